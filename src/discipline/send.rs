//! The send side of a managed queue: credits, signaling, completion mapping, ordered release, backlog.
//!
//! Counting rules:
//! - `accepted` / `released` count the ULP's WRs (posted or parked in the backlog); the library's markers are
//!   not counted. A barrier (`sqd_defer`) waits for `released` to reach the `accepted` of its time.
//! - The provider is never asked to hold more than `sq_depth` WQEs: a slot is reused only after the WR in it is
//!   released, which happens after a polled CQE at or after it.
//! - Invariant: when no credit is left the newest WQE is signaled (the WR that takes the last slot is), so a
//!   full SQ always drains by itself and an unsignaled tail always leaves a credit for a marker.

use std::cell::Cell;
use std::collections::VecDeque;
use std::rc::Rc;

use super::backlog::{Backlog, EntryId, ParkStore, Parked};
use super::opcode::{WC_LOC_QP_OP_ERR, WC_SUCCESS, WC_WR_FLUSH_ERR};
use super::ring::{Slot, SlotRing};
use super::signal::SignalPolicy;
use super::late::LateWindow;
use super::token::Token;
use crate::error::Result;

/// The decision for one WR handed to the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Post it now, with this sequence number, signaled or not.
    Post { seq: u64, signaled: bool },
    /// No credit: park it in the backlog (fill an entry of the CQ's pool, then `commit_park()`).
    Park,
    /// No credit and no backlog room: refuse it (`EAGAIN`).
    Full,
}

/// One release to hand to the ULP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    pub wr_id: u64,
    pub status: u8,
    pub opcode: u8,
    pub vendor_err: u32,
    /// Retired by a later CQE, not its own.
    pub implied: bool,
    /// Released from the backlog: the HCA never saw it.
    pub never_posted: bool,
    /// A library operation: `wr_id` is the operation's id.
    pub op: bool,
    /// A receive whose sender invalidated this rkey (`IBV_WC_WITH_INV`).
    pub remote_inv: Option<u32>,
    /// A parked WR the provider refused when the library posted it (`vendor_err` holds the errno).
    pub refused: bool,
}

/// What a polled send CQE means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqeOutcome {
    /// Show it to the ULP, with the ULP's wr_id (its index on an indexed queue, `set_indexed`).
    Visible { wr_id: u64 },
    /// A completion the library added (moderation or marker): swallow it.
    Hidden,
    /// The token names no pending WR of this queue.
    Stray,
    /// A CQE that arrived after the queue was abandoned (its WRs were already released): swallowed.
    Late,
    /// A CQE of a WQE a later WQE's CQE already retired: the provider completed out of RC order
    /// (`SendState::take_late_cqe` says which; kept out of this enum so that it stays two words).
    OutOfOrder,
}

/// A CQE that names a WQE already retired by the CQE of a later one (`CqeOutcome::OutOfOrder`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LateCqe {
    /// The WQE's sequence number.
    pub seq: u64,
    /// The ULP's wr_id of the WR (its index on an indexed queue), when the WQE was one of the ULP's WRs and the
    /// ring still holds its slot; `None` for a WQE of the library's own or one too old to be known.
    pub wr_id: Option<u64>,
    /// Show the CQE to the ULP with `wr_id`: the ULP signaled the WR, and neither its own CQE nor a late one
    /// was shown before.
    pub show: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendCounters {
    pub signaled_by_ulp: u64,
    pub signaled_by_policy: u64,
    pub markers: u64,
    pub cqes: u64,
    pub stray_cqes: u64,
    pub late_cqes: u64,
    pub refused: u64,
    pub parked: u64,
    pub backlog_peak: u64,
    /// Accepted WRs the provider refused when the library posted them.
    pub provider_refused: u64,
    /// The errno of the newest such refusal, or of the newest refused marker.
    pub provider_refused_errno: u32,
    /// Markers the provider refused (`refuse_marker`).
    pub markers_refused: u32,
}

/// The part of a send queue's state that the release loop reads and advances between release callbacks without
/// borrowing the rest (the queue holds it outside its state's `RefCell`, shared with its `SendState`): the ring
/// and the count of the ULP's WRs released.
///
/// Concurrency contract (one thread; a callback may re-enter the queue): only the release loop moves the
/// ring's `tail` and `released`, and the queue runs one release loop at a time (a release loop started from a
/// callback returns at once). A callback may post (the ring's `head` moves, into slots no unreleased WR holds),
/// poll (`done` moves forward) or fail the queue (pending slots, after `done`, change): none of it touches the
/// complete, unreleased slots `tail..done` the loop is handing out.
#[derive(Debug)]
pub struct SendLedger {
    pub ring: SlotRing,
    released: Cell<u64>,
    /// The first deferred action's target (`Barriers::first_target`, `u64::MAX` when none waits), kept here by
    /// the queue's `Barriers` so that the release loop compares it without borrowing them.
    first_barrier: Cell<u64>,
    /// Why a post call cannot take the common path (`SendState::plain_open`): the causes `SendState::blocked_now`
    /// lists, as bits, recomputed by `SendState::sync_blocked` wherever one of them changes, so that the post
    /// path and the end of a release pass test one byte.
    blocked: Cell<u8>,
    /// The library's operations among `released` (LocalInvs of `invalidate`): the rest are the ULP's WRs.
    ops_released: Cell<u64>,
}

impl SendLedger {
    /// The ULP's WRs released so far.
    #[inline]
    pub fn released(&self) -> u64 {
        self.released.get()
    }
    /// The index of the ULP's next WR to be released: how many of its WRs were released before it (not counting
    /// the library's operations). Releases come once each in post order, so it is also how many WRs the ULP
    /// handed to the queue and the queue accepted before that one.
    #[inline]
    pub fn wr_index(&self) -> u64 {
        self.released.get() - self.ops_released.get()
    }
    /// The first deferred action's target (`u64::MAX` when none waits).
    #[inline]
    pub fn first_barrier(&self) -> u64 {
        self.first_barrier.get()
    }
    /// Open, nothing parked, no WR to note (`SendState::plain_open`).
    #[inline]
    pub fn plain_open(&self) -> bool {
        self.blocked.get() == 0
    }
    /// Whether a completion failed the queue (`SendState::closed`): until then every complete slot holds a
    /// success (status and vendor error 0).
    #[inline]
    pub fn has_failed(&self) -> bool {
        self.blocked.get() & 1 != 0
    }
    /// The release loop handed out the releases up to sequence `tail` (exclusive), `released` of the ULP's WRs
    /// in all: see the contract above.
    #[inline]
    pub fn set_released(&self, tail: u64, released: u64) {
        self.ring.set_tail(tail);
        self.released.set(released);
    }
}

