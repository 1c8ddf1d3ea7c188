//! The seam through which a software device reaches the library: one registry of [`DeviceOps`], keyed by the
//! device's `struct ibv_context`, shared by every copy of the library's core in a process.
//!
//! A provider loaded by libibverbs needs none of this. A device that only fills in a context's public ops table
//! (the software HCA, test devices) registers here what libibverbs would otherwise reach through private driver
//! ops (`ibv_dereg_mr`, `ibv_create_srq`, `ibv_destroy_srq`), and may ask to be told which of its CQs, QPs and
//! SRQs the library's handles hold (`hold`/`release`), so that it can refuse to destroy one of them.
//!
//! Cost for a real device: a handle's creation and every deferred deregistration look the context up, which is
//! one relaxed atomic load while no device is registered in the process (after the once-per-process resolution
//! below). Only while some device is registered does a lookup take the registry's mutex.
//!
//! One registry per process: libsqdisc exports the registry's three C functions (`sqd_device_register`,
//! `sqd_device_unregister`, `sqd_device_lookup`). Another copy of the core (the one libsqdisc_spdk embeds)
//! exports none of them; at its first use of the registry each copy asks the dynamic linker for the first
//! `sqd_device_lookup` in global scope (`dlsym(RTLD_DEFAULT, ..)`) and, when that is another copy's, sends all
//! three calls there, so every copy loaded into the global scope shares one table. A copy that finds none (a
//! program with no libsqdisc in global scope: a static link without `-rdynamic`, a library opened with
//! `dlopen(RTLD_LOCAL)`, a Rust program) or finds its own keeps its own table. Which table a copy uses is decided
//! once: a libsqdisc opened with `RTLD_GLOBAL` after a copy's first use of the registry is not seen by that copy.
//!
//! The same copy also takes the messages of a copy's failing C functions (libsqdisc_sim's `sqd_sim_*` carry
//! their own copy of the C layer): `forward_error` hands them to its `sqd_device_set_error`, so that the
//! `sqd_last_error()` a program calls, the canonical copy's, reads them.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use rdma_sys::{ibv_context, ibv_mr, ibv_pd, ibv_srq, ibv_srq_init_attr};

use crate::error::{Error, Result};

/// A software device's answers to the calls libibverbs would make through private driver ops, and its
/// interest in the objects the library holds. Every function pointer may be NULL; each gets `device` as its
/// first argument. Register it with `sqd_device_register`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DeviceOps {
    /// `sizeof(struct sqd_device_ops)` as the registering program was compiled: later versions of the library
    /// may add members at the end and read only the first `size` bytes.
    pub size: usize,
    /// Passed back, unchanged, as the first argument of every function below.
    pub device: *mut c_void,
    /// Deregisters `mr`, an MR of the device, when the library runs a deferred deregistration
    /// (`sqd_defer_dereg_mr`); 0 or a positive errno, as `ibv_dereg_mr` returns. NULL: such deregistrations
    /// fail with `EOPNOTSUPP`.
    pub dereg_mr: Option<unsafe extern "C" fn(device: *mut c_void, mr: *mut ibv_mr) -> c_int>,
    /// Creates an SRQ on `pd`, a PD of the device, as `ibv_create_srq` does (the granted attributes written back
    /// to `attr`): stores it in `*srq` and returns 0, or returns a positive errno. Called where the library makes
    /// an SRQ itself (the SPDK provider does, for SPDK). NULL: such creations fail with `EOPNOTSUPP`.
    pub create_srq: Option<
        unsafe extern "C" fn(device: *mut c_void, pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr, srq: *mut *mut ibv_srq) -> c_int,
    >,
    /// Destroys `srq`, made by `create_srq`; 0 or a positive errno. NULL: `EOPNOTSUPP`.
    pub destroy_srq: Option<unsafe extern "C" fn(device: *mut c_void, srq: *mut ibv_srq) -> c_int>,
    /// A library handle (`sqd_cq`, `sqd_queue`, `sqd_srq`) now holds `object`, a `struct ibv_cq`, `ibv_qp` or
    /// `ibv_srq` of the device; the same object may be held by several handles at once, each announced. 0, or a
    /// positive errno that makes the handle's creation fail with it. Set together with `release`, or neither.
    pub hold: Option<unsafe extern "C" fn(device: *mut c_void, object: *mut c_void) -> c_int>,
    /// A handle that `hold` announced for `object` is gone; called once per successful `hold`, also after the
    /// device was unregistered.
    pub release: Option<unsafe extern "C" fn(device: *mut c_void, object: *mut c_void)>,
}

