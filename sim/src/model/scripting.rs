//! What the `Scriptable` surface needs beyond the verbs: completing `n` WQEs, failing the next one,
//! delivering a message at once, and the WQE history of scripted QPs.

use rdma_sys::{ibv_qp, ibv_wc_flags, ibv_wc_opcode};

use crate::{Error, Result};
use crate::scriptable::ScriptedWqe;
use super::Model;
use super::qp::QpState;
use super::wc::{Origin, SUCCESS, blank_wc};

/// Upper bound of steps `complete_n` runs before giving up.
const COMPLETE_STEP_LIMIT: u64 = 1_000_000;

impl Model {
    pub(crate) fn complete_n(&mut self, qp: *mut ibv_qp, n: usize) -> Result<usize> {
        let slot = self.slot_of(qp)?;
        let get = |m: &Model| {
            let q = m.qps[slot].as_ref().expect("no QP is taken out between calls");
            (q.completed_total, q.next_complete == q.posted)
        };
        let (start, _) = get(self);
        let mut steps = 0;
        loop {
            let (done, all) = get(self);
            if done - start >= n as u64 || all || steps >= COMPLETE_STEP_LIMIT {
                return Ok((done - start) as usize);
            }
            self.step_once();
            steps += 1;
        }
    }

    pub(crate) fn fail_next(&mut self, qp: *mut ibv_qp, status: u32, vendor_err: u32) -> Result<()> {
        if status == SUCCESS {
            return Err(Error::invalid("fail() needs an error status; use complete() for success"));
        }
        let q = self.qp(qp)?;
        let waiting = q.state == QpState::Rts && q.sq.iter().any(|w| w.tx_count == 0 && !w.done);
        if !waiting {
            return Err(Error::new(libc::ENOENT, format!("qp {:#x} has no send WQE waiting to be transmitted", q.qpn)));
        }
        let slot = self.slot_of(qp)?;
        self.qps[slot].as_mut().unwrap().fail_next = Some((status, vendor_err));
        Ok(())
    }

    pub(crate) fn deliver_now(&mut self, qp: *mut ibv_qp, byte_len: u32, imm: Option<u32>) -> Result<()> {
        self.with_qp(qp, |m, q| {
            let Some(recv) = m.take_recv(q) else {
                return Err(Error::new(libc::ENOENT, format!("qp {:#x} has no receive posted", q.qpn)));
            };
            let mut wc = blank_wc();
            wc.wr_id = recv.wr_id;
            wc.opcode = ibv_wc_opcode::IBV_WC_RECV;
            wc.byte_len = byte_len;
            wc.qp_num = q.qpn;
            wc.src_qp = q.peer.unwrap_or(0);
            if let Some(imm) = imm {
                wc.wc_flags = ibv_wc_flags::IBV_WC_WITH_IMM.0;
                wc.imm_data_invalidated_rkey_union.imm_data = imm;
            }
            m.push_cqe(q, false, wc, Origin::Recv, false);
            Ok(())
        })?
    }

    pub(crate) fn wqe_record(&self, qp: *mut ibv_qp, index: usize) -> Result<ScriptedWqe> {
        let q = self.qp(qp)?;
        if !q.scripted {
            return Err(Error::new(libc::EOPNOTSUPP, "WQE history is kept for QPs made through Scriptable::create_qp only"));
        }
        q.history.get(index).copied().ok_or_else(|| {
            Error::new(libc::ENOENT, format!("qp {:#x} has {} send WQEs; index {index} does not exist", q.qpn, q.history.len()))
        })
    }
}
