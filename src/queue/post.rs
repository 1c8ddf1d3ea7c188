//! The post path of a managed queue's sends: the checks, the admission into the ring (quiet runs, the bulk
//! admission, the general loop with its backlog), the post with one doorbell per run, and the restore.

use std::cell::Cell;

use crate::discipline::backlog::ParkStore;
use crate::discipline::check::{Limits, check_atomic, check_bind_mw, check_inline, check_shape, is_atomic, plain_wc_opcode, quiet_wc_opcode};
use crate::discipline::opcode::{SEND_INLINE, SEND_SIGNALED, WR_BIND_MW};
use crate::discipline::send::Admit;
use crate::discipline::token::Token;
use crate::discipline::{SendState, Slot};
use crate::error::{Error, Result};
use crate::post_error::PostError;
use crate::verbs::{PostFailure, SendChain, StagedWr, WrPtr};

use super::{QueueShared, QueueState, closed_error};

/// Most WRs posted with one doorbell: longer runs are posted in pieces.
const MAX_RUN: u32 = 64;

/// WRs admitted for posting and not yet posted: `len` WRs from `first` to `last`, the newest in the ring (of
/// consecutive sequence numbers up to the ring's head: `Run::seq`). The ring slots hold what to restore in them
/// afterwards (the ULP's wr_id, and whether the ULP itself asked for IBV_SEND_SIGNALED).
#[derive(Clone, Copy)]
struct Run<'a> {
    first: WrPtr<'a>,
    last: WrPtr<'a>,
    len: u32,
    added: Added<'a>,
}

impl<'a> Run<'a> {
    /// No WR yet (its WRs will be from `first` on).
    fn empty(first: WrPtr<'a>) -> Run<'a> {
        Run { first, last: first, len: 0, added: Added::default() }
    }

    /// The sequence number of the run's first WR: a run is posted before anything else is admitted, so its WRs
    /// are the ring's newest. Not carried in the run, whose fields the post path keeps across the provider call.
    #[inline]
    fn seq(&self, send: &SendState<StagedWr>) -> u64 {
        send.wqes() - u64::from(self.len)
    }

    /// The run goes on with `n` WRs admitted from `from` to `last`, the ring's newest.
    #[inline(always)]
    fn extend(&mut self, from: WrPtr<'a>, n: u32, last: WrPtr<'a>) {
        if n > 0 {
            if self.len == 0 {
                self.first = from;
            }
            self.len += n;
            self.last = last;
        }
    }
}

/// The WRs of a run that the policy signaled without the ULP asking: `IBV_SEND_SIGNALED` is taken back from
/// them after the post. The first two are kept (a run has about `len / signal_interval + 1`); with more, the
/// restore reads every WR's flags from the ring instead.
#[derive(Clone, Copy, Default)]
struct Added<'a> {
    first: Option<WrPtr<'a>>,
    second: Option<WrPtr<'a>>,
    more: bool,
}

impl<'a> Added<'a> {
    #[inline]
    fn push(&mut self, w: WrPtr<'a>) {
        if self.first.is_none() {
            self.first = Some(w);
        } else if self.second.is_none() {
            self.second = Some(w);
        } else {
            self.more = true;
        }
    }
}

/// The checks of a WR, the plain test first and the full ones for the rest; its work-completion opcode.
#[inline]
fn check_full(w: WrPtr<'_>, shape: &crate::discipline::check::WrShape, limits: &Limits) -> Result<u8> {
    if let Some(op) = plain_wc_opcode(shape, limits) {
        return Ok(op);
    }
    check_rest(w, shape, limits)
}

/// What `plain_wc_opcode` leaves to the full checks (kept out of line: the post loop's common WR never needs it).
#[cold]
#[inline(never)]
fn check_rest(w: WrPtr<'_>, shape: &crate::discipline::check::WrShape, limits: &Limits) -> Result<u8> {
    let op = check_shape(shape, limits)?;
    if shape.send_flags & SEND_INLINE != 0 {
        check_inline(w.total_len(), limits)?;
    }
    if is_atomic(shape.opcode) {
        check_atomic(w.total_len(), w.atomic_remote_addr())?;
    } else if shape.opcode == WR_BIND_MW {
        check_bind_mw(w.bind_mw_is_null())?;
    }
    Ok(op)
}

