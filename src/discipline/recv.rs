//! The receive side of a managed queue: receive credits, exact mapping of receive CQEs, ordered release.
//!
//! Every receive WR yields its own CQE (success or flush), and an RQ completes in order, so a receive CQE
//! must name the oldest pending receive; anything else is a stray.

use super::opcode::WC_RECV;
use super::ring::{Slot, SlotRing};
use super::send::Release;
use super::late::LateWindow;
use super::token::Token;
use crate::error::Result;

#[derive(Debug)]
pub struct RecvState {
    ring: SlotRing,
    depth: u32,
    pub posted: u64,
    pub cqes: u64,
    pub stray_cqes: u64,
    pub late_cqes: u64,
    abandoned: bool,
    /// Once abandoned: the receives the provider held then whose CQE has not arrived since.
    late: LateWindow,
}

impl RecvState {
    pub fn new(depth: u32) -> Result<RecvState> {
        let ring = SlotRing::new(depth, "the receive ring")?;
        Ok(RecvState { ring, depth, posted: 0, cqes: 0, stray_cqes: 0, late_cqes: 0, abandoned: false, late: LateWindow::default() })
    }
    pub fn depth(&self) -> u32 {
        self.depth
    }
    #[inline]
    pub fn credits(&self) -> u32 {
        self.depth - self.ring.outstanding() as u32
    }
    pub fn outstanding(&self) -> u64 {
        self.ring.outstanding()
    }
    #[inline]
    pub fn seq_base(&self) -> u64 {
        self.ring.done()
    }

    /// Takes a receive credit for `wr_id`; `None` when the RQ is full.
    #[inline]
    pub fn admit(&mut self, wr_id: u64) -> Option<u64> {
        if self.credits() == 0 {
            return None;
        }
        self.posted += 1;
        Some(self.ring.push(Slot::new(wr_id, WC_RECV, Slot::SIGNALED)))
    }

    /// The ULP's wr_id of the receive admitted as `seq` (still outstanding).
    #[inline]
    pub fn wr_id_of(&self, seq: u64) -> u64 {
        debug_assert!(self.ring.is_pending(seq));
        self.ring.get(seq).wr_id
    }

    /// No CQE may ever come for the posted receives: complete them all with `IBV_WC_WR_FLUSH_ERR`; later CQEs
    /// are swallowed.
    pub fn abandon(&mut self) {
        if !self.abandoned {
            self.late = LateWindow::new(self.ring.done(), self.ring.head());
        }
        self.abandoned = true;
        self.ring.complete_all(super::opcode::WC_WR_FLUSH_ERR);
    }

    pub fn is_abandoned(&self) -> bool {
        self.abandoned
    }

    /// The receives whose CQE may still arrive: those the provider holds, or once abandoned, those it held
    /// then and whose CQE has not arrived since.
    pub fn unfinished(&self) -> LateWindow {
        if self.abandoned {
            self.late
        } else {
            LateWindow::new(self.ring.done(), self.ring.head())
        }
    }

    /// The provider refused the newest `n` receives.
    pub fn rollback(&mut self, n: u64) {
        self.ring.unpush(n);
        self.posted -= n;
    }

    /// Maps a polled receive CQE; returns the ULP's wr_id, or `None` for a stray.
    #[inline]
    pub fn on_cqe(&mut self, token: Token, status: u8, vendor_err: u32, wc_opcode: u8, remote_inv: Option<u32>) -> Option<u64> {
        let seq = token.seq_from(self.ring.done());
        if seq != self.ring.done() || !self.ring.is_pending(seq) {
            if self.abandoned {
                self.late_cqes += 1;
                self.late.on_cqe(token);
            } else {
                self.stray_cqes += 1;
            }
            return None;
        }
        self.cqes += 1;
        let wr_id = self.ring.get(seq).wr_id;
        self.ring.complete_through(seq, status, vendor_err);
        if status == 0 {
            self.ring.update(seq, |slot| {
                slot.set_opcode(wc_opcode);
                if let Some(rkey) = remote_inv {
                    slot.set_vendor_err(rkey);
                    slot.add_flags(Slot::REMOTE_INV);
                }
            });
        }
        Some(wr_id)
    }

    /// Whether a completed receive waits for its release (`next_release` would return one).
    #[inline]
    pub fn release_due(&self) -> bool {
        self.ring.tail() != self.ring.done()
    }

    #[inline]
    pub fn next_release(&mut self) -> Option<Release> {
        let (_, s) = self.ring.pop_done()?;
        let remote_inv = s.has(Slot::REMOTE_INV).then_some(s.vendor_err());
        Some(Release {
            wr_id: s.wr_id,
            status: s.status(),
            opcode: s.opcode(),
            vendor_err: if remote_inv.is_some() { 0 } else { s.vendor_err() },
            implied: false,
            never_posted: false,
            op: false,
            remote_inv,
            refused: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discipline::token::Direction;

    #[test]
    fn receives_complete_in_order_only() {
        let mut r = RecvState::new(2).unwrap();
        let a = r.admit(10).unwrap();
        let b = r.admit(11).unwrap();
        assert_eq!(r.admit(12), None, "RQ full");
        assert_eq!(r.on_cqe(Token::new(0, Direction::Recv, b), 0, 0, 128, None), None, "out of order is a stray");
        assert_eq!(r.on_cqe(Token::new(0, Direction::Recv, a), 0, 0, 129, Some(0x77)), Some(10));
        let rel = r.next_release().unwrap();
        assert_eq!((rel.wr_id, rel.opcode, rel.remote_inv, rel.vendor_err), (10, 129, Some(0x77), 0));
        assert_eq!(r.on_cqe(Token::new(0, Direction::Recv, b), 5, 7, 0, None), Some(11));
        let rel = r.next_release().unwrap();
        assert_eq!((rel.wr_id, rel.status, rel.vendor_err, rel.opcode), (11, 5, 7, 128));
        assert_eq!(r.credits(), 2);
    }
}
