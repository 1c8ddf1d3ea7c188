//! Time: one step fires due faults, delivers the packets due, then runs the responder and requester of every
//! QP with work; running until idle.

use crate::{Error, Result};
use super::Model;
use super::qp::{QpModel, QpState};

impl Model {
    pub(crate) fn run(&mut self, steps: u64) {
        for _ in 0..steps {
            self.step_once();
        }
    }

    pub(super) fn step_once(&mut self) {
        self.now += 1;
        let now = self.now;
        if !self.fatal_at.is_empty() {
            let due: Vec<u32> = self.fatal_at.iter().filter(|f| f.0 <= now).map(|f| f.1).collect();
            self.fatal_at.retain(|f| f.0 > now);
            self.pending_err.extend(due);
            self.settle();
        }
        while let Some(entry) = self.wire.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let p = entry.remove();
            self.deliver(p);
        }
        // Only QPs with work: an idle QP's tick does nothing (no ACK due, nothing to send or complete).
        let mut slots = std::mem::take(&mut self.tick_buf);
        slots.clear();
        slots.extend(self.active.iter().copied());
        self.stats.qp_ticks += slots.len() as u64;
        for &slot in &slots {
            self.with_slot(slot, |m, q| {
                m.responder_tick(q);
                m.requester_tick(q);
                if !Self::busy(q) {
                    m.active.remove(&slot);
                }
            });
        }
        self.tick_buf = slots;
        self.settle();
    }

    /// Whether a QP has work for the next step: in RTS with a send WQE not completed, or an ACK due.
    fn busy(q: &QpModel) -> bool {
        q.state == QpState::Rts && (q.next_complete < q.posted || q.ack_due.is_some())
    }

    /// Whether the next step certainly moves traffic: a packet on the wire, an ACK due, or a WQE waiting to be
    /// transmitted by a QP that is not waiting out an RNR NAK. What is left when it is false is waiting for a
    /// timer (retransmission, RNR retry) or for nothing.
    pub(crate) fn urgent(&self) -> bool {
        !self.wire.is_empty()
            || self.active.iter().any(|&s| {
                self.qps[s].as_ref().is_some_and(|q| {
                    q.state == QpState::Rts && (q.ack_due.is_some() || (q.next_tx < q.posted && self.now >= q.rnr_wait_until))
                })
            })
    }

    /// Whether a step could change anything: a packet on the wire, a QP with work, or a fault still to fire.
    pub(crate) fn in_flight(&self) -> bool {
        !self.idle() || !self.fatal_at.is_empty()
    }

    fn idle(&self) -> bool {
        self.wire.is_empty() && self.active.iter().all(|&s| self.qps[s].as_ref().is_none_or(|q| !Self::busy(q)))
    }

    pub(crate) fn run_until_idle(&mut self, max_steps: u64) -> Result<u64> {
        let start = self.now;
        loop {
            if self.idle() {
                return Ok(self.now - start);
            }
            if self.now - start >= max_steps {
                return Err(Error::new(libc::ETIMEDOUT, format!("still busy after {max_steps} steps")));
            }
            self.step_once();
        }
    }
}
