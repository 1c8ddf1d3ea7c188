//! Seeing SPDK's completions without SPDK's help.
//!
//! SPDK polls its CQs itself (`ibv_poll_cq`, an inline function of libibverbs that calls
//! `cq->context->ops.poll_cq`), and the provider interface has no completion hook. So the first time a qpair
//! is created on a device context, the context's `poll_cq` entry is replaced by [`poll_cq`], and the
//! provider's own op is kept. [`poll_cq`] looks the CQ up: a CQ that a managed qpair uses is polled through
//! sqdisc (which calls the provider's op, releases and moderates, and hands back exactly the completions raw
//! verbs would have); any other CQ goes straight to the provider's op, unchanged.
//!
//! Every CQ of a patched context pays that lookup on every poll, so it takes no lock and a bounded number of
//! steps: the provider's ops are found in a fixed table of contexts (written once per context, never
//! removed), and a CQ's lock domain in an open-addressing hash table read under a sequence counter (writers,
//! serialised by a mutex, make the counter odd while they change the table; a reader that saw it change
//! looks again). Tables replaced by bigger ones are kept, and domains' lock cells are never freed (see
//! `DomainCell`), so a reader never touches freed memory.
//!
//! The entry stays replaced for the life of the process (the library is never unloaded under SPDK): putting
//! it back while another thread may be inside `ibv_poll_cq` could not be made safe. `ibv_req_notify_cq` is
//! not replaced: SPDK's requests end in signaled WRs, and the idle tails sqdisc covers on its own are covered
//! by the next two polls.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{fence, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rdma_sys::{ibv_context, ibv_cq, ibv_wc};
use sqdisc::verbs::{NotifyFn, PollFn};

use crate::domain::{Domain, DomainCell};

/// A device context whose `poll_cq` is replaced, with the provider's ops.
#[derive(Clone, Copy)]
pub(crate) struct Originals {
    pub poll: PollFn,
    pub notify: Option<NotifyFn>,
}

