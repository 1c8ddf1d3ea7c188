//! Teardown in every order, through the C ABI: each order gives its documented result (0, `-EBUSY` with a
//! message, or `-EINVAL`), never a use after free. The scripted-device tests run under Miri too
//! (scripts/miri.sh); the SRQ ones need the software HCA.

mod capi_support;

use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::ptr;

use capi_support::*;

/// A queue on its own CQ of a scripted device, everything made through the C ABI.
struct One {
    d: Dev,
    raw_cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    cq: *mut Cq,
    q: *mut Queue,
}

fn one(release: ReleaseFn, ctx: *mut c_void) -> One {
    let d = Dev::new();
    let raw_cq = d.cq(32);
    let qp = d.qp(raw_cq, raw_cq, 8);
    let cq = managed_cq(raw_cq, 0);
    let q = managed_queue(cq, qp, 8, 8, release, ctx);
    One { d, raw_cq, qp, cq, q }
}

#[test]
fn queue_then_cq_then_device_objects_then_device() {
    let o = one(None, ptr::null_mut());
    // SAFETY: live objects, freed once each, in the documented order.
    unsafe {
        assert_eq!(sqd_queue_free(o.q), 0);
        assert_eq!(sqd_cq_free(o.cq), 0);
        assert_eq!(sqd_scripted_destroy_qp(o.qp), 0);
        assert_eq!(sqd_scripted_destroy_cq(o.raw_cq), 0);
        assert_eq!(sqd_scripted_free(o.d.dev), 0);
    }
}

#[test]
fn freeing_a_cq_with_queues_attached_is_ebusy_and_leaves_it_usable() {
    let o = one(None, ptr::null_mut());
    // SAFETY: live handles.
    unsafe {
        assert_fails(sqd_cq_free(o.cq), libc::EBUSY, "1 queue(s) attached");
        // Still valid: it polls, and its queue still works.
        let mut wrs = Sends::new(0, 3, true);
        assert_eq!(post(o.q, &mut wrs), 0);
        drive(o.qp, o.cq, || queue_stats(o.q).released == 3);
        assert_eq!(sqd_queue_free(o.q), 0);
        assert_eq!(sqd_cq_free(o.cq), 0);
        assert_eq!(sqd_scripted_free(o.d.dev), 0);
    }
}

#[test]
fn freeing_a_queue_with_wrs_outstanding_is_ebusy_until_drained_and_polled() {
    let o = one(None, ptr::null_mut());
    let mut wrs = Sends::new(0, 12, false); // 8 posted, 4 in the backlog
    assert_eq!(post(o.q, &mut wrs), 0);
    // SAFETY: live handles.
    unsafe {
        assert_fails(sqd_queue_free(o.q), libc::EBUSY, "12 send WR(s)");
        assert_eq!(sqd_scripted_set_error(o.qp), 0);
        assert_fails(sqd_queue_drain(o.q), libc::EINPROGRESS, "poll the CQ");
        assert_fails(sqd_queue_free(o.q), libc::EBUSY, "not yet released");
        drive(o.qp, o.cq, || sqd_queue_drain(o.q) == 0);
        assert_eq!(queue_stats(o.q).released, 12);
        assert_eq!(sqd_queue_free(o.q), 0);
        assert_eq!(sqd_cq_free(o.cq), 0);
        assert_eq!(sqd_scripted_free(o.d.dev), 0);
    }
}

