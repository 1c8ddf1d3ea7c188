//! The semantics contract of a managed queue, on the scripted device.

mod common;

use common::*;
use sqdisc::{SQD_COMPLETION_IMPLIED, SQD_COMPLETION_NEVER_POSTED};

fn credits_are_never_exceeded_and_the_backlog_keeps_order(make: Make) {
    let rig = Rig::on(make, config(8, 4, 32), 64);
    rig.post(&mut Chain::sends(0..20, 0)).unwrap();
    let st = rig.q().stats();
    assert_eq!((st.accepted, st.in_provider, st.backlog), (20, 8, 12));
    // Drive completions a few WQEs at a time until everything is released.
    for _ in 0..100 {
        rig.complete(3);
        rig.poll_all();
        if rig.log.borrow().len() == 20 {
            break;
        }
    }
    assert_eq!(rig.released_ids(), (0..20).collect::<Vec<_>>(), "released exactly once, in post order");
    let dq = rig.dev.qp_stats(rig.qp).unwrap();
    assert!(dq.max_outstanding <= 8, "the provider held {} WQEs, more than sq_depth", dq.max_outstanding);
    rig.assert_no_violations();
    // The provider saw the WRs in post order (markers aside).
    let ids: Vec<u64> = (0..dq.wqes_posted as usize)
        .map(|i| rig.dev.wqe(rig.qp, i).unwrap())
        .filter(|w| w.opcode == WR_SEND)
        .map(|w| w.wr_id)
        .collect();
    assert_eq!(ids.len(), 20);
    let st = rig.q().stats();
    assert_eq!((st.parked, st.backlog_peak, st.backlog, st.released), (12, 12, 0, 20));
}

fn without_backlog_eagain_names_exactly_the_first_wr_not_taken(make: Make) {
    let rig = Rig::on(make, config(6, 2, 0), 64);
    let mut chain = Chain::sends(100..110, 0);
    let (errno, bad) = rig.post(&mut chain).unwrap_err();
    assert_eq!((errno, bad), (libc::EAGAIN, Some(6)));
    assert_eq!(rig.q().stats().accepted, 6);
    assert_eq!(rig.dev.qp_stats(rig.qp).unwrap().wqes_posted, 6);
    // The chain is the ULP's again, exactly: wr_ids, flags and links.
    for (i, w) in chain.wrs.iter().enumerate() {
        assert_eq!(w.wr_id, 100 + i as u64);
        assert_eq!(w.send_flags, 0);
        let expect = if i + 1 < chain.wrs.len() { &chain.wrs[i + 1] as *const _ } else { std::ptr::null() };
        assert_eq!(w.next as *const _, expect);
    }
    // Retrying the same suffix once credits return succeeds.
    rig.complete(6);
    rig.poll_all();
    assert_eq!(rig.released_ids(), (100..106).collect::<Vec<_>>());
    let mut rest = Chain::sends(106..110, 0);
    rig.post(&mut rest).unwrap();
    rig.assert_no_violations();
}

fn signaling_is_moderated_and_bounded(make: Make) {
    let rig = Rig::on(make, config(64, 8, 0), 128);
    for round in 0..40u64 {
        rig.post(&mut Chain::sends(round * 4..round * 4 + 4, 0)).unwrap();
        rig.complete(usize::MAX);
        rig.poll_all();
    }
    let dq = rig.dev.qp_stats(rig.qp).unwrap();
    // Longest run of unsignaled WQEs stays below the interval.
    let mut run = 0;
    for i in 0..dq.wqes_posted as usize {
        let w = rig.dev.wqe(rig.qp, i).unwrap();
        run = if w.send_flags & SIGNALED != 0 { 0 } else { run + 1 };
        assert!(run < 8, "{run} unsignaled WQEs in a row");
    }
    // Under steady load the CQEs per WR stay near 1/interval.
    let st = rig.q().stats();
    assert!(st.send_cqes * 8 <= st.accepted + 8, "{} CQEs for {} WRs", st.send_cqes, st.accepted);
    assert_eq!(st.markers, 0, "a queue posting every poll cycle needs no marker");
}

fn a_lone_unsignaled_wr_is_released_without_further_posts(make: Make) {
    let rig = Rig::on(make, config(16, 4, 0), 64);
    rig.post(&mut Chain::sends(7..8, 0)).unwrap();
    assert_eq!(rig.dev.wqe(rig.qp, 0).unwrap().send_flags & SIGNALED, 0, "moderated: posted unsignaled");
    rig.complete(usize::MAX);
    assert!(rig.poll_all().is_empty());
    assert!(rig.log.borrow().is_empty(), "no CQE covers it yet");
    assert!(rig.poll_all().is_empty(), "second poll: the idle tail gets a marker, which is not shown");
    let st = rig.q().stats();
    assert_eq!(st.markers, 1);
    rig.complete(usize::MAX);
    assert!(rig.poll_all().is_empty(), "the marker's CQE is hidden");
    let log = rig.log.borrow();
    assert_eq!(log.len(), 1);
    assert_eq!((log[0].wr_id, log[0].status, log[0].flags & SQD_COMPLETION_IMPLIED), (7, WC_SUCCESS, SQD_COMPLETION_IMPLIED));
}

