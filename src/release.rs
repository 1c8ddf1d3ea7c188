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