/// The error of a WR that finds no credit and a full backlog.
#[cold]
fn backlog_full(send: &SendState<StagedWr>) -> Error {
    Error::new(
        libc::EAGAIN,
        format!(
            "no SQ credit (sq_depth {}) and the backlog is full (backlog_depth {})",
            send.depth(),
            send.backlog_capacity()
        ),
    )
}

/// Where `fill_quiet` stopped, in two words so that it comes back in registers.
pub(super) struct QuietRun<'a> {
    /// Slots filled, from the first.
    filled: usize,
    /// The last WR admitted (the first WR when none was).
    last: WrPtr<'a>,
}

impl<'a> QuietRun<'a> {
    /// The WR the run stopped at (not admitted), or `None` at the end of the chain: the one after `last`, or
    /// the first WR (`first`) itself when none was admitted.
    #[inline]
    fn stop(&self, first: WrPtr<'a>) -> Option<WrPtr<'a>> {
        if self.filled == 0 {
            Some(first)
        } else {
            self.last.next()
        }
    }
}

/// Calls `step` on the items in order while it returns `true`; whether it did for every item. Four items per turn
/// of the loop, so that the slice's bound is tested once per four: for the per-WR walks of a post (`fill_quiet`,
/// `restore_run`), whose steps are a few instructions each.
#[inline(always)]
fn each_by_fours<T>(items: &[T], mut step: impl FnMut(&T) -> bool) -> bool {
    let mut fours = items.chunks_exact(4);
    for four in &mut fours {
        for item in four {
            if !step(item) {
                return false;
            }
        }
    }
    fours.remainder().iter().all(step)
}

/// The loop of a quiet run (`Admission::quiet_run`): admits WRs from `w` into `slots` in order while they pass
/// `quiet_wc_opcode`, each with its slot and the next token from `token`. Out of line, with only its own values
/// live, so that the per-WR loop keeps them all in registers.
/// With `KEEP_WR_ID` false (an indexed queue), a slot keeps the wr_id it held: the queue names its WRs by
/// their index and never reads it.
#[inline(never)]
pub(super) fn fill_quiet<'a, const KEEP_WR_ID: bool>(slots: &[Cell<Slot>], mut w: WrPtr<'a>, first_token: u64, limits: &Limits) -> QuietRun<'a> {
    let mut last = w;
    let mut token = first_token;
    // Admits `w` into `cell` and steps to the next WR; `false` where the run stops (`w` not admitted, or the
    // chain's end).
    let admit = |cell: &Cell<Slot>| {
        let Some(op) = quiet_wc_opcode(&w.quiet_shape(), limits) else { return false };
        // Without the wr_id the slot's first word is stored back as it was, which the compiler drops: only the
        // second word is written.
        let wr_id = if KEEP_WR_ID { w.wr_id() } else { cell.get().wr_id };
        cell.set(Slot::unsignaled(wr_id, op));
        w.set_wr_id(token);
        token += 1;
        last = w;
        match w.next() {
            Some(x) => {
                w = x;
                true
            }
            None => false,
        }
    };
    // By fours, the last WR and the next also take turns in two registers instead of moving from one to the
    // other.
    each_by_fours(slots, admit);
    QuietRun { filled: (token - first_token) as usize, last }
}

