//! The software HCA ("sim"): a deterministic model of RC HCAs behind real verbs objects, with fault injection,
//! a ground-truth oracle and a violation log.
//!
//! [`SimDevice`] owns a real `struct ibv_context` (whose ops table — `post_send`, `post_recv`, `poll_cq`,
//! `req_notify_cq` — reaches the model), a `struct ibv_pd`, and the `struct ibv_mr`, `ibv_cq` and `ibv_qp`
//! objects made on it. Unmodified verbs code (libibverbs' inline `ibv_post_send`, `ibv_poll_cq`, ...) and the
//! library drive it as they would drive a provider. QPs of one device connect to each other in-process
//! ([`SimDevice::connect`]); packets between them cross a simulated wire.
//!
//! Time is a global step counter. Nothing moves between calls: the model advances `steps_per_poll` steps at
//! the start of every `ibv_poll_cq` call, and on [`SimDevice::step`] / [`SimDevice::run_until_idle`]. One seed
//! decides every random choice (loss, wire delay), so a run is reproduced exactly by the same seed and the same
//! sequence of calls.
//!
//! The rules modelled, their sources and the ones left out are in `docs/sim.md`. In short:
//!
//! - **SQ slots follow mlx5**: a send WQE holds its slot until a CQE at or after it is *polled*. A full SQ
//!   refuses posts with `ENOMEM` (a violation too with [`SQD_SIM_STRICT`]); likewise the RQ.
//! - **Asynchronous, in-order execution**: WQEs are transmitted from the head of the SQ (`tx_per_step` per
//!   step), take `wire_delay` steps each way, are executed and acknowledged by the peer (ACKs coalesce), and
//!   complete in SQ order once acknowledged. Source memory is read through the SGEs' lkeys at transmission
//!   *and again at every retransmission*; inline data is copied at post time.
//! - **Loss and retransmission**: lost requests are recovered by go-back-N after a NAK (sequence error) or
//!   `retrans_timeout`; lost ACKs make the requester retransmit and the responder re-acknowledge duplicates
//!   without re-executing them (except RDMA READ, which is re-read). `retry_cnt` exhausted: `RETRY_EXC_ERR`.
//! - **LocalInv** executes when it reaches the head of execution, even while earlier WQEs await their ACK
//!   (IBA Table 79, 'L' ordering); with `IBV_SEND_FENCE` it waits for every earlier WQE (Local Invalidate
//!   Fence). A plain fence waits for earlier READ/ATOMIC only.
//! - **Receives, RNR, remote access**: SEND consumes the peer's oldest receive (RNR NAK and retry when there
//!   is none); RDMA WRITE/READ/ATOMIC check the peer's rkey, bounds and access flags. `max_rd_atomic` caps
//!   outstanding READ/ATOMIC.
//! - **Errors** move the QP to the error state; every unfinished WQE then flushes with its own CQE, in order,
//!   signaled or not, and so do posted receives. A CQ overrun loses the CQE, puts the CQ and its QPs in error.
//!
//! The **oracle** ([`SimDevice::buffer_busy`], [`SimDevice::wqe_finished`]) says whether the HCA is truly
//! finished with a WQE (no retransmission can read its memory again). The **violation log** records the rules
//! a ULP broke (SQ overflow in strict mode, CQ overrun, source modified while in flight, MR invalidated or
//! deregistered while in use, invalid WRs).
//!
//! **Target scale**: SRQs ([`SimDevice::create_srq`], `ibv_post_srq_recv`), asynchronous events
//! ([`SimDevice::get_async_event`], an fd readable while some are pending), completion channels
//! ([`SimDevice::create_comp_channel`], `ibv_req_notify_cq`, [`SimDevice::get_cq_event`]). A step visits only
//! the QPs with work, so 10,000 idle QPs cost it nothing.
//!
//! Threading: a device is `Send` and `Sync`. Every entry into the model — the data-path ops called through the
//! context from any thread, control calls, [`SimDevice::step`], statistics — takes one device-wide lock for
//! its duration, so calls on one device are serialised (one at a time per device, whatever CQ or QP they
//! concern). The model never calls user code or the library while holding the lock, so it is never taken
//! re-entrantly and never ordered against a caller's own locks (such as sqdisc's per-CQ locks).

// Every unsafe operation sits in its own `unsafe` block with a `// SAFETY:` comment, also inside an `unsafe fn`;
// a lost error or a discarded `Result` is a bug.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unused_must_use)]
#![deny(rust_2018_idioms)]

// Before the sim's own modules, as when both devices were modules of sqdisc: the order cbindgen reads them in
// is the order of the committed headers.
#[cfg(feature = "scripted")]
pub mod scripted;
mod error;
mod events;
pub mod held;
pub mod memory;
mod model;
mod ops;
pub mod scriptable;
mod wr_chain;
#[cfg(feature = "capi")]
mod capi;
mod context;

pub use error::{Error, Result};

use context::{ContextMark, ContextObj};

use std::ffi::c_void;
use std::marker::PhantomPinned;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rdma_sys::{
    ibv_comp_channel, ibv_context, ibv_cq, ibv_device, ibv_mr, ibv_pd, ibv_qp, ibv_qp_init_attr, ibv_qp_state, ibv_qp_type, ibv_srq,
    ibv_srq_init_attr,
};

use scriptable::{Scriptable, ScriptedCqStats, ScriptedQpCaps, ScriptedQpStats, ScriptedWqe};
use sqdisc_device::DeviceOps;
pub use events::{AsyncElement, AsyncEvent};
use held::HeldObjects;
use model::Model;

/// `flags`: posting into a full SQ or RQ is also logged as a violation (it always fails with `ENOMEM`).
pub const SQD_SIM_STRICT: u32 = 1;
/// `flags`: null mode. Every send WQE completes at once at post time (a CQE for signaled ones, respecting
/// the CQ's capacity and the SQ slot rule); no data moves and no peer is needed. For measuring a ULP's or the
/// library's own cost.
pub const SQD_SIM_NULL: u32 = 2;
/// `flags`: an arm (`ibv_req_notify_cq`) of a CQ that already holds a CQE the arm would fire for raises the
/// completion event at once, as ConnectX HCAs do. Without it, only a CQE added after the arm fires: IBA's
/// Request Completion Notification, and what rxe and siw do.
pub const SQD_SIM_ARM_PENDING: u32 = 4;

