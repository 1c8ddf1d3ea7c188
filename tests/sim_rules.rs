//! One test per rule of the software HCA's model, driven through the ops table as libibverbs' inline verbs
//! drive a provider. Each would fail if its rule broke.

mod sim_support;

use rdma_sys::{ibv_qp_state, ibv_wc_flags, ibv_wc_opcode};
use sim_support::*;
use sqdisc_sim::scripted::Scriptable;
use sqdisc_sim::*;

fn cfg() -> SimConfig {
    SimConfig { wire_delay_min: 1, wire_delay_max: 1, ..SimConfig::default() }
}

fn kinds(dev: &SimDevice) -> Vec<u32> {
    dev.violation_log().iter().map(|v| v.kind).collect()
}

/// A pair with a registered source on `a` and a registered target (with receives posted) on `b`.
struct Rig {
    p: Pair,
    src: Buf,
    dst: Buf,
    src_key: u32,
    dst_key: u32,
    src_mr: *mut rdma_sys::ibv_mr,
}

impl Rig {
    fn new(c: SimConfig, sq: u32, cqe: i32) -> Rig {
        Rig::with_conn(c, sq, cqe, SimConnAttr::default())
    }
    fn with_conn(c: SimConfig, sq: u32, cqe: i32, conn: SimConnAttr) -> Rig {
        let p = Pair::with_conn(c, sq, cqe, conn);
        let src = Buf::new(4096, 0xa5);
        let dst = Buf::new(4096, 0);
        let src_mr = p.reg(&src);
        let dst_mr = p.reg(&dst);
        let (src_key, dst_key) = (mr_keys(src_mr).0, mr_keys(dst_mr).0);
        Rig { p, src, dst, src_key, dst_key, src_mr }
    }
    fn recv(&self, wr_id: u64, off: u64, len: u32) {
        assert_eq!(post_recv(self.p.b, wr_id, &[(self.dst.addr() + off, len, self.dst_key)]), 0);
    }
    fn send(&self, wr_id: u64, flags: u32, off: u64, len: u32) -> W {
        wr(wr_id, op::IBV_WR_SEND, flags, &[(self.src.addr() + off, len, self.src_key)])
    }
    fn write(&self, wr_id: u64, flags: u32, off: u64, len: u32, remote_off: u64) -> W {
        wr(wr_id, op::IBV_WR_RDMA_WRITE, flags, &[(self.src.addr() + off, len, self.src_key)]).rdma(self.dst.addr() + remote_off, self.dst_key)
    }
}

// ---- SQ and RQ slots --------------------------------------------------------------------------------------

#[test]
fn sq_slot_is_freed_only_by_a_polled_cqe_at_or_after_it() {
    let r = Rig::new(SimConfig { flags: SQD_SIM_STRICT, ..cfg() }, 4, 16);
    for i in 0..4 {
        assert_eq!(post1(r.p.a, r.write(i, 0, 0, 8, 0)), 0);
    }
    assert_eq!(post1(r.p.a, r.write(9, 0, 0, 8, 0)), libc::ENOMEM);
    // Everything executes and is acknowledged, yet no CQE exists, so no slot comes back: stuck for good.
    r.p.dev.run_until_idle(1000).unwrap();
    for i in 0..4 {
        assert!(r.p.dev.wqe_finished(r.p.a, i).unwrap());
    }
    assert!(poll(r.p.a_cq, 16).is_empty());
    assert_eq!(post1(r.p.a, r.write(10, SIGNALED, 0, 8, 0)), libc::ENOMEM);
    assert_eq!(kinds(&r.p.dev), vec![SQD_SIM_VIOLATION_SQ_OVERFLOW; 2]);
    assert_eq!(r.p.dev.stats().sq_overflows, 2);

    // With a signaled WQE last, its polled CQE frees its slot and every earlier one.
    let r = Rig::new(cfg(), 4, 16);
    for i in 0..4 {
        assert_eq!(post1(r.p.a, r.write(i, if i == 3 { SIGNALED } else { 0 }, 0, 8, 0)), 0);
    }
    r.p.dev.run_until_idle(1000).unwrap();
    assert_eq!(post1(r.p.a, r.write(5, 0, 0, 8, 0)), libc::ENOMEM, "the CQE is generated but not polled yet");
    let wc = poll(r.p.a_cq, 16);
    assert_eq!(wc.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![3]);
    for i in 5..9 {
        assert_eq!(post1(r.p.a, r.write(i, 0, 0, 8, 0)), 0);
    }
    assert!(r.p.dev.violation_log().is_empty(), "not strict: no violation, ENOMEM only");
}

#[test]
fn posting_past_the_depth_fails_with_bad_wr_and_keeps_the_earlier_wrs() {
    let r = Rig::new(cfg(), 4, 16);
    let mut chain: Vec<W> = (0..6).map(|i| r.write(i, SIGNALED, 0, 8, 0)).collect();
    assert_eq!(post(r.p.a, &mut chain), (libc::ENOMEM, Some(4)));
    assert_eq!(r.p.dev.stats().wqes, 4);
    assert_eq!(r.p.dev.stats().doorbells, 1);
    let wc = poll_n(r.p.a_cq, 4, 100);
    assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), (0..4).map(|i| (i, st::IBV_WC_SUCCESS)).collect::<Vec<_>>());
}

#[test]
fn rq_slots_are_held_until_their_cqe_is_polled() {
    let r = Rig::new(SimConfig { flags: SQD_SIM_STRICT, ..cfg() }, 2, 16);
    r.recv(1, 0, 64);
    r.recv(2, 64, 64);
    assert_eq!(post_recv(r.p.b, 3, &[(r.dst.addr(), 64, r.dst_key)]), libc::ENOMEM);
    assert_eq!(kinds(&r.p.dev), vec![SQD_SIM_VIOLATION_RQ_OVERFLOW]);
    post1(r.p.a, r.send(10, 0, 0, 16));
    r.p.dev.run_until_idle(100).unwrap();
    assert_eq!(post_recv(r.p.b, 3, &[(r.dst.addr(), 64, r.dst_key)]), libc::ENOMEM, "CQE not polled yet");
    assert_eq!(poll(r.p.b_cq, 4).len(), 1);
    assert_eq!(post_recv(r.p.b, 3, &[(r.dst.addr(), 64, r.dst_key)]), 0);
}

#[test]
fn caps_are_clamped_and_written_back_and_sends_need_a_connection() {
    let dev = SimDevice::new(&cfg()).unwrap();
    let cq = dev.create_cq(8).unwrap();
    let mut attr = qp_attr(cq, cq, 100_000, 0);
    attr.cap.max_send_sge = 1000;
    attr.cap.max_inline_data = 1 << 20;
    let qp = dev.create_qp(&mut attr).unwrap();
    assert_eq!((attr.cap.max_send_wr, attr.cap.max_recv_wr, attr.cap.max_send_sge, attr.cap.max_inline_data), (32768, 1, 32, 1024));
    assert_eq!(dev.qp_state(qp).unwrap(), ibv_qp_state::IBV_QPS_INIT);
    assert_eq!(post1(qp, wr(1, op::IBV_WR_RDMA_WRITE, 0, &[])), libc::EINVAL);
    assert_eq!(kinds(&dev), vec![SQD_SIM_VIOLATION_QP_STATE]);
    assert_eq!(dev.destroy_cq(cq).unwrap_err().errno(), libc::EBUSY);
    dev.destroy_qp(qp).unwrap();
    dev.destroy_cq(cq).unwrap();
}

