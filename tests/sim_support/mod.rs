//! Helpers for the software HCA's tests: raw buffers, a connected QP pair, WR builders, and posting and
//! polling through the context's ops table exactly as libibverbs' inline functions do.
#![allow(dead_code)]

use std::pin::Pin;
use std::ptr;

use rdma_sys::{ibv_cq, ibv_mr, ibv_qp, ibv_qp_init_attr, ibv_qp_type, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_wc};
use sqdisc_sim::{SimConfig, SimConnAttr, SimDevice};

pub const SIGNALED: u32 = rdma_sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
pub const FENCE: u32 = rdma_sys::ibv_send_flags::IBV_SEND_FENCE.0;
pub const INLINE: u32 = rdma_sys::ibv_send_flags::IBV_SEND_INLINE.0;
pub const ACCESS_ALL: u32 = 1 | 2 | 4 | 8; // local write, remote write, remote read, remote atomic

pub use rdma_sys::ibv_wc_status as st;
pub use rdma_sys::ibv_wr_opcode as op;

/// Heap memory the sim may read and write behind our back (DMA): only ever accessed through raw pointers.
pub struct Buf {
    ptr: *mut u8,
    len: usize,
}

impl Buf {
    pub fn new(len: usize, fill: u8) -> Buf {
        let b: Box<[u8]> = vec![fill; len].into_boxed_slice();
        Buf { ptr: Box::into_raw(b).cast(), len }
    }
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn fill(&self, v: u8) {
        // SAFETY: `ptr` holds `len` bytes owned by this buffer; no reference to them exists.
        unsafe { ptr::write_bytes(self.ptr, v, self.len) };
    }
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: in bounds (checked); no reference to the bytes exists.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
    }
    pub fn read(&self, off: usize, n: usize) -> Vec<u8> {
        assert!(off + n <= self.len);
        let mut v = vec![0; n];
        // SAFETY: in bounds (checked).
        unsafe { ptr::copy_nonoverlapping(self.ptr.add(off), v.as_mut_ptr(), n) };
        v
    }
    pub fn all(&self) -> Vec<u8> {
        self.read(0, self.len)
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` came from `Box::into_raw` of a boxed slice of `len` bytes in `new`.
        drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

pub fn mr_keys(mr: *mut ibv_mr) -> (u32, u32) {
    // SAFETY: tests pass live MRs made by the sim.
    unsafe { ((*mr).lkey, (*mr).rkey) }
}

/// Two connected QPs `a` and `b` with one CQ each (send and receive on it).
pub struct Pair {
    pub a: *mut ibv_qp,
    pub b: *mut ibv_qp,
    pub a_cq: *mut ibv_cq,
    pub b_cq: *mut ibv_cq,
    pub dev: Pin<Box<SimDevice>>,
}

pub fn qp_attr(send_cq: *mut ibv_cq, recv_cq: *mut ibv_cq, sq: u32, rq: u32) -> ibv_qp_init_attr {
    // SAFETY: `ibv_qp_init_attr` is plain data; all-zero is valid.
    let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    attr.send_cq = send_cq;
    attr.recv_cq = recv_cq;
    attr.qp_type = ibv_qp_type::IBV_QPT_RC;
    attr.cap.max_send_wr = sq;
    attr.cap.max_recv_wr = rq;
    attr.cap.max_send_sge = 4;
    attr.cap.max_recv_sge = 4;
    attr.cap.max_inline_data = 64;
    attr
}

impl Pair {
    pub fn new(cfg: SimConfig, sq: u32, cqe: i32) -> Pair {
        Pair::with_conn(cfg, sq, cqe, SimConnAttr::default())
    }
    pub fn with_conn(cfg: SimConfig, sq: u32, cqe: i32, conn: SimConnAttr) -> Pair {
        let dev = SimDevice::new(&cfg).unwrap();
        let a_cq = dev.create_cq(cqe).unwrap();
        let b_cq = dev.create_cq(cqe).unwrap();
        let a = dev.create_qp(&mut qp_attr(a_cq, a_cq, sq, sq)).unwrap();
        let b = dev.create_qp(&mut qp_attr(b_cq, b_cq, sq, sq)).unwrap();
        dev.connect(a, b, &conn).unwrap();
        Pair { a, b, a_cq, b_cq, dev }
    }
    /// Registers `buf` with every access right.
    pub fn reg(&self, buf: &Buf) -> *mut ibv_mr {
        // SAFETY: `buf` outlives the MR in every test (the device or an explicit dereg goes first).
        unsafe { self.dev.reg_mr(buf.ptr().cast(), buf.len(), ACCESS_ALL) }.unwrap()
    }
}

/// A send WR and its SGE list.
pub struct W {
    pub wr: ibv_send_wr,
    pub sges: Vec<ibv_sge>,
}

pub fn wr(wr_id: u64, opcode: u32, flags: u32, sges: &[(u64, u32, u32)]) -> W {
    // SAFETY: `ibv_send_wr` is plain data; all-zero (NULL pointers, zero counts) is valid.
    let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
    w.wr_id = wr_id;
    w.opcode = opcode;
    w.send_flags = flags;
    let sges: Vec<ibv_sge> = sges.iter().map(|&(addr, length, lkey)| ibv_sge { addr, length, lkey }).collect();
    w.num_sge = sges.len() as i32;
    W { wr: w, sges }
}

impl W {
    pub fn rdma(mut self, remote_addr: u64, rkey: u32) -> W {
        self.wr.wr.rdma.remote_addr = remote_addr;
        self.wr.wr.rdma.rkey = rkey;
        self
    }
    pub fn atomic(mut self, remote_addr: u64, rkey: u32, compare_add: u64, swap: u64) -> W {
        self.wr.wr.atomic.remote_addr = remote_addr;
        self.wr.wr.atomic.rkey = rkey;
        self.wr.wr.atomic.compare_add = compare_add;
        self.wr.wr.atomic.swap = swap;
        self
    }
    /// `imm_data` or `invalidate_rkey` (the same field).
    pub fn imm(mut self, v: u32) -> W {
        self.wr.imm_data_invalidated_rkey_union.imm_data = v;
        self
    }
}

/// Posts `ws` as one chain through the ops table; returns the provider's result and the index of `*bad_wr`.
pub fn post(qp: *mut ibv_qp, ws: &mut [W]) -> (i32, Option<usize>) {
    for w in ws.iter_mut() {
        w.wr.sg_list = if w.sges.is_empty() { ptr::null_mut() } else { w.sges.as_mut_ptr() };
    }
    for i in (0..ws.len()).rev() {
        let next = if i + 1 < ws.len() { ptr::addr_of_mut!(ws[i + 1].wr) } else { ptr::null_mut() };
        ws[i].wr.next = next;
    }
    let head = ws.first_mut().map_or(ptr::null_mut(), |w| ptr::addr_of_mut!(w.wr));
    let mut bad: *mut ibv_send_wr = ptr::null_mut();
    // SAFETY: `qp` is a live sim QP; the chain and its SGE lists live in `ws` for the whole call.
    let rc = unsafe { (*(*qp).context).ops.post_send.unwrap()(qp, head, &mut bad) };
    (rc, ws.iter().position(|w| ptr::eq(&w.wr, bad)))
}

pub fn post1(qp: *mut ibv_qp, w: W) -> i32 {
    post(qp, &mut [w]).0
}

pub fn post_recv(qp: *mut ibv_qp, wr_id: u64, sges: &[(u64, u32, u32)]) -> i32 {
    let mut list: Vec<ibv_sge> = sges.iter().map(|&(addr, length, lkey)| ibv_sge { addr, length, lkey }).collect();
    // SAFETY: `ibv_recv_wr` is plain data; all-zero is valid.
    let mut w: ibv_recv_wr = unsafe { std::mem::zeroed() };
    w.wr_id = wr_id;
    w.num_sge = list.len() as i32;
    w.sg_list = if list.is_empty() { ptr::null_mut() } else { list.as_mut_ptr() };
    let mut bad: *mut ibv_recv_wr = ptr::null_mut();
    // SAFETY: `qp` is a live sim QP; `w` and `list` live for the whole call.
    unsafe { (*(*qp).context).ops.post_recv.unwrap()(qp, &mut w, &mut bad) }
}

/// What a test looks at in a work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub byte_len: u32,
    pub wc_flags: u32,
    pub imm: u32,
    pub qp_num: u32,
}

/// One `ibv_poll_cq` call for up to `max` CQEs (it advances the model `steps_per_poll` steps).
pub fn poll(cq: *mut ibv_cq, max: usize) -> Vec<Wc> {
    // SAFETY: all-zero is a valid `ibv_wc`.
    let mut wc: Vec<ibv_wc> = (0..max).map(|_| unsafe { std::mem::zeroed() }).collect();
    // SAFETY: `cq` is a live sim CQ; `wc` holds `max` entries.
    let n = unsafe { (*(*cq).context).ops.poll_cq.unwrap()(cq, max as i32, wc.as_mut_ptr()) };
    assert!(n >= 0, "poll_cq failed: {n}");
    wc[..n as usize]
        .iter()
        .map(|w| Wc {
            wr_id: w.wr_id,
            status: w.status,
            opcode: w.opcode,
            byte_len: w.byte_len,
            wc_flags: w.wc_flags,
            // SAFETY: both union members are a u32.
            imm: unsafe { w.imm_data_invalidated_rkey_union.imm_data },
            qp_num: w.qp_num,
        })
        .collect()
}

/// Polls (one step per call with the default config) until `n` CQEs were gathered or `max_polls` calls made.
pub fn poll_n(cq: *mut ibv_cq, n: usize, max_polls: usize) -> Vec<Wc> {
    let mut out = Vec::new();
    for _ in 0..max_polls {
        out.extend(poll(cq, 16));
        if out.len() >= n {
            break;
        }
    }
    out
}

/// Links `ws` into a chain (SGE lists and `next` pointers) and returns its head.
pub fn link(ws: &mut [W]) -> *mut ibv_send_wr {
    for w in ws.iter_mut() {
        w.wr.sg_list = if w.sges.is_empty() { ptr::null_mut() } else { w.sges.as_mut_ptr() };
    }
    for i in (0..ws.len()).rev() {
        let next = if i + 1 < ws.len() { ptr::addr_of_mut!(ws[i + 1].wr) } else { ptr::null_mut() };
        ws[i].wr.next = next;
    }
    ws.first_mut().map_or(ptr::null_mut(), |w| ptr::addr_of_mut!(w.wr))
}

/// Posts `ws` through a managed queue; `Err((errno, index of the first WR not taken))`.
pub fn qpost(q: &sqdisc::Queue, ws: &mut [W]) -> Result<(), (i32, Option<usize>)> {
    let head = link(ws);
    // SAFETY: the chain lives in `ws` for the whole call (the queue copies what it parks).
    let r = q.post_send(unsafe { sqdisc::verbs::SendChain::from_raw(head) });
    r.map_err(|e| (e.error.errno(), ws.iter().position(|w| ptr::eq(&w.wr, e.bad.as_ptr()))))
}

/// Posts one receive through a managed queue.
pub fn qpost_recv(q: &sqdisc::Queue, wr_id: u64, sges: &[(u64, u32, u32)]) -> i32 {
    let mut list: Vec<ibv_sge> = sges.iter().map(|&(addr, length, lkey)| ibv_sge { addr, length, lkey }).collect();
    // SAFETY: `ibv_recv_wr` is plain data; all-zero is valid.
    let mut w: ibv_recv_wr = unsafe { std::mem::zeroed() };
    w.wr_id = wr_id;
    w.num_sge = list.len() as i32;
    w.sg_list = list.as_mut_ptr();
    // SAFETY: `w` and `list` live for the whole call.
    match q.post_recv(unsafe { sqdisc::verbs::RecvChain::from_raw(&mut w) }) {
        Ok(()) => 0,
        Err(e) => e.error.errno(),
    }
}

/// One poll of a managed CQ: the ULP-visible completions.
pub fn qpoll(cq: &sqdisc::Cq) -> Vec<Wc> {
    // SAFETY: all-zero is a valid `ibv_wc`.
    let mut wc: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
    let n = cq.poll(&mut wc).expect("managed poll");
    wc[..n]
        .iter()
        .map(|w| Wc {
            wr_id: w.wr_id,
            status: w.status,
            opcode: w.opcode,
            byte_len: w.byte_len,
            wc_flags: w.wc_flags,
            // SAFETY: both union members are a u32.
            imm: unsafe { w.imm_data_invalidated_rkey_union.imm_data },
            qp_num: w.qp_num,
        })
        .collect()
}

/// Posts receives `ids` with one SGE each (`sges`, in order) as one chain through `post` (a managed queue's or
/// SRQ's `post_recv`); `Err((errno, receives taken))`.
pub fn post_recv_chain(
    ids: &[u64],
    sges: &[(u64, u32, u32)],
    post: impl FnOnce(sqdisc::verbs::RecvChain<'_>) -> Result<(), (i32, *mut ibv_recv_wr)>,
) -> Result<(), (i32, usize)> {
    let mut list: Vec<ibv_sge> = sges.iter().map(|&(addr, length, lkey)| ibv_sge { addr, length, lkey }).collect();
    // SAFETY: all-zero is a valid `ibv_recv_wr`.
    let mut wrs: Vec<ibv_recv_wr> = ids.iter().map(|_| unsafe { std::mem::zeroed() }).collect();
    let n = wrs.len();
    if n == 0 {
        return Ok(());
    }
    let (base, sge_base) = (wrs.as_mut_ptr(), list.as_mut_ptr());
    for (k, &id) in ids.iter().enumerate() {
        // SAFETY: `k < n`; both pointers cover `n` elements; no reference into the vectors is live.
        unsafe {
            let w = base.add(k);
            (*w).wr_id = id;
            (*w).num_sge = 1;
            (*w).sg_list = sge_base.add(k);
            (*w).next = if k + 1 < n { base.add(k + 1) } else { ptr::null_mut() };
        }
    }
    // SAFETY: the chain lives here for the whole call.
    let r = post(unsafe { sqdisc::verbs::RecvChain::from_raw(base) });
    r.map_err(|(e, bad)| (e, (0..n).find(|&k| ptr::eq(base.wrapping_add(k), bad)).unwrap_or(n)))
}