/// `rnr_retry` value meaning "retry forever" (IBA: an RNR retry count of 7 is infinite).
pub const SQD_SIM_RNR_RETRY_FOREVER: u32 = 7;

/// Fault: the QP moves to the error state at step `at_step` (or at once if that step has passed), as after
/// a fatal local error: its unfinished WQEs and posted receives flush.
pub const SQD_SIM_FAULT_QP_FATAL: u32 = 1;
/// Fault: the next request of the QP that its peer executes fails the peer's rkey check: the WQE completes
/// with `IBV_WC_REM_ACCESS_ERR` and both QPs go to error (as a real rkey violation).
pub const SQD_SIM_FAULT_REMOTE_ACCESS: u32 = 2;
/// Fault: the QP's posted receives are withheld for `count` steps: SENDs to it get RNR NAKs meanwhile.
pub const SQD_SIM_FAULT_RECV_STARVE: u32 = 3;
/// Fault: the QP's next send WQE not yet transmitted fails at transmission with `status` and `vendor_err`
/// (an error CQE, signaled or not; the QP goes to error).
pub const SQD_SIM_FAULT_FAIL_NEXT: u32 = 4;
/// Fault: the next `count` request packets the QP sends are lost on the wire.
pub const SQD_SIM_FAULT_LOSE_REQUESTS: u32 = 5;
/// Fault: the next `count` response packets (ACK, NAK, read/atomic response) sent to the QP are lost.
pub const SQD_SIM_FAULT_LOSE_ACKS: u32 = 6;

/// Violation: a send WR was posted into a full SQ (strict mode only; the post fails with `ENOMEM`).
pub const SQD_SIM_VIOLATION_SQ_OVERFLOW: u32 = 1;
/// Violation: a receive WR was posted into a full RQ (strict mode only; the post fails with `ENOMEM`).
pub const SQD_SIM_VIOLATION_RQ_OVERFLOW: u32 = 2;
/// Violation: a CQE was pushed into a full CQ; it is lost, the CQ and its QPs go to error.
pub const SQD_SIM_VIOLATION_CQ_OVERRUN: u32 = 3;
/// Violation: a retransmission read source bytes that differ from the first transmission of that WQE: the
/// buffer was changed before the HCA was done with it (rule 3 of the seed discussion).
pub const SQD_SIM_VIOLATION_SOURCE_MODIFIED: u32 = 4;
/// Violation: an MR was deregistered or invalidated (LocalInv, SEND_WITH_INV) while a send WQE the HCA is not
/// finished with references it through an SGE (rules 3 and 4).
pub const SQD_SIM_VIOLATION_MR_IN_USE: u32 = 5;
/// Violation: an invalid WR (unsupported opcode, too many SGEs, NULL sg_list, inline data too large, ...);
/// the post fails with `EINVAL`.
pub const SQD_SIM_VIOLATION_BAD_WR: u32 = 6;
/// Violation: a send WR was posted to a QP that is not connected yet; the post fails with `EINVAL`.
pub const SQD_SIM_VIOLATION_QP_STATE: u32 = 7;

/// The name of a violation kind (`"SQ overflow"`, ...), or `"unknown"`.
pub fn violation_kind_str(kind: u32) -> &'static str {
    match kind {
        SQD_SIM_VIOLATION_SQ_OVERFLOW => "SQ overflow",
        SQD_SIM_VIOLATION_RQ_OVERFLOW => "RQ overflow",
        SQD_SIM_VIOLATION_CQ_OVERRUN => "CQ overrun",
        SQD_SIM_VIOLATION_SOURCE_MODIFIED => "source modified while in flight",
        SQD_SIM_VIOLATION_MR_IN_USE => "MR invalidated while in use",
        SQD_SIM_VIOLATION_BAD_WR => "invalid WR",
        SQD_SIM_VIOLATION_QP_STATE => "post to a QP not ready to send",
        _ => "unknown",
    }
}

/// How a simulated HCA behaves (`struct sqd_sim_config` in C). Start from the defaults (`sqd_sim_config_default`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimConfig {
    /// Decides every random choice of the run.
    pub seed: u64,
    /// Request packets lost on the wire, per million.
    pub loss_ppm: u32,
    /// Response packets (ACK, NAK, read/atomic responses) lost, per million.
    pub ack_loss_ppm: u32,
    /// One-way wire delay of a packet, in steps, uniform in `wire_delay_min..=wire_delay_max` (at least 1).
    /// Packets between two QPs keep their order.
    pub wire_delay_min: u32,
    pub wire_delay_max: u32,
    /// Responder ACK coalescing: an ACK leaves this many steps after the first request it acknowledges; it
    /// acknowledges every request executed by then.
    pub ack_delay: u32,
    /// Steps without acknowledgement progress after which the requester retransmits (go-back-N).
    pub retrans_timeout: u32,
    /// Steps a requester waits after an RNR NAK before retrying.
    pub rnr_delay: u32,
    /// Steps run at the start of every `ibv_poll_cq` call (0: polling does not advance time).
    pub steps_per_poll: u32,
    /// Send WQEs a QP transmits (or executes, for local ones) per step.
    pub tx_per_step: u32,
    /// `SQD_SIM_STRICT`, `SQD_SIM_NULL`, `SQD_SIM_ARM_PENDING`.
    pub flags: u32,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            seed: 1,
            loss_ppm: 0,
            ack_loss_ppm: 0,
            wire_delay_min: 1,
            wire_delay_max: 3,
            ack_delay: 2,
            retrans_timeout: 24,
            rnr_delay: 8,
            steps_per_poll: 1,
            tx_per_step: 4,
            flags: 0,
        }
    }
}

/// Connection attributes (`struct sqd_sim_conn_attr` in C): what `ibv_modify_qp` to RTR/RTS would set.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimConnAttr {
    /// RNR retries before `IBV_WC_RNR_RETRY_EXC_ERR`; 7 = forever. 0..=7.
    pub rnr_retry: u32,
    /// Transport retries (timeouts, sequence NAKs) before `IBV_WC_RETRY_EXC_ERR`. 0..=7.
    pub retry_cnt: u32,
    /// RDMA READ / ATOMIC requests outstanding at once (1..=16); more stall the SQ (head of line).
    pub max_rd_atomic: u32,
}

