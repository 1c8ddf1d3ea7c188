//! The C ABI as a C program sees it, for tests that drive the `sqd_*` functions from Rust (and so can run under
//! Miri): declarations of the exported functions and mirrors of the `#[repr(C)]` structures they take, plus a
//! few helpers. The functions resolve to the library's `#[no_mangle]` exports at link time.
#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr;

pub use rdma_sys::{ibv_cq, ibv_qp, ibv_qp_init_attr, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_srq, ibv_srq_init_attr, ibv_wc};
pub use sqdisc_sim::scripted::{ScriptedDevice, ScriptedQpCaps};
pub use sqdisc_sim::{SimConfig, SimConnAttr, SimDevice};
pub use sqdisc::{Completion, CqStats, QueueStats, SrqStats};

/// `struct sqd_cq`: incomplete in C, so opaque here; only pointers to it are used.
#[repr(C)]
pub struct Cq {
    _private: [u8; 0],
}

/// `struct sqd_queue`.
#[repr(C)]
pub struct Queue {
    _private: [u8; 0],
}

/// `struct sqd_srq`.
#[repr(C)]
pub struct Srq {
    _private: [u8; 0],
}

pub type ReleaseFn = Option<unsafe extern "C" fn(ctx: *mut c_void, c: *const Completion)>;
pub type DeferFn = Option<unsafe extern "C" fn(ctx: *mut c_void)>;
pub type SrqLowFn = Option<unsafe extern "C" fn(ctx: *mut c_void, posted: u32)>;

/// `struct sqd_queue_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QueueAttr {
    pub sq_depth: u32,
    pub max_send_sge: u32,
    pub max_inline_data: u32,
    pub rq_depth: u32,
    pub signal_interval: u32,
    pub backlog_depth: u32,
    pub release: ReleaseFn,
    pub release_ctx: *mut c_void,
    pub flags: u32,
    pub srq: *mut Srq,
}

impl Default for QueueAttr {
    fn default() -> QueueAttr {
        QueueAttr {
            sq_depth: 0,
            max_send_sge: 1,
            max_inline_data: 0,
            rq_depth: 0,
            signal_interval: 0,
            backlog_depth: 0,
            release: None,
            release_ctx: ptr::null_mut(),
            flags: 0,
            srq: ptr::null_mut(),
        }
    }
}

/// `struct sqd_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SrqAttr {
    pub depth: u32,
    pub low_watermark: u32,
    pub release: ReleaseFn,
    pub release_ctx: *mut c_void,
    pub low: SrqLowFn,
    pub low_ctx: *mut c_void,
    pub flags: u32,
}

pub const SQD_CQ_THREAD_SAFE: u32 = 1;
pub const IBV_EVENT_CQ_ERR: u32 = 0;
pub const IBV_EVENT_QP_FATAL: u32 = 1;
pub const WR_SEND: u32 = 2;
pub const SIGNALED: u32 = 2;
pub const WC_SUCCESS: u32 = 0;
pub const WC_WR_FLUSH_ERR: u32 = 5;