fn poll_shows_what_raw_verbs_would_and_releases_are_ordered_with_implied_flags(make: Make) {
    let rig = Rig::on(make, config(16, 4, 0), 64);
    // 0,1 unsignaled, 2 asked signaled by the ULP, 3..=6 moderated (6 signaled by the interval).
    let mut c = Chain::sends(0..2, 0).push(2, WR_SEND, SIGNALED, &[8]);
    for id in 3..7 {
        c = c.push(id, WR_SEND, 0, &[8]);
    }
    rig.post(&mut c).unwrap();
    rig.complete(usize::MAX);
    let shown = rig.poll_all();
    assert_eq!(shown, vec![(2, WC_SUCCESS, WC_SEND)], "only the WR the ULP signaled is shown, with its wr_id");
    let log = rig.log.borrow();
    assert_eq!(log.iter().map(|c| c.wr_id).collect::<Vec<_>>(), (0..7).collect::<Vec<_>>());
    let implied: Vec<bool> = log.iter().map(|c| c.is_implied()).collect();
    assert_eq!(implied, vec![true, true, false, true, true, true, false]);
    assert!(log.iter().all(|c| c.status == WC_SUCCESS && c.opcode == WC_SEND));
}

/// Scripted device only: its `fail` picks the next WQE not yet executed, while the model's picks the next one
/// not yet transmitted (WRs 5..16 are on the wire already); the model's error paths are in tests/sim_*.rs.
#[test]
fn an_error_in_the_middle_fails_the_queue_and_flushes_in_order() {
    let make: Make = scripted;
    let rig = Rig::on(make, config(16, 4, 8), 64);
    rig.post(&mut Chain::sends(0..16, 0)).unwrap();
    rig.post(&mut Chain::sends(16..20, 0)).unwrap(); // parked: no credit
    assert_eq!(rig.q().stats().backlog, 4);
    rig.complete(5); // 0..=4 execute; 3 was signaled by the interval
    rig.dev.fail(rig.qp, WC_REM_ACCESS_ERR, 0x42).unwrap(); // 5 fails, 6..16 flush
    let shown = rig.poll_all();
    // The CQE of 3 freed four slots before the error CQE was reaped, so 16..20 left the backlog into the
    // (already failed) QP and flush too. Raw verbs shows the error CQE and a flush CQE for every later WR,
    // signaled or not.
    let mut expect = vec![(5, WC_REM_ACCESS_ERR)];
    expect.extend((6..20).map(|i| (i, WC_WR_FLUSH_ERR)));
    assert_eq!(shown.iter().map(|w| (w.0, w.1)).collect::<Vec<_>>(), expect);
    let log = rig.log.borrow();
    assert_eq!(log.iter().map(|c| c.wr_id).collect::<Vec<_>>(), (0..20).collect::<Vec<_>>());
    assert!(log[..5].iter().all(|c| c.status == WC_SUCCESS));
    assert_eq!((log[5].status, log[5].vendor_err, log[5].opcode), (WC_REM_ACCESS_ERR, 0x42, WC_SEND));
    assert!(log[6..].iter().all(|c| c.status == WC_WR_FLUSH_ERR && c.flags == 0 && c.opcode == WC_SEND));
    drop(log);
    let (errno, bad) = rig.post(&mut Chain::sends(30..31, 0)).unwrap_err();
    assert_eq!((errno, bad), (libc::EIO, Some(0)));
    rig.q().check_free().unwrap();
    rig.assert_no_violations();
}

fn backlog_wrs_of_a_failed_queue_are_released_as_never_posted_after_the_posted_ones(make: Make) {
    let rig = Rig::on(make, config(8, 4, 8), 64);
    rig.post(&mut Chain::sends(0..13, 0)).unwrap(); // 8 posted, 5 parked
    rig.dev.fail(rig.qp, WC_REM_ACCESS_ERR, 1).unwrap(); // 0 fails, 1..8 flush
    let shown = rig.poll_all();
    assert_eq!(shown.len(), 8, "only posted WRs have completions: {shown:?}");
    let log = rig.log.borrow();
    assert_eq!(log.iter().map(|c| c.wr_id).collect::<Vec<_>>(), (0..13).collect::<Vec<_>>());
    assert!(log[..8].iter().all(|c| !c.never_posted()));
    assert!(log[8..].iter().all(|c| c.status == WC_WR_FLUSH_ERR && c.flags & SQD_COMPLETION_NEVER_POSTED != 0));
    assert_eq!(rig.dev.qp_stats(rig.qp).unwrap().wqes_posted, 8, "the parked WRs never reached the provider");
}

