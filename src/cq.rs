//! A managed CQ: shared by any number of queues, polled by the ULP through [`Cq::poll`].

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::Arc;

use crate::alloc;
use crate::attach::{AttachedQueue, AttachedSrq, CqeFate, IdleCheck};
use crate::discipline::budget::CqBudget;
use crate::discipline::late::RetiredQueue;
use crate::discipline::token::{Direction, Token, MAX_INDEX};
use crate::error::{Error, Result};
use crate::discipline::srq::SRQ_TOKEN_BASE;
use crate::verbs::{ibv_wc, BacklogPool, CqHandle};
pub use crate::verbs::BacklogPoolStats;

/// Counters of a managed CQ (`struct sqd_cq_stats` in C).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CqStats {
    /// CQEs the provider granted: `cq->cqe` at `sqd_cq_new`, re-read by `sqd_cq_update_capacity`.
    pub capacity: u64,
    /// CQEs reserved by the attached queues' worst cases.
    pub reserved: u64,
    /// Queues attached (a queue whose sends and receives both complete here counts once).
    pub queues: u32,
    pub _reserved0: u32,
    /// Calls to `sqd_cq_poll`.
    pub polls: u64,
    /// CQEs reaped from the provider.
    pub cqes: u64,
    /// Work completions handed to the ULP.
    pub visible: u64,
    /// CQEs the library added (moderation, markers) and did not show.
    pub hidden: u64,
    /// CQEs of QPs not managed on this CQ, returned unchanged.
    pub passthrough: u64,
    /// CQEs of a managed QP that match no outstanding WR: dropped and counted. A provider or ULP bug, or a
    /// completion that arrived for a queue freed after an asynchronous event released its WRs.
    pub stray: u64,
    /// Idle-tail markers posted by `sqd_cq_poll`.
    pub tail_markers: u64,
}

/// `sqd_cq_out_of_order.flags`: `wr_id` is the WR's own, as the ULP gave it (its index on a queue with
/// `SQD_QUEUE_INDEXED`); without it, the WQE was the library's own (a marker or a LocalInv) or is no longer
/// known, and `wr_id` is the value the completion carried.
pub const SQD_OUT_OF_ORDER_ULP_WR: u32 = 1;
/// `sqd_cq_out_of_order.flags`: `sqd_cq_poll` showed the completion, with the WR's own wr_id.
pub const SQD_OUT_OF_ORDER_SHOWN: u32 = 2;

/// Completions that came out of RC order (`struct sqd_cq_out_of_order` in C): each names a send WQE that the
/// completion of a later WQE of its QP had already retired, which no RC QP may do. `count` and `shown` count
/// them all; the other fields describe the first one.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutOfOrder {
    /// Such completions so far (0: none, and the other fields are 0).
    pub count: u64,
    /// Of those, the ones `sqd_cq_poll` showed: completions of WRs the ULP signaled, each shown once.
    pub shown: u64,
    /// The first one's WQE: its position among the WQEs its queue posted (0 for the first; the library's own
    /// markers and LocalInvs count too).
    pub wqe: u64,
    /// The first one's wr_id: the WR's own with `SQD_OUT_OF_ORDER_ULP_WR`, else the value the completion
    /// carried (the library's token).
    pub wr_id: u64,
    /// The first one's QP number.
    pub qp_num: u32,
    /// The first one's `enum ibv_wc_opcode`, as the completion carried it.
    pub opcode: u32,
    /// The first one's `enum ibv_wc_status`.
    pub status: u32,
    /// The first one's vendor error (0 for a success).
    pub vendor_err: u32,
    /// `SQD_OUT_OF_ORDER_*` bits, of the first one.
    pub flags: u32,
    pub _reserved0: u32,
}

impl OutOfOrder {
    /// Adds `one`, a single completion: the first one is kept whole, later ones only counted.
    pub(crate) fn add(&mut self, one: &OutOfOrder) {
        if self.count == 0 {
            *self = *one;
        } else {
            self.count += one.count;
            self.shown += one.shown;
        }
    }

    /// What the first one was and what the library did with it, or `None` before any.
    pub fn describe(&self) -> Option<String> {
        if self.count == 0 {
            return None;
        }
        let wr = if self.flags & SQD_OUT_OF_ORDER_ULP_WR != 0 {
            format!("wr_id {:#x}", self.wr_id)
        } else {
            format!("a WQE of the library's own or no longer known, wr_id {:#x} as carried", self.wr_id)
        };
        let fate = if self.flags & SQD_OUT_OF_ORDER_SHOWN != 0 {
            "sqd_cq_poll showed it with the WR's wr_id, since the ULP signaled that WR"
        } else {
            "it was not shown (the ULP did not signal that WR, or its completion was shown already)"
        };
        Some(format!(
            "QP {:#x}: a completion (opcode {}, status {}) arrived for WQE {} ({wr}) after the completion of a later \
             WQE had retired it: the provider completes out of RC order. That WR was released when the later \
             completion came, as RC order implies, so its buffers may have been reused while the HCA still used \
             them; {fate}",
            self.qp_num, self.opcode, self.status, self.wqe
        ))
    }
}

pub(crate) struct CqShared {
    pub(crate) handle: CqHandle,
    state: RefCell<CqState>,
    /// The counters the data path bumps, kept out of `state` so that bumping one takes no borrow.
    counts: Counts,
    /// `POLLING` while a poll reaps (a poll from a callback is refused), and `LOCKED` for a CQ with a `lock`:
    /// the C API's common poll tests both with one load (`is_open`).
    gate: Cell<u8>,
    /// `arm` armed the CQ and no poll has run since: the ULP may be asleep on the channel, so no poll may come
    /// to cover an unsignaled tail. A post that leaves one covers it at once instead (`QueueShared::post_send`).
    armed: Cell<bool>,
    /// Set in thread-safe mode: the C layer holds it around every call on the CQ and its queues.
    pub(crate) lock: Option<Arc<CqLock>>,
    /// Poll cycles: bumped at the end of every idle-tail pass (so by every idle poll: `Counts::idle_polls`). A
    /// queue remembers the cycle in which it last left an unsignaled tail (`QueueShared::tail_left`), so that the
    /// pass needs no per-queue flag reset.
    cycle: Cell<u64>,
    /// Entries in `CqState::watch` (kept here so that the end of a poll reads it without a borrow).
    watching: Cell<u32>,
    /// Watched queues that left a tail in this cycle, each counted once (at most `watching`; 0 when unsure, which
    /// only costs a pass). When it equals `watching` no watched queue can be idle: the pass is skipped.
    posted: Cell<u32>,
    /// Where the queues whose sends complete here park WRs. Borrowed by a queue with its own state borrowed
    /// (queue -> pool), never the other way, and never across a callback or a call into another object.
    pub(crate) pool: RefCell<BacklogPool>,
    /// Completions of its queues that came out of RC order (`Cq::out_of_order`).
    out_of_order: Cell<OutOfOrder>,
}

