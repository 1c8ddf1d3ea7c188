//! The model of every tracked QP, CQ and MR, updated at each post, poll and control call, and the rules
//! checked against it.
//!
//! Objects are keyed by their address (`usize`); the edge never hands over an address it did not see
//! created or tracked. A QP's send WQEs stay in its model from the post until a polled CQE covers them (a
//! CQE of WQE i covers every earlier WQE of the SQ: the slots it frees, as mlx5 frees them).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::config::{Config, Mode};
use super::hash::FastMap;
use super::kind::Kind;
use super::log::{Log, Record, NO_WQE};

// Values of libibverbs' enums that the rules use (verbs.h).
const WR_RDMA_WRITE: u32 = 0;
const WR_RDMA_WRITE_WITH_IMM: u32 = 1;
const WR_SEND: u32 = 2;
const WR_SEND_WITH_IMM: u32 = 3;
const WR_LOCAL_INV: u32 = 7;
const WR_SEND_WITH_INV: u32 = 9;
const SEND_FENCE: u32 = 1;
const SEND_SIGNALED: u32 = 2;
const SEND_INLINE: u32 = 8;
const WC_SUCCESS: u32 = 0;
const WC_WR_FLUSH_ERR: u32 = 5;
/// `IBV_WC_RECV` and later opcodes are receive completions.
const WC_RECV_FLAG: u32 = 1 << 7;

/// Reads registered memory for the source-buffer verifier.
pub trait Memory {
    /// A checksum of the bytes of `ranges` (host address, length), in order.
    fn checksum(&self, ranges: &[(usize, usize)]) -> u64;
}

/// One SGE of a WR, as posted.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// One send WR of a chain; its SGEs are `sges[first_sge..first_sge + num_sge]` of the chain's SGE list.
#[derive(Debug, Clone, Copy, Default)]
pub struct SendWr {
    pub wr_id: u64,
    pub opcode: u32,
    pub flags: u32,
    pub invalidate_rkey: u32,
    pub first_sge: usize,
    pub num_sge: usize,
}

/// One completion, the fields the rules read.
#[derive(Debug, Clone, Copy, Default)]
pub struct Wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub qp_num: u32,
}

/// What a QP was created with (the granted caps).
#[derive(Debug, Clone, Copy, Default)]
pub struct QpInfo {
    pub ctx: usize,
    pub num: u32,
    pub send_cq: usize,
    pub recv_cq: usize,
    pub sq_depth: u32,
    pub rq_depth: u32,
    pub sig_all: bool,
    pub srq: bool,
}

/// A registered MR: its keys, the address range WRs name (`iova`) and where that range is in this process
/// (`host`, 0 when unknown: a dmabuf MR).
#[derive(Debug, Clone, Copy, Default)]
pub struct MrInfo {
    pub ctx: usize,
    pub lkey: u32,
    pub rkey: u32,
    pub iova: u64,
    pub host: usize,
    pub len: u64,
}

/// A source checksum taken at post time.
#[derive(Debug)]
pub struct Sample {
    ranges: Vec<(usize, usize)>,
    sum: u64,
}

#[derive(Debug)]
struct Wqe {
    index: u64,
    wr_id: u64,
    signaled: bool,
    /// The lkeys its SGEs name (none for inline data: copied at post time): the first two in place, any
    /// more on the heap (a WR of one or two SGEs allocates nothing).
    keys: [u32; 2],
    nkeys: u8,
    more_keys: Option<Box<[u32]>>,
    sample: Option<Box<Sample>>,
}

impl Wqe {
    fn uses(&self, lkey: u32) -> bool {
        self.keys[..usize::from(self.nkeys)].contains(&lkey) || self.more_keys.as_ref().is_some_and(|m| m.contains(&lkey))
    }
}