fn a_release_callback_may_post_on_its_own_queue(make: Make) {
    use std::cell::RefCell;
    use std::rc::Rc;
    // Each release of WR n posts WR n + 1 from inside the callback, until 50.
    let dev = make();
    let cq_raw = dev.create_cq(64).unwrap();
    let qp = dev.create_qp(cq_raw, cq_raw, &sqdisc_sim::scripted::ScriptedQpCaps::with_depths(4, 1)).unwrap();
    let cq = sqdisc::Cq::new(unsafe { sqdisc::verbs::CqHandle::from_raw(cq_raw) }.unwrap());
    let slot: Rc<RefCell<Option<Rc<sqdisc::Queue>>>> = Rc::default();
    let seen: Rc<RefCell<Vec<u64>>> = Rc::default();
    let (slot2, seen2) = (slot.clone(), seen.clone());
    let handler = sqdisc::ReleaseHandler::Closure(Box::new(move |c: &sqdisc::Completion| {
        seen2.borrow_mut().push(c.wr_id);
        if c.wr_id < 50 {
            let q = slot2.borrow().clone().unwrap();
            let mut ch = Chain::sends(c.wr_id + 1..c.wr_id + 2, 0);
            let head = ch.link();
            q.post_send(unsafe { sqdisc::verbs::SendChain::from_raw(head) }).unwrap();
        }
    }));
    let q = Rc::new(sqdisc::Queue::new(&cq, None, unsafe { sqdisc::verbs::QpHandle::from_raw(qp) }.unwrap(), config(4, 2, 0), Some(handler)).unwrap());
    *slot.borrow_mut() = Some(q.clone());
    let mut first = Chain::sends(0..1, SIGNALED);
    let head = first.link();
    q.post_send(unsafe { sqdisc::verbs::SendChain::from_raw(head) }).unwrap();
    for _ in 0..500 {
        dev.complete(qp, usize::MAX).unwrap();
        let mut wc: [rdma_sys::ibv_wc; 8] = unsafe { std::mem::zeroed() };
        cq.poll(&mut wc).unwrap();
        if seen.borrow().len() == 51 {
            break;
        }
    }
    assert_eq!(*seen.borrow(), (0..=50).collect::<Vec<_>>());
    assert!(dev.violations().is_empty());
    slot.borrow_mut().take();
}

fn cq_budget_refuses_a_queue_that_does_not_fit(make: Make) {
    let rig = Rig::on(make, config(16, 4, 0), 40); // reserves 17 of 40
    let qp2 = rig.dev.create_qp(rig.cq_raw, rig.cq_raw, &sqdisc_sim::scripted::ScriptedQpCaps::with_depths(32, 1)).unwrap();
    let qh = unsafe { sqdisc::verbs::QpHandle::from_raw(qp2) }.unwrap();
    let err = sqdisc::Queue::new(&rig.cq, None, qh, config(32, 0, 0), None).err().expect("ENOSPC");
    assert_eq!(err.errno(), libc::ENOSPC);
    assert!(err.message().contains("holds 40") && err.message().contains("needs 33"), "{}", err.message());
    let qh = unsafe { sqdisc::verbs::QpHandle::from_raw(qp2) }.unwrap();
    let q2 = sqdisc::Queue::new(&rig.cq, None, qh, config(22, 0, 0), None).unwrap();
    assert_eq!(rig.cq.stats().reserved, 40);
    drop(q2);
    assert_eq!(rig.cq.stats().reserved, 17);
}

fn drain_releases_everything_and_free_waits_for_it(make: Make) {
    let rig = Rig::on(make, config(8, 4, 8), 64);
    rig.post(&mut Chain::sends(0..11, 0)).unwrap(); // 8 posted, 3 parked
    assert_eq!(rig.q().check_free().unwrap_err().errno(), libc::EBUSY);
    rig.dev.set_error(rig.qp).unwrap(); // the ULP moves the QP to error
    assert_eq!(rig.q().drain().unwrap_err().errno(), libc::EINPROGRESS);
    let shown = rig.poll_all();
    assert_eq!(shown.len(), 8, "every posted WR flushes visibly");
    rig.q().drain().unwrap();
    let log = rig.log.borrow();
    assert_eq!(log.iter().map(|c| c.wr_id).collect::<Vec<_>>(), (0..11).collect::<Vec<_>>());
    assert!(log[8..].iter().all(|c| c.never_posted()));
    drop(log);
    rig.q().check_free().unwrap();
}