#[test]
fn invalid_wrs_are_refused_with_einval_and_logged() {
    let r = Rig::new(cfg(), 8, 16);
    let too_many: Vec<(u64, u32, u32)> = (0..5).map(|i| (r.src.addr() + i * 8, 8, r.src_key)).collect();
    assert_eq!(post1(r.p.a, wr(1, op::IBV_WR_SEND, 0, &too_many)), libc::EINVAL);
    assert_eq!(post1(r.p.a, wr(2, op::IBV_WR_SEND, INLINE, &[(r.src.addr(), 65, 0)])), libc::EINVAL);
    assert_eq!(post1(r.p.a, wr(3, op::IBV_WR_BIND_MW, 0, &[])), libc::EINVAL);
    assert_eq!(post1(r.p.a, wr(4, op::IBV_WR_ATOMIC_FETCH_AND_ADD, 0, &[(r.src.addr(), 4, r.src_key)]).atomic(r.dst.addr(), r.dst_key, 1, 0)), libc::EINVAL);
    assert_eq!(kinds(&r.p.dev), vec![SQD_SIM_VIOLATION_BAD_WR; 4]);
}

// ---- asynchronous, in-order execution and DMA timing -------------------------------------------------------

#[test]
fn execution_is_asynchronous_and_completions_are_in_order() {
    let r = Rig::new(cfg(), 16, 32);
    post(r.p.a, &mut [r.write(0, 0, 0, 8, 0), r.write(1, 0, 8, 8, 8), r.write(2, SIGNALED, 16, 8, 16)]);
    // Nothing happened at post time.
    assert_eq!(r.p.dev.stats().packets, 0);
    assert!(r.p.dev.buffer_busy(r.src.ptr().cast(), 24));
    assert!(!r.p.dev.wqe_finished(r.p.a, 0).unwrap());
    assert_eq!(r.dst.read(0, 24), vec![0; 24]);
    // Transmitted at the first step, executed after the wire delay, ACK after ack_delay, back after the wire.
    let mut seen = Vec::new();
    for _ in 0..10 {
        seen.extend(poll(r.p.a_cq, 4));
        if !seen.is_empty() {
            break;
        }
    }
    assert_eq!(seen.len(), 1);
    assert_eq!((seen[0].wr_id, seen[0].opcode, seen[0].byte_len), (2, ibv_wc_opcode::IBV_WC_RDMA_WRITE, 8));
    assert!(r.p.dev.now() >= 4, "a round trip with ack delay takes steps, got {}", r.p.dev.now());
    // The signaled CQE retires every earlier WQE: all finished, nothing busy.
    for i in 0..3 {
        assert!(r.p.dev.wqe_finished(r.p.a, i).unwrap());
    }
    assert!(!r.p.dev.buffer_busy(r.src.ptr().cast(), 24));
    assert_eq!(r.dst.read(0, 24), vec![0xa5; 24]);
    assert_eq!(r.p.dev.wqe_finished(r.p.a, 3).unwrap_err().errno(), libc::ENOENT);
}

#[test]
fn local_ops_complete_in_order_behind_unacked_sends() {
    let r = Rig::new(cfg(), 16, 32);
    let other = Buf::new(64, 0);
    let other_mr = r.p.reg(&other);
    let (_, other_rkey) = mr_keys(other_mr);
    post(r.p.a, &mut [r.write(0, SIGNALED, 0, 8, 0), wr(1, op::IBV_WR_LOCAL_INV, SIGNALED, &[]).imm(other_rkey)]);
    r.p.dev.step(1);
    // The LocalInv executed at once (head of execution), the WRITE still awaits its ACK.
    assert!(r.p.dev.wqe_finished(r.p.a, 1).unwrap());
    assert!(!r.p.dev.wqe_finished(r.p.a, 0).unwrap());
    assert!(poll(r.p.a_cq, 4).is_empty(), "the LocalInv's CQE waits behind the WRITE's");
    let wc = poll_n(r.p.a_cq, 2, 50);
    assert_eq!(wc.iter().map(|w| (w.wr_id, w.opcode)).collect::<Vec<_>>(), vec![(0, ibv_wc_opcode::IBV_WC_RDMA_WRITE), (1, ibv_wc_opcode::IBV_WC_LOCAL_INV)]);
}

#[test]
fn source_memory_is_read_at_transmission_and_inline_data_at_post() {
    let r = Rig::new(cfg(), 16, 32);
    r.recv(1, 0, 64);
    r.recv(2, 64, 64);
    r.src.write(0, b"before--");
    r.src.write(8, b"inline-1");
    post(r.p.a, &mut [r.send(10, 0, 0, 8), wr(11, op::IBV_WR_SEND, INLINE | SIGNALED, &[(r.src.addr() + 8, 8, 0)])]);
    // Changed after the post, before the HCA read it: the DMA sees the new bytes; inline data was copied.
    r.src.write(0, b"after---");
    r.src.write(8, b"changed!");
    r.p.dev.run_until_idle(100).unwrap();
    assert_eq!(r.dst.read(0, 8), b"after---");
    assert_eq!(r.dst.read(64, 8), b"inline-1");
    let wc = poll(r.p.b_cq, 4);
    assert_eq!(wc.iter().map(|w| (w.wr_id, w.opcode, w.byte_len)).collect::<Vec<_>>(), vec![(1, ibv_wc_opcode::IBV_WC_RECV, 8), (2, ibv_wc_opcode::IBV_WC_RECV, 8)]);
    assert!(r.p.dev.violation_log().is_empty(), "no retransmission happened: nothing to compare");
}

// ---- loss, ACK loss, retransmission ----------------------------------------------------------------------

#[test]
fn a_retransmission_rereads_the_source_and_logs_a_modification() {
    let r = Rig::new(cfg(), 16, 32);
    r.src.write(0, b"original");
    r.p.dev.inject(&SimFault { count: 1, ..SimFault::new(SQD_SIM_FAULT_LOSE_REQUESTS, r.p.a) }).unwrap();
    post1(r.p.a, r.write(7, SIGNALED, 0, 8, 0));
    r.p.dev.step(1); // transmitted (and lost)
    r.src.write(0, b"REUSED!!");
    let wc = poll_n(r.p.a_cq, 1, 200);
    assert_eq!(wc[0].status, st::IBV_WC_SUCCESS);
    assert_eq!(r.dst.read(0, 8), b"REUSED!!", "the peer got the bytes of the retransmission");
    let v = r.p.dev.violation_log();
    assert_eq!(v.len(), 1);
    assert_eq!((v[0].kind, v[0].wqe_index, v[0].qp_num), (SQD_SIM_VIOLATION_SOURCE_MODIFIED, Some(0), unsafe { (*r.p.a).qp_num }));
    let s = r.p.dev.stats();
    assert_eq!((s.packets_lost, s.retransmissions), (1, 1));
    assert!(s.timeouts == 1, "a lone lost packet is recovered by the timeout");
}

#[test]
fn a_lost_request_followed_by_others_is_recovered_by_a_sequence_nak() {
    let r = Rig::new(cfg(), 16, 32);
    r.p.dev.inject(&SimFault { count: 1, ..SimFault::new(SQD_SIM_FAULT_LOSE_REQUESTS, r.p.a) }).unwrap();
    post(r.p.a, &mut [r.write(0, 0, 0, 8, 0), r.write(1, 0, 8, 8, 8), r.write(2, SIGNALED, 16, 8, 16)]);
    let wc = poll_n(r.p.a_cq, 1, 200);
    assert_eq!(wc[0].status, st::IBV_WC_SUCCESS);
    let s = r.p.dev.stats();
    assert_eq!((s.seq_naks, s.timeouts, s.retransmissions), (1, 0, 3));
    assert_eq!(r.dst.read(0, 24), vec![0xa5; 24]);
}

#[test]
fn ack_loss_makes_the_requester_retransmit_and_the_responder_not_reexecute() {
    let r = Rig::new(cfg(), 16, 32);
    r.recv(1, 0, 64);
    r.recv(2, 64, 64);
    r.p.dev.inject(&SimFault { count: 1, ..SimFault::new(SQD_SIM_FAULT_LOSE_ACKS, r.p.a) }).unwrap();
    post1(r.p.a, r.send(5, SIGNALED, 0, 32));
    let wc = poll_n(r.p.a_cq, 1, 200);
    assert_eq!(wc[0].status, st::IBV_WC_SUCCESS);
    let s = r.p.dev.stats();
    assert_eq!((s.acks_lost, s.retransmissions, s.duplicates), (1, 1, 1));
    assert_eq!(poll(r.p.b_cq, 4).len(), 1, "the duplicate SEND consumed no second receive");
}

