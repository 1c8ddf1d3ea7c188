//! Posting receives through a managed queue or SRQ allocates nothing beyond what the provider itself does:
//! the same receive chains posted raw to an identical software-HCA QP (or SRQ) and through sqdisc make the
//! same number of heap allocations. Also checks the ULP's wr_ids come back on every WR, including the WRs the
//! provider refused.

#[allow(unused_imports)]
mod sim_support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ptr;

use rdma_sys::{ibv_qp, ibv_recv_wr, ibv_sge, ibv_srq, ibv_srq_init_attr};
use sim_support::*;
use sqdisc_sim::{SimConfig, SimDevice};
use sqdisc::verbs::{CqHandle, QpHandle, RecvChain, SrqHandle};
use sqdisc::{Cq, Queue, QueueConfig, Srq};

/// Counts this thread's allocation calls (other test threads do not disturb the count).
struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn bump() {
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

fn allocs() -> u64 {
    ALLOCS.with(|c| c.get())
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a const-initialised
// thread-local `Cell` without a destructor, which allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: forwarded with the caller's own layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: forwarded with the caller's own layout.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        // SAFETY: as for `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const DEPTH: u32 = 64;
const CHAINS: usize = 8;
const CHAIN_LEN: usize = 4;

/// Receive chains built before any counting starts: `CHAINS` chains of `CHAIN_LEN` WRs with one SGE each.
struct Chains {
    wrs: Vec<ibv_recv_wr>,
    sges: Vec<ibv_sge>,
}

impl Chains {
    fn new(buf: &Buf, lkey: u32) -> Chains {
        let n = CHAINS * CHAIN_LEN;
        let sges: Vec<ibv_sge> = (0..n).map(|i| ibv_sge { addr: buf.addr() + i as u64 * 64, length: 64, lkey }).collect();
        // SAFETY: `ibv_recv_wr` is plain data; all-zero is valid.
        let wrs: Vec<ibv_recv_wr> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
        let mut c = Chains { wrs, sges };
        c.relink();
        c
    }

    /// Fresh wr_ids (`0x1000 + i`) and links, every chain ending in NULL.
    fn relink(&mut self) {
        let base = self.wrs.as_mut_ptr();
        for i in 0..self.wrs.len() {
            let w = &mut self.wrs[i];
            w.wr_id = 0x1000 + i as u64;
            w.num_sge = 1;
            w.sg_list = &mut self.sges[i];
            // SAFETY: `i + 1` is within `wrs` whenever it is linked (not the last WR of a chain).
            w.next = if (i + 1) % CHAIN_LEN == 0 { ptr::null_mut() } else { unsafe { base.add(i + 1) } };
        }
    }

    fn head(&mut self, chain: usize) -> *mut ibv_recv_wr {
        &mut self.wrs[chain * CHAIN_LEN]
    }

    fn assert_wr_ids_intact(&self) {
        for (i, w) in self.wrs.iter().enumerate() {
            assert_eq!(w.wr_id, 0x1000 + i as u64, "WR {i} did not get its wr_id back");
        }
    }
}

fn raw_post_recv(qp: *mut ibv_qp, head: *mut ibv_recv_wr) -> i32 {
    let mut bad = ptr::null_mut();
    // SAFETY: `qp` is a live sim QP; the chain lives in `Chains` for the call.
    unsafe { (*(*qp).context).ops.post_recv.unwrap()(qp, head, &mut bad) }
}

fn raw_post_srq_recv(srq: *mut ibv_srq, head: *mut ibv_recv_wr) -> i32 {
    let mut bad = ptr::null_mut();
    // SAFETY: `srq` is a live sim SRQ; the chain lives in `Chains` for the call.
    unsafe { (*(*srq).context).ops.post_srq_recv.unwrap()(srq, head, &mut bad) }
}

/// Allocations made by `CHAINS` posts of `post`.
fn count(chains: &mut Chains, mut post: impl FnMut(*mut ibv_recv_wr)) -> u64 {
    let before = allocs();
    for c in 0..CHAINS {
        post(chains.head(c));
    }
    allocs() - before
}

/// Posts every chain raw, then again through sqdisc, and requires no more allocations the second time and
/// the ULP's wr_ids back on every WR both times.
fn assert_no_extra_allocs(
    what: &str,
    chains: &mut Chains,
    raw_post: impl FnMut(*mut ibv_recv_wr),
    managed_post: impl FnMut(*mut ibv_recv_wr),
) {
    let raw = count(chains, raw_post);
    chains.assert_wr_ids_intact();
    chains.relink();
    let managed = count(chains, managed_post);
    chains.assert_wr_ids_intact();
    assert!(
        managed <= raw,
        "{CHAINS} managed {what} calls made {managed} allocations, the same raw posts {raw}: sqdisc allocates on the receive path"
    );
}

#[test]
fn queue_post_recv_allocates_no_more_than_the_provider() {
    let dev = SimDevice::new(&SimConfig::default()).unwrap();
    let cq = dev.create_cq(4 * DEPTH as i32).unwrap();
    let raw_qp = dev.create_qp(&mut qp_attr(cq, cq, 8, DEPTH)).unwrap();
    let managed_qp = dev.create_qp(&mut qp_attr(cq, cq, 8, DEPTH)).unwrap();
    let buf = Buf::new(64 * CHAINS * CHAIN_LEN, 0);
    // SAFETY: the sim writes into `buf` only when a message arrives for a posted receive; nothing is ever
    // sent here, and `buf` lives to the end of the test.
    let lkey = mr_keys(unsafe { dev.reg_mr(buf.ptr().cast(), buf.len(), ACCESS_ALL) }.unwrap()).0;

    // SAFETY: the CQ and QP live as long as the device, which outlives the managed objects.
    let mcq = Cq::new(unsafe { CqHandle::from_raw(cq) }.unwrap());
    let cfg = QueueConfig { sq_depth: 8, rq_depth: DEPTH, max_send_sge: 4, ..QueueConfig::default() };
    // SAFETY: as above.
    let q = Queue::new(&mcq, Some(&mcq), unsafe { QpHandle::from_raw(managed_qp) }.unwrap(), cfg, None).unwrap();

    assert_no_extra_allocs(
        "post_recv",
        &mut Chains::new(&buf, lkey),
        |h| assert_eq!(raw_post_recv(raw_qp, h), 0),
        // SAFETY: each chain lives in `Chains` for the call.
        |h| q.post_recv(unsafe { RecvChain::from_raw(h) }).map_err(|e| e.error.errno()).unwrap(),
    );
    assert_eq!(q.stats().recv_posted, (CHAINS * CHAIN_LEN) as u64);
}

#[test]
fn srq_post_recv_allocates_no_more_than_the_provider() {
    let dev = SimDevice::new(&SimConfig::default()).unwrap();
    let mut attr: ibv_srq_init_attr = srq_attr(DEPTH);
    let raw_srq = dev.create_srq(&mut attr).unwrap();
    let mut attr: ibv_srq_init_attr = srq_attr(DEPTH);
    let managed_srq = dev.create_srq(&mut attr).unwrap();
    let buf = Buf::new(64 * CHAINS * CHAIN_LEN, 0);
    // SAFETY: as in the queue test, nothing is ever sent into `buf`, which lives to the end of the test.
    let lkey = mr_keys(unsafe { dev.reg_mr(buf.ptr().cast(), buf.len(), ACCESS_ALL) }.unwrap()).0;
    // SAFETY: the SRQ lives as long as the device, which outlives the managed SRQ.
    let srq = Srq::new(unsafe { SrqHandle::from_raw(managed_srq) }.unwrap(), DEPTH, None, 0, None).unwrap();

    assert_no_extra_allocs(
        "SRQ post_recv",
        &mut Chains::new(&buf, lkey),
        |h| assert_eq!(raw_post_srq_recv(raw_srq, h), 0),
        // SAFETY: each chain lives in `Chains` for the call.
        |h| srq.post_recv(unsafe { RecvChain::from_raw(h) }).map_err(|e| e.error.errno()).unwrap(),
    );
    assert_eq!(srq.stats().posted, (CHAINS * CHAIN_LEN) as u32);
    srq.release_all().unwrap();
}

/// A managed SRQ of `DEPTH` receives on the sim, with receive chains in a registered buffer. Fields drop in
/// order: the SRQ before the device.
struct SrqRig {
    srq: Srq,
    chains: Chains,
    max_sge: i32,
    _buf: Buf,
    _dev: std::pin::Pin<Box<SimDevice>>,
}

fn srq_rig() -> SrqRig {
    let dev = SimDevice::new(&SimConfig::default()).unwrap();
    let mut attr = srq_attr(DEPTH);
    let raw = dev.create_srq(&mut attr).unwrap();
    let max_sge = attr.attr.max_sge as i32;
    let buf = Buf::new(64 * CHAINS * CHAIN_LEN, 0);
    // SAFETY: as in the queue test, nothing is ever sent into `buf`, which the rig keeps.
    let lkey = mr_keys(unsafe { dev.reg_mr(buf.ptr().cast(), buf.len(), ACCESS_ALL) }.unwrap()).0;
    // SAFETY: the SRQ lives as long as the device, which the rig drops after the managed SRQ.
    let srq = Srq::new(unsafe { SrqHandle::from_raw(raw) }.unwrap(), DEPTH, None, 0, None).unwrap();
    let chains = Chains::new(&buf, lkey);
    SrqRig { srq, chains, max_sge, _buf: buf, _dev: dev }
}

#[test]
fn srq_post_refused_by_the_provider_frees_exactly_the_refused_slots() {
    let mut r = srq_rig();
    let (srq, max_sge) = (&r.srq, r.max_sge);
    let chains = &mut r.chains;

    // The second WR of the first chain names more SGEs than the SRQ takes: the provider posts the first and
    // refuses the rest.
    chains.wrs[1].num_sge = max_sge + 1;
    let head = chains.head(0);
    // SAFETY: the chain lives in `chains` for the call.
    let err = srq.post_recv(unsafe { RecvChain::from_raw(head) }).unwrap_err();
    assert_eq!(err.error.errno(), libc::EINVAL);
    assert!(ptr::eq(err.bad.as_ptr(), &chains.wrs[1]), "bad_wr must be the first WR the provider refused");
    chains.wrs[1].num_sge = 1;
    chains.assert_wr_ids_intact();
    assert_eq!(srq.stats().posted, 1, "only the WR the provider took may hold a slot");

    // Every refused slot is usable again: the SRQ fills to exactly its depth.
    let mut filled = 1;
    loop {
        chains.relink();
        let mut progressed = false;
        for c in 0..CHAINS {
            let head = chains.head(c);
            // SAFETY: as above.
            match srq.post_recv(unsafe { RecvChain::from_raw(head) }) {
                Ok(()) => {
                    filled += CHAIN_LEN as u32;
                    progressed = true;
                }
                Err(e) => {
                    assert_eq!(e.error.errno(), libc::EAGAIN);
                    let taken = (0..CHAIN_LEN).position(|k| ptr::eq(e.bad.as_ptr(), &chains.wrs[c * CHAIN_LEN + k])).unwrap();
                    filled += taken as u32;
                    break;
                }
            }
        }
        if !progressed || filled >= DEPTH {
            break;
        }
    }
    assert_eq!(filled, DEPTH);
    assert_eq!(srq.stats().posted, DEPTH);
    srq.release_all().unwrap();
}

fn srq_attr(max_wr: u32) -> ibv_srq_init_attr {
    // SAFETY: plain data; all-zero is valid.
    let mut a: ibv_srq_init_attr = unsafe { std::mem::zeroed() };
    a.attr.max_wr = max_wr;
    a.attr.max_sge = 1;
    a
}

/// A single receive, the common post: a well-formed one takes a credit and comes back with its wr_id; one the
/// provider refuses (more SGEs than the QP takes) is reported with itself as `bad`, its wr_id back and its
/// credit returned; one with a bad SGE list or without a credit is refused by the queue.
#[test]
fn a_single_receive_is_posted_refused_or_rejected_exactly() {
    let dev = SimDevice::new(&SimConfig::default()).unwrap();
    let cq = dev.create_cq(4 * DEPTH as i32).unwrap();
    let mut attr = qp_attr(cq, cq, 8, DEPTH);
    let qp = dev.create_qp(&mut attr).unwrap();
    let max_sge = attr.cap.max_recv_sge as i32;
    let buf = Buf::new(64 * CHAINS * CHAIN_LEN, 0);
    // SAFETY: nothing is ever sent into `buf`, which lives to the end of the test.
    let lkey = mr_keys(unsafe { dev.reg_mr(buf.ptr().cast(), buf.len(), ACCESS_ALL) }.unwrap()).0;
    // SAFETY: the CQ and QP live as long as the device, which outlives the managed objects.
    let mcq = Cq::new(unsafe { CqHandle::from_raw(cq) }.unwrap());
    let cfg = QueueConfig { sq_depth: 8, rq_depth: DEPTH, max_send_sge: 4, ..QueueConfig::default() };
    // SAFETY: as above.
    let q = Queue::new(&mcq, Some(&mcq), unsafe { QpHandle::from_raw(qp) }.unwrap(), cfg, None).unwrap();
    let mut chains = Chains::new(&buf, lkey);
    // Receive 0 alone (its chain cut after it).
    chains.wrs[0].next = ptr::null_mut();
    chains.wrs[0].num_sge = max_sge + 1;
    let one = chains.head(0);
    // SAFETY: the WR lives in `chains` for the call.
    let err = q.post_recv(unsafe { RecvChain::from_raw(one) }).unwrap_err();
    assert_eq!(err.error.errno(), libc::EINVAL, "{}", err.error.message());
    assert!(ptr::eq(err.bad.as_ptr(), one), "bad_wr must be the refused receive");
    assert_eq!(chains.wrs[0].wr_id, 0x1000, "the refused receive gets its wr_id back");
    assert_eq!(q.stats().recv_outstanding, 0, "the refused receive holds no credit");
    chains.wrs[0].num_sge = 1;
    chains.wrs[0].sg_list = ptr::null_mut();
    // SAFETY: as above.
    let err = q.post_recv(unsafe { RecvChain::from_raw(one) }).unwrap_err();
    assert_eq!(err.error.errno(), libc::EINVAL, "{}", err.error.message());
    assert_eq!(q.stats().recv_outstanding, 0);
    chains.wrs[0].sg_list = &mut chains.sges[0];
    for k in 0..DEPTH {
        // SAFETY: as above.
        q.post_recv(unsafe { RecvChain::from_raw(one) }).unwrap();
        assert_eq!(chains.wrs[0].wr_id, 0x1000, "post {k}: the wr_id comes back");
    }
    assert_eq!(q.stats().recv_outstanding, DEPTH);
    // SAFETY: as above.
    let err = q.post_recv(unsafe { RecvChain::from_raw(one) }).unwrap_err();
    assert_eq!(err.error.errno(), libc::EAGAIN, "no credit left: {}", err.error.message());
    assert!(ptr::eq(err.bad.as_ptr(), one));
    assert_eq!(chains.wrs[0].wr_id, 0x1000);
}

/// The same for an SRQ: a single receive the provider refuses frees its slot and gets its wr_id back; a
/// well-formed one takes a slot until the SRQ is full, then `EAGAIN`.
#[test]
fn a_single_srq_receive_is_posted_refused_or_rejected_exactly() {
    let mut r = srq_rig();
    let (srq, max_sge) = (&r.srq, r.max_sge);
    let chains = &mut r.chains;
    chains.wrs[0].next = ptr::null_mut();
    chains.wrs[0].num_sge = max_sge + 1;
    let one = chains.head(0);
    // SAFETY: the WR lives in `chains` for the call.
    let err = srq.post_recv(unsafe { RecvChain::from_raw(one) }).unwrap_err();
    assert_eq!(err.error.errno(), libc::EINVAL, "{}", err.error.message());
    assert!(ptr::eq(err.bad.as_ptr(), one), "bad_wr must be the refused receive");
    assert_eq!(chains.wrs[0].wr_id, 0x1000, "the refused receive gets its wr_id back");
    assert_eq!((srq.stats().posted, srq.stats().total_posted), (0, 0), "the refused receive holds no slot");
    chains.wrs[0].num_sge = 1;
    for k in 0..DEPTH {
        // SAFETY: as above.
        srq.post_recv(unsafe { RecvChain::from_raw(one) }).unwrap();
        assert_eq!(chains.wrs[0].wr_id, 0x1000, "post {k}: the wr_id comes back");
    }
    assert_eq!(srq.stats().posted, DEPTH);
    // SAFETY: as above.
    let err = srq.post_recv(unsafe { RecvChain::from_raw(one) }).unwrap_err();
    assert_eq!(err.error.errno(), libc::EAGAIN, "the SRQ is full: {}", err.error.message());
    assert!(ptr::eq(err.bad.as_ptr(), one));
    srq.release_all().unwrap();
}
