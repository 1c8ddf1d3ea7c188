//! The releases of a managed SRQ's receives: in the order their CQEs are reaped, once each, through the SRQ's
//! release handler; a receive reaped from one of its callbacks (a poll of another CQ) is handed out after it
//! by the same pass; the low-watermark callback runs after the pass, once.

mod sim_support;

use std::cell::RefCell;
use std::rc::Rc;

use rdma_sys::{ibv_qp, ibv_srq_init_attr};
use sim_support::*;
use sqdisc::verbs::{CqHandle, QpHandle, SrqHandle};
use sqdisc::{Completion, Cq, Queue, QueueConfig, ReleaseHandler, Srq};
use sqdisc_sim::{SimConfig, SimConnAttr, SimDevice};

type Log = Rc<RefCell<Vec<String>>>;
type Hook = Rc<RefCell<Option<Box<dyn Fn(&Completion)>>>>;

/// Two senders, each connected to a receiver whose receives come from one managed SRQ; each receiver's
/// managed queue completes on a CQ of its own. Fields drop in order: the library's objects, then the device.
struct Srqs {
    queues: Vec<Queue>,
    srq: Srq,
    cqs: Rc<Vec<Cq>>,
    senders: [*mut ibv_qp; 2],
    sender_cq: *mut rdma_sys::ibv_cq,
    lkey: u32,
    log: Log,
    hook: Hook,
    _dev: std::pin::Pin<Box<SimDevice>>,
    buf: Buf,
}

impl Drop for Srqs {
    fn drop(&mut self) {
        self.hook.borrow_mut().take();
        self.queues.clear();
    }
}

fn srqs(low_watermark: u32) -> Srqs {
    let buf = Buf::new(4096, 0);
    let dev = SimDevice::new(&SimConfig { wire_delay_min: 1, wire_delay_max: 1, ..SimConfig::default() }).unwrap();
    // SAFETY: `buf` outlives the device (declared after it in `Srqs`, dropped after it).
    let lkey = mr_keys(unsafe { dev.reg_mr(buf.ptr().cast(), buf.len(), ACCESS_ALL) }.unwrap()).0;
    let sender_cq = dev.create_cq(64).unwrap();
    // SAFETY: plain data; all-zero is valid.
    let mut sa: ibv_srq_init_attr = unsafe { std::mem::zeroed() };
    sa.attr.max_wr = 8;
    sa.attr.max_sge = 1;
    let srq_raw = dev.create_srq(&mut sa).unwrap();
    let log: Log = Rc::default();
    let hook: Hook = Rc::default();
    let (l, h) = (log.clone(), hook.clone());
    let handler = ReleaseHandler::Closure(Box::new(move |c: &Completion| {
        l.borrow_mut().push(if c.status == 0 { format!("r{}", c.wr_id) } else { format!("r{}!{}", c.wr_id, c.status) });
        let h = h.clone();
        if let Some(f) = h.borrow().as_ref() {
            f(c);
        };
    }));
    let l = log.clone();
    let low = Box::new(move |posted: u32| l.borrow_mut().push(format!("low {posted}")));
    // SAFETY: the SRQ lives as long as the device, which outlives the managed SRQ.
    let srq = Srq::new(unsafe { SrqHandle::from_raw(srq_raw) }.unwrap(), 8, Some(handler), low_watermark, Some(low)).unwrap();
    let mut senders = [std::ptr::null_mut(); 2];
    let mut cqs = Vec::new();
    let mut queues = Vec::new();
    for s in &mut senders {
        *s = dev.create_qp(&mut qp_attr(sender_cq, sender_cq, 8, 8)).unwrap();
        let cq = dev.create_cq(64).unwrap();
        let mut ta = qp_attr(cq, cq, 8, 0);
        ta.srq = srq_raw;
        let t = dev.create_qp(&mut ta).unwrap();
        dev.connect(*s, t, &SimConnAttr::default()).unwrap();
        // SAFETY: the CQ and QP live as long as the device.
        let mcq = Cq::new(unsafe { CqHandle::from_raw(cq) }.unwrap());
        let qcfg = QueueConfig { sq_depth: 8, max_send_sge: 1, ..QueueConfig::default() };
        // SAFETY: as above.
        queues.push(Queue::with_srq(&mcq, &mcq, &srq, unsafe { QpHandle::from_raw(t) }.unwrap(), qcfg, None).unwrap());
        cqs.push(mcq);
    }
    Srqs { queues, srq, cqs: Rc::new(cqs), senders, sender_cq, lkey, log, hook, _dev: dev, buf }
}