fn hash(key: usize) -> usize {
    ((key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize
}

// ---- device contexts -----------------------------------------------------------------------------------------

/// Device contexts a process can have patched: one per RDMA device a qpair was made on.
const MAX_CONTEXTS: usize = 64;

/// A patched context and the provider's ops, as addresses (0: empty slot; `notify` 0: none).
struct ContextSlot {
    ctx: AtomicUsize,
    poll: AtomicUsize,
    notify: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // only the initialiser of CONTEXTS
const EMPTY_CONTEXT: ContextSlot = ContextSlot { ctx: AtomicUsize::new(0), poll: AtomicUsize::new(0), notify: AtomicUsize::new(0) };
/// Open addressing, linear probing; entries are never removed (a context opened again at the address of a
/// closed one reuses its slot).
static CONTEXTS: [ContextSlot; MAX_CONTEXTS] = [EMPTY_CONTEXT; MAX_CONTEXTS];

/// The slot of `ctx`, or the empty slot where it would go; `None` when the table is full.
#[inline]
fn context_slot(ctx: usize) -> Option<&'static ContextSlot> {
    let start = hash(ctx);
    for i in start..start + MAX_CONTEXTS {
        let s = &CONTEXTS[i % MAX_CONTEXTS];
        let k = s.ctx.load(Ordering::Acquire);
        if k == ctx || k == 0 {
            return Some(s);
        }
    }
    None
}

/// The poll op shared by every patched context, while they all have the same one (one driver: the usual
/// case), else 0: the poll path then needs no context lookup.
static ONLY_POLL: AtomicUsize = AtomicUsize::new(0);
/// Whether two patched contexts have had different poll ops (ONLY_POLL then stays 0).
static MIXED_POLLS: AtomicUsize = AtomicUsize::new(0);

/// The provider's poll op for a CQ of `ctx`, a patched context.
#[inline]
fn original_poll(ctx: usize) -> Option<PollFn> {
    let only = ONLY_POLL.load(Ordering::Acquire);
    if only != 0 {
        // SAFETY: stored from a `PollFn` (pointer layout, non-NULL).
        return Some(unsafe { std::mem::transmute::<usize, PollFn>(only) });
    }
    originals_of(ctx).map(|o| o.poll)
}

/// The provider's ops of a patched context.
#[inline]
fn originals_of(ctx: usize) -> Option<Originals> {
    let slot = context_slot(ctx).filter(|s| s.ctx.load(Ordering::Acquire) == ctx)?;
    let (poll, notify) = (slot.poll.load(Ordering::Relaxed), slot.notify.load(Ordering::Relaxed));
    // SAFETY: both were stored (before the key, which was read with Acquire) from a `PollFn` and an
    // `Option<NotifyFn>`, which have the layout of a pointer (NULL for `None`).
    unsafe {
        Some(Originals {
            poll: std::mem::transmute::<usize, PollFn>(poll),
            notify: std::mem::transmute::<usize, Option<NotifyFn>>(notify),
        })
    }
}

// ---- managed CQs ---------------------------------------------------------------------------------------------

struct CqSlot {
    /// The CQ's address; 0 for an empty slot.
    cq: AtomicUsize,
    cell: AtomicPtr<DomainCell>,
}

/// Open addressing with linear probing and backward-shift deletion (no tombstones), at most half full.
struct Table {
    mask: usize,
    slots: &'static [CqSlot],
}

impl Table {
    fn new(len: usize) -> &'static Table {
        let slots: Vec<CqSlot> = (0..len).map(|_| CqSlot { cq: AtomicUsize::new(0), cell: AtomicPtr::new(std::ptr::null_mut()) }).collect();
        Box::leak(Box::new(Table { mask: len - 1, slots: Box::leak(slots.into_boxed_slice()) }))
    }

    #[inline]
    fn slot(&self, i: usize) -> &CqSlot {
        // SAFETY: `i & mask` < `slots.len()` == `mask + 1`.
        unsafe { self.slots.get_unchecked(i & self.mask) }
    }

    /// The domain cell of `cq`, if the table has it. Bounded by the table's length even if read while a
    /// writer changes it (the caller then discards the answer).
    #[inline]
    fn find(&self, cq: usize) -> Option<&'static DomainCell> {
        let mut i = hash(cq);
        let end = i.wrapping_add(self.mask);
        loop {
            let s = self.slot(i);
            let k = s.cq.load(Ordering::Relaxed);
            if k == cq {
                // SAFETY: cells are never freed (`DomainCell`); NULL only in a slot being written.
                return unsafe { s.cell.load(Ordering::Relaxed).as_ref() };
            }
            if k == 0 || i == end {
                return None;
            }
            i = i.wrapping_add(1);
        }
    }

    /// Writer only (sequence odd): stores `cq` -> `cell`, replacing an entry for `cq`.
    fn put(&self, cq: usize, cell: &'static DomainCell) {
        let mut i = hash(cq);
        loop {
            let s = self.slot(i);
            let k = s.cq.load(Ordering::Relaxed);
            if k == cq || k == 0 {
                s.cell.store(std::ptr::from_ref(cell).cast_mut(), Ordering::Relaxed);
                s.cq.store(cq, Ordering::Relaxed);
                return;
            }
            i += 1;
        }
    }

    /// Writer only (sequence odd): removes `cq`, moving later entries of its probe run back.
    fn remove(&self, cq: usize) {
        let mut i = hash(cq) & self.mask;
        loop {
            let k = self.slot(i).cq.load(Ordering::Relaxed);
            if k == 0 {
                return;
            }
            if k == cq {
                break;
            }
            i = (i + 1) & self.mask;
        }
        let mut j = i;
        loop {
            self.slot(i).cq.store(0, Ordering::Relaxed);
            self.slot(i).cell.store(std::ptr::null_mut(), Ordering::Relaxed);
            loop {
                j = (j + 1) & self.mask;
                let k = self.slot(j).cq.load(Ordering::Relaxed);
                if k == 0 {
                    return;
                }
                // The entry at j may stay if its home slot lies cyclically in (i, j].
                let home = hash(k) & self.mask;
                let stays = if i <= j { i < home && home <= j } else { i < home || home <= j };
                if !stays {
                    let cell = self.slot(j).cell.load(Ordering::Relaxed);
                    self.slot(i).cell.store(cell, Ordering::Relaxed);
                    self.slot(i).cq.store(k, Ordering::Relaxed);
                    i = j;
                    break;
                }
            }
        }
    }
}

