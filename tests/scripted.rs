//! The scripted test device, driven through its ops table exactly as libibverbs' inline functions drive a
//! provider (`qp->context->ops.post_send(qp, wr, &bad)` ...).
//!
//! Each check is written against the `Scriptable` trait so that it can run unchanged on another device model.

use std::ptr;

use rdma_sys::{
    ibv_cq, ibv_qp, ibv_qp_state, ibv_qp_type, ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc, ibv_wc_flags,
    ibv_wc_opcode, ibv_wc_status, ibv_wr_opcode,
};
use sqdisc_sim::scripted::{Scriptable, ScriptedDevice, ScriptedQpCaps};

mod common;

const SIGNALED: u32 = ibv_send_flags::IBV_SEND_SIGNALED.0;
const INLINE: u32 = ibv_send_flags::IBV_SEND_INLINE.0;
const GARBAGE: u32 = 0xffff_ffff;

/// One send WR and the SGEs it points to.
struct Wr {
    wr: ibv_send_wr,
    sges: Vec<ibv_sge>,
}

fn wr(wr_id: u64, opcode: u32, flags: u32, sge_lengths: &[u32]) -> Wr {
    // SAFETY: `ibv_send_wr` is plain data; all-zero (NULL pointers, zero counts) is a valid value.
    let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
    w.wr_id = wr_id;
    w.opcode = opcode;
    w.send_flags = flags;
    let sges: Vec<ibv_sge> = sge_lengths
        .iter()
        .enumerate()
        .map(|(i, &length)| ibv_sge { addr: 0x1000 * (i as u64 + 1), length, lkey: 0x10 + i as u32 })
        .collect();
    w.num_sge = sges.len() as i32;
    Wr { wr: w, sges }
}

fn send(wr_id: u64, signaled: bool) -> Wr {
    wr(wr_id, ibv_wr_opcode::IBV_WR_SEND, if signaled { SIGNALED } else { 0 }, &[64])
}

/// Posts `wrs` as one chain through the ops table. Returns the provider's result and the index of `*bad_wr`.
fn post(qp: *mut ibv_qp, wrs: &mut [Wr]) -> (i32, Option<usize>) {
    for w in wrs.iter_mut() {
        w.wr.sg_list = if w.sges.is_empty() { ptr::null_mut() } else { w.sges.as_mut_ptr() };
    }
    for i in (0..wrs.len()).rev() {
        let next = if i + 1 < wrs.len() { ptr::addr_of_mut!(wrs[i + 1].wr) } else { ptr::null_mut() };
        wrs[i].wr.next = next;
    }
    let head = wrs.first_mut().map_or(ptr::null_mut(), |w| ptr::addr_of_mut!(w.wr));
    let mut bad: *mut ibv_send_wr = ptr::null_mut();
    // SAFETY: `qp` is a live scripted QP; the chain and its SGE lists live in `wrs` for the whole call.
    let rc = unsafe { (*(*qp).context).ops.post_send.unwrap()(qp, head, &mut bad) };
    let at = wrs.iter().position(|w| ptr::eq(&w.wr, bad));
    (rc, at)
}

fn post1(qp: *mut ibv_qp, w: Wr) -> i32 {
    post(qp, &mut [w]).0
}

fn post_recv(qp: *mut ibv_qp, wr_ids: &[u64]) -> (i32, Option<usize>) {
    let mut sges = vec![ibv_sge { addr: 0x9000, length: 4096, lkey: 7 }; wr_ids.len()];
    let mut wrs: Vec<ibv_recv_wr> = wr_ids
        .iter()
        .zip(sges.iter_mut())
        .map(|(&wr_id, sge)| ibv_recv_wr { wr_id, next: ptr::null_mut(), sg_list: sge, num_sge: 1 })
        .collect();
    for i in (0..wrs.len().saturating_sub(1)).rev() {
        wrs[i].next = ptr::addr_of_mut!(wrs[i + 1]);
    }
    let head = wrs.first_mut().map_or(ptr::null_mut(), |w| w as *mut ibv_recv_wr);
    let mut bad: *mut ibv_recv_wr = ptr::null_mut();
    // SAFETY: as in `post`.
    let rc = unsafe { (*(*qp).context).ops.post_recv.unwrap()(qp, head, &mut bad) };
    (rc, wrs.iter().position(|w| ptr::eq(w, bad)))
}

fn poll(cq: *mut ibv_cq, max: usize) -> Vec<ibv_wc> {
    // SAFETY: `ibv_wc` is plain data; zero is valid.
    let mut wcs: Vec<ibv_wc> = (0..max).map(|_| unsafe { std::mem::zeroed() }).collect();
    // SAFETY: `cq` is a live scripted CQ and `wcs` holds `max` entries.
    let n = unsafe { (*(*cq).context).ops.poll_cq.unwrap()(cq, max as i32, wcs.as_mut_ptr()) };
    assert!(n >= 0, "poll_cq failed: {n}");
    wcs.truncate(n as usize);
    wcs
}

