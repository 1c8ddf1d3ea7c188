//! What a storage target at scale needs from the software HCA: SRQs, asynchronous events, completion channels
//! (event mode), several threads on one device, and 10,000 QPs on one CQ and one SRQ. Each test would fail if
//! its rule broke.

mod sim_support;

use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use rdma_sys::{ibv_comp_channel, ibv_cq, ibv_event_type as ev, ibv_qp, ibv_recv_wr, ibv_sge, ibv_srq, ibv_srq_init_attr, ibv_wc_opcode};
use sim_support::*;
use sqdisc_sim::*;

const SOLICITED: u32 = rdma_sys::ibv_send_flags::IBV_SEND_SOLICITED.0;

fn cfg() -> SimConfig {
    SimConfig { wire_delay_min: 1, wire_delay_max: 1, ..SimConfig::default() }
}

/// Raw pointers handed to another thread: the sim is thread-safe, the objects live as long as the device.
#[derive(Clone, Copy)]
struct P<T>(*mut T);
// SAFETY: only used to pass sim objects to threads that run within the device's lifetime.
unsafe impl<T> Send for P<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for P<T> {}

fn readable(fd: i32) -> bool {
    wait_readable(fd, 0)
}

fn wait_readable(fd: i32, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    n == 1 && p.revents & libc::POLLIN != 0
}

fn srq_attr(max_wr: u32, max_sge: u32, ctx: usize) -> ibv_srq_init_attr {
    // SAFETY: plain data; all-zero is valid.
    let mut a: ibv_srq_init_attr = unsafe { std::mem::zeroed() };
    a.srq_context = ctx as *mut _;
    a.attr.max_wr = max_wr;
    a.attr.max_sge = max_sge;
    a
}

/// Posts receives `(wr_id, addr, len, lkey)` as one chain through the context's `post_srq_recv` op, as
/// libibverbs' inline `ibv_post_srq_recv` does; returns the result and the index of `*bad_wr`.
fn post_srq(srq: *mut ibv_srq, recvs: &[(u64, u64, u32, u32)]) -> (i32, Option<usize>) {
    let mut sges: Vec<ibv_sge> = recvs.iter().map(|&(_, addr, length, lkey)| ibv_sge { addr, length, lkey }).collect();
    // SAFETY: plain data; all-zero is valid.
    let mut wrs: Vec<ibv_recv_wr> = recvs.iter().map(|_| unsafe { std::mem::zeroed() }).collect();
    let n = wrs.len();
    for i in 0..n {
        wrs[i].wr_id = recvs[i].0;
        wrs[i].num_sge = 1;
        wrs[i].sg_list = &mut sges[i];
    }
    for i in 0..n.saturating_sub(1) {
        wrs[i].next = &mut wrs[i + 1] as *mut _;
    }
    let mut bad: *mut ibv_recv_wr = ptr::null_mut();
    // SAFETY: `srq` is a live sim SRQ; the chain lives for the call.
    let rc = unsafe { (*(*srq).context).ops.post_srq_recv.unwrap()(srq, wrs.as_mut_ptr(), &mut bad) };
    (rc, wrs.iter().position(|w| ptr::eq(w, bad)))
}

fn arm(cq: *mut ibv_cq, solicited_only: bool) {
    // SAFETY: `cq` is a live sim CQ; this is what libibverbs' inline ibv_req_notify_cq does.
    assert_eq!(unsafe { (*(*cq).context).ops.req_notify_cq.unwrap()(cq, i32::from(solicited_only)) }, 0);
}

fn events(dev: &SimDevice) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| dev.get_async_event()).collect()
}

/// A target: initiators `i[k]` (CQ `icq`) connected to targets `t[k]` (CQ `tcq`) that take their receives from
/// one SRQ; a source buffer on the initiators' side and a receive area on the target's.
struct Target {
    dev: std::pin::Pin<Box<SimDevice>>,
    srq: *mut ibv_srq,
    icq: *mut ibv_cq,
    tcq: *mut ibv_cq,
    i: Vec<*mut ibv_qp>,
    t: Vec<*mut ibv_qp>,
    src: Buf,
    dst: Buf,
    src_key: u32,
    dst_key: u32,
}

