//! The in-flight ring: one small record per SQ (or RQ) slot, indexed by sequence number.
//!
//! Sequences only grow. `tail..head` are the posted WRs not yet released; among them `tail..done` are proven
//! complete by a polled CQE and wait only for their release to be handed out. Storage is a power of two at least
//! the queue depth, allocated once at creation.

use crate::alloc;
use crate::error::Result;

/// What the library remembers about one posted WR: 16 bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Slot {
    /// The ULP's own wr_id (0 for the library's own markers).
    pub wr_id: u64,
    /// Vendor error of the completion that finished this WR (valid once complete).
    pub vendor_err: u32,
    /// `ibv_wc_opcode` of the WR as posted.
    pub opcode: u8,
    /// `Slot::*` flag bits.
    pub flags: u8,
    /// `ibv_wc_status` of the completion that finished this WR (valid once complete).
    pub status: u8,
    /// Unused; keeps the record at 16 bytes.
    pub _pad: u8,
}

impl Slot {
    /// The ULP asked for a completion (`IBV_SEND_SIGNALED`).
    pub const ULP_SIGNALED: u8 = 1;
    /// Posted signaled (by request or by the policy).
    pub const SIGNALED: u8 = 2;
    /// A WR of the library's own (idle-tail or drain marker): never shown, never released to the ULP.
    pub const INTERNAL: u8 = 4;
    /// Its own CQE retired it (as opposed to a later CQE: the completion is implied).
    pub const OWN_CQE: u8 = 8;
    /// An operation the library posts for the ULP (a deferred LocalInv): never shown by poll; its release goes to
    /// the operation's own completion handler. `wr_id` holds the operation's id.
    pub const OP: u8 = 16;
    /// A receive whose SEND_WITH_INV invalidated an rkey; `vendor_err` holds that rkey (success CQEs have no
    /// vendor error).
    pub const REMOTE_INV: u8 = 32;

    #[inline]
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

#[derive(Debug)]
pub struct SlotRing {
    slots: Box<[Slot]>,
    mask: u64,
    head: u64,
    done: u64,
    tail: u64,
}

impl SlotRing {
    /// A ring for `depth` WRs (`what` names it in the `ENOMEM` error if its storage cannot be allocated).
    pub fn new(depth: u32, what: &str) -> Result<SlotRing> {
        let cap = (depth.max(1) as usize).next_power_of_two();
        let slots = alloc::boxed_slice(cap, Slot::default(), what)?;
        Ok(SlotRing { slots, mask: cap as u64 - 1, head: 0, done: 0, tail: 0 })
    }

    /// Number of slots of storage (bytes per slot: `size_of::<Slot>()`).
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }
    #[inline]
    pub fn head(&self) -> u64 {
        self.head
    }
    #[inline]
    pub fn done(&self) -> u64 {
        self.done
    }
    #[inline]
    pub fn tail(&self) -> u64 {
        self.tail
    }
    /// Posted and not yet released.
    #[inline]
    pub fn outstanding(&self) -> u64 {
        self.head - self.tail
    }
    /// Posted and not yet proven complete by a CQE: what the provider still holds.
    #[inline]
    pub fn in_provider(&self) -> u64 {
        self.head - self.done
    }

    /// Appends a slot; the caller has checked credits. The slot's `status` and `vendor_err` must be 0: a
    /// pending slot holds a success until its completion says otherwise, so that `complete_through` need not
    /// write the slots a CQE covers.
    #[inline]
    pub fn push(&mut self, slot: Slot) -> u64 {
        debug_assert!(self.outstanding() < self.slots.len() as u64);
        debug_assert!(slot.status == 0 && slot.vendor_err == 0);
        let seq = self.head;
        self.slots[(seq & self.mask) as usize] = slot;
        self.head += 1;
        seq
    }

    /// The storage, its index mask and the next sequence number, for a writer that fills slots `head..` with
    /// locals and then stores the new head once (`set_head`): `send::Admission`. The same rule as `push`
    /// holds for every slot it writes (status and vendor error 0).
    #[inline]
    pub fn storage(&mut self) -> (&mut [Slot], u64, u64) {
        (&mut self.slots, self.mask, self.head)
    }

    /// Ends a bulk write begun with `storage`: every slot before `head` is posted.
    #[inline]
    pub fn set_head(&mut self, head: u64) {
        debug_assert!(head >= self.head && head - self.tail <= self.slots.len() as u64);
        self.head = head;
    }