fn drain_of_a_healthy_queue_covers_the_unsignaled_tail_at_once(make: Make) {
    let rig = Rig::on(make, config(16, 8, 0), 64);
    rig.post(&mut Chain::sends(0..3, 0)).unwrap();
    assert_eq!(rig.q().drain().unwrap_err().errno(), libc::EINPROGRESS);
    assert_eq!(rig.q().stats().markers, 1);
    rig.complete(usize::MAX);
    assert!(rig.poll_all().is_empty());
    rig.q().drain().unwrap();
    assert_eq!(rig.released_ids(), vec![0, 1, 2]);
}

fn deferred_actions_run_after_every_earlier_wr_and_before_later_ones(make: Make) {
    use std::cell::RefCell;
    use std::rc::Rc;
    let rig = Rig::on(make, config(16, 4, 0), 64);
    let order: Rc<RefCell<Vec<String>>> = Rc::default();
    let o = order.clone();
    rig.q().defer(sqdisc::Deferred::Closure(Box::new(move || o.borrow_mut().push("idle".into())))).unwrap();
    assert_eq!(*order.borrow(), vec!["idle"], "nothing outstanding: runs at once");
    rig.post(&mut Chain::sends(0..3, 0)).unwrap();
    let (o, log) = (order.clone(), rig.log.clone());
    rig.q().defer(sqdisc::Deferred::Closure(Box::new(move || {
        o.borrow_mut().push(format!("after {} releases", log.borrow().len()))
    }))).unwrap();
    rig.post(&mut Chain::sends(3..5, 0)).unwrap();
    rig.complete(usize::MAX);
    rig.poll_all();
    rig.poll_all();
    rig.complete(usize::MAX);
    rig.poll_all();
    assert_eq!(rig.log.borrow().len(), 5);
    assert_eq!(*order.borrow(), vec!["idle", "after 3 releases"], "ran after release 2 and before release 3");
    assert_eq!(rig.q().stats().deferred, 0);
}

fn receives_are_mapped_released_and_flushed(make: Make) {
    let mut cfg = config(8, 4, 0);
    cfg.rq_depth = 4;
    let rig = Rig::on(make, cfg, 64);
    rig.post_recvs(0..4).unwrap();
    assert_eq!(rig.post_recvs(4..5).unwrap_err(), libc::EAGAIN);
    rig.post(&mut Chain::sends(100..101, SIGNALED)).unwrap();
    rig.dev.deliver(rig.qp, 77, None).unwrap();
    rig.complete(1);
    let shown = rig.poll_all();
    assert!(shown.contains(&(0, WC_SUCCESS, WC_RECV)), "{shown:?}");
    assert!(shown.contains(&(100, WC_SUCCESS, WC_SEND)), "{shown:?}");
    rig.dev.set_error(rig.qp).unwrap();
    let shown = rig.poll_all();
    assert_eq!(shown, vec![(1, WC_WR_FLUSH_ERR, shown[0].2), (2, WC_WR_FLUSH_ERR, shown[1].2), (3, WC_WR_FLUSH_ERR, shown[2].2)]);
    let recvs: Vec<u64> = rig.log.borrow().iter().filter(|c| c.is_recv()).map(|c| c.wr_id).collect();
    assert_eq!(recvs, vec![0, 1, 2, 3]);
    rig.q().check_free().unwrap();
}

fn the_wr_that_takes_the_last_slot_is_signaled(make: Make) {
    let rig = Rig::on(make, config(4, 4, 0), 16);
    rig.post(&mut Chain::sends(0..1, 0).push(1, WR_SEND, SIGNALED, &[8]).push(2, WR_SEND, 0, &[8]).push(3, WR_SEND, 0, &[8]))
        .unwrap();
    let flags: Vec<bool> = (0..4).map(|i| rig.dev.wqe(rig.qp, i).unwrap().send_flags & SIGNALED != 0).collect();
    assert_eq!(flags, vec![false, true, false, true], "WR 3 fills the SQ, so its CQE must free it");
    assert_eq!(rig.q().stats().credits, 0);
    rig.complete(usize::MAX);
    assert_eq!(rig.poll_all(), vec![(1, WC_SUCCESS, WC_SEND)]);
    assert_eq!(rig.released_ids(), vec![0, 1, 2, 3]);
}

fn a_long_chain_is_posted_in_few_doorbells_and_restored(make: Make) {
    let rig = Rig::on(make, config(256, 0, 0), 512);
    let mut chain = Chain::sends(0..150, 0);
    rig.post(&mut chain).unwrap();
    let st = rig.q().stats();
    assert_eq!(st.accepted, 150);
    assert_eq!(st.doorbells, 3, "runs of at most 64 WRs per provider call");
    assert!(chain.wrs.iter().enumerate().all(|(i, w)| w.wr_id == i as u64 && w.send_flags == 0));
    assert_eq!(st.signal_interval, 64, "default: a quarter of sq_depth");
}

