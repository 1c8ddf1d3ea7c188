//! `QueueConfig::no_restore` (`SQD_QUEUE_NO_RESTORE`): a post may leave the WRs it posted as it posted them, but
//! the links of the chain, the WRs it did not take and every release are as without it.

mod common;

use common::*;

fn lean(sq_depth: u32, signal_interval: u32, backlog_depth: u32) -> sqdisc::QueueConfig {
    sqdisc::QueueConfig { no_restore: true, ..config(sq_depth, signal_interval, backlog_depth) }
}

/// The links a chain was built with: each WR points at the next one of the vector.
fn assert_linked(chain: &Chain) {
    for (k, w) in chain.wrs.iter().enumerate() {
        let want = chain.wrs.get(k + 1).map_or(std::ptr::null_mut(), |n| n as *const _ as *mut _);
        assert_eq!(w.next, want, "the link after WR {k}");
    }
}

/// Posted WRs keep the library's wr_ids (the walk that restores them is skipped), yet each release carries the
/// ULP's own, in order, and the chain keeps its links, across runs the ring's wrap cuts.
fn posted_wrs_are_left_as_posted_and_released_with_their_own_wr_ids(make: Make) {
    let rig = Rig::on(make, lean(8, 4, 0), 64);
    // The ULP's ids differ from the library's tokens (a queue's first tokens are 0, 1, ...).
    let mut ids = 1000u64;
    for round in 0..6 {
        let n = 3 + round % 4;
        let mut chain = Chain::sends(ids..ids + n, 0);
        rig.post(&mut chain).unwrap();
        assert_linked(&chain);
        if n > 1 {
            assert!(
                chain.wrs.iter().zip(ids..).any(|(w, id)| w.wr_id != id),
                "round {round}: the chain was restored, so the option saves nothing"
            );
        }
        ids += n;
        rig.complete(usize::MAX);
        rig.poll_all();
    }
    // An unsignaled tail is covered by the polls that follow.
    for _ in 0..4 {
        rig.complete(usize::MAX);
        rig.poll_all();
    }
    assert_eq!(rig.released_ids(), (1000..ids).collect::<Vec<_>>());
    rig.assert_no_violations();
}

on_both_devices!(posted_wrs_are_left_as_posted_and_released_with_their_own_wr_ids);

/// A WR the provider refuses, and every WR after it, is as the ULP passed it; the WRs before it are posted and
/// released.
#[test]
fn the_wrs_a_failed_post_did_not_take_are_as_passed() {
    let rig = Rig::new(lean(16, 4, 0), 64);
    rig.dev.refuse_opcode(rig.qp, WR_RDMA_READ, libc::EINVAL).unwrap();
    let mut chain = Chain::new()
        .push(0, WR_SEND, 0, &[8])
        .push(1, WR_SEND, 0, &[8])
        .push(2, WR_RDMA_READ, 0, &[8])
        .push(3, WR_SEND, 0, &[8])
        .push(4, WR_SEND, SIGNALED, &[8]);
    let before: Vec<(u64, u32)> = chain.wrs.iter().map(|w| (w.wr_id, w.send_flags)).collect();
    assert_eq!(rig.post(&mut chain), Err((libc::EINVAL, Some(2))));
    let after: Vec<(u64, u32)> = chain.wrs.iter().map(|w| (w.wr_id, w.send_flags)).collect();
    assert_eq!(after[2..], before[2..], "the refused WR and those after it");
    assert_linked(&chain);
    for _ in 0..4 {
        rig.complete(usize::MAX);
        rig.poll_all();
    }
    assert_eq!(rig.released_ids(), vec![0, 1]);
}

/// A post of one WR that the provider refuses leaves it as passed.
#[test]
fn a_single_refused_wr_is_as_passed() {
    let rig = Rig::new(lean(16, 4, 0), 64);
    rig.dev.refuse_opcode(rig.qp, WR_RDMA_READ, libc::EINVAL).unwrap();
    let mut chain = Chain::new().push(77, WR_RDMA_READ, 0, &[8]);
    assert_eq!(rig.post(&mut chain), Err((libc::EINVAL, Some(0))));
    assert_eq!((chain.wrs[0].wr_id, chain.wrs[0].send_flags), (77, 0));
}

/// A chain longer than the SQ: the posted run is cut where the backlog takes over, and the link there comes back.
#[test]
fn the_link_where_a_run_was_cut_is_restored() {
    let rig = Rig::new(lean(8, 4, 8), 64);
    let mut chain = Chain::sends(1000..1012, 0);
    rig.post(&mut chain).unwrap();
    assert_linked(&chain);
    for _ in 0..6 {
        rig.complete(usize::MAX);
        rig.poll_all();
    }
    assert_eq!(rig.released_ids(), (1000..1012).collect::<Vec<_>>());
}

/// Without the option, the same post restores the whole chain (the default is unchanged).
#[test]
fn by_default_the_chain_is_restored() {
    let rig = Rig::new(config(8, 4, 0), 64);
    let mut chain = Chain::sends(0..6, 0);
    let before: Vec<(u64, u32)> = chain.wrs.iter().map(|w| (w.wr_id, w.send_flags)).collect();
    rig.post(&mut chain).unwrap();
    let after: Vec<(u64, u32)> = chain.wrs.iter().map(|w| (w.wr_id, w.send_flags)).collect();
    assert_eq!(before, after);
    assert_linked(&chain);
}
