//! Deferred invalidation, deregistration with precise per-MR tracking, and buffer verification, on the
//! scripted device.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::*;
use sqdisc::verbs::control::Teardown;
use sqdisc::verbs::device::{self, DeviceOps};
use sqdisc::{Completion, Deferred, InvalidateMode, ReleaseHandler, SQD_COMPLETION_BUFFER_MODIFIED, SQD_COMPLETION_NEVER_POSTED};

const WR_LOCAL_INV: u32 = 7;
const FENCE: u32 = 1;
const WC_LOCAL_INV: u32 = 6;

fn done_log() -> (Rc<RefCell<Vec<Completion>>>, ReleaseHandler) {
    let log: Rc<RefCell<Vec<Completion>>> = Rc::default();
    let l = log.clone();
    (log, ReleaseHandler::Closure(Box::new(move |c: &Completion| l.borrow_mut().push(*c))))
}

fn local_invs<D: ?Sized + sqdisc_sim::scripted::Scriptable>(rig: &Rig<D>) -> Vec<(u32, u32)> {
    let n = rig.dev.qp_stats(rig.qp).unwrap().wqes_posted as usize;
    (0..n)
        .map(|i| rig.dev.wqe(rig.qp, i).unwrap())
        .filter(|w| w.opcode == WR_LOCAL_INV)
        .map(|w| (w.imm_data, w.send_flags))
        .collect()
}

#[test]
fn a_deferred_local_inv_waits_for_a_cqe_covering_every_earlier_wr() {
    let rig = Rig::new(config(16, 8, 0), 64);
    rig.post(&mut Chain::sends(0..3, 0)).unwrap();
    let (done, handler) = done_log();
    rig.q().invalidate(0xbeef, InvalidateMode::Deferred, 77, Some(handler)).unwrap();
    assert!(local_invs(&rig).is_empty(), "not posted while the earlier WRs are not proven done");
    rig.complete(usize::MAX); // the SENDs execute, but nothing signaled covers them yet
    rig.poll_all();
    assert!(local_invs(&rig).is_empty());
    rig.poll_all(); // idle tail: marker
    rig.complete(usize::MAX);
    assert!(rig.poll_all().is_empty());
    assert_eq!(rig.released_ids(), vec![0, 1, 2]);
    let invs = local_invs(&rig);
    assert_eq!(invs.len(), 1, "posted right after the covering CQE");
    assert_eq!(invs[0].0, 0xbeef);
    assert_ne!(invs[0].1 & SIGNALED, 0, "signaled, so its own completion reports it");
    assert_eq!(invs[0].1 & FENCE, 0);
    assert!(done.borrow().is_empty());
    rig.complete(usize::MAX);
    assert!(rig.poll_all().is_empty(), "its completion is the library's: not shown");
    let d = done.borrow();
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].wr_id, d[0].status, d[0].opcode, d[0].flags), (77, WC_SUCCESS, WC_LOCAL_INV, 0));
    assert_eq!(rig.log.borrow().len(), 3, "the ULP's release callback never sees the library's LocalInv");
    rig.q().check_free().unwrap();
}

#[test]
fn a_fenced_local_inv_is_posted_at_once_with_the_fence() {
    let rig = Rig::new(config(16, 8, 0), 64);
    rig.post(&mut Chain::sends(0..3, 0)).unwrap();
    let (done, handler) = done_log();
    rig.q().invalidate(0x51, InvalidateMode::Fenced, 5, Some(handler)).unwrap();
    assert_eq!(local_invs(&rig), vec![(0x51, SIGNALED | FENCE)]);
    rig.complete(usize::MAX);
    rig.poll_all();
    assert_eq!(rig.released_ids(), vec![0, 1, 2], "its CQE also retires the WRs before it");
    assert_eq!(done.borrow().len(), 1);
}

#[test]
fn an_invalidation_pending_when_the_queue_fails_is_reported_never_posted() {
    let rig = Rig::new(config(16, 8, 0), 64);
    rig.post(&mut Chain::sends(0..3, 0)).unwrap();
    let (done, handler) = done_log();
    rig.q().invalidate(0x99, InvalidateMode::Deferred, 9, Some(handler)).unwrap();
    rig.dev.fail(rig.qp, WC_REM_ACCESS_ERR, 0).unwrap();
    rig.poll_all();
    let d = done.borrow();
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].wr_id, d[0].status), (9, WC_WR_FLUSH_ERR));
    assert_ne!(d[0].flags & SQD_COMPLETION_NEVER_POSTED, 0);
    assert!(local_invs(&rig).is_empty());
    assert_eq!(
        rig.q().invalidate(1, InvalidateMode::Deferred, 0, None).unwrap_err().errno(),
        libc::EIO,
        "a failed queue refuses new invalidations"
    );
}