/// `T` is the type of the entries the backlog's WRs are parked in (in a `ParkStore` shared with other queues).
#[derive(Debug)]
pub struct SendState<T> {
    ledger: Rc<SendLedger>,
    depth: u32,
    policy: SignalPolicy,
    backlog: Backlog,
    parked_type: std::marker::PhantomData<fn(T) -> T>,
    accepted: u64,
    /// The status that failed the queue: the first error CQE's, replaced once by the first non-flush error
    /// (a device may flush earlier WQEs before it reports the error that caused the flush).
    failed: Option<u8>,
    /// The vendor error of the CQE whose status `failed` holds.
    failed_vendor_err: u32,
    draining: bool,
    abandoned: bool,
    /// Once abandoned: the WQEs the provider held then whose CQE has not arrived since.
    late: LateWindow,
    /// The CQE `on_cqe` last answered `CqeOutcome::OutOfOrder` for, until the queue takes it.
    late_cqe: Option<LateCqe>,
    /// The queue notes every WR it accepts (tracked MRs, buffer verification): set by the queue.
    noting: bool,
    /// The ULP's WRs are named by their index (`SendLedger::wr_index`), not their wr_id, which the quiet
    /// admission does not keep (`set_indexed`).
    indexed: bool,
    /// The provider refused the oldest parked WR with this errno: it waits, unposted, for the WRs posted before
    /// it to be released, is then released itself (refused), and the WRs behind it are posted after it.
    front_refused: Option<i32>,
    pub counters: SendCounters,
}

/// Why the queue takes no more WRs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// A completion reported this error status and vendor error (see `SendState::failure`).
    Failed { status: u8, vendor_err: u32 },
    /// `drain` was called.
    Draining,
}

impl<T: Parked> SendState<T> {
    pub fn new(depth: u32, signal_interval: u32, backlog: Backlog) -> Result<SendState<T>> {
        Ok(SendState {
            ledger: Rc::new(SendLedger {
                ring: SlotRing::new(depth, "the send ring")?,
                released: Cell::new(0),
                first_barrier: Cell::new(u64::MAX),
                blocked: Cell::new(0),
                ops_released: Cell::new(0),
            }),
            depth,
            policy: SignalPolicy::new(signal_interval),
            backlog,
            parked_type: std::marker::PhantomData,
            accepted: 0,
            failed: None,
            failed_vendor_err: 0,
            draining: false,
            abandoned: false,
            late: LateWindow::default(),
            late_cqe: None,
            front_refused: None,
            noting: false,
            indexed: false,
            counters: SendCounters::default(),
        })
    }

    pub fn depth(&self) -> u32 {
        self.depth
    }
    pub fn signal_interval(&self) -> u32 {
        self.policy.interval()
    }
    /// Slots free for new WQEs.
    #[inline]
    pub fn credits(&self) -> u32 {
        self.depth - self.ledger.ring.outstanding() as u32
    }
    pub fn accepted(&self) -> u64 {
        self.accepted
    }
    pub fn released(&self) -> u64 {
        self.ledger.released()
    }
    /// The ring and the released count, for the release loop (see `SendLedger`).
    pub fn ledger(&self) -> &Rc<SendLedger> {
        &self.ledger
    }
    /// WQEs posted so far, the library's own included.
    pub fn wqes(&self) -> u64 {
        // Every WQE posted took the next sequence number; a refused one gave it back.
        self.ledger.ring.head()
    }
    /// WQEs the provider holds (posted, no CQE polled yet at or after them).
    pub fn in_provider(&self) -> u64 {
        self.ledger.ring.in_provider()
    }
    /// The oldest sequence still pending a CQE (the base for decoding tokens).
    #[inline]
    pub fn seq_base(&self) -> u64 {
        self.ledger.ring.done()
    }
    pub fn backlog_len(&self) -> usize {
        self.backlog.len()
    }
    pub fn backlog_capacity(&self) -> usize {
        self.backlog.capacity()
    }
    /// The ring slot of a posted, not yet released sequence number.
    #[inline]
    pub fn slot(&self, seq: u64) -> Slot {
        self.ledger.ring.get(seq)
    }
    /// The slots of a run of `len` posted, not yet released sequence numbers from `seq` (`SlotRing::run_slots`).
    #[inline]
    pub fn run_slots(&self, seq: u64, len: u64) -> (&[Cell<Slot>], &[Cell<Slot>]) {
        self.ledger.ring.run_slots(seq, len)
    }
    pub fn ring_capacity(&self) -> usize {
        self.ledger.ring.capacity()
    }
    /// Every accepted WR released and nothing of the library's own in flight.
    pub fn is_idle(&self) -> bool {
        self.accepted == self.ledger.released() && self.ledger.ring.outstanding() == 0
    }
    /// Open, nothing parked, no WR to note: a post may take the common path (its WRs' checks and credits
    /// still decide).
    #[inline]
    pub fn plain_open(&self) -> bool {
        debug_assert_eq!(self.ledger.blocked.get(), self.blocked_now());
        self.ledger.plain_open()
    }
    /// Whether the queue notes every WR it accepts (`set_noting`).
    pub fn noting(&self) -> bool {
        self.noting
    }
    /// The queue starts or stops noting every WR it accepts.
    pub fn set_noting(&mut self, noting: bool) {
        self.noting = noting;
        self.sync_blocked();
    }
    /// From now on a completion shown to the ULP carries its WR's index instead of the wr_id in its slot
    /// (which the queue's quiet admission leaves as it was). Set at creation.
    pub fn set_indexed(&mut self) {
        self.indexed = true;
    }
    /// The index of the ULP's WR in the posted, unreleased slot `seq`: the ULP's WRs released before the
    /// ring's tail, and those in the slots from the tail up to it (markers and operations are not the ULP's).
    fn index_of(&self, seq: u64) -> u64 {
        let ring = &self.ledger.ring;
        let tail = ring.tail();
        let before = if ring.is_plain_from(tail) {
            seq - tail
        } else {
            (tail..seq).filter(|&s| !ring.get(s).has(Slot::INTERNAL | Slot::OP)).count() as u64
        };
        self.ledger.wr_index() + before
    }
    fn blocked_now(&self) -> u8 {
        u8::from(self.failed.is_some())
            | u8::from(self.draining) << 1
            | u8::from(!self.backlog.is_empty()) << 2
            | u8::from(self.noting) << 3
    }
    #[inline]
    fn sync_blocked(&mut self) {
        self.ledger.blocked.set(self.blocked_now());
    }
    pub fn closed(&self) -> Option<Closed> {
        match (self.failed, self.draining) {
            (Some(s), _) => Some(Closed::Failed { status: s, vendor_err: self.failed_vendor_err }),
            (None, true) => Some(Closed::Draining),
            (None, false) => None,
        }
    }
    /// The status and vendor error that failed the queue (see `on_cqe`), if it failed.
    pub fn failure(&self) -> Option<(u8, u32)> {
        self.failed.map(|s| (s, self.failed_vendor_err))
    }
    pub fn has_unsignaled_tail(&self) -> bool {
        self.policy.has_unsignaled_tail()
    }

