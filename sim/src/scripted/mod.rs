//! A scripted verbs device for tests.
//!
//! [`ScriptedDevice`] owns a real `struct ibv_context` whose ops table (`post_send`, `post_recv`, `poll_cq`,
//! `req_notify_cq`) points into a model, plus a `struct ibv_pd`, and makes real `struct ibv_cq` and
//! `struct ibv_qp` objects. Unmodified verbs code (libibverbs' inline `ibv_post_send`, `ibv_poll_cq`, ... which
//! call through `qp->context->ops`) and the library itself drive it exactly as they would drive a provider.
//! It also registers memory ([`ScriptedDevice::reg_mr`]): real `struct ibv_mr` objects with distinct keys,
//! which the library's deferred deregistration frees through the device (sqdisc's `verbs::control`).
//! Nothing executes by itself: the test scripts what the "HCA" does next ([`ScriptedDevice::complete`],
//! [`ScriptedDevice::fail`], [`ScriptedDevice::set_error`], [`ScriptedDevice::deliver`]) and then inspects the
//! result ([`ScriptedDevice::qp_stats`], [`ScriptedDevice::cq_stats`], [`ScriptedDevice::wqe`], the violation
//! log).
//!
//! Model rules (those of the hardware the library must be correct on):
//!
//! - **SQ slots follow mlx5**: a send WQE holds its slot from post until a CQE at or after it on that SQ is
//!   *polled*. Executing a WQE or generating its CQE frees nothing; unsignaled WQEs are freed only by a later
//!   signaled one's polled CQE, so a ULP that never signals fills the SQ for good. Posting into a full SQ
//!   returns `ENOMEM` with `*bad_wr` at the first WR not taken (the earlier WRs of the chain stay posted) and is
//!   logged as a violation "SQ overflow".
//! - WRs are checked against the QP's caps: `num_sge > max_send_sge`, inline data beyond `max_inline_data`, a
//!   NULL `sg_list` or an opcode an RC QP cannot post: `EINVAL` and a violation.
//! - **Refusals** on request ([`ScriptedDevice::refuse_opcode`]): send WRs of a chosen opcode are refused at post
//!   time with a chosen errno, as a provider refuses a WR it does not support (no violation: the provider's right).
//! - **Errors**: a failed WQE completes with its error status whether signaled or not; the QP moves to the
//!   error state and every later send WQE, then every posted receive, flushes with its own
//!   `IBV_WC_WR_FLUSH_ERR` CQE, in order. A WR posted to a QP in the error state is accepted and flushed at once.
//!   On error and flush CQEs only `wr_id`, `status`, `qp_num` and `vendor_err` are meaningful; `opcode` and
//!   `byte_len` hold `0xffffffff` to catch users who read them.
//! - **CQs** are FIFOs of capacity `cqe`. A CQE pushed into a full CQ is lost, the CQ is marked in error and the
//!   overrun is logged as a violation "CQ overrun". A CQ may be shared by any QPs and by both sides of one QP.
//! - Receives hold a slot (up to `max_recv_wr`) until their CQE is polled; beyond: `ENOMEM` and "RQ overflow".
//!
//! Granted sizes are exactly the requested ones (`cq->cqe` = the `cqe` asked for; caps as given). The device
//! keeps every send WQE ever posted for inspection, so it is meant for tests, not long benchmarks.
//!
//! The scripting and inspection surface is the [`Scriptable`] trait (defined with the software HCA, which
//! implements it too), so that tests written against it run unchanged on the fuller device model. The C functions (`sqd_scripted_*`) are in `capi::scripted`, with the `capi` feature.
//!
//! Threading: a device and its objects are used by one thread at a time (`ScriptedDevice` is neither `Send`
//! nor `Sync`). The ops callbacks never call back into user code, so the model's `RefCell` is never borrowed
//! re-entrantly.

mod model;
mod ops;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::marker::PhantomPinned;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use rdma_sys::{ibv_context, ibv_cq, ibv_device, ibv_mr, ibv_pd, ibv_qp, ibv_qp_state, ibv_qp_type};

use crate::held::HeldObjects;
pub use crate::scriptable::{Scriptable, ScriptedCqStats, ScriptedQpCaps, ScriptedQpStats, ScriptedWqe};
use sqdisc_device::DeviceOps;
use crate::context::{ContextMark, ContextObj};
use crate::{Error, Result};
use model::Model;

