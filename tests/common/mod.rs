//! A test rig: a managed queue on a scriptable device, with a log of every release.
#![allow(dead_code)]

use std::cell::RefCell;
use std::pin::Pin;
use std::ptr;
use std::rc::Rc;

use rdma_sys::{ibv_cq, ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_wc};
use sqdisc_sim::scripted::{Scriptable, ScriptedDevice, ScriptedQpCaps};
use sqdisc_sim::{SimConfig, SimDevice};
use sqdisc::verbs::{CqHandle, QpHandle, RecvChain, SendChain};
use sqdisc::{Completion, Cq, Queue, QueueConfig, ReleaseHandler};

pub const WR_SEND: u32 = 2;
pub const WR_RDMA_WRITE: u32 = 0;
pub const WR_RDMA_READ: u32 = 4;
pub const SIGNALED: u32 = 2;
pub const INLINE: u32 = 8;
pub const WC_SUCCESS: u32 = 0;
pub const WC_WR_FLUSH_ERR: u32 = 5;
pub const WC_REM_ACCESS_ERR: u32 = 10;
pub const WC_SEND: u32 = 0;
pub const WC_RECV: u32 = 128;

pub type Log = Rc<RefCell<Vec<Completion>>>;

/// A WR chain built by a test: the WRs, their SGEs and a data buffer.
pub struct Chain {
    pub wrs: Vec<ibv_send_wr>,
    pub sges: Vec<Vec<ibv_sge>>,
}

impl Chain {
    pub fn new() -> Chain {
        Chain { wrs: Vec::new(), sges: Vec::new() }
    }
    pub fn push(mut self, wr_id: u64, opcode: u32, flags: u32, sge_lengths: &[u32]) -> Chain {
        // SAFETY: all-zero is a valid `ibv_send_wr`.
        let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
        w.wr_id = wr_id;
        w.opcode = opcode;
        w.send_flags = flags;
        w.num_sge = sge_lengths.len() as i32;
        self.wrs.push(w);
        self.sges.push(sge_lengths.iter().map(|&l| ibv_sge { addr: 0x10_0000 + wr_id * 0x1000, length: l, lkey: 7 }).collect());
        self
    }
    pub fn sends(ids: std::ops::Range<u64>, flags: u32) -> Chain {
        ids.fold(Chain::new(), |c, id| c.push(id, WR_SEND, flags, &[64]))
    }
    /// Links the WRs and returns the head. Every pointer comes from one base pointer per vector, so none is
    /// invalidated by a later borrow of the vectors.
    pub fn link(&mut self) -> *mut ibv_send_wr {
        let n = self.wrs.len();
        let base = self.wrs.as_mut_ptr();
        let sge_lists: Vec<*mut ibv_sge> =
            self.sges.iter_mut().map(|l| if l.is_empty() { ptr::null_mut() } else { l.as_mut_ptr() }).collect();
        for (i, list) in sge_lists.into_iter().enumerate() {
            // SAFETY: `i < n`; `base` points to `n` WRs; no reference into `self.wrs` is live.
            unsafe {
                let w = base.add(i);
                (*w).sg_list = list;
                (*w).next = if i + 1 < n { base.add(i + 1) } else { ptr::null_mut() };
            }
        }
        if n == 0 {
            ptr::null_mut()
        } else {
            base
        }
    }

    pub fn index_of(&self, p: *mut ibv_send_wr) -> Option<usize> {
        self.wrs.iter().position(|w| ptr::eq(w, p))
    }
}

/// A device the rig can run on: the scripted test device, or the software HCA (its scripted QPs).
pub type Device = Pin<Box<dyn Scriptable>>;
pub type Make = fn() -> Device;

pub fn scripted() -> Device {
    ScriptedDevice::new()
}

/// The software HCA with wire delays, so completions really arrive asynchronously.
pub fn sim() -> Device {
    let cfg = SimConfig { seed: 7, wire_delay_min: 1, wire_delay_max: 3, ..SimConfig::default() };
    SimDevice::new(&cfg).expect("sim config")
}

