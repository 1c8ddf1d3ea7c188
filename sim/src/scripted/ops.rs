//! The device's ops table: the data-path verbs libibverbs' inline functions call through `context->ops`.
//!
//! Each callback copies what it needs out of the caller's structures, updates the model under one borrow, and
//! calls nothing outside the model, so the model is never borrowed re-entrantly. A panic (a bug in the model)
//! never unwinds into C: it becomes `EIO`.

use std::ffi::c_int;

use rdma_sys::{ibv_cq, ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_wc, ibv_wr_opcode};

use super::model::SendRequest;
use super::{ScriptedDevice, ScriptedWqe};
use crate::wr_chain::{guarded, post_chain, refuse};

/// Copies one send WR. SGEs are read only when `num_sge` is within `max_sge` (else the model rejects the WR).
///
/// # Safety
/// `wr` points to a valid `ibv_send_wr` whose `sg_list`, when non-NULL, holds `num_sge` entries.
unsafe fn read_send_wr(wr: *const ibv_send_wr, max_sge: u32) -> SendRequest {
    // SAFETY: the caller promises `wr` is valid for reads.
    let w = unsafe { &*wr };
    let mut wqe = ScriptedWqe {
        wr_id: w.wr_id,
        opcode: w.opcode,
        send_flags: w.send_flags,
        num_sge: w.num_sge,
        // SAFETY: both union members are a `u32` at offset 0; any bit pattern is valid.
        imm_data: unsafe { w.imm_data_invalidated_rkey_union.imm_data },
        ..ScriptedWqe::default()
    };
    let atomic = w.opcode == ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
    if atomic {
        // SAFETY: for atomic opcodes the `atomic` member is the one the caller filled; all members are plain data.
        let a = unsafe { w.wr.atomic };
        wqe.remote_addr = a.remote_addr;
        wqe.rkey = a.rkey;
        wqe.compare_add = a.compare_add;
        wqe.swap = a.swap;
    } else {
        // SAFETY: as above, for the `rdma` member (meaningless but harmless for opcodes that don't use it).
        let r = unsafe { w.wr.rdma };
        wqe.remote_addr = r.remote_addr;
        wqe.rkey = r.rkey;
    }
    let null_sg_list = w.num_sge > 0 && w.sg_list.is_null();
    if w.num_sge > 0 && w.num_sge as u32 <= max_sge && !w.sg_list.is_null() {
        // SAFETY: the caller promises `sg_list` holds `num_sge` entries.
        let sges = unsafe { std::slice::from_raw_parts(w.sg_list, w.num_sge as usize) };
        wqe.first_sge_addr = sges[0].addr;
        wqe.first_sge_length = sges[0].length;
        wqe.first_sge_lkey = sges[0].lkey;
        wqe.total_length = sges.iter().map(|s| u64::from(s.length)).sum();
    }
    SendRequest { wqe, null_sg_list }
}

/// `ibv_post_send`: posts the chain in order; on the first WR refused, returns its positive errno with
/// `*bad_wr` at it (earlier WRs stay posted).
pub(crate) unsafe extern "C" fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    guarded(libc::EIO, || {
        if qp.is_null() {
            return refuse(bad_wr, wr, libc::EINVAL);
        }
        // SAFETY: this callback is reached through `qp->context->ops`, so `qp` is a live QP whose context is a
        // scripted device's, alive while its objects are used.
        let Some(device) = (unsafe { ScriptedDevice::from_context((*qp).context) }) else {
            return refuse(bad_wr, wr, libc::EINVAL);
        };
        let mut model = device.model().borrow_mut();
        let Some(caps) = model.send_caps(qp) else {
            return refuse(bad_wr, wr, libc::EINVAL);
        };
        let post = |cur: *mut ibv_send_wr| {
            // SAFETY: `cur` is a WR of the caller's chain, valid for reads (`post_chain` hands on no other), with
            // its SGE list as `ibv_post_send` requires.
            model.post_send(qp, unsafe { read_send_wr(cur, caps.max_send_sge) })
        };
        // SAFETY: `wr` is the caller's WR chain, each element valid for reads as `ibv_post_send` requires.
        let (posted, rc) = unsafe { post_chain(wr, bad_wr, post) };
        if posted > 0 {
            model.doorbell(qp);
        }
        rc
    })
}

/// `ibv_post_recv`: as `post_send`, for receive WRs.
pub(crate) unsafe extern "C" fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    guarded(libc::EIO, || {
        if qp.is_null() {
            return refuse(bad_wr, wr, libc::EINVAL);
        }
        // SAFETY: as in `post_send`.
        let Some(device) = (unsafe { ScriptedDevice::from_context((*qp).context) }) else {
            return refuse(bad_wr, wr, libc::EINVAL);
        };
        let mut model = device.model().borrow_mut();
        let post = |cur: *mut ibv_recv_wr| {
            // SAFETY: `cur` is a WR of the caller's chain, valid for reads (`post_chain` hands on no other).
            let w = unsafe { &*cur };
            model.post_recv(qp, w.wr_id, w.num_sge, w.num_sge > 0 && w.sg_list.is_null())
        };
        // SAFETY: `wr` is the caller's receive WR chain, valid for reads as `ibv_post_recv` requires.
        unsafe { post_chain(wr, bad_wr, post) }.1
    })
}

/// `ibv_poll_cq`: up to `num_entries` CQEs in FIFO order; a negative errno for a CQ that is not ours.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    guarded(-libc::EIO, || {
        if cq.is_null() {
            return -libc::EINVAL;
        }
        // SAFETY: reached through `cq->context->ops`, so `cq` is a live CQ of a live scripted device.
        let Some(device) = (unsafe { ScriptedDevice::from_context((*cq).context) }) else {
            return -libc::EINVAL;
        };
        let mut model = device.model().borrow_mut();
        if !model.owns_cq(cq) {
            return -libc::EINVAL;
        }
        if num_entries <= 0 {
            return 0;
        }
        if wc.is_null() {
            return -libc::EINVAL;
        }
        let n = model.poll(cq, num_entries as usize, |i, entry| {
            // SAFETY: `wc` holds `num_entries` writable `ibv_wc`s as `ibv_poll_cq` requires, and `i` is below it.
            unsafe { wc.add(i).write(entry) };
        });
        n as c_int
    })
}

/// `ibv_req_notify_cq`: counts the arm and succeeds (the device raises no events).
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, _solicited_only: c_int) -> c_int {
    guarded(libc::EIO, || {
        if cq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: as in `poll_cq`.
        let Some(device) = (unsafe { ScriptedDevice::from_context((*cq).context) }) else {
            return libc::EINVAL;
        };
        let result = device.model().borrow_mut().arm(cq);
        match result {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}
