//! C API: `struct sqd_queue`, a managed send (and receive) queue.

use std::ffi::c_void;
use std::ptr;

use rdma_sys::{ibv_mr, ibv_mw, ibv_qp, ibv_recv_wr, ibv_send_wr};

use super::handle::{self, sqd_cq, sqd_queue, sqd_srq, HandlePtr};
use super::{fail, ffi_boundary, status, try_mut, try_ref};
use crate::completion::{Completion, ReleaseBatchC};
use crate::queue::{Deferred, InvalidateMode, Queue, QueueConfig, QueueStats};
use crate::release::ReleaseHandler;
use crate::verbs::control::Teardown;
use crate::verbs::{ForeignBatch, ForeignDeferred, ForeignRelease, QpHandle, RecvChain, SendChain};
use crate::Error;

/// A release callback: `c` is valid only during the call and is read-only (the library fills the same completion
/// again for the next release: copy what you keep). It runs on the thread that polls (or posts, defers or
/// drains) and may call the API again, including posting on the same queue.
pub type ReleaseFn = Option<unsafe extern "C" fn(ctx: *mut c_void, c: *const Completion)>;

/// A batch release callback (see `sqd_queue_set_release_batch`): `b` and its `wr_ids` are valid only during the
/// call and are read-only. It runs where a release callback would, and may call the API again as one may.
pub type ReleaseBatchFn = Option<unsafe extern "C" fn(ctx: *mut c_void, b: *const ReleaseBatchC)>;

/// A deferred action (see `sqd_defer`).
pub type DeferFn = Option<unsafe extern "C" fn(ctx: *mut c_void)>;

/// `sqd_queue_attr.flags`: checksum every SGE a SEND or RDMA WRITE reads (not inline data) when the WR is
/// accepted and again at its release; a difference sets `SQD_COMPLETION_BUFFER_MODIFIED` and `modified_sge` in
/// the release and counts in `sqd_queue_stats.verify_mismatches`. The bytes must stay readable until the
/// release. Costs about a cycle per byte twice; for debug and canary builds.
pub const SQD_QUEUE_VERIFY_BUFFERS: u32 = 1;
/// `sqd_queue_attr.flags`: `sqd_post_send` may leave the WRs it posted as it posted them instead of restoring
/// them before it returns. After a successful call their `wr_id` and `send_flags` are unspecified (the library's
/// token, and `IBV_SEND_SIGNALED` where the signal policy added it); after a failed one, the same holds for the
/// WRs before `*bad_wr`, while `*bad_wr` and the WRs after it are as you passed them. `next` is always as you
/// passed it. For ULPs that fill `wr_id` and `send_flags` of every WR before each post; it saves the walk that
/// restores the chain (about 10 instructions per WR). Releases and completions carry your wr_ids either way.
pub const SQD_QUEUE_NO_RESTORE: u32 = 2;
/// `sqd_queue_attr.flags`: the queue names each send WR by its index instead of its wr_id. A WR's index is how
/// many send WRs the queue accepted before it: 0 for the first, and a call that accepts k WRs gives them the
/// next k (on failure, the WRs before `*bad_wr`); `sqd_invalidate` takes none. Each WR is released exactly once
/// and in post order, so the n-th send release of the queue is always the WR of index n. The queue neither
/// keeps nor restores your wr_ids: a release's `wr_id`, the `wr_id` of a send completion `sqd_cq_poll` returns
/// (a WR you signaled, or an error) and `sqd_release_batch.first` are indexes, and a batch's `wr_ids` is NULL.
/// For ULPs that keep their per-WR state in post order (a ring indexed by the index modulo its size, say): it
/// saves storing each wr_id and handing it back (about 6 instructions per WR with batched releases) and the
/// batch array (`sqd_queue_set_release_batch`). Implies `SQD_QUEUE_NO_RESTORE`, and more: after a call of
/// `sqd_post_send`, the `wr_id` of every WR it was handed is unspecified, the WRs not accepted included.
pub const SQD_QUEUE_INDEXED: u32 = 4;
const QUEUE_FLAGS: u32 = SQD_QUEUE_VERIFY_BUFFERS | SQD_QUEUE_NO_RESTORE | SQD_QUEUE_INDEXED;

/// `sqd_invalidate` flag: post the LocalInv at once with `IBV_SEND_FENCE` (the Local Invalidate Fence), for
/// devices that honour it, instead of waiting for a completion that covers the earlier WRs.
pub const SQD_INVALIDATE_FENCE: u32 = 1;

