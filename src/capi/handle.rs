//! The C handle types: `struct sqd_cq`, `struct sqd_queue`, `struct sqd_srq`.
//!
//! C sees each as an incomplete struct. Each is an opaque Rust type of its own, never the Rust type behind it,
//! so the header documents a C handle for C readers and no Rust item leaks into it. [`Castable`] binds a
//! handle type to the Rust type a pointer to it really points at; the functions below are the only places
//! that convert one into the other.

use crate::{Cq, Queue, Srq};

/// A managed completion queue: an `ibv_cq` taken under management by `sqd_cq_new` or `sqd_cq_new_ex`, freed
/// by `sqd_cq_free`.
///
/// Threads: made without `SQD_CQ_THREAD_SAFE`, the CQ and the queues on it are used from one thread at a time
/// and nothing is locked; made with it, any thread may use them, each call holding the CQ's lock.
#[allow(non_camel_case_types)]
pub struct sqd_cq {
    _private: [u8; 0],
}

/// The managed send queue (and optionally receive queue) of one RC QP, made by `sqd_queue_new` and freed by
/// `sqd_queue_free`.
///
/// Threads: as its CQs (`SQD_CQ_THREAD_SAFE`). It is freed only when nothing of it is outstanding
/// (`sqd_queue_free`), since WRs still outstanding would then complete as strays.
#[allow(non_camel_case_types)]
pub struct sqd_queue {
    _private: [u8; 0],
}

/// An `ibv_srq` under management, made by `sqd_srq_new` and freed by `sqd_srq_free`.
///
/// Its receives are released (through its own release handler, flag `SQD_COMPLETION_RECV`) when their own
/// completion is reaped on any managed CQ where a queue attached to it completes receives. Threads: used by
/// the thread that polls the CQs of its queues, which are never `SQD_CQ_THREAD_SAFE` ones (`sqd_queue_new`
/// refuses an SRQ there).
#[allow(non_camel_case_types)]
pub struct sqd_srq {
    _private: [u8; 0],
}

/// A C handle type and the Rust type its pointers point at: a `*mut Self` handed to C was made from a
/// `Box<Self::RustType>` by [`into_raw`].
pub(crate) trait Castable {
    type RustType;
}

impl Castable for sqd_cq {
    type RustType = Cq;
}

impl Castable for sqd_queue {
    type RustType = Queue;
}

impl Castable for sqd_srq {
    type RustType = Srq;
}

/// Hands a boxed object to C as its handle.
pub(crate) fn into_raw<C: Castable>(object: Box<C::RustType>) -> *mut C {
    Box::into_raw(object).cast()
}

/// A handle pointer (`*mut` or `*const`) as a pointer to its Rust object; NULL stays NULL. Only the type changes:
/// dereferencing the result is up to the caller, under the handle's own contract.
pub(crate) trait HandlePtr {
    type Target;
    fn object(self) -> *mut Self::Target;
}

impl<C: Castable> HandlePtr for *mut C {
    type Target = C::RustType;
    #[inline(always)]
    fn object(self) -> *mut C::RustType {
        self.cast()
    }
}

impl<C: Castable> HandlePtr for *const C {
    type Target = C::RustType;
    #[inline(always)]
    fn object(self) -> *mut C::RustType {
        self.cast_mut().cast()
    }
}

/// Takes back and drops the object behind a handle.
///
/// # Safety
/// `handle` was made by [`into_raw`] for this type and is not used again.
pub(crate) unsafe fn free<C: Castable>(handle: *mut C) {
    // SAFETY: `handle` came from `Box::into_raw` of a `Box<C::RustType>` (caller's promise), freed once.
    drop(unsafe { Box::from_raw(handle.object()) });
}