/// The size of the first version of `struct sqd_device_ops`: the least `size` a registration may give.
pub const DEVICE_OPS_SIZE_V1: usize = std::mem::size_of::<DeviceOps>();

impl DeviceOps {
    /// No functions: every call on the device is refused with `EOPNOTSUPP`, nothing is held.
    pub fn empty(device: *mut c_void) -> DeviceOps {
        DeviceOps { size: DEVICE_OPS_SIZE_V1, device, dereg_mr: None, create_srq: None, destroy_srq: None, hold: None, release: None }
    }
}

/// One registered device.
struct Entry {
    ctx: usize,
    ops: DeviceOps,
}

// SAFETY: an entry is only data: the registrant promised (`register`'s contract) that the functions may be
// called from any thread with `device`.
unsafe impl Send for Entry {}

/// This copy's table; the canonical one when this copy is the first in global scope.
static ENTRIES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
/// How many entries `ENTRIES` holds: a lookup reads only this while it is 0.
static REGISTERED: AtomicUsize = AtomicUsize::new(0);

fn entries() -> std::sync::MutexGuard<'static, Vec<Entry>> {
    ENTRIES.lock().unwrap_or_else(|e| e.into_inner())
}

/// This copy's registration.
fn local_register(ctx: *mut ibv_context, ops: DeviceOps) -> Result<()> {
    if ctx.is_null() {
        return Err(Error::invalid("ctx is NULL"));
    }
    let mut table = entries();
    if table.iter().any(|e| e.ctx == ctx as usize) {
        return Err(Error::new(libc::EEXIST, format!("a device is already registered for context {ctx:p}")));
    }
    crate::alloc::reserve(&mut table, 1, "the table of registered devices")?;
    table.push(Entry { ctx: ctx as usize, ops });
    REGISTERED.store(table.len(), Ordering::Relaxed);
    Ok(())
}

/// This copy's unregistration.
fn local_unregister(ctx: *mut ibv_context) -> Result<()> {
    if ctx.is_null() {
        return Err(Error::invalid("ctx is NULL"));
    }
    let mut table = entries();
    let Some(i) = table.iter().position(|e| e.ctx == ctx as usize) else {
        return Err(Error::new(libc::ENOENT, format!("no device is registered for context {ctx:p}")));
    };
    table.swap_remove(i);
    REGISTERED.store(table.len(), Ordering::Relaxed);
    Ok(())
}

/// This copy's lookup: one relaxed load while nothing is registered.
fn local_lookup(ctx: *mut ibv_context) -> Option<DeviceOps> {
    // Relaxed is enough: a registration that happens before the lookup (the context reached this thread through
    // some synchronisation) is seen; the table itself is read under the mutex.
    if REGISTERED.load(Ordering::Relaxed) == 0 {
        return None;
    }
    entries().iter().find(|e| e.ctx == ctx as usize).map(|e| e.ops)
}

type RegisterFn = unsafe extern "C" fn(*mut ibv_context, *const DeviceOps) -> c_int;
type UnregisterFn = unsafe extern "C" fn(*mut ibv_context) -> c_int;
type LookupFn = unsafe extern "C" fn(*mut ibv_context, *mut DeviceOps) -> c_int;
type SetErrorFn = unsafe extern "C" fn(*const std::ffi::c_char) -> c_int;

