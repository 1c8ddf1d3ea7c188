//! A managed queue: the send queue (and optionally the receive queue) of one RC QP.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::attach::{AttachedQueue, CqeFate, IdleCheck};
use crate::completion::Completion;
use crate::cq::{Cq, CqShared};
use crate::discipline::budget::{posts_markers, reservation, send_reservation};
use crate::discipline::signal::interval_in_force;
use crate::discipline::check::Limits;
use crate::discipline::late::RetiredQueue;
use crate::discipline::opcode::SEND_INLINE;
use crate::discipline::send::{Barriers, Closed, SendLedger};
use crate::discipline::token::{Direction, Token};
use crate::discipline::{Backlog, RecvState, SendState, Slot};
use crate::error::{Error, Result};
use crate::limits::{MAX_DEPTH, MAX_INLINE, MAX_SGE};
use crate::post_error::{PostError, RecvPostError};
use crate::release::{BatchCall, BatchHandler, ReleaseHandler};
use crate::srq::{Srq, SrqShared};
use crate::verbs::control::Teardown;
use crate::verbs::verify::VerifyStore;
use crate::verbs::{BacklogPool, ForeignDeferred, QpHandle, RecvChain, SendChain, StagedWr, WrPtr};

mod ops;
mod post;
mod recv;
mod release;
mod tail;

/// How a queue is set up. Depths are what the QP was actually granted (read them back after creating it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueConfig {
    /// The QP's `max_send_wr`: the most WQEs the library ever lets the provider hold.
    pub sq_depth: u32,
    pub max_send_sge: u32,
    pub max_inline_data: u32,
    /// The QP's `max_recv_wr` when receives complete on a managed CQ (`recv_cq`), else 0.
    pub rq_depth: u32,
    /// At most `signal_interval - 1` unsignaled WRs in a row; 0 picks `max(1, sq_depth / 4)`. With 1 (given, or
    /// picked by 0 below an `sq_depth` of 8) every WR is signaled, so the queue never posts a marker and
    /// reserves no CQE for one.
    pub signal_interval: u32,
    /// WRs parked while the SQ has no credit; 0 makes posts fail with `EAGAIN` instead.
    pub backlog_depth: u32,
    /// Checksum the bytes of every SGE a WR reads (SEND, RDMA WRITE; not inline) when it is accepted and again at
    /// its release; a difference is reported in the release (`SQD_COMPLETION_BUFFER_MODIFIED`) and counted.
    /// The bytes must stay readable until the release (as rule 3 requires anyway). For debug and canary builds.
    pub verify_buffers: bool,
    /// Leave the WRs a post call posted as it posted them instead of restoring them before it returns: after a
    /// successful call, their `wr_id` and `send_flags` are unspecified (the library's token; `IBV_SEND_SIGNALED`
    /// where the policy added it); after a failed one, the same for the WRs before the one it names, and that
    /// one and the rest are as the ULP passed them. `next` is always restored. For ULPs that fill every WR
    /// before each post: the walk that restores a posted chain is skipped.
    pub no_restore: bool,
    /// Name each send WR by its index instead of its wr_id. A WR's index is how many send WRs the queue
    /// accepted before it (0 for the first; `invalidate` takes none); as every WR is released exactly once and
    /// in post order, the n-th send release of the queue is always the WR of index n. The queue neither keeps
    /// nor restores the ULP's wr_ids: a release's `wr_id`, a send completion's `wr_id` from a poll and
    /// [`ReleaseBatch::first`](crate::ReleaseBatch) are indexes, and a batch's `wr_ids` is empty. For ULPs that
    /// keep their per-WR state in post order: storing each wr_id and handing it back is skipped. Implies
    /// `no_restore`, and more: every WR handed to a post call has an unspecified `wr_id` after it, those not
    /// accepted included.
    pub indexed: bool,
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

/// What a completion barrier does when it is reached.
enum Action {
    User(Deferred),
    /// Post the library operation with this id (a deferred LocalInv).
    PostOp(u32),
    /// Deregister an MR or deallocate an MW; `untrack`: the lkey of the MR, tracked when it was handed over,
    /// to stop tracking once it is gone (its key may then name a new MR).
    Teardown { teardown: Teardown, untrack: Option<u32> },
}

/// What `Queue::on_out_of_order` sets: called with the description of the queue's first completion out of RC
/// order.
pub type OutOfOrderHook = Box<dyn Fn(&str)>;

/// An MR whose uses the queue tracks precisely (see `Queue::track_mr`).
struct TrackedMr {
    lkey: u32,
    /// `accepted` right after the newest WR whose SGEs may use it: every WR accepted before it was tracked may
    /// (the queue did not look at their SGEs), so it starts at `accepted` as of `track_mr`.
    last_use: u64,
}

/// How `Queue::invalidate` orders the LocalInv.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidateMode {
    /// Posted only once a CQE covers every WR accepted before the request (works on every device).
    Deferred,
    /// Posted at once with `IBV_SEND_FENCE` (or parked behind WRs already parked): for devices that honour the
    /// Local Invalidate Fence.
    Fenced,
}

/// A pending library operation.
struct Op {
    rkey: u32,
    fence: bool,
    wr_id: u64,
    done: Option<ReleaseHandler>,
}

