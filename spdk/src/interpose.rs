//! Seeing SPDK's completions without SPDK's help.
//!
//! SPDK polls its CQs itself (`ibv_poll_cq`, an inline function of libibverbs that calls
//! `cq->context->ops.poll_cq`), and the provider interface has no completion hook. So the first time a qpair
//! is created on a device context, the context's `poll_cq` entry is replaced by [`poll_cq`], and the
//! provider's own op is kept. [`poll_cq`] looks the CQ up: a CQ that a managed qpair uses is polled through
//! sqdisc (which calls the provider's op, releases and moderates, and hands back exactly the completions raw
//! verbs would have); any other CQ goes straight to the provider's op, unchanged.
//!
//! The entry stays replaced for the life of the process (the library is never unloaded under SPDK): putting
//! it back while another thread may be inside `ibv_poll_cq` could not be made safe, and the pass-through costs
//! one lookup. `ibv_req_notify_cq` is not replaced: SPDK's requests end in signaled WRs, and the idle tails
//! sqdisc covers on its own are covered by the next two polls.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use rdma_sys::{ibv_context, ibv_cq, ibv_wc};
use sqdisc::verbs::{NotifyFn, PollFn};

use crate::domain::Domain;

/// A device context whose `poll_cq` is replaced, with the provider's ops.
#[derive(Clone, Copy)]
pub(crate) struct Originals {
    pub poll: PollFn,
    pub notify: Option<NotifyFn>,
}

/// Few entries (a device context per HCA, a CQ per poll group): vectors, searched in order, are the fastest here.
#[derive(Default)]
struct Registry {
    contexts: Vec<(usize, Originals)>,
    /// Managed CQs and the domain that owns each.
    cqs: Vec<(usize, Arc<Domain>)>,
}

impl Registry {
    fn context(&self, ctx: usize) -> Option<&Originals> {
        self.contexts.iter().find(|e| e.0 == ctx).map(|e| &e.1)
    }
    fn cq(&self, cq: usize) -> Option<&Arc<Domain>> {
        self.cqs.iter().find(|e| e.0 == cq).map(|e| &e.1)
    }
}

static REGISTRY: RwLock<Option<Registry>> = RwLock::new(None);

/// Replaces `ctx`'s `poll_cq` (once per context) and returns the provider's ops.
///
/// # Safety
/// `ctx` is a live device context that stays alive while any CQ of it is polled.
pub(crate) unsafe fn install(ctx: *mut ibv_context) -> Result<Originals, &'static str> {
    let mut reg = REGISTRY.write();
    let reg = reg.get_or_insert_with(Registry::default);
    // SAFETY: `ctx` is live (caller's promise); field reads.
    let (poll, notify) = unsafe { ((*ctx).ops.poll_cq, (*ctx).ops.req_notify_cq) };
    let poll = poll.ok_or("the device context has no poll_cq op")?;
    if let Some(o) = reg.context(ctx as usize) {
        // Still ours, or a context opened since at the address of a closed one: then it is patched afresh.
        if poll as usize == poll_cq as PollFn as usize {
            return Ok(*o);
        }
    }
    let originals = Originals { poll, notify };
    reg.contexts.retain(|e| e.0 != ctx as usize);
    reg.contexts.push((ctx as usize, originals));
    // SAFETY: `ops.poll_cq` is an aligned, pointer-sized field of the live context (`Option<fn>` has the layout
    // of a pointer); other threads may be reading it in `ibv_poll_cq` right now, so it is replaced with one
    // atomic store, and either value they read is valid.
    unsafe {
        let slot = std::ptr::addr_of_mut!((*ctx).ops.poll_cq).cast::<AtomicUsize>();
        (*slot).store(poll_cq as PollFn as usize, Ordering::Release);
    }
    Ok(originals)
}

/// Routes `cq` through `domain` from now on.
pub(crate) fn manage(cq: *mut ibv_cq, domain: &Arc<Domain>) {
    let mut reg = REGISTRY.write();
    let reg = reg.get_or_insert_with(Registry::default);
    reg.cqs.retain(|e| e.0 != cq as usize);
    reg.cqs.push((cq as usize, domain.clone()));
}

/// Polls of `cq` go straight to the provider again.
pub(crate) fn unmanage(cq: *mut ibv_cq) {
    if let Some(reg) = REGISTRY.write().as_mut() {
        reg.cqs.retain(|e| e.0 != cq as usize);
        if reg.cqs.is_empty() {
            reg.cqs = Vec::new();
        }
    }
}

/// The domain that manages `cq`, if any.
pub(crate) fn domain_of(cq: *mut ibv_cq) -> Option<Arc<Domain>> {
    REGISTRY.read().as_ref().and_then(|r| r.cq(cq as usize).cloned())
}

/// The replacement `poll_cq`.
///
/// # Safety
/// Called by `ibv_poll_cq` with a live CQ of a context passed to [`install`] and `wc` holding `n` entries.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: as `ibv_poll_cq` promises.
    catch_unwind(AssertUnwindSafe(|| unsafe { poll_cq_inner(cq, n, wc) })).unwrap_or(-libc::EIO)
}

/// # Safety
/// As for [`poll_cq`].
unsafe fn poll_cq_inner(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    let (domain, original) = {
        let reg = REGISTRY.read();
        let Some(reg) = reg.as_ref() else { return -libc::EINVAL };
        // SAFETY: `cq` is live (caller's promise); a field read.
        let ctx = unsafe { (*cq).context } as usize;
        let Some(o) = reg.context(ctx) else { return -libc::EINVAL };
        (reg.cq(cq as usize).cloned(), o.poll)
    };
    let Some(domain) = domain else {
        // SAFETY: the provider's own op, called as `ibv_poll_cq` would have.
        return unsafe { original(cq, n, wc) };
    };
    if n <= 0 || wc.is_null() {
        return 0;
    }
    // SAFETY: `wc` holds `n` writable entries (caller's promise).
    let out = unsafe { std::slice::from_raw_parts_mut(wc, n as usize) };
    let held = domain.lock();
    let state = held.borrow();
    let Some(m) = state.cq(cq) else {
        drop(state);
        drop(held);
        // SAFETY: unmanaged in the meantime: the provider's own op.
        return unsafe { original(cq, n, wc) };
    };
    let mut k = take_pending(&m.pending, out);
    if k < out.len() {
        match m.sqd.poll(&mut out[k..]) {
            Ok(got) => k += got,
            Err(e) if k == 0 => return -e.errno(),
            Err(_) => {}
        }
        // Flushes owed for WRs that never reached the SQ come after the CQEs that made them due.
        k += take_pending(&m.pending, &mut out[k..]);
    }
    k as c_int
}

fn take_pending(pending: &crate::domain::Pending, out: &mut [ibv_wc]) -> usize {
    let mut p = pending.borrow_mut();
    let k = p.len().min(out.len());
    for (slot, wc) in out.iter_mut().zip(p.drain(..k)) {
        *slot = wc;
    }
    k
}