/// How to manage a QP (`struct sqd_queue_attr`). Depths are what the QP was actually granted: read the caps
/// back from `ibv_create_qp`'s `init_attr.cap`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QueueAttr {
    /// The QP's `max_send_wr`: the library never lets the provider hold more WQEs. 1..=1048576.
    pub sq_depth: u32,
    /// The QP's `max_send_sge`: WRs with more SGEs are refused (`-EINVAL`). At most 1024.
    pub max_send_sge: u32,
    /// The QP's `max_inline_data`: inline WRs carrying more are refused (`-EINVAL`). At most 65536.
    pub max_inline_data: u32,
    /// The QP's `max_recv_wr` when its receives complete on a managed CQ (`recv_cq`), else 0. At most 1048576.
    pub rq_depth: u32,
    /// At most `signal_interval - 1` unsignaled WRs in a row; 0 picks `max(1, sq_depth / 4)`, which is 1 (every
    /// WR signaled, as with an explicit 1) below an `sq_depth` of 8. At most sq_depth.
    pub signal_interval: u32,
    /// How many WRs may wait in the software backlog when the SQ has no free slot; 0 makes such posts fail
    /// with `-EAGAIN`. At most 1048576. The copies of the waiting WRs are kept in the send CQ's backlog pool,
    /// shared by the queues whose sends complete on it (see `sqd_cq_set_backlog_limit`); this depth is the
    /// queue's own cap.
    pub backlog_depth: u32,
    /// Called once per accepted WR (and receive), in post order, when its resources may be reused. May be NULL.
    pub release: ReleaseFn,
    /// Passed to `release`.
    pub release_ctx: *mut c_void,
    /// `SQD_QUEUE_*` bits; unknown bits are refused (`-EINVAL`).
    pub flags: u32,
    /// The managed SRQ the QP receives from (`qp->srq`), or NULL. With an SRQ, `recv_cq` must be the QP's
    /// receive CQ and `rq_depth` 0; receives are posted with `sqd_srq_post_recv`.
    pub srq: *mut sqd_srq,
}