impl Target {
    fn new(c: SimConfig, n: usize, srq_wr: u32, cqe: i32) -> Target {
        let dev = SimDevice::new(&c).unwrap();
        let srq = dev.create_srq(&mut srq_attr(srq_wr, 2, 0x5eed)).unwrap();
        let icq = dev.create_cq(cqe).unwrap();
        let tcq = dev.create_cq(cqe).unwrap();
        let (mut i, mut t) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let a = dev.create_qp(&mut qp_attr(icq, icq, 16, 16)).unwrap();
            let mut ta = qp_attr(tcq, tcq, 16, 16);
            ta.srq = srq;
            let b = dev.create_qp(&mut ta).unwrap();
            dev.connect(a, b, &SimConnAttr::default()).unwrap();
            i.push(a);
            t.push(b);
        }
        let src = Buf::new(4096, 0x5a);
        let dst = Buf::new(64 * 1024, 0);
        // SAFETY: the buffers outlive the device (declared after it in the struct, dropped after it).
        let src_key = mr_keys(unsafe { dev.reg_mr(src.ptr().cast(), src.len(), ACCESS_ALL) }.unwrap()).0;
        // SAFETY: as above.
        let dst_key = mr_keys(unsafe { dev.reg_mr(dst.ptr().cast(), dst.len(), ACCESS_ALL) }.unwrap()).0;
        Target { dev, srq, icq, tcq, i, t, src, dst, src_key, dst_key }
    }
    /// Receives `ids` into 64-byte slots of `dst` (slot = wr_id % 1024).
    fn post_recvs(&self, ids: std::ops::Range<u64>) -> (i32, Option<usize>) {
        let r: Vec<_> = ids.map(|id| (id, self.dst.addr() + (id % 1024) * 64, 64u32, self.dst_key)).collect();
        post_srq(self.srq, &r)
    }
    fn send(&self, k: usize, wr_id: u64, flags: u32) -> i32 {
        post1(self.i[k], wr(wr_id, op::IBV_WR_SEND, SIGNALED | flags, &[(self.src.addr(), 32, self.src_key)]))
    }
}

// ---- SRQ --------------------------------------------------------------------------------------------------

#[test]
fn srq_receives_are_taken_oldest_first_by_whichever_qp_a_message_arrives_on() {
    let t = Target::new(cfg(), 2, 64, 64);
    // SAFETY: a live SRQ made by the sim.
    let s = unsafe { &*t.srq };
    assert_eq!((s.context, s.pd, s.srq_context as usize), (t.dev.context(), t.dev.pd(), 0x5eed));
    assert_eq!(t.post_recvs(0..4), (0, None));
    assert_eq!(t.send(1, 10, 0), 0);
    t.dev.run_until_idle(100).unwrap();
    assert_eq!(t.send(0, 11, 0), 0);
    t.dev.run_until_idle(100).unwrap();
    assert_eq!(t.send(1, 12, 0), 0);
    t.dev.run_until_idle(100).unwrap();
    let wc = poll(t.tcq, 16);
    // SAFETY: live QPs.
    let qpn = |q: *mut ibv_qp| unsafe { (*q).qp_num };
    assert_eq!(
        wc.iter().map(|w| (w.wr_id, w.qp_num, w.opcode, w.status)).collect::<Vec<_>>(),
        vec![
            (0, qpn(t.t[1]), ibv_wc_opcode::IBV_WC_RECV, st::IBV_WC_SUCCESS),
            (1, qpn(t.t[0]), ibv_wc_opcode::IBV_WC_RECV, st::IBV_WC_SUCCESS),
            (2, qpn(t.t[1]), ibv_wc_opcode::IBV_WC_RECV, st::IBV_WC_SUCCESS),
        ]
    );
    assert_eq!(t.dst.read(0, 32), vec![0x5a; 32], "the data went through the SRQ receive's SGE");
    assert_eq!(t.dev.srq_state(t.srq).unwrap(), (0, 1, 1), "one receive left; the polled ones freed their slots");
    // A QP on an SRQ has no receive queue of its own.
    assert_eq!(post_recv(t.t[0], 99, &[(t.dst.addr(), 8, t.dst_key)]), libc::EINVAL);
    assert!(t.dev.violation_log().iter().any(|v| v.kind == SQD_SIM_VIOLATION_BAD_WR && v.text.contains("SRQ")));
}

#[test]
fn srq_caps_are_clamped_and_written_back_and_its_slots_are_freed_by_polled_cqes() {
    let dev = SimDevice::new(&cfg()).unwrap();
    let mut a = srq_attr(1 << 20, 99, 0);
    let srq = dev.create_srq(&mut a).unwrap();
    assert_eq!((a.attr.max_wr, a.attr.max_sge), (32768, 32));
    let mut a = srq_attr(0, 0, 0);
    dev.destroy_srq(srq).unwrap();
    let srq = dev.create_srq(&mut a).unwrap();
    assert_eq!((a.attr.max_wr, a.attr.max_sge), (1, 1));
    dev.destroy_srq(srq).unwrap();
    // A QP made on an SRQ gets no RQ caps.
    let cq = dev.create_cq(8).unwrap();
    let srq = dev.create_srq(&mut srq_attr(2, 1, 0)).unwrap();
    let mut qa = qp_attr(cq, cq, 4, 4);
    qa.srq = srq;
    let qp = dev.create_qp(&mut qa).unwrap();
    assert_eq!((qa.cap.max_recv_wr, qa.cap.max_recv_sge), (0, 0));
    // SAFETY: a live QP.
    assert_eq!(unsafe { (*qp).srq }, srq);
    assert_eq!(dev.destroy_srq(srq).unwrap_err().errno(), libc::EBUSY, "a QP uses it");
    dev.destroy_qp(qp).unwrap();
    // max_wr 2: a chain of three stops at the third, the first two stay posted.
    let buf = Buf::new(64, 0);
    // SAFETY: `buf` outlives the device.
    let k = mr_keys(unsafe { dev.reg_mr(buf.ptr().cast(), 64, ACCESS_ALL) }.unwrap()).0;
    assert_eq!(post_srq(srq, &[(1, buf.addr(), 8, k), (2, buf.addr(), 8, k), (3, buf.addr(), 8, k)]), (libc::ENOMEM, Some(2)));
    assert_eq!(dev.srq_state(srq).unwrap(), (0, 2, 2));
    assert_eq!(post_srq(srq, &[(4, buf.addr(), 8, k), (5, buf.addr(), 8, k)]).0, libc::ENOMEM);
    dev.destroy_srq(srq).unwrap();
}

