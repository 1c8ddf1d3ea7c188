//! The qpair functions: create a QP through the connection manager and put it under a sqdisc queue; queue and
//! flush WR lists through it; destroy.

use std::cell::Cell;
use std::collections::VecDeque;
use std::ffi::c_int;
use std::ptr;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};

use rdma_sys::{ibv_cq, ibv_qp_init_attr, ibv_qp_type, ibv_recv_wr, ibv_send_wr, ibv_wc, ibv_wc_opcode, ibv_wc_status};
use sqdisc::verbs::{CqHandle, QpHandle, RecvChain, SendChain};
use sqdisc::{Completion, Deferred, Queue, QueueConfig, ReleaseHandler, SQD_COMPLETION_BUFFER_MODIFIED, SQD_COMPLETION_REFUSED};

use crate::abi::{self, ProviderQp, QpInitAttr, QpStats};
use crate::domain::{Domain, DomainState, Guarded, ManagedCq, Pending};
use crate::flushes::{Ledger, Origin, QpCounters, QP_COUNTERS_V1};
use crate::{cm, interpose, log_error, srq, wr_list};

/// What SPDK holds as `struct spdk_rdma_provider_qp *`: SPDK's public part first, then ours.
#[repr(C)]
pub(crate) struct ShimQp {
    pub public: ProviderQp,
    pub state: Option<Guarded<QpState>>,
    owned_stats: Option<Box<QpStats>>,
}

pub(crate) struct QpState {
    pub queue: Queue,
    qp_num: u32,
    /// The send CQ, whose gate a flush updates (the domain's own, shared: it outlives the queue on it).
    send: Rc<ManagedCq>,
    pending: Pending,
    /// Set while the qpair is destroyed: releases then owe SPDK nothing.
    destroying: Rc<Cell<bool>>,
    /// The error completions SPDK is owed and was handed (`flushes`).
    ledger: Rc<Ledger>,
}

fn flush_wc(wr_id: u64, opcode: u32, qp_num: u32) -> ibv_wc {
    error_wc(wr_id, opcode, qp_num, ibv_wc_status::IBV_WC_WR_FLUSH_ERR, 0)
}

fn error_wc(wr_id: u64, opcode: u32, qp_num: u32, status: ibv_wc_status::Type, vendor_err: u32) -> ibv_wc {
    // SAFETY: `ibv_wc` is plain data; all zeroes is a valid value.
    let mut wc: ibv_wc = unsafe { std::mem::zeroed() };
    wc.wr_id = wr_id;
    wc.status = status;
    wc.opcode = opcode as ibv_wc_opcode::Type;
    wc.vendor_err = vendor_err;
    wc.qp_num = qp_num;
    wc
}

/// Whether `SQDISC_SPDK_VERIFY_BUFFERS=1` was in the environment when the process made its first qpair: then
/// every send WR's source bytes are checksummed when SPDK flushes it and again when it is released, and a
/// difference (SPDK reused a buffer the HCA could still read) is logged through `spdk_log`. For debug runs: it
/// reads every byte sent twice.
fn verify_buffers() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SQDISC_SPDK_VERIFY_BUFFERS").is_some_and(|v| v == "1"))
}

/// The backlog-pool limit of every CQ the provider manages when the process has no
/// `SQDISC_SPDK_BACKLOG_LIMIT` (see [`backlog_limit`]).
pub(crate) const DEFAULT_BACKLOG_LIMIT: u32 = 16;

/// The most WRs the qpairs of one CQ may park at once, all together (`sqd_cq_set_backlog_limit`): without a
/// limit a CQ's backlog pool keeps room for every qpair's whole backlog, about 100 KB for a qpair of SPDK's
/// shape (max_send_wr 256, 16 SGEs), while under SPDK, which admits no more WRs than max_send_wr, WRs park
/// rarely. `SQDISC_SPDK_BACKLOG_LIMIT` in the environment when the process makes its first qpair changes it: a
/// number of WRs, or 0 for no limit (each qpair's backlog then has room for max_send_wr WRs of its own); a
/// value that is not a number up to 1048576 is logged and the default kept. A flush that would park a WR past
/// the limit gets what a full SQ gives raw verbs: ENOMEM, `*bad_wr` at the first WR not taken.
fn backlog_limit() -> u32 {
    static LIMIT: OnceLock<u32> = OnceLock::new();
    *LIMIT.get_or_init(|| match std::env::var("SQDISC_SPDK_BACKLOG_LIMIT") {
        Err(std::env::VarError::NotPresent) => DEFAULT_BACKLOG_LIMIT,
        Ok(v) => match v.trim().parse::<u32>() {
            Ok(n) if n <= 1 << 20 => n,
            _ => {
                log_error(&format!(
                    "SQDISC_SPDK_BACKLOG_LIMIT={v:?} is not a number of WRs up to 1048576; using {DEFAULT_BACKLOG_LIMIT}"
                ));
                DEFAULT_BACKLOG_LIMIT
            }
        },
        Err(_) => {
            log_error(&format!("SQDISC_SPDK_BACKLOG_LIMIT is not valid Unicode; using {DEFAULT_BACKLOG_LIMIT}"));
            DEFAULT_BACKLOG_LIMIT
        }
    })
}