impl Default for SimConnAttr {
    fn default() -> SimConnAttr {
        SimConnAttr { rnr_retry: SQD_SIM_RNR_RETRY_FOREVER, retry_cnt: 7, max_rd_atomic: 4 }
    }
}

/// A fault to inject (`struct sqd_sim_fault` in C).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SimFault {
    /// `SQD_SIM_FAULT_*`.
    pub kind: u32,
    /// The QP the fault applies to.
    pub qp: *mut ibv_qp,
    /// `SQD_SIM_FAULT_QP_FATAL`: the step at which the QP fails.
    pub at_step: u64,
    /// Packets (`LOSE_*`) or steps (`RECV_STARVE`).
    pub count: u32,
    /// `SQD_SIM_FAULT_FAIL_NEXT`: the `enum ibv_wc_status` error and vendor error of the failing WQE.
    pub status: u32,
    pub vendor_err: u32,
}

impl SimFault {
    /// A fault of `kind` on `qp` with every other field zero.
    pub fn new(kind: u32, qp: *mut ibv_qp) -> SimFault {
        SimFault { kind, qp, at_step: 0, count: 0, status: 0, vendor_err: 0 }
    }
}

/// Device-wide counters (`struct sqd_sim_stats` in C).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Steps run so far (the current time).
    pub steps: u64,
    /// `post_send` calls that posted at least one WQE.
    pub doorbells: u64,
    /// Send WQEs accepted.
    pub wqes: u64,
    /// Receive WQEs accepted.
    pub recvs: u64,
    /// CQEs generated (send and receive, success and error, including those lost to an overrun).
    pub cqes: u64,
    /// Request packets sent, first transmissions and retransmissions.
    pub packets: u64,
    /// Request packets sent again (go-back-N, RNR retry).
    pub retransmissions: u64,
    /// Retransmission timeouts that fired.
    pub timeouts: u64,
    /// Request packets lost on the wire.
    pub packets_lost: u64,
    /// Response packets lost on the wire.
    pub acks_lost: u64,
    /// Duplicate requests seen by responders.
    pub duplicates: u64,
    /// RNR NAKs sent by responders.
    pub rnr_naks: u64,
    /// Sequence-error NAKs sent by responders.
    pub seq_naks: u64,
    /// `IBV_WC_WR_FLUSH_ERR` CQEs generated.
    pub flushes: u64,
    /// Error CQEs other than flushes.
    pub errors: u64,
    /// CQEs lost because their CQ was full or in error.
    pub cq_overruns: u64,
    /// Posts refused because the SQ was full.
    pub sq_overflows: u64,
    /// Posts refused because the RQ was full.
    pub rq_overflows: u64,
    /// Violations logged.
    pub violations: u64,
    /// Bytes read from registered memory (sources, READ targets at the responder).
    pub bytes_read: u64,
    /// Bytes written into registered memory.
    pub bytes_written: u64,
    /// QP visits made by steps: a step visits only the QPs with work (a send WQE not completed, an ACK due), so
    /// this grows with the work done, not with the number of QPs.
    pub qp_ticks: u64,
    /// Asynchronous events raised.
    pub async_events: u64,
    /// Completion events queued on completion channels.
    pub comp_events: u64,
}

/// One logged violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// `SQD_SIM_VIOLATION_*`.
    pub kind: u32,
    /// The QP it is recorded against (0 when none).
    pub qp_num: u32,
    /// The send WQE involved, by its index on that QP (0 = first ever posted), when there is one.
    pub wqe_index: Option<u64>,
    /// The step at which it happened.
    pub step: u64,
    /// What happened, starting with the kind's name.
    pub text: String,
}

/// A sim device's context (see `context.rs`).
static SENTINEL: u8 = 0;
const CONTEXT_MARK: ContextMark = ContextMark { sentinel: &SENTINEL, magic: 0x7371_645f_7369_6d30 }; // "sqd_sim0"

/// A simulated HCA: a real `struct ibv_context` and `struct ibv_pd`, and the MRs, CQs and QPs made on it.
///
/// The ops callbacks find the device through a pointer stored in the context, so it never moves (it is made
/// pinned). Freeing it frees every object it made.
///
/// Thread-safe: any number of threads may call into one sim at once (data-path ops, `sqd_sim_*` calls,
/// stepping); each call holds the device-wide lock for its duration. Only `sqd_sim_free` and the
/// `sqd_sim_destroy_*` calls must not race other calls on the objects they free.
pub struct SimDevice {
    ctx: *mut ContextObj<SimDevice>,
    pd: *mut ibv_pd,
    ibdev: *mut ibv_device,
    /// The device lock: every call into the model — data-path ops from any thread, control calls, stepping,
    /// statistics — holds it for its duration. The model never calls out (no user callback, no library code)
    /// while holding it, so it is never taken re-entrantly.
    model: Mutex<Model>,
    /// Scripted refusals (`refuse_opcode`): QP address, opcode, errno. Taken after the model lock, never before
    /// it.
    refusals: Mutex<Vec<(usize, u32, i32)>>,
    /// Whether `refusals` holds any: `post_send` looks at the list only then.
    refusal_armed: AtomicBool,
    /// The CQs, QPs and SRQs the library's handles hold (told through the device seam): not destroyed while held.
    held: Arc<HeldObjects>,
    _pinned: PhantomPinned,
}

// SAFETY: the raw pointers a device holds are objects it owns (freed only by its `Drop`) and registered memory
// the `reg_mr` contract keeps valid; nothing in them is tied to a thread. Every access to the model's state goes
// through the `Mutex`, so the device may be used from several threads at once (see the module docs).
unsafe impl Send for SimDevice {}
// SAFETY: as above: shared access is serialised by the device lock; the fields outside it are set once in `new`.
unsafe impl Sync for SimDevice {}

