//! Batched releases (`Queue::set_release_batch`): the batch handler and the per-WR release handler together
//! release every WR exactly once, in post order; batches are runs of one status, end before a deferred action
//! is due, and leave the releases they cannot carry to the per-WR handler.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::*;
use sqdisc::{Deferred, ReleaseBatch, SQD_COMPLETION_NEVER_POSTED};

/// One release as either handler saw it, in the order they were called.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    /// A batch: its wr_ids, status and vendor error.
    Batch(Vec<u64>, u32, u32),
    /// A release through the per-WR handler: wr_id, status, flags.
    One(u64, u32, u32),
    /// A deferred action ran.
    Action(&'static str),
}

type Trace = Rc<RefCell<Vec<Seen>>>;

/// A rig whose per-WR handler and batch handler both write to one trace.
fn batched_rig(make: Make, cfg: sqdisc::QueueConfig) -> (Rig, Trace) {
    let rig = Rig::on(make, cfg, 256);
    let trace: Trace = Rc::default();
    let t = trace.clone();
    rig.q().set_release_batch(Box::new(move |b: &ReleaseBatch<'_>| {
        assert!(!b.wr_ids.is_empty(), "an empty batch");
        t.borrow_mut().push(Seen::Batch(b.wr_ids.to_vec(), b.status, b.vendor_err));
    }))
    .unwrap();
    (rig, trace)
}

/// Every WR the trace saw released, with its status, in the order of the calls.
fn merged(trace: &Trace) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    for s in trace.borrow().iter() {
        match s {
            Seen::Batch(ids, status, _) => out.extend(ids.iter().map(|&id| (id, *status))),
            Seen::One(id, status, _) => out.push((*id, *status)),
            Seen::Action(_) => {}
        }
    }
    out
}

