//! The device seam: the process's one registry of software devices, keyed by the device's `struct ibv_context`,
//! and the text of the C layer's last error. A crate of its own so that sqdisc and the software HCA
//! (`sqdisc-sim`) share it without either depending on the other.
//!
//! A provider loaded by libibverbs needs none of this. A device that only fills in a context's public ops table
//! (the software HCA, test devices) registers here what libibverbs would otherwise reach through private driver
//! ops (`ibv_dereg_mr`, `ibv_create_srq`, `ibv_destroy_srq`), and may ask to be told which of its CQs, QPs and
//! SRQs the library's handles hold (`hold`/`release`), so that it can refuse to destroy one of them. sqdisc
//! looks the registry up (`src/verbs/device.rs` there); devices register in it.
//!
//! Cost for a real device: a handle's creation and every deferred deregistration look the context up, which is
//! one relaxed atomic load while no device is registered in the process (after the once-per-process resolution
//! below). Only while some device is registered does a lookup take the registry's mutex.
//!
//! One registry per process. A Rust program links one copy of this crate, which sqdisc and the sim share. A C
//! program may load several copies: libsqdisc's, which exports the registry's C functions (`sqd_device_register`,
//! `sqd_device_unregister`, `sqd_device_lookup`, `sqd_device_set_error`, defined by sqdisc's C layer over this
//! crate), and copies that export none (libsqdisc_sim's, libsqdisc_spdk's). At its first use of the registry
//! each copy asks the dynamic linker for the first `sqd_device_lookup` in global scope (`dlsym(RTLD_DEFAULT, ..)`)
//! and, when that is another copy's, sends every call there, so every copy loaded into the global scope shares
//! one table. A copy that finds none (no libsqdisc in global scope: a static link without `-rdynamic`, a library
//! opened with `dlopen(RTLD_LOCAL)`, a Rust program) or finds its own keeps its own table. Which table a copy
//! uses is decided once: a libsqdisc opened with `RTLD_GLOBAL` after a copy's first use of the registry is not
//! seen by that copy. A copy whose library exports the C functions says so first ([`claim_exports`]), so that it
//! recognises its own; one that is told too late (a library holding both sqdisc's C layer and a device, whose
//! device registers first) sees its forwarded call come back to it on the same thread and uses its own table.
//!
//! The same resolution carries the messages of a copy's failing C functions (libsqdisc_sim's `sqd_sim_*`):
//! [`record_error`] hands them to the canonical copy's `sqd_device_set_error`, so that the `sqd_last_error()` a
//! program calls, libsqdisc's, reads them.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unused_must_use)]
#![deny(rust_2018_idioms)]

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use rdma_sys::{ibv_context, ibv_mr, ibv_pd, ibv_srq, ibv_srq_init_attr};

/// A refused registry call: the positive errno and a message naming the context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    errno: i32,
    message: Cow<'static, str>,
}

impl Error {
    pub fn new(errno: i32, message: impl Into<Cow<'static, str>>) -> Error {
        Error { errno, message: message.into() }
    }
    fn invalid(message: impl Into<Cow<'static, str>>) -> Error {
        Error::new(libc::EINVAL, message)
    }
    pub fn errno(&self) -> i32 {
        self.errno
    }
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (errno {})", self.message, self.errno)
    }
}

impl std::error::Error for Error {}

