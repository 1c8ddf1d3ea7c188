//! A managed queue: the send queue (and optionally the receive queue) of one RC QP.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::completion::Completion;
use crate::cq::{Cq, CqShared, IdleCheck};
use crate::discipline::budget::reservation;
use crate::discipline::check::{check_inline, check_shape, Limits};
use crate::discipline::opcode::{SEND_INLINE, SEND_SIGNALED};
use crate::discipline::send::{Admit, Barriers, Closed, CqeOutcome};
use crate::discipline::token::{Direction, Token};
use crate::discipline::{Backlog, RecvState, SendState};
use crate::error::{Error, Result};
use crate::verbs::{pump_backlog, ForeignDeferred, ForeignRelease, QpHandle, RecvChain, RecvWrPtr, SendChain, StagedWr, WrPtr};

/// Largest depth (SQ, RQ or backlog) a queue accepts.
pub const MAX_DEPTH: u32 = 1 << 20;
/// Largest `max_send_sge` a queue accepts.
pub const MAX_SGE: u32 = 1024;
/// Largest `max_inline_data` a queue accepts.
pub const MAX_INLINE: u32 = 1 << 16;

/// How a queue is set up. Depths are what the QP was actually granted (read them back after creating it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueConfig {
    /// The QP's `max_send_wr`: the most WQEs the library ever lets the provider hold.
    pub sq_depth: u32,
    pub max_send_sge: u32,
    pub max_inline_data: u32,
    /// The QP's `max_recv_wr` when receives complete on a managed CQ (`recv_cq`), else 0.
    pub rq_depth: u32,
    /// At most `signal_interval - 1` unsignaled WRs in a row; 0 picks `max(1, sq_depth / 4)`.
    pub signal_interval: u32,
    /// WRs parked while the SQ has no credit; 0 makes posts fail with `EAGAIN` instead.
    pub backlog_depth: u32,
}

/// What runs when a WR is released.
pub enum ReleaseHandler {
    Closure(Box<dyn Fn(&Completion)>),
    Foreign(ForeignRelease),
}

/// What `defer` runs once every WR accepted before it is released.
pub enum Deferred {
    Closure(Box<dyn FnOnce()>),
    Foreign(ForeignDeferred),
}

impl Deferred {
    fn run(self) {
        match self {
            Deferred::Closure(f) => f(),
            Deferred::Foreign(f) => f.call(),
        }
    }
}

/// Counters and state of a queue (`struct sqd_queue_stats` in C).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Send WRs accepted (posted or parked).
    pub accepted: u64,
    /// Send WRs released.
    pub released: u64,
    /// WQEs handed to the provider, markers included.
    pub wqes: u64,
    /// Provider post_send calls.
    pub doorbells: u64,
    /// WQEs signaled because the ULP asked.
    pub signaled_by_ulp: u64,
    /// WQEs signaled by the moderation policy (interval or last free slot).
    pub signaled_by_policy: u64,
    /// Zero-length signaled markers posted to cover an idle unsignaled tail or a drain.
    pub markers: u64,
    /// Send CQEs reaped.
    pub send_cqes: u64,
    /// WRs that went through the backlog.
    pub parked: u64,
    /// WRs refused with EAGAIN (no credit, backlog full).
    pub refused: u64,
    /// Most WRs in the backlog at once.
    pub backlog_peak: u64,
    /// Receives posted.
    pub recv_posted: u64,
    /// Receive CQEs reaped.
    pub recv_cqes: u64,
    /// CQEs of this QP that matched no outstanding WR.
    pub stray_cqes: u64,
    /// WQEs the provider holds now (no CQE polled at or after them yet).
    pub in_provider: u32,
    /// Free SQ slots now.
    pub credits: u32,
    /// WRs in the backlog now.
    pub backlog: u32,
    /// Receives posted and not yet released.
    pub recv_outstanding: u32,
    /// Deferred actions waiting.
    pub deferred: u32,
    /// The signal interval in force.
    pub signal_interval: u32,
    /// An `enum ibv_wc_status` if a completion failed the queue, else 0.
    pub failed_status: u32,
    /// 1 when the queue takes no more WRs (failed or draining).
    pub closed: u32,
}

