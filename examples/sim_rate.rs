//! Small-message rate and latency on the in-process software HCA, measured the way `ib_send_bw` and
//! `ib_send_lat` measure them between two processes through the device daemon (`scripts/bench-sim.sh` runs
//! both and compares them): 64-byte SENDs, 128 outstanding, a completion requested every 100 SENDs, the
//! receiver reposting each receive as it completes; and a ping-pong of one 64-byte SEND each way.
//!
//! Usage: `sim_rate <bw|lat> <iterations>`; prints `msg_rate <per second>` or `latency_us <one way>`.

use std::time::Instant;

use rdma_sys::{ibv_cq, ibv_qp, ibv_qp_init_attr, ibv_qp_type, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_wc};
use sqdisc_sim::{SimConfig, SimConnAttr, SimDevice};

const SIZE: u32 = 64;
const TX_DEPTH: u64 = 128;
const CQ_MOD: u64 = 100;
const RX_DEPTH: u64 = 512;

struct Side {
    qp: *mut ibv_qp,
    cq: *mut ibv_cq,
    buf: Vec<u8>,
    lkey: u32,
}

fn qp_attr(cq: *mut ibv_cq) -> ibv_qp_init_attr {
    // SAFETY: plain data; zero is valid.
    let mut a: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    a.send_cq = cq;
    a.recv_cq = cq;
    a.qp_type = ibv_qp_type::IBV_QPT_RC;
    a.cap.max_send_wr = TX_DEPTH as u32;
    a.cap.max_recv_wr = RX_DEPTH as u32;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    a
}

fn side(dev: &SimDevice) -> Side {
    let cq = dev.create_cq(4096).expect("cq");
    let qp = dev.create_qp(&mut qp_attr(cq)).expect("qp");
    let mut buf = vec![7u8; SIZE as usize];
    // SAFETY: `buf` lives as long as the device in `main`.
    let mr = unsafe { dev.reg_mr(buf.as_mut_ptr().cast(), buf.len(), 1 | 2 | 4) }.expect("mr");
    // SAFETY: a live MR of the device.
    let lkey = unsafe { (*mr).lkey };
    Side { qp, cq, buf, lkey }
}

fn post_send(s: &Side, signaled: bool) {
    let mut sge = ibv_sge { addr: s.buf.as_ptr() as u64, length: SIZE, lkey: s.lkey };
    // SAFETY: plain data; zero is valid.
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.opcode = rdma_sys::ibv_wr_opcode::IBV_WR_SEND;
    wr.send_flags = if signaled { rdma_sys::ibv_send_flags::IBV_SEND_SIGNALED.0 } else { 0 };
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    let mut bad = std::ptr::null_mut();
    // SAFETY: the QP's context ops are the sim's; the WR and SGE live for the call.
    let rc = unsafe { ((*(*s.qp).context).ops.post_send.expect("post_send"))(s.qp, &mut wr, &mut bad) };
    assert_eq!(rc, 0, "post_send");
}

fn post_recv(s: &Side) {
    let mut sge = ibv_sge { addr: s.buf.as_ptr() as u64, length: SIZE, lkey: s.lkey };
    // SAFETY: plain data; zero is valid.
    let mut wr: ibv_recv_wr = unsafe { std::mem::zeroed() };
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    let mut bad = std::ptr::null_mut();
    // SAFETY: as in `post_send`.
    let rc = unsafe { ((*(*s.qp).context).ops.post_recv.expect("post_recv"))(s.qp, &mut wr, &mut bad) };
    assert_eq!(rc, 0, "post_recv");
}

fn poll(s: &Side, out: &mut [ibv_wc]) -> usize {
    // SAFETY: the CQ's context ops are the sim's; `out` has room for its length.
    let n = unsafe { ((*(*s.cq).context).ops.poll_cq.expect("poll_cq"))(s.cq, out.len() as i32, out.as_mut_ptr()) };
    assert!(n >= 0, "poll_cq");
    for w in &out[..n as usize] {
        assert_eq!(w.status, rdma_sys::ibv_wc_status::IBV_WC_SUCCESS, "completion status");
    }
    n as usize
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mode, iters) = match (args.get(1).map(String::as_str), args.get(2).and_then(|s| s.parse::<u64>().ok())) {
        (Some(m @ ("bw" | "lat")), Some(n)) if n > 0 => (m, n),
        _ => {
            eprintln!("usage: sim_rate <bw|lat> <iterations>");
            std::process::exit(2);
        }
    };
    let dev = SimDevice::new(&SimConfig::default()).expect("sim");
    let (a, b) = (side(&dev), side(&dev));
    dev.connect(a.qp, b.qp, &SimConnAttr::default()).expect("connect");
    // SAFETY: plain data; zero is valid.
    let mut wcs: Vec<ibv_wc> = (0..64).map(|_| unsafe { std::mem::zeroed() }).collect();
    if mode == "bw" {
        for _ in 0..RX_DEPTH {
            post_recv(&b);
        }
        let start = Instant::now();
        let (mut posted, mut completed, mut received) = (0u64, 0u64, 0u64);
        while completed < iters || received < iters {
            while posted < iters && posted - completed < TX_DEPTH {
                posted += 1;
                post_send(&a, posted % CQ_MOD == 0 || posted == iters);
            }
            let n = poll(&a, &mut wcs) as u64;
            // Each send completion stands for the CQ_MOD sends up to it.
            completed = (completed + n * CQ_MOD).min(posted);
            let r = poll(&b, &mut wcs) as u64;
            for _ in 0..r {
                post_recv(&b);
            }
            received += r;
        }
        let secs = start.elapsed().as_secs_f64();
        println!("msg_rate {:.0}", iters as f64 / secs);
    } else {
        post_recv(&a);
        post_recv(&b);
        let start = Instant::now();
        for _ in 0..iters {
            post_send(&a, true);
            while poll(&b, &mut wcs[..1]) == 0 {}
            post_recv(&b);
            post_send(&b, true);
            // a's send and receive completions, b's send completion.
            let (mut on_a, mut on_b) = (0, 0);
            while on_a < 2 || on_b < 1 {
                on_a += poll(&a, &mut wcs[..2]);
                on_b += poll(&b, &mut wcs[..1]);
            }
            post_recv(&a);
        }
        let secs = start.elapsed().as_secs_f64();
        println!("latency_us {:.2}", secs * 1e6 / iters as f64 / 2.0);
    }
}