#[derive(Debug)]
struct Qp {
    info: QpInfo,
    /// Send WQEs accepted so far: the index of the next one.
    posted: u64,
    /// Accepted send WQEs no polled CQE covers yet, oldest first.
    sq: VecDeque<Wqe>,
    /// Receives posted and not yet completed (wr_id), oldest first.
    rq: VecDeque<u64>,
    /// Unsignaled WQEs accepted since the last signaled one.
    run: u64,
    run_reported: bool,
    /// When the last WQE was accepted (kept only while the idle-tail rule is on).
    last_post: Option<Instant>,
    tail_reported: bool,
    /// A CQE with an error status was polled, or the QP was moved to the error state.
    in_error: bool,
}

impl Qp {
    fn used(&self) -> u64 {
        self.sq.len() as u64
    }
}

#[derive(Debug)]
struct Cq {
    ctx: usize,
    capacity: u64,
    /// SQ and RQ slots of the QPs using it: CQEs that can be outstanding at once.
    reserved: u64,
    /// QPs whose send CQ it is (for the idle-tail rule).
    senders: Vec<usize>,
    next_scan: Option<Instant>,
}

/// A finding made while a chain is checked: kind, the QP it is recorded against, WQE index, text.
type Finding = (Kind, u32, u64, String);

/// Per-chain scratch of [`Checker::before_post`]: the samples taken, one per WR.
pub type Samples = Vec<Option<Box<Sample>>>;

pub struct Checker {
    pub cfg: Config,
    pub log: Log,
    start: Instant,
    qps: FastMap<usize, Qp>,
    qp_by_num: FastMap<(usize, u32), usize>,
    cqs: FastMap<usize, Cq>,
    mrs: FastMap<usize, MrInfo>,
    by_lkey: FastMap<(usize, u32), usize>,
    by_rkey: FastMap<(usize, u32), usize>,
    sample_counter: u64,
    /// Set when a violation was recorded in abort mode: the edge writes the report and aborts.
    pub abort_now: bool,
}

fn is_source_op(opcode: u32) -> bool {
    matches!(opcode, WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM | WR_SEND | WR_SEND_WITH_IMM | WR_SEND_WITH_INV)
}

impl Checker {
    pub fn new(cfg: Config) -> Checker {
        let first = cfg.first;
        Checker {
            cfg,
            log: Log::new(first),
            start: Instant::now(),
            qps: FastMap::default(),
            qp_by_num: FastMap::default(),
            cqs: FastMap::default(),
            mrs: FastMap::default(),
            by_lkey: FastMap::default(),
            by_rkey: FastMap::default(),
            sample_counter: 0,
            abort_now: false,
        }
    }

    pub fn set_config(&mut self, cfg: Config) {
        self.log.set_first(cfg.first);
        self.cfg = cfg;
    }

    fn find(&mut self, kind: Kind, qp_num: u32, wqe_index: u64, text: String) {
        let time_ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if self.log.add(Record { kind, qp_num, wqe_index, time_ns, text }) && self.cfg.mode == Mode::Abort {
            self.abort_now = true;
        }
    }

    pub fn knows_qp(&self, qp: usize) -> bool {
        self.qps.contains_key(&qp)
    }

    // ---- CQs ----------------------------------------------------------------------------------------------

    pub fn track_cq(&mut self, cq: usize, ctx: usize, capacity: u32) {
        self.cqs.insert(cq, Cq { ctx, capacity: u64::from(capacity), reserved: 0, senders: Vec::new(), next_scan: None });
    }

    /// The CQ now holds `capacity` CQEs (`ibv_resize_cq`).
    pub fn resize_cq(&mut self, cq: usize, capacity: u32) {
        let Some(c) = self.cqs.get_mut(&cq) else { return };
        c.capacity = u64::from(capacity);
        let (cap, need) = (c.capacity, c.reserved);
        if need > cap {
            self.find(
                Kind::CqUndersized,
                0,
                NO_WQE,
                format!(
                    "{}: cq {cq:#x} resized to {cap} CQEs but its QPs can have {need} outstanding (every SQ and RQ slot \
                     can flush with its own CQE): a failure would overrun it",
                    Kind::CqUndersized.name()
                ),
            );
        }
    }