/// Counters and state of a queue (`struct sqd_queue_stats` in C).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Send WRs accepted (posted or parked): the ULP's, and the LocalInv of each `sqd_invalidate` once it was
    /// posted or parked (not the library's markers). A LocalInv's release goes to its `done` callback, not to
    /// the queue's `release`; one cancelled before it was posted or parked (a drain, a failed queue, a
    /// provider refusal) counts in neither counter.
    pub accepted: u64,
    /// Send WRs released, counted as `accepted` is.
    pub released: u64,
    /// WQEs handed to the provider, markers included.
    pub wqes: u64,
    /// Provider post_send calls.
    pub doorbells: u64,
    /// WQEs signaled because the ULP asked.
    pub signaled_by_ulp: u64,
    /// WQEs signaled by the moderation policy (interval or last free slot).
    pub signaled_by_policy: u64,
    /// Zero-length signaled markers posted to cover an idle unsignaled tail, a drain, or the unsignaled tail
    /// of a post made while the send CQ is armed (`sqd_cq_arm`).
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
    /// CQEs that arrived after an async event made the queue release everything: swallowed.
    pub late_cqes: u64,
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
    /// The `ibv_wc_status` that failed the queue, else 0: that of the first error completion of its sends whose
    /// status is not `IBV_WC_WR_FLUSH_ERR` (kept even if a device reaped flushes before it). It is
    /// `IBV_WC_WR_FLUSH_ERR` only while no other error status has been reaped: the QP was moved to the error
    /// state from outside, or an async event failed the queue (the completions reaped after that are
    /// swallowed and change nothing). The failing WR may be one of the library's own (an idle-tail or drain
    /// marker, or a deferred LocalInv), whose completion `sqd_cq_poll` never shows: the ULP's WRs before it
    /// then release as successful (its completion proves they finished), those after it with
    /// `IBV_WC_WR_FLUSH_ERR`, no completion the ULP sees carries the error, and this field and
    /// `failed_vendor_err` are where the cause shows.
    pub failed_status: u32,
    /// 1 when the queue takes no more WRs (failed or draining).
    pub closed: u32,
    /// MRs tracked precisely now (`sqd_queue_track_mr`); one handed to `sqd_defer_dereg_mr` counts until its
    /// deregistration has run.
    pub tracked_mrs: u32,
    /// The `vendor_err` of the completion whose status `failed_status` holds (0 when it had none, or when an
    /// async event failed the queue). It sits in what was padding before it, so the struct's size and the
    /// offsets of the other fields are those of earlier versions.
    pub failed_vendor_err: u32,
    /// Deferred deregistrations or deallocations that failed.
    pub teardown_failures: u64,
    /// Releases whose buffers verification found modified (`SQD_COMPLETION_BUFFER_MODIFIED`).
    pub verify_mismatches: u64,
    /// Bytes the queue allocated at creation: its own storage (fixed part, 16 bytes per slot rounded to a power
    /// of two, verification storage) and what its creation added to its send CQ's backlog pool, where its WRs
    /// park (room for `backlog_depth` WRs of its shape when the pool had none to spare; nothing when the pool
    /// already had the room, as for a queue joining a CQ whose `sqd_cq_set_backlog_limit` storage exists). The
    /// pool's storage as a whole is in `sqd_backlog_pool_stats.bytes`. Not counted: what grows later with use,
    /// namely pending invalidations (`sqd_invalidate`), deferred actions and tracked MRs.
    pub bytes: u64,
    /// Accepted WRs the provider's `post_send` refused when the library posted them (from the backlog, or a
    /// deferred LocalInv): each was released with `SQD_COMPLETION_REFUSED`.
    pub provider_refused: u64,
    /// The provider's errno of the newest such refusal, or of the newest refused marker, else 0
    /// (`sqd_queue_last_refusal` describes it).
    pub provider_refused_errno: u32,
    /// The library's idle-tail markers the provider's `post_send` refused. The tail stays watched, and each
    /// later poll cycle of the send CQ tries the marker again until one is taken (or the ULP posts a signaled
    /// WR behind the tail).
    pub markers_refused: u32,
}

struct QueueState {
    send: SendState<StagedWr>,
    recv: Option<RecvState>,
    barriers: Barriers<Action>,
    ops: Vec<Option<Op>>,
    free_ops: Vec<u32>,
    tracked: Vec<TrackedMr>,
    teardown_failures: u64,
    verify: Option<VerifyStore>,
    verify_mismatches: u64,
    doorbells: u64,
    /// What the provider refused last, after the queue had accepted it (see `Queue::last_refusal`).
    last_refusal: Option<String>,
    /// Completions of this queue that came out of RC order (`Queue::out_of_order`).
    out_of_order: crate::cq::OutOfOrder,
}

pub(crate) struct QueueShared {
    qp: QpHandle,
    limits: Limits,
    send_cq: Rc<CqShared>,
    recv_cq: Option<Rc<CqShared>>,
    send_index: u32,
    /// `Token::new(send_index, Direction::Send, 0)`: a send token is this or'ed with the sequence number.
    send_token: u64,
    recv_index: u32,
    send_need: u64,
    recv_need: u64,
    /// The queue's class (its WR shape) in its send CQ's backlog pool.
    pool_class: u16,
    /// Bytes its creation added to that pool (counted in its footprint).
    pool_bytes: u64,
    state: RefCell<QueueState>,
    /// The send ring and the released count, also in `state.send`: the release loop's common case reads and
    /// advances them without borrowing `state` (`SendLedger`'s contract).
    ledger: Rc<SendLedger>,
    /// A receive of the queue's may have its release due: set whenever a receive completes (its CQE, or the queue
    /// abandoned), cleared by the release pass when it finds none due. A Cell, so that the end of a release pass
    /// (`release_pass_done`) tests it without a borrow: a queue that manages receives does not pay the rest of
    /// the pass for every send CQE.
    recv_due: Cell<bool>,
    /// The send CQ's poll cycle (`CqShared::cycle`) in which a post (or a pump) last left an unsignaled tail:
    /// while it is the current cycle, the idle-tail check at the end of the poll waits. Cells, so that the check
    /// takes no borrow.
    posted_cycle: Cell<u64>,
    /// The queue is in its send CQ's watch list.
    watched: Cell<bool>,
    releasing: Cell<bool>,
    /// The queue verifies buffers (`QueueState::verify` is set): fixed at creation, so that the release loop
    /// is chosen once per call and the loop without the verifier tests nothing of it per release.
    verifying: bool,
    /// `QueueConfig::no_restore` (or `indexed`, which implies it): fixed at creation.
    no_restore: bool,
    /// `QueueConfig::indexed`: fixed at creation.
    indexed: bool,
    /// The per-WR release pass of a queue without a batch handler (`run_plain_releases`, or
    /// `run_indexed_releases` on an indexed queue that does not verify buffers), chosen at creation: a call
    /// through it costs what a direct call does, where a test of the two flags per pass cost the CQE path
    /// three instructions more.
    plain_releases: fn(&QueueShared),
    /// The quiet run's loop: `fill_quiet::<false>` on an indexed queue (its slots keep no wr_id), else
    /// `fill_quiet::<true>`, picked at creation.
    fill_quiet: for<'a> fn(&[Cell<crate::discipline::Slot>], crate::verbs::WrPtr<'a>, u64, &Limits) -> post::QuietRun<'a>,
    release: Option<ReleaseHandler>,
    /// The batch handler (`Queue::set_release_batch`), set at most once.
    batcher: std::cell::OnceCell<Batcher>,
    srq: Option<Rc<SrqShared>>,
    /// When `IBV_EVENT_QP_LAST_WQE_REACHED` was reported: the receive CQ's count of empty polls then.
    last_wqe_at: Cell<Option<u64>>,
    /// Called with the description of the queue's first completion out of RC order (`Queue::on_out_of_order`).
    out_of_order_hook: Cell<Option<OutOfOrderHook>>,
}

