//! C API: `struct sqd_cq`, a managed completion queue.
//!
//! Thread-safe CQs: every function here and in `queue.rs` takes the CQ's reentrant lock (`_held`) before
//! touching the CQ or a queue on it. The library's objects are single-threaded (`Rc`, `RefCell`); the lock
//! serialises every access to them, reference counts included, so no two threads ever touch them at once.

use rdma_sys::{ibv_cq, ibv_wc};

use super::handle::{self, sqd_cq, HandlePtr};
use super::{fail, ffi_boundary, status, try_mut, try_ref};
use crate::cq::{BacklogPoolStats, Cq, CqStats, OutOfOrder};
use crate::verbs::CqHandle;
use crate::Error;

/// Takes `cq` under management and stores the new handle in `*out`: `sqd_cq_new_ex` with no flags.
#[no_mangle]
pub extern "C" fn sqd_cq_new(cq: *mut ibv_cq, out: *mut *mut sqd_cq) -> i32 {
    sqd_cq_new_ex(cq, 0, out)
}

/// `sqd_cq_new_ex` flag: any thread may post to the CQ's queues (and free, defer, drain...) while one thread
/// polls. Every call on the CQ or on its queues then holds the CQ's lock; release callbacks run under it and may
/// call the API on the same CQ again (the lock is reentrant), but must not wait for another thread that uses
/// the CQ. Queues on a thread-safe CQ have their sends and receives on that one CQ.
///
/// In event mode the poller may sleep on the channel while other threads post: a post made after
/// `sqd_cq_arm` and before the next `sqd_cq_poll` that leaves an unsignaled tail covers it at once with a
/// signaled marker, so its WRs still produce a completion that raises the event (see `sqd_cq_arm`).
pub const SQD_CQ_THREAD_SAFE: u32 = 1;