#[test]
fn a_held_srq_slot_comes_back_only_when_its_cqe_is_polled() {
    let t = Target::new(cfg(), 1, 2, 64);
    assert_eq!(t.post_recvs(0..2), (0, None));
    assert_eq!(t.post_recvs(2..3).0, libc::ENOMEM);
    assert_eq!(t.send(0, 1, 0), 0);
    t.dev.run_until_idle(100).unwrap();
    assert_eq!(t.dev.srq_state(t.srq).unwrap(), (0, 1, 2), "consumed, but its CQE is not polled yet");
    assert_eq!(t.post_recvs(2..3).0, libc::ENOMEM);
    assert_eq!(poll(t.tcq, 4).len(), 1);
    assert_eq!(t.post_recvs(2..3), (0, None));
}

#[test]
fn the_srq_limit_fires_once_when_the_count_drops_below_it_then_is_disarmed() {
    let t = Target::new(cfg(), 1, 64, 64);
    assert_eq!(t.dev.modify_srq_limit(t.srq, 65).unwrap_err().errno(), libc::EINVAL, "above max_wr");
    assert_eq!(t.post_recvs(0..5), (0, None));
    t.dev.modify_srq_limit(t.srq, 3).unwrap();
    let fd = t.dev.async_fd();
    let mut seen = Vec::new();
    for k in 0..4 {
        assert_eq!(t.send(0, k, 0), 0);
        t.dev.run_until_idle(100).unwrap();
        let left = t.dev.srq_state(t.srq).unwrap().1;
        seen.push((left, readable(fd), events(&t.dev)));
    }
    let lim = AsyncEvent { event_type: ev::IBV_EVENT_SRQ_LIMIT_REACHED, element: AsyncElement::Srq(t.srq) };
    assert_eq!(seen[0], (4, false, vec![]));
    assert_eq!(seen[1], (3, false, vec![]), "3 is not below the limit of 3");
    assert_eq!(seen[2], (2, true, vec![lim]), "dropped below: one event, the fd was readable");
    assert_eq!(seen[3], (1, false, vec![]), "disarmed after firing");
    assert!(!readable(fd));
    assert_eq!(t.dev.srq_state(t.srq).unwrap().0, 0, "the limit reads 0 once fired (ibv_query_srq)");
    // Re-armed above the current count: the next take fires it.
    t.dev.modify_srq_limit(t.srq, 2).unwrap();
    assert_eq!(t.send(0, 9, 0), 0);
    t.dev.run_until_idle(100).unwrap();
    assert_eq!(events(&t.dev), vec![lim]);
}

#[test]
fn an_srq_qp_in_error_leaves_the_srq_receives_to_the_others_and_reports_its_last_wqe() {
    let t = Target::new(cfg(), 2, 64, 64);
    assert_eq!(t.post_recvs(0..4), (0, None));
    // The target QP 0 has a send WQE outstanding (a reply that never gets its ACK: the initiator is told nothing).
    assert_eq!(post1(t.t[0], wr(77, op::IBV_WR_SEND, SIGNALED, &[(t.src.addr(), 8, t.src_key)])), 0);
    t.dev.set_error(t.t[0]).unwrap();
    let wc = poll(t.tcq, 16);
    assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(77, st::IBV_WC_WR_FLUSH_ERR)], "its own send flushes; no SRQ receive does");
    assert_eq!(t.dev.srq_state(t.srq).unwrap().1, 4, "the SRQ keeps its receives");
    assert_eq!(events(&t.dev), vec![AsyncEvent { event_type: ev::IBV_EVENT_QP_LAST_WQE_REACHED, element: AsyncElement::Qp(t.t[0]) }]);
    // The other QP still receives from the SRQ.
    assert_eq!(t.send(1, 5, 0), 0);
    t.dev.run_until_idle(100).unwrap();
    assert_eq!(poll(t.tcq, 4).iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(0, st::IBV_WC_SUCCESS)]);
    // An injected fatal error: QP_FATAL first, then the last WQE.
    t.dev.inject(&SimFault::new(SQD_SIM_FAULT_QP_FATAL, t.t[1])).unwrap();
    let q1 = AsyncElement::Qp(t.t[1]);
    assert_eq!(
        events(&t.dev),
        vec![
            AsyncEvent { event_type: ev::IBV_EVENT_QP_FATAL, element: q1 },
            AsyncEvent { event_type: ev::IBV_EVENT_QP_LAST_WQE_REACHED, element: q1 },
        ]
    );
    t.dev.set_error(t.t[1]).unwrap();
    assert!(events(&t.dev).is_empty(), "raised once per QP");
    assert_eq!(t.dev.srq_state(t.srq).unwrap().1, 3);
}

