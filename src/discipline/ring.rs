//! The in-flight ring: one small record per SQ (or RQ) slot, indexed by sequence number.
//!
//! Sequences only grow. `tail..head` are the posted WRs not yet released; among them `tail..done` are proven
//! complete by a polled CQE and wait only for their release to be handed out. Storage is a power of two at least
//! the queue depth, allocated once at creation.

use std::cell::Cell;

use crate::alloc;
use crate::error::Result;

/// What the library remembers about one posted WR: 16 bytes, two words, so that filling one is two stores and
/// reading one two loads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Slot {
    /// The ULP's own wr_id (0 for the library's own markers).
    pub wr_id: u64,
    /// Bits 0-7: the `ibv_wc_opcode` of the WR as posted; 8-15: `Slot::*` flag bits; 16-23: the `ibv_wc_status`
    /// of the completion that finished it (valid once complete); 32-63: that completion's vendor error.
    meta: u64,
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
    /// A late CQE of this WR (one that came after a later WQE's CQE had retired it) was shown to the ULP: a
    /// second one is not (`SendState::on_stray_cqe`).
    pub const LATE_SHOWN: u8 = 64;

    /// A pending slot: status 0 and vendor error 0 until its completion says otherwise.
    #[inline]
    pub fn new(wr_id: u64, opcode: u8, flags: u8) -> Slot {
        Slot { wr_id, meta: opcode as u64 | (flags as u64) << 8 }
    }
    /// A slot posted unsignaled, pending: `Slot::new(wr_id, wc_opcode, 0)` for an opcode already known to be below
    /// 256 (`quiet_wc_opcode`), with no conversion on the quiet run's path.
    #[inline]
    pub fn unsignaled(wr_id: u64, wc_opcode: u32) -> Slot {
        debug_assert!(wc_opcode <= u32::from(u8::MAX));
        Slot { wr_id, meta: u64::from(wc_opcode) }
    }
    /// The second word as a whole: two slots with the same one give the same completion but for the wr_id.
    #[inline]
    pub fn meta(&self) -> u64 {
        self.meta
    }
    #[inline]
    pub fn opcode(&self) -> u8 {
        self.meta as u8
    }
    #[inline]
    pub fn flags(&self) -> u8 {
        (self.meta >> 8) as u8
    }
    #[inline]
    pub fn status(&self) -> u8 {
        (self.meta >> 16) as u8
    }
    #[inline]
    pub fn vendor_err(&self) -> u32 {
        (self.meta >> 32) as u32
    }
    #[inline]
    pub fn set_opcode(&mut self, opcode: u8) {
        self.meta = (self.meta & !0xff) | opcode as u64;
    }
    #[inline]
    pub fn add_flags(&mut self, flags: u8) {
        self.meta |= (flags as u64) << 8;
    }
    #[inline]
    pub fn set_status(&mut self, status: u8) {
        self.meta = (self.meta & !(0xff << 16)) | (status as u64) << 16;
    }
    #[inline]
    pub fn set_vendor_err(&mut self, vendor_err: u32) {
        self.meta = (self.meta & 0xffff_ffff) | (vendor_err as u64) << 32;
    }

    #[inline]
    pub fn has(&self, flag: u8) -> bool {
        self.flags() & flag != 0
    }
}

/// The bits of a slot's second word on which two slots must agree for their releases to share a batch
/// (`Queue::set_release_batch`): the status, the vendor error, and the flags of a slot never released as one of
/// the ULP's WRs (`Slot::INTERNAL`, `Slot::OP`). Two slots without those flags that agree on them give the same
/// completion but for the wr_id, the opcode and whether it was implied.
const BATCH_KEY: u64 = !0xffff | ((Slot::INTERNAL | Slot::OP) as u64) << 8;

