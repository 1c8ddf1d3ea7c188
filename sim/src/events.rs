//! What the device tells a ULP outside the CQs: asynchronous events (`ibv_get_async_event(3)`) and completion
//! events on completion channels (`ibv_req_notify_cq(3)`, `ibv_get_cq_event(3)`), each behind a file
//! descriptor that is readable exactly while something is pending, so a ULP can sleep on it with epoll.

use std::collections::VecDeque;

use rdma_sys::{ibv_comp_channel, ibv_cq, ibv_event_type, ibv_qp, ibv_srq};

use crate::{Error, Result};

/// The object an asynchronous event is about (the member of `ibv_async_event.element` that is valid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncElement {
    Cq(*mut ibv_cq),
    Qp(*mut ibv_qp),
    Srq(*mut ibv_srq),
}

/// One asynchronous event, as `ibv_get_async_event` would return it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    pub event_type: ibv_event_type,
    pub element: AsyncElement,
}

impl AsyncEvent {
    /// Whether the event names `ptr` (a CQ, QP or SRQ of the device).
    pub(crate) fn names(&self, ptr: usize) -> bool {
        match self.element {
            AsyncElement::Cq(p) => p as usize == ptr,
            AsyncElement::Qp(p) => p as usize == ptr,
            AsyncElement::Srq(p) => p as usize == ptr,
        }
    }
}

/// A nonblocking eventfd kept readable exactly while its owner has something pending: `set(true)` makes it
/// readable, `set(false)` drains it. Only the owner reads it; a ULP only waits on it (poll/epoll/select).
pub(crate) struct EventFd {
    fd: i32,
    readable: bool,
}

impl EventFd {
    pub(crate) fn new() -> Result<EventFd> {
        // SAFETY: plain system call with no pointer argument.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EMFILE);
            return Err(Error::new(errno, format!("eventfd failed: {}", std::io::Error::from_raw_os_error(errno))));
        }
        Ok(EventFd { fd, readable: false })
    }

    pub(crate) fn fd(&self) -> i32 {
        self.fd
    }

    pub(crate) fn set(&mut self, pending: bool) {
        if pending == self.readable {
            return;
        }
        let mut value: u64 = 1;
        // SAFETY: `fd` is our open eventfd; `value` is 8 readable/writable bytes, the size eventfd requires.
        // Nonblocking: a write cannot block (the counter is 0 or 1), a read drains it or fails with EAGAIN.
        let n = unsafe {
            if pending {
                libc::write(self.fd, std::ptr::addr_of!(value).cast(), 8)
            } else {
                libc::read(self.fd, std::ptr::addr_of_mut!(value).cast(), 8)
            }
        };
        if n == 8 || !pending {
            self.readable = pending;
        }
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: `fd` is owned by this value and closed only here.
        unsafe { libc::close(self.fd) };
    }
}

/// A completion channel: a real `struct ibv_comp_channel` whose `fd` is readable while completion events are
/// queued, and the queue (CQs, oldest first).
pub(crate) struct ChannelModel {
    pub(crate) obj: *mut ibv_comp_channel,
    pub(crate) fd: EventFd,
    /// Completion events not yet taken by `get_cq_event`: the key of the CQ each is for.
    pub(crate) events: VecDeque<usize>,
}

impl ChannelModel {
    pub(crate) fn sync_fd(&mut self) {
        self.fd.set(!self.events.is_empty());
    }
}

impl Drop for ChannelModel {
    fn drop(&mut self) {
        // SAFETY: `obj` came from `Box::into_raw` in `Model::create_channel` and is freed only here, once.
        drop(unsafe { Box::from_raw(self.obj) });
    }
}
