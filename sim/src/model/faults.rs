//! Injected faults (`SimDevice::inject`).

use crate::{Error, Result};
use super::Model;
use super::super::{
    SimFault, SQD_SIM_FAULT_FAIL_NEXT, SQD_SIM_FAULT_LOSE_ACKS, SQD_SIM_FAULT_LOSE_REQUESTS, SQD_SIM_FAULT_QP_FATAL,
    SQD_SIM_FAULT_RECV_STARVE, SQD_SIM_FAULT_REMOTE_ACCESS,
};
use super::wc::SUCCESS;

impl Model {
    pub(crate) fn inject(&mut self, f: &SimFault) -> Result<()> {
        let slot = self.slot_of(f.qp)?;
        let now = self.now;
        let q = self.qps[slot].as_mut().expect("no QP is taken out between calls");
        match f.kind {
            SQD_SIM_FAULT_QP_FATAL => {
                let qpn = q.qpn;
                self.fatal_at.push((f.at_step, qpn));
                if f.at_step <= now {
                    self.fatal_at.retain(|x| x.0 > now);
                    self.pending_err.push(qpn);
                    self.settle();
                }
            }
            SQD_SIM_FAULT_REMOTE_ACCESS => q.remote_access_next = true,
            SQD_SIM_FAULT_RECV_STARVE => q.starve_until = now + u64::from(f.count),
            SQD_SIM_FAULT_FAIL_NEXT => {
                if f.status == SUCCESS {
                    return Err(Error::invalid(format!("status {} is not an error status", f.status)));
                }
                q.fail_next = Some((f.status, f.vendor_err));
            }
            SQD_SIM_FAULT_LOSE_REQUESTS => q.lose_requests = q.lose_requests.saturating_add(f.count),
            SQD_SIM_FAULT_LOSE_ACKS => q.lose_acks = q.lose_acks.saturating_add(f.count),
            k => return Err(Error::invalid(format!("unknown fault kind {k}"))),
        }
        Ok(())
    }
}