    /// Whether the policy leaves the next WR unsignaled when the ULP does, with `credits` (`credits()`) free
    /// slots: it neither ends an interval nor takes the last free slot. Such a WR is admitted by
    /// `admit_quiet_one`.
    #[inline]
    pub fn quiet_next(&self, credits: u32) -> bool {
        credits > 1 && self.policy.run() + 1 < self.policy.interval()
    }

    /// `admit_posted` for a WR the ULP leaves unsignaled when `quiet_next` said the policy does too: it is
    /// posted unsignaled and leaves an unsignaled tail. Returns its sequence number.
    #[inline(always)]
    pub fn admit_quiet_one(&mut self, wr_id: u64, wc_opcode: u8) -> u64 {
        debug_assert!(self.quiet_next(self.credits()) && self.backlog.is_empty());
        self.accepted += 1;
        self.policy.set_run(self.policy.run() + 1);
        self.ledger.ring.push_plain(Slot::new(wr_id, wc_opcode, 0))
    }

    /// Decides what happens to the next WR. The caller has checked `closed()`.
    #[inline]
    pub fn admit(&mut self, wr_id: u64, wc_opcode: u8, ulp_signaled: bool) -> Admit {
        let credits = self.credits();
        if credits == 0 || !self.backlog.is_empty() {
            if self.backlog.is_full() {
                self.counters.refused += 1;
                return Admit::Full;
            }
            return Admit::Park;
        }
        self.accepted += 1;
        self.post_slot(wr_id, wc_opcode, ulp_signaled, false, credits)
    }

    /// Credits a run of `admit_posted` calls may use: the free slots, or 0 while WRs wait in the backlog (a
    /// new WR then goes behind them, through `admit`).
    #[inline]
    pub fn postable(&self) -> u32 {
        if self.backlog.is_empty() {
            self.credits()
        } else {
            0
        }
    }

    /// `admit` for a WR the caller knows can be posted: `credits` is `postable()` before this call, minus
    /// one per `admit_posted` since (nothing else has changed the SQ or the backlog meanwhile). Returns its
    /// sequence number and whether it is signaled.
    #[inline]
    pub fn admit_posted(&mut self, wr_id: u64, wc_opcode: u8, ulp_signaled: bool, credits: u32) -> (u64, bool) {
        debug_assert!(credits > 0 && credits == self.credits() && self.backlog.is_empty());
        self.accepted += 1;
        match self.post_slot(wr_id, wc_opcode, ulp_signaled, false, credits) {
            Admit::Post { seq, signaled } => (seq, signaled),
            _ => unreachable!("post_slot always posts"),
        }
    }