    /// Removes the newest `n` slots (the provider refused them).
    pub fn unpush(&mut self, n: u64) {
        debug_assert!(n <= self.head - self.done);
        self.head -= n;
    }

    #[inline]
    pub fn get(&self, seq: u64) -> &Slot {
        &self.slots[(seq & self.mask) as usize]
    }
    #[inline]
    pub fn get_mut(&mut self, seq: u64) -> &mut Slot {
        &mut self.slots[(seq & self.mask) as usize]
    }

    /// Whether `seq` is posted and not yet proven complete.
    #[inline]
    pub fn is_pending(&self, seq: u64) -> bool {
        seq >= self.done && seq < self.head
    }

    /// Marks every slot up to and including `seq` complete: `seq` with the CQE's status, earlier ones
    /// (covered by it) successful. Those already say so: `push` stored them with status 0 and vendor error 0,
    /// and nothing writes a pending slot's status but this and `complete_all`, which end its pendency.
    #[inline]
    pub fn complete_through(&mut self, seq: u64, status: u8, vendor_err: u32) {
        debug_assert!(self.is_pending(seq));
        debug_assert!((self.done..seq).all(|k| self.get(k).status == 0 && self.get(k).vendor_err == 0));
        let s = self.get_mut(seq);
        s.status = status;
        s.vendor_err = vendor_err;
        s.flags |= Slot::OWN_CQE;
        self.done = seq + 1;
    }

    /// Marks every pending slot complete with `status`: no CQE will come for them (their QP or CQ is in error).
    pub fn complete_all(&mut self, status: u8) {
        while self.done < self.head {
            let s = self.get_mut(self.done);
            s.status = status;
            s.vendor_err = 0;
            self.done += 1;
        }
    }

    /// Takes the oldest complete, unreleased slot unless it has one of the `skip` flags (then it stays).
    #[inline]
    pub fn pop_done_without(&mut self, skip: u8) -> Option<Slot> {
        if self.tail == self.done {
            return None;
        }
        let slot = *self.get(self.tail);
        if slot.flags & skip != 0 {
            return None;
        }
        self.tail += 1;
        Some(slot)
    }

    /// Takes the oldest complete, unreleased slot.
    #[inline]
    pub fn pop_done(&mut self) -> Option<(u64, Slot)> {
        if self.tail == self.done {
            return None;
        }
        let seq = self.tail;
        self.tail += 1;
        Some((seq, *self.get(seq)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_is_sixteen_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 16);
    }

    #[test]
    fn covered_slots_complete_successfully_and_pop_in_order() {
        let mut r = SlotRing::new(5, "test").unwrap();
        assert_eq!(r.capacity(), 8);
        for i in 0..4 {
            r.push(Slot { wr_id: 100 + i, ..Slot::default() });
        }
        r.complete_through(2, 5, 9);
        assert_eq!(r.outstanding(), 4);
        assert_eq!(r.in_provider(), 1);
        let popped: Vec<_> = std::iter::from_fn(|| r.pop_done()).collect();
        assert_eq!(popped.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!((popped[0].1.status, popped[0].1.has(Slot::OWN_CQE)), (0, false));
        assert_eq!((popped[2].1.status, popped[2].1.vendor_err, popped[2].1.has(Slot::OWN_CQE)), (5, 9, true));
        assert!(r.is_pending(3) && !r.is_pending(2) && !r.is_pending(4));
    }

    #[test]
    fn a_reused_slot_is_covered_as_a_success() {
        let mut r = SlotRing::new(2, "test").unwrap();
        for _ in 0..2 {
            let seq = r.push(Slot::default());
            r.complete_through(seq, 5, 9);
            assert_eq!(r.pop_done().unwrap().1.status, 5);
        }
        let a = r.push(Slot { wr_id: 1, ..Slot::default() });
        let b = r.push(Slot { wr_id: 2, ..Slot::default() });
        r.complete_through(b, 0, 0);
        let (seq, covered) = r.pop_done().unwrap();
        assert_eq!((seq, covered.wr_id, covered.status, covered.vendor_err, covered.has(Slot::OWN_CQE)), (a, 1, 0, 0, false));
    }

    #[test]
    fn wraps_around_storage() {
        let mut r = SlotRing::new(2, "test").unwrap();
        for i in 0..100u64 {
            let seq = r.push(Slot { wr_id: i, ..Slot::default() });
            r.complete_through(seq, 0, 0);
            assert_eq!(r.pop_done().unwrap().1.wr_id, i);
        }
    }
}