fn completions_of_unmanaged_qps_pass_through_and_strays_are_counted(make: Make) {
    let rig = Rig::on(make, config(8, 2, 0), 64);
    // A QP on the same CQ that the library does not manage.
    let raw = rig.dev.create_qp(rig.cq_raw, rig.cq_raw, &sqdisc_sim::scripted::ScriptedQpCaps::with_depths(4, 1)).unwrap();
    let mut c = Chain::sends(0xabc..0xabd, SIGNALED);
    let head = c.link();
    let mut bad = std::ptr::null_mut();
    // SAFETY: a live scripted QP and a chain that lives in `c`.
    assert_eq!(unsafe { (*(*raw).context).ops.post_send.unwrap()(raw, head, &mut bad) }, 0);
    rig.dev.complete(raw, 1).unwrap();
    assert_eq!(rig.poll_all(), vec![(0xabc, WC_SUCCESS, WC_SEND)], "wr_id untouched");
    assert_eq!(rig.cq.stats().passthrough, 1);
    // A CQE of the managed QP whose wr_id is not one of the library's tokens: posted behind its back.
    let mut c = Chain::sends(0x5555..0x5556, SIGNALED);
    let head = c.link();
    // SAFETY: as above.
    assert_eq!(unsafe { (*(*rig.qp).context).ops.post_send.unwrap()(rig.qp, head, &mut bad) }, 0);
    rig.complete(1);
    assert!(rig.poll_all().is_empty(), "a stray is dropped, not shown with a wrong wr_id");
    assert_eq!(rig.cq.stats().stray, 1);
    assert!(rig.log.borrow().is_empty());
}

/// Chains of 1 to 9 WRs at signal interval 3, some signaled by the ULP: a post call's run holds none, one, two
/// or more WRs the policy signaled (45 WRs without a completion: the SQ of 64 never fills). Each WR goes to the provider with the library's token and the signal the
/// policy decided, and the chain comes back exactly as the ULP built it: wr_ids, flags and links.
fn every_chain_is_restored_whatever_the_policy_signaled(make: Make) {
    let rig = Rig::on(make, config(64, 3, 0), 256);
    let mut posted = 0;
    for len in 1..=9u64 {
        let base = len * 100;
        let mut chain = Chain::new();
        for i in 0..len {
            chain = chain.push(base + i, WR_SEND, if i % 4 == 3 { SIGNALED } else { 0 }, &[64]);
        }
        rig.post(&mut chain).unwrap();
        for (i, w) in chain.wrs.iter().enumerate() {
            assert_eq!(w.wr_id, base + i as u64, "chain of {len}, WR {i}");
            assert_eq!(w.send_flags, if i % 4 == 3 { SIGNALED } else { 0 }, "chain of {len}, WR {i}");
            let expect = if i + 1 < chain.wrs.len() { &chain.wrs[i + 1] as *const _ } else { std::ptr::null() };
            assert_eq!(w.next as *const _, expect, "chain of {len}, WR {i}");
        }
        for i in 0..len as usize {
            let wqe = rig.dev.wqe(rig.qp, posted + i).unwrap();
            assert_ne!(wqe.wr_id, base + i as u64, "the provider saw the library's token");
        }
        posted += len as usize;
    }
    let st = rig.q().stats();
    assert_eq!((st.accepted, st.wqes), (45, 45));
    assert!(st.signaled_by_policy >= 9, "{st:?}");
}

/// A chain's unsignaled WRs go in one quiet run up to the first WR the ULP signals, wherever that WR is in the
/// chain and wherever the run begins in the ring (runs of 13 on a ring of 32 begin at every offset and cross
/// its end at every position): each WR reaches the provider with the library's token and the signal the ULP
/// asked for, the chain comes back exactly as the ULP built it, and every WR is released once, in order.
fn a_quiet_run_stops_at_any_wr_and_the_chain_comes_back_whole(make: Make) {
    let rig = Rig::on(make, config(32, 32, 0), 256);
    const LEN: usize = 13;
    // ULP wr_ids far from the first tokens (a token's sequence field counts from 0).
    const FIRST_ID: u64 = 1 << 20;
    let mut next_id = FIRST_ID;
    for round in 0..3 {
        for stop in 0..=LEN {
            let flags = |i: usize| if i == stop { SIGNALED } else { 0 };
            let mut chain = Chain::new();
            for i in 0..LEN {
                chain = chain.push(next_id + i as u64, WR_SEND, flags(i), &[8]);
            }
            let before = rig.dev.qp_stats(rig.qp).unwrap().wqes_posted as usize;
            rig.post(&mut chain).unwrap();
            let what = format!("round {round}, ULP signal at {stop}");
            for (i, w) in chain.wrs.iter().enumerate() {
                assert_eq!((w.wr_id, w.send_flags), (next_id + i as u64, flags(i)), "{what}, WR {i}");
                let expect = if i + 1 < LEN { &chain.wrs[i + 1] as *const _ } else { std::ptr::null() };
                assert_eq!(w.next as *const _, expect, "{what}, WR {i}");
            }
            assert_eq!(rig.dev.qp_stats(rig.qp).unwrap().wqes_posted as usize, before + LEN, "{what}");
            for i in 0..LEN {
                let wqe = rig.dev.wqe(rig.qp, before + i).unwrap();
                assert_ne!(wqe.wr_id, next_id + i as u64, "{what}, WR {i}: the provider saw the library's token");
                if i == stop {
                    assert_ne!(wqe.send_flags & SIGNALED, 0, "{what}, WR {i}");
                }
            }
            next_id += LEN as u64;
            for _ in 0..3 {
                rig.complete(usize::MAX);
                rig.poll_all();
            }
            assert_eq!(rig.released_ids(), (FIRST_ID..next_id).collect::<Vec<_>>(), "{what}");
        }
    }
    rig.assert_no_violations();
}

