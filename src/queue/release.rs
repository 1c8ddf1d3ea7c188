//! The release pass of a managed queue: the CQEs it is given, then its WRs released in post order, one by one
//! or in batches, with its deferred actions, operations and parked WRs in their places.

use crate::attach::CqeFate;
use crate::completion::Completion;
use crate::discipline::ring::{copy_alike_wr_ids, copy_wr_ids, count_alike};
use crate::cq::{OutOfOrder, SQD_OUT_OF_ORDER_SHOWN, SQD_OUT_OF_ORDER_ULP_WR};
use crate::discipline::send::{CqeOutcome, LateCqe};
use crate::discipline::Slot;
use crate::discipline::token::{Direction, Token};
use crate::release::{ReleaseHandler, call};
use crate::verbs::pump_backlog;

use super::{Action, Batcher, ClearOnDrop, QueueShared, QueueState};

/// The release of a posted WR whose slot the ring just gave up (as `Completion::from` a `Release` of it).
#[inline]
fn completion_of(slot: &Slot) -> Completion {
    Completion {
        wr_id: slot.wr_id,
        status: slot.status() as u32,
        opcode: slot.opcode() as u32,
        vendor_err: slot.vendor_err(),
        flags: if slot.has(Slot::OWN_CQE) { 0 } else { crate::completion::SQD_COMPLETION_IMPLIED },
        invalidated_rkey: 0,
        modified_sge: 0,
    }
}

impl QueueShared {
    /// Processes one CQE of this queue, then hands out every release it made due.
    pub(crate) fn on_cqe(&self, token: Token, status: u8, vendor_err: u32, wc_opcode: u8, remote_inv: Option<u32>) -> CqeFate {
        let fate = {
            let mut st = self.state.borrow_mut();
            match token.direction() {
                Direction::Send => match st.send.on_cqe(token, status, vendor_err) {
                    CqeOutcome::Visible { wr_id } => CqeFate::Visible(wr_id),
                    CqeOutcome::Hidden | CqeOutcome::Late => CqeFate::Hidden,
                    CqeOutcome::Stray => return CqeFate::Stray,
                    CqeOutcome::OutOfOrder => {
                        let late = st.send.take_late_cqe().expect("on_cqe kept the late CQE");
                        drop(st);
                        return self.on_out_of_order(late, token, status, vendor_err, wc_opcode);
                    }
                },
                Direction::Recv => match st.recv.as_mut() {
                    Some(r) => match {
                        self.recv_due.set(true);
                        r.on_cqe(token, status, vendor_err, wc_opcode, remote_inv)
                    } {
                        Some(wr_id) => CqeFate::Visible(wr_id),
                        None if r.is_abandoned() => CqeFate::Hidden,
                        None => return CqeFate::Stray,
                    },
                    None => return CqeFate::Stray,
                },
            }
        };
        self.run_releases();
        fate
    }

    /// A CQE of a WQE that a later WQE's CQE already retired (`SendState::on_stray_cqe`): recorded in the queue
    /// and its send CQ, described once through the queue's hook, and shown when the ULP signaled the WR.
    #[cold]
    #[inline(never)]
    fn on_out_of_order(&self, late: LateCqe, token: Token, status: u8, vendor_err: u32, wc_opcode: u8) -> CqeFate {
        let one = OutOfOrder {
            count: 1,
            shown: u64::from(late.show),
            wqe: late.seq,
            wr_id: late.wr_id.unwrap_or(token.0),
            qp_num: self.qp_num(),
            opcode: u32::from(wc_opcode),
            status: u32::from(status),
            vendor_err,
            flags: if late.wr_id.is_some() { SQD_OUT_OF_ORDER_ULP_WR } else { 0 }
                | if late.show { SQD_OUT_OF_ORDER_SHOWN } else { 0 },
            _reserved0: 0,
        };
        let first = {
            let mut st = self.state.borrow_mut();
            let first = st.out_of_order.count == 0;
            st.out_of_order.add(&one);
            first
        };
        self.send_cq.note_out_of_order(&one);
        if first {
            if let (Some(hook), Some(text)) = (self.out_of_order_hook.take(), one.describe()) {
                hook(&text);
                // Put back unless the hook set another.
                let newer = self.out_of_order_hook.take();
                self.out_of_order_hook.set(newer.or(Some(hook)));
            }
        }
        // An error status failed the queue: what that makes due is handed out now.
        self.run_releases();
        match late.wr_id {
            Some(wr_id) if late.show => CqeFate::Visible(wr_id),
            _ => CqeFate::Stray,
        }
    }

