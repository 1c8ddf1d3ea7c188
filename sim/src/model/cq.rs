//! Completion queues (as rxe's `rxe_cq.c`): creation, resize, destruction, arming, adding a CQE (overrun
//! included) and polling, which frees SQ and RQ/SRQ slots.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::c_void;

use rdma_sys::{ibv_comp_channel, ibv_cq, ibv_event_type, ibv_wc};

use crate::{Error, Result};
use super::{MAX_CQE, Model, key};
use super::qp::QpModel;
use super::super::{SQD_SIM_VIOLATION_CQ_OVERRUN, violation_kind_str};
use super::super::events::AsyncElement;
use super::wc::{FLUSH, GARBAGE, Origin, SUCCESS};

pub(super) struct CqEntry {
    wc: ibv_wc,
    pub(super) qpn: u32,
    pub(super) origin: Origin,
    /// Would fire a solicited-only arm: a receive of a solicited message, or an unsuccessful completion.
    fires_solicited: bool,
}

pub(super) struct CqModel {
    pub(super) obj: *mut ibv_cq,
    pub(super) entries: VecDeque<CqEntry>,
    pub(super) capacity: usize,
    pub(super) max_queued: usize,
    pub(super) overruns: u64,
    pub(super) in_error: bool,
    pub(super) arms: u64,
    /// QP numbers attached, with how many sides use it (2: a QP using it as send and receive CQ). Ordered, so
    /// that an overrun puts them in error in a deterministic order.
    pub(super) users: BTreeMap<u32, u32>,
    /// The completion channel (key) it was made on.
    channel: Option<usize>,
    /// Armed by `ibv_req_notify_cq`: `Some(solicited_only)`; one-shot.
    armed: Option<bool>,
    /// Completion events taken from its channel (`get_cq_event`) and acknowledged (`ack_cq_events`).
    pub(super) events_got: u64,
    pub(super) events_acked: u64,
    /// In `Model::cq_changed` (a CQE was added since the last `take_cq_changes`).
    pub(super) changed: bool,
}

impl Drop for CqModel {
    fn drop(&mut self) {
        // SAFETY: `obj` came from `Box::into_raw` in `Model::create_cq` and is freed only here, once.
        drop(unsafe { Box::from_raw(self.obj) });
    }
}

impl Model {
    pub(crate) fn owns_cq(&self, cq: *mut ibv_cq) -> bool {
        self.cqs.contains_key(&key(cq))
    }

    pub(super) fn cq(&self, cq: *mut ibv_cq) -> Result<&CqModel> {
        self.cqs.get(&key(cq)).ok_or_else(|| Error::invalid(format!("cq {cq:p} is not a CQ of this sim device")))
    }

    /// Pushes a CQE to the QP's send or receive CQ. A full CQ (or one already in error) loses it; the first
    /// loss marks the CQ in error, raises `IBV_EVENT_CQ_ERR` ("CQ is in error (CQ overrun)",
    /// `ibv_get_async_event(3)`), puts every QP using it in error (its CQEs can no longer be delivered; each
    /// gets `IBV_EVENT_QP_FATAL`) and is logged as a violation. From then on the CQ takes no CQE: later ones,
    /// flushes of its QPs included, are lost (counted in `cq_overruns`).
    ///
    /// A CQE that lands in an armed CQ (`ibv_req_notify_cq`) — any CQE, or with `solicited_only` only a
    /// solicited one (`solicited`: a receive of a message sent with `IBV_SEND_SOLICITED`) or an unsuccessful
    /// one, as `ibv_req_notify_cq(3)` defines — disarms it ("one shot") and queues one completion event on its
    /// channel.
    pub(super) fn push_cqe(&mut self, q: &mut QpModel, to_send_cq: bool, wc: ibv_wc, origin: Origin, solicited: bool) {
        self.stats.cqes += 1;
        q.stats.cqes_generated += 1;
        if wc.status == FLUSH {
            self.stats.flushes += 1;
            q.stats.flushed += 1;
        } else if wc.status != SUCCESS {
            self.stats.errors += 1;
        }
        let cq_key = if to_send_cq { q.send_cq } else { q.recv_cq };
        let Some(cq) = self.cqs.get_mut(&cq_key) else { return };
        if cq.in_error || cq.entries.len() >= cq.capacity {
            self.stats.cq_overruns += 1;
            cq.overruns += 1;
            if cq.in_error {
                return;
            }
            cq.in_error = true;
            let text = format!(
                "{}: cq {:p} (capacity {}) is full; CQE wr_id {:#x} status {} of qp {:#x} lost; the CQ and its QPs \
                 are in error",
                violation_kind_str(SQD_SIM_VIOLATION_CQ_OVERRUN),
                cq.obj,
                cq.capacity,
                wc.wr_id,
                wc.status,
                q.qpn
            );
            // Reverse order: `settle` pops from the end, so the QPs go to error in ascending QP number.
            self.pending_err.extend(cq.users.keys().rev());
            let cq_obj = cq.obj;
            let index = match origin {
                Origin::Send(i) => Some(i),
                Origin::Recv => None,
            };
            self.violation(Some(q), SQD_SIM_VIOLATION_CQ_OVERRUN, index, text);
            self.raise(ibv_event_type::IBV_EVENT_CQ_ERR, AsyncElement::Cq(cq_obj));
            return;
        }
        let failed = wc.status != SUCCESS;
        cq.entries.push_back(CqEntry { wc, qpn: q.qpn, origin, fires_solicited: solicited || failed });
        cq.max_queued = cq.max_queued.max(cq.entries.len());
        if !cq.changed {
            cq.changed = true;
            self.cq_changed.push(cq_key);
        }
        let fire = match cq.armed {
            Some(solicited_only) => !solicited_only || solicited || failed,
            None => false,
        };
        if fire {
            cq.armed = None;
            if let Some(ch) = cq.channel.and_then(|c| self.channels.get_mut(&c)) {
                self.stats.comp_events += 1;
                ch.events.push_back(cq_key);
                ch.sync_fd();
            }
        }
    }

