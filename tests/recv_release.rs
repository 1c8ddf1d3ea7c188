//! The release pass of a queue with its own RQ: receives are released in order and exactly once, after the
//! sends due before them, whatever their callbacks do (post a send that completes in the same poll, poll,
//! defer an action, drain the queue), with each receive's completion whole; and a failed queue's receives
//! are flushed in order. Each scenario runs with the per-WR handler alone and with a batch handler too.

mod common;

use std::cell::RefCell;
use std::pin::Pin;
use std::rc::Rc;

use common::*;
use rdma_sys::{ibv_cq, ibv_qp, ibv_wc};
use sqdisc::verbs::{CqHandle, QpHandle, SendChain};
use sqdisc::{Completion, Cq, Deferred, Queue, QueueConfig, ReleaseBatch, ReleaseHandler, SQD_COMPLETION_RECV};
use sqdisc_sim::scripted::{ScriptedDevice, ScriptedQpCaps};

/// What the callbacks run from a release, after it is logged.
type Hook = Rc<RefCell<Option<Box<dyn Fn(&Rc<World>, &Completion)>>>>;

/// A managed queue with an RQ on a scripted device, its receives on the send CQ or on a CQ of their own. The
/// callbacks reach the queue, the CQs and the device through it (a callback may poll the other CQ, not its
/// own). Fields drop in order: the queue (taken out of its slot) before the CQs, the CQs before the device.
struct World {
    queue: RefCell<Option<Queue>>,
    cq: Cq,
    /// The receive CQ, if not `cq`.
    recv_cq: Option<Cq>,
    qp: *mut ibv_qp,
    dev: Pin<Box<ScriptedDevice>>,
    /// Every release and deferred action, in the order they ran: `r<wr_id>` a receive, `s<wr_id>` a send (with
    /// `!<status>` if not a success), `b[..]` a batch, `<name>` an action.
    log: RefCell<Vec<String>>,
    /// Every receive's completion, whole.
    recvs: RefCell<Vec<Completion>>,
    hook: Hook,
}

impl Drop for World {
    fn drop(&mut self) {
        self.hook.borrow_mut().take();
        self.queue.borrow_mut().take();
    }
}

fn name(c: &Completion) -> String {
    let kind = if c.is_recv() { 'r' } else { 's' };
    if c.status == WC_SUCCESS {
        format!("{kind}{}", c.wr_id)
    } else {
        format!("{kind}{}!{}", c.wr_id, c.status)
    }
}

/// A world of `cfg` (`rq_depth` receives) whose releases go to its log, through a batch handler too if
/// `batched`, with a receive CQ of its own if `split`.
fn world(cfg: QueueConfig, batched: bool, split: bool) -> Rc<World> {
    let dev = ScriptedDevice::new();
    let cq_raw: *mut ibv_cq = dev.create_cq(256).unwrap();
    let recv_raw: *mut ibv_cq = if split { dev.create_cq(256).unwrap() } else { cq_raw };
    let caps = ScriptedQpCaps {
        max_send_wr: cfg.sq_depth,
        max_recv_wr: cfg.rq_depth,
        max_send_sge: cfg.max_send_sge,
        max_recv_sge: 4,
        max_inline_data: cfg.max_inline_data,
    };
    let qp = dev.create_qp(cq_raw, recv_raw, &caps).unwrap();
    // SAFETY: the CQs and QP live as long as the device, which the world drops last.
    let cq = Cq::new(unsafe { CqHandle::from_raw(cq_raw) }.unwrap());
    // SAFETY: as above.
    let recv_cq = split.then(|| Cq::new(unsafe { CqHandle::from_raw(recv_raw) }.unwrap()));
    let w = Rc::new(World {
        queue: RefCell::new(None),
        cq,
        recv_cq,
        qp,
        dev,
        log: RefCell::default(),
        recvs: RefCell::default(),
        hook: Rc::default(),
    });
    // The handlers hold the world weakly: it owns the queue, which owns them.
    let weak = Rc::downgrade(&w);
    let handler = ReleaseHandler::Closure(Box::new(move |c: &Completion| {
        let w = weak.upgrade().expect("the world outlives its queue");
        w.log.borrow_mut().push(name(c));
        if c.is_recv() {
            w.recvs.borrow_mut().push(*c);
        }
        let hook = w.hook.clone();
        if let Some(f) = hook.borrow().as_ref() {
            f(&w, c);
        };
    }));
    // SAFETY: as above.
    let qh = unsafe { QpHandle::from_raw(qp) }.unwrap();
    let q = Queue::new(&w.cq, Some(w.recv_cq.as_ref().unwrap_or(&w.cq)), qh, cfg, Some(handler)).unwrap();
    if batched {
        let weak = Rc::downgrade(&w);
        q.set_release_batch(Box::new(move |b: &ReleaseBatch<'_>| {
            let w = weak.upgrade().expect("the world outlives its queue");
            let mut log = w.log.borrow_mut();
            for id in b.wr_ids {
                log.push(if b.status == WC_SUCCESS { format!("s{id}") } else { format!("s{id}!{}", b.status) });
            }
        }))
        .unwrap();
    }
    *w.queue.borrow_mut() = Some(q);
    w
}

