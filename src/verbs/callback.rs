//! C callbacks held by the library: a function pointer and its context, called from safe code.

use std::ffi::c_void;

use crate::completion::Completion;

/// `sqd_release_fn` and its context. Neither copied nor called outside the library: the constructor's promise
/// covers the calls the queue it is handed to makes, no others.
#[derive(Debug)]
pub struct ForeignRelease {
    f: unsafe extern "C" fn(*mut c_void, *const Completion),
    ctx: *mut c_void,
}

impl ForeignRelease {
    /// # Safety
    /// `f` may be called with `ctx` and a pointer to a valid `Completion`, from the thread that polls, for as
    /// long as the queue exists.
    pub unsafe fn new(f: unsafe extern "C" fn(*mut c_void, *const Completion), ctx: *mut c_void) -> ForeignRelease {
        ForeignRelease { f, ctx }
    }
    #[inline]
    pub(crate) fn call(&self, c: &Completion) {
        // SAFETY: the constructor's contract.
        unsafe { (self.f)(self.ctx, c) }
    }
}

/// `sqd_release_batch_fn` and its context, called by the release pass with the batch in its C form, without a
/// closure in between. Neither copied nor called outside the library, as `ForeignRelease`. Only the C API makes one.
#[cfg(feature = "capi")]
#[derive(Debug)]
pub struct ForeignBatch {
    f: unsafe extern "C" fn(*mut c_void, *const crate::completion::ReleaseBatchC),
    ctx: *mut c_void,
}

#[cfg(feature = "capi")]
impl ForeignBatch {
    /// # Safety
    /// `f` may be called with `ctx` and a pointer to a valid `ReleaseBatchC`, from the thread that polls, for as
    /// long as the queue exists.
    pub unsafe fn new(f: unsafe extern "C" fn(*mut c_void, *const crate::completion::ReleaseBatchC), ctx: *mut c_void) -> ForeignBatch {
        ForeignBatch { f, ctx }
    }
    #[inline]
    pub(crate) fn call(&self, b: &crate::completion::ReleaseBatchC) {
        // SAFETY: the constructor's contract.
        unsafe { (self.f)(self.ctx, b) }
    }
}

/// A deferred C function and its context. Neither copied nor called outside the library, so it runs at most
/// once, when the queue it is handed to reaches it.
#[derive(Debug)]
pub struct ForeignDeferred {
    f: unsafe extern "C" fn(*mut c_void),
    ctx: *mut c_void,
}

impl ForeignDeferred {
    /// # Safety
    /// `f` may be called once with `ctx`, later, from the thread that polls or posts.
    pub unsafe fn new(f: unsafe extern "C" fn(*mut c_void), ctx: *mut c_void) -> ForeignDeferred {
        ForeignDeferred { f, ctx }
    }
    pub(crate) fn call(self) {
        // SAFETY: the constructor's contract.
        unsafe { (self.f)(self.ctx) }
    }
}
