//! Control-path calls the library makes only where the ULP asks for them (deferred deregistration and
//! deallocation, SRQs made on a ULP's behalf).
//!
//! `ibv_dereg_mr`, `ibv_create_srq` and `ibv_destroy_srq` are libibverbs functions that reach the provider
//! through private driver ops, so a device that only fills in the public ops table (the software HCA)
//! registers its own versions with [`super::device`], keyed by its `struct ibv_context`. `ibv_dealloc_mw` goes
//! through the public ops table and needs no entry.

use rdma_sys::{ibv_mr, ibv_mw, ibv_pd, ibv_srq, ibv_srq_init_attr};

use super::device;

/// Deregisters `mr`: through the device's registered function, else `ibv_dereg_mr`.
///
/// # Safety
/// `mr` is a valid MR that nothing uses any more and that is deregistered once.
pub unsafe fn dereg_mr(mr: *mut ibv_mr) -> i32 {
    // SAFETY: `mr` is valid (caller's promise); a field read.
    let ctx = unsafe { (*mr).context };
    match device::lookup(ctx) {
        // SAFETY: the device registered this function for its MRs; `mr` is one of them.
        Some(device::DeviceOps { device, dereg_mr: Some(f), .. }) => unsafe { f(device, mr) },
        Some(_) => libc::EOPNOTSUPP,
        // SAFETY: a provider's MR, deregistered once (caller's promise).
        None => unsafe { rdma_sys::ibv_dereg_mr(mr) },
    }
}

/// Creates an SRQ on `pd` from `attr` (granted attributes written back): through the device's registered
/// function, else `ibv_create_srq`. A positive errno on failure.
///
/// # Safety
/// `pd` is a valid PD and `attr` a valid, writable `struct ibv_srq_init_attr`.
pub unsafe fn create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> std::result::Result<*mut ibv_srq, i32> {
    // SAFETY: `pd` is valid (caller's promise); a field read.
    let ctx = unsafe { (*pd).context };
    match device::lookup(ctx) {
        Some(device::DeviceOps { device, create_srq: Some(f), .. }) => {
            let mut srq: *mut ibv_srq = std::ptr::null_mut();
            // SAFETY: the device registered this function for its PDs; the caller's promise covers the arguments.
            match unsafe { f(device, pd, attr, &mut srq) } {
                0 if !srq.is_null() => Ok(srq),
                0 => Err(libc::EIO),
                rc => Err(rc.saturating_abs()),
            }
        }
        Some(_) => Err(libc::EOPNOTSUPP),
        None => {
            // SAFETY: a provider's PD and a valid attribute struct (caller's promise).
            let srq = unsafe { rdma_sys::ibv_create_srq(pd, attr) };
            if srq.is_null() {
                Err(std::io::Error::last_os_error().raw_os_error().filter(|&e| e != 0).unwrap_or(libc::ENOMEM))
            } else {
                Ok(srq)
            }
        }
    }
}

/// Destroys `srq`: through the device's registered function, else `ibv_destroy_srq`. 0 or a positive errno.
///
/// # Safety
/// `srq` is a valid SRQ, destroyed once.
pub unsafe fn destroy_srq(srq: *mut ibv_srq) -> i32 {
    // SAFETY: `srq` is valid (caller's promise); a field read.
    let ctx = unsafe { (*srq).context };
    match device::lookup(ctx) {
        // SAFETY: the device registered this function for its SRQs; `srq` is one of them.
        Some(device::DeviceOps { device, destroy_srq: Some(f), .. }) => unsafe { f(device, srq) },
        Some(_) => libc::EOPNOTSUPP,
        // SAFETY: a provider's SRQ, destroyed once (caller's promise).
        None => unsafe { rdma_sys::ibv_destroy_srq(srq) },
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
///
/// Only [`Teardown::dereg_mr`] and [`Teardown::dealloc_mw`] make one, and both are `unsafe`: a teardown frees
/// what it names, so safe code must not be able to name memory it does not own. Only the library runs it,
/// once the completions its queue is waiting for have arrived.
///
/// ```compile_fail,E0599
/// // What safe code could write before: wrap any pointer and free it. There is no public variant to wrap it in.
/// sqdisc::verbs::control::Teardown::DeregMr(std::ptr::NonNull::dangling().as_ptr()).run();
/// ```
///
/// ```compile_fail,E0624
/// // Running one is the library's business: not even a teardown made with the unsafe promise can be run by
/// // its maker instead of the queue.
/// # let mr: *mut rdma_sys::ibv_mr = std::ptr::null_mut();
/// let t = unsafe { sqdisc::verbs::control::Teardown::dereg_mr(mr) };
/// t.run();
/// ```
///
/// ```compile_fail,E0133
/// // The constructors are `unsafe`: without the promise there is no teardown.
/// let t = sqdisc::verbs::control::Teardown::dereg_mr(std::ptr::NonNull::dangling().as_ptr());
/// ```
#[derive(Debug)]
pub struct Teardown(Target);

#[derive(Debug)]
enum Target {
    DeregMr(*mut ibv_mr),
    DeallocMw(*mut ibv_mw),
}

impl Teardown {
    /// # Safety
    /// `mr` is a valid MR, deregistered by nothing else, valid until this teardown runs.
    pub unsafe fn dereg_mr(mr: *mut ibv_mr) -> Teardown {
        Teardown(Target::DeregMr(mr))
    }
    /// # Safety
    /// `mw` is a valid MW, deallocated by nothing else, valid until this teardown runs.
    pub unsafe fn dealloc_mw(mw: *mut ibv_mw) -> Teardown {
        Teardown(Target::DeallocMw(mw))
    }
    /// Runs it; 0 or a positive errno.
    pub(crate) fn run(self) -> i32 {
        match self.0 {
            // SAFETY: the constructor's promise.
            Target::DeregMr(mr) => unsafe { dereg_mr(mr) },
            // SAFETY: the constructor's promise.
            Target::DeallocMw(mw) => unsafe { dealloc_mw(mw) },
        }
    }
}
