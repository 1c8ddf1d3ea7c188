//! The state machine of the software HCA: MRs, CQs, QPs (requester and responder halves), the wire, faults,
//! the oracle and the violation log.
//!
//! Objects are looked up by address (or QP number / key), so a pointer that is not (or no longer) one of ours
//! is reported, never followed. The only memory of the caller the model touches is registered memory, through
//! a key that is valid at that moment (the `reg_mr` contract keeps it alive), and inline data at post time.
//!
//! QPs live in slots; while one QP is being worked on it is taken out of its slot, so the rest of the model
//! (other QPs, CQs, MRs, the wire) can be borrowed freely next to it. Every path puts it back.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ffi::c_void;

use rdma_sys::{
    ibv_access_flags, ibv_comp_channel, ibv_context, ibv_cq, ibv_event_type, ibv_mr, ibv_pd, ibv_qp, ibv_qp_init_attr,
    ibv_qp_state, ibv_qp_type, ibv_send_flags, ibv_srq, ibv_srq_init_attr, ibv_wc, ibv_wc_flags, ibv_wc_opcode, ibv_wc_status,
    ibv_wr_opcode,
};

use super::events::{AsyncElement, AsyncEvent, ChannelModel, EventFd};
use super::*;
use crate::scripted::{ScriptedCqStats, ScriptedQpCaps, ScriptedQpStats, ScriptedWqe};
use crate::{Error, Result};

/// Written into `opcode` and `byte_len` of error and flush CQEs, where verbs leaves them undefined.
const GARBAGE: u32 = 0xffff_ffff;

/// Device limits: caps are clamped to them.
pub(crate) const MAX_WR: u32 = 1 << 15;
pub(crate) const MAX_SGE: u32 = 32;
pub(crate) const MAX_INLINE: u32 = 1024;
pub(crate) const MAX_CQE: i32 = 1 << 22;
const MAX_RD_ATOMIC: u32 = 16;
/// Upper bound of steps `complete_n` runs before giving up.
const COMPLETE_STEP_LIMIT: u64 = 1_000_000;

const SUCCESS: u32 = ibv_wc_status::IBV_WC_SUCCESS;
const FLUSH: u32 = ibv_wc_status::IBV_WC_WR_FLUSH_ERR;

const LOCAL_WRITE: u32 = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
const REMOTE_WRITE: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
const REMOTE_READ: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
const REMOTE_ATOMIC: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;

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
    if c.flags & !(SQD_SIM_STRICT | SQD_SIM_NULL) != 0 {
        return Err(Error::invalid(format!("unknown flags {:#x}", c.flags & !(SQD_SIM_STRICT | SQD_SIM_NULL))));
    }
    Ok(())
}

/// splitmix64: small, fast, and the same sequence on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.next() % (hi - lo + 1)
        }
    }
    fn chance_ppm(&mut self, ppm: u32) -> bool {
        ppm > 0 && self.next() % 1_000_000 < u64::from(ppm)
    }
}

/// One scatter/gather element, copied at post time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// One send work request, copied out of the caller's `ibv_send_wr` by the ops layer.
pub(crate) struct SendRequest {
    pub wr_id: u64,
    pub opcode: u32,
    pub flags: u32,
    pub num_sge: i32,
    /// `num_sge > 0` with a NULL `sg_list`.
    pub null_sg_list: bool,
    /// The SGEs (empty in null mode or when `num_sge` is out of range).
    pub sges: Vec<Sge>,
    /// Sum of the SGE lengths (as far as they were read).
    pub total_len: u64,
    /// Inline data copied at post time (`IBV_SEND_INLINE` within `max_inline_data`).
    pub inline: Option<Vec<u8>>,
    pub remote_addr: u64,
    pub rkey: u32,
    /// `imm_data` (network byte order) or `invalidate_rkey`: the same field of the WR.
    pub imm: u32,
    pub compare_add: u64,
    pub swap: u64,
}

/// One receive work request, copied by the ops layer.
pub(crate) struct RecvRequest {
    pub wr_id: u64,
    pub num_sge: i32,
    pub null_sg_list: bool,
    pub sges: Vec<Sge>,
}

fn is_read_or_atomic(op: u32) -> bool {
    matches!(op, ibv_wr_opcode::IBV_WR_RDMA_READ | ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP | ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD)
}

fn is_atomic(op: u32) -> bool {
    matches!(op, ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP | ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD)
}

fn is_local(op: u32) -> bool {
    op == ibv_wr_opcode::IBV_WR_LOCAL_INV
}

/// Opcodes whose payload is read from the SGEs at (re)transmission.
fn carries_data(op: u32) -> bool {
    matches!(
        op,
        ibv_wr_opcode::IBV_WR_SEND
            | ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
            | ibv_wr_opcode::IBV_WR_SEND_WITH_INV
            | ibv_wr_opcode::IBV_WR_RDMA_WRITE
            | ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
    )
}

/// The work-completion opcode of a successful send WQE, or `None` for an opcode the model does not support.
fn wc_opcode(wr_opcode: u32) -> Option<u32> {
    use ibv_wc_opcode::*;
    use ibv_wr_opcode::*;
    Some(match wr_opcode {
        IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_SEND_WITH_INV => IBV_WC_SEND,
        IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => IBV_WC_RDMA_WRITE,
        IBV_WR_RDMA_READ => IBV_WC_RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP => IBV_WC_COMP_SWAP,
        IBV_WR_ATOMIC_FETCH_AND_ADD => IBV_WC_FETCH_ADD,
        IBV_WR_LOCAL_INV => IBV_WC_LOCAL_INV,
        _ => return None,
    })
}