/// Takes `cq` under management and stores the new handle in `*out`.
///
/// The capacity is `cq->cqe`, the depth the provider granted. Queues attached to the CQ reserve their worst
/// case on it (see `sqd_queue_new`); CQEs of QPs that are not managed on it are passed through unchanged.
///
/// Ownership: `cq` stays the caller's and must outlive the handle; free the handle with `sqd_cq_free` before
/// destroying `cq`. Thread safety: by default a `struct sqd_cq` and the queues on it are used from one thread
/// at a time (the poll-group model) and nothing is locked; with `SQD_CQ_THREAD_SAFE` any thread may use them.
///
/// Returns 0, or `-EINVAL` (NULL argument, unknown flags, a CQ without a provider context or `poll_cq` op,
/// `cqe <= 0`), `-ENOMEM` (the handle could not be allocated; `sqd_last_error()` names the bytes).
#[no_mangle]
pub extern "C" fn sqd_cq_new_ex(cq: *mut ibv_cq, flags: u32, out: *mut *mut sqd_cq) -> i32 {
    ffi_boundary!({
        let out = try_mut!(out, "out");
        *out = std::ptr::null_mut();
        if flags & !SQD_CQ_THREAD_SAFE != 0 {
            return fail(&Error::invalid(format!("flags {flags:#x} has unknown bits")));
        }
        // SAFETY: the caller passes a valid CQ (or NULL, rejected inside) that outlives the handle, as documented.
        let handle = match unsafe { CqHandle::from_raw(cq) } {
            Ok(h) => h,
            Err(e) => return fail(&e),
        };
        match crate::alloc::boxed(Cq::with_lock(handle, flags & SQD_CQ_THREAD_SAFE != 0), "the CQ handle") {
            Ok(b) => {
                *out = handle::into_raw(b);
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// Frees a handle made by `sqd_cq_new` (not the `ibv_cq` under it). NULL is a no-op (returns 0).
///
/// Returns 0, or `-EBUSY` (with a message in `sqd_last_error()`) while queues are attached (free them first,
/// in any order) or when called from a callback run by this CQ's poll; the handle then stays valid. Free it
/// before destroying its `ibv_cq`: the library's own devices (`sqd_scripted_destroy_cq`, `sqd_sim_destroy_cq`)
/// refuse with `-EBUSY` until then, a real provider cannot tell.
#[no_mangle]
pub extern "C" fn sqd_cq_free(cq: *mut sqd_cq) -> i32 {
    ffi_boundary!({
        if cq.is_null() {
            return 0;
        }
        let lock = try_ref!(cq.object(), "cq").lock().cloned();
        let _held = lock.as_deref().map(|l| l.lock());
        if let Err(e) = try_ref!(cq.object(), "cq").check_free() {
            return fail(&e);
        }
        // SAFETY: `cq` came from `sqd_cq_new` (caller's promise) and is freed once.
        unsafe { handle::free(cq) };
        0
    })
}

/// Polls up to `max` work completions into `wc` and returns how many it stored (0 when there are none).
///
/// They are exactly the completions raw verbs would have given the ULP for the WRs it posted through its
/// queues: receive completions, send completions of WRs posted with `IBV_SEND_SIGNALED`, and every error or
/// flush completion, each with the ULP's own `wr_id` (a send's index on a queue made with `SQD_QUEUE_INDEXED`;
/// on error completions only `wr_id`, `status`, `qp_num` and `vendor_err` are valid, as in verbs). Completions
/// the library added for moderation are not shown.
///
/// Meanwhile it runs the release callbacks and deferred actions the reaped CQEs make due (in post order per
/// queue), posts backlogged WRs as credits return, and covers idle unsignaled tails: a queue that has an
/// unsignaled tail and receives no post during one whole poll cycle gets a signaled zero-length RDMA WRITE.
/// So every WR is covered by a signaled WQE, without further posts, no later than the end of the second
/// `sqd_cq_poll` after it reached the SQ (in the post call, or in the poll that moved it from the backlog), or
/// at once by `sqd_cq_arm` or, while the CQ is armed, by its post call, and is released when that WQE's CQE is
/// polled.
///
/// A provider that completes a QP's send WQEs out of RC order breaks what the library builds on: the CQE of a
/// WQE retires every earlier WQE of its QP, and those WRs are released then. When a CQE then arrives for such
/// an earlier WQE (its own completion came after a later one's), the library shows it with the WR's `wr_id` if
/// you signaled that WR and its completion was not shown before, since that is the completion you wait for;
/// otherwise it drops it (counted in `sqd_cq_stats.stray` and `sqd_queue_stats.stray_cqes`). An error status
/// fails the queue, as any error completion does. It counts every such completion and keeps the first one's
/// QP number, WQE, `wr_id`, opcode and status in `sqd_cq_out_of_order`, described once in
/// `sqd_cq_out_of_order_message`. The WR was already released when the later completion came: on such a
/// provider a release does not prove the HCA is done with the WR's buffers.
///
/// Callbacks may post, defer and poll other CQs; calling `sqd_cq_poll` on this same CQ from one of them
/// returns `-EBUSY`. One call reaps at most a full CQ (its capacity) of CQEs beyond `max`, so callbacks that
/// keep posting cannot hold it forever: it may then return fewer than `max` while CQEs remain (poll again).
/// Every CQE present when the call began is reaped, so `sqd_cq_arm` returning 0 still means nothing was missed.
///
/// Returns the count (>= 0), or `-EINVAL` (NULL `cq`, `max < 0`, NULL `wc` with `max > 0`), `-EBUSY`
/// (re-entered), `-EIO` (the provider's poll failed: the CQ is in error).
#[no_mangle]
pub extern "C" fn sqd_cq_poll(cq: *mut sqd_cq, max: i32, wc: *mut ibv_wc) -> i32 {
    ffi_boundary!({
        // The common call (a CQ, room for completions, an array, no lock) goes straight to the poll; every other
        // one through `poll_general`, which takes the lock before it checks the other arguments.
        // SAFETY: a non-NULL `cq` came from `sqd_cq_new` and is not being freed (the caller's promise).
        // The lock and the re-entry are tested with one load (`is_open`).
        if cq.is_null() || max <= 0 || wc.is_null() || !unsafe { &*cq.object() }.shared.is_open() {
            return poll_general(cq, max, wc);
        }
        // SAFETY: as above; `cq` is not NULL.
        let cq = unsafe { &*cq.object() };
        // SAFETY: the caller provides an array of `max` writable `struct ibv_wc`.
        let out = unsafe { std::slice::from_raw_parts_mut(wc, max as usize) };
        cq.shared.poll_open(out, |n| n as i32, fail_with)
    })
}

/// `sqd_cq_poll` for a thread-safe CQ or a call the common one does not cover (`max <= 0`, NULL `wc`, a poll
/// from one of the CQ's callbacks, which `poll` refuses).
#[cold]
#[inline(never)]
fn poll_general(cq: *mut sqd_cq, max: i32, wc: *mut ibv_wc) -> i32 {
    let cq = try_ref!(cq.object(), "cq");
    let _held = cq.lock().map(|l| l.lock());
    if max < 0 {
        return fail(&Error::invalid(format!("max is {max}; it must be >= 0")));
    }
    if max == 0 {
        return 0;
    }
    if wc.is_null() {
        return fail(&Error::invalid("wc is NULL"));
    }
    // SAFETY: the caller provides an array of `max` writable `struct ibv_wc`.
    let out = unsafe { std::slice::from_raw_parts_mut(wc, max as usize) };
    match cq.poll(out) {
        Ok(n) => n as i32,
        Err(e) => fail(&e),
    }
}

/// `fail` for an error the caller no longer needs, kept out of the common poll.
#[cold]
#[inline(never)]
fn fail_with(e: Error) -> i32 {
    fail(&e)
}

/// Call after `ibv_resize_cq` on a managed CQ: the library re-reads the capacity the provider now reports
/// (`cq->cqe`) and checks queues attached from now on against it.
///
/// Returns 0, or `-EINVAL` (NULL `cq`), `-ENOSPC` when the CQ was shrunk below what its attached queues
/// reserve (the new capacity is in force: a flush of them all could overrun it; `sqd_last_error()` names the
/// numbers).
#[no_mangle]
pub extern "C" fn sqd_cq_update_capacity(cq: *const sqd_cq) -> i32 {
    ffi_boundary!({
        let cq = try_ref!(cq.object(), "cq");
        let _held = cq.lock().map(|l| l.lock());
        status(cq.update_capacity().map(|_| ()))
    })
}

/// Copies the CQ's counters into `*out`. Returns 0 or `-EINVAL` (NULL argument).
#[no_mangle]
pub extern "C" fn sqd_cq_stats(cq: *const sqd_cq, out: *mut CqStats) -> i32 {
    ffi_boundary!({
        let cq = try_ref!(cq.object(), "cq");
        let _held = cq.lock().map(|l| l.lock());
        let out = try_mut!(out, "out");
        *out = cq.stats();
        status(Ok(()))
    })
}

/// Copies into `*out` how many completions of the CQ's queues came out of RC order (see `sqd_cq_poll`) and
/// what the first one was: its QP number, WQE, `wr_id`, opcode, status and `SQD_OUT_OF_ORDER_*` flags. All
/// zero while none did. Returns 0 or `-EINVAL` (NULL argument).
#[no_mangle]
pub extern "C" fn sqd_cq_out_of_order(cq: *const sqd_cq, out: *mut OutOfOrder) -> i32 {
    ffi_boundary!({
        let cq = try_ref!(cq.object(), "cq");
        let _held = cq.lock().map(|l| l.lock());
        let out = try_mut!(out, "out");
        *out = cq.out_of_order();
        0
    })
}

/// Copies the description of the CQ's first completion out of RC order (see `sqd_cq_poll`: which QP and WQE,
/// and what the library did with it) into `buf`, as a NUL-terminated string cut to `len - 1` bytes; nothing is
/// written when `len` is 0. The description stays that of the first one; `sqd_cq_out_of_order` counts them.
///
/// Returns the length of the whole description (without the NUL; 0 and an empty string while none came out of
/// order), or `-EINVAL` (NULL `cq`, NULL `buf` with `len` > 0).
#[no_mangle]
pub extern "C" fn sqd_cq_out_of_order_message(cq: *const sqd_cq, buf: *mut std::ffi::c_char, len: usize) -> i32 {
    ffi_boundary!({
        let cq = try_ref!(cq.object(), "cq");
        let _held = cq.lock().map(|l| l.lock());
        if buf.is_null() && len > 0 {
            return fail(&Error::invalid("buf is NULL and len is not 0"));
        }
        let text = cq.out_of_order_message().unwrap_or_default();
        if len > 0 {
            let n = text.len().min(len - 1);
            // SAFETY: the caller promises `buf` holds `len` writable bytes; `n < len`.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
        i32::try_from(text.len()).unwrap_or(i32::MAX)
    })
}

/// Limits the WRs that the queues whose sends complete on `cq` may park at once, all together, to `max_parked`
/// (0, the default: no limit but each queue's own `backlog_depth`).
///
/// WRs a queue accepts while its SQ has no credit wait in its backlog (`sqd_queue_attr.backlog_depth`), but
/// their copies (WR, SGE list, inline data) are kept in a pool shared by the queues of their send CQ. Without a
/// limit the pool holds room for every queue's whole backlog: a queue's creation adds the room the pool lacks
/// for `backlog_depth` more WRs of its shape (`max_send_sge`, `max_inline_data`), counted in its
/// `sqd_queue_stats.bytes`. With a limit,
/// the pool holds room for at most `max_parked` WRs of each shape of its queues, so queues with deep backlogs
/// cost little memory each (the first queue of a shape makes the pool grow, later ones do not), and a WR
/// that would park while `max_parked` WRs are parked on the CQ is refused with `-EAGAIN` and a message in
/// `sqd_last_error()` (as when its own backlog is full: `*bad_wr` at it, it and the WRs after it not accepted);
/// it can be posted again once releases have moved parked WRs to their SQs. Each queue's `backlog_depth`
/// stays its own cap. The pool's state is in `sqd_cq_backlog_pool_stats`.
///
/// May be called at any time. Room for a higher limit is allocated in this call; room is kept when the limit is
/// lowered (for later queues), and freed when the last queue of its shape is freed; a limit below the WRs
/// parked now refuses new ones until enough are released. Parking a WR and posting parked WRs never allocate.
///
/// Returns 0, or `-EINVAL` (NULL `cq`), `-ENOMEM` (the room could not be allocated; the previous limit stays,
/// and `sqd_last_error()` names the bytes).
#[no_mangle]
pub extern "C" fn sqd_cq_set_backlog_limit(cq: *mut sqd_cq, max_parked: u32) -> i32 {
    ffi_boundary!({
        let cq = try_ref!(cq.object(), "cq");
        let _held = cq.lock().map(|l| l.lock());
        status(cq.set_backlog_limit(max_parked))
    })
}

/// Copies the state of the CQ's backlog pool (where the queues whose sends complete on it park WRs) into
/// `*out`. Returns 0 or `-EINVAL` (NULL argument).
#[no_mangle]
pub extern "C" fn sqd_cq_backlog_pool_stats(cq: *const sqd_cq, out: *mut BacklogPoolStats) -> i32 {
    ffi_boundary!({
        let cq = try_ref!(cq.object(), "cq");
        let _held = cq.lock().map(|l| l.lock());
        let out = try_mut!(out, "out");
        *out = cq.backlog_pool_stats();
        status(Ok(()))
    })
}

/// Arms the CQ for its completion channel (`ibv_req_notify_cq(cq, solicited_only)`), then polls it once more so
/// that a completion that arrived between your last empty `sqd_cq_poll` and the arming is not missed: up to
/// `max` completions are stored in `wc`, exactly as `sqd_cq_poll` would (releases run too).
///
/// Returns 0 when the CQ is armed and was empty: sleep on the channel (`ibv_get_cq_event`, or epoll on its
/// fd), then `ibv_ack_cq_events` and poll. A positive count: handle them, then poll again (and re-arm) before
/// sleeping.
///
/// Unsignaled WRs produce no completion, and a sleeping poller no poll to cover them. So every unsignaled tail
/// of the CQ's queues gets its signaled marker in this call, and from this call until the next `sqd_cq_poll`
/// of the CQ (the one inside a later `sqd_cq_arm` included), every post to a queue whose sends complete on it
/// (`sqd_post_send`, from any thread on a `SQD_CQ_THREAD_SAFE` CQ, or from the poller itself before it
/// sleeps) that leaves an unsignaled tail posts the marker at once: one more WQE and CQE per such post
/// (counted in `sqd_queue_stats.markers`), whose completion raises the event when the CQ is armed for every
/// completion (`solicited_only` 0; armed for solicited completions only, a successful send completion raises
/// none, as in verbs). Negative: `-EINVAL` (NULL `cq`, `max <= 0`, NULL `wc`), `-EOPNOTSUPP` (the provider cannot
/// notify), `-EBUSY` (called from a callback of this CQ), `-EIO`, or the provider's negated errno.
#[no_mangle]
pub extern "C" fn sqd_cq_arm(cq: *mut sqd_cq, solicited_only: i32, max: i32, wc: *mut ibv_wc) -> i32 {
    ffi_boundary!({
        let cq = try_ref!(cq.object(), "cq");
        let _held = cq.lock().map(|l| l.lock());
        if max <= 0 {
            return fail(&Error::invalid(format!("max is {max}; arming needs room for at least one completion")));
        }
        if wc.is_null() {
            return fail(&Error::invalid("wc is NULL"));
        }
        // SAFETY: the caller provides an array of `max` writable `struct ibv_wc`.
        let out = unsafe { std::slice::from_raw_parts_mut(wc, max as usize) };
        match cq.arm(solicited_only != 0, out) {
            Ok(n) => n as i32,
            Err(e) => fail(&e),
        }
    })
}

/// Tells the library about an asynchronous event of the CQ (`type` is an `enum ibv_event_type` value, as read
/// by `ibv_get_async_event`). `IBV_EVENT_CQ_ERR`: the CQ will deliver no more completions, so every queue
/// attached to it fails and releases at once, in post order, every posted WR and receive with
/// `IBV_WC_WR_FLUSH_ERR` and every backlogged WR as never posted; completions that still arrive for them are
/// swallowed. Release callbacks run inside this call.
///
/// Returns 0, or `-EINVAL` (NULL `cq`, an event that is not a CQ's).
#[no_mangle]
pub extern "C" fn sqd_cq_async_event(cq: *mut sqd_cq, r#type: u32) -> i32 {
    ffi_boundary!({
        let cq = try_ref!(cq.object(), "cq");
        let _held = cq.lock().map(|l| l.lock());
        status(cq.on_async_event(r#type))
    })
}

/// One queue of a plan for `sqd_cq_depth_for` and `sqd_cq_depth_for_srqs` (`struct sqd_queue_plan`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QueuePlan {
    /// The queue's sq_depth, if its sends complete on the CQ; else 0.
    pub sq_depth: u32,
    /// The queue's rq_depth, if its receives complete on the CQ; else 0 (also for a queue that receives
    /// through an SRQ: `sqd_cq_depth_for_srqs` counts the SRQ).
    pub rq_depth: u32,
}

/// The CQ depth (`cqe` to ask `ibv_create_cq` for) that lets every queue of `plans` attach: the sum of what each
/// reserves (`sq_depth + 1` for its sends, `rq_depth` for its receives; one less for a queue whose interval in
/// force is 1, `signal_interval` 1 or 0 below an `sq_depth` of 8, so the sum is then one more than it needs). Compare with the device's `max_cqe`: a CQ the device clamps
/// below it would refuse some queues with `-ENOSPC`. It counts no SRQ: when queues receive through managed SRQs
/// on the CQ, use `sqd_cq_depth_for_srqs`.
///
/// Returns 0 and stores the depth in `*out`, or `-EINVAL` (NULL `out`, NULL `plans` with `n > 0`),
/// `-EOVERFLOW` (the depth does not fit in 64 bits).
#[no_mangle]
pub extern "C" fn sqd_cq_depth_for(plans: *const QueuePlan, n: usize, out: *mut u64) -> i32 {
    sqd_cq_depth_for_srqs(plans, n, std::ptr::null(), 0, out)
}

/// The CQ depth (`cqe` to ask `ibv_create_cq` for) that lets every queue of `plans` attach when some of them
/// receive through managed SRQs (`sqd_srq_new`): what `sqd_cq_depth_for` returns for `plans`, plus each of the
/// `n_srqs` depths of `srq_depths` once. List there, once each, the `depth` (of its `struct sqd_srq_attr`) of
/// every SRQ that a queue on this CQ receives through with the CQ as its receive CQ: `sqd_queue_new` reserves
/// that depth on the CQ once, for the first of its queues there, however many follow. Plan each such queue
/// with `rq_depth` 0, as its `struct sqd_queue_attr` has, and its `sq_depth` if its sends complete on the CQ.
/// The plans are the same `struct sqd_queue_plan` array that `sqd_cq_depth_for` takes.
///
/// Returns 0 and stores the depth in `*out`, or `-EINVAL` (NULL `out`, NULL `plans` with `n > 0`, NULL
/// `srq_depths` with `n_srqs > 0`), `-EOVERFLOW` (the depth does not fit in 64 bits).
#[no_mangle]
pub extern "C" fn sqd_cq_depth_for_srqs(
    plans: *const QueuePlan,
    n: usize,
    srq_depths: *const u32,
    n_srqs: usize,
    out: *mut u64,
) -> i32 {
    ffi_boundary!({
        let out = try_mut!(out, "out");
        if n > 0 && plans.is_null() {
            return fail(&Error::invalid("plans is NULL"));
        }
        if n_srqs > 0 && srq_depths.is_null() {
            return fail(&Error::invalid("srq_depths is NULL"));
        }
        let plans = if n == 0 {
            &[][..]
        } else {
            // SAFETY: the caller provides `n` readable plans.
            unsafe { std::slice::from_raw_parts(plans, n) }
        };
        let srq_depths = if n_srqs == 0 {
            &[][..]
        } else {
            // SAFETY: the caller provides `n_srqs` readable depths.
            unsafe { std::slice::from_raw_parts(srq_depths, n_srqs) }
        };
        let queues = plans
            .iter()
            .map(|p| crate::discipline::budget::reservation(p.sq_depth, p.rq_depth, p.sq_depth > 0, p.rq_depth > 0));
        let srqs = srq_depths.iter().map(|&d| u64::from(d));
        match queues.chain(srqs).try_fold(0u64, u64::checked_add) {
            Some(depth) => {
                *out = depth;
                0
            }
            None => fail(&Error::new(libc::EOVERFLOW, "the CQ depth of the plan does not fit in 64 bits")),
        }
    })
}
