//! What a release callback receives: one completion, or a batch of them.

/// The release of one WR (`struct sqd_completion` in C).
///
/// After its release, and not before, the ULP may reuse the WR's buffers, lkeys and MRs.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Completion {
    /// The ULP's own wr_id; for a send WR of a queue made with `SQD_QUEUE_INDEXED`, its index (how many send WRs
    /// the queue accepted before it).
    pub wr_id: u64,
    /// An `enum ibv_wc_status` value: `IBV_WC_SUCCESS`, the error of the WR's CQE, `IBV_WC_WR_FLUSH_ERR`, or
    /// `IBV_WC_LOC_QP_OP_ERR` for a WR the provider refused (`SQD_COMPLETION_REFUSED`).
    pub status: u32,
    /// An `enum ibv_wc_opcode` value taken from the WR as posted (valid even on error); for receives, the CQE's
    /// opcode on success and `IBV_WC_RECV` otherwise.
    pub opcode: u32,
    /// The vendor error of the WR's own error CQE; with `SQD_COMPLETION_REFUSED`, the provider's errno; else 0.
    pub vendor_err: u32,
    /// `SQD_COMPLETION_*` bits.
    pub flags: u32,
    /// With `SQD_COMPLETION_REMOTE_INV`: the rkey the sender's SEND_WITH_INV invalidated (no LocalInv of it is
    /// needed any more).
    pub invalidated_rkey: u32,
    /// With `SQD_COMPLETION_BUFFER_MODIFIED`: the index of the first SGE whose bytes changed while in flight.
    pub modified_sge: u32,
}

/// Send WRs released together (`struct sqd_release_batch`, see `sqd_queue_set_release_batch`): WRs the ULP
/// posted, retired one after the other with the same status and vendor error. After its release, and not before,
/// the ULP may reuse each WR's buffers, lkeys and MRs.
#[cfg(feature = "capi")]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ReleaseBatchC {
    /// The WRs' own wr_ids, oldest first (`count` of them), valid only during the call; NULL on a queue with
    /// `SQD_QUEUE_INDEXED`, which names them by their indexes, `first` to `first + count - 1`.
    pub wr_ids: *const u64,
    /// How many WRs the batch releases: at least 1.
    pub count: u32,
    /// An `enum ibv_wc_status` value, the same for each WR: `IBV_WC_SUCCESS`, the error of a WR's own CQE, or
    /// `IBV_WC_WR_FLUSH_ERR`.
    pub status: u32,
    /// The vendor error of the WRs' error CQE, else 0.
    pub vendor_err: u32,
    /// The index of the batch's first WR: how many send WRs the queue accepted before it (the others follow it
    /// in order; see `SQD_QUEUE_INDEXED`).
    pub first: u64,
}

/// The WR was retired by a later signaled completion, not a CQE of its own.
pub const SQD_COMPLETION_IMPLIED: u32 = 1;
/// The WR was never executed: a send WR still in the backlog when the queue failed or drained, or a receive
/// `sqd_srq_release_all` took back (status `IBV_WC_WR_FLUSH_ERR`); or a send WR the provider's `post_send`
/// refused (with `SQD_COMPLETION_REFUSED`).
pub const SQD_COMPLETION_NEVER_POSTED: u32 = 2;
/// The WR was a receive (posted with `sqd_post_recv`).
pub const SQD_COMPLETION_RECV: u32 = 4;
/// A receive whose sender invalidated `invalidated_rkey` (SEND_WITH_INV): skip your own LocalInv of it.
pub const SQD_COMPLETION_REMOTE_INV: u32 = 8;
/// Buffer verification (`SQD_QUEUE_VERIFY_BUFFERS`) found bytes of SGE `modified_sge` changed between the post
/// and the release: the ULP wrote into a buffer the HCA could still read.
pub const SQD_COMPLETION_BUFFER_MODIFIED: u32 = 16;
/// The queue accepted the WR, but the provider's `post_send` refused it when the library posted it (from the
/// backlog, or a deferred LocalInv at its barrier): it never reached the HCA (`SQD_COMPLETION_NEVER_POSTED` is
/// set too), `status` is `IBV_WC_LOC_QP_OP_ERR` and `vendor_err` holds the provider's errno. The queue stays
/// open and the WRs behind it are posted; `sqd_queue_stats` counts it and `sqd_queue_last_refusal` describes it.
pub const SQD_COMPLETION_REFUSED: u32 = 32;

impl Completion {
    pub fn is_implied(&self) -> bool {
        self.flags & SQD_COMPLETION_IMPLIED != 0
    }
    pub fn never_posted(&self) -> bool {
        self.flags & SQD_COMPLETION_NEVER_POSTED != 0
    }
    pub fn is_recv(&self) -> bool {
        self.flags & SQD_COMPLETION_RECV != 0
    }
}

impl From<(crate::discipline::Release, bool)> for Completion {
    fn from((r, recv): (crate::discipline::Release, bool)) -> Completion {
        let mut flags = 0;
        if r.implied {
            flags |= SQD_COMPLETION_IMPLIED;
        }
        if r.never_posted {
            flags |= SQD_COMPLETION_NEVER_POSTED;
        }
        if r.refused {
            flags |= SQD_COMPLETION_REFUSED;
        }
        if recv {
            flags |= SQD_COMPLETION_RECV;
        }
        if r.remote_inv.is_some() {
            flags |= SQD_COMPLETION_REMOTE_INV;
        }
        Completion {
            wr_id: r.wr_id,
            status: r.status as u32,
            opcode: r.opcode as u32,
            vendor_err: r.vendor_err,
            flags,
            invalidated_rkey: r.remote_inv.unwrap_or(0),
            modified_sge: 0,
        }
    }
}