    pub(crate) fn create_cq(
        &mut self,
        cqe: i32,
        channel: *mut ibv_comp_channel,
        cq_context: *mut c_void,
        comp_vector: i32,
    ) -> Result<*mut ibv_cq> {
        if !(1..=MAX_CQE).contains(&cqe) {
            return Err(Error::invalid(format!("cqe = {cqe} is out of range (1..={MAX_CQE})")));
        }
        if comp_vector != 0 {
            return Err(Error::invalid(format!("comp_vector {comp_vector} is out of range (the sim has one: 0)")));
        }
        if !channel.is_null() && !self.channels.contains_key(&key(channel)) {
            return Err(Error::invalid(format!("channel {channel:p} is not a completion channel of this sim device")));
        }
        // SAFETY: `ibv_cq` is plain data (pointers, ints, zero-initializable pthread objects): zero is valid.
        let mut cq: Box<ibv_cq> = Box::new(unsafe { std::mem::zeroed() });
        cq.context = self.ctx;
        cq.cqe = cqe;
        cq.channel = channel;
        cq.cq_context = cq_context;
        let obj = Box::into_raw(cq);
        if !channel.is_null() {
            // SAFETY: `channel` is a live channel owned by this model (checked above); libibverbs counts the CQs
            // on a channel in `refcnt` and refuses to destroy it while that is not zero.
            unsafe { (*channel).refcnt += 1 };
        }
        self.cqs.insert(
            key(obj),
            CqModel {
                obj,
                entries: VecDeque::new(),
                capacity: cqe as usize,
                max_queued: 0,
                overruns: 0,
                in_error: false,
                arms: 0,
                users: BTreeMap::new(),
                channel: (!channel.is_null()).then(|| key(channel)),
                armed: None,
                events_got: 0,
                events_acked: 0,
                changed: false,
            },
        );
        Ok(obj)
    }

    /// `ibv_resize_cq`: the CQ holds `cqe` CQEs from now on (1..=4194304); `EINVAL` below the CQEs it holds now,
    /// as `ibv_resize_cq(3)` requires. `cq->cqe` is updated (the granted size, which this device does not round).
    pub(crate) fn resize_cq(&mut self, cq: *mut ibv_cq, cqe: i32) -> Result<()> {
        let c = self.cqs.get_mut(&key(cq)).ok_or_else(|| Error::invalid("cq is not a CQ of this sim device"))?;
        if !(1..=MAX_CQE).contains(&cqe) {
            return Err(Error::invalid(format!("cqe {cqe} is outside 1..={MAX_CQE}")));
        }
        if (cqe as usize) < c.entries.len() {
            return Err(Error::invalid(format!("cqe {cqe} is below the {} CQEs the CQ holds now", c.entries.len())));
        }
        c.capacity = cqe as usize;
        // SAFETY: `c.obj` is the live CQ object this model owns; a field write, made under the device lock.
        unsafe { (*c.obj).cqe = cqe };
        Ok(())
    }

    /// Destroys a CQ: `EBUSY` while a QP uses it, or while completion events taken from its channel are not
    /// all acknowledged (libibverbs' `ibv_destroy_cq` waits for them, `ibv_get_cq_event(3)`; the sim cannot
    /// wait for the caller itself, so it refuses). Its events still queued on the channel are discarded.
    pub(crate) fn destroy_cq(&mut self, cq: *mut ibv_cq) -> Result<()> {
        let c = self.cq(cq)?;
        if !c.users.is_empty() {
            let n: u32 = c.users.values().sum();
            return Err(Error::new(libc::EBUSY, format!("cq {cq:p} is still used by {n} QP queue(s)")));
        }
        if c.events_got > c.events_acked {
            return Err(Error::new(
                libc::EBUSY,
                format!("cq {cq:p} has {} completion event(s) not acknowledged (ibv_ack_cq_events)", c.events_got - c.events_acked),
            ));
        }
        let c = self.cqs.remove(&key(cq)).expect("checked above");
        if let Some(ch) = c.channel.and_then(|k| self.channels.get_mut(&k)) {
            ch.events.retain(|&e| e != key(cq));
            ch.sync_fd();
            // SAFETY: the channel object is alive (owned by `ch`); this CQ was counted in `refcnt` at creation.
            unsafe { (*ch.obj).refcnt -= 1 };
        }
        self.async_events.retain(|e| !e.names(key(cq)));
        self.async_fd.set(!self.async_events.is_empty());
        Ok(())
    }

