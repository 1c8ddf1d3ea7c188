//! What runs when a WR or a receive is released, for queues and SRQs alike.

use crate::completion::Completion;
use crate::verbs::ForeignRelease;

/// What runs when a WR is released.
pub enum ReleaseHandler {
    Closure(Box<dyn Fn(&Completion)>),
    Foreign(ForeignRelease),
}

pub(crate) fn call(handler: Option<&ReleaseHandler>, c: &Completion) {
    match handler {
        Some(ReleaseHandler::Closure(f)) => f(c),
        Some(ReleaseHandler::Foreign(f)) => f.call(c),
        None => {}
    }
}

/// Send WRs released together, in post order ([`crate::Queue::set_release_batch`]): posted WRs of the ULP's whose
/// completions would differ only in their wr_id, their opcode and `SQD_COMPLETION_IMPLIED`.
#[derive(Debug, Clone, Copy)]
pub struct ReleaseBatch<'a> {
    /// The WRs' own wr_ids, oldest first: at least one.
    pub wr_ids: &'a [u64],
    /// Their status (an `enum ibv_wc_status` value), the same for each: `IBV_WC_SUCCESS`, the error of a WR's
    /// own CQE, or `IBV_WC_WR_FLUSH_ERR`.
    pub status: u32,
    /// The vendor error of their error CQE, else 0: the same for each.
    pub vendor_err: u32,
}

/// What runs for a batch of releases ([`crate::Queue::set_release_batch`]).
pub type BatchHandler = Box<dyn Fn(&ReleaseBatch<'_>)>;
