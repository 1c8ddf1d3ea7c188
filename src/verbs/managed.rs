//! Which verbs objects the library's handles hold, so that the library's own devices (the scripted device and
//! the software HCA) can refuse to destroy an object while a handle still points at it.
//!
//! A handle (`CqHandle`, `QpHandle`, `SrqHandle`) registers its object when it is made and unregisters it when
//! it is dropped. A real provider's `ibv_destroy_*` cannot ask; the library's devices do, so destroying a CQ, QP
//! or SRQ (or the whole device) under a live `sqd_cq`, `sqd_queue` or `sqd_srq` fails with `EBUSY` instead of
//! leaving the handle to a use after free. Only the control path touches this table.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Object address -> (its context's address, handles holding it). An object may be held by more than one handle
/// (two `sqd_cq` on one CQ; a QP handle made for a queue that is then refused). A B-tree rather than a hash
/// table: its nodes are reached through pointers to their starts, so leak checkers (valgrind) see the memory a
/// process keeps here at exit as reachable, not "possibly lost".
static HELD: Mutex<BTreeMap<usize, (usize, u32)>> = Mutex::new(BTreeMap::new());

fn with<R>(f: impl FnOnce(&mut BTreeMap<usize, (usize, u32)>) -> R) -> R {
    f(&mut HELD.lock().unwrap_or_else(|e| e.into_inner()))
}

/// A handle now holds `obj`, an object of the device whose context is `ctx`.
pub(crate) fn hold<T>(obj: *mut T, ctx: *mut rdma_sys::ibv_context) {
    with(|m| m.entry(obj as usize).or_insert((ctx as usize, 0)).1 += 1);
}

/// A handle holding `obj` is gone.
pub(crate) fn release<T>(obj: *mut T) {
    with(|m| {
        if let Some(e) = m.get_mut(&(obj as usize)) {
            e.1 -= 1;
            if e.1 == 0 {
                m.remove(&(obj as usize));
            }
        }
    });
}

/// How many of the library's handles hold `obj` (a CQ, QP or SRQ).
pub fn holders<T>(obj: *const T) -> u32 {
    with(|m| m.get(&(obj as usize)).map_or(0, |e| e.1))
}

/// How many objects of the device whose context is `ctx` the library's handles hold.
pub fn held_on(ctx: *const rdma_sys::ibv_context) -> usize {
    with(|m| m.values().filter(|e| e.0 == ctx as usize).count())
}

/// `EBUSY` (naming `what` holds it) while a library handle holds `obj`; for a device's destroy calls.
pub(crate) fn check_unheld<T>(obj: *mut T, name: &str, what: &str) -> crate::Result<()> {
    match holders(obj) {
        0 => Ok(()),
        n => Err(crate::Error::new(
            libc::EBUSY,
            format!("{name} {obj:p} is still managed by the library ({n} handle(s)): it is held by {what}"),
        )),
    }
}
