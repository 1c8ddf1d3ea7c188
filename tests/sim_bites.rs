//! The model bites: for each rule of the seed discussion, a small raw-verbs ULP (posting with `ibv_post_send`
//! through the ops table, no sqdisc) that breaks the rule fails on the model, across many seeds — and the same
//! workload through the sqdisc library (release callbacks, `Queue::defer_teardown`, `Queue::invalidate`) is
//! clean on the same seeds. Counts are printed (`cargo test --test sim_bites -- --nocapture`).

mod sim_support;

use std::cell::{Cell, RefCell};
use std::pin::Pin;
use std::rc::Rc;

use rdma_sys::{ibv_cq, ibv_mr, ibv_qp, ibv_wc_opcode};
use sim_support::*;
use sqdisc_sim::*;
use sqdisc::verbs::control::Teardown;
use sqdisc::verbs::{CqHandle, QpHandle};
use sqdisc::{Completion, Cq, InvalidateMode, Queue, QueueConfig, ReleaseHandler};

const SEEDS: u64 = 500;

type Dev = Rc<Pin<Box<SimDevice>>>;

/// A client QP `a` (on `a_cq`) connected to a server QP `b` (on `b_cq`), and a registered server buffer
/// whose first 16 × 64 bytes take receives.
struct Net {
    dev: Dev,
    a: *mut ibv_qp,
    b: *mut ibv_qp,
    a_cq: *mut ibv_cq,
    b_cq: *mut ibv_cq,
    server: Buf,
    server_key: u32,
}

fn config(seed: u64, loss_ppm: u32, ack_loss_ppm: u32) -> SimConfig {
    SimConfig { seed, loss_ppm, ack_loss_ppm, wire_delay_min: 1, wire_delay_max: 4, flags: SQD_SIM_STRICT, ..SimConfig::default() }
}

impl Net {
    fn new(cfg: SimConfig, sq: u32, a_cqe: i32) -> Net {
        let dev = Rc::new(SimDevice::new(&cfg).unwrap());
        let a_cq = dev.create_cq(a_cqe).unwrap();
        let b_cq = dev.create_cq(256).unwrap();
        let a = dev.create_qp(&mut qp_attr(a_cq, a_cq, sq, 16)).unwrap();
        let b = dev.create_qp(&mut qp_attr(b_cq, b_cq, 64, 16)).unwrap();
        dev.connect(a, b, &SimConnAttr::default()).unwrap();
        let server = Buf::new(64 * 1024, 0);
        // SAFETY: `server` lives as long as the device (both in `Net`; the device is freed by its last Rc,
        // and tests drop managed queues before the Net).
        let server_key = mr_keys(unsafe { dev.reg_mr(server.ptr().cast(), server.len(), ACCESS_ALL) }.unwrap()).0;
        let n = Net { dev, a, b, a_cq, b_cq, server, server_key };
        for i in 0..16 {
            n.server_recv(i);
        }
        n
    }

    fn server_recv(&self, slot: u64) {
        assert_eq!(post_recv(self.b, slot, &[(self.server.addr() + (slot % 16) * 64, 64, self.server_key)]), 0);
    }

    /// The server: every received message is answered with a one-byte inline reply (when `reply`), its
    /// receive re-posted. Returns how many messages arrived.
    fn serve(&self, reply: bool) -> usize {
        let mut n = 0;
        for wc in poll(self.b_cq, 16) {
            if wc.opcode == ibv_wc_opcode::IBV_WC_RECV && wc.status == 0 {
                n += 1;
                self.server_recv(wc.wr_id);
                if reply {
                    let byte = [wc.wr_id as u8];
                    let w = wr(1000 + wc.wr_id, op::IBV_WR_SEND, INLINE | SIGNALED, &[(byte.as_ptr() as u64, 1, 0)]);
                    assert_eq!(post1(self.b, w), 0);
                }
            }
        }
        n
    }