/// A software device's answers to the calls libibverbs would make through private driver ops, and its
/// interest in the objects the library holds: `struct sqd_device_ops` of `<sqdisc.h>`, member for member (sqdisc
/// declares the C type, `sqdisc::verbs::device::DeviceOps`). Every function pointer may be NULL; each gets
/// `device` as its first argument.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DeviceOps {
    /// `sizeof(struct sqd_device_ops)` as the registering program was compiled.
    pub size: usize,
    /// Passed back, unchanged, as the first argument of every function below.
    pub device: *mut c_void,
    /// Deregisters `mr`, an MR of the device; 0 or a positive errno, as `ibv_dereg_mr` returns.
    pub dereg_mr: Option<unsafe extern "C" fn(device: *mut c_void, mr: *mut ibv_mr) -> c_int>,
    /// Creates an SRQ on `pd`, as `ibv_create_srq` does: stores it in `*srq` and returns 0, or a positive errno.
    pub create_srq: Option<
        unsafe extern "C" fn(device: *mut c_void, pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr, srq: *mut *mut ibv_srq) -> c_int,
    >,
    /// Destroys `srq`, made by `create_srq`; 0 or a positive errno.
    pub destroy_srq: Option<unsafe extern "C" fn(device: *mut c_void, srq: *mut ibv_srq) -> c_int>,
    /// A library handle now holds `object` (a `struct ibv_cq`, `ibv_qp` or `ibv_srq` of the device); 0, or a
    /// positive errno that makes the handle's creation fail. Set together with `release`, or neither.
    pub hold: Option<unsafe extern "C" fn(device: *mut c_void, object: *mut c_void) -> c_int>,
    /// A handle that `hold` announced for `object` is gone; once per successful `hold`.
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
fn local_register(ctx: *mut ibv_context, ops: DeviceOps) -> Result<(), Error> {
    if ctx.is_null() {
        return Err(Error::invalid("ctx is NULL"));
    }
    let mut table = entries();
    if table.iter().any(|e| e.ctx == ctx as usize) {
        return Err(Error::new(libc::EEXIST, format!("a device is already registered for context {ctx:p}")));
    }
    table.try_reserve(1).map_err(|_| {
        Error::new(
            libc::ENOMEM,
            format!("could not allocate {} bytes for the table of registered devices", std::mem::size_of::<Entry>()),
        )
    })?;
    table.push(Entry { ctx: ctx as usize, ops });
    REGISTERED.store(table.len(), Ordering::Relaxed);
    Ok(())
}