#[test]
fn a_duplicate_rdma_read_is_read_again() {
    let r = Rig::new(cfg(), 16, 32);
    let local = Buf::new(64, 0);
    let local_mr = r.p.reg(&local);
    r.dst.write(0, b"version1");
    r.p.dev.inject(&SimFault { count: 1, ..SimFault::new(SQD_SIM_FAULT_LOSE_ACKS, r.p.a) }).unwrap();
    post1(r.p.a, wr(1, op::IBV_WR_RDMA_READ, SIGNALED, &[(local.addr(), 8, mr_keys(local_mr).0)]).rdma(r.dst.addr(), r.dst_key));
    r.p.dev.step(4); // executed at the responder, response lost
    r.dst.write(0, b"version2");
    let wc = poll_n(r.p.a_cq, 1, 200);
    assert_eq!((wc[0].status, wc[0].opcode, wc[0].byte_len), (st::IBV_WC_SUCCESS, ibv_wc_opcode::IBV_WC_RDMA_READ, 8));
    assert_eq!(local.read(0, 8), b"version2");
    assert_eq!(r.p.dev.stats().duplicates, 1);
}

#[test]
fn retry_count_exhausted_is_retry_exc_err_and_flushes_the_rest() {
    let conn = SimConnAttr { retry_cnt: 2, ..SimConnAttr::default() };
    let r = Rig::with_conn(cfg(), 16, 32, conn);
    r.p.dev.inject(&SimFault { count: 1000, ..SimFault::new(SQD_SIM_FAULT_LOSE_REQUESTS, r.p.a) }).unwrap();
    post(r.p.a, &mut [r.write(0, 0, 0, 8, 0), r.write(1, 0, 8, 8, 8)]);
    let wc = poll_n(r.p.a_cq, 2, 500);
    assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(0, st::IBV_WC_RETRY_EXC_ERR), (1, st::IBV_WC_WR_FLUSH_ERR)]);
    assert_eq!(r.p.dev.stats().timeouts, 3);
    assert!(r.p.dev.qp_in_error(r.p.a).unwrap());
}

// ---- LocalInv and fences ---------------------------------------------------------------------------------

#[test]
fn unfenced_local_inv_runs_ahead_and_a_retransmission_hits_the_invalid_lkey() {
    let r = Rig::new(cfg(), 16, 32);
    r.recv(1, 0, 64);
    r.p.dev.inject(&SimFault { count: 1, ..SimFault::new(SQD_SIM_FAULT_LOSE_REQUESTS, r.p.a) }).unwrap();
    post(r.p.a, &mut [r.send(1, 0, 0, 16), wr(2, op::IBV_WR_LOCAL_INV, SIGNALED, &[]).imm(r.src_key)]);
    let wc = poll_n(r.p.a_cq, 2, 200);
    assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(1, st::IBV_WC_LOC_PROT_ERR), (2, st::IBV_WC_WR_FLUSH_ERR)]);
    assert_eq!(kinds(&r.p.dev), vec![SQD_SIM_VIOLATION_MR_IN_USE]);
    assert_eq!(r.p.dev.violation(0).unwrap().wqe_index, Some(0));
    // Error CQEs carry only wr_id, status, qp_num, vendor_err.
    assert_eq!((wc[0].opcode, wc[0].byte_len), (0xffff_ffff, 0xffff_ffff));
}

#[test]
fn fenced_local_inv_waits_for_every_earlier_wqe() {
    let r = Rig::new(cfg(), 16, 32);
    r.recv(1, 0, 64);
    r.recv(2, 64, 64);
    r.p.dev.inject(&SimFault { count: 1, ..SimFault::new(SQD_SIM_FAULT_LOSE_REQUESTS, r.p.a) }).unwrap();
    post(r.p.a, &mut [r.send(1, 0, 0, 16), wr(2, op::IBV_WR_LOCAL_INV, SIGNALED | FENCE, &[]).imm(r.src_key)]);
    r.p.dev.step(3);
    assert!(!r.p.dev.wqe_finished(r.p.a, 1).unwrap(), "the fenced LocalInv waits for the SEND's ACK");
    let wc = poll_n(r.p.a_cq, 1, 200);
    assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(2, st::IBV_WC_SUCCESS)]);
    assert!(r.p.dev.violation_log().is_empty());
    // The MR really is invalid now.
    post1(r.p.a, r.send(3, SIGNALED, 0, 16));
    let wc = poll_n(r.p.a_cq, 1, 50);
    assert_eq!(wc[0].status, st::IBV_WC_LOC_PROT_ERR);
}

#[test]
fn a_plain_fence_waits_for_earlier_reads_only() {
    let r = Rig::new(cfg(), 16, 32);
    let local = Buf::new(64, 0);
    let lk = mr_keys(r.p.reg(&local)).0;
    let read = || wr(1, op::IBV_WR_RDMA_READ, 0, &[(local.addr(), 8, lk)]).rdma(r.dst.addr(), r.dst_key);
    post(r.p.a, &mut [read(), r.write(2, FENCE | SIGNALED, 0, 8, 64)]);
    r.p.dev.step(1);
    assert_eq!(r.p.dev.stats().packets, 1, "the fenced WRITE waits for the READ's response");
    poll_n(r.p.a_cq, 1, 50);
    assert_eq!(r.p.dev.stats().packets, 2);

    let r2 = Rig::new(cfg(), 16, 32);
    post(r2.p.a, &mut [r2.write(1, 0, 0, 8, 0), r2.write(2, FENCE | SIGNALED, 0, 8, 64)]);
    r2.p.dev.step(1);
    assert_eq!(r2.p.dev.stats().packets, 2, "a fence does not wait for an earlier WRITE");
}

#[test]
fn max_rd_atomic_stalls_the_head_of_the_sq() {
    let conn = SimConnAttr { max_rd_atomic: 1, ..SimConnAttr::default() };
    let r = Rig::with_conn(cfg(), 16, 32, conn);
    let local = Buf::new(64, 0);
    let lk = mr_keys(r.p.reg(&local)).0;
    let read = |id, off| wr(id, op::IBV_WR_RDMA_READ, SIGNALED, &[(local.addr() + off, 8, lk)]).rdma(r.dst.addr(), r.dst_key);
    post(r.p.a, &mut [read(1, 0), read(2, 8), r.write(3, SIGNALED, 0, 8, 64)]);
    r.p.dev.step(1);
    assert_eq!(r.p.dev.stats().packets, 1, "the second READ and the WRITE behind it wait");
    let wc = poll_n(r.p.a_cq, 3, 100);
    assert_eq!(wc.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![1, 2, 3]);
}

// ---- receives, RNR, remote access, atomics ---------------------------------------------------------------

#[test]
fn send_consumes_the_oldest_receive_with_imm_and_invalidate() {
    let r = Rig::new(cfg(), 16, 32);
    let inv = Buf::new(64, 0);
    let inv_key = mr_keys(r.p.reg(&inv)).0;
    r.recv(1, 0, 16);
    r.recv(2, 16, 16);
    r.src.write(0, b"0123456789abcdef");
    post(r.p.a, &mut [wr(5, op::IBV_WR_SEND_WITH_IMM, 0, &[(r.src.addr(), 10, r.src_key)]).imm(0x1234_5678), wr(6, op::IBV_WR_SEND_WITH_INV, SIGNALED, &[(r.src.addr() + 10, 6, r.src_key)]).imm(inv_key)]);
    r.p.dev.run_until_idle(100).unwrap();
    let wc = poll(r.p.b_cq, 4);
    assert_eq!(wc.len(), 2);
    assert_eq!((wc[0].wr_id, wc[0].byte_len, wc[0].wc_flags, wc[0].imm), (1, 10, ibv_wc_flags::IBV_WC_WITH_IMM.0, 0x1234_5678));
    assert_eq!((wc[1].wr_id, wc[1].byte_len, wc[1].wc_flags, wc[1].imm), (2, 6, ibv_wc_flags::IBV_WC_WITH_INV.0, inv_key));
    assert_eq!(r.dst.read(0, 10), b"0123456789");
    assert_eq!(r.dst.read(16, 6), b"abcdef");
    // The invalidated rkey is dead at the responder.
    post1(r.p.a, r.write(7, SIGNALED, 0, 8, 0).rdma(inv.addr(), inv_key));
    let wc = poll_n(r.p.a_cq, 2, 100);
    assert_eq!(wc.last().unwrap().status, st::IBV_WC_REM_ACCESS_ERR);
}

