//! Runs one case against the software HCA and checks every invariant after every operation.
//!
//! The world: up to `SLOTS` managed queues, each on its own RC QP connected to a raw-verbs peer QP (all peers
//! share one raw CQ and are kept supplied with receives); up to `CQS` managed CQs on one completion channel;
//! one managed SRQ. The library is driven only through its Rust API, the sim only through its public
//! surface. Release callbacks and deferred actions never panic: they record what they saw, and the runner
//! turns any broken rule into an `Err` that names it, so a failing case unwinds nothing through the library.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, VecDeque};
use std::pin::Pin;
use std::ptr;
use std::rc::Rc;

use rdma_sys::{ibv_comp_channel, ibv_cq, ibv_event_type as ev, ibv_mr, ibv_qp, ibv_srq, ibv_srq_init_attr, ibv_wc};
use sqdisc::discipline::budget::{reservation, send_reservation};
use sqdisc_sim::*;
use std::result::Result;
use sqdisc::verbs::control::Teardown;
use sqdisc::verbs::{CqHandle, QpHandle, SrqHandle};
use sqdisc::{Completion, Cq, Deferred, InvalidateMode, Queue, QueueConfig, ReleaseHandler, Srq};

use super::ops::*;
use crate::sim_support::{self, op, post_recv_chain, st, Buf, W, ACCESS_ALL, FENCE, INLINE, SIGNALED};

const OK: u32 = st::IBV_WC_SUCCESS;
const FLUSH: u32 = st::IBV_WC_WR_FLUSH_ERR;
/// 64-byte source/destination chunks per queue: more than `sq + backlog` can hold at once.
const CHUNKS: u32 = 128;
const CHUNK: u64 = 64;
/// The probe target: bytes past the chunks of a queue's buffer, written by nobody but a probe.
const PROBE_OFF: u64 = CHUNKS as u64 * CHUNK;
const RQ_DEPTH: u32 = 8;
const RECV_LEN: u32 = 256;
const SRQ_DEPTH: u32 = 32;
const PEER_RQ: u32 = 64;
const PEER_DST_LEN: usize = 64 * 1024;
/// Teardown rounds (each polls every CQ once) before a queue that does not drain is a liveness failure.
const TEARDOWN_ROUNDS: usize = 4000;
/// wr_ids: sends count from 0, a queue's own receives from `RECV_IDS`, the SRQ's from `SRQ_IDS`; the peers'
/// receives carry `PEER_RECV`.
const RECV_IDS: u64 = 1 << 40;
const SRQ_IDS: u64 = 1 << 41;
const PEER_RECV: u64 = 1 << 42;

/// What a case did, for the campaign's totals.
#[derive(Debug, Default, Clone, Copy)]
pub struct Report {
    pub ops: u64,
    /// Fault operations that injected something (a fault, an overrun, an SRQ error).
    pub faults: u64,
    /// Packets and responses the sim lost (random and injected), RNR NAKs.
    pub lost: u64,
    pub rnr_naks: u64,
    pub releases: u64,
    pub defers: u64,
    pub rkeys_probed: u64,
    pub async_events: u64,
}

type Fail = String;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// A send WR accepted and not yet released.
#[derive(Clone, Copy)]
struct Pending {
    wr_id: u64,
    chunk: Option<u32>,
    /// (addr, len) the HCA reads or writes through the SGE (not inline).
    dma: Option<(u64, u32)>,
    ulp_signaled: bool,
}

/// What a queue's callbacks and the runner share.
struct Book {
    dev: Rc<Pin<Box<SimDevice>>>,
    buf: Rc<Buf>,
    errors: Rc<RefCell<Vec<String>>>,
    slot: u8,
    sends: VecDeque<Pending>,
    recvs: VecDeque<u64>,
    free_chunks: Vec<u32>,
    /// (wr_id, status, flags) of every send release, in order.
    log: Vec<(u64, u32, u32)>,
    recv_log: Vec<(u64, u32)>,
    ulp_signaled: BTreeSet<u64>,
    send_order: Order,
    recv_order: Order,
    transport_failed: bool,
    accepted: u64,
    released: u64,
    /// The queue names its WRs by their index (`QueueConfig::indexed`): its releases carry indexes, which the
    /// book checks against the count of releases before them and maps back to wr_ids through `ids`.
    indexed: bool,
    /// The wr_id of each accepted send WR, by index.
    ids: Vec<u64>,
    /// The batch handler takes failures only (`Queue::set_release_failures`): the successes before a release
    /// may have been released without a call (`catch_up`). Such a queue takes no invalidation, so that its
    /// successes can be counted from `QueueStats::released` (`sync_quiet`), which also counts LocalInvs.
    quiet: bool,
}

impl Book {
    fn err(&self, s: String) {
        self.errors.borrow_mut().push(format!("queue {}: {s}", self.slot));
    }

    /// A release through a handler: on a quiet queue, the successes released without a call before it first.
    fn on_release_any(&mut self, c: &Completion) {
        if self.quiet && !c.is_recv() {
            let upto = if self.indexed {
                c.wr_id
            } else {
                match self.sends.iter().position(|p| p.wr_id == c.wr_id) {
                    Some(at) => self.released + at as u64,
                    None => return self.err(format!("release {c:?} of no outstanding WR")),
                }
            };
            self.catch_up(upto);
        }
        self.on_release(c);
    }

    /// A quiet queue's WRs up to index `upto` (exclusive) released without a call: successes, each the oldest
    /// outstanding WR, with everything a release checks and frees.
    fn catch_up(&mut self, upto: u64) {
        while self.released < upto {
            let Some(p) = self.sends.front().copied() else {
                return self.err(format!("{upto} send releases counted, {} accepted", self.accepted));
            };
            let wr_id = if self.indexed { self.released } else { p.wr_id };
            self.on_release(&Completion { wr_id, status: OK, ..Completion::default() });
        }
    }

    fn on_release(&mut self, c: &Completion) {
        if c.is_recv() {
            match self.recvs.pop_front() {
                Some(id) if id == c.wr_id => {
                    if let Err(e) = self.recv_order.next(c.status) {
                        self.err(format!("receive release {c:?}: {e} (earlier receive releases: {:?})", self.recv_log));
                    }
                    self.recv_log.push((c.wr_id, c.status));
                }
                other => self.err(format!("receive release {c:?} but the oldest posted receive is {other:?}")),
            }
            return;
        }
        let Some(p) = self.sends.pop_front() else {
            return self.err(format!("release {c:?} with no WR outstanding (released twice?)"));
        };
        let named;
        let c = if self.indexed {
            // Releases come once each in post order: the n-th is index n, whichever WR it is.
            if c.wr_id != self.released {
                self.err(format!("release {c:?} carries index {} but {} send releases came before it", c.wr_id, self.released));
            }
            named = Completion { wr_id: p.wr_id, ..*c };
            &named
        } else {
            c
        };
        if p.wr_id != c.wr_id {
            self.err(format!("release of wr_id {} but the oldest outstanding WR is {} (order or exactly-once broken)", c.wr_id, p.wr_id));
        }
        if let Some((addr, len)) = p.dma {
            if self.dev.buffer_busy(addr as *const _, len as usize) {
                self.err(format!("wr_id {} released ({c:?}) while the HCA may still read or write its buffer", c.wr_id));
            }
        }
        if let Some(k) = p.chunk {
            // Reuse the buffer at once, as a ULP may after the release: a retransmission reading it now is a
            // "source modified" violation in the sim's log.
            fill(&self.buf, k as u64 * CHUNK, (c.wr_id as u8) ^ 0xa5);
            self.free_chunks.push(k);
        }
        // Per send queue, as an RC requester completes: successes, then at most one error, then only flushes.
        if let Err(e) = self.send_order.next(c.status) {
            self.err(format!("{e}: {c:?} (earlier releases: {:?})", self.log));
        }
        if c.status == st::IBV_WC_RETRY_EXC_ERR {
            // The transport gave up: the HCA's verdict, not the library's, where packets can be lost (the check
            // is in `final_checks`). No RNR_RETRY_EXC: every connection here retries RNR forever.
            self.transport_failed = true;
        }
        if c.never_posted() && c.status != FLUSH {
            self.err(format!("never-posted release without a flush status: {c:?}"));
        }
        self.released += 1;
        self.log.push((c.wr_id, c.status, c.flags));
    }
}

