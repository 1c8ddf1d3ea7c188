//! The state machine of the software HCA: MRs, CQs, QPs (requester and responder halves), the wire, faults,
//! the oracle and the violation log.
//!
//! Objects are looked up by address (or QP number / key), so a pointer that is not (or no longer) one of ours
//! is reported, never followed. The only memory of the caller the model touches is registered memory, through
//! a key that is valid at that moment (the `reg_mr` contract keeps it alive), and inline data at post time.
//!
//! QPs live in slots; while one QP is being worked on it is taken out of its slot, so the rest of the model
//! (other QPs, CQs, MRs, the wire) can be borrowed freely next to it. Every path puts it back.
//!
//! This file holds the `Model` itself, its device limits and the QP slots; each role is a file of its own,
//! after the roles of the Linux kernel's software RoCE driver (rxe) where it has one: `mr` (memory regions and
//! DMA), `cq` (completion queues), `notify` (completion channels and asynchronous events), `srq`, `qp` (QP
//! records, creation, connection, the error state), `post` (the post verbs), `requester` (transmission and
//! retransmission), `responder` (executing requests), `completer` (acknowledgements and in-order completion),
//! `wire` (packets), `time` (steps), `faults`, `scripting` (the `Scriptable` surface), `oracle` (buffer and WQE
//! ownership, violations) and `inspect` (statistics); `wr`, `wc`, `opcode` and `rng` are the small types and
//! helpers they share. Every `impl Model` block is part of the one model: the fields stay private to this
//! module tree.

mod completer;
mod cq;
mod faults;
mod inspect;
mod mr;
mod notify;
mod opcode;
mod oracle;
mod post;
mod qp;
mod requester;
mod responder;
mod rng;
mod scripting;
mod srq;
mod time;
mod wc;
mod wire;
mod wr;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use rdma_sys::{ibv_context, ibv_pd, ibv_qp};

use super::events::{AsyncEvent, ChannelModel, EventFd};
use super::{SimConfig, SimStats, Violation, SQD_SIM_ARM_PENDING, SQD_SIM_NULL, SQD_SIM_STRICT};
use crate::{Error, Result};
use cq::CqModel;
use mr::MrModel;
use qp::QpModel;
use rng::Rng;
use srq::SrqModel;
use wire::Packet;
pub(crate) use wr::{RecvRequest, SendRequest, Sge};

/// Device limits: caps are clamped to them.
pub(crate) const MAX_WR: u32 = 1 << 15;
pub(crate) const MAX_SGE: u32 = 32;
pub(crate) const MAX_INLINE: u32 = 1024;
pub(crate) const MAX_CQE: i32 = 1 << 22;
const MAX_RD_ATOMIC: u32 = 16;

pub(crate) fn check_config(c: &SimConfig) -> Result<()> {
    if c.wire_delay_min > c.wire_delay_max {
        return Err(Error::invalid(format!(
            "wire_delay_min {} is above wire_delay_max {}",
            c.wire_delay_min, c.wire_delay_max
        )));
    }
    if c.tx_per_step == 0 {
        return Err(Error::invalid("tx_per_step is 0: nothing would ever be transmitted"));
    }
    if c.retrans_timeout == 0 {
        return Err(Error::invalid("retrans_timeout is 0"));
    }
    if c.loss_ppm > 1_000_000 || c.ack_loss_ppm > 1_000_000 {
        return Err(Error::invalid(format!(
            "loss_ppm {} / ack_loss_ppm {} above 1000000",
            c.loss_ppm, c.ack_loss_ppm
        )));
    }
    let known = SQD_SIM_STRICT | SQD_SIM_NULL | SQD_SIM_ARM_PENDING;
    if c.flags & !known != 0 {
        return Err(Error::invalid(format!("unknown flags {:#x}", c.flags & !known)));
    }
    Ok(())
}

