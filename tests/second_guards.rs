//! Second, independent tests of rules that one test alone guarded: in-order receive retirement (through a CQ
//! that hands out receive completions out of order), the receive budget of a queue whose sends and receives
//! share one CQ (an exact reservation, and no overrun when everything flushes at once), and the tracked-MR
//! barrier (a tracked MR used by a backlogged WR among WRs that do not use it).

mod common;

use std::cell::Cell;
use std::ffi::c_int;
use std::rc::Rc;

use common::*;
use rdma_sys::{ibv_cq, ibv_wc};
use sqdisc_sim::scripted::{ScriptedDevice, ScriptedQpCaps};
use sqdisc::verbs::{CqHandle, QpHandle};
use sqdisc::{Cq, Deferred, Queue, QueueConfig};

type PollFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;

thread_local! {
    /// The scripted device's own `poll_cq`, which `reversing_poll` wraps.
    static PROVIDER_POLL: Cell<Option<PollFn>> = const { Cell::new(None) };
    /// While set, `reversing_poll` hands out the CQEs of each provider poll in reverse order.
    static REVERSE: Cell<bool> = const { Cell::new(false) };
}

/// A provider poll that delivers completions out of order when asked (a misbehaving or foreign provider).
unsafe extern "C" fn reversing_poll(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    let poll = PROVIDER_POLL.with(|p| p.get()).expect("set before the CQ is polled");
    // SAFETY: the caller's arguments, passed on unchanged to the provider's own poll.
    let got = unsafe { poll(cq, n, wc) };
    if got > 1 && REVERSE.with(|r| r.get()) {
        // SAFETY: the provider wrote `got` completions into `wc`.
        unsafe { std::slice::from_raw_parts_mut(wc, got as usize) }.reverse();
    }
    got
}

#[test]
fn a_receive_completion_out_of_order_retires_nothing_but_the_oldest_receive_in_order() {
    let dev = ScriptedDevice::new();
    let cq_raw = dev.create_cq(32).unwrap();
    let qp = dev.create_qp(cq_raw, cq_raw, &ScriptedQpCaps::with_depths(8, 4)).unwrap();
    // SAFETY: the device's context is valid while the device lives; a field read.
    let provider_poll = unsafe { (*dev.context()).ops.poll_cq }.unwrap();
    PROVIDER_POLL.with(|p| p.set(Some(provider_poll)));
    // SAFETY: the CQ lives as long as the device, which outlives the handles below (dropped first).
    let cq = Cq::new(unsafe { CqHandle::from_raw_with_ops(cq_raw, reversing_poll, None) }.unwrap());
    let log: Log = Rc::default();
    let cfg = QueueConfig { sq_depth: 8, rq_depth: 4, max_send_sge: 4, max_inline_data: 64, ..QueueConfig::default() };
    // SAFETY: as above.
    let q = Queue::new(&cq, Some(&cq), unsafe { QpHandle::from_raw(qp) }.unwrap(), cfg, Some(logger(&log))).unwrap();
    let rig_recvs = |ids: std::ops::Range<u64>| post_recv_chain(&q, ids, 64);
    let poll = || {
        // SAFETY: all-zero is a valid `ibv_wc`.
        let mut wc: [ibv_wc; 8] = unsafe { std::mem::zeroed() };
        let n = cq.poll(&mut wc).unwrap();
        wc[..n].iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>()
    };
    rig_recvs(0..3).unwrap();
    // Receives 0 and 1 arrive; the CQ hands out 1's completion before 0's.
    dev.deliver(qp, 10, None).unwrap();
    dev.deliver(qp, 11, None).unwrap();
    REVERSE.with(|r| r.set(true));
    let shown = poll();
    REVERSE.with(|r| r.set(false));
    assert_eq!(shown, vec![(0, WC_SUCCESS)], "1's completion came before 0 was complete: a stray, not shown");
    let recvs: Vec<u64> = log.borrow().iter().map(|c| c.wr_id).collect();
    assert_eq!(recvs, vec![0], "0 is retired by its own completion only; 1 is not retired by a completion out of order");
    let st = q.stats();
    assert_eq!((st.recv_cqes, st.stray_cqes, st.recv_outstanding), (1, 1, 2));
    assert_eq!(cq.stats().stray, 1);
    // 2's completion, in order from the device, is not the oldest receive's (1 is still outstanding): a stray too.
    dev.deliver(qp, 12, None).unwrap();
    assert!(poll().is_empty());
    assert_eq!(q.stats().stray_cqes, 2);
    assert_eq!(log.borrow().len(), 1);
    drop(q);
    drop(cq);
}