    fn reg(&self, buf: &Buf) -> *mut ibv_mr {
        // SAFETY: every test keeps `buf` alive until the device is gone or the MR deregistered.
        unsafe { self.dev.reg_mr(buf.ptr().cast(), buf.len(), ACCESS_ALL) }.unwrap()
    }

    fn kinds(&self) -> Vec<u32> {
        self.dev.violation_log().iter().map(|v| v.kind).collect()
    }
}

/// A managed queue on the client QP. Dropped before the `Net` (declare it after).
struct Managed {
    queue: Queue,
    cq: Cq,
    released: Rc<RefCell<Vec<Completion>>>,
}

type OnRelease = Box<dyn Fn(&Completion)>;

fn managed(net: &Net, sq_depth: u32, rq_depth: u32, extra: Option<OnRelease>) -> Managed {
    // SAFETY: the CQ and QP live as long as the device, which outlives the managed objects.
    let cq = Cq::new(unsafe { CqHandle::from_raw(net.a_cq) }.unwrap());
    let released: Rc<RefCell<Vec<Completion>>> = Rc::default();
    let log = released.clone();
    let handler = ReleaseHandler::Closure(Box::new(move |c: &Completion| {
        log.borrow_mut().push(*c);
        if let Some(f) = &extra {
            f(c);
        }
    }));
    let cfg = QueueConfig { sq_depth, max_send_sge: 4, max_inline_data: 64, rq_depth, backlog_depth: 1024, ..QueueConfig::default() };
    // SAFETY: as above.
    let qp = unsafe { QpHandle::from_raw(net.a) }.unwrap();
    let queue = Queue::new(&cq, (rq_depth > 0).then_some(&cq), qp, cfg, Some(handler)).unwrap();
    Managed { queue, cq, released }
}

fn report(name: &str, raw_failed: u64, raw_violations: u64, clean: u64) {
    eprintln!("{name}: raw ULP failed on {raw_failed}/{SEEDS} seeds (violations logged on {raw_violations}); sqdisc clean on {clean}/{SEEDS}");
}

// ---- rule 1: periodic signaling ----------------------------------------------------------------------------

#[test]
fn never_signaling_leaves_the_sq_full_for_good() {
    let (mut raw_failed, mut raw_viol, mut clean) = (0, 0, 0);
    for seed in 0..SEEDS {
        let net = Net::new(config(seed, 20_000, 20_000), 16, 64);
        let src = Buf::new(64, 7);
        let lk = mr_keys(net.reg(&src)).0;
        let mut stuck = false;
        for i in 0..64u64 {
            let w = wr(i, op::IBV_WR_RDMA_WRITE, 0, &[(src.addr(), 64, lk)]).rdma(net.server.addr(), net.server_key);
            let mut rc = post1(net.a, w);
            for _ in 0..200 {
                if rc != libc::ENOMEM {
                    break;
                }
                poll(net.a_cq, 16);
                let w = wr(i, op::IBV_WR_RDMA_WRITE, 0, &[(src.addr(), 64, lk)]).rdma(net.server.addr(), net.server_key);
                rc = post1(net.a, w);
            }
            if rc == libc::ENOMEM {
                stuck = true;
                break;
            }
        }
        raw_failed += u64::from(stuck);
        raw_viol += u64::from(net.kinds().contains(&SQD_SIM_VIOLATION_SQ_OVERFLOW));

        // The same ULP (never asks for a signaled WR) through sqdisc.
        let net = Net::new(config(seed, 20_000, 20_000), 16, 64);
        let src = Buf::new(64, 7);
        let lk = mr_keys(net.reg(&src)).0;
        let m = managed(&net, 16, 0, None);
        for i in 0..64u64 {
            let w = wr(i, op::IBV_WR_RDMA_WRITE, 0, &[(src.addr(), 64, lk)]).rdma(net.server.addr(), net.server_key);
            qpost(&m.queue, &mut [w]).unwrap();
        }
        for _ in 0..20_000 {
            if m.released.borrow().len() == 64 {
                break;
            }
            qpoll(&m.cq);
        }
        let ok = m.released.borrow().len() == 64 && net.kinds().is_empty() && net.dev.stats().sq_overflows == 0;
        clean += u64::from(ok);
    }
    report("never signaling", raw_failed, raw_viol, clean);
    assert_eq!(raw_failed, SEEDS, "an unsignaled SQ fills and stays full on every seed");
    assert_eq!(clean, SEEDS);
}