fn ids(wcs: &[ibv_wc]) -> Vec<(u64, u32)> {
    wcs.iter().map(|wc| (wc.wr_id, wc.status)).collect()
}

/// A device with one CQ of `cqe` used for both sides of one QP.
fn qp_on_cq(dev: &dyn Scriptable, cqe: i32, caps: ScriptedQpCaps) -> (*mut ibv_cq, *mut ibv_qp) {
    let cq = dev.create_cq(cqe).unwrap();
    let qp = dev.create_qp(cq, cq, &caps).unwrap();
    (cq, qp)
}

fn check_objects_are_real_verbs_objects(dev: &dyn Scriptable) {
    let ctx = dev.context();
    let pd = dev.pd();
    let cq = dev.create_cq(16).unwrap();
    let caps = ScriptedQpCaps::with_depths(8, 4);
    let a = dev.create_qp(cq, cq, &caps).unwrap();
    let b = dev.create_qp(cq, cq, &caps).unwrap();
    // SAFETY: all of these are live objects of `dev`.
    unsafe {
        assert!((*ctx).ops.post_send.is_some() && (*ctx).ops.post_recv.is_some());
        assert!((*ctx).ops.poll_cq.is_some() && (*ctx).ops.req_notify_cq.is_some());
        assert!((*ctx).ops.bind_mw.is_none() && (*ctx).ops.post_srq_recv.is_none());
        assert_eq!((*pd).context, ctx);
        assert_eq!((*cq).context, ctx);
        assert_eq!((*cq).cqe, 16);
        for qp in [a, b] {
            assert_eq!((*qp).context, ctx);
            assert_eq!((*qp).pd, pd);
            assert_eq!((*qp).send_cq, cq);
            assert_eq!((*qp).recv_cq, cq);
            assert_eq!((*qp).qp_type, ibv_qp_type::IBV_QPT_RC);
            assert_eq!((*qp).state, ibv_qp_state::IBV_QPS_RTS);
            assert_ne!((*qp).qp_num, 0);
        }
        assert_ne!((*a).qp_num, (*b).qp_num);
        // The rdma-sys copies of the libibverbs inline functions reach the model too.
        let mut w = send(1, true);
        w.wr.sg_list = w.sges.as_mut_ptr();
        let mut bad = ptr::null_mut();
        assert_eq!(rdma_sys::ibv_post_send(a, &mut w.wr, &mut bad), 0);
        assert_eq!(rdma_sys::ibv_req_notify_cq(cq, 0), 0);
        assert_eq!(rdma_sys::ibv_req_notify_cq(cq, 1), 0);
    }
    assert_eq!(dev.qp_caps(a).unwrap(), caps);
    assert_eq!(dev.qp_stats(a).unwrap().wqes_posted, 1);
    assert_eq!(dev.cq_stats(cq).unwrap().arms, 2);
}

fn check_full_sq_enomem_at_first_refused_wr(dev: &dyn Scriptable) {
    let (_cq, qp) = qp_on_cq(dev, 64, ScriptedQpCaps::with_depths(4, 4));
    let mut chain: Vec<Wr> = (0..6).map(|i| send(100 + i, true)).collect();
    let (rc, bad) = post(qp, &mut chain);
    assert_eq!(rc, libc::ENOMEM, "a full SQ returns positive ENOMEM");
    assert_eq!(bad, Some(4), "bad_wr is the first WR that did not fit");
    let s = dev.qp_stats(qp).unwrap();
    assert_eq!((s.wqes_posted, s.outstanding, s.doorbells, s.violations), (4, 4, 1, 1));
    assert_eq!(dev.wqe(qp, 3).unwrap().wr_id, 103);
    assert!(dev.wqe(qp, 4).is_err(), "the refused WRs were not recorded");
    let v = dev.violations();
    assert_eq!(v.len(), 1);
    assert!(v[0].starts_with("SQ overflow"), "{}", v[0]);
    // A chain whose very first WR is refused rings no doorbell.
    assert_eq!(post(qp, &mut [send(200, true)]), (libc::ENOMEM, Some(0)));
    assert_eq!(dev.qp_stats(qp).unwrap().doorbells, 1);
}

