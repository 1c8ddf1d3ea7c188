//! The library's target-scale features on the software HCA, each test failing if its feature broke:
//!
//! 1. an NVMe-oF-like target: 64 connections, one managed CQ sized by the budget rules, one managed SRQ
//!    refilled from its release callback, RDMA WRITE + response SEND per command through sqdisc, under
//!    request/ACK loss and QP failures mid-run; every WR and receive released exactly once; the last-WQE rule;
//! 2. 10,000 queues on one CQ: phase times, memory per queue and per slot, every WR released, budget back to 0;
//! 3. event mode: a sleeper using `Cq::arm` (arm, then poll again) and epoll on the completion channel, a
//!    driver thread stepping the sim; no completion is ever stranded;
//! 4. the asynchronous event path: a CQ overrun (`IBV_EVENT_CQ_ERR`) and an injected `IBV_EVENT_QP_FATAL`
//!    release every outstanding WR once, with flush status, without any CQE;
//! 5. SRQ details: the low-watermark refill keeps the SRQ from starving, `Srq::release_all`, the counters.
//!
//! `cargo test` runs bounded variants; `SQDISC_SOAK=1` (`make soak`) runs the same tests scaled up.

mod sim_support;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::ptr;
use std::rc::{Rc, Weak};
use std::time::Instant;

use rdma_sys::{ibv_cq, ibv_event_type as ev, ibv_qp, ibv_recv_wr, ibv_sge, ibv_srq_init_attr, ibv_wc, ibv_wc_opcode};
use sim_support::*;
use sqdisc::discipline::budget::cq_depth_for;
use sqdisc_sim::*;
use std::result::Result;
use sqdisc::verbs::{CqHandle, QpHandle, RecvChain, SrqHandle};
use sqdisc::{Completion, Cq, Queue, QueueConfig, ReleaseHandler, Srq, SQD_COMPLETION_NEVER_POSTED};

const FLUSH: u32 = st::IBV_WC_WR_FLUSH_ERR;
const OK: u32 = st::IBV_WC_SUCCESS;