#[test]
fn device_objects_under_live_handles_are_ebusy_and_the_handles_keep_working() {
    let o = one(None, ptr::null_mut());
    // SAFETY: live objects; every refused call leaves them valid.
    unsafe {
        assert_fails(sqd_scripted_destroy_qp(o.qp), libc::EBUSY, "sqd_queue_free it first");
        assert_fails(sqd_scripted_destroy_cq(o.raw_cq), libc::EBUSY, "sqd_cq_free it first");
        assert_fails(sqd_scripted_free(o.d.dev), libc::EBUSY, "2 object(s) of the device are still managed");
        // Nothing was freed: the queue posts and completes through them.
        let mut wrs = Sends::new(0, 4, true);
        assert_eq!(post(o.q, &mut wrs), 0);
        drive(o.qp, o.cq, || queue_stats(o.q).released == 4);
        assert_eq!(sqd_queue_free(o.q), 0);
        // The QP is free to go now; the CQ is still held by its handle.
        assert_eq!(sqd_scripted_destroy_qp(o.qp), 0);
        assert_fails(sqd_scripted_free(o.d.dev), libc::EBUSY, "1 object(s)");
        assert_eq!(sqd_cq_free(o.cq), 0);
        // The device frees its remaining CQ itself.
        assert_eq!(sqd_scripted_free(o.d.dev), 0);
    }
}

#[test]
fn two_handles_on_one_cq_hold_it_until_both_are_freed() {
    let d = Dev::new();
    let raw = d.cq(8);
    let (a, b) = (managed_cq(raw, 0), managed_cq(raw, 0));
    // SAFETY: live objects.
    unsafe {
        assert_eq!(sqd_cq_free(a), 0);
        assert_fails(sqd_scripted_destroy_cq(raw), libc::EBUSY, "1 handle(s)");
        assert_eq!(sqd_cq_free(b), 0);
        assert_eq!(sqd_scripted_destroy_cq(raw), 0);
        assert_eq!(sqd_scripted_free(d.dev), 0);
    }
}

#[test]
fn free_of_null_is_a_no_op() {
    // SAFETY: NULL is documented as a no-op for every free.
    unsafe {
        assert_eq!(sqd_queue_free(ptr::null_mut()), 0);
        assert_eq!(sqd_cq_free(ptr::null_mut()), 0);
        assert_eq!(sqd_srq_free(ptr::null_mut()), 0);
        assert_eq!(sqd_scripted_free(ptr::null_mut()), 0);
        assert_eq!(sqd_sim_free(ptr::null_mut()), 0);
    }
}

#[test]
fn failed_creates_leave_null_and_hold_nothing() {
    let d = Dev::new();
    let (small, other) = (d.cq(4), d.cq(64));
    let qp = d.qp(small, other, 8);
    let (cq_small, cq_other) = (managed_cq(small, 0), managed_cq(other, 0));
    let mut out: *mut Cq = ptr::NonNull::dangling().as_ptr();
    // SAFETY: arguments the calls check; `out` is writable.
    unsafe {
        assert_fails(sqd_cq_new_ex(small, 0x80, &mut out), libc::EINVAL, "unknown bits");
        assert!(out.is_null(), "a failed create stores NULL");
        assert_eq!(sqd_cq_free(out), 0);
        assert_fails(sqd_cq_new(ptr::null_mut(), &mut out), libc::EINVAL, "cq is NULL");
        assert!(out.is_null());
    }
    // A queue that does not fit its send CQ's budget: refused, nothing reserved, its QP not held.
    let attr = QueueAttr { sq_depth: 8, ..QueueAttr::default() };
    let mut q: *mut Queue = ptr::NonNull::dangling().as_ptr();
    // SAFETY: live handles and QP; `q` is writable.
    unsafe {
        assert_fails(sqd_queue_new(cq_small, ptr::null_mut(), qp, &attr, &mut q), libc::ENOSPC, "");
        assert!(q.is_null());
        assert_eq!(sqd_queue_free(q), 0);
    }
    // One that fits its send CQ but not its receive CQ: the send side's reservation is given back too.
    let qp2 = d.qp(other, small, 8);
    let attr = QueueAttr { sq_depth: 8, rq_depth: 8, ..QueueAttr::default() };
    // SAFETY: as above.
    unsafe {
        assert_fails(sqd_queue_new(cq_other, cq_small, qp2, &attr, &mut q), libc::ENOSPC, "rq_depth 8");
        assert!(q.is_null());
    }
    assert_eq!((cq_stats(cq_small).queues, cq_stats(cq_small).reserved), (0, 0));
    assert_eq!((cq_stats(cq_other).queues, cq_stats(cq_other).reserved), (0, 0));
    // SAFETY: live objects; nothing holds the QPs after the failed creates.
    unsafe {
        assert_eq!(sqd_scripted_destroy_qp(qp), 0);
        assert_eq!(sqd_scripted_destroy_qp(qp2), 0);
        assert_eq!(sqd_cq_free(cq_small), 0);
        assert_eq!(sqd_cq_free(cq_other), 0);
        assert_eq!(sqd_scripted_free(d.dev), 0);
    }
}

