//! C API: the seam for software devices (`sqd_device_*`), over [`crate::verbs::device`].

use std::ffi::{c_char, c_int, CStr};

use rdma_sys::ibv_context;

use super::{fail, ffi_boundary, set_last_error, status};
use crate::error::{Error, Result};
use crate::verbs::device::{self, DeviceOps, DEVICE_OPS_SIZE_V1};

/// Registers a software device: a device whose provider only fills in the public ops table of its
/// `struct ibv_context` (`post_send`, `poll_cq`, ...) and so cannot be reached by libibverbs calls that go
/// through private driver ops. Hardware providers loaded by libibverbs never need this.
///
/// From then on, for objects whose `context` is `ctx`, the library calls `ops->dereg_mr` instead of
/// `ibv_dereg_mr` (deferred deregistration: `sqd_defer_dereg_mr`), `ops->create_srq` / `ops->destroy_srq` instead
/// of `ibv_create_srq` / `ibv_destroy_srq` where it makes an SRQ itself (the SPDK provider, libsqdisc_spdk, does
/// for SPDK), and, when set, `ops->hold` / `ops->release` as each
/// `sqd_cq`, `sqd_queue` and `sqd_srq` starts and stops using one of the device's CQs, QPs and SRQs, so the device
/// can refuse to destroy an object a handle still uses. `*ops` is copied; `ops->size` must be
/// `sizeof(struct sqd_device_ops)`.
///
/// One registry serves the whole process: every copy of the library loaded into the global scope (libsqdisc, and
/// the copy libsqdisc_spdk carries) uses the first `sqd_device_register` / `sqd_device_lookup` the dynamic linker
/// finds there, from its first use of the registry on. A copy opened with `dlopen(RTLD_LOCAL)` or linked
/// statically into a program that does not export it (no `-rdynamic`) cannot be found, and keeps a registry of its
/// own that devices registered elsewhere do not reach.
///
/// The functions of `ops` may be called from any thread, with `ops->device` as their first argument, until
/// `sqd_device_unregister(ctx)` returns (`release`: until every successful `hold` is released, which may be
/// later).
///
/// Returns 0; `-EINVAL` (NULL `ctx` or `ops`, `ops->size` too small, `hold` without `release` or the reverse),
/// `-EEXIST` (a device is registered for `ctx` already), `-ENOMEM`.
#[no_mangle]
pub unsafe extern "C" fn sqd_device_register(ctx: *mut ibv_context, ops: *const DeviceOps) -> c_int {
    ffi_boundary!({
        // SAFETY: the C caller passes NULL or a readable struct of `ops->size` bytes, as documented.
        let ops = match unsafe { read_ops(ops) } {
            Ok(o) => o,
            Err(e) => return fail(&e),
        };
        // SAFETY: the C caller's promise, documented above, is the contract of `register`.
        status(unsafe { device::register(ctx, &ops) })
    })
}

/// Ends `sqd_device_register(ctx, ...)`: objects of `ctx` go to libibverbs' own calls again. A device calls it
/// when it closes, after the library has stopped using its objects.
///
/// Returns 0; `-EINVAL` (NULL `ctx`), `-ENOENT` (no device is registered for `ctx`).
#[no_mangle]
pub unsafe extern "C" fn sqd_device_unregister(ctx: *mut ibv_context) -> c_int {
    ffi_boundary!({
        // SAFETY: the C caller stops handing the library objects of `ctx` to tear down, as documented above.
        status(unsafe { device::unregister(ctx) })
    })
}

/// Whether a device is registered for `ctx`: 1, with its ops copied into `*ops` (at most `ops->size` bytes, which
/// the caller sets to `sizeof(struct sqd_device_ops)` first); 0 if none is (`*ops` untouched); `-EINVAL` for a
/// NULL `ops` or an `ops->size` below the first version's.
#[no_mangle]
pub unsafe extern "C" fn sqd_device_lookup(ctx: *mut ibv_context, ops: *mut DeviceOps) -> c_int {
    ffi_boundary!({
        if ops.is_null() {
            return fail(&Error::invalid("ops is NULL"));
        }
        // SAFETY: non-NULL, and the caller promises `ops->size` writable bytes; `size` is the first member.
        let size = unsafe { std::ptr::addr_of!((*ops).size).read_unaligned() };
        if size < DEVICE_OPS_SIZE_V1 {
            return fail(&Error::invalid(format!(
                "ops->size is {size}; struct sqd_device_ops is {DEVICE_OPS_SIZE_V1} bytes"
            )));
        }
        match device::lookup(ctx) {
            None => 0,
            Some(found) => {
                // SAFETY: at least `DEVICE_OPS_SIZE_V1` writable bytes (checked above, caller's promise).
                unsafe { ops.write_unaligned(found) };
                1
            }
        }
    })
}

/// Leaves `message` (copied) as the calling thread's `sqd_last_error()`, for a device implemented in another
/// library whose own C functions fail: its callers read the message where they read the library's. A device
/// library carrying its own copy of sqdisc's core (libsqdisc_sim) calls the first `sqd_device_set_error` in
/// global scope, like `sqd_device_lookup`.
///
/// Returns 0; `-EINVAL` for a NULL `message` (then "message is NULL" is the last error).
#[no_mangle]
pub unsafe extern "C" fn sqd_device_set_error(message: *const c_char) -> c_int {
    ffi_boundary!({
        if message.is_null() {
            set_last_error(c"message is NULL".to_owned());
            return -libc::EINVAL;
        }
        // SAFETY: non-NULL; the caller promises a NUL-terminated string, as documented above.
        set_last_error(unsafe { CStr::from_ptr(message) }.to_owned());
        0
    })
}

/// Checks `ops` and copies it out (at most what this version knows; a shorter `size` is refused).
///
/// # Safety
/// `ops` is NULL or points to at least `(*ops).size` readable bytes.
unsafe fn read_ops(ops: *const DeviceOps) -> Result<DeviceOps> {
    if ops.is_null() {
        return Err(Error::invalid("ops is NULL"));
    }
    // SAFETY: non-NULL and readable (caller's promise); `size` is the first member of every version.
    let size = unsafe { std::ptr::addr_of!((*ops).size).read_unaligned() };
    if size < DEVICE_OPS_SIZE_V1 {
        return Err(Error::invalid(format!(
            "ops->size is {size}; struct sqd_device_ops is {DEVICE_OPS_SIZE_V1} bytes (set size = sizeof(struct sqd_device_ops))"
        )));
    }
    // SAFETY: at least `DEVICE_OPS_SIZE_V1` bytes are readable (checked above, caller's promise).
    let mut copy = unsafe { ops.read_unaligned() };
    copy.size = DEVICE_OPS_SIZE_V1;
    if copy.hold.is_some() != copy.release.is_some() {
        return Err(Error::invalid("ops->hold and ops->release must be both set or both NULL"));
    }
    Ok(copy)
}
