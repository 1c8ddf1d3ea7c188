//! Work completions as the model builds them: statuses, error/flush CQEs with their undefined fields poisoned,
//! and where a CQE came from (which send WQE, or a receive).

use rdma_sys::{ibv_wc, ibv_wc_status};

/// Written into `opcode` and `byte_len` of error and flush CQEs, where verbs leaves them undefined.
pub(super) const GARBAGE: u32 = 0xffff_ffff;

pub(super) const SUCCESS: u32 = ibv_wc_status::IBV_WC_SUCCESS;
pub(super) const FLUSH: u32 = ibv_wc_status::IBV_WC_WR_FLUSH_ERR;

pub(super) fn blank_wc() -> ibv_wc {
    // SAFETY: `ibv_wc` is plain data (integers and an integer union); all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// An error or flush CQE: only `wr_id`, `status`, `qp_num` and `vendor_err` are meaningful; the rest is
/// poisoned so a user reading it sees an obviously wrong value.
pub(super) fn error_wc(wr_id: u64, status: u32, vendor_err: u32, qpn: u32) -> ibv_wc {
    let mut wc = blank_wc();
    wc.wr_id = wr_id;
    wc.status = status;
    wc.vendor_err = vendor_err;
    wc.qp_num = qpn;
    wc.opcode = GARBAGE;
    wc.byte_len = GARBAGE;
    wc.src_qp = GARBAGE;
    wc.wc_flags = GARBAGE;
    wc
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Origin {
    /// The send WQE with this index on its QP.
    Send(u64),
    Recv,
}