/// `SQDISC_SOAK=1` (anything but empty or 0) scales every test up.
fn soak() -> bool {
    std::env::var("SQDISC_SOAK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// `bounded` in `cargo test`, `heavy` under `SQDISC_SOAK=1`.
fn scaled<T>(bounded: T, heavy: T) -> T {
    if soak() {
        heavy
    } else {
        bounded
    }
}

/// A small deterministic generator for the tests' own choices (which QPs fail, chain lengths).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Ends a loop that stopped making progress, fast and with a message, instead of letting a liveness bug spin it
/// through millions of turns: `check` fails once `limit` turns in a row saw the same progress measure.
struct Progress {
    last: u64,
    idle: u64,
    limit: u64,
}

impl Progress {
    fn new(limit: u64) -> Progress {
        Progress { last: u64::MAX, idle: 0, limit }
    }

    /// `now` is a measure that grows with every step of useful work (WRs posted, completed, released...).
    #[track_caller]
    fn check(&mut self, now: u64, state: impl FnOnce() -> String) {
        if now != self.last {
            self.last = now;
            self.idle = 0;
            return;
        }
        self.idle += 1;
        assert!(self.idle < self.limit, "no progress in {} turns of the loop: {}", self.limit, state());
    }
}

fn reg(dev: &SimDevice, buf: &Buf) -> (u32, u32) {
    // SAFETY: every buffer outlives the device that registered it (declared before it in each test).
    mr_keys(unsafe { dev.reg_mr(buf.ptr().cast(), buf.len(), ACCESS_ALL) }.unwrap())
}

fn srq_attr(max_wr: u32) -> ibv_srq_init_attr {
    // SAFETY: plain data; all-zero is valid.
    let mut a: ibv_srq_init_attr = unsafe { std::mem::zeroed() };
    a.attr.max_wr = max_wr;
    a.attr.max_sge = 1;
    a
}

/// Posts receives `(wr_id, addr, len, lkey)` as one chain to a managed SRQ; `Err(errno)` if any was refused.
fn srq_post(srq: &Srq, recvs: &[(u64, u64, u32, u32)]) -> Result<(), i32> {
    let mut sges: Vec<ibv_sge> = recvs.iter().map(|&(_, addr, length, lkey)| ibv_sge { addr, length, lkey }).collect();
    // SAFETY: all-zero is a valid `ibv_recv_wr`.
    let mut wrs: Vec<ibv_recv_wr> = recvs.iter().map(|_| unsafe { std::mem::zeroed() }).collect();
    let n = wrs.len();
    let (base, sge_base) = (wrs.as_mut_ptr(), sges.as_mut_ptr());
    for (i, r) in recvs.iter().enumerate() {
        // SAFETY: `i < n`; both pointers cover `n` elements; no reference into the vectors is live.
        unsafe {
            let w = base.add(i);
            (*w).wr_id = r.0;
            (*w).num_sge = 1;
            (*w).sg_list = sge_base.add(i);
            (*w).next = if i + 1 < n { base.add(i + 1) } else { ptr::null_mut() };
        }
    }
    // SAFETY: the chain lives here for the whole call.
    srq.post_recv(unsafe { RecvChain::from_raw(base) }).map_err(|e| e.error.errno())
}

fn cq_handle(cq: *mut ibv_cq) -> CqHandle {
    // SAFETY: every CQ passed here lives as long as its device, which outlives the library's handles.
    unsafe { CqHandle::from_raw(cq) }.unwrap()
}

fn qp_handle(qp: *mut ibv_qp) -> QpHandle {
    // SAFETY: as above, for QPs.
    unsafe { QpHandle::from_raw(qp) }.unwrap()
}

fn qpn(qp: *mut ibv_qp) -> u32 {
    // SAFETY: a live sim QP.
    unsafe { (*qp).qp_num }
}

fn to_wc(w: &ibv_wc) -> Wc {
    Wc {
        wr_id: w.wr_id,
        status: w.status,
        opcode: w.opcode,
        byte_len: w.byte_len,
        wc_flags: w.wc_flags,
        // SAFETY: both union members are a u32.
        imm: unsafe { w.imm_data_invalidated_rkey_union.imm_data },
        qp_num: w.qp_num,
    }
}

/// Polls a managed CQ once into a 64-entry array.
fn mpoll(cq: &Cq) -> Vec<Wc> {
    // SAFETY: all-zero is a valid `ibv_wc`.
    let mut wc: [ibv_wc; 64] = unsafe { std::mem::zeroed() };
    let n = cq.poll(&mut wc).expect("managed poll");
    wc[..n].iter().map(to_wc).collect()
}

const EV_QP_FATAL: u32 = ev::IBV_EVENT_QP_FATAL as u32;
const EV_LAST_WQE: u32 = ev::IBV_EVENT_QP_LAST_WQE_REACHED as u32;

/// One release of a send WR: (wr_id, status, flags).
type SendLog = Rc<RefCell<Vec<(u64, u32, u32)>>>;

fn send_logger(log: &SendLog) -> ReleaseHandler {
    let log = log.clone();
    ReleaseHandler::Closure(Box::new(move |c: &Completion| {
        assert!(!c.is_recv(), "a send queue released a receive: {c:?}");
        log.borrow_mut().push((c.wr_id, c.status, c.flags));
    }))
}

/// Checks a queue's release log: wr_ids 0..accepted, each once, in post order; successes first, then (if the
/// queue failed) only flushes. Returns how many were flushed.
fn check_send_log(what: &str, log: &[(u64, u32, u32)], accepted: u64, may_fail: bool) -> u64 {
    let ids: Vec<u64> = log.iter().map(|r| r.0).collect();
    assert!(ids.iter().copied().eq(0..accepted), "{what}: releases are not 0..{accepted} in order: {:?}", &ids[..ids.len().min(40)]);
    let first_bad = log.iter().position(|r| r.1 != OK).unwrap_or(log.len());
    let bad = &log[first_bad..];
    assert!(bad.iter().all(|r| r.1 == FLUSH), "{what}: after the failure every release is a flush: {:?}", &bad[..bad.len().min(8)]);
    assert!(may_fail || bad.is_empty(), "{what}: a healthy queue released {} WR(s) as failed", bad.len());
    bad.len() as u64
}

// ---- 1. an NVMe-oF-like target ----------------------------------------------------------------------------

const CONNS: usize = 64;
/// Commands an initiator keeps outstanding: two WRs each at the target, so a target queue of 128 also parks.
const WINDOW: u64 = 96;
const TARGET_SQ: u32 = 128;
const SRQ_DEPTH: u32 = 2048;
/// Bytes the target writes per command; bytes of a command; bytes of an SRQ receive buffer.
const DLEN: u32 = 256;
const CMD_LEN: u32 = 24;
const RBUF: u64 = 64;

#[derive(Debug, Clone, Copy)]
struct Cmd {
    id: u64,
    addr: u64,
    rkey: u32,
    len: u32,
}

impl Cmd {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(CMD_LEN as usize);
        v.extend_from_slice(&self.id.to_le_bytes());
        v.extend_from_slice(&self.addr.to_le_bytes());
        v.extend_from_slice(&self.rkey.to_le_bytes());
        v.extend_from_slice(&self.len.to_le_bytes());
        v
    }
    fn decode(b: &[u8]) -> Cmd {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        Cmd { id: u64_at(0), addr: u64_at(8), rkey: u32_at(16), len: u32_at(20) }
    }
}

/// The target's SRQ side: receive buffers, the receives outstanding, and the commands its release callback
/// copied out before reposting the buffer.
struct SrqSide {
    srq: RefCell<Weak<Srq>>,
    bufs: Buf,
    lkey: u32,
    seq: Cell<u64>,
    /// Posted and not yet released.
    outstanding: RefCell<HashSet<u64>>,
    posts: Cell<u64>,
    released_ok: Cell<u64>,
    released_never_posted: Cell<u64>,
    released_other: Cell<u64>,
    /// Releases of a wr_id that was not outstanding (a second release, or one never posted).
    unexpected: Cell<u64>,
    commands: RefCell<HashMap<u64, Cmd>>,
    /// Repost a buffer as soon as its receive is released; otherwise the buffer goes to `free`.
    refill: Cell<bool>,
    free: RefCell<Vec<u64>>,
}

impl SrqSide {
    fn new(slots: u32, bufs: Buf, lkey: u32) -> Rc<SrqSide> {
        assert!(bufs.len() as u64 >= slots as u64 * RBUF);
        Rc::new(SrqSide {
            srq: RefCell::new(Weak::new()),
            bufs,
            lkey,
            seq: Cell::new(0),
            outstanding: RefCell::default(),
            posts: Cell::new(0),
            released_ok: Cell::new(0),
            released_never_posted: Cell::new(0),
            released_other: Cell::new(0),
            unexpected: Cell::new(0),
            commands: RefCell::default(),
            refill: Cell::new(true),
            free: RefCell::default(),
        })
    }

    /// Receives into buffers `slots`, each with a fresh wr_id (`seq << 16 | slot`).
    fn post(&self, slots: impl Iterator<Item = u64>) -> Result<(), i32> {
        let srq = self.srq.borrow().upgrade().expect("the SRQ is alive");
        let recvs: Vec<_> = slots
            .map(|slot| {
                let s = self.seq.get() + 1;
                self.seq.set(s);
                (s << 16 | slot, self.bufs.addr() + slot * RBUF, RBUF as u32, self.lkey)
            })
            .collect();
        let r = srq_post(&srq, &recvs);
        if r.is_ok() {
            self.outstanding.borrow_mut().extend(recvs.iter().map(|r| r.0));
            self.posts.set(self.posts.get() + recvs.len() as u64);
        }
        r
    }

    fn release_handler(self: &Rc<Self>) -> ReleaseHandler {
        let me = Rc::downgrade(self);
        ReleaseHandler::Closure(Box::new(move |c: &Completion| {
            let me = me.upgrade().expect("the SRQ side outlives its SRQ");
            assert!(c.is_recv(), "an SRQ release without the receive flag: {c:?}");
            if !me.outstanding.borrow_mut().remove(&c.wr_id) {
                me.unexpected.set(me.unexpected.get() + 1);
                return;
            }
            let slot = c.wr_id & 0xffff;
            if c.status == OK {
                me.released_ok.set(me.released_ok.get() + 1);
                // The command is copied out now: the buffer goes back to the SRQ at once.
                let cmd = Cmd::decode(&me.bufs.read((slot * RBUF) as usize, CMD_LEN as usize));
                me.commands.borrow_mut().insert(c.wr_id, cmd);
            } else if c.never_posted() && c.status == FLUSH {
                me.released_never_posted.set(me.released_never_posted.get() + 1);
            } else {
                me.released_other.set(me.released_other.get() + 1);
            }
            if me.refill.get() && c.status == OK {
                me.post(std::iter::once(slot)).expect("refilling the SRQ from its release callback");
            } else {
                me.free.borrow_mut().push(slot);
            }
        }))
    }
}

/// An initiator: a raw-verbs QP that keeps up to `WINDOW` commands outstanding, in order.
struct Initiator {
    qp: *mut ibv_qp,
    issued: u64,
    sends_done: u64,
    resps_done: u64,
    failed: bool,
}

#[derive(Debug, Default)]
struct TargetReport {
    requests: u64,
    completed: u64,
    target_wrs: u64,
    flushed: u64,
    visible_flushes: u64,
    never_posted: u64,
    late_cqes: u64,
    parked: u64,
    srq_receives: u64,
    steps: u64,
    packets_lost: u64,
    acks_lost: u64,
    rnr_naks: u64,
}

fn target_run(seed: u64, per_conn: u64) -> TargetReport {
    let cfg = SimConfig {
        seed,
        loss_ppm: 10_000,
        ack_loss_ppm: 10_000,
        wire_delay_min: 1,
        wire_delay_max: 4,
        flags: SQD_SIM_STRICT,
        ..SimConfig::default()
    };
    // Buffers first: they outlive the device.
    let cmd_bufs = Buf::new(CONNS * WINDOW as usize * 32, 0);
    let data = Buf::new(CONNS * WINDOW as usize * DLEN as usize, 0);
    let resp_bufs = Buf::new(CONNS * WINDOW as usize * 32, 0);
    let tsrc = Buf::new(CONNS * DLEN as usize, 0);
    for k in 0..CONNS {
        tsrc.write(k * DLEN as usize, &vec![k as u8 + 1; DLEN as usize]);
    }
    let tresp = Buf::new(32, 0xee);
    let srq_bufs = Buf::new(SRQ_DEPTH as usize * RBUF as usize, 0);
    let dev = SimDevice::new(&cfg).unwrap();
    let (cmd_key, _) = reg(&dev, &cmd_bufs);
    let (_, data_rkey) = reg(&dev, &data);
    let (resp_key, _) = reg(&dev, &resp_bufs);
    let (tsrc_key, _) = reg(&dev, &tsrc);
    let (tresp_key, _) = reg(&dev, &tresp);
    let (srq_key, _) = reg(&dev, &srq_bufs);

    // The target's CQ holds exactly what the budget rules reserve: every queue's sq_depth + 1, and the SRQ's
    // depth once.
    let plan = vec![(TARGET_SQ, 0u32); CONNS];
    let tcq_depth = cq_depth_for(&plan) + SRQ_DEPTH as u64;
    let tcq_raw = dev.create_cq(tcq_depth as i32).unwrap();
    let icq = dev.create_cq(CONNS as i32 * 2 * WINDOW as i32).unwrap();
    let mut sa = srq_attr(SRQ_DEPTH);
    let srq_raw = dev.create_srq(&mut sa).unwrap();
    assert_eq!(sa.attr.max_wr, SRQ_DEPTH);

    let mut inis = Vec::new();
    let mut tqps = Vec::new();
    for _ in 0..CONNS {
        let i = dev.create_qp(&mut qp_attr(icq, icq, WINDOW as u32, WINDOW as u32)).unwrap();
        let mut ta = qp_attr(tcq_raw, tcq_raw, TARGET_SQ, 0);
        ta.srq = srq_raw;
        let t = dev.create_qp(&mut ta).unwrap();
        assert_eq!(ta.cap.max_send_wr, TARGET_SQ);
        dev.connect(i, t, &SimConnAttr::default()).unwrap();
        inis.push(Initiator { qp: i, issued: 0, sends_done: 0, resps_done: 0, failed: false });
        tqps.push(t);
    }
    let ini_by_qpn: HashMap<u32, usize> = inis.iter().enumerate().map(|(k, i)| (qpn(i.qp), k)).collect();
    let tgt_by_qpn: HashMap<u32, usize> = tqps.iter().enumerate().map(|(k, &t)| (qpn(t), k)).collect();

    // The library's side of the target.
    let tcq = Cq::new(cq_handle(tcq_raw));
    let side = SrqSide::new(SRQ_DEPTH, srq_bufs, srq_key);
    // SAFETY: the SRQ lives as long as the device, which outlives the managed SRQ.
    let srq = Rc::new(Srq::new(unsafe { SrqHandle::from_raw(srq_raw) }.unwrap(), SRQ_DEPTH, Some(side.release_handler()), 0, None).unwrap());
    *side.srq.borrow_mut() = Rc::downgrade(&srq);
    let qcfg = QueueConfig {
        sq_depth: TARGET_SQ,
        max_send_sge: 4,
        max_inline_data: 64,
        backlog_depth: 2 * WINDOW as u32,
        ..QueueConfig::default()
    };
    let logs: Vec<SendLog> = (0..CONNS).map(|_| SendLog::default()).collect();
    let mut queues: Vec<Option<Queue>> = tqps
        .iter()
        .zip(&logs)
        .map(|(&t, log)| Some(Queue::with_srq(&tcq, &tcq, &srq, qp_handle(t), qcfg, Some(send_logger(log))).unwrap()))
        .collect();
    let cs = tcq.stats();
    assert_eq!((cs.capacity, cs.reserved, cs.queues), (tcq_depth, tcq_depth, CONNS as u32), "the budget fills the CQ exactly");
    // One more queue does not fit: the CQ could overrun with it.
    let mut ta = qp_attr(tcq_raw, tcq_raw, 1, 0);
    ta.srq = srq_raw;
    let extra = dev.create_qp(&mut ta).unwrap();
    let e = Queue::with_srq(&tcq, &tcq, &srq, qp_handle(extra), QueueConfig { sq_depth: 1, ..qcfg }, None).err().unwrap();
    assert_eq!(e.errno(), libc::ENOSPC, "{}", e.message());
    dev.destroy_qp(extra).unwrap();

    side.post(0..SRQ_DEPTH as u64).unwrap();
    for (k, ini) in inis.iter().enumerate() {
        for s in 0..WINDOW {
            let slot = k as u64 * WINDOW + s;
            assert_eq!(post_recv(ini.qp, slot, &[(resp_bufs.addr() + slot * 32, 32, resp_key)]), 0);
        }
    }

    // Which connections fail mid-run, and how: an injected fatal error (the sim raises IBV_EVENT_QP_FATAL) or
    // the ULP moving the QP to the error state (its WQEs flush).
    let mut rng = Rng(seed);
    let mut victims: Vec<usize> = Vec::new();
    while victims.len() < 8 {
        let k = rng.below(CONNS as u64) as usize;
        if !victims.contains(&k) {
            victims.push(k);
        }
    }
    let (fatal, set_err): (Vec<usize>, Vec<usize>) = (victims[..4].to_vec(), victims[4..].to_vec());
    let total = per_conn * CONNS as u64;
    let trigger = total * (2 + rng.below(4)) / 10; // after 20..50% of the responses
    let mut triggered = false;
    let mut fatal_seen = [false; CONNS];
    let mut last_wqe = [false; CONNS];
    let mut next_wr = vec![0u64; CONNS];
    let mut report = TargetReport { requests: total, ..TargetReport::default() };

    let done = |inis: &[Initiator], queues: &[Option<Queue>]| {
        (0..CONNS).all(|k| {
            let q = queues[k].as_ref().unwrap().stats();
            if victims.contains(&k) {
                q.closed == 1 && q.accepted == q.released
            } else {
                inis[k].resps_done == per_conn && inis[k].sends_done == per_conn
            }
        })
    };
    let mut visible_flushes = 0u64;
    let mut progress = Progress::new(20_000);
    while !done(&inis, &queues) {
        let released: u64 = queues.iter().flatten().map(|q| q.stats().released).sum();
        let initiators: u64 = inis.iter().map(|i| i.issued + i.sends_done + i.resps_done + i.failed as u64).sum();
        let events = last_wqe.iter().chain(&fatal_seen).filter(|&&b| b).count() as u64;
        progress.check(released + initiators + events + visible_flushes + triggered as u64, || {
            let queues: Vec<String> = queues
                .iter()
                .flatten()
                .map(|q| {
                    let s = q.stats();
                    format!("{}/{} released, backlog {}, in_provider {}, closed {}", s.released, s.accepted, s.backlog, s.in_provider, s.closed)
                })
                .collect();
            format!("seed {seed}: target queues {queues:?}")
        });
        // Initiators issue commands while their window allows.
        for (k, ini) in inis.iter_mut().enumerate() {
            while !ini.failed && ini.issued < per_conn && ini.issued < ini.sends_done.min(ini.resps_done) + WINDOW {
                let slot = k as u64 * WINDOW + ini.issued % WINDOW;
                let cmd = Cmd { id: ini.issued, addr: data.addr() + slot * DLEN as u64, rkey: data_rkey, len: DLEN };
                cmd_bufs.write((slot * 32) as usize, &cmd.encode());
                let w = wr(ini.issued, op::IBV_WR_SEND, SIGNALED, &[(cmd_bufs.addr() + slot * 32, CMD_LEN, cmd_key)]);
                assert_eq!(post1(ini.qp, w), 0, "seed {seed}: initiator {k} post");
                ini.issued += 1;
            }
        }
        for w in poll(icq, 256) {
            let k = ini_by_qpn[&w.qp_num];
            let ini = &mut inis[k];
            if w.status != OK {
                assert!(victims.contains(&k), "seed {seed}: surviving initiator {k} got status {} for wr {}", w.status, w.wr_id);
                ini.failed = true;
                continue;
            }
            if w.opcode == ibv_wc_opcode::IBV_WC_SEND {
                assert_eq!(w.wr_id, ini.sends_done, "seed {seed}: initiator {k}: send completions in order");
                ini.sends_done += 1;
            } else {
                assert_eq!(w.opcode, ibv_wc_opcode::IBV_WC_RECV);
                assert!(w.wc_flags & rdma_sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0);
                assert_eq!(w.imm as u64, ini.resps_done, "seed {seed}: initiator {k}: responses in command order");
                let slot = k as u64 * WINDOW + ini.resps_done % WINDOW;
                let at = (slot * DLEN as u64) as usize;
                assert_eq!(data.read(at, DLEN as usize), vec![k as u8 + 1; DLEN as usize], "seed {seed}: the WRITE landed before the response");
                data.write(at, &vec![0; DLEN as usize]);
                ini.resps_done += 1;
                let r = w.wr_id;
                assert_eq!(post_recv(ini.qp, r, &[(resp_bufs.addr() + r * 32, 32, resp_key)]), 0);
            }
        }
        // The target: its managed CQ (which runs the SRQ's release callback, refilling it), then its commands.
        for w in mpoll(&tcq) {
            let k = tgt_by_qpn[&w.qp_num];
            if w.status != OK {
                // Sends are unsignaled and SRQ receives do not flush: only the flushes of a failed QP's sends
                // are shown, as raw verbs would show them (an error CQE's opcode is not valid).
                assert_eq!(w.status, FLUSH, "seed {seed}: target {k}: only flushes are shown");
                assert!(victims.contains(&k), "seed {seed}: target {k} showed a flush");
                visible_flushes += 1;
                continue;
            }
            assert_eq!(w.opcode, ibv_wc_opcode::IBV_WC_RECV, "seed {seed}: target {k}: no successful send is shown");
            let cmd = side.commands.borrow_mut().remove(&w.wr_id).expect("the release callback copied the command");
            assert_eq!((cmd.len, w.byte_len), (DLEN, CMD_LEN));
            let q = queues[k].as_ref().unwrap();
            let mut ws = [
                wr(next_wr[k], op::IBV_WR_RDMA_WRITE, 0, &[(tsrc.addr() + (k as u64 * DLEN as u64), DLEN, tsrc_key)]).rdma(cmd.addr, cmd.rkey),
                wr(next_wr[k] + 1, op::IBV_WR_SEND_WITH_IMM, 0, &[(tresp.addr(), 16, tresp_key)]).imm(cmd.id as u32),
            ];
            match qpost(q, &mut ws) {
                Ok(()) => next_wr[k] += 2,
                Err((e, bad)) => {
                    assert_eq!(e, libc::EIO, "seed {seed}: target {k}: a post fails only once the queue failed");
                    assert!(victims.contains(&k));
                    next_wr[k] += bad.unwrap() as u64;
                }
            }
        }
        assert!(side.commands.borrow().is_empty(), "every command released was shown by the poll");
        while let Some(e) = dev.get_async_event() {
            let AsyncElement::Qp(qp) = e.element else { panic!("seed {seed}: unexpected event {e:?}") };
            let k = tgt_by_qpn[&qpn(qp)];
            let q = queues[k].as_ref().unwrap();
            match e.event_type {
                ev::IBV_EVENT_QP_FATAL => {
                    assert!(fatal.contains(&k), "seed {seed}: QP_FATAL on target {k}");
                    fatal_seen[k] = true;
                    q.on_async_event(EV_QP_FATAL).unwrap();
                    let s = q.stats();
                    assert_eq!(s.accepted, s.released, "seed {seed}: target {k}: QP_FATAL released everything at once");
                }
                ev::IBV_EVENT_QP_LAST_WQE_REACHED => {
                    assert!(victims.contains(&k), "seed {seed}: LAST_WQE_REACHED on target {k}");
                    last_wqe[k] = true;
                    q.on_async_event(EV_LAST_WQE).unwrap();
                }
                t => panic!("seed {seed}: unexpected event {t:?} on target {k}"),
            }
        }
        let responses: u64 = inis.iter().map(|i| i.resps_done).sum();
        if !triggered && responses >= trigger {
            triggered = true;
            let now = dev.now();
            for &k in &fatal {
                let at_step = now + 1 + rng.below(40);
                dev.inject(&SimFault { at_step, ..SimFault::new(SQD_SIM_FAULT_QP_FATAL, tqps[k]) }).unwrap();
            }
            for &k in &set_err {
                dev.set_error(tqps[k]).unwrap();
            }
        }
    }
    assert!(triggered, "seed {seed}: the failures were injected mid-run");
    for &k in &fatal {
        assert!(fatal_seen[k] && last_wqe[k], "seed {seed}: target {k}: QP_FATAL then LAST_WQE_REACHED");
    }
    for &k in &set_err {
        assert!(last_wqe[k] && !fatal_seen[k], "seed {seed}: target {k}: set_error raises only LAST_WQE_REACHED");
    }

    // Quiesce the survivors: keep polling until every WR is released (the idle tails are covered by markers).
    for _ in 0..1000 {
        if queues.iter().all(|q| {
            let s = q.as_ref().unwrap().stats();
            s.accepted == s.released
        }) {
            break;
        }
        assert!(mpoll(&tcq).is_empty(), "seed {seed}: nothing more to show");
    }
    for (k, q) in queues.iter().enumerate() {
        let q = q.as_ref().unwrap();
        let s = q.stats();
        let what = format!("seed {seed}: target {k}");
        assert_eq!(s.accepted, next_wr[k], "{what}: accepted");
        assert_eq!(s.stray_cqes, 0, "{what}: stray CQEs");
        assert_eq!(s.refused, 0, "{what}: nothing refused with EAGAIN");
        let flushed = check_send_log(&what, &logs[k].borrow(), s.accepted, victims.contains(&k));
        if !victims.contains(&k) {
            assert_eq!(s.accepted, 2 * per_conn, "{what}: two WRs per command");
        }
        report.target_wrs += s.accepted;
        report.flushed += flushed;
        report.never_posted += logs[k].borrow().iter().filter(|r| r.2 & SQD_COMPLETION_NEVER_POSTED != 0).count() as u64;
        report.late_cqes += s.late_cqes;
        report.parked += s.parked;
    }

    // Free the queues. Victims: their QP is in error and the last WQE was reported. Survivors follow the
    // last-WQE-reached rule, and the library refuses to free them before it is complete.
    side.refill.set(false);
    for k in 0..CONNS {
        let q = queues[k].as_ref().unwrap();
        let what = format!("seed {seed}: target {k}");
        if !victims.contains(&k) {
            assert_eq!(q.check_free().unwrap_err().errno(), libc::EBUSY, "{what}: free before the QP is in error");
            dev.set_error(tqps[k]).unwrap();
            assert_eq!(q.check_free().unwrap_err().errno(), libc::EBUSY, "{what}: free before the last WQE is reported");
            let e = dev.get_async_event().expect("the sim raises LAST_WQE_REACHED");
            assert_eq!(e, AsyncEvent { event_type: ev::IBV_EVENT_QP_LAST_WQE_REACHED, element: AsyncElement::Qp(tqps[k]) });
            q.on_async_event(EV_LAST_WQE).unwrap();
            assert_eq!(q.check_free().unwrap_err().errno(), libc::EBUSY, "{what}: free before the CQ was polled empty");
            assert!(mpoll(&tcq).is_empty(), "{what}: nothing was outstanding");
        }
        q.check_free().unwrap_or_else(|e| panic!("{what}: free: {}", e.message()));
        queues[k] = None;
    }
    assert!(dev.get_async_event().is_none());
    let cs = tcq.stats();
    assert_eq!((cs.reserved, cs.queues, cs.stray, cs.passthrough), (0, 0, 0, 0), "seed {seed}: CQ after the queues: {cs:?}");
    srq.release_all().unwrap();
    let ss = srq.stats();
    assert_eq!(side.unexpected.get(), 0, "seed {seed}: an SRQ receive was released twice or never posted");
    assert_eq!(side.released_other.get(), 0, "seed {seed}: SRQ receives released with an error");
    assert!(side.outstanding.borrow().is_empty(), "seed {seed}: SRQ receives never released");
    assert_eq!(side.posts.get(), side.released_ok.get() + side.released_never_posted.get());
    assert_eq!(side.released_never_posted.get(), SRQ_DEPTH as u64, "the SRQ was kept full");
    assert_eq!((ss.posted, ss.total_posted, ss.cqes, ss.stray_cqes), (0, side.posts.get(), side.released_ok.get(), 0));
    srq.check_free().unwrap();

    let sim = dev.stats();
    assert_eq!((sim.cq_overruns, sim.sq_overflows, sim.rq_overflows), (0, 0, 0), "seed {seed}: {sim:?}");
    assert_eq!(dev.violation_log(), vec![], "seed {seed}: violations");
    assert!(visible_flushes <= report.flushed);
    report.visible_flushes = visible_flushes;
    report.completed = inis.iter().filter(|i| !i.failed).map(|i| i.resps_done).sum();
    report.srq_receives = side.released_ok.get();
    report.steps = sim.steps;
    report.packets_lost = sim.packets_lost;
    report.acks_lost = sim.acks_lost;
    report.rnr_naks = sim.rnr_naks;
    drop(queues);
    drop(srq);
    drop(tcq);
    drop(dev);
    report
}

#[test]
fn nvmf_like_target_survives_loss_and_qp_failures() {
    let seeds = scaled(1..=2u64, 1..=12);
    let per_conn = scaled(150, 1500);
    let t0 = Instant::now();
    for seed in seeds {
        let r = target_run(seed, per_conn);
        assert!(r.completed >= r.requests * 7 / 8, "seed {seed}: the 56 surviving connections completed: {r:?}");
        assert!(r.flushed > 0, "seed {seed}: the failures caught WRs in flight: {r:?}");
        assert!(r.parked > 0, "seed {seed}: the backlog was used: {r:?}");
        assert!(r.packets_lost > 0 && r.acks_lost > 0, "seed {seed}: loss happened: {r:?}");
        eprintln!("target seed {seed}: {r:?}");
    }
    eprintln!("target: {:?}", t0.elapsed());
}

// ---- 2. 10,000 queues on one CQ ---------------------------------------------------------------------------

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    // SAFETY: plain system call.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// Bytes of one queue of `sq_depth` slots and `backlog_depth` parked WRs, as the library counts them.
fn queue_bytes(sq_depth: u32, backlog_depth: u32) -> (usize, u64) {
    let dev = SimDevice::new(&SimConfig::default()).unwrap();
    let raw = dev.create_cq(4096).unwrap();
    let qp = sqdisc_sim::scripted::Scriptable::create_qp(&*dev, raw, raw, &sqdisc_sim::scripted::ScriptedQpCaps::with_depths(sq_depth, 1)).unwrap();
    let cq = Cq::new(cq_handle(raw));
    let cfg = QueueConfig { sq_depth, max_send_sge: 4, max_inline_data: 64, backlog_depth, ..QueueConfig::default() };
    let q = Queue::new(&cq, None, qp_handle(qp), cfg, None).unwrap();
    (q.footprint(), q.stats().bytes)
}

#[test]
fn ten_thousand_queues_on_one_managed_cq() {
    use sqdisc_sim::scripted::{Scriptable, ScriptedQpCaps};
    const N: usize = 10_000;
    const SQ: u32 = 16;
    const BACKLOG: u32 = 16;
    let rounds = scaled(1u64, 8);
    // Per round and queue: a chain that fills the SQ and parks 10 WRs, whose unsignaled tail needs a marker.
    let per_round = (SQ + BACKLOG / 2 + 2) as u64;
    let dev = SimDevice::new(&SimConfig { seed: 3, wire_delay_min: 1, wire_delay_max: 3, ..SimConfig::default() }).unwrap();

    let t0 = Instant::now();
    let cqe = cq_depth_for(&vec![(SQ, 0); N]);
    let raw_cq = dev.create_cq(cqe as i32).unwrap();
    let qps: Vec<*mut ibv_qp> = (0..N).map(|_| Scriptable::create_qp(&*dev, raw_cq, raw_cq, &ScriptedQpCaps::with_depths(SQ, 1)).unwrap()).collect();
    let t_qps = t0.elapsed();

    let rss0 = rss_bytes();
    let t1 = Instant::now();
    let cq = Cq::new(cq_handle(raw_cq));
    // Releases: per queue, the next wr_id expected; anything out of order or failed is counted.
    let next: Rc<Vec<Cell<u64>>> = Rc::new((0..N).map(|_| Cell::new(0)).collect());
    let disorder = Rc::new(Cell::new(0u64));
    let cfg = QueueConfig { sq_depth: SQ, max_send_sge: 4, max_inline_data: 64, backlog_depth: BACKLOG, ..QueueConfig::default() };
    let queues: Vec<Queue> = qps
        .iter()
        .enumerate()
        .map(|(k, &qp)| {
            let (next, disorder) = (next.clone(), disorder.clone());
            let h = ReleaseHandler::Closure(Box::new(move |c: &Completion| {
                let n = &next[k];
                if c.wr_id != n.get() || c.status != OK || c.never_posted() {
                    disorder.set(disorder.get() + 1);
                }
                n.set(n.get() + 1);
            }));
            Queue::new(&cq, None, qp_handle(qp), cfg, Some(h)).unwrap()
        })
        .collect();
    let t_queues = t1.elapsed();
    let rss_queues = rss_bytes().saturating_sub(rss0);
    let cs = cq.stats();
    assert_eq!((cs.capacity, cs.reserved, cs.queues), (cqe, cqe, N as u32), "the budget rules size the CQ exactly");

    let t2 = Instant::now();
    let (mut accepted, mut asked) = (0u64, 0u64);
    let mut visible = 0u64;
    let mut polls = 0u64;
    let mut progress = Progress::new(10_000);
    for round in 0..rounds {
        for (k, q) in queues.iter().enumerate() {
            // The last WR of every chain of every other queue is signaled by the ULP: raw verbs would show it.
            let signal_last = (k as u64 + round) % 2 == 0;
            let mut ws: Vec<W> = (0..per_round)
                .map(|i| {
                    let id = round * per_round + i;
                    let flags = if signal_last && i + 1 == per_round { SIGNALED } else { 0 };
                    wr(id, op::IBV_WR_RDMA_WRITE, flags, &[(0x10_0000 + id * 64, 64, 7)]).rdma(0x20_0000, 9)
                })
                .collect();
            qpost(q, &mut ws).unwrap_or_else(|e| panic!("queue {k}: post {e:?}"));
            accepted += per_round;
            asked += signal_last as u64;
        }
        let target: u64 = (round + 1) * per_round;
        loop {
            // SAFETY: all-zero is a valid `ibv_wc`.
            let mut wc: Vec<ibv_wc> = (0..4096).map(|_| unsafe { std::mem::zeroed() }).collect();
            let n = cq.poll(&mut wc).unwrap();
            polls += 1;
            for w in &wc[..n] {
                assert_eq!((w.status, w.opcode), (OK, ibv_wc_opcode::IBV_WC_RDMA_WRITE), "only the ULP's signaled WRITEs are shown");
                assert_eq!(w.wr_id % per_round, per_round - 1, "the signaled one is the last of its chain");
            }
            visible += n as u64;
            if next.iter().all(|c| c.get() == target) {
                break;
            }
            progress.check(next.iter().map(|c| c.get()).sum::<u64>() + visible, || {
                let stuck = next.iter().position(|c| c.get() != target).unwrap_or(0);
                format!("round {round}: queue {stuck} released {} of {target}: {:?}", next[stuck].get(), queues[stuck].stats())
            });
        }
    }
    let t_traffic = t2.elapsed();
    assert_eq!(disorder.get(), 0, "releases out of order, failed or never posted");
    assert_eq!(visible, asked, "every completion the ULP asked for, nothing else");
    let cs = cq.stats();
    assert_eq!((cs.stray, cs.passthrough), (0, 0), "every CQE dispatched to its queue: {cs:?}");
    assert_eq!(cs.visible, asked);
    assert_eq!(cs.cqes, cs.visible + cs.hidden);
    let (mut bytes, mut parked, mut markers, mut wqes) = (0u64, 0u64, 0u64, 0u64);
    for q in &queues {
        let s = q.stats();
        assert_eq!((s.accepted, s.released, s.in_provider, s.backlog, s.stray_cqes), (rounds * per_round, rounds * per_round, 0, 0, 0));
        assert_eq!(s.bytes, q.footprint() as u64);
        bytes += s.bytes;
        parked += s.parked;
        markers += s.markers;
        wqes += s.wqes;
    }
    assert_eq!(parked, N as u64 * rounds * (per_round - SQ as u64), "every queue parked the rest of its chain each round");
    assert_eq!(markers, N as u64 * rounds - asked, "one idle-tail marker per chain the ULP did not end signaled");

    let t3 = Instant::now();
    for q in &queues {
        q.check_free().unwrap();
    }
    drop(queues);
    let cs = cq.stats();
    assert_eq!((cs.reserved, cs.queues), (0, 0), "the CQ's reservations return to 0");
    cq.check_free().unwrap();
    drop(cq);
    let t_free = t3.elapsed();
    let t4 = Instant::now();
    for &qp in &qps {
        dev.destroy_qp(qp).unwrap();
    }
    dev.destroy_cq(raw_cq).unwrap();
    let t_destroy = t4.elapsed();
    assert_eq!(dev.violation_log(), vec![]);

    let (f16, b16) = queue_bytes(SQ, BACKLOG);
    let (f32_, _) = queue_bytes(2 * SQ, BACKLOG);
    let (f16_0, _) = queue_bytes(SQ, 0);
    let (f16_32, _) = queue_bytes(SQ, 2 * BACKLOG);
    assert_eq!(f16 as u64, b16);
    eprintln!(
        "{N} queues (sq_depth {SQ}, backlog {BACKLOG}) on one CQ of {cqe} CQEs: sim QPs {t_qps:?}, queues {t_queues:?}, traffic \
         {t_traffic:?} ({accepted} WRs, {wqes} WQEs incl. {markers} markers, {} CQEs, {polls} polls), free {t_free:?}, destroy QPs \
         {t_destroy:?}",
        cs.cqes
    );
    eprintln!(
        "memory: {} bytes per queue (stats.bytes; {} in all), {} per SQ slot, {} per backlog slot, {} with no backlog; \
         process RSS grew {} bytes per queue while creating them (release closure and allocator included)",
        bytes / N as u64,
        bytes,
        (f32_ - f16) / SQ as usize,
        (f16_32 - f16) / BACKLOG as usize,
        f16_0,
        rss_queues / N as u64
    );
}

// ---- 3. event mode ----------------------------------------------------------------------------------------

/// Raw pointers handed to the sleeper thread: the sim is thread-safe and its objects outlive the threads.
#[derive(Clone, Copy)]
struct P<T>(*mut T);
// SAFETY: only sim objects, used by threads that end before the device is dropped.
unsafe impl<T> Send for P<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for P<T> {}

fn readable(fd: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLIN != 0
}

#[derive(Debug, Default)]
struct SleeperReport {
    released: u64,
    asked: u64,
    visible: u64,
    polls: u64,
    arms: u64,
    found_by_arm: u64,
    sleeps: u64,
    events: u64,
    markers: u64,
    parked: u64,
    /// Set when the driver found the sleeper asleep with the sim idle and no event pending: a completion that
    /// will never be reported.
    stranded: Option<String>,
}

/// One seed: the sleeper thread owns the library's CQ and queue (all library calls happen there); the driver
/// thread only steps the sim. `steps_per_poll` is 0, so only the driver advances time.
fn event_mode_run(seed: u64, total: u64) -> SleeperReport {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    const SQ: u32 = 16;
    const WINDOW: u64 = 40;
    let cfg = SimConfig {
        seed,
        steps_per_poll: 0,
        loss_ppm: 20_000,
        ack_loss_ppm: 20_000,
        wire_delay_min: 1,
        wire_delay_max: 4,
        ..SimConfig::default()
    };
    let src = Buf::new(64 * 64, 0x11);
    let dst = Buf::new(64 * 64, 0);
    let dev = SimDevice::new(&cfg).unwrap();
    let (src_key, _) = reg(&dev, &src);
    let (_, dst_rkey) = reg(&dev, &dst);
    let ch = dev.create_comp_channel().unwrap();
    let scq = dev.create_cq_ex(cq_depth_for(&[(SQ, 0)]) as i32, ch, ptr::null_mut(), 0).unwrap();
    let pcq = dev.create_cq(64).unwrap();
    let a = dev.create_qp(&mut qp_attr(scq, scq, SQ, 1)).unwrap();
    let b = dev.create_qp(&mut qp_attr(pcq, pcq, SQ, 1)).unwrap();
    dev.connect(a, b, &SimConnAttr::default()).unwrap();
    // SAFETY: a live channel.
    let fd = unsafe { (*ch).fd };
    // SAFETY: plain system call.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    assert!(efd >= 0);
    let (src_addr, dst_addr) = (src.addr(), dst.addr());
    let (a, scq, ch) = (P(a), P(scq), P(ch));
    let dev: &SimDevice = &dev;
    let done = AtomicBool::new(false);
    let asleep = AtomicBool::new(false);
    let sleep_gen = AtomicU64::new(0);
    let stranded = AtomicBool::new(false);

    let report = std::thread::scope(|s| {
        // The driver: advances time one step at a time. When the sleeper has been asleep through 200 steps in
        // which the sim visited no QP (nothing in flight, nothing will ever complete) and its channel has no
        // event, the sleeper would sleep forever: wake it through the eventfd and say so.
        s.spawn(|| {
            let (mut idle, mut gen) = (0u32, 0u64);
            while !done.load(SeqCst) {
                let before = dev.stats().qp_ticks;
                dev.step(1);
                idle = if dev.stats().qp_ticks == before { idle + 1 } else { 0 };
                if asleep.load(SeqCst) {
                    let g = sleep_gen.load(SeqCst);
                    if g != gen {
                        (gen, idle) = (g, 0);
                    } else if idle >= 200 && !readable(fd) && asleep.load(SeqCst) && sleep_gen.load(SeqCst) == g {
                        stranded.store(true, SeqCst);
                        // SAFETY: our eventfd and an 8-byte counter.
                        assert_eq!(unsafe { libc::write(efd, (&1u64 as *const u64).cast(), 8) }, 8);
                        while asleep.load(SeqCst) {
                            std::thread::yield_now();
                        }
                    }
                }
                std::thread::yield_now();
            }
        });
        let sleeper = s.spawn(|| {
            let (a, scq, ch) = (a, scq, ch); // whole wrappers, not their raw fields
            let cq = Cq::new(cq_handle(scq.0));
            let log = SendLog::default();
            let qcfg = QueueConfig { sq_depth: SQ, max_send_sge: 4, max_inline_data: 64, backlog_depth: 64, ..QueueConfig::default() };
            let q = Queue::new(&cq, None, qp_handle(a.0), qcfg, Some(send_logger(&log))).unwrap();
            // SAFETY: plain system calls on our own fds.
            let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            for (f, tag) in [(fd, 1u64), (efd, 2)] {
                let mut e = libc::epoll_event { events: libc::EPOLLIN as u32, u64: tag };
                // SAFETY: valid epoll fd, fd and event.
                assert_eq!(unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, f, &mut e) }, 0);
            }
            let mut rng = Rng(seed ^ 0x0ddba11);
            let mut r = SleeperReport::default();
            let mut signaled: HashSet<u64> = HashSet::new();
            let (mut posted, mut unacked) = (0u64, 0u32);
            // SAFETY: all-zero is a valid `ibv_wc`.
            let mut wc: [ibv_wc; 8] = unsafe { std::mem::zeroed() };
            let check = |n: usize, wc: &[ibv_wc], signaled: &mut HashSet<u64>, r: &mut SleeperReport| {
                for w in &wc[..n] {
                    assert_eq!(w.status, OK, "seed {seed}: completion {}", w.wr_id);
                    assert!(signaled.remove(&w.wr_id), "seed {seed}: shown {} which was not asked for, or twice", w.wr_id);
                }
                r.visible += n as u64;
            };
            loop {
                if log.borrow().len() as u64 == total {
                    break;
                }
                let released = log.borrow().len() as u64;
                // Phases of 50 WRs: a window of WINDOW WRs (more than the SQ: some park), then small bursts
                // posted only once everything before is released (their unsignaled tails need markers).
                let bursts = (posted / 50) % 2 == 1;
                let window = if bursts { if posted == released { 1 } else { 0 } } else { WINDOW };
                while posted < total && posted - released < window {
                    let n = (1 + rng.below(6)).min(total - posted);
                    let mut ws: Vec<W> = (posted..posted + n)
                        .map(|id| {
                            let sig = rng.below(5) == 0;
                            if sig {
                                signaled.insert(id);
                                r.asked += 1;
                            }
                            let off = (id % 64) * 64;
                            let flags = if sig { SIGNALED } else { 0 };
                            wr(id, op::IBV_WR_RDMA_WRITE, flags, &[(src_addr + off, 64, src_key)]).rdma(dst_addr + off, dst_rkey)
                        })
                        .collect();
                    qpost(&q, &mut ws).unwrap();
                    posted += n;
                    if bursts {
                        break;
                    }
                }
                // The sleeper's loop: poll; if nothing, arm (which polls again); only if still nothing, sleep.
                r.polls += 1;
                let n = cq.poll(&mut wc).unwrap();
                check(n, &wc, &mut signaled, &mut r);
                if n > 0 {
                    continue;
                }
                r.arms += 1;
                let n = cq.arm(false, &mut wc).unwrap();
                check(n, &wc, &mut signaled, &mut r);
                if n > 0 {
                    r.found_by_arm += 1;
                    continue;
                }
                if log.borrow().len() as u64 == posted {
                    continue; // the arm's poll released the last WRs: nothing left to wait for
                }
                sleep_gen.fetch_add(1, SeqCst);
                asleep.store(true, SeqCst);
                let mut out = [libc::epoll_event { events: 0, u64: 0 }; 2];
                // SAFETY: valid epoll fd and output array. The timeout only bounds a broken detector.
                let woke = unsafe { libc::epoll_wait(ep, out.as_mut_ptr(), 2, 600_000) };
                asleep.store(false, SeqCst);
                assert!(woke > 0, "seed {seed}: the stranding detector never fired");
                r.sleeps += 1;
                if stranded.load(SeqCst) {
                    let s = q.stats();
                    r.stranded = Some(format!(
                        "asleep with {} of {posted} WRs unreleased ({} in the provider, {} parked), sim idle, no event: {s:?}",
                        posted - log.borrow().len() as u64,
                        s.in_provider,
                        s.backlog
                    ));
                    break;
                }
                while let Ok((ecq, _)) = dev.get_cq_event(ch.0) {
                    assert_eq!(ecq, scq.0);
                    r.events += 1;
                    unacked += 1;
                }
            }
            if r.stranded.is_none() {
                // Nothing is left unreported: every WR released in order, every asked completion shown, the CQ
                // empty, the queue free to go.
                check_send_log(&format!("seed {seed}"), &log.borrow(), total, false);
                assert!(signaled.is_empty(), "seed {seed}: asked-for completions never shown: {signaled:?}");
                assert_eq!(cq.poll(&mut wc).unwrap(), 0);
                let s = q.stats();
                assert_eq!((s.in_provider, s.backlog, s.stray_cqes), (0, 0, 0), "seed {seed}: {s:?}");
                q.check_free().unwrap();
                r.markers = s.markers;
                r.parked = s.parked;
            }
            r.released = log.borrow().len() as u64;
            while dev.get_cq_event(ch.0).is_ok() {
                unacked += 1;
            }
            dev.ack_cq_events(scq.0, unacked).unwrap();
            // SAFETY: our epoll fd.
            unsafe { libc::close(ep) };
            drop(q);
            drop(cq);
            r
        });
        let r = sleeper.join();
        // The driver stops however the sleeper ended: a sleeper that panicked fails the test with its own message
        // rather than leaving the driver, and so the scope, running forever.
        done.store(true, SeqCst);
        r.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    });
    // SAFETY: our eventfd.
    unsafe { libc::close(efd) };
    report
}