pub(crate) enum CqeFate {
    Visible(u64),
    Hidden,
    Stray,
    Passthrough,
}

struct QueueState {
    send: SendState<StagedWr>,
    recv: Option<RecvState>,
    barriers: Barriers<Deferred>,
    doorbells: u64,
    posted_since_poll: bool,
    watched: bool,
}

pub(crate) struct QueueShared {
    qp: QpHandle,
    limits: Limits,
    send_cq: Rc<CqShared>,
    recv_cq: Option<Rc<CqShared>>,
    send_index: u32,
    recv_index: u32,
    send_need: u64,
    recv_need: u64,
    state: RefCell<QueueState>,
    releasing: Cell<bool>,
    release: Option<ReleaseHandler>,
}

/// The managed send queue (and optionally receive queue) of one RC QP.
///
/// Not thread-safe: used from the thread that uses its CQs. Dropping it detaches it from its CQs; call
/// [`Queue::check_free`] first, since WRs still outstanding would then complete as strays.
pub struct Queue {
    shared: Rc<QueueShared>,
}

/// A post that stopped early: `error` says why; `bad` is the first WR not accepted (it and every WR after it
/// were not taken).
#[derive(Debug)]
pub struct PostError<'a> {
    pub error: Error,
    pub bad: WrPtr<'a>,
}

#[derive(Debug)]
pub struct RecvPostError<'a> {
    pub error: Error,
    pub bad: RecvWrPtr<'a>,
}

