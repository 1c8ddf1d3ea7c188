//! What the device tells a ULP outside the CQs: completion channels and their completion events
//! (`ibv_get_cq_event`, `ibv_ack_cq_events`), and asynchronous events (`ibv_get_async_event`).

use std::collections::VecDeque;
use std::ffi::c_void;

use rdma_sys::{ibv_comp_channel, ibv_cq, ibv_event_type};

use crate::{Error, Result};
use super::{Model, key};
use super::super::events::{AsyncElement, AsyncEvent, ChannelModel, EventFd};

impl Model {
    /// Queues an asynchronous event; the async fd becomes readable.
    pub(super) fn raise(&mut self, event_type: ibv_event_type, element: AsyncElement) {
        self.stats.async_events += 1;
        self.async_events.push_back(AsyncEvent { event_type, element });
        self.async_fd.set(true);
    }

    pub(crate) fn create_channel(&mut self) -> Result<*mut ibv_comp_channel> {
        let fd = EventFd::new()?;
        let obj = Box::into_raw(Box::new(ibv_comp_channel { context: self.ctx, fd: fd.fd(), refcnt: 0 }));
        self.channels.insert(key(obj), ChannelModel { obj, fd, events: VecDeque::new() });
        Ok(obj)
    }

    pub(crate) fn owns_channel(&self, ch: *mut ibv_comp_channel) -> bool {
        self.channels.contains_key(&key(ch))
    }

    /// `EBUSY` while a CQ uses the channel (libibverbs: while `refcnt` is not zero).
    pub(crate) fn destroy_channel(&mut self, ch: *mut ibv_comp_channel) -> Result<()> {
        let c = self.channels.get(&key(ch)).ok_or_else(|| Error::invalid(format!("channel {ch:p} is not a channel of this sim device")))?;
        // SAFETY: the channel object is alive, owned by `c`.
        let refcnt = unsafe { (*c.obj).refcnt };
        if refcnt > 0 {
            return Err(Error::new(libc::EBUSY, format!("channel {ch:p} is still used by {refcnt} CQ(s)")));
        }
        self.channels.remove(&key(ch));
        Ok(())
    }

    /// Takes the oldest completion event of the channel: the CQ and its `cq_context`. `EAGAIN` when none.
    pub(crate) fn get_cq_event(&mut self, ch: *mut ibv_comp_channel) -> Result<(*mut ibv_cq, *mut c_void)> {
        let c = self.channels.get_mut(&key(ch)).ok_or_else(|| Error::invalid(format!("channel {ch:p} is not a channel of this sim device")))?;
        let Some(cq_key) = c.events.pop_front() else {
            return Err(Error::new(libc::EAGAIN, "no completion event is pending on the channel"));
        };
        c.sync_fd();
        let cq = self.cqs.get_mut(&cq_key).expect("a CQ's events leave its channel when it is destroyed");
        cq.events_got += 1;
        // SAFETY: the CQ object is alive, owned by `cq`.
        let cq_context = unsafe { (*cq.obj).cq_context };
        Ok((cq.obj, cq_context))
    }

    /// Acknowledges `n` completion events of the CQ. `EINVAL` for more than were taken and not yet acknowledged
    /// (libibverbs does not check; a model that lets the count go wrong would hide the ULP's bug).
    pub(crate) fn ack_cq_events(&mut self, cq: *mut ibv_cq, n: u32) -> Result<()> {
        let c = self.cqs.get_mut(&key(cq)).ok_or_else(|| Error::invalid(format!("cq {cq:p} is not a CQ of this sim device")))?;
        let unacked = c.events_got - c.events_acked;
        if u64::from(n) > unacked {
            return Err(Error::invalid(format!("acknowledging {n} completion event(s) of cq {cq:p}, but only {unacked} are unacknowledged")));
        }
        c.events_acked += u64::from(n);
        // SAFETY: the CQ object is alive, owned by `c`; libibverbs' ibv_ack_cq_events counts here too.
        unsafe { (*c.obj).comp_events_completed = (*c.obj).comp_events_completed.wrapping_add(n) };
        Ok(())
    }

    /// Takes the oldest asynchronous event, if any.
    pub(crate) fn get_async_event(&mut self) -> Option<AsyncEvent> {
        let e = self.async_events.pop_front();
        self.async_fd.set(!self.async_events.is_empty());
        e
    }

    pub(crate) fn async_fd(&self) -> i32 {
        self.async_fd.fd()
    }
}