#[test]
fn event_mode_sleeper_never_misses_a_completion() {
    let seeds = scaled(1..=16u64, 1..=400);
    let total = scaled(300, 2000);
    let mut sum = SleeperReport::default();
    let mut stranded = Vec::new();
    for seed in seeds.clone() {
        let r = event_mode_run(seed, total);
        if let Some(s) = &r.stranded {
            stranded.push(format!("seed {seed}: {s}"));
            continue;
        }
        assert!(r.sleeps > 0 && r.events > 0, "seed {seed}: the sleeper never slept: {r:?}");
        assert_eq!(r.released, total);
        sum.released += r.released;
        sum.asked += r.asked;
        sum.visible += r.visible;
        sum.polls += r.polls;
        sum.arms += r.arms;
        sum.found_by_arm += r.found_by_arm;
        sum.sleeps += r.sleeps;
        sum.events += r.events;
        sum.markers += r.markers;
        sum.parked += r.parked;
    }
    eprintln!("event mode, seeds {seeds:?}: {sum:?}");
    assert_eq!(stranded, Vec::<String>::new(), "completions stranded in event mode");
    assert!(sum.parked > 0 && sum.markers > 0, "the backlog and idle-tail markers were exercised: {sum:?}");
}

// ---- 4. the asynchronous event path -----------------------------------------------------------------------

