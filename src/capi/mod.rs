//! The C ABI. Every `extern "C"` function of the library lives below this module and nothing else does.
//!
//! Each function: checks its pointers (`try_ref!`, `try_mut!`), runs its body inside `ffi_boundary!` so that a
//! panic becomes `-EIO` instead of unwinding into C, converts arguments, and calls the safe Rust API. Failures
//! return a negative errno and leave a message for `sqd_last_error()` on the calling thread.

use std::ffi::{c_char, CString};

use crate::error::Error;

pub mod compat;
pub mod cq;
pub mod error;
pub mod handle;
pub mod queue;
pub mod srq;
// Last: its declarations close include/sqdisc.h.
pub mod device;

/// Records `err` as this thread's last error and returns its negative errno. The text lives in the device seam
/// (`sqdisc-device`), which the software HCA's C functions share in a Rust program; in a copy of the C layer
/// that is not the process's canonical one it goes to the canonical copy's last error through
/// `sqd_device_set_error`, since the program reads that copy's `sqd_last_error()`.
pub(crate) fn fail(err: &Error) -> i32 {
    crate::verbs::device::record_error(err.message());
    -err.errno()
}

/// Makes `text` this copy's last error on the calling thread.
pub(crate) fn set_last_error(text: CString) {
    sqdisc_device::set_last_error(text);
}

/// Converts a result into the C convention: `0` or a negative errno (message recorded).
pub(crate) fn status(result: crate::Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}

pub(crate) fn last_error_ptr() -> *const c_char {
    sqdisc_device::last_error_ptr()
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

/// What `ffi_boundary!` returns for a panic caught at the C boundary: `-EIO`, with the panic's message. Out of
/// line, so that the entry points' common paths carry none of it.
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