/// Finds the domain the new qpair's CQs and SRQ live in, or a new one; `None` if they are in different ones.
fn pick_domain(send_cq: *mut ibv_cq, recv_cq: *mut ibv_cq, srq: Option<&Arc<Domain>>) -> Option<Arc<Domain>> {
    let mut found: Vec<Arc<Domain>> = [interpose::domain_of(send_cq), interpose::domain_of(recv_cq), srq.cloned()]
        .into_iter()
        .flatten()
        .collect();
    found.dedup_by(|a, b| Arc::ptr_eq(a, b));
    match found.len() {
        0 => Some(Domain::new()),
        1 => found.pop(),
        _ if found.iter().all(|d| Arc::ptr_eq(d, &found[0])) => found.pop(),
        _ => None,
    }
}

/// Makes `cq` a managed CQ of the domain (or refreshes its capacity after an `ibv_resize_cq`).
fn ensure_cq(state: &mut DomainState, domain: &Arc<Domain>, cq: *mut ibv_cq) -> Result<(), String> {
    if let Some(m) = state.cq(cq) {
        // A shrunk CQ is refused by the queue's own budget check below, with the numbers.
        let _ = m.sqd.update_capacity();
        return Ok(());
    }
    // SAFETY: `cq` is a live CQ SPDK made on a live context, which outlives its qpairs (and so the CQ's
    // management, which ends with its last qpair).
    let (originals, gate) = unsafe { interpose::manage(cq, domain) }?;
    // SAFETY: as above; the originals are the provider's own ops for this CQ's context.
    let handle = match unsafe { CqHandle::from_raw_with_ops(cq, originals.poll, originals.notify) } {
        Ok(h) => h,
        Err(e) => {
            interpose::unmanage(cq);
            return Err(e.message().to_owned());
        }
    };
    let sqd = sqdisc::Cq::new(handle);
    let limit = backlog_limit();
    if limit != 0 {
        if let Err(e) = sqd.set_backlog_limit(limit) {
            drop(sqd);
            interpose::unmanage(cq);
            return Err(e.message().to_owned());
        }
    }
    state.cqs.push(Rc::new(ManagedCq { cq, sqd, pending: Pending::default(), gate, book: Default::default() }));
    Ok(())
}

/// Makes room for `extra` more reserved CQEs on `m` with `ibv_resize_cq`, as SPDK itself grows a poll group's
/// CQ when it adds a qpair.
fn grow(m: &ManagedCq, extra: u64) -> Result<(), String> {
    if extra == 0 {
        return Ok(());
    }
    let st = m.sqd.stats();
    let want = st.reserved + extra;
    if want <= st.capacity {
        return Ok(());
    }
    let cqe = i32::try_from(want).map_err(|_| format!("a CQ of {want} CQEs is beyond what verbs can ask for"))?;
    // SAFETY: a live CQ SPDK made; resizing keeps the CQEs it holds (ibv_resize_cq(3)).
    let rc = unsafe { rdma_sys::ibv_resize_cq(m.cq, cqe) };
    if rc != 0 {
        return Err(format!("growing the CQ from {} to {want} CQEs with ibv_resize_cq failed (errno {rc})", st.capacity));
    }
    m.sqd.update_capacity().map(|_| ()).map_err(|e| e.message().to_owned())
}

/// Stops managing CQs of the domain that no queue uses any more.
fn release_unused_cqs(state: &mut DomainState) {
    state.cqs.retain(|m| {
        let used = m.sqd.queue_count() > 0;
        if !used {
            interpose::unmanage(m.cq);
        }
        used
    });
}