impl Queue {
    /// Puts `qp` under management: its sends complete on `send_cq`, its receives (if `config.rq_depth > 0`) on
    /// `recv_cq`. Reserves the queue's worst case on the CQ(s): `ENOSPC` if it does not fit.
    pub fn new(send_cq: &Cq, recv_cq: Option<&Cq>, qp: QpHandle, config: QueueConfig, release: Option<ReleaseHandler>) -> Result<Queue> {
        let c = config;
        if c.sq_depth == 0 || c.sq_depth > MAX_DEPTH {
            return Err(Error::invalid(format!("sq_depth {} is outside 1..={MAX_DEPTH}", c.sq_depth)));
        }
        if c.rq_depth > MAX_DEPTH || c.backlog_depth > MAX_DEPTH {
            return Err(Error::invalid(format!(
                "rq_depth {} or backlog_depth {} is above {MAX_DEPTH}",
                c.rq_depth, c.backlog_depth
            )));
        }
        if c.max_send_sge > MAX_SGE {
            return Err(Error::invalid(format!("max_send_sge {} is above {MAX_SGE}", c.max_send_sge)));
        }
        if c.max_inline_data > MAX_INLINE {
            return Err(Error::invalid(format!("max_inline_data {} is above {MAX_INLINE}", c.max_inline_data)));
        }
        if c.signal_interval > c.sq_depth {
            return Err(Error::invalid(format!(
                "signal_interval {} is above sq_depth {}: the SQ would fill before a signaled WR",
                c.signal_interval, c.sq_depth
            )));
        }
        let interval = if c.signal_interval == 0 { (c.sq_depth / 4).max(1) } else { c.signal_interval };
        if !std::ptr::eq(qp.send_cq(), send_cq.shared.handle.as_ptr()) {
            return Err(Error::invalid(format!(
                "the QP's send CQ ({:p}) is not the CQ given as send_cq ({:p})",
                qp.send_cq(),
                send_cq.shared.handle.as_ptr()
            )));
        }
        match (recv_cq, c.rq_depth) {
            (None, 0) => {}
            (None, n) => {
                return Err(Error::invalid(format!("rq_depth is {n} but no recv_cq was given (use 0 for unmanaged receives)")))
            }
            (Some(_), 0) => return Err(Error::invalid("a recv_cq was given but rq_depth is 0")),
            (Some(rcq), _) => {
                if qp.has_srq() {
                    return Err(Error::invalid("the QP receives from an SRQ: its receives cannot be managed per queue"));
                }
                if !std::ptr::eq(qp.recv_cq(), rcq.shared.handle.as_ptr()) {
                    return Err(Error::invalid(format!(
                        "the QP's recv CQ ({:p}) is not the CQ given as recv_cq ({:p})",
                        qp.recv_cq(),
                        rcq.shared.handle.as_ptr()
                    )));
                }
            }
        }
        let same_cq = recv_cq.is_some_and(|r| Rc::ptr_eq(&r.shared, &send_cq.shared));
        let (send_need, recv_need) = if same_cq {
            (reservation(c.sq_depth, c.rq_depth, true, true), 0)
        } else {
            (reservation(c.sq_depth, 0, true, false), reservation(0, c.rq_depth, false, recv_cq.is_some()))
        };
        let what = if same_cq {
            format!("sq_depth {} + rq_depth {} + 1 drain marker", c.sq_depth, c.rq_depth)
        } else {
            format!("sq_depth {} + 1 drain marker", c.sq_depth)
        };
        let qp_num = qp.qp_num();
        let send_index = send_cq.shared.attach(qp_num, send_need, &what)?;
        let recv_index = match recv_cq {
            Some(r) if !same_cq => match r.shared.attach(qp_num, recv_need, &format!("rq_depth {}", c.rq_depth)) {
                Ok(i) => i,
                Err(e) => {
                    send_cq.shared.detach(send_index, qp_num, send_need);
                    return Err(e);
                }
            },
            _ => send_index,
        };
        let limits = Limits { max_send_sge: c.max_send_sge, max_inline_data: c.max_inline_data };
        let backlog = Backlog::new(c.backlog_depth as usize, || StagedWr::new(c.max_send_sge, c.max_inline_data));
        let shared = Rc::new(QueueShared {
            qp,
            limits,
            send_cq: send_cq.shared.clone(),
            recv_cq: recv_cq.map(|r| r.shared.clone()),
            send_index,
            recv_index,
            send_need,
            recv_need,
            state: RefCell::new(QueueState {
                send: SendState::new(c.sq_depth, interval, backlog),
                recv: recv_cq.map(|_| RecvState::new(c.rq_depth)),
                barriers: Barriers::default(),
                doorbells: 0,
                posted_since_poll: false,
                watched: false,
            }),
            releasing: Cell::new(false),
            release,
        });
        shared.send_cq.install(send_index, shared.clone());
        if let Some(r) = &shared.recv_cq {
            if !same_cq {
                r.install(recv_index, shared.clone());
            }
        }
        Ok(Queue { shared })
    }

    /// Hands a chain of send WRs to the queue. Each WR, in order, is checked, then posted (with the library's
    /// wr_id and, when the policy says so, `IBV_SEND_SIGNALED`) or parked in the backlog; all WRs posted by one
    /// call go to the provider with one doorbell. The chain is restored exactly before the call returns.
    ///
    /// On failure, the WRs before `bad` were accepted and `bad` and the rest were not.
    pub fn post_send<'a>(&self, chain: SendChain<'a>) -> std::result::Result<(), PostError<'a>> {
        self.shared.post_send(chain)
    }

    /// Posts a chain of receives (the queue must manage receives: `rq_depth > 0`). Fails with `EAGAIN` at the
    /// first receive beyond the RQ's credits.
    pub fn post_recv<'a>(&self, chain: RecvChain<'a>) -> std::result::Result<(), RecvPostError<'a>> {
        self.shared.post_recv(chain)
    }

    /// Runs `action` once every send WR accepted so far is released (at once if that is already so).
    pub fn defer(&self, action: Deferred) {
        let target = self.shared.state.borrow().send.accepted();
        self.shared.state.borrow_mut().barriers.push(target, action);
        self.shared.run_releases();
    }

    /// Brings the queue to "everything released": stops taking WRs, covers an unsignaled tail with a marker so
    /// the CQ proves every posted WR done (or flushed, when the ULP moved the QP to the error state), and
    /// releases parked WRs as never posted once the posted ones are released. Returns `Ok` when everything is
    /// released; `EINPROGRESS` while completions are still to be polled (call again after polling).
    pub fn drain(&self) -> Result<()> {
        self.shared.drain()
    }

    /// `EBUSY` while WRs or receives are outstanding (not yet released).
    pub fn check_free(&self) -> Result<()> {
        self.shared.check_free()
    }

    pub fn stats(&self) -> QueueStats {
        self.shared.stats()
    }

    pub fn qp_num(&self) -> u32 {
        self.shared.qp_num()
    }

    /// Bytes this queue allocated: its fixed part, slot records and backlog storage.
    pub fn footprint(&self) -> usize {
        let st = self.shared.state.borrow();
        let slot = std::mem::size_of::<crate::discipline::Slot>();
        let mut n = std::mem::size_of::<QueueShared>() + st.send.ring_capacity() * slot;
        if st.send.backlog_capacity() > 0 {
            n += st.send.backlog_capacity() * StagedWr::new(self.shared.limits.max_send_sge, self.shared.limits.max_inline_data).footprint();
        }
        if let Some(r) = &st.recv {
            n += (r.depth() as usize).next_power_of_two() * slot;
        }
        n
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        let s = &self.shared;
        s.send_cq.detach(s.send_index, s.qp.qp_num(), s.send_need);
        if let Some(r) = &s.recv_cq {
            if !Rc::ptr_eq(r, &s.send_cq) {
                r.detach(s.recv_index, s.qp.qp_num(), s.recv_need);
            }
        }
    }
}