impl SimDevice {
    /// A new simulated HCA. `EINVAL` for a configuration out of range (`wire_delay_min > wire_delay_max`,
    /// `tx_per_step` 0, `loss_ppm` or `ack_loss_ppm` above 1000000, `retrans_timeout` 0, or unknown flags).
    pub fn new(config: &SimConfig) -> Result<Pin<Box<SimDevice>>> {
        model::check_config(config)?;
        // SAFETY: `ibv_device` is plain data (integers, char arrays, nullable fn pointers): zero is valid.
        let mut ibdev: Box<ibv_device> = Box::new(unsafe { std::mem::zeroed() });
        for (dst, src) in ibdev.name.iter_mut().zip(b"sqd_sim0".iter()) {
            *dst = *src as std::ffi::c_char;
        }
        ibdev.node_type = rdma_sys::ibv_node_type::IBV_NODE_CA;
        ibdev.transport_type = rdma_sys::ibv_transport_type::IBV_TRANSPORT_IB;
        let ibdev = Box::into_raw(ibdev);

        // SAFETY: `ibv_context` is plain data (pointers, ints, nullable fn pointers, a pthread mutex whose
        // all-zero pattern is the static initializer on Linux): zero is valid.
        let mut ctx: ibv_context = unsafe { std::mem::zeroed() };
        ctx.device = ibdev;
        ctx.cmd_fd = -1;
        ctx.async_fd = -1;
        ctx.num_comp_vectors = 1;
        ctx.ops.post_send = Some(ops::post_send);
        ctx.ops.post_recv = Some(ops::post_recv);
        ctx.ops.poll_cq = Some(ops::poll_cq);
        ctx.ops.req_notify_cq = Some(ops::req_notify_cq);
        ctx.ops.post_srq_recv = Some(ops::post_srq_recv);
        let ctx = ContextObj::boxed(ctx, &CONTEXT_MARK);
        let pd = Box::into_raw(Box::new(ibv_pd { context: ctx.cast(), handle: 1 }));
        let model = match Model::new(*config, ctx.cast(), pd) {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: the three came from `Box::into_raw` above and nothing refers to them yet.
                unsafe {
                    drop(Box::from_raw(pd));
                    drop(Box::from_raw(ctx));
                    drop(Box::from_raw(ibdev));
                }
                return Err(e);
            }
        };

