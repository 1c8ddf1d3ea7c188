//! The SRQ functions: an SRQ made on SPDK's behalf and put under a sqdisc SRQ.

use std::ffi::c_int;
use std::ptr;
use std::sync::Mutex;

use rdma_sys::{ibv_recv_wr, ibv_srq};
use sqdisc::verbs::{RecvChain, SrqHandle};
use sqdisc::Srq;

use crate::abi::{ProviderSrq, SrqInitAttr, WrStats};
use crate::domain::{Domain, Guarded};
use crate::log_error;
use crate::wr_list;

/// What SPDK holds as `struct spdk_rdma_provider_srq *`: SPDK's public part first, then ours.
#[repr(C)]
struct ShimSrq {
    public: ProviderSrq,
    state: Option<Guarded<SrqState>>,
    owned_stats: Option<Box<WrStats>>,
}

pub(crate) struct SrqState {
    pub srq: Srq,
}

/// SRQs made here, so that qp_create can find the managed SRQ behind the `ibv_srq` SPDK passes.
static SRQS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// The managed SRQ behind `srq`, if this provider made it.
///
/// # Safety
/// The returned reference is used while the SRQ is alive (SPDK destroys an SRQ after the qpairs on it).
pub(crate) unsafe fn lookup<'a>(srq: *mut ibv_srq) -> Option<&'a Guarded<SrqState>> {
    let shim = SRQS.lock().unwrap_or_else(|e| e.into_inner()).iter().find(|e| e.0 == srq as usize)?.1;
    // SAFETY: the map holds live `ShimSrq`s only (removed in srq_destroy before they are freed).
    unsafe { (*(shim as *const ShimSrq)).state.as_ref() }
}

#[no_mangle]
pub extern "C" fn spdk_rdma_provider_srq_create(init_attr: *mut SrqInitAttr) -> *mut ProviderSrq {
    crate::boundary(ptr::null_mut(), || {
        // SAFETY: SPDK passes a valid init attr struct, or NULL.
        let Some(attr) = (unsafe { init_attr.as_mut() }) else {
            log_error("srq_create: init_attr is NULL");
            return ptr::null_mut();
        };
        if attr.pd.is_null() {
            log_error("srq_create: pd is NULL");
            return ptr::null_mut();
        }
        // SAFETY: a valid PD and attribute struct; the provider writes the granted attributes back.
        let srq = match unsafe { sqdisc::verbs::create_srq(attr.pd, &mut attr.srq_init_attr) } {
            Ok(s) => s,
            Err(errno) => {
                log_error(&format!("srq_create: creating the SRQ failed (errno {errno})"));
                return ptr::null_mut();
            }
        };
        let depth = attr.srq_init_attr.attr.max_wr;
        let domain = Domain::new();
        let managed = {
            let _held = domain.lock();
            // SAFETY: the SRQ just made; it lives until srq_destroy, after the handle.
            unsafe { SrqHandle::from_raw(srq) }
                .and_then(|h| Srq::new(h, depth, None, 0, None))
                .map(|srq| Guarded::new(domain.clone(), SrqState { srq }))
        };
        let managed = match managed {
            Ok(m) => m,
            Err(e) => {
                log_error(&format!("srq_create: {}", e.message()));
                // SAFETY: the SRQ made above, destroyed once.
                unsafe { sqdisc::verbs::destroy_srq(srq) };
                return ptr::null_mut();
            }
        };
        let (stats, owned_stats) = if attr.stats.is_null() {
            let mut b = Box::new(WrStats::default());
            (&mut *b as *mut WrStats, Some(b))
        } else {
            (attr.stats, None)
        };
        let shim = Box::new(ShimSrq {
            public: ProviderSrq {
                srq,
                recv_wrs: crate::abi::RecvWrList { first: ptr::null_mut(), last: ptr::null_mut() },
                stats,
                shared_stats: owned_stats.is_none(),
            },
            state: Some(managed),
            owned_stats,
        });
        let raw = Box::into_raw(shim);
        SRQS.lock().unwrap_or_else(|e| e.into_inner()).push((srq as usize, raw as usize));
        raw.cast()
    })
}