    /// A bulk admission of at most `room` WRs the caller knows can be posted: the fast form of `admit_posted`,
    /// for the WRs of one post call while `credits` (`postable()`, at least 1, at least `room`) last, with
    /// tokens from `token_base` (`Token::new(index, Send, 0).0`). The slots, the signal policy and the counters
    /// are kept in locals until `admitted` stores them once. Nothing else may change the SQ meanwhile. It may
    /// stop early (`is_full`) where the tokens' sequence field wraps.
    #[inline]
    pub fn admission(&mut self, credits: u32, room: u32, token_base: u64) -> Admission<'_> {
        debug_assert!(credits > 0 && credits >= room && credits == self.credits() && self.backlog.is_empty());
        let run = self.policy.run() as u64;
        let interval = self.policy.interval() as u64;
        let ring = &self.ledger.ring;
        // The free run ends where the ring's storage does, never past a wrap of the tokens' sequence field: the
        // storage is a power of two that divides the field's range.
        let (slots, head) = ring.free_run(room as u64);
        debug_assert!(slots.len() as u64 <= Token::seqs_before_wrap(head));
        let token = Token::from_base(token_base, head).0;
        Admission {
            slots: slots.iter(),
            token,
            start_token: token,
            start: head,
            gap: u64::from(self.quiet_gap(credits)),
            last: token.wrapping_add(credits as u64 - 1),
            interval,
            last_signaled: token.wrapping_sub(run + 1),
            by_ulp: 0,
            by_policy: 0,
        }
    }

    /// How many WRs the policy leaves unsignaled from the next one, with `credits` free slots: the unsignaled
    /// run that ends the SQ grows up to the WR that makes it `interval` long, or the one that takes the last free
    /// slot if that comes first; that WR is signaled.
    #[inline]
    fn quiet_gap(&self, credits: u32) -> u32 {
        (self.policy.interval() - 1).saturating_sub(self.policy.run()).min(credits - 1)
    }

    /// The free slots a post call may fill in a quiet run, from the next one, the first one's sequence number
    /// and token (`token_base` as for `admission`), and how many of them the policy leaves unsignaled (the
    /// `gap`): as many slots as `room` allows, up to and including the WR the policy signals next (so at most
    /// `credits`, which is `postable()`, at least 1), short of the ring's end. The caller fills a prefix of them
    /// in order with `Slot::unsignaled(wr_id, wc_opcode)`, gives the WRs consecutive tokens, and reports how many
    /// with `quiet_admitted` before anything else: an `admission` for a call whose WRs the ULP leaves
    /// unsignaled, without its set-up.
    #[inline]
    pub fn quiet_run(&self, credits: u32, room: u32, token_base: u64) -> (&[Cell<Slot>], u64, u64, u32) {
        debug_assert!(credits > 0 && credits == self.credits() && self.backlog.is_empty());
        let gap = self.quiet_gap(credits);
        let (slots, head) = self.ledger.ring.free_run(u64::from((gap + 1).min(room)));
        debug_assert!(slots.len() as u64 <= Token::seqs_before_wrap(head));
        (slots, head, Token::from_base(token_base, head).0, gap)
    }

    /// The first `k` slots of a `quiet_run` whose gap was `gap` are filled: their WRs are accepted and posted,
    /// unsignaled, but for a `k`-th past the gap: the WR the policy signals (the interval's last, or the one
    /// that takes the last free slot). Returns whether there is one; its WR must be posted with
    /// `IBV_SEND_SIGNALED`.
    #[inline]
    pub fn quiet_admitted(&mut self, k: u32, gap: u32) -> bool {
        let head = self.ledger.ring.head();
        self.ledger.ring.set_head(head + u64::from(k));
        self.accepted += u64::from(k);
        if k > gap {
            self.signal_quiet_end(head + u64::from(k) - 1);
            return true;
        }
        self.policy.set_run(self.policy.run() + k);
        false
    }

    /// `quiet_admitted`'s WR that the policy signals, at `seq`: its slot says so, the run of unsignaled WRs
    /// starts again.
    #[inline]
    fn signal_quiet_end(&mut self, seq: u64) {
        self.ledger.ring.update(seq, |s| s.add_flags(Slot::SIGNALED));
        self.policy.note_signaled();
        self.counters.signaled_by_policy += 1;
    }

    /// Stores what an `admission` decided: its WRs are accepted and posted (as many `admit_posted` calls).
    #[inline]
    pub fn admitted(&mut self, a: Admitted) {
        let n = a.head - a.start;
        self.ledger.ring.set_head(a.head);
        self.accepted += n;
        self.counters.signaled_by_ulp += a.by_ulp;
        self.counters.signaled_by_policy += a.by_policy;
        self.policy.set_run(a.run);
    }

    /// Like `admit`, for a library operation: always signaled (its own completion is what it reports), never
    /// shown by poll.
    pub fn admit_op(&mut self, op_id: u64, wc_opcode: u8) -> Admit {
        let credits = self.credits();
        if credits == 0 || !self.backlog.is_empty() {
            if self.backlog.is_full() {
                self.counters.refused += 1;
                return Admit::Full;
            }
            return Admit::Park;
        }
        self.accepted += 1;
        self.post_slot(op_id, wc_opcode, true, true, credits)
    }

    #[inline]
    fn post_slot(&mut self, wr_id: u64, wc_opcode: u8, ulp_signaled: bool, op: bool, credits: u32) -> Admit {
        let signaled = self.policy.decide(ulp_signaled, credits == 1);
        let mut flags = 0;
        if op {
            flags |= Slot::OP;
        } else if ulp_signaled {
            flags |= Slot::ULP_SIGNALED;
            self.counters.signaled_by_ulp += 1;
        } else if signaled {
            self.counters.signaled_by_policy += 1;
        }
        if signaled {
            flags |= Slot::SIGNALED;
        }
        let seq = self.ledger.ring.push(Slot::new(wr_id, wc_opcode, flags));
        Admit::Post { seq, signaled }
    }

    /// The parked WR is in place in entry `id` of `store` (after `Admit::Park`): it is accepted.
    #[inline]
    pub fn commit_park(&mut self, id: EntryId, store: &mut impl ParkStore<Entry = T>) {
        self.backlog.push(id, store);
        self.sync_blocked();
        self.accepted += 1;
        self.counters.parked += 1;
        self.counters.backlog_peak = self.counters.backlog_peak.max(self.backlog.len() as u64);
    }

    /// Whether the `i`-th oldest parked WR can be posted now.
    #[inline]
    pub fn can_pump(&self, i: usize) -> bool {
        self.backlog.len() > i && self.credits() > 0 && self.closed().is_none() && self.front_refused.is_none()
    }

    /// The provider refused the oldest parked WR (the pump's post stopped at it) with `errno`. It is not retried:
    /// it is released, refused, once every WR posted before it is released (`next_release`), and the pump then
    /// goes on with the WRs behind it.
    pub fn refuse_front(&mut self, errno: i32) {
        debug_assert!(!self.backlog.is_empty() && self.front_refused.is_none());
        self.front_refused = Some(errno);
        self.note_provider_refusal(errno);
    }

    /// `admit` said `Park` but the store had no entry for the WR: it is refused (`EAGAIN`) after all.
    #[cold]
    pub fn note_store_exhausted(&mut self) {
        self.counters.refused += 1;
    }

    /// The provider refused the marker `admit_marker` just admitted: it is taken back (the tail is unsignaled
    /// again, to be covered by a later attempt) and the refusal counted.
    #[cold]
    pub fn refuse_marker(&mut self, errno: i32) {
        self.rollback(1, false);
        self.counters.markers -= 1;
        self.counters.markers_refused += 1;
        self.counters.provider_refused_errno = errno as u32;
    }

    /// Counts a WR the provider refused after the queue accepted it.
    pub fn note_provider_refusal(&mut self, errno: i32) {
        self.counters.provider_refused += 1;
        self.counters.provider_refused_errno = errno as u32;
    }

    /// The refused oldest parked WR, if any: its wr_id (an operation id for a library operation), whether it is
    /// a library operation, and the errno.
    pub fn refused_front(&mut self, store: &mut impl ParkStore<Entry = T>) -> Option<(u64, bool, i32)> {
        let errno = self.front_refused?;
        let e = store.entry(self.backlog.front());
        Some((e.wr_id(), e.is_op(), errno))
    }

    /// Whether the refused oldest parked WR can be released now (`next_release` then returns it).
    pub fn refused_release_due(&self) -> bool {
        self.front_refused.is_some() && self.ledger.ring.outstanding() == 0
    }

    /// Admits the next parked WR for posting, `e`: the caller walks the backlog from `backlog_front()`, admits
    /// entries in order, posts them together, then calls `pumped`. Only while `credits() > 0`.
    pub fn admit_parked(&mut self, e: &T) -> (u64, bool) {
        let credits = self.credits();
        debug_assert!(credits > 0);
        let (wr_id, op, ulp_signaled, is_op) = (e.wr_id(), e.wc_opcode(), e.ulp_signaled(), e.is_op());
        let Admit::Post { seq, signaled } = self.post_slot(wr_id, op, ulp_signaled || is_op, is_op, credits) else {
            unreachable!()
        };
        (seq, signaled)
    }

    /// The oldest parked WR's entry (`EntryId::NONE` when none is parked).
    #[inline]
    pub fn backlog_front(&self) -> EntryId {
        self.backlog.front()
    }

    /// `n` parked WRs reached the provider: they leave the backlog, and their entries go back to `store`.
    pub fn pumped(&mut self, n: usize, store: &mut impl ParkStore<Entry = T>) {
        self.backlog.pop_front(n, store);
        self.sync_blocked();
    }

    /// Gives every parked WR's entry back to `store` without releasing it: for a queue that goes away (its
    /// owner dropped it) with WRs still parked.
    pub fn discard_backlog(&mut self, store: &mut impl ParkStore<Entry = T>) {
        let n = self.backlog.len();
        self.backlog.pop_front(n, store);
        self.sync_blocked();
    }

    /// The provider refused the newest `n` WQEs: forget them. When they came from the ULP's call (not the
    /// backlog) they are no longer accepted either.
    pub fn rollback(&mut self, n: u64, from_ulp: bool) {
        self.ledger.ring.unpush(n);
        if from_ulp {
            self.accepted -= n;
        }
        // The run of unsignaled WQEs now ending the SQ.
        let mut run = 0;
        let mut seq = self.ledger.ring.head();
        while seq > self.ledger.ring.done() && !self.ledger.ring.get(seq - 1).has(Slot::SIGNALED) {
            run += 1;
            seq -= 1;
        }
        self.policy.set_run(run);
    }

    /// A signaled marker (zero-length RDMA WRITE) to cover an unsignaled tail, if there is one and the queue is
    /// open or draining. Returns its sequence number.
    pub fn admit_marker(&mut self) -> Option<u64> {
        if self.failed.is_some() || !self.policy.has_unsignaled_tail() {
            return None;
        }
        debug_assert!(self.credits() > 0, "an unsignaled tail always leaves a credit");
        if self.credits() == 0 {
            return None;
        }
        self.policy.note_signaled();
        self.counters.markers += 1;
        Some(self.ledger.ring.push(Slot::new(0, 0, Slot::INTERNAL | Slot::SIGNALED)))
    }

    /// Maps a polled send CQE to its WR and retires every WR up to it.
    #[inline]
    pub fn on_cqe(&mut self, token: Token, status: u8, vendor_err: u32) -> CqeOutcome {
        let seq = token.seq_from(self.ledger.ring.done());
        if !self.ledger.ring.is_pending(seq) {
            if self.abandoned {
                self.counters.late_cqes += 1;
                self.late.on_cqe(token);
                return CqeOutcome::Late;
            }
            return self.on_stray_cqe(token, status, vendor_err);
        }
        self.counters.cqes += 1;
        let slot = self.ledger.ring.get(seq);
        self.ledger.ring.complete_through(seq, status, vendor_err);
        if status != WC_SUCCESS {
            self.note_failure(status, vendor_err);
        }
        if slot.has(Slot::INTERNAL | Slot::OP) || (status == WC_SUCCESS && !slot.has(Slot::ULP_SIGNALED)) {
            CqeOutcome::Hidden
        } else {
            CqeOutcome::Visible { wr_id: if self.indexed { self.index_of(seq) } else { slot.wr_id } }
        }
    }

    /// A send CQE that names no pending WQE: a stray, or the CQE of a WQE that a later WQE's CQE already
    /// retired (the provider completed out of RC order). Such a WQE is identified while the ring still holds its
    /// slot (its sequence is within one ring of the newest); its WR was released when the later CQE retired it.
    /// The CQE is shown to the ULP, once, when the ULP signaled the WR: that is the completion it waits for,
    /// which the later CQE retired without showing. An error status fails the queue as any error CQE does.
    #[cold]
    #[inline(never)]
    fn on_stray_cqe(&mut self, token: Token, status: u8, vendor_err: u32) -> CqeOutcome {
        let ring = &self.ledger.ring;
        let Some(seq) = token.seq_before(ring.done()).filter(|&s| s + ring.capacity() as u64 >= ring.head()) else {
            self.counters.stray_cqes += 1;
            return CqeOutcome::Stray;
        };
        let slot = ring.get(seq);
        let ulp = !slot.has(Slot::INTERNAL | Slot::OP);
        let wr_id = ulp.then(|| if self.indexed { self.index_before(seq) } else { slot.wr_id });
        let show = ulp && slot.has(Slot::ULP_SIGNALED) && !slot.has(Slot::OWN_CQE | Slot::LATE_SHOWN);
        if show {
            ring.update(seq, |s| s.add_flags(Slot::LATE_SHOWN));
        } else {
            self.counters.stray_cqes += 1;
        }
        if status != WC_SUCCESS {
            self.note_failure(status, vendor_err);
        }
        self.late_cqe = Some(LateCqe { seq, wr_id, show });
        CqeOutcome::OutOfOrder
    }

    /// What the CQE `on_cqe` just answered `CqeOutcome::OutOfOrder` for was.
    pub fn take_late_cqe(&mut self) -> Option<LateCqe> {
        self.late_cqe.take()
    }

    /// The index of the ULP's WR at `seq`, a WQE already complete (released or not) whose slot the ring still
    /// holds. For a released one, counted back from the releases: a parked WR the provider refused, released
    /// after `seq` without a ring slot, is not counted, so the index is then too high by one per such WR.
    fn index_before(&self, seq: u64) -> u64 {
        let ring = &self.ledger.ring;
        let tail = ring.tail();
        if seq >= tail {
            return self.index_of(seq);
        }
        let between = (seq..tail).filter(|&s| !ring.get(s).has(Slot::INTERNAL | Slot::OP)).count() as u64;
        self.ledger.wr_index() - between
    }

    /// Records an error CQE's status as the queue's failure: the first one, unless it was a flush and this is
    /// not. A flush only says the QP is in error; the error that put it there may come after flushes of
    /// earlier WQEs (and may be a WQE of the library's own, whose CQE the ULP never sees).
    #[cold]
    fn note_failure(&mut self, status: u8, vendor_err: u32) {
        let replace = match self.failed {
            None => true,
            Some(s) => s == WC_WR_FLUSH_ERR && status != WC_WR_FLUSH_ERR,
        };
        if replace {
            self.failed = Some(status);
            self.sync_blocked();
            self.failed_vendor_err = vendor_err;
        }
    }

    /// The QP or CQ is in error and no CQE may ever come (an async event said so): the queue fails, every posted
    /// WR is complete with `IBV_WC_WR_FLUSH_ERR`, parked ones will be released as never posted, and CQEs that
    /// still arrive are swallowed.
    pub fn abandon(&mut self) {
        self.failed.get_or_insert(WC_WR_FLUSH_ERR);
        self.sync_blocked();
        if !self.abandoned {
            self.late = LateWindow::new(self.ledger.ring.done(), self.ledger.ring.head());
        }
        self.abandoned = true;
        self.ledger.ring.complete_all(WC_WR_FLUSH_ERR);
    }

    pub fn is_abandoned(&self) -> bool {
        self.abandoned
    }

    /// The WQEs whose CQE may still arrive: those the provider holds, or once abandoned, those it held then
    /// and that no CQE has covered since.
    pub fn unfinished(&self) -> LateWindow {
        if self.abandoned {
            self.late
        } else {
            LateWindow::new(self.ledger.ring.done(), self.ledger.ring.head())
        }
    }

    /// Stops taking WRs; parked ones will be released as never posted.
    pub fn start_drain(&mut self) {
        self.draining = true;
        self.sync_blocked();
    }

    /// The next release of a posted WR, in post order, if one is due: its slot (the library's markers are
    /// skipped). Parked WRs released as never posted come from `next_release` only.
    #[inline]
    pub fn pop_posted(&mut self) -> Option<Slot> {
        while let Some((_, slot)) = self.ledger.ring.pop_done() {
            if slot.has(Slot::INTERNAL) {
                continue;
            }
            self.count_release(slot.has(Slot::OP));
            return Some(slot);
        }
        None
    }

    /// The next release, in post order, if one is due.
    #[inline]
    pub fn next_release(&mut self, store: &mut impl ParkStore<Entry = T>) -> Option<Release> {
        if let Some(slot) = self.pop_posted() {
            return Some(Release {
                wr_id: slot.wr_id,
                status: slot.status(),
                opcode: slot.opcode(),
                vendor_err: slot.vendor_err(),
                implied: !slot.has(Slot::OWN_CQE),
                never_posted: false,
                op: slot.has(Slot::OP),
                remote_inv: None,
                refused: false,
            });
        }
        self.next_parked_release(store)
    }

    /// A WR, posted or parked, is released (a library operation if `op`): outside the release loop's common
    /// runs, which count in `SendLedger::set_released` and hold no operation.
    #[inline]
    fn count_release(&mut self, op: bool) {
        self.ledger.released.set(self.ledger.released.get() + 1);
        if op {
            self.ledger.ops_released.set(self.ledger.ops_released.get() + 1);
        }
    }

    /// The next release of a parked WR (one the provider refused, or one never posted by a queue that failed or
    /// drains), if one is due: only once no posted WR is outstanding, so the release order is the post order.
    pub fn next_parked_release(&mut self, store: &mut impl ParkStore<Entry = T>) -> Option<Release> {
        if self.backlog.is_empty() {
            return None;
        }
        // A refused parked WR is released after every WR posted before it (in post order), open queue or not.
        if let (Some(errno), 0) = (self.front_refused, self.ledger.ring.outstanding()) {
            let e = store.entry(self.backlog.front());
            let r = Release {
                wr_id: e.wr_id(),
                status: WC_LOC_QP_OP_ERR,
                opcode: e.wc_opcode(),
                vendor_err: errno as u32,
                implied: false,
                never_posted: true,
                op: e.is_op(),
                remote_inv: None,
                refused: true,
            };
            self.backlog.pop_front(1, store);
            self.sync_blocked();
            self.front_refused = None;
            self.count_release(r.op);
            return Some(r);
        }
        if self.closed().is_some() && self.ledger.ring.outstanding() == 0 {
            let e = store.entry(self.backlog.front());
            let r = Release {
                wr_id: e.wr_id(),
                status: WC_WR_FLUSH_ERR,
                opcode: e.wc_opcode(),
                vendor_err: 0,
                implied: false,
                never_posted: true,
                op: e.is_op(),
                remote_inv: None,
                refused: false,
            };
            self.backlog.pop_front(1, store);
            self.sync_blocked();
            self.count_release(r.op);
            return Some(r);
        }
        None
    }
}