/// Tries every free from inside a release callback and logs the results.
#[derive(Default)]
struct Frees {
    q: Cell<*mut Queue>,
    cq: Cell<*mut Cq>,
    dev: Cell<*mut ScriptedDevice>,
    qp: Cell<*mut ibv_qp>,
    codes: RefCell<Vec<(i32, i32, i32, i32)>>,
}

unsafe extern "C" fn try_frees(ctx: *mut c_void, _c: *const Completion) {
    // SAFETY: the queue was made with a `Frees` that outlives it.
    let f = unsafe { &*(ctx as *const Frees) };
    // SAFETY: live objects; every one of these calls is refused and leaves them valid.
    let codes = unsafe {
        (
            sqd_queue_free(f.q.get()),
            sqd_cq_free(f.cq.get()),
            sqd_scripted_destroy_qp(f.qp.get()),
            sqd_scripted_free(f.dev.get()),
        )
    };
    f.codes.borrow_mut().push(codes);
}

unsafe extern "C" fn defer_frees(ctx: *mut c_void) {
    // SAFETY: a `Frees`, as above.
    unsafe { try_frees(ctx, ptr::null()) }
}

#[test]
fn frees_from_release_and_deferred_callbacks_are_ebusy() {
    let f = Frees::default();
    let o = one(Some(try_frees), &f as *const Frees as *mut c_void);
    f.q.set(o.q);
    f.cq.set(o.cq);
    f.qp.set(o.qp);
    f.dev.set(o.d.dev);
    let mut wrs = Sends::new(0, 3, true);
    assert_eq!(post(o.q, &mut wrs), 0);
    // SAFETY: a live queue; `f` outlives it.
    assert_eq!(unsafe { sqd_defer(o.q, Some(defer_frees), &f as *const Frees as *mut c_void) }, 0);
    drive(o.qp, o.cq, || f.codes.borrow().len() == 4);
    let busy = (-libc::EBUSY, -libc::EBUSY, -libc::EBUSY, -libc::EBUSY);
    assert_eq!(*f.codes.borrow(), vec![busy; 4], "3 releases and the deferred action");
    // SAFETY: live objects, in order.
    unsafe {
        assert_eq!(sqd_queue_free(o.q), 0);
        assert_eq!(sqd_cq_free(o.cq), 0);
        assert_eq!(sqd_scripted_free(o.d.dev), 0);
    }
}

// ---- SRQs, on the software HCA ------------------------------------------------------------------------------

struct SrqRig {
    sim: *mut SimDevice,
    raw_cq: *mut ibv_cq,
    raw_srq: *mut ibv_srq,
    qp: *mut ibv_qp,
    peer: *mut ibv_qp,
    cq: *mut Cq,
    srq: *mut Srq,
    q: *mut Queue,
}