// ---- rule 2: credits ---------------------------------------------------------------------------------------

#[test]
fn posting_past_the_sq_depth_fails() {
    let (mut raw_failed, mut raw_viol, mut clean) = (0, 0, 0);
    for seed in 0..SEEDS {
        let net = Net::new(config(seed, 20_000, 20_000), 16, 64);
        let mut chain: Vec<W> = (0..20).map(|i| wr(i, op::IBV_WR_RDMA_WRITE, SIGNALED, &[]).rdma(0, 0)).collect();
        let (rc, bad) = post(net.a, &mut chain);
        raw_failed += u64::from(rc == libc::ENOMEM && bad == Some(16));
        raw_viol += u64::from(net.kinds() == vec![SQD_SIM_VIOLATION_SQ_OVERFLOW]);

        let net = Net::new(config(seed, 20_000, 20_000), 16, 64);
        let m = managed(&net, 16, 0, None);
        let mut chain: Vec<W> = (0..20).map(|i| wr(i, op::IBV_WR_RDMA_WRITE, SIGNALED, &[]).rdma(0, 0)).collect();
        let posted = qpost(&m.queue, &mut chain).is_ok();
        let mut seen = 0;
        for _ in 0..20_000 {
            seen += qpoll(&m.cq).len();
            if seen == 20 {
                break;
            }
        }
        clean += u64::from(posted && seen == 20 && net.kinds().is_empty() && net.dev.stats().sq_overflows == 0);
    }
    report("posting past the depth", raw_failed, raw_viol, clean);
    assert_eq!(raw_failed, SEEDS);
    assert_eq!(clean, SEEDS);
}

#[test]
fn a_shared_cq_sized_for_signaled_cqes_overruns_on_a_flush_storm() {
    const QPS: usize = 4;
    let (mut raw_failed, mut raw_viol, mut clean) = (0, 0, 0);
    for seed in 0..SEEDS {
        // Four QPs share one CQ sized for the 2 signaled WQEs each of 16 posts; the peers' side is separate.
        let build = |cqe: i32| {
            let dev = Rc::new(SimDevice::new(&config(seed, 20_000, 20_000)).unwrap());
            let shared = dev.create_cq(cqe).unwrap();
            let peer_cq = dev.create_cq(256).unwrap();
            let qps: Vec<*mut ibv_qp> = (0..QPS)
                .map(|_| {
                    let a = dev.create_qp(&mut qp_attr(shared, shared, 16, 1)).unwrap();
                    let b = dev.create_qp(&mut qp_attr(peer_cq, peer_cq, 16, 1)).unwrap();
                    dev.connect(a, b, &SimConnAttr::default()).unwrap();
                    a
                })
                .collect();
            (dev, shared, qps)
        };
        let wrs = |base: u64| -> Vec<W> { (0..16).map(|i| wr(base + i, op::IBV_WR_RDMA_WRITE, if i % 8 == 7 { SIGNALED } else { 0 }, &[]).rdma(0, 0)).collect() };

        let (dev, shared, qps) = build((QPS * 2) as i32);
        for (k, &qp) in qps.iter().enumerate() {
            assert_eq!(post(qp, &mut wrs(k as u64 * 100)).0, 0);
        }
        for _ in 0..(seed % 5) {
            poll(shared, 1);
        }
        for &qp in &qps {
            dev.set_error(qp).unwrap();
        }
        let overrun = dev.stats().cq_overruns > 0;
        raw_failed += u64::from(overrun);
        raw_viol += u64::from(dev.violation_log().iter().any(|v| v.kind == SQD_SIM_VIOLATION_CQ_OVERRUN));

        // sqdisc refuses the undersized CQ (its budget counts a flush of every slot), and on a CQ sized by that
        // budget the same storm fits.
        let (dev, shared, qps) = build((QPS * 2) as i32);
        // SAFETY: the CQ and QPs live as long as the device, which outlives these handles.
        let cq = Cq::new(unsafe { CqHandle::from_raw(shared) }.unwrap());
        let cfg = QueueConfig { sq_depth: 16, max_send_sge: 4, max_inline_data: 64, backlog_depth: 64, ..QueueConfig::default() };
        let refused = Queue::new(&cq, None, unsafe { QpHandle::from_raw(qps[0]) }.unwrap(), cfg, None).err().map(|e| e.errno());
        drop(cq);
        drop(dev);
        let (dev, shared, qps) = build((QPS * 17) as i32);
        let cq = Cq::new(unsafe { CqHandle::from_raw(shared) }.unwrap());
        let released = Rc::new(Cell::new(0usize));
        let queues: Vec<Queue> = qps
            .iter()
            .map(|&qp| {
                let r = released.clone();
                let h = ReleaseHandler::Closure(Box::new(move |_c: &Completion| r.set(r.get() + 1)));
                Queue::new(&cq, None, unsafe { QpHandle::from_raw(qp) }.unwrap(), cfg, Some(h)).unwrap()
            })
            .collect();
        for (k, q) in queues.iter().enumerate() {
            qpost(q, &mut wrs(k as u64 * 100)).unwrap();
        }
        for _ in 0..(seed % 5) {
            qpoll(&cq);
        }
        for &qp in &qps {
            dev.set_error(qp).unwrap();
        }
        for _ in 0..100 {
            qpoll(&cq);
        }
        let ok = refused == Some(libc::ENOSPC) && dev.stats().cq_overruns == 0 && dev.violation_log().is_empty() && released.get() == QPS * 16;
        clean += u64::from(ok);
        drop(queues);
        drop(cq);
    }
    report("CQ sized for signaled CQEs only", raw_failed, raw_viol, clean);
    assert_eq!(raw_failed, SEEDS);
    assert_eq!(clean, SEEDS);
}