/// Restores the WRs of a posted run (its successor in the ULP's chain is `cut`), in one walk: the ULP's wr_id
/// from the ring slots their admission filled, and the link cut after the run. The flags differ from the ULP's
/// only by `IBV_SEND_SIGNALED` on the WRs in `run.added`.
fn restore_run(send: &SendState<StagedWr>, run: Run<'_>, cut: Option<WrPtr<'_>>) {
    if run.added.more {
        return restore_flags_too(send, run, cut);
    }
    let (a, b) = send.run_slots(run.seq(send), run.len as u64);
    // The run was posted cut after its last WR (`post_run`): the walk ends at its NULL link, which is also the
    // end of its slots, so that a WR costs no count, only its slot's load, its store and its link.
    let mut w = run.first;
    let mut restore = |slot: &Cell<Slot>| {
        w.set_wr_id(slot.get().wr_id);
        match w.next() {
            Some(x) => {
                w = x;
                true
            }
            None => false,
        }
    };
    if each_by_fours(a, &mut restore) {
        each_by_fours(b, &mut restore);
    }
    debug_assert!(w.next().is_none() && w == run.last, "a run's slots and WRs end together");
    run.last.set_next(cut);
    if let Some(a) = run.added.first {
        a.set_send_flags(a.send_flags() & !SEND_SIGNALED);
        if let Some(b) = run.added.second {
            b.set_send_flags(b.send_flags() & !SEND_SIGNALED);
        }
    }
}

/// `restore_run` for a run with more than two WRs the policy signaled: each WR's flags from its slot.
#[inline(never)]
fn restore_flags_too(send: &SendState<StagedWr>, run: Run<'_>, cut: Option<WrPtr<'_>>) {
    let (a, b) = send.run_slots(run.seq(send), run.len as u64);
    let mut w = run.first;
    let mut left = run.len;
    for part in [a, b] {
        for slot in part {
            let slot = slot.get();
            w.set_wr_id(slot.wr_id);
            if slot.flags() & (Slot::SIGNALED | Slot::ULP_SIGNALED) == Slot::SIGNALED {
                w.set_send_flags(w.send_flags() & !SEND_SIGNALED);
            }
            left -= 1;
            if left == 0 {
                w.set_next(cut);
                return;
            }
            w = w.next().expect("run is linked");
        }
    }
}