        let device = Box::pin(SimDevice {
            ctx,
            pd,
            ibdev,
            model: Mutex::new(model),
            refusals: Mutex::new(Vec::new()),
            refusal_armed: AtomicBool::new(false),
            held: HeldObjects::new(),
            _pinned: PhantomPinned,
        });
        // SAFETY: `ctx` came from `boxed` above and is owned by `device`; nothing else refers to it yet. The
        // device is pinned and frees the context when it is dropped.
        unsafe { ContextObj::tie(ctx, &*device) };
        // `ibv_dereg_mr` cannot reach this device (it has no driver ops): the library's deferred deregistration
        // (`Queue::defer_teardown`, `sqd_defer_dereg_mr`) calls `dereg_for_library` instead; the library's handles
        // report what they hold into `held`.
        let ops = DeviceOps {
            dereg_mr: Some(dereg_for_library),
            create_srq: Some(create_srq_for_library),
            destroy_srq: Some(destroy_srq_for_library),
            ..DeviceOps::empty(std::ptr::null_mut())
        };
        // SAFETY: the three functions do on this device's objects what the libibverbs calls would (each finds the
        // device from the object and refuses objects of no live sim device), from any thread; `held`'s two
        // outlive every hold. The device unregisters in its `Drop`.
        unsafe { sqdisc_device::register(ctx.cast(), &HeldObjects::ops(&device.held, ops)) }?;
        Ok(device)
    }

    /// The device that owns `ctx`, if `ctx` is a sim context.
    ///
    /// # Safety
    /// `ctx` is NULL or points to a live `struct ibv_context`; when it is a sim device's, that device outlives
    /// `'a`.
    pub unsafe fn from_context<'a>(ctx: *mut ibv_context) -> Option<&'a SimDevice> {
        // SAFETY: as the caller promises.
        unsafe { ContextObj::device(ctx, &CONTEXT_MARK) }
    }

    /// The device that owns `qp`; `EINVAL` if it is NULL or not a live QP of a sim device.
    ///
    /// # Safety
    /// `qp` is NULL or points to a live `struct ibv_qp` whose context is alive; a sim device owning it
    /// outlives `'a`.
    pub unsafe fn from_qp<'a>(qp: *mut ibv_qp) -> Result<&'a SimDevice> {
        if qp.is_null() {
            return Err(Error::invalid("qp is NULL"));
        }
        // SAFETY: as the caller promises.
        let device = unsafe { Self::from_context((*qp).context) }
            .ok_or_else(|| Error::invalid(format!("qp {qp:p} does not belong to a sim device")))?;
        if !device.model.lock().owns_qp(qp) {
            return Err(Error::invalid(format!("qp {qp:p} is not a live QP of its sim device")));
        }
        Ok(device)
    }

    /// The device that owns `cq`; as [`SimDevice::from_qp`].
    ///
    /// # Safety
    /// As [`SimDevice::from_qp`], for a `struct ibv_cq`.
    pub unsafe fn from_cq<'a>(cq: *mut ibv_cq) -> Result<&'a SimDevice> {
        if cq.is_null() {
            return Err(Error::invalid("cq is NULL"));
        }
        // SAFETY: as the caller promises.
        let device = unsafe { Self::from_context((*cq).context) }
            .ok_or_else(|| Error::invalid(format!("cq {cq:p} does not belong to a sim device")))?;
        if !device.model.lock().owns_cq(cq) {
            return Err(Error::invalid(format!("cq {cq:p} is not a live CQ of its sim device")));
        }
        Ok(device)
    }

    /// The device that owns `mr`; as [`SimDevice::from_qp`].
    ///
    /// # Safety
    /// As [`SimDevice::from_qp`], for a `struct ibv_mr`.
    pub unsafe fn from_mr<'a>(mr: *mut ibv_mr) -> Result<&'a SimDevice> {
        if mr.is_null() {
            return Err(Error::invalid("mr is NULL"));
        }
        // SAFETY: as the caller promises.
        let device = unsafe { Self::from_context((*mr).context) }
            .ok_or_else(|| Error::invalid(format!("mr {mr:p} does not belong to a sim device")))?;
        if !device.model.lock().owns_mr(mr) {
            return Err(Error::invalid(format!("mr {mr:p} is not a live MR of its sim device")));
        }
        Ok(device)
    }

    pub(crate) fn model(&self) -> &Mutex<Model> {
        &self.model
    }

    /// The device's `struct ibv_context`.
    pub fn context(&self) -> *mut ibv_context {
        self.ctx.cast()
    }

    /// The device's protection domain.
    pub fn pd(&self) -> *mut ibv_pd {
        self.pd
    }

    /// The configuration the device was made with.
    pub fn config(&self) -> SimConfig {
        self.model.lock().config()
    }

    /// Registers `len` bytes at `addr` with `access` (`IBV_ACCESS_*` bits) and returns a real `struct ibv_mr`
    /// (`lkey`, `rkey`, `addr`, `length`, `context`, `pd` set; `lkey == rkey`, never reused). `EINVAL` for a
    /// NULL `addr` with `len` > 0, or `IBV_ACCESS_REMOTE_WRITE`/`REMOTE_ATOMIC` without `LOCAL_WRITE` (as
    /// verbs requires).
    ///
    /// # Safety
    /// `[addr, addr + len)` stays valid for reads — and for writes when `access` includes a write permission —
    /// until the MR is deregistered or the device is dropped: the model reads and writes it (DMA) at any step.
    pub unsafe fn reg_mr(&self, addr: *mut c_void, len: usize, access: u32) -> Result<*mut ibv_mr> {
        self.model.lock().reg_mr(addr, len, access)
    }

    /// Registers `len` bytes at `addr` of `mem`, memory outside this process (the device daemon's clients'), as
    /// [`SimDevice::reg_mr`] does for this process's memory. Every DMA through the MR reads or writes through
    /// `mem`; one that fails is a protection error of that access.
    pub fn reg_mr_in(&self, mem: std::sync::Arc<dyn memory::Memory>, addr: u64, len: usize, access: u32) -> Result<*mut ibv_mr> {
        self.model.lock().reg_mr_in(Some(mem), addr as *mut c_void, len, access)
    }

    /// Deregisters an MR: its keys are invalid from now on (a later DMA through them fails) and `mr` dangles.
    /// Logs an "MR invalidated while in use" violation when an unfinished send WQE references it.
    pub fn dereg_mr(&self, mr: *mut ibv_mr) -> Result<()> {
        self.model.lock().dereg_mr(mr)
    }

    /// Makes a CQ holding `cqe` CQEs (1..=4194304); `cq->cqe` is `cqe`. No completion channel.
    pub fn create_cq(&self, cqe: i32) -> Result<*mut ibv_cq> {
        self.model.lock().create_cq(cqe, std::ptr::null_mut(), std::ptr::null_mut(), 0)
    }

    /// Makes a CQ as `ibv_create_cq` does: `cqe` CQEs (1..=4194304), on completion channel `channel` (NULL:
    /// none) of this device, with `cq_context` (returned by [`SimDevice::get_cq_event`]) and `comp_vector` (the
    /// device has one: 0). `EINVAL` otherwise.
    pub fn create_cq_ex(&self, cqe: i32, channel: *mut ibv_comp_channel, cq_context: *mut c_void, comp_vector: i32) -> Result<*mut ibv_cq> {
        self.model.lock().create_cq(cqe, channel, cq_context, comp_vector)
    }

    /// Makes a completion channel: a real `struct ibv_comp_channel` (`context`, `fd`, `refcnt`) whose `fd` (a
    /// nonblocking eventfd) is readable exactly while completion events are queued on it. Read events with
    /// [`SimDevice::get_cq_event`], never `read(2)` the fd (nor libibverbs' `ibv_get_cq_event`, which needs a
    /// kernel device).
    pub fn create_comp_channel(&self) -> Result<*mut ibv_comp_channel> {
        self.model.lock().create_channel()
    }

    /// Destroys a completion channel; `EBUSY` while a CQ uses it (`refcnt` not zero), `EINVAL` if not ours.
    pub fn destroy_comp_channel(&self, channel: *mut ibv_comp_channel) -> Result<()> {
        self.model.lock().destroy_channel(channel)
    }

    /// Takes the oldest completion event of `channel`, without blocking: the CQ it is for and that CQ's
    /// `cq_context`. `EAGAIN` when none is queued (sleep on `channel->fd` meanwhile). Each event taken must be
    /// acknowledged ([`SimDevice::ack_cq_events`]) before the CQ is destroyed.
    pub fn get_cq_event(&self, channel: *mut ibv_comp_channel) -> Result<(*mut ibv_cq, *mut c_void)> {
        self.model.lock().get_cq_event(channel)
    }

    /// Acknowledges `n` completion events taken for `cq`. `EINVAL` for more than are unacknowledged.
    pub fn ack_cq_events(&self, cq: *mut ibv_cq, n: u32) -> Result<()> {
        self.model.lock().ack_cq_events(cq, n)
    }

    /// Takes the oldest asynchronous event (CQ error, QP fatal, last WQE reached, SRQ limit reached, SRQ
    /// error), without blocking; `None` when none is pending.
    pub fn get_async_event(&self) -> Option<AsyncEvent> {
        self.model.lock().get_async_event()
    }

    /// A nonblocking eventfd, readable exactly while asynchronous events are pending (for epoll); owned by the
    /// device. Take events with [`SimDevice::get_async_event`], never by reading the fd.
    pub fn async_fd(&self) -> i32 {
        self.model.lock().async_fd()
    }

    /// Makes a shared receive queue as `ibv_create_srq` does: a real `struct ibv_srq` (`context`, `pd`,
    /// `srq_context`); `attr.attr.max_wr` (1..=32768) and `max_sge` (1..=32) are clamped and written back;
    /// `srq_limit` is ignored (arm it with [`SimDevice::modify_srq_limit`]). Post receives to it with
    /// libibverbs' `ibv_post_srq_recv` (the context's `post_srq_recv` op).
    pub fn create_srq(&self, attr: &mut ibv_srq_init_attr) -> Result<*mut ibv_srq> {
        self.model.lock().create_srq(attr)
    }

    /// Destroys an SRQ; `EBUSY` while a QP uses it or a library handle (a managed SRQ) holds it. Receives still posted on it never complete.
    pub fn destroy_srq(&self, srq: *mut ibv_srq) -> Result<()> {
        self.held.check_unheld(srq, "srq", "an sqd_srq (sqd_srq_free it first)")?;
        self.model.lock().destroy_srq(srq)
    }

    /// Arms the SRQ limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): when a QP takes a receive and fewer than
    /// `limit` remain posted, one `IBV_EVENT_SRQ_LIMIT_REACHED` is raised and the limit disarmed. 0 disarms.
    /// `EINVAL` above the SRQ's `max_wr`.
    pub fn modify_srq_limit(&self, srq: *mut ibv_srq, limit: u32) -> Result<()> {
        self.model.lock().modify_srq_limit(srq, limit)
    }

    /// Fault: the SRQ fails (`IBV_EVENT_SRQ_ERR`); every QP on it goes to error, posts to it are refused.
    pub fn srq_set_error(&self, srq: *mut ibv_srq) -> Result<()> {
        self.model.lock().srq_set_error(srq)
    }

    /// The SRQ's armed limit (0: not armed), how many receives are posted and not yet taken, and how many
    /// receive slots are held (posted, and not yet freed by polling their CQE).
    pub fn srq_state(&self, srq: *mut ibv_srq) -> Result<(u32, usize, usize)> {
        self.model.lock().srq_state(srq)
    }

    /// Whether `srq` is a live SRQ of this device.
    pub fn owns_srq(&self, srq: *mut ibv_srq) -> bool {
        self.model.lock().owns_srq(srq)
    }

    /// Whether `channel` is a live completion channel of this device.
    pub fn owns_comp_channel(&self, channel: *mut ibv_comp_channel) -> bool {
        self.model.lock().owns_channel(channel)
    }

    /// Resizes a CQ as `ibv_resize_cq` does: it holds `cqe` CQEs from now on and `cq->cqe` says so; `EINVAL`
    /// below the CQEs it holds now. A managed CQ learns the new size from `Cq::update_capacity`.
    pub fn resize_cq(&self, cq: *mut ibv_cq, cqe: i32) -> Result<()> {
        self.model.lock().resize_cq(cq, cqe)
    }

    /// Destroys a CQ; `EBUSY` while a QP uses it or a library handle (a managed CQ) holds it. Its pointer dangles afterwards.
    pub fn destroy_cq(&self, cq: *mut ibv_cq) -> Result<()> {
        self.held.check_unheld(cq, "cq", "an sqd_cq (sqd_cq_free it first)")?;
        self.model.lock().destroy_cq(cq)
    }

    /// Makes an RC QP. `attr->qp_type` must be `IBV_QPT_RC`, `send_cq`/`recv_cq` CQs of this device, `srq`
    /// NULL or an SRQ of this device (the QP then takes its receives from it, oldest first, and has no RQ of
    /// its own: `ibv_post_recv` on it fails with `EINVAL`; `max_recv_wr`/`max_recv_sge` are written back as 0). Caps are honoured, clamped to the device limits (WRs 1..=32768, SGEs 1..=32, inline 0..=1024);
    /// the granted caps are written back to `attr.cap`. `sq_sig_all` makes every send WR signaled.
    ///
    /// The QP starts in the INIT state: receives may be posted, sends only after [`SimDevice::connect`]
    /// (in null mode it starts ready to send).
    pub fn create_qp(&self, attr: &mut ibv_qp_init_attr) -> Result<*mut ibv_qp> {
        self.model.lock().create_qp(attr, false)
    }

    /// Connects two QPs of this device to each other (both to RTS), as the two sides' `ibv_modify_qp` to
    /// RTR/RTS would. `a` and `b` must differ and be unconnected. `attr` applies to both.
    pub fn connect(&self, a: *mut ibv_qp, b: *mut ibv_qp, attr: &SimConnAttr) -> Result<()> {
        self.model.lock().connect(a, b, attr)
    }

    /// Connects one QP to the QP numbered `dest_qpn`, as one side's `ibv_modify_qp` to RTR/RTS does: the other
    /// side is connected by its own call (until then it drops this QP's requests and they are retransmitted).
    /// `dest_qpn` may be a QP of this device made by another process of the device daemon. `EINVAL` for a QP in
    /// error, one connected to another QP, or attributes out of range.
    pub fn connect_to(&self, qp: *mut ibv_qp, dest_qpn: u32, attr: &SimConnAttr) -> Result<()> {
        self.model.lock().connect_to(qp, dest_qpn, attr)
    }

    /// Moves a QP to the error state (as `ibv_modify_qp` to `IBV_QPS_ERR`): every unfinished send WQE and
    /// every posted receive flushes with its own CQE, in order.
    pub fn set_error(&self, qp: *mut ibv_qp) -> Result<()> {
        self.model.lock().set_error(qp)
    }

    /// Destroys a QP whatever it holds (`EBUSY` while a library handle, a managed queue, holds it); its CQEs not yet polled are removed from its CQs. Packets in flight to
    /// it are dropped; its peer, if any, stays connected to nothing (its requests time out).
    pub fn destroy_qp(&self, qp: *mut ibv_qp) -> Result<()> {
        self.held.check_unheld(qp, "qp", "an sqd_queue (sqd_queue_free it first)")?;
        self.model.lock().destroy_qp(qp)?;
        self.forget_refusals(qp);
        Ok(())
    }

    /// Makes the HCA refuse send WRs at post time, as a provider refuses a WR it does not support: from now on
    /// every send WR of `qp` with `opcode` (an `enum ibv_wr_opcode` value) is refused with `errno`, whenever it is
    /// posted (`post_send` returns it with `*bad_wr` at that WR; it and the WRs after it in that chain are not
    /// posted). No violation is logged. `errno` 0 lifts the refusal. `EINVAL` for an errno above 4095 or a QP
    /// not of this device.
    pub fn refuse_opcode(&self, qp: *mut ibv_qp, opcode: u32, errno: i32) -> Result<()> {
        self.model.lock().qp_stats(qp)?;
        if !(0..=4095).contains(&errno) {
            return Err(Error::invalid(format!("errno {errno} is outside 0..=4095")));
        }
        let mut list = self.refusals.lock();
        list.retain(|r| !(r.0 == qp as usize && r.1 == opcode));
        if errno != 0 {
            list.push((qp as usize, opcode, errno));
        }
        self.refusal_armed.store(!list.is_empty(), Ordering::Relaxed);
        Ok(())
    }

    fn forget_refusals(&self, qp: *mut ibv_qp) {
        let mut list = self.refusals.lock();
        list.retain(|r| r.0 != qp as usize);
        self.refusal_armed.store(!list.is_empty(), Ordering::Relaxed);
    }

    /// Whether any scripted refusal is set (cheap: `post_send` asks before each chain).
    pub(crate) fn refusal_armed(&self) -> bool {
        self.refusal_armed.load(Ordering::Relaxed)
    }

    /// The errno a send WR of `qp` with `opcode` is refused with, if a scripted refusal says so.
    pub(crate) fn refusal_of(&self, qp: *mut ibv_qp, opcode: u32) -> Option<i32> {
        self.refusals.lock().iter().find(|r| r.0 == qp as usize && r.1 == opcode).map(|r| r.2)
    }

    /// Runs `steps` steps.
    pub fn step(&self, steps: u32) {
        self.model.lock().run(u64::from(steps));
    }

    /// Runs steps until nothing is in flight (no WQE waiting to be transmitted or acknowledged, no packet on
    /// the wire, no ACK pending); returns the steps run. `ETIMEDOUT` after `max_steps` steps (an RNR retry
    /// that never ends, a peer that never answers...).
    pub fn run_until_idle(&self, max_steps: u32) -> Result<u64> {
        self.model.lock().run_until_idle(u64::from(max_steps))
    }

    /// Polls a CQ as `ibv_poll_cq` does (`steps_per_poll` steps first), handing each CQE to `out` with, for a
    /// send completion, the count of its QP's send slots now free (every slot below it; the device daemon's
    /// clients keep a copy of that count so that they can tell at post time, without asking, that a post
    /// fits). Returns how many CQEs were taken.
    pub fn poll_cq_slots(&self, cq: *mut ibv_cq, max: usize, out: impl FnMut(usize, rdma_sys::ibv_wc, Option<u64>)) -> Result<usize> {
        let mut model = self.model.lock();
        if !model.owns_cq(cq) {
            return Err(Error::invalid(format!("cq {cq:p} is not a live CQ of this sim device")));
        }
        Ok(model.poll_slots(cq, max, out))
    }

    /// Hands each CQ that got a CQE since the last call to `f`, with the number of CQEs it holds now (the device
    /// daemon publishes it to the CQ's owner, who then polls only a CQ that holds something).
    pub fn take_cq_changes(&self, f: impl FnMut(*mut ibv_cq, usize)) {
        self.model.lock().take_cq_changes(f)
    }

    /// The number of CQEs a CQ holds; `None` for a CQ not of this device.
    pub fn cq_queued(&self, cq: *mut ibv_cq) -> Option<usize> {
        self.model.lock().cq_queued(cq)
    }

    /// Whether the next step certainly moves traffic (a packet on the wire, an ACK due, a WQE to transmit),
    /// rather than only bringing a retransmission or RNR timer closer. The device daemon steps back to back
    /// while it is true, and at its wall-clock tick while only `busy` is.
    pub fn urgent(&self) -> bool {
        self.model.lock().urgent()
    }

    /// Whether anything is in flight: a WQE waiting to be transmitted or acknowledged, a packet on the wire, an
    /// ACK pending. Steps change nothing while it is false.
    pub fn busy(&self) -> bool {
        self.model.lock().in_flight()
    }

    /// Injects a fault (`SQD_SIM_FAULT_*`). `EINVAL` for an unknown kind or a QP not of this device.
    pub fn inject(&self, fault: &SimFault) -> Result<()> {
        self.model.lock().inject(fault)
    }

    /// Oracle: whether any send WQE the HCA is not truly finished with (it could still be transmitted or
    /// retransmitted, i.e. not yet acknowledged and completed, or — for RDMA READ and atomics — still to be
    /// written) references bytes of `[addr, addr + len)` through its SGEs. Inline data never counts (it was
    /// copied at post time).
    pub fn buffer_busy(&self, addr: *const c_void, len: usize) -> bool {
        self.model.lock().buffer_busy(addr as u64, len as u64)
    }

    /// Oracle: whether the HCA is finished with the `index`-th send WQE posted on `qp` (0 = first ever).
    /// `ENOENT` beyond the last posted.
    pub fn wqe_finished(&self, qp: *mut ibv_qp, index: u64) -> Result<bool> {
        self.model.lock().wqe_finished(qp, index)
    }

    /// The device-wide counters.
    pub fn stats(&self) -> SimStats {
        self.model.lock().stats()
    }

    /// The current step.
    pub fn now(&self) -> u64 {
        self.model.lock().now()
    }

    /// Number of violations logged.
    pub fn violation_count(&self) -> usize {
        self.model.lock().violations().len()
    }

    /// The `index`-th violation (0 = oldest).
    pub fn violation(&self, index: usize) -> Option<Violation> {
        self.model.lock().violations().get(index).cloned()
    }

    /// Every violation logged so far, oldest first.
    pub fn violation_log(&self) -> Vec<Violation> {
        self.model.lock().violations().to_vec()
    }

    /// Whether `qp` is in the error state.
    pub fn qp_in_error(&self, qp: *mut ibv_qp) -> Result<bool> {
        Ok(self.model.lock().qp_stats(qp)?.in_error)
    }
}