fn blank_wc() -> ibv_wc {
    // SAFETY: `ibv_wc` is plain data (integers and an integer union); all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// An error or flush CQE: only `wr_id`, `status`, `qp_num` and `vendor_err` are meaningful; the rest is
/// poisoned so a user reading it sees an obviously wrong value.
fn error_wc(wr_id: u64, status: u32, vendor_err: u32, qpn: u32) -> ibv_wc {
    let mut wc = blank_wc();
    wc.wr_id = wr_id;
    wc.status = status;
    wc.vendor_err = vendor_err;
    wc.qp_num = qpn;
    wc.opcode = GARBAGE;
    wc.byte_len = GARBAGE;
    wc.src_qp = GARBAGE;
    wc.wc_flags = GARBAGE;
    wc
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// The send WQE with this index on its QP.
    Send(u64),
    Recv,
}

struct CqEntry {
    wc: ibv_wc,
    qpn: u32,
    origin: Origin,
}

struct CqModel {
    obj: *mut ibv_cq,
    entries: VecDeque<CqEntry>,
    capacity: usize,
    max_queued: usize,
    overruns: u64,
    in_error: bool,
    arms: u64,
    /// QP numbers attached, with how many sides use it (2: a QP using it as send and receive CQ). Ordered, so
    /// that an overrun puts them in error in a deterministic order.
    users: BTreeMap<u32, u32>,
    /// The completion channel (key) it was made on.
    channel: Option<usize>,
    /// Armed by `ibv_req_notify_cq`: `Some(solicited_only)`; one-shot.
    armed: Option<bool>,
    /// Completion events taken from its channel (`get_cq_event`) and acknowledged (`ack_cq_events`).
    events_got: u64,
    events_acked: u64,
}

/// A shared receive queue: receives posted to it are consumed, oldest first, by any QP made on it.
struct SrqModel {
    obj: *mut ibv_srq,
    rq: VecDeque<Recv>,
    /// Receives posted and not yet freed (a receive's slot is freed when its CQE is polled, as for an RQ).
    held: usize,
    max_wr: u32,
    max_sge: u32,
    /// Armed limit (0: not armed).
    limit: u32,
    /// QPs made on it.
    users: usize,
    in_error: bool,
}

impl Drop for SrqModel {
    fn drop(&mut self) {
        // SAFETY: `obj` came from `Box::into_raw` in `Model::create_srq` and is freed only here, once.
        drop(unsafe { Box::from_raw(self.obj) });
    }
}

impl Drop for CqModel {
    fn drop(&mut self) {
        // SAFETY: `obj` came from `Box::into_raw` in `Model::create_cq` and is freed only here, once.
        drop(unsafe { Box::from_raw(self.obj) });
    }
}

struct MrModel {
    obj: *mut ibv_mr,
    addr: u64,
    len: u64,
    access: u32,
    /// False once invalidated (LocalInv, SEND_WITH_INV); the object lives until deregistration.
    valid: bool,
}

impl Drop for MrModel {
    fn drop(&mut self) {
        // SAFETY: `obj` came from `Box::into_raw` in `Model::reg_mr` and is freed only here, once.
        drop(unsafe { Box::from_raw(self.obj) });
    }
}

impl MrModel {
    fn covers(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|end| end <= self.addr + self.len)
    }
}

struct Wqe {
    index: u64,
    wr_id: u64,
    opcode: u32,
    signaled: bool,
    fence: bool,
    /// `IBV_SEND_SOLICITED`: the receive completion it causes at the responder is solicited.
    solicited: bool,
    sges: Vec<Sge>,
    inline: Option<Vec<u8>>,
    len: u64,
    remote_addr: u64,
    rkey: u32,
    imm: u32,
    compare_add: u64,
    swap: u64,
    /// Assigned at first transmission (remote opcodes only).
    psn: Option<u64>,
    /// Transmissions so far (local ops: 1 once executed).
    tx_count: u32,
    /// Step of the last (re)transmission.
    sent_at: u64,
    /// The bytes read from the SGEs at first transmission, kept until the WQE is finished.
    image: Option<Vec<u8>>,
    modified_logged: bool,
    /// The HCA is finished with it: acknowledged (or executed, for local ops), failed, or flushed.
    done: bool,
    status: u32,
    vendor_err: u32,
}

struct Recv {
    wr_id: u64,
    sges: Vec<Sge>,
}

