//! A managed queue's unsignaled tail: watched by its send CQ's polls, and covered by a signaled marker when the
//! queue goes idle or its CQ is armed.

use crate::attach::IdleCheck;
use crate::discipline::token::{Direction, Token};

use super::{QueueShared, QueueState};

/// What became of an attempt to cover the unsignaled tail with a marker.
#[derive(PartialEq, Eq)]
enum Marker {
    Posted,
    /// No unsignaled tail, or a queue that posts no more.
    NotNeeded,
    /// The provider refused it.
    Refused,
}

impl QueueShared {
    /// After a post: an unsignaled tail it left is covered at once on an armed CQ (the poller may sleep on the
    /// channel until a CQE comes, so no poll would cover it), or watched by the send CQ's polls.
    #[inline(always)]
    pub(super) fn settle_tail(&self, st: &mut QueueState) {
        if st.send.has_unsignaled_tail() {
            if self.send_cq.is_armed() && self.post_marker(st) == Marker::Posted {
                return;
            }
            self.tail_left();
        } else if self.watched.get() {
            // Still watched for an earlier tail: posted to in this cycle, so the poll's pass leaves it be (and the
            // next post's tail finds it in the list), rather than dropping it now to add it back at that post.
            self.note_posted_in_cycle();
        }
    }

    /// `settle_tail` after a post whose last WR is unsignaled (an unsignaled tail is known to exist): the
    /// common case, a watched queue on a CQ that is not armed, only notes the post in the poll cycle.
    #[inline(always)]
    pub(super) fn settle_quiet_tail(&self, st: &mut QueueState) {
        debug_assert!(st.send.has_unsignaled_tail());
        if self.send_cq.is_armed() || !self.watched.get() {
            return self.settle_tail_rare(st);
        }
        self.note_posted_in_cycle();
    }

    /// `settle_tail` out of line, for `settle_quiet_tail`'s rare cases (a marker to post, a queue to watch).
    #[cold]
    #[inline(never)]
    fn settle_tail_rare(&self, st: &mut QueueState) {
        self.settle_tail(st);
    }

    /// A post or a pump left an unsignaled tail: the end of the send CQ's next poll leaves it be (more posts may
    /// come), and the one after covers it with a marker unless the queue was posted to again.
    #[inline]
    pub(super) fn tail_left(&self) {
        if !self.watched.get() {
            self.watched.set(true);
            self.send_cq.watch(self.send_index);
        }
        self.note_posted_in_cycle();
    }

    /// The watched queue was posted to in the send CQ's current poll cycle: the idle-tail check at the end of the
    /// cycle's poll leaves it be.
    #[inline]
    fn note_posted_in_cycle(&self) {
        let cycle = self.send_cq.cycle();
        if self.posted_cycle.get() != cycle {
            self.posted_cycle.set(cycle);
            self.send_cq.note_posted();
        }
    }

    /// Called at the end of a poll of the send CQ (cycle `cycle`) while this queue is watched.
    pub(crate) fn check_idle_tail(&self, now: bool, cycle: u64) -> IdleCheck {
        if self.posted_cycle.get() == cycle && !now {
            return IdleCheck::KeepWatching;
        }
        match self.cover_idle_tail() {
            Marker::Posted => {
                self.watched.set(false);
                IdleCheck::Covered(true)
            }
            Marker::NotNeeded => {
                self.watched.set(false);
                IdleCheck::Covered(false)
            }
            // Still uncovered: the next poll cycle tries again.
            Marker::Refused => IdleCheck::KeepWatching,
        }
    }

    /// Posts the idle-tail marker if the tail is still unsignaled (kept out of line: the poll's common case
    /// is a queue that was posted to, which needs none).
    #[inline(never)]
    fn cover_idle_tail(&self) -> Marker {
        let mut st = self.state.borrow_mut();
        self.post_marker(&mut st)
    }

    /// Covers the unsignaled tail with a signaled marker, if there is one and the queue may post. A marker the
    /// provider refuses is counted and described; the tail stays unsignaled for the caller to try again.
    fn post_marker(&self, st: &mut QueueState) -> Marker {
        let Some(seq) = st.send.admit_marker() else { return Marker::NotNeeded };
        st.doorbells += 1;
        match self.qp.post_marker(Token::new(self.send_index, Direction::Send, seq).0) {
            Ok(()) => Marker::Posted,
            Err(errno) => {
                st.send.refuse_marker(errno);
                st.last_refusal = Some(format!(
                    "the provider's post_send refused the idle-tail marker (a signaled zero-length RDMA WRITE) with \
                     errno {errno} ({}); the unsignaled WRs before it wait, and each poll cycle of the send CQ tries \
                     the marker again",
                    std::io::Error::from_raw_os_error(errno)
                ));
                Marker::Refused
            }
        }
    }
}
