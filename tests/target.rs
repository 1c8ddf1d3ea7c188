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
use sqdisc::sim::*;
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
    /// Repost a buffer as soon as its receive is released.
    refill: Cell<bool>,
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
    let mut fatal_seen = vec![false; CONNS];
    let mut last_wqe = vec![false; CONNS];
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
    let mut iterations = 0u64;
    let mut visible_flushes = 0u64;
    while !done(&inis, &queues) {
        iterations += 1;
        assert!(iterations < 2_000_000, "seed {seed}: no end in sight");
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
    let qp = sqdisc::scripted::Scriptable::create_qp(&*dev, raw, raw, &sqdisc::scripted::ScriptedQpCaps::with_depths(sq_depth, 1)).unwrap();
    let cq = Cq::new(cq_handle(raw));
    let cfg = QueueConfig { sq_depth, max_send_sge: 4, max_inline_data: 64, backlog_depth, ..QueueConfig::default() };
    let q = Queue::new(&cq, None, qp_handle(qp), cfg, None).unwrap();
    (q.footprint(), q.stats().bytes)
}

#[test]
fn ten_thousand_queues_on_one_managed_cq() {
    use sqdisc::scripted::{Scriptable, ScriptedQpCaps};
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
            assert!(polls < 1_000_000, "no end in sight");
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