#[allow(clippy::declare_interior_mutable_const)] // only the initialiser of EMPTY_SLOTS
const EMPTY_SLOT: CqSlot = CqSlot { cq: AtomicUsize::new(0), cell: AtomicPtr::new(std::ptr::null_mut()) };
static EMPTY_SLOTS: [CqSlot; 1] = [EMPTY_SLOT];
static EMPTY_TABLE: Table = Table { mask: 0, slots: &EMPTY_SLOTS };

/// The current table of managed CQs; never freed.
static TABLE: AtomicPtr<Table> = AtomicPtr::new(std::ptr::addr_of!(EMPTY_TABLE).cast_mut());
/// Odd while a writer changes the table.
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// The writers' side, under one mutex: the managed CQs with their domains (for qpair creation and stats), and
/// the tables replaced by bigger ones, kept because readers may still be in them.
struct Writer {
    cqs: Vec<(usize, Arc<Domain>)>,
    retired: Vec<&'static Table>,
}

static WRITER: Mutex<Writer> = Mutex::new(Writer { cqs: Vec::new(), retired: Vec::new() });

fn writer() -> MutexGuard<'static, Writer> {
    WRITER.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `change` on the current table with the sequence odd, so readers that overlap it look again.
fn write_table(change: impl FnOnce(&'static Table)) {
    let seq = SEQUENCE.load(Ordering::Relaxed);
    SEQUENCE.store(seq + 1, Ordering::Relaxed);
    fence(Ordering::Release);
    // SAFETY: tables are never freed.
    change(unsafe { &*TABLE.load(Ordering::Relaxed) });
    SEQUENCE.store(seq + 2, Ordering::Release);
}

/// The domain cell of a managed CQ, without a lock.
#[inline]
fn managed_cell(cq: usize) -> Option<&'static DomainCell> {
    loop {
        let seq = SEQUENCE.load(Ordering::Acquire);
        if seq & 1 == 0 {
            // SAFETY: tables are never freed.
            let found = unsafe { &*TABLE.load(Ordering::Acquire) }.find(cq);
            fence(Ordering::Acquire);
            if SEQUENCE.load(Ordering::Relaxed) == seq {
                return found;
            }
        }
        std::hint::spin_loop();
    }
}

// ---- the provider's side -------------------------------------------------------------------------------------