/// A queue's batch handler and the array its batches' wr_ids are gathered in (one slot per ring slot: a batch
/// never holds more WRs than the ring). Only the release pass, which never nests, fills and lends the array.
struct Batcher {
    handler: BatchCall,
    /// Whether batches of successes go to `handler` too; if not, they are released without a call.
    successes: bool,
    wr_ids: RefCell<Box<[u64]>>,
    /// The queue's release pass (`run_batched_release_loop`, with indexes on an indexed queue), picked with
    /// the handler: the CQE path then tests nothing more than whether a batcher is set.
    pass: fn(&QueueShared),
}

/// What a queue allocates at creation: everything whose size its configuration decides.
struct QueueStorage {
    send: SendState<StagedWr>,
    recv: Option<RecvState>,
    verify: Option<VerifyStore>,
}

impl QueueStorage {
    /// Allocates the storage of a queue of configuration `c`; `ENOMEM` names the bytes that could not be
    /// allocated and the queue's total.
    fn new(c: &QueueConfig, interval: u32, recv: bool) -> Result<QueueStorage> {
        Self::allocate(c, interval, recv).map_err(|e| {
            Error::new(
                e.errno(),
                format!(
                    "{}; the queue (sq_depth {}, rq_depth {}, backlog_depth {}, max_send_sge {}, max_inline_data {}, \
                     buffer verification {}) needs {} bytes in all",
                    e.message(),
                    c.sq_depth,
                    if recv { c.rq_depth } else { 0 },
                    c.backlog_depth,
                    c.max_send_sge,
                    c.max_inline_data,
                    if c.verify_buffers { "on" } else { "off" },
                    Self::bytes(c, recv)
                ),
            )
        })
    }

    fn allocate(c: &QueueConfig, interval: u32, recv: bool) -> Result<QueueStorage> {
        // The entries of parked WRs come from the send CQ's backlog pool; the queue keeps only their list.
        let backlog = Backlog::new(c.backlog_depth as usize);
        Ok(QueueStorage {
            send: SendState::new(c.sq_depth, interval, backlog)?,
            recv: if recv { Some(RecvState::new(c.rq_depth)?) } else { None },
            verify: if c.verify_buffers {
                Some(VerifyStore::new(c.sq_depth as usize + c.backlog_depth as usize, c.max_send_sge)?)
            } else {
                None
            },
        })
    }

    /// Bytes of the queue, as `Queue::footprint` counts them: its fixed part and what `allocate` asks for.
    fn bytes(c: &QueueConfig, recv: bool) -> u64 {
        let slot = std::mem::size_of::<Slot>() as u64;
        let ring = |depth: u32| (depth.max(1) as u64).next_power_of_two() * slot;
        let mut n = std::mem::size_of::<QueueShared>() as u64 + ring(c.sq_depth);
        if recv {
            n += ring(c.rq_depth);
        }
        if c.verify_buffers {
            n += VerifyStore::footprint_for(c.sq_depth as usize + c.backlog_depth as usize, c.max_send_sge) as u64;
        }
        n
    }
}

/// The managed send queue (and optionally receive queue) of one RC QP ([`Queue::new`], [`Queue::with_srq`]).
///
/// Threads: as its CQs. Drop it only when nothing of it is outstanding ([`Queue::check_free`]), since WRs
/// still outstanding would then complete as strays.
pub struct Queue {
    shared: Rc<QueueShared>,
    /// Whether the send CQ is thread-safe (has a lock), kept here so that the C entry points test it with one
    /// load from the handle.
    locked: bool,
}

/// Dropping a queue detaches it from its CQs whatever is outstanding: call [`Queue::check_free`] first, as
/// `sqd_queue_free` does. Like [`Cq`], a `Queue` is neither `Send` nor `Sync`.
impl Queue {
    /// Puts `qp` under management: its sends complete on `send_cq`, its receives (if `config.rq_depth > 0`) on
    /// `recv_cq`. Reserves the queue's worst case on the CQ(s): `ENOSPC` if it does not fit.
    pub fn new(send_cq: &Cq, recv_cq: Option<&Cq>, qp: QpHandle, config: QueueConfig, release: Option<ReleaseHandler>) -> Result<Queue> {
        Queue::build(send_cq, recv_cq, None, qp, config, release)
    }

    /// Puts `qp`, whose receives come from the managed `srq`, under management: its sends complete on
    /// `send_cq`, its receives (from the SRQ) on `recv_cq` (the QP's, managed; it may be `send_cq`). The SRQ's
    /// depth is reserved once on `recv_cq` for all queues of that SRQ there. `config.rq_depth` must be 0.
    pub fn with_srq(send_cq: &Cq, recv_cq: &Cq, srq: &Srq, qp: QpHandle, config: QueueConfig, release: Option<ReleaseHandler>) -> Result<Queue> {
        Queue::build(send_cq, Some(recv_cq), Some(srq), qp, config, release)
    }

