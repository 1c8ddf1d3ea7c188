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

/// What a queue calls for a batch: a Rust handler, or a C function called with the batch in its C form.
pub(crate) enum BatchCall {
    Closure(BatchHandler),
    #[cfg(feature = "capi")]
    Foreign(crate::verbs::ForeignBatch),
}

impl BatchCall {
    #[inline]
    pub(crate) fn call(&self, wr_ids: &[u64], status: u32, vendor_err: u32) {
        match self {
            #[cfg(feature = "capi")]
            BatchCall::Foreign(f) => {
                f.call(&crate::completion::ReleaseBatchC { wr_ids: wr_ids.as_ptr(), count: wr_ids.len() as u32, status, vendor_err })
            }
            BatchCall::Closure(h) => h(&ReleaseBatch { wr_ids, status, vendor_err }),
        }
    }
}