    /// Hands out due releases and deferred actions in order, then posts parked WRs that now have credits. A
    /// call from inside a callback returns at once: the outer loop picks up what the callback made due.
    #[inline]
    pub(crate) fn run_releases(&self) {
        if self.releasing.replace(true) {
            return;
        }
        if let Some(b) = self.batcher.get() {
            // A handler of failures only, on a queue that does not verify buffers: a CQE that retired successes
            // alone and left nothing else due ends here, without the pass (nothing is called).
            if !b.successes && !self.verifying && self.release_quiet_successes() {
                self.releasing.set(false);
                return;
            }
            (b.pass)(self);
        } else {
            (self.plain_releases)(self);
        }
    }

    /// For a batch handler of failures only (`Queue::set_release_failures`), at the start of a release pass: releases the
    /// complete slots from the tail if they are all successes of the ULP's WRs (up to the first deferred
    /// action's barrier), as `release_batched` would without a call; whether the pass is then over
    /// (`release_pass_done`). Under `SendLedger`'s contract, as the release loops are.
    #[inline(always)]
    fn release_quiet_successes(&self) -> bool {
        let ledger = &*self.ledger;
        let ring = &ledger.ring;
        let (tail, released) = (ring.tail(), ledger.released());
        let n = (ring.done() - tail).min(ledger.first_barrier().saturating_sub(released));
        if n > 0 {
            self.release_if_successes(tail, released, n);
        }
        self.release_pass_done()
    }

    /// Releases the `n` complete slots from `tail` (`released` before them) without a call if they are all
    /// successes of the ULP's WRs (the ring plain from `tail`, the queue not failed); whether it did. For a
    /// batch handler of failures only.
    #[inline(always)]
    fn release_if_successes(&self, tail: u64, released: u64, n: u64) -> bool {
        let ledger = &*self.ledger;
        let successes = ledger.ring.is_plain_from(tail) && !ledger.has_failed();
        if successes {
            ledger.set_released(tail + n, released + n);
        }
        successes
    }

    /// `run_releases` for a queue without a batch handler: the per-WR pass, with or without the verifier.
    #[inline(never)]
    pub(super) fn run_plain_releases(&self) {
        let _guard = ClearOnDrop(&self.releasing);
        if self.verifying {
            self.run_release_loop::<true, false>();
        } else {
            self.run_release_loop::<false, false>();
        }
    }

    /// `run_plain_releases` for an indexed queue that does not verify buffers: the per-WR releases carry
    /// indexes. A function of its own (`QueueShared::plain_releases` picks it): chosen inside
    /// `run_plain_releases`, it cost that one's per-WR loop a register (an instruction per release).
    #[inline(never)]
    pub(super) fn run_indexed_releases(&self) {
        let _guard = ClearOnDrop(&self.releasing);
        self.run_release_loop::<false, true>();
    }

    /// `release_loop` with the queue's release handler. The handler, `VERIFY` (`self.verifying`) and `INDEXED`
    /// (`self.indexed`, for the common releases) are fixed for the queue's life: decided once per call, not per
    /// release.
    #[inline(always)]
    fn run_release_loop<const VERIFY: bool, const INDEXED: bool>(&self) {
        match &self.release {
            Some(ReleaseHandler::Foreign(f)) => self.release_loop::<VERIFY, false, INDEXED, false>(|c| f.call(c)),
            Some(ReleaseHandler::Closure(f)) => self.release_loop::<VERIFY, false, INDEXED, false>(|c| f(c)),
            None => self.release_loop::<VERIFY, false, INDEXED, false>(|_| {}),
        }
    }

    /// `run_release_loop` for a queue with a batch handler (and so with a release handler), with indexes
    /// instead of wr_ids if `INDEXED`, and batches of successes released without a call if `QUIET`
    /// (`Queue::set_release_failures`): the batcher's `pass`, picked when the handler is set. Marked cold only to
    /// keep it off the straight line of the per-WR handler's pass, whose registers it would otherwise disturb
    /// (10 instructions per WR).
    #[cold]
    #[inline(never)]
    pub(super) fn run_batched_release_loop<const INDEXED: bool, const QUIET: bool>(&self) {
        let _guard = ClearOnDrop(&self.releasing);
        let h = self.release.as_ref();
        if self.verifying {
            self.release_loop::<true, true, false, false>(|c| call(h, c));
        } else {
            self.release_loop::<false, true, INDEXED, QUIET>(|c| call(h, c));
        }
    }