/// A quiet run may end with the WR the policy signals because it takes the last free slot: that WR alone is
/// posted signaled, the rest of the chain is parked behind it, the chain comes back whole, and every WR is
/// released once, in order.
fn a_quiet_run_that_takes_the_last_slot_parks_the_rest(make: Make) {
    let rig = Rig::on(make, config(8, 8, 16), 64);
    let mut next_id = 0;
    let mut wqes = 0;
    for (lead, len) in [(0, 12), (3, 10), (7, 4), (0, 8), (5, 3)] {
        // `lead` WRs first, in a call of their own, so that the chain's quiet run begins with fewer credits.
        if lead > 0 {
            rig.post(&mut Chain::sends(next_id..next_id + lead, 0)).unwrap();
            next_id += lead;
        }
        let credits = 8 - lead;
        let mut chain = Chain::sends(next_id..next_id + len, 0);
        rig.post(&mut chain).unwrap();
        let what = format!("{lead} WRs, then a chain of {len}");
        for (i, w) in chain.wrs.iter().enumerate() {
            assert_eq!((w.wr_id, w.send_flags), (next_id + i as u64, 0), "{what}, WR {i}");
            let expect = if i + 1 < chain.wrs.len() { &chain.wrs[i + 1] as *const _ } else { std::ptr::null() };
            assert_eq!(w.next as *const _, expect, "{what}, WR {i}");
        }
        let st = rig.q().stats();
        let posted = len.min(credits);
        assert_eq!((st.in_provider, st.backlog as u64, st.credits), (8, len - posted, 0), "{what}: {st:?}");
        let signaled: Vec<bool> =
            (0..8).map(|i| rig.dev.wqe(rig.qp, wqes + i).unwrap().send_flags & SIGNALED != 0).collect();
        let mut want = vec![false; 8];
        want[7] = true;
        assert_eq!(signaled, want, "{what}: only the WR that fills the SQ is signaled");
        next_id += len;
        for _ in 0..20 {
            rig.complete(usize::MAX);
            rig.poll_all();
        }
        assert_eq!(rig.released_ids(), (0..next_id).collect::<Vec<_>>(), "{what}");
        wqes = rig.dev.qp_stats(rig.qp).unwrap().wqes_posted as usize;
    }
    rig.assert_no_violations();
}

/// Chains of one WR take their own path through the post call: the same signals as the policy decides for
/// longer chains (every third WR, a ULP-signaled WR restarting the count), the library's token at the provider,
/// and the WR back as the ULP built it.
fn single_wr_posts_are_signaled_and_restored_as_chains_are(make: Make) {
    let rig = Rig::on(make, config(64, 3, 0), 256);
    let mut run = 0;
    for k in 0..20u64 {
        let flags = if k % 7 == 6 { SIGNALED } else { 0 };
        let mut chain = Chain::new().push(1000 + k, WR_SEND, flags, &[64]);
        rig.post(&mut chain).unwrap();
        assert_eq!((chain.wrs[0].wr_id, chain.wrs[0].send_flags), (1000 + k, flags), "WR {k} restored");
        assert!(chain.wrs[0].next.is_null());
        run += 1;
        let signaled = flags != 0 || run == 3;
        if signaled {
            run = 0;
        }
        let wqe = rig.dev.wqe(rig.qp, k as usize).unwrap();
        assert_ne!(wqe.wr_id, 1000 + k, "the provider saw the library's token");
        assert_eq!(wqe.send_flags & SIGNALED != 0, signaled, "WR {k}");
    }
    let st = rig.q().stats();
    assert_eq!((st.accepted, st.wqes, st.signaled_by_ulp), (20, 20, 2));
}