/// `IBV_EVENT_CQ_ERR`, the one `enum ibv_event_type` value of a CQ (`Cq::on_async_event`).
const EV_CQ_ERR: u32 = 0;

/// The lock of a thread-safe CQ: reentrant, so that callbacks may call the API again on the same CQ.
pub type CqLock = parking_lot::ReentrantMutex<()>;

struct CqState {
    budget: CqBudget,
    /// Weak: each queue owns its CQs (`QueueShared::send_cq`, `recv_cq`) and leaves its entry when dropped.
    table: Vec<Option<Entry>>,
    free: Vec<u32>,
    by_qp: HashMap<u32, u32>,
    /// Queues that may have an unsignaled tail to cover at the end of a poll.
    watch: Vec<u32>,
    /// SRQs whose queues complete receives here: (id, SRQ, queues), the SRQ's depth reserved once.
    srqs: Vec<(u32, Rc<dyn AttachedSrq>, u32)>,
    /// Freed queues whose WRs may still complete here (after an async event released them, or a Rust owner
    /// dropped the queue early), by QP number: their completions carry the library's wr_ids and are dropped
    /// rather than passed through. An entry goes when its last possible completion arrives, or when a new queue
    /// here takes its QP number (a device reuses a number only once the old QP is destroyed, and destroying a
    /// QP removes its completions from the CQ). So each entry stands for at least one WQE or receive that may
    /// still complete: the memory is bounded by what can still arrive.
    retired: HashMap<u32, RetiredQueue>,
    /// `capacity` and `tail_markers` (the data path's counters are in `CqShared::counts`).
    stats: CqStats,
}

/// A queue in the CQ's table, with what the demux of a CQE checks copied from it when it was installed (a
/// queue's QP number and CQs never change), so that a CQE costs no call into the queue before `on_cqe`.
struct Entry {
    queue: Weak<dyn AttachedQueue<CqShared>>,
    qp_num: u32,
    /// The queue's sends complete on this CQ.
    sends_here: bool,
    /// The queue's receives complete on this CQ.
    recvs_here: bool,
}

/// `CqStats` counters bumped on every poll or CQE.
#[derive(Default)]
struct Counts {
    /// Every other poll: its first provider call found CQEs or failed, or it had no room (`polls()` adds the
    /// idle polls).
    busy_polls: Cell<u64>,
    /// The poll cycles (`CqShared::cycle`) not ended by an idle poll, one whose first provider call found the CQ
    /// empty: every idle poll ends a cycle and bumps no counter of its own, so that the idle polls are the
    /// cycles less these (`idle_polls`).
    other_cycles: Cell<u64>,
    cqes: Cell<u64>,
    visible: Cell<u64>,
    hidden: Cell<u64>,
    passthrough: Cell<u64>,
    stray: Cell<u64>,
    /// Polls that found CQEs and ended before filling the caller's array (`empty_polls()` adds `idle_polls`).
    short_polls: Cell<u64>,
}

impl Counts {
    /// Polls whose first provider call found the CQ empty, with `cycle` the CQ's poll cycle.
    fn idle_polls(&self, cycle: u64) -> u64 {
        cycle - self.other_cycles.get()
    }
    fn polls(&self, cycle: u64) -> u64 {
        self.busy_polls.get() + self.idle_polls(cycle)
    }
    /// Polls that found the CQ empty (ended before filling the caller's array).
    fn empty_polls(&self, cycle: u64) -> u64 {
        self.idle_polls(cycle) + self.short_polls.get()
    }
}

#[inline]
fn bump(c: &Cell<u64>, n: u64) {
    c.set(c.get() + n);
}

/// An `ibv_cq` under management ([`Cq::new`], [`Cq::with_lock`]).
///
/// Threads: a `Cq` and the queues on it are single-threaded (`!Send`). [`Cq::with_lock`] only attaches a
/// lock for a caller that serialises access itself (the C API's `SQD_CQ_THREAD_SAFE` mode); the Rust API
/// never takes it.
pub struct Cq {
    pub(crate) shared: Rc<CqShared>,
}

/// In Rust a `Cq` is neither `Send` nor `Sync`: the thread-safe mode is the C API's, which takes the CQ's lock
/// around every call.
impl Cq {
    /// Takes a CQ under management. Its capacity is the `cqe` the provider granted.
    pub fn new(handle: CqHandle) -> Cq {
        Cq::with_lock(handle, false)
    }

    /// Like [`Cq::new`]; with `thread_safe` the CQ carries a lock ([`Cq::lock`]) that the C layer takes around
    /// every call on the CQ and on its queues, so that any thread may post while one polls.
    pub fn with_lock(handle: CqHandle, thread_safe: bool) -> Cq {
        let capacity = handle.capacity() as u64;
        Cq {
            shared: Rc::new(CqShared {
                handle,
                state: RefCell::new(CqState {
                    budget: CqBudget::new(capacity),
                    table: Vec::new(),
                    free: Vec::new(),
                    by_qp: HashMap::new(),
                    watch: Vec::new(),
                    srqs: Vec::new(),
                    retired: HashMap::new(),
                    stats: CqStats { capacity, ..CqStats::default() },
                }),
                counts: Counts::default(),
                gate: Cell::new(if thread_safe { LOCKED } else { 0 }),
                armed: Cell::new(false),
                cycle: Cell::new(0),
                watching: Cell::new(0),
                posted: Cell::new(0),
                lock: thread_safe.then(|| Arc::new(CqLock::new(()))),
                pool: RefCell::new(BacklogPool::default()),
                out_of_order: Cell::new(OutOfOrder::default()),
            }),
        }
    }

    /// The completions of this CQ's queues that came out of RC order: how many, and the first one.
    pub fn out_of_order(&self) -> OutOfOrder {
        self.shared.out_of_order.get()
    }