/// WRs being admitted for posting in bulk (`SendState::admission`): each `push` decides the signal and fills
/// the next slot as `admit_posted` would, with the state in locals, and gives the WR's token.
///
/// Everything is counted in tokens, which are consecutive integers for consecutive sequence numbers (an
/// admission stops before the token's sequence field wraps), so one counter serves as the sequence number, the
/// token and the slot index (`token & mask`: the ring is smaller than the field). The policy's decision is kept
/// as the token of the next WR it signals (the one that completes the interval, or the one that takes the
/// last free slot, whichever comes first), so a WR costs one compare; the counters change only at a signaled WR.
pub struct Admission<'s> {
    /// The free slots this admission may fill, in order (the ring's storage up to its end: it stops where the
    /// ring wraps or where the caller's room ends).
    slots: std::slice::Iter<'s, Cell<Slot>>,
    token: u64,
    start_token: u64,
    start: u64,
    /// WRs to admit before the one the policy signals next (the one that completes the interval, or the one
    /// that takes the last free slot, whichever comes first): a WR costs one test of it.
    gap: u64,
    /// The token of the WR that takes the last free slot: it is signaled.
    last: u64,
    interval: u64,
    /// The token of the newest signaled WR (before the first, where it would be): the run ends at it.
    last_signaled: u64,
    by_ulp: u64,
    by_policy: u64,
}