    /// The loop of `run_releases`, with the queue's release handler as `release`: the common releases
    /// (`release_common`), and the rest of the pass out of line only when something else may be due.
    #[inline(always)]
    fn release_loop<const VERIFY: bool, const BATCH: bool, const INDEXED: bool, const QUIET: bool>(&self, release: impl Fn(&Completion)) {
        if !VERIFY {
            self.release_common::<BATCH, INDEXED, QUIET>(&release);
            if self.release_pass_done() {
                return;
            }
        }
        self.release_more::<VERIFY, BATCH, INDEXED, QUIET>(&release);
    }

    /// The pass after the common releases when it is not over: the receives' own loop if nothing else can be
    /// due (`sends_quiet`), else the rest of the pass. A function of its own, small: the receives do not pay
    /// `release_rest`'s setup, and the callers' per-WR loops keep their registers.
    #[inline(never)]
    fn release_more<const VERIFY: bool, const BATCH: bool, const INDEXED: bool, const QUIET: bool>(&self, release: &impl Fn(&Completion)) {
        if VERIFY || !self.sends_quiet() {
            self.release_rest::<VERIFY, BATCH, INDEXED, QUIET>(release);
        } else if self.release_recvs(release) {
            self.debug_assert_pass_done();
        } else {
            self.release_after_recvs::<BATCH, INDEXED, QUIET>(release);
        }
    }

    /// A receive's callback made something else due: the common releases, as `release_rest` runs them after
    /// each release, then the rest of the pass unless it is over.
    #[cold]
    #[inline(never)]
    fn release_after_recvs<const BATCH: bool, const INDEXED: bool, const QUIET: bool>(&self, release: &impl Fn(&Completion)) {
        self.release_common::<BATCH, INDEXED, QUIET>(release);
        if self.release_pass_done() {
            return;
        }
        self.release_rest::<false, BATCH, INDEXED, QUIET>(release);
    }

    /// The receives of a pass in which nothing else is due (`sends_quiet`), handed out as the steps of
    /// `release_rest` would, without them: while the sends stay quiet after a receive's callback, the next
    /// receive is the next release. Returns whether the pass is over (no receive due: then `release_rest`
    /// would clear `recv_due` and find `settle_idle` with nothing to do, as `release_pass_done` says); `false`
    /// when a callback made something else due, which `release_rest` hands out in its order, the common
    /// releases first.
    #[inline(always)]
    fn release_recvs(&self, release: &impl Fn(&Completion)) -> bool {
        debug_assert!(self.sends_quiet());
        loop {
            let c = {
                let mut st = self.state.borrow_mut();
                let Some(r) = st.recv.as_mut() else {
                    self.recv_due.set(false);
                    return true;
                };
                let Some(rel) = r.next_release() else {
                    self.recv_due.set(false);
                    return true;
                };
                // None is due after this one: cleared now, and set again by any receive that completes before
                // the next look (a poll from the callback).
                if !r.release_due() {
                    self.recv_due.set(false);
                }
                Completion::from((rel, true))
            };
            release(&c);
            if !self.sends_quiet() {
                return false;
            }
            if !self.recv_due.get() {
                return true;
            }
        }
    }

    /// The common releases: through `release` one by one (`release_plain`), or to the batch handler
    /// (`release_batched`) if the queue has one (`BATCH`); with indexes for wr_ids if `INDEXED`.
    #[inline(always)]
    fn release_common<const BATCH: bool, const INDEXED: bool, const QUIET: bool>(&self, release: &impl Fn(&Completion)) {
        if BATCH {
            if let Some(b) = self.batcher.get() {
                self.release_batched::<INDEXED, QUIET>(b);
            }
        } else {
            self.release_plain::<INDEXED>(release);
        }
    }

