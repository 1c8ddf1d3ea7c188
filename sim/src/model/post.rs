//! Posting (the `post_send` and `post_recv` verbs): validation against the QP's state and caps, the SQ and RQ
//! slot rules, the WQE record, and null mode's completion at post time.

use rdma_sys::{ibv_qp, ibv_send_flags};

use crate::scriptable::{ScriptedQpCaps, ScriptedWqe};
use super::{Model, key};
use super::opcode::{carries_data, is_atomic, wc_opcode};
use super::qp::{QpModel, QpState, Recv, Wqe};
use super::super::{
    violation_kind_str, SQD_SIM_VIOLATION_BAD_WR, SQD_SIM_VIOLATION_QP_STATE, SQD_SIM_VIOLATION_RQ_OVERFLOW,
    SQD_SIM_VIOLATION_SQ_OVERFLOW,
};
use super::wc::{FLUSH, GARBAGE, Origin, SUCCESS, blank_wc, error_wc};
use super::wr::{RecvRequest, SendRequest};

impl Model {
    /// The caps the ops layer needs to copy a WR (`max_send_sge`, `max_inline_data`), and whether SGEs need to
    /// be copied at all (not in null mode).
    pub(crate) fn post_info(&self, qp: *mut ibv_qp) -> Option<(ScriptedQpCaps, bool)> {
        let slot = *self.qp_by_ptr.get(&key(qp))?;
        let q = self.qps[slot].as_ref()?;
        Some((q.caps, !self.null()))
    }

    /// Accepts or rejects one send WR. `Err` is a positive errno, as providers return from `post_send`.
    pub(crate) fn post_send(&mut self, qp: *mut ibv_qp, req: SendRequest) -> std::result::Result<(), i32> {
        let Ok(slot) = self.slot_of(qp) else { return Err(libc::EINVAL) };
        let r = self.with_slot(slot, |m, q| m.post_send_on(q, req)).unwrap_or(Err(libc::EINVAL));
        self.settle();
        r
    }

    fn post_send_on(&mut self, q: &mut QpModel, req: SendRequest) -> std::result::Result<(), i32> {
        let qpn = q.qpn;
        let index = q.posted;
        if q.state == QpState::Init {
            let text = format!(
                "{}: qp {qpn:#x} is not connected (INIT); wr_id {:#x} rejected with EINVAL",
                violation_kind_str(SQD_SIM_VIOLATION_QP_STATE),
                req.wr_id
            );
            self.violation(Some(q), SQD_SIM_VIOLATION_QP_STATE, None, text);
            return Err(libc::EINVAL);
        }
        if q.state != QpState::Err && q.posted - q.base >= u64::from(q.caps.max_send_wr) {
            self.stats.sq_overflows += 1;
            if self.strict() {
                let text = format!(
                    "{}: qp {qpn:#x} holds {} of {} send slots (none freed by a polled CQE); wr_id {:#x} rejected with ENOMEM",
                    violation_kind_str(SQD_SIM_VIOLATION_SQ_OVERFLOW),
                    q.posted - q.base,
                    q.caps.max_send_wr,
                    req.wr_id
                );
                self.violation(Some(q), SQD_SIM_VIOLATION_SQ_OVERFLOW, Some(index), text);
            }
            return Err(libc::ENOMEM);
        }
        let inline = req.flags & ibv_send_flags::IBV_SEND_INLINE.0 != 0;
        let bad = if wc_opcode(req.opcode).is_none() {
            Some(format!("unsupported opcode {}", req.opcode))
        } else if req.num_sge < 0 || req.num_sge as u32 > q.caps.max_send_sge {
            Some(format!("num_sge {} > max_send_sge {}", req.num_sge, q.caps.max_send_sge))
        } else if req.null_sg_list {
            Some(format!("num_sge {} with a NULL sg_list", req.num_sge))
        } else if inline && req.total_len > u64::from(q.caps.max_inline_data) {
            Some(format!("{} inline bytes > max_inline_data {}", req.total_len, q.caps.max_inline_data))
        } else if inline && !carries_data(req.opcode) {
            Some("IBV_SEND_INLINE on an opcode without outgoing data".to_string())
        } else if is_atomic(req.opcode) && (req.total_len != 8 || req.remote_addr % 8 != 0) {
            Some(format!("atomic needs 8 bytes of local SGE and an 8-byte aligned remote_addr (got {} bytes, {:#x})", req.total_len, req.remote_addr))
        } else {
            None
        };
        if let Some(why) = bad {
            let text = format!("{}: qp {qpn:#x} wr_id {:#x}: {why}; rejected with EINVAL", violation_kind_str(SQD_SIM_VIOLATION_BAD_WR), req.wr_id);
            self.violation(Some(q), SQD_SIM_VIOLATION_BAD_WR, None, text);
            return Err(libc::EINVAL);
        }
        let signaled = q.sig_all || req.flags & ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
        q.posted += 1;
        self.stats.wqes += 1;
        q.stats.wqes_posted += 1;
        q.stats.signaled_wqes += u64::from(signaled);
        q.stats.max_outstanding = q.stats.max_outstanding.max(q.posted - q.base);
        if q.scripted {
            q.history.push(ScriptedWqe {
                wr_id: req.wr_id,
                opcode: req.opcode,
                send_flags: req.flags,
                num_sge: req.num_sge,
                first_sge_length: req.sges.first().map_or(0, |s| s.len),
                first_sge_addr: req.sges.first().map_or(0, |s| s.addr),
                total_length: req.total_len,
                first_sge_lkey: req.sges.first().map_or(0, |s| s.lkey),
                imm_data: req.imm,
                remote_addr: req.remote_addr,
                rkey: req.rkey,
                compare_add: req.compare_add,
                swap: req.swap,
                signaled,
                ..ScriptedWqe::default()
            });
        }
        if self.null() {
            // Null mode: complete at once, no record kept.
            q.next_tx = q.posted;
            q.next_complete = q.posted;
            q.completed_total += 1;
            let status = if q.state == QpState::Err { FLUSH } else { SUCCESS };
            if status == SUCCESS {
                q.stats.executed += 1;
            }
            if signaled || status != SUCCESS {
                let wc = if status == SUCCESS {
                    let mut wc = blank_wc();
                    wc.wr_id = req.wr_id;
                    wc.opcode = wc_opcode(req.opcode).unwrap_or(GARBAGE);
                    wc.byte_len = req.total_len.min(u64::from(u32::MAX)) as u32;
                    wc.qp_num = qpn;
                    wc
                } else {
                    error_wc(req.wr_id, status, 0, qpn)
                };
                self.push_cqe(q, true, wc, Origin::Send(index), false);
            }
            return Ok(());
        }
        q.sq.push_back(Wqe {
            index,
            wr_id: req.wr_id,
            opcode: req.opcode,
            signaled,
            fence: req.flags & ibv_send_flags::IBV_SEND_FENCE.0 != 0,
            solicited: req.flags & ibv_send_flags::IBV_SEND_SOLICITED.0 != 0,
            sges: if inline { Vec::new() } else { req.sges },
            inline: if inline { req.inline } else { None },
            len: req.total_len,
            remote_addr: req.remote_addr,
            rkey: req.rkey,
            imm: req.imm,
            compare_add: req.compare_add,
            swap: req.swap,
            psn: None,
            tx_count: 0,
            sent_at: 0,
            image: None,
            modified_logged: false,
            done: false,
            status: SUCCESS,
            vendor_err: 0,
        });
        if q.state == QpState::Err {
            // A WR posted to a QP in error is flushed at once.
            self.complete_ready(q);
        } else {
            self.active.insert(q.slot);
        }
        Ok(())
    }

