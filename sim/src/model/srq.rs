//! Shared receive queues (as rxe's `rxe_srq.c`): creation, the limit event, the SRQ error, destruction and
//! posting receives to it.

use std::collections::VecDeque;

use rdma_sys::{ibv_event_type, ibv_srq, ibv_srq_init_attr};

use crate::{Error, Result};
use super::{MAX_SGE, MAX_WR, Model, key};
use super::qp::Recv;
use super::super::{SQD_SIM_VIOLATION_BAD_WR, SQD_SIM_VIOLATION_RQ_OVERFLOW, violation_kind_str};
use super::super::events::AsyncElement;
use super::wr::RecvRequest;

/// A shared receive queue: receives posted to it are consumed, oldest first, by any QP made on it.
pub(super) struct SrqModel {
    pub(super) obj: *mut ibv_srq,
    pub(super) rq: VecDeque<Recv>,
    /// Receives posted and not yet freed (a receive's slot is freed when its CQE is polled, as for an RQ).
    pub(super) held: usize,
    max_wr: u32,
    max_sge: u32,
    /// Armed limit (0: not armed).
    pub(super) limit: u32,
    /// QPs made on it.
    pub(super) users: usize,
    pub(super) in_error: bool,
}

impl Drop for SrqModel {
    fn drop(&mut self) {
        // SAFETY: `obj` came from `Box::into_raw` in `Model::create_srq` and is freed only here, once.
        drop(unsafe { Box::from_raw(self.obj) });
    }
}

impl Model {
    /// `ibv_create_srq`: `attr.max_wr` and `attr.max_sge` are clamped to the device limits and written back
    /// ("set to the actual values allocated on return", `ibv_create_srq(3)`); `attr.srq_limit` is ignored (the
    /// limit is armed by modifying it).
    pub(crate) fn create_srq(&mut self, attr: &mut ibv_srq_init_attr) -> Result<*mut ibv_srq> {
        attr.attr.max_wr = attr.attr.max_wr.clamp(1, MAX_WR);
        attr.attr.max_sge = attr.attr.max_sge.clamp(1, MAX_SGE);
        // SAFETY: `ibv_srq` is plain data (pointers, ints, zero-initializable pthread objects): zero is valid.
        let mut obj: Box<ibv_srq> = Box::new(unsafe { std::mem::zeroed() });
        obj.context = self.ctx;
        obj.pd = self.pd;
        obj.srq_context = attr.srq_context;
        obj.handle = self.srqs.len() as u32 + 1;
        let obj = Box::into_raw(obj);
        self.srqs.insert(
            key(obj),
            SrqModel {
                obj,
                rq: VecDeque::new(),
                held: 0,
                max_wr: attr.attr.max_wr,
                max_sge: attr.attr.max_sge,
                limit: 0,
                users: 0,
                in_error: false,
            },
        );
        Ok(obj)
    }

    pub(crate) fn owns_srq(&self, srq: *mut ibv_srq) -> bool {
        self.srqs.contains_key(&key(srq))
    }

    fn srq_mut(&mut self, srq: *mut ibv_srq) -> Result<&mut SrqModel> {
        self.srqs.get_mut(&key(srq)).ok_or_else(|| Error::invalid(format!("srq {srq:p} is not an SRQ of this sim device")))
    }

    /// `EBUSY` while a QP uses it. Receives still posted are dropped (the SRQ has no CQ to flush them to).
    pub(crate) fn destroy_srq(&mut self, srq: *mut ibv_srq) -> Result<()> {
        let s = self.srq_mut(srq)?;
        if s.users > 0 {
            return Err(Error::new(libc::EBUSY, format!("srq {srq:p} is still used by {} QP(s)", s.users)));
        }
        self.srqs.remove(&key(srq));
        self.async_events.retain(|e| !e.names(key(srq)));
        self.async_fd.set(!self.async_events.is_empty());
        Ok(())
    }