#[test]
fn an_srq_error_raises_srq_err_and_puts_its_qps_in_error() {
    let t = Target::new(cfg(), 2, 64, 64);
    assert_eq!(t.post_recvs(0..4), (0, None));
    t.dev.srq_set_error(t.srq).unwrap();
    let e = events(&t.dev);
    assert_eq!(e[0], AsyncEvent { event_type: ev::IBV_EVENT_SRQ_ERR, element: AsyncElement::Srq(t.srq) });
    assert_eq!(e[1..].iter().map(|e| (e.event_type, e.element)).collect::<Vec<_>>(), vec![
        (ev::IBV_EVENT_QP_LAST_WQE_REACHED, AsyncElement::Qp(t.t[0])),
        (ev::IBV_EVENT_QP_LAST_WQE_REACHED, AsyncElement::Qp(t.t[1])),
    ]);
    assert!(t.dev.qp_in_error(t.t[0]).unwrap() && t.dev.qp_in_error(t.t[1]).unwrap());
    assert_eq!(t.post_recvs(10..11).0, libc::EINVAL, "an SRQ in error takes no receive");
}

// ---- asynchronous events ----------------------------------------------------------------------------------

#[test]
fn a_cq_overrun_raises_cq_err_and_the_cq_takes_no_cqe_afterwards_not_even_flushes() {
    let p = Pair::new(cfg(), 8, 2);
    let fd = p.dev.async_fd();
    assert!(!readable(fd));
    // Five signaled zero-length writes into a CQ of 2: the third CQE overruns it.
    for i in 0..5 {
        assert_eq!(post1(p.a, wr(i, op::IBV_WR_RDMA_WRITE, SIGNALED, &[]).rdma(0, 0)), 0);
    }
    p.dev.run_until_idle(200).unwrap();
    assert!(readable(fd), "events are pending");
    assert_eq!(
        events(&p.dev),
        vec![
            AsyncEvent { event_type: ev::IBV_EVENT_CQ_ERR, element: AsyncElement::Cq(p.a_cq) },
            AsyncEvent { event_type: ev::IBV_EVENT_QP_FATAL, element: AsyncElement::Qp(p.a) },
        ],
        "the CQ's only QP cannot be told by a CQE"
    );
    assert!(!readable(fd), "drained with the last event");
    assert!(p.dev.qp_in_error(p.a).unwrap() && !p.dev.qp_in_error(p.b).unwrap());
    let lost = p.dev.stats().cq_overruns;
    assert_eq!(lost, 3, "wr 2 overran; wr 3 and 4 (done or flushed) were lost too");
    // Later WRs flush at once (the QP is in error); their flush CQEs are lost as well.
    for i in 10..14 {
        assert_eq!(post1(p.a, wr(i, op::IBV_WR_RDMA_WRITE, 0, &[]).rdma(0, 0)), 0);
    }
    assert_eq!(p.dev.stats().cq_overruns, lost + 4, "flushes into a CQ in error are lost");
    // What was queued before the overrun is still in the CQ's memory; nothing after it.
    assert_eq!(poll(p.a_cq, 16).iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![0, 1]);
    assert!(poll(p.a_cq, 16).is_empty());
    assert!(p.dev.get_async_event().is_none(), "CQ_ERR is raised once");
}

#[test]
fn the_modelled_error_paths_raise_exactly_their_events() {
    let p = Pair::new(cfg(), 8, 64);
    // A WQE error is told by its CQE; the ULP's own set_error needs no event: nothing is raised.
    p.dev.inject(&SimFault { status: st::IBV_WC_LOC_PROT_ERR, ..SimFault::new(SQD_SIM_FAULT_FAIL_NEXT, p.a) }).unwrap();
    assert_eq!(post1(p.a, wr(1, op::IBV_WR_RDMA_WRITE, SIGNALED, &[]).rdma(0, 0)), 0);
    p.dev.run_until_idle(100).unwrap();
    assert!(p.dev.qp_in_error(p.a).unwrap());
    p.dev.set_error(p.b).unwrap();
    assert!(p.dev.get_async_event().is_none());
    assert_eq!(p.dev.stats().async_events, 0);
    // An injected fatal error at a later step: raised at that step, not before.
    let p = Pair::new(cfg(), 8, 64);
    p.dev.inject(&SimFault { at_step: 5, ..SimFault::new(SQD_SIM_FAULT_QP_FATAL, p.b) }).unwrap();
    p.dev.step(4);
    assert!(p.dev.get_async_event().is_none());
    p.dev.step(1);
    assert_eq!(p.dev.get_async_event(), Some(AsyncEvent { event_type: ev::IBV_EVENT_QP_FATAL, element: AsyncElement::Qp(p.b) }));
    // Events about a destroyed object are discarded with it.
    p.dev.inject(&SimFault::new(SQD_SIM_FAULT_QP_FATAL, p.a)).unwrap();
    p.dev.destroy_qp(p.a).unwrap();
    assert!(p.dev.get_async_event().is_none());
    assert!(!readable(p.dev.async_fd()));
}

