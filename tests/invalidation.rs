//! rkey safety on the software HCA: once sqdisc reports an invalidation complete, no remote RDMA access with
//! that rkey can succeed, while a peer keeps trying; before it, the peer's accesses work. Across seeds, with
//! request and ACK loss, and with the LocalInv deferred behind unacknowledged SENDs.

mod sim_support;

use std::cell::Cell;
use std::rc::Rc;

use sim_support::*;
use sqdisc_sim::*;
use sqdisc::verbs::{CqHandle, QpHandle};
use sqdisc::{Completion, Cq, InvalidateMode, Queue, QueueConfig, ReleaseHandler};

struct Outcome {
    writes_before: u32,
    writes_ok_before: u32,
    attempts_after: u32,
}

fn run(seed: u64) -> Outcome {
    let cfg = SimConfig { seed, loss_ppm: 40_000, ack_loss_ppm: 40_000, wire_delay_min: 1, wire_delay_max: 4, ..SimConfig::default() };
    let p = Pair::new(cfg, 32, 512);
    let exposed = Buf::new(4096, 0);
    let (_, rkey) = mr_keys(p.reg(&exposed));
    let own = Buf::new(4096, 7);
    let (own_lkey, _) = mr_keys(p.reg(&own));
    let peer_src = Buf::new(64, 9);
    let (peer_lkey, _) = mr_keys(p.reg(&peer_src));
    for i in 0..8 {
        assert_eq!(post_recv(p.b, i, &[(peer_src.addr(), 64, peer_lkey)]), 0);
    }
    // Side `a` runs sqdisc; it sends a few unsignaled SENDs, then asks to invalidate the rkey it exposed.
    // SAFETY: the CQ and QP live as long as the device, which outlives the queue (dropped first below).
    let cq = Cq::new(unsafe { CqHandle::from_raw(p.a_cq) }.unwrap());
    let cfg = QueueConfig { sq_depth: 32, max_send_sge: 4, max_inline_data: 64, signal_interval: 8, ..QueueConfig::default() };
    let q = Queue::new(&cq, None, unsafe { QpHandle::from_raw(p.a) }.unwrap(), cfg, None).unwrap();
    let mut sends: Vec<W> = (0..3).map(|i| wr(i, op::IBV_WR_SEND, 0, &[(own.addr(), 64, own_lkey)])).collect();
    qpost(&q, &mut sends).unwrap();
    let done = Rc::new(Cell::new(None::<u32>));
    let d = done.clone();
    let handler = ReleaseHandler::Closure(Box::new(move |c: &Completion| d.set(Some(c.status))));
    q.invalidate(rkey, InvalidateMode::Deferred, 1, Some(handler)).unwrap();

    // Side `b`, the peer, writes into the exposed buffer over and over, one WRITE at a time.
    let (mut writes_before, mut writes_ok_before) = (0, 0);
    let mut in_flight: Option<bool> = None; // Some(posted after the invalidation was reported)
    for _ in 0..20_000 {
        if done.get().is_some() {
            break;
        }
        if in_flight.is_none() {
            let w = wr(77, op::IBV_WR_RDMA_WRITE, SIGNALED, &[(peer_src.addr(), 8, peer_lkey)]).rdma(exposed.addr(), rkey);
            assert_eq!(post1(p.b, w), 0);
            in_flight = Some(done.get().is_some());
        }
        for wc in poll(p.b_cq, 8) {
            if wc.wr_id == 77 {
                writes_before += 1;
                writes_ok_before += (wc.status == st::IBV_WC_SUCCESS) as u32;
                in_flight = None;
            }
        }
        qpoll(&cq);
    }
    assert_eq!(done.get(), Some(st::IBV_WC_SUCCESS), "seed {seed}: the invalidation completed");
    // From now on every access with the rkey must fail, from whichever QP the peer tries, and the exposed bytes
    // must not change.
    let snapshot = exposed.all();
    let mut attempts_after = 0;
    for k in 0..4u64 {
        let (c_cq, a2_cq) = (p.dev.create_cq(64).unwrap(), p.dev.create_cq(64).unwrap());
        let c = p.dev.create_qp(&mut qp_attr(c_cq, c_cq, 8, 8)).unwrap();
        let a2 = p.dev.create_qp(&mut qp_attr(a2_cq, a2_cq, 8, 8)).unwrap();
        p.dev.connect(c, a2, &SimConnAttr::default()).unwrap();
        let opcode = if k % 2 == 0 { op::IBV_WR_RDMA_WRITE } else { op::IBV_WR_RDMA_READ };
        let w = wr(100 + k, opcode, SIGNALED, &[(peer_src.addr(), 8, peer_lkey)]).rdma(exposed.addr(), rkey);
        assert_eq!(post1(c, w), 0);
        let got = poll_n(c_cq, 1, 20_000);
        assert_eq!(got.len(), 1, "seed {seed}: the attempt completes");
        // The responder refuses it (REM_ACCESS_ERR); if that NAK is lost, the requester's retries run out.
        assert!(
            [st::IBV_WC_REM_ACCESS_ERR, st::IBV_WC_RETRY_EXC_ERR].contains(&got[0].status),
            "seed {seed}: access {k} with an invalidated rkey completed with status {}",
            got[0].status
        );
        attempts_after += 1;
    }
    assert_eq!(exposed.all(), snapshot, "seed {seed}: the exposed buffer changed after the invalidation");
    // The old QP too, if it still works.
    drop(q);
    Outcome { writes_before, writes_ok_before, attempts_after }
}

#[test]
fn no_access_with_an_rkey_succeeds_once_its_invalidation_is_reported() {
    let (mut before, mut ok_before, mut after) = (0, 0, 0);
    for seed in 1..=150 {
        let o = run(seed);
        before += o.writes_before;
        ok_before += o.writes_ok_before;
        after += o.attempts_after;
    }
    eprintln!("peer writes before the report: {before} ({ok_before} succeeded); refused after: {after}");
    assert!(ok_before > 0, "the rkey worked before its invalidation: the test is not vacuous");
    assert_eq!(after, 150 * 4);
}
