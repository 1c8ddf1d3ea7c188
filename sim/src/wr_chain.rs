//! What every post op of the devices' ops tables does alike: walk the caller's WR chain in order and stop at the
//! first WR refused, with `*bad_wr` at it (the WRs before it stay posted, as `ibv_post_send` says), and never
//! let a panic in the model unwind into C.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use rdma_sys::{ibv_recv_wr, ibv_send_wr};

/// Runs an op's body; a panic (a bug in the model) becomes `on_panic`.
pub(crate) fn guarded(on_panic: c_int, f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(on_panic)
}

/// A WR of a chain linked by `next`.
pub(crate) trait ChainedWr {
    fn next_wr(&self) -> *mut Self;
}

impl ChainedWr for ibv_send_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

impl ChainedWr for ibv_recv_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

/// Refuses the WR `at` with `errno`: `*bad_wr` (when the caller passed one) names it.
pub(crate) fn refuse<W>(bad_wr: *mut *mut W, at: *mut W, errno: c_int) -> c_int {
    if !bad_wr.is_null() {
        // SAFETY: a non-NULL `bad_wr` is the caller's out-pointer, valid for a write.
        unsafe { *bad_wr = at };
    }
    errno
}

/// Hands each WR of the chain at `wr` to `post`, in order, until `post` refuses one: returns how many were
/// posted and 0, or, with `*bad_wr` at the WR refused, its errno.
///
/// # Safety
/// `wr` is NULL or the first of a chain of WRs valid for reads, as the verbs post calls require.
pub(crate) unsafe fn post_chain<W: ChainedWr>(
    wr: *mut W,
    bad_wr: *mut *mut W,
    mut post: impl FnMut(*mut W) -> Result<(), c_int>,
) -> (u32, c_int) {
    let mut posted = 0;
    let mut cur = wr;
    while !cur.is_null() {
        if let Err(errno) = post(cur) {
            return (posted, refuse(bad_wr, cur, errno));
        }
        posted += 1;
        // SAFETY: `cur` is a WR of the caller's chain (the caller's promise).
        cur = unsafe { (*cur).next_wr() };
    }
    (posted, 0)
}