    /// The rest of a release pass: deferred actions, markers and operations, parked WRs, receives, the pump.
    /// Each step takes the state borrow once and drops it before any callback runs (callbacks may post, defer
    /// or poll again); between steps, the common releases run again.
    #[inline(never)]
    fn release_rest<const VERIFY: bool, const BATCH: bool, const INDEXED: bool, const QUIET: bool>(&self, release: &impl Fn(&Completion)) {
        enum Item {
            Release(Completion),
            OpDone(Option<ReleaseHandler>, Completion),
            Action(Action),
            /// Nothing is due; `true`: a parked WR became due (its release comes next), so the loop goes on.
            Idle(bool),
        }
        loop {
            let item = {
                let mut guard = self.state.borrow_mut();
                let st = &mut *guard;
                if st.barriers.is_due(st.send.released()) {
                    Item::Action(st.barriers.pop_ready(st.send.released()).expect("a barrier is due"))
                } else if let Some((mut c, op)) = self.next_send_release(st) {
                    if op {
                        let (done, oc) = st.finish_op(c);
                        Item::OpDone(done, oc)
                    } else {
                        if VERIFY {
                            st.check_released_buffers(&mut c);
                        }
                        if self.indexed {
                            // Popped and counted: the index of the WR released now is one less than the next's.
                            c.wr_id = self.ledger.wr_index() - 1;
                        }
                        Item::Release(c)
                    }
                } else if let Some(r) = st.recv.as_mut().and_then(|r| r.next_release()) {
                    Item::Release(Completion::from((r, true)))
                } else {
                    // No receive is due until another completes (`recv_due`).
                    self.recv_due.set(false);
                    // Nothing due: parked WRs that now have credits are posted, under the same borrow (the pump
                    // only calls the provider, which never calls back).
                    Item::Idle(self.settle_idle(st))
                }
            };
            match item {
                Item::Release(c) => release(&c),
                Item::OpDone(done, c) => call(done.as_ref(), &c),
                Item::Action(Action::User(d)) => d.run(),
                Item::Action(Action::PostOp(id)) => self.post_op(id),
                Item::Action(Action::Teardown { teardown, untrack }) => {
                    let failed = teardown.run() != 0;
                    let mut st = self.state.borrow_mut();
                    if failed {
                        st.teardown_failures += 1;
                    }
                    if let Some(i) = untrack.and_then(|k| st.tracked.iter().position(|t| t.lkey == k)) {
                        st.tracked.swap_remove(i);
                        st.sync_noting();
                    }
                }
                Item::Idle(go_on) => {
                    if !go_on {
                        break;
                    }
                }
            }
            if !VERIFY {
                self.release_common::<BATCH, INDEXED, QUIET>(release);
                if self.release_pass_done() {
                    break;
                }
            }
        }
    }

    /// After the common releases, whether the pass is over without a look at the rest of the state: no posted
    /// slot is left complete (a marker or an operation would be), no barrier is due, no receive has completed
    /// since the last pass found none due (`recv_due`), and nothing is parked and the queue is open (`SendLedger::plain_open`), so that neither a
    /// parked WR's release nor a pump can be due. Then `settle_idle` would do nothing either: with nothing
    /// parked nothing is pumped, and a tail left unsignaled was watched by the post that left it.
    #[inline(always)]
    fn release_pass_done(&self) -> bool {
        let done = !self.recv_due.get() && self.sends_quiet();
        if done {
            self.debug_assert_pass_done();
        }
        done
    }

    /// The send side of `release_pass_done`: no posted slot complete, no barrier due, nothing parked, the queue
    /// open. Then nothing but a receive can be due.
    #[inline(always)]
    fn sends_quiet(&self) -> bool {
        let ledger = &*self.ledger;
        ledger.plain_open() && ledger.ring.tail() == ledger.ring.done() && ledger.released() < ledger.first_barrier()
    }

    /// At the end of a release pass that skipped `settle_idle`: it would have had nothing to do.
    #[inline(always)]
    fn debug_assert_pass_done(&self) {
        debug_assert!(
            self.state.try_borrow().map_or(true, |st| !st.send.has_unsignaled_tail() || self.watched.get()),
            "an unsignaled tail nobody watches at the end of a release pass"
        );
    }

    /// The end of a release pass, when nothing is due: posts parked WRs that now have credits and watches a tail
    /// left unsignaled. Returns whether the pass goes on: parked WRs released as never posted, and a parked WR
    /// the provider refused, become due only when the ring is empty; anything else due now was produced by the
    /// pump (nothing) or by callbacks (picked up before). After a refused WR's release the pump goes on behind
    /// it.
    #[inline(always)]
    fn settle_idle(&self, st: &mut QueueState) -> bool {
        // An empty backlog has nothing to pump (`pump_backlog` would return Ok(0)).
        if st.send.backlog_len() > 0 {
            let pumped = pump_backlog(&mut st.send, &mut self.send_cq.pool.borrow_mut(), &self.qp, self.send_index);
            if !matches!(pumped, Ok(0)) {
                st.doorbells += 1;
            }
            if pumped.is_err() {
                st.describe_refused_front(&mut self.send_cq.pool.borrow_mut());
            }
        }
        if st.send.has_unsignaled_tail() && !self.watched.get() {
            self.tail_left();
        }
        let flushing = st.send.closed().is_some() && st.send.backlog_len() > 0 && st.send.in_provider() == 0;
        flushing || st.send.refused_release_due()
    }

