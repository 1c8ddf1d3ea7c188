//! The state machine of the scripted device: send and receive queues, CQ FIFOs, slot accounting, violations.
//!
//! Nothing here dereferences a caller's pointer. The verbs objects (`ibv_qp`, `ibv_cq`) are owned here as raw
//! pointers obtained from `Box::into_raw` and freed on destruction; objects are looked up by address, so a
//! pointer that is not (or no longer) one of ours is reported, never followed.

use std::collections::{HashMap, VecDeque};

use rdma_sys::{ibv_cq, ibv_mr, ibv_qp, ibv_qp_state, ibv_wc, ibv_wc_flags, ibv_wc_opcode, ibv_wc_status, ibv_wr_opcode};

use super::{ScriptedCqStats, ScriptedQpCaps, ScriptedQpStats, ScriptedWqe};
use crate::{Error, Result};

/// The `opcode` (and `byte_len`) written into error and flush CQEs, where the verbs contract says they are
/// undefined: a user that reads them anyway sees an obviously wrong value.
pub(crate) const GARBAGE: u32 = 0xffff_ffff;

/// Largest accepted `max_send_wr` / `max_recv_wr` and CQ depth.
pub(crate) const MAX_WR: u32 = 1 << 15;
pub(crate) const MAX_CQE: i32 = 1 << 22;
pub(crate) const MAX_SGE: u32 = 64;
pub(crate) const MAX_INLINE: u32 = 4096;
/// The lkey of the first MR registered on a device; keys are handed out in pairs (lkey, rkey = lkey + 1).
pub(crate) const FIRST_MR_KEY: u32 = 0x1000;

/// Which queue a CQE belongs to. Kept beside the CQE because the CQE's own opcode is undefined on errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// The send WQE with this index (position in the QP's history of send WQEs).
    Send(usize),
    Recv,
}

struct CqEntry {
    wc: ibv_wc,
    qpn: u32,
    origin: Origin,
}

struct RecvWqe {
    wr_id: u64,
}

pub(crate) struct CqModel {
    obj: *mut ibv_cq,
    entries: VecDeque<CqEntry>,
    capacity: usize,
    max_queued: usize,
    overruns: u64,
    in_error: bool,
    arms: u64,
    /// Number of QP queues (send or receive side) attached.
    users: usize,
}

impl Drop for CqModel {
    fn drop(&mut self) {
        // SAFETY: `obj` came from `Box::into_raw` in `Model::create_cq` and is freed only here, once.
        drop(unsafe { Box::from_raw(self.obj) });
    }
}

pub(crate) struct QpModel {
    obj: *mut ibv_qp,
    qpn: u32,
    caps: ScriptedQpCaps,
    send_cq: usize,
    recv_cq: usize,
    /// Every send WQE ever accepted, in post order.
    wqes: Vec<ScriptedWqe>,
    /// Index of the oldest send WQE not yet executed, failed or flushed.
    next_exec: usize,
    /// Send slots `[0, freed)` are released (a CQE at or after them was polled).
    freed: usize,
    /// Receives posted and not yet completed, oldest first.
    recv_pending: VecDeque<RecvWqe>,
    /// Receive slots held: posted, CQE not yet polled.
    recv_held: usize,
    in_error: bool,
    stats: ScriptedQpStats,
    /// Scripted refusals (`Model::refuse_opcode`): send WRs of this opcode are refused with this errno.
    refused_opcodes: Vec<(u32, i32)>,
}

impl Drop for QpModel {
    fn drop(&mut self) {
        // SAFETY: `obj` came from `Box::into_raw` in `Model::create_qp` and is freed only here, once.
        drop(unsafe { Box::from_raw(self.obj) });
    }
}

impl QpModel {
    fn outstanding(&self) -> usize {
        self.wqes.len() - self.freed
    }

    fn enter_error(&mut self) {
        self.in_error = true;
        self.stats.in_error = true;
        // SAFETY: `obj` is owned by this model and alive; no reference to it is held across this write (the
        // device is used by one thread at a time). `state` is the cached state libibverbs users may read.
        unsafe { (*self.obj).state = ibv_qp_state::IBV_QPS_ERR };
    }
}