#[test]
fn a_queue_whose_sends_and_receives_share_a_cq_reserves_both_and_never_overruns_it() {
    let cfg = |sq, rq| QueueConfig { sq_depth: sq, rq_depth: rq, max_send_sge: 4, max_inline_data: 64, signal_interval: sq, ..QueueConfig::default() };
    let dev = ScriptedDevice::new();
    // sq_depth 6 + rq_depth 5 + 1 marker = 12: a CQ of 11 is refused, one of 12 taken exactly.
    for (cqe, fits) in [(11, false), (12, true)] {
        let cq_raw = dev.create_cq(cqe).unwrap();
        let qp = dev.create_qp(cq_raw, cq_raw, &ScriptedQpCaps::with_depths(6, 5)).unwrap();
        // SAFETY: the CQ and QP live as long as the device, which outlives the handles (dropped in this turn).
        let cq = Cq::new(unsafe { CqHandle::from_raw(cq_raw) }.unwrap());
        let r = Queue::new(&cq, Some(&cq), unsafe { QpHandle::from_raw(qp) }.unwrap(), cfg(6, 5), None);
        match r {
            Ok(q) => {
                assert!(fits, "a CQ of {cqe} cannot take sq_depth 6 + rq_depth 5 + a drain marker");
                assert_eq!(cq.stats().reserved, 12);
                drop(q);
                assert_eq!(cq.stats().reserved, 0, "freeing the queue returns both reservations");
            }
            Err(e) => {
                assert!(!fits, "a CQ of {cqe} refused the queue: {}", e.message());
                assert_eq!(e.errno(), libc::ENOSPC);
                assert!(e.message().contains("rq_depth 5"), "{}", e.message());
            }
        }
        drop(cq);
        dev.destroy_qp(qp).unwrap();
        dev.destroy_cq(cq_raw).unwrap();
    }
    // On the CQ of exactly 12: a full SQ with an idle-tail marker and a full RQ all flush at once, no overrun.
    let mut c = config(6, 6, 0);
    c.rq_depth = 5;
    let rig = Rig::new(c, 12);
    rig.post_recvs(0..5).unwrap();
    rig.post(&mut Chain::sends(100..105, 0)).unwrap();
    rig.poll_all();
    rig.poll_all();
    let st = rig.q().stats();
    assert_eq!((st.markers, st.in_provider, st.recv_outstanding), (1, 6, 5), "5 WRs and their marker, 5 receives");
    rig.dev.set_error(rig.qp).unwrap();
    let cs = rig.dev.cq_stats(rig.cq_raw).unwrap();
    assert_eq!((cs.queued, cs.overruns), (11, 0), "6 send flushes and 5 receive flushes fit");
    rig.poll_all();
    assert_eq!(rig.log.borrow().len(), 10);
    rig.q().check_free().unwrap();
    rig.assert_no_violations();
}

#[test]
fn a_tracked_mr_used_by_a_backlogged_wr_is_released_right_after_that_wr() {
    let rig = Rig::new(config(2, 2, 8), 32);
    const TRACKED: u32 = 0x51;
    rig.q().track_mr(TRACKED).unwrap();
    // 0 and 1 fill the SQ; 2 (parked) is the only WR using the tracked MR, and only in its second SGE; 3 and 4
    // (parked) do not use it.
    let mut chain = Chain::sends(0..2, 0).push(2, WR_SEND, 0, &[8, 8]).push(3, WR_SEND, 0, &[8]).push(4, WR_SEND, 0, &[8]);
    chain.sges[2][1].lkey = TRACKED;
    rig.post(&mut chain).unwrap();
    assert_eq!(rig.q().stats().backlog, 3);
    let ran_after: Rc<Cell<Option<usize>>> = Rc::default();
    let (log, at) = (rig.log.clone(), ran_after.clone());
    rig.q().defer_mr(TRACKED, Deferred::Closure(Box::new(move || at.set(Some(log.borrow().len()))))).unwrap();
    // An untracked MR waits for every WR accepted so far.
    let untracked_after: Rc<Cell<Option<usize>>> = Rc::default();
    let (log, at) = (rig.log.clone(), untracked_after.clone());
    rig.q().defer_mr(0x99, Deferred::Closure(Box::new(move || at.set(Some(log.borrow().len()))))).unwrap();
    let mut rounds = 0;
    while rig.log.borrow().len() < 5 {
        rounds += 1;
        assert!(rounds < 50, "not released: {:?}", rig.q().stats());
        rig.complete(usize::MAX);
        rig.poll_all();
    }
    assert_eq!(rig.released_ids(), (0..5).collect::<Vec<_>>());
    assert_eq!(ran_after.get(), Some(3), "right after the release of 2, before those of 3 and 4");
    assert_eq!(untracked_after.get(), Some(5), "after every WR accepted before it");
}