/// Copies to `out` (at least as long as `slots`) the wr_ids of the slots from the first up to the first whose
/// second word's `BATCH_KEY` bits differ from `like`'s; returns how many it copied. Eight slots at a time
/// while all eight match (their second words compared with `like` whole, which most are equal to, and only if
/// one is not, under the key; then their wr_ids copied), then one at a time.
#[inline(always)]
pub fn copy_alike_wr_ids(slots: &[Cell<Slot>], out: &mut [u64], like: u64) -> usize {
    let key = like & BATCH_KEY;
    let out = &mut out[..slots.len()];
    let mut n = 0;
    for (chunk, out) in slots.chunks_exact(8).zip(out.chunks_exact_mut(8)) {
        if !chunk.iter().all(|s| s.get().meta == like)
            && chunk.iter().any(|s| s.get().meta & BATCH_KEY != key)
        {
            break;
        }
        for (s, out) in chunk.iter().zip(out) {
            *out = s.get().wr_id;
        }
        n += 8;
    }
    for (s, out) in slots[n..].iter().zip(&mut out[n..]) {
        let s = s.get();
        if s.meta & BATCH_KEY != key {
            break;
        }
        *out = s.wr_id;
        n += 1;
    }
    n
}

/// How many slots from the first of `slots` belong in one batch with a slot whose second word is `like`:
/// `copy_alike_wr_ids`'s count, for an indexed queue's batch, which carries no wr_ids.
#[inline]
pub fn count_alike(slots: &[Cell<Slot>], like: u64) -> usize {
    let key = like & BATCH_KEY;
    slots.iter().take_while(|s| s.get().meta & BATCH_KEY == key).count()
}

/// Copies to `out` (at least as long as `slots`) the wr_ids of `slots`: a run of releases known to be one batch
/// (`SlotRing::is_plain_from`, on a queue that has not failed), with nothing to compare.
#[inline(always)]
pub fn copy_wr_ids(slots: &[Cell<Slot>], out: &mut [u64]) {
    let out = &mut out[..slots.len()];
    // Eight at a time, as plain loads and stores: the compiler's vectorized form of the loop de-interleaves the
    // slots' two words at more instructions per wr_id than this.
    let (mut from, mut to) = (slots.chunks_exact(8), out.chunks_exact_mut(8));
    for (s, o) in (&mut from).zip(&mut to) {
        for k in 0..8 {
            o[k] = s[k].get().wr_id;
        }
    }
    for (s, o) in from.remainder().iter().zip(to.into_remainder()) {
        *o = s.get().wr_id;
    }
}

/// The ring's fields are cells: the release loop reads and advances it between release callbacks without
/// holding a borrow of the rest of the queue's state (a callback may post, which pushes at `head`; only the
/// release loop moves `tail`).
#[derive(Debug)]
pub struct SlotRing {
    slots: Box<[Cell<Slot>]>,
    mask: u64,
    head: Cell<u64>,
    done: Cell<u64>,
    tail: Cell<u64>,
    /// One past the newest slot pushed with `INTERNAL` or `OP` (0 before any): the slots from it on are the
    /// ULP's WRs, so a release run there needs no test of their flags (`is_plain_from`).
    special_end: Cell<u64>,
}

impl SlotRing {
    /// A ring for `depth` WRs (`what` names it in the `ENOMEM` error if its storage cannot be allocated).
    pub fn new(depth: u32, what: &str) -> Result<SlotRing> {
        let cap = (depth.max(1) as usize).next_power_of_two();
        let slots = alloc::boxed_slice(cap, Cell::new(Slot::default()), what)?;
        Ok(SlotRing {
            slots,
            mask: cap as u64 - 1,
            head: Cell::new(0),
            done: Cell::new(0),
            tail: Cell::new(0),
            special_end: Cell::new(0),
        })
    }

