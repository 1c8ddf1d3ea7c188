//! Which verbs objects the library's handles hold, so that the library's own devices (the scripted device and
//! the software HCA) can refuse to destroy an object while a handle still points at it.
//!
//! A handle (`CqHandle`, `QpHandle`, `SrqHandle`) registers its object when it is made and unregisters it when
//! it is dropped. A real provider's `ibv_destroy_*` cannot ask; the library's devices do, so destroying a CQ, QP
//! or SRQ (or the whole device) under a live `sqd_cq`, `sqd_queue` or `sqd_srq` fails with `EBUSY` instead of
//! leaving the handle to a use after free. Only the control path touches this table.

use std::sync::Mutex;

/// One held object: its address, its context's address, and how many handles hold it. An object may be held by
/// more than one handle (two `sqd_cq` on one CQ; a QP handle made for a queue that is then refused).
#[derive(Clone, Copy)]
struct Held {
    obj: usize,
    ctx: usize,
    handles: u32,
}

/// Every held object, unordered. A vector, searched linearly (only the control path comes here): it grows by
/// `try_reserve`, so a handle that cannot be recorded is an `ENOMEM` error, and leak checkers (valgrind) see
/// the memory a process keeps here at exit as reachable through the pointer to its start.
static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());

fn with<R>(f: impl FnOnce(&mut Vec<Held>) -> R) -> R {
    f(&mut HELD.lock().unwrap_or_else(|e| e.into_inner()))
}

/// A handle now holds `obj`, an object of the device whose context is `ctx`; `ENOMEM` if that cannot be
/// recorded.
pub(crate) fn hold<T>(obj: *mut T, ctx: *mut rdma_sys::ibv_context) -> crate::Result<()> {
    with(|m| {
        if let Some(e) = m.iter_mut().find(|e| e.obj == obj as usize) {
            e.handles += 1;
            return Ok(());
        }
        crate::alloc::reserve(m, 1, "the table of objects the library's handles hold")?;
        m.push(Held { obj: obj as usize, ctx: ctx as usize, handles: 1 });
        Ok(())
    })
}

/// A handle holding `obj` is gone.
pub(crate) fn release<T>(obj: *mut T) {
    with(|m| {
        if let Some(i) = m.iter().position(|e| e.obj == obj as usize) {
            m[i].handles -= 1;
            if m[i].handles == 0 {
                m.swap_remove(i);
            }
        }
    });
}

/// How many of the library's handles hold `obj` (a CQ, QP or SRQ).
pub fn holders<T>(obj: *const T) -> u32 {
    with(|m| m.iter().find(|e| e.obj == obj as usize).map_or(0, |e| e.handles))
}

/// How many objects of the device whose context is `ctx` the library's handles hold.
pub fn held_on(ctx: *const rdma_sys::ibv_context) -> usize {
    with(|m| m.iter().filter(|e| e.ctx == ctx as usize).count())
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