fn check_unsignaled_stream_fills_sq_forever(dev: &dyn Scriptable) {
    let (cq, qp) = qp_on_cq(dev, 64, ScriptedQpCaps::with_depths(4, 4));
    for i in 0..4 {
        assert_eq!(post1(qp, send(i, false)), 0);
    }
    assert_eq!(dev.complete(qp, 10).unwrap(), 4, "complete returns how many were waiting");
    assert!(poll(cq, 16).is_empty(), "unsignaled WQEs produce no CQE");
    let s = dev.qp_stats(qp).unwrap();
    assert_eq!((s.executed, s.outstanding, s.doorbells), (4, 4, 4));
    assert!(dev.wqe(qp, 0).unwrap().executed);
    // Executed, but no polled CQE freed the slots: the SQ stays full.
    for _ in 0..3 {
        assert_eq!(post1(qp, send(9, false)), libc::ENOMEM);
        assert!(poll(cq, 16).is_empty());
    }
    assert_eq!(dev.qp_stats(qp).unwrap().outstanding, 4);
    assert_eq!(dev.violations().len(), 3);
}

fn check_signaled_cqe_frees_earlier_slots_when_polled(dev: &dyn Scriptable) {
    let (cq, qp) = qp_on_cq(dev, 64, ScriptedQpCaps::with_depths(4, 4));
    // U S U U: the signaled CQE frees the first two slots only.
    let (rc, _) = post(qp, &mut [send(1, false), send(2, true), send(3, false), send(4, false)]);
    assert_eq!(rc, 0);
    assert_eq!(dev.complete(qp, 4).unwrap(), 4);
    assert_eq!(dev.cq_stats(cq).unwrap().queued, 1);
    assert_eq!(dev.qp_stats(qp).unwrap().outstanding, 4, "a generated CQE frees nothing until polled");
    assert_eq!(post1(qp, send(5, true)), libc::ENOMEM);
    let wcs = poll(cq, 16);
    assert_eq!(ids(&wcs), vec![(2, ibv_wc_status::IBV_WC_SUCCESS)]);
    assert_eq!(wcs[0].opcode, ibv_wc_opcode::IBV_WC_SEND);
    assert_eq!(wcs[0].byte_len, 64);
    // SAFETY: `qp` is live.
    assert_eq!(wcs[0].qp_num, unsafe { (*qp).qp_num });
    assert_eq!(dev.qp_stats(qp).unwrap().outstanding, 2, "slots up to and including the polled WQE are freed");
    assert_eq!(post(qp, &mut [send(6, false), send(7, true), send(8, false)]), (libc::ENOMEM, Some(2)));
    assert_eq!(dev.complete(qp, 4).unwrap(), 2);
    assert_eq!(ids(&poll(cq, 16)), vec![(7, 0)]);
    assert_eq!(dev.qp_stats(qp).unwrap().outstanding, 0);
    assert_eq!(dev.qp_stats(qp).unwrap().max_outstanding, 4);
}

fn check_fail_then_flush_in_order(dev: &dyn Scriptable) {
    let (cq, qp) = qp_on_cq(dev, 64, ScriptedQpCaps::with_depths(8, 4));
    assert_eq!(post_recv(qp, &[50, 51]), (0, None));
    let (rc, _) = post(qp, &mut [send(1, true), send(2, false), send(3, false), send(4, true)]);
    assert_eq!(rc, 0);
    assert_eq!(dev.complete(qp, 1).unwrap(), 1);
    dev.fail(qp, ibv_wc_status::IBV_WC_REM_ACCESS_ERR, 0x42).unwrap();
    let s = dev.qp_stats(qp).unwrap();
    assert!(s.in_error);
    // SAFETY: `qp` is live.
    assert_eq!(unsafe { (*qp).state }, ibv_qp_state::IBV_QPS_ERR);
    let wcs = poll(cq, 16);
    let flush = ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
    assert_eq!(
        ids(&wcs),
        vec![(1, 0), (2, ibv_wc_status::IBV_WC_REM_ACCESS_ERR), (3, flush), (4, flush), (50, flush), (51, flush)],
        "the failed WQE (unsignaled) gets its CQE, then every later send, then every receive flushes"
    );
    assert_eq!(wcs[1].vendor_err, 0x42);
    for wc in &wcs[1..] {
        assert_eq!(wc.opcode, GARBAGE, "opcode is not meaningful on error CQEs");
        // SAFETY: `qp` is live.
        assert_eq!(wc.qp_num, unsafe { (*qp).qp_num });
    }
    let s = dev.qp_stats(qp).unwrap();
    assert_eq!((s.executed, s.flushed, s.cqes_generated), (2, 4, 6));
    assert_eq!((s.outstanding, s.recv_outstanding), (0, 0));
    let w = dev.wqe(qp, 1).unwrap();
    assert!(w.executed && !w.flushed && w.status == ibv_wc_status::IBV_WC_REM_ACCESS_ERR);
    assert!(dev.wqe(qp, 2).unwrap().flushed);
    assert!(dev.fail(qp, ibv_wc_status::IBV_WC_REM_ACCESS_ERR, 0).is_err(), "nothing left to fail");
    assert_eq!(dev.fail(qp, ibv_wc_status::IBV_WC_SUCCESS, 0).unwrap_err().errno(), libc::EINVAL);
}