/// The scripted device's surface, mapped onto the model so that tests written for the scripted device can run
/// here.
///
/// - `create_qp` makes a *scripted QP*: connected at once to an internal sink that accepts every request
///   (no receive needed, no rkey check) and moves no data (its SGEs are never read), so made-up addresses and
///   keys work. Its WQEs still go through transmission, the wire (with the device's loss and delays),
///   acknowledgement and in-order completion. `wqe` history is kept for scripted QPs only.
/// - `complete(qp, n)` runs steps until `n` more send WQEs of the QP have completed (in order), or nothing of
///   the QP is in flight any more; returns how many completed.
/// - `fail(qp, status, vendor_err)`: the QP's next send WQE not yet transmitted fails with that status when it
///   reaches transmission (which happens at the next step); `ENOENT` if none is waiting.
/// - `deliver(qp, byte_len, imm)`: a message from the peer arrives now, bypassing the wire: the oldest posted
///   receive completes with `byte_len` (no bytes are written). `ENOENT` if no receive is posted.
/// - `violations()` gives the texts of the violation log.
impl Scriptable for SimDevice {
    fn context(&self) -> *mut ibv_context {
        SimDevice::context(self)
    }
    fn pd(&self) -> *mut ibv_pd {
        SimDevice::pd(self)
    }
    fn create_cq(&self, cqe: i32) -> Result<*mut ibv_cq> {
        SimDevice::create_cq(self, cqe)
    }
    fn create_qp(&self, send_cq: *mut ibv_cq, recv_cq: *mut ibv_cq, caps: &ScriptedQpCaps) -> Result<*mut ibv_qp> {
        // SAFETY: `ibv_qp_init_attr` is plain data (pointers and integers): zero is valid.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = send_cq;
        attr.recv_cq = recv_cq;
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        attr.cap.max_send_wr = caps.max_send_wr;
        attr.cap.max_recv_wr = caps.max_recv_wr;
        attr.cap.max_send_sge = caps.max_send_sge;
        attr.cap.max_recv_sge = caps.max_recv_sge;
        attr.cap.max_inline_data = caps.max_inline_data;
        self.model.lock().create_qp(&mut attr, true)
    }
    fn destroy_qp(&self, qp: *mut ibv_qp) -> Result<()> {
        SimDevice::destroy_qp(self, qp)
    }
    fn destroy_cq(&self, cq: *mut ibv_cq) -> Result<()> {
        SimDevice::destroy_cq(self, cq)
    }
    fn complete(&self, qp: *mut ibv_qp, n: usize) -> Result<usize> {
        self.model.lock().complete_n(qp, n)
    }
    fn fail(&self, qp: *mut ibv_qp, status: u32, vendor_err: u32) -> Result<()> {
        self.model.lock().fail_next(qp, status, vendor_err)
    }
    fn set_error(&self, qp: *mut ibv_qp) -> Result<()> {
        SimDevice::set_error(self, qp)
    }
    fn deliver(&self, qp: *mut ibv_qp, byte_len: u32, imm: Option<u32>) -> Result<()> {
        self.model.lock().deliver_now(qp, byte_len, imm)
    }
    fn qp_stats(&self, qp: *mut ibv_qp) -> Result<ScriptedQpStats> {
        self.model.lock().qp_stats(qp)
    }
    fn qp_caps(&self, qp: *mut ibv_qp) -> Result<ScriptedQpCaps> {
        self.model.lock().qp_caps(qp)
    }
    fn cq_stats(&self, cq: *mut ibv_cq) -> Result<ScriptedCqStats> {
        self.model.lock().cq_stats(cq)
    }
    fn wqe(&self, qp: *mut ibv_qp, index: usize) -> Result<ScriptedWqe> {
        self.model.lock().wqe_record(qp, index)
    }
    fn refuse_opcode(&self, qp: *mut ibv_qp, opcode: u32, errno: i32) -> Result<()> {
        SimDevice::refuse_opcode(self, qp, opcode, errno)
    }
    fn violations(&self) -> Vec<String> {
        self.model.lock().violations().iter().map(|v| v.text.clone()).collect()
    }
}