/// Puts the RC QP `qp` under management and stores the new queue in `*out`.
///
/// Its sends must complete on `send_cq` (`qp->send_cq`). Its receives are managed when `recv_cq` is non-NULL
/// (it must be `qp->recv_cq`, which may be the same handle as `send_cq`; `attr->rq_depth` > 0); pass NULL and
/// `rq_depth` 0 to post receives yourself on a CQ the library does not manage.
///
/// The queue reserves its worst case on each CQ: `sq_depth + 1` on the send CQ (every outstanding WR flushes
/// with its own CQE on QP error, plus a drain marker; `sq_depth` alone when the interval in force is 1, which
/// signals every WR and so never needs a marker: `signal_interval` 1, or 0 with `sq_depth` below 8) and
/// `rq_depth` on the receive CQ. If that does not fit in what the CQ
/// has left, it fails with `-ENOSPC` and `sqd_last_error()` names the numbers.
///
/// Its storage is allocated here, once (`sqd_queue_stats.bytes`): a slot record per SQ (and RQ) slot, and with
/// `SQD_QUEUE_VERIFY_BUFFERS` a checksum per SGE of every WR that may be in flight or parked. Parked WRs are
/// kept in the send CQ's backlog pool: when the pool lacks room for `backlog_depth` more WRs of this queue's
/// shape (room for `max_send_sge` SGEs and `max_inline_data` bytes each) and no limit set by
/// `sqd_cq_set_backlog_limit` stops it, the pool grows here by what it lacks, and the queue's `bytes` count
/// that growth. Large depths and limits together can ask for gigabytes: when an allocation fails it returns
/// `-ENOMEM`, and `sqd_last_error()` names the bytes that could not be allocated.
///
/// Ownership: `qp` stays the caller's and must outlive the queue. `attr` is copied. Thread safety: one thread at
/// a time, the one that uses the queue's CQs.
///
/// Returns 0, or `-EINVAL` (NULL argument, a depth of 0 or too large, `signal_interval > sq_depth`, unknown
/// `flags` bits, a QP that is not RC, a CQ that is not the QP's, receives through an SRQ, an `attr->srq` with a
/// thread-safe send or receive CQ: SRQs are managed on single-threaded CQs only), `-EBUSY` (the QP is
/// already managed on that CQ), `-ENOSPC` (CQ budget), `-ENOMEM` (see above), `-EIO` (`attr->srq` had its
/// receives released by `sqd_srq_release_all`).
#[no_mangle]
pub extern "C" fn sqd_queue_new(
    send_cq: *mut sqd_cq,
    recv_cq: *mut sqd_cq,
    qp: *mut ibv_qp,
    attr: *const QueueAttr,
    out: *mut *mut sqd_queue,
) -> i32 {
    ffi_boundary!({
        let out = try_mut!(out, "out");
        *out = ptr::null_mut();
        let send_cq = try_ref!(send_cq.object(), "send_cq");
        let _held = send_cq.lock().map(|l| l.lock());
        let attr = try_ref!(attr, "attr");
        // SAFETY: non-NULL handles come from `sqd_cq_new` (the caller's promise).
        let recv_cq = (!recv_cq.is_null()).then(|| unsafe { &*recv_cq.object() });
        if attr.flags & !QUEUE_FLAGS != 0 {
            return fail(&Error::invalid(format!(
                "attr->flags {:#x} has unknown bits {:#x}",
                attr.flags,
                attr.flags & !QUEUE_FLAGS
            )));
        }
        // SAFETY: the caller passes a valid QP (or NULL, rejected inside) that outlives the queue.
        let qp = match unsafe { QpHandle::from_raw(qp) } {
            Ok(q) => q,
            Err(e) => return fail(&e),
        };
        let config = QueueConfig {
            sq_depth: attr.sq_depth,
            max_send_sge: attr.max_send_sge,
            max_inline_data: attr.max_inline_data,
            rq_depth: attr.rq_depth,
            signal_interval: attr.signal_interval,
            backlog_depth: attr.backlog_depth,
            verify_buffers: attr.flags & SQD_QUEUE_VERIFY_BUFFERS != 0,
            no_restore: attr.flags & SQD_QUEUE_NO_RESTORE != 0,
            indexed: attr.flags & SQD_QUEUE_INDEXED != 0,
        };
        // SAFETY: the C caller promises `release` may be called with `release_ctx` while the queue exists.
        let release = attr.release.map(|f| ReleaseHandler::Foreign(unsafe { ForeignRelease::new(f, attr.release_ctx) }));
        let made = if attr.srq.is_null() {
            Queue::new(send_cq, recv_cq, qp, config, release)
        } else {
            // SAFETY: a non-NULL `srq` comes from `sqd_srq_new` (the caller's promise).
            let srq = unsafe { &*attr.srq.object() };
            match recv_cq {
                Some(r) => Queue::with_srq(send_cq, r, srq, qp, config, release),
                None => return fail(&Error::invalid("attr->srq is set but recv_cq is NULL: give the QP's receive CQ")),
            }
        };
        match made.and_then(|q| crate::alloc::boxed(q, "the queue handle")) {
            Ok(q) => {
                *out = handle::into_raw(q);
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// Frees a queue (not its QP). NULL is a no-op (returns 0), and so is the NULL a failed `sqd_queue_new` stores.
///
/// Returns 0, or `-EBUSY` (with a message in `sqd_last_error()`; the queue then stays valid) while WRs or
/// receives are outstanding (not yet released: poll, or drain, first) or the provider still holds a WQE of the
/// queue (a marker of the library's whose completion is not polled yet), while a QP on an SRQ may still
/// consume its receives (see `sqd_queue_async_event`), or when called from one of the queue's own callbacks
/// (release, deferred action, invalidation `done`). From a callback of another queue, even one of the same
/// CQ during its poll, an idle queue is freed normally. Free it before destroying its QP: the library's own
/// devices (`sqd_scripted_destroy_qp`, `sqd_sim_destroy_qp`) refuse with `-EBUSY` until then.
#[no_mangle]
pub extern "C" fn sqd_queue_free(q: *mut sqd_queue) -> i32 {
    ffi_boundary!({
        if q.is_null() {
            return 0;
        }
        let lock = try_ref!(q.object(), "q").lock().cloned();
        let _held = lock.as_deref().map(|l| l.lock());
        if let Err(e) = try_ref!(q.object(), "q").check_free() {
            return fail(&e);
        }
        // SAFETY: `q` came from `sqd_queue_new` (the caller's promise) and is freed once.
        unsafe { handle::free(q) };
        0
    })
}

/// Hands the queue's common releases to `fn` in batches from now on, for ULPs that finish their WRs in bulk:
/// the WRs the ULP posted that are released one after the other with the same status and vendor error (the
/// successes a signaled CQE retires, mostly) go to one call of `fn(ctx, batch)`, oldest first, instead of one
/// call each of the queue's `release`.
///
/// Every other release still goes to `release`, one per WR: receives, WRs released as never posted or refused
/// (`SQD_COMPLETION_NEVER_POSTED`, `SQD_COMPLETION_REFUSED`), every release of a queue that verifies buffers
/// (`SQD_QUEUE_VERIFY_BUFFERS`), and a common release too wherever the library finds that simpler. Handle any
/// release in `release` as well: between them, each WR is released exactly once and in post order, and a
/// deferred action (`sqd_defer`, `sqd_defer_mr`) still runs right after the last release it waits for. A batch
/// carries no opcode and does not say which WR's own CQE retired it; a ULP that needs those keeps to
/// `release` alone. Inside `fn`, `sqd_queue_stats` counts the whole batch as released.
///
/// Set it at most once, outside the queue's own callbacks; it stays for the queue's life. The queue must have
/// a `release` callback (it gets the releases a batch cannot carry). Costs 8 bytes per SQ slot (counted in
/// `sqd_queue_stats.bytes`), none on a queue with `SQD_QUEUE_INDEXED`.
///
/// Returns 0, or `-EINVAL` (NULL `q` or `fn`; the queue has no `release`), `-EBUSY` (already set; called from
/// one of the queue's own callbacks), `-ENOMEM`.
#[no_mangle]
pub extern "C" fn sqd_queue_set_release_batch(q: *mut sqd_queue, r#fn: ReleaseBatchFn, ctx: *mut c_void) -> i32 {
    ffi_boundary!({
        let q = try_ref!(q.object(), "q");
        let _held = q.lock().map(|l| l.lock());
        let Some(f) = r#fn else { return fail(&Error::invalid("fn is NULL")) };
        // SAFETY: the C caller promises `fn` may be called with `ctx` and a batch while the queue exists.
        status(q.set_release_batch_foreign(unsafe { ForeignBatch::new(f, ctx) }))
    })
}

/// `sqd_queue_set_release_batch` for ULPs that have nothing to do when their WRs succeed (they learn of the
/// successes from the completions they signaled, say): a batch of successes is released without a call, and
/// `fn(ctx, batch)` gets the batches of failures only (a WR's own error, then the flushes behind it), each with
/// one status and vendor error, oldest first. A success is still counted in `sqd_queue_stats.released` and
/// still lets a deferred action that waits for it run in its place. A success's buffers may be reused once it
/// is released: by the time `sqd_cq_poll` returns the completion of a WR you signaled (when not called from
/// one of the queue's own callbacks), that WR and every WR posted before it on the queue are.
///
/// Everything else is as with `sqd_queue_set_release_batch`: every release a batch cannot carry still goes to
/// `release` (successes among them, wherever the library releases them one by one), between them each WR that
/// gets a call gets exactly one and in post order, and the queue must have a `release` callback. Set at most
/// one of the two, at most once, outside the queue's own callbacks. Saves gathering the batch's wr_ids and the
/// call for each completion that retires only successes.
///
/// Returns 0, or `-EINVAL` (NULL `q` or `fn`; the queue has no `release`), `-EBUSY` (a batch callback is
/// already set; called from one of the queue's own callbacks), `-ENOMEM`.
#[no_mangle]
pub extern "C" fn sqd_queue_set_release_failures(q: *mut sqd_queue, r#fn: ReleaseBatchFn, ctx: *mut c_void) -> i32 {
    ffi_boundary!({
        let q = try_ref!(q.object(), "q");
        let _held = q.lock().map(|l| l.lock());
        let Some(f) = r#fn else { return fail(&Error::invalid("fn is NULL")) };
        // SAFETY: the C caller promises `fn` may be called with `ctx` and a batch while the queue exists.
        status(q.set_release_failures_foreign(unsafe { ForeignBatch::new(f, ctx) }))
    })
}

/// Hands a chain of send WRs to the queue instead of `ibv_post_send`.
///
/// Each WR in turn is checked, then either posted (the WRs posted by one call go to the provider in runs of up
/// to 64 per doorbell) or, when the SQ has no free slot, copied into the backlog (WR, SGE list and inline data: you may
/// reuse the structs and inline buffers at once) to be posted in order as completions free slots. Either way
/// it is accepted: it will get exactly one release. The library owns the wr_id and may add
/// `IBV_SEND_SIGNALED`; your chain is restored exactly before the call returns (on a queue with
/// `SQD_QUEUE_NO_RESTORE`, only its links and the WRs not accepted are).
///
/// Until its release, a WR's data buffers, lkeys and MRs must stay valid and unchanged: the HCA may read them
/// again for a retransmission.
///
/// On failure `*bad_wr` is the first WR not accepted: the WRs before it were accepted, it and all after it
/// were not, as with `ibv_post_send`. Returns 0 (and `*bad_wr = NULL`), or `-EINVAL` (NULL argument; an
/// opcode not valid on RC; unknown `send_flags` bits; `num_sge` above `max_send_sge` or negative; NULL
/// `sg_list`; inline data above `max_inline_data` or with an opcode that cannot carry it; an atomic whose SGEs
/// do not total exactly 8 bytes or whose `remote_addr` is not 8-byte aligned; a BIND_MW with a NULL
/// `bind_mw.mw`), `-EAGAIN` (no SQ slot, and the backlog is full or disabled, or the send CQ's backlog pool is
/// at its limit, `sqd_cq_set_backlog_limit`), `-EIO` (the queue failed or is
/// draining), or the provider's negated errno when its `post_send` refused a WR this call posted (that WR
/// is `*bad_wr`; the WRs before it stay posted and will be released, even unsignaled ones, without more posts).
///
/// A backlogged WR is posted later, as completions free slots (within `sqd_cq_poll`, or any call that hands out
/// releases); if the provider's `post_send` refuses it then (a WR these checks accept but the provider does not
/// support), it is not retried: it is released, after the WRs
/// posted before it, with `IBV_WC_LOC_QP_OP_ERR`, `SQD_COMPLETION_REFUSED | SQD_COMPLETION_NEVER_POSTED` and
/// the provider's errno in `vendor_err`; `sqd_queue_stats` counts it (`provider_refused`,
/// `provider_refused_errno`) and `sqd_queue_last_refusal` describes it. It is not shown by `sqd_cq_poll`. The
/// queue stays open and the WRs behind it are posted in order.
#[no_mangle]
pub extern "C" fn sqd_post_send(q: *mut sqd_queue, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> i32 {
    ffi_boundary!({
        // The common call (a queue, a chain, `bad_wr`, no lock) goes straight to the post; every other one through
        // `post_send_general`, which takes the lock before it checks the chain.
        // SAFETY: a non-NULL `q` came from `sqd_queue_new` and is not being freed (the caller's promise).
        if q.is_null() || wr.is_null() || bad_wr.is_null() || unsafe { &*q.object() }.is_locked() {
            return post_send_general(q, wr, bad_wr);
        }
        // SAFETY: not NULL, checked above; `*bad_wr` is the caller's for the duration of the call.
        let bad_wr = unsafe { &mut *bad_wr };
        *bad_wr = wr;
        // SAFETY: as above; `q` is not NULL.
        let q = unsafe { &*q.object() };
        // SAFETY: the caller lends a valid chain for the duration of the call, as `ibv_post_send` requires.
        let chain = unsafe { SendChain::from_raw(wr) };
        post_send_result(q, chain, bad_wr)
    })
}

/// The end of `sqd_post_send`: posts `chain` and sets `*bad_wr` (NULL, or the first WR not posted).
#[inline(always)]
fn post_send_result(q: &Queue, chain: SendChain<'_>, bad_wr: &mut *mut ibv_send_wr) -> i32 {
    let bad: *mut *mut ibv_send_wr = bad_wr;
    q.post_send_then(
        chain,
        || {
            // SAFETY: `bad` is the caller's `bad_wr`, valid for the call (borrowed by this function).
            unsafe { *bad = ptr::null_mut() };
            0
        },
        |e| {
            // SAFETY: as above.
            unsafe { *bad = e.bad.as_ptr() };
            fail(&e.error)
        },
    )
}

/// `sqd_post_send` for a queue on a thread-safe CQ or a call the common one does not cover (a NULL argument).
#[cold]
#[inline(never)]
fn post_send_general(q: *mut sqd_queue, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> i32 {
    let bad_wr = try_mut!(bad_wr, "bad_wr");
    *bad_wr = wr;
    let q = try_ref!(q.object(), "q");
    let _held = q.lock().map(|l| l.lock());
    if wr.is_null() {
        return fail(&Error::invalid("wr is NULL"));
    }
    // SAFETY: the caller lends a valid chain for the duration of the call, as `ibv_post_send` requires.
    let chain = unsafe { SendChain::from_raw(wr) };
    post_send_result(q, chain, bad_wr)
}

/// Posts a chain of receives on a queue that manages them (`rq_depth` > 0), instead of `ibv_post_recv`.
///
/// Each receive gets exactly one release (flag `SQD_COMPLETION_RECV`), in post order, and its completion is
/// returned by `sqd_cq_poll` with your wr_id. On failure `*bad_wr` is the first receive not posted. Returns 0,
/// or `-EINVAL` (NULL argument, queue without managed receives, bad `num_sge`/`sg_list`), `-EAGAIN` (more
/// receives than `rq_depth` outstanding), `-EIO` (an asynchronous event released the queue), or the provider's
/// negated errno.
#[no_mangle]
pub extern "C" fn sqd_post_recv(q: *mut sqd_queue, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> i32 {
    ffi_boundary!({
        let bad_wr = try_mut!(bad_wr, "bad_wr");
        *bad_wr = wr;
        let q = try_ref!(q.object(), "q");
        let _held = q.lock().map(|l| l.lock());
        if wr.is_null() {
            return fail(&Error::invalid("wr is NULL"));
        }
        // SAFETY: the caller lends a valid receive chain for the duration of the call.
        let chain = unsafe { RecvChain::from_raw(wr) };
        match q.post_recv(chain) {
            Ok(()) => {
                *bad_wr = ptr::null_mut();
                0
            }
            Err(e) => {
                *bad_wr = e.bad.as_ptr();
                fail(&e.error)
            }
        }
    })
}

/// A completion barrier: runs `fn(ctx)` once every send WR accepted on the queue so far is released — right
/// after the last of those releases, before any later one. If they all are already, it runs before this call
/// returns. Deferred MR deregistration or invalidation and "buffer may be reused" hooks are built on it.
///
/// Returns 0, or `-EINVAL` (NULL `q` or `fn`), `-ENOMEM` (no room for the action could be allocated; `fn`
/// will not be called).
#[no_mangle]
pub extern "C" fn sqd_defer(q: *mut sqd_queue, r#fn: DeferFn, ctx: *mut c_void) -> i32 {
    ffi_boundary!({
        let q = try_ref!(q.object(), "q");
        let _held = q.lock().map(|l| l.lock());
        let Some(f) = r#fn else { return fail(&Error::invalid("fn is NULL")) };
        // SAFETY: the C caller promises `fn` may be called once with `ctx`.
        status(q.defer(Deferred::Foreign(unsafe { ForeignDeferred::new(f, ctx) })))
    })
}

/// Brings the queue to "everything released", as the kernel's drain does.
///
/// Move the QP to the error state first (so outstanding WRs flush) or not (they complete normally). From
/// this call on the queue takes no new WRs (`-EIO`); an unsignaled tail is covered at once by a signaled
/// marker so a CQE proves every posted WR finished; WRs still in the backlog are released as never posted
/// (`SQD_COMPLETION_NEVER_POSTED`, `IBV_WC_WR_FLUSH_ERR`) after the posted ones. Receives are released as their
/// (flush) completions arrive. Invalidations `sqd_invalidate` still holds back (waiting for a covering
/// completion) are cancelled: their `done` callback gets `IBV_WC_WR_FLUSH_ERR` with
/// `SQD_COMPLETION_NEVER_POSTED`, and their rkey was never invalidated, so it stays valid. The call never
/// blocks.
///
/// Returns 0 when every WR and receive is released and the provider holds none of the queue's WQEs (the
/// library's markers included: the queue may then be freed), `-EINPROGRESS` while completions are still to be
/// polled (poll the CQ, then call again; the message says what is left), `-EINVAL` (NULL), or `-EIO` (the
/// marker could not be posted).
#[no_mangle]
pub extern "C" fn sqd_queue_drain(q: *mut sqd_queue) -> i32 {
    ffi_boundary!({
        let q = try_ref!(q.object(), "q");
        let _held = q.lock().map(|l| l.lock());
        status(q.drain())
    })
}

/// Copies the description of the newest WR the provider refused after the queue had accepted it (see
/// `sqd_post_send` and `SQD_COMPLETION_REFUSED`: which WR, the errno, what became of it) into `buf`, as a
/// NUL-terminated string cut to `len - 1` bytes; nothing is written when `len` is 0.
///
/// Returns the length of the whole description (without the NUL; 0 and an empty string when the provider
/// refused nothing so far), or `-EINVAL` (NULL `q`, NULL `buf` with `len` > 0).
#[no_mangle]
pub extern "C" fn sqd_queue_last_refusal(q: *const sqd_queue, buf: *mut std::ffi::c_char, len: usize) -> i32 {
    ffi_boundary!({
        let q = try_ref!(q.object(), "q");
        let _held = q.lock().map(|l| l.lock());
        if buf.is_null() && len > 0 {
            return fail(&Error::invalid("buf is NULL and len is not 0"));
        }
        let text = q.last_refusal().unwrap_or_default();
        if len > 0 {
            let n = text.len().min(len - 1);
            // SAFETY: the caller promises `buf` holds `len` writable bytes; `n < len`.
            unsafe {
                ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
        i32::try_from(text.len()).unwrap_or(i32::MAX)
    })
}

/// Copies the queue's counters and state into `*out`. Returns 0 or `-EINVAL` (NULL argument).
#[no_mangle]
pub extern "C" fn sqd_queue_stats(q: *const sqd_queue, out: *mut QueueStats) -> i32 {
    ffi_boundary!({
        let q = try_ref!(q.object(), "q");
        let _held = q.lock().map(|l| l.lock());
        let out = try_mut!(out, "out");
        *out = q.stats();
        0
    })
}

/// Invalidates `rkey` (an MR or memory window the ULP exposed to its peer) at the first moment it is safe, and
/// reports when the invalidation itself has completed.
///
/// Without flags the `IBV_WR_LOCAL_INV` is posted only once a completion covers every WR accepted on the queue
/// before this call: a LocalInv is not ordered behind earlier WRs (IBA Table 79, 'L'), so posting it at once
/// could invalidate keys an earlier, not yet acknowledged WR still needs for a retransmission. With
/// `SQD_INVALIDATE_FENCE` it is posted now with `IBV_SEND_FENCE` (the Local Invalidate Fence), for devices
/// that honour it; when no SQ slot is free, or WRs accepted earlier wait in the backlog (it never overtakes
/// them), it is parked behind them and posted, fenced, in post order. Either way it is signaled and its
/// completion is not shown by `sqd_cq_poll`; `done` (may be NULL) then receives `wr_id`, opcode `IBV_WC_LOCAL_INV` and the status (`IBV_WC_WR_FLUSH_ERR` with
/// `SQD_COMPLETION_NEVER_POSTED` if the queue failed or drained first; `IBV_WC_LOC_QP_OP_ERR` with
/// `SQD_COMPLETION_REFUSED | SQD_COMPLETION_NEVER_POSTED` and the errno in `vendor_err` if the provider's
/// `post_send` refused the LocalInv). Once `done` reports success, no
/// remote access with `rkey` can succeed. A `sqd_defer` registered after this call does not wait for the
/// LocalInv unless it had been posted by then: use `done`.
///
/// If the peer already invalidated the rkey with SEND_WITH_INV, the receive's release says so
/// (`SQD_COMPLETION_REMOTE_INV`, `invalidated_rkey`) and no LocalInv is needed.
///
/// Unfenced invalidations wait in the queue, not in the SQ or the backlog, so any number may be pending
/// however full those are: each takes a small record (a few dozen bytes) from the heap until its `done` ran,
/// and that memory is not counted in `sqd_queue_stats.bytes`. The records are kept for reuse, so a steady
/// state allocates nothing.
///
/// Returns 0, or `-EINVAL` (NULL `q`, unknown flags), `-EIO` (the queue failed or is draining), `-EAGAIN`
/// (fenced, it cannot be posted now, since no SQ slot is free or WRs wait in the backlog, and cannot be
/// parked: the queue's backlog is full, or the send CQ's backlog pool is at its limit; nothing is recorded and
/// `done` is not called), `-ENOMEM` (no room to record it could be allocated:
/// nothing is posted and `done` is not called).
#[no_mangle]
pub extern "C" fn sqd_invalidate(q: *mut sqd_queue, rkey: u32, wr_id: u64, flags: u32, done: ReleaseFn, done_ctx: *mut c_void) -> i32 {
    ffi_boundary!({
        let q = try_ref!(q.object(), "q");
        let _held = q.lock().map(|l| l.lock());
        if flags & !SQD_INVALIDATE_FENCE != 0 {
            return fail(&Error::invalid(format!("flags {flags:#x} has unknown bits")));
        }
        let mode = if flags & SQD_INVALIDATE_FENCE != 0 { InvalidateMode::Fenced } else { InvalidateMode::Deferred };
        // SAFETY: the C caller promises `done` may be called once with `done_ctx`.
        let done = done.map(|f| ReleaseHandler::Foreign(unsafe { ForeignRelease::new(f, done_ctx) }));
        status(q.invalidate(rkey, mode, wr_id, done))
    })
}

/// Tracks the uses of `mr` on this queue precisely: from now on the queue remembers the newest WR whose SGEs
/// name `mr->lkey`, so `sqd_defer_mr` and `sqd_defer_dereg_mr` on it wait only for the WRs that use it instead
/// of every WR accepted so far. The WRs accepted before this call were not looked at: until each of them is
/// released it counts as a use, so tracking an MR that WRs in flight read never lets it go early. Costs a scan
/// of the tracked MRs for each SGE posted: track the few MRs you tear down while traffic continues, not every
/// MR. An MR stays tracked until `sqd_queue_untrack_mr`, or until the deregistration of `sqd_defer_dereg_mr`
/// on this queue has run.
///
/// Returns 0, or `-EINVAL` (NULL argument), `-EEXIST` (already tracked), `-ENOMEM`.
#[no_mangle]
pub extern "C" fn sqd_queue_track_mr(q: *mut sqd_queue, mr: *const ibv_mr) -> i32 {
    ffi_boundary!({
        let q = try_ref!(q.object(), "q");
        let _held = q.lock().map(|l| l.lock());
        let mr = try_ref!(mr, "mr");
        status(q.track_mr(mr.lkey))
    })
}

/// Stops tracking `mr`. Returns 0, or `-EINVAL` (NULL argument), `-ENOENT` (not tracked).
#[no_mangle]
pub extern "C" fn sqd_queue_untrack_mr(q: *mut sqd_queue, mr: *const ibv_mr) -> i32 {
    ffi_boundary!({
        let q = try_ref!(q.object(), "q");
        let _held = q.lock().map(|l| l.lock());
        let mr = try_ref!(mr, "mr");
        status(q.untrack_mr(mr.lkey))
    })
}

/// Runs `fn(ctx)` once no in-flight WR of the queue can reference `mr`: when `mr` is tracked
/// (`sqd_queue_track_mr`), right after the release of the newest WR whose SGEs use it or of the last WR
/// accepted before it was tracked, whichever was accepted later; else after every WR accepted so far; at once
/// if that is already so. "Buffer may be reused" hooks for one MR build on it.
///
/// Returns 0, or `-EINVAL` (NULL `q`, `mr` or `fn`), `-ENOMEM` (as for `sqd_defer`).
#[no_mangle]
pub extern "C" fn sqd_defer_mr(q: *mut sqd_queue, mr: *const ibv_mr, r#fn: DeferFn, ctx: *mut c_void) -> i32 {
    ffi_boundary!({
        let q = try_ref!(q.object(), "q");
        let _held = q.lock().map(|l| l.lock());
        let mr = try_ref!(mr, "mr");
        let Some(f) = r#fn else { return fail(&Error::invalid("fn is NULL")) };
        // SAFETY: the C caller promises `fn` may be called once with `ctx`.
        status(q.defer_mr(mr.lkey, Deferred::Foreign(unsafe { ForeignDeferred::new(f, ctx) })))
    })
}

/// Deregisters `mr` (`ibv_dereg_mr`, or the software HCA's equivalent for its MRs) once no in-flight WR of the
/// queue can reference it, as `sqd_defer_mr` would run an action. Ownership of `mr` passes to the queue: do not
/// use or deregister it yourself afterwards. If `mr` is tracked on this queue (`sqd_queue_track_mr`), the queue
/// untracks it when the deregistration has run (`sqd_queue_stats.tracked_mrs` drops; a later MR with the same
/// lkey may be tracked); untrack it yourself, before this call, on any other queue that tracks it. A failed
/// deregistration counts in `sqd_queue_stats.teardown_failures` (the MR is untracked all the same).
///
/// Returns 0, or `-EINVAL` (NULL argument), `-ENOMEM` (no room for the deregistration could be allocated:
/// `mr` stays yours).
#[no_mangle]
pub extern "C" fn sqd_defer_dereg_mr(q: *mut sqd_queue, mr: *mut ibv_mr) -> i32 {
    ffi_boundary!({
        let q = try_ref!(q.object(), "q");
        let _held = q.lock().map(|l| l.lock());
        let lkey = try_ref!(mr, "mr").lkey;
        // SAFETY: the caller hands `mr` over to be deregistered once, later.
        status(q.defer_teardown(Some(lkey), unsafe { Teardown::dereg_mr(mr) }))
    })
}

/// Deallocates the memory window `mw` (`ibv_dealloc_mw`, through its context's ops) once every WR accepted on
/// the queue so far is released. Ownership of `mw` passes to the queue. A failure counts in
/// `sqd_queue_stats.teardown_failures`.
///
/// Returns 0, or `-EINVAL` (NULL argument), `-ENOMEM` (no room for the deallocation could be allocated:
/// `mw` stays yours).
#[no_mangle]
pub extern "C" fn sqd_defer_dealloc_mw(q: *mut sqd_queue, mw: *mut ibv_mw) -> i32 {
    ffi_boundary!({
        let q = try_ref!(q.object(), "q");
        let _held = q.lock().map(|l| l.lock());
        if mw.is_null() {
            return fail(&Error::invalid("mw is NULL"));
        }
        // SAFETY: the caller hands `mw` over to be deallocated once, later.
        status(q.defer_teardown(None, unsafe { Teardown::dealloc_mw(mw) }))
    })
}

/// Tells the queue about an asynchronous event of its QP (`type` is an `enum ibv_event_type` value, as read by
/// `ibv_get_async_event`).
///
/// `IBV_EVENT_QP_FATAL`, `IBV_EVENT_QP_REQ_ERR`, `IBV_EVENT_QP_ACCESS_ERR`: the QP is in the error state, the
/// HCA no longer executes its WRs, and its CQ may deliver no flush completion at all: the queue fails and
/// releases at once, in post order, every posted WR and receive with `IBV_WC_WR_FLUSH_ERR` and every
/// backlogged WR as never posted; completions that still arrive for them are swallowed (counted in
/// `late_cqes`), also after `sqd_queue_free`, however many queues were freed this way: each CQ remembers, per
/// freed queue, the WQEs and receives the provider held at the event and no completion has covered since, and
/// drops their completions as strays (`sqd_cq_stats.stray`) instead of passing them through to the ULP. It
/// forgets the queue once the completion of the last of them arrived, or when a new queue on the CQ takes its
/// QP number (a device reuses a number only for a new QP, and destroying a QP removes its completions from its
/// CQs), so what it keeps is bounded by what can still arrive. Release callbacks run inside this call.
/// `IBV_EVENT_COMM_EST`, `IBV_EVENT_SQ_DRAINED`, `IBV_EVENT_PATH_MIG`, `IBV_EVENT_QP_LAST_WQE_REACHED`:
/// nothing to do.
///
/// Returns 0, or `-EINVAL` (NULL `q`, an event that is not a QP's).
#[no_mangle]
pub extern "C" fn sqd_queue_async_event(q: *mut sqd_queue, r#type: u32) -> i32 {
    ffi_boundary!({
        let q = try_ref!(q.object(), "q");
        let _held = q.lock().map(|l| l.lock());
        status(q.on_async_event(r#type))
    })
}
