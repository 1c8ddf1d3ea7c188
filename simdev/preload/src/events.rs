//! Completion events (`ibv_get_cq_event`, `ibv_ack_cq_events`) and asynchronous events
//! (`ibv_get_async_event`, `ibv_ack_async_event`): each read from a socket the daemon writes records to, so the
//! program can poll the channel's `fd` and the context's `async_fd`, blocking or not, as with a kernel device.

use std::ffi::{c_int, c_void};

use rdma_sys::{ibv_async_event, ibv_comp_channel, ibv_context, ibv_cq, ibv_event_type, ibv_qp, ibv_srq};
use sqdisc_sim_proto::{EventRecord, EVENT_ASYNC_CQ, EVENT_ASYNC_PORT, EVENT_ASYNC_QP, EVENT_ASYNC_SRQ, EVENT_COMPLETION};

use crate::context::{context, fatal_once};
use crate::set_errno;

/// Reads one record: `Ok(None)` at end of stream (the daemon has gone).
fn read_record(fd: c_int) -> Result<Option<EventRecord>, i32> {
    let mut b = [0u8; EventRecord::SIZE];
    loop {
        // SAFETY: `b` is writable for its length; `fd` is the program's channel or async descriptor.
        let n = unsafe { libc::read(fd, b.as_mut_ptr().cast(), b.len()) };
        if n == EventRecord::SIZE as isize {
            return Ok(Some(EventRecord::from_bytes(&b)));
        }
        if n == 0 {
            return Ok(None);
        }
        if n < 0 {
            // SAFETY: reads the calling thread's errno.
            let e = unsafe { *libc::__errno_location() };
            // EINTR included: as libibverbs' read of a kernel event file, a signal ends the wait (-1, EINTR).
            return Err(e);
        }
        return Err(libc::EIO);
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(channel: *mut ibv_comp_channel, cq: *mut *mut ibv_cq, cq_context: *mut *mut c_void) -> c_int {
    if channel.is_null() || cq.is_null() || cq_context.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: a channel of this library (the caller's contract).
    let fd = unsafe { (*channel).fd };
    match read_record(fd) {
        Ok(Some(rec)) if rec.kind == EVENT_COMPLETION => {
            let obj = rec.cookie as *mut ibv_cq;
            // SAFETY: the cookie is the address of the program's CQ, which stays alive while its events are
            // unacknowledged (libibverbs' rule: destroy waits for acknowledgements).
            unsafe {
                *cq = obj;
                *cq_context = (*obj).cq_context;
            }
            0
        }
        Ok(Some(_)) => {
            set_errno(libc::EPROTO);
            -1
        }
        Ok(None) => {
            eprintln!("sqdisc-sim: ibv_get_cq_event: the sqdisc-sim daemon has gone");
            set_errno(libc::EIO);
            -1
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, n: u32) {
    if cq.is_null() {
        return;
    }
    // SAFETY: a CQ of this library; the counter is the program's to read, as libibverbs keeps it.
    unsafe { (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(n) };
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(ctx: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
    // SAFETY: a context pointer of the caller; checked against the live set.
    let Some(c) = (unsafe { context(ctx) }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: plain data; zero is valid.
    let mut ev: ibv_async_event = unsafe { std::mem::zeroed() };
    // SAFETY: the live context's async descriptor.
    let fd = unsafe { (*ctx).async_fd };
    match read_record(fd) {
        Ok(Some(rec)) => {
            let Some(t) = event_type(rec.event_type) else {
                set_errno(libc::EPROTO);
                return -1;
            };
            ev.event_type = t;
            match rec.kind {
                EVENT_ASYNC_CQ => ev.element.cq = rec.cookie as *mut ibv_cq,
                EVENT_ASYNC_QP => ev.element.qp = rec.cookie as *mut ibv_qp,
                EVENT_ASYNC_SRQ => ev.element.srq = rec.cookie as *mut ibv_srq,
                EVENT_ASYNC_PORT => ev.element.port_num = rec.cookie as c_int,
                _ => {
                    set_errno(libc::EPROTO);
                    return -1;
                }
            }
        }
        // The daemon has gone: the device is lost, as a kernel device reports it, once.
        Ok(None) if fatal_once(c) => {
            ev.event_type = ibv_event_type::IBV_EVENT_DEVICE_FATAL;
        }
        Ok(None) => {
            set_errno(libc::EIO);
            return -1;
        }
        Err(e) => {
            set_errno(e);
            return -1;
        }
    }
    // SAFETY: the caller's non-NULL event struct.
    unsafe { event.write(ev) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(_event: *mut ibv_async_event) {}

fn event_type(t: u32) -> Option<ibv_event_type> {
    use ibv_event_type::*;
    const ALL: [ibv_event_type; 20] = [
        IBV_EVENT_CQ_ERR,
        IBV_EVENT_QP_FATAL,
        IBV_EVENT_QP_REQ_ERR,
        IBV_EVENT_QP_ACCESS_ERR,
        IBV_EVENT_COMM_EST,
        IBV_EVENT_SQ_DRAINED,
        IBV_EVENT_PATH_MIG,
        IBV_EVENT_PATH_MIG_ERR,
        IBV_EVENT_DEVICE_FATAL,
        IBV_EVENT_PORT_ACTIVE,
        IBV_EVENT_PORT_ERR,
        IBV_EVENT_LID_CHANGE,
        IBV_EVENT_PKEY_CHANGE,
        IBV_EVENT_SM_CHANGE,
        IBV_EVENT_SRQ_ERR,
        IBV_EVENT_SRQ_LIMIT_REACHED,
        IBV_EVENT_QP_LAST_WQE_REACHED,
        IBV_EVENT_CLIENT_REREGISTER,
        IBV_EVENT_GID_CHANGE,
        IBV_EVENT_WQ_FATAL,
    ];
    ALL.into_iter().find(|e| *e as u32 == t)
}