const EV_CQ_ERR: u32 = ev::IBV_EVENT_CQ_ERR as u32;

/// What an async-event run saw: WRs released with a success, released as flushed without any CQE of their own
/// having been polled, and CQEs swallowed after the event.
#[derive(Debug, Default)]
struct EventReport {
    ok: u64,
    flushed: u64,
    never_posted: u64,
    late_cqes: u64,
    lost_cqes: u64,
}

/// Three managed queues on one CQ sized exactly by the budget rules, and a raw-verbs QP that shares the CQ
/// without a budget (the ULP's bug): its signaled WRITEs overrun the CQ. The sim raises `IBV_EVENT_CQ_ERR` and
/// delivers no CQE any more. `poll_first`: the ULP polls everything that is still there before the event
/// reaches it; otherwise the event comes first.
fn cq_overrun_run(seed: u64, poll_first: bool) -> EventReport {
    const Q: usize = 3;
    const SQ: u32 = 8;
    const PER_QUEUE: u64 = 20;
    let src = Buf::new(4096, 7);
    let dst = Buf::new(4096, 0);
    let dev = SimDevice::new(&SimConfig { seed, wire_delay_min: 1, wire_delay_max: 3, ..SimConfig::default() }).unwrap();
    let (src_key, _) = reg(&dev, &src);
    let (_, dst_rkey) = reg(&dev, &dst);
    let depth = cq_depth_for(&[(SQ, 0); Q]);
    let cq_raw = dev.create_cq(depth as i32).unwrap();
    let pcq = dev.create_cq(1024).unwrap();
    let mk = |cq| {
        let a = dev.create_qp(&mut qp_attr(cq, cq, SQ, 1)).unwrap();
        let b = dev.create_qp(&mut qp_attr(pcq, pcq, 64, 1)).unwrap();
        dev.connect(a, b, &SimConnAttr::default()).unwrap();
        a
    };
    let qps: Vec<*mut ibv_qp> = (0..Q).map(|_| mk(cq_raw)).collect();
    let raw = dev.create_qp(&mut qp_attr(cq_raw, cq_raw, 64, 1)).unwrap();
    let rb = dev.create_qp(&mut qp_attr(pcq, pcq, 64, 1)).unwrap();
    dev.connect(raw, rb, &SimConnAttr::default()).unwrap();

    let cq = Cq::new(cq_handle(cq_raw));
    let logs: Vec<SendLog> = (0..Q).map(|_| SendLog::default()).collect();
    let cfg = QueueConfig { sq_depth: SQ, max_send_sge: 4, max_inline_data: 64, backlog_depth: 16, ..QueueConfig::default() };
    let queues: Vec<Queue> = qps.iter().zip(&logs).map(|(&qp, log)| Queue::new(&cq, None, qp_handle(qp), cfg, Some(send_logger(log))).unwrap()).collect();
    let mut rng = Rng(seed);
    for (k, q) in queues.iter().enumerate() {
        let mut ws: Vec<W> = (0..PER_QUEUE)
            .map(|i| {
                let off = (k as u64 * PER_QUEUE + i) * 64;
                let flags = if rng.below(6) == 0 { SIGNALED } else { 0 };
                wr(i, op::IBV_WR_RDMA_WRITE, flags, &[(src.addr() + off, 64, src_key)]).rdma(dst.addr() + off, dst_rkey)
            })
            .collect();
        qpost(q, &mut ws).unwrap();
    }
    for i in 0..40 {
        assert_eq!(post1(raw, wr(1000 + i, op::IBV_WR_RDMA_WRITE, SIGNALED, &[]).rdma(0, 0)), 0);
    }
    // Time passes without a poll: the raw QP's CQEs fill the CQ.
    dev.run_until_idle(5000).unwrap();
    let lost = dev.stats().cq_overruns;
    assert!(lost > 0, "seed {seed}: the CQ overran");
    assert!(dev.violation_log().iter().any(|v| v.kind == SQD_SIM_VIOLATION_CQ_OVERRUN));
    let events: Vec<AsyncEvent> = std::iter::from_fn(|| dev.get_async_event()).collect();
    assert_eq!(events[0], AsyncEvent { event_type: ev::IBV_EVENT_CQ_ERR, element: AsyncElement::Cq(cq_raw) }, "seed {seed}");
    let fatal: HashSet<*mut ibv_qp> = events[1..]
        .iter()
        .map(|e| match (e.event_type, e.element) {
            (ev::IBV_EVENT_QP_FATAL, AsyncElement::Qp(qp)) => qp,
            _ => panic!("seed {seed}: unexpected event {e:?}"),
        })
        .collect();
    assert_eq!(fatal, qps.iter().copied().chain([raw]).collect(), "seed {seed}: every QP on the CQ is fatal");

    let mut shown_raw = 0;
    let mut drain = |cq: &Cq| {
        for _ in 0..100 {
            let got = mpoll(cq);
            if got.is_empty() {
                return;
            }
            for w in got {
                // Only the raw QP's CQEs pass through (unchanged); nothing of the managed queues is shown: their
                // WRs were unsignaled or their CQEs lost, or they were already released by the event.
                assert!(w.qp_num == qpn(raw) || w.status == OK, "seed {seed}: {w:?}");
                shown_raw += (w.qp_num == qpn(raw)) as u64;
            }
        }
        panic!("seed {seed}: the CQ does not drain");
    };
    let mut before_event = [0u64; Q];
    if poll_first {
        drain(&cq);
        // Whatever was in the CQ has been polled; the rest of the WRs will never get a CQE.
        for (k, q) in queues.iter().enumerate() {
            let s = q.stats();
            before_event[k] = s.released;
            assert!(logs[k].borrow().iter().all(|r| r.1 == OK), "seed {seed}: queue {k}: nothing failed before the event");
        }
        assert!(queues.iter().any(|q| q.stats().released < PER_QUEUE), "seed {seed}: WRs are left without a CQE");
    }
    cq.on_async_event(EV_CQ_ERR).unwrap();
    for (k, q) in queues.iter().enumerate() {
        let s = q.stats();
        assert_eq!((s.accepted, s.released, s.in_provider, s.backlog), (PER_QUEUE, PER_QUEUE, 0, 0), "seed {seed}: queue {k}: {s:?}");
        for (i, r) in logs[k].borrow().iter().enumerate() {
            if i as u64 >= before_event[k] {
                assert_eq!(r.1, FLUSH, "seed {seed}: queue {k}: WR {i} was released by the event with a flush");
            }
        }
    }
    // The QP_FATAL of each QP comes too: nothing is left to release, nothing is released twice.
    for q in &queues {
        q.on_async_event(EV_QP_FATAL).unwrap();
    }
    drain(&cq);
    assert!(shown_raw > 0 && shown_raw < 40, "seed {seed}: the raw QP's CQEs up to the overrun passed through: {shown_raw}");
    let mut r = EventReport { lost_cqes: lost, ..EventReport::default() };
    for (k, q) in queues.iter().enumerate() {
        let what = format!("seed {seed}: queue {k}");
        r.flushed += check_send_log(&what, &logs[k].borrow(), PER_QUEUE, true);
        let log = logs[k].borrow();
        r.ok += log.iter().filter(|x| x.1 == OK).count() as u64;
        r.never_posted += log.iter().filter(|x| x.2 & SQD_COMPLETION_NEVER_POSTED != 0).count() as u64;
        let s = q.stats();
        assert_eq!(s.stray_cqes, 0, "{what}");
        if poll_first {
            assert_eq!(s.late_cqes, 0, "{what}: everything there was polled before the event");
        }
        r.late_cqes += s.late_cqes;
        let mut more = [wr(99, op::IBV_WR_RDMA_WRITE, 0, &[]).rdma(0, 0)];
        assert_eq!(qpost(q, &mut more).unwrap_err().0, libc::EIO, "{what}: a failed queue takes no WR");
        q.check_free().unwrap();
    }
    if !poll_first {
        assert_eq!(r.ok, 0, "seed {seed}: the event came first: everything flushed");
    }
    let cs = cq.stats();
    assert_eq!((cs.stray, cs.passthrough), (0, shown_raw), "seed {seed}: {cs:?}");
    drop(queues);
    assert_eq!(cq.stats().reserved, 0);
    r
}

