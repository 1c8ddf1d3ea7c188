//! Receives posted to a shared receive queue (SRQ).
//!
//! Any QP attached to the SRQ may consume any receive, and the completions arrive on those QPs' CQs in no
//! order the poster can predict, so SRQ receives live in a slab, not a ring: a token names a slot and its
//! generation, each receive is released by its own CQE, and a CQE naming a slot that is free (or of an older
//! generation) is a stray.

use super::opcode::{WC_RECV, WC_WR_FLUSH_ERR};
use super::send::Release;
use crate::alloc;
use crate::error::Result;

/// Bits of a token's sequence field that name the slot; the rest hold the slot's generation.
pub const SLOT_BITS: u32 = 20;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
/// Token queue indices from here up name an SRQ (`SRQ_TOKEN_BASE + srq id`), not a queue: any QP attached to
/// the SRQ may consume its receives, on whatever CQ that QP's receives complete.
pub const SRQ_TOKEN_BASE: u32 = 0xFF_F000;
/// SRQ ids: 0..MAX_SRQS.
pub const MAX_SRQS: u32 = super::token::MAX_INDEX - SRQ_TOKEN_BASE + 1;

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    wr_id: u64,
    gen: u32,
    posted: bool,
}

#[derive(Debug)]
pub struct SrqSlots {
    slots: Box<[Slot]>,
    free: Vec<u32>,
    posted: u32,
    pub cqes: u64,
    pub stray_cqes: u64,
    pub total_posted: u64,
}

impl SrqSlots {
    /// `depth` <= 2^20.
    pub fn new(depth: u32) -> Result<SrqSlots> {
        assert!(depth as u64 <= 1 << SLOT_BITS);
        let slots = alloc::boxed_slice(depth as usize, Slot::default(), "the SRQ's slots")?;
        let mut free = alloc::vec_with_capacity(depth as usize, "the SRQ's free list")?;
        free.extend((0..depth).rev());
        Ok(SrqSlots { slots, free, posted: 0, cqes: 0, stray_cqes: 0, total_posted: 0 })
    }
    pub fn depth(&self) -> u32 {
        self.slots.len() as u32
    }
    /// Receives posted and not yet released.
    pub fn posted(&self) -> u32 {
        self.posted
    }

    /// Takes a slot for `wr_id`; returns the token's sequence field, or `None` when the SRQ is full.
    #[inline]
    pub fn admit(&mut self, wr_id: u64) -> Option<u64> {
        let i = self.free.pop()?;
        let s = &mut self.slots[i as usize];
        s.wr_id = wr_id;
        s.posted = true;
        self.posted += 1;
        self.total_posted += 1;
        Some(((s.gen as u64) << SLOT_BITS) | i as u64)
    }

    /// The ULP's wr_id of the receive admitted as `field` (still posted).
    #[inline]
    pub fn wr_id_of(&self, field: u64) -> u64 {
        let s = &self.slots[(field & SLOT_MASK) as usize];
        debug_assert!(s.posted && s.gen == (field >> SLOT_BITS) as u32);
        s.wr_id
    }

    /// The provider refused the receive admitted as `field`: its slot is free again.
    pub fn rollback(&mut self, field: u64) {
        let i = (field & SLOT_MASK) as usize;
        self.free_slot(i);
        self.total_posted -= 1;
    }

    fn free_slot(&mut self, i: usize) {
        let s = &mut self.slots[i];
        s.posted = false;
        s.gen = s.gen.wrapping_add(1) & ((1 << (39 - SLOT_BITS)) - 1);
        self.posted -= 1;
        self.free.push(i as u32);
    }

    /// Maps a receive CQE's sequence field to its receive and releases the slot.
    #[inline]
    pub fn on_cqe(&mut self, field: u64, status: u8, vendor_err: u32, wc_opcode: u8, remote_inv: Option<u32>) -> Option<Release> {
        let i = (field & SLOT_MASK) as usize;
        let gen = (field >> SLOT_BITS) as u32;
        match self.slots.get(i) {
            Some(s) if s.posted && s.gen == gen => {
                let wr_id = s.wr_id;
                self.free_slot(i);
                self.cqes += 1;
                let ok = status == 0;
                Some(Release {
                    wr_id,
                    status,
                    opcode: if ok { wc_opcode } else { WC_RECV },
                    vendor_err: if ok { 0 } else { vendor_err },
                    implied: false,
                    never_posted: false,
                    op: false,
                    remote_inv: if ok { remote_inv } else { None },
                    refused: false,
                })
            }
            _ => {
                self.stray_cqes += 1;
                None
            }
        }
    }

    /// Releases every posted receive with `IBV_WC_WR_FLUSH_ERR` (the SRQ is in error or being destroyed: no
    /// QP will consume them), in slot order, through `each`.
    pub fn release_all(&mut self, mut each: impl FnMut(Release)) {
        for i in 0..self.slots.len() {
            if self.slots[i].posted {
                let wr_id = self.slots[i].wr_id;
                self.free_slot(i);
                each(Release {
                    wr_id,
                    status: WC_WR_FLUSH_ERR,
                    opcode: WC_RECV,
                    vendor_err: 0,
                    implied: false,
                    never_posted: true,
                    op: false,
                    remote_inv: None,
                    refused: false,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_released_by_their_own_cqe_in_any_order_and_stale_tokens_are_strays() {
        let mut s = SrqSlots::new(3).unwrap();
        let a = s.admit(10).unwrap();
        let b = s.admit(11).unwrap();
        let c = s.admit(12).unwrap();
        assert_eq!(s.admit(13), None, "full");
        assert_eq!(s.on_cqe(b, 0, 0, 128, None).unwrap().wr_id, 11);
        assert!(s.on_cqe(b, 0, 0, 128, None).is_none(), "twice is a stray");
        let d = s.admit(14).unwrap();
        assert_eq!(d & SLOT_MASK, b & SLOT_MASK, "the freed slot is reused");
        assert!(s.on_cqe(b, 0, 0, 128, None).is_none(), "an old generation is a stray");
        let r = s.on_cqe(c, 5, 9, 0, Some(4)).unwrap();
        assert_eq!((r.wr_id, r.status, r.opcode, r.vendor_err, r.remote_inv), (12, 5, WC_RECV, 9, None));
        assert_eq!(s.on_cqe(d, 0, 0, 129, Some(7)).unwrap().remote_inv, Some(7));
        let mut rest = Vec::new();
        s.release_all(|r| rest.push((r.wr_id, r.status, r.never_posted)));
        assert_eq!(rest, vec![(10, WC_WR_FLUSH_ERR, true)]);
        let _ = a;
        assert_eq!((s.posted(), s.stray_cqes), (0, 2));
    }
}