// ---- completion channels ----------------------------------------------------------------------------------

struct Chan {
    p: Pair,
    ch: *mut ibv_comp_channel,
    cq: *mut ibv_cq,
}

/// A pair whose `a` has its send CQ on a completion channel (context 0xc0ffee).
fn chan(c: SimConfig) -> Chan {
    let p = Pair::new(c, 64, 64);
    let ch = p.dev.create_comp_channel().unwrap();
    let cq = p.dev.create_cq_ex(64, ch, 0xc0ffee as *mut _, 0).unwrap();
    let a = p.dev.create_qp(&mut qp_attr(cq, p.a_cq, 64, 4)).unwrap();
    let b = p.dev.create_qp(&mut qp_attr(p.b_cq, p.b_cq, 64, 64)).unwrap();
    p.dev.connect(a, b, &SimConnAttr::default()).unwrap();
    let mut p = p;
    p.a = a;
    p.b = b;
    Chan { p, ch, cq }
}

impl Chan {
    fn write(&self, id: u64) {
        assert_eq!(post1(self.p.a, wr(id, op::IBV_WR_RDMA_WRITE, SIGNALED, &[]).rdma(0, 0)), 0);
    }
    fn event(&self) -> Option<(*mut ibv_cq, usize)> {
        self.p.dev.get_cq_event(self.ch).ok().map(|(cq, ctx)| (cq, ctx as usize))
    }
}

#[test]
fn an_armed_cq_queues_one_event_on_its_channel_for_the_next_cqe_only() {
    let c = chan(cfg());
    // SAFETY: live objects made by the sim.
    let (chobj, cqobj) = unsafe { (&*c.ch, &*c.cq) };
    assert_eq!((chobj.context, chobj.refcnt, cqobj.channel, cqobj.cq_context as usize), (c.p.dev.context(), 1, c.ch, 0xc0ffee));
    assert_eq!(c.p.dev.create_cq_ex(4, c.ch, ptr::null_mut(), 1).unwrap_err().errno(), libc::EINVAL, "one comp vector");
    // Not armed: a CQE raises nothing.
    c.write(1);
    c.p.dev.run_until_idle(100).unwrap();
    assert!(!readable(chobj.fd));
    assert_eq!(c.p.dev.get_cq_event(c.ch).unwrap_err().errno(), libc::EAGAIN);
    // Armed with that CQE still unpolled: it does not count, only the next one fires.
    arm(c.cq, false);
    assert!(!readable(chobj.fd), "CQEs already in the CQ do not fire an armed CQ");
    c.write(2);
    c.p.dev.run_until_idle(100).unwrap();
    assert!(readable(chobj.fd));
    assert_eq!(c.event(), Some((c.cq, 0xc0ffee)));
    assert!(!readable(chobj.fd));
    assert!(c.event().is_none());
    // One shot: the next CQE raises nothing until re-armed.
    c.write(3);
    c.p.dev.run_until_idle(100).unwrap();
    assert!(c.event().is_none());
    assert_eq!(poll(c.cq, 8).iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![1, 2, 3]);
    // Unacknowledged events keep the CQ alive; the channel is busy while a CQ uses it.
    c.p.dev.destroy_qp(c.p.a).unwrap();
    assert_eq!(c.p.dev.destroy_comp_channel(c.ch).unwrap_err().errno(), libc::EBUSY);
    assert_eq!(c.p.dev.destroy_cq(c.cq).unwrap_err().errno(), libc::EBUSY);
    assert_eq!(c.p.dev.ack_cq_events(c.cq, 2).unwrap_err().errno(), libc::EINVAL, "only one was taken");
    c.p.dev.ack_cq_events(c.cq, 1).unwrap();
    assert_eq!(cqobj.comp_events_completed, 1);
    // An armed CQ's pending event leaves with it.
    c.p.dev.destroy_cq(c.cq).unwrap();
    c.p.dev.destroy_comp_channel(c.ch).unwrap();
}

