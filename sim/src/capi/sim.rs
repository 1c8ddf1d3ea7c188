//! C API: the software HCA (`sqd_sim_*`), thin wrappers over the crate's [`SimDevice`](crate::SimDevice).
//!
//! Threading for every function here: any thread may call any function on a sim and its objects (MRs, CQs, QPs,
//! SRQs, channels, and the data-path verbs called on them through its context) at any time: every call holds
//! the sim's device lock for its duration, so calls are serialised per sim, never interleaved. Exception:
//! `sqd_sim_free`, and each `sqd_sim_destroy_*`, must not race other calls on the objects they free.
//!
//! Ownership: the sim owns every object it makes; `sqd_sim_free` frees them all. Free the library's own
//! objects (`sqd_queue`, `sqd_cq`, `sqd_srq`) that use a sim's QPs, CQs and SRQs first: until then destroying
//! one of those objects, or the sim, fails with `-EBUSY`.

use std::ffi::{c_char, c_int, c_void};
use std::pin::Pin;

use rdma_sys::{
    ibv_async_event, ibv_async_event_element_t, ibv_comp_channel, ibv_context, ibv_cq, ibv_mr, ibv_pd, ibv_qp, ibv_qp_init_attr, ibv_srq,
    ibv_srq_init_attr,
};

use super::{fail, ffi_boundary, status, try_mut, try_ref};
use crate::{violation_kind_str, AsyncElement, SimConfig, SimConnAttr, SimDevice, SimFault, SimStats};
use crate::Error;

/// `wqe_index` of a violation that concerns no particular send WQE.
pub const SQD_SIM_NO_WQE: u64 = 0xffff_ffff_ffff_ffff;

/// Bytes of `text` in `struct sqd_sim_violation`, including the terminating NUL.
pub const SQD_SIM_VIOLATION_TEXT: usize = 256;

/// One logged violation, as `sqd_sim_violation` copies it out.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SimViolationRecord {
    /// `SQD_SIM_VIOLATION_*`; `sqd_sim_violation_kind_str` names it.
    pub kind: u32,
    /// The QP it is recorded against (0 when none).
    pub qp_num: u32,
    /// Index of the send WQE involved on that QP (0 = first ever posted), or `SQD_SIM_NO_WQE`.
    pub wqe_index: u64,
    /// The step at which it happened.
    pub step: u64,
    /// A description starting with the kind's name, NUL-terminated, truncated to fit.
    pub text: [c_char; SQD_SIM_VIOLATION_TEXT],
}

fn sim_ref<'a>(sim: *const SimDevice) -> Option<&'a SimDevice> {
    // SAFETY: every function taking a sim documents that it must be NULL or a live sim from `sqd_sim_new`.
    unsafe { sim.as_ref() }
}

fn qp_device<'a>(qp: *mut ibv_qp) -> crate::Result<&'a SimDevice> {
    // SAFETY: every function taking a QP documents that it must be NULL or a live QP made by
    // `sqd_sim_create_qp`, whose sim is alive for the duration of the call.
    unsafe { SimDevice::from_qp(qp) }
}

fn null_sim() -> c_int {
    fail(&Error::invalid("sim is NULL"))
}

/// Fills `*cfg` with the defaults: seed 1, no loss, wire delay 1..=3 steps, ACK delay 2, retransmission
/// timeout 24, RNR delay 8, 1 step per `ibv_poll_cq` call, 4 WQEs transmitted per step per QP, no flags.
/// NULL is a no-op.
#[no_mangle]
pub extern "C" fn sqd_sim_config_default(cfg: *mut SimConfig) {
    if !cfg.is_null() {
        // SAFETY: a non-NULL `cfg` points to a writable `struct sqd_sim_config`, as documented.
        unsafe { cfg.write(SimConfig::default()) };
    }
}

