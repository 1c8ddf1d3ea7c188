//! A provider that completes out of RC order: a CQE for a WQE the library already retired, because the CQE of
//! a later WQE came first (no RC QP may do that). The library keeps the first such completion where the ULP can
//! read it, describes it once, and shows the late completion of a WR the ULP signaled, which the later CQE
//! retired without showing it.

mod common;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use common::*;
use rdma_sys::{ibv_cq, ibv_wc};
use sqdisc_sim::scripted::{ScriptedDevice, ScriptedQpCaps};
use sqdisc::verbs::{CqHandle, PollFn, QpHandle, SendChain};
use sqdisc::{Cq, Queue, SQD_COMPLETION_IMPLIED};

const WC_RDMA_READ: u32 = 2;

/// The scripted CQ's own poll op, and what the reordering poll holds: the CQEs polled from it and not yet
/// returned, and how many of the next CQEs to move behind the one after them.
struct Reorder {
    original: Option<PollFn>,
    queue: VecDeque<ibv_wc>,
    swaps: usize,
}

thread_local! {
    static REORDER: RefCell<Reorder> = const { RefCell::new(Reorder { original: None, queue: VecDeque::new(), swaps: 0 }) };
}

/// A poll op that returns the scripted device's CQEs, except that while `swaps` is set, each pair of CQEs it
/// meets comes back in the opposite order (the later WQE's first).
unsafe extern "C" fn reordering_poll(cq: *mut ibv_cq, n: i32, wc: *mut ibv_wc) -> i32 {
    REORDER.with(|r| {
        let mut r = r.borrow_mut();
        let original = r.original.unwrap();
        // SAFETY: all-zero is a valid `ibv_wc`.
        let mut buf: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: the scripted CQ's own op, with room for 16.
            let got = unsafe { original(cq, 16, buf.as_mut_ptr()) };
            assert!(got >= 0);
            for w in &buf[..got as usize] {
                // SAFETY: `ibv_wc` is plain data.
                r.queue.push_back(unsafe { std::ptr::read(w) });
            }
            if got < 16 {
                break;
            }
        }
        let mut out = Vec::new();
        while r.swaps > 0 && r.queue.len() >= 2 {
            let (a, b) = (r.queue.pop_front().unwrap(), r.queue.pop_front().unwrap());
            out.extend([b, a]);
            r.swaps -= 1;
        }
        out.extend(r.queue.drain(..));
        let k = out.len().min(n as usize);
        for (i, w) in out.drain(..k).enumerate() {
            // SAFETY: `wc` has room for `n` entries.
            unsafe { *wc.add(i) = w };
        }
        for w in out.into_iter().rev() {
            r.queue.push_front(w);
        }
        k as i32
    })
}

struct OooRig {
    queue: Option<Queue>,
    cq: Cq,
    log: Log,
    qp: *mut rdma_sys::ibv_qp,
    dev: std::pin::Pin<Box<ScriptedDevice>>,
}

impl OooRig {
    fn new(sq_depth: u32, signal_interval: u32) -> OooRig {
        let dev = ScriptedDevice::new();
        let cq_raw = dev.create_cq(64).unwrap();
        // SAFETY: a live scripted CQ: its context's ops are the device's.
        let original = unsafe { (*(*cq_raw).context).ops.poll_cq }.unwrap();
        REORDER.with(|r| *r.borrow_mut() = Reorder { original: Some(original), queue: VecDeque::new(), swaps: 0 });
        // SAFETY: the CQ lives as long as the device; `reordering_poll` calls the device's own op.
        let cq = Cq::new(unsafe { CqHandle::from_raw_with_ops(cq_raw, reordering_poll, None) }.unwrap());
        let qp = dev.create_qp(cq_raw, cq_raw, &ScriptedQpCaps::with_depths(sq_depth, 1)).unwrap();
        let log: Log = Rc::default();
        // SAFETY: the QP lives as long as the device.
        let qh = unsafe { QpHandle::from_raw(qp) }.unwrap();
        let queue = Queue::new(&cq, None, qh, config(sq_depth, signal_interval, 0), Some(logger(&log))).unwrap();
        OooRig { queue: Some(queue), cq, log, qp, dev }
    }

    fn released_ids(&self) -> Vec<u64> {
        self.log.borrow().iter().map(|c| c.wr_id).collect()
    }

    fn q(&self) -> &Queue {
        self.queue.as_ref().unwrap()
    }

    fn post(&self, chain: &mut Chain) {
        let head = chain.link();
        // SAFETY: the chain lives in `chain` for the whole call.
        self.q().post_send(unsafe { SendChain::from_raw(head) }).unwrap();
    }

    /// Completes every WQE, then polls until the CQ is empty: (wr_id, status, opcode) of what is shown.
    fn complete_and_poll(&self, swaps: usize) -> Vec<(u64, u32, u32)> {
        REORDER.with(|r| r.borrow_mut().swaps = swaps);
        self.dev.complete(self.qp, usize::MAX).unwrap();
        let mut shown = Vec::new();
        loop {
            // SAFETY: all-zero is a valid `ibv_wc`.
            let mut wc: [ibv_wc; 4] = unsafe { std::mem::zeroed() };
            let n = self.cq.poll(&mut wc).unwrap();
            shown.extend(wc[..n].iter().map(|w| (w.wr_id, w.status, w.opcode)));
            if n < wc.len() {
                return shown;
            }
        }
    }
}