#[test]
fn without_a_receive_the_send_is_rnr_nacked_and_retried() {
    let r = Rig::new(cfg(), 16, 32);
    post1(r.p.a, r.send(1, SIGNALED, 0, 8));
    r.p.dev.step(30);
    assert!(r.p.dev.stats().rnr_naks >= 2, "retried forever (rnr_retry 7)");
    r.recv(9, 0, 64);
    let wc = poll_n(r.p.a_cq, 1, 100);
    assert_eq!(wc[0].status, st::IBV_WC_SUCCESS);

    let conn = SimConnAttr { rnr_retry: 2, ..SimConnAttr::default() };
    let r = Rig::with_conn(cfg(), 16, 32, conn);
    post1(r.p.a, r.send(1, 0, 0, 8));
    let wc = poll_n(r.p.a_cq, 1, 200);
    assert_eq!(wc[0].status, st::IBV_WC_RNR_RETRY_EXC_ERR);
    assert_eq!(r.p.dev.stats().rnr_naks, 3);
}

#[test]
fn a_receive_too_small_fails_both_sides() {
    let r = Rig::new(cfg(), 16, 32);
    r.recv(1, 0, 4);
    post1(r.p.a, r.send(2, 0, 0, 8));
    let wc = poll_n(r.p.a_cq, 1, 100);
    assert_eq!(wc[0].status, st::IBV_WC_REM_INV_REQ_ERR);
    assert_eq!(poll(r.p.b_cq, 4)[0].status, st::IBV_WC_LOC_LEN_ERR);
}

#[test]
fn rdma_checks_rkey_bounds_and_access_at_the_responder() {
    type Make = Box<dyn Fn(&Rig) -> W>;
    let cases: [(&str, Make); 3] = [
        ("bad rkey", Box::new(|r: &Rig| r.write(1, 0, 0, 8, 0).rdma(r.dst.addr(), 0xdead))),
        ("out of bounds", Box::new(|r: &Rig| r.write(1, 0, 0, 8, 0).rdma(r.dst.addr() + 4090, r.dst_key))),
        ("read without remote read", Box::new(|r: &Rig| wr(1, op::IBV_WR_RDMA_READ, 0, &[(r.src.addr(), 8, r.src_key)]).rdma(0, 0))),
    ];
    for (what, make) in cases {
        let r = Rig::new(cfg(), 16, 32);
        r.recv(50, 0, 64);
        post1(r.p.a, make(&r));
        let wc = poll_n(r.p.a_cq, 1, 100);
        assert_eq!(wc[0].status, st::IBV_WC_REM_ACCESS_ERR, "{what}");
        assert!(r.p.dev.qp_in_error(r.p.a).unwrap() && r.p.dev.qp_in_error(r.p.b).unwrap(), "{what}: both QPs to error");
        assert_eq!(poll(r.p.b_cq, 4).iter().map(|w| w.status).collect::<Vec<_>>(), vec![st::IBV_WC_WR_FLUSH_ERR], "{what}");
    }
    // Access flags: a target registered without remote write.
    let r = Rig::new(cfg(), 16, 32);
    let ro = Buf::new(64, 0);
    // SAFETY: `ro` outlives the device.
    let ro_mr = unsafe { r.p.dev.reg_mr(ro.ptr().cast(), 64, 4) }.unwrap();
    post1(r.p.a, r.write(1, 0, 0, 8, 0).rdma(ro.addr(), mr_keys(ro_mr).1));
    assert_eq!(poll_n(r.p.a_cq, 1, 100)[0].status, st::IBV_WC_REM_ACCESS_ERR);
}

#[test]
fn a_zero_length_rdma_write_needs_no_valid_rkey() {
    let r = Rig::new(cfg(), 16, 32);
    post1(r.p.a, wr(1, op::IBV_WR_RDMA_WRITE, SIGNALED, &[]).rdma(0, 0));
    let wc = poll_n(r.p.a_cq, 1, 100);
    assert_eq!((wc[0].status, wc[0].byte_len), (st::IBV_WC_SUCCESS, 0));
}

#[test]
fn atomics_fetch_and_add_and_compare_and_swap() {
    let r = Rig::new(cfg(), 16, 32);
    let local = Buf::new(16, 0);
    let lk = mr_keys(r.p.reg(&local)).0;
    r.dst.write(0, &40u64.to_ne_bytes());
    post(
        r.p.a,
        &mut [
            wr(1, op::IBV_WR_ATOMIC_FETCH_AND_ADD, SIGNALED, &[(local.addr(), 8, lk)]).atomic(r.dst.addr(), r.dst_key, 2, 0),
            wr(2, op::IBV_WR_ATOMIC_CMP_AND_SWP, SIGNALED, &[(local.addr() + 8, 8, lk)]).atomic(r.dst.addr(), r.dst_key, 42, 7),
        ],
    );
    let wc = poll_n(r.p.a_cq, 2, 100);
    assert_eq!(wc.iter().map(|w| (w.opcode, w.byte_len)).collect::<Vec<_>>(), vec![(ibv_wc_opcode::IBV_WC_FETCH_ADD, 8), (ibv_wc_opcode::IBV_WC_COMP_SWAP, 8)]);
    assert_eq!(local.read(0, 8), 40u64.to_ne_bytes());
    assert_eq!(local.read(8, 8), 42u64.to_ne_bytes());
    assert_eq!(r.dst.read(0, 8), 7u64.to_ne_bytes());
}

#[test]
fn a_bad_lkey_is_a_local_protection_error() {
    let r = Rig::new(cfg(), 16, 32);
    post1(r.p.a, wr(1, op::IBV_WR_RDMA_WRITE, 0, &[(r.src.addr(), 8, 0x77)]).rdma(r.dst.addr(), r.dst_key));
    post1(r.p.a, wr(2, op::IBV_WR_RDMA_WRITE, 0, &[(r.src.addr() + 4090, 8, r.src_key)]).rdma(r.dst.addr(), r.dst_key));
    let wc = poll_n(r.p.a_cq, 2, 100);
    assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(1, st::IBV_WC_LOC_PROT_ERR), (2, st::IBV_WC_WR_FLUSH_ERR)]);
}

// ---- errors, flushes, CQ overrun -------------------------------------------------------------------------

#[test]
fn on_error_every_outstanding_wqe_and_receive_flushes_in_order() {
    let r = Rig::new(cfg(), 16, 64);
    for i in 0..6 {
        post1(r.p.a, r.write(i, if i == 2 { SIGNALED } else { 0 }, 0, 8, 0));
    }
    assert_eq!(post_recv(r.p.a, 100, &[(r.src.addr(), 8, r.src_key)]), 0);
    r.p.dev.set_error(r.p.a).unwrap();
    let wc = poll(r.p.a_cq, 16);
    let got: Vec<(u64, u32)> = wc.iter().map(|w| (w.wr_id, w.status)).collect();
    let mut want: Vec<(u64, u32)> = (0..6).map(|i| (i, st::IBV_WC_WR_FLUSH_ERR)).collect();
    want.push((100, st::IBV_WC_WR_FLUSH_ERR));
    assert_eq!(got, want);
    assert!(wc.iter().all(|w| w.opcode == 0xffff_ffff && w.qp_num == unsafe { (*r.p.a).qp_num }));
    assert_eq!(unsafe { (*r.p.a).state }, ibv_qp_state::IBV_QPS_ERR);
    // Posted later: flushed at once.
    post1(r.p.a, r.write(7, 0, 0, 8, 0));
    assert_eq!(poll(r.p.a_cq, 4).iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(7, st::IBV_WC_WR_FLUSH_ERR)]);
    assert_eq!(r.p.dev.stats().flushes, 8);
}