/// Creates a software HCA: a `struct ibv_context` whose data-path ops (`ibv_post_send`, `ibv_post_recv`,
/// `ibv_poll_cq`, `ibv_req_notify_cq`) run the model, and a protection domain. `cfg` NULL means the defaults
/// (`sqd_sim_config_default`); it is read during the call only.
///
/// On success stores the sim in `*out` and returns 0; the caller owns it and frees it with `sqd_sim_free`.
/// Errors: `-EINVAL` if `out` is NULL or the configuration is out of range (`wire_delay_min` above
/// `wire_delay_max`, `tx_per_step` or `retrans_timeout` 0, a loss rate above 1000000 ppm, unknown flags).
#[no_mangle]
pub extern "C" fn sqd_sim_new(cfg: *const SimConfig, out: *mut *mut SimDevice) -> c_int {
    ffi_boundary!({
        let out = try_mut!(out, "out");
        // SAFETY: a non-NULL `cfg` points to a readable `struct sqd_sim_config`, as documented.
        let cfg = unsafe { cfg.as_ref() }.copied().unwrap_or_default();
        match SimDevice::new(&cfg) {
            Ok(sim) => {
                // SAFETY: the sim is only ever reached through this pointer, by reference; it is never moved, and
                // `sqd_sim_free` drops it in place.
                *out = Box::into_raw(unsafe { Pin::into_inner_unchecked(sim) });
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// Frees a sim and every MR, CQ, QP, SRQ and channel made on it. NULL is a no-op (returns 0). Every pointer
/// obtained from it dangles afterwards; registered memory is no longer touched. No other call may use the sim
/// concurrently.
///
/// Returns 0, or `-EBUSY` while any of its CQs, QPs or SRQs is still held by a library handle (`sqd_cq`,
/// `sqd_queue`, `sqd_srq`): free those first. The sim is then left as it was, still valid.
#[no_mangle]
pub extern "C" fn sqd_sim_free(sim: *mut SimDevice) -> c_int {
    ffi_boundary!({
        let Some(dev) = sim_ref(sim) else { return 0 };
        let held = dev.held_count();
        if held > 0 {
            return fail(&Error::new(
                libc::EBUSY,
                format!("{held} object(s) of the sim are still managed (sqd_cq, sqd_queue, sqd_srq): free those first"),
            ));
        }
        // SAFETY: a non-NULL `sim` came from `sqd_sim_new` (Box::into_raw) and is freed once, here.
        drop(unsafe { Box::from_raw(sim) });
        0
    })
}

/// The sim's `struct ibv_context`, owned by the sim (valid until `sqd_sim_free`). Only the data-path ops are
/// set; other verbs (`ibv_create_qp`, `ibv_reg_mr`, `ibv_modify_qp`, ...) must not be called on it: use the
/// `sqd_sim_*` equivalents. NULL if `sim` is NULL.
#[no_mangle]
pub extern "C" fn sqd_sim_context(sim: *const SimDevice) -> *mut ibv_context {
    sim_ref(sim).map_or(std::ptr::null_mut(), |s| s.context())
}

/// The sim's protection domain, owned by the sim (valid until `sqd_sim_free`). NULL if `sim` is NULL.
#[no_mangle]
pub extern "C" fn sqd_sim_pd(sim: *const SimDevice) -> *mut ibv_pd {
    sim_ref(sim).map_or(std::ptr::null_mut(), |s| s.pd())
}

/// Registers `len` bytes at `addr` with `access` (`IBV_ACCESS_*`), as `ibv_reg_mr` does, and stores a real
/// `struct ibv_mr` (`lkey`, `rkey` (equal, never reused), `addr`, `length`, `context`, `pd`) in `*out`.
///
/// The memory must stay valid (and writable, with a write permission) until the MR is deregistered or the sim
/// freed: the model reads and writes it (DMA) inside `ibv_poll_cq` and `sqd_sim_step`. The sim owns the MR.
/// Errors: `-EINVAL` for a NULL `sim`/`out`, a NULL `addr` with `len` > 0, negative `access`, or a remote
/// write/atomic permission without `IBV_ACCESS_LOCAL_WRITE`.
#[no_mangle]
pub extern "C" fn sqd_sim_reg_mr(sim: *const SimDevice, addr: *mut c_void, len: usize, access: c_int, out: *mut *mut ibv_mr) -> c_int {
    ffi_boundary!({
        let sim = try_ref!(sim, "sim");
        let out = try_mut!(out, "out");
        if access < 0 {
            return fail(&Error::invalid(format!("access {access} is negative")));
        }
        // SAFETY: the caller keeps the memory valid while registered, as documented above.
        match unsafe { sim.reg_mr(addr, len, access as u32) } {
            Ok(mr) => {
                *out = mr;
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// Deregisters an MR made by `sqd_sim_reg_mr`, as `ibv_dereg_mr` does: its keys are invalid at once (a later
/// DMA through them — e.g. a retransmission — fails with `IBV_WC_LOC_PROT_ERR`), and `mr` dangles. If a send
/// WQE the HCA is not finished with references it, an "MR invalidated while in use" violation is logged.
/// Errors: `-EINVAL` if `mr` is NULL or not a live sim MR.
#[no_mangle]
pub extern "C" fn sqd_sim_dereg_mr(mr: *mut ibv_mr) -> c_int {
    ffi_boundary!({
        // SAFETY: `mr` is NULL or a live MR made by `sqd_sim_reg_mr`, whose sim is alive, as documented.
        match unsafe { SimDevice::from_mr(mr) } {
            Ok(sim) => status(sim.dereg_mr(mr)),
            Err(e) => fail(&e),
        }
    })
}

/// Creates a CQ holding exactly `cqe` CQEs (`cq->cqe == cqe`). A CQE pushed into a full CQ is lost, the CQ and
/// every QP using it go to error, and a "CQ overrun" violation is logged.
///
/// On success stores the CQ in `*out` and returns 0; the sim owns it. Errors: `-EINVAL` for a NULL argument or
/// `cqe` outside 1..=4194304.
#[no_mangle]
pub extern "C" fn sqd_sim_create_cq(sim: *const SimDevice, cqe: c_int, out: *mut *mut ibv_cq) -> c_int {
    ffi_boundary!({
        let sim = try_ref!(sim, "sim");
        let out = try_mut!(out, "out");
        match sim.create_cq(cqe) {
            Ok(cq) => {
                *out = cq;
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// Resizes a CQ as `ibv_resize_cq` does: it holds `cqe` CQEs from now on (1..=4194304) and `cq->cqe` says so.
/// Tell a `struct sqd_cq` managing it with `sqd_cq_update_capacity`. Errors: `-EINVAL` if `cq` is NULL or not a
/// live sim CQ, or `cqe` is out of range or below the CQEs the CQ holds now.
#[no_mangle]
pub extern "C" fn sqd_sim_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    ffi_boundary!({
        // SAFETY: `cq` is NULL or a live CQ made by `sqd_sim_create_cq`, whose sim is alive, as documented.
        match unsafe { SimDevice::from_cq(cq) } {
            Ok(sim) => status(sim.resize_cq(cq, cqe)),
            Err(e) => fail(&e),
        }
    })
}

/// Destroys a CQ made by `sqd_sim_create_cq` or `sqd_sim_create_cq_ex`; its completion events still queued on
/// its channel are discarded. Errors: `-EINVAL` if `cq` is NULL or not a live sim CQ; `-EBUSY` while a QP uses
/// it, or while completion events taken for it are not all acknowledged (`sqd_sim_ack_cq_events`; libibverbs'
/// `ibv_destroy_cq` would wait for them), or while an `sqd_cq` manages it (`sqd_cq_free` it first). On success
/// `cq` dangles.
#[no_mangle]
pub extern "C" fn sqd_sim_destroy_cq(cq: *mut ibv_cq) -> c_int {
    ffi_boundary!({
        // SAFETY: `cq` is NULL or a live CQ made by `sqd_sim_create_cq`, whose sim is alive, as documented.
        match unsafe { SimDevice::from_cq(cq) } {
            Ok(sim) => status(sim.destroy_cq(cq)),
            Err(e) => fail(&e),
        }
    })
}

/// Creates an RC QP from `attr`, as `ibv_create_qp` does: `qp_type` must be `IBV_QPT_RC`, `send_cq`/`recv_cq`
/// CQs of this sim, `srq` NULL or an SRQ of this sim (`sqd_sim_create_srq`): the QP then takes its receives
/// from the SRQ, oldest first, and has no receive queue of its own (`ibv_post_recv` on it fails with `EINVAL`;
/// `attr->cap.max_recv_wr`/`max_recv_sge` are written back as 0). Caps are honoured, clamped to the device
/// limits (WRs 1..=32768, SGEs 1..=32, inline 0..=1024), and the granted caps are written back to `attr->cap`.
/// `sq_sig_all` makes every send WR signaled.
///
/// The QP starts in INIT (receives may be posted; sends fail with `EINVAL` until `sqd_sim_connect`); in null
/// mode it starts in RTS. On success stores the QP in `*out`; the sim owns it.
/// Errors: `-EINVAL` for a NULL argument, a QP type other than RC, or CQs or an SRQ not of this sim.
#[no_mangle]
pub extern "C" fn sqd_sim_create_qp(sim: *const SimDevice, attr: *mut ibv_qp_init_attr, out: *mut *mut ibv_qp) -> c_int {
    ffi_boundary!({
        let sim = try_ref!(sim, "sim");
        let attr = try_mut!(attr, "attr");
        let out = try_mut!(out, "out");
        match sim.create_qp(attr) {
            Ok(qp) => {
                *out = qp;
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// Connects two QPs of the same sim to each other and moves both to RTS, as both sides' `ibv_modify_qp` to
/// RTR and RTS would. `attr` (read during the call) applies to both; NULL means the defaults: `rnr_retry` 7
/// (forever), `retry_cnt` 7, `max_rd_atomic` 4.
/// Errors: `-EINVAL` for NULL or foreign QPs, QPs of different sims, the same QP twice, a QP already connected
/// or in error, or attributes out of range (`rnr_retry`, `retry_cnt` 0..=7; `max_rd_atomic` 1..=16).
#[no_mangle]
pub extern "C" fn sqd_sim_connect(a: *mut ibv_qp, b: *mut ibv_qp, attr: *const SimConnAttr) -> c_int {
    ffi_boundary!({
        // SAFETY: a non-NULL `attr` points to a readable `struct sqd_sim_conn_attr`, as documented.
        let attr = unsafe { attr.as_ref() }.copied().unwrap_or_default();
        let (da, db) = match (qp_device(a), qp_device(b)) {
            (Ok(da), Ok(db)) => (da, db),
            (Err(e), _) | (_, Err(e)) => return fail(&e),
        };
        if !std::ptr::eq(da, db) {
            return fail(&Error::invalid("the two QPs belong to different sims"));
        }
        status(da.connect(a, b, &attr))
    })
}

/// Moves a QP to the error state, as `ibv_modify_qp` to `IBV_QPS_ERR` does: every send WQE the HCA is not
/// finished with, then every posted receive, completes with its own `IBV_WC_WR_FLUSH_ERR` CQE, in order,
/// signaled or not; later posts are accepted and flushed at once. Its peer is not told (its requests to this
/// QP go unanswered). Errors: `-EINVAL` if `qp` is NULL or not a live sim QP.
#[no_mangle]
pub extern "C" fn sqd_sim_set_error(qp: *mut ibv_qp) -> c_int {
    ffi_boundary!({
        match qp_device(qp) {
            Ok(sim) => status(sim.set_error(qp)),
            Err(e) => fail(&e),
        }
    })
}

/// Makes the HCA's `post_send` refuse send WRs of `qp`, as a provider refuses a WR it does not support:
/// from now on every send WR of `qp` with `opcode` (an `enum ibv_wr_opcode` value) is refused with `errnum` (a
/// positive errno) whenever it is posted: `post_send` returns it with `*bad_wr` at that WR, and it and the WRs
/// after it in that chain are not posted. No violation is recorded. `errnum` 0 lifts the refusal of `opcode`.
///
/// Errors: `-EINVAL` if `qp` is NULL or not a live sim QP, or `errnum` is outside 0..=4095.
#[no_mangle]
pub extern "C" fn sqd_sim_refuse_opcode(qp: *mut ibv_qp, opcode: u32, errnum: c_int) -> c_int {
    ffi_boundary!({
        match qp_device(qp) {
            Ok(sim) => status(sim.refuse_opcode(qp, opcode, errnum)),
            Err(e) => fail(&e),
        }
    })
}

/// Destroys a QP made by `sqd_sim_create_qp`, whatever it holds; its CQEs not yet polled are removed from its
/// CQs. Errors: `-EINVAL` if `qp` is NULL or not a live sim QP; `-EBUSY` while an `sqd_queue` manages it
/// (`sqd_queue_free` it first). On success `qp` dangles.
#[no_mangle]
pub extern "C" fn sqd_sim_destroy_qp(qp: *mut ibv_qp) -> c_int {
    ffi_boundary!({
        match qp_device(qp) {
            Ok(sim) => status(sim.destroy_qp(qp)),
            Err(e) => fail(&e),
        }
    })
}

/// Advances the model by `steps` steps (transmissions, wire, responders, ACKs, timers, completions).
/// `ibv_poll_cq` also advances it (`steps_per_poll` per call). Errors: `-EINVAL` if `sim` is NULL.
#[no_mangle]
pub extern "C" fn sqd_sim_step(sim: *const SimDevice, steps: u32) -> c_int {
    ffi_boundary!({
        let Some(sim) = sim_ref(sim) else { return null_sim() };
        sim.step(steps);
        0
    })
}

/// Runs steps until nothing is in flight: no send WQE waiting to be transmitted, acknowledged or completed on
/// a connected QP, no packet on the wire, no ACK pending. CQEs not yet polled do not count.
/// Returns the number of steps run (>= 0, saturating at INT_MAX). Errors: `-EINVAL` if `sim` is NULL;
/// `-ETIMEDOUT` after `max_steps` steps (e.g. an RNR retry that never ends).
#[no_mangle]
pub extern "C" fn sqd_sim_run_until_idle(sim: *const SimDevice, max_steps: u32) -> c_int {
    ffi_boundary!({
        let Some(sim) = sim_ref(sim) else { return null_sim() };
        match sim.run_until_idle(max_steps) {
            Ok(n) => c_int::try_from(n).unwrap_or(c_int::MAX),
            Err(e) => fail(&e),
        }
    })
}

/// Injects a fault (`f` is read during the call): `SQD_SIM_FAULT_QP_FATAL` (the QP fails at step
/// `at_step`), `SQD_SIM_FAULT_REMOTE_ACCESS` (its next request fails the peer's rkey check),
/// `SQD_SIM_FAULT_RECV_STARVE` (its posted receives are withheld for `count` steps), `SQD_SIM_FAULT_FAIL_NEXT`
/// (its next send WQE fails at transmission with `status`/`vendor_err`), `SQD_SIM_FAULT_LOSE_REQUESTS` /
/// `SQD_SIM_FAULT_LOSE_ACKS` (its next `count` request / response packets are lost).
/// Errors: `-EINVAL` for a NULL argument, an unknown kind, a QP not of this sim, or `FAIL_NEXT` with
/// `IBV_WC_SUCCESS`.
#[no_mangle]
pub extern "C" fn sqd_sim_inject(sim: *const SimDevice, f: *const SimFault) -> c_int {
    ffi_boundary!({
        let Some(sim) = sim_ref(sim) else { return null_sim() };
        let f = try_ref!(f, "f");
        status(sim.inject(f))
    })
}

/// Oracle: 1 if any send WQE the HCA is not truly finished with (it could still be transmitted or
/// retransmitted — not yet acknowledged and completed — or, for RDMA READ/atomics, still be written) references
/// bytes of `[addr, addr + len)` through its SGEs, else 0. Inline data never counts (copied at post time).
/// Errors: `-EINVAL` if `sim` is NULL.
#[no_mangle]
pub extern "C" fn sqd_sim_buffer_busy(sim: *const SimDevice, addr: *const c_void, len: usize) -> c_int {
    ffi_boundary!({
        let Some(sim) = sim_ref(sim) else { return null_sim() };
        c_int::from(sim.buffer_busy(addr, len))
    })
}

/// Oracle: 1 if the HCA is finished with the `wqe_index`-th send WQE posted on `qp` (0 = first ever posted;
/// refused posts do not count), 0 if not. Errors: `-EINVAL` if `qp` is NULL or not a live sim QP; `-ENOENT`
/// beyond the last posted WQE.
#[no_mangle]
pub extern "C" fn sqd_sim_wqe_finished(qp: *mut ibv_qp, wqe_index: u64) -> c_int {
    ffi_boundary!({
        match qp_device(qp).and_then(|sim| sim.wqe_finished(qp, wqe_index)) {
            Ok(done) => c_int::from(done),
            Err(e) => fail(&e),
        }
    })
}

/// Copies the sim's counters into `*out` and returns 0. Errors: `-EINVAL` for a NULL argument.
#[no_mangle]
pub extern "C" fn sqd_sim_stats(sim: *const SimDevice, out: *mut SimStats) -> c_int {
    ffi_boundary!({
        let Some(sim) = sim_ref(sim) else { return null_sim() };
        let out = try_mut!(out, "out");
        *out = sim.stats();
        0
    })
}

/// The number of violations logged (>= 0). Errors: `-EINVAL` if `sim` is NULL.
#[no_mangle]
pub extern "C" fn sqd_sim_violation_count(sim: *const SimDevice) -> c_int {
    ffi_boundary!({
        let Some(sim) = sim_ref(sim) else { return null_sim() };
        c_int::try_from(sim.violation_count()).unwrap_or(c_int::MAX)
    })
}

/// Copies the `index`-th violation (0 = oldest) into `*out` and returns 0.
/// Errors: `-EINVAL` for a NULL argument; `-ENOENT` if fewer than `index + 1` were logged.
#[no_mangle]
pub extern "C" fn sqd_sim_violation(sim: *const SimDevice, index: usize, out: *mut SimViolationRecord) -> c_int {
    ffi_boundary!({
        let Some(sim) = sim_ref(sim) else { return null_sim() };
        let out = try_mut!(out, "out");
        let Some(v) = sim.violation(index) else {
            return fail(&Error::new(
                libc::ENOENT,
                format!("violation {index} does not exist ({} logged)", sim.violation_count()),
            ));
        };
        let mut text = [0 as c_char; SQD_SIM_VIOLATION_TEXT];
        for (dst, src) in text.iter_mut().zip(v.text.bytes().take(SQD_SIM_VIOLATION_TEXT - 1)) {
            *dst = src as c_char;
        }
        *out = SimViolationRecord {
            kind: v.kind,
            qp_num: v.qp_num,
            wqe_index: v.wqe_index.unwrap_or(SQD_SIM_NO_WQE),
            step: v.step,
            text,
        };
        0
    })
}

/// The name of a violation kind (`"SQ overflow"`, `"CQ overrun"`, `"source modified while in flight"`,
/// `"MR invalidated while in use"`, ...), or `"unknown"`: a static NUL-terminated string, never NULL.
#[no_mangle]
pub extern "C" fn sqd_sim_violation_kind_str(kind: u32) -> *const c_char {
    let s: &'static str = match violation_kind_str(kind) {
        "SQ overflow" => "SQ overflow\0",
        "RQ overflow" => "RQ overflow\0",
        "CQ overrun" => "CQ overrun\0",
        "source modified while in flight" => "source modified while in flight\0",
        "MR invalidated while in use" => "MR invalidated while in use\0",
        "invalid WR" => "invalid WR\0",
        "post to a QP not ready to send" => "post to a QP not ready to send\0",
        _ => "unknown\0",
    };
    s.as_ptr().cast()
}

/// Creates a CQ as `ibv_create_cq` does: `cqe` CQEs (1..=4194304, `cq->cqe == cqe`), on completion channel
/// `channel` (NULL: none; else made by `sqd_sim_create_comp_channel` on this sim: its `refcnt` counts the CQ),
/// with `cq_context` (stored in `cq->cq_context`, returned by `sqd_sim_get_cq_event`) and `comp_vector` (the sim
/// has one: 0). `ibv_req_notify_cq(cq, solicited_only)` then arms it: the next CQE added (any, or with
/// `solicited_only` a receive of a message sent with `IBV_SEND_SOLICITED` or an unsuccessful one) disarms it and
/// queues one completion event on the channel. CQEs already in the CQ when it is armed do not fire it: arm,
/// then poll once more before sleeping.
///
/// On success stores the CQ in `*out` and returns 0; the sim owns it. Errors: `-EINVAL` for a NULL `sim`/`out`,
/// `cqe` out of range, a channel not of this sim, `comp_vector` other than 0.
#[no_mangle]
pub extern "C" fn sqd_sim_create_cq_ex(
    sim: *const SimDevice,
    cqe: c_int,
    channel: *mut ibv_comp_channel,
    cq_context: *mut c_void,
    comp_vector: c_int,
    out: *mut *mut ibv_cq,
) -> c_int {
    ffi_boundary!({
        let sim = try_ref!(sim, "sim");
        let out = try_mut!(out, "out");
        match sim.create_cq_ex(cqe, channel, cq_context, comp_vector) {
            Ok(cq) => {
                *out = cq;
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// Creates a completion channel, as `ibv_create_comp_channel` does: a real `struct ibv_comp_channel` (`context`,
/// `fd`, `refcnt`) whose `fd` is a nonblocking eventfd, readable exactly while completion events are queued on
/// the channel: wait on it with poll/epoll/select, then take the events with `sqd_sim_get_cq_event`. Never
/// `read(2)` the fd, and do not call libibverbs' `ibv_get_cq_event`/`ibv_ack_cq_events` on it (they need a
/// kernel device): use `sqd_sim_get_cq_event`/`sqd_sim_ack_cq_events`.
///
/// On success stores the channel in `*out` and returns 0; the sim owns it (freed by `sqd_sim_free` if not
/// destroyed). Errors: `-EINVAL` for a NULL argument; `-EMFILE`/`-ENFILE` when no fd is left.
#[no_mangle]
pub extern "C" fn sqd_sim_create_comp_channel(sim: *const SimDevice, out: *mut *mut ibv_comp_channel) -> c_int {
    ffi_boundary!({
        let sim = try_ref!(sim, "sim");
        let out = try_mut!(out, "out");
        match sim.create_comp_channel() {
            Ok(ch) => {
                *out = ch;
                0
            }
            Err(e) => fail(&e),
        }
    })
}

fn channel_device<'a>(channel: *mut ibv_comp_channel) -> crate::Result<&'a SimDevice> {
    if channel.is_null() {
        return Err(Error::invalid("channel is NULL"));
    }
    // SAFETY: every function taking a channel documents that it must be NULL or a live channel made by
    // `sqd_sim_create_comp_channel`, whose sim is alive for the duration of the call.
    let sim = unsafe { SimDevice::from_context((*channel).context) }.ok_or_else(|| Error::invalid("channel does not belong to a sim"))?;
    if !sim.owns_comp_channel(channel) {
        return Err(Error::invalid(format!("channel {channel:p} is not a live channel of its sim")));
    }
    Ok(sim)
}

/// Destroys a completion channel made by `sqd_sim_create_comp_channel`; its fd is closed and `channel` dangles.
/// Errors: `-EINVAL` for NULL or a channel not of a sim; `-EBUSY` while a CQ uses it (as
/// `ibv_destroy_comp_channel`).
#[no_mangle]
pub extern "C" fn sqd_sim_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    ffi_boundary!({
        match channel_device(channel) {
            Ok(sim) => status(sim.destroy_comp_channel(channel)),
            Err(e) => fail(&e),
        }
    })
}

/// Takes the oldest completion event queued on `channel`, without blocking (the non-blocking form of
/// `ibv_get_cq_event`): stores the CQ it is for in `*cq` and that CQ's `cq_context` in `*cq_context`, returns 0.
/// Every event taken must be acknowledged with `sqd_sim_ack_cq_events` before the CQ is destroyed.
/// Errors: `-EAGAIN` when none is queued (the channel's fd is then not readable: sleep on it); `-EINVAL` for a
/// NULL argument or a channel not of a sim.
///
/// Time: the sim advances only inside `ibv_poll_cq` (`steps_per_poll`), `sqd_sim_step` and
/// `sqd_sim_run_until_idle`. A ULP that sleeps on the fd needs something else to advance time while it sleeps:
/// typically a driver thread calling `sqd_sim_step(sim, 1)` in a loop (the sim is thread-safe).
#[no_mangle]
pub extern "C" fn sqd_sim_get_cq_event(channel: *mut ibv_comp_channel, cq: *mut *mut ibv_cq, cq_context: *mut *mut c_void) -> c_int {
    ffi_boundary!({
        let cq = try_mut!(cq, "cq");
        let cq_context = try_mut!(cq_context, "cq_context");
        match channel_device(channel).and_then(|sim| sim.get_cq_event(channel)) {
            Ok((c, ctx)) => {
                *cq = c;
                *cq_context = ctx;
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// Acknowledges `nevents` completion events taken for `cq` with `sqd_sim_get_cq_event` (as `ibv_ack_cq_events`;
/// `cq->comp_events_completed` counts them). `sqd_sim_destroy_cq` fails with `-EBUSY` while some are
/// unacknowledged. Errors: `-EINVAL` for a CQ not of a sim, or more events than are unacknowledged.
#[no_mangle]
pub extern "C" fn sqd_sim_ack_cq_events(cq: *mut ibv_cq, nevents: u32) -> c_int {
    ffi_boundary!({
        // SAFETY: `cq` is NULL or a live CQ made by a sim, whose sim is alive, as documented.
        match unsafe { SimDevice::from_cq(cq) } {
            Ok(sim) => status(sim.ack_cq_events(cq, nevents)),
            Err(e) => fail(&e),
        }
    })
}

/// Takes the oldest asynchronous event of the sim, without blocking (the sim's `ibv_get_async_event`; the
/// libibverbs function reads a kernel fd and cannot be used): fills `out->element` (`cq`, `qp` or `srq`, per
/// the type) and `out->event_type`, returns 0. The sim raises: `IBV_EVENT_CQ_ERR` (a CQ overran; it takes no
/// more CQEs), `IBV_EVENT_QP_FATAL` (a QP went to error with no CQE of its own to say so: an injected fatal
/// error, or its CQ overran), `IBV_EVENT_QP_LAST_WQE_REACHED` (a QP on an SRQ went to error and completed its
/// last receive), `IBV_EVENT_SRQ_LIMIT_REACHED` (an armed SRQ limit was crossed), `IBV_EVENT_SRQ_ERR` (an SRQ
/// failed). Events need no acknowledgement; events naming an object are discarded when it is destroyed.
/// Errors: `-EAGAIN` when none is pending; `-EINVAL` for a NULL argument.
#[no_mangle]
pub extern "C" fn sqd_sim_get_async_event(sim: *const SimDevice, out: *mut ibv_async_event) -> c_int {
    ffi_boundary!({
        let Some(sim) = sim_ref(sim) else { return null_sim() };
        let out = try_mut!(out, "out");
        let Some(ev) = sim.get_async_event() else {
            return fail(&Error::new(libc::EAGAIN, "no asynchronous event is pending"));
        };
        let element = match ev.element {
            AsyncElement::Cq(cq) => ibv_async_event_element_t { cq },
            AsyncElement::Qp(qp) => ibv_async_event_element_t { qp },
            AsyncElement::Srq(srq) => ibv_async_event_element_t { srq },
        };
        *out = ibv_async_event { element, event_type: ev.event_type };
        0
    })
}

/// A file descriptor (nonblocking eventfd, owned by the sim) that is readable exactly while asynchronous events
/// are pending, for poll/epoll/select; take the events with `sqd_sim_get_async_event`, never `read(2)` it.
/// Errors: `-EINVAL` if `sim` is NULL.
#[no_mangle]
pub extern "C" fn sqd_sim_async_fd(sim: *const SimDevice) -> c_int {
    ffi_boundary!({
        let Some(sim) = sim_ref(sim) else { return null_sim() };
        sim.async_fd()
    })
}

/// Creates a shared receive queue, as `ibv_create_srq` does: a real `struct ibv_srq` (`context`, `pd`,
/// `srq_context` from `attr`). `attr->attr.max_wr` (1..=32768) and `attr->attr.max_sge` (1..=32) are clamped and
/// written back; `attr->attr.srq_limit` is ignored (arm it with `sqd_sim_modify_srq_limit`). Post receives with
/// libibverbs' `ibv_post_srq_recv` (the context's `post_srq_recv` op): a chain is taken in order up to the first
/// WR refused (`ENOMEM` when `max_wr` receives are held — a receive's slot is freed when its CQE is polled —,
/// `EINVAL` for a bad SGE count or an SRQ in error), `*bad_wr` at it.
///
/// On success stores the SRQ in `*out` and returns 0; the sim owns it. Errors: `-EINVAL` for a NULL argument.
#[no_mangle]
pub extern "C" fn sqd_sim_create_srq(sim: *const SimDevice, attr: *mut ibv_srq_init_attr, out: *mut *mut ibv_srq) -> c_int {
    ffi_boundary!({
        let sim = try_ref!(sim, "sim");
        let attr = try_mut!(attr, "attr");
        let out = try_mut!(out, "out");
        match sim.create_srq(attr) {
            Ok(srq) => {
                *out = srq;
                0
            }
            Err(e) => fail(&e),
        }
    })
}

fn srq_device<'a>(srq: *mut ibv_srq) -> crate::Result<&'a SimDevice> {
    if srq.is_null() {
        return Err(Error::invalid("srq is NULL"));
    }
    // SAFETY: every function taking an SRQ documents that it must be NULL or a live SRQ made by
    // `sqd_sim_create_srq`, whose sim is alive for the duration of the call.
    let sim = unsafe { SimDevice::from_context((*srq).context) }.ok_or_else(|| Error::invalid("srq does not belong to a sim"))?;
    if !sim.owns_srq(srq) {
        return Err(Error::invalid(format!("srq {srq:p} is not a live SRQ of its sim")));
    }
    Ok(sim)
}

/// Destroys an SRQ; receives still posted on it never complete, and `srq` dangles.
/// Errors: `-EINVAL` for NULL or an SRQ not of a sim; `-EBUSY` while a QP uses it or an `sqd_srq` manages it
/// (`sqd_srq_free` it first).
#[no_mangle]
pub extern "C" fn sqd_sim_destroy_srq(srq: *mut ibv_srq) -> c_int {
    ffi_boundary!({
        match srq_device(srq) {
            Ok(sim) => status(sim.destroy_srq(srq)),
            Err(e) => fail(&e),
        }
    })
}

/// Sets the SRQ's limit, as `ibv_modify_srq` with `IBV_SRQ_LIMIT`: a nonzero `limit` arms it — when a QP takes
/// a receive and fewer than `limit` receives remain posted, the sim raises one `IBV_EVENT_SRQ_LIMIT_REACHED`
/// and disarms it (`ibv_modify_srq(3)`, `ibv_query_srq(3)`: 0 means not armed); 0 disarms.
/// Errors: `-EINVAL` for NULL, an SRQ not of a sim, or `limit` above the SRQ's `max_wr`.
#[no_mangle]
pub extern "C" fn sqd_sim_modify_srq_limit(srq: *mut ibv_srq, limit: u32) -> c_int {
    ffi_boundary!({
        match srq_device(srq) {
            Ok(sim) => status(sim.modify_srq_limit(srq, limit)),
            Err(e) => fail(&e),
        }
    })
}

/// Fault: the SRQ fails (a catastrophic SRQ error). The sim raises `IBV_EVENT_SRQ_ERR`; the SRQ hands out no
/// more receives and refuses posts; every QP on it goes to error (its send WQEs flush) and gets
/// `IBV_EVENT_QP_LAST_WQE_REACHED`. Errors: `-EINVAL` for NULL or an SRQ not of a sim.
#[no_mangle]
pub extern "C" fn sqd_sim_srq_set_error(srq: *mut ibv_srq) -> c_int {
    ffi_boundary!({
        match srq_device(srq) {
            Ok(sim) => status(sim.srq_set_error(srq)),
            Err(e) => fail(&e),
        }
    })
}
