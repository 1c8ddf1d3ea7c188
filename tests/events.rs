//! Asynchronous events and event mode, on the scripted device.

mod common;

use common::*;
use sqdisc::SQD_COMPLETION_NEVER_POSTED;

const EV_CQ_ERR: u32 = 0;
const EV_QP_FATAL: u32 = 1;
const EV_SQ_DRAINED: u32 = 5;
const EV_PORT_ACTIVE: u32 = 9;

#[test]
fn a_fatal_qp_releases_everything_at_once_and_late_cqes_are_swallowed() {
    let mut cfg = config(8, 4, 8);
    cfg.rq_depth = 2;
    let rig = Rig::new(cfg, 64);
    rig.post_recvs(100..102).unwrap();
    rig.post(&mut Chain::sends(0..11, 0)).unwrap(); // 8 posted, 3 parked
    rig.complete(2); // the HCA did some work the queue has not seen a CQE for
    rig.q().on_async_event(EV_QP_FATAL).unwrap();
    let log = rig.log.borrow().clone();
    let sends: Vec<_> = log.iter().filter(|c| !c.is_recv()).collect();
    assert_eq!(sends.iter().map(|c| c.wr_id).collect::<Vec<_>>(), (0..11).collect::<Vec<_>>());
    assert!(sends.iter().all(|c| c.status == WC_WR_FLUSH_ERR));
    assert_eq!(sends.iter().filter(|c| c.flags & SQD_COMPLETION_NEVER_POSTED != 0).count(), 3);
    let recvs: Vec<u64> = log.iter().filter(|c| c.is_recv()).map(|c| c.wr_id).collect();
    assert_eq!(recvs, vec![100, 101]);
    rig.q().check_free().unwrap();
    // The provider flushes after all: nothing is shown twice, nothing released twice.
    rig.dev.set_error(rig.qp).unwrap();
    assert!(rig.poll_all().is_empty());
    assert_eq!(rig.log.borrow().len(), 13);
    let st = rig.q().stats();
    assert!(st.late_cqes > 0 && st.stray_cqes == 0, "{st:?}");
    assert_eq!(rig.post(&mut Chain::sends(50..51, 0)).unwrap_err().0, libc::EIO);
}

#[test]
fn late_cqes_of_a_freed_abandoned_queue_are_dropped_not_passed_through() {
    let mut rig = Rig::new(config(8, 4, 8), 64);
    rig.post(&mut Chain::sends(0..6, 0)).unwrap();
    rig.q().on_async_event(EV_QP_FATAL).unwrap();
    rig.q().check_free().unwrap();
    rig.queue = None;
    // The provider flushes after all, with the library's wr_ids: none may reach the ULP as its own.
    rig.dev.set_error(rig.qp).unwrap();
    assert!(rig.poll_all().is_empty());
    let st = rig.cq.stats();
    assert!(st.stray > 0 && st.passthrough == 0, "{st:?}");
}

#[test]
fn a_cq_error_releases_every_queue_on_it() {
    let rig = Rig::new(config(8, 4, 0), 64);
    let qp2 = rig.dev.create_qp(rig.cq_raw, rig.cq_raw, &sqdisc_sim::scripted::ScriptedQpCaps::with_depths(8, 1)).unwrap();
    let log2 = Log::default();
    // SAFETY: the QP lives as long as the device.
    let q2 = sqdisc::Queue::new(&rig.cq, None, unsafe { sqdisc::verbs::QpHandle::from_raw(qp2) }.unwrap(), config(8, 4, 0), Some(logger(&log2)))
        .unwrap();
    rig.post(&mut Chain::sends(0..3, 0)).unwrap();
    let mut c = Chain::sends(10..15, 0);
    let head = c.link();
    // SAFETY: the chain lives in `c` for the call.
    q2.post_send(unsafe { sqdisc::verbs::SendChain::from_raw(head) }).unwrap();
    rig.cq.on_async_event(EV_CQ_ERR).unwrap();
    assert_eq!(rig.released_ids(), vec![0, 1, 2]);
    assert_eq!(log2.borrow().iter().map(|c| c.wr_id).collect::<Vec<_>>(), (10..15).collect::<Vec<_>>());
    assert_eq!(rig.cq.on_async_event(EV_QP_FATAL).unwrap_err().errno(), libc::EINVAL);
    drop(q2);
}

#[test]
fn harmless_events_change_nothing_and_foreign_ones_are_refused() {
    let rig = Rig::new(config(8, 4, 0), 64);
    rig.post(&mut Chain::sends(0..3, 0)).unwrap();
    rig.q().on_async_event(EV_SQ_DRAINED).unwrap();
    assert!(rig.log.borrow().is_empty());
    assert_eq!(rig.q().on_async_event(EV_PORT_ACTIVE).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(rig.q().stats().closed, 0);
}

#[test]
fn arming_polls_again_so_a_completion_racing_the_arm_is_not_missed() {
    let rig = Rig::new(config(8, 4, 0), 64);
    // SAFETY: all-zero is a valid `ibv_wc`.
    let mut wc: [rdma_sys::ibv_wc; 4] = unsafe { std::mem::zeroed() };
    assert_eq!(rig.cq.arm(false, &mut wc).unwrap(), 0, "empty: safe to sleep");
    assert_eq!(rig.dev.cq_stats(rig.cq_raw).unwrap().arms, 1);
    // A completion lands after the ULP's last empty poll, before it arms.
    rig.post(&mut Chain::sends(0..1, SIGNALED)).unwrap();
    rig.complete(1);
    let n = rig.cq.arm(false, &mut wc).unwrap();
    assert_eq!(n, 1, "the arm reports it instead of letting the ULP sleep past it");
    assert_eq!(wc[0].wr_id, 0);
    assert_eq!(rig.released_ids(), vec![0]);
}

#[test]
fn a_queue_on_a_thread_safe_cq_keeps_sends_and_receives_on_it() {
    use sqdisc_sim::scripted::ScriptedQpCaps;
    use sqdisc::verbs::{CqHandle, QpHandle};
    let dev = sqdisc_sim::scripted::ScriptedDevice::new();
    let (a, b) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
    let qp = dev.create_qp(a, b, &ScriptedQpCaps::with_depths(8, 8)).unwrap();
    // SAFETY: the CQs and QP live as long as the device.
    let (ca, cb) = unsafe { (sqdisc::Cq::with_lock(CqHandle::from_raw(a).unwrap(), true), sqdisc::Cq::new(CqHandle::from_raw(b).unwrap())) };
    let mut cfg = config(8, 4, 0);
    cfg.rq_depth = 8;
    let e = sqdisc::Queue::new(&ca, Some(&cb), unsafe { QpHandle::from_raw(qp) }.unwrap(), cfg, None).err().unwrap();
    assert_eq!(e.errno(), libc::EINVAL);
    assert!(e.message().contains("thread-safe"), "{}", e.message());
    assert!(ca.lock().is_some() && cb.lock().is_none());
}
