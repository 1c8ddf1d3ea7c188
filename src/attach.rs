//! What a managed CQ needs from the queues and SRQs attached to it: the CQ dispatches each CQE through these
//! traits, so `cq` imports neither `queue` nor `srq` (they sit above it and implement them).

use std::rc::Rc;

use crate::discipline::token::Token;

/// What becomes of one reaped CQE.
pub(crate) enum CqeFate {
    Visible(u64),
    Hidden,
    Stray,
    Passthrough,
}

/// The answer of a watched queue at the end of a poll of its send CQ.
pub(crate) enum IdleCheck {
    KeepWatching,
    /// Done watching; `true` when a marker was posted.
    Covered(bool),
}

/// A queue attached to a CQ of type `C` (the CQ's table holds it weakly: the queue owns its CQs).
pub(crate) trait AttachedQueue<C> {
    fn qp_num(&self) -> u32;
    fn send_cq(&self) -> &Rc<C>;
    fn recv_cq(&self) -> Option<&Rc<C>>;
    /// Processes one CQE of this queue, then hands out every release it made due.
    fn on_cqe(&self, token: Token, status: u8, vendor_err: u32, wc_opcode: u8, remote_inv: Option<u32>) -> CqeFate;
    /// Called at the end of a poll of the send CQ (in its poll cycle `cycle`) while this queue is watched.
    fn check_idle_tail(&self, now: bool, cycle: u64) -> IdleCheck;
    /// No CQE may come for this queue's WRs any more: release them all now.
    fn abandon(&self);
}

/// An SRQ whose queues complete receives on a CQ (the CQ holds it while one of them is attached there).
pub(crate) trait AttachedSrq {
    /// The SRQ's id in its tokens (`SRQ_TOKEN_BASE + id`).
    fn id(&self) -> u32;
    fn depth(&self) -> u32;
    /// Maps a receive CQE and hands out the releases due, then runs the low-watermark callback if the posted
    /// receives dropped below it; the ULP's wr_id, or `None` for a stray.
    fn on_cqe(&self, token: Token, status: u8, vendor_err: u32, wc_opcode: u8, remote_inv: Option<u32>) -> Option<u64>;
    /// Whether the SRQ has no release handler and no low watermark: then `on_cqe` only maps the CQE, and
    /// nothing it does calls out of the library.
    fn is_silent(&self) -> bool;
}