impl Recv {
    fn capacity(&self) -> u64 {
        self.sges.iter().map(|s| u64::from(s.len)).sum()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QpState {
    Init,
    Rts,
    Err,
}

struct QpModel {
    obj: *mut ibv_qp,
    qpn: u32,
    /// Its index in `Model::qps`.
    slot: usize,
    /// The SRQ (key) it takes its receives from, if made on one.
    srq: Option<usize>,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED` was raised for it.
    last_wqe_raised: bool,
    caps: ScriptedQpCaps,
    sig_all: bool,
    send_cq: usize,
    recv_cq: usize,
    /// Made through `Scriptable::create_qp`: connected to an internal sink, moves no data.
    scripted: bool,
    peer: Option<u32>,
    conn: SimConnAttr,
    state: QpState,

    // ---- send queue (requester) ----
    /// Records of send WQEs `[base, posted)` (empty in null mode).
    sq: VecDeque<Wqe>,
    /// Slots below `base` are free (a CQE at or after them was polled).
    base: u64,
    posted: u64,
    /// Next WQE to transmit (or retransmit, after a rewind).
    next_tx: u64,
    /// Next WQE to complete, in order.
    next_complete: u64,
    next_psn: u64,
    retries: u32,
    rnr_count: u32,
    last_progress: u64,
    rnr_wait_until: u64,
    fail_next: Option<(u32, u32)>,
    lose_requests: u32,
    lose_acks: u32,
    remote_access_next: bool,
    completed_total: u64,

    // ---- receive queue and responder ----
    rq: VecDeque<Recv>,
    recv_held: usize,
    starve_until: u64,
    /// Expected PSN of the next new request.
    epsn: u64,
    /// Coalesced ACK: the step it leaves and the PSN it carries.
    ack_due: Option<u64>,
    ack_psn: u64,
    /// A NAK naming `epsn` was sent (a sequence error, or an RNR NAK of the request at `epsn`): the requester
    /// knows where to resume, so later requests are dropped silently until `epsn` arrives again.
    nak_seq_sent: bool,
    /// Results of recent atomics by PSN, replayed for duplicates (IBA: atomics are not re-executed).
    atomic_replay: VecDeque<(u64, u64)>,

    history: Vec<ScriptedWqe>,
    stats: ScriptedQpStats,
}

impl Drop for QpModel {
    fn drop(&mut self) {
        // SAFETY: `obj` came from `Box::into_raw` in `Model::create_qp` and is freed only here, once.
        drop(unsafe { Box::from_raw(self.obj) });
    }
}

impl QpModel {
    fn wqe(&self, index: u64) -> &Wqe {
        &self.sq[(index - self.base) as usize]
    }
    fn wqe_mut(&mut self, index: u64) -> &mut Wqe {
        &mut self.sq[(index - self.base) as usize]
    }
    fn index_of_psn(&self, psn: u64) -> Option<u64> {
        self.sq.iter().find(|w| w.psn == Some(psn)).map(|w| w.index)
    }
    fn set_obj_state(&mut self, state: ibv_qp_state::Type) {
        // SAFETY: `obj` is owned by this model and alive; no reference to it is held across this write (one
        // thread at a time). `state` is the cached state verbs users may read.
        unsafe { (*self.obj).state = state };
    }
}

enum Response {
    Ack,
    ReadData(Vec<u8>),
    AtomicData(u64),
    RnrNak,
    /// Sequence error: `psn` is the responder's expected PSN.
    SeqNak,
    /// A fatal NAK; the requester's WQE completes with this status.
    Nak(u32),
}

struct Request {
    opcode: u32,
    data: Vec<u8>,
    len: u64,
    remote_addr: u64,
    rkey: u32,
    imm: u32,
    compare_add: u64,
    swap: u64,
    solicited: bool,
    force_access_err: bool,
}

enum Body {
    Req(Request),
    Resp(Response),
}

struct Packet {
    src: u32,
    dst: u32,
    psn: u64,
    body: Body,
}

/// What the responder does with an in-sequence request.
enum Outcome {
    Ack,
    Respond(Response),
    Rnr,
    Nak(u32),
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

    pub(crate) fn now(&self) -> u64 {
        self.now
    }

    // ---- lookups -----------------------------------------------------------------------------------------

    pub(crate) fn owns_qp(&self, qp: *mut ibv_qp) -> bool {
        self.qp_by_ptr.contains_key(&key(qp))
    }

    pub(crate) fn owns_cq(&self, cq: *mut ibv_cq) -> bool {
        self.cqs.contains_key(&key(cq))
    }

    pub(crate) fn owns_mr(&self, mr: *mut ibv_mr) -> bool {
        self.mr_by_obj.contains_key(&key(mr))
    }

    fn slot_of(&self, qp: *mut ibv_qp) -> Result<usize> {
        self.qp_by_ptr.get(&key(qp)).copied().ok_or_else(|| Error::invalid(format!("qp {qp:p} is not a QP of this sim device")))
    }

    fn qp(&self, qp: *mut ibv_qp) -> Result<&QpModel> {
        let slot = self.slot_of(qp)?;
        Ok(self.qps[slot].as_ref().expect("no QP is taken out between calls"))
    }

    fn cq(&self, cq: *mut ibv_cq) -> Result<&CqModel> {
        self.cqs.get(&key(cq)).ok_or_else(|| Error::invalid(format!("cq {cq:p} is not a CQ of this sim device")))
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

    // ---- violations and CQEs -----------------------------------------------------------------------------

    fn violation(&mut self, q: Option<&mut QpModel>, kind: u32, wqe_index: Option<u64>, text: String) {
        let qp_num = q.as_ref().map_or(0, |q| q.qpn);
        if let Some(q) = q {
            q.stats.violations += 1;
        }
        self.stats.violations += 1;
        self.violations.push(Violation { kind, qp_num, wqe_index, step: self.now, text });
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
    fn push_cqe(&mut self, q: &mut QpModel, to_send_cq: bool, wc: ibv_wc, origin: Origin, solicited: bool) {
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
        cq.entries.push_back(CqEntry { wc, qpn: q.qpn, origin });
        cq.max_queued = cq.max_queued.max(cq.entries.len());
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

    /// Queues an asynchronous event; the async fd becomes readable.
    fn raise(&mut self, event_type: ibv_event_type, element: AsyncElement) {
        self.stats.async_events += 1;
        self.async_events.push_back(AsyncEvent { event_type, element });
        self.async_fd.set(true);
    }

    /// Puts every QP queued for error (an overrun of its CQ, an injected fatal error) in error, raising
    /// `IBV_EVENT_QP_FATAL` ("Error occurred on a QP and it transitioned to error state",
    /// `ibv_get_async_event(3)`) for each that was not in error yet: no CQE of its own tells the ULP.
    fn settle(&mut self) {
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
    fn enter_error(&mut self, q: &mut QpModel) {
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

    /// Completes send WQEs in SQ order as far as they are done. The first one that failed is the QP's one error
    /// CQE: the QP goes to error with it. In the error state every WQE not completed yet flushes — even one
    /// already acknowledged behind an unfinished one, or a LocalInv that already executed — so a send queue's
    /// CQEs are always successes, then at most one error, then flushes (an RC requester completes in order,
    /// and once a WQE completed in error every later one completes with a flush).
    fn complete_ready(&mut self, q: &mut QpModel) {
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
    fn fail_wqe(&mut self, q: &mut QpModel, index: u64, status: u32, vendor_err: u32) {
        let w = q.wqe_mut(index);
        w.done = true;
        w.status = status;
        w.vendor_err = vendor_err;
        w.image = None;
        self.complete_ready(q);
    }

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
    fn take_recv(&mut self, q: &mut QpModel) -> Option<Recv> {
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

    // ---- memory ------------------------------------------------------------------------------------------

    pub(crate) fn reg_mr(&mut self, addr: *mut c_void, len: usize, access: u32) -> Result<*mut ibv_mr> {
        if addr.is_null() && len > 0 {
            return Err(Error::invalid("addr is NULL"));
        }
        if access & (REMOTE_WRITE | REMOTE_ATOMIC) != 0 && access & LOCAL_WRITE == 0 {
            return Err(Error::invalid("IBV_ACCESS_REMOTE_WRITE and REMOTE_ATOMIC need IBV_ACCESS_LOCAL_WRITE"));
        }
        if (addr as u64).checked_add(len as u64).is_none() {
            return Err(Error::invalid("addr + len overflows"));
        }
        let k = self.next_key;
        self.next_key = self.next_key.checked_add(0x101).ok_or_else(|| Error::new(libc::ENOSPC, "sim ran out of MR keys"))?;
        let obj = Box::into_raw(Box::new(ibv_mr {
            context: self.ctx,
            pd: self.pd,
            addr,
            length: len,
            handle: k,
            lkey: k,
            rkey: k,
        }));
        self.mrs.insert(k, MrModel { obj, addr: addr as u64, len: len as u64, access, valid: true });
        self.mr_by_obj.insert(key(obj), k);
        Ok(obj)
    }

    /// The first unfinished send WQE (of `extra` or any live QP) whose SGEs use `mr_key`.
    fn mr_user(&self, extra: Option<&QpModel>, mr_key: u32) -> Option<(u32, u64, u64)> {
        extra.into_iter().chain(self.live_qps()).find_map(|q| {
            q.sq.iter().find(|w| !w.done && w.inline.is_none() && w.sges.iter().any(|s| s.lkey == mr_key)).map(|w| (q.qpn, w.index, w.wr_id))
        })
    }

    /// Logs an "MR invalidated while in use" violation if an unfinished WQE references `mr_key`.
    fn check_mr_unused(&mut self, q: Option<&mut QpModel>, mr_key: u32, what: &str) {
        let user = self.mr_user(q.as_deref(), mr_key);
        if let Some((qpn, index, wr_id)) = user {
            let text = format!(
                "{}: {what} key {mr_key:#x} while send WQE #{index} (wr_id {wr_id:#x}) of qp {qpn:#x} still references \
                 it and the HCA is not finished with it (it may be (re)transmitted)",
                violation_kind_str(SQD_SIM_VIOLATION_MR_IN_USE)
            );
            // Recorded against the QP whose WQE is affected.
            let q_user = match q {
                Some(x) if x.qpn == qpn => Some(x),
                _ => None,
            };
            if let Some(x) = q_user {
                self.violation(Some(x), SQD_SIM_VIOLATION_MR_IN_USE, Some(index), text);
            } else if let Some(&slot) = self.qp_by_num.get(&qpn) {
                let mut other = self.qps[slot].take();
                self.violation(other.as_mut(), SQD_SIM_VIOLATION_MR_IN_USE, Some(index), text);
                self.qps[slot] = other;
            }
        }
    }

    pub(crate) fn dereg_mr(&mut self, mr: *mut ibv_mr) -> Result<()> {
        let k = *self.mr_by_obj.get(&key(mr)).ok_or_else(|| Error::invalid(format!("mr {mr:p} is not an MR of this sim device")))?;
        self.check_mr_unused(None, k, "ibv_dereg_mr deregistered");
        self.mr_by_obj.remove(&key(mr));
        self.mrs.remove(&k);
        Ok(())
    }

    /// Invalidates the MR whose rkey is `rkey`; false if there is none valid.
    fn invalidate(&mut self, q: Option<&mut QpModel>, rkey: u32, what: &str) -> bool {
        if !self.mrs.get(&rkey).is_some_and(|m| m.valid) {
            return false;
        }
        self.check_mr_unused(q, rkey, what);
        if let Some(m) = self.mrs.get_mut(&rkey) {
            m.valid = false;
        }
        true
    }

    /// DMA read through lkeys: every SGE must lie in a valid MR (IBA: local protection checks at the time the
    /// HCA accesses the memory).
    fn dma_read(&mut self, sges: &[Sge]) -> std::result::Result<Vec<u8>, String> {
        let total: usize = sges.iter().map(|s| s.len as usize).sum();
        let mut out: Vec<u8> = Vec::with_capacity(total);
        for s in sges.iter().filter(|s| s.len > 0) {
            match self.mrs.get(&s.lkey) {
                Some(m) if m.valid && m.covers(s.addr, u64::from(s.len)) => {}
                Some(m) if !m.valid => return Err(format!("lkey {:#x} was invalidated", s.lkey)),
                Some(_) => return Err(format!("SGE [{:#x}, +{}) is outside the MR of lkey {:#x}", s.addr, s.len, s.lkey)),
                None => return Err(format!("lkey {:#x} is not registered", s.lkey)),
            }
            let at = out.len();
            // SAFETY: `[addr, addr + len)` lies inside a valid MR, which its registrant keeps readable while
            // registered (`reg_mr` contract); `out` has room for `total` bytes and `at + len <= total`.
            unsafe {
                std::ptr::copy_nonoverlapping(s.addr as *const u8, out.as_mut_ptr().add(at), s.len as usize);
                out.set_len(at + s.len as usize);
            }
        }
        self.stats.bytes_read += total as u64;
        Ok(out)
    }

    /// DMA write (scatter) through lkeys that must allow local write.
    fn dma_scatter(&mut self, sges: &[Sge], data: &[u8]) -> bool {
        let mut left = data.len() as u64;
        for s in sges {
            if left == 0 {
                break;
            }
            let n = left.min(u64::from(s.len));
            if !self.mrs.get(&s.lkey).is_some_and(|m| m.valid && m.access & LOCAL_WRITE != 0 && m.covers(s.addr, n)) {
                return false;
            }
            left -= n;
        }
        if left > 0 {
            return false;
        }
        let mut off = 0usize;
        for s in sges {
            if off == data.len() {
                break;
            }
            let n = (data.len() - off).min(s.len as usize);
            // SAFETY: checked above: `[addr, addr + n)` lies inside a valid MR registered with local write
            // access, which its registrant keeps writable while registered; `data[off..off + n]` is in bounds.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(off), s.addr as *mut u8, n) };
            off += n;
        }
        self.stats.bytes_written += data.len() as u64;
        true
    }

    /// The responder's rkey check (IBA 9.7.4.1.3 style: key valid, range inside the region, access allowed).
    fn remote_ok(&self, rkey: u32, addr: u64, len: u64, access: u32) -> bool {
        self.mrs.get(&rkey).is_some_and(|m| m.valid && m.access & access != 0 && m.covers(addr, len))
    }

    // ---- CQs ---------------------------------------------------------------------------------------------

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

    /// `ibv_req_notify_cq`: arms the CQ for its next CQE (or next solicited one). One shot. A request for any
    /// CQE takes precedence over a pending solicited-only one (IBA's Request Completion Notification).
    /// CQEs already in the CQ do not count: only one added afterwards fires.
    pub(crate) fn arm(&mut self, cq: *mut ibv_cq, solicited_only: bool) -> Result<()> {
        let cq = self.cqs.get_mut(&key(cq)).ok_or_else(|| Error::invalid("cq is not a CQ of this sim device"))?;
        cq.arms += 1;
        cq.armed = Some(solicited_only && cq.armed.unwrap_or(true));
        Ok(())
    }

    // ---- completion channels and async events -------------------------------------------------------------

    pub(crate) fn create_channel(&mut self) -> Result<*mut ibv_comp_channel> {
        let fd = EventFd::new()?;
        let obj = Box::into_raw(Box::new(ibv_comp_channel { context: self.ctx, fd: fd.fd(), refcnt: 0 }));
        self.channels.insert(key(obj), ChannelModel { obj, fd, events: VecDeque::new() });
        Ok(obj)
    }

    pub(crate) fn owns_channel(&self, ch: *mut ibv_comp_channel) -> bool {
        self.channels.contains_key(&key(ch))
    }

    /// `EBUSY` while a CQ uses the channel (libibverbs: while `refcnt` is not zero).
    pub(crate) fn destroy_channel(&mut self, ch: *mut ibv_comp_channel) -> Result<()> {
        let c = self.channels.get(&key(ch)).ok_or_else(|| Error::invalid(format!("channel {ch:p} is not a channel of this sim device")))?;
        // SAFETY: the channel object is alive, owned by `c`.
        let refcnt = unsafe { (*c.obj).refcnt };
        if refcnt > 0 {
            return Err(Error::new(libc::EBUSY, format!("channel {ch:p} is still used by {refcnt} CQ(s)")));
        }
        self.channels.remove(&key(ch));
        Ok(())
    }

    /// Takes the oldest completion event of the channel: the CQ and its `cq_context`. `EAGAIN` when none.
    pub(crate) fn get_cq_event(&mut self, ch: *mut ibv_comp_channel) -> Result<(*mut ibv_cq, *mut c_void)> {
        let c = self.channels.get_mut(&key(ch)).ok_or_else(|| Error::invalid(format!("channel {ch:p} is not a channel of this sim device")))?;
        let Some(cq_key) = c.events.pop_front() else {
            return Err(Error::new(libc::EAGAIN, "no completion event is pending on the channel"));
        };
        c.sync_fd();
        let cq = self.cqs.get_mut(&cq_key).expect("a CQ's events leave its channel when it is destroyed");
        cq.events_got += 1;
        // SAFETY: the CQ object is alive, owned by `cq`.
        let cq_context = unsafe { (*cq.obj).cq_context };
        Ok((cq.obj, cq_context))
    }

    /// Acknowledges `n` completion events of the CQ. `EINVAL` for more than were taken and not yet acknowledged
    /// (libibverbs does not check; a model that lets the count go wrong would hide the ULP's bug).
    pub(crate) fn ack_cq_events(&mut self, cq: *mut ibv_cq, n: u32) -> Result<()> {
        let c = self.cqs.get_mut(&key(cq)).ok_or_else(|| Error::invalid(format!("cq {cq:p} is not a CQ of this sim device")))?;
        let unacked = c.events_got - c.events_acked;
        if u64::from(n) > unacked {
            return Err(Error::invalid(format!("acknowledging {n} completion event(s) of cq {cq:p}, but only {unacked} are unacknowledged")));
        }
        c.events_acked += u64::from(n);
        // SAFETY: the CQ object is alive, owned by `c`; libibverbs' ibv_ack_cq_events counts here too.
        unsafe { (*c.obj).comp_events_completed = (*c.obj).comp_events_completed.wrapping_add(n) };
        Ok(())
    }

    /// Takes the oldest asynchronous event, if any.
    pub(crate) fn get_async_event(&mut self) -> Option<AsyncEvent> {
        let e = self.async_events.pop_front();
        self.async_fd.set(!self.async_events.is_empty());
        e
    }

    pub(crate) fn async_fd(&self) -> i32 {
        self.async_fd.fd()
    }

    // ---- shared receive queues ----------------------------------------------------------------------------

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

    /// `ibv_poll_cq`: runs `steps_per_poll` steps, then pops up to `max` CQEs. A popped send CQE frees its
    /// slot and every earlier one of its SQ (the mlx5 rule); a popped receive CQE frees one receive slot.
    pub(crate) fn poll(&mut self, cq: *mut ibv_cq, max: usize, mut out: impl FnMut(usize, ibv_wc)) -> usize {
        if !self.null() {
            self.run(u64::from(self.cfg.steps_per_poll));
        }
        let Some(cqm) = self.cqs.get_mut(&key(cq)) else { return 0 };
        let mut n = 0;
        while n < max {
            let Some(entry) = cqm.entries.pop_front() else { break };
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
            out(n, entry.wc);
            n += 1;
        }
        n
    }

    // ---- QPs ---------------------------------------------------------------------------------------------

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
        if attr.rnr_retry > 7 || attr.retry_cnt > 7 || !(1..=MAX_RD_ATOMIC).contains(&attr.max_rd_atomic) {
            return Err(Error::invalid(format!(
                "connection attributes out of range: rnr_retry {} (0..=7), retry_cnt {} (0..=7), max_rd_atomic {} (1..={MAX_RD_ATOMIC})",
                attr.rnr_retry, attr.retry_cnt, attr.max_rd_atomic
            )));
        }
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

    pub(crate) fn set_error(&mut self, qp: *mut ibv_qp) -> Result<()> {
        self.with_qp(qp, |m, q| m.enter_error(q))
    }

    pub(crate) fn destroy_qp(&mut self, qp: *mut ibv_qp) -> Result<()> {
        let slot = self.slot_of(qp)?;
        let q = self.qps[slot].take().expect("no QP is taken out between calls");
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

    // ---- posting -----------------------------------------------------------------------------------------

    /// The caps the ops layer needs to copy a WR (`max_send_sge`, `max_inline_data`), and whether SGEs need to
    /// be copied at all (not in null mode).
    pub(crate) fn post_info(&self, qp: *mut ibv_qp) -> Option<(ScriptedQpCaps, bool)> {
        let slot = *self.qp_by_ptr.get(&key(qp))?;
        let q = self.qps[slot].as_ref()?;
        Some((q.caps, !self.null()))
    }

    /// Accepts or rejects one send WR. `Err` is a positive errno, as providers return from `post_send`.
    pub(crate) fn post_send(&mut self, qp: *mut ibv_qp, req: SendRequest) -> std::result::Result<(), i32> {
        let Ok(slot) = self.slot_of(qp) else { return Err(libc::EINVAL) };
        let r = self.with_slot(slot, |m, q| m.post_send_on(q, req)).unwrap_or(Err(libc::EINVAL));
        self.settle();
        r
    }

    fn post_send_on(&mut self, q: &mut QpModel, req: SendRequest) -> std::result::Result<(), i32> {
        let qpn = q.qpn;
        let index = q.posted;
        if q.state == QpState::Init {
            let text = format!(
                "{}: qp {qpn:#x} is not connected (INIT); wr_id {:#x} rejected with EINVAL",
                violation_kind_str(SQD_SIM_VIOLATION_QP_STATE),
                req.wr_id
            );
            self.violation(Some(q), SQD_SIM_VIOLATION_QP_STATE, None, text);
            return Err(libc::EINVAL);
        }
        if q.state != QpState::Err && q.posted - q.base >= u64::from(q.caps.max_send_wr) {
            self.stats.sq_overflows += 1;
            if self.strict() {
                let text = format!(
                    "{}: qp {qpn:#x} holds {} of {} send slots (none freed by a polled CQE); wr_id {:#x} rejected with ENOMEM",
                    violation_kind_str(SQD_SIM_VIOLATION_SQ_OVERFLOW),
                    q.posted - q.base,
                    q.caps.max_send_wr,
                    req.wr_id
                );
                self.violation(Some(q), SQD_SIM_VIOLATION_SQ_OVERFLOW, Some(index), text);
            }
            return Err(libc::ENOMEM);
        }
        let inline = req.flags & ibv_send_flags::IBV_SEND_INLINE.0 != 0;
        let bad = if wc_opcode(req.opcode).is_none() {
            Some(format!("unsupported opcode {}", req.opcode))
        } else if req.num_sge < 0 || req.num_sge as u32 > q.caps.max_send_sge {
            Some(format!("num_sge {} > max_send_sge {}", req.num_sge, q.caps.max_send_sge))
        } else if req.null_sg_list {
            Some(format!("num_sge {} with a NULL sg_list", req.num_sge))
        } else if inline && req.total_len > u64::from(q.caps.max_inline_data) {
            Some(format!("{} inline bytes > max_inline_data {}", req.total_len, q.caps.max_inline_data))
        } else if inline && !carries_data(req.opcode) {
            Some("IBV_SEND_INLINE on an opcode without outgoing data".to_string())
        } else if is_atomic(req.opcode) && (req.total_len != 8 || req.remote_addr % 8 != 0) {
            Some(format!("atomic needs 8 bytes of local SGE and an 8-byte aligned remote_addr (got {} bytes, {:#x})", req.total_len, req.remote_addr))
        } else {
            None
        };
        if let Some(why) = bad {
            let text = format!("{}: qp {qpn:#x} wr_id {:#x}: {why}; rejected with EINVAL", violation_kind_str(SQD_SIM_VIOLATION_BAD_WR), req.wr_id);
            self.violation(Some(q), SQD_SIM_VIOLATION_BAD_WR, None, text);
            return Err(libc::EINVAL);
        }
        let signaled = q.sig_all || req.flags & ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
        q.posted += 1;
        self.stats.wqes += 1;
        q.stats.wqes_posted += 1;
        q.stats.signaled_wqes += u64::from(signaled);
        q.stats.max_outstanding = q.stats.max_outstanding.max(q.posted - q.base);
        if q.scripted {
            q.history.push(ScriptedWqe {
                wr_id: req.wr_id,
                opcode: req.opcode,
                send_flags: req.flags,
                num_sge: req.num_sge,
                first_sge_length: req.sges.first().map_or(0, |s| s.len),
                first_sge_addr: req.sges.first().map_or(0, |s| s.addr),
                total_length: req.total_len,
                first_sge_lkey: req.sges.first().map_or(0, |s| s.lkey),
                imm_data: req.imm,
                remote_addr: req.remote_addr,
                rkey: req.rkey,
                compare_add: req.compare_add,
                swap: req.swap,
                signaled,
                ..ScriptedWqe::default()
            });
        }
        if self.null() {
            // Null mode: complete at once, no record kept.
            q.next_tx = q.posted;
            q.next_complete = q.posted;
            q.completed_total += 1;
            let status = if q.state == QpState::Err { FLUSH } else { SUCCESS };
            if status == SUCCESS {
                q.stats.executed += 1;
            }
            if signaled || status != SUCCESS {
                let wc = if status == SUCCESS {
                    let mut wc = blank_wc();
                    wc.wr_id = req.wr_id;
                    wc.opcode = wc_opcode(req.opcode).unwrap_or(GARBAGE);
                    wc.byte_len = req.total_len.min(u64::from(u32::MAX)) as u32;
                    wc.qp_num = qpn;
                    wc
                } else {
                    error_wc(req.wr_id, status, 0, qpn)
                };
                self.push_cqe(q, true, wc, Origin::Send(index), false);
            }
            return Ok(());
        }
        q.sq.push_back(Wqe {
            index,
            wr_id: req.wr_id,
            opcode: req.opcode,
            signaled,
            fence: req.flags & ibv_send_flags::IBV_SEND_FENCE.0 != 0,
            solicited: req.flags & ibv_send_flags::IBV_SEND_SOLICITED.0 != 0,
            sges: if inline { Vec::new() } else { req.sges },
            inline: if inline { req.inline } else { None },
            len: req.total_len,
            remote_addr: req.remote_addr,
            rkey: req.rkey,
            imm: req.imm,
            compare_add: req.compare_add,
            swap: req.swap,
            psn: None,
            tx_count: 0,
            sent_at: 0,
            image: None,
            modified_logged: false,
            done: false,
            status: SUCCESS,
            vendor_err: 0,
        });
        if q.state == QpState::Err {
            // A WR posted to a QP in error is flushed at once.
            self.complete_ready(q);
        } else {
            self.active.insert(q.slot);
        }
        Ok(())
    }

    pub(crate) fn doorbell(&mut self, qp: *mut ibv_qp) {
        self.stats.doorbells += 1;
        if let Some(q) = self.qp_by_ptr.get(&key(qp)).and_then(|&s| self.qps[s].as_mut()) {
            q.stats.doorbells += 1;
        }
    }

    /// Accepts or rejects one receive WR (positive errno on rejection).
    pub(crate) fn post_recv(&mut self, qp: *mut ibv_qp, req: RecvRequest) -> std::result::Result<(), i32> {
        let Ok(slot) = self.slot_of(qp) else { return Err(libc::EINVAL) };
        let r = self.with_slot(slot, |m, q| m.post_recv_on(q, req)).unwrap_or(Err(libc::EINVAL));
        self.settle();
        r
    }

    fn post_recv_on(&mut self, q: &mut QpModel, req: RecvRequest) -> std::result::Result<(), i32> {
        let qpn = q.qpn;
        if q.srq.is_some() {
            let text = format!(
                "{}: qp {qpn:#x} takes its receives from an SRQ; ibv_post_recv wr_id {:#x} rejected with EINVAL (post to the SRQ)",
                violation_kind_str(SQD_SIM_VIOLATION_BAD_WR),
                req.wr_id
            );
            self.violation(Some(q), SQD_SIM_VIOLATION_BAD_WR, None, text);
            return Err(libc::EINVAL);
        }
        if q.state != QpState::Err && q.recv_held >= q.caps.max_recv_wr as usize {
            self.stats.rq_overflows += 1;
            if self.strict() {
                let text = format!(
                    "{}: qp {qpn:#x} holds {} of {} receive slots; wr_id {:#x} rejected with ENOMEM",
                    violation_kind_str(SQD_SIM_VIOLATION_RQ_OVERFLOW),
                    q.recv_held,
                    q.caps.max_recv_wr,
                    req.wr_id
                );
                self.violation(Some(q), SQD_SIM_VIOLATION_RQ_OVERFLOW, None, text);
            }
            return Err(libc::ENOMEM);
        }
        if req.num_sge < 0 || req.num_sge as u32 > q.caps.max_recv_sge || req.null_sg_list {
            let text = format!(
                "{}: qp {qpn:#x} receive wr_id {:#x} has num_sge {} (max_recv_sge {}){}; rejected with EINVAL",
                violation_kind_str(SQD_SIM_VIOLATION_BAD_WR),
                req.wr_id,
                req.num_sge,
                q.caps.max_recv_sge,
                if req.null_sg_list { " and a NULL sg_list" } else { "" }
            );
            self.violation(Some(q), SQD_SIM_VIOLATION_BAD_WR, None, text);
            return Err(libc::EINVAL);
        }
        self.stats.recvs += 1;
        q.stats.recv_posted += 1;
        q.recv_held += 1;
        q.rq.push_back(Recv { wr_id: req.wr_id, sges: req.sges });
        if q.state == QpState::Err {
            self.enter_error(q);
        }
        Ok(())
    }

    // ---- time --------------------------------------------------------------------------------------------

    pub(crate) fn run(&mut self, steps: u64) {
        for _ in 0..steps {
            self.step_once();
        }
    }

    fn step_once(&mut self) {
        self.now += 1;
        let now = self.now;
        if !self.fatal_at.is_empty() {
            let due: Vec<u32> = self.fatal_at.iter().filter(|f| f.0 <= now).map(|f| f.1).collect();
            self.fatal_at.retain(|f| f.0 > now);
            self.pending_err.extend(due);
            self.settle();
        }
        while let Some(entry) = self.wire.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let p = entry.remove();
            self.deliver(p);
        }
        // Only QPs with work: an idle QP's tick does nothing (no ACK due, nothing to send or complete).
        let mut slots = std::mem::take(&mut self.tick_buf);
        slots.clear();
        slots.extend(self.active.iter().copied());
        self.stats.qp_ticks += slots.len() as u64;
        for &slot in &slots {
            self.with_slot(slot, |m, q| {
                m.responder_tick(q);
                m.requester_tick(q);
                if !Self::busy(q) {
                    m.active.remove(&slot);
                }
            });
        }
        self.tick_buf = slots;
        self.settle();
    }

    /// Whether a QP has work for the next step: in RTS with a send WQE not completed, or an ACK due.
    fn busy(q: &QpModel) -> bool {
        q.state == QpState::Rts && (q.next_complete < q.posted || q.ack_due.is_some())
    }

    fn idle(&self) -> bool {
        self.wire.is_empty() && self.active.iter().all(|&s| self.qps[s].as_ref().is_none_or(|q| !Self::busy(q)))
    }

    pub(crate) fn run_until_idle(&mut self, max_steps: u64) -> Result<u64> {
        let start = self.now;
        loop {
            if self.idle() {
                return Ok(self.now - start);
            }
            if self.now - start >= max_steps {
                return Err(Error::new(libc::ETIMEDOUT, format!("still busy after {max_steps} steps")));
            }
            self.step_once();
        }
    }

    // ---- the wire ----------------------------------------------------------------------------------------

    fn send_packet(&mut self, p: Packet, forced_loss: bool) {
        let is_req = matches!(p.body, Body::Req(_));
        let ppm = if is_req { self.cfg.loss_ppm } else { self.cfg.ack_loss_ppm };
        let lost = self.rng.chance_ppm(ppm) || forced_loss;
        if lost {
            if is_req {
                self.stats.packets_lost += 1;
            } else {
                self.stats.acks_lost += 1;
            }
            return;
        }
        let delay = self.rng.range(u64::from(self.cfg.wire_delay_min.max(1)), u64::from(self.cfg.wire_delay_max.max(1)));
        // Packets between two QPs arrive in the order they were sent (one path, IBA RC in-order delivery).
        let last = self.last_arrival.entry((p.src, p.dst)).or_insert(0);
        let at = (self.now + delay).max(*last);
        *last = at;
        self.wire_seq += 1;
        self.wire.insert((at, self.wire_seq), p);
    }

    fn deliver(&mut self, p: Packet) {
        let Some(&slot) = self.qp_by_num.get(&p.dst) else { return };
        self.with_slot(slot, |m, q| match p.body {
            Body::Req(r) => m.responder_rx(q, p.src, p.psn, r),
            Body::Resp(r) => m.requester_rx(q, p.psn, r),
        });
    }

    /// Sends a response from responder `q` to requester `dst` (`dst` may be `q` itself for a scripted sink).
    fn respond(&mut self, q: &mut QpModel, dst: u32, psn: u64, r: Response) {
        let lose = if dst == q.qpn {
            take_one(&mut q.lose_acks)
        } else {
            self.qp_by_num.get(&dst).and_then(|&s| self.qps[s].as_mut()).is_some_and(|d| take_one(&mut d.lose_acks))
        };
        self.send_packet(Packet { src: q.qpn, dst, psn, body: Body::Resp(r) }, lose);
    }

    // ---- responder ---------------------------------------------------------------------------------------

    fn responder_tick(&mut self, q: &mut QpModel) {
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

    fn responder_rx(&mut self, q: &mut QpModel, src: u32, psn: u64, r: Request) {
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
        // SAFETY: `remote_ok` proved the range lies in a valid MR registered for remote read, which its
        // registrant keeps readable while registered; `data` holds `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(r.remote_addr as *const u8, data.as_mut_ptr(), data.len()) };
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
                    // SAFETY: `remote_ok` proved the range lies in a valid MR registered for remote write, which
                    // its registrant keeps writable while registered; `data` holds `len` bytes.
                    unsafe { std::ptr::copy_nonoverlapping(r.data.as_ptr(), r.remote_addr as *mut u8, r.data.len()) };
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
                let p = r.remote_addr as *mut u64;
                // SAFETY: `remote_ok` proved the 8 bytes lie in a valid MR registered for remote atomics (which
                // implies local write), kept valid by its registrant; the address is 8-byte aligned (checked
                // at post time).
                let old = unsafe { p.read() };
                let new = if r.opcode == IBV_WR_ATOMIC_CMP_AND_SWP {
                    if old == r.compare_add {
                        r.swap
                    } else {
                        old
                    }
                } else {
                    old.wrapping_add(r.compare_add)
                };
                // SAFETY: as above.
                unsafe { p.write(new) };
                Outcome::Respond(Response::AtomicData(old))
            }
            _ => Outcome::Nak(ibv_wc_status::IBV_WC_REM_INV_REQ_ERR),
        }
    }

    // ---- requester ---------------------------------------------------------------------------------------

    /// Go back to `index`: it and every later unfinished remote WQE are sent again.
    fn rewind(&mut self, q: &mut QpModel, index: u64) {
        q.next_tx = q.next_tx.min(index);
        q.last_progress = self.now;
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

    fn requester_rx(&mut self, q: &mut QpModel, psn: u64, r: Response) {
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

    fn requester_tick(&mut self, q: &mut QpModel) {
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

    // ---- faults and scripting ----------------------------------------------------------------------------

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

    pub(crate) fn complete_n(&mut self, qp: *mut ibv_qp, n: usize) -> Result<usize> {
        let slot = self.slot_of(qp)?;
        let get = |m: &Model| {
            let q = m.qps[slot].as_ref().expect("no QP is taken out between calls");
            (q.completed_total, q.next_complete == q.posted)
        };
        let (start, _) = get(self);
        let mut steps = 0;
        loop {
            let (done, all) = get(self);
            if done - start >= n as u64 || all || steps >= COMPLETE_STEP_LIMIT {
                return Ok((done - start) as usize);
            }
            self.step_once();
            steps += 1;
        }
    }

    pub(crate) fn fail_next(&mut self, qp: *mut ibv_qp, status: u32, vendor_err: u32) -> Result<()> {
        if status == SUCCESS {
            return Err(Error::invalid("fail() needs an error status; use complete() for success"));
        }
        let q = self.qp(qp)?;
        let waiting = q.state == QpState::Rts && q.sq.iter().any(|w| w.tx_count == 0 && !w.done);
        if !waiting {
            return Err(Error::new(libc::ENOENT, format!("qp {:#x} has no send WQE waiting to be transmitted", q.qpn)));
        }
        let slot = self.slot_of(qp)?;
        self.qps[slot].as_mut().unwrap().fail_next = Some((status, vendor_err));
        Ok(())
    }

    pub(crate) fn deliver_now(&mut self, qp: *mut ibv_qp, byte_len: u32, imm: Option<u32>) -> Result<()> {
        self.with_qp(qp, |m, q| {
            let Some(recv) = m.take_recv(q) else {
                return Err(Error::new(libc::ENOENT, format!("qp {:#x} has no receive posted", q.qpn)));
            };
            let mut wc = blank_wc();
            wc.wr_id = recv.wr_id;
            wc.opcode = ibv_wc_opcode::IBV_WC_RECV;
            wc.byte_len = byte_len;
            wc.qp_num = q.qpn;
            wc.src_qp = q.peer.unwrap_or(0);
            if let Some(imm) = imm {
                wc.wc_flags = ibv_wc_flags::IBV_WC_WITH_IMM.0;
                wc.imm_data_invalidated_rkey_union.imm_data = imm;
            }
            m.push_cqe(q, false, wc, Origin::Recv, false);
            Ok(())
        })?
    }

    // ---- oracle and inspection ---------------------------------------------------------------------------

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

    pub(crate) fn stats(&self) -> SimStats {
        SimStats { steps: self.now, violations: self.violations.len() as u64, ..self.stats }
    }

    pub(crate) fn violations(&self) -> &[Violation] {
        &self.violations
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

    pub(crate) fn wqe_record(&self, qp: *mut ibv_qp, index: usize) -> Result<ScriptedWqe> {
        let q = self.qp(qp)?;
        if !q.scripted {
            return Err(Error::new(libc::EOPNOTSUPP, "WQE history is kept for QPs made through Scriptable::create_qp only"));
        }
        q.history.get(index).copied().ok_or_else(|| {
            Error::new(libc::ENOENT, format!("qp {:#x} has {} send WQEs; index {index} does not exist", q.qpn, q.history.len()))
        })
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

fn take_one(counter: &mut u32) -> bool {
    if *counter > 0 {
        *counter -= 1;
        true
    } else {
        false
    }
}
