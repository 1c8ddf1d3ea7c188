//! Parked WRs take their storage from a pool shared by the queues whose sends complete on one CQ: a queue at
//! rest holds no backlog storage of its own, the pool's exhaustion refuses a WR with EAGAIN (and a message) and
//! never drops or stalls one, WRs parked by several queues through one pool are posted in order and released
//! exactly once, and parking allocates nothing in steady state.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use common::*;
use rdma_sys::ibv_qp;
use sqdisc_sim::scripted::{ScriptedDevice, ScriptedQpCaps};
use sqdisc_sim::{SimConfig, SimDevice, SQD_SIM_NULL};
use sqdisc::verbs::{CqHandle, QpHandle, SendChain};
use sqdisc::{Completion, Cq, Queue, QueueConfig, ReleaseHandler};

/// Counts this thread's allocation calls and the bytes they asked for (other test threads do not disturb it).
struct Counting;

thread_local! {
    static ALLOCS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

fn bump(bytes: usize) {
    let _ = ALLOCS.try_with(|c| {
        let (n, b) = c.get();
        c.set((n + 1, b + bytes as u64));
    });
}

/// (allocation calls, bytes asked for) so far on this thread.
fn allocs() -> (u64, u64) {
    ALLOCS.with(|c| c.get())
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a const-initialised
// thread-local `Cell` without a destructor, which allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump(layout.size());
        // SAFETY: forwarded with the caller's own layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump(layout.size());
        // SAFETY: forwarded with the caller's own layout.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump(new_size);
        // SAFETY: as for `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Queues on one managed CQ of a scripted device, each with a log of its releases. Fields drop in order: the
/// queues, then the CQ, then the device.
struct Group {
    queues: Vec<Queue>,
    logs: Vec<Rc<RefCell<Vec<Completion>>>>,
    qps: Vec<*mut ibv_qp>,
    cq: Cq,
    dev: Device,
    cq_raw: *mut rdma_sys::ibv_cq,
    /// (allocation calls, bytes) that the newest `Queue::new` took.
    last_new_heap: (u64, u64),
}

impl Group {
    /// On the scripted device.
    fn new(cqe: i32) -> Group {
        Group::on(ScriptedDevice::new(), cqe)
    }

    fn on(dev: Device, cqe: i32) -> Group {
        let cq_raw = dev.create_cq(cqe).unwrap();
        // SAFETY: the CQ lives as long as the device, which outlives the handle (drop order).
        let cq = Cq::new(unsafe { CqHandle::from_raw(cq_raw) }.unwrap());
        Group { queues: Vec::new(), logs: Vec::new(), qps: Vec::new(), cq, dev, cq_raw, last_new_heap: (0, 0) }
    }

    /// Adds a queue of `cfg` (its QP granted exactly `cfg`'s depths and limits); returns its index.
    fn add(&mut self, cfg: QueueConfig) -> usize {
        let caps = ScriptedQpCaps {
            max_send_wr: cfg.sq_depth,
            max_recv_wr: 1,
            max_send_sge: cfg.max_send_sge,
            max_recv_sge: 1,
            max_inline_data: cfg.max_inline_data,
        };
        let qp = self.dev.create_qp(self.cq_raw, self.cq_raw, &caps).unwrap();
        let log: Rc<RefCell<Vec<Completion>>> = Rc::default();
        let l = log.clone();
        let release = ReleaseHandler::Closure(Box::new(move |c: &Completion| l.borrow_mut().push(*c)));
        // SAFETY: the QP lives as long as the device.
        let qh = unsafe { QpHandle::from_raw(qp) }.unwrap();
        let before = allocs();
        let q = Queue::new(&self.cq, None, qh, cfg, Some(release)).unwrap();
        let after = allocs();
        self.last_new_heap = (after.0 - before.0, after.1 - before.1);
        self.queues.push(q);
        self.logs.push(log);
        self.qps.push(qp);
        self.queues.len() - 1
    }

    /// Posts `chain` to queue `i`: Ok, or (errno, message, index of the bad WR).
    fn post(&self, i: usize, chain: &mut Chain) -> Result<(), (i32, String, Option<usize>)> {
        let head = chain.link();
        // SAFETY: the chain lives in `chain` for the whole call.
        let r = self.queues[i].post_send(unsafe { SendChain::from_raw(head) });
        r.map_err(|e| (e.error.errno(), e.error.message().to_string(), chain.index_of(e.bad.as_ptr())))
    }

    /// Lets queue `i`'s QP execute up to `n` WQEs, then polls the CQ until it is empty.
    fn complete_and_poll(&self, i: usize, n: usize) {
        self.dev.complete(self.qps[i], n).unwrap();
        self.poll_all();
    }

    fn poll_all(&self) {
        loop {
            // SAFETY: all-zero is a valid `ibv_wc`.
            let mut wc: [rdma_sys::ibv_wc; 8] = unsafe { std::mem::zeroed() };
            let n = self.cq.poll(&mut wc).unwrap();
            if n < wc.len() {
                return;
            }
        }
    }

    fn released(&self, i: usize) -> Vec<u64> {
        self.logs[i].borrow().iter().map(|c| c.wr_id).collect()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.queues.clear();
    }
}

fn shape(sq_depth: u32, max_send_sge: u32, backlog_depth: u32) -> QueueConfig {
    QueueConfig { sq_depth, max_send_sge, max_inline_data: 64, backlog_depth, ..QueueConfig::default() }
}

/// (a) A queue of depth 256, 16 SGEs, a 256-deep backlog and 64 inline bytes holds at most 16 KB at rest: its
/// `bytes`, and the heap its creation takes, once the CQ's pool has its storage (here from the first queue,
/// with the pool limited to 256 parked WRs on the CQ).
#[test]
fn a_queue_with_a_deep_backlog_is_small_at_rest() {
    const TARGET: u64 = 16 * 1024;
    let mut g = Group::new(4096);
    g.cq.set_backlog_limit(256).unwrap();
    g.add(shape(256, 16, 256));
    for _ in 0..3 {
        let i = g.add(shape(256, 16, 256));
        let bytes = g.queues[i].stats().bytes;
        assert!(bytes <= TARGET, "sqd_queue_stats.bytes of a 256/16/256 queue is {bytes}, above {TARGET}");
        assert_eq!(bytes, g.queues[i].footprint() as u64);
        let (calls, heap) = g.last_new_heap;
        assert!(heap <= TARGET, "creating a 256/16/256 queue took {heap} bytes of heap ({calls} allocations)");
    }
    let pool = g.cq.backlog_pool_stats();
    assert_eq!((pool.limit, pool.capacity, pool.demand, pool.parked), (256, 256, 4 * 256, 0), "a limited pool does not grow: {pool:?}");
    assert!(pool.bytes >= 256 * (16 * 16 + 64), "the pool holds 256 WRs of 16 SGEs and 64 inline bytes: {pool:?}");
}

/// (b) Two queues share a pool limited to 6 parked WRs: a WR that finds it exhausted is refused with EAGAIN and
/// a message (it and the WRs after it are not accepted, `bad` at it), and is taken once releases have emptied
/// the pool. The per-queue `backlog_depth` stays a cap of its own.
#[test]
fn an_exhausted_pool_refuses_with_eagain_until_releases_free_it() {
    let mut g = Group::new(256);
    g.cq.set_backlog_limit(6).unwrap();
    let a = g.add(config(4, 0, 8));
    let b = g.add(config(4, 0, 8));
    // A: 4 posted, 6 parked (the pool's limit), the 11th refused although A's own backlog has room.
    let mut c = Chain::sends(0..12, 0);
    let (errno, msg, bad) = g.post(a, &mut c).unwrap_err();
    assert_eq!((errno, bad), (libc::EAGAIN, Some(10)), "{msg}");
    assert!(msg.contains("pool") && msg.contains('6'), "the message names the CQ's exhausted pool: {msg}");
    let (sa, pool) = (g.queues[a].stats(), g.cq.backlog_pool_stats());
    assert_eq!((sa.accepted, sa.in_provider, sa.backlog, sa.refused), (10, 4, 6, 1));
    assert_eq!((pool.parked, pool.peak, pool.exhausted), (6, 6, 1), "{pool:?}");
    // B: 4 posted, then nothing parks.
    let mut c = Chain::sends(100..106, 0);
    let (errno, msg, bad) = g.post(b, &mut c).unwrap_err();
    assert_eq!((errno, bad), (libc::EAGAIN, Some(4)), "{msg}");
    assert!(msg.contains("pool"), "{msg}");
    let sb = g.queues[b].stats();
    assert_eq!((sb.accepted, sb.backlog, sb.refused), (4, 0, 1));
    // A's CQEs free its slots: its parked WRs move to the SQ (4, then 2) and leave the pool.
    g.complete_and_poll(a, usize::MAX);
    assert_eq!(g.released(a), (0..4).collect::<Vec<_>>());
    assert_eq!((g.queues[a].stats().backlog, g.cq.backlog_pool_stats().parked), (2, 2));
    g.complete_and_poll(a, usize::MAX);
    assert_eq!(g.released(a), (0..8).collect::<Vec<_>>());
    assert_eq!(g.queues[a].stats().backlog, 0);
    assert_eq!(g.cq.backlog_pool_stats().parked, 0);
    // B's refused WR and the rest are taken now.
    let mut c = Chain::sends(104..110, 0);
    g.post(b, &mut c).unwrap();
    assert_eq!(g.queues[b].stats().backlog, 6);
    g.complete_and_poll(a, usize::MAX);
    for _ in 0..4 {
        g.complete_and_poll(b, usize::MAX);
    }
    assert_eq!(g.released(a), (0..10).collect::<Vec<_>>());
    assert_eq!(g.released(b), (100..110).collect::<Vec<_>>());
    assert_eq!(g.cq.backlog_pool_stats().parked, 0);

    // The queue's own cap: a pool with room does not let a queue park beyond its backlog_depth.
    g.cq.set_backlog_limit(0).unwrap();
    let d = g.add(config(4, 0, 2));
    let mut c = Chain::sends(200..210, 0);
    let (errno, msg, bad) = g.post(d, &mut c).unwrap_err();
    assert_eq!((errno, bad), (libc::EAGAIN, Some(6)), "{msg}");
    assert!(msg.contains("backlog is full") && msg.contains("backlog_depth 2"), "{msg}");
    for _ in 0..3 {
        g.complete_and_poll(d, usize::MAX);
    }
    assert_eq!(g.released(d), (200..206).collect::<Vec<_>>());
}

/// (c) Three queues park through one pool smaller than their backlogs together; WRs are posted interleaved,
/// completed a few at a time, some refused by the exhausted pool and posted again later. Every accepted WR is
/// released exactly once, in post order per queue, and nothing stays in the pool.
#[test]
fn queues_sharing_a_pool_release_every_parked_wr_once_in_order() {
    let mut g = Group::new(1024);
    g.cq.set_backlog_limit(10).unwrap();
    let qs: Vec<usize> = (0..3).map(|_| g.add(config(4, 2, 8))).collect();
    let mut next = [0u64; 3]; // the next wr_id (per queue) to hand over
    let total = 200u64;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut step = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut refusals = 0;
    let mut rounds = 0;
    while g.released(0).len() + g.released(1).len() + g.released(2).len() < 3 * total as usize {
        rounds += 1;
        assert!(rounds < 10_000, "no progress: {:?}", qs.iter().map(|&q| g.queues[q].stats()).collect::<Vec<_>>());
        let q = (step() % 3) as usize;
        let n = 1 + step() % 6;
        let from = next[q];
        let to = (from + n).min(total);
        if from < to {
            let mut c = Chain::sends(q as u64 * 1_000_000 + from..q as u64 * 1_000_000 + to, 0);
            match g.post(qs[q], &mut c) {
                Ok(()) => next[q] = to,
                Err((errno, msg, bad)) => {
                    assert_eq!(errno, libc::EAGAIN, "{msg}");
                    let bad = bad.expect("bad points into the chain") as u64;
                    next[q] = from + bad;
                    refusals += 1;
                }
            }
        }
        let pool = g.cq.backlog_pool_stats();
        assert!(pool.parked <= 10, "{pool:?}");
        let parked: u32 = qs.iter().map(|&q| g.queues[q].stats().backlog).sum();
        assert_eq!(parked, pool.parked, "the pool counts exactly the queues' parked WRs");
        let c = (step() % 3) as usize;
        g.complete_and_poll(qs[c], (step() % 5) as usize);
    }
    for (k, &q) in qs.iter().enumerate() {
        let want: Vec<u64> = (0..total).map(|i| k as u64 * 1_000_000 + i).collect();
        assert_eq!(g.released(q), want, "queue {k}: every WR released once, in post order");
        assert!(g.logs[q].borrow().iter().all(|c| c.status == WC_SUCCESS && c.flags & sqdisc::SQD_COMPLETION_NEVER_POSTED == 0));
        let s = g.queues[q].stats();
        assert_eq!((s.accepted, s.released, s.backlog), (total, total, 0));
    }
    let pool = g.cq.backlog_pool_stats();
    assert_eq!((pool.parked, pool.peak), (0, 10), "{pool:?}");
    assert!(refusals > 0 && pool.exhausted > 0, "the scenario exhausted the pool: {refusals} refusals, {pool:?}");
}

/// A queue freed (dropped) with WRs still parked gives their storage back to the pool.
#[test]
fn a_dropped_queue_gives_its_parked_entries_back() {
    let mut g = Group::new(256);
    g.cq.set_backlog_limit(6).unwrap();
    let a = g.add(config(4, 0, 8));
    let mut c = Chain::sends(0..9, 0);
    g.post(a, &mut c).unwrap();
    assert_eq!(g.cq.backlog_pool_stats().parked, 5);
    g.queues.clear();
    let pool = g.cq.backlog_pool_stats();
    assert_eq!((pool.parked, pool.demand), (0, 0), "{pool:?}");
}

/// (d) Parking through the shared pool and posting from it allocate nothing once the queues exist: many
/// rounds of chains that fill the SQ and park the rest, on two queues, make no heap allocation. On the
/// software HCA's null mode (every WQE completes at post), which allocates nothing per WR itself.
#[test]
fn parking_allocates_nothing_in_steady_state() {
    let dev = SimDevice::new(&SimConfig { flags: SQD_SIM_NULL, ..SimConfig::default() }).unwrap();
    let cq_raw = dev.create_cq(1024).unwrap();
    // SAFETY: the CQ and QPs live as long as the device, which is dropped last.
    let cq = Cq::new(unsafe { CqHandle::from_raw(cq_raw) }.unwrap());
    cq.set_backlog_limit(24).unwrap();
    let released = Rc::new(Cell::new(0u64));
    let queues: Vec<Queue> = (0..2)
        .map(|_| {
            // SAFETY: `ibv_qp_init_attr` is plain data: zero is valid.
            let mut attr: rdma_sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
            (attr.send_cq, attr.recv_cq, attr.qp_type) = (cq_raw, cq_raw, rdma_sys::ibv_qp_type::IBV_QPT_RC);
            (attr.cap.max_send_wr, attr.cap.max_recv_wr, attr.cap.max_send_sge, attr.cap.max_recv_sge) = (8, 1, 4, 1);
            attr.cap.max_inline_data = 64;
            let qp = dev.create_qp(&mut attr).unwrap();
            let r = released.clone();
            let release = ReleaseHandler::Closure(Box::new(move |_: &Completion| r.set(r.get() + 1)));
            // SAFETY: as above.
            Queue::new(&cq, None, unsafe { QpHandle::from_raw(qp) }.unwrap(), config(8, 0, 16), Some(release)).unwrap()
        })
        .collect();
    let mut chains: Vec<Chain> = (0..2u64).map(|k| Chain::sends(k * 1000..k * 1000 + 20, 0)).collect();
    // Every chain ends signaled, so no idle-tail marker is needed and each round completes by itself.
    for c in &mut chains {
        c.wrs.last_mut().unwrap().send_flags = SIGNALED;
    }
    // Linked once, before counting (linking builds a list of SGE pointers).
    let heads: Vec<_> = chains.iter_mut().map(|c| c.link()).collect();
    let round = || {
        for (q, &head) in queues.iter().zip(&heads) {
            // SAFETY: the chain lives in `chains` for the whole test; the post restores it as it was.
            q.post_send(unsafe { SendChain::from_raw(head) }).unwrap();
        }
        assert_eq!(cq.backlog_pool_stats().parked, 24);
        // SAFETY: all-zero is a valid `ibv_wc`.
        let mut wc: [rdma_sys::ibv_wc; 8] = unsafe { std::mem::zeroed() };
        for _ in 0..16 {
            cq.poll(&mut wc).unwrap();
        }
        for q in &queues {
            let s = q.stats();
            assert_eq!((s.backlog, s.accepted - s.released), (0, 0), "{s:?}");
        }
    };
    round();
    let before = allocs();
    for _ in 0..50 {
        round();
    }
    let after = allocs();
    assert_eq!(after.0 - before.0, 0, "allocations in 50 rounds of 24 parked WRs");
    assert_eq!(queues[0].stats().parked, 51 * 12);
    assert_eq!(released.get(), 51 * 40);
    drop(queues);
    drop(cq);
}

/// A fenced invalidation is posted at once or refused: with no SQ credit and the CQ's pool at its limit (the
/// queue's own backlog has room) it is refused with EAGAIN, as with a full backlog, and taken after releases.
#[test]
fn a_fenced_invalidation_finds_the_pool_at_its_limit_and_is_refused() {
    use sqdisc::InvalidateMode;
    let mut g = Group::new(256);
    g.cq.set_backlog_limit(2).unwrap();
    let a = g.add(config(4, 0, 8));
    let mut c = Chain::sends(0..6, 0);
    g.post(a, &mut c).unwrap();
    assert_eq!(g.cq.backlog_pool_stats().parked, 2);
    let e = g.queues[a].invalidate(0x1234, InvalidateMode::Fenced, 77, None).unwrap_err();
    assert_eq!(e.errno(), libc::EAGAIN, "{}", e.message());
    assert!(e.message().contains("backlog pool"), "{}", e.message());
    assert_eq!(g.queues[a].stats().accepted, 6, "the LocalInv was not accepted");
    g.complete_and_poll(a, usize::MAX);
    g.queues[a].invalidate(0x1234, InvalidateMode::Fenced, 77, None).unwrap();
    for _ in 0..3 {
        g.complete_and_poll(a, usize::MAX);
    }
    let s = g.queues[a].stats();
    assert_eq!((s.accepted, s.released, s.backlog), (7, 7, 0), "{s:?}");
}