#[test]
fn with_arm_pending_an_arm_over_unpolled_cqes_fires_at_once() {
    let mut config = cfg();
    config.flags |= SQD_SIM_ARM_PENDING;
    let c = chan(config);
    // SAFETY: a live channel.
    let fd = unsafe { (*c.ch).fd };
    arm(c.cq, false);
    assert!(!readable(fd), "an empty CQ: nothing to fire for");
    c.write(1);
    c.p.dev.run_until_idle(100).unwrap();
    assert_eq!(c.event(), Some((c.cq, 0xc0ffee)));
    // The CQE is still unpolled: the next arm fires at once, and only once.
    arm(c.cq, false);
    assert!(readable(fd), "an arm over an unpolled CQE fires at once");
    assert_eq!(c.event(), Some((c.cq, 0xc0ffee)));
    assert!(c.event().is_none());
    c.write(2);
    c.p.dev.run_until_idle(100).unwrap();
    assert!(c.event().is_none(), "one shot: the arm was spent");
    assert_eq!(poll(c.cq, 8).iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![1, 2]);
    // Polled empty: an arm waits for the next CQE again.
    arm(c.cq, false);
    assert!(c.event().is_none());
    c.write(3);
    c.p.dev.run_until_idle(100).unwrap();
    assert_eq!(c.event(), Some((c.cq, 0xc0ffee)));
    // A solicited-only arm is not fired by a pending plain send completion.
    c.write(4);
    c.p.dev.run_until_idle(100).unwrap();
    arm(c.cq, true);
    assert!(c.event().is_none(), "no pending CQE is solicited or failed");
    c.p.dev.ack_cq_events(c.cq, 3).unwrap();
}

#[test]
fn a_pending_event_is_discarded_with_its_cq_and_rearming_is_idempotent() {
    let c = chan(cfg());
    // SAFETY: a live channel.
    let fd = unsafe { (*c.ch).fd };
    arm(c.cq, false);
    arm(c.cq, false);
    c.write(1);
    c.write(2);
    c.p.dev.run_until_idle(100).unwrap();
    assert!(c.event().is_some());
    assert!(c.event().is_none(), "two arms before one CQE: still one event");
    arm(c.cq, false);
    c.write(3);
    c.p.dev.run_until_idle(100).unwrap();
    assert!(readable(fd));
    c.p.dev.ack_cq_events(c.cq, 1).unwrap();
    c.p.dev.destroy_qp(c.p.a).unwrap();
    c.p.dev.destroy_cq(c.cq).unwrap();
    assert!(!readable(fd), "the destroyed CQ's queued event is gone");
}

#[test]
fn solicited_only_fires_on_a_solicited_receive_or_an_error_not_on_other_cqes() {
    let p = Pair::new(cfg(), 16, 64);
    let ch = p.dev.create_comp_channel().unwrap();
    let rcq = p.dev.create_cq_ex(64, ch, ptr::null_mut(), 0).unwrap();
    let a = p.dev.create_qp(&mut qp_attr(p.a_cq, p.a_cq, 16, 16)).unwrap();
    let b = p.dev.create_qp(&mut qp_attr(rcq, rcq, 16, 16)).unwrap();
    p.dev.connect(a, b, &SimConnAttr::default()).unwrap();
    let buf = Buf::new(256, 7);
    let k = mr_keys(p.reg(&buf)).0;
    for i in 0..4 {
        assert_eq!(post_recv(b, 100 + i, &[(buf.addr() + 128, 64, k)]), 0);
    }
    let send = |id, flags| post1(a, wr(id, op::IBV_WR_SEND, SIGNALED | flags, &[(buf.addr(), 8, k)]));
    arm(rcq, true);
    // A successful send completion on b's CQ (b replies) and a plain receive: unsolicited, no event.
    assert_eq!(post1(b, wr(7, op::IBV_WR_RDMA_WRITE, SIGNALED, &[]).rdma(0, 0)), 0);
    assert_eq!(send(1, 0), 0);
    p.dev.run_until_idle(100).unwrap();
    assert_eq!(poll(rcq, 8).len(), 2);
    assert!(p.dev.get_cq_event(ch).is_err());
    // A solicited receive fires it.
    assert_eq!(send(2, SOLICITED), 0);
    p.dev.run_until_idle(100).unwrap();
    assert_eq!(p.dev.get_cq_event(ch).unwrap().0, rcq);
    p.dev.ack_cq_events(rcq, 1).unwrap();
    // An error completion fires it too (the QP's error flushes its receives).
    arm(rcq, true);
    p.dev.set_error(b).unwrap();
    assert_eq!(p.dev.get_cq_event(ch).unwrap().0, rcq);
    p.dev.ack_cq_events(rcq, 1).unwrap();
    // Arming for any CQE takes precedence over a pending solicited-only arm.
    arm(rcq, true);
    arm(rcq, false);
    assert_eq!(poll(rcq, 16).len(), 3);
    assert_eq!(post1(b, wr(8, op::IBV_WR_RDMA_WRITE, 0, &[]).rdma(0, 0)), 0, "a flushed post: an error CQE");
    assert!(p.dev.get_cq_event(ch).is_ok());
}

// ---- event mode: the classic race -------------------------------------------------------------------------