    pub fn untrack_cq(&mut self, cq: usize) {
        self.cqs.remove(&cq);
    }

    // ---- QPs ----------------------------------------------------------------------------------------------

    /// A QP was created: the CQ-sizing rule is checked for its CQs at once, before any WR is posted.
    pub fn track_qp(&mut self, qp: usize, info: QpInfo) {
        if let Some(old) = self.qps.remove(&qp) {
            self.release_qp(qp, &old);
        }
        let rq = if info.srq { 0 } else { info.rq_depth };
        let mut checks = Vec::new();
        for (cq, slots) in [(info.send_cq, info.sq_depth), (info.recv_cq, rq)] {
            if let Some(c) = self.cqs.get_mut(&cq) {
                c.reserved += u64::from(slots);
                if cq == info.send_cq && !c.senders.contains(&qp) {
                    c.senders.push(qp);
                }
                if slots > 0 && !checks.iter().any(|&(k, _)| k == cq) {
                    checks.push((cq, c.capacity));
                }
            }
        }
        for (cq, cap) in checks {
            let need = self.cqs.get(&cq).map_or(0, |c| c.reserved);
            if need > cap {
                self.find(
                    Kind::CqUndersized,
                    info.num,
                    NO_WQE,
                    format!(
                        "{}: cq {cq:#x} holds {cap} CQEs but its QPs can have {need} outstanding (every SQ and RQ slot \
                         can flush with its own CQE) once qp {:#x} ({} send, {rq} receive slots) uses it: a failure \
                         would overrun it",
                        Kind::CqUndersized.name(),
                        info.num,
                        info.sq_depth
                    ),
                );
            }
        }
        self.qp_by_num.insert((info.ctx, info.num), qp);
        self.qps.insert(
            qp,
            Qp {
                info,
                posted: 0,
                sq: VecDeque::new(),
                rq: VecDeque::new(),
                run: 0,
                run_reported: false,
                last_post: None,
                tail_reported: false,
                in_error: false,
            },
        );
    }

    fn release_qp(&mut self, qp: usize, q: &Qp) {
        let rq = if q.info.srq { 0 } else { q.info.rq_depth };
        if let Some(c) = self.cqs.get_mut(&q.info.send_cq) {
            c.reserved = c.reserved.saturating_sub(u64::from(q.info.sq_depth));
            c.senders.retain(|&s| s != qp);
        }
        if let Some(c) = self.cqs.get_mut(&q.info.recv_cq) {
            c.reserved = c.reserved.saturating_sub(u64::from(rq));
        }
        if self.qp_by_num.get(&(q.info.ctx, q.info.num)) == Some(&qp) {
            self.qp_by_num.remove(&(q.info.ctx, q.info.num));
        }
    }

    /// The QP is being destroyed. A sampled source whose WQE no polled CQE covered is checked one last time:
    /// changed now, it changed while the HCA could still read it.
    pub fn untrack_qp(&mut self, qp: usize, mem: &dyn Memory) {
        let Some(q) = self.qps.remove(&qp) else { return };
        self.release_qp(qp, &q);
        let num = q.info.num;
        for w in &q.sq {
            if let Some(s) = &w.sample {
                if mem.checksum(&s.ranges) != s.sum {
                    self.find(
                        Kind::SourceModified,
                        num,
                        w.index,
                        format!(
                            "{}: the source of send WQE #{} (wr_id {:#x}) of qp {num:#x} changed after its post, and \
                             no polled CQE covered the WQE before the QP was destroyed",
                            Kind::SourceModified.name(),
                            w.index,
                            w.wr_id
                        ),
                    );
                }
            }
        }
    }

    /// The QP was moved to `error` (true) or reset (false: its queues are emptied).
    pub fn qp_state(&mut self, qp: usize, error: bool) {
        let Some(q) = self.qps.get_mut(&qp) else { return };
        if error {
            q.in_error = true;
        } else {
            q.sq.clear();
            q.rq.clear();
            q.run = 0;
            q.run_reported = false;
            q.in_error = false;
        }
    }