    /// What the first completion out of RC order was and what the library did with it (`None` before any).
    pub fn out_of_order_message(&self) -> Option<String> {
        self.shared.out_of_order.get().describe()
    }

    /// The lock of a thread-safe CQ (`None` in the default single-threaded mode).
    pub fn lock(&self) -> Option<&Arc<CqLock>> {
        self.shared.lock.as_ref()
    }

    /// Limits the WRs that the queues whose sends complete on this CQ may park at once, all together, to
    /// `max_parked` (0: no limit beyond each queue's `backlog_depth`, the default). The CQ's backlog pool then
    /// holds storage for at most that many WRs of each shape (`max_send_sge`, `max_inline_data`) of its queues,
    /// instead of the sum of their `backlog_depth`; a WR that finds the limit reached is refused with `EAGAIN`.
    /// Storage for a higher limit is allocated now (`ENOMEM`: the old limit stays); storage is kept when the
    /// limit is lowered. Lowering it below the WRs parked now refuses new ones until enough are released.
    pub fn set_backlog_limit(&self, max_parked: u32) -> Result<()> {
        self.shared.pool.borrow_mut().set_limit(max_parked)
    }

    /// The state of the CQ's backlog pool.
    pub fn backlog_pool_stats(&self) -> BacklogPoolStats {
        self.shared.pool.borrow().stats()
    }

    /// Queues attached to this CQ.
    pub fn queue_count(&self) -> u32 {
        self.shared.state.borrow().budget.queues()
    }

    pub fn stats(&self) -> CqStats {
        let st = self.shared.state.borrow();
        let n = &self.shared.counts;
        CqStats {
            reserved: st.budget.reserved(),
            queues: st.budget.queues(),
            polls: n.polls(self.shared.cycle.get()),
            cqes: n.cqes.get(),
            visible: n.visible.get(),
            hidden: n.hidden.get(),
            passthrough: n.passthrough.get(),
            stray: n.stray.get(),
            ..st.stats
        }
    }

    /// Re-reads the capacity the provider reports (`cq->cqe`) after the CQ was resized with `ibv_resize_cq`, so
    /// that queues attached from now on are checked against it. Fails with `ENOSPC` (the new capacity is still
    /// in force) when it is below what the attached queues reserve: a flush of them all could overrun the CQ.
    pub fn update_capacity(&self) -> Result<u64> {
        let capacity = self.shared.handle.current_cqe() as u64;
        let mut st = self.shared.state.borrow_mut();
        st.budget.set_capacity(capacity);
        st.stats.capacity = capacity;
        let reserved = st.budget.reserved();
        if reserved > capacity {
            return Err(Error::new(
                libc::ENOSPC,
                format!("the CQ now holds {capacity} CQEs but its {} queue(s) reserve {reserved}", st.budget.queues()),
            ));
        }
        Ok(capacity)
    }

    /// Fails with `EBUSY` while queues are attached.
    pub fn check_free(&self) -> Result<()> {
        if self.shared.is_polling() {
            return Err(Error::new(libc::EBUSY, "the CQ is being polled (called from one of its callbacks)"));
        }
        let n = self.queue_count();
        if n > 0 {
            return Err(Error::new(libc::EBUSY, format!("the CQ still has {n} queue(s) attached; free them first")));
        }
        Ok(())
    }

    /// Tells the CQ about an asynchronous event (an `enum ibv_event_type` value). `IBV_EVENT_CQ_ERR`: the CQ
    /// delivers no more CQEs, so every queue attached to it (by its sends or its receives) fails and releases
    /// everything at once, as for `Queue::on_async_event` with `IBV_EVENT_QP_FATAL`. Other events: `EINVAL`.
    pub fn on_async_event(&self, event: u32) -> Result<()> {
        if event != EV_CQ_ERR {
            return Err(Error::invalid(format!("event {event} is not an event of a CQ (IBV_EVENT_CQ_ERR is 0)")));
        }
        // One queue at a time, by table index, so that no list of them is allocated. A release callback may free
        // queues or attach new ones meanwhile: one attached into an entry not visited yet is released too (this
        // CQ will deliver no CQE to it either).
        let entries = self.shared.state.borrow().table.len();
        for i in 0..entries {
            let q = self.shared.state.borrow().table.get(i).and_then(|e| e.as_ref()?.queue.upgrade());
            if let Some(q) = q {
                q.abandon();
            }
        }
        Ok(())
    }

    /// Arms the CQ for its completion channel (`ibv_req_notify_cq`), then polls it once more, so a completion
    /// that arrived between the caller's last empty poll and the arming is not missed (the classic race).
    /// Returns the completions that poll found, like [`Cq::poll`]: 0 means armed and empty, safe to sleep on
    /// the channel; more means handle them and poll again before sleeping.
    ///
    /// Because the caller is about to sleep, there is no next poll to cover an unsignaled tail (WRs this very
    /// poll moved from a backlog, or posted just before): every such tail gets its marker now, whose CQE then
    /// raises the event. For the same reason, until the next poll of this CQ, a post to a queue whose sends
    /// complete here that leaves an unsignaled tail covers it with a marker at once (one more WQE and CQE per
    /// such post), so a post made while the poller sleeps (from another thread, or by the poller itself before
    /// it sleeps) still produces a CQE.
    pub fn arm(&self, solicited_only: bool, out: &mut [ibv_wc]) -> Result<usize> {
        self.shared.handle.req_notify(solicited_only)?;
        let n = self.shared.poll(out)?;
        if n == 0 {
            bump(&self.shared.counts.other_cycles, 1);
            self.shared.cover_idle_tails(true);
        }
        self.shared.armed.set(true);
        Ok(n)
    }

    /// Reaps completions into `out` and returns how many are for the ULP: exactly the work completions raw verbs
    /// would have given it for the WRs it posted (receives, sends it asked to be signaled, every error and
    /// flush), with its own wr_ids (a send's index on an indexed queue, `QueueConfig::indexed`). Runs release
    /// callbacks and deferred actions of the queues on this CQ, posts parked WRs as credits return, and covers
    /// idle unsignaled tails. Reaps at most the CQ's capacity of CQEs beyond `out.len()` (every CQE present when
    /// it began among them), so callbacks that keep posting cannot hold it forever.
    #[inline]
    pub fn poll(&self, out: &mut [ibv_wc]) -> Result<usize> {
        self.shared.poll(out)
    }