// ---- rule 3: stable resources ------------------------------------------------------------------------------

/// One request/reply exchange per round; the request's MR is deregistered when the reply arrives (raw), or
/// handed to `Queue::defer_teardown` (sqdisc). Returns (LOC_PROT_ERR seen, violations logged, all replies).
fn dereg_on_reply(seed: u64, managed_ulp: bool) -> (bool, bool, bool) {
    const ROUNDS: u64 = 12;
    let net = Net::new(config(seed, 0, 200_000), 16, 64);
    let replies = Buf::new(16 * 64, 0);
    let reply_key = mr_keys(net.reg(&replies)).0;
    let bufs: Vec<Buf> = (0..ROUNDS).map(|r| Buf::new(64, r as u8)).collect();
    let m = managed_ulp.then(|| managed(&net, 16, 16, None));
    for i in 0..16u64 {
        let sge = [(replies.addr() + i * 64, 64, reply_key)];
        match &m {
            Some(m) => assert_eq!(qpost_recv(&m.queue, 500 + i, &sge), 0),
            None => assert_eq!(post_recv(net.a, 500 + i, &sge), 0),
        }
    }
    let (mut prot, mut got) = (false, 0);
    let mut check = |wcs: Vec<Wc>, got: &mut u64| {
        for wc in wcs {
            prot |= wc.status == st::IBV_WC_LOC_PROT_ERR;
            if wc.opcode == ibv_wc_opcode::IBV_WC_RECV && wc.status == 0 {
                *got += 1;
            }
        }
    };
    for r in 0..ROUNDS {
        let mr = net.reg(&bufs[r as usize]);
        let w = wr(r, op::IBV_WR_SEND, SIGNALED, &[(bufs[r as usize].addr(), 64, mr_keys(mr).0)]);
        match &m {
            Some(m) => {
                qpost(&m.queue, &mut [w]).unwrap();
                // SAFETY: a live MR of the sim, deregistered by nothing else.
                m.queue.defer_teardown(Some(mr_keys(mr).0), unsafe { Teardown::dereg_mr(mr) }).unwrap();
            }
            None => assert_eq!(post1(net.a, w), 0),
        }
        let want = r + 1;
        for _ in 0..3000 {
            net.serve(true);
            let wcs = match &m {
                Some(m) => qpoll(&m.cq),
                None => poll(net.a_cq, 16),
            };
            check(wcs, &mut got);
            if got >= want || net.dev.qp_in_error(net.a).unwrap() {
                break;
            }
        }
        if m.is_none() {
            // The reply proves the server received the request... so the ULP thinks the Send is done.
            net.dev.dereg_mr(mr).unwrap();
        }
        if net.dev.qp_in_error(net.a).unwrap() {
            break;
        }
    }
    for _ in 0..300 {
        net.serve(true);
        let wcs = match &m {
            Some(m) => qpoll(&m.cq),
            None => poll(net.a_cq, 16),
        };
        check(wcs, &mut got);
    }
    let violations = !net.kinds().is_empty();
    drop(m);
    (prot, violations, got == ROUNDS)
}