/// The outcome of an `Admission`, for `SendState::admitted`.
pub struct Admitted {
    head: u64,
    start: u64,
    run: u32,
    by_ulp: u64,
    by_policy: u64,
}

impl Admitted {
    /// How many WRs the admission took.
    #[inline]
    pub fn count(&self) -> u32 {
        (self.head - self.start) as u32
    }
}

impl<'s> Admission<'s> {
    /// Whether the admission took as many WRs as it may.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.slots.len() == 0
    }

    /// Admits the next WR: its token and whether it is signaled (the ULP asked, the unsignaled run reached the
    /// interval, or it takes the last free slot); `None` when the admission is full (`is_full`).
    #[inline]
    pub fn push(&mut self, wr_id: u64, wc_opcode: u8, ulp_signaled: bool) -> Option<(u64, bool)> {
        let cell = self.slots.next()?;
        let token = self.token;
        self.token = token + 1;
        if (self.gap == 0) | ulp_signaled {
            cell.set(self.signaled(token, wr_id, wc_opcode, ulp_signaled));
            return Some((token, true));
        }
        self.gap -= 1;
        cell.set(Slot::new(wr_id, wc_opcode, 0));
        Some((token, false))
    }

    /// The slots of the WRs the policy leaves unsignaled from here (those before the next one it signals, as
    /// far as the admission has room), and the first one's token: the caller fills them in order with
    /// `Slot::new(wr_id, wc_opcode, 0)`, gives the WRs consecutive tokens, and reports how many it filled with
    /// `quiet_done` before anything else. A WR the ULP signals ends the run: it goes through `push`.
    #[inline]
    pub fn quiet_run(&self) -> (&'s [Cell<Slot>], u64) {
        let slots = self.slots.as_slice();
        (&slots[..(self.gap as usize).min(slots.len())], self.token)
    }

    /// The first `k` slots of `quiet_run` are filled.
    #[inline]
    pub fn quiet_done(&mut self, k: usize) {
        if k > 0 {
            self.slots.nth(k - 1);
            self.token += k as u64;
            self.gap -= k as u64;
        }
    }

    /// The WR of `token` is signaled: the run restarts after it. Returns its slot.
    #[inline]
    fn signaled(&mut self, token: u64, wr_id: u64, wc_opcode: u8, ulp_signaled: bool) -> Slot {
        self.last_signaled = token;
        self.gap = self.interval.min(self.last.wrapping_sub(token)).saturating_sub(1);
        self.by_ulp += u64::from(ulp_signaled);
        self.by_policy += u64::from(!ulp_signaled);
        Slot::new(wr_id, wc_opcode, (u8::from(ulp_signaled) * Slot::ULP_SIGNALED) | Slot::SIGNALED)
    }

    #[inline]
    pub fn end(self) -> Admitted {
        let run = self.token.wrapping_sub(self.last_signaled.wrapping_add(1)) as u32;
        let head = self.start + (self.token - self.start_token);
        Admitted { head, start: self.start, run, by_ulp: self.by_ulp, by_policy: self.by_policy }
    }
}