    /// `poll` for a caller that made the first provider call itself: the provider's poll op put `found` CQEs in
    /// the first entries of `out`, and this processes them exactly as `poll` would have after its own first call
    /// (and polls again while the CQ fills `out`). With [`Cq::has_watched_tails`] false and no CQE found, it only
    /// counts the poll: a caller that skips the call for such empty polls loses nothing but that count. For a
    /// layer that must see the provider's answer before it takes the lock that guards this CQ.
    /// In line in the caller's crate (the SPDK provider's poll), as the poll's common path is.
    #[inline]
    pub fn poll_found(&self, out: &mut [ibv_wc], found: usize) -> Result<usize> {
        self.shared.poll_found_by_caller(out, found.min(out.len()))
    }

    /// Whether a queue's idle unsignaled tail is watched on this CQ, so that an empty poll has work to do
    /// (covering it); when false, an empty poll of the provider is all `poll` would do.
    #[inline]
    pub fn has_watched_tails(&self) -> bool {
        self.shared.watching.get() != 0
    }
}

impl CqShared {
    /// Attaches a queue; returns its index in this CQ's table.
    pub(crate) fn attach(&self, qp_num: u32, need: u64, what: &str) -> Result<u32> {
        let mut st = self.state.borrow_mut();
        if st.by_qp.contains_key(&qp_num) {
            return Err(Error::new(libc::EBUSY, format!("QP {qp_num:#x} is already managed on this CQ")));
        }
        let index = match st.free.last() {
            Some(&i) => i,
            None if st.table.len() as u32 >= SRQ_TOKEN_BASE.min(MAX_INDEX) => {
                return Err(Error::new(libc::ENOSPC, "too many queues on one CQ"));
            }
            None => st.table.len() as u32,
        };
        // Room first, so that a failure changes nothing. A queue is watched at most once at a time, and a table
        // entry is freed at most once: with room for every table entry in `watch` and `free`, neither grows
        // (allocates) on the data path or when a queue is freed. Likewise `retired` has room for every queue
        // attached here to be freed with completions still to come.
        let entries = st.table.len() + usize::from(st.free.last() != Some(&index));
        let (watch_more, free_more) = (entries - st.watch.len(), entries - st.free.len());
        alloc::reserve(&mut st.table, 1, "the CQ's table of queues")?;
        alloc::reserve(&mut st.watch, watch_more, "the CQ's idle-tail watch list")?;
        alloc::reserve(&mut st.free, free_more, "the CQ's free list")?;
        let retire_more = st.by_qp.len() + 1;
        alloc::reserve_map(&mut st.retired, retire_more, "the CQ's map of freed queues' late completions")?;
        alloc::reserve_map(&mut st.by_qp, 1, "the CQ's map of QP numbers")?;
        st.budget.reserve(need, what)?;
        if st.free.last() == Some(&index) {
            st.free.pop();
        } else {
            st.table.push(None);
        }
        st.by_qp.insert(qp_num, index);
        st.retired.remove(&qp_num);
        Ok(index)
    }

    /// Registers an SRQ whose queue completes receives here; its depth is reserved on the first.
    pub(crate) fn attach_srq(&self, srq: &Rc<impl AttachedSrq + 'static>) -> Result<()> {
        let mut st = self.state.borrow_mut();
        if let Some(e) = st.srqs.iter_mut().find(|e| e.0 == srq.id()) {
            e.2 += 1;
            return Ok(());
        }
        let depth = srq.depth() as u64;
        alloc::reserve(&mut st.srqs, 1, "the CQ's list of SRQs")?;
        st.budget.reserve_extra(depth, &format!("SRQ depth {depth}, reserved once for all its queues here"))?;
        st.srqs.push((srq.id(), srq.clone(), 1));
        Ok(())
    }

    pub(crate) fn detach_srq(&self, id: u32) {
        let mut st = self.state.borrow_mut();
        let Some(i) = st.srqs.iter().position(|e| e.0 == id) else { return };
        st.srqs[i].2 -= 1;
        if st.srqs[i].2 == 0 {
            let (_, srq, _) = st.srqs.swap_remove(i);
            st.budget.release_extra(srq.depth() as u64);
        }
    }

    /// Armed by `Cq::arm`, and not polled since.
    #[inline]
    /// A queue met a completion out of RC order (`one`: that one alone).
    pub(crate) fn note_out_of_order(&self, one: &OutOfOrder) {
        let mut o = self.out_of_order.get();
        o.add(one);
        self.out_of_order.set(o);
    }

    pub(crate) fn is_armed(&self) -> bool {
        self.armed.get()
    }

    pub(crate) fn empty_polls(&self) -> u64 {
        self.counts.empty_polls(self.cycle.get())
    }

    /// Puts the queue object in its table slot (after the queue is built), weakly: the queue owns this CQ.
    pub(crate) fn install(&self, index: u32, q: &Rc<impl AttachedQueue<CqShared> + 'static>) {
        let entry = Entry {
            queue: Rc::downgrade(q) as Weak<dyn AttachedQueue<CqShared>>,
            qp_num: q.qp_num(),
            sends_here: std::ptr::eq(Rc::as_ptr(q.send_cq()), self),
            recvs_here: q.recv_cq().is_some_and(|c| std::ptr::eq(Rc::as_ptr(c), self)),
        };
        self.state.borrow_mut().table[index as usize] = Some(entry);
    }

    /// Detaches the queue at `index`. `late`: what of its WRs may still complete on this CQ (its token index
    /// here and its windows; empty windows for a queue that had nothing in flight).
    pub(crate) fn detach(&self, index: u32, qp_num: u32, need: u64, late: RetiredQueue) {
        let mut st = self.state.borrow_mut();
        if !late.is_done() {
            debug_assert_eq!(late.index, index);
            st.retired.insert(qp_num, late);
        }
        st.table[index as usize] = None;
        st.by_qp.remove(&qp_num);
        st.free.push(index);
        st.budget.release(need);
        st.watch.retain(|&i| i != index);
        self.watching.set(st.watch.len() as u32);
        // The queue may have been counted in `posted`: the next pass checks every queue.
        self.posted.set(0);
    }

    /// Asks the next poll to check this queue's tail.
    pub(crate) fn watch(&self, index: u32) {
        self.state.borrow_mut().watch.push(index);
        self.watching.set(self.watching.get() + 1);
    }

    /// The current poll cycle (see `cycle`).
    #[inline]
    pub(crate) fn cycle(&self) -> u64 {
        self.cycle.get()
    }

