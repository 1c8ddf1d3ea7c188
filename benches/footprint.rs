//! Memory of a managed queue, from `Queue::footprint()` (the bytes the queue allocated: its fixed part, one
//! slot record per SQ slot rounded up to a power of two, and the backlog's preallocated entries). Run by
//! `make bench` (scripts/bench.sh) as `cargo bench --bench footprint`; prints one key=value line per queue.
//!
//! Queues of depth 128 and 1024, each without a backlog and with a backlog as deep as the SQ, on QPs with
//! max_send_sge 4 and max_inline_data 64 (what a backlog entry must be able to hold), on the software HCA.

use rdma_sys::{ibv_qp_init_attr, ibv_qp_type};
use sqdisc::sim::{SimConfig, SimDevice, SQD_SIM_NULL};
use sqdisc::verbs::{CqHandle, QpHandle};
use sqdisc::{Cq, Queue, QueueConfig};

const SGES: u32 = 4;
const INLINE: u32 = 64;

fn main() {
    let dev = SimDevice::new(&SimConfig { flags: SQD_SIM_NULL, ..SimConfig::default() }).expect("sim");
    println!("slot_bytes={}", std::mem::size_of::<sqdisc::discipline::Slot>());
    for depth in [128u32, 1024] {
        for backlog in [0, depth] {
            let cq_raw = dev.create_cq(depth as i32 + 1).expect("cq");
            // SAFETY: `ibv_qp_init_attr` is plain data; all-zero is valid.
            let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
            attr.send_cq = cq_raw;
            attr.recv_cq = cq_raw;
            attr.qp_type = ibv_qp_type::IBV_QPT_RC;
            attr.cap.max_send_wr = depth;
            attr.cap.max_recv_wr = 1;
            attr.cap.max_send_sge = SGES;
            attr.cap.max_recv_sge = 1;
            attr.cap.max_inline_data = INLINE;
            let qp = dev.create_qp(&mut attr).expect("qp");
            // SAFETY: the CQ and QP live as long as `dev`, which outlives the queue and the managed CQ.
            let cq = Cq::new(unsafe { CqHandle::from_raw(cq_raw) }.expect("cq handle"));
            let config = QueueConfig {
                sq_depth: attr.cap.max_send_wr,
                max_send_sge: attr.cap.max_send_sge,
                max_inline_data: attr.cap.max_inline_data,
                backlog_depth: backlog,
                ..QueueConfig::default()
            };
            // SAFETY: as above.
            let q = Queue::new(&cq, None, unsafe { QpHandle::from_raw(qp) }.expect("qp handle"), config, None).expect("queue");
            println!("depth={depth} backlog={backlog} sges={SGES} inline={INLINE} footprint={}", q.footprint());
        }
    }
}