impl SimDevice {
    /// How many of its CQs, QPs and SRQs the library's handles hold (the device is not freed while any is).
    pub fn held_count(&self) -> usize {
        self.held.count()
    }

    /// How many of the library's handles hold `obj` (a CQ, QP or SRQ of the device).
    pub fn holders<T>(&self, obj: *const T) -> u32 {
        self.held.holders(obj)
    }

    /// The state a QP was made in, for tests: INIT until connected (RTS in null mode), ERR after an error.
    pub fn qp_state(&self, qp: *mut ibv_qp) -> Result<ibv_qp_state::Type> {
        self.model.lock().qp_state(qp)
    }
}

/// The SRQ creation the device registers with [`sqdisc_device::register`]: what
/// [`SimDevice::create_srq`] does on the PD's device.
///
/// # Safety
/// `pd` is a valid PD of a live sim device, `attr` a valid, writable attribute struct and `out` writable.
unsafe extern "C" fn create_srq_for_library(
    _device: *mut c_void,
    pd: *mut ibv_pd,
    attr: *mut rdma_sys::ibv_srq_init_attr,
    out: *mut *mut rdma_sys::ibv_srq,
) -> i32 {
    // SAFETY: as this function's caller promises.
    let Some(device) = (unsafe { SimDevice::from_context((*pd).context) }) else { return libc::EINVAL };
    // SAFETY: as this function's caller promises.
    let Some(attr) = (unsafe { attr.as_mut() }) else { return libc::EINVAL };
    match device.create_srq(attr) {
        Ok(srq) => {
            // SAFETY: writable (the caller's promise).
            unsafe { out.write(srq) };
            0
        }
        Err(e) => e.errno(),
    }
}