#[test]
fn a_cq_overrun_event_releases_every_queue_on_the_cq_once_without_cqes() {
    for poll_first in [true, false] {
        let mut sum = EventReport::default();
        for seed in 1..=scaled(8u64, 400) {
            let r = cq_overrun_run(seed, poll_first);
            sum.ok += r.ok;
            sum.flushed += r.flushed;
            sum.never_posted += r.never_posted;
            sum.late_cqes += r.late_cqes;
            sum.lost_cqes += r.lost_cqes;
        }
        eprintln!("CQ overrun, {}: {sum:?}", if poll_first { "polled before the event" } else { "event first" });
        assert!(sum.flushed > 0 && sum.never_posted > 0, "{sum:?}");
        if poll_first {
            assert!(sum.ok > 0, "CQEs before the overrun released WRs normally: {sum:?}");
        } else {
            assert!(sum.late_cqes > 0, "CQEs queued before the overrun were swallowed after the event: {sum:?}");
        }
    }
}

/// Two queues on one healthy CQ; the sim makes one QP fatal mid-run (`IBV_EVENT_QP_FATAL`). `event_first`:
/// the event reaches the queue before any poll sees the QP's flushes; otherwise the ULP polls the flushes first.
fn qp_fatal_run(seed: u64, event_first: bool) -> EventReport {
    const SQ: u32 = 8;
    const PER_QUEUE: u64 = 40;
    let src = Buf::new(8192, 7);
    let dst = Buf::new(8192, 0);
    let cfg = SimConfig { seed, loss_ppm: 20_000, ack_loss_ppm: 20_000, wire_delay_min: 1, wire_delay_max: 3, ..SimConfig::default() };
    let dev = SimDevice::new(&cfg).unwrap();
    let (src_key, _) = reg(&dev, &src);
    let (_, dst_rkey) = reg(&dev, &dst);
    let cq_raw = dev.create_cq(cq_depth_for(&[(SQ, 0); 2]) as i32).unwrap();
    let pcq = dev.create_cq(1024).unwrap();
    let qps: Vec<*mut ibv_qp> = (0..2)
        .map(|_| {
            let a = dev.create_qp(&mut qp_attr(cq_raw, cq_raw, SQ, 1)).unwrap();
            let b = dev.create_qp(&mut qp_attr(pcq, pcq, 64, 1)).unwrap();
            dev.connect(a, b, &SimConnAttr::default()).unwrap();
            a
        })
        .collect();
    let cq = Cq::new(cq_handle(cq_raw));
    let logs: Vec<SendLog> = (0..2).map(|_| SendLog::default()).collect();
    let qcfg = QueueConfig { sq_depth: SQ, max_send_sge: 4, max_inline_data: 64, backlog_depth: 64, ..QueueConfig::default() };
    let queues: Vec<Queue> = qps.iter().zip(&logs).map(|(&qp, log)| Queue::new(&cq, None, qp_handle(qp), qcfg, Some(send_logger(log))).unwrap()).collect();
    let mut rng = Rng(seed);
    for (k, q) in queues.iter().enumerate() {
        let mut ws: Vec<W> = (0..PER_QUEUE)
            .map(|i| {
                let off = (k as u64 * PER_QUEUE + i) * 64;
                wr(i, op::IBV_WR_RDMA_WRITE, 0, &[(src.addr() + off, 64, src_key)]).rdma(dst.addr() + off, dst_rkey)
            })
            .collect();
        qpost(q, &mut ws).unwrap();
    }
    let at_step = dev.now() + 4 + rng.below(12);
    dev.inject(&SimFault { at_step, ..SimFault::new(SQD_SIM_FAULT_QP_FATAL, qps[0]) }).unwrap();
    let mut visible_flushes = 0;
    let mut poll = |cq: &Cq| {
        for w in mpoll(cq) {
            assert_eq!((w.qp_num, w.status), (qpn(qps[0]), FLUSH), "seed {seed}: only the fatal QP's flushes are shown");
            visible_flushes += 1;
        }
    };
    // Run until the event arrives, polling as a ULP does (each poll advances the sim one step).
    let event = loop {
        if let Some(e) = dev.get_async_event() {
            break e;
        }
        if event_first && dev.now() + 1 >= at_step {
            dev.step(1); // the fatal step passes without a poll: its flushes wait in the CQ
        } else {
            poll(&cq);
        }
    };
    assert_eq!(event, AsyncEvent { event_type: ev::IBV_EVENT_QP_FATAL, element: AsyncElement::Qp(qps[0]) });
    if event_first {
        assert!(queues[0].stats().released < PER_QUEUE, "seed {seed}: the failure caught WRs in flight");
    } else {
        for _ in 0..20 {
            poll(&cq);
        }
        assert_eq!(queues[0].stats().released, PER_QUEUE, "seed {seed}: the flush CQEs released everything");
    }
    queues[0].on_async_event(EV_QP_FATAL).unwrap();
    let s = queues[0].stats();
    assert_eq!((s.released, s.in_provider, s.backlog, s.closed), (PER_QUEUE, 0, 0, 1), "seed {seed}: released at once: {s:?}");
    // The healthy queue completes; the fatal QP's flushes that still arrive are swallowed.
    for _ in 0..10_000 {
        poll(&cq);
        if queues[1].stats().released == PER_QUEUE {
            break;
        }
    }
    for _ in 0..20 {
        poll(&cq);
    }
    let mut r = EventReport {
        flushed: check_send_log(&format!("seed {seed}: fatal queue"), &logs[0].borrow(), PER_QUEUE, true),
        ..EventReport::default()
    };
    assert_eq!(check_send_log(&format!("seed {seed}: healthy queue"), &logs[1].borrow(), PER_QUEUE, false), 0);
    assert!(r.flushed > 0);
    let s0 = queues[0].stats();
    r.never_posted = logs[0].borrow().iter().filter(|x| x.2 & SQD_COMPLETION_NEVER_POSTED != 0).count() as u64;
    r.ok = PER_QUEUE - r.flushed;
    r.late_cqes = s0.late_cqes;
    if event_first {
        assert_eq!(visible_flushes, 0, "seed {seed}: released by the event, its flushes are not shown");
        assert!(s0.late_cqes > 0, "seed {seed}: the flushes still came and were swallowed: {s0:?}");
    } else {
        assert_eq!(s0.late_cqes, 0, "seed {seed}: {s0:?}");
        assert!(visible_flushes > 0, "seed {seed}: the flushes were shown as raw verbs shows them");
    }
    let cs = cq.stats();
    assert_eq!((cs.stray, cs.passthrough, s0.stray_cqes), (0, 0, 0), "seed {seed}: {cs:?}");
    for q in &queues {
        q.check_free().unwrap();
    }
    assert_eq!(dev.violation_log(), vec![]);
    r
}

