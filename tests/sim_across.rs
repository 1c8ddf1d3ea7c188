//! The model's rules for QPs whose two ends are made by different processes of the device daemon
//! (`sqdisc-sim`): one-sided connection, memory outside the process, and a destroyed responder.

mod sim_support;

use std::sync::{Arc, Mutex};

use sim_support::*;
use sqdisc_sim::memory::Memory;
use sqdisc_sim::*;

fn cfg() -> SimConfig {
    SimConfig { wire_delay_min: 1, wire_delay_max: 1, ..SimConfig::default() }
}

/// A responder destroyed right after its program saw the receive completion has sent the ACK of that SEND
/// first: the requester's SEND succeeds instead of retrying into RETRY_EXC_ERR.
#[test]
fn a_destroyed_responder_acknowledges_what_it_executed_first() {
    let p = Pair::with_conn(SimConfig { ack_delay: 8, ..cfg() }, 16, 32, SimConnAttr { retry_cnt: 1, ..SimConnAttr::default() });
    let src = Buf::new(64, 0x5a);
    let dst = Buf::new(64, 0);
    let (sk, dk) = (mr_keys(p.reg(&src)).0, mr_keys(p.reg(&dst)).0);
    assert_eq!(post_recv(p.b, 7, &[(dst.addr(), 64, dk)]), 0);
    assert_eq!(post1(p.a, wr(1, op::IBV_WR_SEND, SIGNALED, &[(src.addr(), 64, sk)])), 0);
    let recv = poll_n(p.b_cq, 1, 100);
    assert_eq!(recv.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(7, st::IBV_WC_SUCCESS)]);
    assert_eq!(dst.all(), vec![0x5a; 64]);
    p.dev.destroy_qp(p.b).unwrap();
    let sent = poll_n(p.a_cq, 1, 2000);
    assert_eq!(sent.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(1, st::IBV_WC_SUCCESS)]);
    assert_eq!(p.dev.stats().timeouts, 0);
}

/// `connect_to` connects one side: until the peer connects back it drops the requests, the requester
/// retransmits, and once it does the SEND goes through.
#[test]
fn connect_to_is_one_sided_and_the_peer_drops_requests_until_it_connects_back() {
    let dev = SimDevice::new(&SimConfig { retrans_timeout: 4, ..cfg() }).unwrap();
    let (acq, bcq) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
    let a = dev.create_qp(&mut qp_attr(acq, acq, 8, 8)).unwrap();
    let b = dev.create_qp(&mut qp_attr(bcq, bcq, 8, 8)).unwrap();
    // SAFETY: both are live QPs of `dev`.
    let (na, nb) = unsafe { ((*a).qp_num, (*b).qp_num) };
    let src = Buf::new(16, 3);
    let dst = Buf::new(16, 0);
    // SAFETY: the buffers outlive the device.
    let (sk, dk) = unsafe { (mr_keys(dev.reg_mr(src.ptr().cast(), 16, ACCESS_ALL).unwrap()).0, mr_keys(dev.reg_mr(dst.ptr().cast(), 16, ACCESS_ALL).unwrap()).0) };
    assert_eq!(post_recv(b, 9, &[(dst.addr(), 16, dk)]), 0);
    dev.connect_to(a, nb, &SimConnAttr::default()).unwrap();
    assert_eq!(post1(a, wr(1, op::IBV_WR_SEND, SIGNALED, &[(src.addr(), 16, sk)])), 0);
    dev.step(20);
    assert!(poll(acq, 4).is_empty(), "b is not connected: nothing is acknowledged");
    assert!(dev.stats().timeouts >= 2, "a retransmitted: {:?}", dev.stats());
    assert!(dev.connect_to(a, nb + 100, &SimConnAttr::default()).is_err(), "a is connected to b already");
    dev.connect_to(b, na, &SimConnAttr::default()).unwrap();
    let wc = poll_n(acq, 1, 200);
    assert_eq!(wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(1, st::IBV_WC_SUCCESS)]);
    assert_eq!(poll_n(bcq, 1, 10).len(), 1);
    assert_eq!(dst.all(), vec![3; 16]);
}

