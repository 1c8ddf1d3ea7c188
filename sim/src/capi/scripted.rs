//! C API: the scripted test device (`sqd_scripted_*`), thin wrappers over [`crate::scripted`].
//!
//! Threading for every function here: a device and all its objects are not thread-safe; use them from one
//! thread at a time (including the data-path verbs called through the device's context).

use std::ffi::{c_char, c_int, c_void};
use std::pin::Pin;

use rdma_sys::{ibv_context, ibv_cq, ibv_mr, ibv_pd, ibv_qp};

use super::{fail, ffi_boundary, status, try_mut, try_ref};
use crate::scripted::{ScriptedCqStats, ScriptedDevice, ScriptedQpCaps, ScriptedQpStats, ScriptedWqe};
use crate::{Error, Result};

fn qp_device<'a>(qp: *mut ibv_qp) -> Result<&'a ScriptedDevice> {
    // SAFETY: every function taking a QP documents that it must be NULL or a live QP made by
    // `sqd_scripted_create_qp`, whose device is alive for the duration of the call.
    unsafe { ScriptedDevice::from_qp(qp) }
}

fn cq_device<'a>(cq: *mut ibv_cq) -> Result<&'a ScriptedDevice> {
    // SAFETY: as in `qp_device`, for CQs made by `sqd_scripted_create_cq`.
    unsafe { ScriptedDevice::from_cq(cq) }
}

/// Creates a scripted verbs device: a `struct ibv_context` whose data-path ops (`ibv_post_send`,
/// `ibv_post_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`) run a test-scripted model, and a protection domain.
///
/// On success stores the device in `*out` and returns 0; the caller owns it and frees it with
/// `sqd_scripted_free`. Errors: `-EINVAL` if `out` is NULL.
/// Not thread-safe: a device and its objects are used by one thread at a time.
#[no_mangle]
pub extern "C" fn sqd_scripted_new(out: *mut *mut ScriptedDevice) -> c_int {
    ffi_boundary!({
        let out = try_mut!(out, "out");
        let device = match ScriptedDevice::try_new() {
            Ok(d) => d,
            Err(e) => return fail(&e),
        };
        // SAFETY: the device is only ever reached through this pointer, by reference; it is never moved, and
        // `sqd_scripted_free` drops it in place.
        *out = Box::into_raw(unsafe { Pin::into_inner_unchecked(device) });
        0
    })
}

/// Frees a device and every CQ, QP and MR made on it. NULL is a no-op (returns 0).
///
/// Every pointer obtained from the device (context, PD, CQs, QPs) dangles afterwards.
/// Not thread-safe: no other call may use the device or its objects concurrently.
///
/// Returns 0, or `-EBUSY` while any of its CQs or QPs is still held by a library handle (`sqd_cq`,
/// `sqd_queue`): free those first. The device is then left as it was, still valid.
#[no_mangle]
pub extern "C" fn sqd_scripted_free(dev: *mut ScriptedDevice) -> c_int {
    ffi_boundary!({
        if dev.is_null() {
            return 0;
        }
        // SAFETY: a non-NULL `dev` is a live device from `sqd_scripted_new`.
        let held = unsafe { &*dev }.held_count();
        if held > 0 {
            return fail(&Error::new(
                libc::EBUSY,
                format!("{held} object(s) of the device are still managed (sqd_cq, sqd_queue): free those first"),
            ));
        }
        // SAFETY: a non-NULL `dev` came from `sqd_scripted_new` (Box::into_raw) and is freed once, here.
        // Dropping in place does not move it.
        drop(unsafe { Box::from_raw(dev) });
        0
    })
}

/// The device's `struct ibv_context`, owned by the device (valid until `sqd_scripted_free`). Its ops table
/// reaches the model, so libibverbs' inline data-path functions work on the device's objects. Only the
/// data-path ops are set; other verbs must not be called. NULL if `dev` is NULL.
#[no_mangle]
pub extern "C" fn sqd_scripted_context(dev: *const ScriptedDevice) -> *mut ibv_context {
    if dev.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a non-NULL `dev` is a live device from `sqd_scripted_new`.
    unsafe { &*dev }.context()
}

/// The device's protection domain, owned by the device (valid until `sqd_scripted_free`). NULL if `dev` is NULL.
#[no_mangle]
pub extern "C" fn sqd_scripted_pd(dev: *const ScriptedDevice) -> *mut ibv_pd {
    if dev.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a non-NULL `dev` is a live device from `sqd_scripted_new`.
    unsafe { &*dev }.pd()
}