/// A sleeper that polls, finds nothing, and arms without polling again misses a CQE that landed in between:
/// the sim only fires for CQEs added after the arm, as the verbs contract says. Arm-then-poll finds it.
#[test]
fn a_cqe_landing_between_the_last_poll_and_the_arm_is_found_only_by_polling_after_arming() {
    for arm_then_poll in [false, true] {
        let c = chan(SimConfig { steps_per_poll: 0, ..cfg() });
        // SAFETY: a live channel.
        let fd = unsafe { (*c.ch).fd };
        c.write(1);
        assert!(poll(c.cq, 4).is_empty(), "polled before the HCA completed it");
        c.p.dev.run_until_idle(100).unwrap(); // the CQE lands now, between the empty poll and the arm
        arm(c.cq, false);
        let found = if arm_then_poll { poll(c.cq, 4).len() } else { 0 };
        // Nothing else will ever complete: sleeping now waits forever unless the poll after the arm found it.
        c.p.dev.step(50);
        let woken = readable(fd);
        if arm_then_poll {
            assert_eq!((found, woken), (1, false), "found by the poll after the arm");
        } else {
            assert_eq!((found, woken), (0, false), "the naive sleeper is never woken: its completion is stranded");
        }
    }
}

/// Many seeds: a ULP thread in event mode (arm, poll again, sleep on the channel fd with epoll) and a driver
/// thread advancing time with `step`. Every completion is reaped and no sleep outlasts the timeout.
#[test]
fn an_event_mode_sleeper_with_a_driver_thread_never_misses_a_completion() {
    for seed in 1..=12u64 {
        let c = chan(SimConfig { seed, steps_per_poll: 0, wire_delay_min: 1, wire_delay_max: 4, ..SimConfig::default() });
        // SAFETY: a live channel.
        let fd = unsafe { (*c.ch).fd };
        let dev: &SimDevice = &c.p.dev;
        let done = AtomicBool::new(false);
        let total = 120u64;
        let (qp, cq, ch) = (P(c.p.a), P(c.cq), P(c.ch));
        std::thread::scope(|s| {
            s.spawn(|| {
                while !done.load(Ordering::Acquire) {
                    dev.step(1);
                    std::thread::yield_now();
                }
            });
            let sleeper = s.spawn(move || {
                let (qp, cq, ch) = (qp, cq, ch); // whole wrappers, not their raw fields
                // SAFETY: plain system call.
                let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
                let mut e = libc::epoll_event { events: libc::EPOLLIN as u32, u64: 1 };
                // SAFETY: valid epoll fd, channel fd and event.
                assert_eq!(unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut e) }, 0);
                let (mut posted, mut reaped, mut sleeps, mut unacked) = (0u64, 0u64, 0u32, 0u32);
                while reaped < total {
                    while posted < total && posted - reaped < 8 {
                        assert_eq!(post1(qp.0, wr(posted, op::IBV_WR_RDMA_WRITE, SIGNALED, &[]).rdma(0, 0)), 0);
                        posted += 1;
                    }
                    let got = poll(cq.0, 16);
                    if !got.is_empty() {
                        reaped += got.len() as u64;
                        continue;
                    }
                    arm(cq.0, false);
                    let got = poll(cq.0, 16);
                    if !got.is_empty() {
                        reaped += got.len() as u64;
                        continue;
                    }
                    let mut out = libc::epoll_event { events: 0, u64: 0 };
                    // SAFETY: valid epoll fd and one output slot.
                    let n = unsafe { libc::epoll_wait(ep, &mut out, 1, 5000) };
                    assert_eq!(n, 1, "seed {seed}: slept 5 s with {} completions outstanding: one was missed", posted - reaped);
                    sleeps += 1;
                    let (ecq, _) = dev.get_cq_event(ch.0).expect("the fd was readable");
                    assert_eq!(ecq, cq.0);
                    unacked += 1;
                }
                dev.ack_cq_events(cq.0, unacked).unwrap();
                // SAFETY: our epoll fd.
                unsafe { libc::close(ep) };
                sleeps
            });
            let sleeps = sleeper.join();
            // The driver stops however the sleeper ended: a sleeper that panicked fails the test with its own
            // message rather than leaving the driver, and so the scope, running forever.
            done.store(true, Ordering::Release);
            let sleeps = sleeps.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            assert!(sleeps > 0, "seed {seed}: the sleeper never slept; the test proves nothing");
        });
    }
}

// ---- threads ----------------------------------------------------------------------------------------------

