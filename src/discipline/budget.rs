//! CQ budget: every queue attached to a CQ reserves its worst case, so the CQ can never overrun.
//!
//! On QP error every outstanding WR flushes with its own CQE, signaled or not, so the worst case for a queue's
//! sends is its SQ depth; receives completing on the CQ add the RQ depth; one more CQE is kept for a drain
//! marker (as the kernel's drain does).

use super::signal::interval_in_force;
use crate::error::{Error, Result};

/// CQEs a queue reserves on one CQ.
pub fn reservation(sq_depth: u32, rq_depth: u32, sends_here: bool, recvs_here: bool) -> u64 {
    let mut need = 0u64;
    if sends_here {
        need += sq_depth as u64 + 1;
    }
    if recvs_here {
        need += rq_depth as u64;
    }
    need
}

/// Whether a queue of `sq_depth` configured with `signal_interval` may post a WQE of its own that its CQ must
/// have room for (an idle-tail or drain marker): not when the interval in force is 1 (an explicit 1, or 0 below
/// an SQ depth of 8), which signals every WR, so that no unsignaled tail can exist.
pub fn posts_markers(sq_depth: u32, signal_interval: u32) -> bool {
    interval_in_force(sq_depth, signal_interval) != 1
}

/// CQEs a queue's sends reserve on their CQ: `reservation`'s, less the marker's when it posts none
/// (`posts_markers`).
pub fn send_reservation(sq_depth: u32, signal_interval: u32) -> u64 {
    reservation(sq_depth, 0, true, false) - u64::from(!posts_markers(sq_depth, signal_interval))
}

/// The CQ depth a set of queues needs: the sum of their reservations. Counts no SRQ (see `cq_depth_for_srqs`).
pub fn cq_depth_for(queues: &[(u32, u32)]) -> u64 {
    queues.iter().map(|&(sq, rq)| reservation(sq, rq, true, rq > 0)).sum()
}

/// The CQ depth a set of queues needs when some receive through SRQs: their reservations (a queue on an SRQ
/// has `rq_depth` 0) plus the depth of each SRQ whose queues complete receives on the CQ, once per SRQ, as
/// the first such queue reserves it (`CqShared::attach_srq`).
pub fn cq_depth_for_srqs(queues: &[(u32, u32)], srq_depths: &[u32]) -> u64 {
    cq_depth_for(queues) + srq_depths.iter().map(|&d| d as u64).sum::<u64>()
}

#[derive(Debug, Clone)]
pub struct CqBudget {
    capacity: u64,
    reserved: u64,
    queues: u32,
}

impl CqBudget {
    pub fn new(capacity: u64) -> CqBudget {
        CqBudget { capacity, reserved: 0, queues: 0 }
    }
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    pub fn reserved(&self) -> u64 {
        self.reserved
    }
    pub fn queues(&self) -> u32 {
        self.queues
    }

    /// The CQ was resized: `capacity` is what it holds now. It may be below what is reserved (the CQ was
    /// shrunk under its queues): then nothing more fits until queues detach.
    pub fn set_capacity(&mut self, capacity: u64) {
        self.capacity = capacity;
    }

    /// Reserves `need` CQEs, or fails with `ENOSPC` and a message that names the numbers.
    pub fn reserve(&mut self, need: u64, what: &str) -> Result<()> {
        let free = self.capacity.saturating_sub(self.reserved);
        if need > free {
            return Err(Error::new(
                libc::ENOSPC,
                format!(
                    "CQ too small: it holds {} CQEs, {} are reserved by {} queue(s), {} are free; this queue needs {} ({}), {} short",
                    self.capacity, self.reserved, self.queues, free, need, what, need - free
                ),
            ));
        }
        self.reserved += need;
        self.queues += 1;
        Ok(())
    }

    /// Reserves `need` CQEs for something shared by queues (an SRQ), without counting a queue.
    pub fn reserve_extra(&mut self, need: u64, what: &str) -> Result<()> {
        self.reserve(need, what)?;
        self.queues -= 1;
        Ok(())
    }

    pub fn release_extra(&mut self, need: u64) {
        debug_assert!(need <= self.reserved);
        self.reserved -= need;
    }

    pub fn release(&mut self, need: u64) {
        debug_assert!(need <= self.reserved && self.queues > 0);
        self.reserved -= need;
        self.queues -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue that signals every WR keeps no CQE for a marker; any other interval (0 is the default) keeps one.
    #[test]
    fn only_an_interval_of_1_reserves_no_marker() {
        assert_eq!(send_reservation(13, 1), 13);
        for interval in [0, 2, 4, 13] {
            assert_eq!(send_reservation(13, interval), reservation(13, 0, true, false), "interval {interval}");
        }
    }

    #[test]
    fn reserve_until_full_then_enospc_with_numbers() {
        let mut b = CqBudget::new(100);
        b.reserve(reservation(32, 16, true, true), "a").unwrap();
        assert_eq!(b.reserved(), 49);
        b.reserve(reservation(32, 16, true, true), "b").unwrap();
        let e = b.reserve(reservation(2, 0, true, false), "sq_depth 2 + 1 drain marker").unwrap_err();
        assert_eq!(e.errno(), libc::ENOSPC);
        assert!(e.message().contains("holds 100"), "{}", e.message());
        assert!(e.message().contains("needs 3") && e.message().contains("1 short"), "{}", e.message());
        assert!(e.message().contains("2 are free"), "{}", e.message());
        b.release(49);
        b.reserve(2, "c").unwrap();
        assert_eq!((b.reserved(), b.queues()), (51, 2));
    }

    #[test]
    fn resized_capacity_grows_and_shrinks_below_reserved_without_underflow() {
        let mut b = CqBudget::new(10);
        b.reserve(9, "a").unwrap();
        b.set_capacity(20);
        b.reserve(11, "b").unwrap();
        b.set_capacity(8);
        let e = b.reserve(1, "c").unwrap_err();
        assert_eq!(e.errno(), libc::ENOSPC);
        assert!(e.message().contains("holds 8") && e.message().contains("0 are free"), "{}", e.message());
        b.release(11);
        b.release(9);
        b.reserve(8, "d").unwrap();
    }

    #[test]
    fn depth_for_a_plan() {
        assert_eq!(cq_depth_for(&[(128, 0), (64, 64)]), 129 + 129);
    }

    #[test]
    fn depth_for_a_plan_with_srqs_counts_each_srq_once() {
        assert_eq!(cq_depth_for_srqs(&[(16, 0), (16, 0), (16, 0), (8, 4)], &[64, 32]), 3 * 17 + 9 + 4 + 64 + 32);
        assert_eq!(cq_depth_for_srqs(&[(16, 0)], &[]), cq_depth_for(&[(16, 0)]));
    }
}