/// The WRs one CQE retires are released with their own opcode, and only the last carries the CQE's own
/// completion: the release of a run rewrites the completion's fields whenever they change from one WR to the
/// next, not only at its first.
fn the_releases_of_one_cqe_each_carry_their_own_opcode_and_flags(make: Make) {
    let rig = Rig::on(make, config(16, 8, 0), 64);
    let mut chain = Chain::new()
        .push(0, WR_SEND, 0, &[8])
        .push(1, WR_RDMA_WRITE, 0, &[8])
        .push(2, WR_RDMA_WRITE, 0, &[8])
        .push(3, WR_SEND, 0, &[8])
        .push(4, WR_RDMA_WRITE, SIGNALED, &[8]);
    rig.post(&mut chain).unwrap();
    rig.complete(usize::MAX);
    rig.poll_all();
    let got: Vec<(u64, u32, bool)> = rig.log.borrow().iter().map(|c| (c.wr_id, c.opcode, c.is_implied())).collect();
    // ibv_wc_opcode: SEND 0, RDMA_WRITE 1.
    assert_eq!(got, vec![(0, WC_SEND, true), (1, 1, true), (2, 1, true), (3, WC_SEND, true), (4, 1, false)]);
}

/// Verbs defines a completion's `vendor_err` for errors only, and a provider leaves it unwritten for a success
/// (rdma-core's mlx5 and mlx4 set it in their error paths alone; the sim poisons it): whatever the poll array
/// held there, a success is released with vendor error 0, and its CQE shown to the ULP keeps the field as
/// raw verbs would have left it.
fn a_success_is_released_with_vendor_error_0_whatever_the_poll_array_held(make: Make) {
    let rig = Rig::on(make, config(16, 4, 0), 64);
    // 3 and 7 are signaled by the policy, 8 by the ULP.
    rig.post(&mut Chain::sends(0..8, 0).push(8, WR_SEND, SIGNALED, &[64])).unwrap();
    rig.complete(usize::MAX);
    let mut shown = Vec::new();
    loop {
        // SAFETY: all-zero is a valid `ibv_wc`.
        let mut wc: [rdma_sys::ibv_wc; 4] = unsafe { std::mem::zeroed() };
        for w in &mut wc {
            w.vendor_err = 0xdead_beef;
        }
        let n = rig.cq.poll(&mut wc).unwrap();
        shown.extend(wc[..n].iter().map(|w| (w.wr_id, w.status)));
        if n < wc.len() {
            break;
        }
    }
    assert_eq!(shown, [(8, WC_SUCCESS)]);
    let log = rig.log.borrow();
    let got: Vec<(u64, u32, u32)> = log.iter().map(|c| (c.wr_id, c.status, c.vendor_err)).collect();
    assert_eq!(got, (0..9).map(|id| (id, WC_SUCCESS, 0)).collect::<Vec<_>>());
}

on_both_devices!(
    a_quiet_run_stops_at_any_wr_and_the_chain_comes_back_whole,
    a_quiet_run_that_takes_the_last_slot_parks_the_rest,
    the_releases_of_one_cqe_each_carry_their_own_opcode_and_flags,
    single_wr_posts_are_signaled_and_restored_as_chains_are,
    every_chain_is_restored_whatever_the_policy_signaled,
    credits_are_never_exceeded_and_the_backlog_keeps_order,
    without_backlog_eagain_names_exactly_the_first_wr_not_taken,
    signaling_is_moderated_and_bounded,
    a_lone_unsignaled_wr_is_released_without_further_posts,
    poll_shows_what_raw_verbs_would_and_releases_are_ordered_with_implied_flags,
    backlog_wrs_of_a_failed_queue_are_released_as_never_posted_after_the_posted_ones,
    a_release_callback_may_post_on_its_own_queue,
    cq_budget_refuses_a_queue_that_does_not_fit,
    drain_releases_everything_and_free_waits_for_it,
    drain_of_a_healthy_queue_covers_the_unsignaled_tail_at_once,
    deferred_actions_run_after_every_earlier_wr_and_before_later_ones,
    receives_are_mapped_released_and_flushed,
    the_wr_that_takes_the_last_slot_is_signaled,
    a_long_chain_is_posted_in_few_doorbells_and_restored,
    completions_of_unmanaged_qps_pass_through_and_strays_are_counted,
    a_success_is_released_with_vendor_error_0_whatever_the_poll_array_held,
);

#[test]
fn a_queue_reports_its_memory() {
    let small = Rig::new(config(128, 0, 0), 512);
    let st = small.q().stats();
    assert_eq!(st.bytes as usize, small.q().footprint());
    // 128 slots of 16 bytes plus a fixed part; a backlog adds its entries.
    assert!(st.bytes >= 128 * 16 && st.bytes < 128 * 16 + 4096, "{}", st.bytes);
    let with_backlog = Rig::new(config(128, 0, 64), 512);
    let per_entry = (with_backlog.q().stats().bytes - st.bytes) / 64;
    assert!(per_entry >= 4 * 16 + 64, "a backlog entry holds 4 SGEs and 64 inline bytes: {per_entry}");
}