    /// A watched queue left a tail for the first time in this cycle.
    #[inline]
    pub(crate) fn note_posted(&self) {
        self.posted.set(self.posted.get() + 1);
    }

    /// The queue of QP `qp_num` at `token`'s index, and whether `token`'s direction completes on this CQ.
    fn lookup(&self, token: Token, qp_num: u32) -> Option<(Rc<dyn AttachedQueue<CqShared>>, bool)> {
        let st = self.state.borrow();
        let e = st.table.get(token.index() as usize)?.as_ref()?;
        if e.qp_num != qp_num {
            return None;
        }
        let here = match token.direction() {
            Direction::Send => e.sends_here,
            Direction::Recv => e.recvs_here,
        };
        Some((e.queue.upgrade()?, here))
    }

    #[inline]
    fn poll(&self, out: &mut [ibv_wc]) -> Result<usize> {
        self.poll_then(out, Ok, Err)
    }

    /// `poll`, handing its count to `done` or its error to `failed` and returning what they make of it, so that
    /// a caller that wants one value (the C API's count or negative errno) gets it from the common, empty poll
    /// without a `Result` in between.
    #[inline(always)]
    pub(crate) fn poll_then<R>(
        &self,
        out: &mut [ibv_wc],
        done: impl FnOnce(usize) -> R,
        failed: impl FnOnce(Error) -> R,
    ) -> R {
        if self.is_polling() {
            return reentered(failed);
        }
        self.poll_open(out, done, failed)
    }

    /// Neither being polled nor carrying a lock: `poll_open` may run.
    #[cfg_attr(not(feature = "capi"), allow(dead_code))]
    #[inline(always)]
    pub(crate) fn is_open(&self) -> bool {
        self.gate.get() == 0
    }

    /// A poll runs and reaps (a poll from one of its callbacks is refused).
    #[inline]
    fn is_polling(&self) -> bool {
        self.gate.get() & POLLING != 0
    }

    #[inline(always)]
    fn set_polling(&self, on: bool) {
        self.gate.set(self.gate.get() & !POLLING | if on { POLLING } else { 0 });
    }

    /// `poll_then` for a caller that knows the CQ is not being polled (`is_open`, or `is_polling` tested).
    #[inline(always)]
    pub(crate) fn poll_open<R>(
        &self,
        out: &mut [ibv_wc],
        done: impl FnOnce(usize) -> R,
        failed: impl FnOnce(Error) -> R,
    ) -> R {
        debug_assert!(!self.is_polling());
        self.armed.set(false);
        // The common poll finds the CQ empty: one provider call, no reaping. Everything else is `poll_found`.
        // Until CQEs are found no callback can run (the provider never calls back, and the idle-tail pass runs
        // none), so nothing can re-enter the poll: `POLLING` is set only around the reaping.
        if out.is_empty() {
            bump(&self.counts.busy_polls, 1);
            bump(&self.counts.other_cycles, 1);
            self.cover_idle_tails(false);
            return done(0);
        }
        let got = self.handle.poll_raw(out);
        if got == 0 {
            // An idle poll: counted by the cycle it ends (`Counts::idle_polls`).
            self.cover_idle_tails(false);
            return done(0);
        }
        if got < 0 {
            return failed(self.poll_failed(got));
        }
        self.set_polling(true);
        let _guard = PollingGuard(self);
        self.poll_found(out, (got as usize).min(out.len()), done, failed)
    }

    /// The provider's first call of a poll failed with `got` (< 0): the CQ is in error.
    #[cold]
    #[inline(never)]
    fn poll_failed(&self, got: i32) -> Error {
        bump(&self.counts.busy_polls, 1);
        crate::verbs::poll_failed(got)
    }

    /// `poll_then` with the provider's first call made by the caller (`Cq::poll_found`).
    #[inline]
    fn poll_found_by_caller(&self, out: &mut [ibv_wc], found: usize) -> Result<usize> {
        if self.is_polling() {
            return reentered(Err);
        }
        self.set_polling(true);
        let _guard = PollingGuard(self);
        self.armed.set(false);
        if found == 0 {
            if out.is_empty() {
                bump(&self.counts.busy_polls, 1);
                bump(&self.counts.other_cycles, 1);
            }
            self.cover_idle_tails(false);
            return Ok(0);
        }
        self.poll_found(out, found, Ok, Err)
    }

    /// The rest of `poll_then` once the provider's first call put `found` (> 0) CQEs in `out`.
    #[inline(never)]
    fn poll_found<R>(
        &self,
        out: &mut [ibv_wc],
        found: usize,
        done: impl FnOnce(usize) -> R,
        failed: impl FnOnce(Error) -> R,
    ) -> R {
        bump(&self.counts.busy_polls, 1);
        match self.reap_batches(out, found) {
            Ok(kept) => {
                bump(&self.counts.other_cycles, 1);
                self.cover_idle_tails(false);
                bump(&self.counts.visible, kept as u64);
                done(kept)
            }
            Err(e) => failed(e),
        }
    }

    /// The reaping loop of `poll`, after the provider's first call put `first` CQEs in `out`: processes them,
    /// then polls again while the CQ fills the caller's room. Returns how many entries of `out` are kept.
    #[inline(always)]
    fn reap_batches(&self, out: &mut [ibv_wc], first: usize) -> Result<usize> {
        // The common poll: the provider left room in `out`, so the CQ is empty now and one pass is all.
        if first < out.len() {
            bump(&self.counts.short_polls, 1);
            return Ok(self.reap_pass(out, 0, first));
        }
        let mut kept = self.reap_pass(out, 0, first);
        // The CQ filled the array: poll again while it fills the room left. Callbacks that post may refill the CQ
        // as fast as it is reaped, and hidden CQEs fill no room in `out`, so without a limit one call could run
        // forever. The limit is a full CQ beyond `out`: every CQE present when the call began is reaped first (a
        // CQ completes in order and holds at most its capacity), so a 0 from `arm` still means nothing was missed.
        let limit = self.state.borrow().budget.capacity() as usize + out.len();
        let mut reaped = first;
        while kept < out.len() && reaped < limit {
            let room = out.len() - kept;
            let n = self.handle.poll(&mut out[kept..])?;
            reaped += n;
            kept = self.reap_pass(out, kept, n);
            if n < room {
                bump(&self.counts.short_polls, 1);
                break;
            }
        }
        Ok(kept)
    }