    // ---- MRs ----------------------------------------------------------------------------------------------

    pub fn track_mr(&mut self, mr: usize, info: MrInfo) {
        self.untrack_mr_quiet(mr);
        self.by_lkey.insert((info.ctx, info.lkey), mr);
        self.by_rkey.insert((info.ctx, info.rkey), mr);
        self.mrs.insert(mr, info);
    }

    fn untrack_mr_quiet(&mut self, mr: usize) -> Option<MrInfo> {
        let info = self.mrs.remove(&mr)?;
        if self.by_lkey.get(&(info.ctx, info.lkey)) == Some(&mr) {
            self.by_lkey.remove(&(info.ctx, info.lkey));
        }
        if self.by_rkey.get(&(info.ctx, info.rkey)) == Some(&mr) {
            self.by_rkey.remove(&(info.ctx, info.rkey));
        }
        // Its memory may be freed from now on: samples that read it are dropped.
        for q in self.qps.values_mut().filter(|q| q.info.ctx == info.ctx) {
            for w in q.sq.iter_mut().filter(|w| w.uses(info.lkey)) {
                w.sample = None;
            }
        }
        Some(info)
    }

    /// The first WQE, on any QP of `ctx`, that references `lkey` and that no polled CQE covers yet.
    fn user_of(&self, ctx: usize, lkey: u32, skip_qp: Option<usize>) -> Option<(u32, u64, u64)> {
        let mut best: Option<(u32, u64, u64)> = None;
        for (&k, q) in &self.qps {
            if q.info.ctx != ctx || Some(k) == skip_qp {
                continue;
            }
            if let Some(w) = q.sq.iter().find(|w| w.uses(lkey)) {
                if best.is_none_or(|b| (q.info.num, w.index) < (b.0, b.1)) {
                    best = Some((q.info.num, w.index, w.wr_id));
                }
            }
        }
        best
    }

    /// The MR is being deregistered (called before the provider deregisters it).
    pub fn untrack_mr(&mut self, mr: usize) {
        let Some(info) = self.mrs.get(&mr).copied() else { return };
        if let Some((qpn, index, wr_id)) = self.user_of(info.ctx, info.lkey, None) {
            self.find(
                Kind::MrInUse,
                qpn,
                index,
                format!(
                    "{}: ibv_dereg_mr deregistered key {:#x} while send WQE #{index} (wr_id {wr_id:#x}) of qp {qpn:#x} \
                     still references it and no polled CQE covers it (it may be (re)transmitted)",
                    Kind::MrInUse.name(),
                    info.lkey
                ),
            );
        }
        self.untrack_mr_quiet(mr);
    }

    /// Forgets every object of a device context (the context is closed or its device freed); nothing is
    /// reported.
    pub fn detach(&mut self, ctx: usize) {
        let qps: Vec<usize> = self.qps.iter().filter(|(_, q)| q.info.ctx == ctx).map(|(&k, _)| k).collect();
        for k in qps {
            if let Some(q) = self.qps.remove(&k) {
                self.release_qp(k, &q);
            }
        }
        self.cqs.retain(|_, c| c.ctx != ctx);
        let mrs: Vec<usize> = self.mrs.iter().filter(|(_, m)| m.ctx == ctx).map(|(&k, _)| k).collect();
        for k in mrs {
            self.untrack_mr_quiet(k);
        }
    }

    // ---- posting ------------------------------------------------------------------------------------------