    /// Hands each CQ that got a CQE since the last call to `f`, with the CQEs it holds now.
    pub(crate) fn take_cq_changes(&mut self, mut f: impl FnMut(*mut ibv_cq, usize)) {
        for k in std::mem::take(&mut self.cq_changed) {
            if let Some(cq) = self.cqs.get_mut(&k) {
                cq.changed = false;
                f(cq.obj, cq.entries.len());
            }
        }
    }

    /// The CQEs a CQ holds.
    pub(crate) fn cq_queued(&self, cq: *mut ibv_cq) -> Option<usize> {
        self.cqs.get(&key(cq)).map(|c| c.entries.len())
    }

    /// `ibv_req_notify_cq`: arms the CQ for its next CQE (or next solicited one). One shot. A request for any
    /// CQE takes precedence over a pending solicited-only one (IBA's Request Completion Notification).
    /// CQEs already in the CQ do not count: only one added afterwards fires.
    ///
    /// With `SQD_SIM_ARM_PENDING`, an arm of a CQ that already holds a CQE it would fire for fires at once, as
    /// ConnectX HCAs do (the arm carries the consumer index, and the HCA raises the event when CQEs lie beyond
    /// it). IBA leaves that open; a program that takes one CQE per event and re-arms before it polls the rest
    /// waits forever without it.
    pub(crate) fn arm(&mut self, cq: *mut ibv_cq, solicited_only: bool) -> Result<()> {
        let arm_pending = self.arm_pending();
        let cq_key = key(cq);
        let cq = self.cqs.get_mut(&cq_key).ok_or_else(|| Error::invalid("cq is not a CQ of this sim device"))?;
        cq.arms += 1;
        let solicited_only = solicited_only && cq.armed.unwrap_or(true);
        let fire_now = arm_pending && cq.entries.iter().any(|e| !solicited_only || e.fires_solicited);
        if !fire_now {
            cq.armed = Some(solicited_only);
            return Ok(());
        }
        cq.armed = None;
        if let Some(ch) = cq.channel.and_then(|c| self.channels.get_mut(&c)) {
            self.stats.comp_events += 1;
            ch.events.push_back(cq_key);
            ch.sync_fd();
        }
        Ok(())
    }

    /// `ibv_poll_cq`: runs `steps_per_poll` steps, then pops up to `max` CQEs. A popped send CQE frees its
    /// slot and every earlier one of its SQ (the mlx5 rule); a popped receive CQE frees one receive slot.
    pub(crate) fn poll(&mut self, cq: *mut ibv_cq, max: usize, mut out: impl FnMut(usize, ibv_wc)) -> usize {
        self.poll_slots(cq, max, |i, wc, _| out(i, wc))
    }

    /// As `poll`, also telling for each CQE whether it is a send completion and, if so, the send slots of its
    /// QP it freed: those below the index it gives (`None` for a receive completion).
    pub(crate) fn poll_slots(&mut self, cq: *mut ibv_cq, max: usize, mut out: impl FnMut(usize, ibv_wc, Option<u64>)) -> usize {
        if !self.null() {
            self.run(u64::from(self.cfg.steps_per_poll));
        }
        let Some(cqm) = self.cqs.get_mut(&key(cq)) else { return 0 };
        let mut n = 0;
        while n < max {
            let Some(entry) = cqm.entries.pop_front() else { break };
            let freed = match entry.origin {
                Origin::Send(index) => Some(index + 1),
                Origin::Recv => None,
            };
            if let Some(q) = self.qp_by_num.get(&entry.qpn).and_then(|&s| self.qps[s].as_mut()) {
                match entry.origin {
                    Origin::Send(index) => {
                        q.base = q.base.max(index + 1);
                        while q.sq.front().is_some_and(|w| w.index < q.base) {
                            q.sq.pop_front();
                        }
                    }
                    Origin::Recv => match q.srq.and_then(|k| self.srqs.get_mut(&k)) {
                        Some(srq) => srq.held = srq.held.saturating_sub(1),
                        None => q.recv_held = q.recv_held.saturating_sub(1),
                    },
                }
            }
            let mut wc = entry.wc;
            if wc.status == SUCCESS {
                // Verbs defines vendor_err for errors only; a real provider does not write it for a success (mlx5
                // and mlx4 set it in their error paths alone), so the caller's array keeps what it held. The sim
                // poisons it, so that nothing may read it as 0.
                wc.vendor_err = GARBAGE;
            }
            out(n, wc, freed);
            n += 1;
        }
        n
    }
}
