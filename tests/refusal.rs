//! A provider that refuses a WR at post time, as a real one refuses a WR it does not support: the refused WR of
//! a post (bad_wr, rollback, liveness of the WRs accepted before it), a parked WR the provider refuses when the
//! library posts it (its release, the stats, the WRs behind it), the WRs the queue itself refuses because
//! providers would, and a drain whose marker is still with the provider.

mod common;

use common::*;
use sqdisc::{SQD_COMPLETION_NEVER_POSTED, SQD_COMPLETION_REFUSED};

const WC_LOC_QP_OP_ERR: u32 = 2;
const WC_RDMA_READ: u32 = 2;
const WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
const WR_BIND_MW: u32 = 8;

/// Completes and polls until `want` releases are logged; fails fast, with what is stuck, when `idle_rounds`
/// rounds in a row release nothing.
fn drive_until_released(rig: &Rig, want: usize) {
    let mut idle = 0;
    while rig.log.borrow().len() < want {
        let before = rig.log.borrow().len();
        rig.complete(usize::MAX);
        rig.poll_all();
        idle = if rig.log.borrow().len() == before { idle + 1 } else { 0 };
        if idle == 8 {
            let st = rig.q().stats();
            panic!(
                "no release in 8 rounds of complete + poll: {} of {want} released; backlog {}, in_provider {}, credits {}, closed {}",
                rig.log.borrow().len(),
                st.backlog,
                st.in_provider,
                st.credits,
                st.closed
            );
        }
    }
}

/// Whether each send WQE the provider accepted so far was signaled, in post order.
fn wqe_signaled(rig: &Rig) -> Vec<bool> {
    let n = rig.dev.qp_stats(rig.qp).unwrap().wqes_posted as usize;
    (0..n).map(|i| rig.dev.wqe(rig.qp, i).unwrap().send_flags & SIGNALED != 0).collect()
}

/// SENDs `ids`, with an RDMA READ (the opcode the tests make the provider refuse) as `read`.
fn sends_with_read(ids: std::ops::Range<u64>, read: u64, flags: u32) -> Chain {
    ids.fold(Chain::new(), |c, id| c.push(id, if id == read { WR_RDMA_READ } else { WR_SEND }, flags, &[64]))
}

fn a_parked_wr_the_provider_refuses_is_released_refused_and_the_wrs_behind_it_flow(make: Make) {
    let rig = Rig::on(make, config(4, 2, 16), 64);
    rig.post(&mut Chain::sends(0..4, 0)).unwrap();
    // The provider refuses READs, whenever they are posted: 6 is parked, refused when the pump posts it.
    rig.dev.refuse_opcode(rig.qp, WR_RDMA_READ, libc::EINVAL).unwrap();
    rig.post(&mut sends_with_read(4..10, 6, 0)).unwrap();
    assert_eq!(rig.q().stats().backlog, 6);
    drive_until_released(&rig, 10);
    assert_eq!(rig.released_ids(), (0..10).collect::<Vec<_>>(), "exactly one release each, in post order");
    let log = rig.log.borrow();
    let c = log[6];
    assert_eq!((c.status, c.vendor_err, c.opcode), (WC_LOC_QP_OP_ERR, libc::EINVAL as u32, WC_RDMA_READ));
    assert_eq!(c.flags, SQD_COMPLETION_REFUSED | SQD_COMPLETION_NEVER_POSTED);
    for (i, c) in log.iter().enumerate().filter(|(i, _)| *i != 6) {
        assert_eq!((c.status, c.flags & (SQD_COMPLETION_REFUSED | SQD_COMPLETION_NEVER_POSTED)), (WC_SUCCESS, 0), "WR {i}");
    }
    drop(log);
    let st = rig.q().stats();
    assert_eq!((st.accepted, st.released, st.backlog, st.closed, st.failed_status), (10, 10, 0, 0, 0));
    assert_eq!((st.provider_refused, st.provider_refused_errno), (1, libc::EINVAL as u32));
    let text = rig.q().last_refusal().expect("the refusal is described");
    assert!(text.contains("wr_id 0x6") && text.contains("errno 22"), "{text}");
    // The provider executed every other WR; the queue is still open and takes more.
    rig.post(&mut Chain::sends(10..12, 0)).unwrap();
    drive_until_released(&rig, 12);
    assert_eq!(rig.released_ids(), (0..12).collect::<Vec<_>>());
    rig.assert_no_violations();
    rig.q().drain().unwrap();
    rig.q().check_free().unwrap();
}