/// The registry of another copy of the core, reached through its exported functions.
#[derive(Clone, Copy)]
struct Canonical {
    register: RegisterFn,
    unregister: UnregisterFn,
    lookup: LookupFn,
    /// Its `sqd_device_set_error`: where this copy's C functions leave their messages, so that the program's
    /// `sqd_last_error()` (the canonical copy's) reads them.
    set_error: Option<SetErrorFn>,
}

/// `None`: this copy's table is the process's (or the one this copy can see).
static CANONICAL: OnceLock<Option<Canonical>> = OnceLock::new();

/// The shared object (or executable) whose mapping holds `addr`, by its load address; `None` if none does.
#[cfg(not(miri))]
fn object_of(addr: *const c_void) -> Option<usize> {
    // SAFETY: all-zero is a valid `Dl_info` (pointers and NULL); dladdr only writes it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `addr` is only looked up, never dereferenced; `info` is writable.
    (unsafe { libc::dladdr(addr, &mut info) } != 0).then_some(info.dli_fbase as usize)
}

/// This copy's own `sqd_device_lookup`, when it has one (its C ABI is built: the `capi` feature). Named through
/// the linker, not the module path, so that `verbs` does not import `capi`; only its address is taken.
#[cfg(all(feature = "capi", not(miri)))]
fn own_lookup() -> Option<usize> {
    extern "C" {
        fn sqd_device_lookup(ctx: *mut ibv_context, ops: *mut DeviceOps) -> c_int;
    }
    Some(sqd_device_lookup as *const () as usize)
}

#[cfg(all(not(feature = "capi"), not(miri)))]
fn own_lookup() -> Option<usize> {
    None
}