    /// The common releases, as many as are due in a row: posted WRs of the ULP's (not markers, not library
    /// operations), complete, with no barrier due before them, on a queue that does not verify buffers. The ring
    /// and the counts are read and advanced without borrowing the state, under `SendLedger`'s contract: only
    /// this loop moves `tail` and `released`, and nothing a callback does changes the slots between them and
    /// the `done` read at the start. `sqd_queue_stats` read from a callback counts its WR as released. A
    /// barrier a callback adds that is due at once (a `sqd_defer_mr` whose MR's last use is released) stops the
    /// run before the next release, as the ledger's first barrier is read after every callback.
    #[inline(always)]
    fn release_plain<const INDEXED: bool>(&self, release: &impl Fn(&Completion)) {
        let ledger = &*self.ledger;
        let ring = &ledger.ring;
        let mut tail = ring.tail();
        let n = ring.done() - tail;
        if n == 0 {
            return;
        }
        let mut released = ledger.released();
        // Only the fields a posted WR's slot fills change from one release to the next.
        let mut plain = Completion::default();
        // An indexed queue's release carries the WR's index, one more than the last one's (none of these
        // releases is a library operation's), counted in the completion itself: no register for it.
        if INDEXED {
            plain.wr_id = ledger.wr_index().wrapping_sub(1);
        }
        // One CQE per WR (every WR signaled): no slices to set up for one slot. Otherwise the complete slots as
        // slices, walked in order: nothing is indexed per release.
        let (one, (a, b)) = if n == 1 { (Some(ring.get(tail)), (&[][..], &[][..])) } else { (None, ring.slots_of(tail, n)) };
        // Releases `slot` if it is a common one and no barrier is due; whether it did.
        // A slot's second word never equals this: it would have every flag, `INTERNAL` included.
        let mut last_meta = u64::MAX;
        let mut release_slot = |slot: Slot| {
            // Consecutive releases mostly differ only in their wr_id (the same opcode, covered successes): a slot
            // whose second word is the previous release's is a common release too, and the completion's other
            // fields already hold its values (the callback gets the completion read-only).
            if slot.meta() != last_meta {
                if slot.flags() & (Slot::INTERNAL | Slot::OP) != 0 {
                    return false;
                }
                last_meta = slot.meta();
                plain.status = slot.status() as u32;
                plain.opcode = slot.opcode() as u32;
                plain.vendor_err = slot.vendor_err();
                plain.flags = u32::from(!slot.has(Slot::OWN_CQE)) * crate::completion::SQD_COMPLETION_IMPLIED;
            }
            if released >= ledger.first_barrier() {
                return false;
            }
            tail += 1;
            released += 1;
            ledger.set_released(tail, released);
            plain.wr_id = if INDEXED { plain.wr_id.wrapping_add(1) } else { slot.wr_id };
            release(&plain);
            debug_assert_eq!((ring.tail(), ledger.released()), (tail, released), "a callback moved the release point");
            true
        };
        if let Some(slot) = one {
            release_slot(slot);
            return;
        }
        for part in [a, b] {
            for slot in part {
                if !release_slot(slot.get()) {
                    return;
                }
            }
        }
    }