fn closed_error(c: Closed) -> Error {
    match c {
        Closed::Failed(status) => Error::new(
            libc::EIO,
            format!("the queue has failed (a completion reported ibv_wc_status {status}); it takes no more WRs"),
        ),
        Closed::Draining => Error::new(libc::EIO, "the queue is draining; it takes no more WRs"),
    }
}

/// Restores the WRs of a posted run: the ULP's wr_ids and flags, and the link cut after the run.
fn restore_run(first: WrPtr<'_>, n: usize, ulp: &[(u64, u32)], cut: Option<WrPtr<'_>>) {
    let mut w = first;
    for (i, &(wr_id, flags)) in ulp.iter().enumerate().take(n) {
        w.set_wr_id(wr_id);
        w.set_send_flags(flags);
        if i + 1 == n {
            w.set_next(cut);
        } else {
            w = w.next().expect("run is linked");
        }
    }
}

impl QueueShared {
    pub(crate) fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }
    pub(crate) fn send_cq(&self) -> &Rc<CqShared> {
        &self.send_cq
    }
    pub(crate) fn recv_cq(&self) -> Option<&Rc<CqShared>> {
        self.recv_cq.as_ref()
    }

    fn post_send<'a>(&self, chain: SendChain<'a>) -> std::result::Result<(), PostError<'a>> {
        let Some(first) = chain.first() else { return Ok(()) };
        let mut st = self.state.borrow_mut();
        let st = &mut *st;
        if let Some(c) = st.send.closed() {
            return Err(PostError { error: closed_error(c), bad: first });
        }
        // The run of WRs to post with one doorbell, and what to restore in them afterwards. Runs longer than
        // the stash are posted in pieces.
        const STASH: usize = 64;
        let mut stash = [(0u64, 0u32); STASH];
        let mut run_first: Option<WrPtr<'a>> = None;
        let mut run_len = 0usize;
        let mut cur = Some(first);
        let mut result = Ok(());
        while let Some(w) = cur {
            let next = w.next();
            let shape = w.shape();
            let checked = check_shape(&shape, &self.limits).and_then(|op| {
                if shape.send_flags & SEND_INLINE != 0 {
                    check_inline(w.total_len(), &self.limits)?;
                }
                Ok(op)
            });
            let op = match checked {
                Ok(op) => op,
                Err(e) => {
                    result = Err(PostError { error: e, bad: w });
                    break;
                }
            };
            let ulp_signaled = shape.send_flags & SEND_SIGNALED != 0;
            if run_len == STASH {
                if let Err(e) = self.flush_run(st, run_first.take().expect("a full run"), run_len, &stash, Some(w)) {
                    result = Err(e);
                    break;
                }
                run_len = 0;
            }
            match st.send.admit(w.wr_id(), op, ulp_signaled) {
                Admit::Post { seq, signaled } => {
                    stash[run_len] = (w.wr_id(), shape.send_flags);
                    run_len += 1;
                    run_first.get_or_insert(w);
                    w.set_wr_id(Token::new(self.send_index, Direction::Send, seq).0);
                    if signaled && !ulp_signaled {
                        w.set_send_flags(shape.send_flags | SEND_SIGNALED);
                    }
                }
                Admit::Park => {
                    if let Some(f) = run_first.take() {
                        if let Err(e) = self.flush_run(st, f, run_len, &stash, Some(w)) {
                            result = Err(e);
                            run_len = 0;
                            break;
                        }
                        run_len = 0;
                    }
                    st.send.backlog_vacant().stage_from(w, op);
                    st.send.commit_park();
                }
                Admit::Full => {
                    result = Err(PostError {
                        error: Error::new(
                            libc::EAGAIN,
                            format!(
                                "no SQ credit (sq_depth {}) and the backlog is full (backlog_depth {})",
                                st.send.depth(),
                                st.send.backlog_capacity()
                            ),
                        ),
                        bad: w,
                    });
                    break;
                }
            }
            cur = next;
        }
        if let Some(f) = run_first.take() {
            if run_len > 0 {
                // The run ends before `cur` (the WR that stopped the loop, or the end of the chain).
                let cut = match &result {
                    Err(e) => Some(e.bad),
                    Ok(()) => None,
                };
                if let Err(e) = self.flush_run(st, f, run_len, &stash, cut) {
                    result = Err(e);
                }
            }
        }
        if st.send.has_unsignaled_tail() {
            st.posted_since_poll = true;
            if !st.watched {
                st.watched = true;
                self.send_cq.watch(self.send_index);
            }
        }
        result
    }

    /// Posts `n` WRs starting at `first` (the run), whose successor in the ULP's chain is `cut`.
    fn flush_run<'a>(
        &self,
        st: &mut QueueState,
        first: WrPtr<'a>,
        n: usize,
        ulp: &[(u64, u32)],
        cut: Option<WrPtr<'a>>,
    ) -> std::result::Result<(), PostError<'a>> {
        let mut last = first;
        for _ in 1..n {
            last = last.next().expect("run is linked");
        }
        last.set_next(None);
        let r = self.qp.post_chain(first);
        st.doorbells += 1;
        restore_run(first, n, ulp, cut);
        match r {
            Ok(()) => Ok(()),
            Err(f) => {
                st.send.rollback((n - f.posted) as u64, true);
                let mut bad = first;
                for _ in 0..f.posted {
                    bad = bad.next().expect("run is linked");
                }
                Err(PostError {
                    error: Error::new(f.errno, format!("the provider's post_send failed (errno {})", f.errno)),
                    bad,
                })
            }
        }
    }

    fn post_recv<'a>(&self, chain: RecvChain<'a>) -> std::result::Result<(), RecvPostError<'a>> {
        let Some(first) = chain.first() else { return Ok(()) };
        let mut st = self.state.borrow_mut();
        let Some(recv) = st.recv.as_mut() else {
            return Err(RecvPostError {
                error: Error::invalid("this queue does not manage receives (rq_depth 0)"),
                bad: first,
            });
        };
        let mut ulp: Vec<u64> = Vec::new();
        let mut cur = Some(first);
        let mut last: Option<RecvWrPtr<'a>> = None;
        let mut stop: Option<RecvPostError<'a>> = None;
        while let Some(w) = cur {
            let (num_sge, list_null) = w.num_sge();
            if num_sge < 0 || (num_sge > 0 && list_null) {
                stop = Some(RecvPostError { error: Error::invalid(format!("receive WR has num_sge {num_sge} and a NULL or bad sg_list")), bad: w });
                break;
            }
            let Some(seq) = recv.admit(w.wr_id()) else {
                stop = Some(RecvPostError {
                    error: Error::new(libc::EAGAIN, format!("no receive credit (rq_depth {})", recv.depth())),
                    bad: w,
                });
                break;
            };
            ulp.push(w.wr_id());
            w.set_wr_id(Token::new(self.recv_index, Direction::Recv, seq).0);
            last = Some(w);
            cur = w.next();
        }
        let Some(last) = last else { return Err(stop.expect("nothing admitted means a stop")) };
        let cut = last.next();
        last.set_next(None);
        let r = self.qp.post_recv_chain(first);
        last.set_next(cut);
        let mut w = first;
        for (i, id) in ulp.iter().enumerate() {
            w.set_wr_id(*id);
            if i + 1 < ulp.len() {
                w = w.next().expect("run is linked");
            }
        }
        match r {
            Ok(()) => stop.map_or(Ok(()), Err),
            Err(f) => {
                recv.rollback((ulp.len() - f.posted) as u64);
                let mut bad = first;
                for _ in 0..f.posted {
                    bad = bad.next().expect("run is linked");
                }
                Err(RecvPostError { error: Error::new(f.errno, format!("the provider's post_recv failed (errno {})", f.errno)), bad })
            }
        }
    }

    /// Processes one CQE of this queue, then hands out every release it made due.
    pub(crate) fn on_cqe(&self, token: Token, status: u8, vendor_err: u32, wc_opcode: u8) -> CqeFate {
        let fate = {
            let mut st = self.state.borrow_mut();
            match token.direction() {
                Direction::Send => match st.send.on_cqe(token, status, vendor_err) {
                    CqeOutcome::Visible { wr_id } => CqeFate::Visible(wr_id),
                    CqeOutcome::Hidden => CqeFate::Hidden,
                    CqeOutcome::Stray => return CqeFate::Stray,
                },
                Direction::Recv => match st.recv.as_mut().and_then(|r| r.on_cqe(token, status, vendor_err, wc_opcode)) {
                    Some(wr_id) => CqeFate::Visible(wr_id),
                    None => return CqeFate::Stray,
                },
            }
        };
        self.run_releases();
        fate
    }

    /// Hands out due releases and deferred actions in order, then posts parked WRs that now have credits. A
    /// call from inside a callback returns at once: the outer loop picks up what the callback made due.
    pub(crate) fn run_releases(&self) {
        if self.releasing.replace(true) {
            return;
        }
        let _guard = ClearOnDrop(&self.releasing);
        loop {
            enum Item {
                Release(Completion),
                Deferred(Deferred),
            }
            let item = {
                let mut st = self.state.borrow_mut();
                let released = st.send.released();
                if let Some(d) = st.barriers.pop_ready(released) {
                    Some(Item::Deferred(d))
                } else if let Some(r) = st.send.next_release() {
                    Some(Item::Release(Completion::from((r, false))))
                } else {
                    st.recv.as_mut().and_then(|r| r.next_release()).map(|r| Item::Release(Completion::from((r, true))))
                }
            };
            match item {
                Some(Item::Release(c)) => match &self.release {
                    Some(ReleaseHandler::Closure(f)) => f(&c),
                    Some(ReleaseHandler::Foreign(f)) => f.call(&c),
                    None => {}
                },
                Some(Item::Deferred(d)) => d.run(),
                None => {
                    let pumped = {
                        let mut st = self.state.borrow_mut();
                        let r = pump_backlog(&mut st.send, &self.qp, self.send_index);
                        if !matches!(r, Ok(0)) {
                            st.doorbells += 1;
                        }
                        if st.send.has_unsignaled_tail() && !st.watched {
                            st.watched = true;
                            st.posted_since_poll = true;
                            self.send_cq.watch(self.send_index);
                        }
                        r
                    };
                    // Parked WRs released as never posted become due only when the ring is empty; anything
                    // else due now was produced by the pump (nothing) or by callbacks (picked up above).
                    let more = {
                        let st = self.state.borrow();
                        st.send.closed().is_some() && st.send.backlog_len() > 0 && st.send.in_provider() == 0
                    };
                    if !more || pumped.is_err() {
                        break;
                    }
                }
            }
        }
    }

    /// Called at the end of a poll of the send CQ while this queue is watched.
    pub(crate) fn check_idle_tail(&self) -> IdleCheck {
        let mut st = self.state.borrow_mut();
        if st.posted_since_poll {
            st.posted_since_poll = false;
            return IdleCheck::KeepWatching;
        }
        st.watched = false;
        IdleCheck::Covered(self.post_marker(&mut st))
    }

    fn post_marker(&self, st: &mut QueueState) -> bool {
        let Some(seq) = st.send.admit_marker() else { return false };
        st.doorbells += 1;
        match self.qp.post_marker(Token::new(self.send_index, Direction::Send, seq).0) {
            Ok(()) => true,
            Err(_) => {
                st.send.rollback(1, false);
                false
            }
        }
    }

    fn drain(&self) -> Result<()> {
        {
            let mut st = self.state.borrow_mut();
            st.send.start_drain();
            if st.send.has_unsignaled_tail() && st.send.closed() == Some(Closed::Draining) {
                let Some(seq) = st.send.admit_marker() else {
                    return Err(Error::new(libc::EIO, "no SQ slot for the drain marker"));
                };
                st.doorbells += 1;
                if let Err(errno) = self.qp.post_marker(Token::new(self.send_index, Direction::Send, seq).0) {
                    st.send.rollback(1, false);
                    return Err(Error::new(libc::EIO, format!("posting the drain marker failed (errno {errno})")));
                }
            }
        }
        self.run_releases();
        let st = self.state.borrow();
        let sends = st.send.accepted() - st.send.released();
        let recvs = st.recv.as_ref().map_or(0, |r| r.outstanding());
        if sends == 0 && recvs == 0 && st.send.in_provider() == 0 {
            Ok(())
        } else {
            Err(Error::new(
                libc::EINPROGRESS,
                format!("drain in progress: {sends} send WR(s) and {recvs} receive(s) not yet released; poll the CQ and call again"),
            ))
        }
    }

    fn check_free(&self) -> Result<()> {
        if self.releasing.get() {
            return Err(Error::new(
                libc::EBUSY,
                "the queue is running one of its own callbacks; free it after that returns",
            ));
        }
        let st = self.state.borrow();
        let sends = st.send.accepted() - st.send.released();
        let recvs = st.recv.as_ref().map_or(0, |r| r.outstanding());
        if sends > 0 || recvs > 0 || st.send.in_provider() > 0 {
            return Err(Error::new(
                libc::EBUSY,
                format!("the queue has {sends} send WR(s) and {recvs} receive(s) not yet released; poll (or drain) first"),
            ));
        }
        Ok(())
    }

    fn stats(&self) -> QueueStats {
        let st = self.state.borrow();
        let c = &st.send.counters;
        let recv = st.recv.as_ref();
        QueueStats {
            accepted: st.send.accepted(),
            released: st.send.released(),
            wqes: c.wqes,
            doorbells: st.doorbells,
            signaled_by_ulp: c.signaled_by_ulp,
            signaled_by_policy: c.signaled_by_policy,
            markers: c.markers,
            send_cqes: c.cqes,
            parked: c.parked,
            refused: c.refused,
            backlog_peak: c.backlog_peak,
            recv_posted: recv.map_or(0, |r| r.posted),
            recv_cqes: recv.map_or(0, |r| r.cqes),
            stray_cqes: c.stray_cqes + recv.map_or(0, |r| r.stray_cqes),
            in_provider: st.send.in_provider() as u32,
            credits: st.send.credits(),
            backlog: st.send.backlog_len() as u32,
            recv_outstanding: recv.map_or(0, |r| r.outstanding() as u32),
            deferred: st.barriers.len() as u32,
            signal_interval: st.send.signal_interval(),
            failed_status: match st.send.closed() {
                Some(Closed::Failed(s)) => s as u32,
                _ => 0,
            },
            closed: st.send.closed().is_some() as u32,
        }
    }
}

struct ClearOnDrop<'a>(&'a Cell<bool>);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}
