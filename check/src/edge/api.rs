//! The C API (`check/include/sqdisc_check.h`): attaching a context, telling the checker of objects it did not
//! see created, reading what it found. Every function returns 0 or a negative errno and never unwinds.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use rdma_sys::{ibv_context, ibv_cq, ibv_mr, ibv_qp, ibv_qp_init_attr, ibv_qp_state};

use super::ops::{attach, ProcessMemory};
use super::output;
use super::state::lock;
use crate::rules::config::Mode;
use crate::rules::kind::Kind;
use crate::rules::model::{MrInfo, QpInfo};

/// Bytes of `text` in `struct sqd_check_record`, the NUL included.
pub const RECORD_TEXT: usize = 256;

/// `struct sqd_check_record`.
#[repr(C)]
pub struct SqdCheckRecord {
    pub kind: u32,
    pub qp_num: u32,
    pub wqe_index: u64,
    pub time_ns: u64,
    pub text: [c_char; RECORD_TEXT],
}

/// `struct sqd_check_config`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SqdCheckConfig {
    pub mode: u32,
    pub sample_every: u32,
    pub sample_bytes: u32,
    pub idle_ms: u32,
    pub first: u32,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records why a call of this thread failed (read by `sqd_check_last_error`) and returns `errno`.
fn fail(errno: c_int, why: &str) -> c_int {
    let msg = CString::new(why.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = msg);
    errno
}

fn boundary(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| fail(-libc::EIO, "internal error (panic) in libsqdisc_check"))
}

/// Why the last failing `sqd_check_*` call of this thread failed: a NUL-terminated string valid until the next
/// failing call of the thread; "" if none failed.
#[no_mangle]
pub extern "C" fn sqd_check_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Runs `f` on the checker unless checking is off.
fn with_checker(f: impl FnOnce(&mut crate::rules::model::Checker)) {
    if let Some(st) = lock().as_mut() {
        if !st.off() {
            f(&mut st.checker);
        }
    }
}

/// Tracks a QP from its granted caps.
///
/// # Safety
/// `qp` is a live QP; `attr` is readable.
pub(crate) unsafe fn track_qp_raw(qp: *mut ibv_qp, attr: *const ibv_qp_init_attr) {
    // SAFETY: both are live and readable (caller's promise); field reads.
    let info = unsafe {
        let q = &*qp;
        let a = &*attr;
        QpInfo {
            ctx: q.context as usize,
            num: q.qp_num,
            send_cq: q.send_cq as usize,
            recv_cq: q.recv_cq as usize,
            sq_depth: a.cap.max_send_wr,
            rq_depth: a.cap.max_recv_wr,
            sig_all: a.sq_sig_all != 0,
            srq: !q.srq.is_null(),
        }
    };
    with_checker(|c| c.track_qp(qp as usize, info));
}

/// # Safety
/// `cq` is a live CQ.
pub(crate) unsafe fn track_cq_raw(cq: *mut ibv_cq) {
    // SAFETY: live (caller's promise); field reads.
    let (ctx, cqe) = unsafe { ((*cq).context as usize, (*cq).cqe) };
    with_checker(|c| c.track_cq(cq as usize, ctx, u32::try_from(cqe).unwrap_or(0)));
}

/// # Safety
/// `mr` is a live MR; `host` is where its `iova` range is mapped in this process (0: unknown).
pub(crate) unsafe fn track_mr_raw(mr: *mut ibv_mr, iova: u64, host: usize) {
    // SAFETY: live (caller's promise); field reads.
    let info = unsafe {
        let m = &*mr;
        MrInfo { ctx: m.context as usize, lkey: m.lkey, rkey: m.rkey, iova, host, len: m.length as u64 }
    };
    with_checker(|c| c.track_mr(mr as usize, info));
}

/// The report, in abort mode, if the last call found a violation.
pub(crate) fn abort_if_due() {
    let report = lock().as_mut().and_then(output::take_abort);
    if let Some(r) = report {
        output::abort_with(&r);
    }
}

/// Replaces the data-path ops of `ctx` with the checker's (once per context).
///
/// # Safety
/// `ctx` is NULL or a live device context that outlives its use.
#[no_mangle]
pub unsafe extern "C" fn sqd_check_attach(ctx: *mut ibv_context) -> c_int {
    // SAFETY: as the caller promises.
    boundary(|| match unsafe { attach(ctx) } {
        Ok(()) => 0,
        Err(e) if ctx.is_null() => fail(e, "sqd_check_attach: ctx is NULL"),
        Err(e) => fail(e, "sqd_check_attach: the context's ops are the checker's, but their originals are lost"),
    })
}