fn a_refused_parked_wr_with_nothing_before_it_is_released_at_once(make: Make) {
    // Signaled WRs fill the SQ: once their CQEs are polled nothing is in flight when the pump meets the refusal.
    let rig = Rig::on(make, config(2, 1, 8), 64);
    rig.post(&mut Chain::sends(0..2, SIGNALED)).unwrap();
    rig.dev.refuse_opcode(rig.qp, WR_RDMA_READ, libc::EOPNOTSUPP).unwrap();
    rig.post(&mut sends_with_read(2..5, 2, SIGNALED)).unwrap();
    rig.complete(usize::MAX);
    let shown: Vec<u64> = rig.poll_all().iter().map(|w| w.0).collect();
    assert_eq!(shown[..2], [0, 1]);
    assert!(!shown.contains(&2), "a refused WR has no CQE to show: {shown:?}");
    assert_eq!(rig.released_ids()[..3], [0, 1, 2], "released within the poll that met the refusal");
    assert_eq!(rig.log.borrow()[2].vendor_err, libc::EOPNOTSUPP as u32);
    assert_eq!(rig.q().stats().backlog, 0, "3 and 4 were posted behind it");
    drive_until_released(&rig, 5);
    assert_eq!(rig.released_ids(), (0..5).collect::<Vec<_>>());
    rig.assert_no_violations();
}

fn a_post_the_provider_refuses_partway_names_the_refused_wr_and_keeps_the_ones_before_it_live(make: Make) {
    // Interval 4: WR 3 would be signaled. The provider refuses it, so 0..3 are posted unsignaled: the rollback
    // must see the unsignaled run they form and the post must watch it, or they are never released.
    let rig = Rig::on(make, config(16, 4, 8), 64);
    rig.dev.refuse_opcode(rig.qp, WR_RDMA_READ, libc::EINVAL).unwrap();
    let mut chain = sends_with_read(0..6, 3, 0);
    assert_eq!(rig.post(&mut chain), Err((libc::EINVAL, Some(3))), "bad_wr is exactly the refused WR");
    for (i, w) in chain.wrs.iter().enumerate() {
        assert_eq!((w.wr_id, w.send_flags), (i as u64, 0), "WR {i} restored");
    }
    let st = rig.q().stats();
    assert_eq!((st.accepted, st.in_provider, st.credits, st.provider_refused), (3, 3, 13, 0));
    assert_eq!(wqe_signaled(&rig), vec![false, false, false]);
    // No more posts: the idle unsignaled tail gets its marker and the three are released.
    drive_until_released(&rig, 3);
    assert_eq!(rig.released_ids(), vec![0, 1, 2]);
    assert_eq!(rig.q().stats().markers, 1);
    rig.assert_no_violations();
}

fn after_a_partial_refusal_the_signal_interval_counts_from_the_wrs_really_posted(make: Make) {
    let rig = Rig::on(make, config(16, 8, 0), 64);
    rig.dev.refuse_opcode(rig.qp, WR_RDMA_READ, libc::EINVAL).unwrap();
    assert_eq!(rig.post(&mut sends_with_read(0..5, 3, 0)), Err((libc::EINVAL, Some(3))));
    // 0..3 form an unsignaled run of 3: with interval 8 the fifth WR of the next post is the 8th in a row.
    rig.post(&mut Chain::sends(3..8, 0)).unwrap();
    assert_eq!(wqe_signaled(&rig), vec![false, false, false, false, false, false, false, true]);
    drive_until_released(&rig, 8);
    assert_eq!(rig.released_ids(), (0..8).collect::<Vec<_>>());
    rig.assert_no_violations();
}

fn wrs_every_provider_refuses_are_refused_at_post_even_when_they_would_be_parked(make: Make) {
    let rig = Rig::on(make, config(2, 2, 8), 64);
    // An atomic returns 8 bytes; a BIND_MW names its window.
    let bad_atomic = || Chain::sends(0..1, 0).push(1, WR_ATOMIC_FETCH_AND_ADD, 0, &[16]).push(2, WR_SEND, 0, &[8]);
    let (errno, bad) = rig.post(&mut bad_atomic()).unwrap_err();
    assert_eq!((errno, bad), (libc::EINVAL, Some(1)));
    let mut bind = Chain::new().push(3, WR_BIND_MW, 0, &[]);
    assert_eq!(rig.post(&mut bind), Err((libc::EINVAL, Some(0))));
    // The SQ is full now (0 and a second WR): the same WRs are refused, not parked.
    rig.post(&mut Chain::sends(10..11, 0)).unwrap();
    assert_eq!(rig.q().stats().credits, 0);
    assert_eq!(rig.post(&mut bad_atomic()).unwrap_err(), (libc::EINVAL, Some(1)));
    let st = rig.q().stats();
    assert_eq!((st.accepted, st.backlog), (3, 1), "0, 10 and the second 0 (parked)");
    // An atomic on 8 bytes is taken.
    rig.post(&mut Chain::new().push(20, WR_ATOMIC_FETCH_AND_ADD, 0, &[8])).unwrap();
    drive_until_released(&rig, 4);
    assert_eq!(rig.released_ids(), vec![0, 10, 0, 20]);
    assert!(rig.log.borrow().iter().all(|c| c.status == WC_SUCCESS));
}

