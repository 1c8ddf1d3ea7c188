//! A completion queue reached through its context's ops table.

use std::ptr::NonNull;

use rdma_sys::{ibv_cq, ibv_wc};

use crate::error::{Error, Result};

/// A provider's `poll_cq` op.
pub type PollFn = unsafe extern "C" fn(*mut ibv_cq, i32, *mut ibv_wc) -> i32;
/// A provider's `req_notify_cq` op.
pub type NotifyFn = unsafe extern "C" fn(*mut ibv_cq, i32) -> i32;

#[derive(Debug)]
pub struct CqHandle {
    cq: NonNull<ibv_cq>,
    poll: PollFn,
    notify: Option<NotifyFn>,
    capacity: u32,
    /// Tells a registered software device, when dropped, that this handle no longer holds the object.
    _hold: super::device::Hold,
}

impl CqHandle {
    /// Wraps a CQ.
    ///
    /// # Safety
    /// `cq` is NULL or a valid `struct ibv_cq` whose `context` is valid, and both stay valid and at the same
    /// address for the handle's lifetime.
    pub unsafe fn from_raw(cq: *mut ibv_cq) -> Result<CqHandle> {
        let cq = NonNull::new(cq).ok_or_else(|| Error::invalid("cq is NULL"))?;
        // SAFETY: the caller promises `cq` is a valid CQ; we only read its fields.
        let (ctx, cqe) = unsafe { ((*cq.as_ptr()).context, (*cq.as_ptr()).cqe) };
        if ctx.is_null() {
            return Err(Error::invalid("cq->context is NULL: not a CQ made by a verbs provider"));
        }
        // SAFETY: a valid CQ's context is a valid `struct ibv_context` (the caller's promise).
        let poll = unsafe { (*ctx).ops.poll_cq }.ok_or_else(|| Error::invalid("the CQ's provider has no poll_cq op"))?;
        // SAFETY: as above.
        let notify = unsafe { (*ctx).ops.req_notify_cq };
        if cqe <= 0 {
            return Err(Error::invalid(format!("cq->cqe is {cqe}: a CQ must hold at least one CQE")));
        }
        let hold = super::device::Hold::new(ctx, cq.as_ptr(), "cq")?;
        Ok(CqHandle { cq, poll, notify, capacity: cqe as u32, _hold: hold })
    }

    /// Wraps a CQ whose provider ops are `poll` and `notify`, for code that has replaced the context's ops
    /// table entries with its own (an interposer) and keeps the provider's originals.
    ///
    /// # Safety
    /// As for [`CqHandle::from_raw`]; `poll` and `notify` are the provider's ops for `cq`.
    pub unsafe fn from_raw_with_ops(cq: *mut ibv_cq, poll: PollFn, notify: Option<NotifyFn>) -> Result<CqHandle> {
        // SAFETY: the caller's promise, as `from_raw` needs it.
        let mut h = unsafe { CqHandle::from_raw(cq) }?;
        h.poll = poll;
        h.notify = notify;
        Ok(h)
    }

    /// The `cqe` the provider reports now: larger or smaller than `capacity()` after `ibv_resize_cq`.
    pub fn current_cqe(&self) -> u32 {
        // SAFETY: the handle's contract keeps the CQ valid; a field read.
        let cqe = unsafe { (*self.cq.as_ptr()).cqe };
        cqe.max(0) as u32
    }

    /// The CQE capacity the provider granted (`cq->cqe` at attach time).
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    pub fn as_ptr(&self) -> *mut ibv_cq {
        self.cq.as_ptr()
    }

    /// Requests a completion event for the next (solicited) CQE, as `ibv_req_notify_cq` does.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let Some(notify) = self.notify else {
            return Err(Error::new(libc::EOPNOTSUPP, "the CQ's provider has no req_notify_cq op"));
        };
        // SAFETY: the handle's contract keeps the CQ valid.
        let ret = unsafe { notify(self.cq.as_ptr(), solicited_only as i32) };
        if ret != 0 {
            return Err(Error::new(ret.abs(), format!("the provider's req_notify_cq failed ({ret})")));
        }
        Ok(())
    }

    /// Polls up to `out.len()` CQEs into `out`.
    #[inline]
    pub fn poll(&self, out: &mut [ibv_wc]) -> Result<usize> {
        let got = self.poll_raw(out);
        if got <= 0 {
            // The common poll finds nothing: it returns before the bound below, which only a CQE needs.
            return if got == 0 { Ok(0) } else { Err(poll_failed(got)) };
        }
        Ok((got as usize).min(out.len()))
    }

    /// `poll` with the provider's answer as it gave it: a count of CQEs put in `out` (which a provider might
    /// overstate: `poll` bounds it by `out.len()`), 0, or a negative value for a CQ in error (`poll_failed`).
    #[inline]
    pub fn poll_raw(&self, out: &mut [ibv_wc]) -> i32 {
        let n = out.len().min(i32::MAX as usize) as i32;
        // SAFETY: the handle's contract keeps the CQ valid; `out` is writable for `n` entries.
        unsafe { (self.poll)(self.cq.as_ptr(), n, out.as_mut_ptr()) }
    }
}

/// The error of a provider poll that failed (kept out of line: the empty poll's path stays short).
#[cold]
#[inline(never)]
pub(crate) fn poll_failed(got: i32) -> Error {
    Error::new(libc::EIO, format!("the provider's poll_cq failed ({got}): the CQ is in error"))
}