/// Forgets every QP, CQ and MR of `ctx` without reporting anything (its device is about to be freed).
#[no_mangle]
pub extern "C" fn sqd_check_detach(ctx: *mut ibv_context) -> c_int {
    if ctx.is_null() {
        return fail(-libc::EINVAL, "sqd_check_detach: ctx is NULL");
    }
    boundary(|| {
        with_checker(|c| c.detach(ctx as usize));
        0
    })
}

/// # Safety
/// `cq` is NULL or a live CQ.
#[no_mangle]
pub unsafe extern "C" fn sqd_check_track_cq(cq: *mut ibv_cq) -> c_int {
    if cq.is_null() {
        return fail(-libc::EINVAL, "sqd_check_track_cq: cq is NULL");
    }
    boundary(|| {
        // SAFETY: live (caller's promise).
        unsafe { track_cq_raw(cq) };
        abort_if_due();
        0
    })
}

/// # Safety
/// `cq` is NULL or a live CQ; `cqe` its new capacity.
#[no_mangle]
pub unsafe extern "C" fn sqd_check_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    if cq.is_null() || cqe < 1 {
        return fail(-libc::EINVAL, &format!("sqd_check_resize_cq: cq is NULL or cqe {cqe} is below 1"));
    }
    boundary(|| {
        with_checker(|c| c.resize_cq(cq as usize, cqe as u32));
        abort_if_due();
        0
    })
}

#[no_mangle]
pub extern "C" fn sqd_check_untrack_cq(cq: *mut ibv_cq) -> c_int {
    if cq.is_null() {
        return fail(-libc::EINVAL, "sqd_check_untrack_cq: cq is NULL");
    }
    boundary(|| {
        with_checker(|c| c.untrack_cq(cq as usize));
        0
    })
}

/// # Safety
/// `qp` and `attr` are NULL or live and readable.
#[no_mangle]
pub unsafe extern "C" fn sqd_check_track_qp(qp: *mut ibv_qp, attr: *const ibv_qp_init_attr) -> c_int {
    if qp.is_null() || attr.is_null() {
        return fail(-libc::EINVAL, "sqd_check_track_qp: qp or attr is NULL");
    }
    boundary(|| {
        // SAFETY: live and readable (caller's promise).
        unsafe { track_qp_raw(qp, attr) };
        abort_if_due();
        0
    })
}

#[no_mangle]
pub extern "C" fn sqd_check_untrack_qp(qp: *mut ibv_qp) -> c_int {
    if qp.is_null() {
        return fail(-libc::EINVAL, "sqd_check_untrack_qp: qp is NULL");
    }
    boundary(|| {
        with_checker(|c| c.untrack_qp(qp as usize, &ProcessMemory));
        abort_if_due();
        0
    })
}

/// `state`: an `enum ibv_qp_state` the QP was moved to.
#[no_mangle]
pub extern "C" fn sqd_check_qp_state(qp: *mut ibv_qp, state: c_int) -> c_int {
    if qp.is_null() {
        return fail(-libc::EINVAL, "sqd_check_qp_state: qp is NULL");
    }
    boundary(|| {
        let s = state as u32;
        if s == ibv_qp_state::IBV_QPS_ERR {
            with_checker(|c| c.qp_state(qp as usize, true));
        } else if s == ibv_qp_state::IBV_QPS_RESET {
            with_checker(|c| c.qp_state(qp as usize, false));
        }
        0
    })
}

/// # Safety
/// `mr` is NULL or a live MR whose `addr` is mapped in this process.
#[no_mangle]
pub unsafe extern "C" fn sqd_check_track_mr(mr: *mut ibv_mr) -> c_int {
    if mr.is_null() {
        return fail(-libc::EINVAL, "sqd_check_track_mr: mr is NULL");
    }
    boundary(|| {
        // SAFETY: live (caller's promise); field read.
        let addr = unsafe { (*mr).addr } as usize;
        // SAFETY: as above.
        unsafe { track_mr_raw(mr, addr as u64, addr) };
        0
    })
}

#[no_mangle]
pub extern "C" fn sqd_check_untrack_mr(mr: *mut ibv_mr) -> c_int {
    if mr.is_null() {
        return fail(-libc::EINVAL, "sqd_check_untrack_mr: mr is NULL");
    }
    boundary(|| {
        with_checker(|c| c.untrack_mr(mr as usize));
        abort_if_due();
        0
    })
}

/// Findings of `kind` so far (kind 0: every violation, notices excluded); 0 for an unknown kind.
#[no_mangle]
pub extern "C" fn sqd_check_count(kind: u32) -> u64 {
    catch_unwind(|| {
        let g = lock();
        let Some(st) = g.as_ref() else { return 0 };
        match Kind::from_u32(kind) {
            Some(k) => st.checker.log.count(k),
            None if kind == 0 => st.checker.log.violations(),
            None => 0,
        }
    })
    .unwrap_or(0)
}

