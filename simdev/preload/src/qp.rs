//! QPs: `ibv_create_qp` (and the extended `ibv_create_qp_ex` with the `ibv_wr_*` post API), `ibv_modify_qp`,
//! `ibv_query_qp`, `ibv_destroy_qp`.

use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use rdma_sys::{
    ibv_context, ibv_data_buf, ibv_pd, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_ex, ibv_qp_init_attr, ibv_qp_init_attr_ex, ibv_qp_state,
    ibv_sge, ibv_wr_opcode, verbs_context,
};
use sqdisc_sim_proto::{QpCaps, QpTransition, Reply, Request, SendWr, Sge};

use crate::context::{context, context_fast, Context};
use crate::objects::{pd_context, Cq, Srq};
use crate::{guarded, report, set_errno};

/// A QP: the extended struct (whose first field is the `ibv_qp` the program sees), the daemon's id, the caps
/// granted, the attributes last set (for `ibv_query_qp`), and the WRs an `ibv_wr_start` batch has built.
#[repr(C)]
pub struct Qp {
    pub qpx: ibv_qp_ex,
    pub id: u64,
    pub caps: QpCaps,
    pub sq_sig_all: bool,
    pub extended: bool,
    pub attr: Mutex<ibv_qp_attr>,
    pub batch: Mutex<Batch>,
    pub mirror: Mutex<Mirror>,
}

/// This side's copy of the QP's slot counts, kept from its posts and from the slots each polled completion
/// frees (the daemon says which), and whether the QP is connected. It is never emptier than the model's, so a
/// post it says fits is accepted: such posts go without waiting for an answer; any other waits for the model's.
#[derive(Default)]
pub struct Mirror {
    /// Send WRs accepted, and the send slots below `freed` that polled completions freed.
    pub posted: u64,
    pub freed: u64,
    /// Receive WRs accepted, and receive completions polled.
    pub recv_posted: u64,
    pub recv_polled: u64,
    /// Moved to RTR or beyond (connected in the model).
    pub connected: bool,
    /// Completions of the QP the program polled with `IBV_WC_WR_FLUSH_ERR`, and with another error status.
    pub flush_polled: u64,
    pub error_polled: u64,
}

/// Whether `SQDISC_SIM_QP_STATS=1` was in the environment (read once): then each QP's polled error completions
/// are written to standard error when it is destroyed, one line per QP, `sqdisc-sim qp stats: key=value ...`,
/// so that runs of a program with different RDMA layers above the device can be compared (scripts/spdk-e2e.sh).
fn stats_on_destroy() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SQDISC_SIM_QP_STATS").is_some_and(|v| v == "1"))
}

#[derive(Default)]
pub struct Batch {
    pub wrs: Vec<SendWr>,
    /// A call of the batch was invalid (an SGE before any WR, too many SGEs): `ibv_wr_complete` fails.
    pub error: Option<i32>,
}

/// A copy of a QP attribute struct (plain data, but not `Copy` in the bindings).
fn copy_attr(a: &ibv_qp_attr) -> ibv_qp_attr {
    // SAFETY: `ibv_qp_attr` is plain data (integers and plain structs): a bitwise copy is a valid value.
    unsafe { std::ptr::read(a) }
}

/// # Safety
/// `qp` is a live QP of this library.
pub unsafe fn qp_obj<'a>(qp: *mut ibv_qp) -> &'a Qp {
    // SAFETY: as the caller promises: a `Qp` whose first field (through `ibv_qp_ex`) is the `ibv_qp`.
    unsafe { &*qp.cast::<Qp>() }
}

/// # Safety
/// `qp` is a live QP of this library.
pub unsafe fn qp_context<'a>(qp: *mut ibv_qp) -> &'a Context {
    // SAFETY: as the caller promises.
    unsafe { context_fast((*qp).context) }
}

struct Init {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    qp_context: *mut c_void,
    send_cq: *mut rdma_sys::ibv_cq,
    recv_cq: *mut rdma_sys::ibv_cq,
    srq: *mut rdma_sys::ibv_srq,
    cap: *mut rdma_sys::ibv_qp_cap,
    qp_type: u32,
    sq_sig_all: bool,
    extended: bool,
}