    pub(crate) fn doorbell(&mut self, qp: *mut ibv_qp) {
        self.stats.doorbells += 1;
        if let Some(q) = self.qp_by_ptr.get(&key(qp)).and_then(|&s| self.qps[s].as_mut()) {
            q.stats.doorbells += 1;
        }
    }

    /// Accepts or rejects one receive WR (positive errno on rejection).
    pub(crate) fn post_recv(&mut self, qp: *mut ibv_qp, req: RecvRequest) -> std::result::Result<(), i32> {
        let Ok(slot) = self.slot_of(qp) else { return Err(libc::EINVAL) };
        let r = self.with_slot(slot, |m, q| m.post_recv_on(q, req)).unwrap_or(Err(libc::EINVAL));
        self.settle();
        r
    }

    fn post_recv_on(&mut self, q: &mut QpModel, req: RecvRequest) -> std::result::Result<(), i32> {
        let qpn = q.qpn;
        if q.srq.is_some() {
            let text = format!(
                "{}: qp {qpn:#x} takes its receives from an SRQ; ibv_post_recv wr_id {:#x} rejected with EINVAL (post to the SRQ)",
                violation_kind_str(SQD_SIM_VIOLATION_BAD_WR),
                req.wr_id
            );
            self.violation(Some(q), SQD_SIM_VIOLATION_BAD_WR, None, text);
            return Err(libc::EINVAL);
        }
        if q.state != QpState::Err && q.recv_held >= q.caps.max_recv_wr as usize {
            self.stats.rq_overflows += 1;
            if self.strict() {
                let text = format!(
                    "{}: qp {qpn:#x} holds {} of {} receive slots; wr_id {:#x} rejected with ENOMEM",
                    violation_kind_str(SQD_SIM_VIOLATION_RQ_OVERFLOW),
                    q.recv_held,
                    q.caps.max_recv_wr,
                    req.wr_id
                );
                self.violation(Some(q), SQD_SIM_VIOLATION_RQ_OVERFLOW, None, text);
            }
            return Err(libc::ENOMEM);
        }
        if req.num_sge < 0 || req.num_sge as u32 > q.caps.max_recv_sge || req.null_sg_list {
            let text = format!(
                "{}: qp {qpn:#x} receive wr_id {:#x} has num_sge {} (max_recv_sge {}){}; rejected with EINVAL",
                violation_kind_str(SQD_SIM_VIOLATION_BAD_WR),
                req.wr_id,
                req.num_sge,
                q.caps.max_recv_sge,
                if req.null_sg_list { " and a NULL sg_list" } else { "" }
            );
            self.violation(Some(q), SQD_SIM_VIOLATION_BAD_WR, None, text);
            return Err(libc::EINVAL);
        }
        self.stats.recvs += 1;
        q.stats.recv_posted += 1;
        q.recv_held += 1;
        q.rq.push_back(Recv { wr_id: req.wr_id, sges: req.sges });
        if q.state == QpState::Err {
            self.enter_error(q);
        }
        Ok(())
    }
}
