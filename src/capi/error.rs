//! `sqd_last_error`, `sqd_version`: the library-wide C functions.

use std::ffi::c_char;

/// The message of the calling thread's most recent failed `sqd_*` call, as a NUL-terminated string.
///
/// Never NULL: an empty string before any failure. The pointer stays valid until the next failing `sqd_*` call
/// on the same thread; copy it to keep it. Successful calls do not clear it.
#[no_mangle]
pub extern "C" fn sqd_last_error() -> *const c_char {
    super::last_error_ptr()
}

/// The library version, "MAJOR.MINOR.PATCH", as a static NUL-terminated string.
#[no_mangle]
pub extern "C" fn sqd_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
