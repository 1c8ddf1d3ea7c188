//! The responder half of a QP (as rxe's `rxe_resp.c`): sequence checks, duplicates, RNR, executing requests
//! into memory and receives, and the coalesced ACK.

use rdma_sys::{ibv_event_type, ibv_wc_flags, ibv_wc_opcode, ibv_wc_status, ibv_wr_opcode};

use super::{MAX_RD_ATOMIC, Model};
use super::mr::{REMOTE_ATOMIC, REMOTE_READ, REMOTE_WRITE};
use super::opcode::is_atomic;
use super::qp::{QpModel, QpState, Recv};
use super::super::events::AsyncElement;
use super::wc::{Origin, SUCCESS, blank_wc, error_wc};
use super::wire::{Request, Response};

/// What the responder does with an in-sequence request.
enum Outcome {
    Ack,
    Respond(Response),
    Rnr,
    Nak(u32),
}

impl Model {
    /// Whether a receive is available to `q` now: in its own RQ, or in its SRQ (not in error).
    fn recv_ready(&self, q: &QpModel) -> bool {
        match q.srq {
            Some(k) => self.srqs.get(&k).is_some_and(|s| !s.in_error && !s.rq.is_empty()),
            None => !q.rq.is_empty(),
        }
    }

    /// Takes the oldest receive available to `q`. From an SRQ: a take that leaves fewer receives than its armed
    /// limit raises `IBV_EVENT_SRQ_LIMIT_REACHED` and disarms the limit ("arms the SRQ to produce an
    /// IBV_EVENT_SRQ_LIMIT_REACHED 'low watermark' asynchronous event once the number of WRs in the SRQ drops
    /// below srq_limit", `ibv_modify_srq(3)`; a limit of 0 means not armed, `ibv_query_srq(3)`).
    pub(super) fn take_recv(&mut self, q: &mut QpModel) -> Option<Recv> {
        let Some(k) = q.srq else { return q.rq.pop_front() };
        let srq = self.srqs.get_mut(&k)?;
        if srq.in_error {
            return None;
        }
        let r = srq.rq.pop_front()?;
        if srq.limit > 0 && srq.rq.len() < srq.limit as usize {
            srq.limit = 0;
            let obj = srq.obj;
            self.raise(ibv_event_type::IBV_EVENT_SRQ_LIMIT_REACHED, AsyncElement::Srq(obj));
        }
        Some(r)
    }

    pub(super) fn responder_tick(&mut self, q: &mut QpModel) {
        if q.state != QpState::Rts {
            return;
        }
        if q.ack_due.is_some_and(|at| at <= self.now) {
            q.ack_due = None;
            if let Some(peer) = q.peer {
                self.respond(q, peer, q.ack_psn, Response::Ack);
            }
        }
    }

    /// Sends the QP's coalesced ACK now, if one is due: a QP being destroyed acknowledges what it executed
    /// first, as an HCA's responder does before the receive completions it wrote can reach the program that
    /// then destroys the QP.
    pub(super) fn flush_ack(&mut self, q: &mut QpModel) {
        if q.state == QpState::Rts && q.ack_due.take().is_some() {
            if let Some(peer) = q.peer {
                self.respond(q, peer, q.ack_psn, Response::Ack);
            }
        }
    }