/// Memory of another process, as a `Memory` the test keeps: every read and write goes through it, a
/// retransmission reads it again, and memory that cannot be reached fails the WQE with a protection error.
struct Fake {
    base: u64,
    bytes: Mutex<Vec<u8>>,
    reads: Mutex<u32>,
    reachable: Mutex<bool>,
}

impl Memory for Fake {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        *self.reads.lock().unwrap() += 1;
        let at = (addr - self.base) as usize;
        buf.copy_from_slice(&self.bytes.lock().unwrap()[at..at + buf.len()]);
        *self.reachable.lock().unwrap()
    }
    fn write(&self, addr: u64, data: &[u8]) -> bool {
        let at = (addr - self.base) as usize;
        self.bytes.lock().unwrap()[at..at + data.len()].copy_from_slice(data);
        *self.reachable.lock().unwrap()
    }
}

#[test]
fn memory_outside_the_process_is_read_at_each_transmission_and_written_by_the_responder() {
    let p = Pair::new(cfg(), 16, 32);
    let base = 0x7000_0000_0000u64;
    let fake = Arc::new(Fake { base, bytes: Mutex::new(vec![0x11; 64]), reads: Mutex::new(0), reachable: Mutex::new(true) });
    let fake_mr = p.dev.reg_mr_in(fake.clone(), base, 64, ACCESS_ALL).unwrap();
    let fk = mr_keys(fake_mr).0;
    let local = Buf::new(64, 0x22);
    let lk = mr_keys(p.reg(&local)).0;

    // An RDMA WRITE from local memory into the other process's, then a READ back out of it.
    p.dev.inject(&SimFault { count: 1, ..SimFault::new(SQD_SIM_FAULT_LOSE_ACKS, p.a) }).unwrap();
    post(p.a, &mut [wr(1, op::IBV_WR_RDMA_WRITE, SIGNALED, &[(local.addr(), 32, lk)]).rdma(base, fk)]);
    assert_eq!(poll_n(p.a_cq, 1, 500).iter().map(|w| w.status).collect::<Vec<_>>(), vec![st::IBV_WC_SUCCESS]);
    assert_eq!(&fake.bytes.lock().unwrap()[..33], &[&[0x22u8; 32][..], &[0x11]].concat()[..]);

    // A SEND whose source is the other process's memory, its first ACK lost: read at each transmission.
    let dst = Buf::new(64, 0);
    let dk = mr_keys(p.reg(&dst)).0;
    assert_eq!(post_recv(p.b, 5, &[(dst.addr(), 64, dk)]), 0);
    let reads = *fake.reads.lock().unwrap();
    p.dev.inject(&SimFault { count: 1, ..SimFault::new(SQD_SIM_FAULT_LOSE_ACKS, p.a) }).unwrap();
    post(p.a, &mut [wr(2, op::IBV_WR_SEND, SIGNALED, &[(base, 16, fk)])]);
    assert_eq!(poll_n(p.a_cq, 1, 500).iter().map(|w| w.status).collect::<Vec<_>>(), vec![st::IBV_WC_SUCCESS]);
    assert_eq!(*fake.reads.lock().unwrap() - reads, 2, "the first transmission and the retransmission");
    assert_eq!(dst.read(0, 16), vec![0x22; 16]);

    // Memory that cannot be reached (its process has gone): a local protection error.
    *fake.reachable.lock().unwrap() = false;
    post(p.a, &mut [wr(3, op::IBV_WR_SEND, SIGNALED, &[(base, 16, fk)])]);
    assert_eq!(poll_n(p.a_cq, 1, 500).iter().map(|w| w.status).collect::<Vec<_>>(), vec![st::IBV_WC_LOC_PROT_ERR]);
}