#[no_mangle]
pub extern "C" fn spdk_rdma_provider_qp_create(cm_id: *mut rdma_sys::rdma_cm_id, qp_attr: *mut QpInitAttr) -> *mut ProviderQp {
    crate::boundary(ptr::null_mut(), || {
        // SAFETY: SPDK passes a valid init attr struct, or NULL.
        let Some(attr) = (unsafe { qp_attr.as_mut() }) else {
            log_error("qp_create: qp_attr is NULL");
            return ptr::null_mut();
        };
        if cm_id.is_null() || attr.pd.is_null() || attr.send_cq.is_null() || attr.recv_cq.is_null() {
            log_error("qp_create: cm_id, pd, send_cq and recv_cq are required");
            return ptr::null_mut();
        }
        if attr.domain_transfer.is_some() {
            log_error("qp_create: memory domain transfer is not supported by the sqdisc provider");
            return ptr::null_mut();
        }
        // SAFETY: a non-NULL `srq` SPDK passes is one it made with `spdk_rdma_provider_srq_create`.
        let srq = unsafe { srq::lookup(attr.srq) };
        if !attr.srq.is_null() && srq.is_none() {
            log_error("qp_create: the SRQ was not made by spdk_rdma_provider_srq_create");
            return ptr::null_mut();
        }
        let Some(domain) = pick_domain(attr.send_cq, attr.recv_cq, srq.map(|s| s.domain())) else {
            log_error("qp_create: the qpair's CQs and SRQ belong to different poll groups");
            return ptr::null_mut();
        };
        // SAFETY: `ibv_qp_init_attr` is plain data; all zeroes is valid (and what SPDK starts from).
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.qp_context = attr.qp_context;
        init.send_cq = attr.send_cq;
        init.recv_cq = attr.recv_cq;
        init.srq = attr.srq;
        init.cap = attr.cap;
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        // SAFETY: the connection manager, called as SPDK's verbs provider calls it.
        let rc = unsafe { cm::create_qp(cm_id, attr.pd, &mut init) };
        if rc != 0 {
            log_error(&format!("qp_create: {} failed ({rc}, errno {})", cm::name("create_qp"), std::io::Error::last_os_error()));
            return ptr::null_mut();
        }
        // SAFETY: `cm_id` is live; create_qp stored the new QP in it.
        let qp = unsafe { (*cm_id).qp };
        let state = match manage(&domain, qp, &init, srq) {
            Ok(s) => s,
            Err(msg) => {
                log_error(&format!("qp_create: {msg}"));
                // SAFETY: the QP made above, not yet seen by SPDK.
                unsafe { cm::destroy_qp(cm_id) };
                return ptr::null_mut();
            }
        };
        // SAFETY: SPDK's rdma_utils, as its verbs provider calls it.
        let mem_domain = unsafe { abi::spdk_rdma_utils_get_memory_domain(attr.pd) };
        let (stats, owned_stats) = if attr.stats.is_null() {
            let mut b = Box::new(QpStats::default());
            (&mut *b as *mut QpStats, Some(b))
        } else {
            (attr.stats, None)
        };
        let shim = Box::new(ShimQp {
            public: ProviderQp {
                qp,
                cm_id,
                domain: mem_domain,
                send_wrs: abi::SendWrList { first: ptr::null_mut(), last: ptr::null_mut() },
                recv_wrs: abi::RecvWrList { first: ptr::null_mut(), last: ptr::null_mut() },
                stats,
                shared_stats: owned_stats.is_none(),
            },
            state: Some(state),
            owned_stats,
        });
        let raw = Box::into_raw(shim).cast::<ProviderQp>();
        if mem_domain.is_null() {
            log_error("qp_create: spdk_rdma_utils_get_memory_domain failed");
            spdk_rdma_provider_qp_destroy(raw);
            return ptr::null_mut();
        }
        attr.cap = init.cap;
        raw
    })
}

/// What a release that is not the common success owes SPDK: an error completion (the provider's own for a WR
/// that never reached the SQ, else the device's, counted in the ledger), and a log line for a modified buffer.
#[cold]
#[inline(never)]
fn release_owed(c: &Completion, qp_num: u32, destroying: &Cell<bool>, ledger: &Ledger, pending: &Pending) {
    if c.status != 0 && !destroying.get() {
        if c.never_posted() && !c.is_recv() {
            // A WR flushed from the backlog never reached the SQ, so no CQE will say so: raw verbs
            // would have flushed it with its own completion, signaled or not, and SPDK counts on it.
            // A WR the device refused when it was posted from the backlog: SPDK took its flush as
            // posted, so this completion is the only way to tell it; it carries the refusal.
            let wc = if c.flags & SQD_COMPLETION_REFUSED != 0 {
                if ledger.refused(c.vendor_err) {
                    log_error(&format!(
                        "qpair of QP {qp_num:#x}: the device refused WR {:#x} (wc opcode {}) with errno {} \
                         when it was posted from the backlog; SPDK gets it as a completion with status \
                         {} (not logged again for this qpair; counted in sqd_spdk_qp_counters.refused)",
                        c.wr_id, c.opcode, c.vendor_err, c.status
                    ));
                }
                error_wc(c.wr_id, c.opcode, qp_num, c.status, c.vendor_err)
            } else {
                flush_wc(c.wr_id, c.opcode, qp_num)
            };
            pending.borrow_mut().push_back(wc);
            ledger.owe(c.wr_id, Origin::Own);
        } else if !c.never_posted() {
            // The device's CQE of this WR reaches SPDK in this poll.
            ledger.owe(c.wr_id, if c.is_recv() { Origin::Recv } else { Origin::Send });
        }
    }
    if c.flags & SQD_COMPLETION_BUFFER_MODIFIED != 0 {
        log_error(&format!(
            "qpair {qp_num:#x}: SGE {} of WR {:#x} (wc opcode {}) was written while the HCA could still read it",
            c.modified_sge, c.wr_id, c.opcode
        ));
    }
}

