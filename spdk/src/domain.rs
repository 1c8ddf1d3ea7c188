//! Lock domains: sqdisc's objects are single-threaded (`Rc` inside), SPDK calls the provider and polls its
//! CQs from the thread of each poll group. A domain is a lock over one group of sqdisc objects that use each
//! other — the managed CQs, the queues on them and an SRQ they receive from — and every use of any of them,
//! creation and drop included, happens with that lock held. Poll groups never share CQs or SRQs in SPDK, so
//! each gets its own domain and pollers on different threads never wait for each other.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use std::num::NonZeroUsize;

use parking_lot::lock_api::{self, GetThreadId};
use parking_lot::RawMutex;
use rdma_sys::{ibv_cq, ibv_wc};

/// The current thread's identity for the domains' reentrant locks: its thread pointer (`fs:0` on x86_64, the
/// TCB's own address; `tpidr_el0` on aarch64), one instruction where parking_lot's default takes the address of a
/// thread-local, which a shared library reaches through a `__tls_get_addr` call on every lock.
pub(crate) struct ThreadPointer;

// SAFETY: the thread pointer is non-zero and distinct for every thread alive at the same time (it is the
// address of that thread's own control block), which is what the trait asks of an identity.
unsafe impl GetThreadId for ThreadPointer {
    const INIT: ThreadPointer = ThreadPointer;

    #[inline(always)]
    fn nonzero_thread_id(&self) -> NonZeroUsize {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            let tp: usize;
            // SAFETY: reads the word at fs:0, which the C library sets to the thread control block's own address
            // for every thread (the x86_64 TLS ABI); no memory is written.
            unsafe { std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags)) };
            // SAFETY: that address, of a live thread's control block, is never 0.
            #[allow(clippy::needless_return)]
            return unsafe { NonZeroUsize::new_unchecked(tp) };
        }
        #[cfg(all(target_arch = "aarch64", target_os = "linux"))]
        {
            let tp: usize;
            // SAFETY: reads the thread pointer register; no memory is touched.
            unsafe { std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nomem, nostack, preserves_flags)) };
            if let Some(id) = NonZeroUsize::new(tp) {
                return id;
            }
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        parking_lot::RawThreadId.nonzero_thread_id()
    }
}

type ReentrantMutex<T> = lock_api::ReentrantMutex<RawMutex, ThreadPointer, T>;
pub(crate) type ReentrantMutexGuard<'a, T> = lock_api::ReentrantMutexGuard<'a, RawMutex, ThreadPointer, T>;

/// Work completions the provider owes SPDK that no CQE carries (WRs flushed before they reached the SQ), in
/// the order raw verbs would have delivered them; returned by the next polls of their CQ before new CQEs.
pub(crate) type Pending = Rc<RefCell<VecDeque<ibv_wc>>>;

/// One `ibv_cq` under management.
pub(crate) struct ManagedCq {
    pub cq: *mut ibv_cq,
    pub sqd: sqdisc::Cq,
    pub pending: Pending,
    pub gate: GateRef,
    /// The error completions its qpairs are owed and were handed (`flushes`).
    pub book: crate::flushes::Book,
}

impl ManagedCq {
    /// Records, for the poll path's lock-free check, whether an empty poll must go through sqdisc: flush
    /// completions are owed, or a queue's idle tail is watched. Called under the domain's lock after everything
    /// that may change either (a poll, a flush).
    #[inline]
    pub fn update_gate(&self) {
        let needs = !self.pending.borrow().is_empty() || self.sqd.has_watched_tails();
        self.gate.set_needs_sqdisc(needs);
    }
}

/// What the poll path reads of a managed CQ without the domain's lock, in one word: the thread polling the CQ
/// now (its [`thread_id`], bit 0 clear), or 0, and in bit 0 whether an empty poll must go through sqdisc
/// ([`ManagedCq::update_gate`]; else the device's op alone answers it, and only CQEs it finds are taken to
/// sqdisc, under the lock). Pollers of one CQ take turns, so that CQEs reach sqdisc in the order the device
/// gave them even when the device is polled before the lock is taken. The common poll takes the turn with one
/// compare-exchange from 0, which fails when the flag is set as when the turn is taken.
pub(crate) struct CqGate {
    word: AtomicUsize,
}

/// How a poller entered a CQ's gate ([`CqGate::enter`]).
pub(crate) enum Entered {
    /// It has the turn; sqdisc has work (the flag was set).
    Sqdisc,
    /// It has the turn; the device's op alone may answer.
    Device,
    /// The thread already had the turn: a poll from inside its own poll of the CQ.
    Reentered,
}

const NEEDS_SQDISC: usize = 1;

impl CqGate {
    pub const fn new() -> CqGate {
        CqGate { word: AtomicUsize::new(0) }
    }