    /// A chain is about to be handed to the provider: every rule that a post can break is checked for the WRs
    /// the provider would accept (up to the first that overflows the SQ), and the sampled sources are
    /// checksummed into `samples` (one entry per WR). `in_error`: the QP's state says error.
    pub fn before_post(
        &mut self,
        qp: usize,
        wrs: &[SendWr],
        sges: &[Sge],
        in_error: bool,
        mem: &dyn Memory,
        samples: &mut Samples,
    ) {
        samples.clear();
        let Some(q) = self.qps.get(&qp) else { return };
        let (num, depth, sig_all, ctx) = (q.info.num, u64::from(q.info.sq_depth), q.info.sig_all, q.info.ctx);
        let check_credits = !(in_error || q.in_error);
        let (used0, posted) = (q.used(), q.posted);
        let mut run = q.run;
        let mut run_reported = q.run_reported;
        let mut found: Vec<Finding> = Vec::new();
        for (k, wr) in wrs.iter().enumerate() {
            let (used, index) = (used0 + k as u64, posted + k as u64);
            let wr_sges = sges.get(wr.first_sge..wr.first_sge + wr.num_sge).unwrap_or(&[]);
            if check_credits && used >= depth {
                found.push((
                    Kind::SqOverflow,
                    num,
                    index,
                    format!(
                        "{}: qp {num:#x} holds {used} of {depth} send slots (none freed by a polled CQE); wr_id {:#x} \
                         would be rejected with ENOMEM",
                        Kind::SqOverflow.name(),
                        wr.wr_id
                    ),
                ));
                break;
            }
            let signaled = sig_all || wr.flags & SEND_SIGNALED != 0;
            if wr.opcode == WR_LOCAL_INV {
                self.check_invalidate(qp, wr, index, &wrs[..k], sges, &mut found);
            }
            if signaled {
                run = 0;
                run_reported = false;
            } else {
                run += 1;
                if run >= depth && !run_reported {
                    run_reported = true;
                    found.push((
                        Kind::UnsignaledRun,
                        num,
                        index,
                        format!(
                            "{}: qp {num:#x} has {run} unsignaled send WQEs since its last signaled one, as many as \
                             its {depth} send slots: no completion can ever free them (wr_id {:#x})",
                            Kind::UnsignaledRun.name(),
                            wr.wr_id
                        ),
                    ));
                }
            }
            let sample = self.take_sample(ctx, wr, wr_sges, mem);
            samples.push(sample);
        }
        if let Some(q) = self.qps.get_mut(&qp) {
            q.run_reported = run_reported;
        }
        for (kind, on, index, text) in found {
            self.find(kind, on, index, text);
        }
    }

    /// A LOCAL_INV at `index` of `qp`: the MR it invalidates must not be used by a WQE no CQE covers, on another
    /// QP at all, on this QP unless the LocalInv is fenced. `earlier`: the WRs before it in the same chain.
    fn check_invalidate(
        &self,
        qp: usize,
        wr: &SendWr,
        index: u64,
        earlier: &[SendWr],
        sges: &[Sge],
        found: &mut Vec<Finding>,
    ) {
        let Some(q) = self.qps.get(&qp) else { return };
        let (ctx, num) = (q.info.ctx, q.info.num);
        let Some(mr) = self.by_rkey.get(&(ctx, wr.invalidate_rkey)).and_then(|m| self.mrs.get(m)) else { return };
        let lkey = mr.lkey;
        let rkey = wr.invalidate_rkey;
        if wr.flags & SEND_FENCE == 0 {
            let mut user = q.sq.iter().find(|w| w.uses(lkey)).map(|w| (w.index, w.wr_id));
            if user.is_none() {
                let base = q.posted;
                user = earlier.iter().enumerate().find_map(|(i, e)| {
                    let e_sges = sges.get(e.first_sge..e.first_sge + e.num_sge).unwrap_or(&[]);
                    (e.flags & SEND_INLINE == 0 && e_sges.iter().any(|s| s.lkey == lkey)).then_some((base + i as u64, e.wr_id))
                });
            }
            if let Some((user_index, user_wr_id)) = user {
                found.push((
                    Kind::UnfencedInvalidate,
                    num,
                    user_index,
                    format!(
                        "{}: LOCAL_INV WQE #{index} (wr_id {:#x}) of qp {num:#x} invalidates key {rkey:#x} without \
                         IBV_SEND_FENCE while send WQE #{user_index} (wr_id {user_wr_id:#x}) before it still uses the \
                         MR and no polled CQE covers it: the HCA may run the LocalInv first (IBA Table 79)",
                        Kind::UnfencedInvalidate.name(),
                        wr.wr_id
                    ),
                ));
            }
        }
        if let Some((other, user_index, user_wr_id)) = self.user_of(ctx, lkey, Some(qp)) {
            found.push((
                Kind::MrInUse,
                other,
                user_index,
                format!(
                    "{}: LOCAL_INV WQE #{index} of qp {num:#x} invalidates key {rkey:#x} while send WQE #{user_index} \
                     (wr_id {user_wr_id:#x}) of qp {other:#x} still references it and no polled CQE covers it",
                    Kind::MrInUse.name()
                ),
            ));
        }
    }