/// Puts the new QP under a queue of `domain`.
fn manage(domain: &Arc<Domain>, qp: *mut rdma_sys::ibv_qp, init: &ibv_qp_init_attr, srq: Option<&Guarded<srq::SrqState>>) -> Result<Guarded<QpState>, String> {
    let held = domain.lock();
    let result = (|| {
        let mut st = held.borrow_mut();
        ensure_cq(&mut st, domain, init.send_cq)?;
        ensure_cq(&mut st, domain, init.recv_cq)?;
        let st = &*st;
        let send = st.cq(init.send_cq).expect("just managed");
        let recv = st.cq(init.recv_cq).expect("just managed");
        // SAFETY: the QP SPDK's rdma_cm layer just made; it lives until the qpair is destroyed, after the queue.
        let qp_num = unsafe { QpHandle::from_raw(qp) }.map_err(|e| e.message().to_owned())?.qp_num();
        let with_rq = init.srq.is_null() && init.cap.max_recv_wr > 0;
        let config = QueueConfig {
            sq_depth: init.cap.max_send_wr,
            max_send_sge: init.cap.max_send_sge,
            max_inline_data: init.cap.max_inline_data,
            rq_depth: if with_rq { init.cap.max_recv_wr } else { 0 },
            signal_interval: 0,
            // SPDK never has more than max_send_wr WRs outstanding, so this is room for all it can post.
            backlog_depth: init.cap.max_send_wr,
            verify_buffers: verify_buffers(),
            // SPDK sets a request's WRs up once and posts them again: they must come back as they were.
            no_restore: false,
            // SPDK finds its requests by their wr_ids.
            indexed: false,
        };
        let pending = send.pending.clone();
        let destroying = Rc::new(Cell::new(false));
        let ledger = Ledger::new(qp_num);
        if srq.is_some() {
            ledger.set_srq();
        }
        let build = |config: QueueConfig| {
            let pending = pending.clone();
            let destroying = destroying.clone();
            let ledger = ledger.clone();
            let release = ReleaseHandler::Closure(Box::new(move |c: &Completion| {
                // The common release (a success, nothing modified) owes SPDK nothing: two tests here, the rest
                // out of line.
                if (c.status != 0 && !destroying.get()) || c.flags & SQD_COMPLETION_BUFFER_MODIFIED != 0 {
                    release_owed(c, qp_num, &destroying, &ledger, &pending);
                }
            }));
            // SAFETY: as above.
            let qph = unsafe { QpHandle::from_raw(qp) }?;
            match srq {
                Some(s) => s.with(|s, _| Queue::with_srq(&send.sqd, &recv.sqd, &s.srq, qph, config, Some(release))),
                None if with_rq => Queue::new(&send.sqd, Some(&recv.sqd), qph, config, Some(release)),
                None => Queue::new(&send.sqd, None, qph, config, Some(release)),
            }
        };
        // The qpair's worst case must fit its CQs. SPDK sizes them by its own rules (with an SRQ, for the SRQ
        // alone), so the CQ is grown here as SPDK grows it, ibv_resize_cq, first by the queue's own
        // reservation, then by the SRQ's depth if it is the first of the SRQ's queues on that CQ.
        let same = init.send_cq == init.recv_cq;
        let srq_depth = srq.map_or(0, |s| s.with(|s, _| u64::from(s.srq.depth())));
        let sends = u64::from(config.sq_depth) + 1;
        let recvs = u64::from(config.rq_depth);
        let growth: [(u64, u64); 2] =
            if same { [(sends + recvs, 0), (srq_depth, 0)] } else { [(sends, recvs), (0, srq_depth)] };
        // Where the CQ cannot grow (iWARP, some providers), the queue signals every WR instead (signal_interval
        // 1) and reserves one CQE less, if that fits. It is safe: a marker is posted only to cover an unsignaled
        // tail, and with every WR signaled there never is one, so the SQ depth alone bounds the CQEs of the
        // sends, flushes included (every outstanding WQE flushes with one CQE, and sqdisc never has more than
        // max_send_wr WQEs outstanding). That is the sizing of SPDK's NVMe host, 2 n CQEs for n sends and n
        // receives; the host signals every SEND, so signaling every WR costs it nothing. A caller that leaves
        // WRs unsignaled gets their completions too, hidden from it as moderation's are.
        let mut config = config;
        let mut attempt = 0;
        let mut cannot_grow: Option<String> = None;
        let queue = loop {
            match build(config) {
                Ok(q) => break q,
                Err(e) if e.errno() == libc::ENOSPC && cannot_grow.is_none() && attempt < growth.len() => {
                    let (on_send, on_recv) = growth[attempt];
                    let grown = grow(send, on_send).and_then(|()| if same { Ok(()) } else { grow(recv, on_recv) });
                    match grown {
                        Ok(()) => attempt += 1,
                        Err(g) if config.signal_interval != 1 => {
                            config.signal_interval = 1;
                            cannot_grow = Some(g);
                        }
                        Err(g) => return Err(format!("{}; {g}", e.message())),
                    }
                }
                Err(e) => {
                    return Err(match &cannot_grow {
                        Some(g) if e.errno() == libc::ENOSPC => format!("{}; {g}", e.message()),
                        _ => e.message().to_owned(),
                    })
                }
            }
        };
        // SPDK learns of its sends from the completions it polls, not from releases: the common successes owe it
        // nothing, so they are released without a call, and a batch handler takes the runs of failures. The
        // releases that owe SPDK something else (a WR flushed from the backlog, a modified buffer) still come one
        // by one to `release` above.
        // A batch of failures is of WRs whose device CQEs reach SPDK in this poll: owed until then.
        let (batch_ledger, batch_destroying) = (ledger.clone(), destroying.clone());
        queue
            .set_release_failures(Box::new(move |b| {
                debug_assert_ne!(b.status, 0, "a batch of successes");
                if !batch_destroying.get() {
                    for &wr_id in b.wr_ids {
                        batch_ledger.owe(wr_id, Origin::Send);
                    }
                }
            }))
            .map_err(|e| e.message().to_owned())?;
        if let Some(g) = &cannot_grow {
            ledger.set_cq_not_grown();
            // SPDK cannot be told: the qpair works, signaling every WR. Said once per CQ.
            if !send.book.grow_logged.replace(true) {
                crate::log_warn(&format!(
                    "qpair of QP {qp_num:#x} (max_send_wr {}, max_recv_wr {}): {g}; the qpair signals every WR \
                     instead (not logged again for this CQ; counted in sqd_spdk_qp_counters.cq_not_grown)",
                    init.cap.max_send_wr, config.rq_depth
                ));
            }
        }
        send.book.register(qp_num, &ledger);
        recv.book.register(qp_num, &ledger);
        // A device that completes out of RC order: sqdisc hands SPDK the late completions of the WRs SPDK
        // signaled (SPDK matches them by wr_id), and this says so once per qpair.
        queue.on_out_of_order(Box::new(move |what: &str| {
            log_error(&format!(
                "qpair of QP {qp_num:#x}: the device completes out of RC order; the late completions of WRs SPDK \
                 signaled are still handed to SPDK (not logged again for this qpair): {what}"
            ))
        }));
        Ok(QpState { queue, qp_num, send: send.clone(), pending, destroying, ledger })
    })();
    match result {
        Ok(state) => Ok(Guarded::new(domain.clone(), state)),
        Err(e) => {
            release_unused_cqs(&mut held.borrow_mut());
            Err(e)
        }
    }
}

