//! QPs (as rxe's `rxe_qp.c`): the QP record with its send and receive queues, creation, connection (to
//! RTS), destruction, and the move to the error state that flushes everything outstanding.

use std::collections::VecDeque;

use rdma_sys::{ibv_event_type, ibv_qp, ibv_qp_init_attr, ibv_qp_state, ibv_qp_type};

use crate::{Error, Result};
use crate::scriptable::{ScriptedQpCaps, ScriptedQpStats, ScriptedWqe};
use super::{MAX_INLINE, MAX_RD_ATOMIC, MAX_SGE, MAX_WR, Model, key};
use super::super::SimConnAttr;
use super::super::events::AsyncElement;
use super::wc::{FLUSH, Origin, error_wc};
use super::wr::Sge;

pub(super) struct Wqe {
    pub(super) index: u64,
    pub(super) wr_id: u64,
    pub(super) opcode: u32,
    pub(super) signaled: bool,
    pub(super) fence: bool,
    /// `IBV_SEND_SOLICITED`: the receive completion it causes at the responder is solicited.
    pub(super) solicited: bool,
    pub(super) sges: Vec<Sge>,
    pub(super) inline: Option<Vec<u8>>,
    pub(super) len: u64,
    pub(super) remote_addr: u64,
    pub(super) rkey: u32,
    pub(super) imm: u32,
    pub(super) compare_add: u64,
    pub(super) swap: u64,
    /// Assigned at first transmission (remote opcodes only).
    pub(super) psn: Option<u64>,
    /// Transmissions so far (local ops: 1 once executed).
    pub(super) tx_count: u32,
    /// Step of the last (re)transmission.
    pub(super) sent_at: u64,
    /// The bytes read from the SGEs at first transmission, kept until the WQE is finished.
    pub(super) image: Option<Vec<u8>>,
    pub(super) modified_logged: bool,
    /// The HCA is finished with it: acknowledged (or executed, for local ops), failed, or flushed.
    pub(super) done: bool,
    pub(super) status: u32,
    pub(super) vendor_err: u32,
}

pub(super) struct Recv {
    pub(super) wr_id: u64,
    pub(super) sges: Vec<Sge>,
}