    fn take_sample(&mut self, ctx: usize, wr: &SendWr, sges: &[Sge], mem: &dyn Memory) -> Option<Box<Sample>> {
        if self.cfg.sample_every == 0 || !is_source_op(wr.opcode) || wr.flags & SEND_INLINE != 0 || sges.is_empty() {
            return None;
        }
        self.sample_counter += 1;
        if self.sample_counter % u64::from(self.cfg.sample_every) != 0 {
            return None;
        }
        let mut budget = self.cfg.sample_bytes as usize;
        let mut ranges = Vec::with_capacity(sges.len());
        for s in sges {
            let mr = self.by_lkey.get(&(ctx, s.lkey)).and_then(|m| self.mrs.get(m))?;
            let end = s.addr.checked_add(u64::from(s.len))?;
            if mr.host == 0 || s.addr < mr.iova || end > mr.iova.checked_add(mr.len)? {
                return None;
            }
            let take = (s.len as usize).min(budget);
            if take > 0 {
                ranges.push((mr.host.checked_add(usize::try_from(s.addr - mr.iova).ok()?)?, take));
                budget -= take;
            }
        }
        if ranges.is_empty() {
            return None;
        }
        let sum = mem.checksum(&ranges);
        Some(Box::new(Sample { ranges, sum }))
    }

    /// The provider accepted the first `accepted` WRs of the chain `before_post` saw.
    pub fn after_post(&mut self, qp: usize, wrs: &[SendWr], sges: &[Sge], accepted: usize, samples: &mut Samples) {
        let Some(q) = self.qps.get_mut(&qp) else { return };
        let mut taken = samples.drain(..);
        for wr in wrs.iter().take(accepted) {
            let signaled = q.info.sig_all || wr.flags & SEND_SIGNALED != 0;
            let wr_sges = if wr.flags & SEND_INLINE != 0 {
                &[][..]
            } else {
                sges.get(wr.first_sge..wr.first_sge + wr.num_sge).unwrap_or(&[])
            };
            let mut keys = [0u32; 2];
            for (k, s) in keys.iter_mut().zip(wr_sges) {
                *k = s.lkey;
            }
            let nkeys = wr_sges.len().min(2) as u8;
            let more_keys = (wr_sges.len() > 2).then(|| wr_sges[2..].iter().map(|s| s.lkey).collect());
            let sample = taken.next().flatten();
            q.sq.push_back(Wqe { index: q.posted, wr_id: wr.wr_id, signaled, keys, nkeys, more_keys, sample });
            q.posted += 1;
            if signaled {
                q.run = 0;
                q.run_reported = false;
            } else {
                q.run += 1;
            }
        }
        if accepted > 0 {
            q.tail_reported = false;
            if self.cfg.idle_ms > 0 {
                q.last_post = Some(Instant::now());
            }
        }
    }

    pub fn after_post_recv(&mut self, qp: usize, wr_ids: &[u64]) {
        if let Some(q) = self.qps.get_mut(&qp) {
            if !q.info.srq {
                q.rq.extend(wr_ids.iter().copied());
            }
        }
    }

