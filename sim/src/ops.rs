//! The device's ops table: the data-path verbs libibverbs' inline functions call through `context->ops`.
//!
//! Each callback copies what it needs out of the caller's structures (WRs, SGE lists, inline data), updates the
//! model under the device lock, and calls nothing outside the model, so the lock is never taken re-entrantly.
//! A panic (a bug in the model) never unwinds into C: it becomes `EIO`.

use std::ffi::c_int;

use rdma_sys::{ibv_cq, ibv_qp, ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_srq, ibv_wc};

use super::model::{RecvRequest, SendRequest, Sge};
use super::wr_chain::{guarded, post_chain, refuse};
use super::SimDevice;

fn copy_sges(list: *const ibv_sge, n: i32) -> Vec<Sge> {
    if n <= 0 || list.is_null() {
        return Vec::new();
    }
    // SAFETY: the caller of `ibv_post_send`/`ibv_post_recv` promises `sg_list` holds `num_sge` entries; `n` was
    // checked against the QP's caps before this is called.
    let sges = unsafe { std::slice::from_raw_parts(list, n as usize) };
    sges.iter().map(|s| Sge { addr: s.addr, len: s.length, lkey: s.lkey }).collect()
}

/// Copies one send WR: SGEs only when `num_sge` is within `max_sge` (else the model rejects the WR), inline data
/// only within `max_inline`.
///
/// # Safety
/// `wr` points to a valid `ibv_send_wr` whose `sg_list`, when non-NULL, holds `num_sge` entries, and whose
/// inline SGEs (with `IBV_SEND_INLINE`) point to readable bytes, as `ibv_post_send` requires.
unsafe fn read_send_wr(wr: *const ibv_send_wr, max_sge: u32, max_inline: u32, copy: bool) -> SendRequest {
    // SAFETY: the caller promises `wr` is valid for reads.
    let w = unsafe { &*wr };
    // SAFETY: both members of the union are a `u32` at offset 0; any bit pattern is valid.
    let imm = unsafe { w.imm_data_invalidated_rkey_union.imm_data };
    let atomic = w.opcode == rdma_sys::ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP
        || w.opcode == rdma_sys::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
    let (remote_addr, rkey, compare_add, swap) = if atomic {
        // SAFETY: for atomic opcodes the `atomic` member is the one the caller filled; all members are plain data.
        let a = unsafe { w.wr.atomic };
        (a.remote_addr, a.rkey, a.compare_add, a.swap)
    } else {
        // SAFETY: as above, for the `rdma` member (meaningless but harmless for opcodes that don't use it).
        let r = unsafe { w.wr.rdma };
        (r.remote_addr, r.rkey, 0, 0)
    };
    let in_range = w.num_sge >= 0 && w.num_sge as u32 <= max_sge;
    let null_sg_list = w.num_sge > 0 && w.sg_list.is_null();
    let inline_flag = w.send_flags & ibv_send_flags::IBV_SEND_INLINE.0 != 0;
    let mut req = SendRequest {
        wr_id: w.wr_id,
        opcode: w.opcode,
        flags: w.send_flags,
        num_sge: w.num_sge,
        null_sg_list,
        sges: Vec::new(),
        total_len: 0,
        inline: None,
        remote_addr,
        rkey,
        imm,
        compare_add,
        swap,
    };
    if !in_range || null_sg_list {
        return req;
    }
    if !copy && !inline_flag {
        // Null mode: only the length is needed.
        if w.num_sge > 0 {
            // SAFETY: as in `copy_sges` (`sg_list` is non-NULL: `null_sg_list` was checked above).
            let sges = unsafe { std::slice::from_raw_parts(w.sg_list, w.num_sge as usize) };
            req.total_len = sges.iter().map(|s| u64::from(s.length)).sum();
        }
        return req;
    }
    req.sges = copy_sges(w.sg_list, w.num_sge);
    req.total_len = req.sges.iter().map(|s| u64::from(s.len)).sum();
    if inline_flag && req.total_len <= u64::from(max_inline) {
        let mut data = Vec::with_capacity(req.total_len as usize);
        for s in &req.sges {
            // SAFETY: with IBV_SEND_INLINE the caller promises each SGE's `[addr, addr + length)` is readable
            // during the call (no lkey is involved); the data is copied now, as an HCA copies inline data at
            // post time.
            data.extend_from_slice(unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.len as usize) });
        }
        req.inline = Some(data);
    }
    req
}

/// `ibv_post_send`: posts the chain in order; on the first WR refused, returns its positive errno with
/// `*bad_wr` at it (earlier WRs stay posted).
pub(crate) unsafe extern "C" fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    guarded(libc::EIO, || {
        if qp.is_null() {
            return refuse(bad_wr, wr, libc::EINVAL);
        }
        // SAFETY: this callback is reached through `qp->context->ops`, so `qp` is a live QP whose context is a
        // sim device's, alive while its objects are used.
        let Some(device) = (unsafe { SimDevice::from_context((*qp).context) }) else {
            return refuse(bad_wr, wr, libc::EINVAL);
        };
        let mut model = device.model().lock();
        let Some((caps, copy)) = model.post_info(qp) else {
            return refuse(bad_wr, wr, libc::EINVAL);
        };
        let refusals = device.refusal_armed();
        let post = |cur: *mut ibv_send_wr| {
            // SAFETY: `cur` is a WR of the caller's chain, valid for reads (`post_chain` hands on no other); a
            // plain field read.
            let opcode = unsafe { (*cur).opcode };
            if let Some(errno) = refusals.then(|| device.refusal_of(qp, opcode)).flatten() {
                // A scripted refusal (`SimDevice::refuse_opcode`): the provider rejects this WR.
                return Err(errno);
            }
            // SAFETY: as above, with its SGE list and inline data as `ibv_post_send` requires.
            model.post_send(qp, unsafe { read_send_wr(cur, caps.max_send_sge, caps.max_inline_data, copy) })
        };
        // SAFETY: `wr` is the caller's WR chain, each element valid for reads as `ibv_post_send` requires.
        let (posted, rc) = unsafe { post_chain(wr, bad_wr, post) };
        if posted > 0 {
            model.doorbell(qp);
        }
        rc
    })
}