#[test]
fn a_cq_overrun_loses_the_cqe_and_puts_its_qps_in_error() {
    let p = Pair::new(cfg(), 16, 2);
    for i in 0..4 {
        post1(p.a, wr(i, op::IBV_WR_RDMA_WRITE, SIGNALED, &[]).rdma(0, 0));
    }
    p.dev.run_until_idle(100).unwrap();
    let v = p.dev.violation_log();
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].kind, SQD_SIM_VIOLATION_CQ_OVERRUN);
    assert!(v[0].text.starts_with("CQ overrun"));
    assert!(p.dev.qp_in_error(p.a).unwrap());
    let cs = p.dev.cq_stats(p.a_cq).unwrap();
    assert!(cs.in_error && cs.overruns >= 2 && cs.queued == 2);
}

// ---- faults ----------------------------------------------------------------------------------------------

#[test]
fn injected_faults() {
    // QP fatal at a given step.
    let r = Rig::new(cfg(), 16, 32);
    r.p.dev.inject(&SimFault { at_step: 5, ..SimFault::new(SQD_SIM_FAULT_QP_FATAL, r.p.a) }).unwrap();
    r.p.dev.step(4);
    assert!(!r.p.dev.qp_in_error(r.p.a).unwrap());
    r.p.dev.step(1);
    assert!(r.p.dev.qp_in_error(r.p.a).unwrap());

    // Remote access error on the next WQE.
    let r = Rig::new(cfg(), 16, 32);
    r.p.dev.inject(&SimFault::new(SQD_SIM_FAULT_REMOTE_ACCESS, r.p.a)).unwrap();
    post1(r.p.a, r.write(1, 0, 0, 8, 0));
    assert_eq!(poll_n(r.p.a_cq, 1, 50)[0].status, st::IBV_WC_REM_ACCESS_ERR);

    // Receive starvation: RNR NAKs while withheld, then success.
    let r = Rig::new(cfg(), 16, 32);
    r.recv(1, 0, 64);
    r.p.dev.inject(&SimFault { count: 20, ..SimFault::new(SQD_SIM_FAULT_RECV_STARVE, r.p.b) }).unwrap();
    post1(r.p.a, r.send(2, SIGNALED, 0, 8));
    let wc = poll_n(r.p.a_cq, 1, 100);
    assert_eq!(wc[0].status, st::IBV_WC_SUCCESS);
    assert!(r.p.dev.stats().rnr_naks >= 1 && r.p.dev.now() > 20);

    // The next WQE fails with a chosen status.
    let r = Rig::new(cfg(), 16, 32);
    r.p.dev.inject(&SimFault { status: st::IBV_WC_LOC_QP_OP_ERR, vendor_err: 0x42, ..SimFault::new(SQD_SIM_FAULT_FAIL_NEXT, r.p.a) }).unwrap();
    post(r.p.a, &mut [r.write(1, 0, 0, 8, 0), r.write(2, 0, 0, 8, 0)]);
    let wc = poll_n(r.p.a_cq, 2, 50);
    assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(1, st::IBV_WC_LOC_QP_OP_ERR), (2, st::IBV_WC_WR_FLUSH_ERR)]);
    assert_eq!(r.p.dev.inject(&SimFault::new(99, r.p.a)).unwrap_err().errno(), libc::EINVAL);
}

// ---- the oracle and the MR rules -------------------------------------------------------------------------

#[test]
fn deregistering_an_mr_under_an_unfinished_wqe_is_a_violation() {
    let r = Rig::new(cfg(), 16, 32);
    post1(r.p.a, r.write(1, SIGNALED, 0, 8, 0));
    assert!(r.p.dev.buffer_busy(r.src.ptr().cast(), 1));
    assert!(!r.p.dev.buffer_busy(r.src.ptr().wrapping_add(8).cast(), 8), "bytes outside the SGE are not busy");
    r.p.dev.dereg_mr(r.src_mr).unwrap();
    assert_eq!(kinds(&r.p.dev), vec![SQD_SIM_VIOLATION_MR_IN_USE]);
    let wc = poll_n(r.p.a_cq, 1, 50);
    assert_eq!(wc[0].status, st::IBV_WC_LOC_PROT_ERR, "transmission found the key gone");
}

// ---- null mode and determinism ---------------------------------------------------------------------------

#[test]
fn null_mode_completes_at_post_and_keeps_the_slot_rule() {
    let dev = SimDevice::new(&SimConfig { flags: SQD_SIM_NULL, ..cfg() }).unwrap();
    let cq = dev.create_cq(4).unwrap();
    let qp = dev.create_qp(&mut qp_attr(cq, cq, 4, 1)).unwrap();
    assert_eq!(post(qp, &mut [wr(1, op::IBV_WR_SEND, 0, &[(0x1000, 8, 1)]), wr(2, op::IBV_WR_SEND, SIGNALED, &[(0x1000, 8, 1)])]).0, 0);
    assert!(dev.wqe_finished(qp, 0).unwrap() && dev.wqe_finished(qp, 1).unwrap());
    for i in 3..5 {
        assert_eq!(post1(qp, wr(i, op::IBV_WR_SEND, 0, &[(0x1000, 8, 1)])), 0);
    }
    assert_eq!(post1(qp, wr(5, op::IBV_WR_SEND, 0, &[])), libc::ENOMEM);
    let wc = poll(cq, 4);
    assert_eq!(wc.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![2]);
    assert_eq!(post1(qp, wr(6, op::IBV_WR_SEND, 0, &[])), 0);
    assert_eq!(dev.stats().steps, 0, "polling does not advance time in null mode");
}

fn lossy_run(seed: u64) -> (SimStats, Vec<u8>) {
    let c = SimConfig { seed, loss_ppm: 100_000, ack_loss_ppm: 300_000, wire_delay_min: 1, wire_delay_max: 5, ..SimConfig::default() };
    let r = Rig::new(c, 64, 128);
    for i in 0..32u64 {
        r.src.write(i as usize * 8, &i.to_ne_bytes());
        post1(r.p.a, r.write(i, if i % 8 == 7 { SIGNALED } else { 0 }, i * 8, 8, i * 8));
    }
    poll_n(r.p.a_cq, 4, 5000);
    (r.p.dev.stats(), r.dst.read(0, 256))
}

#[test]
fn one_seed_decides_everything() {
    let (a, da) = lossy_run(7);
    let (b, db) = lossy_run(7);
    assert_eq!(a, b);
    assert_eq!(da, db);
    let (c, dc) = lossy_run(8);
    assert_ne!(a, c, "another seed, another run");
    assert_eq!(da, dc, "but RC delivers the same bytes");
    assert!(a.packets_lost > 0 && a.acks_lost > 0 && a.retransmissions > 0, "{a:?}");
}

// ---- the Scriptable surface ------------------------------------------------------------------------------

