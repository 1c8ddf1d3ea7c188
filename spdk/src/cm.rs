//! The connection manager, reached the way the running SPDK reaches it.
//!
//! SPDK's verbs provider creates, accepts, disconnects and destroys a qpair's QP through the connection
//! manager. Up to v26.05 it calls librdmacm directly (`rdma_create_qp`, `rdma_accept`, `rdma_disconnect`,
//! `rdma_destroy_qp`); SPDK master wraps those in its own `spdk_rdma_cm_*` functions (libspdk_rdma_cm), which
//! no release has. One library serves both: it refers to the four `spdk_rdma_cm_*` functions weakly and calls
//! them when the process defines all four, else librdmacm's, as the release's own provider does.
//!
//! A weak reference is resolved where the provider is bound, in all three ways of using it: by the dynamic
//! linker when the shared library is loaded (replacing SPDK's, or preloaded: an absent symbol is 0, never an
//! error, even with `-z now`), and by the static linker when the archive takes the place of SPDK's (SPDK links
//! every archive inside `--whole-archive`, so its libspdk_rdma_cm, when the build has one, is always there).
//! Unlike a `dlsym` lookup, it also finds SPDK's functions in a static application that exports no symbols.

use std::ffi::c_int;

use rdma_sys::{ibv_pd, ibv_qp_init_attr, rdma_cm_id, rdma_conn_param};

type CreateQpFn = unsafe extern "C" fn(*mut rdma_cm_id, *mut ibv_pd, *mut ibv_qp_init_attr) -> c_int;
type DestroyQpFn = unsafe extern "C" fn(*mut rdma_cm_id);
type AcceptFn = unsafe extern "C" fn(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int;
type DisconnectFn = unsafe extern "C" fn(*mut rdma_cm_id) -> c_int;

/// The addresses of SPDK's `spdk_rdma_cm_*` functions, each NULL when the process does not define it.
#[repr(C)]
struct WeakCm {
    create_qp: Option<CreateQpFn>,
    destroy_qp: Option<DestroyQpFn>,
    accept: Option<AcceptFn>,
    disconnect: Option<DisconnectFn>,
}

// Stable Rust has no weak imports: the four weak references are data words, filled by the linker with each
// function's address or 0. The symbol is hidden, and made local with the rest of the core when the library is
// built (its name is outside the exported `spdk_rdma_provider_*` / `sqd_spdk_*`).
std::arch::global_asm!(
    ".pushsection .data.rel.ro.sqdisc_spdk_cm_weak_refs,\"aw\"",
    ".p2align 3",
    ".globl sqdisc_spdk_cm_weak_refs",
    ".hidden sqdisc_spdk_cm_weak_refs",
    "sqdisc_spdk_cm_weak_refs:",
    ".weak spdk_rdma_cm_create_qp",
    ".quad spdk_rdma_cm_create_qp",
    ".weak spdk_rdma_cm_destroy_qp",
    ".quad spdk_rdma_cm_destroy_qp",
    ".weak spdk_rdma_cm_accept",
    ".quad spdk_rdma_cm_accept",
    ".weak spdk_rdma_cm_disconnect",
    ".quad spdk_rdma_cm_disconnect",
    ".popsection",
);

extern "C" {
    static sqdisc_spdk_cm_weak_refs: WeakCm;
}

/// The connection manager a qpair's QP is created, accepted, disconnected and destroyed through.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// SPDK's `spdk_rdma_cm_*` wrappers (SPDK master since its libspdk_rdma_cm).
    SpdkRdmaCm,
    /// librdmacm, directly (SPDK v25.05 to v26.05).
    Librdmacm,
}

fn spdk() -> Option<&'static WeakCm> {
    // SAFETY: an immutable table the linker filled before any code of this library ran.
    let w = unsafe { &*std::ptr::addr_of!(sqdisc_spdk_cm_weak_refs) };
    let all = w.create_qp.is_some() && w.destroy_qp.is_some() && w.accept.is_some() && w.disconnect.is_some();
    all.then_some(w)
}

/// Which connection manager this process gives the provider.
#[cfg(test)]
fn via() -> Via {
    if spdk().is_some() {
        Via::SpdkRdmaCm
    } else {
        Via::Librdmacm
    }
}

/// The name of the function `op` ("create_qp", "disconnect"...) reaches, for messages.
pub fn name(op: &str) -> String {
    match spdk() {
        Some(_) => format!("spdk_rdma_cm_{op}"),
        None => format!("rdma_{op}"),
    }
}

/// `rdma_create_qp`: 0, or -1 with errno set.
///
/// # Safety
/// As `rdma_create_qp(3)`: a live `id` and `pd`, a valid `attr`.
pub unsafe fn create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> c_int {
    match spdk().and_then(|w| w.create_qp) {
        // SAFETY: SPDK's wrapper, with the same contract (the caller's promise).
        Some(f) => unsafe { f(id, pd, attr) },
        // SAFETY: as above.
        None => unsafe { rdma_sys::rdma_create_qp(id, pd, attr) },
    }
}

/// `rdma_destroy_qp`.
///
/// # Safety
/// A live `id` whose QP was made by [`create_qp`], destroyed once.
pub unsafe fn destroy_qp(id: *mut rdma_cm_id) {
    match spdk().and_then(|w| w.destroy_qp) {
        // SAFETY: the caller's promise.
        Some(f) => unsafe { f(id) },
        // SAFETY: the caller's promise.
        None => unsafe { rdma_sys::rdma_destroy_qp(id) },
    }
}

/// `rdma_accept`: 0, or -1 with errno set.
///
/// # Safety
/// A live `id`; `param` NULL or valid.
pub unsafe fn accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    match spdk().and_then(|w| w.accept) {
        // SAFETY: the caller's promise.
        Some(f) => unsafe { f(id, param) },
        // SAFETY: the caller's promise.
        None => unsafe { rdma_sys::rdma_accept(id, param) },
    }
}

/// `rdma_disconnect`: 0, or -1 with errno set.
///
/// # Safety
/// A live `id`.
pub unsafe fn disconnect(id: *mut rdma_cm_id) -> c_int {
    match spdk().and_then(|w| w.disconnect) {
        // SAFETY: the caller's promise.
        Some(f) => unsafe { f(id) },
        // SAFETY: the caller's promise.
        None => unsafe { rdma_sys::rdma_disconnect(id) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test binary defines no `spdk_rdma_cm_*`: the weak references are NULL and librdmacm is used.
    #[test]
    fn without_spdk_rdma_cm_librdmacm_is_used() {
        assert_eq!(via(), Via::Librdmacm);
    }
}