impl Drop for OooRig {
    fn drop(&mut self) {
        self.queue.take();
    }
}

/// The ULP signaled a READ and the SEND behind it; the provider completes the SEND first. The SEND's CQE
/// retires the READ (RC order says it is done), so the READ is released then, as implied; the READ's own CQE,
/// which comes next, is shown with the ULP's wr_id, so that a ULP waiting for it does not wait forever.
#[test]
fn the_late_completion_of_a_wr_the_ulp_signaled_is_shown_and_recorded() {
    let rig = OooRig::new(16, 8);
    let hook_calls: Rc<RefCell<Vec<String>>> = Rc::default();
    let h = hook_calls.clone();
    rig.q().on_out_of_order(Box::new(move |msg: &str| h.borrow_mut().push(msg.to_owned())));
    assert_eq!(rig.cq.out_of_order().count, 0);
    assert!(rig.cq.out_of_order_message().is_none());
    rig.post(&mut Chain::new().push(10, WR_RDMA_READ, SIGNALED, &[64]).push(11, WR_SEND, SIGNALED, &[64]));
    let shown = rig.complete_and_poll(1);
    assert_eq!(shown, vec![(11, WC_SUCCESS, WC_SEND), (10, WC_SUCCESS, WC_RDMA_READ)], "both completions the ULP asked for");
    assert_eq!(rig.released_ids(), vec![10, 11]);
    assert_ne!(rig.log.borrow()[0].flags & SQD_COMPLETION_IMPLIED, 0, "released when the SEND's CQE retired it");
    let o = rig.cq.out_of_order();
    assert_eq!((o.count, o.shown), (1, 1), "{o:?}");
    // SAFETY: a live scripted QP.
    let qp_num = unsafe { (*rig.qp).qp_num };
    assert_eq!((o.qp_num, o.wqe, o.wr_id, o.opcode, o.status), (qp_num, 0, 10, WC_RDMA_READ, WC_SUCCESS), "{o:?}");
    assert_eq!(o.flags, sqdisc::SQD_OUT_OF_ORDER_ULP_WR | sqdisc::SQD_OUT_OF_ORDER_SHOWN, "{o:?}");
    let msg = rig.cq.out_of_order_message().expect("described");
    assert!(msg.contains(&format!("QP {qp_num:#x}")) && msg.contains("wr_id 0xa") && msg.contains("out of RC order"), "{msg}");
    assert_eq!(*hook_calls.borrow(), vec![msg.clone()], "the queue's hook ran once, with the message");
    assert_eq!(rig.q().out_of_order(), o, "the queue keeps its own record");
    let st = rig.q().stats();
    assert_eq!((st.stray_cqes, st.released, st.closed), (0, 2, 0));
    assert_eq!(rig.cq.stats().stray, 0);

    // Again: counted, the first record and the message stay, the hook does not run again.
    rig.post(&mut Chain::new().push(12, WR_RDMA_READ, SIGNALED, &[64]).push(13, WR_SEND, SIGNALED, &[64]));
    let shown = rig.complete_and_poll(1);
    assert_eq!(shown, vec![(13, WC_SUCCESS, WC_SEND), (12, WC_SUCCESS, WC_RDMA_READ)]);
    let o2 = rig.cq.out_of_order();
    assert_eq!((o2.count, o2.shown, o2.wqe, o2.wr_id), (2, 2, 0, 10));
    assert_eq!(rig.cq.out_of_order_message().unwrap(), msg);
    assert_eq!(hook_calls.borrow().len(), 1);
    assert_eq!(rig.released_ids(), vec![10, 11, 12, 13]);
}

/// A WR the ULP did not signal (the library's moderation did): its late CQE is counted and recorded, and not
/// shown, as its in-order CQE would not have been.
#[test]
fn the_late_completion_of_a_wr_the_ulp_did_not_signal_is_recorded_not_shown() {
    let rig = OooRig::new(16, 1);
    rig.post(&mut Chain::sends(0..2, 0));
    let shown = rig.complete_and_poll(1);
    assert!(shown.is_empty(), "{shown:?}");
    assert_eq!(rig.released_ids(), vec![0, 1]);
    let o = rig.cq.out_of_order();
    assert_eq!((o.count, o.shown, o.wqe, o.wr_id, o.opcode), (1, 0, 0, 0, WC_SEND), "{o:?}");
    assert_eq!(o.flags, sqdisc::SQD_OUT_OF_ORDER_ULP_WR, "{o:?}");
    let msg = rig.cq.out_of_order_message().unwrap();
    assert!(msg.contains("not shown"), "{msg}");
}

/// In RC order nothing is recorded.
#[test]
fn completions_in_order_record_nothing() {
    let rig = OooRig::new(16, 2);
    rig.post(&mut Chain::new().push(1, WR_RDMA_READ, SIGNALED, &[64]).push(2, WR_SEND, SIGNALED, &[64]));
    rig.post(&mut Chain::sends(3..9, 0));
    let shown = rig.complete_and_poll(0);
    assert_eq!(shown.iter().map(|s| s.0).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(rig.cq.out_of_order(), sqdisc::OutOfOrder::default());
    assert!(rig.cq.out_of_order_message().is_none());
}