#[test]
fn scriptable_surface_maps_onto_the_model() {
    let dev = SimDevice::new(&cfg()).unwrap();
    let s: &dyn Scriptable = &*dev;
    let cq = s.create_cq(16).unwrap();
    let qp = s.create_qp(cq, cq, &sqdisc_sim::scripted::ScriptedQpCaps::with_depths(8, 4)).unwrap();
    // Made-up addresses and keys work on a scripted QP: no data moves.
    post(qp, &mut [wr(1, op::IBV_WR_SEND, 0, &[(0x1000, 64, 7)]), wr(2, op::IBV_WR_SEND, SIGNALED, &[(0x2000, 64, 7)]), wr(3, op::IBV_WR_SEND, SIGNALED, &[(0x3000, 64, 7)])]);
    assert!(s.complete(qp, 2).unwrap() >= 2);
    let w = s.wqe(qp, 1).unwrap();
    assert!(w.executed && w.signaled && w.first_sge_addr == 0x2000);
    s.fail(qp, st::IBV_WC_REM_OP_ERR, 9).unwrap_or(());
    post_recv(qp, 70, &[(0x5000, 64, 7)]);
    s.deliver(qp, 33, Some(5)).unwrap();
    let st_ = s.qp_stats(qp).unwrap();
    assert_eq!(st_.wqes_posted, 3);
    let wc = poll_n(cq, 3, 100);
    assert!(wc.iter().any(|w| w.wr_id == 70 && w.byte_len == 33 && w.imm == 5));
    assert_eq!(s.deliver(qp, 1, None).unwrap_err().errno(), libc::ENOENT);
    assert_eq!(s.cq_stats(cq).unwrap().capacity, 16);
}

#[test]
fn resize_cq_keeps_the_cqes_it_holds_and_a_managed_cq_learns_the_new_size() {
    let p = Pair::new(cfg(), 8, 4);
    let mut w = [wr(1, op::IBV_WR_RDMA_WRITE, SIGNALED, &[])];
    // Zero-length writes need no rkey: three CQEs on a 4-entry CQ.
    for i in 0..3 {
        w[0].wr.wr_id = i;
        assert_eq!(post(p.a, &mut w).0, 0);
    }
    p.dev.run_until_idle(1000).unwrap();
    assert_eq!(p.dev.resize_cq(p.a_cq, 2).unwrap_err().errno(), libc::EINVAL, "below the 3 CQEs held");
    p.dev.resize_cq(p.a_cq, 16).unwrap();
    // SAFETY: a live CQ of the device.
    assert_eq!(unsafe { (*p.a_cq).cqe }, 16);
    assert_eq!(poll(p.a_cq, 16).len(), 3, "resizing loses no CQE");

    // SAFETY: the CQ outlives the handle (dropped at the end of the test, before the device).
    let cq = sqdisc::Cq::new(unsafe { sqdisc::verbs::CqHandle::from_raw(p.b_cq) }.unwrap());
    // SAFETY: a live QP of the device, which outlives the queue.
    let b_qp = unsafe { sqdisc::verbs::QpHandle::from_raw(p.b) }.unwrap();
    let cfg16 = sqdisc::QueueConfig { sq_depth: 8, max_send_sge: 4, ..Default::default() };
    assert_eq!(cq.stats().capacity, 4);
    p.dev.resize_cq(p.b_cq, 64).unwrap();
    assert_eq!(cq.update_capacity().unwrap(), 64);
    let q = sqdisc::Queue::new(&cq, None, b_qp, cfg16, None).expect("fits the resized CQ");
    p.dev.resize_cq(p.b_cq, 4).unwrap();
    let e = cq.update_capacity().unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC);
    assert!(e.message().contains("holds 4") && e.message().contains("reserve 9"), "{}", e.message());
    drop(q);
}

#[test]
fn the_control_path_makes_and_destroys_srqs_on_the_software_hca_and_refuses_elsewhere() {
    let p = Pair::new(cfg(), 8, 16);
    // SAFETY: all-zero is a valid `ibv_srq_init_attr`.
    let mut attr: rdma_sys::ibv_srq_init_attr = unsafe { std::mem::zeroed() };
    attr.attr.max_wr = 100_000;
    attr.attr.max_sge = 1;
    // SAFETY: the device's live PD and a valid attribute struct.
    let srq = unsafe { sqdisc::verbs::control::create_srq(p.dev.pd(), &mut attr) }.unwrap();
    assert_eq!(attr.attr.max_wr, 32768, "granted attributes are written back");
    // SAFETY: the SRQ just made, destroyed once.
    assert_eq!(unsafe { sqdisc::verbs::control::destroy_srq(srq) }, 0);
    // A device that registered no SRQ control path refuses rather than reaching libibverbs with its objects.
    let scripted = sqdisc_sim::scripted::ScriptedDevice::new();
    // SAFETY: the scripted device's live PD; the call is refused before anything is read through it.
    assert_eq!(unsafe { sqdisc::verbs::control::create_srq(scripted.pd(), &mut attr) }.unwrap_err(), libc::EOPNOTSUPP);
}

// ---- transport retries: what spends and what reloads retry_cnt -------------------------------------------

/// B's SEND to A, which has no receive, is RNR NAKed for as long as the test runs (rnr_retry 7). Meanwhile A's
/// WRITEs and SENDs to B all succeed, though the ACK of every round is lost and retry_cnt is 1: B's responder
/// keeps executing A's requests and re-acknowledging the duplicates while B's requester waits out its RNR
/// back-off. The two halves of a QP do not wait for each other.
#[test]
fn a_qp_waiting_out_rnr_naks_still_executes_and_acknowledges_the_peers_requests() {
    let conn = SimConnAttr { retry_cnt: 1, ..SimConnAttr::default() };
    let r = Rig::with_conn(cfg(), 16, 256, conn);
    assert_eq!(post1(r.p.b, wr(100, op::IBV_WR_SEND, SIGNALED, &[(r.dst.addr() + 2048, 8, r.dst_key)])), 0);
    r.p.dev.step(20);
    let rnr_start = r.p.dev.stats().rnr_naks;
    assert!(rnr_start >= 1, "B's SEND is being RNR NAKed");
    const ROUNDS: u64 = 20;
    let mut b = Vec::new();
    for round in 0..ROUNDS {
        b.extend(poll(r.p.b_cq, 16)); // frees the receive slots
        r.recv(1000 + round, 0, 64);
        r.p.dev.inject(&SimFault { count: 1, ..SimFault::new(SQD_SIM_FAULT_LOSE_ACKS, r.p.a) }).unwrap();
        post(r.p.a, &mut [r.write(2 * round, 0, 0, 8, 512), r.send(2 * round + 1, SIGNALED, 8, 16)]);
        let wc = poll_n(r.p.a_cq, 1, 200);
        assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(2 * round + 1, st::IBV_WC_SUCCESS)], "round {round}");
    }
    let s = r.p.dev.stats();
    // Every round: the coalesced ACK lost, one timeout, both requests resent, both recognised as duplicates.
    assert_eq!((s.acks_lost, s.timeouts, s.duplicates), (ROUNDS, ROUNDS, 2 * ROUNDS), "{s:?}");
    assert!(s.rnr_naks >= rnr_start + ROUNDS, "B's requester was in RNR back-off all along: {s:?}");
    b.extend(poll(r.p.b_cq, 16));
    assert_eq!(b.len() as u64, ROUNDS, "one receive per SEND, none for a duplicate, and no CQE for B's own SEND");
    assert!(b.iter().all(|w| w.status == st::IBV_WC_SUCCESS && w.wr_id >= 1000));
    assert!(!r.p.dev.qp_in_error(r.p.a).unwrap() && !r.p.dev.qp_in_error(r.p.b).unwrap());
}

