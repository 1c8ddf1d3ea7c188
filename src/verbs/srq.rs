//! A shared receive queue reached through its context's ops table.

use std::ptr::{self, NonNull};

use rdma_sys::{ibv_recv_wr, ibv_srq};

use super::errno_of;
use super::qp::PostFailure;
use super::wr::RecvWrPtr;
use crate::error::{Error, Result};

type PostSrqRecvFn = unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32;

#[derive(Debug)]
pub struct SrqHandle {
    srq: NonNull<ibv_srq>,
    post: PostSrqRecvFn,
    /// Tells a registered software device, when dropped, that this handle no longer holds the object.
    _hold: super::device::Hold,
}

impl SrqHandle {
    /// # Safety
    /// `srq` is NULL or a valid `struct ibv_srq` with a valid `context`, both valid and at the same address
    /// for the handle's lifetime.
    pub unsafe fn from_raw(srq: *mut ibv_srq) -> Result<SrqHandle> {
        let srq = NonNull::new(srq).ok_or_else(|| Error::invalid("srq is NULL"))?;
        // SAFETY: the caller promises a valid SRQ; a field read.
        let ctx = unsafe { (*srq.as_ptr()).context };
        if ctx.is_null() {
            return Err(Error::invalid("srq->context is NULL: not an SRQ made by a verbs provider"));
        }
        // SAFETY: a valid SRQ's context is valid (the caller's promise).
        let post = unsafe { (*ctx).ops.post_srq_recv }.ok_or_else(|| Error::invalid("the SRQ's provider has no post_srq_recv op"))?;
        let hold = super::device::Hold::new(ctx, srq.as_ptr(), "srq")?;
        Ok(SrqHandle { srq, post, _hold: hold })
    }

    pub fn as_ptr(&self) -> *mut ibv_srq {
        self.srq.as_ptr()
    }

    /// Posts a NULL-terminated receive chain with one provider call.
    pub fn post_chain(&self, first: RecvWrPtr<'_>) -> std::result::Result<(), PostFailure> {
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: valid SRQ (handle contract); `first` heads a valid receive chain (RecvChain contract).
        let ret = unsafe { (self.post)(self.srq.as_ptr(), first.as_ptr(), &mut bad) };
        if ret == 0 {
            return Ok(());
        }
        Err(PostFailure { errno: errno_of(ret), posted: super::qp::count_recv_until(first, bad) })
    }
}
