//! The C ABI re-entered from its own callbacks: release callbacks, deferred actions and async-event releases that
//! post, poll other CQs, free other queues and defer, through the `sqd_*` extern "C" functions on the scripted
//! device. Runs under Miri too (scripts/miri.sh), which checks every such path for use after free and aliasing
//! violations; natively it checks the documented results.

mod capi_support;

use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::ptr;

use capi_support::*;

/// What one queue's callbacks see and do.
#[derive(Default)]
struct Ctx {
    /// Handles the callbacks act on (set after creation).
    own_q: Cell<*mut Queue>,
    own_cq: Cell<*mut Cq>,
    other_q: Cell<*mut Queue>,
    other_cq: Cell<*mut Cq>,
    other_qp: Cell<*mut ibv_qp>,
    /// A queue a callback frees (then set to NULL), and the QP under it.
    victim_q: Cell<*mut Queue>,
    victim_qp: Cell<*mut ibv_qp>,
    /// The callbacks' event log: ("release", wr_id, status) or ("defer", tag, 0).
    events: RefCell<Vec<(&'static str, u64, u32)>>,
    /// Return codes of calls made from inside callbacks, by name.
    codes: RefCell<Vec<(&'static str, i32)>>,
    /// Post a follow-up WR from the release of wr_ids below this.
    chain_until: Cell<u64>,
}

impl Ctx {
    fn code(&self, what: &'static str, rc: i32) {
        self.codes.borrow_mut().push((what, rc));
    }
    fn codes_of(&self, what: &str) -> Vec<i32> {
        self.codes.borrow().iter().filter(|c| c.0 == what).map(|c| c.1).collect()
    }
    fn released(&self) -> Vec<u64> {
        self.events.borrow().iter().filter(|e| e.0 == "release").map(|e| e.1).collect()
    }
    fn as_ptr(&self) -> *mut c_void {
        self as *const Ctx as *mut c_void
    }
}

/// # Safety
/// `ctx` is a live `Ctx`; `c` a valid completion.
unsafe fn ctx_of<'a>(ctx: *mut c_void) -> &'a Ctx {
    // SAFETY: the caller's promise; the tests pass a `Ctx` that outlives every queue using it.
    unsafe { &*(ctx as *const Ctx) }
}

/// Logs the release and re-enters the API: posts the next WR on its own queue, polls its own CQ (refused),
/// tries to free its own queue and CQ (refused), posts on another queue and polls that queue's CQ.
unsafe extern "C" fn busy_release(ctx: *mut c_void, c: *const Completion) {
    // SAFETY: the queue was made with a `Ctx`, and `c` is valid during the call.
    let (x, c) = unsafe { (ctx_of(ctx), &*c) };
    x.events.borrow_mut().push(("release", c.wr_id, c.status));
    if c.wr_id < x.chain_until.get() {
        let mut next = Sends::new(c.wr_id + 1, 1, false);
        x.code("post own", post(x.own_q.get(), &mut next));
    }
    x.code("poll own", poll(x.own_cq.get()));
    // SAFETY: live handles; the calls are refused.
    unsafe {
        x.code("free own queue", sqd_queue_free(x.own_q.get()));
        x.code("free own cq", sqd_cq_free(x.own_cq.get()));
    }
    if !x.other_q.get().is_null() {
        let mut other = Sends::new(1000 + c.wr_id, 1, true);
        x.code("post other", post(x.other_q.get(), &mut other));
        // SAFETY: a live scripted QP.
        unsafe { sqd_scripted_complete(x.other_qp.get(), i32::MAX) };
        x.code("poll other", poll(x.other_cq.get()));
    }
}

unsafe extern "C" fn log_release(ctx: *mut c_void, c: *const Completion) {
    // SAFETY: as in `busy_release`.
    let (x, c) = unsafe { (ctx_of(ctx), &*c) };
    x.events.borrow_mut().push(("release", c.wr_id, c.status));
}

#[test]
fn release_callbacks_post_poll_another_cq_and_are_refused_on_their_own() {
    let d = Dev::new();
    let (raw_a, raw_b) = (d.cq(64), d.cq(64));
    let (qp_a, qp_b) = (d.qp(raw_a, raw_a, 4), d.qp(raw_b, raw_b, 4));
    let (cq_a, cq_b) = (managed_cq(raw_a, 0), managed_cq(raw_b, 0));
    let a = Ctx::default();
    let b = Ctx::default();
    let qa = managed_queue(cq_a, qp_a, 4, 16, Some(busy_release), a.as_ptr());
    let qb = managed_queue(cq_b, qp_b, 4, 16, Some(log_release), b.as_ptr());
    a.own_q.set(qa);
    a.own_cq.set(cq_a);
    a.other_q.set(qb);
    a.other_cq.set(cq_b);
    a.other_qp.set(qp_b);
    a.chain_until.set(8);

    let mut first = Sends::new(0, 1, true);
    assert_eq!(post(qa, &mut first), 0);
    drive(qp_a, cq_a, || a.released().len() == 9);

    assert_eq!(a.released(), (0..9).collect::<Vec<_>>(), "each release posted the next WR, released in order");
    assert_eq!(a.codes_of("post own"), vec![0; 8]);
    assert_eq!(a.codes_of("poll own"), vec![-libc::EBUSY; 9], "polling the CQ being polled is refused");
    assert_eq!(a.codes_of("free own queue"), vec![-libc::EBUSY; 9]);
    assert_eq!(a.codes_of("free own cq"), vec![-libc::EBUSY; 9]);
    assert_eq!(a.codes_of("post other"), vec![0; 9]);
    let polled_other = a.codes_of("poll other");
    assert_eq!(polled_other.len(), 9);
    assert!(polled_other.iter().all(|&rc| rc >= 0) && polled_other.iter().sum::<i32>() > 0, "{polled_other:?}");
    // The other queue's releases ran inside the first queue's callbacks (nested), all of them in order.
    drive(qp_b, cq_b, || b.released().len() == 9);
    assert_eq!(b.released(), (1000..1009).collect::<Vec<_>>());

    // SAFETY: live handles, nothing outstanding; handles before the device.
    unsafe {
        assert_eq!(sqd_queue_free(qa), 0, "{}", last_error());
        assert_eq!(sqd_queue_free(qb), 0, "{}", last_error());
        assert_eq!(sqd_cq_free(cq_a), 0);
        assert_eq!(sqd_cq_free(cq_b), 0);
        assert_eq!(sqd_scripted_free(d.dev), 0);
    }
}

/// Frees the victim queue (idle, on the same CQ as the queue releasing) from inside a release, then destroys
/// its QP, which no handle holds any more; defers an action from the release.
unsafe extern "C" fn freeing_release(ctx: *mut c_void, c: *const Completion) {
    // SAFETY: as in `busy_release`.
    let (x, c) = unsafe { (ctx_of(ctx), &*c) };
    x.events.borrow_mut().push(("release", c.wr_id, c.status));
    let victim = x.victim_q.replace(ptr::null_mut());
    if !victim.is_null() {
        // SAFETY: a live queue with nothing outstanding, then its QP, which nothing holds after the free.
        unsafe {
            x.code("free victim", sqd_queue_free(victim));
            x.code("destroy victim qp", sqd_scripted_destroy_qp(x.victim_qp.get()));
        }
    }
    if c.wr_id == 1 {
        // SAFETY: a live queue; the action's context outlives it.
        x.code("defer", unsafe { sqd_defer(x.own_q.get(), Some(tagged_defer), x.as_ptr()) });
    }
}

unsafe extern "C" fn tagged_defer(ctx: *mut c_void) {
    // SAFETY: the action was deferred with a `Ctx`.
    let x = unsafe { ctx_of(ctx) };
    x.events.borrow_mut().push(("defer", 0, 0));
    // SAFETY: the running queue is live; freeing it from its own deferred action is refused.
    x.code("free own from defer", unsafe { sqd_queue_free(x.own_q.get()) });
}

#[test]
fn a_release_frees_another_queue_of_the_cq_being_polled_and_defers() {
    let d = Dev::new();
    let raw = d.cq(64);
    let (qp_a, qp_v) = (d.qp(raw, raw, 8), d.qp(raw, raw, 8));
    let cq = managed_cq(raw, 0);
    let a = Ctx::default();
    let qa = managed_queue(cq, qp_a, 8, 0, Some(freeing_release), a.as_ptr());
    let qv = managed_queue(cq, qp_v, 8, 0, None, ptr::null_mut());
    a.own_q.set(qa);
    a.victim_q.set(qv);
    a.victim_qp.set(qp_v);
    assert_eq!(cq_stats(cq).queues, 2);

    let mut wrs = Sends::new(0, 4, false);
    assert_eq!(post(qa, &mut wrs), 0);
    drive(qp_a, cq, || a.released().len() == 4);

    assert_eq!(a.codes_of("free victim"), vec![0], "an idle queue of the polled CQ may be freed from a release");
    assert_eq!(a.codes_of("destroy victim qp"), vec![0], "its QP is no longer held once the queue is freed");
    assert_eq!(a.codes_of("defer"), vec![0]);
    assert_eq!(a.codes_of("free own from defer"), vec![-libc::EBUSY]);
    // The action deferred during the release of WR 1 waited for WR 3, the last accepted before it.
    let ev: Vec<_> = a.events.borrow().iter().map(|e| (e.0, e.1)).collect();
    assert_eq!(ev, vec![("release", 0), ("release", 1), ("release", 2), ("release", 3), ("defer", 0)]);
    assert_eq!(cq_stats(cq).queues, 1);

    // SAFETY: live handles, nothing outstanding.
    unsafe {
        assert_eq!(sqd_queue_free(qa), 0);
        assert_eq!(sqd_cq_free(cq), 0);
        assert_eq!(sqd_scripted_free(d.dev), 0);
    }
}

/// A deferred action that posts on its own queue and defers again behind that WR.
unsafe extern "C" fn posting_defer(ctx: *mut c_void) {
    // SAFETY: the action was deferred with a `Ctx`.
    let x = unsafe { ctx_of(ctx) };
    x.events.borrow_mut().push(("defer", 1, 0));
    let mut wr = Sends::new(50, 1, false);
    x.code("post from defer", post(x.own_q.get(), &mut wr));
    // SAFETY: a live queue; the context outlives it.
    x.code("defer from defer", unsafe { sqd_defer(x.own_q.get(), Some(tagged_defer), x.as_ptr()) });
    // SAFETY: as above; refused while its own action runs.
    x.code("free own from defer", unsafe { sqd_queue_free(x.own_q.get()) });
}

#[test]
fn a_deferred_action_posts_and_defers_behind_its_own_wr() {
    let d = Dev::new();
    let raw = d.cq(32);
    let qp = d.qp(raw, raw, 4);
    let cq = managed_cq(raw, 0);
    let a = Ctx::default();
    let q = managed_queue(cq, qp, 4, 0, Some(log_release), a.as_ptr());
    a.own_q.set(q);
    // Nothing outstanding: the action runs inside sqd_defer.
    // SAFETY: a live queue; the context outlives it.
    assert_eq!(unsafe { sqd_defer(q, Some(posting_defer), a.as_ptr()) }, 0);
    assert_eq!(a.codes_of("post from defer"), vec![0]);
    assert_eq!(a.codes_of("defer from defer"), vec![0]);
    // The nested action waits for WR 50, posted just before it.
    assert_eq!(a.events.borrow().len(), 1);
    assert_eq!(queue_stats(q).deferred, 1);
    drive(qp, cq, || a.events.borrow().len() == 3);
    let ev: Vec<_> = a.events.borrow().iter().map(|e| (e.0, e.1)).collect();
    assert_eq!(ev, vec![("defer", 1), ("release", 50), ("defer", 0)]);
    assert_eq!(a.codes_of("free own from defer"), vec![-libc::EBUSY, -libc::EBUSY]);
    // SAFETY: live handles, nothing outstanding.
    unsafe {
        assert_eq!(sqd_queue_free(q), 0);
        assert_eq!(sqd_cq_free(cq), 0);
        assert_eq!(sqd_scripted_free(d.dev), 0);
    }
}

#[test]
fn on_a_thread_safe_cq_callbacks_reenter_the_lock() {
    let d = Dev::new();
    let raw = d.cq(64);
    let qp = d.qp(raw, raw, 4);
    let cq = managed_cq(raw, SQD_CQ_THREAD_SAFE);
    let a = Ctx::default();
    let q = managed_queue(cq, qp, 4, 16, Some(busy_release), a.as_ptr());
    a.own_q.set(q);
    a.own_cq.set(cq);
    a.chain_until.set(5);
    let mut first = Sends::new(0, 1, true);
    assert_eq!(post(q, &mut first), 0);
    drive(qp, cq, || a.released().len() == 6);
    assert_eq!(a.released(), (0..6).collect::<Vec<_>>());
    assert_eq!(a.codes_of("post own"), vec![0; 5], "posting from a callback re-enters the CQ's lock");
    assert_eq!(a.codes_of("poll own"), vec![-libc::EBUSY; 6]);
    assert_eq!(a.codes_of("free own queue"), vec![-libc::EBUSY; 6]);
    // SAFETY: live handles, nothing outstanding.
    unsafe {
        assert_eq!(sqd_queue_free(q), 0);
        assert_eq!(sqd_cq_free(cq), 0);
        assert_eq!(sqd_scripted_free(d.dev), 0);
    }
}

/// Releases run by an async event: posting is refused (the queue failed), freeing the running queue or its CQ is
/// refused, freeing another (idle) queue of the CQ succeeds even though the event is still walking the CQ's
/// queues.
unsafe extern "C" fn abandoned_release(ctx: *mut c_void, c: *const Completion) {
    // SAFETY: as in `busy_release`.
    let (x, c) = unsafe { (ctx_of(ctx), &*c) };
    x.events.borrow_mut().push(("release", c.wr_id, c.status));
    let mut wr = Sends::new(90, 1, false);
    x.code("post", post(x.own_q.get(), &mut wr));
    // SAFETY: live handles.
    unsafe {
        x.code("free own queue", sqd_queue_free(x.own_q.get()));
        x.code("free own cq", sqd_cq_free(x.own_cq.get()));
    }
    let victim = x.victim_q.replace(ptr::null_mut());
    if !victim.is_null() {
        // SAFETY: a live idle queue.
        x.code("free victim", unsafe { sqd_queue_free(victim) });
    }
}

#[test]
fn releases_run_by_a_cq_error_may_free_other_queues_of_that_cq() {
    let d = Dev::new();
    let raw = d.cq(64);
    let (qp_a, qp_v, qp_w) = (d.qp(raw, raw, 8), d.qp(raw, raw, 8), d.qp(raw, raw, 8));
    let cq = managed_cq(raw, 0);
    let a = Ctx::default();
    // The idle victims sit on both sides of the releasing queue in the CQ's table.
    let qv = managed_queue(cq, qp_v, 8, 0, None, ptr::null_mut());
    let qa = managed_queue(cq, qp_a, 8, 8, Some(abandoned_release), a.as_ptr());
    let qw = managed_queue(cq, qp_w, 8, 0, None, ptr::null_mut());
    a.own_q.set(qa);
    a.own_cq.set(cq);
    a.victim_q.set(qw);
    let mut wrs = Sends::new(0, 12, false);
    assert_eq!(post(qa, &mut wrs), 0);
    assert_eq!(queue_stats(qa).backlog, 4);

    // SAFETY: a live CQ handle; the releases run inside this call.
    assert_eq!(unsafe { sqd_cq_async_event(cq, IBV_EVENT_CQ_ERR) }, 0);
    assert_eq!(a.released(), (0..12).collect::<Vec<_>>());
    assert!(a.events.borrow().iter().all(|e| e.2 == WC_WR_FLUSH_ERR));
    assert_eq!(a.codes_of("post"), vec![-libc::EIO; 12], "the failed queue takes no WR");
    assert_eq!(a.codes_of("free own queue"), vec![-libc::EBUSY; 12]);
    assert_eq!(a.codes_of("free own cq"), vec![-libc::EBUSY; 12]);
    assert_eq!(a.codes_of("free victim"), vec![0]);
    assert_eq!(cq_stats(cq).queues, 2);
    // SAFETY: live handles; everything released.
    unsafe {
        assert_eq!(sqd_queue_free(qa), 0, "{}", last_error());
        assert_eq!(sqd_queue_free(qv), 0);
        assert_eq!(sqd_cq_free(cq), 0);
        assert_eq!(sqd_scripted_free(d.dev), 0);
    }
}

/// An invalidation's `done` callback frees the queue's idle neighbour and posts on its own queue.
unsafe extern "C" fn inv_done(ctx: *mut c_void, c: *const Completion) {
    // SAFETY: as in `busy_release`.
    let (x, c) = unsafe { (ctx_of(ctx), &*c) };
    x.events.borrow_mut().push(("done", c.wr_id, c.status));
    let mut wr = Sends::new(70, 1, true);
    x.code("post from done", post(x.own_q.get(), &mut wr));
    // SAFETY: a live queue, refused from its own callback.
    x.code("free own from done", unsafe { sqd_queue_free(x.own_q.get()) });
}

#[test]
fn an_invalidation_done_callback_posts_again() {
    let d = Dev::new();
    let raw = d.cq(64);
    let qp = d.qp(raw, raw, 4);
    let cq = managed_cq(raw, 0);
    let a = Ctx::default();
    let q = managed_queue(cq, qp, 4, 4, Some(log_release), a.as_ptr());
    a.own_q.set(q);
    let mut wrs = Sends::new(0, 2, false);
    assert_eq!(post(q, &mut wrs), 0);
    // SAFETY: a live queue; the context outlives it.
    assert_eq!(unsafe { sqd_invalidate(q, 0x1234, 7, 0, Some(inv_done), a.as_ptr()) }, 0);
    drive(qp, cq, || a.released().len() == 3);
    let ev: Vec<_> = a.events.borrow().iter().map(|e| (e.0, e.1)).collect();
    assert_eq!(ev, vec![("release", 0), ("release", 1), ("done", 7), ("release", 70)]);
    assert_eq!(a.codes_of("post from done"), vec![0]);
    assert_eq!(a.codes_of("free own from done"), vec![-libc::EBUSY]);
    // SAFETY: live handles, nothing outstanding.
    unsafe {
        assert_eq!(sqd_queue_free(q), 0);
        assert_eq!(sqd_cq_free(cq), 0);
        assert_eq!(sqd_scripted_free(d.dev), 0);
    }
}