/// Successes come in batches of more than one; an error, its flushes (a batch per flush CQE) and the parked WRs
/// released as never posted follow in post order, through the batch handler (runs of one status) or the per-WR
/// handler (never posted).
fn successes_come_in_batches_and_every_wr_is_released_once_in_order(make: Make) {
    let (rig, trace) = batched_rig(make, config(8, 4, 8));
    // The per-WR handler writes to the same trace, so that the order between the two is seen.
    let t = trace.clone();
    let log = rig.log.clone();
    let one = move || {
        for c in log.borrow_mut().drain(..) {
            t.borrow_mut().push(Seen::One(c.wr_id, c.status, c.flags));
        }
    };
    rig.post(&mut Chain::sends(0..8, 0)).unwrap();
    rig.complete(usize::MAX);
    rig.poll_all();
    one();
    let batches: Vec<Seen> = trace.borrow().clone();
    assert!(
        batches.iter().all(|s| matches!(s, Seen::Batch(_, WC_SUCCESS, 0))),
        "successes go to the batch handler: {batches:?}"
    );
    assert!(batches.len() < 8, "eight successes in fewer calls: {batches:?}");
    // Now a failure: 8..16 posted (8 fails, 9..16 are flushed behind it), 16..21 parked.
    rig.post(&mut Chain::sends(8..21, 0)).unwrap();
    rig.dev.fail(rig.qp, WC_REM_ACCESS_ERR, 1).unwrap();
    for _ in 0..20 {
        rig.complete(usize::MAX);
        rig.poll_all();
        one();
    }
    let all = merged(&trace);
    assert_eq!(all.iter().map(|&(id, _)| id).collect::<Vec<_>>(), (0..21).collect::<Vec<_>>(), "{:?}", trace.borrow());
    assert_eq!(all[8].1, WC_REM_ACCESS_ERR, "the failing WR keeps its error");
    assert!(all[9..].iter().all(|&(_, s)| s == WC_WR_FLUSH_ERR), "{all:?}");
    let tr = trace.borrow();
    let never_posted: Vec<u64> = tr
        .iter()
        .filter_map(|s| match s {
            Seen::One(id, _, flags) if flags & SQD_COMPLETION_NEVER_POSTED != 0 => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(never_posted, (16..21).collect::<Vec<_>>(), "parked WRs go to the per-WR handler: {tr:?}");
    let flushed_in_batches: Vec<u64> = tr
        .iter()
        .filter_map(|s| match s {
            Seen::Batch(ids, WC_WR_FLUSH_ERR, 0) => Some(ids.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(flushed_in_batches, (9..16).collect::<Vec<_>>(), "posted WRs' flushes go to the batch handler: {tr:?}");
    assert_eq!(rig.q().stats().released, 21);
}

/// A deferred action waits for the WRs accepted before it: a batch ends at it, so it runs after WR 9's release
/// and before WR 10's, though one CQE retires all twenty.
fn a_batch_ends_where_a_deferred_action_is_due(make: Make) {
    let (rig, trace) = batched_rig(make, config(32, 32, 0));
    rig.post(&mut Chain::sends(0..10, 0)).unwrap();
    let t = trace.clone();
    rig.q().defer(Deferred::Closure(Box::new(move || t.borrow_mut().push(Seen::Action("after 0..10"))))).unwrap();
    rig.post(&mut Chain::sends(10..19, 0)).unwrap();
    rig.post(&mut Chain::sends(19..20, SIGNALED)).unwrap();
    rig.complete(usize::MAX);
    rig.poll_all();
    assert_eq!(
        *trace.borrow(),
        vec![
            Seen::Batch((0..10).collect(), WC_SUCCESS, 0),
            Seen::Action("after 0..10"),
            Seen::Batch((10..20).collect(), WC_SUCCESS, 0),
        ]
    );
    assert!(rig.log.borrow().is_empty(), "nothing went to the per-WR handler");
}

/// A run of successes that goes on past the ring's end is one batch, its wr_ids in post order from both parts
/// of the ring, wherever the run begins: on a ring of 8, runs of 7 retired by one CQE begin at every slot.
fn a_batch_that_wraps_the_ring_is_whole_and_in_order(make: Make) {
    let (rig, trace) = batched_rig(make, config(8, 8, 0));
    let mut next = 0u64;
    for _ in 0..8 {
        rig.post(&mut Chain::sends(next..next + 6, 0)).unwrap();
        rig.post(&mut Chain::sends(next + 6..next + 7, SIGNALED)).unwrap();
        rig.complete(usize::MAX);
        rig.poll_all();
        let want = Seen::Batch((next..next + 7).collect(), WC_SUCCESS, 0);
        assert_eq!(trace.borrow().last(), Some(&want), "the run from WR {next}");
        next += 7;
    }
    assert_eq!(merged(&trace), (0..next).map(|id| (id, WC_SUCCESS)).collect::<Vec<_>>());
    assert!(rig.log.borrow().is_empty(), "nothing went to the per-WR handler");
}

on_both_devices!(
    successes_come_in_batches_and_every_wr_is_released_once_in_order,
    a_batch_ends_where_a_deferred_action_is_due,
    a_batch_that_wraps_the_ring_is_whole_and_in_order,
    a_failures_handler_sees_every_failure_once_and_no_success,
    a_deferred_action_runs_in_place_among_quiet_successes
);

/// Inside the batch handler, the queue counts the whole batch as released, and the handler may post on its own
/// queue: those WRs are released later, in order.
#[test]
fn a_batch_handler_sees_its_batch_released_and_may_post() {
    let rig = Rc::new(Rig::new(config(16, 4, 16), 256));
    // Each batch's wr_ids, and `released` as the queue counted it inside the call.
    type Calls = Rc<RefCell<Vec<(Vec<u64>, u64)>>>;
    let seen: Calls = Rc::default();
    let (s, r) = (seen.clone(), Rc::downgrade(&rig));
    rig.q()
        .set_release_batch(Box::new(move |b: &ReleaseBatch<'_>| {
            let rig = r.upgrade().unwrap();
            s.borrow_mut().push((b.wr_ids.to_vec(), rig.q().stats().released));
            if b.wr_ids[0] < 100 {
                let next = b.wr_ids[0] + 100;
                rig.post(&mut Chain::sends(next..next + 1, 0)).unwrap();
            }
        }))
        .unwrap();
    rig.post(&mut Chain::sends(0..4, 0)).unwrap();
    for _ in 0..10 {
        rig.complete(usize::MAX);
        rig.poll_all();
    }
    let seen = seen.borrow();
    assert_eq!(seen[0], ((0..4).collect(), 4), "the batch counts as released inside its call");
    let ids: Vec<u64> = seen.iter().flat_map(|(ids, _)| ids.iter().copied()).collect();
    assert_eq!(ids, vec![0, 1, 2, 3, 100], "{seen:?}");
    assert!(rig.log.borrow().is_empty());
}

/// A batch handler may post into the slots its own batch held (they are free once the batch is released): the
/// wr_ids it was handed stay as they were for the whole call, even when its posts take every free slot of an SQ
/// whose depth is the ring's capacity.
#[test]
fn a_batch_keeps_its_wr_ids_while_its_handler_fills_the_sq() {
    let rig = Rc::new(Rig::new(config(8, 4, 0), 256));
    // Per batch: its wr_ids on entry, the same slice read again after the handler's posts, and how many it posted.
    type Calls = Rc<RefCell<Vec<(Vec<u64>, Vec<u64>, u32)>>>;
    let seen: Calls = Rc::default();
    let next_id = Rc::new(std::cell::Cell::new(100u64));
    let (s, r, next) = (seen.clone(), Rc::downgrade(&rig), next_id.clone());
    rig.q()
        .set_release_batch(Box::new(move |b: &ReleaseBatch<'_>| {
            let rig = r.upgrade().unwrap();
            let on_entry = b.wr_ids.to_vec();
            let credits = if b.wr_ids[0] < 100 { rig.q().stats().credits } else { 0 };
            if credits > 0 {
                let first = next.get();
                next.set(first + credits as u64);
                rig.post(&mut Chain::sends(first..first + credits as u64, 0)).unwrap();
            }
            s.borrow_mut().push((on_entry, b.wr_ids.to_vec(), credits));
        }))
        .unwrap();
    rig.post(&mut Chain::sends(0..8, 0)).unwrap();
    for _ in 0..10 {
        rig.complete(usize::MAX);
        rig.poll_all();
    }
    let seen = seen.borrow();
    assert!(seen.iter().any(|(_, _, posted)| *posted > 0), "the handler posted: {seen:?}");
    for (on_entry, after, posted) in seen.iter() {
        assert_eq!(on_entry, after, "the batch changed under its handler, which posted {posted} WRs");
    }
    let ids: Vec<u64> = seen.iter().flat_map(|(ids, _, _)| ids.iter().copied()).collect();
    let mut want: Vec<u64> = (0..8).collect();
    want.extend(100..next_id.get());
    assert_eq!(ids, want, "every WR released once, in post order: {seen:?}");
    assert!(rig.log.borrow().is_empty());
    assert_eq!(rig.q().stats().released, want.len() as u64);
}

/// A batch handler may read its queue's statistics (and so its footprint, which counts the batch array) while
/// the batch's wr_ids are lent to it.
#[test]
fn a_batch_handler_may_read_its_queues_stats() {
    let rig = Rc::new(Rig::new(config(8, 4, 0), 64));
    let seen: Rc<RefCell<Vec<(usize, u64)>>> = Rc::default();
    let (r, s) = (Rc::downgrade(&rig), seen.clone());
    rig.q()
        .set_release_batch(Box::new(move |b: &ReleaseBatch<'_>| {
            let rig = r.upgrade().unwrap();
            s.borrow_mut().push((b.wr_ids.len(), rig.q().stats().bytes));
        }))
        .unwrap();
    let bytes = rig.q().stats().bytes;
    rig.post(&mut Chain::sends(0..8, 0)).unwrap();
    rig.complete(usize::MAX);
    rig.poll_all();
    let seen = seen.borrow();
    assert_eq!(seen.iter().map(|&(n, _)| n).sum::<usize>(), 8, "{seen:?}");
    assert!(seen.iter().all(|&(_, b)| b == bytes), "the footprint read inside a batch: {seen:?}, {bytes} outside");
}

#[test]
fn set_release_batch_refuses_what_it_cannot_honour() {
    // No per-WR handler: the releases a batch cannot carry would have nowhere to go.
    let dev = sqdisc_sim::scripted::ScriptedDevice::new();
    let cq_raw = dev.create_cq(64).unwrap();
    let qp = dev.create_qp(cq_raw, cq_raw, &sqdisc_sim::scripted::ScriptedQpCaps::with_depths(8, 1)).unwrap();
    let cq = sqdisc::Cq::new(unsafe { sqdisc::verbs::CqHandle::from_raw(cq_raw) }.unwrap());
    let bare = sqdisc::Queue::new(&cq, None, unsafe { sqdisc::verbs::QpHandle::from_raw(qp) }.unwrap(), config(8, 4, 0), None).unwrap();
    let e = bare.set_release_batch(Box::new(|_: &ReleaseBatch<'_>| {})).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    drop(bare);

    // Twice, and from inside the queue's own release pass.
    let rig = Rc::new(Rig::new(config(8, 4, 0), 64));
    let before = rig.q().footprint();
    rig.q().set_release_batch(Box::new(|_: &ReleaseBatch<'_>| {})).unwrap();
    assert_eq!(rig.q().footprint(), before + 8 * 8, "8 bytes per ring slot, counted");
    assert_eq!(rig.q().stats().bytes as usize, rig.q().footprint());
    let e = rig.q().set_release_batch(Box::new(|_: &ReleaseBatch<'_>| {})).unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY, "{e}");
    let other = Rc::new(Rig::new(config(8, 4, 0), 64));
    let (inner, r) = (Rc::new(RefCell::new(None)), Rc::downgrade(&other));
    let i2 = inner.clone();
    other
        .q()
        .defer(Deferred::Closure(Box::new(move || {
            let rig = r.upgrade().unwrap();
            *i2.borrow_mut() = Some(rig.q().set_release_batch(Box::new(|_: &ReleaseBatch<'_>| {})).map_err(|e| e.errno()));
        })))
        .unwrap();
    assert_eq!(*inner.borrow(), Some(Err(libc::EBUSY)), "a deferred action runs inside the release pass");
}

/// Posts WRs 0..12 on a queue that signals every fourth: 0..6 execute (3 is signaled: its CQE), then 6 fails
/// (vendor error 77): its CQE covers 4 and 5, which succeeded unsignaled, and 7..12 are flushed; all polled.
fn fail_the_seventh_of_twelve(rig: &Rig) {
    rig.post(&mut Chain::sends(0..12, 0)).unwrap();
    rig.complete(6);
    rig.dev.fail(rig.qp, WC_REM_ACCESS_ERR, 77).unwrap();
    rig.complete(usize::MAX);
    rig.poll_all();
}

/// An error CQE also retires the unsignaled WRs before it, as successes: one CQE makes a run of successes and
/// the failing WR due at once, and they are separate batches.
#[test]
fn an_error_cqe_releases_the_successes_before_it_and_its_wr_as_separate_batches() {
    let (rig, trace) = batched_rig(scripted, config(16, 4, 0));
    fail_the_seventh_of_twelve(&rig);
    let tr = trace.borrow();
    assert_eq!(tr[0], Seen::Batch((0..4).collect(), WC_SUCCESS, 0), "{tr:?}");
    assert_eq!(tr[1], Seen::Batch(vec![4, 5], WC_SUCCESS, 0), "{tr:?}");
    assert_eq!(tr[2], Seen::Batch(vec![6], WC_REM_ACCESS_ERR, 77), "{tr:?}");
    assert_eq!(merged(&trace).iter().map(|&(id, _)| id).collect::<Vec<_>>(), (0..12).collect::<Vec<_>>());
}

/// A rig whose batch handler takes failures only (`Queue::set_release_failures`), writing to the same kind of
/// trace as `batched_rig`'s.
fn failures_rig(make: Make, cfg: sqdisc::QueueConfig) -> (Rig, Trace) {
    let rig = Rig::on(make, cfg, 256);
    let trace: Trace = Rc::default();
    let t = trace.clone();
    rig.q()
        .set_release_failures(Box::new(move |b: &ReleaseBatch<'_>| {
            assert!(!b.wr_ids.is_empty(), "an empty batch");
            t.borrow_mut().push(Seen::Batch(b.wr_ids.to_vec(), b.status, b.vendor_err));
        }))
        .unwrap();
    (rig, trace)
}

/// Successes are released without a call, counted all the same; a failure, its flushes and the parked WRs
/// released as never posted come to the handlers in post order, each once, as with `set_release_batch`.
fn a_failures_handler_sees_every_failure_once_and_no_success(make: Make) {
    let (rig, trace) = failures_rig(make, config(8, 4, 8));
    rig.post(&mut Chain::sends(0..8, 0)).unwrap();
    rig.complete(usize::MAX);
    rig.poll_all();
    assert!(trace.borrow().is_empty(), "no call for successes: {:?}", trace.borrow());
    assert!(rig.log.borrow().is_empty(), "nor through the per-WR handler: {:?}", rig.log.borrow());
    assert_eq!(rig.q().stats().released, 8);
    // 8..16 posted (8 fails, 9..16 are flushed behind it), 16..21 parked.
    rig.post(&mut Chain::sends(8..21, 0)).unwrap();
    rig.dev.fail(rig.qp, WC_REM_ACCESS_ERR, 1).unwrap();
    for _ in 0..20 {
        rig.complete(usize::MAX);
        rig.poll_all();
    }
    let t = trace.clone();
    for c in rig.log.borrow_mut().drain(..) {
        t.borrow_mut().push(Seen::One(c.wr_id, c.status, c.flags));
    }
    let all = merged(&trace);
    assert_eq!(all.iter().map(|&(id, _)| id).collect::<Vec<_>>(), (8..21).collect::<Vec<_>>(), "{:?}", trace.borrow());
    assert_eq!(all[0].1, WC_REM_ACCESS_ERR, "the failing WR keeps its error");
    assert!(all[1..].iter().all(|&(_, s)| s == WC_WR_FLUSH_ERR), "{all:?}");
    assert!(trace.borrow().iter().all(|s| !matches!(s, Seen::Batch(_, WC_SUCCESS, _))), "{:?}", trace.borrow());
    assert_eq!(rig.q().stats().released, 21);
}

/// A deferred action still waits for the WRs accepted before it when their releases make no call: it runs
/// between the successes before it and the failure after it.
fn a_deferred_action_runs_in_place_among_quiet_successes(make: Make) {
    let (rig, trace) = failures_rig(make, config(32, 32, 0));
    rig.post(&mut Chain::sends(0..10, 0)).unwrap();
    let (t, r) = (trace.clone(), rig.q().stats());
    assert_eq!(r.released, 0);
    rig.q().defer(Deferred::Closure(Box::new(move || t.borrow_mut().push(Seen::Action("after 0..10"))))).unwrap();
    rig.post(&mut Chain::sends(10..19, 0)).unwrap();
    rig.post(&mut Chain::sends(19..20, SIGNALED)).unwrap();
    rig.complete(usize::MAX);
    rig.poll_all();
    assert_eq!(*trace.borrow(), vec![Seen::Action("after 0..10")]);
    assert_eq!(rig.q().stats().released, 20);
    assert!(rig.log.borrow().is_empty(), "nothing went to the per-WR handler");
}

/// The successes an error CQE retires before the failing WR make no call; the failing WR is a batch of its own.
#[test]
fn an_error_cqe_after_quiet_successes_hands_over_the_failure_alone() {
    let (rig, trace) = failures_rig(scripted, config(16, 4, 0));
    fail_the_seventh_of_twelve(&rig);
    let tr = trace.borrow();
    assert_eq!(tr[0], Seen::Batch(vec![6], WC_REM_ACCESS_ERR, 77), "{tr:?}");
    assert_eq!(merged(&trace).iter().map(|&(id, _)| id).collect::<Vec<_>>(), (6..12).collect::<Vec<_>>());
    assert_eq!(rig.q().stats().released, 12);
}

/// An indexed queue's failure batches carry the index of their first WR, counted over the quiet successes.
#[test]
fn an_indexed_failure_batch_counts_the_quiet_successes_before_it() {
    let mut cfg = config(16, 4, 0);
    cfg.indexed = true;
    let rig = Rig::on(scripted, cfg, 256);
    let seen: Rc<RefCell<Vec<(u64, usize, u32)>>> = Rc::default();
    let s = seen.clone();
    rig.q()
        .set_release_failures(Box::new(move |b: &ReleaseBatch<'_>| s.borrow_mut().push((b.first, b.count, b.status))))
        .unwrap();
    fail_the_seventh_of_twelve(&rig);
    let seen = seen.borrow();
    assert_eq!(seen[0], (6, 1, WC_REM_ACCESS_ERR), "{seen:?}");
    assert_eq!(seen.iter().map(|&(_, n, _)| n).sum::<usize>(), 6, "{seen:?}");
    assert!(seen[1..].iter().all(|&(_, _, st)| st == WC_WR_FLUSH_ERR), "{seen:?}");
}

/// What a ULP with a failures-only handler relies on to reuse its buffers: when a poll returns the completion of
/// a WR it signaled, that WR and every WR posted before it on the queue are released.
#[test]
fn a_signaled_completion_comes_with_its_wr_and_those_before_it_released() {
    let (rig, trace) = failures_rig(scripted, config(16, 16, 0));
    rig.post(&mut Chain::sends(0..5, 0)).unwrap();
    rig.post(&mut Chain::sends(5..6, SIGNALED)).unwrap();
    rig.post(&mut Chain::sends(6..8, 0)).unwrap();
    rig.complete(6);
    // SAFETY: all-zero is a valid `ibv_wc`.
    let mut wc: [rdma_sys::ibv_wc; 4] = unsafe { std::mem::zeroed() };
    let n = rig.cq.poll(&mut wc).unwrap();
    assert_eq!((n, wc[0].wr_id, wc[0].status), (1, 5, WC_SUCCESS));
    assert_eq!(rig.q().stats().released, 6, "WRs 0..=5 released when the completion of 5 is returned");
    assert!(trace.borrow().is_empty() && rig.log.borrow().is_empty());
}

/// One batch handler per queue, of either kind.
#[test]
fn set_release_failures_refuses_a_second_handler() {
    let rig = Rig::new(config(8, 4, 0), 64);
    rig.q().set_release_batch(Box::new(|_: &ReleaseBatch<'_>| {})).unwrap();
    let e = rig.q().set_release_failures(Box::new(|_: &ReleaseBatch<'_>| {})).unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY, "{e:?}");
}