/// A release callback that posts the next WR each time, on a device that completes every WR by the next poll
/// (the software HCA's null mode): the CQ never runs dry, and the moderated CQEs are hidden, so they fill no
/// room in the caller's array. One `poll` must still return, having reaped no more than a full CQ beyond the
/// room it was given; the next call goes on where it stopped.
#[test]
fn one_poll_reaps_at_most_a_full_cq_beyond_its_room_while_callbacks_keep_posting() {
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;
    use sqdisc_sim::{SimConfig, SimDevice, SQD_SIM_NULL};
    use sqdisc_sim::scripted::Scriptable;
    const CQE: i32 = 16;
    const STOP: u64 = 5_000;
    let dev = SimDevice::new(&SimConfig { flags: SQD_SIM_NULL, ..SimConfig::default() }).unwrap();
    let cq_raw = dev.create_cq(CQE).unwrap();
    let qp = Scriptable::create_qp(&*dev, cq_raw, cq_raw, &sqdisc_sim::scripted::ScriptedQpCaps::with_depths(4, 1)).unwrap();
    let cq = sqdisc::Cq::new(unsafe { sqdisc::verbs::CqHandle::from_raw(cq_raw) }.unwrap());
    let slot: Rc<RefCell<Option<Rc<sqdisc::Queue>>>> = Rc::default();
    let released = Rc::new(Cell::new(0u64));
    let (slot2, released2) = (slot.clone(), released.clone());
    let handler = sqdisc::ReleaseHandler::Closure(Box::new(move |c: &sqdisc::Completion| {
        released2.set(released2.get() + 1);
        if c.wr_id < STOP {
            let q = slot2.borrow().clone().unwrap();
            let mut ch = Chain::sends(c.wr_id + 1..c.wr_id + 2, 0);
            let head = ch.link();
            q.post_send(unsafe { sqdisc::verbs::SendChain::from_raw(head) }).unwrap();
        }
    }));
    let q = Rc::new(sqdisc::Queue::new(&cq, None, unsafe { sqdisc::verbs::QpHandle::from_raw(qp) }.unwrap(), config(4, 1, 0), Some(handler)).unwrap());
    *slot.borrow_mut() = Some(q.clone());
    let mut first = Chain::sends(0..1, 0);
    let head = first.link();
    q.post_send(unsafe { sqdisc::verbs::SendChain::from_raw(head) }).unwrap();

    let mut wc: [rdma_sys::ibv_wc; 1] = unsafe { std::mem::zeroed() };
    let mut calls = 0;
    while released.get() <= STOP {
        let before = cq.stats().cqes;
        assert_eq!(cq.poll(&mut wc).unwrap(), 0, "the ULP asked for no completion");
        let reaped = cq.stats().cqes - before;
        assert!(reaped <= CQE as u64 + 1, "one poll reaped {reaped} CQEs, more than a full CQ ({CQE}) beyond its room (1)");
        calls += 1;
        assert!(calls <= 2 * STOP, "the releases stopped coming");
    }
    assert_eq!(released.get(), STOP + 1);
    assert!(calls > STOP / (CQE as u64 + 1), "{calls} polls reaped {STOP} CQEs");
    slot.borrow_mut().take();
}

/// `signal_interval` 0 picks `max(1, sq_depth / 4)`: below an SQ depth of 8 that is 1, which signals every WR,
/// so such a queue never posts a marker and reserves what an explicit 1 does: `sq_depth` CQEs, not one more.
#[test]
fn a_default_interval_that_comes_to_1_reserves_what_an_explicit_1_does() {
    for depth in [1u32, 4, 7] {
        let explicit = Rig::new(config(depth, 1, 0), 64);
        let default = Rig::new(config(depth, 0, 0), 64);
        assert_eq!(explicit.cq.stats().reserved, u64::from(depth));
        assert_eq!(default.cq.stats().reserved, u64::from(depth), "sq_depth {depth}, signal_interval 0");
        // Every WR is signaled: no tail, no marker, everything released.
        default.post(&mut Chain::sends(0..u64::from(depth), 0)).unwrap();
        for _ in 0..3 {
            default.complete(usize::MAX);
            default.poll_all();
        }
        assert_eq!(default.released_ids(), (0..u64::from(depth)).collect::<Vec<_>>());
        assert_eq!(default.q().stats().markers, 0);
        default.q().drain().unwrap();
        assert_eq!(default.q().stats().markers, 0, "the drain needs no marker either");
    }
    // From 8 on the default is above 1: the marker's CQE is reserved.
    assert_eq!(Rig::new(config(8, 0, 0), 64).cq.stats().reserved, 9);
}