fn an_idle_tail_marker_the_provider_refuses_is_tried_again_and_reported(make: Make) {
    // The marker is a zero-length RDMA WRITE. While the provider refuses WRITEs the unsignaled tail stays
    // watched and every refused attempt is counted and described; once WRITEs are taken again the next poll
    // cycle covers the tail and the WRs are released, without another post.
    let rig = Rig::on(make, config(16, 8, 0), 64);
    rig.post(&mut Chain::sends(0..3, 0)).unwrap();
    rig.dev.refuse_opcode(rig.qp, WR_RDMA_WRITE, libc::EINVAL).unwrap();
    for _ in 0..4 {
        rig.complete(usize::MAX);
        rig.poll_all();
    }
    assert!(rig.log.borrow().is_empty(), "no CQE can cover the tail yet");
    let st = rig.q().stats();
    assert_eq!((st.markers, st.provider_refused, st.closed), (0, 0, 0), "a marker is no accepted WR");
    assert!(st.markers_refused >= 1, "the refused marker is counted: {st:?}");
    assert_eq!(st.provider_refused_errno, libc::EINVAL as u32);
    let text = rig.q().last_refusal().expect("the refused marker is described");
    assert!(text.contains("marker") && text.contains("errno 22"), "{text}");
    rig.dev.refuse_opcode(rig.qp, WR_RDMA_WRITE, 0).unwrap();
    drive_until_released(&rig, 3);
    assert_eq!(rig.released_ids(), vec![0, 1, 2]);
    assert_eq!(rig.q().stats().markers, 1);
    rig.assert_no_violations();
}

on_both_devices!(
    an_idle_tail_marker_the_provider_refuses_is_tried_again_and_reported,
    a_parked_wr_the_provider_refuses_is_released_refused_and_the_wrs_behind_it_flow,
    a_refused_parked_wr_with_nothing_before_it_is_released_at_once,
    a_post_the_provider_refuses_partway_names_the_refused_wr_and_keeps_the_ones_before_it_live,
    after_a_partial_refusal_the_signal_interval_counts_from_the_wrs_really_posted,
    wrs_every_provider_refuses_are_refused_at_post_even_when_they_would_be_parked,
);

#[test]
fn a_refused_atomic_names_the_rule_in_its_message() {
    let rig = Rig::new(config(4, 2, 0), 16);
    let mut c = Chain::new().push(1, WR_ATOMIC_FETCH_AND_ADD, 0, &[16]);
    let head = c.link();
    // SAFETY: the chain lives in `c` for the whole call.
    let e = rig.q().post_send(unsafe { sqdisc::verbs::SendChain::from_raw(head) }).unwrap_err();
    assert!(e.error.message().contains("16 bytes"), "{}", e.error.message());
    assert_eq!(rig.dev.qp_stats(rig.qp).unwrap().wqes_posted, 0, "nothing reached the provider");
}

/// The scripted device holds a completion back: a drain marker whose flush CQE is still in the CQ while every
/// WR is released. The drain is not finished (freeing would find the marker with the provider).
#[test]
fn drain_is_not_done_while_its_marker_is_with_the_provider() {
    let rig = Rig::new(config(8, 4, 0), 16);
    rig.post(&mut Chain::sends(0..1, 0)).unwrap();
    assert_eq!(rig.q().drain().unwrap_err().errno(), libc::EINPROGRESS);
    assert_eq!(rig.q().stats().markers, 1, "the unsignaled tail got the drain marker");
    // WR 0 fails with a CQE of its own; the marker flushes behind it.
    rig.dev.fail(rig.qp, WC_REM_ACCESS_ERR, 0).unwrap();
    // SAFETY: all-zero is a valid `ibv_wc`.
    let mut one: [rdma_sys::ibv_wc; 1] = unsafe { std::mem::zeroed() };
    assert_eq!(rig.cq.poll(&mut one).unwrap(), 1, "the error CQE of WR 0");
    assert_eq!(rig.released_ids(), vec![0]);
    let st = rig.q().stats();
    assert_eq!((st.accepted, st.released, st.in_provider), (1, 1, 1), "the marker is still with the provider");
    assert_eq!(rig.q().drain().unwrap_err().errno(), libc::EINPROGRESS);
    assert_eq!(rig.q().check_free().unwrap_err().errno(), libc::EBUSY);
    rig.poll_all();
    rig.q().drain().unwrap();
    rig.q().check_free().unwrap();
}