/// Copies one receive WR: its SGEs only when the model keeps them (`copy`) and `num_sge` is within `max_sge`.
///
/// # Safety
/// `wr` points to a valid `ibv_recv_wr` whose `sg_list`, when non-NULL, holds `num_sge` entries.
unsafe fn read_recv_wr(wr: *const ibv_recv_wr, max_sge: u32, copy: bool) -> RecvRequest {
    // SAFETY: the caller promises `wr` is valid for reads.
    let w = unsafe { &*wr };
    let null_sg_list = w.num_sge > 0 && w.sg_list.is_null();
    let in_range = w.num_sge >= 0 && w.num_sge as u32 <= max_sge;
    let sges = if copy && in_range && !null_sg_list { copy_sges(w.sg_list, w.num_sge) } else { Vec::new() };
    RecvRequest { wr_id: w.wr_id, num_sge: w.num_sge, null_sg_list, sges }
}

/// `ibv_post_recv`: as `post_send`, for receive WRs.
pub(crate) unsafe extern "C" fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    guarded(libc::EIO, || {
        if qp.is_null() {
            return refuse(bad_wr, wr, libc::EINVAL);
        }
        // SAFETY: as in `post_send`.
        let Some(device) = (unsafe { SimDevice::from_context((*qp).context) }) else {
            return refuse(bad_wr, wr, libc::EINVAL);
        };
        let mut model = device.model().lock();
        let Some((caps, copy)) = model.post_info(qp) else {
            return refuse(bad_wr, wr, libc::EINVAL);
        };
        let post = |cur: *mut ibv_recv_wr| {
            // SAFETY: `cur` is a WR of the caller's chain, valid for reads (`post_chain` hands on no other).
            model.post_recv(qp, unsafe { read_recv_wr(cur, caps.max_recv_sge, copy) })
        };
        // SAFETY: `wr` is the caller's receive WR chain, valid for reads as `ibv_post_recv` requires.
        unsafe { post_chain(wr, bad_wr, post) }.1
    })
}

/// `ibv_poll_cq`: advances the model `steps_per_poll` steps, then returns up to `num_entries` CQEs in FIFO
/// order; a negative errno for a CQ that is not ours.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    guarded(-libc::EIO, || {
        if cq.is_null() {
            return -libc::EINVAL;
        }
        // SAFETY: reached through `cq->context->ops`, so `cq` is a live CQ of a live sim device.
        let Some(device) = (unsafe { SimDevice::from_context((*cq).context) }) else {
            return -libc::EINVAL;
        };
        let mut model = device.model().lock();
        if !model.owns_cq(cq) {
            return -libc::EINVAL;
        }
        if num_entries < 0 || (num_entries > 0 && wc.is_null()) {
            return -libc::EINVAL;
        }
        let n = model.poll(cq, num_entries as usize, |i, entry| {
            // SAFETY: `wc` holds `num_entries` writable `ibv_wc`s as `ibv_poll_cq` requires, and `i` is below it.
            unsafe { wc.add(i).write(entry) };
        });
        n as c_int
    })
}

/// `ibv_req_notify_cq`: arms the CQ for its next CQE (any, or solicited only); one shot. When it fires, one
/// completion event is queued on the CQ's channel, if it has one.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guarded(libc::EIO, || {
        if cq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: as in `poll_cq`.
        let Some(device) = (unsafe { SimDevice::from_context((*cq).context) }) else {
            return libc::EINVAL;
        };
        let result = device.model().lock().arm(cq, solicited_only != 0);
        match result {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

/// `ibv_post_srq_recv`: posts the receive chain to the SRQ in order; on the first WR refused, returns its positive
/// errno with `*bad_wr` at it (earlier WRs stay posted).
pub(crate) unsafe extern "C" fn post_srq_recv(srq: *mut ibv_srq, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    guarded(libc::EIO, || {
        if srq.is_null() {
            return refuse(bad_wr, wr, libc::EINVAL);
        }
        // SAFETY: reached through `srq->context->ops`, so `srq` is a live SRQ whose context is a sim device's.
        let Some(device) = (unsafe { SimDevice::from_context((*srq).context) }) else {
            return refuse(bad_wr, wr, libc::EINVAL);
        };
        let mut model = device.model().lock();
        let Some((max_sge, copy)) = model.srq_post_info(srq) else {
            return refuse(bad_wr, wr, libc::EINVAL);
        };
        let post = |cur: *mut ibv_recv_wr| {
            // SAFETY: `cur` is a WR of the caller's chain, valid for reads (`post_chain` hands on no other).
            model.post_srq_recv(srq, unsafe { read_recv_wr(cur, max_sge, copy) })
        };
        // SAFETY: `wr` is the caller's receive WR chain, valid for reads as `ibv_post_srq_recv` requires.
        unsafe { post_chain(wr, bad_wr, post) }.1
    })
}