fn check_errored_qp_flushes_posts_at_once(dev: &dyn Scriptable) {
    let (cq, qp) = qp_on_cq(dev, 64, ScriptedQpCaps::with_depths(2, 2));
    assert_eq!(post_recv(qp, &[70]).0, 0);
    assert_eq!(post(qp, &mut [send(1, false), send(2, false)]).0, 0);
    dev.set_error(qp).unwrap();
    let flush = ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
    assert_eq!(ids(&poll(cq, 16)), vec![(1, flush), (2, flush), (70, flush)]);
    assert_eq!(post1(qp, send(3, false)), 0, "a post to an errored QP is accepted");
    assert_eq!(post_recv(qp, &[71]).0, 0);
    assert_eq!(ids(&poll(cq, 16)), vec![(3, flush), (71, flush)], "and flushed at once, signaled or not");
    let s = dev.qp_stats(qp).unwrap();
    assert_eq!((s.flushed, s.outstanding, s.recv_outstanding, s.violations), (5, 0, 0, 0));
    assert!(dev.deliver(qp, 8, None).is_err());
}

fn check_cq_overrun_loses_cqe(dev: &dyn Scriptable) {
    let (cq, qp) = qp_on_cq(dev, 2, ScriptedQpCaps::with_depths(8, 4));
    assert_eq!(post(qp, &mut [send(1, true), send(2, true), send(3, true)]).0, 0);
    assert_eq!(dev.complete(qp, 3).unwrap(), 3);
    let c = dev.cq_stats(cq).unwrap();
    assert_eq!((c.capacity, c.queued, c.max_queued, c.overruns, c.in_error), (2, 2, 2, 1, true));
    let v = dev.violations();
    assert_eq!(v.len(), 1);
    assert!(v[0].starts_with("CQ overrun"), "{}", v[0]);
    assert_eq!(ids(&poll(cq, 16)), vec![(1, 0), (2, 0)], "the third CQE is lost");
    let s = dev.qp_stats(qp).unwrap();
    assert_eq!((s.cqes_generated, s.violations), (3, 1));
    assert_eq!(s.outstanding, 1, "the lost CQE's slot is never freed by it");
}

fn check_shared_cq_between_two_qps(dev: &dyn Scriptable) {
    let cq = dev.create_cq(16).unwrap();
    let other = dev.create_cq(16).unwrap();
    let caps = ScriptedQpCaps::with_depths(4, 4);
    let a = dev.create_qp(cq, other, &caps).unwrap();
    let b = dev.create_qp(cq, other, &caps).unwrap();
    assert_eq!(post(a, &mut [send(1, false), send(2, true)]).0, 0);
    assert_eq!(post(b, &mut [send(1, true), send(2, false)]).0, 0);
    assert_eq!(dev.complete(b, 2).unwrap(), 2);
    assert_eq!(dev.complete(a, 2).unwrap(), 2);
    let wcs = poll(cq, 1);
    // SAFETY: `a` and `b` are live.
    let (qa, qb) = unsafe { ((*a).qp_num, (*b).qp_num) };
    assert_eq!((wcs[0].wr_id, wcs[0].qp_num), (1, qb));
    assert_eq!(dev.qp_stats(b).unwrap().outstanding, 1, "b's CQE frees b's first slot only");
    assert_eq!(dev.qp_stats(a).unwrap().outstanding, 2, "and none of a's");
    let wcs = poll(cq, 4);
    assert_eq!(wcs.iter().map(|w| (w.wr_id, w.qp_num)).collect::<Vec<_>>(), vec![(2, qa)]);
    assert_eq!(dev.qp_stats(a).unwrap().outstanding, 0);
    assert_eq!(dev.qp_stats(b).unwrap().outstanding, 1);
    assert!(poll(other, 4).is_empty());
    // Destroying a QP removes its CQEs still queued on a shared CQ.
    assert_eq!(post1(b, send(3, true)), 0);
    assert_eq!(post1(a, send(4, true)), 0);
    dev.complete(b, 1).unwrap();
    dev.complete(a, 1).unwrap();
    assert_eq!(dev.destroy_cq(cq).unwrap_err().errno(), libc::EBUSY);
    dev.destroy_qp(b).unwrap();
    assert_eq!(poll(cq, 4).iter().map(|w| (w.wr_id, w.qp_num)).collect::<Vec<_>>(), vec![(4, qa)]);
    assert!(dev.qp_stats(b).is_err());
    dev.destroy_qp(a).unwrap();
    dev.destroy_cq(cq).unwrap();
    dev.destroy_cq(other).unwrap();
}

