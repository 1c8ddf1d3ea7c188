//! `QueueConfig::indexed` (`SQD_QUEUE_INDEXED`): a queue that names each send WR by its index, the count of
//! send WRs it accepted before it, instead of keeping the ULP's wr_id. Every release, batch and completion
//! shown carries indexes, in post order, whatever the WRs' own wr_ids, across parking, invalidations,
//! refusals and failures.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::*;
use sqdisc::{InvalidateMode, ReleaseBatch};

fn indexed(sq_depth: u32, signal_interval: u32, backlog_depth: u32) -> sqdisc::QueueConfig {
    sqdisc::QueueConfig { indexed: true, ..config(sq_depth, signal_interval, backlog_depth) }
}

/// Completes and polls until nothing more is released; returns what the polls showed.
fn settle<D: ?Sized + sqdisc_sim::scripted::Scriptable>(rig: &Rig<D>) -> Vec<(u64, u32, u32)> {
    let mut shown = Vec::new();
    for _ in 0..8 {
        rig.complete(usize::MAX);
        shown.extend(rig.poll_all());
    }
    shown
}

/// Chains of every length up to twice the SQ, with wr_ids that repeat and WRs the ULP signals: the releases
/// carry the indexes 0, 1, 2, ... in order, parked WRs included, and a WR the ULP signaled shows its index.
fn releases_carry_indexes_in_post_order(make: Make) {
    let rig = Rig::on(make, indexed(8, 4, 16), 64);
    let mut next = 0u64;
    let mut signaled = Vec::new();
    let mut shown = Vec::new();
    for n in 1..=16u64 {
        // Every WR has the same wr_id: an indexed queue never reads it.
        let mut chain = Chain::new();
        for k in 0..n {
            let flags = if (next + k) % 7 == 3 { SIGNALED } else { 0 };
            if flags != 0 {
                signaled.push(next + k);
            }
            chain = chain.push(0xdead, WR_SEND, flags, &[8]);
        }
        rig.post(&mut chain).unwrap();
        next += n;
        shown.extend(settle(&rig));
    }
    assert_eq!(rig.released_ids(), (0..next).collect::<Vec<_>>());
    assert_eq!(shown.iter().map(|w| w.0).collect::<Vec<_>>(), signaled, "the completions the ULP asked for");
    rig.assert_no_violations();
}

