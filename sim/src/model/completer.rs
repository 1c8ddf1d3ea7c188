//! Acknowledgements and in-order completion (as rxe's `rxe_comp.c`): ACKs, READ/atomic responses, NAKs and
//! retry counters, failing a WQE, and completing send WQEs in SQ order.

use rdma_sys::ibv_wc_status;

use super::Model;
use super::opcode::{is_atomic, is_read_or_atomic, wc_opcode};
use super::qp::{QpModel, QpState};
use super::super::SQD_SIM_RNR_RETRY_FOREVER;
use super::wc::{FLUSH, GARBAGE, Origin, SUCCESS, blank_wc, error_wc};
use super::wire::Response;

impl Model {
    /// Completes send WQEs in SQ order as far as they are done. The first one that failed is the QP's one error
    /// CQE: the QP goes to error with it. In the error state every WQE not completed yet flushes — even one
    /// already acknowledged behind an unfinished one, or a LocalInv that already executed — so a send queue's
    /// CQEs are always successes, then at most one error, then flushes (an RC requester completes in order,
    /// and once a WQE completed in error every later one completes with a flush).
    pub(super) fn complete_ready(&mut self, q: &mut QpModel) {
        while q.next_complete < q.posted {
            let index = q.next_complete;
            let in_error = q.state == QpState::Err;
            let qpn = q.qpn;
            let w = q.wqe_mut(index);
            if !w.done && !in_error {
                break;
            }
            if in_error {
                w.done = true;
                w.status = FLUSH;
            }
            w.image = None;
            let (status, signaled) = (w.status, w.signaled);
            let wc = if status == SUCCESS {
                let mut wc = blank_wc();
                wc.wr_id = w.wr_id;
                wc.status = SUCCESS;
                wc.opcode = wc_opcode(w.opcode).unwrap_or(GARBAGE);
                wc.byte_len = if is_atomic(w.opcode) { 8 } else { w.len.min(u64::from(u32::MAX)) as u32 };
                wc.qp_num = qpn;
                wc
            } else {
                error_wc(w.wr_id, status, w.vendor_err, qpn)
            };
            q.next_complete += 1;
            q.next_tx = q.next_tx.max(q.next_complete);
            q.completed_total += 1;
            if status == FLUSH {
                // counted by push_cqe
            } else {
                q.stats.executed += 1;
            }
            if let Some(h) = q.history.get_mut(index as usize) {
                h.status = status;
                h.executed = status != FLUSH;
                h.flushed = status == FLUSH;
            }
            if signaled || status != SUCCESS {
                self.push_cqe(q, true, wc, Origin::Send(index), false);
            }
            if !in_error && status != SUCCESS {
                self.enter_error(q); // flushes the rest
                return;
            }
        }
    }

    /// The WQE fails with `status`. The requester stops there (nothing at or after it is sent again); the
    /// earlier WQEs still in flight go on, are retransmitted as needed and complete first. Once they all have,
    /// this WQE completes with its error and the QP goes to error; if one of them fails first, that one is
    /// the error and this one flushes.
    pub(super) fn fail_wqe(&mut self, q: &mut QpModel, index: u64, status: u32, vendor_err: u32) {
        let w = q.wqe_mut(index);
        w.done = true;
        w.status = status;
        w.vendor_err = vendor_err;
        w.image = None;
        self.complete_ready(q);
    }