    fn build(
        send_cq: &Cq,
        recv_cq: Option<&Cq>,
        srq: Option<&Srq>,
        qp: QpHandle,
        config: QueueConfig,
        release: Option<ReleaseHandler>,
    ) -> Result<Queue> {
        let c = config;
        if c.sq_depth == 0 || c.sq_depth > MAX_DEPTH {
            return Err(Error::invalid(format!("sq_depth {} is outside 1..={MAX_DEPTH}", c.sq_depth)));
        }
        for (field, value) in [("rq_depth", c.rq_depth), ("backlog_depth", c.backlog_depth)] {
            if value > MAX_DEPTH {
                return Err(Error::invalid(format!("{field} {value} is above {MAX_DEPTH}")));
            }
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
        let interval = interval_in_force(c.sq_depth, c.signal_interval);
        if !std::ptr::eq(qp.send_cq(), send_cq.shared.handle.as_ptr()) {
            return Err(Error::invalid(format!(
                "the QP's send CQ ({:p}) is not the CQ given as send_cq ({:p})",
                qp.send_cq(),
                send_cq.shared.handle.as_ptr()
            )));
        }
        if let Some(srq) = srq {
            if !std::ptr::eq(qp.srq(), srq.shared.handle().as_ptr()) {
                return Err(Error::invalid(format!(
                    "the QP's SRQ ({:p}) is not the SRQ given ({:p})",
                    qp.srq(),
                    srq.shared.handle().as_ptr()
                )));
            }
            if c.rq_depth != 0 {
                return Err(Error::invalid("rq_depth must be 0 for a QP that receives from an SRQ"));
            }
            srq.shared.check_open()?;
            if send_cq.lock().is_some() || recv_cq.is_some_and(|r| r.lock().is_some()) {
                return Err(Error::invalid("SRQs are managed in single-threaded mode only (not on thread-safe CQs)"));
            }
            let rcq = recv_cq.expect("with_srq gives a recv_cq");
            if !std::ptr::eq(qp.recv_cq(), rcq.shared.handle.as_ptr()) {
                return Err(Error::invalid(format!(
                    "the QP's recv CQ ({:p}) is not the CQ given as recv_cq ({:p})",
                    qp.recv_cq(),
                    rcq.shared.handle.as_ptr()
                )));
            }
        }
        match (recv_cq, c.rq_depth) {
            _ if srq.is_some() => {}
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
        if let Some(r) = recv_cq {
            if !same_cq && (send_cq.lock().is_some() || r.lock().is_some()) {
                return Err(Error::invalid(
                    "a queue on a thread-safe CQ must have its sends and receives on that one CQ (one lock)",
                ));
            }
        }
        // Receives completing on the send CQ reserve there, with the sends.
        let recvs = reservation(0, c.rq_depth, false, recv_cq.is_some());
        let sends = send_reservation(c.sq_depth, c.signal_interval);
        let (send_need, recv_need) = if same_cq { (sends + recvs, 0) } else { (sends, recvs) };
        let marker = if posts_markers(c.sq_depth, c.signal_interval) { "1 drain marker" } else { "every WR signaled, no marker" };
        let what = if same_cq {
            format!("sq_depth {} + rq_depth {} + {marker}", c.sq_depth, c.rq_depth)
        } else {
            format!("sq_depth {} + {marker}", c.sq_depth)
        };
        // The queue's storage, allocated before anything is attached so that a failure leaves nothing to undo.
        let storage = QueueStorage::new(&c, interval, recv_cq.is_some() && srq.is_none())?;
        // Room in the send CQ's backlog pool for what this queue may park (within the CQ's limit, if any).
        let (pool_class, pool_bytes) = send_cq.shared.pool.borrow_mut().join(c.max_send_sge, c.max_inline_data, c.backlog_depth)?;
        let leave_pool = || send_cq.shared.pool.borrow_mut().leave(pool_class, c.backlog_depth);
        let qp_num = qp.qp_num();
        let send_index = match send_cq.shared.attach(qp_num, send_need, &what) {
            Ok(i) => i,
            Err(e) => {
                leave_pool();
                return Err(e);
            }
        };
        let recv_index = match recv_cq {
            Some(r) if !same_cq => match r.shared.attach(qp_num, recv_need, &format!("rq_depth {}", c.rq_depth)) {
                Ok(i) => i,
                Err(e) => {
                    send_cq.shared.detach(send_index, qp_num, send_need, RetiredQueue::default());
                    leave_pool();
                    return Err(e);
                }
            },
            _ => send_index,
        };
        if let (Some(srq), Some(r)) = (srq, recv_cq) {
            if let Err(e) = r.shared.attach_srq(&srq.shared) {
                leave_pool();
                send_cq.shared.detach(send_index, qp_num, send_need, RetiredQueue::default());
                if !same_cq {
                    r.shared.detach(recv_index, qp_num, recv_need, RetiredQueue::default());
                }
                return Err(e);
            }
            srq.shared.queues.set(srq.shared.queues.get() + 1);
        }
        let limits = Limits::new(c.max_send_sge, c.max_inline_data);
        let verify = storage.verify;
        let mut storage_send = storage.send;
        storage_send.set_noting(verify.is_some());
        if c.indexed {
            storage_send.set_indexed();
        }
        let barriers = Barriers::new(storage_send.ledger().clone());
        let shared = Rc::new(QueueShared {
            ledger: storage_send.ledger().clone(),
            recv_due: Cell::new(false),
            verifying: verify.is_some(),
            no_restore: c.no_restore || c.indexed,
            indexed: c.indexed,
            plain_releases: if c.indexed && verify.is_none() { QueueShared::run_indexed_releases } else { QueueShared::run_plain_releases },
            fill_quiet: if c.indexed { post::fill_quiet::<false> } else { post::fill_quiet::<true> },
            qp,
            limits,
            send_cq: send_cq.shared.clone(),
            recv_cq: recv_cq.map(|r| r.shared.clone()),
            send_index,
            send_token: Token::new(send_index, Direction::Send, 0).0,
            recv_index,
            send_need,
            recv_need,
            pool_class,
            pool_bytes,
            state: RefCell::new(QueueState {
                send: storage_send,
                recv: storage.recv,
                barriers,
                ops: Vec::new(),
                free_ops: Vec::new(),
                tracked: Vec::new(),
                teardown_failures: 0,
                verify,
                verify_mismatches: 0,
                doorbells: 0,
                last_refusal: None,
                out_of_order: crate::cq::OutOfOrder::default(),
            }),
            posted_cycle: Cell::new(u64::MAX),
            watched: Cell::new(false),
            releasing: Cell::new(false),
            release,
            batcher: std::cell::OnceCell::new(),
            srq: srq.map(|s| s.shared.clone()),
            last_wqe_at: Cell::new(None),
            out_of_order_hook: Cell::new(None),
        });
        shared.send_cq.install(send_index, &shared);
        if let Some(r) = &shared.recv_cq {
            if !same_cq {
                r.install(recv_index, &shared);
            }
        }
        let locked = shared.send_cq.lock.is_some();
        Ok(Queue { shared, locked })
    }

    /// Hands a chain of send WRs to the queue. Each WR, in order, is checked, then posted (with the library's
    /// wr_id and, when the policy says so, `IBV_SEND_SIGNALED`) or parked in the backlog; the WRs posted by one
    /// call go to the provider in runs of up to 64 per doorbell. The chain is restored exactly before the call returns
    /// (with [`QueueConfig::no_restore`], only its links and the WRs not accepted are).
    ///
    /// On failure, the WRs before `bad` were accepted and `bad` and the rest were not. Atomics whose SGEs are not
    /// exactly 8 bytes or whose remote address is not 8-byte aligned, and BIND_MWs without a window, are refused
    /// (`EINVAL`) before anything is posted or parked. A parked WR the provider refuses when the library posts it
    /// is released, after the WRs posted before it, with `IBV_WC_LOC_QP_OP_ERR`,
    /// `SQD_COMPLETION_REFUSED | SQD_COMPLETION_NEVER_POSTED` and the errno in `vendor_err` (see
    /// [`Queue::last_refusal`]); the WRs behind it are posted.
    pub fn post_send<'a>(&self, chain: SendChain<'a>) -> std::result::Result<(), PostError<'a>> {
        self.shared.post_send(chain)
    }