/// A scripted device's context (see `context.rs`).
static SENTINEL: u8 = 0;
const CONTEXT_MARK: ContextMark = ContextMark { sentinel: &SENTINEL, magic: 0x7371_645f_7363_7270 }; // "sqd_scrp"

/// Every live scripted MR (by address) and the address of the device that registered it, so that an MR can be
/// recognised, and traced to its device, without reading memory it points to. A device removes its entries
/// when an MR is deregistered and when it is dropped.
static LIVE_MRS: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());

fn live_mrs() -> std::sync::MutexGuard<'static, BTreeMap<usize, usize>> {
    LIVE_MRS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The deregistration the device registers with [`sqdisc_device::register`]: what
/// `sqd_scripted_dereg_mr` does, as 0 or a positive errno.
///
/// # Safety
/// The device that registered `mr`, if any, is alive and not in use by another thread.
unsafe extern "C" fn dereg_for_library(_device: *mut std::ffi::c_void, mr: *mut ibv_mr) -> i32 {
    // SAFETY: as this function's caller promises.
    match unsafe { ScriptedDevice::from_mr(mr) }.and_then(|dev| dev.dereg_mr(mr)) {
        Ok(()) => 0,
        Err(e) => e.errno(),
    }
}

/// A scripted verbs device: a real `struct ibv_context` and `struct ibv_pd`, and the CQs and QPs made on it.
///
/// The context's ops callbacks find the device through a pointer to it, so it never moves (it is made
/// pinned). Freeing it frees every object it made. Not thread-safe: one thread at a time per device.
pub struct ScriptedDevice {
    ctx: *mut ContextObj<ScriptedDevice>,
    pd: *mut ibv_pd,
    ibdev: *mut ibv_device,
    model: RefCell<Model>,
    /// The CQs and QPs the library's handles hold (told through the device seam): not destroyed while held.
    held: Arc<HeldObjects>,
    _pinned: PhantomPinned,
}

impl ScriptedDevice {
    /// A new device with no CQs or QPs. Panics if the device cannot be registered with the library (out of
    /// memory): see [`ScriptedDevice::try_new`].
    pub fn new() -> Pin<Box<ScriptedDevice>> {
        ScriptedDevice::try_new().unwrap_or_else(|e| panic!("cannot make a scripted device: {e}"))
    }