/// retry_cnt bounds consecutive transport retries (timeouts, sequence-error NAKs) without forward progress; an
/// ACK or response that acknowledges new work reloads it. With retry_cnt 1, 400 rounds that each lose an ACK
/// (recovered by a timeout) or a request (recovered by a sequence NAK) all succeed; then a random-loss run.
#[test]
fn retry_cnt_counts_retries_without_progress_and_an_ack_of_new_work_reloads_it() {
    let conn = SimConnAttr { retry_cnt: 1, ..SimConnAttr::default() };
    let r = Rig::with_conn(cfg(), 16, 256, conn);
    const ROUNDS: u64 = 400;
    for round in 0..ROUNDS {
        let kind = if round % 2 == 0 { SQD_SIM_FAULT_LOSE_ACKS } else { SQD_SIM_FAULT_LOSE_REQUESTS };
        r.p.dev.inject(&SimFault { count: 1, ..SimFault::new(kind, r.p.a) }).unwrap();
        let id = 4 * round;
        post(r.p.a, &mut [r.write(id, 0, 0, 8, 0), r.write(id + 1, 0, 8, 8, 8), r.write(id + 2, 0, 16, 8, 16), r.write(id + 3, SIGNALED, 24, 8, 24)]);
        let wc = poll_n(r.p.a_cq, 1, 200);
        assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(id + 3, st::IBV_WC_SUCCESS)], "round {round}");
    }
    let s = r.p.dev.stats();
    assert_eq!((s.acks_lost, s.packets_lost), (ROUNDS / 2, ROUNDS / 2));
    assert_eq!(s.timeouts + s.seq_naks, ROUNDS, "one retry per round, {ROUNDS} in all against a retry_cnt of 1: {s:?}");
    assert!(s.seq_naks > 0 && s.timeouts > 0, "{s:?}");

    // Rare random loss both ways over a long run (this seed: dozens of losses, never three in a row on one
    // retry): retry_cnt 2 is never exhausted.
    let conn = SimConnAttr { retry_cnt: 2, ..SimConnAttr::default() };
    let c = SimConfig { seed: 77, loss_ppm: 5000, ack_loss_ppm: 5000, wire_delay_max: 3, ..SimConfig::default() };
    let r = Rig::with_conn(c, 64, 256, conn);
    for round in 0..1000u64 {
        let mut ws: Vec<W> = (0..8).map(|k| r.write(8 * round + k, if k == 7 { SIGNALED } else { 0 }, 8 * k, 8, 8 * k)).collect();
        post(r.p.a, &mut ws);
        let wc = poll_n(r.p.a_cq, 1, 400);
        assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(8 * round + 7, st::IBV_WC_SUCCESS)], "round {round}");
    }
    let s = r.p.dev.stats();
    assert!(s.packets_lost > 20 && s.acks_lost > 5 && s.timeouts + s.seq_naks > 20, "losses happened and were retried, far more often than retry_cnt: {s:?}");
}

/// The legitimate road to `IBV_WC_RETRY_EXC_ERR` on a pair with no dead link: B's SEND to A is RNR NAKed
/// forever (A posts no receive, rnr_retry 7). An RNR NAK acknowledges nothing new, so it is not forward
/// progress: it spends only the RNR count (never exhausted at 7) and does not reload retry_cnt. Each RNR NAK
/// lost on the way costs B one timeout and one transport retry; the dozens of RNR NAKs received in between
/// undo none of it; the (retry_cnt+1)-th lost one ends B's SEND with RETRY_EXC_ERR and puts B in error. From then on
/// B drops A's requests without a response, and A's next WRITE ends with RETRY_EXC_ERR too, though A's own
/// traffic lost nothing.
#[test]
fn lost_rnr_naks_of_an_endless_rnr_stall_exhaust_retry_cnt_and_the_peer_follows() {
    let conn = SimConnAttr { retry_cnt: 2, ..SimConnAttr::default() };
    let r = Rig::with_conn(cfg(), 16, 256, conn);
    assert_eq!(post1(r.p.b, wr(100, op::IBV_WR_SEND, SIGNALED, &[(r.dst.addr() + 2048, 8, r.dst_key)])), 0);
    r.p.dev.step(20);
    for lost in 1..=3u64 {
        let rnr_before = r.p.dev.stats().rnr_naks;
        // The next RNR NAK A sends to B is lost.
        r.p.dev.inject(&SimFault { count: 1, ..SimFault::new(SQD_SIM_FAULT_LOSE_ACKS, r.p.b) }).unwrap();
        r.p.dev.step(200);
        let s = r.p.dev.stats();
        assert_eq!((s.acks_lost, s.timeouts), (lost, lost), "each lost RNR NAK is one timeout of B's SEND: {s:?}");
        if lost < 3 {
            assert!(s.rnr_naks >= rnr_before + 10, "many RNR NAKs arrived after the loss, and none reloaded retry_cnt: {s:?}");
            assert!(!r.p.dev.qp_in_error(r.p.b).unwrap(), "{lost} lost RNR NAKs are within retry_cnt 2");
            // A's requests to B meanwhile: executed and acknowledged.
            post1(r.p.a, r.write(lost, SIGNALED, 0, 8, 0));
            let wc = poll_n(r.p.a_cq, 1, 100);
            assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(lost, st::IBV_WC_SUCCESS)]);
        }
    }
    let b = poll(r.p.b_cq, 16);
    assert_eq!(b.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(100, st::IBV_WC_RETRY_EXC_ERR)]);
    assert!(r.p.dev.qp_in_error(r.p.b).unwrap());

    // B in error answers nothing: A's WRITE is retried retry_cnt times, then fails.
    let before = r.p.dev.stats();
    post1(r.p.a, r.write(9, SIGNALED, 0, 8, 0));
    let wc = poll_n(r.p.a_cq, 1, 400);
    assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(9, st::IBV_WC_RETRY_EXC_ERR)]);
    let s = r.p.dev.stats();
    assert_eq!((s.timeouts - before.timeouts, s.acks_lost, s.packets_lost), (3, 3, 0), "no packet of A's was lost: {s:?}");
}

// ---- completion order: successes, then at most one error, then flushes -----------------------------------

/// A signaled FETCH_AND_ADD whose response is lost, three signaled WRITEs behind it whose coalesced ACK
/// arrives, then a WQE that fails at its transmission. The ACK beyond the atomic tells the requester the
/// atomic's response was lost: it resends from the atomic (the WRITEs with it), and the responder answers the
/// duplicate atomic from its replay record without executing it again. The failing WQE stops the requester;
/// its error is reported once every earlier WQE has completed, in order. No flush before a success, no
/// error after a flush.
#[test]
fn a_lost_atomic_response_is_recovered_before_a_later_wqe_fails() {
    let r = Rig::new(cfg(), 16, 32);
    let local = Buf::new(8, 0);
    let lk = mr_keys(r.p.reg(&local)).0;
    r.dst.write(0, &40u64.to_ne_bytes());
    // The first response to A — the atomic's — is lost.
    r.p.dev.inject(&SimFault { count: 1, ..SimFault::new(SQD_SIM_FAULT_LOSE_ACKS, r.p.a) }).unwrap();
    post(
        r.p.a,
        &mut [
            wr(1, op::IBV_WR_ATOMIC_FETCH_AND_ADD, SIGNALED, &[(local.addr(), 8, lk)]).atomic(r.dst.addr(), r.dst_key, 2, 0),
            r.write(2, SIGNALED, 0, 8, 64),
            r.write(3, SIGNALED, 8, 8, 72),
            r.write(4, SIGNALED, 16, 8, 80),
        ],
    );
    // Step 1: all four sent; step 2: executed, the atomic's response lost; step 4: the coalesced ACK of the
    // WRITEs leaves; it arrives at step 5, when the next WQE is transmitted too — and fails.
    r.p.dev.step(4);
    assert_eq!(r.p.dev.stats().acks_lost, 1);
    assert!(poll(r.p.a_cq, 8).is_empty());
    r.p.dev.inject(&SimFault { status: st::IBV_WC_LOC_QP_OP_ERR, ..SimFault::new(SQD_SIM_FAULT_FAIL_NEXT, r.p.a) }).unwrap();
    post1(r.p.a, r.write(5, SIGNALED, 24, 8, 88));
    r.p.dev.run_until_idle(500).unwrap();
    post1(r.p.a, r.write(6, 0, 32, 8, 96));
    let wc = poll(r.p.a_cq, 16);
    let got: Vec<(u64, u32)> = wc.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        vec![
            (1, st::IBV_WC_SUCCESS),
            (2, st::IBV_WC_SUCCESS),
            (3, st::IBV_WC_SUCCESS),
            (4, st::IBV_WC_SUCCESS),
            (5, st::IBV_WC_LOC_QP_OP_ERR),
            (6, st::IBV_WC_WR_FLUSH_ERR)
        ]
    );
    assert_eq!((wc[0].opcode, wc[0].byte_len), (ibv_wc_opcode::IBV_WC_FETCH_ADD, 8));
    assert_eq!(local.read(0, 8), 40u64.to_ne_bytes(), "the replayed result of the one execution");
    assert_eq!(r.dst.read(0, 8), 42u64.to_ne_bytes(), "the atomic executed once");
    assert_eq!(r.dst.read(64, 24), vec![0xa5; 24]);
    assert!(r.p.dev.stats().duplicates >= 1);
    assert!(r.p.dev.qp_in_error(r.p.a).unwrap());
}