    /// [`Queue::post_send`], handing nothing to `done` when every WR was accepted, or the error to `failed`, and
    /// returning what they make of it (the C API's 0 or negative errno, with no `Result` in between).
    #[cfg(feature = "capi")]
    #[inline(always)]
    pub(crate) fn post_send_then<'a, R>(
        &self,
        chain: SendChain<'a>,
        done: impl FnOnce() -> R,
        failed: impl FnOnce(PostError<'a>) -> R,
    ) -> R {
        self.shared.post_send_then(chain, done, failed)
    }

    /// Posts a chain of receives (the queue must manage receives: `rq_depth > 0`). Fails with `EAGAIN` at the
    /// first receive beyond the RQ's credits, and with `EIO` once an asynchronous event released the queue.
    pub fn post_recv<'a>(&self, chain: RecvChain<'a>) -> std::result::Result<(), RecvPostError<'a>> {
        self.shared.post_recv(chain)
    }

    /// Runs `action` once every send WR accepted so far is released (at once if that is already so). `ENOMEM`
    /// (and `action` dropped, not run) if no room for it can be allocated.
    pub fn defer(&self, action: Deferred) -> Result<()> {
        {
            let mut st = self.shared.state.borrow_mut();
            st.barriers.reserve(1)?;
            let target = st.send.accepted();
            st.barriers.push(target, Action::User(action));
        }
        self.shared.run_releases();
        Ok(())
    }

    /// Tracks the uses of the MR with `lkey` precisely: from now on the queue remembers the newest WR whose SGEs
    /// name it, so [`Queue::defer_mr`] and [`Queue::defer_teardown`] on it wait only for the WRs that use it
    /// (instead of every WR accepted so far). The WRs accepted before this call were not looked at: each of them
    /// counts as a use. Costs a scan of the tracked MRs per SGE at post.
    pub fn track_mr(&self, lkey: u32) -> Result<()> {
        let mut st = self.shared.state.borrow_mut();
        if st.tracked.iter().any(|t| t.lkey == lkey) {
            return Err(Error::new(libc::EEXIST, format!("the MR with lkey {lkey:#x} is already tracked")));
        }
        let last_use = st.send.accepted();
        crate::alloc::reserve(&mut st.tracked, 1, "the list of tracked MRs")?;
        st.tracked.push(TrackedMr { lkey, last_use });
        st.sync_noting();
        Ok(())
    }

    /// Stops tracking the MR with `lkey` (`ENOENT` if it was not tracked).
    pub fn untrack_mr(&self, lkey: u32) -> Result<()> {
        let mut st = self.shared.state.borrow_mut();
        let Some(i) = st.tracked.iter().position(|t| t.lkey == lkey) else {
            return Err(Error::new(libc::ENOENT, format!("the MR with lkey {lkey:#x} is not tracked")));
        };
        st.tracked.swap_remove(i);
        st.sync_noting();
        Ok(())
    }

    /// Runs `action` once no in-flight WR of this queue can reference the MR with `lkey`: when it is tracked,
    /// after the release of the newest WR that uses it or of the last WR accepted before it was tracked,
    /// whichever was accepted later; else after every WR accepted so far (at once if that is already so).
    /// `ENOMEM` as for [`Queue::defer`].
    pub fn defer_mr(&self, lkey: u32, action: Deferred) -> Result<()> {
        self.shared.defer_action(Some(lkey), Action::User(action))
    }

    /// Deregisters an MR (or deallocates an MW) once no in-flight WR can reference it: as [`Queue::defer_mr`]
    /// with the MR's `lkey`, or after every WR accepted so far with `None` (memory windows, which WRs reference
    /// by rkey at the peer). An MR tracked on this queue ([`Queue::track_mr`]) when it is handed over is
    /// untracked when the deregistration runs, whether that succeeds or not. A failed deregistration is counted in
    /// `QueueStats::teardown_failures`. `ENOMEM` as for [`Queue::defer`]: the MR or MW is then not torn down, and
    /// stays the caller's.
    pub fn defer_teardown(&self, lkey: Option<u32>, teardown: Teardown) -> Result<()> {
        let untrack = lkey.filter(|&k| self.shared.state.borrow().tracked.iter().any(|t| t.lkey == k));
        self.shared.defer_action(lkey, Action::Teardown { teardown, untrack })
    }

    /// Invalidates `rkey` (a LocalInv of an MR or MW the ULP exposed to its peer) at the first moment it is safe:
    /// in `Deferred` mode the LocalInv is posted only once a CQE covers every WR accepted before this call (a
    /// LocalInv is not ordered behind earlier WRs, IBA Table 79 'L'); in `Fenced` mode it is posted now with the
    /// Local Invalidate Fence. The LocalInv is signaled and never shown by poll; when it has completed, `done`
    /// receives a `Completion` with `wr_id`, opcode `IBV_WC_LOCAL_INV` and its status (`IBV_WC_WR_FLUSH_ERR` and
    /// `SQD_COMPLETION_NEVER_POSTED` when the queue failed or drained first; `IBV_WC_LOC_QP_OP_ERR` with
    /// `SQD_COMPLETION_REFUSED | SQD_COMPLETION_NEVER_POSTED` and the errno in `vendor_err` when the provider
    /// refused it). A fenced LocalInv that cannot be posted now (no free slot, or WRs parked before it) is
    /// parked behind them; `EAGAIN` when it cannot be parked either (the backlog or the CQ's pool is full).
    pub fn invalidate(&self, rkey: u32, mode: InvalidateMode, wr_id: u64, done: Option<ReleaseHandler>) -> Result<()> {
        self.shared.invalidate(rkey, mode, wr_id, done)
    }

    /// Brings the queue to "everything released": stops taking WRs, covers an unsignaled tail with a marker so
    /// the CQ proves every posted WR done (or flushed, when the ULP moved the QP to the error state), and
    /// releases parked WRs as never posted once the posted ones are released. Returns `Ok` when everything is
    /// released and the provider holds none of the queue's WQEs (markers included); `EINPROGRESS` while
    /// completions are still to be polled (call again after polling).
    pub fn drain(&self) -> Result<()> {
        self.shared.drain()
    }

    /// Tells the queue about an asynchronous event of its QP (an `enum ibv_event_type` value).
    ///
    /// `IBV_EVENT_QP_FATAL`, `IBV_EVENT_QP_REQ_ERR` and `IBV_EVENT_QP_ACCESS_ERR` put the QP in the error state,
    /// where the HCA no longer executes its WRs, and a CQ in error may deliver no flush CQE at all: the queue
    /// fails and releases at once, in order, every posted WR and receive with `IBV_WC_WR_FLUSH_ERR` and every
    /// parked WR as never posted; CQEs that still arrive for them are swallowed. `IBV_EVENT_SQ_DRAINED`,
    /// `IBV_EVENT_COMM_EST`, `IBV_EVENT_PATH_MIG` and `IBV_EVENT_QP_LAST_WQE_REACHED` need nothing. Other events do
    /// not concern a QP: `EINVAL`.
    pub fn on_async_event(&self, event: u32) -> Result<()> {
        match event {
            EV_QP_FATAL | EV_QP_REQ_ERR | EV_QP_ACCESS_ERR => {
                self.shared.abandon();
                Ok(())
            }
            EV_QP_LAST_WQE_REACHED => {
                let s = &self.shared;
                let polls = s.recv_cq.as_ref().map_or(0, |r| r.empty_polls());
                s.last_wqe_at.set(Some(polls));
                Ok(())
            }
            EV_COMM_EST | EV_SQ_DRAINED | EV_PATH_MIG => Ok(()),
            _ => Err(Error::invalid(format!("event {event} is not an event of a QP"))),
        }
    }

    /// Hands the queue's common releases to `handler` in batches from now on: posted send WRs of the ULP's
    /// released one after the other with the same status and vendor error go to one call, oldest first, instead
    /// of one call each to the queue's release handler. Every other release (receives, WRs released as never
    /// posted or refused, and any release of a queue that verifies buffers) still goes to the release handler,
    /// which the queue must have (`EINVAL` otherwise), and so may a common release whenever the library finds
    /// that simpler: the two together get each WR exactly once and in post order. A batch carries no opcode
    /// and does not say which WR's own CQE retired it.
    ///
    /// Set at most once (`EBUSY` after that, and from inside the queue's own release pass). `ENOMEM` if the
    /// array of the batches' wr_ids (8 bytes per SQ slot, counted in [`Queue::footprint`]; none on an indexed
    /// queue) cannot be allocated.
    pub fn set_release_batch(&self, handler: BatchHandler) -> Result<()> {
        self.set_batch_call(BatchCall::Closure(handler), true)
    }

    /// [`Queue::set_release_batch`] for a ULP that has nothing to do when its WRs succeed: a batch of successes
    /// is released without a call (counted in [`QueueStats::released`] all the same), and `handler` gets the
    /// batches of failures only (a WR's own error, the flushes behind it). Every other release still goes to the
    /// release handler, successes included where the library releases them one by one; deferred actions and
    /// operations keep their places in post order. By the time a poll (not from one of the queue's own
    /// callbacks) returns the completion of a WR the ULP signaled, that WR and every WR posted before it on the
    /// queue are released. Saves the gathering of wr_ids
    /// and the call per CQE when nothing fails. Set at most once, as `set_release_batch`, and not together with
    /// it.
    pub fn set_release_failures(&self, handler: BatchHandler) -> Result<()> {
        self.set_batch_call(BatchCall::Closure(handler), false)
    }

    /// `set_release_batch` with a C function, called with the batch in its C form (`sqd_queue_set_release_batch`).
    #[cfg(feature = "capi")]
    pub(crate) fn set_release_batch_foreign(&self, f: crate::verbs::ForeignBatch) -> Result<()> {
        self.set_batch_call(BatchCall::Foreign(f), true)
    }

    /// `set_release_failures` with a C function (`sqd_queue_set_release_failures`).
    #[cfg(feature = "capi")]
    pub(crate) fn set_release_failures_foreign(&self, f: crate::verbs::ForeignBatch) -> Result<()> {
        self.set_batch_call(BatchCall::Foreign(f), false)
    }

    /// `successes`: whether batches of successes are handed to `handler` (`set_release_batch`) or released
    /// without a call (`set_release_failures`).
    fn set_batch_call(&self, handler: BatchCall, successes: bool) -> Result<()> {
        let s = &self.shared;
        if s.release.is_none() {
            return Err(Error::invalid(
                "the queue has no release handler: the releases a batch cannot carry go to it, so set one at creation",
            ));
        }
        if s.batcher.get().is_some() {
            return Err(Error::new(libc::EBUSY, "the queue's batch handler is already set"));
        }
        if s.releasing.get() {
            return Err(Error::new(libc::EBUSY, "called from inside the queue's own release pass"));
        }
        // An indexed queue's batches carry no wr_ids: no array to gather them in.
        let len = if s.indexed { 0 } else { s.ledger.ring.capacity() };
        let wr_ids = crate::alloc::boxed_slice(len, 0u64, "the array of a release batch's wr_ids")?;
        s.batcher
            .set(Batcher {
                handler,
                successes,
                wr_ids: RefCell::new(wr_ids),
                pass: match (s.indexed, successes) {
                    (true, true) => QueueShared::run_batched_release_loop::<true, false>,
                    (false, true) => QueueShared::run_batched_release_loop::<false, false>,
                    (true, false) => QueueShared::run_batched_release_loop::<true, true>,
                    (false, false) => QueueShared::run_batched_release_loop::<false, true>,
                },
            })
            .map_err(|_| Error::new(libc::EBUSY, "the queue's batch handler is already set"))
    }

    /// `EBUSY` while WRs or receives are outstanding (not yet released).
    pub fn check_free(&self) -> Result<()> {
        self.shared.check_free()
    }

    pub fn stats(&self) -> QueueStats {
        self.shared.stats()
    }

    /// What the provider refused last after the queue had accepted it (a parked WR when the library posted it,
    /// or a deferred LocalInv): which WR, the errno and what became of it. `None` if nothing was refused so far.
    pub fn last_refusal(&self) -> Option<String> {
        self.shared.state.borrow().last_refusal.clone()
    }

    pub fn qp_num(&self) -> u32 {
        self.shared.qp_num()
    }

    /// The completions of this queue's sends that came out of RC order: how many, and the first one (as
    /// [`Cq::out_of_order`] keeps for all the queues of the send CQ).
    pub fn out_of_order(&self) -> crate::cq::OutOfOrder {
        self.shared.state.borrow().out_of_order
    }

    /// Sets what is called, once, with the description of this queue's first completion out of RC order (as
    /// [`Cq::out_of_order_message`] gives it), from within the poll that met it; replaces an earlier hook. The
    /// hook may not poll the CQ (`EBUSY`, as from a release callback).
    pub fn on_out_of_order(&self, hook: OutOfOrderHook) {
        self.shared.out_of_order_hook.set(Some(hook));
    }

    /// The lock of the queue's (thread-safe) CQ, if any.
    pub fn lock(&self) -> Option<&std::sync::Arc<crate::cq::CqLock>> {
        self.shared.send_cq.lock.as_ref()
    }

    /// Whether the queue's CQ is thread-safe (`lock` is `Some`), read from the queue itself.
    #[inline(always)]
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    /// Bytes this queue allocated: its fixed part, slot records and verification storage, and what its
    /// creation added to its send CQ's backlog pool (see `QueueStats::bytes`).
    pub fn footprint(&self) -> usize {
        self.shared.footprint()
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        let s = &self.shared;
        if let (Some(srq), Some(r)) = (&s.srq, &s.recv_cq) {
            r.detach_srq(srq.id);
            srq.queues.set(srq.queues.get() - 1);
        }
        // What may still complete (after an async event released everything, or when dropped early) is
        // remembered by each CQ, so those completions are dropped there instead of reaching the ULP.
        let (send, recv) = {
            let mut st = s.state.borrow_mut();
            // WRs still parked are never posted now: their entries go back to the pool.
            let mut pool = s.send_cq.pool.borrow_mut();
            st.send.discard_backlog(&mut *pool);
            pool.leave(s.pool_class, st.send.backlog_capacity() as u32);
            (st.send.unfinished(), st.recv.as_ref().map(|r| r.unfinished()).unwrap_or_default())
        };
        let same_cq = s.recv_cq.as_ref().is_some_and(|r| Rc::ptr_eq(r, &s.send_cq));
        let send_late = RetiredQueue { index: s.send_index, send, recv: if same_cq { recv } else { Default::default() } };
        s.send_cq.detach(s.send_index, s.qp.qp_num(), s.send_need, send_late);
        if let Some(r) = &s.recv_cq {
            if !same_cq {
                let recv_late = RetiredQueue { index: s.recv_index, send: Default::default(), recv };
                r.detach(s.recv_index, s.qp.qp_num(), s.recv_need, recv_late);
            }
        }
    }
}