    /// A new device with no CQs or QPs; `ENOMEM` if it cannot be registered with the library.
    pub fn try_new() -> Result<Pin<Box<ScriptedDevice>>> {
        // SAFETY: `ibv_device` is plain data (integers, char arrays, nullable fn pointers): zero is valid.
        let mut ibdev: Box<ibv_device> = Box::new(unsafe { std::mem::zeroed() });
        for (dst, src) in ibdev.name.iter_mut().zip(b"sqd_scripted0".iter()) {
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
        let ctx = ContextObj::boxed(ctx, &CONTEXT_MARK);
        let pd = Box::into_raw(Box::new(ibv_pd { context: ctx.cast(), handle: 1 }));

        let device = Box::pin(ScriptedDevice {
            ctx,
            pd,
            ibdev,
            model: RefCell::new(Model::new()),
            held: HeldObjects::new(),
            _pinned: PhantomPinned,
        });
        // SAFETY: `ctx` came from `boxed` above and is owned by `device`; nothing else refers to it yet. The
        // device is pinned and frees the context when it is dropped.
        unsafe { ContextObj::tie(ctx, &*device) };
        let ops = DeviceOps { dereg_mr: Some(dereg_for_library), ..DeviceOps::empty(std::ptr::null_mut()) };
        // SAFETY: `dereg_for_library` deregisters this device's MRs as `ibv_dereg_mr` would (it finds the device
        // by the MR's address and refuses MRs it does not know); `held`'s two functions outlive every hold. The
        // device unregisters in its `Drop`.
        unsafe { sqdisc_device::register(ctx.cast(), &HeldObjects::ops(&device.held, ops)) }?;
        Ok(device)
    }

    /// The device that registered `mr`. Only the address is looked up: `mr` is never read, so a pointer that is
    /// not (or no longer) a scripted MR is reported, not followed.
    ///
    /// # Safety
    /// A device found this way is alive (it removes its MRs when dropped) but not thread-safe: the caller uses it
    /// from the one thread that uses it, for no longer than `'a`, and not while it is being dropped.
    pub unsafe fn from_mr<'a>(mr: *mut ibv_mr) -> Result<&'a ScriptedDevice> {
        if mr.is_null() {
            return Err(Error::invalid("mr is NULL"));
        }
        let device = live_mrs().get(&(mr as usize)).copied();
        match device {
            // SAFETY: the map holds only devices that are alive (see above), as the caller relies on.
            Some(d) => Ok(unsafe { &*(d as *const ScriptedDevice) }),
            None => Err(Error::invalid(format!("mr {mr:p} is not a registered MR of a scripted device"))),
        }
    }

    /// The device that owns `ctx`, if `ctx` is a scripted device's context.
    ///
    /// # Safety
    /// `ctx` is NULL or points to a live `struct ibv_context`; when it is a scripted device's, that device
    /// outlives `'a`.
    pub unsafe fn from_context<'a>(ctx: *mut ibv_context) -> Option<&'a ScriptedDevice> {
        // SAFETY: as the caller promises.
        unsafe { ContextObj::device(ctx, &CONTEXT_MARK) }
    }

    /// The device that owns `qp`.
    ///
    /// # Safety
    /// `qp` is NULL or points to a live `struct ibv_qp` whose context is alive; a scripted device owning it
    /// outlives `'a`.
    pub unsafe fn from_qp<'a>(qp: *mut ibv_qp) -> Result<&'a ScriptedDevice> {
        if qp.is_null() {
            return Err(Error::invalid("qp is NULL"));
        }
        // SAFETY: as the caller promises.
        let device = unsafe { Self::from_context((*qp).context) }
            .ok_or_else(|| Error::invalid(format!("qp {qp:p} does not belong to a scripted device")))?;
        if !device.model.borrow().owns_qp(qp) {
            return Err(Error::invalid(format!("qp {qp:p} is not a live QP of its scripted device")));
        }
        Ok(device)
    }

    /// The device that owns `cq`.
    ///
    /// # Safety
    /// As [`ScriptedDevice::from_qp`], for a `struct ibv_cq`.
    pub unsafe fn from_cq<'a>(cq: *mut ibv_cq) -> Result<&'a ScriptedDevice> {
        if cq.is_null() {
            return Err(Error::invalid("cq is NULL"));
        }
        // SAFETY: as the caller promises.
        let device = unsafe { Self::from_context((*cq).context) }
            .ok_or_else(|| Error::invalid(format!("cq {cq:p} does not belong to a scripted device")))?;
        if !device.model.borrow().owns_cq(cq) {
            return Err(Error::invalid(format!("cq {cq:p} is not a live CQ of its scripted device")));
        }
        Ok(device)
    }

    pub(crate) fn model(&self) -> &RefCell<Model> {
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

    /// Makes a CQ holding `cqe` CQEs (1..=4194304); `cq->cqe` is `cqe`.
    pub fn create_cq(&self, cqe: i32) -> Result<*mut ibv_cq> {
        if !(1..=model::MAX_CQE).contains(&cqe) {
            return Err(Error::invalid(format!("cqe = {cqe} is out of range (1..={})", model::MAX_CQE)));
        }
        // SAFETY: `ibv_cq` is plain data (pointers, ints, zero-initializable pthread objects): zero is valid.
        let mut cq: Box<ibv_cq> = Box::new(unsafe { std::mem::zeroed() });
        cq.context = self.context();
        cq.cqe = cqe;
        let cq = Box::into_raw(cq);
        self.model.borrow_mut().add_cq(cq, cqe as usize);
        Ok(cq)
    }

    /// Makes an RC QP in the RTS state; see [`Scriptable::create_qp`]. `EINVAL` for caps out of range or CQs
    /// not of this device.
    pub fn create_qp(&self, send_cq: *mut ibv_cq, recv_cq: *mut ibv_cq, caps: &ScriptedQpCaps) -> Result<*mut ibv_qp> {
        let mut model = self.model.borrow_mut();
        model.check_qp_args(send_cq, recv_cq, caps)?;
        // SAFETY: `ibv_qp` is plain data (pointers, ints, zero-initializable pthread objects): zero is valid.
        let mut qp: Box<ibv_qp> = Box::new(unsafe { std::mem::zeroed() });
        qp.context = self.context();
        qp.pd = self.pd;
        qp.send_cq = send_cq;
        qp.recv_cq = recv_cq;
        qp.qp_num = model.next_qpn();
        qp.handle = qp.qp_num;
        qp.qp_type = ibv_qp_type::IBV_QPT_RC;
        qp.state = ibv_qp_state::IBV_QPS_RTS;
        let qp = Box::into_raw(qp);
        model.add_qp(qp, send_cq, recv_cq, *caps);
        Ok(qp)
    }

    /// Destroys a QP; `EBUSY` while a library handle (a managed queue) holds it.
    pub fn destroy_qp(&self, qp: *mut ibv_qp) -> Result<()> {
        self.held.check_unheld(qp, "qp", "an sqd_queue (sqd_queue_free it first)")?;
        self.model.borrow_mut().destroy_qp(qp)
    }

    /// Destroys a CQ; `EBUSY` while a QP uses it or a library handle (a managed CQ) holds it.
    pub fn destroy_cq(&self, cq: *mut ibv_cq) -> Result<()> {
        self.held.check_unheld(cq, "cq", "an sqd_cq (sqd_cq_free it first)")?;
        self.model.borrow_mut().destroy_cq(cq)
    }

    /// How many of its CQs and QPs the library's handles hold (the device is not freed while any is).
    pub fn held_count(&self) -> usize {
        self.held.count()
    }

    pub fn complete(&self, qp: *mut ibv_qp, n: usize) -> Result<usize> {
        self.model.borrow_mut().complete(qp, n)
    }

    pub fn fail(&self, qp: *mut ibv_qp, status: u32, vendor_err: u32) -> Result<()> {
        self.model.borrow_mut().fail(qp, status, vendor_err)
    }

    pub fn set_error(&self, qp: *mut ibv_qp) -> Result<()> {
        self.model.borrow_mut().set_error(qp)
    }

    pub fn deliver(&self, qp: *mut ibv_qp, byte_len: u32, imm: Option<u32>) -> Result<()> {
        self.model.borrow_mut().deliver(qp, byte_len, imm)
    }

    pub fn qp_stats(&self, qp: *mut ibv_qp) -> Result<ScriptedQpStats> {
        self.model.borrow().qp_stats(qp)
    }

    pub fn qp_caps(&self, qp: *mut ibv_qp) -> Result<ScriptedQpCaps> {
        self.model.borrow().qp_caps(qp)
    }

    pub fn cq_stats(&self, cq: *mut ibv_cq) -> Result<ScriptedCqStats> {
        self.model.borrow().cq_stats(cq)
    }

    pub fn wqe(&self, qp: *mut ibv_qp, index: usize) -> Result<ScriptedWqe> {
        self.model.borrow().wqe(qp, index)
    }

    /// See [`Scriptable::refuse_opcode`].
    pub fn refuse_opcode(&self, qp: *mut ibv_qp, opcode: u32, errno: i32) -> Result<()> {
        self.model.borrow_mut().refuse_opcode(qp, opcode, errno)
    }

    /// Registers `len` bytes at `addr`: a real `struct ibv_mr` with `context`, `pd`, `addr`, `length` and a
    /// nonzero lkey and rkey distinct from each other and from those of every other MR of the device. `access`
    /// (`enum ibv_access_flags` bits) is accepted as given: the device enforces no access rights. The device owns
    /// the MR until [`ScriptedDevice::dereg_mr`] or its own drop.
    pub fn reg_mr(&self, addr: *mut c_void, len: usize, _access: i32) -> Result<*mut ibv_mr> {
        let mut model = self.model.borrow_mut();
        let (lkey, rkey) = model.next_keys();
        // SAFETY: `ibv_mr` is plain data (pointers and integers): zero is valid.
        let mut mr: Box<ibv_mr> = Box::new(unsafe { std::mem::zeroed() });
        mr.context = self.context();
        mr.pd = self.pd;
        mr.addr = addr;
        mr.length = len;
        mr.handle = lkey;
        mr.lkey = lkey;
        mr.rkey = rkey;
        let mr = Box::into_raw(mr);
        model.add_mr(mr);
        live_mrs().insert(mr as usize, self as *const ScriptedDevice as usize);
        Ok(mr)
    }

    /// Deregisters an MR of this device (frees it). `EINVAL` if `mr` is not a registered MR of this device.
    pub fn dereg_mr(&self, mr: *mut ibv_mr) -> Result<()> {
        self.model.borrow_mut().dereg_mr(mr)?;
        live_mrs().remove(&(mr as usize));
        Ok(())
    }

    /// How many MRs are registered on the device now.
    pub fn mr_count(&self) -> usize {
        self.model.borrow().mr_count()
    }

    /// Number of violations recorded on the device.
    pub fn violation_count(&self) -> usize {
        self.model.borrow().violations().len()
    }

    /// The `index`-th violation (0 = oldest).
    pub fn violation(&self, index: usize) -> Option<String> {
        self.model.borrow().violations().get(index).cloned()
    }

    pub fn violations(&self) -> Vec<String> {
        self.model.borrow().violations().to_vec()
    }
}

impl Scriptable for ScriptedDevice {
    fn context(&self) -> *mut ibv_context {
        ScriptedDevice::context(self)
    }
    fn pd(&self) -> *mut ibv_pd {
        ScriptedDevice::pd(self)
    }
    fn create_cq(&self, cqe: i32) -> Result<*mut ibv_cq> {
        ScriptedDevice::create_cq(self, cqe)
    }
    fn create_qp(&self, send_cq: *mut ibv_cq, recv_cq: *mut ibv_cq, caps: &ScriptedQpCaps) -> Result<*mut ibv_qp> {
        ScriptedDevice::create_qp(self, send_cq, recv_cq, caps)
    }
    fn destroy_qp(&self, qp: *mut ibv_qp) -> Result<()> {
        ScriptedDevice::destroy_qp(self, qp)
    }
    fn destroy_cq(&self, cq: *mut ibv_cq) -> Result<()> {
        ScriptedDevice::destroy_cq(self, cq)
    }
    fn complete(&self, qp: *mut ibv_qp, n: usize) -> Result<usize> {
        ScriptedDevice::complete(self, qp, n)
    }
    fn fail(&self, qp: *mut ibv_qp, status: u32, vendor_err: u32) -> Result<()> {
        ScriptedDevice::fail(self, qp, status, vendor_err)
    }
    fn set_error(&self, qp: *mut ibv_qp) -> Result<()> {
        ScriptedDevice::set_error(self, qp)
    }
    fn deliver(&self, qp: *mut ibv_qp, byte_len: u32, imm: Option<u32>) -> Result<()> {
        ScriptedDevice::deliver(self, qp, byte_len, imm)
    }
    fn qp_stats(&self, qp: *mut ibv_qp) -> Result<ScriptedQpStats> {
        ScriptedDevice::qp_stats(self, qp)
    }
    fn qp_caps(&self, qp: *mut ibv_qp) -> Result<ScriptedQpCaps> {
        ScriptedDevice::qp_caps(self, qp)
    }
    fn cq_stats(&self, cq: *mut ibv_cq) -> Result<ScriptedCqStats> {
        ScriptedDevice::cq_stats(self, cq)
    }
    fn wqe(&self, qp: *mut ibv_qp, index: usize) -> Result<ScriptedWqe> {
        ScriptedDevice::wqe(self, qp, index)
    }
    fn violations(&self) -> Vec<String> {
        ScriptedDevice::violations(self)
    }
    fn refuse_opcode(&self, qp: *mut ibv_qp, opcode: u32, errno: i32) -> Result<()> {
        ScriptedDevice::refuse_opcode(self, qp, opcode, errno)
    }
}

impl Drop for ScriptedDevice {
    fn drop(&mut self) {
        // SAFETY: the device is going: none of its objects is torn down after this. It was registered in `new`.
        let _ = unsafe { sqdisc_device::unregister(self.context()) };
        {
            let mut live = live_mrs();
            for mr in self.model.get_mut().mr_keys() {
                live.remove(&mr);
            }
        }
        self.model.get_mut().clear();
        // SAFETY: these three came from `Box::into_raw` in `new`, are owned by the device and freed only here.
        // Every QP and CQ referring to them was freed by `clear` above.
        unsafe {
            drop(Box::from_raw(self.pd));
            drop(Box::from_raw(self.ctx));
            drop(Box::from_raw(self.ibdev));
        }
    }
}