impl World {
    fn with_q<T>(&self, f: impl FnOnce(&Queue) -> T) -> T {
        f(self.queue.borrow().as_ref().expect("the queue is set"))
    }
    fn post_sends(&self, ids: std::ops::Range<u64>) {
        let mut chain = Chain::sends(ids, SIGNALED);
        let head = chain.link();
        // SAFETY: the chain lives here for the whole call.
        self.with_q(|q| q.post_send(unsafe { SendChain::from_raw(head) }).map_err(|e| e.error.errno())).unwrap();
    }
    fn post_recvs(&self, ids: std::ops::Range<u64>) {
        self.with_q(|q| post_recv_chain(q, ids, 64)).unwrap();
    }
    /// One poll of the send CQ, up to `room` CQEs; the wr_ids shown.
    fn poll(&self, room: usize) -> Vec<u64> {
        poll(&self.cq, room)
    }
    /// The same on the receive CQ.
    fn poll_recv(&self, room: usize) -> Vec<u64> {
        poll(self.recv_cq.as_ref().unwrap_or(&self.cq), room)
    }
    fn set_hook(&self, f: impl Fn(&Rc<World>, &Completion) + 'static) {
        *self.hook.borrow_mut() = Some(Box::new(f));
    }
    fn log(&self) -> Vec<String> {
        self.log.borrow().clone()
    }
    fn note(&self, s: &str) {
        self.log.borrow_mut().push(s.to_owned());
    }
    fn assert_clean(&self) {
        assert_eq!(self.dev.violations(), Vec::<String>::new());
        let s = self.with_q(|q| q.stats());
        assert_eq!(s.stray_cqes, 0, "{s:?}");
    }
}

fn poll(cq: &Cq, room: usize) -> Vec<u64> {
    // SAFETY: all-zero is a valid `ibv_wc`.
    let mut wc: Vec<ibv_wc> = (0..room).map(|_| unsafe { std::mem::zeroed() }).collect();
    let n = cq.poll(&mut wc).unwrap();
    wc[..n].iter().map(|w| w.wr_id).collect()
}