/// This copy's unregistration.
fn local_unregister(ctx: *mut ibv_context) -> Result<(), Error> {
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
type SetErrorFn = unsafe extern "C" fn(*const c_char) -> c_int;

/// The registry of another copy, reached through its library's exported functions.
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

/// The address of the `sqd_device_lookup` the library holding this copy exports, 0 if it exports none.
static OWN_LOOKUP: AtomicUsize = AtomicUsize::new(0);

/// Tells this copy that its library exports the registry's C functions, `lookup` being the address of its
/// `sqd_device_lookup` (sqdisc's C layer calls this before each use of the registry). A copy told nothing takes
/// any `sqd_device_lookup` it finds in global scope for another copy's; one told this takes only one that is
/// not `lookup` or lies in another object. Only what is told before the copy's first use of the registry counts.
pub fn claim_exports(lookup: usize) {
    if OWN_LOOKUP.load(Ordering::Relaxed) != lookup {
        OWN_LOOKUP.store(lookup, Ordering::Relaxed);
    }
}

/// The shared object (or executable) whose mapping holds `addr`, by its load address; `None` if none does.
#[cfg(not(miri))]
fn object_of(addr: *const c_void) -> Option<usize> {
    // SAFETY: all-zero is a valid `Dl_info` (pointers and NULL); dladdr only writes it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `addr` is only looked up, never dereferenced; `info` is writable.
    (unsafe { libc::dladdr(addr, &mut info) } != 0).then_some(info.dli_fbase as usize)
}

/// The first definition of `name` in global scope, if any.
#[cfg(not(miri))]
fn global_symbol(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: `name` is NUL-terminated; RTLD_DEFAULT searches the global scope and returns NULL when it has none.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// Whether `lookup`, the first `sqd_device_lookup` in global scope, is another copy's: this copy's library
/// exports none, or it is not that one, or it lies in another object than this code (a library whose own
/// symbol is interposed by an earlier one resolves its own name to that one).
#[cfg(not(miri))]
fn is_foreign(lookup: *mut c_void) -> bool {
    let own = OWN_LOOKUP.load(Ordering::Relaxed);
    own == 0 || lookup as usize != own || object_of(lookup) != object_of(is_foreign as *const () as *const c_void)
}

#[cfg(not(miri))]
fn resolve_canonical() -> Option<Canonical> {
    let lookup = global_symbol(c"sqd_device_lookup").filter(|&p| is_foreign(p))?;
    let register = global_symbol(c"sqd_device_register")?;
    let unregister = global_symbol(c"sqd_device_unregister")?;
    let set_error = global_symbol(c"sqd_device_set_error");
    // SAFETY: each address is the exported function of that name of sqdisc's C layer (the names are the
    // library's own, with these signatures in every version that has them).
    unsafe {
        Some(Canonical {
            register: std::mem::transmute::<*mut c_void, RegisterFn>(register),
            unregister: std::mem::transmute::<*mut c_void, UnregisterFn>(unregister),
            lookup: std::mem::transmute::<*mut c_void, LookupFn>(lookup),
            set_error: set_error.map(|p| std::mem::transmute::<*mut c_void, SetErrorFn>(p)),
        })
    }
}

/// Miri cannot ask the dynamic linker; a program run under it has one copy.
#[cfg(miri)]
fn resolve_canonical() -> Option<Canonical> {
    None
}

fn canonical() -> Option<Canonical> {
    *CANONICAL.get_or_init(resolve_canonical)
}

thread_local! {
    /// Set while this copy's call into the canonical copy runs on this thread.
    static FORWARDING: Cell<bool> = const { Cell::new(false) };
}

/// Where this copy's calls go: the canonical copy, unless this thread is already inside one of this copy's
/// forwarded calls. Then the canonical functions came back here: they are this copy's own, exported by a library
/// that did not claim them before its first use of the registry (one holding both sqdisc's C layer and the sim),
/// and this copy's table is the one, instead of a recursion without end.
fn forward_target() -> Option<Canonical> {
    canonical().filter(|_| !FORWARDING.with(Cell::get))
}

/// Runs `call` (a call of the canonical copy's functions) marked as forwarded on this thread.
fn forwarded<R>(call: impl FnOnce() -> R) -> R {
    FORWARDING.with(|f| f.set(true));
    let result = call();
    FORWARDING.with(|f| f.set(false));
    result
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
pub unsafe fn register(ctx: *mut ibv_context, ops: &DeviceOps) -> Result<(), Error> {
    let ops = DeviceOps { size: DEVICE_OPS_SIZE_V1, ..*ops };
    if ops.hold.is_some() != ops.release.is_some() {
        return Err(Error::invalid("ops.hold and ops.release must be both set or both None"));
    }
    if ctx.is_null() {
        return Err(Error::invalid("ctx is NULL"));
    }
    let Some(c) = forward_target() else { return local_register(ctx, ops) };
    // SAFETY: the canonical function of this name, given a valid struct; the caller's promise covers `ops`.
    match forwarded(|| unsafe { (c.register)(ctx, &ops) }) {
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
pub unsafe fn unregister(ctx: *mut ibv_context) -> Result<(), Error> {
    if ctx.is_null() {
        return Err(Error::invalid("ctx is NULL"));
    }
    let Some(c) = forward_target() else { return local_unregister(ctx) };
    // SAFETY: the canonical function of this name; the caller's promise covers `ctx`.
    match forwarded(|| unsafe { (c.unregister)(ctx) }) {
        0 => Ok(()),
        rc => Err(foreign_error("sqd_device_unregister", rc)),
    }
}

/// The ops registered for `ctx`, if any. `ctx` is only a key: neither this copy nor the canonical one
/// dereferences it.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn lookup(ctx: *mut ibv_context) -> Option<DeviceOps> {
    match forward_target() {
        None => local_lookup(ctx),
        Some(c) => {
            let mut out = DeviceOps::empty(std::ptr::null_mut());
            // SAFETY: the canonical function of this name; `out` is a valid, writable struct whose `size` says
            // how much of it may be written.
            (forwarded(|| unsafe { (c.lookup)(ctx, &mut out) }) == 1).then_some(out)
        }
    }
}

thread_local! {
    /// This copy's text of `sqd_last_error()` on this thread.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Makes `text` this copy's last error on the calling thread (what sqdisc's `sqd_last_error()` reads, and its
/// `sqd_device_set_error` writes).
pub fn set_last_error(text: CString) {
    LAST_ERROR.with(|slot| *slot.borrow_mut() = text);
}

/// This copy's last error on the calling thread, valid until the next error of the thread.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|slot| slot.borrow().as_ptr())
}

/// Records a failing C function's message where the program reads it: the canonical copy's last error (through
/// its `sqd_device_set_error`) when this copy is not the canonical one, else this copy's.
pub fn record_error(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    if let Some(set_error) = forward_target().and_then(|c| c.set_error) {
        // SAFETY: the canonical function of this name, given a NUL-terminated string that outlives the call (it
        // copies the text).
        forwarded(|| unsafe { set_error(text.as_ptr()) });
    } else {
        set_last_error(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The C functions a library holding this copy would export (sqdisc's `sqd_device_*`), over this copy.
    unsafe extern "C" fn exported_register(ctx: *mut ibv_context, ops: *const DeviceOps) -> c_int {
        // SAFETY: the registry's callers pass a valid struct and keep `register`'s contract.
        unsafe { register(ctx, &*ops) }.map_or_else(|e| -e.errno(), |()| 0)
    }
    unsafe extern "C" fn exported_unregister(ctx: *mut ibv_context) -> c_int {
        // SAFETY: as the registry's callers promise.
        unsafe { unregister(ctx) }.map_or_else(|e| -e.errno(), |()| 0)
    }
    unsafe extern "C" fn exported_lookup(ctx: *mut ibv_context, out: *mut DeviceOps) -> c_int {
        match lookup(ctx) {
            Some(ops) => {
                // SAFETY: a valid, writable struct (the registry's callers' promise).
                unsafe { out.write(ops) };
                1
            }
            None => 0,
        }
    }
    unsafe extern "C" fn exported_set_error(message: *const c_char) -> c_int {
        // SAFETY: a NUL-terminated string (the registry's callers' promise).
        set_last_error(unsafe { CStr::from_ptr(message) }.to_owned());
        0
    }

    /// Every test first makes this copy resolve the registry to its own exported functions, as a library that
    /// holds both sqdisc's C layer and a device, and exports them, would when the device registers first: each
    /// call must come back to this copy's table once, not forward to itself for ever.
    fn exported_by_this_copy() {
        CANONICAL.get_or_init(|| {
            Some(Canonical {
                register: exported_register,
                unregister: exported_unregister,
                lookup: exported_lookup,
                set_error: Some(exported_set_error),
            })
        });
        assert!(canonical().is_some());
    }

    /// A context address for the registry only: it is never dereferenced.
    fn ctx(n: usize) -> *mut ibv_context {
        (0x1000 * n) as *mut ibv_context
    }

    unsafe extern "C" fn hold(_device: *mut c_void, _object: *mut c_void) -> c_int {
        0
    }

    #[test]
    fn a_registered_device_is_found_until_unregistered() {
        exported_by_this_copy();
        let ops = DeviceOps::empty(0x55 as *mut c_void);
        // SAFETY: the ops have no functions; the context is never used.
        unsafe { register(ctx(1), &ops) }.unwrap();
        assert_eq!(lookup(ctx(1)).map(|o| o.device as usize), Some(0x55));
        assert!(lookup(ctx(2)).is_none());
        // SAFETY: as above.
        let again = unsafe { register(ctx(1), &ops) }.unwrap_err();
        assert_eq!(again.errno(), libc::EEXIST, "{again}");
        // SAFETY: nothing of the context is torn down.
        unsafe { unregister(ctx(1)) }.unwrap();
        assert!(lookup(ctx(1)).is_none());
        // SAFETY: as above.
        let gone = unsafe { unregister(ctx(1)) }.unwrap_err();
        assert_eq!(gone.errno(), libc::ENOENT, "{gone}");
    }

    #[test]
    fn bad_registrations_are_refused_with_einval() {
        exported_by_this_copy();
        let ops = DeviceOps::empty(std::ptr::null_mut());
        // SAFETY: refused before anything is stored.
        let null = unsafe { register(std::ptr::null_mut(), &ops) }.unwrap_err();
        assert_eq!((null.errno(), null.message()), (libc::EINVAL, "ctx is NULL"));
        let half = DeviceOps { hold: Some(hold), ..ops };
        // SAFETY: refused before anything is stored.
        let half = unsafe { register(ctx(3), &half) }.unwrap_err();
        assert_eq!(half.errno(), libc::EINVAL, "{half}");
        assert!(lookup(ctx(3)).is_none());
        // SAFETY: nothing is registered for a NULL context.
        assert_eq!(unsafe { unregister(std::ptr::null_mut()) }.unwrap_err().errno(), libc::EINVAL);
    }

    #[test]
    fn a_recorded_error_is_the_last_error_of_the_thread() {
        exported_by_this_copy();
        record_error("sim is NULL");
        // SAFETY: the pointer is this thread's last error, valid until the next one.
        assert_eq!(unsafe { CStr::from_ptr(last_error_ptr()) }.to_str().unwrap(), "sim is NULL");
        record_error("a\0b");
        // SAFETY: as above.
        assert_eq!(unsafe { CStr::from_ptr(last_error_ptr()) }.to_str().unwrap(), "a b");
        std::thread::spawn(|| {
            // SAFETY: as above, on this thread.
            assert_eq!(unsafe { CStr::from_ptr(last_error_ptr()) }.to_bytes(), b"");
        })
        .join()
        .unwrap();
    }
}