#[test]
fn a_qp_fatal_event_releases_the_queue_once_whether_it_comes_before_or_after_the_flushes() {
    for event_first in [true, false] {
        let mut sum = EventReport::default();
        for seed in 1..=scaled(16u64, 1000) {
            let r = qp_fatal_run(seed, event_first);
            sum.ok += r.ok;
            sum.flushed += r.flushed;
            sum.never_posted += r.never_posted;
            sum.late_cqes += r.late_cqes;
        }
        eprintln!("QP fatal, {}: {sum:?}", if event_first { "event first" } else { "flushes polled first" });
        assert!(sum.never_posted > 0, "parked WRs were released as never posted: {sum:?}");
    }
}

// ---- 5. SRQ details ---------------------------------------------------------------------------------------

#[derive(Debug, Default)]
struct SrqReport {
    messages: u64,
    low_calls: u64,
    min_posted_at_low: u32,
    rnr_naks: u64,
    rnr_exhausted: u64,
    never_posted: u64,
    /// Low-watermark callbacks during the teardown (from `release_all`).
    calls_in_teardown: u64,
}

/// Eight raw-verbs senders, eight target QPs managed by queues on one CQ, one managed SRQ of 64 receives
/// whose low-watermark callback (at 24) refills it (`refill`), or only counts (the control run).
fn srq_run(seed: u64, refill: bool, per_sender: u64) -> SrqReport {
    const SENDERS: usize = 8;
    const DEPTH: u32 = 64;
    const LOW: u32 = 24;
    const WINDOW: u64 = 16;
    let cfg = SimConfig {
        seed,
        loss_ppm: 10_000,
        ack_loss_ppm: 10_000,
        wire_delay_min: 1,
        wire_delay_max: 2,
        tx_per_step: 1,
        ..SimConfig::default()
    };
    let src = Buf::new(4096, 0x3c);
    let srq_bufs = Buf::new(DEPTH as usize * RBUF as usize, 0);
    let dev = SimDevice::new(&cfg).unwrap();
    let (src_key, _) = reg(&dev, &src);
    let (srq_key, _) = reg(&dev, &srq_bufs);
    let icq = dev.create_cq(1024).unwrap();
    let tcq_raw = dev.create_cq((cq_depth_for(&[(4, 0); SENDERS]) + DEPTH as u64) as i32).unwrap();
    let srq_raw = dev.create_srq(&mut srq_attr(DEPTH)).unwrap();
    // Finite RNR retries: a starving SRQ exhausts them.
    let conn = SimConnAttr { rnr_retry: 2, ..SimConnAttr::default() };
    let (mut senders, mut targets) = (Vec::new(), Vec::new());
    for _ in 0..SENDERS {
        let i = dev.create_qp(&mut qp_attr(icq, icq, WINDOW as u32, 1)).unwrap();
        let mut ta = qp_attr(tcq_raw, tcq_raw, 4, 0);
        ta.srq = srq_raw;
        let t = dev.create_qp(&mut ta).unwrap();
        dev.connect(i, t, &conn).unwrap();
        senders.push(i);
        targets.push(t);
    }
    let by_qpn: HashMap<u32, usize> = senders.iter().enumerate().map(|(k, &q)| (qpn(q), k)).collect();

    let tcq = Cq::new(cq_handle(tcq_raw));
    let side = SrqSide::new(DEPTH, srq_bufs, srq_key);
    side.refill.set(false);
    let low_calls: Rc<RefCell<Vec<u32>>> = Rc::default();
    // Set once the targets are torn down: the callback then only counts (the library also runs it from
    // `release_all`, whose receives the device still holds: a refill then would be refused).
    let stopping = Rc::new(Cell::new(false));
    let low = {
        let (side, calls, stopping) = (Rc::downgrade(&side), low_calls.clone(), stopping.clone());
        Box::new(move |posted: u32| {
            let side = side.upgrade().unwrap();
            calls.borrow_mut().push(posted);
            assert!(posted < LOW, "the low-watermark callback ran with {posted} receives posted (watermark {LOW})");
            let srq = side.srq.borrow().upgrade().unwrap();
            assert_eq!(srq.stats().posted, posted);
            if refill && !stopping.get() {
                let free: Vec<u64> = side.free.borrow_mut().drain(..).collect();
                side.post(free.into_iter()).expect("refilling from the low-watermark callback");
                assert_eq!(srq.stats().posted, DEPTH, "refilled to the depth");
            }
        }) as Box<dyn Fn(u32)>
    };
    // SAFETY: the SRQ lives as long as the device, which outlives the managed SRQ.
    let srq = Rc::new(Srq::new(unsafe { SrqHandle::from_raw(srq_raw) }.unwrap(), DEPTH, Some(side.release_handler()), LOW, Some(low)).unwrap());
    *side.srq.borrow_mut() = Rc::downgrade(&srq);
    let qcfg = QueueConfig { sq_depth: 4, max_send_sge: 4, max_inline_data: 64, ..QueueConfig::default() };
    let mut queues: Vec<Option<Queue>> =
        targets.iter().map(|&t| Some(Queue::with_srq(&tcq, &tcq, &srq, qp_handle(t), qcfg, None).unwrap())).collect();
    assert_eq!(srq.stats().queues, SENDERS as u32);
    side.post(0..DEPTH as u64).unwrap();
    assert_eq!(srq_post(&srq, &[(1, side.bufs.addr(), 8, srq_key)]).unwrap_err(), libc::EAGAIN, "full");

    let (mut issued, mut done, mut failed) = (vec![0u64; SENDERS], vec![0u64; SENDERS], vec![false; SENDERS]);
    let mut r = SrqReport { min_posted_at_low: u32::MAX, ..SrqReport::default() };
    let mut progress = Progress::new(20_000);
    loop {
        if (0..SENDERS).all(|k| failed[k] || done[k] == per_sender) {
            break;
        }
        let work: u64 = (0..SENDERS).map(|k| issued[k] + done[k] + failed[k] as u64).sum();
        progress.check(work + r.messages, || {
            format!("seed {seed}: senders issued {issued:?}, done {done:?}, failed {failed:?}; SRQ {:?}", srq.stats())
        });
        for k in 0..SENDERS {
            while !failed[k] && issued[k] < per_sender && issued[k] < done[k] + WINDOW {
                let w = wr(issued[k], op::IBV_WR_SEND, SIGNALED, &[(src.addr(), 32, src_key)]);
                assert_eq!(post1(senders[k], w), 0);
                issued[k] += 1;
            }
        }
        for w in poll(icq, 64) {
            let k = by_qpn[&w.qp_num];
            if w.status == st::IBV_WC_RNR_RETRY_EXC_ERR {
                r.rnr_exhausted += 1;
            }
            if w.status != OK {
                failed[k] = true;
                continue;
            }
            assert_eq!(w.wr_id, done[k]);
            done[k] += 1;
        }
        for w in mpoll(&tcq) {
            assert_eq!((w.status, w.opcode, w.byte_len), (OK, ibv_wc_opcode::IBV_WC_RECV, 32), "seed {seed}");
            assert!(side.commands.borrow_mut().remove(&w.wr_id).is_some(), "seed {seed}: released before it was shown");
            r.messages += 1;
        }
    }
    // Free the targets by the last-WQE rule; the SRQ's receives stay posted until `release_all`.
    stopping.set(true);
    let calls_before_teardown = low_calls.borrow().len();
    for k in 0..SENDERS {
        let q = queues[k].as_ref().unwrap();
        assert_eq!(srq.release_all().unwrap_err().errno(), libc::EBUSY, "queues still attached");
        dev.set_error(targets[k]).unwrap();
        let e = dev.get_async_event().unwrap();
        assert_eq!(e, AsyncEvent { event_type: ev::IBV_EVENT_QP_LAST_WQE_REACHED, element: AsyncElement::Qp(targets[k]) });
        if srq.stats().posted > 0 {
            assert_eq!(q.check_free().unwrap_err().errno(), libc::EBUSY, "seed {seed}: the QP could still take a receive");
        }
        q.on_async_event(EV_LAST_WQE).unwrap();
        assert!(mpoll(&tcq).is_empty());
        q.check_free().unwrap();
        queues[k] = None;
    }
    let before = srq.stats();
    if before.posted > 0 {
        assert_eq!(srq.check_free().unwrap_err().errno(), libc::EBUSY, "receives are still posted");
    }
    let np_before = side.released_never_posted.get();
    srq.release_all().unwrap();
    let ss = srq.stats();
    r.never_posted = side.released_never_posted.get() - np_before;
    assert_eq!(r.never_posted, before.posted as u64, "seed {seed}: release_all released every posted receive as never consumed");
    assert_eq!((ss.posted, ss.queues, ss.stray_cqes, ss.depth), (0, 0, 0, DEPTH));
    assert_eq!(ss.total_posted, side.posts.get(), "seed {seed}: total_posted counts every receive posted");
    assert_eq!(ss.cqes, r.messages, "seed {seed}: one CQE per message received");
    assert_eq!(ss.cqes, side.released_ok.get());
    assert_eq!(ss.total_posted, ss.cqes + side.released_never_posted.get(), "seed {seed}: every receive released once");
    assert_eq!((side.unexpected.get(), side.released_other.get()), (0, 0), "seed {seed}");
    assert!(side.outstanding.borrow().is_empty());
    assert_eq!(ss.low_events as usize, low_calls.borrow().len(), "seed {seed}: low_events counts the callbacks");
    srq.check_free().unwrap();
    assert_eq!(tcq.stats().reserved, 0, "the SRQ's reservation left with its last queue");
    r.calls_in_teardown = (low_calls.borrow().len() - calls_before_teardown) as u64;
    r.low_calls = calls_before_teardown as u64;
    r.min_posted_at_low = low_calls.borrow()[..calls_before_teardown].iter().copied().min().unwrap_or(u32::MAX);
    r.rnr_naks = dev.stats().rnr_naks;
    if refill {
        assert!(done.iter().all(|&d| d == per_sender), "seed {seed}: every message was received: {done:?}");
        assert_eq!(r.messages, SENDERS as u64 * per_sender);
    }
    assert_eq!(dev.violation_log(), vec![]);
    drop(srq);
    r
}