/// # Safety
/// `qp` is NULL or a qpair made by `spdk_rdma_provider_qp_create`, not destroyed.
unsafe fn shim<'a>(qp: *mut ProviderQp) -> Option<&'a mut ShimQp> {
    // SAFETY: `ProviderQp` is the first field of the `#[repr(C)]` `ShimQp` the pointer came from.
    unsafe { qp.cast::<ShimQp>().as_mut() }
}

#[no_mangle]
pub extern "C" fn spdk_rdma_provider_qp_accept(qp: *mut ProviderQp, conn_param: *mut rdma_sys::rdma_conn_param) -> c_int {
    crate::boundary(-libc::EINVAL, || {
        // SAFETY: SPDK passes its live qpair.
        let Some(s) = (unsafe { shim(qp) }) else { return -libc::EINVAL };
        // SAFETY: the connection manager, as SPDK's verbs provider calls it.
        unsafe { cm::accept(s.public.cm_id, conn_param) }
    })
}

#[no_mangle]
pub extern "C" fn spdk_rdma_provider_qp_complete_connect(_qp: *mut ProviderQp) -> c_int {
    0
}

#[no_mangle]
pub extern "C" fn spdk_rdma_provider_qp_disconnect(qp: *mut ProviderQp) -> c_int {
    crate::boundary(-libc::EINVAL, || {
        // SAFETY: SPDK passes its live qpair.
        let Some(s) = (unsafe { shim(qp) }) else { return -libc::EINVAL };
        if s.public.cm_id.is_null() {
            return 0;
        }
        // SAFETY: the connection manager; for IB and RoCE it moves the QP to the error state, so every WR still
        // outstanding flushes with its own completion, which the queue reaps and passes on.
        let rc = unsafe { cm::disconnect(s.public.cm_id) };
        if rc != 0 {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            // SAFETY: a live QP's context and device, field reads.
            let iwarp = unsafe { (*(*(*s.public.qp).context).device).transport_type } == rdma_sys::ibv_transport_type::IBV_TRANSPORT_IWARP;
            // iWARP moves the QP to error before the disconnect, which then fails with EINVAL: not an error.
            if errno == libc::EINVAL && iwarp {
                return 0;
            }
            log_error(&format!("qp_disconnect: {} failed (errno {errno})", cm::name("disconnect")));
        }
        rc
    })
}

