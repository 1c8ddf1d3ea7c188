//! The control path under `LD_PRELOAD`: libibverbs' exported constructors and destructors, each forwarded to
//! the next definition (libibverbs') with `dlsym(RTLD_NEXT)`, the object it returns attached and tracked.
//!
//! A checker finding at creation (an undersized CQ) or deregistration (an MR in use) is recorded before the
//! call returns (for deregistration, before the provider sees it); in abort mode the process aborts there.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use rdma_sys::{ibv_comp_channel, ibv_context, ibv_cq, ibv_mr, ibv_pd, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_init_attr};

use super::api::{abort_if_due, track_cq_raw, track_mr_raw, track_qp_raw};
use super::ops::{attach, ProcessMemory};
use super::state::lock;

/// The next definition of `name` (NUL-terminated), looked up once.
fn next(cache: &AtomicUsize, name: &'static [u8]) -> usize {
    let f = cache.load(Ordering::Acquire);
    if f != 0 {
        return f;
    }
    // SAFETY: `name` is a NUL-terminated symbol name; RTLD_NEXT searches the objects loaded after this one.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast::<c_char>()) } as usize;
    cache.store(f, Ordering::Release);
    f
}

macro_rules! real {
    ($name:literal, $ty:ty) => {{
        static CACHE: AtomicUsize = AtomicUsize::new(0);
        let f = next(&CACHE, concat!($name, "\0").as_bytes());
        if f == 0 {
            None
        } else {
            // SAFETY: `f` is libibverbs' exported function of that name, whose C signature `$ty` spells.
            Some(unsafe { std::mem::transmute::<usize, $ty>(f) })
        }
    }};
}

fn checking() -> bool {
    lock().as_ref().is_some_and(|st| !st.off())
}

fn no_symbol<T>() -> *mut T {
    // SAFETY: sets this thread's errno.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    std::ptr::null_mut()
}

type CreateCq = unsafe extern "C" fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq;
type ResizeCq = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
type DestroyCq = unsafe extern "C" fn(*mut ibv_cq) -> c_int;
type CreateQp = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
type ModifyQp = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
type DestroyQp = unsafe extern "C" fn(*mut ibv_qp) -> c_int;
type RegMr = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
type RegMrIova = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_int) -> *mut ibv_mr;
type RegMrIova2 = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr;
type RegDmabufMr = unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr;
type DeregMr = unsafe extern "C" fn(*mut ibv_mr) -> c_int;

/// # Safety
/// As libibverbs' `ibv_create_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    let Some(f) = real!("ibv_create_cq", CreateCq) else { return no_symbol() };
    // SAFETY: forwarded unchanged.
    let cq = unsafe { f(ctx, cqe, cq_context, channel, comp_vector) };
    if !cq.is_null() && checking() {
        // SAFETY: the provider just made `cq` on the live `ctx`.
        unsafe {
            let _ = attach(ctx);
            track_cq_raw(cq);
        }
    }
    cq
}

/// # Safety
/// As libibverbs' `ibv_resize_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    let Some(f) = real!("ibv_resize_cq", ResizeCq) else { return libc::ENOSYS };
    // SAFETY: forwarded unchanged.
    let rc = unsafe { f(cq, cqe) };
    if rc == 0 && checking() {
        // SAFETY: `cq` is live; the provider updated `cq->cqe`.
        let now = unsafe { (*cq).cqe };
        if let Some(st) = lock().as_mut() {
            st.checker.resize_cq(cq as usize, u32::try_from(now).unwrap_or(0));
        }
        abort_if_due();
    }
    rc
}

/// # Safety
/// As libibverbs' `ibv_destroy_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    let Some(f) = real!("ibv_destroy_cq", DestroyCq) else { return libc::ENOSYS };
    // SAFETY: forwarded unchanged.
    let rc = unsafe { f(cq) };
    if rc == 0 {
        if let Some(st) = lock().as_mut() {
            st.checker.untrack_cq(cq as usize);
        }
    }
    rc
}