/// The SRQ destruction the device registers with [`sqdisc_device::register`].
///
/// # Safety
/// `srq` is a valid SRQ of a live sim device.
unsafe extern "C" fn destroy_srq_for_library(_device: *mut c_void, srq: *mut rdma_sys::ibv_srq) -> i32 {
    // SAFETY: as this function's caller promises.
    match unsafe { SimDevice::from_context((*srq).context) } {
        Some(device) => device.destroy_srq(srq).err().map_or(0, |e| e.errno()),
        None => libc::EINVAL,
    }
}

/// The deregistration the device registers with [`sqdisc_device::register`]: what
/// [`SimDevice::dereg_mr`] does, as 0 or a positive errno.
///
/// # Safety
/// The device that registered `mr`, if any, is alive and not in use by another thread.
unsafe extern "C" fn dereg_for_library(_device: *mut c_void, mr: *mut ibv_mr) -> i32 {
    // SAFETY: as this function's caller promises.
    match unsafe { SimDevice::from_mr(mr) }.and_then(|dev| dev.dereg_mr(mr)) {
        Ok(()) => 0,
        Err(e) => e.errno(),
    }
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        // SAFETY: the device is going: none of its objects is torn down after this. It was registered in `new`.
        let _ = unsafe { sqdisc_device::unregister(self.context()) };
        self.model.get_mut().clear();
        // SAFETY: these three came from `Box::into_raw` in `new`, are owned by the device and freed only here.
        // Every MR, QP and CQ referring to them was freed by `clear` above.
        unsafe {
            drop(Box::from_raw(self.pd));
            drop(Box::from_raw(self.ctx));
            drop(Box::from_raw(self.ibdev));
        }
    }
}