    // ---- polling ------------------------------------------------------------------------------------------

    /// The provider returned `wcs` from `cq` (none: the CQ was empty).
    pub fn after_poll(&mut self, cq: usize, wcs: &[Wc], mem: &dyn Memory) {
        let Some(ctx) = self.cqs.get(&cq).map(|c| c.ctx) else { return };
        if wcs.is_empty() {
            self.idle_scan(cq);
            return;
        }
        for wc in wcs {
            let Some(&qk) = self.qp_by_num.get(&(ctx, wc.qp_num)) else { continue };
            let Some(q) = self.qps.get_mut(&qk) else { continue };
            if wc.status != WC_SUCCESS {
                q.in_error = true;
            }
            let recv = if q.info.send_cq != q.info.recv_cq {
                cq == q.info.recv_cq
            } else if wc.status == WC_SUCCESS {
                wc.opcode & WC_RECV_FLAG != 0
            } else {
                !q.sq.iter().any(|w| w.wr_id == wc.wr_id)
            };
            if recv {
                if let Some(p) = q.rq.iter().position(|&id| id == wc.wr_id) {
                    q.rq.drain(..=p);
                }
                continue;
            }
            let Some(p) = q.sq.iter().position(|w| w.wr_id == wc.wr_id && (w.signaled || wc.status != WC_SUCCESS))
            else {
                continue;
            };
            let num = q.info.num;
            let mut modified: Vec<(u64, u64)> = Vec::new();
            let mut last = None;
            for w in q.sq.drain(..=p) {
                last = Some((w.index, w.wr_id, w.signaled));
                if let Some(s) = &w.sample {
                    if mem.checksum(&s.ranges) != s.sum {
                        modified.push((w.index, w.wr_id));
                    }
                }
            }
            for (index, wr_id) in modified {
                self.find(
                    Kind::SourceModified,
                    num,
                    index,
                    format!(
                        "{}: the source of send WQE #{index} (wr_id {wr_id:#x}) of qp {num:#x} changed between its \
                         post and the CQE that covers it (sampled checksum)",
                        Kind::SourceModified.name()
                    ),
                );
            }
            if let Some((index, wr_id, false)) = last {
                if wc.status == WC_WR_FLUSH_ERR {
                    self.find(
                        Kind::UnsignaledFlush,
                        num,
                        index,
                        format!(
                            "{}: qp {num:#x} completed unsignaled send WQE #{index} (wr_id {wr_id:#x}) with \
                             IBV_WC_WR_FLUSH_ERR: the ULP asked for no CQE for it",
                            Kind::UnsignaledFlush.name()
                        ),
                    );
                }
            }
        }
    }

