//! The oracle and the violation log: whether the HCA is finished with a buffer or a send WQE, and the
//! record of every rule a ULP broke.

use rdma_sys::ibv_qp;

use crate::{Error, Result};
use super::Model;
use super::qp::QpModel;
use super::super::Violation;

impl Model {
    pub(super) fn violation(&mut self, q: Option<&mut QpModel>, kind: u32, wqe_index: Option<u64>, text: String) {
        let qp_num = q.as_ref().map_or(0, |q| q.qpn);
        if let Some(q) = q {
            q.stats.violations += 1;
        }
        self.stats.violations += 1;
        self.violations.push(Violation { kind, qp_num, wqe_index, step: self.now, text });
    }

    pub(crate) fn buffer_busy(&self, addr: u64, len: u64) -> bool {
        let end = addr.saturating_add(len);
        self.live_qps().any(|q| {
            q.sq.iter().any(|w| {
                !w.done && w.inline.is_none() && w.sges.iter().any(|s| s.len > 0 && s.addr < end && addr < s.addr.saturating_add(u64::from(s.len)))
            })
        })
    }

    pub(crate) fn wqe_finished(&self, qp: *mut ibv_qp, index: u64) -> Result<bool> {
        let q = self.qp(qp)?;
        if index >= q.posted {
            return Err(Error::new(libc::ENOENT, format!("qp {:#x} has {} send WQEs; index {index} does not exist", q.qpn, q.posted)));
        }
        Ok(index < q.base || self.null() || q.wqe(index).done)
    }

    pub(crate) fn violations(&self) -> &[Violation] {
        &self.violations
    }
}