const EV_QP_FATAL: u32 = 1;
const EV_QP_REQ_ERR: u32 = 2;
const EV_QP_ACCESS_ERR: u32 = 3;
const EV_COMM_EST: u32 = 4;
const EV_SQ_DRAINED: u32 = 5;
const EV_PATH_MIG: u32 = 6;
const EV_QP_LAST_WQE_REACHED: u32 = 16;

fn closed_error(c: Closed) -> Error {
    match c {
        Closed::Failed { status, vendor_err } => Error::new(
            libc::EIO,
            format!(
                "the queue has failed (a completion reported ibv_wc_status {status}, vendor error {vendor_err:#x}); \
                 it takes no more WRs"
            ),
        ),
        Closed::Draining => Error::new(libc::EIO, "the queue is draining; it takes no more WRs"),
    }
}

/// What the CQs of a queue call on it; the CQ's table holds the queue as this (`CqShared::install`).
impl AttachedQueue<CqShared> for QueueShared {
    fn qp_num(&self) -> u32 {
        QueueShared::qp_num(self)
    }
    fn send_cq(&self) -> &Rc<CqShared> {
        QueueShared::send_cq(self)
    }
    fn recv_cq(&self) -> Option<&Rc<CqShared>> {
        QueueShared::recv_cq(self)
    }
    fn on_cqe(&self, token: Token, status: u8, vendor_err: u32, wc_opcode: u8, remote_inv: Option<u32>) -> CqeFate {
        QueueShared::on_cqe(self, token, status, vendor_err, wc_opcode, remote_inv)
    }
    fn check_idle_tail(&self, now: bool, cycle: u64) -> IdleCheck {
        QueueShared::check_idle_tail(self, now, cycle)
    }
    fn abandon(&self) {
        QueueShared::abandon(self)
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

    /// No CQE may come for this queue's WRs any more: release them all now (see `Queue::on_async_event`).
    pub(crate) fn abandon(&self) {
        {
            let mut st = self.state.borrow_mut();
            st.send.abandon();
            if let Some(r) = st.recv.as_mut() {
                r.abandon();
                self.recv_due.set(true);
            }
        }
        self.run_releases();
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
                    st.send.refuse_marker(errno);
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
                format!(
                    "drain in progress: {sends} send WR(s) and {recvs} receive(s) not yet released, {} WQE(s) with the \
                     provider; poll the CQ and call again",
                    st.send.in_provider()
                ),
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
                format!(
                    "the queue has {sends} send WR(s) and {recvs} receive(s) not yet released, {} WQE(s) with the \
                     provider; poll (or drain) first",
                    st.send.in_provider()
                ),
            ));
        }
        // A QP on an SRQ may have consumed receives whose completions are still to come: the last-WQE-reached
        // rule (IBA 11.6.3: after the QP is in error, the device reports when it will consume no more).
        if let (Some(srq), Some(r)) = (&self.srq, &self.recv_cq) {
            let drained = self.last_wqe_at.get().is_some_and(|at| r.empty_polls() > at);
            if srq.posted() > 0 && !drained && !st.send.is_abandoned() {
                return Err(Error::new(
                    libc::EBUSY,
                    "the QP may still complete receives from its SRQ: move it to the error state, wait for \
                     IBV_EVENT_QP_LAST_WQE_REACHED, report it (sqd_queue_async_event), poll its receive CQ empty, \
                     then free",
                ));
            }
        }
        Ok(())
    }

    /// Bytes this queue allocated: its fixed part, slot records and verification storage, and what its
    /// creation added to its send CQ's backlog pool.
    fn footprint(&self) -> usize {
        let st = self.state.borrow();
        let slot = std::mem::size_of::<crate::discipline::Slot>();
        let mut n = std::mem::size_of::<QueueShared>() + st.send.ring_capacity() * slot + self.pool_bytes as usize;
        if let Some(r) = &st.recv {
            n += (r.depth() as usize).next_power_of_two() * slot;
        }
        if let Some(v) = &st.verify {
            n += v.footprint();
        }
        if self.batcher.get().is_some() && !self.indexed {
            // The batch array has one entry per ring slot (`set_release_batch`), none on an indexed queue; it is
            // not borrowed here, since the release pass holds it while a batch handler (which may ask for the
            // footprint) runs.
            n += st.send.ring_capacity() * std::mem::size_of::<u64>();
        }
        n
    }

    fn stats(&self) -> QueueStats {
        let bytes = self.footprint() as u64;
        let st = self.state.borrow();
        let c = &st.send.counters;
        let recv = st.recv.as_ref();
        QueueStats {
            accepted: st.send.accepted(),
            released: st.send.released(),
            wqes: st.send.wqes(),
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
            late_cqes: c.late_cqes + recv.map_or(0, |r| r.late_cqes),
            in_provider: st.send.in_provider() as u32,
            credits: st.send.credits(),
            backlog: st.send.backlog_len() as u32,
            recv_outstanding: recv.map_or(0, |r| r.outstanding() as u32),
            deferred: st.barriers.len() as u32,
            signal_interval: st.send.signal_interval(),
            failed_status: st.send.failure().map_or(0, |(s, _)| s as u32),
            failed_vendor_err: st.send.failure().map_or(0, |(_, v)| v),
            closed: st.send.closed().is_some() as u32,
            tracked_mrs: st.tracked.len() as u32,
            teardown_failures: st.teardown_failures,
            verify_mismatches: st.verify_mismatches,
            bytes,
            provider_refused: c.provider_refused,
            provider_refused_errno: c.provider_refused_errno,
            markers_refused: c.markers_refused,
        }
    }
}