fn create(c: &Context, init: Init) -> *mut ibv_qp {
    if init.send_cq.is_null() || init.recv_cq.is_null() {
        set_errno(libc::EINVAL);
        eprintln!("sqdisc-sim: ibv_create_qp: send_cq and recv_cq are required");
        return std::ptr::null_mut();
    }
    // SAFETY: the caller's attribute struct's caps, valid for reads and writes.
    let cap = unsafe { &mut *init.cap };
    // SAFETY: CQs and an SRQ of this library (the caller's contract).
    let (scq, rcq) = unsafe { ((*init.send_cq.cast::<Cq>()).id, (*init.recv_cq.cast::<Cq>()).id) };
    // SAFETY: as above.
    let srq = (!init.srq.is_null()).then(|| unsafe { (*init.srq.cast::<Srq>()).id });
    let caps = QpCaps {
        max_send_wr: cap.max_send_wr,
        max_recv_wr: cap.max_recv_wr,
        max_send_sge: cap.max_send_sge,
        max_recv_sge: cap.max_recv_sge,
        max_inline_data: cap.max_inline_data,
    };
    let mut obj: Box<Qp> = Box::new(Qp {
        // SAFETY: `ibv_qp_ex` is plain data (pointers, ints, nullable fn pointers, zero-valid pthread objects):
        // zero is valid.
        qpx: unsafe { std::mem::zeroed() },
        id: 0,
        caps,
        sq_sig_all: init.sq_sig_all,
        extended: init.extended,
        // SAFETY: as above.
        attr: Mutex::new(unsafe { std::mem::zeroed() }),
        batch: Mutex::new(Batch::default()),
        mirror: Mutex::new(Mirror::default()),
    });
    let cookie = std::ptr::addr_of_mut!(obj.qpx.qp_base) as u64;
    let request = Request::CreateQp { send_cq: scq, recv_cq: rcq, srq, qp_type: init.qp_type, caps, sq_sig_all: init.sq_sig_all, cookie };
    match c.conn.ask(&request) {
        Ok(Reply::Qp { qp, qp_num, caps }) => {
            obj.id = qp;
            obj.caps = caps;
            cap.max_send_wr = caps.max_send_wr;
            cap.max_recv_wr = caps.max_recv_wr;
            cap.max_send_sge = caps.max_send_sge;
            cap.max_recv_sge = caps.max_recv_sge;
            cap.max_inline_data = caps.max_inline_data;
            let b = &mut obj.qpx.qp_base;
            b.context = init.ctx;
            b.qp_context = init.qp_context;
            b.pd = init.pd;
            b.send_cq = init.send_cq;
            b.recv_cq = init.recv_cq;
            b.srq = init.srq;
            b.handle = qp_num;
            b.qp_num = qp_num;
            b.state = ibv_qp_state::IBV_QPS_RESET;
            b.qp_type = init.qp_type;
            if init.extended {
                install_wr_ops(&mut obj.qpx);
            }
            if let Ok(mut a) = obj.attr.lock() {
                a.qp_state = ibv_qp_state::IBV_QPS_RESET;
                a.cap = *cap;
            }
            let ptr = Box::into_raw(obj);
            c.qps_by_num.lock().unwrap_or_else(|p| p.into_inner()).insert(qp_num, ptr as usize);
            ptr.cast()
        }
        Ok(other) => {
            eprintln!("sqdisc-sim: ibv_create_qp: unexpected answer {other:?}");
            set_errno(libc::EPROTO);
            std::ptr::null_mut()
        }
        Err(f) => {
            report("ibv_create_qp", &f);
            std::ptr::null_mut()
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    guarded("ibv_create_qp", std::ptr::null_mut(), || {
        // SAFETY: a PD pointer of the caller.
        let Some(c) = (unsafe { pd_context(pd) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's attribute struct, non-NULL.
        let a = unsafe { &mut *attr };
        let init = Init {
            // SAFETY: a PD of a live context.
            ctx: unsafe { (*pd).context },
            pd,
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: std::ptr::addr_of_mut!(a.cap),
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all != 0,
            extended: false,
        };
        create(c, init)
    })
}

/// The send operations the `ibv_wr_*` API of a sim QP supports.
const SUPPORTED_SEND_OPS: u64 = rdma_sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE.0 as u64
    | rdma_sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM.0 as u64
    | rdma_sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND.0 as u64
    | rdma_sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_IMM.0 as u64
    | rdma_sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_READ.0 as u64
    | rdma_sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP.0 as u64
    | rdma_sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD.0 as u64
    | rdma_sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_LOCAL_INV.0 as u64
    | rdma_sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_INV.0 as u64;

/// The context's `create_qp_ex` op (libibverbs' inline `ibv_create_qp_ex` calls it).
unsafe extern "C" fn create_qp_ex(ctx: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    guarded("ibv_create_qp_ex", std::ptr::null_mut(), || {
        // SAFETY: the context this op was reached through; checked against the live set.
        let Some(c) = (unsafe { context(ctx) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's attribute struct, non-NULL.
        let a = unsafe { &mut *attr };
        let known = rdma_sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0 | rdma_sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0;
        if a.comp_mask & !known != 0 {
            eprintln!("sqdisc-sim: ibv_create_qp_ex: comp_mask {:#x} asks for what the sim device does not have", a.comp_mask & !known);
            set_errno(libc::EOPNOTSUPP);
            return std::ptr::null_mut();
        }
        if a.comp_mask & rdma_sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0 == 0 || a.pd.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        let extended = a.comp_mask & rdma_sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0 != 0;
        if extended && a.send_ops_flags & !SUPPORTED_SEND_OPS != 0 {
            eprintln!("sqdisc-sim: ibv_create_qp_ex: send_ops_flags {:#x} are not supported by the sim device", a.send_ops_flags & !SUPPORTED_SEND_OPS);
            set_errno(libc::EOPNOTSUPP);
            return std::ptr::null_mut();
        }
        let init = Init {
            ctx,
            pd: a.pd,
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: std::ptr::addr_of_mut!(a.cap),
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all != 0,
            extended,
        };
        create(c, init)
    })
}

/// Fills the context's extended ops the device has.
pub fn install_extended(vctx: &mut verbs_context) {
    vctx.create_qp_ex = Some(create_qp_ex);
}

/// `ibv_qp_to_qp_ex`: the extended QP of a QP made with `ibv_create_qp_ex` and send ops, else NULL.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    if qp.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a QP of this library (the caller's contract).
    let q = unsafe { qp_obj(qp) };
    if q.extended {
        qp.cast()
    } else {
        std::ptr::null_mut()
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    guarded("ibv_modify_qp", libc::EIO, || {
        if qp.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a QP of this library (the caller's contract); its context is checked live.
        let Some(c) = (unsafe { context((*qp).context) }) else { return libc::EINVAL };
        // SAFETY: as above.
        let q = unsafe { qp_obj(qp) };
        // SAFETY: the caller's attribute struct, non-NULL.
        let a = unsafe { &*attr };
        let mask = mask as u32;
        let has = |m: ibv_qp_attr_mask| mask & m.0 != 0;
        let mut stored = q.attr.lock().unwrap_or_else(|p| p.into_inner());
        // Merge first: the transition uses what earlier calls set (the RTR's destination at RTS).
        let mut next = copy_attr(&stored);
        if has(ibv_qp_attr_mask::IBV_QP_STATE) {
            next.qp_state = a.qp_state;
        }
        macro_rules! take {
            ($m:ident, $($f:ident),+) => {
                if has(ibv_qp_attr_mask::$m) {
                    $(next.$f = a.$f;)+
                }
            };
        }
        take!(IBV_QP_DEST_QPN, dest_qp_num);
        take!(IBV_QP_AV, ah_attr);
        take!(IBV_QP_PATH_MTU, path_mtu);
        take!(IBV_QP_RQ_PSN, rq_psn);
        take!(IBV_QP_SQ_PSN, sq_psn);
        take!(IBV_QP_ACCESS_FLAGS, qp_access_flags);
        take!(IBV_QP_PKEY_INDEX, pkey_index);
        take!(IBV_QP_PORT, port_num);
        take!(IBV_QP_TIMEOUT, timeout);
        take!(IBV_QP_RETRY_CNT, retry_cnt);
        take!(IBV_QP_RNR_RETRY, rnr_retry);
        take!(IBV_QP_MAX_QP_RD_ATOMIC, max_rd_atomic);
        take!(IBV_QP_MAX_DEST_RD_ATOMIC, max_dest_rd_atomic);
        take!(IBV_QP_MIN_RNR_TIMER, min_rnr_timer);
        if has(ibv_qp_attr_mask::IBV_QP_STATE) {
            let to = QpTransition {
                state: a.qp_state,
                dest_qp_num: next.dest_qp_num,
                rnr_retry: if has(ibv_qp_attr_mask::IBV_QP_RNR_RETRY) { a.rnr_retry } else { 7 },
                retry_cnt: if has(ibv_qp_attr_mask::IBV_QP_RETRY_CNT) { a.retry_cnt } else { 7 },
                max_rd_atomic: if has(ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC) { a.max_rd_atomic } else { 4 },
            };
            if a.qp_state == ibv_qp_state::IBV_QPS_RTR && !has(ibv_qp_attr_mask::IBV_QP_DEST_QPN) {
                eprintln!("sqdisc-sim: ibv_modify_qp: RTR needs IBV_QP_DEST_QPN");
                return libc::EINVAL;
            }
            if let Err(f) = c.conn.ask(&Request::ModifyQp { qp: q.id, to }) {
                report("ibv_modify_qp", &f);
                return f.errno;
            }
            // SAFETY: as above; the program reads `qp->state`.
            unsafe { (*qp).state = a.qp_state };
            if matches!(a.qp_state, ibv_qp_state::IBV_QPS_RTR | ibv_qp_state::IBV_QPS_RTS) {
                q.mirror.lock().unwrap_or_else(|p| p.into_inner()).connected = true;
            }
        }
        *stored = next;
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, _mask: c_int, init_attr: *mut ibv_qp_init_attr) -> c_int {
    guarded("ibv_query_qp", libc::EIO, || {
        if qp.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a QP of this library (the caller's contract); its context is checked live.
        let Some(c) = (unsafe { context((*qp).context) }) else { return libc::EINVAL };
        // SAFETY: as above.
        let q = unsafe { qp_obj(qp) };
        let state = match c.conn.ask(&Request::QueryQpState { qp: q.id }) {
            Ok(Reply::QpState { state }) => state,
            Ok(_) => return libc::EPROTO,
            Err(f) => {
                report("ibv_query_qp", &f);
                return f.errno;
            }
        };
        let mut a = copy_attr(&q.attr.lock().unwrap_or_else(|p| p.into_inner()));
        a.qp_state = state;
        a.cur_qp_state = state;
        a.cap.max_send_wr = q.caps.max_send_wr;
        a.cap.max_recv_wr = q.caps.max_recv_wr;
        a.cap.max_send_sge = q.caps.max_send_sge;
        a.cap.max_recv_sge = q.caps.max_recv_sge;
        a.cap.max_inline_data = q.caps.max_inline_data;
        let cap = a.cap;
        // SAFETY: the caller's attribute struct, non-NULL.
        unsafe { attr.write(a) };
        if !init_attr.is_null() {
            // SAFETY: plain data; zero is valid.
            let mut i: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
            // SAFETY: the QP's own fields.
            let b = unsafe { &*qp };
            i.qp_context = b.qp_context;
            i.send_cq = b.send_cq;
            i.recv_cq = b.recv_cq;
            i.srq = b.srq;
            i.cap = cap;
            i.qp_type = b.qp_type;
            i.sq_sig_all = i32::from(q.sq_sig_all);
            // SAFETY: the caller's non-NULL init attribute struct.
            unsafe { init_attr.write(i) };
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guarded("ibv_destroy_qp", libc::EIO, || {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a QP of this library (the caller's contract); its context is checked live.
        let Some(c) = (unsafe { context((*qp).context) }) else { return libc::EINVAL };
        // SAFETY: as above.
        let (id, qp_num) = (unsafe { qp_obj(qp) }.id, unsafe { (*qp).qp_num });
        match c.conn.ask(&Request::DestroyQp { qp: id }) {
            Ok(_) | Err(crate::conn::Failure { errno: libc::EIO, .. }) => {
                c.qps_by_num.lock().unwrap_or_else(|p| p.into_inner()).remove(&qp_num);
                if stats_on_destroy() {
                    // SAFETY: as above; still live.
                    let m = unsafe { qp_obj(qp) }.mirror.lock().unwrap_or_else(|p| p.into_inner());
                    eprintln!("sqdisc-sim qp stats: qp={qp_num:#x} flush_cqes={} error_cqes={}", m.flush_polled, m.error_polled);
                }
                // SAFETY: made by `Box::into_raw` in `create`; freed once.
                drop(unsafe { Box::from_raw(qp.cast::<Qp>()) });
                0
            }
            Err(f) => {
                report("ibv_destroy_qp", &f);
                f.errno
            }
        }
    })
}

// ---- the `ibv_wr_*` post API of extended QPs: a batch of WRs built between `wr_start` and `wr_complete` ----

/// # Safety
/// `qpx` is an extended QP of this library.
unsafe fn batch<'a>(qpx: *mut ibv_qp_ex) -> (&'a Qp, std::sync::MutexGuard<'a, Batch>) {
    // SAFETY: as the caller promises: the `ibv_qp_ex` is the first field of a `Qp`.
    let q = unsafe { &*qpx.cast::<Qp>() };
    (q, q.batch.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Starts a new WR of the batch, with the QP's current `wr_id` and `wr_flags`.
///
/// # Safety
/// `qpx` is an extended QP of this library.
unsafe fn push(qpx: *mut ibv_qp_ex, opcode: u32, remote_addr: u64, rkey: u32, imm: u32, compare_add: u64, swap: u64) {
    // SAFETY: as the caller promises.
    let (wr_id, flags) = unsafe { ((*qpx).wr_id, (*qpx).wr_flags) };
    // SAFETY: as the caller promises.
    let (_, mut b) = unsafe { batch(qpx) };
    b.wrs.push(SendWr {
        wr_id,
        opcode,
        send_flags: flags,
        num_sge: 0,
        null_sg_list: false,
        sges: Vec::new(),
        inline_data: None,
        remote_addr,
        rkey,
        imm,
        compare_add,
        swap,
    });
}

unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    // SAFETY: reached through an extended QP of this library.
    let (_, mut b) = unsafe { batch(qpx) };
    b.wrs.clear();
    b.error = None;
}

unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    // SAFETY: reached through an extended QP of this library.
    let (_, mut b) = unsafe { batch(qpx) };
    b.wrs.clear();
    b.error = None;
}

unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    guarded("ibv_wr_complete", libc::EIO, || {
        // SAFETY: reached through an extended QP of this library.
        let (q, mut b) = unsafe { batch(qpx) };
        let wrs = std::mem::take(&mut b.wrs);
        if let Some(e) = b.error.take() {
            return e;
        }
        drop(b);
        // SAFETY: as above.
        let c = unsafe { qp_context(qpx.cast()) };
        match c.conn.ask(&Request::PostSend { qp: q.id, wrs }) {
            Ok(Reply::Posted { errno, .. }) => errno,
            Ok(_) => libc::EPROTO,
            Err(f) => {
                report("ibv_wr_complete", &f);
                f.errno
            }
        }
    })
}

unsafe extern "C" fn wr_send(qpx: *mut ibv_qp_ex) {
    // SAFETY: reached through an extended QP of this library.
    unsafe { push(qpx, ibv_wr_opcode::IBV_WR_SEND, 0, 0, 0, 0, 0) };
}

unsafe extern "C" fn wr_send_imm(qpx: *mut ibv_qp_ex, imm: u32) {
    // SAFETY: reached through an extended QP of this library.
    unsafe { push(qpx, ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, 0, 0, imm, 0, 0) };
}

unsafe extern "C" fn wr_send_inv(qpx: *mut ibv_qp_ex, rkey: u32) {
    // SAFETY: reached through an extended QP of this library.
    unsafe { push(qpx, ibv_wr_opcode::IBV_WR_SEND_WITH_INV, 0, 0, rkey, 0, 0) };
}

unsafe extern "C" fn wr_rdma_write(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: reached through an extended QP of this library.
    unsafe { push(qpx, ibv_wr_opcode::IBV_WR_RDMA_WRITE, remote_addr, rkey, 0, 0, 0) };
}

unsafe extern "C" fn wr_rdma_write_imm(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: u32) {
    // SAFETY: reached through an extended QP of this library.
    unsafe { push(qpx, ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM, remote_addr, rkey, imm, 0, 0) };
}

unsafe extern "C" fn wr_rdma_read(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: reached through an extended QP of this library.
    unsafe { push(qpx, ibv_wr_opcode::IBV_WR_RDMA_READ, remote_addr, rkey, 0, 0, 0) };
}

unsafe extern "C" fn wr_atomic_cmp_swp(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, compare: u64, swap: u64) {
    // SAFETY: reached through an extended QP of this library.
    unsafe { push(qpx, ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP, remote_addr, rkey, 0, compare, swap) };
}

unsafe extern "C" fn wr_atomic_fetch_add(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, add: u64) {
    // SAFETY: reached through an extended QP of this library.
    unsafe { push(qpx, ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD, remote_addr, rkey, 0, add, 0) };
}

unsafe extern "C" fn wr_local_inv(qpx: *mut ibv_qp_ex, rkey: u32) {
    // SAFETY: reached through an extended QP of this library.
    unsafe { push(qpx, ibv_wr_opcode::IBV_WR_LOCAL_INV, 0, 0, rkey, 0, 0) };
}

/// Sets the SGEs of the batch's last WR; an SGE with no WR, or more SGEs than the QP has, fails the batch.
///
/// # Safety
/// `qpx` is an extended QP of this library.
unsafe fn set_sges(qpx: *mut ibv_qp_ex, sges: Vec<Sge>) {
    // SAFETY: as the caller promises.
    let (q, mut b) = unsafe { batch(qpx) };
    let max = q.caps.max_send_sge as usize;
    let Batch { wrs, error } = &mut *b;
    match wrs.last_mut() {
        Some(w) if sges.len() <= max => {
            w.num_sge = sges.len() as i32;
            w.sges = sges;
        }
        _ => *error = Some(libc::EINVAL),
    }
}

unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: reached through an extended QP of this library.
    unsafe { set_sges(qpx, vec![Sge { addr, length, lkey }]) };
}

unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, num: usize, list: *const ibv_sge) {
    // SAFETY: reached through an extended QP of this library.
    let max = unsafe { (*qpx.cast::<Qp>()).caps.max_send_sge } as usize;
    if num > max || (num > 0 && list.is_null()) {
        // SAFETY: as above.
        unsafe { batch(qpx) }.1.error = Some(libc::EINVAL);
        return;
    }
    // SAFETY: the caller's list of `num` SGEs (checked against the QP's caps above).
    let sges = if num == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(list, num) } };
    // SAFETY: as above.
    unsafe { set_sges(qpx, sges.iter().map(|s| Sge { addr: s.addr, length: s.length, lkey: s.lkey }).collect()) };
}

/// Sets the inline data of the batch's last WR, read now (inline data is copied at post time).
///
/// # Safety
/// `qpx` is an extended QP of this library.
unsafe fn set_inline(qpx: *mut ibv_qp_ex, bufs: &[(*const u8, usize)]) {
    // SAFETY: as the caller promises.
    let (q, mut b) = unsafe { batch(qpx) };
    let total: usize = bufs.iter().map(|b| b.1).sum();
    let Batch { wrs, error } = &mut *b;
    match wrs.last_mut() {
        Some(w) if total <= q.caps.max_inline_data as usize => {
            let mut data = Vec::with_capacity(total);
            for &(p, n) in bufs {
                if n > 0 {
                    // SAFETY: the caller's buffer of `n` readable bytes (the `ibv_wr_set_inline_data` contract).
                    data.extend_from_slice(unsafe { std::slice::from_raw_parts(p, n) });
                }
            }
            w.send_flags |= rdma_sys::ibv_send_flags::IBV_SEND_INLINE.0;
            w.num_sge = 1;
            w.sges = vec![Sge { addr: 0, length: total as u32, lkey: 0 }];
            w.inline_data = Some(data);
        }
        _ => *error = Some(libc::EINVAL),
    }
}

unsafe extern "C" fn wr_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    // SAFETY: reached through an extended QP of this library.
    unsafe { set_inline(qpx, &[(addr.cast_const().cast(), length)]) };
}

unsafe extern "C" fn wr_set_inline_data_list(qpx: *mut ibv_qp_ex, num: usize, list: *const ibv_data_buf) {
    if num > 0 && list.is_null() {
        // SAFETY: reached through an extended QP of this library.
        unsafe { batch(qpx) }.1.error = Some(libc::EINVAL);
        return;
    }
    // SAFETY: the caller's list of `num` buffers.
    let bufs = if num == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(list, num) } };
    let bufs: Vec<(*const u8, usize)> = bufs.iter().map(|b| (b.addr.cast_const().cast(), b.length)).collect();
    // SAFETY: as above.
    unsafe { set_inline(qpx, &bufs) };
}

fn install_wr_ops(qpx: &mut ibv_qp_ex) {
    qpx.wr_start = Some(wr_start);
    qpx.wr_complete = Some(wr_complete);
    qpx.wr_abort = Some(wr_abort);
    qpx.wr_send = Some(wr_send);
    qpx.wr_send_imm = Some(wr_send_imm);
    qpx.wr_send_inv = Some(wr_send_inv);
    qpx.wr_rdma_write = Some(wr_rdma_write);
    qpx.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    qpx.wr_rdma_read = Some(wr_rdma_read);
    qpx.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    qpx.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    qpx.wr_local_inv = Some(wr_local_inv);
    qpx.wr_set_sge = Some(wr_set_sge);
    qpx.wr_set_sge_list = Some(wr_set_sge_list);
    qpx.wr_set_inline_data = Some(wr_set_inline_data);
    qpx.wr_set_inline_data_list = Some(wr_set_inline_data_list);
}