/// Copies the `index`-th kept finding of `kind` into `*out`.
///
/// # Safety
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn sqd_check_record(kind: u32, index: usize, out: *mut SqdCheckRecord) -> c_int {
    let Some(k) = Kind::from_u32(kind) else {
        return fail(-libc::EINVAL, &format!("sqd_check_record: {kind} is not a kind (1..=8)"));
    };
    if out.is_null() {
        return fail(-libc::EINVAL, "sqd_check_record: out is NULL");
    }
    boundary(|| {
        let g = lock();
        let Some(r) = g.as_ref().and_then(|st| st.checker.log.record(k, index)) else {
            return fail(-libc::ENOENT, &format!("sqd_check_record: no kept finding #{index} of kind {kind}"));
        };
        let mut text = [0 as c_char; RECORD_TEXT];
        for (d, &b) in text.iter_mut().zip(r.text.as_bytes().iter().take(RECORD_TEXT - 1)) {
            *d = b as c_char;
        }
        // SAFETY: `out` is writable (caller's promise).
        unsafe {
            out.write(SqdCheckRecord { kind, qp_num: r.qp_num, wqe_index: r.wqe_index, time_ns: r.time_ns, text });
        }
        0
    })
}

/// The name of a kind, or "unknown": a static NUL-terminated string.
#[no_mangle]
pub extern "C" fn sqd_check_kind_str(kind: u32) -> *const c_char {
    const NAMES: [&CStr; 9] = [
        c"unknown",
        c"SQ overflow",
        c"unsignaled run",
        c"idle unsignaled tail",
        c"CQ undersized",
        c"MR invalidated while in use",
        c"unfenced LocalInv",
        c"source modified while in flight",
        c"flush of an unsignaled WQE",
    ];
    NAMES.get(kind as usize).unwrap_or(&NAMES[0]).as_ptr()
}

/// Writes the report (counts per kind, the first occurrences) to `fd`.
#[no_mangle]
pub extern "C" fn sqd_check_write_report(fd: c_int) -> c_int {
    boundary(|| {
        let report = lock().as_ref().map(|st| st.checker.log.report("on request")).unwrap_or_default();
        match output::write_to_fd(fd, &report) {
            0 => 0,
            e => fail(e, &format!("sqd_check_write_report: write to fd {fd}: {}", std::io::Error::from_raw_os_error(-e))),
        }
    })
}

/// Forgets every finding (the tracked objects stay).
#[no_mangle]
pub extern "C" fn sqd_check_reset() -> c_int {
    boundary(|| {
        if let Some(st) = lock().as_mut() {
            st.checker.log.clear();
            st.checker.abort_now = false;
        }
        0
    })
}

/// # Safety
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn sqd_check_get_config(out: *mut SqdCheckConfig) -> c_int {
    if out.is_null() {
        return fail(-libc::EINVAL, "sqd_check_get_config: out is NULL");
    }
    boundary(|| {
        let g = lock();
        let Some(st) = g.as_ref() else { return -libc::EIO };
        let c = &st.checker.cfg;
        let v = SqdCheckConfig {
            mode: c.mode as u32,
            sample_every: c.sample_every,
            sample_bytes: c.sample_bytes,
            idle_ms: c.idle_ms,
            first: c.first,
        };
        // SAFETY: writable (caller's promise).
        unsafe { out.write(v) };
        0
    })
}

/// # Safety
/// `cfg` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn sqd_check_set_config(cfg: *const SqdCheckConfig) -> c_int {
    if cfg.is_null() {
        return fail(-libc::EINVAL, "sqd_check_set_config: cfg is NULL");
    }
    // SAFETY: readable (caller's promise).
    let v = unsafe { cfg.read() };
    let mode = match v.mode {
        0 => Mode::Off,
        1 => Mode::Log,
        2 => Mode::Abort,
        m => return fail(-libc::EINVAL, &format!("sqd_check_set_config: mode {m} is not 0 (off), 1 (log) or 2 (abort)")),
    };
    boundary(|| {
        let mut g = lock();
        let Some(st) = g.as_mut() else { return -libc::EIO };
        if st.off() && mode != Mode::Off {
            // Contexts were not attached while checking was off; turning it on later would see half a program.
            return fail(-libc::EINVAL, "sqd_check_set_config: checking started off (SQDISC_CHECK=off) and stays off");
        }
        let mut c = st.checker.cfg.clone();
        c.mode = mode;
        c.sample_every = v.sample_every;
        c.sample_bytes = v.sample_bytes;
        c.idle_ms = v.idle_ms;
        c.first = v.first;
        st.checker.set_config(c);
        0
    })
}