    /// `release_plain` for a queue with a batch handler: the same releases, each run of them with one status and
    /// vendor error handed over in one call (with `QUIET`, a run of successes released without one), with their wr_ids gathered into the batcher's array, or (an
    /// indexed queue, `INDEXED`) only where the batch starts and how long it is. Under `SendLedger`'s contract
    /// as `release_plain` is; a batch ends before the first barrier, and the barrier is read again after each
    /// batch's call, so a barrier the call makes due runs before the next release.
    #[inline(always)]
    fn release_batched<const INDEXED: bool, const QUIET: bool>(&self, b: &Batcher) {
        let ledger = &*self.ledger;
        let ring = &ledger.ring;
        loop {
            let tail = ring.tail();
            let released = ledger.released();
            let n = (ring.done() - tail).min(ledger.first_barrier().saturating_sub(released));
            if n == 0 {
                return;
            }
            // The run's slots, which a batch that gathers wr_ids walks (an indexed batch reads only the first,
            // unless it compares them).
            let (first_part, wrapped) = if INDEXED { (&[][..], &[][..]) } else { ring.run_slots(tail, n) };
            let first = if INDEXED { ring.get(tail) } else { first_part[0].get() };
            if first.flags() & (Slot::INTERNAL | Slot::OP) != 0 {
                return;
            }
            // The batch: the slots from the first that release as it does but for the wr_id, the opcode and
            // whether it was implied; a run that goes on past the ring's end goes on at its start. A run of
            // successes of the ULP's WRs only (the ring is plain from the tail, the queue has not failed) is one
            // batch whole.
            // A run of successes for a handler that wants failures only: released, nothing to call.
            if QUIET && self.release_if_successes(tail, released, n) {
                return;
            }
            let plain = ring.is_plain_from(tail) && !ledger.has_failed();
            debug_assert!(
                !plain || {
                    let (a, b) = ring.run_slots(tail, n);
                    a.iter().chain(b).all(|s| s.get().status() == 0 && s.get().vendor_err() == 0
                        && s.get().flags() & (Slot::INTERNAL | Slot::OP) == 0)
                },
                "a plain run holds successes of the ULP's WRs only"
            );
            let first_index = ledger.wr_index();
            let count = if !INDEXED {
                // Borrowed once, for the copy and the call: nothing else borrows the array while the pass runs (a
                // release pass started from the handler returns at once, and the footprint counts the array by
                // the ring's capacity).
                let mut wr_ids = b.wr_ids.borrow_mut();
                let (out_first, out_wrapped) = wr_ids.split_at_mut(first_part.len());
                let count = if plain {
                    copy_wr_ids(first_part, out_first);
                    if !wrapped.is_empty() {
                        copy_wr_ids(wrapped, out_wrapped);
                    }
                    n as usize
                } else {
                    let k = copy_alike_wr_ids(first_part, out_first, first.meta());
                    if k == first_part.len() && !wrapped.is_empty() {
                        k + copy_alike_wr_ids(wrapped, out_wrapped, first.meta())
                    } else {
                        k
                    }
                };
                ledger.set_released(tail + count as u64, released + count as u64);
                if !QUIET || first.status() != 0 {
                    b.handler.call(Some(&wr_ids[..count]), count, first_index, first.status() as u32, first.vendor_err());
                }
                count
            } else {
                // An indexed queue's batch names its WRs by their indexes: nothing to gather.
                let count = if plain {
                    n as usize
                } else {
                    let (first_part, wrapped) = ring.run_slots(tail, n);
                    let k = count_alike(first_part, first.meta());
                    if k == first_part.len() && !wrapped.is_empty() { k + count_alike(wrapped, first.meta()) } else { k }
                };
                ledger.set_released(tail + count as u64, released + count as u64);
                if !QUIET || first.status() != 0 {
                    b.handler.call(None, count, first_index, first.status() as u32, first.vendor_err());
                }
                count
            };
            debug_assert_eq!(
                (ring.tail(), ledger.released()),
                (tail + count as u64, released + count as u64),
                "a callback moved the release point"
            );
            // The batch took every release that was due when it began. What its handler made due since (slots
            // a poll of its own completed, a barrier it made due) the caller finds: `release_pass_done` reads
            // the ledger again, and `release_rest` hands it out in order. Only a batch cut short by a slot of
            // another kind goes round again here.
            if count as u64 == n {
                return;
            }
        }
    }

    /// The next send release, in post order, if one is due, and whether it is a library operation's: a posted
    /// WR (markers skipped), else a parked one released as never posted.
    #[inline]
    fn next_send_release(&self, st: &mut QueueState) -> Option<(Completion, bool)> {
        if let Some(slot) = st.send.pop_posted() {
            return Some((completion_of(&slot), slot.has(Slot::OP)));
        }
        if st.send.backlog_len() == 0 {
            return None;
        }
        self.next_parked_release(st).map(|r| (Completion::from((r, false)), r.op))
    }

    /// The next release of a parked WR, if one is due (see `SendState::next_parked_release`). Out of line and
    /// called only when the queue has WRs parked, so that the release loop's common case is one compare.
    #[inline(never)]
    fn next_parked_release(&self, st: &mut QueueState) -> Option<crate::discipline::Release> {
        st.send.next_parked_release(&mut *self.send_cq.pool.borrow_mut())
    }
}
