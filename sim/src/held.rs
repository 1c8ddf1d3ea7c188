//! Which of a software device's CQs, QPs and SRQs the library's handles hold, as the library announces them
//! through the device seam (`hold` and `release` of [`DeviceOps`]), so that the device can refuse to destroy an
//! object a handle still points at (`EBUSY`) instead of leaving the handle to a use after free.
//!
//! A real provider's `ibv_destroy_*` cannot ask; a software device keeps one of these tables and gives its two
//! functions to [`HeldObjects::ops`]. Only the control path touches it: a handle's creation and drop, and the
//! device's destroy calls.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

use sqdisc_device::DeviceOps;
use crate::{Error, Result};

/// One held object: its address and how many handles hold it. An object may be held by more than one handle
/// (two `sqd_cq` on one CQ; a QP handle made for a queue that is then refused).
#[derive(Clone, Copy)]
struct Held {
    obj: usize,
    handles: u32,
}

/// A device's held objects. Shared (`Arc`): every hold also keeps the table alive, so a release that comes
/// after the device is gone still finds it.
#[derive(Default)]
pub struct HeldObjects {
    /// Unordered, searched linearly (only the control path comes here). It grows by `try_reserve`, so a hold
    /// that cannot be recorded fails with `ENOMEM`.
    held: Mutex<Vec<Held>>,
}

impl HeldObjects {
    pub fn new() -> Arc<HeldObjects> {
        Arc::new(HeldObjects::default())
    }

    fn with<R>(&self, f: impl FnOnce(&mut Vec<Held>) -> R) -> R {
        f(&mut self.held.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A handle now holds `obj`; `ENOMEM` if that cannot be recorded.
    fn hold(&self, obj: usize) -> std::result::Result<(), c_int> {
        self.with(|m| {
            if let Some(e) = m.iter_mut().find(|e| e.obj == obj) {
                e.handles += 1;
                return Ok(());
            }
            m.try_reserve(1).map_err(|_| libc::ENOMEM)?;
            m.push(Held { obj, handles: 1 });
            Ok(())
        })
    }

    /// A handle holding `obj` is gone.
    fn release(&self, obj: usize) {
        self.with(|m| {
            if let Some(i) = m.iter().position(|e| e.obj == obj) {
                m[i].handles -= 1;
                if m[i].handles == 0 {
                    m.swap_remove(i);
                }
            }
        });
    }

    /// How many of the library's handles hold `obj`.
    pub fn holders<T>(&self, obj: *const T) -> u32 {
        self.with(|m| m.iter().find(|e| e.obj == obj as usize).map_or(0, |e| e.handles))
    }

    /// How many objects the library's handles hold.
    pub fn count(&self) -> usize {
        self.with(|m| m.len())
    }

    /// `EBUSY` (naming `what` holds it) while a library handle holds `obj`; for a device's destroy calls.
    pub fn check_unheld<T>(&self, obj: *mut T, name: &str, what: &str) -> Result<()> {
        match self.holders(obj) {
            0 => Ok(()),
            n => Err(Error::new(
                libc::EBUSY,
                format!("{name} {obj:p} is still managed by the library ({n} handle(s)): it is held by {what}"),
            )),
        }
    }

    /// `ops` with `hold` and `release` reporting into `table`, whose address becomes `ops.device`: the other
    /// functions of `ops` must not use their `device` argument.
    pub fn ops(table: &Arc<HeldObjects>, ops: DeviceOps) -> DeviceOps {
        DeviceOps {
            device: Arc::as_ptr(table).cast_mut().cast(),
            hold: Some(hold_object),
            release: Some(release_object),
            ..ops
        }
    }
}

/// `hold` of [`HeldObjects::ops`]: records the hold and keeps the table alive until its release.
///
/// # Safety
/// `device` is the address of a live `Arc<HeldObjects>`'s table.
unsafe extern "C" fn hold_object(device: *mut c_void, object: *mut c_void) -> c_int {
    let table = device.cast_const().cast::<HeldObjects>();
    // SAFETY: a live table (the caller's promise).
    match unsafe { &*table }.hold(object as usize) {
        Ok(()) => {
            // SAFETY: `table` came from `Arc::as_ptr` of a live `Arc`; this count is given back by `release_object`.
            unsafe { Arc::increment_strong_count(table) };
            0
        }
        Err(e) => e,
    }
}

/// `release` of [`HeldObjects::ops`].
///
/// # Safety
/// Paired with one successful `hold_object(device, object)`.
unsafe extern "C" fn release_object(device: *mut c_void, object: *mut c_void) {
    let table = device.cast_const().cast::<HeldObjects>();
    // SAFETY: the hold being released keeps the table alive.
    unsafe { &*table }.release(object as usize);
    // SAFETY: gives back the count `hold_object` took.
    unsafe { Arc::decrement_strong_count(table) };
}