    /// Processes the `n` CQEs the provider put in `out` from `kept` on, keeping the ones the ULP sees (with its
    /// wr_id) in order from `kept`. Returns the new count of kept entries.
    #[inline(always)]
    fn reap_pass(&self, out: &mut [ibv_wc], kept: usize, n: usize) -> usize {
        let mut w = kept;
        for i in kept..kept + n {
            match self.reap(&out[i]) {
                CqeFate::Visible(wr_id) => {
                    if w != i {
                        out.swap(w, i);
                    }
                    out[w].wr_id = wr_id;
                    w += 1;
                }
                CqeFate::Passthrough => {
                    if w != i {
                        out.swap(w, i);
                    }
                    w += 1;
                }
                CqeFate::Hidden | CqeFate::Stray => {}
            }
        }
        w
    }

    /// Maps one CQE to its queue and processes it (releases, callbacks, backlog).
    #[inline(always)]
    fn reap(&self, wc: &ibv_wc) -> CqeFate {
        let token = Token(wc.wr_id);
        if token.index() >= SRQ_TOKEN_BASE && token.direction() == Direction::Recv {
            if let Some(fate) = self.reap_srq(token, wc) {
                return fate;
            }
        }
        let fate = match self.lookup(token, wc.qp_num) {
            Some((q, true)) => {
                q.on_cqe(token, wc.status as u8, crate::verbs::wc_vendor_err(wc), wc.opcode as u8, crate::verbs::wc_invalidated_rkey(wc))
            }
            Some((_, false)) => CqeFate::Stray,
            None => self.reap_unattached(token, wc.qp_num),
        };
        let n = &self.counts;
        bump(&n.cqes, 1);
        match fate {
            CqeFate::Hidden => bump(&n.hidden, 1),
            CqeFate::Stray => bump(&n.stray, 1),
            CqeFate::Passthrough => bump(&n.passthrough, 1),
            CqeFate::Visible(_) => {}
        }
        fate
    }

    /// A CQE for which no attached queue holds the token: a stray if its QP is managed here or was (a freed
    /// queue's late completion, which narrows what may still arrive from it), else another QP's, passed through.
    fn reap_unattached(&self, token: Token, qp_num: u32) -> CqeFate {
        let mut st = self.state.borrow_mut();
        if st.by_qp.contains_key(&qp_num) {
            return CqeFate::Stray;
        }
        let Some(r) = st.retired.get_mut(&qp_num) else { return CqeFate::Passthrough };
        r.on_cqe(token);
        if r.is_done() {
            st.retired.remove(&qp_num);
            // Give back the room of a burst of freed queues once most of them are forgotten.
            // Keep room for every attached queue to be freed without allocating (`attach`).
            if st.retired.capacity() > 64 && st.retired.len() < st.retired.capacity() / 4 {
                let keep = (st.retired.len() * 2).max(st.retired.len() + st.by_qp.len());
                st.retired.shrink_to(keep);
            }
        }
        CqeFate::Stray
    }

    /// A receive CQE of a managed SRQ registered here; `None` if no such SRQ (then it is treated as any CQE).
    fn reap_srq(&self, token: Token, wc: &ibv_wc) -> Option<CqeFate> {
        let id = token.index() - SRQ_TOKEN_BASE;
        let on_cqe = |srq: &dyn AttachedSrq| {
            match srq.on_cqe(token, wc.status as u8, crate::verbs::wc_vendor_err(wc), wc.opcode as u8, crate::verbs::wc_invalidated_rkey(wc)) {
                Some(wr_id) => CqeFate::Visible(wr_id),
                None => CqeFate::Stray,
            }
        };
        // Counted once its release is handed out (by `on_cqe`), as a queue's CQE is (`reap`).
        let counted = |fate: CqeFate| {
            bump(&self.counts.cqes, 1);
            if matches!(fate, CqeFate::Stray) {
                bump(&self.counts.stray, 1);
            }
            Some(fate)
        };
        let srq = {
            let st = self.state.borrow();
            let e = st.srqs.iter().find(|e| e.0 == id)?;
            // A silent SRQ calls nothing out of the library: the CQ's state may stay borrowed, and the SRQ needs
            // no reference of its own to outlive a callback.
            if e.1.is_silent() {
                return counted(on_cqe(&*e.1));
            }
            e.1.clone()
        };
        counted(on_cqe(&*srq))
    }

    /// Covers the unsignaled tail of every watched queue that saw no post during a whole poll cycle (`now`:
    /// every watched queue's tail, posted to recently or not), and starts the next cycle.
    #[inline]
    fn cover_idle_tails(&self, now: bool) {
        // The common end of a poll: every watched queue (or none) was posted to in this cycle, so none is idle.
        if !now && self.posted.get() == self.watching.get() {
            self.next_cycle();
            return;
        }
        self.check_watched(now);
    }

    #[inline]
    fn next_cycle(&self) {
        self.cycle.set(self.cycle.get() + 1);
        self.posted.set(0);
    }

    /// The pass of `cover_idle_tails` over the watched queues.
    ///
    /// One pass in place under the CQ's borrow: neither `check_idle_tail` nor the marker it may post comes
    /// back to this CQ (a marker only calls the provider, which never calls out), and no callback runs here.
    #[inline(never)]
    fn check_watched(&self, now: bool) {
        let mut guard = self.state.borrow_mut();
        let st = &mut *guard;
        let cycle = self.cycle.get();
        let mut markers = 0;
        // Compacts the list in order, keeping the queues that still wait. A queue is in the list at most once:
        // it tracks that itself.
        let mut kept = 0;
        for i in 0..st.watch.len() {
            let index = st.watch[i];
            let keep = match st.table.get(index as usize).and_then(|e| e.as_ref()?.queue.upgrade()) {
                Some(q) => match q.check_idle_tail(now, cycle) {
                    IdleCheck::KeepWatching => true,
                    IdleCheck::Covered(m) => {
                        markers += m as u64;
                        false
                    }
                },
                _ => false,
            };
            if keep {
                if kept != i {
                    st.watch[kept] = index;
                }
                kept += 1;
            }
        }
        st.watch.truncate(kept);
        self.watching.set(kept as u32);
        st.stats.tail_markers += markers;
        self.next_cycle();
    }
}