    pub(super) fn responder_rx(&mut self, q: &mut QpModel, src: u32, psn: u64, r: Request) {
        if q.state != QpState::Rts || q.peer != Some(src) {
            return; // a QP not ready to receive silently drops
        }
        if psn < q.epsn {
            // Duplicate (its ACK or response was lost, or go-back-N resent it): never executed twice, except
            // RDMA READ, which is re-read (IBA 9.7.5.1: duplicate READs are executed again; duplicate
            // atomics return the saved result).
            self.stats.duplicates += 1;
            if r.opcode == ibv_wr_opcode::IBV_WR_RDMA_READ {
                let resp = if q.scripted { Response::ReadData(Vec::new()) } else { self.read_remote(&r).unwrap_or(Response::Nak(ibv_wc_status::IBV_WC_REM_ACCESS_ERR)) };
                self.respond(q, src, psn, resp);
            } else if is_atomic(r.opcode) {
                if let Some(&(_, v)) = q.atomic_replay.iter().find(|(p, _)| *p == psn) {
                    self.respond(q, src, psn, Response::AtomicData(v));
                }
            } else {
                self.respond(q, src, q.epsn - 1, Response::Ack);
            }
            return;
        }
        if psn > q.epsn {
            // A request before this one was lost: one sequence-error NAK per gap, later packets dropped. After
            // an RNR NAK of the request at `epsn`, the requests pipelined behind it are dropped silently too: the
            // requester resumes from the RNR NAKed one after its back-off anyway, and a sequence-error NAK would
            // spend one of its transport retries for no loss at all (in an endless RNR stall, with nothing to
            // reload retry_cnt, enough of them would end the stalled WQE in RETRY_EXC_ERR though rnr_retry is 7).
            if !q.nak_seq_sent {
                q.nak_seq_sent = true;
                self.stats.seq_naks += 1;
                let epsn = q.epsn;
                self.respond(q, src, epsn, Response::SeqNak);
            }
            return;
        }
        q.nak_seq_sent = false;
        let outcome = if q.scripted { Self::sink_execute(&r) } else { self.execute(q, src, &r) };
        match outcome {
            Outcome::Ack => {
                q.epsn += 1;
                q.ack_psn = psn;
                if q.ack_due.is_none() {
                    q.ack_due = Some(self.now + u64::from(self.cfg.ack_delay));
                    self.active.insert(q.slot);
                }
                if self.cfg.ack_delay == 0 {
                    q.ack_due = None;
                    self.respond(q, src, psn, Response::Ack);
                }
            }
            Outcome::Respond(resp) => {
                if let Response::AtomicData(v) = resp {
                    // Kept for a duplicate of this atomic (its response lost): answered, never executed again.
                    q.atomic_replay.push_back((psn, v));
                    if q.atomic_replay.len() > MAX_RD_ATOMIC as usize {
                        q.atomic_replay.pop_front();
                    }
                }
                q.epsn += 1;
                q.ack_psn = psn;
                q.ack_due = None; // the response acknowledges every earlier request
                self.respond(q, src, psn, resp);
            }
            Outcome::Rnr => {
                self.stats.rnr_naks += 1;
                q.nak_seq_sent = true;
                q.ack_due = None;
                self.respond(q, src, psn, Response::RnrNak);
            }
            Outcome::Nak(status) => {
                q.ack_due = None;
                self.respond(q, src, psn, Response::Nak(status));
                // rxe (rxe_resp.c, class C errors such as an rkey violation): the responder QP goes to error.
                self.enter_error(q);
            }
        }
    }

    fn sink_execute(r: &Request) -> Outcome {
        match r.opcode {
            ibv_wr_opcode::IBV_WR_RDMA_READ => Outcome::Respond(Response::ReadData(Vec::new())),
            op if is_atomic(op) => Outcome::Respond(Response::AtomicData(0)),
            _ => Outcome::Ack,
        }
    }

    fn read_remote(&mut self, r: &Request) -> Option<Response> {
        if r.len == 0 {
            return Some(Response::ReadData(Vec::new()));
        }
        if !self.remote_ok(r.rkey, r.remote_addr, r.len, REMOTE_READ) {
            return None;
        }
        let mut data = vec![0u8; r.len as usize];
        if !self.mr_read(r.rkey, r.remote_addr, &mut data) {
            return None;
        }
        self.stats.bytes_read += r.len;
        Some(Response::ReadData(data))
    }