/// Creates a CQ holding exactly `cqe` CQEs (`cq->cqe == cqe`). A CQE pushed into a full CQ is lost and
/// recorded as a "CQ overrun" violation.
///
/// On success stores the CQ in `*out` and returns 0. The device owns the CQ: destroy it with
/// `sqd_scripted_destroy_cq`, or let `sqd_scripted_free` free it. Errors: `-EINVAL` for a NULL argument or
/// `cqe` outside 1..=4194304.
#[no_mangle]
pub extern "C" fn sqd_scripted_create_cq(dev: *const ScriptedDevice, cqe: c_int, out: *mut *mut ibv_cq) -> c_int {
    ffi_boundary!({
        let dev = try_ref!(dev, "dev");
        let out = try_mut!(out, "out");
        match dev.create_cq(cqe) {
            Ok(cq) => {
                *out = cq;
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// Destroys a CQ made by `sqd_scripted_create_cq`.
///
/// Errors: `-EINVAL` if `cq` is NULL or not a live scripted CQ; `-EBUSY` while a QP uses it (as send or
/// receive CQ) or an `sqd_cq` manages it (`sqd_cq_free` it first). On success `cq` dangles.
#[no_mangle]
pub extern "C" fn sqd_scripted_destroy_cq(cq: *mut ibv_cq) -> c_int {
    ffi_boundary!({
        match cq_device(cq) {
            Ok(dev) => status(dev.destroy_cq(cq)),
            Err(e) => fail(&e),
        }
    })
}

/// Creates an RC QP in the RTS state (`qp->qp_num` unique and nonzero, `qp->pd`, `qp->send_cq`,
/// `qp->recv_cq` set) with exactly the given caps.
///
/// On success stores the QP in `*out` and returns 0. The device owns the QP: destroy it with
/// `sqd_scripted_destroy_qp`, or let `sqd_scripted_free` free it. `caps` is read during the call only.
/// Errors: `-EINVAL` for a NULL argument, CQs not made by this device, or caps out of range
/// (`max_send_wr`, `max_recv_wr` 1..=32768; `max_send_sge`, `max_recv_sge` 1..=64; `max_inline_data` 0..=4096).
#[no_mangle]
pub extern "C" fn sqd_scripted_create_qp(
    dev: *const ScriptedDevice,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    caps: *const ScriptedQpCaps,
    out: *mut *mut ibv_qp,
) -> c_int {
    ffi_boundary!({
        let dev = try_ref!(dev, "dev");
        let caps = try_ref!(caps, "caps");
        let out = try_mut!(out, "out");
        if send_cq.is_null() || recv_cq.is_null() {
            return fail(&Error::invalid("send_cq and recv_cq must not be NULL"));
        }
        match dev.create_qp(send_cq, recv_cq, caps) {
            Ok(qp) => {
                *out = qp;
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// Destroys a QP made by `sqd_scripted_create_qp`, whatever it holds; its CQEs not yet polled are removed from
/// its CQs. Errors: `-EINVAL` if `qp` is NULL or not a live scripted QP; `-EBUSY` while an `sqd_queue` manages
/// it (`sqd_queue_free` it first). On success `qp` dangles.
#[no_mangle]
pub extern "C" fn sqd_scripted_destroy_qp(qp: *mut ibv_qp) -> c_int {
    ffi_boundary!({
        match qp_device(qp) {
            Ok(dev) => status(dev.destroy_qp(qp)),
            Err(e) => fail(&e),
        }
    })
}

/// Scripts the device: the next `n` send WQEs of `qp` not yet executed execute successfully, in order. Each
/// signaled one pushes a success CQE (`wr_id`, `IBV_WC_SUCCESS`, the `ibv_wc_opcode` matching its WR opcode,
/// `byte_len`, `qp_num`) to the send CQ. No slot is freed until a CQE is polled.
///
/// Returns how many executed (>= 0, fewer than `n` if fewer were waiting). Errors: `-EINVAL` if `qp` is NULL
/// or not a live scripted QP, or `n` < 0.
#[no_mangle]
pub extern "C" fn sqd_scripted_complete(qp: *mut ibv_qp, n: c_int) -> c_int {
    ffi_boundary!({
        if n < 0 {
            return fail(&Error::invalid(format!("n = {n} is negative")));
        }
        match qp_device(qp).and_then(|dev| dev.complete(qp, n as usize)) {
            Ok(done) => done as c_int,
            Err(e) => fail(&e),
        }
    })
}

/// Scripts the device: the next send WQE of `qp` not yet executed fails with `status` (an `enum ibv_wc_status`
/// error) and `vendor_err`: it yields an error CQE whether signaled or not. The QP moves to the error state,
/// then every later send WQE and every posted receive flushes with its own `IBV_WC_WR_FLUSH_ERR` CQE, in order.
/// On these CQEs only `wr_id`, `status`, `qp_num` and `vendor_err` are meaningful.
///
/// Errors: `-EINVAL` if `qp` is NULL or not a live scripted QP, or `status` is `IBV_WC_SUCCESS`; `-ENOENT` if
/// no send WQE is waiting (nothing changes).
#[no_mangle]
pub extern "C" fn sqd_scripted_fail(qp: *mut ibv_qp, status: u32, vendor_err: u32) -> c_int {
    ffi_boundary!({
        match qp_device(qp) {
            Ok(dev) => self::status(dev.fail(qp, status, vendor_err)),
            Err(e) => fail(&e),
        }
    })
}

/// Scripts the device: moves `qp` to the error state, as `ibv_modify_qp` to `IBV_QPS_ERR` would. Every send
/// WQE not yet executed, then every posted receive, flushes with its own `IBV_WC_WR_FLUSH_ERR` CQE, in order;
/// later posts are accepted and flushed at once. Errors: `-EINVAL` if `qp` is NULL or not a live scripted QP.
#[no_mangle]
pub extern "C" fn sqd_scripted_set_error(qp: *mut ibv_qp) -> c_int {
    ffi_boundary!({
        match qp_device(qp) {
            Ok(dev) => status(dev.set_error(qp)),
            Err(e) => fail(&e),
        }
    })
}

/// Scripts the device: a message arrives for `qp`. Its oldest posted receive completes with `IBV_WC_RECV`,
/// `byte_len`, and, when `imm_data` is not NULL, `IBV_WC_WITH_IMM` and `*imm_data` (network byte order, as in
/// `struct ibv_wc`). `imm_data` is read during the call only.
///
/// Errors: `-EINVAL` if `qp` is NULL or not a live scripted QP; `-ENOENT` if no receive is posted.
#[no_mangle]
pub extern "C" fn sqd_scripted_deliver(qp: *mut ibv_qp, byte_len: u32, imm_data: *const u32) -> c_int {
    ffi_boundary!({
        let imm = if imm_data.is_null() {
            None
        } else {
            // SAFETY: a non-NULL `imm_data` points to a readable `uint32_t`, as documented.
            Some(unsafe { *imm_data })
        };
        match qp_device(qp) {
            Ok(dev) => status(dev.deliver(qp, byte_len, imm)),
            Err(e) => fail(&e),
        }
    })
}

/// Scripts the device: makes its `post_send` refuse send WRs of `qp`, as a provider refuses a WR it does not
/// support: from now on every send WR of `qp` with `opcode` (an `enum ibv_wr_opcode` value) is refused with
/// `errnum` (a positive errno) whenever it is posted: `post_send` returns it with `*bad_wr` at that WR, and it and
/// the WRs after it in that chain are not posted. No violation is recorded. `errnum` 0 lifts the refusal of
/// `opcode`.
///
/// Errors: `-EINVAL` if `qp` is NULL or not a live scripted QP, or `errnum` is outside 0..=4095.
#[no_mangle]
pub extern "C" fn sqd_scripted_refuse_opcode(qp: *mut ibv_qp, opcode: u32, errnum: c_int) -> c_int {
    ffi_boundary!({
        match qp_device(qp) {
            Ok(dev) => status(dev.refuse_opcode(qp, opcode, errnum)),
            Err(e) => fail(&e),
        }
    })
}

/// Copies the counters and state of `qp` into `*out` and returns 0.
/// Errors: `-EINVAL` if an argument is NULL or `qp` is not a live scripted QP.
#[no_mangle]
pub extern "C" fn sqd_scripted_qp_stats(qp: *mut ibv_qp, out: *mut ScriptedQpStats) -> c_int {
    ffi_boundary!({
        let out = try_mut!(out, "out");
        match qp_device(qp).and_then(|dev| dev.qp_stats(qp)) {
            Ok(stats) => {
                *out = stats;
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// Copies the caps `qp` was granted (exactly those requested) into `*out` and returns 0.
/// Errors: `-EINVAL` if an argument is NULL or `qp` is not a live scripted QP.
#[no_mangle]
pub extern "C" fn sqd_scripted_qp_caps(qp: *mut ibv_qp, out: *mut ScriptedQpCaps) -> c_int {
    ffi_boundary!({
        let out = try_mut!(out, "out");
        match qp_device(qp).and_then(|dev| dev.qp_caps(qp)) {
            Ok(caps) => {
                *out = caps;
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// Copies the counters and state of `cq` into `*out` and returns 0.
/// Errors: `-EINVAL` if an argument is NULL or `cq` is not a live scripted CQ.
#[no_mangle]
pub extern "C" fn sqd_scripted_cq_stats(cq: *mut ibv_cq, out: *mut ScriptedCqStats) -> c_int {
    ffi_boundary!({
        let out = try_mut!(out, "out");
        match cq_device(cq).and_then(|dev| dev.cq_stats(cq)) {
            Ok(stats) => {
                *out = stats;
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// Copies the `index`-th send WQE ever posted on `qp` (0 = first; as posted, plus whether it was signaled,
/// executed or flushed) into `*out` and returns 0.
/// Errors: `-EINVAL` if an argument is NULL or `qp` is not a live scripted QP; `-ENOENT` if fewer than
/// `index + 1` send WQEs were posted.
#[no_mangle]
pub extern "C" fn sqd_scripted_wqe(qp: *mut ibv_qp, index: usize, out: *mut ScriptedWqe) -> c_int {
    ffi_boundary!({
        let out = try_mut!(out, "out");
        match qp_device(qp).and_then(|dev| dev.wqe(qp, index)) {
            Ok(wqe) => {
                *out = wqe;
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// Registers `len` bytes at `addr` on the device: stores in `*out` a real `struct ibv_mr` with `context` (the
/// device's), `pd` (the device's), `addr`, `length`, and a nonzero `lkey` and `rkey` distinct from each other and
/// from those of every other MR of the device. `access` (`enum ibv_access_flags` bits) is accepted as given: the
/// device enforces no access rights and never reads the memory.
///
/// The device owns the MR: deregister it with `sqd_scripted_dereg_mr`, hand it to `sqd_defer_dereg_mr` (the
/// library deregisters it through the device), or let `sqd_scripted_free` free it. Returns 0, or `-EINVAL` for
/// a NULL `dev` or `out`.
#[no_mangle]
pub extern "C" fn sqd_scripted_reg_mr(
    dev: *const ScriptedDevice,
    addr: *mut c_void,
    len: usize,
    access: c_int,
    out: *mut *mut ibv_mr,
) -> c_int {
    ffi_boundary!({
        let dev = try_ref!(dev, "dev");
        let out = try_mut!(out, "out");
        match dev.reg_mr(addr, len, access) {
            Ok(mr) => {
                *out = mr;
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// Deregisters (frees) an MR made by `sqd_scripted_reg_mr`; on success `mr` dangles. The pointer itself is
/// looked up, never read, so an MR deregistered already is refused safely (unless its address was reused).
/// Returns 0, or `-EINVAL` if `mr` is NULL or not a registered MR of a live scripted device.
#[no_mangle]
pub extern "C" fn sqd_scripted_dereg_mr(mr: *mut ibv_mr) -> c_int {
    ffi_boundary!({
        // SAFETY: a device found through its MR is alive; devices are used by one thread at a time, as documented.
        match unsafe { ScriptedDevice::from_mr(mr) }.and_then(|dev| dev.dereg_mr(mr)) {
            Ok(()) => 0,
            Err(e) => fail(&e),
        }
    })
}

/// The number of MRs registered on the device now (>= 0). Errors: `-EINVAL` if `dev` is NULL.
#[no_mangle]
pub extern "C" fn sqd_scripted_mr_count(dev: *const ScriptedDevice) -> c_int {
    ffi_boundary!({
        let dev = try_ref!(dev, "dev");
        c_int::try_from(dev.mr_count()).unwrap_or(c_int::MAX)
    })
}

/// The number of violations (SQ/RQ overflow, invalid WR, CQ overrun) recorded on the device (>= 0).
/// Errors: `-EINVAL` if `dev` is NULL.
#[no_mangle]
pub extern "C" fn sqd_scripted_violation_count(dev: *const ScriptedDevice) -> c_int {
    ffi_boundary!({
        let dev = try_ref!(dev, "dev");
        c_int::try_from(dev.violation_count()).unwrap_or(c_int::MAX)
    })
}

/// Copies the text of the `index`-th violation (0 = oldest; it starts with its kind, e.g. "SQ overflow:" or
/// "CQ overrun:") into `buf`, truncated to `len - 1` bytes and NUL-terminated when `len` > 0, as `snprintf`
/// does. Returns the full length of the text (excluding the NUL). `buf` may be NULL when `len` is 0.
/// Errors: `-EINVAL` if `dev` is NULL, or `buf` is NULL with `len` > 0; `-ENOENT` if there is no such violation.
#[no_mangle]
pub extern "C" fn sqd_scripted_violation(dev: *const ScriptedDevice, index: usize, buf: *mut c_char, len: usize) -> c_int {
    ffi_boundary!({
        let dev = try_ref!(dev, "dev");
        if buf.is_null() && len > 0 {
            return fail(&Error::invalid("buf is NULL but len > 0"));
        }
        let Some(text) = dev.violation(index) else {
            return fail(&Error::new(
                libc::ENOENT,
                format!("violation {index} does not exist ({} recorded)", dev.violation_count()),
            ));
        };
        let bytes = text.as_bytes();
        if len > 0 {
            let n = bytes.len().min(len - 1);
            // SAFETY: `buf` is non-NULL and holds `len` writable bytes, as documented; `n + 1 <= len`.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
        c_int::try_from(bytes.len()).unwrap_or(c_int::MAX)
    })
}
