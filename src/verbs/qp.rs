//! A queue pair reached through its context's ops table.

use std::ptr::{self, NonNull};

use rdma_sys::{ibv_cq, ibv_qp, ibv_qp_type, ibv_recv_wr, ibv_send_wr};

use super::errno_of;
use super::wr::{RecvWrPtr, WrPtr};
use crate::discipline::opcode::{SEND_SIGNALED, WR_RDMA_WRITE};
use crate::error::{Error, Result};

type PostSendFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> i32;
type PostRecvFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32;

/// The provider refused part of a post: `posted` WRs of the run went in, the rest did not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostFailure {
    pub errno: i32,
    pub posted: usize,
}

#[derive(Debug)]
pub struct QpHandle {
    qp: NonNull<ibv_qp>,
    post_send: PostSendFn,
    post_recv: Option<PostRecvFn>,
    qp_num: u32,
    /// Tells a registered software device, when dropped, that this handle no longer holds the object.
    _hold: super::device::Hold,
}

impl QpHandle {
    /// Wraps an RC QP.
    ///
    /// # Safety
    /// `qp` is NULL or a valid `struct ibv_qp` with a valid `context`, both valid and at the same address for the
    /// handle's lifetime.
    pub unsafe fn from_raw(qp: *mut ibv_qp) -> Result<QpHandle> {
        let qp = NonNull::new(qp).ok_or_else(|| Error::invalid("qp is NULL"))?;
        // SAFETY: the caller promises a valid QP; plain field reads.
        let (ctx, qp_type, qp_num) = unsafe {
            let q = qp.as_ptr();
            ((*q).context, (*q).qp_type, (*q).qp_num)
        };
        if ctx.is_null() {
            return Err(Error::invalid("qp->context is NULL: not a QP made by a verbs provider"));
        }
        if qp_type != ibv_qp_type::IBV_QPT_RC {
            return Err(Error::invalid(format!("qp type is {qp_type}; a managed queue needs an RC QP (IBV_QPT_RC)")));
        }
        // SAFETY: a valid QP's context is valid (the caller's promise).
        let ops = unsafe { &(*ctx).ops };
        let post_send = ops.post_send.ok_or_else(|| Error::invalid("the QP's provider has no post_send op"))?;
        let hold = super::device::Hold::new(ctx, qp.as_ptr(), "qp")?;
        Ok(QpHandle { qp, post_send, post_recv: ops.post_recv, qp_num, _hold: hold })
    }

    pub fn as_ptr(&self) -> *mut ibv_qp {
        self.qp.as_ptr()
    }
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }
    pub fn send_cq(&self) -> *mut ibv_cq {
        // SAFETY: valid for the handle's lifetime; a field read.
        unsafe { (*self.qp.as_ptr()).send_cq }
    }
    pub fn recv_cq(&self) -> *mut ibv_cq {
        // SAFETY: as above.
        unsafe { (*self.qp.as_ptr()).recv_cq }
    }
    pub fn has_srq(&self) -> bool {
        !self.srq().is_null()
    }
    pub fn srq(&self) -> *mut rdma_sys::ibv_srq {
        // SAFETY: as above.
        unsafe { (*self.qp.as_ptr()).srq }
    }

    /// Posts a NULL-terminated chain that starts at `first` with one provider call (one doorbell).
    #[inline]
    pub fn post_chain(&self, first: WrPtr<'_>) -> std::result::Result<(), PostFailure> {
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is valid (handle contract); `first` heads a valid chain (SendChain contract or the
        // backlog's own storage) that the provider only reads during the call.
        let ret = unsafe { (self.post_send)(self.qp.as_ptr(), first.as_ptr(), &mut bad) };
        if ret == 0 {
            return Ok(());
        }
        Err(PostFailure { errno: errno_of(ret), posted: count_until(first, bad) })
    }

    /// Posts the library's own signaled zero-length RDMA WRITE: it carries no data and needs no rkey at the
    /// responder (IBA C9-88), and its CQE retires every WQE before it.
    pub fn post_marker(&self, token: u64) -> std::result::Result<(), i32> {
        // SAFETY: all-zero is a valid `ibv_send_wr` (integers, NULL pointers, unions of those).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = token;
        wr.opcode = WR_RDMA_WRITE;
        wr.send_flags = SEND_SIGNALED;
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: valid QP; `wr` is a complete one-WR chain on our stack for the duration of the call.
        let ret = unsafe { (self.post_send)(self.qp.as_ptr(), &mut wr, &mut bad) };
        if ret == 0 {
            Ok(())
        } else {
            Err(errno_of(ret))
        }
    }

    /// Posts the library's signaled LocalInv of `rkey` (optionally with the Local Invalidate Fence).
    pub fn post_local_inv(&self, token: u64, rkey: u32, fence: bool) -> std::result::Result<(), i32> {
        let mut wr = super::staged::local_inv_wr(token, rkey, fence);
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: valid QP; `wr` is a complete one-WR chain on our stack for the duration of the call.
        let ret = unsafe { (self.post_send)(self.qp.as_ptr(), &mut wr, &mut bad) };
        if ret == 0 {
            Ok(())
        } else {
            Err(errno_of(ret))
        }
    }

    /// Posts a NULL-terminated receive chain with one provider call.
    #[inline]
    pub fn post_recv_chain(&self, first: RecvWrPtr<'_>) -> std::result::Result<(), PostFailure> {
        let Some(post_recv) = self.post_recv else {
            return Err(PostFailure { errno: libc::EOPNOTSUPP, posted: 0 });
        };
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: valid QP; `first` heads a valid receive chain (RecvChain contract).
        let ret = unsafe { post_recv(self.qp.as_ptr(), first.as_ptr(), &mut bad) };
        if ret == 0 {
            return Ok(());
        }
        Err(PostFailure { errno: errno_of(ret), posted: count_recv_until(first, bad) })
    }
}

/// How many receives of the chain precede `bad`; none if `bad` is not in it (the provider named no WR of the
/// chain: take it that none went in).
pub(crate) fn count_recv_until(first: RecvWrPtr<'_>, bad: *mut ibv_recv_wr) -> usize {
    let mut n = 0;
    let mut w = Some(first);
    while let Some(x) = w {
        if x.as_ptr() == bad {
            return n;
        }
        n += 1;
        w = x.next();
    }
    0
}

/// How many WRs of the chain precede `bad` (none if `bad` is not in it).
fn count_until(first: WrPtr<'_>, bad: *mut ibv_send_wr) -> usize {
    let mut n = 0;
    let mut w = Some(first);
    while let Some(x) = w {
        if x.as_ptr() == bad {
            return n;
        }
        n += 1;
        w = x.next();
    }
    0
}