fn check_send_and_recv_of_one_qp_on_one_cq(dev: &dyn Scriptable) {
    let (cq, qp) = qp_on_cq(dev, 16, ScriptedQpCaps::with_depths(2, 2));
    // The same wr_id on both sides: only the device's own bookkeeping tells the CQEs apart.
    assert_eq!(post_recv(qp, &[7]).0, 0);
    assert_eq!(post1(qp, send(7, true)), 0);
    dev.complete(qp, 1).unwrap();
    dev.deliver(qp, 100, Some(0x1234_5678u32.to_be())).unwrap();
    let wcs = poll(cq, 1);
    assert_eq!((wcs[0].opcode, wcs[0].wr_id), (ibv_wc_opcode::IBV_WC_SEND, 7));
    let s = dev.qp_stats(qp).unwrap();
    assert_eq!((s.outstanding, s.recv_outstanding), (0, 1));
    let wcs = poll(cq, 1);
    assert_eq!((wcs[0].opcode, wcs[0].wr_id, wcs[0].byte_len), (ibv_wc_opcode::IBV_WC_RECV, 7, 100));
    assert_eq!(wcs[0].wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0, ibv_wc_flags::IBV_WC_WITH_IMM.0);
    // SAFETY: the CQE carries immediate data, so `imm_data` is the member written.
    assert_eq!(u32::from_be(unsafe { wcs[0].imm_data_invalidated_rkey_union.imm_data }), 0x1234_5678);
    assert_eq!(dev.qp_stats(qp).unwrap().recv_outstanding, 0);
    // On flush the opcode is garbage; the send and receive slots are still told apart.
    assert_eq!(post_recv(qp, &[7, 7]).0, 0);
    assert_eq!(post1(qp, send(7, false)), 0);
    dev.set_error(qp).unwrap();
    let wcs = poll(cq, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].opcode), (7, GARBAGE));
    let s = dev.qp_stats(qp).unwrap();
    assert_eq!((s.outstanding, s.recv_outstanding), (0, 2), "the first flush CQE was the send's");
    assert_eq!(poll(cq, 4).len(), 2);
    assert_eq!(dev.qp_stats(qp).unwrap().recv_outstanding, 0);
}

fn check_receive_queue(dev: &dyn Scriptable) {
    let (cq, qp) = qp_on_cq(dev, 16, ScriptedQpCaps::with_depths(2, 2));
    assert_eq!(dev.deliver(qp, 1, None).unwrap_err().errno(), libc::ENOENT);
    assert_eq!(post_recv(qp, &[1, 2, 3]), (libc::ENOMEM, Some(2)));
    assert!(dev.violations()[0].starts_with("RQ overflow"));
    dev.deliver(qp, 10, None).unwrap();
    assert_eq!(post_recv(qp, &[4]).0, libc::ENOMEM, "a receive slot is freed only when its CQE is polled");
    let wcs = poll(cq, 4);
    assert_eq!((wcs[0].wr_id, wcs[0].wc_flags), (1, 0));
    assert_eq!(post_recv(qp, &[4]).0, 0);
    assert_eq!(dev.qp_stats(qp).unwrap().recv_posted, 3);
}

fn check_wr_validation(dev: &dyn Scriptable) {
    let caps = ScriptedQpCaps { max_send_wr: 8, max_recv_wr: 2, max_send_sge: 2, max_recv_sge: 1, max_inline_data: 32 };
    let (_cq, qp) = qp_on_cq(dev, 16, caps);
    let sges3 = wr(1, ibv_wr_opcode::IBV_WR_SEND, SIGNALED, &[1, 1, 1]);
    assert_eq!(post(qp, &mut [send(0, false), sges3]), (libc::EINVAL, Some(1)));
    assert_eq!(post1(qp, wr(2, ibv_wr_opcode::IBV_WR_SEND, INLINE, &[16, 17])), libc::EINVAL);
    assert_eq!(post1(qp, wr(3, ibv_wr_opcode::IBV_WR_SEND, INLINE, &[16, 16])), 0);
    assert_eq!(post1(qp, wr(4, ibv_wr_opcode::IBV_WR_TSO, 0, &[8])), libc::EINVAL);
    let mut null_list = send(5, false);
    null_list.wr.num_sge = 1;
    null_list.sges.clear();
    assert_eq!(post1(qp, null_list), libc::EINVAL);
    let v = dev.violations();
    assert_eq!(v.len(), 4, "{v:?}");
    assert!(v[0].starts_with("too many SGEs") && v[1].starts_with("inline too large"), "{v:?}");
    let s = dev.qp_stats(qp).unwrap();
    assert_eq!((s.wqes_posted, s.violations), (2, 4));
}