/// A WQE that fails at its transmission while earlier ones are still in flight: the requester stops there,
/// the earlier ones complete first — successfully, and the failure is then the one error; or one of them
/// fails too, and then that earlier one is the error and the later failure a flush.
#[test]
fn a_failing_wqe_waits_for_the_earlier_ones_in_flight() {
    let fail_next = |r: &Rig| r.p.dev.inject(&SimFault { status: st::IBV_WC_LOC_QP_OP_ERR, ..SimFault::new(SQD_SIM_FAULT_FAIL_NEXT, r.p.a) }).unwrap();
    // The earlier WRITE succeeds (its ACK is even lost once: the timeout resends it).
    let r = Rig::new(cfg(), 16, 32);
    r.p.dev.inject(&SimFault { count: 1, ..SimFault::new(SQD_SIM_FAULT_LOSE_ACKS, r.p.a) }).unwrap();
    post1(r.p.a, r.write(1, SIGNALED, 0, 8, 0));
    r.p.dev.step(1);
    fail_next(&r);
    post1(r.p.a, r.write(2, SIGNALED, 8, 8, 8));
    post1(r.p.a, r.write(3, SIGNALED, 16, 8, 16));
    r.p.dev.step(2);
    assert!(!r.p.dev.qp_in_error(r.p.a).unwrap(), "the failure waits for WRITE 1's ACK");
    assert!(r.p.dev.wqe_finished(r.p.a, 1).unwrap(), "the failed WQE is finished: never to be sent");
    assert_eq!(r.p.dev.stats().packets, 1, "nothing at or after the failure is sent");
    r.p.dev.run_until_idle(500).unwrap();
    let wc = poll(r.p.a_cq, 8);
    assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(1, st::IBV_WC_SUCCESS), (2, st::IBV_WC_LOC_QP_OP_ERR), (3, st::IBV_WC_WR_FLUSH_ERR)]);
    assert_eq!(r.p.dev.stats().timeouts, 1);
    assert_eq!(r.dst.read(8, 16), vec![0; 16], "WRITEs 2 and 3 never left");

    // The earlier WRITE fails at the responder (bad rkey) after the later WQE failed locally.
    let r = Rig::new(cfg(), 16, 32);
    post1(r.p.a, r.write(1, SIGNALED, 0, 8, 0).rdma(r.dst.addr(), 0xdead));
    r.p.dev.step(1);
    fail_next(&r);
    post1(r.p.a, r.write(2, SIGNALED, 8, 8, 8));
    r.p.dev.run_until_idle(500).unwrap();
    let wc = poll(r.p.a_cq, 8);
    assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(1, st::IBV_WC_REM_ACCESS_ERR), (2, st::IBV_WC_WR_FLUSH_ERR)]);
}

/// An endless RNR stall with requests pipelined behind the stalled SEND and no loss: the SEND is RNR NAKed
/// round after round (rnr_retry 7: forever), and the WRITE sent behind it in every round finds the responder
/// still expecting the SEND. The RNR NAK already told the requester where to resume, so the responder drops
/// the WRITE silently instead of answering it with a sequence-error NAK — which would spend a transport retry
/// each time the NAK arrived after the RNR back-off, nothing reloading retry_cnt in a stall, and end the SEND
/// in RETRY_EXC_ERR without a single lost packet. Once a receive is posted, both complete.
#[test]
fn an_rnr_stall_with_requests_pipelined_behind_spends_no_transport_retry() {
    // One WQE per step, a short back-off and varying wire delays: the WRITE's packet often trails the SEND's
    // by more than the back-off.
    let c = SimConfig { tx_per_step: 1, wire_delay_min: 1, wire_delay_max: 3, rnr_delay: 1, ..SimConfig::default() };
    let r = Rig::new(c, 16, 64);
    post(r.p.a, &mut [r.send(1, SIGNALED, 0, 8), r.write(2, SIGNALED, 8, 8, 8)]);
    r.p.dev.step(3000);
    let s = r.p.dev.stats();
    assert_eq!(poll(r.p.a_cq, 8).iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![], "{s:?}");
    assert!(s.rnr_naks > 500, "{s:?}");
    assert_eq!((s.packets_lost, s.acks_lost, s.seq_naks, s.timeouts), (0, 0, 0, 0), "{s:?}");
    r.recv(9, 0, 64);
    let wc = poll_n(r.p.a_cq, 2, 100);
    assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(1, st::IBV_WC_SUCCESS), (2, st::IBV_WC_SUCCESS)]);
    assert_eq!(r.dst.read(8, 8), vec![0xa5; 8]);
}

/// A QP made through `Scriptable::create_qp` talks to an internal sink; the sink too answers a duplicate atomic
/// (its response lost) from its replay record, so the retransmission completes the atomic.
#[test]
fn a_scripted_sinks_duplicate_atomic_is_answered_from_its_replay_record() {
    let dev = SimDevice::new(&cfg()).unwrap();
    let s: &dyn Scriptable = &*dev;
    let cq = s.create_cq(16).unwrap();
    let qp = s.create_qp(cq, cq, &sqdisc_sim::scripted::ScriptedQpCaps::with_depths(8, 4)).unwrap();
    dev.inject(&SimFault { count: 1, ..SimFault::new(SQD_SIM_FAULT_LOSE_ACKS, qp) }).unwrap();
    post(qp, &mut [wr(1, op::IBV_WR_ATOMIC_FETCH_AND_ADD, SIGNALED, &[(0x1000, 8, 7)]).atomic(0x2000, 9, 1, 0)]);
    let wc = poll_n(cq, 1, 2000);
    assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(1, st::IBV_WC_SUCCESS)]);
    let st_ = dev.stats();
    assert_eq!((st_.acks_lost, st_.timeouts, st_.duplicates), (1, 1, 1), "{st_:?}");
}

/// A fatal NAK beyond a READ whose response was lost: an implicit NAK of the READ, and nothing else. The
/// responder, in error after the NAK, answers the resent READ with nothing, so the READ ends in RETRY_EXC_ERR
/// and the WRITE the NAK named flushes behind it.
#[test]
fn a_fatal_nak_beyond_a_lost_read_response_is_an_implicit_nak_of_the_read() {
    let conn = SimConnAttr { retry_cnt: 2, ..SimConnAttr::default() };
    let r = Rig::with_conn(cfg(), 16, 32, conn);
    let local = Buf::new(8, 0);
    let lk = mr_keys(r.p.reg(&local)).0;
    r.p.dev.inject(&SimFault { count: 1, ..SimFault::new(SQD_SIM_FAULT_LOSE_ACKS, r.p.a) }).unwrap();
    post(r.p.a, &mut [wr(1, op::IBV_WR_RDMA_READ, SIGNALED, &[(local.addr(), 8, lk)]).rdma(r.dst.addr(), r.dst_key), r.write(2, SIGNALED, 0, 8, 0).rdma(r.dst.addr(), 0xdead)]);
    let wc = poll_n(r.p.a_cq, 2, 500);
    assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(1, st::IBV_WC_RETRY_EXC_ERR), (2, st::IBV_WC_WR_FLUSH_ERR)]);
    assert!(r.p.dev.qp_in_error(r.p.b).unwrap(), "the responder went to error with its NAK");
    assert_eq!(r.p.dev.stats().timeouts, 3);
}