    /// An empty poll: the ULP is waiting. A QP of this send CQ whose SQ ends in unsignaled WQEs and that has
    /// not posted for `idle_ms` is reported, once per tail.
    fn idle_scan(&mut self, cq: usize) {
        if self.cfg.idle_ms == 0 {
            return;
        }
        let idle = Duration::from_millis(u64::from(self.cfg.idle_ms));
        let now = Instant::now();
        let Some(c) = self.cqs.get_mut(&cq) else { return };
        if c.next_scan.is_some_and(|t| now < t) {
            return;
        }
        c.next_scan = Some(now + idle / 8);
        let senders = c.senders.clone();
        let mut found = Vec::new();
        for k in senders {
            let Some(q) = self.qps.get_mut(&k) else { continue };
            let tail = q.sq.back().is_some_and(|w| !w.signaled) && q.run > 0 && !q.in_error;
            let Some(since) = q.last_post else { continue };
            if !tail || q.tail_reported || now.duration_since(since) < idle {
                continue;
            }
            q.tail_reported = true;
            let last = q.sq.back().map_or(NO_WQE, |w| w.index);
            found.push((
                q.info.num,
                last,
                format!(
                    "{}: qp {:#x} ends in {} unsignaled send WQEs (the last #{last}) and has posted nothing for at \
                     least {} ms while its send CQ is polled: no completion will cover them until a signaled WR is \
                     posted",
                    Kind::IdleTail.name(),
                    q.info.num,
                    q.run,
                    self.cfg.idle_ms
                ),
            ));
        }
        for (num, index, text) in found {
            self.find(Kind::IdleTail, num, index, text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoMemory;
    impl Memory for NoMemory {
        fn checksum(&self, _: &[(usize, usize)]) -> u64 {
            0
        }
    }

    fn checker() -> Checker {
        let mut c = Checker::new(Config { sample_every: 0, idle_ms: 0, ..Config::default() });
        c.track_cq(10, 1, 64);
        c.track_qp(20, QpInfo { ctx: 1, num: 7, send_cq: 10, recv_cq: 10, sq_depth: 8, rq_depth: 8, ..QpInfo::default() });
        c.track_mr(30, MrInfo { ctx: 1, lkey: 0x11, rkey: 0x22, iova: 0x1000, host: 0, len: 0x1000 });
        c
    }

    fn post(c: &mut Checker, wrs: &[SendWr], sges: &[Sge]) {
        let mut samples = Samples::new();
        c.before_post(20, wrs, sges, false, &NoMemory, &mut samples);
        c.after_post(20, wrs, sges, wrs.len(), &mut samples);
    }

    #[test]
    fn a_local_inv_behind_a_send_of_the_same_chain_is_unfenced() {
        let mut c = checker();
        let sges = [Sge { addr: 0x1000, len: 64, lkey: 0x11 }];
        let send = SendWr { wr_id: 1, opcode: WR_SEND, flags: 0, first_sge: 0, num_sge: 1, ..SendWr::default() };
        let inv = SendWr { wr_id: 2, opcode: WR_LOCAL_INV, flags: SEND_SIGNALED, invalidate_rkey: 0x22, ..SendWr::default() };
        post(&mut c, &[send, inv], &sges);
        assert_eq!(c.log.count(Kind::UnfencedInvalidate), 1);
        let r = c.log.record(Kind::UnfencedInvalidate, 0).unwrap();
        assert_eq!((r.qp_num, r.wqe_index), (7, 0));
        // Fenced, nothing.
        let inv = SendWr { flags: SEND_SIGNALED | SEND_FENCE, ..inv };
        post(&mut c, &[send, inv], &sges);
        assert_eq!(c.log.count(Kind::UnfencedInvalidate), 1);
    }

    #[test]
    fn a_signaled_cqe_frees_every_slot_up_to_its_wqe() {
        let mut c = checker();
        let wr = |id: u64, flags: u32| SendWr { wr_id: id, opcode: WR_SEND, flags, ..SendWr::default() };
        let chain: Vec<SendWr> = (0..8).map(|i| wr(i, if i == 3 { SEND_SIGNALED } else { 0 })).collect();
        post(&mut c, &chain, &[]);
        assert_eq!(c.log.violations(), 0);
        c.after_poll(10, &[Wc { wr_id: 3, status: WC_SUCCESS, opcode: 0, qp_num: 7 }], &NoMemory);
        post(&mut c, &[wr(8, SEND_SIGNALED), wr(9, 0), wr(10, 0), wr(11, 0)], &[]);
        assert_eq!(c.log.count(Kind::SqOverflow), 0, "4 slots were freed");
        post(&mut c, &[wr(12, 0)], &[]);
        let r = c.log.record(Kind::SqOverflow, 0).unwrap();
        assert_eq!((r.qp_num, r.wqe_index), (7, 12));
    }

    #[test]
    fn resizing_below_the_slots_is_undersized() {
        let mut c = checker();
        assert_eq!(c.log.count(Kind::CqUndersized), 0, "8 + 8 slots fit in 64");
        c.resize_cq(10, 15);
        assert_eq!(c.log.count(Kind::CqUndersized), 1);
    }
}