#[test]
fn srq_low_watermark_refill_keeps_the_srq_from_starving_and_release_all_returns_the_rest() {
    let per_sender = scaled(100, 5000);
    for seed in 1..=scaled(4u64, 40) {
        let r = srq_run(seed, true, per_sender);
        eprintln!("SRQ refilled at the low watermark, seed {seed}: {r:?}");
        assert!(r.low_calls > 1, "seed {seed}: the watermark was crossed again and again: {r:?}");
        assert_eq!((r.rnr_naks, r.rnr_exhausted), (0, 0), "seed {seed}: the SRQ never ran dry: {r:?}");
        // The control: the same traffic with a callback that does not refill starves the SRQ.
        let c = srq_run(seed, false, per_sender);
        eprintln!("SRQ not refilled, seed {seed}: {c:?}");
        assert_eq!(c.low_calls, 1, "seed {seed}: fired once, then not re-armed without a post: {c:?}");
        assert!(c.rnr_naks > 0 && c.rnr_exhausted > 0, "seed {seed}: without the refill the senders run out of RNR retries: {c:?}");
        assert_eq!(c.messages, 64, "seed {seed}: exactly the SRQ's receives were consumed");
    }
}

/// Regression: an arm whose own poll moved parked WRs to the SQ must cover their unsignaled tail at once —
/// the caller is about to sleep, so no later poll will.
#[test]
fn arming_covers_a_tail_its_own_poll_posted_from_the_backlog() {
    let dev = SimDevice::new(&SimConfig { steps_per_poll: 0, ..SimConfig::default() }).unwrap();
    let ch = dev.create_comp_channel().unwrap();
    let scq = dev.create_cq_ex(64, ch, ptr::null_mut(), 0).unwrap();
    let pcq = dev.create_cq(64).unwrap();
    let a = dev.create_qp(&mut qp_attr(scq, scq, 8, 1)).unwrap();
    let b = dev.create_qp(&mut qp_attr(pcq, pcq, 8, 1)).unwrap();
    dev.connect(a, b, &SimConnAttr::default()).unwrap();
    let fd = unsafe { (*ch).fd };
    let cq = Cq::new(cq_handle(scq));
    let log = SendLog::default();
    let cfg = QueueConfig { sq_depth: 8, max_send_sge: 4, max_inline_data: 64, signal_interval: 4, backlog_depth: 8, ..QueueConfig::default() };
    let q = Queue::new(&cq, None, qp_handle(a), cfg, Some(send_logger(&log))).unwrap();
    let mut ws: Vec<W> = (0..10).map(|i| wr(i, op::IBV_WR_RDMA_WRITE, 0, &[]).rdma(0, 0)).collect();
    qpost(&q, &mut ws).unwrap();
    let mut wc: [ibv_wc; 8] = unsafe { std::mem::zeroed() };
    assert_eq!(cq.poll(&mut wc).unwrap(), 0, "poll 1 after the post: nothing done yet");
    dev.run_until_idle(1000).unwrap(); // the CQEs of WRs 3 and 7 land now, before the arm
    assert_eq!(cq.arm(false, &mut wc).unwrap(), 0, "poll 2 (inside the arm): only hidden CQEs");
    // Time passes while the ULP sleeps: the marker posted by the arm completes and raises the event.
    dev.run_until_idle(1000).unwrap();
    assert!(readable(fd), "armed and told it was safe to sleep, yet no event comes for WRs {}..10", log.borrow().len());
    assert_eq!(cq.poll(&mut wc).unwrap(), 0, "the marker's completion is not shown");
    assert_eq!(log.borrow().len(), 10);
    assert_eq!(q.stats().markers, 1);
    drop(q);
}