/// A poll called from one of the same CQ's callbacks: `failed` of its error.
#[cold]
#[inline(never)]
fn reentered<R>(failed: impl FnOnce(Error) -> R) -> R {
    failed(Error::new(libc::EBUSY, "sqd_cq_poll re-entered on the same CQ from one of its callbacks"))
}

/// `CqShared::gate`'s bits.
const POLLING: u8 = 1;
const LOCKED: u8 = 2;

/// Ends a poll's reaping (`CqShared::set_polling`), on return or unwind.
struct PollingGuard<'a>(&'a CqShared);

impl Drop for PollingGuard<'_> {
    fn drop(&mut self) {
        self.0.set_polling(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::{Queue, QueueConfig};
    use sqdisc_sim::scripted::{ScriptedDevice, ScriptedQpCaps};
    use crate::verbs::{QpHandle, SendChain};

    /// Posts `n` unsignaled SENDs of 8 bytes each on `q`.
    fn post_sends(q: &Queue, n: usize) {
        let mut buf = [0u8; 8];
        // SAFETY: all-zero is a valid `ibv_sge` and `ibv_send_wr`.
        let mut sges: Vec<rdma_sys::ibv_sge> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
        // SAFETY: as above.
        let mut wrs: Vec<rdma_sys::ibv_send_wr> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
        let (sge_base, wr_base) = (sges.as_mut_ptr(), wrs.as_mut_ptr());
        for i in 0..n {
            // SAFETY: `i < n` for both vectors, which outlive the post; no other reference into them is live.
            unsafe {
                let s = sge_base.add(i);
                (*s).addr = buf.as_mut_ptr() as u64;
                (*s).length = 8;
                let w = wr_base.add(i);
                (*w).wr_id = i as u64;
                (*w).opcode = rdma_sys::ibv_wr_opcode::IBV_WR_SEND;
                (*w).num_sge = 1;
                (*w).sg_list = s;
                (*w).next = if i + 1 < n { wr_base.add(i + 1) } else { std::ptr::null_mut() };
            }
        }
        // SAFETY: the chain lives in `wrs` and `sges` for the call.
        q.post_send(unsafe { SendChain::from_raw(wr_base) }).unwrap();
    }

    /// A scripted device with one CQ of 64 and one queue of depth 8 on it, signaling every `signal_interval` WRs.
    fn one_queue(signal_interval: u32) -> (std::pin::Pin<Box<ScriptedDevice>>, *mut rdma_sys::ibv_cq, Cq, *mut rdma_sys::ibv_qp, Queue) {
        let dev = ScriptedDevice::new();
        let raw = dev.create_cq(64).unwrap();
        // SAFETY: the CQ lives as long as the device.
        let cq = Cq::new(unsafe { CqHandle::from_raw(raw) }.unwrap());
        let cfg = QueueConfig { sq_depth: 8, max_send_sge: 1, signal_interval, ..QueueConfig::default() };
        let qp = dev.create_qp(raw, raw, &ScriptedQpCaps::with_depths(8, 1)).unwrap();
        // SAFETY: the QP lives as long as the device.
        let q = Queue::new(&cq, None, unsafe { QpHandle::from_raw(qp) }.unwrap(), cfg, None).unwrap();
        (dev, raw, cq, qp, q)
    }

    fn poll_all(cq: &Cq) -> usize {
        // SAFETY: all-zero is a valid `ibv_wc`.
        let mut wc: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
        let mut shown = 0;
        loop {
            let n = cq.poll(&mut wc).unwrap();
            shown += n;
            if n < wc.len() {
                return shown;
            }
        }
    }

    /// Posts one SEND straight to the provider, behind the library's back, with `wr_id` and signaled.
    fn post_raw(qp: *mut rdma_sys::ibv_qp, wr_id: u64) {
        // SAFETY: all-zero is a valid `ibv_send_wr`.
        let mut wr: rdma_sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.opcode = rdma_sys::ibv_wr_opcode::IBV_WR_SEND;
        wr.send_flags = rdma_sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live scripted QP; the WR lives for the call.
        assert_eq!(unsafe { (*(*qp).context).ops.post_send.unwrap()(qp, &mut wr, &mut bad) }, 0);
    }

    /// A CQE that carries a queue's token in a direction that does not complete on the CQ it arrived on is a
    /// stray: it releases nothing, even when the token would match an outstanding WR of that direction.
    #[test]
    fn a_token_of_a_direction_completing_elsewhere_is_a_stray() {
        let dev = ScriptedDevice::new();
        let (send_raw, recv_raw) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
        // SAFETY: the CQs live as long as the device.
        let send_cq = Cq::new(unsafe { CqHandle::from_raw(send_raw) }.unwrap());
        // SAFETY: as above.
        let recv_cq = Cq::new(unsafe { CqHandle::from_raw(recv_raw) }.unwrap());
        let cfg = QueueConfig { sq_depth: 8, max_send_sge: 1, signal_interval: 4, rq_depth: 4, ..QueueConfig::default() };
        let qp = dev.create_qp(send_raw, recv_raw, &ScriptedQpCaps::with_depths(8, 4)).unwrap();
        // SAFETY: the QP lives as long as the device.
        let q = Queue::new(&send_cq, Some(&recv_cq), unsafe { QpHandle::from_raw(qp) }.unwrap(), cfg, None).unwrap();
        // SAFETY: all-zero is a valid `ibv_recv_wr`; no SGE.
        let mut rwr: rdma_sys::ibv_recv_wr = unsafe { std::mem::zeroed() };
        rwr.wr_id = 77;
        // SAFETY: the WR lives for the call.
        q.post_recv(unsafe { crate::verbs::RecvChain::from_raw(&mut rwr) }).unwrap();
        assert_eq!(q.stats().recv_outstanding, 1);
        // The receive's token (sequence 0) but with the queue's index on the send CQ, where it completes.
        let index = *send_cq.shared.state.borrow().by_qp.get(&q.qp_num()).unwrap();
        post_raw(qp, Token::new(index, Direction::Recv, 0).0);
        dev.complete(qp, 1).unwrap();
        assert_eq!(poll_all(&send_cq), 0);
        let st = send_cq.stats();
        assert_eq!((st.cqes, st.stray, st.visible), (1, 1, 0), "{st:?}");
        assert_eq!(q.stats().recv_outstanding, 1, "the receive is not released by a CQE of the send CQ");
        // The send-direction token of the same sequence on the send CQ is the queue's (a WR never posted: stray).
        post_raw(qp, Token::new(index, Direction::Send, 0).0);
        dev.complete(qp, 1).unwrap();
        assert_eq!(poll_all(&send_cq), 0);
        assert_eq!(q.stats().stray_cqes, 1, "dispatched to the queue, which found no such WR");
        assert_eq!(send_cq.stats().stray, 2);
    }

    /// Every call of `poll` counts once in `polls`, whichever way it ends (no room, nothing found, CQEs that
    /// fill the array, CQEs that do not), and `empty_polls` counts the calls that ended before filling it.
    #[test]
    fn every_poll_counts_once_and_the_empty_ones_once_more() {
        let (dev, raw, cq, qp, q) = one_queue(1);
        let counts = |cq: &Cq| (cq.stats().polls, cq.shared.empty_polls());
        // SAFETY: all-zero is a valid `ibv_wc`.
        let mut wc: [ibv_wc; 2] = unsafe { std::mem::zeroed() };
        assert_eq!(cq.poll(&mut wc[..0]).unwrap(), 0, "no room");
        assert_eq!(counts(&cq), (1, 0));
        assert_eq!(cq.poll(&mut wc).unwrap(), 0, "nothing found");
        assert_eq!(counts(&cq), (2, 1));
        post_sends(&q, 4);
        dev.complete(qp, 4).unwrap();
        // Every WR signaled, none by the ULP: the CQEs are hidden, so the array never fills.
        assert_eq!(cq.poll(&mut wc).unwrap(), 0, "CQEs found, the array not filled");
        assert_eq!(counts(&cq), (3, 2));
        assert_eq!(q.stats().released, 4);
        // Another QP's CQEs on the same CQ, which no queue manages: passed through, visible.
        let other = dev.create_qp(raw, raw, &ScriptedQpCaps::with_depths(8, 1)).unwrap();
        for i in 0..3u64 {
            post_raw(other, 0x5000 + i);
        }
        dev.complete(other, 3).unwrap();
        assert_eq!(cq.poll(&mut wc).unwrap(), 2, "the array filled");
        assert_eq!(counts(&cq), (4, 2));
        assert_eq!(cq.poll(&mut wc).unwrap(), 1);
        assert_eq!(counts(&cq), (5, 3));
    }

    /// CQEs the caller polled from the provider itself, handed to `poll_found`, are processed as `poll` would
    /// have: hidden ones released, the others kept with their wr_ids, counted once; an unsignaled tail is
    /// watched (`has_watched_tails`) until a poll covers it.
    #[test]
    fn poll_found_processes_what_the_caller_polled_as_poll_would() {
        let (dev, raw, cq, qp, q) = one_queue(4);
        // SAFETY: all-zero is a valid `ibv_wc`.
        let mut wc: [ibv_wc; 8] = unsafe { std::mem::zeroed() };
        assert!(!cq.has_watched_tails());
        post_sends(&q, 4);
        dev.complete(qp, 4).unwrap();
        // SAFETY: the scripted CQ's own poll op, with room for 8 entries.
        let found = unsafe { (*(*raw).context).ops.poll_cq.unwrap()(raw, 8, wc.as_mut_ptr()) };
        assert_eq!(found, 1, "one CQE: the fourth WR, signaled by the queue");
        assert_eq!(cq.poll_found(&mut wc, found as usize).unwrap(), 0, "hidden");
        assert_eq!(q.stats().released, 4);
        assert_eq!(cq.stats().polls, 1);
        assert_eq!(cq.poll_found(&mut wc, 0).unwrap(), 0);
        assert_eq!(cq.stats().polls, 2);
        // Two WRs leave an unsignaled tail: watched until a poll covers it with a marker.
        post_sends(&q, 2);
        assert!(cq.has_watched_tails());
        for _ in 0..3 {
            let _ = cq.poll(&mut wc).unwrap();
        }
        dev.complete(qp, 3).unwrap();
        assert_eq!(poll_all(&cq), 0);
        assert_eq!(q.stats().released, 6);
        assert!(!cq.has_watched_tails());
    }

    #[test]
    fn a_freed_queue_is_forgotten_once_its_last_late_completion_arrived() {
        let dev = ScriptedDevice::new();
        let raw = dev.create_cq(256).unwrap();
        // SAFETY: the CQ lives as long as the device.
        let cq = Cq::new(unsafe { CqHandle::from_raw(raw) }.unwrap());
        let cfg = QueueConfig { sq_depth: 8, max_send_sge: 1, signal_interval: 4, ..QueueConfig::default() };
        let mut qps = Vec::new();
        for executed in [0, 2, 4, 8] {
            let qp = dev.create_qp(raw, raw, &ScriptedQpCaps::with_depths(8, 1)).unwrap();
            // SAFETY: the QP lives as long as the device.
            let q = Queue::new(&cq, None, unsafe { QpHandle::from_raw(qp) }.unwrap(), cfg, None).unwrap();
            post_sends(&q, 8);
            dev.complete(qp, executed).unwrap();
            q.on_async_event(1).unwrap(); // IBV_EVENT_QP_FATAL
            q.check_free().unwrap();
            drop(q);
            qps.push(qp);
        }
        let retired = |cq: &Cq| cq.shared.state.borrow().retired.len();
        // All 8 WQEs executed (CQEs for WRs 3 and 7 still queued): the last may still complete.
        assert_eq!(retired(&cq), 4);
        assert_eq!(poll_all(&cq), 0);
        // The signaled CQEs of the executed WQEs covered the fourth QP's every WQE, the third's first four.
        assert_eq!(retired(&cq), 3);
        for &qp in &qps {
            dev.set_error(qp).unwrap();
        }
        assert_eq!(poll_all(&cq), 0);
        assert_eq!(retired(&cq), 0, "every WQE completed: nothing more can arrive, nothing is kept");
        let st = cq.stats();
        assert_eq!((st.stray, st.passthrough, st.visible), (st.cqes, 0, 0), "{st:?}");
    }

    #[test]
    fn late_completions_polled_before_the_free_leave_nothing_to_remember() {
        let (dev, _, cq, qp, q) = one_queue(4);
        post_sends(&q, 8);
        q.on_async_event(1).unwrap();
        dev.set_error(qp).unwrap();
        assert_eq!(poll_all(&cq), 0);
        assert_eq!(q.stats().late_cqes, 8);
        drop(q);
        assert_eq!(cq.shared.state.borrow().retired.len(), 0);
    }
}