#[test]
fn deregistering_a_sends_mr_on_the_peers_reply_hits_a_retransmission() {
    let (mut raw_failed, mut raw_viol, mut clean) = (0, 0, 0);
    for seed in 0..SEEDS {
        let (prot, viol, _) = dereg_on_reply(seed, false);
        raw_failed += u64::from(prot);
        raw_viol += u64::from(viol);
        let (prot, viol, all) = dereg_on_reply(seed, true);
        clean += u64::from(!prot && !viol && all);
    }
    report("dereg on reply (ACK loss)", raw_failed, raw_viol, clean);
    assert!(raw_failed > 0, "with ACK loss some seeds retransmit a Send whose MR is gone");
    assert!(raw_viol >= raw_failed);
    assert_eq!(clean, SEEDS);
}

/// A target that writes `CHUNKS` chunks through staging memory and reuses it after a short wait (raw), or
/// only after the WR's release (sqdisc). Returns (peer got corrupted bytes, violations logged).
fn staging_reuse(seed: u64, managed_ulp: bool) -> (bool, bool) {
    const CHUNKS: u64 = 32;
    let net = Net::new(config(seed, 30_000, 0), 16, 64);
    let pattern = |i: u64| -> Vec<u8> { (0..64).map(|b| (i * 7 + b) as u8).collect() };
    let remote = |i: u64| net.server.addr() + 2048 + i * 64;
    if !managed_ulp {
        let staging = Buf::new(64, 0);
        let lk = mr_keys(net.reg(&staging)).0;
        for i in 0..CHUNKS {
            staging.write(0, &pattern(i));
            let flags = if i % 4 == 3 { SIGNALED } else { 0 };
            let w = wr(i, op::IBV_WR_RDMA_WRITE, flags, &[(staging.addr(), 64, lk)]).rdma(remote(i), net.server_key);
            assert_eq!(post1(net.a, w), 0);
            // "The HCA has surely sent it by now."
            for _ in 0..3 {
                poll(net.a_cq, 16);
            }
        }
        while post1(net.a, wr(99, op::IBV_WR_RDMA_WRITE, SIGNALED, &[]).rdma(0, 0)) == libc::ENOMEM {
            poll(net.a_cq, 16);
        }
        net.dev.run_until_idle(100_000).unwrap();
    } else {
        // A pool of staging buffers; a buffer returns to the pool in its WR's release callback.
        let pool: Vec<Buf> = (0..4).map(|_| Buf::new(64, 0)).collect();
        let keys: Vec<u32> = pool.iter().map(|b| mr_keys(net.reg(b)).0).collect();
        let free: Rc<RefCell<Vec<usize>>> = Rc::new(RefCell::new((0..pool.len()).collect()));
        let f = free.clone();
        let m = managed(&net, 16, 0, Some(Box::new(move |c: &Completion| f.borrow_mut().push((c.wr_id >> 32) as usize))));
        for i in 0..CHUNKS {
            let slot = loop {
                if let Some(s) = free.borrow_mut().pop() {
                    break s;
                }
                qpoll(&m.cq);
            };
            pool[slot].write(0, &pattern(i));
            let w = wr(((slot as u64) << 32) | i, op::IBV_WR_RDMA_WRITE, 0, &[(pool[slot].addr(), 64, keys[slot])]).rdma(remote(i), net.server_key);
            qpost(&m.queue, &mut [w]).unwrap();
            for _ in 0..3 {
                qpoll(&m.cq);
            }
        }
        while m.released.borrow().len() < CHUNKS as usize {
            qpoll(&m.cq);
        }
    }
    let corrupted = (0..CHUNKS).any(|i| net.server.read(2048 + i as usize * 64, 64) != pattern(i));
    (corrupted, !net.kinds().is_empty())
}