#[derive(Default)]
struct SrqCtx {
    srq: Cell<*mut Srq>,
    released: Cell<u32>,
    low_calls: Cell<u32>,
    codes: RefCell<Vec<(&'static str, i32)>>,
}

unsafe extern "C" fn srq_release(ctx: *mut c_void, _c: *const Completion) {
    // SAFETY: the SRQ was made with an `SrqCtx` that outlives it.
    let x = unsafe { &*(ctx as *const SrqCtx) };
    x.released.set(x.released.get() + 1);
    // SAFETY: a live SRQ, refused from its own release.
    x.codes.borrow_mut().push(("free from release", unsafe { sqd_srq_free(x.srq.get()) }));
}

unsafe extern "C" fn srq_low(ctx: *mut c_void, _posted: u32) {
    // SAFETY: as above.
    let x = unsafe { &*(ctx as *const SrqCtx) };
    x.low_calls.set(x.low_calls.get() + 1);
    // SAFETY: a live SRQ, refused while a queue is attached.
    x.codes.borrow_mut().push(("free from low", unsafe { sqd_srq_free(x.srq.get()) }));
}

/// `n` receives with wr_ids 0.., linked, each with one empty SGE.
struct Recvs {
    wrs: Vec<ibv_recv_wr>,
    sges: Vec<ibv_sge>,
}

impl Recvs {
    fn new(n: usize) -> Box<Recvs> {
        let mut r = Box::new(Recvs {
            // SAFETY: all-zero is a valid `ibv_recv_wr`.
            wrs: (0..n).map(|_| unsafe { std::mem::zeroed() }).collect(),
            sges: (0..n).map(|_| ibv_sge { addr: 0, length: 0, lkey: 0 }).collect(),
        });
        // Every pointer comes from one base pointer per vector, so none is invalidated by a later borrow.
        let (wrs, sges) = (r.wrs.as_mut_ptr(), r.sges.as_mut_ptr());
        for i in 0..n {
            // SAFETY: `i < n`; both vectors hold `n` elements; no reference into them is live.
            unsafe {
                let w = wrs.add(i);
                (*w).wr_id = i as u64;
                (*w).sg_list = sges.add(i);
                (*w).num_sge = 1;
                (*w).next = if i + 1 < n { wrs.add(i + 1) } else { ptr::null_mut() };
            }
        }
        r
    }
}

fn srq_rig(x: &SrqCtx) -> SrqRig {
    let cfg = SimConfig::default();
    let mut sim = ptr::null_mut();
    let (mut raw_cq, mut raw_srq, mut qp, mut peer) = (ptr::null_mut(), ptr::null_mut(), ptr::null_mut(), ptr::null_mut());
    // SAFETY: writable outputs; objects of this sim.
    unsafe {
        assert_eq!(sqd_sim_new(&cfg, &mut sim), 0);
        assert_eq!(sqd_sim_create_cq(sim, 64, &mut raw_cq), 0);
        let mut sattr: ibv_srq_init_attr = std::mem::zeroed();
        sattr.attr.max_wr = 8;
        sattr.attr.max_sge = 1;
        assert_eq!(sqd_sim_create_srq(sim, &mut sattr, &mut raw_srq), 0, "{}", last_error());
        let mut qattr: ibv_qp_init_attr = std::mem::zeroed();
        qattr.send_cq = raw_cq;
        qattr.recv_cq = raw_cq;
        qattr.srq = raw_srq;
        qattr.qp_type = rdma_sys::ibv_qp_type::IBV_QPT_RC;
        qattr.cap.max_send_wr = 8;
        qattr.cap.max_send_sge = 1;
        assert_eq!(sqd_sim_create_qp(sim, &mut qattr, &mut qp), 0, "{}", last_error());
        qattr.srq = ptr::null_mut();
        qattr.cap.max_recv_wr = 8;
        qattr.cap.max_recv_sge = 1;
        assert_eq!(sqd_sim_create_qp(sim, &mut qattr, &mut peer), 0, "{}", last_error());
    }
    let cq = managed_cq(raw_cq, 0);
    let sattr = SrqAttr {
        depth: 8,
        low_watermark: 4,
        release: Some(srq_release),
        release_ctx: x as *const SrqCtx as *mut c_void,
        low: Some(srq_low),
        low_ctx: x as *const SrqCtx as *mut c_void,
        flags: 0,
    };
    let mut srq = ptr::null_mut();
    let mut q = ptr::null_mut();
    // SAFETY: live objects; the callbacks' context outlives the SRQ.
    unsafe {
        assert_eq!(sqd_srq_new(raw_srq, &sattr, &mut srq), 0, "{}", last_error());
        let qattr = QueueAttr { sq_depth: 8, srq, ..QueueAttr::default() };
        assert_eq!(sqd_queue_new(cq, cq, qp, &qattr, &mut q), 0, "{}", last_error());
    }
    x.srq.set(srq);
    SrqRig { sim, raw_cq, raw_srq, qp, peer, cq, srq, q }
}

#[test]
fn an_srq_in_use_refuses_every_free_until_its_queues_and_receives_are_gone() {
    let x = SrqCtx::default();
    let r = srq_rig(&x);
    let mut recvs = Recvs::new(6);
    let mut bad = ptr::null_mut();
    // SAFETY: live objects; the receive chain is valid during the call.
    unsafe {
        assert_eq!(sqd_srq_post_recv(r.srq, recvs.wrs.as_mut_ptr(), &mut bad), 0, "{}", last_error());
        assert_fails(sqd_srq_free(r.srq), libc::EBUSY, "1 queue(s) attached and 6 receive(s) posted");
        assert_fails(sqd_srq_release_all(r.srq), libc::EBUSY, "queues are still attached");
        assert_fails(sqd_sim_destroy_srq(r.raw_srq), libc::EBUSY, "");
        assert_fails(sqd_sim_destroy_qp(r.qp), libc::EBUSY, "sqd_queue_free it first");
        assert_fails(sqd_sim_destroy_cq(r.raw_cq), libc::EBUSY, "");
        assert_fails(sqd_sim_free(r.sim), libc::EBUSY, "3 object(s) of the sim");
        // The QP may still consume the SRQ's receives: its queue cannot go yet.
        assert_fails(sqd_queue_free(r.q), libc::EBUSY, "LAST_WQE_REACHED");
        // A fatal error releases it (the QP will consume nothing more).
        assert_eq!(sqd_queue_async_event(r.q, IBV_EVENT_QP_FATAL), 0);
        assert_eq!(sqd_queue_free(r.q), 0, "{}", last_error());
        // Receives still posted: freeing is refused until they are released.
        assert_fails(sqd_srq_free(r.srq), libc::EBUSY, "0 queue(s) attached and 6 receive(s) posted");
        assert_eq!(sqd_srq_release_all(r.srq), 0);
    }
    assert_eq!(x.released.get(), 6);
    assert_eq!(x.codes.borrow().iter().filter(|c| c.0 == "free from release").map(|c| c.1).collect::<Vec<_>>(), vec![-libc::EBUSY; 6]);
    assert_eq!(x.low_calls.get(), 0, "releasing a torn-down SRQ asks for no refill");
    // SAFETY: live objects, in order.
    unsafe {
        assert_eq!(sqd_srq_free(r.srq), 0);
        assert_fails(sqd_sim_destroy_srq(r.raw_srq), libc::EBUSY, "still used by 1 QP(s)");
        assert_eq!(sqd_sim_destroy_qp(r.qp), 0);
        assert_eq!(sqd_sim_destroy_srq(r.raw_srq), 0, "{}", last_error());
        assert_eq!(sqd_cq_free(r.cq), 0);
        assert_eq!(sqd_sim_destroy_qp(r.peer), 0);
        assert_eq!(sqd_sim_destroy_cq(r.raw_cq), 0);
        assert_eq!(sqd_sim_free(r.sim), 0);
    }
}

#[test]
fn an_srq_whose_receives_were_released_takes_no_more_receives_or_queues() {
    let x = SrqCtx::default();
    let r = srq_rig(&x);
    let mut recvs = Recvs::new(3);
    let mut more = Recvs::new(1);
    let mut bad = ptr::null_mut();
    // SAFETY: live objects; the receive chains are valid during the calls.
    unsafe {
        assert_eq!(sqd_queue_async_event(r.q, IBV_EVENT_QP_FATAL), 0);
        assert_eq!(sqd_queue_free(r.q), 0, "{}", last_error());
        // Nothing posted: nothing released, and the SRQ stays open.
        assert_eq!(sqd_srq_release_all(r.srq), 0);
        assert_eq!(sqd_srq_post_recv(r.srq, recvs.wrs.as_mut_ptr(), &mut bad), 0, "{}", last_error());
        assert_eq!(sqd_srq_release_all(r.srq), 0);
        assert_eq!(x.released.get(), 3);
        // The device still holds those three receives: no more may go in (the SRQ could overflow), and no QP may
        // come to consume them into buffers their releases gave back.
        assert_fails(sqd_srq_post_recv(r.srq, more.wrs.as_mut_ptr(), &mut bad), libc::EIO, "sqd_srq_release_all");
        assert!(ptr::eq(bad, more.wrs.as_mut_ptr()), "*bad_wr is the first receive not posted");
        let qattr = QueueAttr { sq_depth: 8, srq: r.srq, ..QueueAttr::default() };
        let mut q = ptr::dangling_mut();
        assert_fails(sqd_queue_new(r.cq, r.cq, r.qp, &qattr, &mut q), libc::EIO, "sqd_srq_release_all");
        assert!(q.is_null(), "a refused sqd_queue_new stores NULL");
        let mut st = SrqStats::default();
        assert_eq!(sqd_srq_stats(r.srq, &mut st), 0);
        assert_eq!((st.posted, st.total_posted, st.queues), (0, 3, 0));
        assert_eq!(sqd_srq_free(r.srq), 0, "{}", last_error());
        assert_eq!(sqd_cq_free(r.cq), 0);
        assert_eq!(sqd_sim_free(r.sim), 0);
    }
}

#[test]
fn the_low_watermark_callback_cannot_free_its_srq() {
    let x = SrqCtx::default();
    let r = srq_rig(&x);
    let mut recvs = Recvs::new(4);
    let mut bad = ptr::null_mut();
    // SAFETY: live objects; chains valid during the calls.
    unsafe {
        assert_eq!(sqd_srq_post_recv(r.srq, recvs.wrs.as_mut_ptr(), &mut bad), 0);
        assert_eq!(sqd_sim_connect(r.peer, r.qp, ptr::null()), 0, "{}", last_error());
    }
    // The peer (unmanaged) sends one message: the QP consumes a receive, the SRQ drops below its watermark.
    let mut send = Sends::new(0, 1, true);
    send.sges[0].length = 0;
    send.sges[0].lkey = 0;
    send.wrs[0].num_sge = 0;
    let mut bad = ptr::null_mut();
    // SAFETY: a raw post on the unmanaged peer QP through its context's ops, as `ibv_post_send` does.
    unsafe {
        let post = (*(*r.peer).context).ops.post_send.unwrap();
        assert_eq!(post(r.peer, send.head(), &mut bad), 0);
        assert!(sqd_sim_run_until_idle(r.sim, 1000) >= 0);
    }
    for _ in 0..10 {
        assert!(poll(r.cq) >= 0);
    }
    assert_eq!(x.low_calls.get(), 1);
    assert_eq!(x.codes.borrow().iter().filter(|c| c.0 == "free from low").map(|c| c.1).collect::<Vec<_>>(), vec![-libc::EBUSY]);
    // SAFETY: live objects, in order.
    unsafe {
        assert_eq!(sqd_queue_async_event(r.q, IBV_EVENT_QP_FATAL), 0);
        assert_eq!(sqd_queue_free(r.q), 0, "{}", last_error());
        assert_eq!(sqd_srq_release_all(r.srq), 0);
        assert_eq!(sqd_srq_free(r.srq), 0);
        assert_eq!(sqd_cq_free(r.cq), 0);
        assert_eq!(sqd_sim_free(r.sim), 0);
    }
}