/// The completion order of one queue (its sends, or the receives of its own RQ), as an RC QP produces it:
/// successes, then at most one error, then only flushes.
#[derive(Default)]
struct Order {
    /// The first status other than success released so far.
    first_failure: Option<u32>,
}

impl Order {
    fn next(&mut self, status: u32) -> Result<(), String> {
        match self.first_failure {
            None => {
                if status != OK {
                    self.first_failure = Some(status);
                }
                Ok(())
            }
            Some(first) => {
                let after = if first == FLUSH { "a flush" } else { "an error" };
                if status == OK {
                    Err(format!("a success released after {after}"))
                } else if status != FLUSH {
                    Err(format!("an error released after {after}"))
                } else {
                    Ok(())
                }
            }
        }
    }
}

/// A live managed queue and everything the runner knows about it.
/// Outside the callbacks: a quiet queue's successes released without a call, counted from its `released`.
fn sync_quiet(s: &Slot) {
    if s.book.borrow().quiet {
        let released = s.queue.as_ref().unwrap().stats().released;
        s.book.borrow_mut().catch_up(released);
    }
}

struct Slot {
    queue: Option<Queue>,
    book: Rc<RefCell<Book>>,
    qp: *mut ibv_qp,
    peer: *mut ibv_qp,
    qpn: u32,
    send_cq: u8,
    recv_cq: u8,
    recv: Recv,
    /// The MR the WRs' SGEs use (replaced after an invalidation or a deferred deregistration).
    mr: *mut ibv_mr,
    recv_buf: Rc<Buf>,
    recv_key: u32,
    next_id: u64,
    next_recv: u64,
    /// The queue leaves the WRs it posted as posted (`QueueConfig::no_restore`).
    no_restore: bool,
    /// The queue names its WRs by index (`QueueConfig::indexed`): the wr_ids of a chain are not restored.
    indexed: bool,
    /// Something made failures legitimate (a fault, an overrun of its CQ, an SRQ error, set_error).
    tainted: bool,
    /// Packets of its connection can be lost (random loss, or a loss fault on it): then the transport may give
    /// up (`IBV_WC_RETRY_EXC_ERR`), if only because the peer's lost RNR NAKs exhausted the peer's retry_cnt and
    /// the peer, in error, answers nothing (docs/sim.md, "RETRY_EXC without a fault of one's own").
    lossy: bool,
    drained: bool,
    peer_recvs: u32,
    /// The peer's QP failed (its receives flushed): it is not supplied any more.
    peer_dead: bool,
    sq: u32,
    /// Invalidations requested (each may add one library WR to the queue's counts).
    invalidations: u64,
    /// Invalidations accepted, reported done once their `runs` is 1.
    inv_pending: Vec<Rc<Barrier>>,
    shown_sends: Vec<(u64, u32)>,
    shown_recvs: Vec<(u64, u32)>,
}

/// One deferred action or invalidation: how often it ran, and what it saw.
struct Barrier {
    runs: Cell<u32>,
}

struct ManagedCq {
    cq: Option<Cq>,
    raw: *mut ibv_cq,
    /// A raw QP without a budget flooded it: overruns and CQ_ERR are expected here.
    broken: bool,
}

pub struct World {
    dev: Rc<Pin<Box<SimDevice>>>,
    errors: Rc<RefCell<Vec<String>>>,
    channel: *mut ibv_comp_channel,
    peer_cq: *mut ibv_cq,
    probe_cqs: (*mut ibv_cq, *mut ibv_cq),
    cqs: Vec<Option<ManagedCq>>,
    slots: Vec<Option<Slot>>,
    srq: Option<Srq>,
    srq_raw: *mut ibv_srq,
    srq_key: u32,
    srq_outstanding: Rc<RefCell<BTreeSet<u64>>>,
    srq_released: Rc<RefCell<Vec<(u64, u32)>>>,
    srq_errored: bool,
    next_srq_id: u64,
    srq_accepted: u64,
    /// Successful SRQ receives shown by polls.
    srq_shown: Vec<u64>,
    /// Keys the library reported invalidated, to be probed by the peer.
    to_probe: Rc<RefCell<Vec<(u32, u64)>>>,
    barriers: Vec<Rc<Barrier>>,
    intruders: Vec<*mut ibv_qp>,
    /// CQs flooded by a QP outside the budget (only these may overrun).
    overruns: u32,
    peer_dst_key: u32,
    peer_src_key: u32,
    report: Report,
    // Memory the sim may touch: dropped after the device (declared last, and `World::drop` drops the device).
    bufs: Vec<Rc<Buf>>,
    peer_dst: Rc<Buf>,
    peer_src: Rc<Buf>,
    scratch: Rc<Buf>,
    srq_buf: Rc<Buf>,
}

fn keys(mr: *mut ibv_mr) -> u32 {
    sim_support::mr_keys(mr).0
}

fn errno<T>(r: &sqdisc::Result<T>) -> i32 {
    r.as_ref().err().map_or(0, |e| e.errno())
}

impl Book {
    fn new(dev: &Rc<Pin<Box<SimDevice>>>, buf: &Rc<Buf>, errors: &Rc<RefCell<Vec<String>>>, slot: u8) -> Book {
        Book {
            dev: dev.clone(),
            buf: buf.clone(),
            errors: errors.clone(),
            slot,
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            free_chunks: (0..CHUNKS).rev().collect(),
            log: Vec::new(),
            recv_log: Vec::new(),
            ulp_signaled: BTreeSet::new(),
            send_order: Order::default(),
            recv_order: Order::default(),
            transport_failed: false,
            accepted: 0,
            released: 0,
            indexed: false,
            ids: Vec::new(),
            quiet: false,
        }
    }
}

impl World {
    pub fn new(sim: &Sim) -> World {
        let cfg = SimConfig {
            seed: sim.seed,
            loss_ppm: sim.loss_ppm,
            ack_loss_ppm: sim.ack_loss_ppm,
            wire_delay_min: 1,
            wire_delay_max: sim.delay_max.max(1),
            ack_delay: sim.ack_delay,
            tx_per_step: sim.tx_per_step.max(1),
            flags: SQD_SIM_STRICT,
            ..SimConfig::default()
        };
        let dev = Rc::new(SimDevice::new(&cfg).expect("sim config"));
        let peer_dst = Rc::new(Buf::new(PEER_DST_LEN, 0));
        let peer_src = Rc::new(Buf::new(4096, 0x5c));
        let scratch = Rc::new(Buf::new(4096, 0));
        let srq_buf = Rc::new(Buf::new((SRQ_DEPTH * RECV_LEN) as usize, 0));
        let reg = |b: &Buf| {
            // SAFETY: every buffer of the world outlives the device (`World::drop` drops the device first).
            keys(unsafe { dev.reg_mr(b.ptr().cast(), b.len(), ACCESS_ALL) }.unwrap())
        };
        let (peer_dst_key, peer_src_key, srq_key) = (reg(&peer_dst), reg(&peer_src), reg(&srq_buf));
        let channel = dev.create_comp_channel().unwrap();
        let peer_cq = dev.create_cq(16384).unwrap();
        let probe_cqs = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
        let errors: Rc<RefCell<Vec<String>>> = Rc::default();
        // The SRQ: its releases checked exactly-once (any order: any of its queues may take any receive).
        // SAFETY: plain data; all-zero is valid.
        let mut attr: ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        attr.attr.max_wr = SRQ_DEPTH;
        attr.attr.max_sge = 1;
        let srq_raw = dev.create_srq(&mut attr).unwrap();
        let srq_outstanding: Rc<RefCell<BTreeSet<u64>>> = Rc::default();
        let srq_released: Rc<RefCell<Vec<(u64, u32)>>> = Rc::default();
        let handler = {
            let (out, rel, errs) = (srq_outstanding.clone(), srq_released.clone(), errors.clone());
            ReleaseHandler::Closure(Box::new(move |c: &Completion| {
                if !out.borrow_mut().remove(&c.wr_id) {
                    errs.borrow_mut().push(format!("SRQ release of receive {} that is not outstanding: {c:?}", c.wr_id));
                }
                rel.borrow_mut().push((c.wr_id, c.status));
            }))
        };
        // SAFETY: the SRQ lives as long as the device, which outlives the managed SRQ (dropped first).
        let srq = Srq::new(unsafe { SrqHandle::from_raw(srq_raw) }.unwrap(), attr.attr.max_wr, Some(handler), 0, None).unwrap();
        World {
            dev,
            errors,
            channel,
            peer_cq,
            probe_cqs,
            cqs: (0..CQS).map(|_| None).collect(),
            slots: (0..SLOTS).map(|_| None).collect(),
            srq: Some(srq),
            srq_raw,
            srq_key,
            srq_outstanding,
            srq_released,
            srq_errored: false,
            next_srq_id: SRQ_IDS,
            srq_accepted: 0,
            srq_shown: Vec::new(),
            to_probe: Rc::default(),
            barriers: Vec::new(),
            intruders: Vec::new(),
            overruns: 0,
            peer_dst_key,
            peer_src_key,
            report: Report::default(),
            bufs: Vec::new(),
            peer_dst,
            peer_src,
            scratch,
            srq_buf,
        }
    }