/// Completion barriers: actions that wait until `released` reaches a target.
#[derive(Debug)]
pub struct Barriers<D> {
    waiting: VecDeque<(u64, D)>,
    /// Where the oldest action's target is kept (`u64::MAX` when none waits): the per-release check is one
    /// compare, and the release loop reads it without borrowing the barriers.
    ledger: Rc<SendLedger>,
}

impl<D> Barriers<D> {
    /// Barriers of the send state that owns `ledger` (`SendState::ledger`).
    pub fn new(ledger: Rc<SendLedger>) -> Self {
        ledger.first_barrier.set(u64::MAX);
        Barriers { waiting: VecDeque::new(), ledger }
    }
    /// Room for `more` actions beyond those waiting, so that as many `push` calls allocate nothing.
    pub fn reserve(&mut self, more: usize) -> Result<()> {
        crate::alloc::reserve_deque(&mut self.waiting, more, "the queue's deferred actions")
    }
    /// Adds an action that runs once `released` reaches `target`. Actions run in target order, and in the order
    /// they were added among equal targets (a precise per-MR barrier may have an earlier target than a
    /// queue-wide one added before it).
    pub fn push(&mut self, target: u64, action: D) {
        let at = self.waiting.iter().rposition(|(t, _)| *t <= target).map_or(0, |i| i + 1);
        self.waiting.insert(at, (target, action));
        self.sync_first();
    }
    fn sync_first(&self) {
        self.ledger.first_barrier.set(self.waiting.front().map_or(u64::MAX, |e| e.0));
    }
    /// The oldest action's target (`u64::MAX` when none waits).
    #[inline]
    pub fn first_target(&self) -> u64 {
        self.ledger.first_barrier.get()
    }
    /// Whether an action's target `released` has reached (`pop_ready` then returns it).
    #[inline]
    pub fn is_due(&self, released: u64) -> bool {
        self.ledger.first_barrier.get() <= released
    }
    /// The oldest action whose target `released` has reached.
    #[inline]
    pub fn pop_ready(&mut self, released: u64) -> Option<D> {
        if self.ledger.first_barrier.get() > released {
            return None;
        }
        let (_, d) = self.waiting.pop_front()?;
        self.sync_first();
        Some(d)
    }
    pub fn len(&self) -> usize {
        self.waiting.len()
    }
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoParked;
    impl Parked for NoParked {
        fn wr_id(&self) -> u64 {
            0
        }
        fn wc_opcode(&self) -> u8 {
            0
        }
        fn ulp_signaled(&self) -> bool {
            false
        }
        fn is_op(&self) -> bool {
            false
        }
    }