#[test]
fn a_deferred_local_inv_without_credits_is_parked_and_posted_in_order() {
    let rig = Rig::new(config(4, 4, 8), 64);
    rig.post(&mut Chain::sends(0..4, 0)).unwrap();
    rig.post(&mut Chain::sends(4..6, 0)).unwrap(); // parked
    let (done, handler) = done_log();
    rig.q().invalidate(0x42, InvalidateMode::Deferred, 1, Some(handler)).unwrap();
    for _ in 0..10 {
        rig.complete(usize::MAX);
        rig.poll_all();
    }
    assert_eq!(rig.released_ids(), (0..6).collect::<Vec<_>>());
    assert_eq!(done.borrow().len(), 1);
    // The LocalInv went to the provider after all six SENDs.
    let n = rig.dev.qp_stats(rig.qp).unwrap().wqes_posted as usize;
    let order: Vec<u32> = (0..n).map(|i| rig.dev.wqe(rig.qp, i).unwrap().opcode).filter(|&o| o != WR_RDMA_WRITE).collect();
    assert_eq!(order, vec![WR_SEND, WR_SEND, WR_SEND, WR_SEND, WR_SEND, WR_SEND, WR_LOCAL_INV]);
    assert!(rig.dev.violations().is_empty());
}

fn with_lkey(mut c: Chain, i: usize, lkey: u32) -> Chain {
    c.sges[i][0].lkey = lkey;
    c
}

#[test]
fn a_tracked_mr_is_released_as_soon_as_the_wrs_using_it_are() {
    let rig = Rig::new(config(16, 2, 0), 64);
    rig.q().track_mr(100).unwrap();
    assert_eq!(rig.q().track_mr(100).unwrap_err().errno(), libc::EEXIST);
    // WR 0 uses MR 100; WRs 1..6 use another MR.
    rig.post(&mut with_lkey(Chain::sends(0..6, 0), 0, 100)).unwrap();
    let fired_after: Rc<RefCell<Vec<(&str, usize)>>> = Rc::default();
    let (f, log) = (fired_after.clone(), rig.log.clone());
    rig.q().defer_mr(100, Deferred::Closure(Box::new(move || f.borrow_mut().push(("mr100", log.borrow().len()))))).unwrap();
    let (f, log) = (fired_after.clone(), rig.log.clone());
    rig.q().defer_mr(7, Deferred::Closure(Box::new(move || f.borrow_mut().push(("mr7", log.borrow().len()))))).unwrap();
    rig.complete(usize::MAX);
    rig.poll_all();
    rig.poll_all();
    rig.complete(usize::MAX);
    rig.poll_all();
    assert_eq!(rig.log.borrow().len(), 6);
    assert_eq!(
        *fired_after.borrow(),
        vec![("mr100", 1), ("mr7", 6)],
        "tracked: right after the release of its only user; untracked: after every WR accepted before it"
    );
    // Unused tracked MR: at once.
    rig.q().track_mr(300).unwrap();
    let f = fired_after.clone();
    rig.q().defer_mr(300, Deferred::Closure(Box::new(move || f.borrow_mut().push(("mr300", 0))))).unwrap();
    assert_eq!(fired_after.borrow().len(), 3);
    rig.q().untrack_mr(300).unwrap();
    assert_eq!(rig.q().untrack_mr(300).unwrap_err().errno(), libc::ENOENT);
    assert_eq!(rig.q().stats().tracked_mrs, 1);
}

