//! SPDK's side of the interface: the structures its RDMA provider functions take and return, and the SPDK
//! functions a provider calls. Declared here from SPDK's documented provider interface
//! (`include/spdk_internal/rdma_provider.h`), the same file in SPDK v25.05, v25.09, v26.01, v26.05 and master
//! (commit 3230130e6a); `tests` below pins every size and offset, and the C contract suite checks the same
//! numbers against `spdk/include/sqdisc_spdk.h`.

use std::ffi::{c_char, c_int, c_void};

use rdma_sys::{ibv_cq, ibv_pd, ibv_qp, ibv_qp_cap, ibv_recv_wr, ibv_send_wr, ibv_srq, ibv_srq_init_attr};

/// The SPDK releases whose provider interface these declarations match.
pub const SPDK_INTERFACE: &str =
    "SPDK v25.05, v25.09, v26.01, v26.05 and master (3230130e6a): spdk_rdma_provider_* with domain_transfer";

/// `struct spdk_rdma_provider_wr_stats`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct WrStats {
    pub num_submitted_wrs: u64,
    pub doorbell_updates: u64,
}

/// `struct spdk_rdma_provider_qp_stats`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct QpStats {
    pub send: WrStats,
    pub recv: WrStats,
}

/// `spdk_memory_domain_transfer_data_cb`: only whether it is set matters here.
pub type DomainTransferFn = Option<unsafe extern "C" fn()>;

/// `struct spdk_rdma_provider_qp_init_attr`.
#[repr(C)]
pub struct QpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub pd: *mut ibv_pd,
    pub stats: *mut QpStats,
    pub domain_transfer: DomainTransferFn,
}

/// `struct spdk_rdma_provider_send_wr_list`.
#[repr(C)]
pub struct SendWrList {
    pub first: *mut ibv_send_wr,
    pub last: *mut ibv_send_wr,
}

/// `struct spdk_rdma_provider_recv_wr_list`.
#[repr(C)]
pub struct RecvWrList {
    pub first: *mut ibv_recv_wr,
    pub last: *mut ibv_recv_wr,
}

/// `struct spdk_rdma_provider_qp`: what SPDK reads of a qpair (`qp`, `domain`). The provider's own state
/// follows it in a larger allocation.
#[repr(C)]
pub struct ProviderQp {
    pub qp: *mut ibv_qp,
    pub cm_id: *mut rdma_sys::rdma_cm_id,
    pub domain: *mut c_void,
    pub send_wrs: SendWrList,
    pub recv_wrs: RecvWrList,
    pub stats: *mut QpStats,
    pub shared_stats: bool,
}

/// `struct spdk_rdma_provider_srq_init_attr`.
#[repr(C)]
pub struct SrqInitAttr {
    pub pd: *mut ibv_pd,
    pub stats: *mut WrStats,
    pub srq_init_attr: ibv_srq_init_attr,
}

/// `struct spdk_rdma_provider_srq`.
#[repr(C)]
pub struct ProviderSrq {
    pub srq: *mut ibv_srq,
    pub recv_wrs: RecvWrList,
    pub stats: *mut WrStats,
    pub shared_stats: bool,
}

/// `SPDK_LOG_ERROR` and `SPDK_LOG_WARN` of `enum spdk_log_level`.
pub const LOG_ERROR: c_int = 0;
pub const LOG_WARN: c_int = 1;

extern "C" {
    // SPDK's connection manager is reached through `cm`. The rest is exported by every SPDK release since
    // v25.05. From SPDK's rdma_utils library (libspdk_rdma_utils).
    pub fn spdk_rdma_utils_get_memory_domain(pd: *mut ibv_pd) -> *mut c_void;
    pub fn spdk_rdma_utils_put_memory_domain(domain: *mut c_void) -> c_int;
    // From SPDK's log library (libspdk_log).
    pub fn spdk_log(level: c_int, file: *const c_char, line: c_int, func: *const c_char, format: *const c_char, ...);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// Sizes and offsets of SPDK's declarations on LP64 (x86_64, aarch64), as SPDK's own header gives them.
    #[test]
    fn layouts_match_spdk_interface() {
        assert_eq!((size_of::<WrStats>(), offset_of!(WrStats, doorbell_updates)), (16, 8));
        assert_eq!((size_of::<QpStats>(), offset_of!(QpStats, recv)), (32, 16));
        assert_eq!(size_of::<QpInitAttr>(), 80);
        assert_eq!(
            [
                offset_of!(QpInitAttr, send_cq),
                offset_of!(QpInitAttr, recv_cq),
                offset_of!(QpInitAttr, srq),
                offset_of!(QpInitAttr, cap),
                offset_of!(QpInitAttr, pd),
                offset_of!(QpInitAttr, stats),
                offset_of!(QpInitAttr, domain_transfer)
            ],
            [8, 16, 24, 32, 56, 64, 72]
        );
        assert_eq!(size_of::<ProviderQp>(), 72);
        assert_eq!(align_of::<ProviderQp>(), 8);
        assert_eq!(
            [
                offset_of!(ProviderQp, cm_id),
                offset_of!(ProviderQp, domain),
                offset_of!(ProviderQp, send_wrs),
                offset_of!(ProviderQp, recv_wrs),
                offset_of!(ProviderQp, stats),
                offset_of!(ProviderQp, shared_stats)
            ],
            [8, 16, 24, 40, 56, 64]
        );
        assert_eq!((size_of::<SrqInitAttr>(), offset_of!(SrqInitAttr, stats), offset_of!(SrqInitAttr, srq_init_attr)), (40, 8, 16));
        assert_eq!(size_of::<ProviderSrq>(), 40);
        assert_eq!(
            [offset_of!(ProviderSrq, recv_wrs), offset_of!(ProviderSrq, stats), offset_of!(ProviderSrq, shared_stats)],
            [8, 24, 32]
        );
    }
}
