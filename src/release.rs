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
    /// The WRs' own wr_ids, oldest first (`count` of them); empty on an indexed queue
    /// ([`crate::QueueConfig::indexed`]), which names them by their indexes from `first` on.
    pub wr_ids: &'a [u64],
    /// How many WRs the batch releases: at least one.
    pub count: usize,
    /// The index of the batch's first WR: how many send WRs the queue accepted before it (the others follow it
    /// in order). See [`crate::QueueConfig::indexed`].
    pub first: u64,
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
    /// Hands over `count` releases from index `first`, with their wr_ids (`count` of them) or without (`None`: an
    /// indexed queue's).
    #[inline]
    pub(crate) fn call(&self, wr_ids: Option<&[u64]>, count: usize, first: u64, status: u32, vendor_err: u32) {
        debug_assert!(count > 0 && wr_ids.is_none_or(|w| w.len() == count));
        match self {
            #[cfg(feature = "capi")]
            BatchCall::Foreign(f) => f.call(&crate::completion::ReleaseBatchC {
                wr_ids: wr_ids.map_or(std::ptr::null(), <[u64]>::as_ptr),
                count: count as u32,
                status,
                vendor_err,
                first,
            }),
            BatchCall::Closure(h) => h(&ReleaseBatch { wr_ids: wr_ids.unwrap_or_default(), count, first, status, vendor_err }),
        }
    }
}