/// With `SQDISC_SPDK_STATS=1` in the environment (read once), each qpair's sqdisc counters are written to
/// standard error when SPDK destroys it: one line per qpair, `sqdisc_spdk stats: key=value ...`, for end-to-end
/// runs (scripts/spdk-e2e.sh sums them per process). Standard error rather than `spdk_log`: SPDK's tools set
/// their own print levels (spdk_nvme_perf shows no warnings), and these lines are asked for.
fn stats_on_destroy() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SQDISC_SPDK_STATS").is_some_and(|v| v == "1"))
}

fn log_qp_stats(qp_num: u32, st: &sqdisc::QueueStats, f: &QpCounters) {
    eprintln!(
        "sqdisc_spdk stats: qp={qp_num:#x} accepted={} wqes={} doorbells={} markers={} mod_signals={} backlogged={} \
         backlog_peak={} send_cqes={} stray={} late={} refused={} failed_status={} send_flushes={} recv_flushes={} \
         owed_flushes={} other_errors={} duplicates={} unhanded={} dev_refused={} cq_not_grown={}",
        st.accepted,
        st.wqes,
        st.doorbells,
        st.markers,
        st.signaled_by_policy,
        st.parked,
        st.backlog_peak,
        st.send_cqes,
        st.stray_cqes,
        st.late_cqes,
        st.refused,
        st.failed_status,
        f.send_flushes,
        f.recv_flushes,
        f.owed_flushes,
        f.other_errors,
        f.duplicates,
        f.owed,
        f.refused,
        f.cq_not_grown
    );
}

#[no_mangle]
pub extern "C" fn spdk_rdma_provider_qp_destroy(qp: *mut ProviderQp) {
    crate::boundary((), || {
        if qp.is_null() {
            return;
        }
        // SAFETY: SPDK hands back a qpair made by `spdk_rdma_provider_qp_create`, once.
        let mut s = unsafe { Box::from_raw(qp.cast::<ShimQp>()) };
        if !s.public.send_wrs.first.is_null() {
            crate::log_warn("qp_destroy: destroying a qpair with queued work requests");
        }
        let state = s.state.take();
        if let Some(state) = &state {
            state.with(|q, dst| {
                let st = q.queue.stats();
                let f = q.ledger.counters();
                if stats_on_destroy() {
                    log_qp_stats(q.qp_num, &st, &f);
                }
                // Error completions SPDK was owed and never polled, or was handed twice: it cannot be told now.
                if f.owed > 0 || f.duplicates > 0 {
                    crate::log_warn(&format!(
                        "qpair of QP {:#x} destroyed with {} error completion(s) owed to SPDK and not handed, {} handed \
                         twice ({} flushes of sends and {} of receives from the device, {} of the provider's own, {} \
                         other errors handed)",
                        q.qp_num, f.owed, f.duplicates, f.send_flushes, f.recv_flushes, f.owed_flushes, f.other_errors
                    ));
                }
                if f.refused > 1 {
                    crate::log_warn(&format!(
                        "qpair of QP {:#x}: the device refused {} WRs posted from the backlog in all (newest errno {})",
                        q.qp_num, f.refused, f.refused_errno
                    ));
                }
                if let Ok(dst) = dst.try_borrow() {
                    for m in &dst.cqs {
                        m.book.unregister(q.qp_num);
                    }
                }
                // Completions sqdisc could match to no outstanding WR were counted and not handed to SPDK (SPDK
                // would have matched them to a stale wr_id). SPDK cannot be told of them; its log is, once per
                // qpair, with the counts.
                if st.stray_cqes > 0 {
                    crate::log_warn(&format!(
                        "qpair of QP {:#x}: {} completion(s) matched no outstanding WR and were not handed to SPDK \
                         ({} send CQEs reaped, {} WRs accepted)",
                        q.qp_num, st.stray_cqes, st.send_cqes, st.accepted
                    ));
                }
                q.destroying.set(true);
                // SPDK is done with the qpair: whatever is still outstanding is released now, and completions
                // that still arrive for it are dropped by the CQ instead of reaching SPDK.
                if q.queue.check_free().is_err() {
                    let _ = q.queue.on_async_event(rdma_sys::ibv_event_type::IBV_EVENT_QP_FATAL as u32);
                }
                let qp_num = q.qp_num;
                q.pending.borrow_mut().retain(|wc| wc.qp_num != qp_num);
            });
        }
        // The queue and its QP handle go before the QP they point at: a device that knows which objects the
        // library holds (the software HCA, through the device seam) refuses to destroy a held QP.
        let domain = state.map(|state| {
            let domain = state.domain().clone();
            {
                let _held = domain.lock();
                drop(state);
            }
            domain
        });
        if !s.public.qp.is_null() {
            // SAFETY: the connection manager destroys the QP it made for this qpair, once; nothing of the library
            // points at it any more. Providers discard the CQEs of a destroyed QP that are still in its CQs (mlx5,
            // the software HCA).
            unsafe { cm::destroy_qp(s.public.cm_id) };
        }
        if let Some(domain) = domain {
            let held = domain.lock();
            release_unused_cqs(&mut held.borrow_mut());
        }
        if !s.public.domain.is_null() {
            // SAFETY: the domain taken in qp_create, put back once.
            unsafe { abi::spdk_rdma_utils_put_memory_domain(s.public.domain) };
        }
        drop(s.owned_stats.take());
    })
}