/// Regression: releasing a torn-down SRQ's receives does not ask the ULP to refill it.
#[test]
fn release_all_does_not_run_the_low_watermark_callback() {
    let buf = Buf::new(4096, 0);
    let dev = SimDevice::new(&SimConfig::default()).unwrap();
    let (lkey, _) = reg(&dev, &buf);
    let raw = dev.create_srq(&mut srq_attr(4)).unwrap();
    let calls: Rc<RefCell<Vec<u32>>> = Rc::default();
    let c = calls.clone();
    let srq = Srq::new(unsafe { SrqHandle::from_raw(raw) }.unwrap(), 4, None, 2, Some(Box::new(move |posted| c.borrow_mut().push(posted)))).unwrap();
    srq_post(&srq, &(0..4).map(|i| (i, buf.addr() + i * 64, 64, lkey)).collect::<Vec<_>>()).unwrap();
    srq.release_all().unwrap(); // no queue attached, no poll anywhere
    assert!(calls.borrow().is_empty(), "Srq::new documents that `low` runs from a poll; release_all ran it with {:?}", calls.borrow());
}

/// An SRQ with no release handler and no low watermark (the SPDK provider's) keeps no releases: its receives'
/// completions are shown by the poll, counted, and their slots free for new receives, in every round.
#[test]
fn an_srq_without_handler_or_watermark_counts_and_frees_its_receives() {
    const DEPTH: u32 = 4;
    let (src, dst) = (Buf::new(4096, 7), Buf::new(4096, 0));
    let dev = SimDevice::new(&SimConfig::default()).unwrap();
    let ((src_key, _), (dst_key, _)) = (reg(&dev, &src), reg(&dev, &dst));
    let icq = dev.create_cq(64).unwrap();
    let tcq_raw = dev.create_cq(64).unwrap();
    let srq_raw = dev.create_srq(&mut srq_attr(DEPTH)).unwrap();
    let ini = dev.create_qp(&mut qp_attr(icq, icq, 8, 0)).unwrap();
    let mut ta = qp_attr(tcq_raw, tcq_raw, 4, 0);
    ta.srq = srq_raw;
    let tgt = dev.create_qp(&mut ta).unwrap();
    dev.connect(ini, tgt, &SimConnAttr::default()).unwrap();
    let tcq = Cq::new(cq_handle(tcq_raw));
    // SAFETY: the SRQ lives as long as the device, which outlives the managed SRQ.
    let srq = Rc::new(Srq::new(unsafe { SrqHandle::from_raw(srq_raw) }.unwrap(), DEPTH, None, 0, None).unwrap());
    let qcfg = QueueConfig { sq_depth: 4, max_send_sge: 4, max_inline_data: 64, ..QueueConfig::default() };
    let q = Queue::with_srq(&tcq, &tcq, &srq, qp_handle(tgt), qcfg, None).unwrap();
    let mut next = 0u64;
    for round in 0..3u64 {
        let recvs: Vec<_> = (next..next + DEPTH as u64).map(|i| (i, dst.addr() + (i % 64) * 64, 64, dst_key)).collect();
        srq_post(&srq, &recvs).unwrap();
        assert_eq!(srq.stats().posted, DEPTH);
        for i in 0..DEPTH as u64 {
            assert_eq!(post1(ini, wr(i, op::IBV_WR_SEND, SIGNALED, &[(src.addr(), 16, src_key)])), 0);
        }
        dev.run_until_idle(1000).unwrap();
        let shown: Vec<u64> = mpoll(&tcq).iter().map(|w| {
            assert_eq!((w.status, w.opcode, w.byte_len), (OK, ibv_wc_opcode::IBV_WC_RECV, 16), "round {round}");
            w.wr_id
        }).collect();
        assert_eq!(shown, (next..next + DEPTH as u64).collect::<Vec<_>>(), "round {round}: every receive shown once, in order");
        let s = srq.stats();
        assert_eq!((s.posted, s.cqes, s.total_posted), (0, (round + 1) * DEPTH as u64, (round + 1) * DEPTH as u64), "round {round}");
        assert_eq!(poll(icq, 64).len(), DEPTH as usize);
        next += DEPTH as u64;
    }
    srq_post(&srq, &[(99, dst.addr(), 64, dst_key)]).unwrap();
    drop(q);
    srq.release_all().unwrap();
    assert_eq!(srq.stats().posted, 0);
}