thread_local! {
    static DEREGS: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

unsafe extern "C" fn fake_dereg(_device: *mut std::ffi::c_void, mr: *mut rdma_sys::ibv_mr) -> i32 {
    // SAFETY: the test's own MR struct.
    DEREGS.with(|d| d.borrow_mut().push(unsafe { (*mr).lkey }));
    0
}

/// Makes `fake_dereg` the deregistration of the scripted device's context, in place of the device's own.
fn replace_dereg(ctx: *mut rdma_sys::ibv_context) {
    let ops = DeviceOps { dereg_mr: Some(fake_dereg), ..DeviceOps::empty(std::ptr::null_mut()) };
    // SAFETY: `fake_dereg` only records the key; the test's MR is no provider object. The device's handles
    // already made keep their own release; no SRQ is made on this device.
    unsafe {
        device::unregister(ctx).unwrap();
        device::register(ctx, &ops).unwrap();
    }
}

#[test]
fn deferred_deregistration_runs_once_no_wr_can_use_the_mr() {
    let rig = Rig::new(config(16, 2, 0), 64);
    let ctx = rig.dev.context();
    replace_dereg(ctx);
    // SAFETY: all-zero is a valid `ibv_mr`.
    let mut mr: rdma_sys::ibv_mr = unsafe { std::mem::zeroed() };
    mr.context = ctx;
    mr.lkey = 100;
    rig.q().track_mr(100).unwrap();
    rig.post(&mut with_lkey(Chain::sends(0..4, 0), 2, 100)).unwrap();
    // SAFETY: `mr` outlives the queue's use of it below.
    rig.q().defer_teardown(Some(100), unsafe { Teardown::dereg_mr(&mut mr) }).unwrap();
    assert!(DEREGS.with(|d| d.borrow().is_empty()));
    for _ in 0..3 {
        rig.complete(usize::MAX);
        rig.poll_all();
    }
    assert_eq!(DEREGS.with(|d| d.borrow().clone()), vec![100], "exactly once");
    // SAFETY: no MR of the scripted device goes to the library's deregistration after this.
    unsafe { device::unregister(ctx) }.unwrap();
    // A memory window whose provider cannot deallocate it: the failure is counted, not lost.
    // SAFETY: all-zero is a valid `ibv_mw`.
    let mut mw: rdma_sys::ibv_mw = unsafe { std::mem::zeroed() };
    mw.context = ctx;
    // SAFETY: `mw` outlives the call (nothing is outstanding: it runs at once).
    rig.q().defer_teardown(None, unsafe { Teardown::dealloc_mw(&mut mw) }).unwrap();
    assert_eq!(rig.q().stats().teardown_failures, 1);
}

#[test]
fn a_tracked_mr_is_untracked_once_its_deferred_deregistration_ran() {
    let rig = Rig::new(config(16, 2, 0), 64);
    let ctx = rig.dev.context();
    replace_dereg(ctx);
    // SAFETY: all-zero is a valid `ibv_mr`.
    let mut mr: rdma_sys::ibv_mr = unsafe { std::mem::zeroed() };
    mr.context = ctx;
    mr.lkey = 200;
    rig.q().track_mr(200).unwrap();
    rig.q().track_mr(201).unwrap();
    rig.post(&mut with_lkey(Chain::sends(0..2, 0), 1, 200)).unwrap();
    // SAFETY: `mr` outlives the queue's use of it below.
    rig.q().defer_teardown(Some(200), unsafe { Teardown::dereg_mr(&mut mr) }).unwrap();
    assert_eq!(rig.q().stats().tracked_mrs, 2, "still tracked while the deregistration waits");
    for _ in 0..3 {
        rig.complete(usize::MAX);
        rig.poll_all();
    }
    assert_eq!(DEREGS.with(|d| d.borrow().clone()), vec![200]);
    assert_eq!(rig.q().stats().tracked_mrs, 1, "the deregistered MR is no longer tracked; the other one is");
    // A new MR with the same key (devices reuse keys) can be tracked.
    rig.q().track_mr(200).unwrap();
    rig.q().untrack_mr(201).unwrap();
    // SAFETY: no MR of the scripted device goes to the library's deregistration after this.
    unsafe { device::unregister(ctx) }.unwrap();
}

#[test]
fn an_mr_tracked_after_wrs_were_accepted_counts_them_as_uses() {
    let rig = Rig::new(config(16, 2, 0), 64);
    // WR 1 uses MR 100, but the queue only learns of the MR afterwards.
    rig.post(&mut with_lkey(Chain::sends(0..3, 0), 1, 100)).unwrap();
    rig.q().track_mr(100).unwrap();
    let fired_after: Rc<RefCell<Vec<usize>>> = Rc::default();
    let (f, log) = (fired_after.clone(), rig.log.clone());
    rig.q().defer_mr(100, Deferred::Closure(Box::new(move || f.borrow_mut().push(log.borrow().len())))).unwrap();
    assert!(fired_after.borrow().is_empty(), "WRs accepted before the tracking may use the MR");
    // WRs accepted after the tracking that do not use it are not waited for.
    rig.post(&mut Chain::sends(3..6, 0)).unwrap();
    for _ in 0..3 {
        rig.complete(usize::MAX);
        rig.poll_all();
    }
    assert_eq!(rig.log.borrow().len(), 6);
    assert_eq!(*fired_after.borrow(), vec![3], "right after the last WR accepted before the tracking");
}

#[test]
fn a_deferred_action_may_post_and_defer_again() {
    let rig = Rig::new(config(16, 4, 0), 64);
    let q = rig.queue.as_ref().unwrap() as *const sqdisc::Queue;
    let fired: Rc<RefCell<Vec<&str>>> = Rc::default();
    rig.post(&mut Chain::sends(0..2, SIGNALED)).unwrap();
    let f = fired.clone();
    rig.q().defer(Deferred::Closure(Box::new(move || {
        f.borrow_mut().push("first");
        // SAFETY: the queue outlives every callback it runs (the rig drops it last).
        let q = unsafe { &*q };
        let mut c = Chain::sends(10..11, SIGNALED);
        let head = c.link();
        q.post_send(unsafe { sqdisc::verbs::SendChain::from_raw(head) }).unwrap();
        let f2 = f.clone();
        q.defer(Deferred::Closure(Box::new(move || f2.borrow_mut().push("second")))).unwrap();
    }))).unwrap();
    rig.complete(usize::MAX);
    rig.poll_all();
    assert_eq!(*fired.borrow(), vec!["first"]);
    rig.complete(usize::MAX);
    rig.poll_all();
    assert_eq!(*fired.borrow(), vec!["first", "second"]);
    assert_eq!(rig.released_ids(), vec![0, 1, 10]);
}

#[test]
fn verification_catches_a_write_into_an_in_flight_buffer_and_is_silent_otherwise() {
    let mut cfg = config(16, 4, 4);
    cfg.verify_buffers = true;
    let rig = Rig::new(cfg, 64);
    let mut bufs: Vec<Vec<u8>> = (0..6).map(|i| vec![i as u8; 100]).collect();
    let mut chain = Chain::sends(0..6, 0).push(6, WR_SEND, INLINE, &[8]);
    for (i, b) in bufs.iter_mut().enumerate() {
        chain.sges[i][0].addr = b.as_mut_ptr() as u64;
        chain.sges[i][0].length = b.len() as u32;
    }
    let mut inline = [1u8; 8];
    chain.sges[6][0].addr = inline.as_mut_ptr() as u64;
    rig.post(&mut chain).unwrap();
    bufs[3][50] ^= 0xff; // the ULP writes into WR 3's buffer while the HCA may still read it
    inline[0] = 9; // inline data was copied at post: changing it is fine
    std::hint::black_box(&inline);
    rig.complete(usize::MAX);
    rig.poll_all();
    rig.poll_all();
    rig.complete(usize::MAX);
    rig.poll_all();
    let log = rig.log.borrow();
    assert_eq!(log.len(), 7);
    let flagged: Vec<(u64, u32)> =
        log.iter().filter(|c| c.flags & SQD_COMPLETION_BUFFER_MODIFIED != 0).map(|c| (c.wr_id, c.modified_sge)).collect();
    assert_eq!(flagged, vec![(3, 0)]);
    assert_eq!(log[3].opcode, WC_SEND);
    assert_eq!(rig.q().stats().verify_mismatches, 1);
}

/// The release loop hands out the common releases without borrowing the queue's state, re-reading only the
/// first barrier's target between callbacks. What a callback does there must still be seen at once: an action
/// it defers on a tracked MR whose last user is already released runs right after that callback, before the
/// next release; one deferred on the whole queue runs after every WR accepted before it; and the stats it reads
/// count its own WR as released.
#[test]
fn what_a_release_callback_defers_or_reads_is_seen_before_the_next_release() {
    let dev = sqdisc_sim::scripted::ScriptedDevice::new();
    let cq_raw = dev.create_cq(64).unwrap();
    let qp = dev.create_qp(cq_raw, cq_raw, &sqdisc_sim::scripted::ScriptedQpCaps::with_depths(16, 4)).unwrap();
    // SAFETY: the CQ and QP live as long as `dev`, which outlives the handles (dropped first below).
    let cq = sqdisc::Cq::new(unsafe { sqdisc::verbs::CqHandle::from_raw(cq_raw) }.unwrap());
    let slot: Rc<RefCell<Option<Rc<sqdisc::Queue>>>> = Rc::default();
    let events: Rc<RefCell<Vec<String>>> = Rc::default();
    let (slot2, ev2) = (slot.clone(), events.clone());
    let handler = ReleaseHandler::Closure(Box::new(move |c: &Completion| {
        let q = slot2.borrow().clone().unwrap();
        ev2.borrow_mut().push(format!("release {} (released {})", c.wr_id, q.stats().released));
        if c.wr_id == 2 {
            let e = ev2.clone();
            q.defer_mr(100, Deferred::Closure(Box::new(move || e.borrow_mut().push("mr100".into())))).unwrap();
            let e = ev2.clone();
            q.defer(Deferred::Closure(Box::new(move || e.borrow_mut().push("queue".into())))).unwrap();
        }
    }));
    // SAFETY: as above.
    let qh = unsafe { sqdisc::verbs::QpHandle::from_raw(qp) }.unwrap();
    let q = Rc::new(sqdisc::Queue::new(&cq, None, qh, config(16, 8, 0), Some(handler)).unwrap());
    *slot.borrow_mut() = Some(q.clone());
    q.track_mr(100).unwrap();
    // WR 0 uses MR 100; WRs 1..6 use another MR. WR 5 is signaled: one CQE retires all six.
    let mut chain = with_lkey(Chain::sends(0..6, 0), 0, 100);
    chain.wrs[5].send_flags = SIGNALED;
    let head = chain.link();
    // SAFETY: the chain lives in `chain` for the whole call.
    q.post_send(unsafe { sqdisc::verbs::SendChain::from_raw(head) }).unwrap();
    dev.complete(qp, usize::MAX).unwrap();
    // SAFETY: all-zero is a valid `ibv_wc`.
    let mut wc: [rdma_sys::ibv_wc; 8] = unsafe { std::mem::zeroed() };
    cq.poll(&mut wc).unwrap();
    let want: Vec<String> = [
        "release 0 (released 1)",
        "release 1 (released 2)",
        "release 2 (released 3)",
        "mr100",
        "release 3 (released 4)",
        "release 4 (released 5)",
        "release 5 (released 6)",
        "queue",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(*events.borrow(), want);
    slot.borrow_mut().take();
}

/// The chain `[WRITE(B), WRITE(B), READ(B), WRITE(A)]` the provider refuses at the READ: `a_at` are the WRs of
/// the chain whose SGE names MR A (100); the others name MR B (200). Returns after the post failed with 2 WRs
/// accepted, MR A tracked since before the post.
fn refused_partway(a_at: &[usize]) -> Rig<sqdisc_sim::scripted::ScriptedDevice> {
    let rig = Rig::new(config(16, 4, 8), 64);
    rig.q().track_mr(100).unwrap();
    rig.dev.refuse_opcode(rig.qp, WR_RDMA_READ, libc::EINVAL).unwrap();
    let mut c = [WR_RDMA_WRITE, WR_RDMA_WRITE, WR_RDMA_READ, WR_RDMA_WRITE]
        .iter()
        .enumerate()
        .fold(Chain::new(), |c, (i, &op)| c.push(i as u64, op, 0, &[64]));
    for (i, sges) in c.sges.iter_mut().enumerate() {
        sges[0].lkey = if a_at.contains(&i) { 100 } else { 200 };
    }
    assert_eq!(rig.post(&mut c), Err((libc::EINVAL, Some(2))));
    assert_eq!(rig.q().stats().accepted, 2);
    rig
}

/// After a post the provider refused partway, the uses of a tracked MR are those of the WRs it accepted: a
/// deferred action (or deregistration) on the MR waits for exactly those, never for the WRs it refused or that
/// came after them.
#[test]
fn a_tracked_mr_counts_only_the_uses_the_provider_accepted() {
    // (WRs naming MR A, releases the action waits for)
    for (a_at, want) in [(&[3][..], 0usize), (&[2, 3][..], 0), (&[0][..], 1), (&[0, 3][..], 1), (&[1, 2][..], 2)] {
        let rig = refused_partway(a_at);
        let fired: Rc<RefCell<Vec<usize>>> = Rc::default();
        let (f, log) = (fired.clone(), rig.log.clone());
        rig.q().defer_mr(100, Deferred::Closure(Box::new(move || f.borrow_mut().push(log.borrow().len())))).unwrap();
        for _ in 0..4 {
            rig.complete(usize::MAX);
            rig.poll_all();
        }
        assert_eq!(rig.released_ids(), vec![0, 1]);
        assert_eq!(*fired.borrow(), vec![want], "MR A used by WRs {a_at:?}: runs after {want} releases");
    }
    // The same for a deferred deregistration.
    let rig = refused_partway(&[3]);
    let ctx = rig.dev.context();
    replace_dereg(ctx);
    DEREGS.with(|d| d.borrow_mut().clear());
    // SAFETY: all-zero is a valid `ibv_mr`.
    let mut mr: rdma_sys::ibv_mr = unsafe { std::mem::zeroed() };
    mr.context = ctx;
    mr.lkey = 100;
    // SAFETY: `mr` outlives the queue's use of it (it runs at once).
    rig.q().defer_teardown(Some(100), unsafe { Teardown::dereg_mr(&mut mr) }).unwrap();
    assert_eq!(DEREGS.with(|d| d.borrow().clone()), vec![100], "no WR the provider accepted uses it: at once");
    assert_eq!(rig.q().stats().tracked_mrs, 0);
    // SAFETY: no MR of the scripted device goes to the library's deregistration after this.
    unsafe { device::unregister(ctx) }.unwrap();
}

/// SQ depth 4, backlog `backlog`: SENDs 0..4 fill the SQ, a READ (4, which the provider refuses) and SEND 5 are
/// parked; WR 0's CQE frees a slot, the pump meets the refused READ and stops there: one SQ slot is free while
/// the backlog holds READ 4 and SEND 5.
fn a_refused_wr_heads_the_backlog(backlog: u32) -> Rig<sqdisc_sim::scripted::ScriptedDevice> {
    let rig = Rig::new(config(4, 1, backlog), 64);
    rig.post(&mut Chain::sends(0..4, 0)).unwrap();
    rig.dev.refuse_opcode(rig.qp, WR_RDMA_READ, libc::EINVAL).unwrap();
    rig.post(&mut Chain::new().push(4, WR_RDMA_READ, 0, &[64]).push(5, WR_SEND, 0, &[64])).unwrap();
    rig.complete(1);
    rig.poll_all();
    let st = rig.q().stats();
    assert_eq!((st.released, st.credits, st.backlog, st.accepted), (1, 1, 2, 6));
    rig
}

/// A fenced LocalInv goes behind the WRs already parked (posting it ahead of them would invalidate the key
/// before WRs accepted earlier ran): it is parked when the backlog has room, else refused with `EAGAIN`, as
/// when no SQ slot is free. Either way it never reports before every WR accepted before it.
#[test]
fn a_fenced_local_inv_goes_behind_parked_wrs_or_is_refused_when_the_backlog_is_full() {
    let rig = a_refused_wr_heads_the_backlog(2);
    let (done, handler) = done_log();
    let e = rig.q().invalidate(0x77, InvalidateMode::Fenced, 9, Some(handler)).unwrap_err();
    assert_eq!(e.errno(), libc::EAGAIN, "{}", e.message());
    assert_eq!(rig.q().stats().accepted, 6, "not taken");
    for _ in 0..6 {
        rig.complete(usize::MAX);
        rig.poll_all();
    }
    assert_eq!(rig.released_ids(), (0..6).collect::<Vec<_>>());
    assert!(done.borrow().is_empty(), "a refused invalidation never reports");
    assert!(local_invs(&rig).is_empty());

    // With room in the backlog it is parked behind READ 4 and SEND 5, and reports after all six.
    let rig = a_refused_wr_heads_the_backlog(3);
    let log = rig.log.clone();
    let order: Rc<RefCell<Vec<usize>>> = Rc::default();
    let o = order.clone();
    let handler = ReleaseHandler::Closure(Box::new(move |c: &Completion| {
        assert_eq!((c.wr_id, c.status), (9, WC_SUCCESS));
        o.borrow_mut().push(log.borrow().len());
    }));
    rig.q().invalidate(0x77, InvalidateMode::Fenced, 9, Some(handler)).unwrap();
    let st = rig.q().stats();
    assert_eq!((st.accepted, st.backlog), (7, 3), "parked");
    assert!(local_invs(&rig).is_empty(), "not posted ahead of the parked WRs");
    for _ in 0..6 {
        rig.complete(usize::MAX);
        rig.poll_all();
    }
    assert_eq!(rig.released_ids(), (0..6).collect::<Vec<_>>());
    assert_eq!(*order.borrow(), vec![6], "reported once, after every earlier WR");
    assert_eq!(local_invs(&rig), vec![(0x77, SIGNALED | FENCE)]);
    rig.assert_no_violations();
}