/// Replaces `ctx`'s `poll_cq` (once per context) and returns the provider's ops.
///
/// # Safety
/// `ctx` is a live device context that stays alive while any CQ of it is polled.
pub(crate) unsafe fn install(ctx: *mut ibv_context) -> Result<Originals, &'static str> {
    let _w = writer();
    // SAFETY: `ctx` is live (caller's promise); field reads.
    let (poll, notify) = unsafe { ((*ctx).ops.poll_cq, (*ctx).ops.req_notify_cq) };
    let poll = poll.ok_or("the device context has no poll_cq op")?;
    let ours = poll_cq as PollFn as usize;
    if poll as usize == ours {
        // Still ours; a context opened since at the address of a closed one has the provider's op again.
        return originals_of(ctx as usize).ok_or("the context's poll_cq is already replaced by another copy of this provider");
    }
    let slot = context_slot(ctx as usize).ok_or("more than 64 device contexts")?;
    slot.poll.store(poll as usize, Ordering::Relaxed);
    slot.notify.store(notify.map_or(0, |f| f as usize), Ordering::Relaxed);
    slot.ctx.store(ctx as usize, Ordering::Release);
    match ONLY_POLL.load(Ordering::Relaxed) {
        _ if MIXED_POLLS.load(Ordering::Relaxed) != 0 => {}
        0 if CONTEXTS.iter().filter(|s| s.ctx.load(Ordering::Relaxed) != 0).count() == 1 => {
            ONLY_POLL.store(poll as usize, Ordering::Release)
        }
        only if only == poll as usize => {}
        _ => {
            MIXED_POLLS.store(1, Ordering::Relaxed);
            ONLY_POLL.store(0, Ordering::Release);
        }
    }
    // SAFETY: `ops.poll_cq` is an aligned, pointer-sized field of the live context (`Option<fn>` has the layout
    // of a pointer); other threads may be reading it in `ibv_poll_cq` right now, so it is replaced with one
    // atomic store, and either value they read is valid. The context's slot is written first.
    unsafe {
        let entry = std::ptr::addr_of_mut!((*ctx).ops.poll_cq).cast::<AtomicUsize>();
        (*entry).store(ours, Ordering::Release);
    }
    Ok(Originals { poll, notify })
}

/// Routes `cq` through `domain` from now on.
pub(crate) fn manage(cq: *mut ibv_cq, domain: &Arc<Domain>) {
    let mut w = writer();
    let key = cq as usize;
    w.cqs.retain(|e| e.0 != key);
    w.cqs.push((key, domain.clone()));
    // SAFETY: tables are never freed.
    let table = unsafe { &*TABLE.load(Ordering::Relaxed) };
    if 2 * w.cqs.len() > table.slots.len() {
        let bigger = Table::new((2 * table.slots.len()).max(16));
        for (k, d) in &w.cqs {
            bigger.put(*k, d.cell());
        }
        write_table(|_| TABLE.store(std::ptr::from_ref(bigger).cast_mut(), Ordering::Relaxed));
        if !std::ptr::eq(table, &EMPTY_TABLE) {
            w.retired.push(table);
        }
    } else {
        write_table(|t| t.put(key, domain.cell()));
    }
}

/// Polls of `cq` go straight to the provider again.
pub(crate) fn unmanage(cq: *mut ibv_cq) {
    let mut w = writer();
    w.cqs.retain(|e| e.0 != cq as usize);
    if w.cqs.is_empty() {
        w.cqs = Vec::new();
    }
    write_table(|t| t.remove(cq as usize));
}

/// The domain that manages `cq`, if any.
pub(crate) fn domain_of(cq: *mut ibv_cq) -> Option<Arc<Domain>> {
    writer().cqs.iter().find(|e| e.0 == cq as usize).map(|e| e.1.clone())
}

/// The replacement `poll_cq`. The lookups cannot panic, so only the managed path needs a panic boundary; both
/// ways out are tail calls.
///
/// # Safety
/// Called by `ibv_poll_cq` with a live CQ of a context passed to [`install`] and `wc` holding `n` entries.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: `cq` is live (caller's promise); a field read.
    let Some(original) = original_poll(unsafe { (*cq).context } as usize) else {
        return unpublished_context(cq, n, wc);
    };
    match managed_cell(cq as usize) {
        // SAFETY: the provider's own op, called as `ibv_poll_cq` would have.
        None => unsafe { original(cq, n, wc) },
        // SAFETY: as `ibv_poll_cq` promises.
        Some(cell) => unsafe { poll_managed_boundary(cell, original, cq, n, wc) },
    }
}

