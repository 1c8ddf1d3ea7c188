//! The scripting and inspection surface shared by the test devices: the software HCA implements it, and so does
//! the scripted device (`crate::scripted`), which depends on it; the sim depends on nothing of the scripted
//! device. Tests written against [`Scriptable`] run unchanged on either. The `Scripted*` records keep the names
//! (and C names, `struct sqd_scripted_*`) they were first given for the scripted device.

use rdma_sys::{ibv_context, ibv_cq, ibv_pd, ibv_qp};

use crate::Result;

/// The capabilities of a scripted QP (granted exactly as requested).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScriptedQpCaps {
    /// Send queue depth: 1..=32768.
    pub max_send_wr: u32,
    /// Receive queue depth: 1..=32768.
    pub max_recv_wr: u32,
    /// SGEs per send WR: 1..=64.
    pub max_send_sge: u32,
    /// SGEs per receive WR: 1..=64.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send WR: 0..=4096.
    pub max_inline_data: u32,
}

impl ScriptedQpCaps {
    /// Caps with the given queue depths, 4 SGEs per WR and 64 bytes of inline data.
    pub const fn with_depths(max_send_wr: u32, max_recv_wr: u32) -> ScriptedQpCaps {
        ScriptedQpCaps { max_send_wr, max_recv_wr, max_send_sge: 4, max_recv_sge: 4, max_inline_data: 64 }
    }
}

/// Counters and state of one scripted QP.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScriptedQpStats {
    /// `post_send` calls that posted at least one WQE.
    pub doorbells: u64,
    /// Send WQEs accepted (including WQEs posted while in error, which flush at once).
    pub wqes_posted: u64,
    /// Accepted send WQEs with `IBV_SEND_SIGNALED`.
    pub signaled_wqes: u64,
    /// Send slots held now: posted, and no CQE at or after them polled yet.
    pub outstanding: u64,
    /// The largest `outstanding` ever reached.
    pub max_outstanding: u64,
    /// Send WQEs executed by `complete` or `fail` (not flushed ones).
    pub executed: u64,
    /// CQEs generated for this QP, send and receive, including CQEs lost to a CQ overrun.
    pub cqes_generated: u64,
    /// `IBV_WC_WR_FLUSH_ERR` CQEs generated for this QP (send and receive).
    pub flushed: u64,
    /// Receive WRs accepted.
    pub recv_posted: u64,
    /// Receive slots held now: posted, and their CQE not polled yet.
    pub recv_outstanding: u64,
    /// Violations recorded against this QP.
    pub violations: u64,
    /// The QP is in the error state.
    pub in_error: bool,
}

/// Counters and state of one scripted CQ.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScriptedCqStats {
    /// CQEs the CQ holds (its `cqe`).
    pub capacity: u64,
    /// CQEs queued now, not yet polled.
    pub queued: u64,
    /// The largest `queued` ever reached.
    pub max_queued: u64,
    /// CQEs lost because the CQ was full.
    pub overruns: u64,
    /// The CQ overran (a real CQ would now be unusable).
    pub in_error: bool,
    /// `req_notify_cq` calls.
    pub arms: u64,
}

/// A copy of one send WQE as posted, with its fate so far.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScriptedWqe {
    pub wr_id: u64,
    /// `enum ibv_wr_opcode` value.
    pub opcode: u32,
    /// `enum ibv_send_flags` bits.
    pub send_flags: u32,
    pub num_sge: i32,
    /// Length of the first SGE (0 when there is none).
    pub first_sge_length: u32,
    /// Address of the first SGE (0 when there is none).
    pub first_sge_addr: u64,
    /// Sum of the lengths of all SGEs.
    pub total_length: u64,
    /// lkey of the first SGE (0 when there is none).
    pub first_sge_lkey: u32,
    /// The WR's `imm_data` (network byte order) or `invalidate_rkey`: the same field.
    pub imm_data: u32,
    /// `wr.rdma.remote_addr`, or `wr.atomic.remote_addr` for atomics.
    pub remote_addr: u64,
    /// `wr.rdma.rkey`, or `wr.atomic.rkey` for atomics.
    pub rkey: u32,
    /// Completion status once `executed` or `flushed` (`enum ibv_wc_status`), else 0.
    pub status: u32,
    /// `wr.atomic.compare_add` for atomics, else 0.
    pub compare_add: u64,
    /// `wr.atomic.swap` for atomics, else 0.
    pub swap: u64,
    /// Posted with `IBV_SEND_SIGNALED`.
    pub signaled: bool,
    /// Executed (successfully, or failed by `fail`).
    pub executed: bool,
    /// Flushed with `IBV_WC_WR_FLUSH_ERR`.
    pub flushed: bool,
}