/// The description of a WR the provider refused after the queue accepted it.
fn refusal_message(what: &str, errno: i32) -> String {
    format!(
        "the provider's post_send refused {what} with errno {errno} ({}); it is released with IBV_WC_LOC_QP_OP_ERR and \
         SQD_COMPLETION_REFUSED after the WRs posted before it, and the queue goes on with the WRs behind it",
        std::io::Error::from_raw_os_error(errno)
    )
}

impl QueueState {
    /// With the buffer verifier on: marks `c`, the release of the ULP's WR just counted as released, if one of
    /// its SGEs' bytes changed while the HCA could read them.
    fn check_released_buffers(&mut self, c: &mut Completion) {
        if let Some(v) = self.verify.as_ref() {
            if let Some(sge) = v.check(self.send.released() - 1) {
                c.flags |= crate::completion::SQD_COMPLETION_BUFFER_MODIFIED;
                c.modified_sge = sge;
                self.verify_mismatches += 1;
            }
        }
    }

    /// Tells the send state whether every accepted WR must be noted (buffer verification, tracked MRs): after
    /// the tracked MRs change.
    fn sync_noting(&mut self) {
        let noting = self.verify.is_some() || !self.tracked.is_empty();
        self.send.set_noting(noting);
    }

    /// Bookkeeping for the WR just accepted and parked: the tracked MRs its SGEs name, and its checksums when
    /// verifying.
    #[inline]
    fn note_accepted(&mut self, w: WrPtr<'_>, send_flags: u32) {
        let now = self.send.accepted();
        self.note_uses(w, send_flags, now);
        self.note_buffers(w);
    }

