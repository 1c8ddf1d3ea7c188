//! C API: `struct sqd_srq`, a managed shared receive queue.

use std::ffi::c_void;
use std::ptr;

use rdma_sys::{ibv_recv_wr, ibv_srq};

use super::queue::ReleaseFn;
use super::handle::{self, sqd_srq, HandlePtr};
use super::{fail, ffi_boundary, status, try_mut, try_ref};
use crate::release::ReleaseHandler;
use crate::srq::{Srq, SrqStats};
use crate::verbs::{ForeignRelease, RecvChain, SrqHandle};
use crate::Error;

/// Called when the number of posted receives of an SRQ drops below its low watermark: post more.
pub type SrqLowFn = Option<unsafe extern "C" fn(ctx: *mut c_void, posted: u32)>;

/// How to manage an SRQ (`struct sqd_srq_attr`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SrqAttr {
    /// The SRQ's granted `max_wr` (read it back from `ibv_create_srq`'s `attr.max_wr`). 1..=1048576.
    pub depth: u32,
    /// `low` runs (from `sqd_cq_poll`) each time the posted receives drop below this; 0: never.
    pub low_watermark: u32,
    /// Called once per receive, when its completion has been reaped (or it is released without one, by
    /// `sqd_srq_release_all`): its buffer may be reused. Receives complete in any order. May be NULL.
    pub release: ReleaseFn,
    pub release_ctx: *mut c_void,
    pub low: SrqLowFn,
    pub low_ctx: *mut c_void,
    /// Reserved: must be 0.
    pub flags: u32,
}

/// Takes the SRQ `srq` under management and stores the handle in `*out`. Queues whose QPs receive from it are
/// made with `sqd_queue_new` and `attr->srq` set; its receives are posted with `sqd_srq_post_recv`, and their
/// completions are returned by `sqd_cq_poll` (with your wr_id and the consuming QP's `qp_num`) on the CQ of the
/// QP that consumed them. The SRQ's depth is reserved once on each CQ where its queues complete receives.
///
/// `srq` must hold no receives the handle does not know of: a new SRQ, or one whose receives were all consumed
/// (not one whose receives `sqd_srq_release_all` gave back, which the device still holds).
///
/// Ownership: `srq` stays the caller's and must outlive the handle. Thread safety: used by the thread that polls
/// the CQs of its queues (not for thread-safe CQs).
///
/// Returns 0, or `-EINVAL` (NULL argument, depth 0 or too large, low watermark above depth, nonzero flags, an
/// SRQ without a provider context or `post_srq_recv` op), `-ENOSPC` (too many managed SRQs: 4096), `-ENOMEM`
/// (its storage could not be allocated; `sqd_last_error()` names the bytes).
#[no_mangle]
pub extern "C" fn sqd_srq_new(srq: *mut ibv_srq, attr: *const SrqAttr, out: *mut *mut sqd_srq) -> i32 {
    ffi_boundary!({
        let out = try_mut!(out, "out");
        *out = ptr::null_mut();
        let attr = try_ref!(attr, "attr");
        if attr.flags != 0 {
            return fail(&Error::invalid(format!("attr->flags is {:#x}; no flags are defined", attr.flags)));
        }
        // SAFETY: the caller passes a valid SRQ (or NULL, rejected inside) that outlives the handle.
        let handle = match unsafe { SrqHandle::from_raw(srq) } {
            Ok(h) => h,
            Err(e) => return fail(&e),
        };
        // SAFETY: the C caller promises `release` may be called with `release_ctx` while the SRQ exists.
        let release = attr.release.map(|f| ReleaseHandler::Foreign(unsafe { ForeignRelease::new(f, attr.release_ctx) }));
        let low = match attr.low {
            Some(f) => {
                let ctx = attr.low_ctx;
                let call = move |posted: u32| {
                    // SAFETY: the C caller promises `low` may be called with `low_ctx` while the SRQ exists.
                    unsafe { f(ctx, posted) }
                };
                match crate::alloc::boxed(call, "the SRQ's low-watermark callback") {
                    Ok(b) => Some(b as Box<dyn Fn(u32)>),
                    Err(e) => return fail(&e),
                }
            }
            None => None,
        };
        match Srq::new(handle, attr.depth, release, attr.low_watermark, low).and_then(|s| crate::alloc::boxed(s, "the SRQ handle")) {
            Ok(s) => {
                *out = handle::into_raw(s);
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// Frees a handle made by `sqd_srq_new` (not the `ibv_srq`). NULL is a no-op (returns 0).
///
/// Returns 0, or `-EBUSY` (with a message in `sqd_last_error()`; the handle then stays valid) while queues are
/// attached (free them first), while receives are posted (release them first with `sqd_srq_release_all` once
/// no QP can consume them), or when called from the SRQ's own release callback. Free it before destroying
/// the `ibv_srq`: `sqd_sim_destroy_srq` refuses with `-EBUSY` until then.
#[no_mangle]
pub extern "C" fn sqd_srq_free(srq: *mut sqd_srq) -> i32 {
    ffi_boundary!({
        if srq.is_null() {
            return 0;
        }
        if let Err(e) = try_ref!(srq.object(), "srq").check_free() {
            return fail(&e);
        }
        // SAFETY: `srq` came from `sqd_srq_new` (the caller's promise) and is freed once.
        unsafe { handle::free(srq) };
        0
    })
}

/// Posts a chain of receives to the SRQ instead of `ibv_post_srq_recv`. On failure `*bad_wr` is the first
/// receive not posted. Returns 0, or `-EINVAL` (NULL argument, bad `num_sge`/`sg_list`), `-EAGAIN` (the SRQ
/// holds `depth` receives already), `-EIO` (`sqd_srq_release_all` released receives: see there), or the
/// provider's negated errno.
#[no_mangle]
pub extern "C" fn sqd_srq_post_recv(srq: *mut sqd_srq, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> i32 {
    ffi_boundary!({
        let bad_wr = try_mut!(bad_wr, "bad_wr");
        *bad_wr = wr;
        let srq = try_ref!(srq.object(), "srq");
        if wr.is_null() {
            return fail(&Error::invalid("wr is NULL"));
        }
        // SAFETY: the caller lends a valid receive chain for the duration of the call.
        let chain = unsafe { RecvChain::from_raw(wr) };
        match srq.post_recv(chain) {
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

/// Releases every receive still posted to the SRQ (`IBV_WC_WR_FLUSH_ERR`, `SQD_COMPLETION_NEVER_POSTED`),
/// when no QP can consume them any more: before destroying the SRQ, or after `IBV_EVENT_SRQ_ERR`. The device
/// still holds those receives, so once this released any the SRQ takes no more receives and no more queues
/// (`-EIO` from `sqd_srq_post_recv` and `sqd_queue_new`): a QP attached later could consume them into buffers
/// you have reused. Free it, and destroy the `ibv_srq`. Returns 0, or `-EINVAL` (NULL), `-EBUSY` (queues are
/// still attached).
#[no_mangle]
pub extern "C" fn sqd_srq_release_all(srq: *mut sqd_srq) -> i32 {
    ffi_boundary!({ status(try_ref!(srq.object(), "srq").release_all()) })
}

/// Copies the SRQ's counters into `*out`. Returns 0 or `-EINVAL` (NULL argument).
#[no_mangle]
pub extern "C" fn sqd_srq_stats(srq: *const sqd_srq, out: *mut SrqStats) -> i32 {
    ffi_boundary!({
        let srq = try_ref!(srq.object(), "srq");
        *try_mut!(out, "out") = srq.stats();
        0
    })
}