    /// On an indexed queue a send completion shown to the ULP carries its WR's index: the ULP's WRs released
    /// before the ring's tail (not the library's operations among them) and the ULP's WRs between the tail and
    /// it (not the markers and operations there).
    #[test]
    fn an_indexed_completion_counts_only_the_ulps_wrs_before_it() {
        use super::super::opcode::{WC_LOCAL_INV, WC_RDMA_WRITE};
        use super::super::token::Direction;
        let mut st = SendState::<NoParked>::new(16, 16, Backlog::new(0)).unwrap();
        st.set_indexed();
        let base = Token::new(3, Direction::Send, 0).0;
        let post = |st: &mut SendState<NoParked>, wr_id: u64, signaled: bool| {
            let credits = st.credits();
            st.admit_posted(wr_id, WC_RDMA_WRITE, signaled, credits).0
        };
        let op = |st: &mut SendState<NoParked>, id: u64| match st.admit_op(id, WC_LOCAL_INV) {
            Admit::Post { seq, .. } => seq,
            _ => panic!("the operation was not posted"),
        };
        let release_all = |st: &mut SendState<NoParked>| {
            if st.ledger.ring.in_provider() > 0 {
                st.ledger.ring.complete_through(st.ledger.ring.head() - 1, 0, 0);
            }
            while st.pop_posted().is_some() {}
        };
        // Indexes 0 and 1, and an operation, all released.
        post(&mut st, 100, false);
        op(&mut st, 7);
        post(&mut st, 101, false);
        release_all(&mut st);
        assert_eq!(st.ledger.wr_index(), 2);
        // Index 2, a marker covering it, an operation, index 3, then index 4 signaled by the ULP: its CQE comes
        // with the others unreleased.
        post(&mut st, 102, false);
        st.admit_marker().expect("an unsignaled tail to cover");
        op(&mut st, 8);
        post(&mut st, 103, false);
        let seq = post(&mut st, 104, true);
        assert!(!st.ledger.ring.is_plain_from(st.ledger.ring.tail()));
        assert_eq!(st.on_cqe(Token::from_base(base, seq), 0, 0), CqeOutcome::Visible { wr_id: 4 });
        release_all(&mut st);
        assert_eq!(st.ledger.wr_index(), 5);
        // On a plain ring, an error CQE of the WR of index 6 (index 5 before it unsignaled).
        post(&mut st, 105, false);
        let seq = post(&mut st, 106, false);
        assert!(st.ledger.ring.is_plain_from(st.ledger.ring.tail()));
        assert_eq!(st.on_cqe(Token::from_base(base, seq), 5, 0), CqeOutcome::Visible { wr_id: 6 });
    }

    /// A bulk admission decides every signal, fills every slot and counts as `admit_posted` one WR at a time,
    /// across post calls of every size, with ULP-signaled WRs mixed in and the SQ filling up.
    #[test]
    fn admission_agrees_with_admit_posted() {
        for (depth, interval) in [(8, 3), (16, 4), (5, 5), (4, 1), (128, 32)] {
            let new = || SendState::<NoParked>::new(depth, interval, Backlog::new(0)).unwrap();
            let (mut one, mut bulk) = (new(), new());
            let base = Token::new(7, super::super::token::Direction::Send, 0).0;
            let mut rng = 0x9e37_79b9_7f4a_7c15u64;
            for call in 0..400u64 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let credits = one.postable();
                assert_eq!(credits, bulk.postable());
                if credits == 0 || rng % 5 == 0 {
                    // Complete and release everything posted so far, in both.
                    for st in [&mut one, &mut bulk] {
                        if st.ledger.ring.in_provider() > 0 {
                            let newest = st.ledger.ring.head() - 1;
                            st.ledger.ring.complete_through(newest, 0, 0);
                        }
                        while st.pop_posted().is_some() {}
                    }
                    continue;
                }
                let n = 1 + (rng >> 8) as u32 % credits;
                let mut k = 0;
                // A third of the calls begin as the post path's chains do: one quiet run, for as many WRs as it
                // has room and the ULP leaves unsignaled.
                if call % 3 == 2 {
                    let (quiet, seq, token, gap) = bulk.quiet_run(credits, n, base);
                    assert_eq!(seq, bulk.wqes());
                    let mut filled = 0;
                    while filled < quiet.len() && k < n && (rng >> (16 + k % 40)) & 7 != 0 {
                        let wr_id = call * 1000 + k as u64;
                        quiet[filled].set(Slot::unsignaled(wr_id, 3));
                        let (seq, signaled) = one.admit_posted(wr_id, 3, false, credits - k);
                        // Only the run's slot past the gap is the policy's signal.
                        let want = (token + filled as u64, filled as u32 == gap);
                        assert_eq!(want, (Token::from_base(base, seq).0, signaled), "call {call} WR {k}");
                        filled += 1;
                        k += 1;
                    }
                    assert_eq!(bulk.quiet_admitted(filled as u32, gap), filled as u32 > gap);
                }
                // As the post path does: admissions until the call's WRs are in (one stops where the ring wraps).
                while k < n {
                    let mut a = bulk.admission(credits - k, n - k, base);
                    assert!(!a.is_full());
                    let first = k;
                    while k < n {
                        let ulp = (rng >> (16 + k % 40)) & 7 == 0;
                        let wr_id = call * 1000 + k as u64;
                        // Half the calls admit the unsignaled WRs as the post path does, through quiet runs.
                        if call % 2 == 0 && !ulp {
                            let (quiet, token) = a.quiet_run();
                            if let Some(cell) = quiet.first() {
                                cell.set(Slot::new(wr_id, 3, 0));
                                a.quiet_done(1);
                                let (seq, signaled) = one.admit_posted(wr_id, 3, ulp, credits - k);
                                assert_eq!((token, false), (Token::from_base(base, seq).0, signaled), "call {call} WR {k}");
                                k += 1;
                                continue;
                            }
                        }
                        let Some(got) = a.push(wr_id, 3, ulp) else { break };
                        let (seq, signaled) = one.admit_posted(wr_id, 3, ulp, credits - k);
                        let want = (Token::from_base(base, seq).0, signaled);
                        assert_eq!(got, want, "depth {depth} interval {interval} call {call} WR {k}");
                        k += 1;
                    }
                    let done = a.end();
                    assert_eq!(done.count(), k - first);
                    bulk.admitted(done);
                }
                assert_eq!(bulk.counters, one.counters);
                assert_eq!((bulk.accepted, bulk.has_unsignaled_tail()), (one.accepted, one.has_unsignaled_tail()));
                assert_eq!(bulk.policy.run(), one.policy.run());
                for seq in one.ledger.ring.tail()..one.ledger.ring.head() {
                    assert_eq!(bulk.slot(seq), one.slot(seq));
                }
            }
        }
    }

    #[test]
    fn barriers_run_in_target_order_stable_among_equals() {
        let st = SendState::<NoParked>::new(4, 1, Backlog::new(0)).unwrap();
        let mut b = Barriers::new(st.ledger().clone());
        b.push(5, "a");
        b.push(3, "b");
        b.push(5, "c");
        b.push(0, "d");
        assert_eq!(b.pop_ready(0), Some("d"));
        assert_eq!(b.pop_ready(2), None);
        assert_eq!(b.pop_ready(3), Some("b"));
        assert_eq!(b.pop_ready(4), None);
        assert_eq!(b.pop_ready(9), Some("a"));
        assert_eq!(b.pop_ready(9), Some("c"));
        assert!(b.is_empty());
        assert!(!b.is_due(u64::MAX - 1));
    }
}