// The handles are opaque to C and are only passed by pointer here, as the header declares them.
#[allow(improper_ctypes)]
extern "C" {
    pub fn sqd_last_error() -> *const c_char;

    pub fn sqd_cq_new(cq: *mut ibv_cq, out: *mut *mut Cq) -> i32;
    pub fn sqd_cq_new_ex(cq: *mut ibv_cq, flags: u32, out: *mut *mut Cq) -> i32;
    pub fn sqd_cq_free(cq: *mut Cq) -> i32;
    pub fn sqd_cq_poll(cq: *mut Cq, max: i32, wc: *mut ibv_wc) -> i32;
    pub fn sqd_cq_stats(cq: *const Cq, out: *mut CqStats) -> i32;
    pub fn sqd_cq_async_event(cq: *mut Cq, r#type: u32) -> i32;

    pub fn sqd_queue_new(send_cq: *mut Cq, recv_cq: *mut Cq, qp: *mut ibv_qp, attr: *const QueueAttr, out: *mut *mut Queue) -> i32;
    pub fn sqd_queue_free(q: *mut Queue) -> i32;
    pub fn sqd_post_send(q: *mut Queue, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> i32;
    pub fn sqd_post_recv(q: *mut Queue, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> i32;
    pub fn sqd_defer(q: *mut Queue, f: DeferFn, ctx: *mut c_void) -> i32;
    pub fn sqd_queue_drain(q: *mut Queue) -> i32;
    pub fn sqd_queue_stats(q: *const Queue, out: *mut QueueStats) -> i32;
    pub fn sqd_queue_async_event(q: *mut Queue, r#type: u32) -> i32;
    pub fn sqd_invalidate(q: *mut Queue, rkey: u32, wr_id: u64, flags: u32, done: ReleaseFn, done_ctx: *mut c_void) -> i32;

    pub fn sqd_srq_new(srq: *mut ibv_srq, attr: *const SrqAttr, out: *mut *mut Srq) -> i32;
    pub fn sqd_srq_free(srq: *mut Srq) -> i32;
    pub fn sqd_srq_post_recv(srq: *mut Srq, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> i32;
    pub fn sqd_srq_release_all(srq: *mut Srq) -> i32;
    pub fn sqd_srq_stats(srq: *const Srq, out: *mut SrqStats) -> i32;

    pub fn sqd_scripted_new(out: *mut *mut ScriptedDevice) -> c_int;
    pub fn sqd_scripted_free(dev: *mut ScriptedDevice) -> c_int;
    pub fn sqd_scripted_create_cq(dev: *const ScriptedDevice, cqe: c_int, out: *mut *mut ibv_cq) -> c_int;
    pub fn sqd_scripted_destroy_cq(cq: *mut ibv_cq) -> c_int;
    pub fn sqd_scripted_create_qp(
        dev: *const ScriptedDevice,
        send_cq: *mut ibv_cq,
        recv_cq: *mut ibv_cq,
        caps: *const ScriptedQpCaps,
        out: *mut *mut ibv_qp,
    ) -> c_int;
    pub fn sqd_scripted_destroy_qp(qp: *mut ibv_qp) -> c_int;
    pub fn sqd_scripted_complete(qp: *mut ibv_qp, n: c_int) -> c_int;
    pub fn sqd_scripted_set_error(qp: *mut ibv_qp) -> c_int;

    pub fn sqd_sim_new(cfg: *const SimConfig, out: *mut *mut SimDevice) -> c_int;
    pub fn sqd_sim_free(sim: *mut SimDevice) -> c_int;
    pub fn sqd_sim_create_cq(sim: *const SimDevice, cqe: c_int, out: *mut *mut ibv_cq) -> c_int;
    pub fn sqd_sim_destroy_cq(cq: *mut ibv_cq) -> c_int;
    pub fn sqd_sim_create_qp(sim: *const SimDevice, attr: *mut ibv_qp_init_attr, out: *mut *mut ibv_qp) -> c_int;
    pub fn sqd_sim_destroy_qp(qp: *mut ibv_qp) -> c_int;
    pub fn sqd_sim_connect(a: *mut ibv_qp, b: *mut ibv_qp, attr: *const SimConnAttr) -> c_int;
    pub fn sqd_sim_create_srq(sim: *const SimDevice, attr: *mut ibv_srq_init_attr, out: *mut *mut ibv_srq) -> c_int;
    pub fn sqd_sim_destroy_srq(srq: *mut ibv_srq) -> c_int;
    pub fn sqd_sim_run_until_idle(sim: *const SimDevice, max_steps: u32) -> c_int;
}

/// `sqd_last_error()` as a String.
pub fn last_error() -> String {
    // SAFETY: never NULL, NUL-terminated, valid until the next failing call on this thread.
    unsafe { CStr::from_ptr(sqd_last_error()) }.to_string_lossy().into_owned()
}

/// Asserts that `rc` is `-errno` and that `sqd_last_error()` contains `needle`.
#[track_caller]
pub fn assert_fails(rc: i32, errno: i32, needle: &str) {
    assert_eq!(rc, -errno, "expected -{errno}, got {rc} (last error: {:?})", last_error());
    let msg = last_error();
    assert!(msg.contains(needle), "last error {msg:?} does not mention {needle:?}");
}

/// Send WRs with their SGEs, kept at stable addresses for as long as the queue may read them.
pub struct Sends {
    pub wrs: Vec<ibv_send_wr>,
    pub sges: Vec<ibv_sge>,
}

impl Sends {
    /// `n` SENDs with wr_ids from `first`, each with one 64-byte SGE; the last one is signaled if `signal_last`.
    pub fn new(first: u64, n: usize, signal_last: bool) -> Box<Sends> {
        let mut s = Box::new(Sends {
            // SAFETY: all-zero is a valid `ibv_send_wr` (integers, NULL pointers, unions of those).
            wrs: (0..n).map(|_| unsafe { std::mem::zeroed() }).collect(),
            sges: (0..n).map(|i| ibv_sge { addr: 0x1000 * (i as u64 + 1), length: 64, lkey: 1 }).collect(),
        });
        let wrs = s.wrs.as_mut_ptr();
        let sges = s.sges.as_mut_ptr();
        for i in 0..n {
            // SAFETY: `i < n`, both vectors hold `n` elements; no reference into them is live.
            unsafe {
                let w = wrs.add(i);
                (*w).wr_id = first + i as u64;
                (*w).opcode = WR_SEND;
                (*w).num_sge = 1;
                (*w).sg_list = sges.add(i);
                (*w).send_flags = if signal_last && i + 1 == n { SIGNALED } else { 0 };
                (*w).next = if i + 1 < n { wrs.add(i + 1) } else { ptr::null_mut() };
            }
        }
        s
    }

    pub fn head(&mut self) -> *mut ibv_send_wr {
        self.wrs.as_mut_ptr()
    }
}

/// Posts `wrs` on `q`; the return code.
pub fn post(q: *mut Queue, wrs: &mut Sends) -> i32 {
    let mut bad = ptr::null_mut();
    // SAFETY: `wrs` is a valid chain that stays alive until its releases (the caller keeps it).
    unsafe { sqd_post_send(q, wrs.head(), &mut bad) }
}

/// Polls `cq` once with room for 16 completions; the return code.
pub fn poll(cq: *mut Cq) -> i32 {
    // SAFETY: all-zero is a valid `ibv_wc`.
    let mut wc: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
    // SAFETY: `wc` holds 16 writable entries.
    unsafe { sqd_cq_poll(cq, 16, wc.as_mut_ptr()) }
}

pub fn queue_stats(q: *mut Queue) -> QueueStats {
    let mut st = QueueStats::default();
    // SAFETY: `q` is a live queue; `st` is writable.
    assert_eq!(unsafe { sqd_queue_stats(q, &mut st) }, 0);
    st
}

pub fn cq_stats(cq: *mut Cq) -> CqStats {
    let mut st = CqStats::default();
    // SAFETY: `cq` is a live CQ handle; `st` is writable.
    assert_eq!(unsafe { sqd_cq_stats(cq, &mut st) }, 0);
    st
}

pub fn caps(depth: u32) -> ScriptedQpCaps {
    ScriptedQpCaps { max_send_wr: depth, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 }
}

/// A scripted device made through the C ABI, and its CQs and QPs.
pub struct Dev {
    pub dev: *mut ScriptedDevice,
}

impl Dev {
    pub fn new() -> Dev {
        let mut dev = ptr::null_mut();
        // SAFETY: `dev` is writable.
        assert_eq!(unsafe { sqd_scripted_new(&mut dev) }, 0);
        Dev { dev }
    }

    pub fn cq(&self, cqe: i32) -> *mut ibv_cq {
        let mut cq = ptr::null_mut();
        // SAFETY: a live device; `cq` is writable.
        assert_eq!(unsafe { sqd_scripted_create_cq(self.dev, cqe, &mut cq) }, 0, "{}", last_error());
        cq
    }

    pub fn qp(&self, send_cq: *mut ibv_cq, recv_cq: *mut ibv_cq, depth: u32) -> *mut ibv_qp {
        let mut qp = ptr::null_mut();
        let c = caps(depth);
        // SAFETY: a live device and CQs of it; `qp` is writable.
        assert_eq!(unsafe { sqd_scripted_create_qp(self.dev, send_cq, recv_cq, &c, &mut qp) }, 0, "{}", last_error());
        qp
    }
}

/// Manages `cq`.
pub fn managed_cq(cq: *mut ibv_cq, flags: u32) -> *mut Cq {
    let mut out = ptr::null_mut();
    // SAFETY: `cq` is a live CQ that outlives the handle (the tests free handles first).
    assert_eq!(unsafe { sqd_cq_new_ex(cq, flags, &mut out) }, 0, "{}", last_error());
    out
}

/// Manages `qp` (sends on `scq`) with a release callback.
pub fn managed_queue(scq: *mut Cq, qp: *mut ibv_qp, depth: u32, backlog: u32, release: ReleaseFn, ctx: *mut c_void) -> *mut Queue {
    let attr = QueueAttr { sq_depth: depth, backlog_depth: backlog, release, release_ctx: ctx, ..QueueAttr::default() };
    let mut q = ptr::null_mut();
    // SAFETY: live CQ handle and QP; `attr` and `q` are valid; the callback's context outlives the queue.
    assert_eq!(unsafe { sqd_queue_new(scq, ptr::null_mut(), qp, &attr, &mut q) }, 0, "{}", last_error());
    q
}

/// Completes everything the scripted QP holds and polls `cq` until `done()` or 50 rounds.
pub fn drive(qp: *mut ibv_qp, cq: *mut Cq, mut done: impl FnMut() -> bool) {
    for _ in 0..50 {
        if done() {
            return;
        }
        // SAFETY: a live scripted QP.
        assert!(unsafe { sqd_scripted_complete(qp, i32::MAX) } >= 0);
        assert!(poll(cq) >= 0, "{}", last_error());
    }
    assert!(done(), "not done after 50 rounds");
}