/// Defines `#[test]`s running a scenario `fn name(make: Make)` on both devices.
#[macro_export]
macro_rules! on_both_devices {
    ($($name:ident),* $(,)?) => {
        mod on_scripted {
            $(#[test] fn $name() { super::$name($crate::common::scripted) })*
        }
        mod on_sim {
            $(#[test] fn $name() { super::$name($crate::common::sim) })*
        }
    };
}

/// Fields drop in order: the library's handles before the device that owns the verbs objects. `D` is the
/// device type: `ScriptedDevice` from [`Rig::new`] (its own methods are then at hand), any device from
/// [`Rig::on`].
pub struct Rig<D: ?Sized + Scriptable = dyn Scriptable> {
    pub queue: Option<Queue>,
    pub cq: Cq,
    pub log: Log,
    pub cq_raw: *mut ibv_cq,
    pub qp: *mut ibv_qp,
    pub dev: Pin<Box<D>>,
}

pub fn config(sq_depth: u32, signal_interval: u32, backlog_depth: u32) -> QueueConfig {
    QueueConfig { sq_depth, max_send_sge: 4, max_inline_data: 64, signal_interval, backlog_depth, ..QueueConfig::default() }
}

pub fn logger(log: &Log) -> ReleaseHandler {
    let log = log.clone();
    ReleaseHandler::Closure(Box::new(move |c: &Completion| log.borrow_mut().push(*c)))
}

impl Rig<ScriptedDevice> {
    /// A queue of `cfg` on a fresh scripted device whose CQ holds `cqe` (and whose QP has `cfg.sq_depth` slots).
    pub fn new(cfg: QueueConfig, cqe: i32) -> Rig<ScriptedDevice> {
        Rig::build(ScriptedDevice::new(), cfg, cqe)
    }
}

impl Rig {
    /// The same on the device `make` builds.
    pub fn on(make: Make, cfg: QueueConfig, cqe: i32) -> Rig {
        Rig::build(make(), cfg, cqe)
    }
}

impl<D: ?Sized + Scriptable> Rig<D> {
    fn build(dev: Pin<Box<D>>, cfg: QueueConfig, cqe: i32) -> Rig<D> {
        let cq_raw = dev.create_cq(cqe).unwrap();
        let caps = ScriptedQpCaps {
            max_send_wr: cfg.sq_depth,
            max_recv_wr: cfg.rq_depth.max(1),
            max_send_sge: cfg.max_send_sge,
            max_recv_sge: 4,
            max_inline_data: cfg.max_inline_data,
        };
        let qp = dev.create_qp(cq_raw, cq_raw, &caps).unwrap();
        // SAFETY: the CQ and QP live as long as the device, which outlives the rig's handles (drop order).
        let cq = Cq::new(unsafe { CqHandle::from_raw(cq_raw) }.unwrap());
        let log: Log = Rc::default();
        let qh = unsafe { QpHandle::from_raw(qp) }.unwrap();
        let recv = (cfg.rq_depth > 0).then_some(&cq);
        let queue = Queue::new(&cq, recv, qh, cfg, Some(logger(&log))).unwrap();
        Rig { queue: Some(queue), cq, log, cq_raw, qp, dev }
    }

    pub fn q(&self) -> &Queue {
        self.queue.as_ref().unwrap()
    }

    /// Posts a chain; returns Ok or (errno, index of bad WR).
    pub fn post(&self, chain: &mut Chain) -> Result<(), (i32, Option<usize>)> {
        let head = chain.link();
        // SAFETY: the chain lives in `chain` for the whole call.
        let r = self.q().post_send(unsafe { SendChain::from_raw(head) });
        r.map_err(|e| (e.error.errno(), chain.index_of(e.bad.as_ptr())))
    }

    pub fn post_recvs(&self, ids: std::ops::Range<u64>) -> Result<(), i32> {
        post_recv_chain(self.q(), ids, 256)
    }

    /// Polls until the CQ is empty; returns (wr_id, status, opcode) of every work completion shown.
    pub fn poll_all(&self) -> Vec<(u64, u32, u32)> {
        let mut out = Vec::new();
        loop {
            // SAFETY: all-zero is a valid `ibv_wc`.
            let mut wc: [ibv_wc; 4] = unsafe { std::mem::zeroed() };
            let n = self.cq.poll(&mut wc).unwrap();
            out.extend(wc[..n].iter().map(|w| (w.wr_id, w.status, w.opcode)));
            if n < wc.len() {
                return out;
            }
        }
    }

    pub fn complete(&self, n: usize) -> usize {
        self.dev.complete(self.qp, n).unwrap()
    }

    pub fn released_ids(&self) -> Vec<u64> {
        self.log.borrow().iter().map(|c| c.wr_id).collect()
    }

    pub fn assert_no_violations(&self) {
        assert_eq!(self.dev.violations(), Vec::<String>::new());
    }
}

/// Posts receives `ids` to `q` as one chain, one SGE of `len` bytes each; returns the errno of a refusal.
pub fn post_recv_chain(q: &Queue, ids: std::ops::Range<u64>, len: u32) -> Result<(), i32> {
    let mut sges: Vec<ibv_sge> = ids.clone().map(|_| ibv_sge { addr: 0x9000, length: len, lkey: 9 }).collect();
    // SAFETY: all-zero is a valid `ibv_recv_wr`.
    let mut wrs: Vec<ibv_recv_wr> = ids.clone().map(|_| unsafe { std::mem::zeroed() }).collect();
    let n = wrs.len();
    let (base, sge_base) = (wrs.as_mut_ptr(), sges.as_mut_ptr());
    for (i, id) in ids.enumerate() {
        // SAFETY: `i < n`; both pointers cover `n` elements; no reference into the vectors is live.
        unsafe {
            let w = base.add(i);
            (*w).wr_id = id;
            (*w).num_sge = 1;
            (*w).sg_list = sge_base.add(i);
            (*w).next = if i + 1 < n { base.add(i + 1) } else { ptr::null_mut() };
        }
    }
    // SAFETY: the chain lives here for the whole call.
    let r = q.post_recv(unsafe { RecvChain::from_raw(base) });
    r.map_err(|e| e.error.errno())
}