impl Srqs {
    fn post_recvs(&self, ids: std::ops::Range<u64>) {
        post_srq_recvs(&self.srq, ids, self.buf.addr(), self.lkey);
    }
    /// A SEND from sender `k`, stepped until the receiver took it (the sender's CQE: RC acknowledged it).
    fn send(&self, k: usize) {
        let w = wr(100 + k as u64, op::IBV_WR_SEND, SIGNALED, &[(self.buf.addr() + 2048, 16, self.lkey)]);
        assert_eq!(post1(self.senders[k], w), 0);
        assert_eq!(poll_n(self.sender_cq, 1, 100).len(), 1, "the SEND completed");
    }
    fn log(&self) -> Vec<String> {
        self.log.borrow().clone()
    }
}

fn post_srq_recvs(srq: &Srq, ids: std::ops::Range<u64>, addr: u64, lkey: u32) {
    let ids: Vec<u64> = ids.collect();
    let sges: Vec<(u64, u32, u32)> = ids.iter().map(|_| (addr, 64, lkey)).collect();
    post_recv_chain(&ids, &sges, |c| srq.post_recv(c).map_err(|e| (e.error.errno(), e.bad.as_ptr()))).unwrap();
}

/// One poll of a managed CQ: the wr_ids shown, every one a success.
fn shown(cq: &Cq) -> Vec<u64> {
    let wcs = qpoll(cq);
    assert!(wcs.iter().all(|w| w.status == st::IBV_WC_SUCCESS), "{wcs:?}");
    wcs.iter().map(|w| w.wr_id).collect()
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn srq_receives_are_released_in_order_and_the_low_watermark_runs_after_the_pass() {
    let s = srqs(3);
    s.post_recvs(0..4);
    s.send(0);
    s.send(0);
    assert_eq!(shown(&s.cqs[0]), vec![0, 1]);
    assert_eq!(s.log(), strs(&["r0", "r1", "low 2"]));
    assert_eq!(s.srq.stats().low_events, 1);
}

#[test]
fn a_receive_reaped_from_an_srq_callback_is_released_after_it_by_the_same_pass() {
    let s = srqs(3);
    s.post_recvs(0..4);
    s.send(0);
    s.send(1);
    let (cqs, log) = (s.cqs.clone(), s.log.clone());
    *s.hook.borrow_mut() = Some(Box::new(move |c: &Completion| {
        if c.wr_id == 0 {
            // The other receiver's CQ: its CQE names the SRQ's next receive, whose release this pass hands out.
            let ids = shown(&cqs[1]);
            log.borrow_mut().push(format!("polled {ids:?}"));
        }
    }));
    assert_eq!(shown(&s.cqs[0]), vec![0]);
    assert_eq!(s.log(), strs(&["r0", "polled [1]", "r1", "low 2"]));
    // A refill arms the watermark again: crossed again by the next pass, after its releases.
    s.post_recvs(4..6);
    s.send(1);
    s.send(0);
    assert_eq!(shown(&s.cqs[1]), vec![2]);
    assert_eq!(shown(&s.cqs[0]), vec![3]);
    assert_eq!(s.log(), strs(&["r0", "polled [1]", "r1", "low 2", "r2", "r3", "low 2"]));
    assert_eq!(s.srq.stats().low_events, 2);
    assert_eq!(s.srq.stats().cqes, 4);
    assert_eq!(s.srq.stats().stray_cqes, 0);
}
