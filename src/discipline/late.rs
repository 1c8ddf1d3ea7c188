//! Completions that may still arrive for WRs the queue no longer holds: after an asynchronous event released
//! them all (the queue is abandoned), and after the queue itself is freed.
//!
//! A queue (or its CQ, once the queue is freed) keeps, per direction, the window of sequence numbers posted to
//! the provider whose CQE was never polled. A send queue and a receive queue each complete in order, so a CQE
//! for sequence `s` means no CQE will come for anything before `s`: the window then starts after `s`. When it is
//! empty, nothing more can arrive.

use super::token::{Direction, Token};

/// Sequences `next..end` of one direction: posted, no CQE polled at or after them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LateWindow {
    next: u64,
    end: u64,
}

impl LateWindow {
    pub fn new(next: u64, end: u64) -> LateWindow {
        debug_assert!(next <= end);
        LateWindow { next, end }
    }

    /// How many WQEs may still complete (each gives at most one CQE).
    pub fn len(&self) -> u64 {
        self.end - self.next
    }

    pub fn is_empty(&self) -> bool {
        self.next == self.end
    }

    /// A CQE with `token` (of this queue and direction) arrived: nothing before it will complete any more.
    /// Returns whether it named a sequence in the window.
    pub fn on_cqe(&mut self, token: Token) -> bool {
        let seq = token.seq_from(self.next);
        if seq < self.end {
            self.next = seq + 1;
            true
        } else {
            false
        }
    }
}

/// What a CQ remembers of a freed queue whose WRs may still complete on it: its token index there and the
/// windows of the directions that complete there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetiredQueue {
    pub index: u32,
    pub send: LateWindow,
    pub recv: LateWindow,
}

impl RetiredQueue {
    /// Nothing more can arrive.
    pub fn is_done(&self) -> bool {
        self.send.is_empty() && self.recv.is_empty()
    }

    /// A CQE of the freed queue's QP arrived on the CQ: narrows the window its token names, if it names one.
    pub fn on_cqe(&mut self, token: Token) {
        if token.index() != self.index {
            return;
        }
        match token.direction() {
            Direction::Send => self.send.on_cqe(token),
            Direction::Recv => self.recv.on_cqe(token),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cqe_closes_the_window_up_to_its_sequence() {
        let mut w = LateWindow::new(10, 18);
        assert_eq!(w.len(), 8);
        assert!(w.on_cqe(Token::new(3, Direction::Send, 13)), "a signaled CQE covering 10..=13");
        assert_eq!(w.len(), 4);
        assert!(!w.on_cqe(Token::new(3, Direction::Send, 12)), "before the window: not one of its WQEs");
        assert!(!w.on_cqe(Token::new(3, Direction::Send, 18)), "never posted");
        assert_eq!(w.len(), 4);
        for s in 14..18 {
            assert!(w.on_cqe(Token::new(3, Direction::Send, s)));
        }
        assert!(w.is_empty());
    }

    #[test]
    fn a_retired_queue_is_done_when_both_windows_are_empty() {
        let mut r = RetiredQueue { index: 7, send: LateWindow::new(0, 2), recv: LateWindow::new(5, 6) };
        r.on_cqe(Token::new(8, Direction::Send, 1));
        assert_eq!(r.send.len(), 2, "another index: another queue's token");
        r.on_cqe(Token::new(7, Direction::Send, 1));
        assert!(r.send.is_empty() && !r.is_done());
        r.on_cqe(Token::new(7, Direction::Recv, 5));
        assert!(r.is_done());
    }

    #[test]
    fn sequences_are_recovered_across_the_token_wrap() {
        let base = (1u64 << 39) - 2;
        let mut w = LateWindow::new(base, base + 4);
        assert!(w.on_cqe(Token::new(0, Direction::Send, base + 2)));
        assert_eq!(w.len(), 1);
    }
}