    /// Executes an in-sequence request at responder `q`.
    fn execute(&mut self, q: &mut QpModel, src: u32, r: &Request) -> Outcome {
        use ibv_wr_opcode::*;
        if r.force_access_err {
            return Outcome::Nak(ibv_wc_status::IBV_WC_REM_ACCESS_ERR);
        }
        let needs_recv = matches!(r.opcode, IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_SEND_WITH_INV | IBV_WR_RDMA_WRITE_WITH_IMM);
        if needs_recv && (self.now < q.starve_until || !self.recv_ready(q)) {
            return Outcome::Rnr; // IBA: receiver not ready, the requester retries after a delay
        }
        match r.opcode {
            IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_SEND_WITH_INV => {
                let recv = self.take_recv(q).expect("checked above");
                let mut wc = blank_wc();
                wc.wr_id = recv.wr_id;
                wc.qp_num = q.qpn;
                wc.src_qp = src;
                let fail = if r.len > recv.capacity() {
                    Some((ibv_wc_status::IBV_WC_LOC_LEN_ERR, ibv_wc_status::IBV_WC_REM_INV_REQ_ERR))
                } else if !self.dma_scatter(&recv.sges, &r.data) {
                    Some((ibv_wc_status::IBV_WC_LOC_PROT_ERR, ibv_wc_status::IBV_WC_REM_OP_ERR))
                } else if r.opcode == IBV_WR_SEND_WITH_INV && !self.invalidate(Some(q), r.imm, "SEND_WITH_INV at the responder invalidated") {
                    Some((ibv_wc_status::IBV_WC_LOC_PROT_ERR, ibv_wc_status::IBV_WC_REM_INV_REQ_ERR))
                } else {
                    None
                };
                if let Some((local, remote)) = fail {
                    let wc = error_wc(recv.wr_id, local, 0, q.qpn);
                    self.push_cqe(q, false, wc, Origin::Recv, false);
                    return Outcome::Nak(remote);
                }
                wc.status = SUCCESS;
                wc.opcode = ibv_wc_opcode::IBV_WC_RECV;
                wc.byte_len = r.len as u32;
                if r.opcode == IBV_WR_SEND_WITH_IMM {
                    wc.wc_flags = ibv_wc_flags::IBV_WC_WITH_IMM.0;
                    wc.imm_data_invalidated_rkey_union.imm_data = r.imm;
                } else if r.opcode == IBV_WR_SEND_WITH_INV {
                    wc.wc_flags = ibv_wc_flags::IBV_WC_WITH_INV.0;
                    wc.imm_data_invalidated_rkey_union.invalidated_rkey = r.imm;
                }
                self.push_cqe(q, false, wc, Origin::Recv, r.solicited);
                Outcome::Ack
            }
            IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => {
                // A zero-length RDMA WRITE touches no memory and needs no valid rkey (IBA C9-88, as rxe notes).
                if r.len > 0 {
                    if !self.remote_ok(r.rkey, r.remote_addr, r.len, REMOTE_WRITE) {
                        return Outcome::Nak(ibv_wc_status::IBV_WC_REM_ACCESS_ERR);
                    }
                    if !self.mr_write(r.rkey, r.remote_addr, &r.data) {
                        return Outcome::Nak(ibv_wc_status::IBV_WC_REM_ACCESS_ERR);
                    }
                    self.stats.bytes_written += r.len;
                }
                if r.opcode == IBV_WR_RDMA_WRITE_WITH_IMM {
                    let recv = self.take_recv(q).expect("checked above");
                    let mut wc = blank_wc();
                    wc.wr_id = recv.wr_id;
                    wc.qp_num = q.qpn;
                    wc.src_qp = src;
                    wc.opcode = ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM;
                    wc.byte_len = r.len as u32;
                    wc.wc_flags = ibv_wc_flags::IBV_WC_WITH_IMM.0;
                    wc.imm_data_invalidated_rkey_union.imm_data = r.imm;
                    self.push_cqe(q, false, wc, Origin::Recv, r.solicited);
                }
                Outcome::Ack
            }
            IBV_WR_RDMA_READ => match self.read_remote(r) {
                Some(resp) => Outcome::Respond(resp),
                None => Outcome::Nak(ibv_wc_status::IBV_WC_REM_ACCESS_ERR),
            },
            IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD => {
                if !self.remote_ok(r.rkey, r.remote_addr, 8, REMOTE_ATOMIC) {
                    return Outcome::Nak(ibv_wc_status::IBV_WC_REM_ACCESS_ERR);
                }
                let mut word = [0u8; 8];
                if !self.mr_read(r.rkey, r.remote_addr, &mut word) {
                    return Outcome::Nak(ibv_wc_status::IBV_WC_REM_ACCESS_ERR);
                }
                // Atomics operate on the target's native 64-bit word (the host's byte order here).
                let old = u64::from_ne_bytes(word);
                let new = if r.opcode == IBV_WR_ATOMIC_CMP_AND_SWP {
                    if old == r.compare_add {
                        r.swap
                    } else {
                        old
                    }
                } else {
                    old.wrapping_add(r.compare_add)
                };
                if !self.mr_write(r.rkey, r.remote_addr, &new.to_ne_bytes()) {
                    return Outcome::Nak(ibv_wc_status::IBV_WC_REM_ACCESS_ERR);
                }
                Outcome::Respond(Response::AtomicData(old))
            }
            _ => Outcome::Nak(ibv_wc_status::IBV_WC_REM_INV_REQ_ERR),
        }
    }
}