/// # Safety
/// As libibverbs' `ibv_create_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    let Some(f) = real!("ibv_create_qp", CreateQp) else { return no_symbol() };
    // SAFETY: forwarded unchanged.
    let qp = unsafe { f(pd, attr) };
    if !qp.is_null() && checking() {
        // SAFETY: the provider just made `qp` and wrote the granted caps into `*attr`.
        unsafe {
            let _ = attach((*qp).context);
            track_qp_raw(qp, attr);
        }
        abort_if_due();
    }
    qp
}

/// # Safety
/// As libibverbs' `ibv_modify_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    let Some(f) = real!("ibv_modify_qp", ModifyQp) else { return libc::ENOSYS };
    // SAFETY: forwarded unchanged.
    let rc = unsafe { f(qp, attr, mask) };
    if rc == 0 && mask as u32 & ibv_qp_attr_mask::IBV_QP_STATE.0 != 0 && !attr.is_null() {
        // SAFETY: `attr` is readable (it was just read by the provider).
        let state = unsafe { (*attr).qp_state } as c_int;
        super::api::sqd_check_qp_state(qp, state);
    }
    rc
}

/// # Safety
/// As libibverbs' `ibv_destroy_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    let Some(f) = real!("ibv_destroy_qp", DestroyQp) else { return libc::ENOSYS };
    // The last look at its sampled sources happens while the QP still exists.
    if !qp.is_null() {
        if let Some(st) = lock().as_mut() {
            st.checker.untrack_qp(qp as usize, &ProcessMemory);
        }
        abort_if_due();
    }
    // SAFETY: forwarded unchanged.
    unsafe { f(qp) }
}

/// # Safety
/// `mr` is NULL or an MR just returned by the provider for `addr` (mapped in this process).
unsafe fn track_new_mr(mr: *mut ibv_mr, iova: u64, host: usize) -> *mut ibv_mr {
    if !mr.is_null() && checking() {
        // SAFETY: live; `host` is where `iova` is mapped.
        unsafe { track_mr_raw(mr, iova, host) };
    }
    mr
}

/// # Safety
/// As libibverbs' `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, len: usize, access: c_int) -> *mut ibv_mr {
    let Some(f) = real!("ibv_reg_mr", RegMr) else { return no_symbol() };
    // SAFETY: forwarded unchanged; the MR's iova is its address.
    unsafe { track_new_mr(f(pd, addr, len, access), addr as u64, addr as usize) }
}

/// # Safety
/// As libibverbs' `ibv_reg_mr_iova`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    let Some(f) = real!("ibv_reg_mr_iova", RegMrIova) else { return no_symbol() };
    // SAFETY: forwarded unchanged; WRs name the memory at `addr` by `iova`.
    unsafe { track_new_mr(f(pd, addr, len, iova, access), iova, addr as usize) }
}

/// # Safety
/// As libibverbs' `ibv_reg_mr_iova2`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    let Some(f) = real!("ibv_reg_mr_iova2", RegMrIova2) else { return no_symbol() };
    // SAFETY: forwarded unchanged; WRs name the memory at `addr` by `iova`.
    unsafe { track_new_mr(f(pd, addr, len, iova, access), iova, addr as usize) }
}

/// # Safety
/// As libibverbs' `ibv_reg_dmabuf_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    len: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    let Some(f) = real!("ibv_reg_dmabuf_mr", RegDmabufMr) else { return no_symbol() };
    // SAFETY: forwarded unchanged; the memory is not mapped here (host 0: never sampled).
    unsafe { track_new_mr(f(pd, offset, len, iova, fd, access), iova, 0) }
}

/// # Safety
/// As libibverbs' `ibv_dereg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    let Some(f) = real!("ibv_dereg_mr", DeregMr) else { return libc::ENOSYS };
    if !mr.is_null() {
        if let Some(st) = lock().as_mut() {
            st.checker.untrack_mr(mr as usize);
        }
        abort_if_due();
    }
    // SAFETY: forwarded unchanged.
    unsafe { f(mr) }
}