    /// Takes the turn if it is free and sqdisc has no work: the common poll.
    #[inline(always)]
    pub fn try_enter_quiet(&self, me: usize) -> bool {
        self.word.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// Takes the turn, waiting for it if another thread has it.
    pub fn enter(&self, me: usize) -> Entered {
        let mut spins = 0u32;
        loop {
            let v = self.word.load(Ordering::Relaxed);
            let owner = v & !NEEDS_SQDISC;
            if owner == me {
                return Entered::Reentered;
            }
            if owner == 0 {
                if self.word.compare_exchange_weak(v, v | me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                    return if v & NEEDS_SQDISC != 0 { Entered::Sqdisc } else { Entered::Device };
                }
                continue;
            }
            spins += 1;
            if spins % 64 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Whether sqdisc has work, read by the turn's holder.
    #[inline]
    pub fn needs_sqdisc(&self) -> bool {
        self.word.load(Ordering::Relaxed) & NEEDS_SQDISC != 0
    }

    /// Gives the turn back, keeping the flag.
    #[inline(always)]
    pub fn leave(&self) {
        self.word.fetch_and(NEEDS_SQDISC, Ordering::Release);
    }

    /// Sets or clears the flag, keeping the turn.
    #[inline]
    pub fn set_needs_sqdisc(&self, needs: bool) {
        if needs {
            self.word.fetch_or(NEEDS_SQDISC, Ordering::Relaxed);
        } else {
            self.word.fetch_and(!NEEDS_SQDISC, Ordering::Relaxed);
        }
    }
}

/// Where a managed CQ's gate lives: in its route bucket's static slot when the CQ is the bucket's owner (the
/// poll path then reaches it with no pointer to follow), else on the heap.
#[derive(Clone)]
pub(crate) enum GateRef {
    Slot(&'static CqGate),
    Own(Arc<CqGate>),
}

impl std::ops::Deref for GateRef {
    type Target = CqGate;
    #[inline(always)]
    fn deref(&self) -> &CqGate {
        match self {
            GateRef::Slot(g) => g,
            GateRef::Own(g) => g,
        }
    }
}

/// The current thread's identity for the gates: non-zero, with bit 0 clear (the thread pointer is the address of
/// a thread control block, aligned to at least 16 bytes; elsewhere parking_lot's identity, shifted).
#[inline(always)]
pub(crate) fn thread_id() -> usize {
    let id = ThreadPointer.nonzero_thread_id().get();
    if cfg!(all(any(target_arch = "x86_64", target_arch = "aarch64"), target_os = "linux")) {
        id
    } else {
        id << 1
    }
}

pub(crate) struct DomainState {
    /// Shared with the qpairs that send on them, whose flushes update the gate with no lookup.
    pub cqs: Vec<Rc<ManagedCq>>,
}

impl DomainState {
    pub fn cq(&self, cq: *mut ibv_cq) -> Option<&Rc<ManagedCq>> {
        self.cqs.iter().find(|m| m.cq == cq)
    }
}

/// A domain's lock and state, shared (`Arc`) by the domain and by the poll path's table of managed CQs
/// (`interpose`). The poll path finds a CQ's cell without a lock and holds it (an `Arc`, or a record it counts
/// itself in) while it polls, so a cell outlives every poller that found it. A poller that finds a cell
/// whose domain is gone finds its CQ missing from the cell's state and polls it as an unmanaged CQ, which is
/// what the CQ became.
pub(crate) struct DomainCell {
    state: ReentrantMutex<RefCell<DomainState>>,
}

impl DomainCell {
    pub fn lock(&self) -> ReentrantMutexGuard<'_, RefCell<DomainState>> {
        self.state.lock()
    }
}

/// A lock domain: owned (`Arc`) by the queues and SRQs of one group and by the CQs it manages.
pub(crate) struct Domain {
    cell: Arc<DomainCell>,
}

// SAFETY: a domain's state (and every `Guarded` value of the domain) holds `Rc`-based sqdisc objects that refer
// only to each other; all of them are created, used and dropped with the domain's lock held, so their
// non-atomic reference counts and cells are never touched by two threads at once, and the lock orders the
// accesses of successive threads. A cell outlived by its domain has an empty state.
unsafe impl Send for DomainState {}

impl Domain {
    pub fn new() -> Arc<Domain> {
        Arc::new(Domain { cell: Arc::new(DomainCell { state: ReentrantMutex::new(RefCell::new(DomainState { cqs: Vec::new() })) }) })
    }

    pub fn lock(&self) -> ReentrantMutexGuard<'_, RefCell<DomainState>> {
        self.cell.lock()
    }

    /// The domain's cell, for the poll path's table.
    pub fn cell(&self) -> &Arc<DomainCell> {
        &self.cell
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        // Every queue, SRQ and managed CQ of the domain held it: its state is empty now. The cell may outlive
        // the domain in a table a poller still reads; it must not keep sqdisc objects alive there.
        let held = self.cell.lock();
        let mut st = held.borrow_mut();
        debug_assert!(st.cqs.is_empty(), "a domain dropped with managed CQs");
        st.cqs.clear();
    }
}

/// A value of a domain (a queue, an SRQ): reachable only with its domain's lock held, dropped under it.
pub(crate) struct Guarded<T> {
    domain: Arc<Domain>,
    value: ManuallyDrop<T>,
}

// SAFETY: the value is only reached through `with`, which holds the domain's lock, and dropped under it (see
// `DomainState`'s Send).
unsafe impl<T> Send for Guarded<T> {}
// SAFETY: as above: shared references give no access without the lock.
unsafe impl<T> Sync for Guarded<T> {}

impl<T> Guarded<T> {
    /// Wraps a value made while holding `domain`'s lock.
    pub fn new(domain: Arc<Domain>, value: T) -> Guarded<T> {
        Guarded { domain, value: ManuallyDrop::new(value) }
    }

    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// Runs `f` with the value and the domain's state, under the domain's lock.
    pub fn with<R>(&self, f: impl FnOnce(&T, &RefCell<DomainState>) -> R) -> R {
        let guard = self.domain.lock();
        f(&self.value, &guard)
    }
}

impl<T> Drop for Guarded<T> {
    fn drop(&mut self) {
        let _held = self.domain.lock();
        // SAFETY: dropped once, here; nothing reaches `value` after this.
        unsafe { ManuallyDrop::drop(&mut self.value) };
    }
}
