//! A post that stopped early, for sends and receives (of a queue or an SRQ).

use crate::error::Error;
use crate::verbs::{RecvWrPtr, WrPtr};

/// A post that stopped early: `error` says why; `bad` is the first WR not accepted (it and every WR after it
/// were not taken).
#[derive(Debug)]
pub struct PostError<'a> {
    pub error: Error,
    pub bad: WrPtr<'a>,
}

#[derive(Debug)]
pub struct RecvPostError<'a> {
    pub error: Error,
    pub bad: RecvWrPtr<'a>,
}