/// A context whose slot this thread has not seen yet: only if it has not synchronised with the thread that
/// patched the context. The writers' mutex orders it after that thread's writes.
#[cold]
#[inline(never)]
fn unpublished_context(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    let Some(original) = ({
        let _w = writer();
        // SAFETY: `cq` is live (`poll_cq`'s caller's promise); a field read.
        originals_of(unsafe { (*cq).context } as usize)
    }) else {
        return -libc::EINVAL;
    };
    // SAFETY: the provider's op of the CQ's context, then as in `poll_cq`.
    match managed_cell(cq as usize) {
        None => unsafe { (original.poll)(cq, n, wc) },
        Some(cell) => unsafe { poll_managed_boundary(cell, original.poll, cq, n, wc) },
    }
}

/// [`poll_managed`] behind a panic boundary.
///
/// # Safety
/// As for [`poll_managed`].
#[inline(never)]
unsafe fn poll_managed_boundary(cell: &DomainCell, original: PollFn, cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the caller's promise.
    catch_unwind(AssertUnwindSafe(|| unsafe { poll_managed(cell, original, cq, n, wc) })).unwrap_or(-libc::EIO)
}

/// Polls a managed CQ through sqdisc, under its domain's lock.
///
/// # Safety
/// As for [`poll_cq`]; `original` is the provider's op for `cq`.
#[inline]
unsafe fn poll_managed(cell: &DomainCell, original: PollFn, cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    if n <= 0 || wc.is_null() {
        return 0;
    }
    // SAFETY: `wc` holds `n` writable entries (caller's promise).
    let out = unsafe { std::slice::from_raw_parts_mut(wc, n as usize) };
    let held = cell.lock();
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// Pollers on other threads find every CQ that stays managed, and none that never was, while CQs come
    /// and go (shifts on removal, the table growing from 16 to 512 slots) under them.
    #[test]
    fn lookups_stay_exact_while_other_cqs_come_and_go() {
        let domain = Domain::new();
        let stable: Vec<usize> = (1..=8).map(|i| 0x7f00_0010_0000 + i * 0x40).collect();
        let absent: Vec<usize> = (1..=8).map(|i| 0x7f00_0030_0000 + i * 0x40).collect();
        for &k in &stable {
            manage(k as *mut ibv_cq, &domain);
        }
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mut rounds = 0u64;
                    while !stop.load(Ordering::Relaxed) || rounds == 0 {
                        for &k in &stable {
                            assert!(managed_cell(k).is_some_and(|c| std::ptr::eq(c, domain.cell())), "lost {k:#x}");
                        }
                        for &k in &absent {
                            assert!(managed_cell(k).is_none(), "found {k:#x}");
                        }
                        rounds += 1;
                    }
                });
            }
            let churn = |i: usize| (0x7f00_0020_0000 + (i % 240) * 0x40) as *mut ibv_cq;
            for i in 0..3000 {
                manage(churn(i), &domain);
                if i % 3 != 0 {
                    unmanage(churn(i));
                }
            }
            for i in 0..240 {
                unmanage(churn(i));
            }
            stop.store(true, Ordering::Relaxed);
        });
        for &k in &stable {
            unmanage(k as *mut ibv_cq);
            assert!(managed_cell(k).is_none());
        }
    }

    /// The table keeps every live key findable through puts, removals (backward shifts across the wrap) and
    /// colliding keys.
    #[test]
    fn table_finds_every_live_key_after_removals() {
        let table = Table::new(16);
        let cell: &'static DomainCell = Domain::new().cell();
        let mut live: Vec<usize> = Vec::new();
        let mut x: u64 = 1;
        for step in 0..4000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = ((x % 24) as usize + 1) * 64;
            if live.contains(&key) {
                table.remove(key);
                live.retain(|&k| k != key);
            } else if live.len() < 8 {
                table.put(key, cell);
                live.push(key);
            }
            for k in (1..=24).map(|i| i * 64) {
                assert_eq!(table.find(k).is_some(), live.contains(&k), "step {step}, key {k}");
            }
        }
    }
}