fn cfg() -> QueueConfig {
    let mut c = config(8, 1, 8);
    c.rq_depth = 8;
    c
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// A receive's callback posts a send, completes it and polls the send CQ: the nested poll shows the send and
/// releases nothing (re-entry returns at once); the outer pass releases the send right after the receive whose
/// callback posted it, then the next receive.
fn a_receive_callback_posts_a_send_that_completes_in_the_same_poll(batched: bool) {
    let w = world(cfg(), batched, true);
    w.post_recvs(0..4);
    let nested: Rc<RefCell<Vec<Vec<u64>>>> = Rc::default();
    let n = nested.clone();
    w.set_hook(move |w, c| {
        if c.is_recv() && c.wr_id < 2 {
            w.post_sends(100 + c.wr_id..101 + c.wr_id);
            w.dev.complete(w.qp, usize::MAX).unwrap();
            n.borrow_mut().push(w.poll(8));
            w.note("polled");
        }
    });
    for _ in 0..3 {
        w.dev.deliver(w.qp, 64, None).unwrap();
    }
    assert_eq!(w.poll_recv(8), vec![0, 1, 2]);
    assert_eq!(*nested.borrow(), vec![vec![100], vec![101]], "the nested polls reap the sends");
    assert_eq!(w.log(), strs(&["r0", "polled", "s100", "r1", "polled", "s101", "r2"]));
    // Nothing was left due or released twice.
    assert!(w.poll(8).is_empty());
    w.dev.deliver(w.qp, 64, None).unwrap();
    assert_eq!(w.poll_recv(8), vec![3]);
    assert_eq!(w.log(), strs(&["r0", "polled", "s100", "r1", "polled", "s101", "r2", "r3"]));
    w.assert_clean();
}

/// A receive's callback posts a send that completes on the receive CQ's poll (one CQ): the poll reaps it after
/// the receives before it and releases it then.
fn a_send_posted_by_a_receive_callback_completes_in_the_same_poll_of_one_cq(batched: bool) {
    let w = world(cfg(), batched, false);
    w.post_recvs(0..4);
    w.set_hook(move |w, c| {
        if c.is_recv() && c.wr_id < 2 {
            w.post_sends(100 + c.wr_id..101 + c.wr_id);
            w.dev.complete(w.qp, usize::MAX).unwrap();
        }
    });
    w.dev.deliver(w.qp, 64, None).unwrap();
    w.dev.deliver(w.qp, 64, None).unwrap();
    let mut all = w.poll(8);
    all.extend(w.poll(8));
    all.extend(w.poll(8));
    assert_eq!(all, vec![0, 1, 100, 101]);
    assert_eq!(w.log(), strs(&["r0", "r1", "s100", "s101"]));
    w.assert_clean();
}

/// A receive's callback defers an action: due at once (nothing outstanding), it runs after that receive and
/// before the next; due after a send the callback posted and completed (polling the send CQ), after that send.
fn a_receive_callback_defers_an_action(batched: bool) {
    let w = world(cfg(), batched, true);
    w.post_recvs(0..4);
    w.set_hook(move |w, c| {
        if !c.is_recv() {
            return;
        }
        let tag = format!("a{}", c.wr_id);
        let weak = Rc::downgrade(w);
        let run = move || weak.upgrade().expect("alive").note(&tag);
        match c.wr_id {
            0 => w.with_q(|q| q.defer(Deferred::Closure(Box::new(run)))).unwrap(),
            1 => {
                w.post_sends(100..101);
                w.with_q(|q| q.defer(Deferred::Closure(Box::new(run)))).unwrap();
                w.dev.complete(w.qp, usize::MAX).unwrap();
                w.poll(8);
            }
            2 => {
                // Due after a send that completes only on the next poll of the send CQ.
                w.post_sends(101..102);
                w.with_q(|q| q.defer(Deferred::Closure(Box::new(run)))).unwrap();
            }
            _ => {}
        }
    });
    for _ in 0..4 {
        w.dev.deliver(w.qp, 64, None).unwrap();
    }
    assert_eq!(w.poll_recv(8), vec![0, 1, 2, 3]);
    assert_eq!(w.log(), strs(&["r0", "a0", "r1", "s100", "a1", "r2", "r3"]));
    w.dev.complete(w.qp, usize::MAX).unwrap();
    assert_eq!(w.poll(8), vec![101]);
    assert_eq!(w.log(), strs(&["r0", "a0", "r1", "s100", "a1", "r2", "r3", "s101", "a2"]));
    assert_eq!(w.with_q(|q| q.stats()).deferred, 0);
    w.assert_clean();
}

/// Receives and sends completing in one poll, either one first: released in the CQ's order, each once.
fn receives_and_sends_complete_in_one_poll_in_either_order(batched: bool) {
    let w = world(cfg(), batched, false);
    w.post_recvs(0..4);
    // A send, then two receives, then a send.
    w.post_sends(100..101);
    w.dev.complete(w.qp, usize::MAX).unwrap();
    w.dev.deliver(w.qp, 64, None).unwrap();
    w.dev.deliver(w.qp, 64, None).unwrap();
    w.post_sends(101..102);
    w.dev.complete(w.qp, usize::MAX).unwrap();
    assert_eq!(w.poll(8), vec![100, 0, 1, 101]);
    assert_eq!(w.log(), strs(&["s100", "r0", "r1", "s101"]));
    // A receive, then two sends, then a receive, in a CQ polled one CQE at a time and then whole.
    w.dev.deliver(w.qp, 64, None).unwrap();
    w.post_sends(102..104);
    w.dev.complete(w.qp, usize::MAX).unwrap();
    w.dev.deliver(w.qp, 64, None).unwrap();
    assert_eq!(w.poll(1), vec![2]);
    assert_eq!(w.poll(8), vec![102, 103, 3]);
    assert_eq!(w.log(), strs(&["s100", "r0", "r1", "s101", "r2", "s102", "s103", "r3"]));
    let recvs = w.recvs.borrow();
    for c in recvs.iter() {
        assert_eq!(
            (c.status, c.opcode, c.vendor_err, c.flags, c.invalidated_rkey, c.modified_sge),
            (WC_SUCCESS, WC_RECV, 0, SQD_COMPLETION_RECV, 0, 0),
            "{c:?}"
        );
    }
    drop(recvs);
    w.assert_clean();
}

/// A send fails the queue while receives are posted: the receive completed before the error is released as a
/// success, the sends and the rest of the receives flushed, each in order and once; a receive's callback that
/// drains the queue does not stop the receives behind it.
fn a_failed_queues_receives_are_flushed_in_order(batched: bool) {
    let w = world(cfg(), batched, false);
    w.post_recvs(0..4);
    w.post_sends(100..103);
    w.dev.deliver(w.qp, 64, None).unwrap();
    w.set_hook(move |w, c| {
        if c.is_recv() && c.wr_id == 1 {
            let r = w.with_q(|q| q.drain().map_err(|e| e.errno()));
            w.note(&format!("drain {r:?}"));
        }
    });
    w.dev.fail(w.qp, WC_REM_ACCESS_ERR, 9).unwrap();
    for _ in 0..4 {
        w.poll(8);
    }
    let log = w.log();
    assert_eq!(
        log,
        strs(&["r0", "s100!10", "s101!5", "s102!5", "r1!5", &format!("drain Err({})", libc::EINPROGRESS), "r2!5", "r3!5"])
    );
    let recvs = w.recvs.borrow();
    assert_eq!(recvs.iter().map(|c| (c.wr_id, c.status, c.vendor_err)).collect::<Vec<_>>(), vec![(0, 0, 0), (1, 5, 0), (2, 5, 0), (3, 5, 0)]);
    assert!(recvs.iter().all(|c| c.flags == SQD_COMPLETION_RECV), "{recvs:?}");
    drop(recvs);
    w.with_q(|q| q.drain()).unwrap();
    w.with_q(|q| q.check_free()).unwrap();
    w.assert_clean();
}

/// A receive's callback fails the queue (a send it posts completes with an error, reaped by its poll of the
/// send CQ): the send's release follows that receive; the receive completed before and the flushed ones follow
/// in order, each once.
fn a_receive_callback_fails_the_queue(batched: bool) {
    let w = world(cfg(), batched, true);
    w.post_recvs(0..4);
    w.set_hook(move |w, c| {
        if c.is_recv() && c.wr_id == 0 {
            w.post_sends(100..101);
            w.dev.fail(w.qp, WC_REM_ACCESS_ERR, 3).unwrap();
            assert_eq!(w.poll(8), vec![100]);
        }
    });
    w.dev.deliver(w.qp, 64, None).unwrap();
    w.dev.deliver(w.qp, 64, None).unwrap();
    let mut shown = Vec::new();
    for _ in 0..4 {
        shown.extend(w.poll_recv(8));
    }
    assert_eq!(shown, vec![0, 1, 2, 3]);
    assert_eq!(w.log(), strs(&["r0", "s100!10", "r1", "r2!5", "r3!5"]));
    assert_eq!(w.recvs.borrow().iter().map(|c| (c.wr_id, c.status, c.vendor_err)).collect::<Vec<_>>(), vec![(0, 0, 0), (1, 0, 0), (2, 5, 0), (3, 5, 0)]);
    w.with_q(|q| q.drain()).unwrap();
    w.assert_clean();
}

/// A receive's callback posts a receive and the device completes it at once: released after it, once, by the
/// poll that reaps its CQE.
fn a_receive_callback_posts_a_receive_that_completes_at_once(batched: bool) {
    let w = world(cfg(), batched, true);
    w.post_recvs(0..1);
    w.set_hook(move |w, c| {
        if c.is_recv() && c.wr_id < 5 {
            w.post_recvs(c.wr_id + 1..c.wr_id + 2);
            w.dev.deliver(w.qp, 64, None).unwrap();
        }
    });
    w.dev.deliver(w.qp, 64, None).unwrap();
    let mut shown = Vec::new();
    for _ in 0..8 {
        shown.extend(w.poll_recv(4));
    }
    assert_eq!(shown, (0..6).collect::<Vec<_>>());
    assert_eq!(w.log(), strs(&["r0", "r1", "r2", "r3", "r4", "r5"]));
    w.assert_clean();
}

macro_rules! both_handlers {
    ($($name:ident),* $(,)?) => {
        mod per_wr {
            $(#[test] fn $name() { super::run(super::$name, false) })*
        }
        mod batched {
            $(#[test] fn $name() { super::run(super::$name, true) })*
        }
    };
}

fn run(f: fn(bool), batched: bool) {
    f(batched)
}

both_handlers!(
    a_receive_callback_posts_a_send_that_completes_in_the_same_poll,
    a_send_posted_by_a_receive_callback_completes_in_the_same_poll_of_one_cq,
    a_receive_callback_defers_an_action,
    receives_and_sends_complete_in_one_poll_in_either_order,
    a_failed_queues_receives_are_flushed_in_order,
    a_receive_callback_posts_a_receive_that_completes_at_once,
    a_receive_callback_fails_the_queue,
);