fn check_wqe_record_and_cqe_opcodes(dev: &dyn Scriptable) {
    let (cq, qp) = qp_on_cq(dev, 64, ScriptedQpCaps::with_depths(16, 2));
    let mut write = wr(10, ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM, SIGNALED, &[100, 28]);
    write.wr.wr.rdma = rdma_sys::rdma_t { remote_addr: 0xabc000, rkey: 0x77 };
    write.wr.imm_data_invalidated_rkey_union.imm_data = 0xfeed;
    let mut cas = wr(11, ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP, SIGNALED, &[8]);
    cas.wr.wr.atomic = rdma_sys::atomic_t { remote_addr: 0xdef000, compare_add: 5, swap: 6, rkey: 0x88 };
    assert_eq!(post(qp, &mut [write, cas]).0, 0);
    let w = dev.wqe(qp, 0).unwrap();
    assert_eq!((w.wr_id, w.opcode, w.num_sge, w.total_length), (10, ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM, 2, 128));
    assert_eq!((w.first_sge_addr, w.first_sge_length, w.first_sge_lkey), (0x1000, 100, 0x10));
    assert_eq!((w.remote_addr, w.rkey, w.imm_data, w.signaled, w.executed), (0xabc000, 0x77, 0xfeed, true, false));
    let a = dev.wqe(qp, 1).unwrap();
    assert_eq!((a.remote_addr, a.rkey, a.compare_add, a.swap), (0xdef000, 0x88, 5, 6));
    let table = [
        (ibv_wr_opcode::IBV_WR_SEND, ibv_wc_opcode::IBV_WC_SEND),
        (ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, ibv_wc_opcode::IBV_WC_SEND),
        (ibv_wr_opcode::IBV_WR_SEND_WITH_INV, ibv_wc_opcode::IBV_WC_SEND),
        (ibv_wr_opcode::IBV_WR_RDMA_WRITE, ibv_wc_opcode::IBV_WC_RDMA_WRITE),
        (ibv_wr_opcode::IBV_WR_RDMA_READ, ibv_wc_opcode::IBV_WC_RDMA_READ),
        (ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD, ibv_wc_opcode::IBV_WC_FETCH_ADD),
        (ibv_wr_opcode::IBV_WR_LOCAL_INV, ibv_wc_opcode::IBV_WC_LOCAL_INV),
        (ibv_wr_opcode::IBV_WR_BIND_MW, ibv_wc_opcode::IBV_WC_BIND_MW),
    ];
    let mut chain: Vec<Wr> = table.iter().enumerate().map(|(i, &(op, _))| wr(20 + i as u64, op, SIGNALED, &[8])).collect();
    assert_eq!(post(qp, &mut chain).0, 0);
    assert_eq!(dev.qp_stats(qp).unwrap().doorbells, 2, "one doorbell per post_send call");
    assert_eq!(dev.complete(qp, 100).unwrap(), 2 + table.len());
    let wcs = poll(cq, 64);
    assert_eq!(wcs[0].opcode, ibv_wc_opcode::IBV_WC_RDMA_WRITE);
    assert_eq!(wcs[0].byte_len, 128);
    assert_eq!((wcs[1].opcode, wcs[1].byte_len), (ibv_wc_opcode::IBV_WC_COMP_SWAP, 8));
    let got: Vec<u32> = wcs[2..].iter().map(|wc| wc.opcode).collect();
    let want: Vec<u32> = table.iter().map(|&(_, wc)| wc).collect();
    assert_eq!(got, want);
    assert!(dev.wqe(qp, 0).unwrap().executed);
    let s = dev.qp_stats(qp).unwrap();
    assert_eq!((s.signaled_wqes, s.executed, s.outstanding), (10, 10, 0));
}

