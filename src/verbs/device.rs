//! The seam through which a software device reaches the library: one registry of [`DeviceOps`], keyed by the
//! device's `struct ibv_context`, shared by every copy of the seam in a process (sqdisc's and the devices').
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
//! The registry itself is the `sqdisc-device` crate (`device/`), shared with the software HCA (`sqdisc-sim`),
//! which registers its devices there without depending on this crate: one registry per process, found across
//! copies of the seam loaded by different libraries through `dlsym(RTLD_DEFAULT, "sqd_device_lookup")` (that
//! crate's documentation). This module declares the C type (`struct sqd_device_ops`), tells the registry that
//! this copy's C layer exports the registry's functions (feature `capi`), and holds what a handle keeps of a
//! registered device (`Hold`).

use std::ffi::{c_int, c_void};

use rdma_sys::{ibv_context, ibv_mr, ibv_pd, ibv_srq, ibv_srq_init_attr};
use sqdisc_device as seam;

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

    /// The registry's record of these ops (`sqdisc_device::DeviceOps`, the same C struct).
    fn to_seam(self) -> seam::DeviceOps {
        let DeviceOps { size, device, dereg_mr, create_srq, destroy_srq, hold, release } = self;
        seam::DeviceOps { size, device, dereg_mr, create_srq, destroy_srq, hold, release }
    }

    fn from_seam(ops: seam::DeviceOps) -> DeviceOps {
        let seam::DeviceOps { size, device, dereg_mr, create_srq, destroy_srq, hold, release } = ops;
        DeviceOps { size, device, dereg_mr, create_srq, destroy_srq, hold, release }
    }
}

/// Tells the registry, before each use, that this copy's C layer exports `sqd_device_lookup` (the `capi`
/// feature), so that it takes that one for its own. Named through the linker, not the module path, so that
/// `verbs` does not import `capi`; only its address is taken.
#[cfg(all(feature = "capi", not(miri)))]
fn claim() {
    extern "C" {
        fn sqd_device_lookup(ctx: *mut ibv_context, ops: *mut DeviceOps) -> c_int;
    }
    seam::claim_exports(sqd_device_lookup as *const () as usize);
}

#[cfg(not(all(feature = "capi", not(miri))))]
fn claim() {}

fn from_seam_error(e: seam::Error) -> Error {
    Error::new(e.errno(), e.message().to_string())
}

/// Registers `ops` as the device whose context is `ctx`, in the process's registry. `EEXIST` if a device is
/// registered for `ctx` already; `EINVAL` for a NULL `ctx` or `hold` without `release` (or the reverse).
///
/// # Safety
/// Each function of `ops` keeps, on every object of `ctx`, the contract of the call it stands for, and may be
/// called from any thread with `ops.device` until `unregister(ctx)` returns (`release`: until every `hold` is
/// released).
pub unsafe fn register(ctx: *mut ibv_context, ops: &DeviceOps) -> Result<()> {
    claim();
    // SAFETY: the caller's promise is `seam::register`'s contract.
    unsafe { seam::register(ctx, &ops.to_seam()) }.map_err(from_seam_error)
}

/// Ends `register(ctx, ..)`: objects of `ctx` go to libibverbs' own calls from now on. `ENOENT` if none was
/// registered.
///
/// # Safety
/// Those calls work on `ctx`'s objects (its provider implements them), or the library tears none of them down
/// after this: a software device's objects handed to `ibv_dereg_mr` or `ibv_destroy_srq` are undefined behaviour.
pub unsafe fn unregister(ctx: *mut ibv_context) -> Result<()> {
    claim();
    // SAFETY: the caller's promise is `seam::unregister`'s contract.
    unsafe { seam::unregister(ctx) }.map_err(from_seam_error)
}

/// The ops registered for `ctx`, if any.
pub(crate) fn lookup(ctx: *mut ibv_context) -> Option<DeviceOps> {
    claim();
    seam::lookup(ctx).map(DeviceOps::from_seam)
}

/// Leaves `message` where the program's `sqd_last_error()` reads it on this thread: this copy's last error, or,
/// in a copy that is not the process's canonical one, the canonical copy's (through its `sqd_device_set_error`).
#[cfg_attr(not(feature = "capi"), allow(dead_code))]
pub(crate) fn record_error(message: &str) {
    claim();
    seam::record_error(message);
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
