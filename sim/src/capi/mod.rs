//! The C functions of the test devices: `sqd_sim_*` (libsqdisc_sim, `include/sqdisc_sim.h`) and, with the
//! `scripted` feature, `sqd_scripted_*` (the test-only libsqdisc_scripted). Each checks its pointers
//! (`try_ref!`, `try_mut!`), runs its body inside `ffi_boundary!` so that a panic becomes `-EIO` instead of
//! unwinding into C, and calls the Rust API. Failures return a negative errno and leave a message where the
//! program's `sqd_last_error()` (libsqdisc's) reads it, through the device seam (`sqdisc_device::record_error`).

use crate::error::Error;

#[cfg(feature = "scripted")]
pub mod scripted;
pub mod sim;

/// Records `err` as this thread's last error (libsqdisc's `sqd_last_error()`) and returns its negative errno.
pub(crate) fn fail(err: &Error) -> i32 {
    sqdisc_device::record_error(err.message());
    -err.errno()
}

/// Converts a result into the C convention: `0` or a negative errno (message recorded).
pub(crate) fn status(result: crate::Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}

/// Runs a C entry point's body; a panic inside becomes `-EIO` with a message, never an unwind into C.
macro_rules! ffi_boundary {
    ($body:block) => {{
        match ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(|| $body)) {
            Ok(value) => value,
            Err(payload) => $crate::capi::panicked(payload),
        }
    }};
}

/// What `ffi_boundary!` returns for a panic caught at the C boundary: `-EIO`, with the panic's message.
#[cold]
#[inline(never)]
pub(crate) fn panicked(payload: Box<dyn std::any::Any + Send>) -> i32 {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown".to_string());
    fail(&Error::new(libc::EIO, format!("internal error (panic caught at the C boundary): {what}")))
}

/// `let x = try_ref!(ptr, "name");` gives `&T`, or returns `-EINVAL` ("name is NULL").
macro_rules! try_ref {
    ($ptr:expr, $name:literal) => {{
        let p = $ptr;
        if p.is_null() {
            return $crate::capi::fail(&$crate::Error::invalid(concat!($name, " is NULL")));
        }
        // SAFETY: non-NULL was checked above; the C caller promises the pointer came from this library (or is a
        // valid object of the named type) and is not being freed concurrently, as every function documents.
        unsafe { &*p }
    }};
}

/// `let x = try_mut!(ptr, "name");` gives `&mut T`, or returns `-EINVAL` ("name is NULL").
macro_rules! try_mut {
    ($ptr:expr, $name:literal) => {{
        let p = $ptr;
        if p.is_null() {
            return $crate::capi::fail(&$crate::Error::invalid(concat!($name, " is NULL")));
        }
        // SAFETY: as in `try_ref!`; the pointee is exclusively the caller's for the duration of the call.
        unsafe { &mut *p }
    }};
}

pub(crate) use {ffi_boundary, try_mut, try_ref};