    /// The checksums of the WR just accepted, when verifying. A WR posted now has its uses of tracked MRs
    /// noted once the provider took it (`note_posted`).
    #[inline]
    fn note_buffers(&mut self, w: WrPtr<'_>) {
        let now = self.send.accepted();
        if let Some(v) = &mut self.verify {
            v.record(now - 1, w);
        }
    }

    /// The tracked MRs `w`'s SGEs name are used up to `now` (`accepted` right after `w`).
    #[inline]
    fn note_uses(&mut self, w: WrPtr<'_>, send_flags: u32, now: u64) {
        if !self.tracked.is_empty() && send_flags & SEND_INLINE == 0 {
            for sge in w.sges() {
                if let Some(t) = self.tracked.iter_mut().find(|t| t.lkey == sge.lkey) {
                    t.last_use = now;
                }
            }
        }
    }

    /// The provider took the first `posted` WRs of a run of `len` that begins at `first`, all of them the
    /// ULP's and the newest accepted (before the rest is rolled back): their uses of tracked MRs are noted.
    /// Noted only now, so that a WR the provider refused never counts as a use.
    pub(super) fn note_posted(&mut self, first: WrPtr<'_>, len: u32, posted: u32) {
        if self.tracked.is_empty() {
            return;
        }
        let base = self.send.accepted() - u64::from(len);
        let mut w = first;
        for i in 0..posted {
            self.note_uses(w, w.send_flags(), base + u64::from(i) + 1);
            if i + 1 < posted {
                w = w.next().expect("run is linked");
            }
        }
    }

    /// Records the message of the refused oldest parked WR (the pump just stopped at it).
    #[cold]
    fn describe_refused_front(&mut self, pool: &mut BacklogPool) {
        let Some((id, op, errno)) = self.send.refused_front(pool) else { return };
        let what = if op {
            let wr_id = self.ops.get(id as usize).and_then(|o| o.as_ref()).map_or(0, |o| o.wr_id);
            format!("the parked LocalInv of sqd_invalidate wr_id {wr_id:#x}")
        } else {
            format!("the parked WR wr_id {id:#x}")
        };
        self.last_refusal = Some(refusal_message(&what, errno));
    }

    /// Stores a pending operation; `ENOMEM` if its record cannot be allocated. `free_ops` keeps room for every
    /// operation, so that retiring one (in a release) never allocates.
    fn new_op(&mut self, op: Op) -> Result<u32> {
        match self.free_ops.pop() {
            Some(id) => {
                self.ops[id as usize] = Some(op);
                Ok(id)
            }
            None => {
                crate::alloc::reserve(&mut self.ops, 1, "the queue's pending invalidations")?;
                let more = (self.ops.len() + 1).saturating_sub(self.free_ops.len());
                crate::alloc::reserve(&mut self.free_ops, more, "the queue's pending invalidations")?;
                self.ops.push(Some(op));
                Ok((self.ops.len() - 1) as u32)
            }
        }
    }

    /// Retires operation `c.wr_id`: returns its handler and the completion to give it (with the ULP's wr_id).
    fn finish_op(&mut self, mut c: Completion) -> (Option<ReleaseHandler>, Completion) {
        let id = c.wr_id as u32;
        let op = self.ops[id as usize].take().expect("a released op is pending");
        self.free_ops.push(id);
        c.wr_id = op.wr_id;
        (op.done, c)
    }
}

struct ClearOnDrop<'a>(&'a Cell<bool>);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}
