//! Control-path calls the library makes only where the ULP asks for them (deferred deregistration and
//! deallocation), and the table that lets a software device provide its own.
//!
//! `ibv_dereg_mr` is a libibverbs function that reaches the provider through private driver ops, so a device
//! that only fills in the public ops table (the software HCA) registers its own deregistration here, keyed by
//! its `struct ibv_context`. `ibv_dealloc_mw` goes through the public ops table and needs no entry.

use std::sync::Mutex;

use rdma_sys::{ibv_context, ibv_mr, ibv_mw};

/// Deregisters an MR of one device; returns 0 or a positive errno, as `ibv_dereg_mr` does.
pub type DeregMrFn = unsafe fn(*mut ibv_mr) -> i32;

static DEVICES: Mutex<Vec<(usize, DeregMrFn)>> = Mutex::new(Vec::new());

/// Makes `dereg` the deregistration of MRs whose `context` is `ctx` (until `unregister_device`).
pub fn register_device(ctx: *mut ibv_context, dereg: DeregMrFn) {
    let mut d = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    d.retain(|(c, _)| *c != ctx as usize);
    d.push((ctx as usize, dereg));
}

pub fn unregister_device(ctx: *mut ibv_context) {
    DEVICES.lock().unwrap_or_else(|e| e.into_inner()).retain(|(c, _)| *c != ctx as usize);
}

/// Deregisters `mr`: through the device's registered function, else `ibv_dereg_mr`.
///
/// # Safety
/// `mr` is a valid MR that nothing uses any more and that is deregistered once.
pub unsafe fn dereg_mr(mr: *mut ibv_mr) -> i32 {
    // SAFETY: `mr` is valid (caller's promise); a field read.
    let ctx = unsafe { (*mr).context } as usize;
    let own = DEVICES.lock().unwrap_or_else(|e| e.into_inner()).iter().find(|(c, _)| *c == ctx).map(|(_, f)| *f);
    match own {
        // SAFETY: the device registered this function for its MRs; `mr` is one of them.
        Some(f) => unsafe { f(mr) },
        // SAFETY: a provider's MR, deregistered once (caller's promise).
        None => unsafe { rdma_sys::ibv_dereg_mr(mr) },
    }
}

/// Deallocates `mw` through its context's ops table, as `ibv_dealloc_mw` does.
///
/// # Safety
/// `mw` is a valid memory window that nothing uses any more, deallocated once.
pub unsafe fn dealloc_mw(mw: *mut ibv_mw) -> i32 {
    // SAFETY: a valid MW has a valid context (caller's promise).
    let op = unsafe { (*(*mw).context).ops.dealloc_mw };
    match op {
        // SAFETY: the provider's own op on its own object.
        Some(f) => unsafe { f(mw) },
        None => libc::EOPNOTSUPP,
    }
}

/// An MR or MW handed to the library to be released later: the unsafe promise is made once, at creation.
#[derive(Debug)]
pub enum Teardown {
    DeregMr(*mut ibv_mr),
    DeallocMw(*mut ibv_mw),
}

impl Teardown {
    /// # Safety
    /// `mr` is a valid MR, deregistered by nothing else, valid until this teardown runs.
    pub unsafe fn dereg_mr(mr: *mut ibv_mr) -> Teardown {
        Teardown::DeregMr(mr)
    }
    /// # Safety
    /// `mw` is a valid MW, deallocated by nothing else, valid until this teardown runs.
    pub unsafe fn dealloc_mw(mw: *mut ibv_mw) -> Teardown {
        Teardown::DeallocMw(mw)
    }
    /// Runs it; 0 or a positive errno.
    pub fn run(self) -> i32 {
        match self {
            // SAFETY: the constructor's promise.
            Teardown::DeregMr(mr) => unsafe { dereg_mr(mr) },
            // SAFETY: the constructor's promise.
            Teardown::DeallocMw(mw) => unsafe { dealloc_mw(mw) },
        }
    }
}