#[test]
fn reusing_a_source_buffer_before_its_completion_corrupts_the_peers_data_under_loss() {
    let (mut raw_failed, mut raw_viol, mut clean) = (0, 0, 0);
    for seed in 0..SEEDS {
        let (bad, viol) = staging_reuse(seed, false);
        raw_failed += u64::from(bad);
        raw_viol += u64::from(viol);
        let (bad, viol) = staging_reuse(seed, true);
        clean += u64::from(!bad && !viol);
    }
    report("staging buffer reuse (request loss)", raw_failed, raw_viol, clean);
    assert!(raw_failed > 0);
    assert!(raw_viol >= raw_failed, "every corruption comes with a 'source modified' violation");
    assert_eq!(clean, SEEDS);
}

// ---- rule 4: deferred invalidation -------------------------------------------------------------------------

/// Rounds of "SEND from an MR, then invalidate that MR": raw posts an unfenced LocalInv right behind the Send;
/// sqdisc uses `Queue::invalidate` (deferred, or fenced). Returns (protection error seen, violations logged).
fn local_inv_after_send(seed: u64, mode: Option<InvalidateMode>) -> (bool, bool) {
    const ROUNDS: u64 = 12;
    let net = Net::new(config(seed, 50_000, 0), 16, 64);
    let bufs: Vec<Buf> = (0..ROUNDS).map(|r| Buf::new(64, r as u8)).collect();
    let m = mode.map(|_| managed(&net, 16, 0, None));
    let mut prot = false;
    let done = Rc::new(Cell::new(0u64));
    for r in 0..ROUNDS {
        let mr = net.reg(&bufs[r as usize]);
        let (lkey, rkey) = mr_keys(mr);
        let send = wr(r, op::IBV_WR_SEND, 0, &[(bufs[r as usize].addr(), 64, lkey)]);
        match (&m, mode) {
            (Some(m), Some(mode)) => {
                qpost(&m.queue, &mut [send]).unwrap();
                let d = done.clone();
                let h = ReleaseHandler::Closure(Box::new(move |c: &Completion| {
                    assert_eq!(c.status, 0, "LocalInv failed");
                    d.set(d.get() + 1)
                }));
                m.queue.invalidate(rkey, mode, 1000 + r, Some(h)).unwrap();
            }
            _ => {
                let inv = wr(1000 + r, op::IBV_WR_LOCAL_INV, SIGNALED, &[]).imm(rkey);
                assert_eq!(post(net.a, &mut [send, inv]).0, 0);
            }
        }
        for _ in 0..3000 {
            net.serve(false);
            let wcs = match &m {
                Some(m) => qpoll(&m.cq),
                None => poll(net.a_cq, 16),
            };
            for wc in &wcs {
                prot |= wc.status == st::IBV_WC_LOC_PROT_ERR;
                if wc.wr_id >= 1000 {
                    done.set(done.get() + 1);
                }
            }
            if done.get() > r || net.dev.qp_in_error(net.a).unwrap() {
                break;
            }
        }
        if net.dev.qp_in_error(net.a).unwrap() {
            break;
        }
        net.dev.dereg_mr(mr).unwrap();
    }
    let viol = !net.kinds().is_empty();
    drop(m);
    (prot, viol)
}