impl Recv {
    pub(super) fn capacity(&self) -> u64 {
        self.sges.iter().map(|s| u64::from(s.len)).sum()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum QpState {
    Init,
    Rts,
    Err,
}

pub(super) struct QpModel {
    pub(super) obj: *mut ibv_qp,
    pub(super) qpn: u32,
    /// Its index in `Model::qps`.
    pub(super) slot: usize,
    /// The SRQ (key) it takes its receives from, if made on one.
    pub(super) srq: Option<usize>,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED` was raised for it.
    last_wqe_raised: bool,
    pub(super) caps: ScriptedQpCaps,
    pub(super) sig_all: bool,
    pub(super) send_cq: usize,
    pub(super) recv_cq: usize,
    /// Made through `Scriptable::create_qp`: connected to an internal sink, moves no data.
    pub(super) scripted: bool,
    pub(super) peer: Option<u32>,
    pub(super) conn: SimConnAttr,
    pub(super) state: QpState,

    // ---- send queue (requester) ----
    /// Records of send WQEs `[base, posted)` (empty in null mode).
    pub(super) sq: VecDeque<Wqe>,
    /// Slots below `base` are free (a CQE at or after them was polled).
    pub(super) base: u64,
    pub(super) posted: u64,
    /// Next WQE to transmit (or retransmit, after a rewind).
    pub(super) next_tx: u64,
    /// Next WQE to complete, in order.
    pub(super) next_complete: u64,
    pub(super) next_psn: u64,
    pub(super) retries: u32,
    pub(super) rnr_count: u32,
    pub(super) last_progress: u64,
    pub(super) rnr_wait_until: u64,
    pub(super) fail_next: Option<(u32, u32)>,
    pub(super) lose_requests: u32,
    pub(super) lose_acks: u32,
    pub(super) remote_access_next: bool,
    pub(super) completed_total: u64,

    // ---- receive queue and responder ----
    pub(super) rq: VecDeque<Recv>,
    pub(super) recv_held: usize,
    pub(super) starve_until: u64,
    /// Expected PSN of the next new request.
    pub(super) epsn: u64,
    /// Coalesced ACK: the step it leaves and the PSN it carries.
    pub(super) ack_due: Option<u64>,
    pub(super) ack_psn: u64,
    /// A NAK naming `epsn` was sent (a sequence error, or an RNR NAK of the request at `epsn`): the requester
    /// knows where to resume, so later requests are dropped silently until `epsn` arrives again.
    pub(super) nak_seq_sent: bool,
    /// Results of recent atomics by PSN, replayed for duplicates (IBA: atomics are not re-executed).
    pub(super) atomic_replay: VecDeque<(u64, u64)>,

    pub(super) history: Vec<ScriptedWqe>,
    pub(super) stats: ScriptedQpStats,
}

impl Drop for QpModel {
    fn drop(&mut self) {
        // SAFETY: `obj` came from `Box::into_raw` in `Model::create_qp` and is freed only here, once.
        drop(unsafe { Box::from_raw(self.obj) });
    }
}

impl QpModel {
    pub(super) fn wqe(&self, index: u64) -> &Wqe {
        &self.sq[(index - self.base) as usize]
    }
    pub(super) fn wqe_mut(&mut self, index: u64) -> &mut Wqe {
        &mut self.sq[(index - self.base) as usize]
    }
    pub(super) fn index_of_psn(&self, psn: u64) -> Option<u64> {
        self.sq.iter().find(|w| w.psn == Some(psn)).map(|w| w.index)
    }
    fn set_obj_state(&mut self, state: ibv_qp_state::Type) {
        // SAFETY: `obj` is owned by this model and alive; no reference to it is held across this write (one
        // thread at a time). `state` is the cached state verbs users may read.
        unsafe { (*self.obj).state = state };
    }
}

impl Model {
    /// Puts every QP queued for error (an overrun of its CQ, an injected fatal error) in error, raising
    /// `IBV_EVENT_QP_FATAL` ("Error occurred on a QP and it transitioned to error state",
    /// `ibv_get_async_event(3)`) for each that was not in error yet: no CQE of its own tells the ULP.
    pub(super) fn settle(&mut self) {
        while let Some(qpn) = self.pending_err.pop() {
            if let Some(&slot) = self.qp_by_num.get(&qpn) {
                self.with_slot(slot, |m, q| {
                    if q.state != QpState::Err {
                        m.raise(ibv_event_type::IBV_EVENT_QP_FATAL, AsyncElement::Qp(q.obj));
                    }
                    m.enter_error(q);
                });
            }
        }
    }

    /// Moves a QP to the error state: every unfinished send WQE flushes (after any WQE that already failed,
    /// in order), then every posted receive (IBA 10.7.3.1 as quoted by rxe: a WC for every WR completed in
    /// error, signaled or not). Packets to a QP in error are dropped.
    pub(super) fn enter_error(&mut self, q: &mut QpModel) {
        if q.state != QpState::Err {
            q.state = QpState::Err;
            q.stats.in_error = true;
            q.set_obj_state(ibv_qp_state::IBV_QPS_ERR);
            q.ack_due = None;
            q.fail_next = None;
        }
        self.complete_ready(q);
        while let Some(r) = q.rq.pop_front() {
            let wc = error_wc(r.wr_id, FLUSH, 0, q.qpn);
            self.push_cqe(q, false, wc, Origin::Recv, false);
        }
        // A QP on an SRQ: the SRQ's receives stay for the other QPs. Messages are single packets here, so a
        // receive is consumed and completed in the same step and none is ever in progress when the QP fails:
        // its last consumed WQE has completed, and the device says so at once with
        // IBV_EVENT_QP_LAST_WQE_REACHED ("Last WQE Reached on a QP associated with an SRQ",
        // ibv_get_async_event(3)).
        if q.srq.is_some() && !q.last_wqe_raised {
            q.last_wqe_raised = true;
            self.raise(ibv_event_type::IBV_EVENT_QP_LAST_WQE_REACHED, AsyncElement::Qp(q.obj));
        }
    }

    pub(crate) fn create_qp(&mut self, attr: &mut ibv_qp_init_attr, scripted: bool) -> Result<*mut ibv_qp> {
        for (cq, name) in [(attr.send_cq, "send_cq"), (attr.recv_cq, "recv_cq")] {
            if !self.owns_cq(cq) {
                return Err(Error::invalid(format!("{name} {cq:p} is not a CQ of this sim device")));
            }
        }
        if attr.qp_type != ibv_qp_type::IBV_QPT_RC {
            return Err(Error::invalid(format!("qp_type {} is not supported: the sim models RC QPs only", attr.qp_type)));
        }
        let srq = if attr.srq.is_null() {
            None
        } else if self.owns_srq(attr.srq) {
            Some(key(attr.srq))
        } else {
            return Err(Error::invalid(format!("srq {:p} is not an SRQ of this sim device", attr.srq)));
        };
        if self.next_qpn > 0x00ff_ffff {
            return Err(Error::new(libc::ENOSPC, "sim ran out of QP numbers"));
        }
        let c = &mut attr.cap;
        c.max_send_wr = c.max_send_wr.clamp(1, MAX_WR);
        c.max_recv_wr = c.max_recv_wr.clamp(1, MAX_WR);
        c.max_send_sge = c.max_send_sge.clamp(1, MAX_SGE);
        c.max_recv_sge = c.max_recv_sge.clamp(1, MAX_SGE);
        c.max_inline_data = c.max_inline_data.min(MAX_INLINE);
        if srq.is_some() {
            // Receives come from the SRQ: the QP has no receive queue of its own (verbs ignores these caps).
            c.max_recv_wr = 0;
            c.max_recv_sge = 0;
        }
        let caps = ScriptedQpCaps {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        };
        let qpn = self.next_qpn;
        self.next_qpn += 1;
        let ready = scripted || self.null();
        // SAFETY: `ibv_qp` is plain data (pointers, ints, zero-initializable pthread objects): zero is valid.
        let mut obj: Box<ibv_qp> = Box::new(unsafe { std::mem::zeroed() });
        obj.context = self.ctx;
        obj.qp_context = attr.qp_context;
        obj.pd = self.pd;
        obj.send_cq = attr.send_cq;
        obj.recv_cq = attr.recv_cq;
        obj.srq = attr.srq;
        obj.qp_num = qpn;
        obj.handle = qpn;
        obj.qp_type = ibv_qp_type::IBV_QPT_RC;
        obj.state = if ready { ibv_qp_state::IBV_QPS_RTS } else { ibv_qp_state::IBV_QPS_INIT };
        let obj = Box::into_raw(obj);
        for cq in [attr.send_cq, attr.recv_cq] {
            if let Some(cq) = self.cqs.get_mut(&key(cq)) {
                *cq.users.entry(qpn).or_insert(0) += 1;
            }
        }
        if let Some(s) = srq.and_then(|k| self.srqs.get_mut(&k)) {
            s.users += 1;
        }
        let slot = self.qps.len();
        let q = QpModel {
            obj,
            qpn,
            slot,
            srq,
            last_wqe_raised: false,
            caps,
            sig_all: attr.sq_sig_all != 0,
            send_cq: key(attr.send_cq),
            recv_cq: key(attr.recv_cq),
            scripted,
            peer: scripted.then_some(qpn),
            conn: SimConnAttr::default(),
            state: if ready { QpState::Rts } else { QpState::Init },
            sq: VecDeque::new(),
            base: 0,
            posted: 0,
            next_tx: 0,
            next_complete: 0,
            next_psn: 0,
            retries: 0,
            rnr_count: 0,
            last_progress: self.now,
            rnr_wait_until: 0,
            fail_next: None,
            lose_requests: 0,
            lose_acks: 0,
            remote_access_next: false,
            completed_total: 0,
            rq: VecDeque::new(),
            recv_held: 0,
            starve_until: 0,
            epsn: 0,
            ack_due: None,
            ack_psn: 0,
            nak_seq_sent: false,
            atomic_replay: VecDeque::new(),
            history: Vec::new(),
            stats: ScriptedQpStats::default(),
        };
        self.qps.push(Some(q));
        self.qp_by_ptr.insert(key(obj), slot);
        self.qp_by_num.insert(qpn, slot);
        Ok(obj)
    }

    pub(crate) fn connect(&mut self, a: *mut ibv_qp, b: *mut ibv_qp, attr: &SimConnAttr) -> Result<()> {
        check_conn_attr(attr)?;
        let (sa, sb) = (self.slot_of(a)?, self.slot_of(b)?);
        if sa == sb {
            return Err(Error::invalid("a QP cannot be connected to itself"));
        }
        for s in [sa, sb] {
            let q = self.qps[s].as_ref().expect("no QP is taken out between calls");
            if q.peer.is_some() {
                return Err(Error::invalid(format!("qp {:#x} is already connected", q.qpn)));
            }
            if q.state == QpState::Err {
                return Err(Error::invalid(format!("qp {:#x} is in the error state", q.qpn)));
            }
        }
        let (na, nb) = (self.qps[sa].as_ref().unwrap().qpn, self.qps[sb].as_ref().unwrap().qpn);
        let now = self.now;
        for (s, peer) in [(sa, nb), (sb, na)] {
            let q = self.qps[s].as_mut().unwrap();
            q.peer = Some(peer);
            q.conn = *attr;
            q.state = QpState::Rts;
            q.last_progress = now;
            q.set_obj_state(ibv_qp_state::IBV_QPS_RTS);
        }
        Ok(())
    }

    /// Connects one QP to the QP numbered `dest_qpn` (which need not exist yet, nor be connected back), as
    /// `ibv_modify_qp` to RTR with `dest_qp_num` does on one side: its requests go to that number from now on,
    /// and it accepts requests from that number only. Until the peer is connected back, the peer drops them and
    /// this QP retransmits, as a real RC QP whose peer is not yet in RTR.
    pub(crate) fn connect_to(&mut self, qp: *mut ibv_qp, dest_qpn: u32, attr: &SimConnAttr) -> Result<()> {
        check_conn_attr(attr)?;
        let slot = self.slot_of(qp)?;
        let now = self.now;
        let q = self.qps[slot].as_mut().expect("no QP is taken out between calls");
        if q.state == QpState::Err {
            return Err(Error::invalid(format!("qp {:#x} is in the error state", q.qpn)));
        }
        if q.peer.is_some_and(|p| p != dest_qpn) {
            return Err(Error::invalid(format!("qp {:#x} is already connected to qp {:#x}", q.qpn, q.peer.unwrap_or(0))));
        }
        q.peer = Some(dest_qpn);
        q.conn = *attr;
        if q.state != QpState::Rts {
            q.state = QpState::Rts;
            q.last_progress = now;
            q.set_obj_state(ibv_qp_state::IBV_QPS_RTS);
        }
        Ok(())
    }

    pub(crate) fn set_error(&mut self, qp: *mut ibv_qp) -> Result<()> {
        self.with_qp(qp, |m, q| m.enter_error(q))
    }

    pub(crate) fn destroy_qp(&mut self, qp: *mut ibv_qp) -> Result<()> {
        let slot = self.slot_of(qp)?;
        let mut q = self.qps[slot].take().expect("no QP is taken out between calls");
        self.flush_ack(&mut q);
        self.qp_by_ptr.remove(&key(qp));
        self.qp_by_num.remove(&q.qpn);
        self.active.remove(&slot);
        // Receive CQEs removed unpolled: for a QP on an SRQ their slots go back to the SRQ.
        let mut recvs_removed = 0usize;
        for cq_key in [q.send_cq, q.recv_cq] {
            if let Some(cq) = self.cqs.get_mut(&cq_key) {
                if let Some(n) = cq.users.get_mut(&q.qpn) {
                    *n -= 1;
                    if *n == 0 {
                        cq.users.remove(&q.qpn);
                    }
                }
                cq.entries.retain(|e| {
                    let mine = e.qpn == q.qpn;
                    recvs_removed += usize::from(mine && e.origin == Origin::Recv);
                    !mine
                });
            }
        }
        if let Some(s) = q.srq.and_then(|k| self.srqs.get_mut(&k)) {
            s.users -= 1;
            s.held = s.held.saturating_sub(recvs_removed);
        }
        self.async_events.retain(|e| !e.names(key(qp)));
        self.async_fd.set(!self.async_events.is_empty());
        drop(q);
        Ok(())
    }
}

fn check_conn_attr(attr: &SimConnAttr) -> Result<()> {
    if attr.rnr_retry > 7 || attr.retry_cnt > 7 || !(1..=MAX_RD_ATOMIC).contains(&attr.max_rd_atomic) {
        return Err(Error::invalid(format!(
            "connection attributes out of range: rnr_retry {} (0..=7), retry_cnt {} (0..=7), max_rd_atomic {} (1..={MAX_RD_ATOMIC})",
            attr.rnr_retry, attr.retry_cnt, attr.max_rd_atomic
        )));
    }
    Ok(())
}