fn check_bad_caps_and_foreign_objects_rejected(dev: &dyn Scriptable, foreign: &dyn Scriptable) {
    let cq = dev.create_cq(8).unwrap();
    let good = ScriptedQpCaps::with_depths(4, 4);
    let bad = [
        ScriptedQpCaps { max_send_wr: 0, ..good },
        ScriptedQpCaps { max_recv_wr: 0, ..good },
        ScriptedQpCaps { max_send_sge: 0, ..good },
        ScriptedQpCaps { max_recv_sge: 0, ..good },
        ScriptedQpCaps { max_send_wr: 1 << 20, ..good },
        ScriptedQpCaps { max_recv_wr: u32::MAX, ..good },
        ScriptedQpCaps { max_send_sge: 1000, ..good },
        ScriptedQpCaps { max_inline_data: 1 << 20, ..good },
    ];
    for caps in bad {
        let err = dev.create_qp(cq, cq, &caps).unwrap_err();
        assert_eq!(err.errno(), libc::EINVAL, "{caps:?}");
        assert!(err.message().contains("caps."), "{}", err.message());
    }
    let foreign_cq = foreign.create_cq(8).unwrap();
    assert_eq!(dev.create_qp(cq, foreign_cq, &good).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(dev.create_qp(foreign_cq, cq, &good).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(dev.create_cq(0).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(dev.create_cq(-1).unwrap_err().errno(), libc::EINVAL);
    let foreign_qp = foreign.create_qp(foreign_cq, foreign_cq, &good).unwrap();
    assert!(dev.complete(foreign_qp, 1).is_err() && dev.qp_stats(foreign_qp).is_err());
    assert!(dev.cq_stats(foreign_cq).is_err() && dev.destroy_cq(foreign_cq).is_err());
    assert!(dev.create_qp(cq, cq, &good).is_ok());
}

fn check_device_lookup_from_objects() {
    let dev = ScriptedDevice::new();
    let cq = dev.create_cq(4).unwrap();
    let qp = dev.create_qp(cq, cq, &ScriptedQpCaps::with_depths(2, 2)).unwrap();
    // SAFETY: the objects and the device are live.
    unsafe {
        assert!(ptr::eq(ScriptedDevice::from_qp(qp).unwrap(), &*dev));
        assert!(ptr::eq(ScriptedDevice::from_cq(cq).unwrap(), &*dev));
        assert!(ScriptedDevice::from_qp(ptr::null_mut()).is_err());
    }
    dev.destroy_qp(qp).unwrap();
    assert!(dev.destroy_qp(qp).is_err(), "a destroyed QP is not found again");
}

fn check_local_inv_is_recorded_and_completes(dev: &dyn Scriptable) {
    let (cq, qp) = qp_on_cq(dev, 16, ScriptedQpCaps::with_depths(8, 2));
    let fence = ibv_send_flags::IBV_SEND_FENCE.0;
    let mut inv = wr(5, ibv_wr_opcode::IBV_WR_LOCAL_INV, SIGNALED | fence, &[]);
    inv.wr.imm_data_invalidated_rkey_union.invalidated_rkey = 0xbeef;
    let mut quiet = wr(6, ibv_wr_opcode::IBV_WR_LOCAL_INV, 0, &[]);
    quiet.wr.imm_data_invalidated_rkey_union.invalidated_rkey = 0x51;
    assert_eq!(post(qp, &mut [inv, quiet]).0, 0);
    let w = dev.wqe(qp, 0).unwrap();
    assert_eq!((w.opcode, w.imm_data, w.send_flags, w.num_sge), (ibv_wr_opcode::IBV_WR_LOCAL_INV, 0xbeef, SIGNALED | fence, 0));
    assert!(w.signaled && !w.executed);
    assert_eq!(dev.wqe(qp, 1).unwrap().imm_data, 0x51, "the invalidate rkey, in the field it shares with imm_data");
    assert_eq!(dev.complete(qp, 2).unwrap(), 2);
    let wcs = poll(cq, 4);
    assert_eq!(wcs.len(), 1, "only the signaled LocalInv has a CQE");
    assert_eq!((wcs[0].wr_id, wcs[0].status, wcs[0].opcode), (5, ibv_wc_status::IBV_WC_SUCCESS, ibv_wc_opcode::IBV_WC_LOCAL_INV));
    assert_eq!(dev.qp_stats(qp).unwrap().outstanding, 1, "the unsignaled one holds its slot");
    assert!(dev.violations().is_empty());
}

#[test]
fn reg_mr_makes_real_mrs_with_distinct_keys_and_dereg_frees_them() {
    let dev = ScriptedDevice::new();
    let foreign = ScriptedDevice::new();
    let mut buf = [0u8; 256];
    let a = dev.reg_mr(buf.as_mut_ptr().cast(), buf.len(), 1).unwrap();
    let b = dev.reg_mr(buf[128..].as_mut_ptr().cast(), 128, 7).unwrap();
    let f = foreign.reg_mr(ptr::null_mut(), 0, 0).unwrap();
    assert_eq!((dev.mr_count(), foreign.mr_count()), (2, 1));
    let mut keys = Vec::new();
    // SAFETY: the three MRs are live.
    unsafe {
        assert_eq!((*a).context, dev.context());
        assert_eq!((*a).pd, dev.pd());
        assert_eq!(((*a).addr, (*a).length), (buf.as_mut_ptr().cast(), 256));
        assert_eq!(((*b).addr, (*b).length), (buf[128..].as_mut_ptr().cast(), 128));
        assert_eq!((*f).context, foreign.context());
        for mr in [a, b] {
            keys.push((*mr).lkey);
            keys.push((*mr).rkey);
        }
        assert!(ptr::eq(ScriptedDevice::from_mr(a).unwrap(), &*dev));
        assert!(ptr::eq(ScriptedDevice::from_mr(f).unwrap(), &*foreign));
    }
    assert!(keys.iter().all(|&k| k != 0), "{keys:x?}");
    let mut distinct = keys.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), keys.len(), "every lkey and rkey differs: {keys:x?}");
    assert_eq!(dev.dereg_mr(f).unwrap_err().errno(), libc::EINVAL, "another device's MR");
    assert_eq!(foreign.mr_count(), 1);
    dev.dereg_mr(a).unwrap();
    assert_eq!(dev.mr_count(), 1);
    assert_eq!(dev.dereg_mr(a).unwrap_err().errno(), libc::EINVAL, "deregistered already (never read)");
    // SAFETY: lookups by address only.
    unsafe {
        assert!(ScriptedDevice::from_mr(a).is_err());
        assert!(ScriptedDevice::from_mr(ptr::null_mut()).is_err());
    }
    // `b` and `f` are freed with their devices (the sanitizer and valgrind runs of the C tests see leaks).
}

#[test]
fn the_library_deregisters_scripted_mrs_through_the_device_registry() {
    let dev = ScriptedDevice::new();
    let other = ScriptedDevice::new();
    let mut buf = [0u8; 64];
    let mr = dev.reg_mr(buf.as_mut_ptr().cast(), buf.len(), 1).unwrap();
    let keep = other.reg_mr(buf.as_mut_ptr().cast(), buf.len(), 1).unwrap();
    // SAFETY: a live scripted MR, deregistered once, here.
    assert_eq!(unsafe { sqdisc::verbs::control::dereg_mr(mr) }, 0);
    assert_eq!((dev.mr_count(), other.mr_count()), (0, 1), "through the device that registered it");
    assert!(dev.dereg_mr(mr).is_err());
    // SAFETY: a live scripted MR, deregistered once.
    assert_eq!(unsafe { sqdisc::verbs::control::dereg_mr(keep) }, 0);
    assert_eq!(other.mr_count(), 0);
}

#[test]
fn a_queue_deregisters_a_tracked_scripted_mr_once_its_last_user_is_released() {
    use common::{config, Chain, Rig};
    use sqdisc::verbs::control::Teardown;
    let rig = Rig::new(config(16, 2, 0), 64);
    let mut buf = [0u8; 64];
    let mr = rig.dev.reg_mr(buf.as_mut_ptr().cast(), buf.len(), 1).unwrap();
    // SAFETY: live until deregistered below.
    let lkey = unsafe { (*mr).lkey };
    rig.q().track_mr(lkey).unwrap();
    let mut chain = Chain::sends(0..4, 0);
    chain.sges[1][0].lkey = lkey;
    rig.post(&mut chain).unwrap();
    // SAFETY: `mr` is a live MR of the rig's device; nothing else deregisters it.
    rig.q().defer_teardown(Some(lkey), unsafe { Teardown::dereg_mr(mr) }).unwrap();
    assert_eq!(rig.dev.mr_count(), 1, "WR 1 may still read it");
    for _ in 0..3 {
        rig.complete(usize::MAX);
        rig.poll_all();
    }
    assert_eq!(rig.released_ids(), vec![0, 1, 2, 3]);
    assert_eq!(rig.dev.mr_count(), 0, "deregistered through the device");
    assert_eq!(rig.q().stats().teardown_failures, 0);
}

macro_rules! on_scripted_device {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            let dev = ScriptedDevice::new();
            super::$name(&*dev);
        }
    )*};
}

mod scripted_device {
    use super::*;

    on_scripted_device!(
        check_objects_are_real_verbs_objects,
        check_full_sq_enomem_at_first_refused_wr,
        check_unsignaled_stream_fills_sq_forever,
        check_signaled_cqe_frees_earlier_slots_when_polled,
        check_fail_then_flush_in_order,
        check_errored_qp_flushes_posts_at_once,
        check_cq_overrun_loses_cqe,
        check_shared_cq_between_two_qps,
        check_send_and_recv_of_one_qp_on_one_cq,
        check_receive_queue,
        check_wr_validation,
        check_wqe_record_and_cqe_opcodes,
        check_local_inv_is_recorded_and_completes,
    );

    #[test]
    fn check_bad_caps_and_foreign_objects_rejected() {
        let dev = ScriptedDevice::new();
        let foreign = ScriptedDevice::new();
        super::check_bad_caps_and_foreign_objects_rejected(&*dev, &*foreign);
    }

    #[test]
    fn check_device_lookup_from_objects() {
        super::check_device_lookup_from_objects();
    }
}
