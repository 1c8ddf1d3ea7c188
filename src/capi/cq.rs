//! C API: `struct sqd_cq`, a managed completion queue.

use rdma_sys::{ibv_cq, ibv_wc};

use super::{fail, ffi_boundary, status, try_mut, try_ref};
use crate::cq::{Cq, CqStats};
use crate::verbs::CqHandle;
use crate::Error;

/// Takes `cq` under management and stores the new handle in `*out`.
///
/// The capacity is `cq->cqe`, the depth the provider granted. Queues attached to the CQ reserve their worst
/// case on it (see `sqd_queue_new`); CQEs of QPs that are not managed on it are passed through unchanged.
///
/// Ownership: `cq` stays the caller's and must outlive the handle; free the handle with `sqd_cq_free` before
/// destroying `cq`. Thread safety: a `struct sqd_cq` and the queues on it are used from one thread at a time.
///
/// Returns 0, or `-EINVAL` (NULL argument, a CQ without a provider context or `poll_cq` op, `cqe <= 0`).
#[no_mangle]
pub extern "C" fn sqd_cq_new(cq: *mut ibv_cq, out: *mut *mut Cq) -> i32 {
    ffi_boundary!({
        let out = try_mut!(out, "out");
        *out = std::ptr::null_mut();
        // SAFETY: the caller passes a valid CQ (or NULL, rejected inside) that outlives the handle, as documented.
        let handle = match unsafe { CqHandle::from_raw(cq) } {
            Ok(h) => h,
            Err(e) => return fail(&e),
        };
        *out = Box::into_raw(Box::new(Cq::new(handle)));
        0
    })
}

/// Frees a handle made by `sqd_cq_new` (not the `ibv_cq` under it). NULL is a no-op.
///
/// Returns 0, or `-EBUSY` while queues are attached or when called from a callback run by this CQ's poll; the
/// handle then stays valid.
#[no_mangle]
pub extern "C" fn sqd_cq_free(cq: *mut Cq) -> i32 {
    ffi_boundary!({
        if cq.is_null() {
            return 0;
        }
        if let Err(e) = try_ref!(cq, "cq").check_free() {
            return fail(&e);
        }
        // SAFETY: `cq` came from `sqd_cq_new` (caller's promise) and is freed once.
        drop(unsafe { Box::from_raw(cq) });
        0
    })
}

/// Polls up to `max` work completions into `wc` and returns how many it stored (0 when there are none).
///
/// They are exactly the completions raw verbs would have given the ULP for the WRs it posted through its
/// queues: receive completions, send completions of WRs posted with `IBV_SEND_SIGNALED`, and every error or
/// flush completion, each with the ULP's own `wr_id` (on error completions only `wr_id`, `status`, `qp_num`
/// and `vendor_err` are valid, as in verbs). Completions the library added for moderation are not shown.
///
/// Meanwhile it runs the release callbacks and deferred actions the reaped CQEs make due (in post order per
/// queue), posts backlogged WRs as credits return, and covers idle unsignaled tails: a queue that has an
/// unsignaled tail and receives no post during one whole poll cycle gets a signaled zero-length RDMA WRITE.
/// So every accepted WR is released, without further posts, once its CQE is polled here, at the latest after
/// the second `sqd_cq_poll` following the post that accepted it.
///
/// Callbacks may post, defer and poll other CQs; calling `sqd_cq_poll` on this same CQ from one of them
/// returns `-EBUSY`.
///
/// Returns the count (>= 0), or `-EINVAL` (NULL `cq`, `max < 0`, NULL `wc` with `max > 0`), `-EBUSY`
/// (re-entered), `-EIO` (the provider's poll failed: the CQ is in error).
#[no_mangle]
pub extern "C" fn sqd_cq_poll(cq: *mut Cq, max: i32, wc: *mut ibv_wc) -> i32 {
    ffi_boundary!({
        let cq = try_ref!(cq, "cq");
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
    })
}

/// Copies the CQ's counters into `*out`. Returns 0 or `-EINVAL` (NULL argument).
#[no_mangle]
pub extern "C" fn sqd_cq_stats(cq: *const Cq, out: *mut CqStats) -> i32 {
    ffi_boundary!({
        let cq = try_ref!(cq, "cq");
        let out = try_mut!(out, "out");
        *out = cq.stats();
        status(Ok(()))
    })
}