    fn reg(&self, b: &Buf) -> *mut ibv_mr {
        // SAFETY: every buffer of the world outlives the device (`World::drop` drops the device first).
        unsafe { self.dev.reg_mr(b.ptr().cast(), b.len(), ACCESS_ALL) }.unwrap()
    }

    /// A fresh MR over the scratch buffer: a key used once (SEND_WITH_INV, a ULP LocalInv).
    fn fresh_key(&self) -> u32 {
        keys(self.reg(&self.scratch))
    }

    fn cq(&self, i: u8) -> Option<&ManagedCq> {
        self.cqs.get(i as usize).and_then(|c| c.as_ref())
    }

    // ---- operations ---------------------------------------------------------------------------------------

    pub fn apply(&mut self, op: &Op) -> Result<(), Fail> {
        self.report.ops += 1;
        match *op {
            Op::NewCq { cq, cqe } => self.new_cq(cq, cqe),
            Op::FreeCq { cq } => self.free_cq(cq)?,
            Op::NewQueue { slot, send_cq, recv_cq, recv, sq, interval, backlog, verify } => {
                self.new_queue(slot, send_cq, recv_cq, recv, sq, interval, backlog, verify)?
            }
            Op::FreeQueue { slot } => self.free_queue(slot)?,
            Op::Post { slot, ref wrs } => self.post(slot, &wrs.0)?,
            Op::PostRecv { slot, n } => self.post_recv(slot, n)?,
            Op::SrqPost { n } => self.srq_post(n)?,
            Op::PeerSend { slot, n, imm } => self.peer_send(slot, n, imm),
            Op::Poll { cq } => self.poll(cq)?,
            Op::Arm { cq } => self.arm(cq)?,
            Op::Step { n } => self.dev.step(n as u32),
            Op::Defer { slot } => self.defer(slot)?,
            Op::Invalidate { slot, fenced } => self.invalidate(slot, fenced)?,
            Op::DeferDereg { slot } => self.defer_dereg(slot),
            Op::Drain { slot } => self.drain(slot)?,
            Op::Events => self.events()?,
            Op::Inject { slot, fault } => self.inject(slot, fault),
            Op::Overrun { cq } => self.overrun(cq),
            Op::SrqError => {
                if self.srq.is_some() && !self.srq_errored {
                    self.dev.srq_set_error(self.srq_raw).unwrap();
                    self.srq_errored = true;
                    self.report.faults += 1;
                    for s in self.slots.iter_mut().flatten() {
                        if s.recv == Recv::Shared {
                            s.tainted = true;
                        }
                    }
                }
            }
        }
        self.pump_peers();
        self.probe()?;
        self.check()
    }

    fn new_cq(&mut self, i: u8, cqe: u16) {
        if self.cq(i).is_some() || i >= CQS {
            return;
        }
        let raw = self.dev.create_cq_ex(cqe as i32, self.channel, ptr::null_mut(), 0).unwrap();
        // SAFETY: the CQ lives until `free_cq` destroys it after the managed CQ is dropped.
        let cq = Cq::new(unsafe { CqHandle::from_raw(raw) }.unwrap());
        self.cqs[i as usize] = Some(ManagedCq { cq: Some(cq), raw, broken: false });
    }

    fn attached(&self, i: u8) -> bool {
        self.slots.iter().flatten().any(|s| s.send_cq == i || (s.recv != Recv::NoRecv && s.recv_cq == i))
    }

    fn free_cq(&mut self, i: u8) -> Result<(), Fail> {
        let Some(c) = self.cq(i) else { return Ok(()) };
        let r = c.cq.as_ref().unwrap().check_free();
        ensure!(r.is_err() == self.attached(i), "CQ {i}: check_free says {r:?}, but queues attached: {}", self.attached(i));
        if r.is_err() {
            return Ok(());
        }
        let mut c = self.cqs[i as usize].take().unwrap();
        let stats = c.cq.as_ref().unwrap().stats();
        ensure!(stats.reserved == 0 && stats.queues == 0, "CQ {i} free with a reservation left: {stats:?}");
        drop(c.cq.take());
        // The flooding QPs of a broken CQ go with it.
        let raw = c.raw;
        let dev = self.dev.clone();
        self.intruders.retain(|&qp| {
            // SAFETY: a live QP of the device.
            let on = unsafe { (*qp).send_cq } == raw;
            if on {
                dev.destroy_qp(qp).unwrap();
            }
            !on
        });
        self.take_channel_events(None);
        self.dev.destroy_cq(raw).map_err(|e| format!("CQ {i}: the device refuses to destroy it: {e:?}"))
    }

    /// Takes and acknowledges every completion event of the channel; whether one was for `cq`.
    fn take_channel_events(&self, cq: Option<*mut ibv_cq>) -> bool {
        let mut seen = false;
        while let Ok((c, _)) = self.dev.get_cq_event(self.channel) {
            seen |= Some(c) == cq;
            self.dev.ack_cq_events(c, 1).unwrap();
        }
        seen
    }