/// One send work request, copied out of the caller's `ibv_send_wr` by the ops layer.
pub(crate) struct SendRequest {
    pub wqe: ScriptedWqe,
    /// `num_sge > 0` with a NULL `sg_list`.
    pub null_sg_list: bool,
}

#[derive(Default)]
pub(crate) struct Model {
    cqs: HashMap<usize, CqModel>,
    qps: HashMap<usize, QpModel>,
    qp_by_num: HashMap<u32, usize>,
    next_qpn: u32,
    violations: Vec<String>,
    /// Registered MRs, by address: objects from `Box::into_raw`, freed by `dereg_mr` or `clear`.
    mrs: HashMap<usize, MrModel>,
    /// The lkey of the next MR (its rkey is the next value).
    next_key: u32,
}

/// A registered MR: owns its `ibv_mr` object.
pub(crate) struct MrModel {
    obj: *mut ibv_mr,
}

impl Drop for MrModel {
    fn drop(&mut self) {
        // SAFETY: `obj` came from `Box::into_raw` in `ScriptedDevice::reg_mr` and is freed only here, once.
        drop(unsafe { Box::from_raw(self.obj) });
    }
}

fn key<T>(p: *mut T) -> usize {
    p as usize
}

/// The work-completion opcode a successful send WQE of this work-request opcode reports.
pub(crate) fn wc_opcode(wr_opcode: u32) -> u32 {
    use ibv_wc_opcode::*;
    use ibv_wr_opcode::*;
    match wr_opcode {
        IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_SEND_WITH_INV => IBV_WC_SEND,
        IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => IBV_WC_RDMA_WRITE,
        IBV_WR_RDMA_READ => IBV_WC_RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP => IBV_WC_COMP_SWAP,
        IBV_WR_ATOMIC_FETCH_AND_ADD => IBV_WC_FETCH_ADD,
        IBV_WR_LOCAL_INV => IBV_WC_LOCAL_INV,
        IBV_WR_BIND_MW => IBV_WC_BIND_MW,
        _ => GARBAGE,
    }
}

fn supported_opcode(op: u32) -> bool {
    wc_opcode(op) != GARBAGE
}

fn is_atomic(op: u32) -> bool {
    op == ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP || op == ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD
}