impl QueueShared {
    /// `Queue::post_send`: admits the chain's WRs (posted now with their tokens, parked, or refused) and
    /// restores the chain as the ULP built it. Always in line: its C entry point's common call and the call that
    /// takes a thread-safe CQ's lock each have their copy, so that the common one makes no call of its own.
    #[inline(always)]
    pub(super) fn post_send<'a>(&self, chain: SendChain<'a>) -> std::result::Result<(), PostError<'a>> {
        self.post_send_then(chain, || Ok(()), Err)
    }

    /// `post_send`, handing nothing to `done` when every WR was accepted, or the error to `failed`, and returning
    /// what they make of it: a caller that wants one value (the C API's 0 or negative errno) gets it from the
    /// common post without a `Result` in between.
    #[inline(always)]
    pub(super) fn post_send_then<'a, R>(
        &self,
        chain: SendChain<'a>,
        done: impl FnOnce() -> R,
        failed: impl FnOnce(PostError<'a>) -> R,
    ) -> R {
        let Some(first) = chain.first() else { return done() };
        let mut guard = self.state.borrow_mut();
        let st = &mut *guard;
        // The common call, one plain WR on an open queue with nothing parked or noted and a free slot, is decided
        // with one test of the queue's state.
        let open = st.send.plain_open();
        let plain_one = if open && first.next().is_none() {
            let credits = st.send.credits();
            let shape = first.shape();
            match plain_wc_opcode(&shape, &self.limits) {
                // The commonest: a WR that neither the ULP nor the policy signals.
                Some(op) if shape.send_flags & SEND_SIGNALED == 0 && st.send.quiet_next(credits) => {
                    return self.post_quiet_one(st, first, op, done, failed);
                }
                Some(op) if credits > 0 => Some((shape.send_flags, op, credits)),
                _ => None,
            }
        } else {
            None
        };
        if let Some((send_flags, op, credits)) = plain_one {
            let result = self.post_one(st, first, send_flags, op, credits);
            self.settle_tail(st);
            return match result {
                Ok(()) => done(),
                Err(e) => failed(e),
            };
        }
        // Decided once per call: nothing below changes them but this call's own posts (one credit each) and
        // parks (after which `credits` is 0 and every WR goes through `admit`). An open queue (`plain_open`) has
        // nothing parked and notes nothing.
        let (credits, note) = if open {
            (st.send.credits(), false)
        } else {
            if let Some(c) = st.send.closed() {
                return failed(PostError { error: closed_error(c), bad: first });
            }
            (st.send.postable(), st.send.noting())
        };
        let result = if credits > 0 && !note {
            // The common chain: plain WRs that fit in the free slots, the policy leaving them all unsignaled,
            // admitted in one quiet run and posted with one doorbell; whatever is left (from a WR the ULP or the
            // policy signals on) goes on in the same run (`post_signaled`).
            let (quiet, _, token, gap) = st.send.quiet_run(credits, MAX_RUN, self.send_token);
            let filled = (self.fill_quiet)(quiet, first, token, &self.limits);
            let n = filled.filled as u32;
            let mut run = Run { first, last: filled.last, len: n, added: Added::default() };
            if st.send.quiet_admitted(n, gap) {
                // The run's last WR is the one the policy signals.
                let w = filled.last;
                w.set_send_flags(w.send_flags() | SEND_SIGNALED);
                run.added.push(w);
            }
            match filled.stop(first) {
                None => match self.post_run(st, run, None) {
                    Ok(()) => {
                        // The common end: returned from here, with no `Result` kept across `settle_tail`.
                        self.settle_tail(st);
                        return done();
                    }
                    Err(f) => Err(self.run_refused(st, run, f)),
                },
                // The quiet run took the last free slot (its last WR is the policy's signal): the WRs from `w`
                // on are parked.
                Some(w) if n == credits => self.post_general(st, w, run, 0, false),
                // The chain's last WR, stopped at by the quiet run (the ULP signals it, or the run's slots ended
                // at the ring's end): admitted as `post_one` admits one WR if it passes the plain checks.
                Some(w) if w.next().is_none() && n < MAX_RUN => {
                    let shape = w.shape();
                    match plain_wc_opcode(&shape, &self.limits) {
                        Some(op) => {
                            let mut run = run;
                            let ulp_signaled = shape.send_flags & SEND_SIGNALED != 0;
                            let (seq, signaled) = st.send.admit_posted(w.wr_id(), op, ulp_signaled, credits - n);
                            w.set_wr_id(Token::from_base(self.send_token, seq).0);
                            if signaled & !ulp_signaled {
                                w.set_send_flags(shape.send_flags | SEND_SIGNALED);
                                run.added.push(w);
                            }
                            run.extend(w, 1, w);
                            match self.post_run(st, run, None) {
                                Ok(()) => {
                                    self.settle_tail(st);
                                    return done();
                                }
                                Err(f) => Err(self.run_refused(st, run, f)),
                            }
                        }
                        None => self.post_signaled(st, w, run, credits - n),
                    }
                }
                Some(w) => self.post_signaled(st, w, run, credits - n),
            }
        } else {
            self.post_general(st, first, Run::empty(first), credits, note)
        };
        self.settle_tail(st);
        match result {
            Ok(()) => done(),
            Err(e) => failed(e),
        }
    }

    /// A post of one plain WR (`plain_wc_opcode` gave `op`) that neither the ULP nor the policy signals
    /// (`SendState::quiet_next`): `post_one` without the signal, so that its outcome is known to leave an
    /// unsignaled tail (`settle_quiet_tail`). Its wr_id is kept in a local to restore it.
    #[inline(always)]
    fn post_quiet_one<'a, R>(
        &self,
        st: &mut QueueState,
        w: WrPtr<'a>,
        op: u8,
        done: impl FnOnce() -> R,
        failed: impl FnOnce(PostError<'a>) -> R,
    ) -> R {
        let wr_id = w.wr_id();
        let seq = st.send.admit_quiet_one(wr_id, op);
        w.set_wr_id(Token::from_base(self.send_token, seq).0);
        let r = self.qp.post_chain(w);
        st.doorbells += 1;
        // Restored whether the queue restores or not (`no_restore`): the wr_id of a WR posted on such a queue
        // is unspecified after the call, and one store costs less than the test.
        w.set_wr_id(wr_id);
        if let Err(f) = r {
            return failed(self.quiet_one_refused(st, w, f));
        }
        self.settle_quiet_tail(st);
        done()
    }

    /// The provider refused the WR of `post_quiet_one`: what `post_one` and `settle_tail` do then.
    #[cold]
    #[inline(never)]
    fn quiet_one_refused<'a>(&self, st: &mut QueueState, w: WrPtr<'a>, f: PostFailure) -> PostError<'a> {
        let run = Run { first: w, last: w, len: 1, added: Added::default() };
        let e = self.run_refused(st, run, f);
        self.settle_tail(st);
        e
    }

    /// A post of one plain WR (`plain_wc_opcode` gave `op`) with a free slot: what the bulk path does for a
    /// chain of one, without its set-up. The WR keeps its own wr_id and flags in locals to restore them.
    #[inline(always)]
    fn post_one<'a>(&self, st: &mut QueueState, w: WrPtr<'a>, send_flags: u32, op: u8, credits: u32) -> std::result::Result<(), PostError<'a>> {
        let wr_id = w.wr_id();
        let ulp_signaled = send_flags & SEND_SIGNALED != 0;
        let (seq, signaled) = st.send.admit_posted(wr_id, op, ulp_signaled, credits);
        w.set_wr_id(Token::from_base(self.send_token, seq).0);
        let added = signaled & !ulp_signaled;
        if added {
            w.set_send_flags(send_flags | SEND_SIGNALED);
        }
        let r = self.qp.post_chain(w);
        st.doorbells += 1;
        if !self.no_restore || r.is_err() {
            w.set_wr_id(wr_id);
            if added {
                w.set_send_flags(send_flags);
            }
        }
        match r {
            Ok(()) => Ok(()),
            Err(f) => {
                let run = Run { first: w, last: w, len: 1, added: Added::default() };
                Err(self.run_refused(st, run, f))
            }
        }
    }

    /// The rest of a post call whose quiet run (`SendState::quiet_run`) stopped at `from`, a WR the policy or
    /// the ULP signals or one that needs more than the plain checks, when it is not the chain's last plain WR
    /// (`post_send` admits that one itself): the bulk admission goes on from it, in the same run, with
    /// `credits` (at least 1) left; whatever it leaves goes through the general loop. Out of line, so that the
    /// common calls carry none of it.
    #[inline(never)]
    fn post_signaled<'a>(&self, st: &mut QueueState, from: WrPtr<'a>, mut run: Run<'a>, credits: u32) -> std::result::Result<(), PostError<'a>> {
        let room = credits.min(MAX_RUN - run.len);
        let (m, last, next) = self.admit_plain(&mut st.send, from, credits, room, &mut run.added);
        run.extend(from, m, last);
        match next {
            None => match self.post_run(st, run, None) {
                Ok(()) => Ok(()),
                Err(f) => Err(self.run_refused(st, run, f)),
            },
            Some(w) => self.post_general(st, w, run, credits - m, false),
        }
    }

    /// The post loop for every WR from `from` on, continuing `run` (the WRs admitted before it and not yet
    /// posted) with `credits` free slots left: plain WRs in bulk, the others one by one through the full checks,
    /// `admit` and the backlog; each run posted with one doorbell.
    #[inline(never)]
    fn post_general<'a>(
        &self,
        st: &mut QueueState,
        from: WrPtr<'a>,
        mut run: Run<'a>,
        mut credits: u32,
        note: bool,
    ) -> std::result::Result<(), PostError<'a>> {
        let mut cur = Some(from);
        let mut result = Ok(());
        while let Some(w) = cur {
            if run.len == MAX_RUN {
                let full = std::mem::replace(&mut run.len, 0);
                if let Err(e) = self.flush_run(st, Run { len: full, ..run }, Some(w)) {
                    result = Err(e);
                    break;
                }
            }
            if credits > 0 && !note {
                // Plain WRs in bulk while credits and the run's room last.
                let room = credits.min(MAX_RUN - run.len);
                if run.len == 0 {
                    run.added = Added::default();
                }
                let (n, last, next) = self.admit_plain(&mut st.send, w, credits, room, &mut run.added);
                if n > 0 {
                    run.extend(w, n, last);
                    credits -= n;
                    cur = next;
                    continue;
                }
                // `w` needs more than the plain checks: the general step below.
            }
            let next = w.next();
            let shape = w.shape();
            let op = match check_full(w, &shape, &self.limits) {
                Ok(op) => op,
                Err(e) => {
                    result = Err(PostError { error: e, bad: w });
                    break;
                }
            };
            let ulp_signaled = shape.send_flags & SEND_SIGNALED != 0;
            let admitted = if credits > 0 {
                let (seq, signaled) = st.send.admit_posted(w.wr_id(), op, ulp_signaled, credits);
                credits -= 1;
                Admit::Post { seq, signaled }
            } else {
                st.send.admit(w.wr_id(), op, ulp_signaled)
            };
            match admitted {
                Admit::Post { seq, signaled } => {
                    if note {
                        // Its uses of tracked MRs are noted once the provider took it (`flush_run`).
                        st.note_buffers(w);
                    }
                    if run.len == 0 {
                        run.first = w;
                        run.added = Added::default();
                    }
                    run.len += 1;
                    run.last = w;
                    w.set_wr_id(Token::from_base(self.send_token, seq).0);
                    if signaled && !ulp_signaled {
                        w.set_send_flags(shape.send_flags | SEND_SIGNALED);
                        run.added.push(w);
                    }
                }
                Admit::Park => {
                    if run.len > 0 {
                        let full = std::mem::replace(&mut run.len, 0);
                        if let Err(e) = self.flush_run(st, Run { len: full, ..run }, Some(w)) {
                            result = Err(e);
                            break;
                        }
                    }
                    let mut pool = self.send_cq.pool.borrow_mut();
                    let id = match pool.take(self.pool_class) {
                        Ok(id) => id,
                        Err(error) => {
                            st.send.note_store_exhausted();
                            result = Err(PostError { error, bad: w });
                            break;
                        }
                    };
                    pool.entry(id).stage_from(w, op);
                    st.send.commit_park(id, &mut *pool);
                    drop(pool);
                    credits = 0;
                    if note {
                        st.note_accepted(w, shape.send_flags);
                    }
                }
                Admit::Full => {
                    result = Err(PostError { error: backlog_full(&st.send), bad: w });
                    break;
                }
            }
            cur = next;
        }
        if run.len > 0 {
            // The run ends before `cur` (the WR that stopped the loop, or the end of the chain).
            let cut = match &result {
                Err(e) => Some(e.bad),
                Ok(()) => None,
            };
            if let Err(e) = self.flush_run(st, run, cut) {
                result = Err(e);
            }
        }
        result
    }

    /// Admits plain WRs (`plain_wc_opcode`) from `first` while `room` (at most `credits`, the SQ's free slots)
    /// lasts: each gets its token and, when the policy signals it, `IBV_SEND_SIGNALED`. Stops at the end of the
    /// chain, after `room` WRs, or at a WR that needs the full checks. Returns how many it admitted, the last
    /// one admitted and the WR after it.
    #[inline(always)]
    fn admit_plain<'a>(
        &self,
        send: &mut SendState<StagedWr>,
        first: WrPtr<'a>,
        credits: u32,
        room: u32,
        added: &mut Added<'a>,
    ) -> (u32, WrPtr<'a>, Option<WrPtr<'a>>) {
        let mut a = send.admission(credits, room, self.send_token);
        let mut w = first;
        let mut last = first;
        let next = 'walk: loop {
            // The WRs the policy leaves unsignaled: the checks, the slot and the token for each, nothing of the
            // policy. A WR the ULP signals or that needs more than the plain checks ends the run: the step
            // below decides it.
            let (quiet, token) = a.quiet_run();
            let run = (self.fill_quiet)(quiet, w, token, &self.limits);
            let k = run.filled;
            if k > 0 {
                last = run.last;
            }
            match run.stop(w) {
                Some(x) => w = x,
                None => {
                    a.quiet_done(k);
                    break 'walk None;
                }
            }
            a.quiet_done(k);
            // The WR the policy signals next, one the ULP signals, or the end of the admission's room.
            let shape = w.shape();
            let Some(op) = plain_wc_opcode(&shape, &self.limits) else { break Some(w) };
            let ulp_signaled = shape.send_flags & SEND_SIGNALED != 0;
            let Some((token, signaled)) = a.push(w.wr_id(), op, ulp_signaled) else { break Some(w) };
            w.set_wr_id(token);
            if signaled & !ulp_signaled {
                w.set_send_flags(shape.send_flags | SEND_SIGNALED);
                added.push(w);
            }
            last = w;
            match w.next() {
                Some(x) => w = x,
                None => break None,
            }
        };
        let done = a.end();
        let n = done.count();
        send.admitted(done);
        (n, last, next)
    }

    /// Posts `run` (whose successor in the ULP's chain is `cut`) with one doorbell, then restores its WRs.
    /// On a queue that notes its WRs, the tracked MRs the WRs the provider took use are noted here.
    fn flush_run<'a>(&self, st: &mut QueueState, run: Run<'a>, cut: Option<WrPtr<'a>>) -> std::result::Result<(), PostError<'a>> {
        let r = self.post_run(st, run, cut);
        if st.send.noting() {
            let posted = match &r {
                Ok(()) => run.len,
                Err(f) => f.posted as u32,
            };
            st.note_posted(run.first, run.len, posted);
        }
        match r {
            Ok(()) => Ok(()),
            Err(f) => Err(self.run_refused(st, run, f)),
        }
    }

    /// `flush_run` without the error's description: the common case, inlined into the post path.
    #[inline(always)]
    fn post_run(&self, st: &mut QueueState, run: Run<'_>, cut: Option<WrPtr<'_>>) -> std::result::Result<(), PostFailure> {
        debug_assert_eq!(
            run.first.wr_id(),
            Token::from_base(self.send_token, run.seq(&st.send)).0,
            "a run's WRs are the ring's newest (Run::seq)"
        );
        // A run that ends the chain (`cut` is `None`, known where this is inlined) already ends at a NULL link.
        if cut.is_some() {
            run.last.set_next(None);
        }
        debug_assert!(run.last.next().is_none(), "a run that ends the chain ends at its NULL link");
        let r = self.qp.post_chain(run.first);
        st.doorbells += 1;
        if self.no_restore && r.is_ok() {
            // Every WR of the run was posted: only the link the run was cut at goes back.
            if cut.is_some() {
                run.last.set_next(cut);
            }
        } else if run.len == 1 {
            // A post of one WR: its slot, its link and at most its own flag.
            let w = run.first;
            w.set_wr_id(st.send.slot(run.seq(&st.send)).wr_id);
            if cut.is_some() {
                w.set_next(cut);
            }
            if run.added.first.is_some() {
                w.set_send_flags(w.send_flags() & !SEND_SIGNALED);
            }
        } else {
            restore_run(&st.send, run, cut);
        }
        r
    }

    /// The provider took only `f.posted` WRs of `run`: the rest are not accepted; the error names the first.
    #[cold]
    #[inline(never)]
    fn run_refused<'a>(&self, st: &mut QueueState, run: Run<'a>, f: PostFailure) -> PostError<'a> {
        st.send.rollback(run.len as u64 - f.posted as u64, true);
        let mut bad = run.first;
        for _ in 0..f.posted {
            bad = bad.next().expect("run is linked");
        }
        PostError { error: Error::new(f.errno, format!("the provider's post_send failed (errno {})", f.errno)), bad }
    }
}
