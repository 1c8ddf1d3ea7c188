//! The only code that touches verbs objects.
//!
//! Data-path calls go through the `struct ibv_context` ops table, exactly as libibverbs' inline
//! `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` do, so any provider works unchanged: a real HCA's, the
//! scripted test device, the software HCA. Handles are built by `unsafe` constructors whose contracts the C
//! layer upholds; their methods are then safe.

mod callback;
pub mod control;
mod cq;
pub mod device;
mod pool;
mod qp;
mod srq;
mod staged;
pub mod verify;
mod wr;

#[cfg(feature = "capi")]
pub use callback::ForeignBatch;
pub use callback::{ForeignDeferred, ForeignRelease};
/// SRQs made and destroyed as `ibv_create_srq` / `ibv_destroy_srq` do, reaching a registered software device's
/// own calls ([`device`]): for code that makes SRQs on a ULP's behalf (the SPDK provider).
pub use control::{create_srq, destroy_srq};
pub use cq::{CqHandle, NotifyFn, PollFn};
pub(crate) use cq::poll_failed;
pub use pool::{BacklogPool, BacklogPoolStats};
pub use qp::{PostFailure, QpHandle};
pub use srq::SrqHandle;
pub use staged::{pump_backlog, StagedWr};
pub use wr::{RecvChain, RecvWrPtr, SendChain, WrPtr};

pub use rdma_sys::{ibv_cq, ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_srq, ibv_wc};

/// The rkey a receive completion says the sender invalidated (`IBV_WC_WITH_INV`), if any.
#[inline]
pub fn wc_invalidated_rkey(wc: &ibv_wc) -> Option<u32> {
    const WITH_INV: u32 = rdma_sys::ibv_wc_flags::IBV_WC_WITH_INV.0;
    if wc.status == 0 && wc.wc_flags & WITH_INV != 0 {
        // SAFETY: both members of the union are plain u32; with IBV_WC_WITH_INV the provider wrote the rkey.
        Some(unsafe { wc.imm_data_invalidated_rkey_union.invalidated_rkey })
    } else {
        None
    }
}

/// The vendor error of a completion: the CQE's for an error status, 0 for a success. Verbs defines the field for
/// errors only, and providers do not write it for a success (rdma-core's mlx5 and mlx4 set it in their error
/// paths alone), so a success's `vendor_err` is whatever the caller's array held.
#[inline]
pub fn wc_vendor_err(wc: &ibv_wc) -> u32 {
    if wc.status == 0 {
        0
    } else {
        wc.vendor_err
    }
}

/// The work-completion opcode (`enum ibv_wc_opcode`) that a send WR of `wr_opcode` (`enum ibv_wr_opcode`)
/// completes with on an RC QP, or `None` for an opcode RC does not have: what a provider reports in the CQE of
/// a WR it flushes.
#[inline]
pub fn wc_opcode_of(wr_opcode: u32) -> Option<u8> {
    crate::discipline::opcode::wc_opcode(wr_opcode)
}

/// libibverbs providers return a positive errno; some return it negated. Normalise to positive.
fn errno_of(ret: i32) -> i32 {
    if ret == 0 {
        0
    } else {
        ret.abs()
    }
}