/// A zeroed work completion.
fn blank_wc() -> ibv_wc {
    // SAFETY: `ibv_wc` is plain data (integers and an integer union); all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// An error or flush CQE: only `wr_id`, `status`, `qp_num` and `vendor_err` are meaningful.
fn error_wc(wr_id: u64, status: u32, vendor_err: u32, qpn: u32) -> ibv_wc {
    let mut wc = blank_wc();
    wc.wr_id = wr_id;
    wc.status = status;
    wc.vendor_err = vendor_err;
    wc.qp_num = qpn;
    wc.opcode = GARBAGE;
    wc.byte_len = GARBAGE;
    wc
}

impl Model {
    pub(crate) fn new() -> Model {
        Model { next_qpn: 0x100, next_key: FIRST_MR_KEY, ..Model::default() }
    }

    fn qp(&self, qp: *mut ibv_qp) -> Result<&QpModel> {
        self.qps.get(&key(qp)).ok_or_else(|| Error::invalid(format!("qp {qp:p} is not a QP of this scripted device")))
    }

    fn cq(&self, cq: *mut ibv_cq) -> Result<&CqModel> {
        self.cqs.get(&key(cq)).ok_or_else(|| Error::invalid(format!("cq {cq:p} is not a CQ of this scripted device")))
    }

    pub(crate) fn owns_qp(&self, qp: *mut ibv_qp) -> bool {
        self.qps.contains_key(&key(qp))
    }

    pub(crate) fn owns_cq(&self, cq: *mut ibv_cq) -> bool {
        self.cqs.contains_key(&key(cq))
    }

    // ---- creation ----------------------------------------------------------------------------------------

    /// Registers a CQ object made by the device (already boxed, `cqe` filled in) with room for `capacity`.
    pub(crate) fn add_cq(&mut self, obj: *mut ibv_cq, capacity: usize) {
        let cq = CqModel {
            obj,
            entries: VecDeque::with_capacity(capacity),
            capacity,
            max_queued: 0,
            overruns: 0,
            in_error: false,
            arms: 0,
            users: 0,
        };
        self.cqs.insert(key(obj), cq);
    }

    pub(crate) fn check_qp_args(&self, send_cq: *mut ibv_cq, recv_cq: *mut ibv_cq, caps: &ScriptedQpCaps) -> Result<()> {
        for (cq, name) in [(send_cq, "send_cq"), (recv_cq, "recv_cq")] {
            if !self.owns_cq(cq) {
                return Err(Error::invalid(format!("{name} {cq:p} is not a CQ of this scripted device")));
            }
        }
        let checks = [
            ("max_send_wr", caps.max_send_wr, 1, MAX_WR),
            ("max_recv_wr", caps.max_recv_wr, 1, MAX_WR),
            ("max_send_sge", caps.max_send_sge, 1, MAX_SGE),
            ("max_recv_sge", caps.max_recv_sge, 1, MAX_SGE),
            ("max_inline_data", caps.max_inline_data, 0, MAX_INLINE),
        ];
        for (name, value, lo, hi) in checks {
            if value < lo || value > hi {
                return Err(Error::invalid(format!("caps.{name} = {value} is out of range ({lo}..={hi})")));
            }
        }
        if self.next_qpn == 0 || self.next_qpn > 0x00ff_ffff {
            return Err(Error::new(libc::ENOSPC, "scripted device ran out of QP numbers"));
        }
        Ok(())
    }

    pub(crate) fn next_qpn(&self) -> u32 {
        self.next_qpn
    }

    /// Registers a QP object made by the device; arguments were checked by `check_qp_args`.
    pub(crate) fn add_qp(&mut self, obj: *mut ibv_qp, send_cq: *mut ibv_cq, recv_cq: *mut ibv_cq, caps: ScriptedQpCaps) {
        let qpn = self.next_qpn;
        self.next_qpn += 1;
        for cq in [send_cq, recv_cq] {
            if let Some(cq) = self.cqs.get_mut(&key(cq)) {
                cq.users += 1;
            }
        }
        let qp = QpModel {
            obj,
            qpn,
            caps,
            send_cq: key(send_cq),
            recv_cq: key(recv_cq),
            wqes: Vec::new(),
            next_exec: 0,
            freed: 0,
            recv_pending: VecDeque::new(),
            recv_held: 0,
            in_error: false,
            stats: ScriptedQpStats::default(),
            refused_opcodes: Vec::new(),
        };
        self.qp_by_num.insert(qpn, key(obj));
        self.qps.insert(key(obj), qp);
    }

    /// Destroys a QP. Its CQEs still queued on its CQs are removed, as providers clean a destroyed QP's CQEs.
    pub(crate) fn destroy_qp(&mut self, qp: *mut ibv_qp) -> Result<()> {
        let model = self.qps.remove(&key(qp)).ok_or_else(|| Error::invalid(format!("qp {qp:p} is not a QP of this scripted device")))?;
        self.qp_by_num.remove(&model.qpn);
        for cq_key in [model.send_cq, model.recv_cq] {
            if let Some(cq) = self.cqs.get_mut(&cq_key) {
                cq.users -= 1;
                cq.entries.retain(|e| e.qpn != model.qpn);
            }
        }
        Ok(())
    }

    pub(crate) fn destroy_cq(&mut self, cq: *mut ibv_cq) -> Result<()> {
        let users = self.cq(cq)?.users;
        if users > 0 {
            return Err(Error::new(libc::EBUSY, format!("cq {cq:p} is still used by {users} QP queue(s)")));
        }
        self.cqs.remove(&key(cq));
        Ok(())
    }

    // ---- CQEs --------------------------------------------------------------------------------------------

    /// Pushes a CQE, or records an overrun when the CQ is full. Returns whether the CQE was queued.
    fn push(cqs: &mut HashMap<usize, CqModel>, violations: &mut Vec<String>, qp: &mut QpModel, to_send_cq: bool, entry: CqEntry) -> bool {
        qp.stats.cqes_generated += 1;
        if entry.wc.status == ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
            qp.stats.flushed += 1;
        }
        let cq_key = if to_send_cq { qp.send_cq } else { qp.recv_cq };
        let Some(cq) = cqs.get_mut(&cq_key) else { return false };
        if cq.entries.len() >= cq.capacity {
            cq.overruns += 1;
            cq.in_error = true;
            qp.stats.violations += 1;
            violations.push(format!(
                "CQ overrun: cq {:p} (capacity {}) is full; CQE wr_id {:#x} status {} of qp {:#x} lost",
                cq.obj, cq.capacity, entry.wc.wr_id, entry.wc.status, qp.qpn
            ));
            return false;
        }
        cq.entries.push_back(entry);
        cq.max_queued = cq.max_queued.max(cq.entries.len());
        true
    }

    /// Flushes, in order, every send WQE not yet executed and then every posted receive of `qp`.
    fn flush_all(cqs: &mut HashMap<usize, CqModel>, violations: &mut Vec<String>, qp: &mut QpModel) {
        while qp.next_exec < qp.wqes.len() {
            let index = qp.next_exec;
            qp.next_exec += 1;
            let status = ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
            let wqe = &mut qp.wqes[index];
            wqe.flushed = true;
            wqe.status = status;
            let wc = error_wc(wqe.wr_id, status, 0, qp.qpn);
            Self::push(cqs, violations, qp, true, CqEntry { wc, qpn: qp.qpn, origin: Origin::Send(index) });
        }
        while let Some(recv) = qp.recv_pending.pop_front() {
            let wc = error_wc(recv.wr_id, ibv_wc_status::IBV_WC_WR_FLUSH_ERR, 0, qp.qpn);
            Self::push(cqs, violations, qp, false, CqEntry { wc, qpn: qp.qpn, origin: Origin::Recv });
        }
    }

    pub(crate) fn poll(&mut self, cq: *mut ibv_cq, max: usize, mut out: impl FnMut(usize, ibv_wc)) -> usize {
        let Some(cqm) = self.cqs.get_mut(&key(cq)) else { return 0 };
        let mut n = 0;
        while n < max {
            let Some(entry) = cqm.entries.pop_front() else { break };
            if let Some(qp) = self.qp_by_num.get(&entry.qpn).and_then(|k| self.qps.get_mut(k)) {
                match entry.origin {
                    // mlx5 rule: a polled CQE releases its own slot and every earlier one on that SQ.
                    Origin::Send(index) => qp.freed = qp.freed.max(index + 1),
                    Origin::Recv => qp.recv_held -= 1,
                }
                qp.stats.outstanding = qp.outstanding() as u64;
                qp.stats.recv_outstanding = qp.recv_held as u64;
            }
            out(n, entry.wc);
            n += 1;
        }
        n
    }

    pub(crate) fn arm(&mut self, cq: *mut ibv_cq) -> Result<()> {
        let cq = self.cqs.get_mut(&key(cq)).ok_or_else(|| Error::invalid("cq is not a CQ of this scripted device"))?;
        cq.arms += 1;
        Ok(())
    }

    // ---- posting -----------------------------------------------------------------------------------------

    pub(crate) fn send_caps(&self, qp: *mut ibv_qp) -> Option<ScriptedQpCaps> {
        self.qps.get(&key(qp)).map(|q| q.caps)
    }

    fn violation(violations: &mut Vec<String>, qp: &mut QpModel, text: String) {
        qp.stats.violations += 1;
        violations.push(text);
    }

    /// Accepts or rejects one send WR. `Err` is a positive errno, as providers return from `post_send`.
    /// Scripts refusals: from now on every send WR of `qp` with `opcode` is refused at post time with `errno`, as a
    /// provider refuses a WR it does not support. `errno` 0 lifts the refusal of that opcode.
    pub(crate) fn refuse_opcode(&mut self, qp: *mut ibv_qp, opcode: u32, errno: i32) -> Result<()> {
        self.qp(qp)?;
        if !(0..=4095).contains(&errno) {
            return Err(Error::invalid(format!("errno {errno} is outside 0..=4095")));
        }
        let q = self.qps.get_mut(&key(qp)).expect("checked above");
        q.refused_opcodes.retain(|r| r.0 != opcode);
        if errno != 0 {
            q.refused_opcodes.push((opcode, errno));
        }
        Ok(())
    }

    /// Accepts or rejects one send WR; a WR of an opcode the test made the device refuse (`refuse_opcode`) is
    /// refused first, with no violation recorded.
    pub(crate) fn post_send(&mut self, qp: *mut ibv_qp, req: SendRequest) -> std::result::Result<(), i32> {
        if let Some(q) = self.qps.get(&key(qp)) {
            if let Some(&(_, errno)) = q.refused_opcodes.iter().find(|r| r.0 == req.wqe.opcode) {
                return Err(errno);
            }
        }
        self.accept_send(qp, req)
    }

    fn accept_send(&mut self, qp: *mut ibv_qp, req: SendRequest) -> std::result::Result<(), i32> {
        let Model { cqs, qps, violations, .. } = self;
        let Some(q) = qps.get_mut(&key(qp)) else { return Err(libc::EINVAL) };
        let mut wqe = req.wqe;
        wqe.signaled = wqe.send_flags & rdma_sys::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
        if q.in_error {
            // Accepted and flushed at once, signaled or not, as a QP in the error state does.
            let index = q.wqes.len();
            q.wqes.push(wqe);
            q.stats.wqes_posted += 1;
            q.stats.signaled_wqes += u64::from(wqe.signaled);
            Self::flush_all(cqs, violations, q);
            q.stats.outstanding = q.outstanding() as u64;
            q.stats.max_outstanding = q.stats.max_outstanding.max(q.stats.outstanding);
            debug_assert_eq!(q.next_exec, index + 1);
            return Ok(());
        }
        let qpn = q.qpn;
        if q.outstanding() >= q.caps.max_send_wr as usize {
            let text = format!(
                "SQ overflow: qp {qpn:#x} holds {} of {} send slots (none freed by a polled CQE); wr_id {:#x} rejected with ENOMEM",
                q.outstanding(),
                q.caps.max_send_wr,
                wqe.wr_id
            );
            Self::violation(violations, q, text);
            return Err(libc::ENOMEM);
        }
        let invalid = if !supported_opcode(wqe.opcode) {
            Some(format!("bad opcode: qp {qpn:#x} wr_id {:#x} has unsupported opcode {}", wqe.wr_id, wqe.opcode))
        } else if wqe.num_sge < 0 || wqe.num_sge as u32 > q.caps.max_send_sge {
            Some(format!(
                "too many SGEs: qp {qpn:#x} wr_id {:#x} has num_sge {} > max_send_sge {}",
                wqe.wr_id, wqe.num_sge, q.caps.max_send_sge
            ))
        } else if req.null_sg_list {
            Some(format!("NULL sg_list: qp {qpn:#x} wr_id {:#x} has num_sge {} and no sg_list", wqe.wr_id, wqe.num_sge))
        } else if wqe.send_flags & rdma_sys::ibv_send_flags::IBV_SEND_INLINE.0 != 0
            && wqe.total_length > u64::from(q.caps.max_inline_data)
        {
            Some(format!(
                "inline too large: qp {qpn:#x} wr_id {:#x} has {} inline bytes > max_inline_data {}",
                wqe.wr_id, wqe.total_length, q.caps.max_inline_data
            ))
        } else {
            None
        };
        if let Some(text) = invalid {
            Self::violation(violations, q, text);
            return Err(libc::EINVAL);
        }
        q.wqes.push(wqe);
        q.stats.wqes_posted += 1;
        q.stats.signaled_wqes += u64::from(wqe.signaled);
        q.stats.outstanding = q.outstanding() as u64;
        q.stats.max_outstanding = q.stats.max_outstanding.max(q.stats.outstanding);
        Ok(())
    }

    pub(crate) fn doorbell(&mut self, qp: *mut ibv_qp) {
        if let Some(q) = self.qps.get_mut(&key(qp)) {
            q.stats.doorbells += 1;
        }
    }

    /// Accepts or rejects one receive WR (positive errno on rejection).
    pub(crate) fn post_recv(&mut self, qp: *mut ibv_qp, wr_id: u64, num_sge: i32, null_sg_list: bool) -> std::result::Result<(), i32> {
        let Model { cqs, qps, violations, .. } = self;
        let Some(q) = qps.get_mut(&key(qp)) else { return Err(libc::EINVAL) };
        if q.in_error {
            // Accepted and flushed at once, as a QP in the error state does.
            q.recv_pending.push_back(RecvWqe { wr_id });
            q.recv_held += 1;
            q.stats.recv_posted += 1;
            Self::flush_all(cqs, violations, q);
            return Ok(());
        }
        let qpn = q.qpn;
        if q.recv_held >= q.caps.max_recv_wr as usize {
            let text = format!(
                "RQ overflow: qp {qpn:#x} holds {} of {} receive slots; wr_id {wr_id:#x} rejected with ENOMEM",
                q.recv_held, q.caps.max_recv_wr
            );
            Self::violation(violations, q, text);
            return Err(libc::ENOMEM);
        }
        if num_sge < 0 || num_sge as u32 > q.caps.max_recv_sge || null_sg_list {
            let text = format!(
                "bad receive SGE list: qp {qpn:#x} wr_id {wr_id:#x} has num_sge {num_sge} (max_recv_sge {}){}",
                q.caps.max_recv_sge,
                if null_sg_list { " and a NULL sg_list" } else { "" }
            );
            Self::violation(violations, q, text);
            return Err(libc::EINVAL);
        }
        q.recv_pending.push_back(RecvWqe { wr_id });
        q.recv_held += 1;
        q.stats.recv_posted += 1;
        q.stats.recv_outstanding = q.recv_held as u64;
        Ok(())
    }

    // ---- scripting ---------------------------------------------------------------------------------------

    pub(crate) fn complete(&mut self, qp: *mut ibv_qp, n: usize) -> Result<usize> {
        self.qp(qp)?;
        let Model { cqs, qps, violations, .. } = self;
        let q = qps.get_mut(&key(qp)).expect("checked above");
        let mut done = 0;
        while done < n && q.next_exec < q.wqes.len() {
            let index = q.next_exec;
            q.next_exec += 1;
            done += 1;
            q.stats.executed += 1;
            let wqe = &mut q.wqes[index];
            wqe.executed = true;
            wqe.status = ibv_wc_status::IBV_WC_SUCCESS;
            if !wqe.signaled {
                continue;
            }
            let mut wc = blank_wc();
            wc.wr_id = wqe.wr_id;
            wc.status = ibv_wc_status::IBV_WC_SUCCESS;
            wc.opcode = wc_opcode(wqe.opcode);
            wc.byte_len = if is_atomic(wqe.opcode) { 8 } else { wqe.total_length.min(u64::from(u32::MAX)) as u32 };
            wc.qp_num = q.qpn;
            Self::push(cqs, violations, q, true, CqEntry { wc, qpn: q.qpn, origin: Origin::Send(index) });
        }
        Ok(done)
    }

    pub(crate) fn fail(&mut self, qp: *mut ibv_qp, status: u32, vendor_err: u32) -> Result<()> {
        if status == ibv_wc_status::IBV_WC_SUCCESS {
            return Err(Error::invalid("fail() needs an error status; use complete() for success"));
        }
        let q = self.qp(qp)?;
        if q.next_exec >= q.wqes.len() {
            return Err(Error::new(libc::ENOENT, format!("qp {:#x} has no send WQE waiting to execute", q.qpn)));
        }
        let Model { cqs, qps, violations, .. } = self;
        let q = qps.get_mut(&key(qp)).expect("checked above");
        let index = q.next_exec;
        q.next_exec += 1;
        q.stats.executed += 1;
        let wqe = &mut q.wqes[index];
        wqe.executed = true;
        wqe.status = status;
        let wc = error_wc(wqe.wr_id, status, vendor_err, q.qpn);
        Self::push(cqs, violations, q, true, CqEntry { wc, qpn: q.qpn, origin: Origin::Send(index) });
        q.enter_error();
        Self::flush_all(cqs, violations, q);
        Ok(())
    }

    pub(crate) fn set_error(&mut self, qp: *mut ibv_qp) -> Result<()> {
        self.qp(qp)?;
        let Model { cqs, qps, violations, .. } = self;
        let q = qps.get_mut(&key(qp)).expect("checked above");
        q.enter_error();
        Self::flush_all(cqs, violations, q);
        Ok(())
    }

    pub(crate) fn deliver(&mut self, qp: *mut ibv_qp, byte_len: u32, imm: Option<u32>) -> Result<()> {
        let Model { cqs, qps, violations, .. } = self;
        let q = qps.get_mut(&key(qp)).ok_or_else(|| Error::invalid(format!("qp {qp:p} is not a QP of this scripted device")))?;
        let Some(recv) = q.recv_pending.pop_front() else {
            return Err(Error::new(libc::ENOENT, format!("qp {:#x} has no receive posted", q.qpn)));
        };
        let mut wc = blank_wc();
        wc.wr_id = recv.wr_id;
        wc.status = ibv_wc_status::IBV_WC_SUCCESS;
        wc.opcode = ibv_wc_opcode::IBV_WC_RECV;
        wc.byte_len = byte_len;
        wc.qp_num = q.qpn;
        if let Some(imm) = imm {
            wc.wc_flags = ibv_wc_flags::IBV_WC_WITH_IMM.0;
            wc.imm_data_invalidated_rkey_union.imm_data = imm;
        }
        Self::push(cqs, violations, q, false, CqEntry { wc, qpn: q.qpn, origin: Origin::Recv });
        Ok(())
    }

    // ---- inspection --------------------------------------------------------------------------------------

    pub(crate) fn qp_stats(&self, qp: *mut ibv_qp) -> Result<ScriptedQpStats> {
        let q = self.qp(qp)?;
        let mut s = q.stats;
        s.outstanding = q.outstanding() as u64;
        s.recv_outstanding = q.recv_held as u64;
        s.in_error = q.in_error;
        Ok(s)
    }

    pub(crate) fn qp_caps(&self, qp: *mut ibv_qp) -> Result<ScriptedQpCaps> {
        Ok(self.qp(qp)?.caps)
    }

    pub(crate) fn wqe(&self, qp: *mut ibv_qp, index: usize) -> Result<ScriptedWqe> {
        let q = self.qp(qp)?;
        q.wqes.get(index).copied().ok_or_else(|| {
            Error::new(libc::ENOENT, format!("qp {:#x} has {} send WQEs; index {index} does not exist", q.qpn, q.wqes.len()))
        })
    }

    pub(crate) fn cq_stats(&self, cq: *mut ibv_cq) -> Result<ScriptedCqStats> {
        let c = self.cq(cq)?;
        Ok(ScriptedCqStats {
            capacity: c.capacity as u64,
            queued: c.entries.len() as u64,
            max_queued: c.max_queued as u64,
            overruns: c.overruns,
            in_error: c.in_error,
            arms: c.arms,
        })
    }

    pub(crate) fn violations(&self) -> &[String] {
        &self.violations
    }

    // ---- memory registration -------------------------------------------------------------------------------

    /// The (lkey, rkey) pair for the next MR: nonzero, distinct from each other and from every earlier pair.
    pub(crate) fn next_keys(&mut self) -> (u32, u32) {
        let lkey = self.next_key;
        self.next_key = self.next_key.checked_add(2).unwrap_or(FIRST_MR_KEY);
        (lkey, lkey + 1)
    }

    /// Takes ownership of an MR object made by the device (already boxed and filled in).
    pub(crate) fn add_mr(&mut self, obj: *mut ibv_mr) {
        self.mrs.insert(key(obj), MrModel { obj });
    }

    /// Deregisters (frees) an MR of this device.
    pub(crate) fn dereg_mr(&mut self, mr: *mut ibv_mr) -> Result<()> {
        match self.mrs.remove(&key(mr)) {
            Some(m) => {
                drop(m);
                Ok(())
            }
            None => Err(Error::invalid(format!("mr {mr:p} is not a registered MR of this scripted device"))),
        }
    }

    pub(crate) fn mr_count(&self) -> usize {
        self.mrs.len()
    }

    /// The addresses of every registered MR.
    pub(crate) fn mr_keys(&self) -> Vec<usize> {
        self.mrs.keys().copied().collect()
    }

    /// Frees every object (device teardown).
    pub(crate) fn clear(&mut self) {
        self.mrs.clear();
        self.qps.clear();
        self.qp_by_num.clear();
        self.cqs.clear();
    }
}