#[no_mangle]
pub extern "C" fn spdk_rdma_provider_qp_queue_send_wrs(qp: *mut ProviderQp, first: *mut ibv_send_wr) -> bool {
    crate::boundary(false, || {
        // SAFETY: SPDK passes its live qpair.
        let Some(s) = (unsafe { shim(qp) }) else { return false };
        if first.is_null() {
            return false;
        }
        let l = &mut s.public.send_wrs;
        // SAFETY: SPDK's chain is valid and stays so until flushed, the list holds chains it queued before;
        // `stats` is SPDK's shared counters or ours, alive as long as the qpair.
        unsafe { wr_list::queue(&mut l.first, &mut l.last, first, &mut (*s.public.stats).send) }
    })
}

/// A flush's post that failed, as raw verbs would have answered it: the errno and the first WR not taken, or,
/// for a failed QP, the WRs taken and their flush completions owed.
#[cold]
#[inline(never)]
fn post_failed(q: &QpState, e: sqdisc::PostError<'_>) -> Result<(), (c_int, *mut ibv_send_wr)> {
    match e.error.errno() {
        libc::EIO if q.queue.stats().failed_status != 0 => {
            // The QP failed: raw verbs would take these WRs and flush each with its own completion.
            // Owe SPDK those, after the flushes of everything posted before them.
            let mut owed = VecDeque::new();
            let mut w = e.bad.as_ptr();
            while !w.is_null() {
                // SAFETY: SPDK's valid chain.
                let (wr_id, opcode, next) = unsafe { ((*w).wr_id, (*w).opcode, (*w).next) };
                owed.push_back(flush_wc(wr_id, sqdisc::verbs::wc_opcode_of(opcode).map_or(0, u32::from), q.qp_num));
                w = next;
            }
            let (pending, ledger) = (q.pending.clone(), q.ledger.clone());
            let owe = move || {
                for wc in &owed {
                    ledger.owe(wc.wr_id, Origin::Own);
                }
                pending.borrow_mut().extend(owed);
            };
            match q.queue.defer(Deferred::Closure(Box::new(owe))) {
                Ok(()) => Ok(()),
                // No memory to owe them: refuse them as raw verbs refuses a post to a failed QP.
                Err(_) => Err((e.error.errno(), e.bad.as_ptr())),
            }
        }
        // No SQ slot and no room to park (the qpair's backlog full, or its CQ's backlog pool at its
        // limit): what a full SQ gives raw verbs. The WRs from `bad` on stay SPDK's, untouched.
        libc::EAGAIN => Err((libc::ENOMEM, e.bad.as_ptr())),
        errno => Err((errno, e.bad.as_ptr())),
    }
}

#[no_mangle]
pub extern "C" fn spdk_rdma_provider_qp_flush_send_wrs(qp: *mut ProviderQp, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    crate::boundary(libc::EINVAL, || {
        // SAFETY: SPDK passes its live qpair.
        let Some(s) = (unsafe { shim(qp) }) else { return libc::EINVAL };
        if bad_wr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: as in queue_send_wrs.
        let Some(first) = wr_list::take(&mut s.public.send_wrs.first, unsafe { &mut (*s.public.stats).send }) else {
            return 0;
        };
        let Some(state) = &s.state else { return libc::EINVAL };
        let result = state.with(|q, _| {
            // SAFETY: SPDK's queued chain, valid for this call (and, for WRs the queue parks, copied).
            let chain = unsafe { SendChain::from_raw(first) };
            let posted = q.queue.post_send(chain);
            let result = match posted {
                Ok(()) => Ok(()),
                Err(e) => post_failed(q, e),
            };
            // The post may have left an idle tail to watch, or owed SPDK completions: the send CQ's next empty
            // poll must then go through sqdisc.
            q.send.update_gate();
            result
        });
        // SAFETY: checked non-NULL above.
        unsafe { wr_list::finish(bad_wr, result) }
    })
}

