//! Read-only views of the model: device statistics, and a QP's state, statistics and caps, a CQ's statistics.

use rdma_sys::{ibv_cq, ibv_qp, ibv_qp_state};

use crate::Result;
use crate::scriptable::{ScriptedCqStats, ScriptedQpCaps, ScriptedQpStats};
use super::Model;
use super::qp::QpState;
use super::super::SimStats;

impl Model {
    pub(crate) fn stats(&self) -> SimStats {
        SimStats { steps: self.now, violations: self.violations.len() as u64, ..self.stats }
    }

    pub(crate) fn qp_state(&self, qp: *mut ibv_qp) -> Result<ibv_qp_state::Type> {
        Ok(match self.qp(qp)?.state {
            QpState::Init => ibv_qp_state::IBV_QPS_INIT,
            QpState::Rts => ibv_qp_state::IBV_QPS_RTS,
            QpState::Err => ibv_qp_state::IBV_QPS_ERR,
        })
    }

    pub(crate) fn qp_stats(&self, qp: *mut ibv_qp) -> Result<ScriptedQpStats> {
        let q = self.qp(qp)?;
        let mut s = q.stats;
        s.outstanding = q.posted - q.base;
        s.recv_outstanding = q.recv_held as u64;
        s.in_error = q.state == QpState::Err;
        Ok(s)
    }

    pub(crate) fn qp_caps(&self, qp: *mut ibv_qp) -> Result<ScriptedQpCaps> {
        Ok(self.qp(qp)?.caps)
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
}