    /// A cumulative acknowledgement of every request up to `psn` (IBA: an ACK acknowledges all earlier PSNs).
    /// An RDMA READ / atomic so covered without its response had its response lost (an implicit NAK): the
    /// acknowledgement stops there, and the requester goes back to it — it and every request after it are sent
    /// again (go-back-N, as rxe's completer does); the responder reads a duplicate READ again and answers a
    /// duplicate atomic from its replay record. Returns false after such an implicit NAK: the caller then
    /// ignores the rest of the packet, which is about a request after the missing response.
    fn ack_through(&mut self, q: &mut QpModel, psn: u64) -> bool {
        let mut progressed = false;
        let mut implicit_nak = None;
        let start = (q.next_complete - q.base) as usize;
        for w in q.sq.iter_mut().skip(start) {
            let Some(p) = w.psn else { continue };
            if p > psn {
                break;
            }
            if w.done {
                continue;
            }
            if is_read_or_atomic(w.opcode) {
                implicit_nak = Some(w.index);
                break;
            }
            w.done = true;
            w.image = None;
            progressed = true;
        }
        if progressed {
            q.retries = 0;
            q.rnr_count = 0;
            q.last_progress = self.now;
        }
        match implicit_nak {
            Some(i) => {
                self.rewind(q, i);
                false
            }
            None => true,
        }
    }

    pub(super) fn requester_rx(&mut self, q: &mut QpModel, psn: u64, r: Response) {
        if q.state != QpState::Rts {
            return;
        }
        // Every response acknowledges the requests before its PSN; one that comes after a missing READ/atomic
        // response is an implicit NAK of that READ/atomic and says nothing else the requester acts on.
        let in_order = matches!(r, Response::Ack) || psn.checked_sub(1).is_none_or(|p| self.ack_through(q, p));
        if in_order {
            self.requester_rx_in_order(q, psn, r);
        }
        if q.state == QpState::Rts {
            self.complete_ready(q);
        }
    }

    /// A response whose PSN follows every request the requester has a response for.
    fn requester_rx_in_order(&mut self, q: &mut QpModel, psn: u64, r: Response) {
        match r {
            Response::Ack => {
                self.ack_through(q, psn);
            }
            Response::ReadData(data) => {
                if let Some(i) = q.index_of_psn(psn) {
                    self.read_response(q, i, Some(&data), 0);
                }
            }
            Response::AtomicData(v) => {
                if let Some(i) = q.index_of_psn(psn) {
                    self.read_response(q, i, None, v);
                }
            }
            Response::RnrNak => {
                let Some(i) = q.index_of_psn(psn) else { return };
                if q.wqe(i).done {
                    return;
                }
                q.rnr_count += 1;
                if q.conn.rnr_retry != SQD_SIM_RNR_RETRY_FOREVER && q.rnr_count > q.conn.rnr_retry {
                    self.fail_wqe(q, i, ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR, 0);
                } else {
                    q.rnr_wait_until = self.now + u64::from(self.cfg.rnr_delay);
                    self.rewind(q, i);
                }
            }
            Response::SeqNak => {
                let Some(i) = q.index_of_psn(psn) else { return };
                if q.wqe(i).done || q.next_tx <= i {
                    return;
                }
                q.retries += 1;
                if q.retries > q.conn.retry_cnt {
                    self.fail_wqe(q, i, ibv_wc_status::IBV_WC_RETRY_EXC_ERR, 0);
                } else {
                    self.rewind(q, i);
                }
            }
            Response::Nak(status) => {
                if let Some(i) = q.index_of_psn(psn) {
                    if !q.wqe(i).done {
                        self.fail_wqe(q, i, status, 0);
                    }
                }
            }
        }
    }

    /// An RDMA READ or atomic response: the data is written into the WQE's local SGEs (which need local write).
    fn read_response(&mut self, q: &mut QpModel, index: u64, data: Option<&[u8]>, atomic: u64) {
        let (done, scripted) = (q.wqe(index).done, q.scripted);
        if done {
            return;
        }
        let bytes = atomic.to_ne_bytes();
        let data = data.unwrap_or(&bytes);
        let sges = std::mem::take(&mut q.wqe_mut(index).sges);
        let ok = scripted || self.dma_scatter(&sges, data);
        q.wqe_mut(index).sges = sges;
        if !ok {
            self.fail_wqe(q, index, ibv_wc_status::IBV_WC_LOC_PROT_ERR, 0);
            return;
        }
        q.wqe_mut(index).done = true;
        q.retries = 0;
        q.rnr_count = 0;
        q.last_progress = self.now;
    }
}