/// The scripting and inspection surface of a test device. Tests written against this trait can run on any
/// device model that implements it.
///
/// QP and CQ arguments are pointers the device made; a pointer the device does not know is an `EINVAL` error,
/// never dereferenced.
pub trait Scriptable {
    /// The device's `struct ibv_context` (its ops table reaches the model).
    fn context(&self) -> *mut ibv_context;
    /// The device's protection domain.
    fn pd(&self) -> *mut ibv_pd;
    /// Makes a CQ holding `cqe` CQEs (1..=4194304).
    fn create_cq(&self, cqe: i32) -> Result<*mut ibv_cq>;
    /// Makes an RC QP in the RTS state on CQs of this device.
    fn create_qp(&self, send_cq: *mut ibv_cq, recv_cq: *mut ibv_cq, caps: &ScriptedQpCaps) -> Result<*mut ibv_qp>;
    /// Destroys a QP; its CQEs not yet polled are removed from its CQs.
    fn destroy_qp(&self, qp: *mut ibv_qp) -> Result<()>;
    /// Destroys a CQ; `EBUSY` while a QP uses it.
    fn destroy_cq(&self, cq: *mut ibv_cq) -> Result<()>;
    /// The next `n` send WQEs not yet executed execute successfully, in order; signaled ones push a success
    /// CQE. Returns how many executed (fewer than `n` if fewer were waiting).
    fn complete(&self, qp: *mut ibv_qp, n: usize) -> Result<usize>;
    /// The next send WQE not yet executed fails with `status` (an error CQE, signaled or not); the QP moves to
    /// the error state and every later send WQE, then every posted receive, flushes. `ENOENT` if no send WQE
    /// is waiting; `EINVAL` for `IBV_WC_SUCCESS`.
    fn fail(&self, qp: *mut ibv_qp, status: u32, vendor_err: u32) -> Result<()>;
    /// Moves the QP to the error state (as `ibv_modify_qp` to ERR): every send WQE not yet executed, then every
    /// posted receive, flushes with its own CQE.
    fn set_error(&self, qp: *mut ibv_qp) -> Result<()>;
    /// The oldest posted receive completes with `IBV_WC_RECV` and `byte_len`; with `imm` (network byte order)
    /// the CQE has `IBV_WC_WITH_IMM`. `ENOENT` if no receive is posted.
    fn deliver(&self, qp: *mut ibv_qp, byte_len: u32, imm: Option<u32>) -> Result<()>;
    fn qp_stats(&self, qp: *mut ibv_qp) -> Result<ScriptedQpStats>;
    fn qp_caps(&self, qp: *mut ibv_qp) -> Result<ScriptedQpCaps>;
    fn cq_stats(&self, cq: *mut ibv_cq) -> Result<ScriptedCqStats>;
    /// The `index`-th send WQE ever posted on `qp` (0 = first); `ENOENT` beyond the last.
    fn wqe(&self, qp: *mut ibv_qp, index: usize) -> Result<ScriptedWqe>;
    /// Makes the provider refuse send WRs at post time, as a provider refuses a WR it does not support: from now
    /// on every send WR of `qp` with `opcode` (an `enum ibv_wr_opcode` value) is refused with `errno` (its
    /// `post_send` returns `errno` with `*bad_wr` at that WR; it and the WRs after it in that chain are not
    /// posted), whenever it is posted. No violation is recorded. `errno` 0 lifts the refusal; `EINVAL` above
    /// 4095.
    fn refuse_opcode(&self, qp: *mut ibv_qp, opcode: u32, errno: i32) -> Result<()>;
    /// Every violation recorded on the device so far, oldest first.
    fn violations(&self) -> Vec<String>;
}