#[test]
fn a_local_inv_right_behind_a_send_without_fence_breaks_its_retransmission() {
    let (mut raw_failed, mut raw_viol, mut clean, mut clean_fenced) = (0, 0, 0, 0);
    for seed in 0..SEEDS {
        let (prot, viol) = local_inv_after_send(seed, None);
        raw_failed += u64::from(prot);
        raw_viol += u64::from(viol);
        let (prot, viol) = local_inv_after_send(seed, Some(InvalidateMode::Deferred));
        clean += u64::from(!prot && !viol);
        let (prot, viol) = local_inv_after_send(seed, Some(InvalidateMode::Fenced));
        clean_fenced += u64::from(!prot && !viol);
    }
    report("LocalInv behind a Send, no fence (request loss)", raw_failed, raw_viol, clean);
    eprintln!("  sqdisc with the Local Invalidate Fence: clean on {clean_fenced}/{SEEDS}");
    assert!(raw_failed > 0);
    assert_eq!(clean, SEEDS);
    assert_eq!(clean_fenced, SEEDS);
}

// ---- release timing --------------------------------------------------------------------------------------

#[test]
fn no_release_callback_fires_while_the_oracle_says_the_buffer_is_busy() {
    let mut releases = 0u64;
    let mut busy_after_post = 0u64;
    let mut early = Vec::new();
    for seed in 0..SEEDS {
        let net = Net::new(config(seed, 50_000, 50_000), 16, 64);
        let bufs: Rc<Vec<Buf>> = Rc::new((0..8).map(|_| Buf::new(64, 0)).collect());
        let keys: Vec<u32> = bufs.iter().map(|b| mr_keys(net.reg(b)).0).collect();
        let free: Rc<RefCell<Vec<usize>>> = Rc::new(RefCell::new((0..8).collect()));
        let bad: Rc<RefCell<Vec<u64>>> = Rc::default();
        let (dev, b2, f2, bad2) = (net.dev.clone(), bufs.clone(), free.clone(), bad.clone());
        let m = managed(
            &net,
            16,
            0,
            Some(Box::new(move |c: &Completion| {
                let slot = (c.wr_id >> 32) as usize;
                if dev.buffer_busy(b2[slot].ptr().cast(), 64) {
                    bad2.borrow_mut().push(c.wr_id);
                }
                f2.borrow_mut().push(slot);
            })),
        );
        for i in 0..48u64 {
            let slot = loop {
                if let Some(s) = free.borrow_mut().pop() {
                    break s;
                }
                net.serve(false);
                qpoll(&m.cq);
            };
            bufs[slot].fill(i as u8);
            let id = ((slot as u64) << 32) | i;
            let sge = [(bufs[slot].addr(), 64, keys[slot])];
            let w = if i % 3 == 0 { wr(id, op::IBV_WR_SEND, 0, &sge) } else { wr(id, op::IBV_WR_RDMA_WRITE, 0, &sge).rdma(net.server.addr() + 4096, net.server_key) };
            qpost(&m.queue, &mut [w]).unwrap();
            busy_after_post += u64::from(net.dev.buffer_busy(bufs[slot].ptr().cast(), 64));
            net.serve(false);
        }
        while m.released.borrow().len() < 48 {
            net.serve(false);
            qpoll(&m.cq);
        }
        releases += 48;
        assert!(m.released.borrow().iter().all(|c| c.status == 0), "seed {seed}: a WR failed");
        assert!(net.kinds().is_empty(), "seed {seed}: {:?}", net.dev.violation_log());
        if !bad.borrow().is_empty() {
            early.push((seed, bad.borrow().clone()));
        }
    }
    eprintln!(
        "release timing: {releases} releases over {SEEDS} seeds with 5% request and ACK loss; {} early; buffer busy right \
         after {busy_after_post} posts",
        early.len()
    );
    assert!(busy_after_post > releases / 2, "the oracle sees posted buffers as busy (it is not trivially false)");
    assert!(early.is_empty(), "releases while the HCA could still read the buffer: {early:?}");
}