    /// Number of slots of storage (bytes per slot: `size_of::<Slot>()`).
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }
    #[inline]
    pub fn head(&self) -> u64 {
        self.head.get()
    }
    #[inline]
    pub fn done(&self) -> u64 {
        self.done.get()
    }
    #[inline]
    pub fn tail(&self) -> u64 {
        self.tail.get()
    }
    /// Posted and not yet released.
    #[inline]
    pub fn outstanding(&self) -> u64 {
        self.head.get() - self.tail.get()
    }
    /// Posted and not yet proven complete by a CQE: what the provider still holds.
    #[inline]
    pub fn in_provider(&self) -> u64 {
        self.head.get() - self.done.get()
    }

    /// Appends a slot; the caller has checked credits. The slot's `status` and `vendor_err` must be 0: a
    /// pending slot holds a success until its completion says otherwise, so that `complete_through` need not
    /// write the slots a CQE covers.
    #[inline]
    pub fn push(&self, slot: Slot) -> u64 {
        debug_assert!(self.outstanding() < self.slots.len() as u64);
        debug_assert!(slot.status() == 0 && slot.vendor_err() == 0);
        let seq = self.head.get();
        self.slots[(seq & self.mask) as usize].set(slot);
        self.head.set(seq + 1);
        if slot.flags() & (Slot::INTERNAL | Slot::OP) != 0 {
            self.special_end.set(seq + 1);
        }
        seq
    }

    /// `push` of a slot the caller knows to hold one of the ULP's WRs (neither `INTERNAL` nor `OP`), in line.
    #[inline(always)]
    pub fn push_plain(&self, slot: Slot) -> u64 {
        debug_assert!(self.outstanding() < self.slots.len() as u64);
        debug_assert!(slot.status() == 0 && slot.vendor_err() == 0 && slot.flags() & (Slot::INTERNAL | Slot::OP) == 0);
        let seq = self.head.get();
        self.slots[(seq & self.mask) as usize].set(slot);
        self.head.set(seq + 1);
        seq
    }

    /// Whether every slot from `seq` on holds a WR of the ULP's (none has `INTERNAL` or `OP`; bulk writes through
    /// `free_run` hold only the ULP's WRs).
    #[inline]
    pub fn is_plain_from(&self, seq: u64) -> bool {
        self.special_end.get() <= seq
    }

    /// The free slots from `head` up to the end of the storage (where the next ones wrap to its start), at most
    /// `max`, and `head`: for a writer that fills them in order with the same rule as `push` (status and vendor
    /// error 0) and then stores the new head once (`set_head`): `send::Admission`. A slice, so that the writer
    /// indexes nothing.
    #[inline]
    pub fn free_run(&self, max: u64) -> (&[Cell<Slot>], u64) {
        let head = self.head.get();
        let at = (head & self.mask) as usize;
        let free = &self.slots[at..];
        (&free[..free.len().min(max as usize)], head)
    }

    /// The slots of the `len` (at most the capacity) consecutive sequence numbers from `seq`, in order: the part
    /// up to the storage's end and the part that wrapped to its start. Slices, so that a reader walking them
    /// along the ULP's chain keeps them in registers (its stores into the chain may alias the ring's fields).
    #[inline]
    pub fn slots_of(&self, seq: u64, len: u64) -> (&[Cell<Slot>], &[Cell<Slot>]) {
        debug_assert!(len <= self.slots.len() as u64);
        let at = (seq & self.mask) as usize;
        let len = len as usize;
        let first = (self.slots.len() - at).min(len);
        (&self.slots[at..at + first], &self.slots[..len - first])
    }

    /// `slots_of`, sliced so that only a run that wraps has a length to check: for the walks that run once per
    /// call (the restore, a batch's copy), where that set-up is most of their cost on a short run. (The per-WR
    /// release loop keeps `slots_of`, around which the compiler allocates its registers better.)
    #[inline]
    pub fn run_slots(&self, seq: u64, len: u64) -> (&[Cell<Slot>], &[Cell<Slot>]) {
        debug_assert!(len <= self.slots.len() as u64);
        let (before, from) = self.slots.split_at((seq & self.mask) as usize);
        let len = len as usize;
        if len <= from.len() {
            (&from[..len], &[])
        } else {
            (from, &before[..len - from.len()])
        }
    }

    /// Ends a bulk write begun with `free_run`: every slot before `head` is posted.
    #[inline]
    pub fn set_head(&self, head: u64) {
        debug_assert!(head >= self.head.get() && head - self.tail.get() <= self.slots.len() as u64);
        self.head.set(head);
    }

    /// The release loop handed out every slot before `tail` (see `send::SendLedger`).
    #[inline]
    pub fn set_tail(&self, tail: u64) {
        debug_assert!(tail >= self.tail.get() && tail <= self.done.get());
        self.tail.set(tail);
    }

    /// Removes the newest `n` slots (the provider refused them).
    pub fn unpush(&self, n: u64) {
        debug_assert!(n <= self.head.get() - self.done.get());
        self.head.set(self.head.get() - n);
    }

    #[inline]
    pub fn get(&self, seq: u64) -> Slot {
        self.slots[(seq & self.mask) as usize].get()
    }
    /// Changes the slot of `seq` in place.
    #[inline]
    pub fn update(&self, seq: u64, f: impl FnOnce(&mut Slot)) {
        let cell = &self.slots[(seq & self.mask) as usize];
        let mut s = cell.get();
        f(&mut s);
        cell.set(s);
    }

    /// Whether `seq` is posted and not yet proven complete.
    #[inline]
    pub fn is_pending(&self, seq: u64) -> bool {
        seq >= self.done.get() && seq < self.head.get()
    }

    /// Marks every slot up to and including `seq` complete: `seq` with the CQE's status, earlier ones
    /// (covered by it) successful. Those already say so: `push` stored them with status 0 and vendor error 0,
    /// and nothing writes a pending slot's status but this and `complete_all`, which end its pendency.
    #[inline]
    pub fn complete_through(&self, seq: u64, status: u8, vendor_err: u32) {
        debug_assert!(self.is_pending(seq));
        debug_assert!((self.done.get()..=seq).all(|k| self.get(k).status() == 0 && self.get(k).vendor_err() == 0));
        self.update(seq, |s| {
            // The common CQE, a success, leaves status and vendor error as the slot holds them: 0 (`push`,
            // `free_run`).
            if status != 0 || vendor_err != 0 {
                s.set_status(status);
                s.set_vendor_err(vendor_err);
            }
            s.add_flags(Slot::OWN_CQE);
        });
        self.done.set(seq + 1);
    }

    /// Marks every pending slot complete with `status`: no CQE will come for them (their QP or CQ is in error).
    pub fn complete_all(&self, status: u8) {
        while self.done.get() < self.head.get() {
            self.update(self.done.get(), |s| {
                s.set_status(status);
                s.set_vendor_err(0);
            });
            self.done.set(self.done.get() + 1);
        }
    }

    /// Takes the oldest complete, unreleased slot unless it has one of the `skip` flags (then it stays).
    #[inline]
    pub fn pop_done_without(&self, skip: u8) -> Option<Slot> {
        let tail = self.tail.get();
        if tail == self.done.get() {
            return None;
        }
        let slot = self.get(tail);
        if slot.flags() & skip != 0 {
            return None;
        }
        self.tail.set(tail + 1);
        Some(slot)
    }

    /// Takes the oldest complete, unreleased slot.
    #[inline]
    pub fn pop_done(&self) -> Option<(u64, Slot)> {
        let seq = self.tail.get();
        if seq == self.done.get() {
            return None;
        }
        self.tail.set(seq + 1);
        Some((seq, self.get(seq)))
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
        let r = SlotRing::new(5, "test").unwrap();
        assert_eq!(r.capacity(), 8);
        for i in 0..4 {
            r.push(Slot::new(100 + i, 0, 0));
        }
        r.complete_through(2, 5, 9);
        assert_eq!(r.outstanding(), 4);
        assert_eq!(r.in_provider(), 1);
        let popped: Vec<_> = std::iter::from_fn(|| r.pop_done()).collect();
        assert_eq!(popped.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!((popped[0].1.status(), popped[0].1.has(Slot::OWN_CQE)), (0, false));
        assert_eq!((popped[2].1.status(), popped[2].1.vendor_err(), popped[2].1.has(Slot::OWN_CQE)), (5, 9, true));
        assert!(r.is_pending(3) && !r.is_pending(2) && !r.is_pending(4));
    }

    #[test]
    fn a_reused_slot_is_covered_as_a_success() {
        let r = SlotRing::new(2, "test").unwrap();
        for _ in 0..2 {
            let seq = r.push(Slot::default());
            r.complete_through(seq, 5, 9);
            assert_eq!(r.pop_done().unwrap().1.status(), 5);
        }
        let a = r.push(Slot::new(1, 0, 0));
        let b = r.push(Slot::new(2, 0, 0));
        r.complete_through(b, 0, 0);
        let (seq, covered) = r.pop_done().unwrap();
        assert_eq!((seq, covered.wr_id, covered.status(), covered.vendor_err(), covered.has(Slot::OWN_CQE)), (a, 1, 0, 0, false));
    }

    /// `is_plain_from` holds from one past the newest slot pushed with `INTERNAL` or `OP` on, whatever came
    /// after it, and `copy_wr_ids` copies every wr_id of a run.
    #[test]
    fn the_ulps_run_begins_after_the_newest_internal_or_op_slot() {
        let r = SlotRing::new(8, "test").unwrap();
        assert!(r.is_plain_from(0));
        r.push(Slot::new(1, 0, 0));
        r.push(Slot::new(2, 0, Slot::INTERNAL | Slot::SIGNALED));
        r.push(Slot::new(3, 0, Slot::SIGNALED | Slot::ULP_SIGNALED));
        assert!(!r.is_plain_from(0) && !r.is_plain_from(1));
        assert!(r.is_plain_from(2) && r.is_plain_from(3));
        r.push(Slot::new(4, 0, Slot::OP | Slot::SIGNALED));
        r.push(Slot::new(5, 0, 0));
        assert!(!r.is_plain_from(3) && r.is_plain_from(4));
        let (a, b) = r.slots_of(0, 5);
        let mut out = [0u64; 8];
        copy_wr_ids(a, &mut out);
        copy_wr_ids(b, &mut out[a.len()..]);
        assert_eq!(out[..5], [1, 2, 3, 4, 5]);
    }

    /// `copy_wr_ids` copies exactly the run's wr_ids, whole groups of eight and the rest, and nothing beyond.
    #[test]
    fn copy_wr_ids_copies_every_length_exactly() {
        let slots: Vec<Cell<Slot>> = (0..40).map(|i| Cell::new(Slot::new(1000 + i, 2, 0))).collect();
        for len in 0..=slots.len() {
            let mut out = [u64::MAX; 48];
            copy_wr_ids(&slots[..len], &mut out);
            assert!(out[..len].iter().enumerate().all(|(i, &w)| w == 1000 + i as u64), "length {len}");
            assert!(out[len..].iter().all(|&w| w == u64::MAX), "length {len}: written past the run");
        }
    }

    /// `copy_alike_wr_ids` (and `count_alike`) stops where a slot by slot walk would, whatever the length and
    /// wherever the first slot that does not belong (same opcode and flags but another status or vendor error,
    /// or an `INTERNAL` or `OP` flag, or nothing but another opcode and flags, which belongs), and copies exactly
    /// those wr_ids.
    #[test]
    fn copy_alike_wr_ids_stops_where_the_run_does() {
        let like = Slot::new(0, 2, 0).meta;
        let unlike = |kind: usize| {
            let mut s = Slot::new(0, 2, 0);
            match kind {
                0 => s.set_status(5),
                1 => s.set_vendor_err(9),
                2 => s.add_flags(Slot::INTERNAL),
                _ => s.add_flags(Slot::OP),
            }
            s.meta
        };
        // A slot that belongs though its second word is not `like`'s: another opcode, signaled, its own CQE.
        let mut alike = Slot::new(0, 4, Slot::SIGNALED | Slot::ULP_SIGNALED);
        alike.add_flags(Slot::OWN_CQE);
        for len in 0..40usize {
            for stop in 0..=len {
                for kind in 0..4 {
                    for odd in [None, Some(stop / 2), Some(stop.saturating_sub(1))] {
                        let slots: Vec<Cell<Slot>> = (0..len)
                            .map(|i| {
                                let meta = if i == stop {
                                    unlike(kind)
                                } else if Some(i) == odd && i < stop {
                                    alike.meta
                                } else {
                                    like
                                };
                                Cell::new(Slot { wr_id: 1000 + i as u64, meta })
                            })
                            .collect();
                        let mut out = vec![0u64; len];
                        let n = copy_alike_wr_ids(&slots, &mut out, like);
                        let want = (0..len).take_while(|&i| i != stop).count();
                        assert_eq!(n, want, "len {len} stop {stop} kind {kind} odd {odd:?}");
                        assert_eq!(count_alike(&slots, like), want, "count_alike: len {len} stop {stop} kind {kind} odd {odd:?}");
                        assert_eq!(out[..n], (0..n as u64).map(|i| 1000 + i).collect::<Vec<_>>()[..]);
                    }
                }
            }
        }
    }

    #[test]
    fn wraps_around_storage() {
        let r = SlotRing::new(2, "test").unwrap();
        for i in 0..100u64 {
            let seq = r.push(Slot::new(i, 0, 0));
            r.complete_through(seq, 0, 0);
            assert_eq!(r.pop_done().unwrap().1.wr_id, i);
        }
    }
}
