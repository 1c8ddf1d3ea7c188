//! The requester half of a QP (as rxe's `rxe_req.c`): the retransmission timer, going back to a WQE, and
//! transmitting WQEs (source memory read at every (re)transmission, fences, `max_rd_atomic`).

use rdma_sys::ibv_wc_status;

use super::Model;
use super::opcode::{carries_data, is_local, is_read_or_atomic};
use super::qp::{QpModel, QpState};
use super::super::{SQD_SIM_VIOLATION_SOURCE_MODIFIED, violation_kind_str};
use super::wc::SUCCESS;
use super::wire::{Body, Packet, Request, take_one};

impl Model {
    /// Go back to `index`: it and every later unfinished remote WQE are sent again.
    pub(super) fn rewind(&mut self, q: &mut QpModel, index: u64) {
        q.next_tx = q.next_tx.min(index);
        q.last_progress = self.now;
    }

    pub(super) fn requester_tick(&mut self, q: &mut QpModel) {
        if q.state != QpState::Rts || q.peer.is_none() || self.now < q.rnr_wait_until {
            return;
        }
        let timeout = u64::from(self.cfg.retrans_timeout);
        if self.now - q.last_progress >= timeout {
            // The oldest transmitted, unacknowledged WQE: resent when its last transmission is that old too.
            let oldest = q
                .sq
                .iter()
                .skip((q.next_complete - q.base) as usize)
                .take_while(|w| w.index < q.next_tx)
                .find(|w| !w.done && w.tx_count > 0 && !is_local(w.opcode))
                .map(|w| (w.index, w.sent_at));
            match oldest {
                Some((i, sent_at)) if self.now - sent_at >= timeout => {
                    self.stats.timeouts += 1;
                    q.retries += 1;
                    if q.retries > q.conn.retry_cnt {
                        self.fail_wqe(q, i, ibv_wc_status::IBV_WC_RETRY_EXC_ERR, 0);
                        return;
                    }
                    self.rewind(q, i);
                }
                Some(_) => {}
                None => q.last_progress = self.now,
            }
        }
        self.transmit(q);
        if q.state == QpState::Rts {
            self.complete_ready(q);
        }
    }

    /// Whether every WQE before `index` is done (acknowledged or executed).
    fn all_before_done(q: &QpModel, index: u64) -> bool {
        q.sq.iter().take_while(|w| w.index < index).all(|w| w.done)
    }

    fn transmit(&mut self, q: &mut QpModel) {
        let mut budget = self.cfg.tx_per_step;
        while budget > 0 && q.state == QpState::Rts && q.next_tx < q.posted {
            let index = q.next_tx;
            let w = q.wqe(index);
            if w.done {
                if w.status != SUCCESS {
                    break; // a failed WQE stops the requester until its error completes
                }
                q.next_tx += 1;
                continue;
            }
            let (opcode, first, fence, rkey) = (w.opcode, w.tx_count == 0, w.fence, w.imm);
            if is_local(opcode) {
                // LocalInv executes when it reaches the head of execution, without waiting for earlier WQEs'
                // ACKs (IBA Table 79: 'L', not ordered) — unless it carries the fence, which mlx5 implements
                // as the Local Invalidate Fence (IBA 10.6.5.1): wait until every earlier WQE is done.
                if fence && !Self::all_before_done(q, index) {
                    break;
                }
                let qpn = q.qpn;
                let ok = self.invalidate(Some(q), rkey, &format!("LOCAL_INV (WQE #{index} of qp {qpn:#x}) invalidated"));
                let w = q.wqe_mut(index);
                w.tx_count = 1;
                q.next_tx += 1;
                budget -= 1;
                if ok {
                    q.wqe_mut(index).done = true;
                } else {
                    // Model's choice for an unknown or already invalid key: a local QP operation error.
                    self.fail_wqe(q, index, ibv_wc_status::IBV_WC_LOC_QP_OP_ERR, 0);
                }
                continue;
            }
            if first {
                if let Some((status, vendor_err)) = q.fail_next.take() {
                    self.fail_wqe(q, index, status, vendor_err);
                    break;
                }
                if fence && !q.sq.iter().take_while(|x| x.index < index).all(|x| x.done || !is_read_or_atomic(x.opcode)) {
                    break; // IBA 10.8.3.3: a fenced WQE waits for earlier RDMA READ and atomics
                }
                if is_read_or_atomic(opcode) {
                    let outstanding = q.sq.iter().take_while(|x| x.index < index).filter(|x| !x.done && x.tx_count > 0 && is_read_or_atomic(x.opcode)).count();
                    if outstanding as u32 >= q.conn.max_rd_atomic {
                        break; // head-of-line stall at max_rd_atomic
                    }
                }
            }
            // DMA: the source is read now, and again at every retransmission.
            let data = if q.scripted || !carries_data(opcode) {
                Vec::new()
            } else if let Some(inline) = &q.wqe(index).inline {
                inline.clone()
            } else {
                let sges = std::mem::take(&mut q.wqe_mut(index).sges);
                let r = self.dma_read(&sges);
                q.wqe_mut(index).sges = sges;
                match r {
                    Ok(d) => d,
                    Err(_) => {
                        self.fail_wqe(q, index, ibv_wc_status::IBV_WC_LOC_PROT_ERR, 0);
                        break;
                    }
                }
            };
            let psn = if first {
                let psn = q.next_psn;
                q.next_psn += 1;
                let w = q.wqe_mut(index);
                w.psn = Some(psn);
                if w.inline.is_none() && !data.is_empty() {
                    w.image = Some(data.clone());
                }
                psn
            } else {
                self.stats.retransmissions += 1;
                let qpn = q.qpn;
                let w = q.wqe_mut(index);
                let modified = w.image.as_ref().is_some_and(|img| *img != data) && !w.modified_logged;
                if modified {
                    w.modified_logged = true;
                    let first_diff = w.image.as_ref().unwrap().iter().zip(&data).position(|(a, b)| a != b).unwrap_or(0);
                    let text = format!(
                        "{}: retransmission #{} of send WQE #{index} (wr_id {:#x}) of qp {qpn:#x} read source bytes that \
                         differ from its first transmission (first difference at byte {first_diff}): the buffer was \
                         reused before a completion covered the WQE",
                        violation_kind_str(SQD_SIM_VIOLATION_SOURCE_MODIFIED),
                        w.tx_count,
                        w.wr_id
                    );
                    self.violation(Some(q), SQD_SIM_VIOLATION_SOURCE_MODIFIED, Some(index), text);
                }
                q.wqe(index).psn.expect("transmitted before")
            };
            let force_access_err = first && std::mem::take(&mut q.remote_access_next);
            let w = q.wqe_mut(index);
            w.tx_count += 1;
            w.sent_at = self.now;
            let req = Request {
                opcode,
                len: w.len,
                data,
                remote_addr: w.remote_addr,
                rkey: w.rkey,
                imm: w.imm,
                compare_add: w.compare_add,
                swap: w.swap,
                solicited: w.solicited,
                force_access_err,
            };
            if first && !q.sq.iter().any(|x| x.index < index && !x.done && x.tx_count > 0) {
                q.last_progress = self.now; // the timer starts with the first outstanding request
            }
            self.stats.packets += 1;
            let lose = take_one(&mut q.lose_requests);
            let peer = q.peer.expect("checked by requester_tick");
            self.send_packet(Packet { src: q.qpn, dst: peer, psn, body: Body::Req(req) }, lose);
            q.next_tx += 1;
            budget -= 1;
        }
    }
}