/// # Safety
/// `srq` is NULL or an SRQ made by `spdk_rdma_provider_srq_create`, not destroyed.
unsafe fn shim<'a>(srq: *mut ProviderSrq) -> Option<&'a mut ShimSrq> {
    // SAFETY: `ProviderSrq` is the first field of the `#[repr(C)]` `ShimSrq` the pointer came from.
    unsafe { srq.cast::<ShimSrq>().as_mut() }
}

#[no_mangle]
pub extern "C" fn spdk_rdma_provider_srq_destroy(srq: *mut ProviderSrq) -> c_int {
    crate::boundary(libc::EINVAL, || {
        // SAFETY: SPDK passes an SRQ it made, or NULL.
        let Some(s) = (unsafe { shim(srq) }) else { return 0 };
        if !s.public.recv_wrs.first.is_null() {
            crate::log_warn("srq_destroy: destroying an SRQ with queued receive work requests");
        }
        if let Some(state) = &s.state {
            let busy = state.with(|st, _| {
                st.srq.check_free().is_err() && st.srq.stats().queues > 0
            });
            if busy {
                // As ibv_destroy_srq: an SRQ some QP still uses is not destroyed.
                log_error("srq_destroy: qpairs still use the SRQ; destroy them first");
                return libc::EBUSY;
            }
            // No QP can consume the receives still posted: they will never complete.
            state.with(|st, _| {
                let _ = st.srq.release_all();
            });
        }
        {
            let mut srqs = SRQS.lock().unwrap_or_else(|e| e.into_inner());
            srqs.retain(|e| e.0 != s.public.srq as usize);
            if srqs.is_empty() {
                *srqs = Vec::new();
            }
        }
        // SAFETY: `srq` came from `Box::into_raw` in srq_create and is freed once, here.
        let mut s = unsafe { Box::from_raw(srq.cast::<ShimSrq>()) };
        drop(s.state.take());
        // SAFETY: the SRQ made in srq_create, destroyed once; its handle was dropped above.
        let rc = unsafe { sqdisc::verbs::destroy_srq(s.public.srq) };
        if rc != 0 {
            log_error(&format!("srq_destroy: destroying the SRQ failed (errno {rc})"));
        }
        rc
    })
}

#[no_mangle]
pub extern "C" fn spdk_rdma_provider_srq_queue_recv_wrs(srq: *mut ProviderSrq, first: *mut ibv_recv_wr) -> bool {
    crate::boundary(false, || {
        // SAFETY: SPDK passes its live SRQ.
        let Some(s) = (unsafe { shim(srq) }) else { return false };
        if first.is_null() {
            return false;
        }
        let l = &mut s.public.recv_wrs;
        // SAFETY: SPDK's chain is valid and stays so until flushed; `stats` is SPDK's shared counters or ours,
        // alive as long as the SRQ.
        unsafe { wr_list::queue(&mut l.first, &mut l.last, first, &mut *s.public.stats) }
    })
}

#[no_mangle]
pub extern "C" fn spdk_rdma_provider_srq_flush_recv_wrs(srq: *mut ProviderSrq, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    crate::boundary(libc::EINVAL, || {
        // SAFETY: SPDK passes its live SRQ.
        let Some(s) = (unsafe { shim(srq) }) else { return libc::EINVAL };
        if bad_wr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: as in srq_queue_recv_wrs.
        let Some(first) = wr_list::take(&mut s.public.recv_wrs.first, unsafe { &mut *s.public.stats }) else {
            return 0;
        };
        let Some(state) = &s.state else { return libc::EINVAL };
        let result = state.with(|st, _| {
            // SAFETY: SPDK's queued chain, valid for this call.
            let chain = unsafe { RecvChain::from_raw(first) };
            st.srq.post_recv(chain).map_err(|e| (e.error.errno(), e.bad.as_ptr()))
        });
        // SAFETY: checked non-NULL above.
        unsafe { wr_list::finish(bad_wr, result) }
    })
}