pub(crate) struct Model {
    cfg: SimConfig,
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    rng: Rng,
    now: u64,
    cqs: HashMap<usize, CqModel>,
    mrs: HashMap<u32, MrModel>,
    mr_by_obj: HashMap<usize, u32>,
    next_key: u32,
    qps: Vec<Option<QpModel>>,
    qp_by_ptr: HashMap<usize, usize>,
    qp_by_num: HashMap<u32, usize>,
    next_qpn: u32,
    wire: BTreeMap<(u64, u64), Packet>,
    wire_seq: u64,
    last_arrival: HashMap<(u32, u32), u64>,
    violations: Vec<Violation>,
    stats: SimStats,
    pending_err: Vec<u32>,
    fatal_at: Vec<(u64, u32)>,
    srqs: HashMap<usize, SrqModel>,
    channels: HashMap<usize, ChannelModel>,
    async_events: VecDeque<AsyncEvent>,
    async_fd: EventFd,
    /// Slots of the QPs that may have work in the next step (a send WQE not completed, an ACK due): a step
    /// visits these only, in slot (creation) order, so its cost follows the QPs with work, not all QPs.
    active: BTreeSet<usize>,
    tick_buf: Vec<usize>,
    /// CQs (keys) that got a CQE since `take_cq_changes` last ran.
    cq_changed: Vec<usize>,
}

fn key<T>(p: *mut T) -> usize {
    p as usize
}

impl Model {
    pub(crate) fn new(cfg: SimConfig, ctx: *mut ibv_context, pd: *mut ibv_pd) -> Result<Model> {
        Ok(Model {
            cfg,
            ctx,
            pd,
            rng: Rng(cfg.seed),
            now: 0,
            cqs: HashMap::new(),
            mrs: HashMap::new(),
            mr_by_obj: HashMap::new(),
            next_key: 0x1100,
            qps: Vec::new(),
            qp_by_ptr: HashMap::new(),
            qp_by_num: HashMap::new(),
            next_qpn: 0x200,
            wire: BTreeMap::new(),
            wire_seq: 0,
            last_arrival: HashMap::new(),
            violations: Vec::new(),
            stats: SimStats::default(),
            pending_err: Vec::new(),
            fatal_at: Vec::new(),
            srqs: HashMap::new(),
            channels: HashMap::new(),
            async_events: VecDeque::new(),
            async_fd: EventFd::new()?,
            active: BTreeSet::new(),
            tick_buf: Vec::new(),
            cq_changed: Vec::new(),
        })
    }

    pub(crate) fn config(&self) -> SimConfig {
        self.cfg
    }

    fn null(&self) -> bool {
        self.cfg.flags & SQD_SIM_NULL != 0
    }

    fn strict(&self) -> bool {
        self.cfg.flags & SQD_SIM_STRICT != 0
    }

    fn arm_pending(&self) -> bool {
        self.cfg.flags & SQD_SIM_ARM_PENDING != 0
    }

    pub(crate) fn now(&self) -> u64 {
        self.now
    }

    pub(crate) fn owns_qp(&self, qp: *mut ibv_qp) -> bool {
        self.qp_by_ptr.contains_key(&key(qp))
    }

    fn slot_of(&self, qp: *mut ibv_qp) -> Result<usize> {
        self.qp_by_ptr.get(&key(qp)).copied().ok_or_else(|| Error::invalid(format!("qp {qp:p} is not a QP of this sim device")))
    }

    fn qp(&self, qp: *mut ibv_qp) -> Result<&QpModel> {
        let slot = self.slot_of(qp)?;
        Ok(self.qps[slot].as_ref().expect("no QP is taken out between calls"))
    }

    /// Runs `f` on the QP in `slot` taken out of the model, then puts it back.
    fn with_slot<R>(&mut self, slot: usize, f: impl FnOnce(&mut Model, &mut QpModel) -> R) -> Option<R> {
        let mut q = self.qps.get_mut(slot)?.take()?;
        let r = f(self, &mut q);
        self.qps[slot] = Some(q);
        Some(r)
    }

    fn with_qp<R>(&mut self, qp: *mut ibv_qp, f: impl FnOnce(&mut Model, &mut QpModel) -> R) -> Result<R> {
        let slot = self.slot_of(qp)?;
        let r = self.with_slot(slot, f).expect("no QP is taken out between calls");
        self.settle();
        Ok(r)
    }

    fn live_qps(&self) -> impl Iterator<Item = &QpModel> {
        self.qps.iter().flatten()
    }

    /// Frees every object (device teardown).
    pub(crate) fn clear(&mut self) {
        self.qps.clear();
        self.qp_by_ptr.clear();
        self.qp_by_num.clear();
        self.cqs.clear();
        self.srqs.clear();
        self.channels.clear();
        self.async_events.clear();
        self.active.clear();
        self.mrs.clear();
        self.mr_by_obj.clear();
        self.wire.clear();
    }
}