/// Two threads each drive their own QP pair and CQs (as two thread-safe sqdisc CQs would, each under its own
/// lock) while a third steps the device: the device lock serialises them; every completion arrives once.
#[test]
fn several_threads_on_one_device_are_serialised_by_the_device_lock() {
    let dev = SimDevice::new(&SimConfig { seed: 7, wire_delay_max: 3, ..SimConfig::default() }).unwrap();
    let buf = Buf::new(64, 1);
    // SAFETY: `buf` outlives the device.
    let k = mr_keys(unsafe { dev.reg_mr(buf.ptr().cast(), 64, ACCESS_ALL) }.unwrap()).0;
    type Side = (P<ibv_qp>, P<ibv_cq>);
    let pairs: Vec<(Side, Side)> = (0..2)
        .map(|_| {
            let (ca, cb) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
            let a = dev.create_qp(&mut qp_attr(ca, ca, 32, 32)).unwrap();
            let b = dev.create_qp(&mut qp_attr(cb, cb, 32, 32)).unwrap();
            dev.connect(a, b, &SimConnAttr::default()).unwrap();
            ((P(a), P(ca)), (P(b), P(cb)))
        })
        .collect();
    let dev: &SimDevice = &dev;
    let base = buf.addr();
    let done = AtomicUsize::new(0);
    let n = 2000u64;
    std::thread::scope(|s| {
        s.spawn(|| {
            while done.load(Ordering::Acquire) < 2 {
                dev.step(1);
                let _ = dev.stats();
            }
        });
        for &((a, ca), (b, cb)) in &pairs {
            let done = &done;
            s.spawn(move || {
                // Counted however the worker ends: a worker that panics stops the driver too, so the test fails
                // instead of running forever.
                let _done = CountOnDrop(done);
                let (a, ca, b, cb) = (a, ca, b, cb); // whole wrappers, not their raw fields
                let (mut posted, mut sends, mut recvs) = (0u64, 0u64, 0u64);
                while sends < n || recvs < n {
                    while posted < n && posted - sends < 16 {
                        assert_eq!(post_recv(b.0, posted, &[(base + 32, 8, k)]), 0);
                        assert_eq!(post1(a.0, wr(posted, op::IBV_WR_SEND, SIGNALED, &[(base, 8, k)])), 0);
                        posted += 1;
                    }
                    for w in poll(ca.0, 16) {
                        assert_eq!((w.wr_id, w.status), (sends, st::IBV_WC_SUCCESS));
                        sends += 1;
                    }
                    for w in poll(cb.0, 16) {
                        assert_eq!((w.wr_id, w.status), (recvs, st::IBV_WC_SUCCESS));
                        recvs += 1;
                    }
                }
            });
        }
    });
    let st = dev.stats();
    assert_eq!((st.wqes, st.recvs, st.violations), (2 * n, 2 * n, 0));
}

/// Adds one to the counter when dropped, on return or unwind.
struct CountOnDrop<'a>(&'a AtomicUsize);

impl Drop for CountOnDrop<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

// ---- scale ------------------------------------------------------------------------------------------------

/// 10,000 target QPs on one CQ and one SRQ, each receiving a SEND from its own initiator QP (10,000 more on one
/// CQ): creation, traffic, teardown. Idle QPs cost a step nothing.
#[test]
fn ten_thousand_qps_on_one_cq_and_one_srq() {
    const N: usize = 10_000;
    let t0 = Instant::now();
    let t = Target::new(cfg(), N, 32768, 2 * N as i32);
    let created = t0.elapsed();
    for chunk in 0..(N as u64 / 1000) {
        assert_eq!(t.post_recvs(chunk * 1000..(chunk + 1) * 1000), (0, None));
    }
    let t1 = Instant::now();
    let before = t.dev.stats().qp_ticks;
    t.dev.step(100);
    assert_eq!(t.dev.stats().qp_ticks, before, "20,000 idle QPs: a step visits none of them");
    for k in 0..N {
        assert_eq!(t.send(k, k as u64, 0), 0);
    }
    let (mut sends, mut recvs) = (0, 0);
    let mut qps_seen = std::collections::HashSet::new();
    for _ in 0..10_000 {
        for w in poll(t.icq, 4096) {
            assert_eq!(w.status, st::IBV_WC_SUCCESS);
            sends += 1;
        }
        for w in poll(t.tcq, 4096) {
            assert_eq!((w.status, w.byte_len), (st::IBV_WC_SUCCESS, 32));
            qps_seen.insert(w.qp_num);
            recvs += 1;
        }
        if sends == N && recvs == N {
            break;
        }
    }
    assert_eq!((sends, recvs, qps_seen.len()), (N, N, N));
    let st = t.dev.stats();
    let traffic = t1.elapsed();
    // Every QP is visited a few steps around its one message (transmit, ACK, completion), not every step.
    assert!(st.qp_ticks < 10 * 2 * N as u64, "{} QP visits for {N} messages", st.qp_ticks);
    let before = st.qp_ticks;
    t.dev.step(100);
    assert_eq!(t.dev.stats().qp_ticks, before, "idle again: steps visit nothing");
    assert_eq!(t.dev.srq_state(t.srq).unwrap(), (0, 0, 0));
    let t2 = Instant::now();
    for k in 0..N {
        t.dev.destroy_qp(t.i[k]).unwrap();
        t.dev.destroy_qp(t.t[k]).unwrap();
    }
    t.dev.destroy_srq(t.srq).unwrap();
    t.dev.destroy_cq(t.icq).unwrap();
    t.dev.destroy_cq(t.tcq).unwrap();
    eprintln!(
        "10,000 QP pairs on one CQ each side and one SRQ: create {:?}, traffic {:?} ({} steps, {} QP visits), teardown {:?}",
        created,
        traffic,
        st.steps,
        st.qp_ticks,
        t2.elapsed()
    );
}