/// With a batch handler: each batch says where it starts and how many WRs it holds, and carries no wr_ids; the
/// batches and the single releases together cover the indexes once each, in order. The batch array is not
/// allocated.
fn batches_carry_their_first_index(make: Make) {
    let rig = Rig::on(make, indexed(16, 4, 0), 64);
    let before = rig.q().footprint();
    let got: Rc<RefCell<Vec<(u64, usize, usize)>>> = Rc::default();
    let g = got.clone();
    rig.q()
        .set_release_batch(Box::new(move |b: &ReleaseBatch<'_>| g.borrow_mut().push((b.first, b.count, b.wr_ids.len()))))
        .unwrap();
    assert_eq!(rig.q().footprint(), before, "an indexed queue's batches need no array");
    let mut next = 0;
    for n in [3u64, 8, 1, 12, 5] {
        let mut chain = Chain::sends(1000..1000 + n, 0);
        rig.post(&mut chain).unwrap();
        next += n;
        settle(&rig);
    }
    let mut covered: Vec<u64> = Vec::new();
    let mut singles = rig.released_ids().into_iter().peekable();
    for &(first, count, ids) in got.borrow().iter() {
        assert_eq!(ids, 0, "a batch of an indexed queue carries no wr_ids");
        assert!(count > 0);
        // Single releases that came before this batch.
        while singles.peek().is_some_and(|&s| s < first) {
            covered.push(singles.next().unwrap());
        }
        covered.extend(first..first + count as u64);
    }
    covered.extend(singles);
    assert_eq!(covered, (0..next).collect::<Vec<_>>());
    assert!(!got.borrow().is_empty());
}

/// Without the option, a batch gives the same `first` beside its wr_ids.
#[test]
fn a_batch_of_wr_ids_says_where_it_starts_too() {
    let rig = Rig::new(config(16, 4, 0), 64);
    type Batches = Rc<RefCell<Vec<(u64, Vec<u64>)>>>;
    let got: Batches = Rc::default();
    let g = got.clone();
    rig.q().set_release_batch(Box::new(move |b: &ReleaseBatch<'_>| {
        assert_eq!(b.count, b.wr_ids.len());
        g.borrow_mut().push((b.first, b.wr_ids.to_vec()))
    }))
    .unwrap();
    for base in [100u64, 200, 300] {
        rig.post(&mut Chain::sends(base..base + 6, 0)).unwrap();
        settle(&rig);
    }
    let ids: Vec<u64> = [100u64, 200, 300].iter().flat_map(|&b| b..b + 6).collect();
    for (first, wr_ids) in got.borrow().iter() {
        let at = *first as usize;
        assert_eq!(&ids[at..at + wr_ids.len()], &wr_ids[..], "batch from index {first}");
    }
}

/// Invalidations take no index: the WRs around them are numbered as if they were not there, and the
/// invalidation's own callback still gets its wr_id. Scripted device only: the model fails a LocalInv of an
/// rkey no MR has (tests/invalidation.rs has its MRs).
#[test]
fn invalidations_take_no_index() {
    let rig = Rig::new(indexed(16, 4, 16), 64);
    let done: Rc<RefCell<Vec<u64>>> = Rc::default();
    for round in 0..6u64 {
        rig.post(&mut Chain::sends(0..3, 0)).unwrap();
        let d = done.clone();
        let handler = sqdisc::ReleaseHandler::Closure(Box::new(move |c: &sqdisc::Completion| d.borrow_mut().push(c.wr_id)));
        let mode = if round % 2 == 0 { InvalidateMode::Deferred } else { InvalidateMode::Fenced };
        rig.q().invalidate(0x100 + round as u32, mode, 5000 + round, Some(handler)).unwrap();
        rig.post(&mut Chain::sends(0..2, SIGNALED)).unwrap();
        settle(&rig);
    }
    assert_eq!(rig.released_ids(), (0..30).collect::<Vec<_>>());
    assert_eq!(*done.borrow(), (5000..5006).collect::<Vec<_>>());
}

/// A failed queue: the failing WR, the flushed ones and the parked ones are released with their indexes in
/// order, and the error completion shown carries the failing WR's index. Scripted device only: its `fail`
/// picks the next WQE not yet executed (see tests/queue.rs).
#[test]
fn a_failure_releases_indexes_in_order() {
    let rig = Rig::new(indexed(8, 4, 16), 64);
    rig.post(&mut Chain::sends(0..5, 0)).unwrap();
    settle(&rig);
    // 8 posted (the SQ's depth), 4 parked; the third posted fails.
    rig.post(&mut Chain::sends(0..12, 0)).unwrap();
    rig.complete(2);
    rig.dev.fail(rig.qp, WC_REM_ACCESS_ERR, 0).unwrap();
    let shown = settle(&rig);
    assert_eq!(rig.released_ids(), (0..17).collect::<Vec<_>>());
    let statuses: Vec<u32> = rig.log.borrow().iter().map(|c| c.status).collect();
    assert_eq!(statuses[..7], [0; 7]);
    assert_eq!(statuses[7], WC_REM_ACCESS_ERR);
    assert!(statuses[8..].iter().all(|&s| s == WC_WR_FLUSH_ERR));
    assert_eq!(shown.first().map(|w| (w.0, w.1)), Some((7, WC_REM_ACCESS_ERR)), "the error completion: {shown:?}");
}

/// WRs the provider refuses are not accepted and take no index: the next accepted WR takes the index after
/// the last one accepted. Their flags are as the ULP passed them (their wr_ids are unspecified).
#[test]
fn refused_wrs_take_no_index() {
    let rig = Rig::new(indexed(16, 4, 0), 64);
    rig.dev.refuse_opcode(rig.qp, WR_RDMA_READ, libc::EINVAL).unwrap();
    let mut chain = Chain::new()
        .push(0, WR_SEND, 0, &[8])
        .push(1, WR_SEND, 0, &[8])
        .push(2, WR_RDMA_READ, 0, &[8])
        .push(3, WR_SEND, SIGNALED, &[8]);
    let flags: Vec<u32> = chain.wrs.iter().map(|w| w.send_flags).collect();
    assert_eq!(rig.post(&mut chain), Err((libc::EINVAL, Some(2))));
    assert_eq!(chain.wrs[2..].iter().map(|w| w.send_flags).collect::<Vec<_>>(), flags[2..]);
    rig.post(&mut Chain::sends(10..13, 0)).unwrap();
    settle(&rig);
    assert_eq!(rig.released_ids(), (0..5).collect::<Vec<_>>());
}

on_both_devices!(releases_carry_indexes_in_post_order, batches_carry_their_first_index);