#[no_mangle]
pub extern "C" fn spdk_rdma_provider_qp_queue_recv_wrs(qp: *mut ProviderQp, first: *mut ibv_recv_wr) -> bool {
    crate::boundary(false, || {
        // SAFETY: SPDK passes its live qpair.
        let Some(s) = (unsafe { shim(qp) }) else { return false };
        if first.is_null() {
            return false;
        }
        let l = &mut s.public.recv_wrs;
        // SAFETY: as for sends.
        unsafe { wr_list::queue(&mut l.first, &mut l.last, first, &mut (*s.public.stats).recv) }
    })
}

#[no_mangle]
pub extern "C" fn spdk_rdma_provider_qp_flush_recv_wrs(qp: *mut ProviderQp, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    crate::boundary(libc::EINVAL, || {
        // SAFETY: SPDK passes its live qpair.
        let Some(s) = (unsafe { shim(qp) }) else { return libc::EINVAL };
        if bad_wr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: as for sends.
        let Some(first) = wr_list::take(&mut s.public.recv_wrs.first, unsafe { &mut (*s.public.stats).recv }) else {
            return 0;
        };
        let Some(state) = &s.state else { return libc::EINVAL };
        let result = state.with(|q, _| {
            // SAFETY: SPDK's queued chain, valid for this call.
            let chain = unsafe { RecvChain::from_raw(first) };
            q.queue.post_recv(chain).map_err(|e| (e.error.errno(), e.bad.as_ptr()))
        });
        // SAFETY: checked non-NULL above.
        unsafe { wr_list::finish(bad_wr, result) }
    })
}

#[no_mangle]
pub extern "C" fn spdk_rdma_provider_accel_sequence_supported() -> bool {
    false
}

/// Copies the sqdisc counters of a qpair's queue into `*out` (`struct sqd_queue_stats`, from sqdisc.h).
/// Returns 0, or `-EINVAL` (NULL argument, a qpair being destroyed).
#[no_mangle]
pub extern "C" fn sqd_spdk_qp_stats(qp: *const ProviderQp, out: *mut sqdisc::QueueStats) -> c_int {
    crate::boundary(-libc::EINVAL, || {
        // SAFETY: the caller passes a live qpair, or NULL.
        let Some(s) = (unsafe { shim(qp.cast_mut()) }) else { return -libc::EINVAL };
        // SAFETY: the caller's writable struct, or NULL.
        let Some(out) = (unsafe { out.as_mut() }) else { return -libc::EINVAL };
        let Some(state) = &s.state else { return -libc::EINVAL };
        *out = state.with(|q, _| q.queue.stats());
        0
    })
}

/// Copies the provider's own counters of a qpair into `*out` (`struct sqd_spdk_qp_counters`): at most
/// `out->size` bytes, which the call sets to what it wrote. Returns 0, or `-EINVAL` (NULL argument, a `size`
/// below the first version's, a qpair being destroyed).
#[no_mangle]
pub extern "C" fn sqd_spdk_qp_counters(qp: *const ProviderQp, out: *mut QpCounters) -> c_int {
    crate::boundary(-libc::EINVAL, || {
        // SAFETY: the caller passes a live qpair, or NULL.
        let Some(s) = (unsafe { shim(qp.cast_mut()) }) else { return -libc::EINVAL };
        if out.is_null() {
            return -libc::EINVAL;
        }
        // SAFETY: the caller's struct begins with its size.
        let size = unsafe { std::ptr::addr_of!((*out).size).read_unaligned() } as usize;
        if size < QP_COUNTERS_V1 {
            crate::log_error(&format!("sqd_spdk_qp_counters: size {size} is below the first version's {QP_COUNTERS_V1}"));
            return -libc::EINVAL;
        }
        let Some(state) = &s.state else { return -libc::EINVAL };
        let c = state.with(|q, _| {
            let mut c = q.ledger.counters();
            let late = q.queue.out_of_order();
            (c.out_of_order, c.out_of_order_shown) = (late.count, late.shown);
            c
        });
        // SAFETY: the caller's struct has at least `size` >= QP_COUNTERS_V1 writable bytes; this version writes
        // exactly its own size, and says so in `size`.
        unsafe { out.write_unaligned(c) };
        0
    })
}

/// Copies the sqdisc counters of a managed CQ into `*out` (`struct sqd_cq_stats`). Returns 0, `-EINVAL` (NULL
/// argument), or `-ENOENT` (no qpair of this provider uses `cq` now).
#[no_mangle]
pub extern "C" fn sqd_spdk_cq_stats(cq: *mut ibv_cq, out: *mut sqdisc::CqStats) -> c_int {
    crate::boundary(-libc::EINVAL, || {
        // SAFETY: the caller's writable struct, or NULL.
        let Some(out) = (unsafe { out.as_mut() }) else { return -libc::EINVAL };
        let Some(domain) = interpose::domain_of(cq) else { return -libc::ENOENT };
        let held = domain.lock();
        let st = held.borrow();
        match st.cq(cq) {
            Some(m) => {
                *out = m.sqd.stats();
                0
            }
            None => -libc::ENOENT,
        }
    })
}
