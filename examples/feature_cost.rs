//! The work sqdisc's optional features add per WR, on the software HCA's null mode (every WQE completes at
//! post, so what is left is the library's own bookkeeping). Run under callgrind by `scripts/feature-cost.sh`,
//! which subtracts a run of 0 WRs and divides by the count.
//!
//! Usage: `feature_cost <baseline|track|verify> <wrs> [bytes per WR]`
//! - baseline: a managed queue, one SGE per WR, 32 WRs per post, release callbacks;
//! - track: the same with 4 MRs tracked precisely (`Queue::track_mr`), the WRs using one of them;
//! - verify: the same with buffer verification (`verify_buffers`), each WR reading `bytes` bytes.

use std::cell::Cell;
use std::rc::Rc;

use rdma_sys::{ibv_qp_init_attr, ibv_qp_type, ibv_send_wr, ibv_sge, ibv_wc};
use sqdisc_sim::{SimConfig, SimDevice, SQD_SIM_NULL};
use sqdisc::verbs::{CqHandle, QpHandle, SendChain};
use sqdisc::{Completion, Cq, Queue, QueueConfig, ReleaseHandler};

const BATCH: usize = 32;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = || -> ! {
        eprintln!("usage: feature_cost <baseline|track|verify> <wrs> [bytes per WR]");
        std::process::exit(2)
    };
    let mode = args.get(1).map(String::as_str).unwrap_or_else(|| usage());
    if !["baseline", "track", "verify"].contains(&mode) {
        usage();
    }
    let wrs: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or_else(|| usage());
    let bytes: usize = args.get(3).map_or(Some(64), |s| s.parse().ok()).unwrap_or_else(|| usage());

    let dev = SimDevice::new(&SimConfig { flags: SQD_SIM_NULL, ..SimConfig::default() }).expect("sim");
    let cq_raw = dev.create_cq(1024).expect("cq");
    // SAFETY: `ibv_qp_init_attr` is plain data; all-zero is valid.
    let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    attr.send_cq = cq_raw;
    attr.recv_cq = cq_raw;
    attr.qp_type = ibv_qp_type::IBV_QPT_RC;
    attr.cap.max_send_wr = 256;
    attr.cap.max_recv_wr = 1;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    let qp = dev.create_qp(&mut attr).expect("qp");
    let mut data = vec![0x5au8; bytes * BATCH];
    // SAFETY: `data` outlives the device's use of it (the queue is dropped before `data`).
    let mr = unsafe { dev.reg_mr(data.as_mut_ptr().cast(), data.len(), 1) }.expect("mr");
    // SAFETY: a live MR.
    let lkey = unsafe { (*mr).lkey };

    // SAFETY: the CQ and QP live as long as `dev`, which outlives the queue.
    let cq = Cq::new(unsafe { CqHandle::from_raw(cq_raw) }.expect("cq handle"));
    let config = QueueConfig {
        sq_depth: attr.cap.max_send_wr,
        max_send_sge: 1,
        max_inline_data: 0,
        signal_interval: 32,
        verify_buffers: mode == "verify",
        ..QueueConfig::default()
    };
    let released = Rc::new(Cell::new(0usize));
    let r = released.clone();
    let handler = ReleaseHandler::Closure(Box::new(move |_: &Completion| r.set(r.get() + 1)));
    let q = Queue::new(&cq, None, unsafe { QpHandle::from_raw(qp) }.expect("qp handle"), config, Some(handler)).expect("queue");
    if mode == "track" {
        for k in [lkey, lkey ^ 0x100, lkey ^ 0x200, lkey ^ 0x300] {
            q.track_mr(k).expect("track");
        }
    }

    let mut sges: Vec<ibv_sge> =
        (0..BATCH).map(|i| ibv_sge { addr: data.as_ptr() as u64 + (i * bytes) as u64, length: bytes as u32, lkey }).collect();
    // SAFETY: all-zero is a valid `ibv_send_wr` and `ibv_wc`.
    let mut wrs_buf: Vec<ibv_send_wr> = (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect();
    let mut wc: [ibv_wc; 32] = unsafe { std::mem::zeroed() };
    let mut posted = 0;
    while posted < wrs {
        let n = BATCH.min(wrs - posted);
        let (base, sge_base) = (wrs_buf.as_mut_ptr(), sges.as_mut_ptr());
        for i in 0..n {
            // SAFETY: `i < n <= BATCH`, in bounds of both vectors; no other reference to them is live.
            let w = unsafe { &mut *base.add(i) };
            w.wr_id = (posted + i) as u64;
            w.opcode = rdma_sys::ibv_wr_opcode::IBV_WR_SEND;
            w.num_sge = 1;
            // SAFETY: as above.
            w.sg_list = unsafe { sge_base.add(i) };
            w.send_flags = 0;
            // SAFETY: as above (`i + 1 < n`).
            w.next = if i + 1 < n { unsafe { base.add(i + 1) } } else { std::ptr::null_mut() };
        }
        // SAFETY: the chain lives in `wrs_buf`/`sges` for the call, `data` until the releases.
        q.post_send(unsafe { SendChain::from_raw(wrs_buf.as_mut_ptr()) }).expect("post");
        posted += n;
        while released.get() < posted {
            cq.poll(&mut wc).expect("poll");
        }
    }
    drop(q);
    println!("{mode}: {wrs} WRs of {bytes} bytes, {} released", released.get());
}