    #[allow(clippy::too_many_arguments)]
    fn new_queue(&mut self, i: u8, scq: u8, rcq: u8, recv: Recv, sq: u8, interval: u8, backlog: u8, verify: bool) -> Result<(), Fail> {
        if i >= SLOTS || self.slots[i as usize].is_some() {
            return Ok(());
        }
        let rcq = if recv == Recv::NoRecv { scq } else { rcq };
        let (Some(s), Some(r)) = (self.cq(scq), self.cq(rcq)) else { return Ok(()) };
        if s.broken || r.broken || (recv == Recv::Shared && (self.srq.is_none() || self.srq_errored)) {
            return Ok(());
        }
        let (s_raw, r_raw) = (s.raw, r.raw);
        let mut attr = sim_support::qp_attr(s_raw, r_raw, sq as u32, if recv == Recv::OwnRq { RQ_DEPTH } else { 1 });
        if recv == Recv::Shared {
            attr.srq = self.srq_raw;
        }
        let qp = self.dev.create_qp(&mut attr).unwrap();
        let granted = attr.cap.max_send_wr;
        let peer = self.dev.create_qp(&mut sim_support::qp_attr(self.peer_cq, self.peer_cq, 64, PEER_RQ)).unwrap();
        self.dev.connect(qp, peer, &SimConnAttr::default()).unwrap();
        let rq_depth = if recv == Recv::OwnRq { RQ_DEPTH } else { 0 };
        let cfg = QueueConfig {
            sq_depth: granted,
            max_send_sge: 4,
            max_inline_data: attr.cap.max_inline_data,
            rq_depth,
            signal_interval: interval as u32,
            backlog_depth: backlog as u32,
            verify_buffers: verify,
            // The queues of one slot in four leave their WRs as posted: the runner builds every WR afresh for its
            // post.
            no_restore: i % 3 == 2,
            // About a quarter name their WRs by index, in every slot (with batched releases or not, with
            // no_restore or not), by the queue's shape rather than its slot.
            indexed: (sq ^ interval) % 4 == 1,
        };
        let buf = Rc::new(Buf::new((PROBE_OFF + CHUNK) as usize, 0));
        let recv_buf = Rc::new(Buf::new((2 * RQ_DEPTH * RECV_LEN) as usize, 0));
        self.bufs.push(buf.clone());
        self.bufs.push(recv_buf.clone());
        let mr = self.reg(&buf);
        let recv_key = keys(self.reg(&recv_buf));
        let book = Rc::new(RefCell::new(Book::new(&self.dev, &buf, &self.errors, i)));
        book.borrow_mut().indexed = cfg.indexed;
        let handler = {
            let b = book.clone();
            ReleaseHandler::Closure(Box::new(move |c: &Completion| b.borrow_mut().on_release_any(c)))
        };
        let (sc, rc) = (self.cq(scq).unwrap().cq.as_ref().unwrap(), self.cq(rcq).unwrap().cq.as_ref().unwrap());
        // What the budget must decide: the queue fits on its CQs or is refused with ENOSPC.
        let fits = |c: &Cq, need: u64| c.stats().reserved + need <= c.stats().capacity;
        // An SRQ's depth is reserved once on each receive CQ its queues use.
        let srq_there = self.slots.iter().flatten().any(|s| s.recv == Recv::Shared && s.recv_cq == rcq);
        let recv_need = match recv {
            Recv::NoRecv => 0,
            Recv::OwnRq => reservation(0, rq_depth, false, true),
            Recv::Shared if srq_there => 0,
            Recv::Shared => SRQ_DEPTH as u64,
        };
        let send_need = send_reservation(granted, interval as u32);
        let fit = if scq == rcq { fits(sc, send_need + recv_need) } else { fits(sc, send_need) && fits(rc, recv_need) };
        // SAFETY: the QP lives until `free_queue` destroys it after the queue is dropped.
        let qh = unsafe { QpHandle::from_raw(qp) }.unwrap();
        let made = match recv {
            Recv::Shared => Queue::with_srq(sc, rc, self.srq.as_ref().unwrap(), qh, cfg, Some(handler)),
            Recv::OwnRq => Queue::new(sc, Some(rc), qh, cfg, Some(handler)),
            Recv::NoRecv => Queue::new(sc, None, qh, cfg, Some(handler)),
        };
        let q = match made {
            Ok(q) => q,
            Err(e) if interval as u32 > granted => {
                ensure!(e.errno() == libc::EINVAL, "queue {i}: signal_interval {interval} > sq_depth {granted} refused with {e:?}");
                self.dev.destroy_qp(qp).unwrap();
                self.dev.destroy_qp(peer).unwrap();
                return Ok(());
            }
            Err(e) => {
                // An SRQ queue also reserves the SRQ's depth on its receive CQ once: only ENOSPC is legitimate.
                ensure!(e.errno() == libc::ENOSPC, "queue {i}: Queue::new failed: {e:?}");
                ensure!(!fit, "queue {i}: refused with ENOSPC although it fits: {e:?}");
                self.dev.destroy_qp(qp).unwrap();
                self.dev.destroy_qp(peer).unwrap();
                return Ok(());
            }
        };
        ensure!(fit, "queue {i}: accepted although its reservation does not fit the CQ");
        // Every other queue takes its common releases in batches, one in four failures only: the book checks them
        // WR by WR all the same.
        if i % 2 == 1 {
            let quiet = i % 4 == 3;
            book.borrow_mut().quiet = quiet;
            let b = book.clone();
            let handler: sqdisc::BatchHandler = Box::new(move |r: &sqdisc::ReleaseBatch<'_>| {
                let mut book = b.borrow_mut();
                if book.quiet {
                    if r.status == OK {
                        book.err(format!("a batch of {} successes for a handler of failures only", r.count));
                    }
                    book.catch_up(r.first);
                }
                if r.first != book.released || r.count == 0 || r.wr_ids.len() != if book.indexed { 0 } else { r.count } {
                    let what = format!("batch from index {} of {} WRs ({} wr_ids) after {} send releases", r.first, r.count, r.wr_ids.len(), book.released);
                    book.err(what);
                }
                for k in 0..r.count {
                    let wr_id = if book.indexed { r.first + k as u64 } else { r.wr_ids[k] };
                    book.on_release(&Completion { wr_id, status: r.status, vendor_err: r.vendor_err, ..Completion::default() });
                }
            });
            let set = if quiet { q.set_release_failures(handler) } else { q.set_release_batch(handler) };
            set.map_err(|e| format!("queue {i}: setting the batch handler: {e:?}"))?;
        }
        ensure!(interval as u32 <= granted, "queue {i}: accepted signal_interval {interval} above sq_depth {granted}");
        // SAFETY: a live QP.
        let qpn = unsafe { (*qp).qp_num };
        self.slots[i as usize] = Some(Slot {
            queue: Some(q),
            book,
            qp,
            peer,
            qpn,
            send_cq: scq,
            recv_cq: rcq,
            recv,
            mr,
            recv_buf,
            recv_key,
            next_id: 0,
            next_recv: 0,
            no_restore: cfg.no_restore || cfg.indexed,
            indexed: cfg.indexed,
            tainted: false,
            lossy: self.dev.config().loss_ppm > 0 || self.dev.config().ack_loss_ppm > 0,
            drained: false,
            peer_recvs: 0,
            peer_dead: false,
            sq: granted,
            invalidations: 0,
            inv_pending: Vec::new(),
            shown_sends: Vec::new(),
            shown_recvs: Vec::new(),
        });
        Ok(())
    }

    fn free_queue(&mut self, i: u8) -> Result<(), Fail> {
        let Some(s) = self.slots.get(i as usize).and_then(|s| s.as_ref()) else { return Ok(()) };
        sync_quiet(s);
        let q = s.queue.as_ref().unwrap();
        let r = q.check_free();
        let (sends, recvs) = {
            let b = s.book.borrow();
            (b.sends.len(), b.recvs.len())
        };
        let invs = s.inv_pending.iter().filter(|b| b.runs.get() == 0).count();
        // A CQ that overran may have lost the CQE of a WQE of the library's own (an idle-tail marker): the queue
        // holds that WQE until the CQ's CQ_ERR event (`Cq::on_async_event`) releases everything on the CQ.
        let broken = |c: u8| self.cqs.get(c as usize).and_then(|c| c.as_ref()).is_some_and(|c| c.broken);
        let on_broken_cq = broken(s.send_cq) || (s.recv != Recv::NoRecv && broken(s.recv_cq));
        if invs > 0 {
            // The library's LocalInv may still be in flight: either answer is possible.
        } else if sends + recvs > 0 {
            ensure!(errno(&r) == libc::EBUSY, "queue {i}: check_free with {sends} WRs and {recvs} receives outstanding: {r:?}");
        } else if on_broken_cq {
            // Either answer is possible (above).
        } else if s.recv != Recv::Shared {
            ensure!(r.is_ok(), "queue {i}: nothing outstanding, yet check_free says {r:?}");
        }
        if r.is_ok() {
            self.final_checks(i)?;
            self.retire(i);
        }
        Ok(())
    }

    /// Drops a queue that is free and destroys its QPs.
    fn retire(&mut self, i: u8) {
        let mut s = self.slots[i as usize].take().unwrap();
        {
            let b = s.book.borrow();
            self.report.releases += b.released + b.recv_log.len() as u64;
        }
        drop(s.queue.take());
        self.dev.destroy_qp(s.qp).unwrap();
        self.dev.destroy_qp(s.peer).unwrap();
    }

    /// Every rule about one queue's whole life, once everything it accepted is released.
    fn final_checks(&self, i: u8) -> Result<(), Fail> {
        let s = self.slots[i as usize].as_ref().unwrap();
        sync_quiet(s);
        let q = s.queue.as_ref().unwrap();
        let b = s.book.borrow();
        let st = q.stats();
        ensure!(b.sends.is_empty() && b.recvs.is_empty(), "queue {i}: free with WRs outstanding");
        ensure!(b.released == b.accepted && st.accepted - b.accepted == st.released - b.released, "queue {i}: accepted {} released {}; stats {st:?}", b.accepted, b.released);
        ensure!(st.deferred == 0 && st.in_provider == 0 && st.backlog == 0, "queue {i}: free with state left: {st:?}");
        ensure!(st.stray_cqes == 0 && st.teardown_failures == 0, "queue {i}: stray CQEs or failed teardowns: {st:?}");
        ensure!(st.verify_mismatches == 0, "queue {i}: buffer verification found a modified buffer: {st:?}");
        // Completions shown by poll: what raw verbs would have shown, exactly for a queue no fault touched.
        let expect: Vec<(u64, u32)> = b
            .log
            .iter()
            .filter(|r| r.2 & sqdisc::SQD_COMPLETION_NEVER_POSTED == 0 && (r.1 != OK || b.ulp_signaled.contains(&r.0)))
            .map(|r| (r.0, r.1))
            .collect();
        let signaled_ok: Vec<(u64, u32)> = expect.iter().copied().filter(|r| r.1 == OK).collect();
        // The transport may give up on a WQE of the library's own (an idle-tail marker), whose completion no
        // release carries: the queue's failure status says so then (QueueStats::failed_status).
        let transport_failed = b.transport_failed || st.failed_status == st::IBV_WC_RETRY_EXC_ERR;
        if !s.tainted && (!transport_failed || !s.lossy) {
            ensure!(b.log.iter().all(|r| r.1 == OK || r.2 & sqdisc::SQD_COMPLETION_NEVER_POSTED != 0), "queue {i}: no fault touched it, yet: {:?}", b.log.iter().filter(|r| r.1 != OK).take(4).collect::<Vec<_>>());
            ensure!(s.shown_sends == expect, "queue {i}: poll showed {:?}, raw verbs would show {:?}", s.shown_sends, expect);
            ensure!(b.recv_log.iter().all(|r| r.1 == OK || r.1 == FLUSH), "queue {i}: a receive failed without a fault: {:?}", b.recv_log);
        } else {
            ensure!(is_subsequence(&s.shown_sends, &expect), "queue {i}: poll showed {:?}, not a subsequence of {:?}", s.shown_sends, expect);
            ensure!(is_subsequence(&signaled_ok, &s.shown_sends), "queue {i}: a signaled success was not shown: {:?} vs {:?}", signaled_ok, s.shown_sends);
        }
        let recv_ok: Vec<(u64, u32)> = b.recv_log.iter().copied().filter(|r| r.1 == OK).collect();
        let shown_ok: Vec<(u64, u32)> = s.shown_recvs.iter().copied().filter(|r| r.1 == OK).collect();
        ensure!(recv_ok == shown_ok, "queue {i}: successful receives released {recv_ok:?} but shown {shown_ok:?}");
        Ok(())
    }

    fn post(&mut self, i: u8, specs: &[Wr]) -> Result<(), Fail> {
        let (peer_dst, peer_dst_key) = (self.peer_dst.addr(), self.peer_dst_key);
        let fresh: Vec<u32> = specs.iter().map(|w| if matches!(w.opc, Opc::SendInv | Opc::LocalInv) { self.fresh_key() } else { 0 }).collect();
        let Some(s) = self.slots.get_mut(i as usize).and_then(|s| s.as_mut()) else { return Ok(()) };
        let lkey = keys(s.mr);
        let mut ws: Vec<W> = Vec::new();
        let mut pend: Vec<Pending> = Vec::new();
        {
            let mut b = s.book.borrow_mut();
            for (k, w) in specs.iter().enumerate() {
                let id = s.next_id;
                s.next_id += 1;
                let atomic = matches!(w.opc, Opc::Cas | Opc::Faa);
                let len = if atomic { 8 } else if w.opc == Opc::Read { w.len.max(1) } else { w.len };
                let has_sge = w.opc != Opc::LocalInv && len > 0;
                let chunk = if has_sge { b.free_chunks.pop() } else { None };
                let inline = w.inline && matches!(w.opc, Opc::Write | Opc::WriteImm | Opc::SendPlain | Opc::SendImm | Opc::SendInv);
                let mut flags = 0;
                if w.signaled {
                    flags |= SIGNALED;
                }
                if w.fence {
                    flags |= FENCE;
                }
                if inline {
                    flags |= INLINE;
                }
                let sges: Vec<(u64, u32, u32)> = match chunk {
                    Some(c) => {
                        let addr = b.buf.addr() + c as u64 * CHUNK;
                        fill(&b.buf, c as u64 * CHUNK, id as u8);
                        vec![(addr, len, lkey)]
                    }
                    None => vec![],
                };
                if has_sge && chunk.is_none() {
                    return Err(format!("queue {i}: the campaign ran out of chunks (more than {CHUNKS} WRs outstanding)"));
                }
                let remote = peer_dst + (id % 512) * 64 + 8;
                let opcode = match w.opc {
                    Opc::Write => op::IBV_WR_RDMA_WRITE,
                    Opc::WriteImm => op::IBV_WR_RDMA_WRITE_WITH_IMM,
                    Opc::SendPlain => op::IBV_WR_SEND,
                    Opc::SendImm => op::IBV_WR_SEND_WITH_IMM,
                    Opc::SendInv => op::IBV_WR_SEND_WITH_INV,
                    Opc::Read => op::IBV_WR_RDMA_READ,
                    Opc::Cas => op::IBV_WR_ATOMIC_CMP_AND_SWP,
                    Opc::Faa => op::IBV_WR_ATOMIC_FETCH_AND_ADD,
                    Opc::LocalInv => op::IBV_WR_LOCAL_INV,
                };
                let mut x = sim_support::wr(id, opcode, flags, &sges);
                x = match w.opc {
                    Opc::Write | Opc::WriteImm | Opc::Read => x.rdma(remote, peer_dst_key).imm(id as u32),
                    Opc::Cas | Opc::Faa => x.atomic(remote, peer_dst_key, 1, 2),
                    Opc::SendImm => x.imm(id as u32),
                    Opc::SendInv | Opc::LocalInv => x.imm(fresh[k]),
                    Opc::SendPlain => x,
                };
                ws.push(x);
                let dma = if inline { None } else { sges.first().map(|s| (s.0, s.1)) };
                pend.push(Pending { wr_id: id, chunk, dma, ulp_signaled: w.signaled });
            }
        }
        let q = s.queue.as_ref().unwrap();
        let no_restore = s.no_restore;
        let before: Vec<(u64, u32)> = ws.iter().map(|w| (w.wr.wr_id, w.wr.send_flags)).collect();
        // Accepted WRs are recorded before the call: a release may come from inside it (a failed queue, at
        // once). The refused suffix is taken back after.
        {
            let mut b = s.book.borrow_mut();
            for p in &pend {
                b.sends.push_back(*p);
            }
        }
        let r = sim_support::qpost(q, &mut ws);
        let taken = match r {
            Ok(()) => ws.len(),
            Err((e, bad)) => {
                ensure!(e != libc::ENOMEM, "queue {i}: the provider's ENOMEM reached the ULP");
                ensure!(e == libc::EAGAIN || e == libc::EIO, "queue {i}: post failed with errno {e}");
                bad.ok_or_else(|| format!("queue {i}: *bad_wr is not in the chain"))?
            }
        };
        let after: Vec<(u64, u32)> = ws.iter().map(|w| (w.wr.wr_id, w.wr.send_flags)).collect();
        // A queue that leaves WRs as posted owes the WRs it did not take, and every link, as they were; an
        // indexed one owes their flags only.
        let kept = if no_restore { taken } else { 0 };
        if s.indexed {
            let flags = |v: &[(u64, u32)]| v.iter().map(|x| x.1).collect::<Vec<_>>();
            ensure!(flags(&before[kept..]) == flags(&after[kept..]), "queue {i}: the flags of the WRs not accepted were not restored: {before:?} -> {after:?}");
        } else {
            ensure!(before[kept..] == after[kept..], "queue {i}: the chain was not restored: {before:?} -> {after:?}");
        }
        for (k, w) in ws.iter().enumerate() {
            let want = ws.get(k + 1).map_or(std::ptr::null(), |n| &n.wr as *const _);
            ensure!(std::ptr::eq(w.wr.next, want), "queue {i}: the link after WR {k} of the chain was not restored");
        }
        let mut b = s.book.borrow_mut();
        let refused = &pend[taken..];
        for p in refused.iter().rev() {
            let back = b.sends.pop_back();
            ensure!(back.map(|x| x.wr_id) == Some(p.wr_id), "queue {i}: a refused WR (wr_id {}) was released", p.wr_id);
            if let Some(c) = p.chunk {
                b.free_chunks.push(c);
            }
        }
        b.accepted += taken as u64;
        b.ids.extend(pend[..taken].iter().map(|p| p.wr_id));
        for p in &pend[..taken] {
            if p.ulp_signaled {
                b.ulp_signaled.insert(p.wr_id);
            }
        }
        Ok(())
    }

    fn post_recv(&mut self, i: u8, n: u8) -> Result<(), Fail> {
        let Some(s) = self.slots.get_mut(i as usize).and_then(|s| s.as_mut()) else { return Ok(()) };
        if s.recv != Recv::OwnRq {
            return Ok(());
        }
        let ids: Vec<u64> = (0..n as u64).map(|k| RECV_IDS + s.next_recv + k).collect();
        s.next_recv += n as u64;
        let sges: Vec<(u64, u32, u32)> = ids.iter().map(|id| (s.recv_buf.addr() + (id % (2 * RQ_DEPTH as u64)) * RECV_LEN as u64, RECV_LEN, s.recv_key)).collect();
        s.book.borrow_mut().recvs.extend(ids.iter().copied());
        let r = post_recv_chain(&ids, &sges, |c| s.queue.as_ref().unwrap().post_recv(c).map_err(|e| (e.error.errno(), e.bad.as_ptr())));
        let taken = match r {
            Ok(()) => ids.len(),
            Err((e, k)) => {
                ensure!(e == libc::EAGAIN || e == libc::EIO, "queue {i}: post_recv failed with errno {e}");
                k
            }
        };
        let mut b = s.book.borrow_mut();
        for _ in taken..ids.len() {
            b.recvs.pop_back();
        }
        Ok(())
    }

    fn srq_post(&mut self, n: u8) -> Result<(), Fail> {
        let Some(srq) = self.srq.as_ref() else { return Ok(()) };
        if self.srq_errored {
            return Ok(());
        }
        let ids: Vec<u64> = (0..n as u64).map(|k| self.next_srq_id + k).collect();
        self.next_srq_id += n as u64;
        let sges: Vec<(u64, u32, u32)> = ids.iter().map(|id| (self.srq_buf.addr() + (id % SRQ_DEPTH as u64) * RECV_LEN as u64, RECV_LEN, self.srq_key)).collect();
        self.srq_outstanding.borrow_mut().extend(ids.iter().copied());
        let r = post_recv_chain(&ids, &sges, |c| srq.post_recv(c).map_err(|e| (e.error.errno(), e.bad.as_ptr())));
        let taken = match r {
            Ok(()) => ids.len(),
            Err((e, k)) => {
                ensure!(e == libc::EAGAIN, "SRQ post_recv failed with errno {e}");
                k
            }
        };
        self.srq_accepted += taken as u64;
        let mut out = self.srq_outstanding.borrow_mut();
        for id in &ids[taken..] {
            out.remove(id);
        }
        Ok(())
    }

    fn peer_send(&mut self, i: u8, n: u8, imm: bool) {
        let (src, key) = (self.peer_src.addr(), self.peer_src_key);
        let Some(s) = self.slots.get_mut(i as usize).and_then(|s| s.as_mut()) else { return };
        if s.recv == Recv::NoRecv {
            return;
        }
        for k in 0..n {
            let opcode = if imm { op::IBV_WR_SEND_WITH_IMM } else { op::IBV_WR_SEND };
            let w = sim_support::wr(1_000_000 + k as u64, opcode, SIGNALED, &[(src, 32, key)]).imm(7);
            // The peer's SQ (64) may be full of RNR-stalled sends: then the peer just sends fewer.
            if sim_support::post1(s.peer, w) != 0 {
                break;
            }
        }
    }

    /// Polls a managed CQ until empty; files what it shows under the queues.
    fn poll(&mut self, i: u8) -> Result<(), Fail> {
        if self.cq(i).is_none() {
            return Ok(());
        }
        for _ in 0..64 {
            // SAFETY: all-zero is a valid `ibv_wc`.
            let mut wc: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
            let cq = self.cq(i).unwrap().cq.as_ref().unwrap();
            let n = cq.poll(&mut wc).map_err(|e| format!("CQ {i}: poll failed: {e:?}"))?;
            self.file(&wc[..n]);
            if n < wc.len() {
                break;
            }
        }
        Ok(())
    }

    fn file(&mut self, wcs: &[ibv_wc]) {
        for w in wcs {
            if let Some(s) = self.slots.iter_mut().flatten().find(|s| s.qpn == w.qp_num) {
                if w.wr_id >= SRQ_IDS {
                    if w.status == OK {
                        self.srq_shown.push(w.wr_id);
                    }
                } else if w.wr_id >= RECV_IDS {
                    s.shown_recvs.push((w.wr_id, w.status));
                } else if s.indexed {
                    // The completion of an indexed queue's WR carries its index.
                    let id = s.book.borrow().ids.get(w.wr_id as usize).copied().unwrap_or(u64::MAX);
                    s.shown_sends.push((id, w.status));
                } else {
                    s.shown_sends.push((w.wr_id, w.status));
                }
            }
        }
    }

    fn arm(&mut self, i: u8) -> Result<(), Fail> {
        let Some(c) = self.cq(i) else { return Ok(()) };
        let (raw, broken) = (c.raw, c.broken);
        // Events of earlier arms are taken first, so that only this arm's can count below.
        self.take_channel_events(None);
        let c = self.cq(i).unwrap();
        // SAFETY: all-zero is a valid `ibv_wc`.
        let mut wc: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
        let n = c.cq.as_ref().unwrap().arm(false, &mut wc).map_err(|e| format!("CQ {i}: arm failed: {e:?}"))?;
        self.file(&wc[..n]);
        if n > 0 || broken {
            return Ok(());
        }
        // Armed and empty: a ULP now sleeps. Any WQE still held must raise the event once done.
        let waiting = self.slots.iter().flatten().filter(|s| s.send_cq == i).any(|s| s.queue.as_ref().unwrap().stats().in_provider > 0);
        if waiting && self.dev.run_until_idle(20_000).is_ok() {
            ensure!(self.take_channel_events(Some(raw)), "CQ {i}: armed with WQEs in flight, told it was safe to sleep, and no completion event came");
        }
        Ok(())
    }

    fn defer(&mut self, i: u8) -> Result<(), Fail> {
        let Some(s) = self.slots.get(i as usize).and_then(|s| s.as_ref()) else { return Ok(()) };
        let target = s.book.borrow().accepted;
        let bar = Rc::new(Barrier { runs: Cell::new(0) });
        self.barriers.push(bar.clone());
        let (book, errs) = (s.book.clone(), self.errors.clone());
        s.queue.as_ref().unwrap().defer(Deferred::Closure(Box::new(move || {
            bar.runs.set(bar.runs.get() + 1);
            // Every WR before the barrier is released now: a quiet queue's successes among them made no call.
            if book.borrow().quiet {
                book.borrow_mut().catch_up(target);
            }
            let released = book.borrow().released;
            if released != target {
                errs.borrow_mut().push(format!("queue {i}: a deferred action ran with {released} WRs released; it was deferred behind {target}"));
            }
        }))).unwrap();
        Ok(())
    }

    fn invalidate(&mut self, i: u8, fenced: bool) -> Result<(), Fail> {
        let Some(s) = self.slots.get(i as usize).and_then(|s| s.as_ref()) else { return Ok(()) };
        if s.book.borrow().quiet {
            return Ok(());
        }
        let rkey = keys(s.mr);
        let target = s.book.borrow().accepted;
        let bar = Rc::new(Barrier { runs: Cell::new(0) });
        let (book, errs, probe) = (s.book.clone(), self.errors.clone(), self.to_probe.clone());
        let addr = s.book.borrow().buf.addr() + PROBE_OFF;
        let b2 = bar.clone();
        let done = ReleaseHandler::Closure(Box::new(move |c: &Completion| {
            b2.runs.set(b2.runs.get() + 1);
            let released = book.borrow().released;
            if c.status == OK {
                if released < target {
                    errs.borrow_mut().push(format!("queue {i}: the invalidation of {rkey:#x} completed with {released} of the {target} WRs before it released"));
                }
                probe.borrow_mut().push((rkey, addr));
            }
        }));
        let mode = if fenced { InvalidateMode::Fenced } else { InvalidateMode::Deferred };
        let r = s.queue.as_ref().unwrap().invalidate(rkey, mode, 0xdead_0000 + target, Some(done));
        match r {
            Ok(()) => {
                self.slots[i as usize].as_mut().unwrap().inv_pending.push(bar.clone());
                self.barriers.push(bar)
            }
            Err(e) => ensure!(e.errno() == libc::EIO || e.errno() == libc::EAGAIN, "queue {i}: invalidate failed: {e:?}"),
        }
        // New WRs use a new registration of the same memory.
        let mr = self.reg(&self.slots[i as usize].as_ref().unwrap().book.borrow().buf.clone());
        let s = self.slots[i as usize].as_mut().unwrap();
        s.mr = mr;
        s.invalidations += 1;
        Ok(())
    }

    fn defer_dereg(&mut self, i: u8) {
        let Some(s) = self.slots.get(i as usize).and_then(|s| s.as_ref()) else { return };
        let old = s.mr;
        // SAFETY: `old` is a live MR of the device, deregistered by nothing else (the slot stops using it now).
        s.queue.as_ref().unwrap().defer_teardown(Some(keys(old)), unsafe { Teardown::dereg_mr(old) }).unwrap();
        let mr = self.reg(&s.book.borrow().buf.clone());
        self.slots[i as usize].as_mut().unwrap().mr = mr;
    }

    fn drain(&mut self, i: u8) -> Result<(), Fail> {
        let Some(s) = self.slots.get_mut(i as usize).and_then(|s| s.as_mut()) else { return Ok(()) };
        s.drained = true;
        let r = s.queue.as_ref().unwrap().drain();
        sync_quiet(s);
        let left = s.book.borrow().sends.len();
        match r {
            Ok(()) => ensure!(left == 0, "queue {i}: drain says done with {left} WRs not released"),
            Err(e) => ensure!(e.errno() == libc::EINPROGRESS, "queue {i}: drain failed: {e:?}"),
        }
        Ok(())
    }

    /// Hands the sim's asynchronous events to their owners, as a ULP's event thread does.
    fn events(&mut self) -> Result<(), Fail> {
        while let Some(e) = self.dev.get_async_event() {
            self.report.async_events += 1;
            match e.element {
                AsyncElement::Qp(qp) => {
                    let Some(s) = self.slots.iter_mut().flatten().find(|s| s.qp == qp) else { continue };
                    match e.event_type {
                        ev::IBV_EVENT_QP_FATAL | ev::IBV_EVENT_QP_LAST_WQE_REACHED => {
                            if e.event_type == ev::IBV_EVENT_QP_FATAL {
                                ensure!(s.tainted, "QP_FATAL on queue {} that no fault touched", s.book.borrow().slot);
                            }
                            s.queue.as_ref().unwrap().on_async_event(e.event_type as u32).map_err(|x| format!("on_async_event: {x:?}"))?;
                        }
                        t => return Err(format!("unexpected QP event {t:?}")),
                    }
                }
                AsyncElement::Cq(cq) => {
                    let Some((i, c)) = self.cqs.iter().enumerate().find_map(|(i, c)| c.as_ref().filter(|c| c.raw == cq).map(|c| (i, c))) else { continue };
                    ensure!(e.event_type == ev::IBV_EVENT_CQ_ERR, "unexpected CQ event {:?}", e.event_type);
                    ensure!(c.broken, "CQ {i} overran although only managed queues use it (the budget failed)");
                    c.cq.as_ref().unwrap().on_async_event(e.event_type as u32).map_err(|x| format!("CQ on_async_event: {x:?}"))?;
                }
                AsyncElement::Srq(_) => {
                    ensure!(e.event_type == ev::IBV_EVENT_SRQ_ERR || e.event_type == ev::IBV_EVENT_SRQ_LIMIT_REACHED, "unexpected SRQ event {:?}", e.event_type);
                }
                #[allow(unreachable_patterns)]
                _ => {}
            }
        }
        Ok(())
    }

    fn inject(&mut self, i: u8, fault: Fault) {
        let now = self.dev.now();
        let Some(s) = self.slots.get_mut(i as usize).and_then(|s| s.as_mut()) else { return };
        let f = match fault {
            Fault::LoseRequests(n) => SimFault { count: n as u32, ..SimFault::new(SQD_SIM_FAULT_LOSE_REQUESTS, s.qp) },
            Fault::LoseAcks(n) => SimFault { count: n as u32, ..SimFault::new(SQD_SIM_FAULT_LOSE_ACKS, s.qp) },
            Fault::RemoteAccess => SimFault::new(SQD_SIM_FAULT_REMOTE_ACCESS, s.qp),
            Fault::Starve(n) => SimFault { count: n as u32, ..SimFault::new(SQD_SIM_FAULT_RECV_STARVE, s.peer) },
            Fault::FailNext => SimFault { status: st::IBV_WC_LOC_QP_OP_ERR, vendor_err: 0x51, ..SimFault::new(SQD_SIM_FAULT_FAIL_NEXT, s.qp) },
            Fault::Fatal(d) => SimFault { at_step: now + d as u64, ..SimFault::new(SQD_SIM_FAULT_QP_FATAL, s.qp) },
            Fault::SetError => {
                s.tainted = true;
                self.report.faults += 1;
                self.dev.set_error(s.qp).unwrap();
                return;
            }
        };
        if matches!(fault, Fault::RemoteAccess | Fault::FailNext | Fault::Fatal(_)) {
            s.tainted = true;
        }
        if matches!(fault, Fault::LoseRequests(_) | Fault::LoseAcks(_)) {
            s.lossy = true;
        }
        self.dev.inject(&f).unwrap();
        self.report.faults += 1;
    }

    fn overrun(&mut self, i: u8) {
        let Some(c) = self.cqs.get_mut(i as usize).and_then(|c| c.as_mut()) else { return };
        if c.broken {
            return;
        }
        c.broken = true;
        let (raw, cap) = (c.raw, c.cq.as_ref().unwrap().stats().capacity as u32);
        let n = cap + 8;
        let qp = self.dev.create_qp(&mut sim_support::qp_attr(raw, raw, n, 1)).unwrap();
        let peer = self.dev.create_qp(&mut sim_support::qp_attr(self.peer_cq, self.peer_cq, 8, 1)).unwrap();
        self.dev.connect(qp, peer, &SimConnAttr::default()).unwrap();
        for k in 0..n {
            assert_eq!(sim_support::post1(qp, sim_support::wr(5_000_000 + k as u64, op::IBV_WR_RDMA_WRITE, SIGNALED, &[]).rdma(0, 0)), 0);
        }
        self.intruders.push(qp);
        self.intruders.push(peer);
        self.overruns += 1;
        for s in self.slots.iter_mut().flatten() {
            if s.send_cq == i || (s.recv != Recv::NoRecv && s.recv_cq == i) {
                s.tainted = true;
            }
        }
        self.report.faults += 1;
    }

    /// The peers' side: poll their CQ, keep their receive queues supplied.
    fn pump_peers(&mut self) {
        let (dst, key) = (self.peer_dst.addr(), self.peer_dst_key);
        for w in sim_support::poll(self.peer_cq, 256) {
            let Some(s) = self.slots.iter_mut().flatten().find(|s| w.qp_num == peer_qpn(s.peer)) else { continue };
            if w.status != OK {
                s.peer_dead = true;
            } else if w.wr_id & PEER_RECV != 0 {
                s.peer_recvs -= 1;
            }
        }
        for s in self.slots.iter_mut().flatten().filter(|s| !s.peer_dead) {
            while s.peer_recvs < PEER_RQ {
                let id = PEER_RECV | s.peer_recvs as u64;
                if sim_support::post_recv(s.peer, id, &[(dst + PEER_DST_LEN as u64 / 2, RECV_LEN, key)]) != 0 {
                    break;
                }
                s.peer_recvs += 1;
            }
        }
    }

    /// The peer tries every rkey the library reported invalidated, from a new connection: it must fail.
    fn probe(&mut self) -> Result<(), Fail> {
        let keys: Vec<(u32, u64)> = self.to_probe.borrow_mut().drain(..).collect();
        for (rkey, addr) in keys {
            self.report.rkeys_probed += 1;
            let (c, a2) = (self.probe_cqs.0, self.probe_cqs.1);
            let x = self.dev.create_qp(&mut sim_support::qp_attr(c, c, 4, 1)).unwrap();
            let y = self.dev.create_qp(&mut sim_support::qp_attr(a2, a2, 4, 1)).unwrap();
            self.dev.connect(x, y, &SimConnAttr::default()).unwrap();
            let before = read_at(addr, 8);
            let w = sim_support::wr(1, op::IBV_WR_RDMA_WRITE, SIGNALED, &[(self.peer_src.addr(), 8, self.peer_src_key)]).rdma(addr, rkey);
            ensure!(sim_support::post1(x, w) == 0, "probe post failed");
            let got = sim_support::poll_n(c, 1, 20_000);
            ensure!(got.len() == 1, "the probe of rkey {rkey:#x} did not complete");
            ensure!(
                got[0].status == st::IBV_WC_REM_ACCESS_ERR || got[0].status == st::IBV_WC_RETRY_EXC_ERR,
                "rkey {rkey:#x} was reported invalidated, yet the peer's RDMA WRITE with it completed with status {}",
                got[0].status
            );
            ensure!(read_at(addr, 8) == before, "rkey {rkey:#x}: reported invalidated, yet the peer wrote through it");
            sim_support::poll(a2, 64);
            self.dev.destroy_qp(x).unwrap();
            self.dev.destroy_qp(y).unwrap();
            sim_support::poll(c, 64);
        }
        Ok(())
    }

    /// The rules checked after every operation.
    fn check(&mut self) -> Result<(), Fail> {
        for s in self.slots.iter().flatten() {
            sync_quiet(s);
        }
        if let Some(e) = self.errors.borrow().first() {
            return Err(e.clone());
        }
        let broken = self.overruns > 0;
        for v in self.dev.violation_log() {
            ensure!(v.kind == SQD_SIM_VIOLATION_CQ_OVERRUN && broken, "the sim logged a violation: {v:?}");
        }
        let ds = self.dev.stats();
        ensure!(ds.sq_overflows == 0 && ds.rq_overflows == 0, "the provider was asked to overflow an SQ or RQ: {ds:?}");
        for (i, c) in self.cqs.iter().enumerate() {
            let Some(c) = c else { continue };
            let cs = c.cq.as_ref().unwrap().stats();
            ensure!(cs.stray == 0, "CQ {i}: {} CQE(s) of managed QPs matched no WR", cs.stray);
            ensure!(cs.reserved <= cs.capacity, "CQ {i}: reserved beyond capacity: {cs:?}");
        }
        for s in self.slots.iter().flatten() {
            let q = s.queue.as_ref().unwrap();
            let st = q.stats();
            let b = s.book.borrow();
            // The library's own LocalInvs count in `accepted`/`released` too; never a ULP WR more or less.
            ensure!(
                st.accepted >= b.accepted && st.released >= b.released && st.accepted - b.accepted >= st.released - b.released && st.accepted - b.accepted <= s.invalidations,
                "queue {}: stats {st:?} vs book accepted {} released {}",
                b.slot,
                b.accepted,
                b.released
            );
            ensure!(st.in_provider <= s.sq && st.in_provider + st.credits == s.sq, "queue {}: {} WQEs in the provider, {} credits, SQ {}", b.slot, st.in_provider, st.credits, s.sq);
            let dq = sqdisc_sim::scripted::Scriptable::qp_stats(&**self.dev, s.qp).unwrap();
            ensure!(dq.max_outstanding <= s.sq as u64, "queue {}: the provider held {} WQEs, SQ depth {}", b.slot, dq.max_outstanding, s.sq);
        }
        Ok(())
    }

    // ---- teardown ----------------------------------------------------------------------------------------

    /// Drains every queue (liveness), then frees everything and checks the whole-life rules.
    pub fn finish(mut self) -> Result<Report, Fail> {
        self.events()?;
        // 1. Graceful: drain every queue, polling as a ULP would, until everything is released.
        let mut round = 0;
        loop {
            let mut left = Vec::new();
            for i in 0..SLOTS {
                if let Some(s) = self.slots[i as usize].as_mut() {
                    s.drained = true;
                    // Receives wait for the error state (phase 2): here only the sends must all be released.
                    match s.queue.as_ref().unwrap().drain() {
                        Ok(()) => {}
                        Err(e) if e.errno() == libc::EINPROGRESS => {
                            if !s.book.borrow().sends.is_empty() {
                                left.push(i)
                            }
                        }
                        Err(e) => return Err(format!("queue {i}: drain failed in teardown: {e:?}")),
                    }
                }
            }
            if left.is_empty() {
                break;
            }
            round += 1;
            if round > TEARDOWN_ROUNDS {
                let st: Vec<_> = left.iter().map(|&i| self.slots[i as usize].as_ref().unwrap().queue.as_ref().unwrap().stats()).collect();
                return Err(format!("queues {left:?} do not drain after {TEARDOWN_ROUNDS} polls each: {st:?}"));
            }
            for c in 0..CQS {
                self.poll(c)?;
            }
            self.events()?;
            self.pump_peers();
            self.probe()?;
            self.check()?;
        }
        for i in 0..SLOTS {
            if let Some(s) = self.slots[i as usize].as_ref() {
                sync_quiet(s);
                let b = s.book.borrow();
                ensure!(b.sends.is_empty(), "queue {i}: drained with WRs outstanding");
            }
        }
        // 2. Receives: move every QP to the error state so they flush; SRQ queues wait for LAST_WQE_REACHED.
        for s in self.slots.iter_mut().flatten() {
            s.tainted = true;
            let _ = self.dev.set_error(s.qp);
        }
        let mut round = 0;
        while self.slots.iter().any(|s| s.is_some()) {
            self.events()?;
            for c in 0..CQS {
                self.poll(c)?;
            }
            self.check()?;
            for i in 0..SLOTS {
                if let Some(s) = self.slots[i as usize].as_ref() {
                    if s.queue.as_ref().unwrap().check_free().is_ok() {
                        self.final_checks(i)?;
                        self.retire(i);
                    }
                }
            }
            round += 1;
            if round > TEARDOWN_ROUNDS {
                let left: Vec<(u8, sqdisc::QueueStats)> =
                    (0..SLOTS).filter_map(|i| self.slots[i as usize].as_ref().map(|s| (i, s.queue.as_ref().unwrap().stats()))).collect();
                return Err(format!("queues never became free after their QPs went to error: {left:?}"));
            }
        }
        // 3. Barriers and invalidations ran exactly once each.
        self.report.defers = self.barriers.len() as u64;
        for (k, b) in self.barriers.iter().enumerate() {
            ensure!(b.runs.get() == 1, "deferred action or invalidation #{k} ran {} times", b.runs.get());
        }
        // 4. The SRQ: every receive released exactly once.
        if let Some(srq) = self.srq.take() {
            srq.release_all().map_err(|e| format!("SRQ release_all: {e:?}"))?;
            ensure!(self.srq_outstanding.borrow().is_empty(), "SRQ receives never released: {:?}", self.srq_outstanding.borrow());
            let rel = self.srq_released.borrow();
            let ids: BTreeSet<u64> = rel.iter().map(|r| r.0).collect();
            ensure!(ids.len() == rel.len() && rel.len() as u64 == self.srq_accepted, "SRQ: {} releases of {} distinct receives, {} accepted", rel.len(), ids.len(), self.srq_accepted);
            let ok: BTreeSet<u64> = rel.iter().filter(|r| r.1 == OK).map(|r| r.0).collect();
            let shown: BTreeSet<u64> = self.srq_shown.iter().copied().collect();
            ensure!(shown.len() == self.srq_shown.len() && ok == shown, "SRQ: receives released with success {ok:?}, shown {shown:?}");
            drop(rel);
            srq.check_free().map_err(|e| format!("SRQ check_free: {e:?}"))?;
            drop(srq);
            self.dev.destroy_srq(self.srq_raw).map_err(|e| format!("destroy SRQ: {e:?}"))?;
        }
        // 5. CQs: no reservation left, the device agrees nothing uses them.
        for i in 0..CQS {
            if self.cq(i).is_some() {
                self.free_cq(i)?;
                ensure!(self.cq(i).is_none(), "CQ {i} could not be freed with every queue gone");
            }
        }
        for qp in std::mem::take(&mut self.intruders) {
            self.dev.destroy_qp(qp).unwrap();
        }
        self.check()?;
        let ds = self.dev.stats();
        self.report.lost += ds.packets_lost + ds.acks_lost;
        self.report.rnr_naks += ds.rnr_naks;
        Ok(self.report)
    }

}

impl Drop for World {
    fn drop(&mut self) {
        // The library's objects first, then the device, then the memory it could touch.
        for s in self.slots.iter_mut().flatten() {
            drop(s.queue.take());
        }
        self.srq = None;
        for c in self.cqs.iter_mut().flatten() {
            drop(c.cq.take());
        }
        self.barriers.clear();
        self.slots.clear();
    }
}

/// Writes `v` over one chunk of `buf` at `off`.
fn fill(buf: &Buf, off: u64, v: u8) {
    buf.write(off as usize, &[v; CHUNK as usize]);
}

fn peer_qpn(qp: *mut ibv_qp) -> u32 {
    // SAFETY: a live QP of the device.
    unsafe { (*qp).qp_num }
}

fn read_at(addr: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0; n];
    // SAFETY: `addr` is inside a live buffer of the world (a queue's probe area, `n` bytes long).
    unsafe { ptr::copy_nonoverlapping(addr as *const u8, v.as_mut_ptr(), n) };
    v
}

fn is_subsequence<T: PartialEq>(small: &[T], big: &[T]) -> bool {
    let mut it = big.iter();
    small.iter().all(|x| it.any(|y| y == x))
}