/// The first definition of `name` in global scope, if any.
#[cfg(not(miri))]
fn global_symbol(name: &std::ffi::CStr) -> Option<*mut c_void> {
    // SAFETY: `name` is NUL-terminated; RTLD_DEFAULT searches the global scope and returns NULL when it has none.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// Whether `lookup`, the first `sqd_device_lookup` in global scope, is another copy's: this copy has none of its
/// own (no C ABI built), or it is not this copy's, or it lies in another object than this code (a copy whose own
/// symbol is interposed by an earlier one resolves its own name to that one).
#[cfg(not(miri))]
fn is_foreign(lookup: *mut c_void) -> bool {
    let Some(own) = own_lookup() else { return true };
    lookup as usize != own || object_of(lookup) != object_of(is_foreign as *const () as *const c_void)
}

#[cfg(not(miri))]
fn resolve_canonical() -> Option<Canonical> {
    let lookup = global_symbol(c"sqd_device_lookup").filter(|&p| is_foreign(p))?;
    let register = global_symbol(c"sqd_device_register")?;
    let unregister = global_symbol(c"sqd_device_unregister")?;
    let set_error = global_symbol(c"sqd_device_set_error");
    // SAFETY: each address is the exported function of that name of another copy of this library (the names are
    // the library's own, with these signatures in every version that has them).
    unsafe {
        Some(Canonical {
            register: std::mem::transmute::<*mut c_void, RegisterFn>(register),
            unregister: std::mem::transmute::<*mut c_void, UnregisterFn>(unregister),
            lookup: std::mem::transmute::<*mut c_void, LookupFn>(lookup),
            set_error: set_error.map(|p| std::mem::transmute::<*mut c_void, SetErrorFn>(p)),
        })
    }
}

/// Miri cannot ask the dynamic linker; a program run under it has one copy of the core.
#[cfg(miri)]
fn resolve_canonical() -> Option<Canonical> {
    None
}

fn canonical() -> Option<Canonical> {
    *CANONICAL.get_or_init(resolve_canonical)
}

fn foreign_error(call: &str, rc: c_int) -> Error {
    Error::new(rc.saturating_neg().max(1), format!("{call} of the process's device registry failed ({rc})"))
}

/// Registers `ops` as the device whose context is `ctx`, in the process's registry. `EEXIST` if a device is
/// registered for `ctx` already; `EINVAL` for a NULL `ctx` or `hold` without `release` (or the reverse).
///
/// # Safety
/// Each function of `ops` keeps, on every object of `ctx`, the contract of the call it stands for, and may be
/// called from any thread with `ops.device` until `unregister(ctx)` returns (`release`: until every `hold` is
/// released).
pub unsafe fn register(ctx: *mut ibv_context, ops: &DeviceOps) -> Result<()> {
    let ops = DeviceOps { size: DEVICE_OPS_SIZE_V1, ..*ops };
    if ops.hold.is_some() != ops.release.is_some() {
        return Err(Error::invalid("ops.hold and ops.release must be both set or both None"));
    }
    let Some(c) = canonical() else { return local_register(ctx, ops) };
    // SAFETY: the canonical function of this name, given a valid struct; the caller's promise covers `ops`.
    match unsafe { (c.register)(ctx, &ops) } {
        0 => Ok(()),
        rc => Err(foreign_error("sqd_device_register", rc)),
    }
}

/// Ends `register(ctx, ..)`: objects of `ctx` go to libibverbs' own calls from now on. `ENOENT` if none was
/// registered.
///
/// # Safety
/// Those calls work on `ctx`'s objects (its provider implements them), or the library tears none of them down
/// after this: a software device's objects handed to `ibv_dereg_mr` or `ibv_destroy_srq` are undefined behaviour.
pub unsafe fn unregister(ctx: *mut ibv_context) -> Result<()> {
    let Some(c) = canonical() else { return local_unregister(ctx) };
    // SAFETY: the canonical function of this name; the caller's promise covers `ctx`.
    match unsafe { (c.unregister)(ctx) } {
        0 => Ok(()),
        rc => Err(foreign_error("sqd_device_unregister", rc)),
    }
}

/// The ops registered for `ctx`, if any.
pub(crate) fn lookup(ctx: *mut ibv_context) -> Option<DeviceOps> {
    match canonical() {
        None => local_lookup(ctx),
        Some(c) => {
            let mut out = DeviceOps::empty(std::ptr::null_mut());
            // SAFETY: the canonical function of this name; `out` is a valid, writable struct whose `size` says
            // how much of it may be written.
            (unsafe { (c.lookup)(ctx, &mut out) } == 1).then_some(out)
        }
    }
}

/// Leaves `message` for the canonical copy's `sqd_last_error()` on this thread, when this copy is not the
/// canonical one (the C functions of a device library that carries its own copy of the core, such as
/// libsqdisc_sim). `false`: this copy's own last error is the one the program reads; the caller records it.
#[cfg_attr(not(feature = "capi"), allow(dead_code))]
pub(crate) fn forward_error(message: &std::ffi::CStr) -> bool {
    let Some(set_error) = canonical().and_then(|c| c.set_error) else { return false };
    // SAFETY: the canonical function of this name, given a NUL-terminated string that outlives the call (it
    // copies the text).
    unsafe { set_error(message.as_ptr()) };
    true
}

/// What a handle holds of a registered device: released (the device told) when dropped.
#[derive(Debug)]
pub(crate) struct Hold {
    release: Option<(unsafe extern "C" fn(*mut c_void, *mut c_void), *mut c_void)>,
    object: *mut c_void,
}

impl Hold {
    /// Tells the device of `ctx`, if one is registered and asks to know, that a handle now holds `object`.
    pub(crate) fn new<T>(ctx: *mut ibv_context, object: *mut T, what: &str) -> Result<Hold> {
        let object = object.cast::<c_void>();
        let none = Hold { release: None, object };
        let Some(DeviceOps { device, hold: Some(hold), release: Some(release), .. }) = lookup(ctx) else {
            return Ok(none);
        };
        // SAFETY: the registrant promised `hold` may be called with its `device` and one of its objects.
        match unsafe { hold(device, object) } {
            0 => Ok(Hold { release: Some((release, device)), object }),
            rc => Err(Error::new(
                rc.saturating_abs(),
                format!("the device of {what} {object:p} refused to let a library handle hold it ({rc})"),
            )),
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some((release, device)) = self.release {
            // SAFETY: paired with the successful `hold` of `new`; the registrant promised `release` stays callable
            // until every hold is released.
            unsafe { release(device, self.object) }
        }
    }
}