    /// `ibv_modify_srq` with `IBV_SRQ_LIMIT`: arms (or, with 0, disarms) the limit event. `EINVAL` above
    /// `max_wr`.
    pub(crate) fn modify_srq_limit(&mut self, srq: *mut ibv_srq, limit: u32) -> Result<()> {
        let s = self.srq_mut(srq)?;
        if limit > s.max_wr {
            return Err(Error::invalid(format!("srq_limit {limit} is above the SRQ's max_wr {}", s.max_wr)));
        }
        s.limit = limit;
        Ok(())
    }

    /// The SRQ fails (a catastrophic SRQ error): `IBV_EVENT_SRQ_ERR` ("Error occurred on an SRQ",
    /// `ibv_get_async_event(3)`); it hands out no more receives, refuses posts, and every QP on it goes to
    /// error (each then gets `IBV_EVENT_QP_LAST_WQE_REACHED`).
    pub(crate) fn srq_set_error(&mut self, srq: *mut ibv_srq) -> Result<()> {
        let s = self.srq_mut(srq)?;
        if s.in_error {
            return Ok(());
        }
        s.in_error = true;
        let obj = s.obj;
        self.raise(ibv_event_type::IBV_EVENT_SRQ_ERR, AsyncElement::Srq(obj));
        let users: Vec<usize> = self.qps.iter().flatten().filter(|q| q.srq == Some(key(srq))).map(|q| q.slot).collect();
        for slot in users {
            self.with_slot(slot, |m, q| m.enter_error(q));
        }
        self.settle();
        Ok(())
    }

    /// The SRQ's limit (0: not armed), receives posted and not consumed, and receive slots held.
    pub(crate) fn srq_state(&self, srq: *mut ibv_srq) -> Result<(u32, usize, usize)> {
        let s = self.srqs.get(&key(srq)).ok_or_else(|| Error::invalid(format!("srq {srq:p} is not an SRQ of this sim device")))?;
        Ok((s.limit, s.rq.len(), s.held))
    }

    /// `ibv_post_srq_recv` of one receive WR (positive errno on rejection): `ENOMEM` when `max_wr` receives are
    /// held, `EINVAL` for a bad SGE count or an SRQ in error.
    pub(crate) fn post_srq_recv(&mut self, srq: *mut ibv_srq, req: RecvRequest) -> std::result::Result<(), i32> {
        let strict = self.strict();
        let Some(s) = self.srqs.get_mut(&key(srq)) else { return Err(libc::EINVAL) };
        let why = if s.in_error {
            Some("the SRQ is in error".to_string())
        } else if req.num_sge < 0 || req.num_sge as u32 > s.max_sge || req.null_sg_list {
            Some(format!("num_sge {} (max_sge {}){}", req.num_sge, s.max_sge, if req.null_sg_list { " with a NULL sg_list" } else { "" }))
        } else {
            None
        };
        if let Some(why) = why {
            let text = format!("{}: srq {srq:p} receive wr_id {:#x}: {why}; rejected with EINVAL", violation_kind_str(SQD_SIM_VIOLATION_BAD_WR), req.wr_id);
            self.violation(None, SQD_SIM_VIOLATION_BAD_WR, None, text);
            return Err(libc::EINVAL);
        }
        if s.held >= s.max_wr as usize {
            let text = format!(
                "{}: srq {srq:p} holds {} of {} receive slots; wr_id {:#x} rejected with ENOMEM",
                violation_kind_str(SQD_SIM_VIOLATION_RQ_OVERFLOW),
                s.held,
                s.max_wr,
                req.wr_id
            );
            self.stats.rq_overflows += 1;
            if strict {
                self.violation(None, SQD_SIM_VIOLATION_RQ_OVERFLOW, None, text);
            }
            return Err(libc::ENOMEM);
        }
        s.held += 1;
        s.rq.push_back(Recv { wr_id: req.wr_id, sges: req.sges });
        self.stats.recvs += 1;
        Ok(())
    }

    /// Whether SGEs of a receive for this SRQ need to be copied (not in null mode), and its `max_sge`.
    pub(crate) fn srq_post_info(&self, srq: *mut ibv_srq) -> Option<(u32, bool)> {
        self.srqs.get(&key(srq)).map(|s| (s.max_sge, !self.null()))
    }
}
