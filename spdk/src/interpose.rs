//! Seeing SPDK's completions without SPDK's help.
//!
//! SPDK polls its CQs itself (`ibv_poll_cq`, an inline function of libibverbs that calls
//! `cq->context->ops.poll_cq`), and the provider interface has no completion hook. So while a device context
//! has a managed CQ (one a qpair of this provider uses), the context's `poll_cq` entry is replaced by
//! [`poll_cq`], and the provider's own op is kept. [`poll_cq`] routes each CQ: a managed CQ is polled through
//! sqdisc (which calls the provider's op, releases and moderates, and hands back exactly the completions raw
//! verbs would have); any other CQ goes straight to the provider's op, unchanged. When the context's last
//! managed CQ stops being managed, its entry is put back.
//!
//! Every CQ of a patched context pays the routing on every poll, so it takes no lock and, for a CQ that is not
//! managed, no more than a hash and an indirect jump: a fixed array of routes ([`ROUTES`], a filter, not a
//! limit) holds, for each hash bucket of CQ addresses, the provider's op itself when no managed CQ falls in
//! the bucket and every patched context has that op (one driver: the usual case), else a function that looks
//! the CQ or its context up. A bucket's first managed CQ (its owner) has what an empty poll needs in a static
//! slot ([`OWNERS`]), and a record for the rest that pollers count themselves in to use. Other lookups read an
//! immutable snapshot of the managed CQs and patched contexts, replaced as a whole by writers (serialised by a
//! mutex); its readers only copy out (an `Arc` of the domain cell), counted in two counters, and a writer that
//! replaced it frees the old one once both have drained, which they do at once. Nothing here has a fixed limit
//! on contexts or CQs, and nothing is kept after it goes.
//!
//! Putting a context's entry back is safe while another thread may be inside `ibv_poll_cq` with the old
//! value: [`poll_cq`] of a context that is no longer patched finds no route to it and calls the op the
//! context holds again, which is the provider's. `ibv_req_notify_cq` is not replaced: SPDK's requests end in
//! signaled WRs, and the idle tails sqdisc covers on its own are covered by the next two polls.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crossbeam_utils::atomic::AtomicCell;
use rdma_sys::{ibv_context, ibv_cq, ibv_wc};
use sqdisc::verbs::{NotifyFn, PollFn};

use crate::domain::{thread_id, CqGate, Domain, DomainCell, Entered, GateRef};

/// A device context whose `poll_cq` is replaced, with the provider's ops.
#[derive(Clone, Copy)]
pub(crate) struct Originals {
    pub poll: PollFn,
    pub notify: Option<NotifyFn>,
}

#[inline(always)]
fn hash(key: usize) -> usize {
    ((key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize
}

// ---- routes --------------------------------------------------------------------------------------------------

const ROUTE_BITS: u32 = 12;
/// Buckets of the route filter: more only makes a CQ that shares a bucket with a managed one rarer.
const ROUTES_LEN: usize = 1 << ROUTE_BITS;

#[inline(always)]
fn bucket(cq: usize) -> usize {
    // Bits 4 to 15 of the CQ's address: CQs are separate allocations, at least 16 bytes apart, so these bits
    // spread them; two that share a bucket only take the slower path. One shift and one mask, so that the
    // unmanaged CQ's route costs the fewest instructions ([`poll_cq`]).
    (cq >> ROUTE_SHIFT) & (ROUTES_LEN - 1)
}

/// The address bits [`bucket`] skips: a route is 16 bytes, so the masked address is the route's byte offset.
const ROUTE_SHIFT: u32 = 4;

/// A route, 16 bytes so that [`poll_cq`] finds it at the CQ's address bits 4 to 15 as a byte offset.
#[repr(C, align(16))]
struct Route(AtomicCell<PollFn>);

const _: () = assert!(std::mem::size_of::<Route>() == 1 << ROUTE_SHIFT);

/// Where a poll of a CQ in each bucket goes: the provider's op itself (no managed CQ in the bucket, one
/// provider op for every patched context), [`route_managed`] (a managed CQ may be in the bucket) or
/// [`route_lookup`] (patched contexts have different ops: look the CQ's context up).
static ROUTES: [Route; ROUTES_LEN] = [const { Route(AtomicCell::new(route_lookup as PollFn)) }; ROUTES_LEN];

/// A managed CQ's record in its bucket's [`OWNERS`] slot, for the poll path's work beyond the device's answer:
/// immutable, freed only once no poller can hold it.
struct Owner {
    cq: usize,
    poll: PollFn,
    cell: Arc<DomainCell>,
    gate: GateRef,
}

/// The first managed CQ of each bucket (its owner, while it is managed): what an empty poll of it reads, in
/// static memory (`key`, the device's `poll` op, the CQ's `gate`), a cache line each so that the poll path finds
/// a slot with a shift and a mask and pollers of different CQs share no line. The turn's holder keeps the poll's
/// arguments in `held_*` across the device's call, for the rare poll that finds CQEs, so that the common one saves
/// no registers. Its record (in [`RECORDS`]) serves the rest. Other managed CQs of a bucket (collisions, rare)
/// are found in the snapshot, with gates of their own.
#[repr(C, align(64))]
struct OwnerSlot {
    key: AtomicUsize,
    poll: AtomicUsize,
    gate: CqGate,
    held_cq: AtomicUsize,
    held_n: AtomicUsize,
    held_wc: AtomicUsize,
}

const _: () = assert!(std::mem::size_of::<OwnerSlot>() == 64);

static OWNERS: [OwnerSlot; ROUTES_LEN] = [const {
    OwnerSlot {
        key: AtomicUsize::new(0),
        poll: AtomicUsize::new(0),
        gate: CqGate::new(),
        held_cq: AtomicUsize::new(0),
        held_n: AtomicUsize::new(0),
        held_wc: AtomicUsize::new(0),
    }
}; ROUTES_LEN];

/// The record of each bucket's owner, which a poller that needs more than the device's answer counts itself
/// in `readers` to use: a record taken out of its slot is freed only once `readers` has been seen at 0 after
/// that (then no poller that could have loaded it is still inside).
struct RecordSlot {
    readers: AtomicUsize,
    owner: AtomicPtr<Owner>,
}

static RECORDS: [RecordSlot; ROUTES_LEN] =
    [const { RecordSlot { readers: AtomicUsize::new(0), owner: AtomicPtr::new(std::ptr::null_mut()) } }; ROUTES_LEN];

/// The poll op shared by every context ever patched while they all had the same one (one driver), else 0.
/// It never changes from one op to another: a thread that read a route a moment before it changed still calls
/// the right op.
static ONLY_POLL: AtomicUsize = AtomicUsize::new(0);
/// Set (for good) once two patched contexts have had different poll ops.
static MIXED_POLLS: AtomicUsize = AtomicUsize::new(0);

/// The route of a bucket with no managed CQ.
fn unmanaged_route() -> PollFn {
    match ONLY_POLL.load(Ordering::Relaxed) {
        0 => route_lookup,
        // SAFETY: stored from a `PollFn` (pointer layout, non-NULL).
        only => unsafe { std::mem::transmute::<usize, PollFn>(only) },
    }
}

// ---- the snapshot pollers read -------------------------------------------------------------------------------

/// A managed CQ: its domain's cell and its context's poll op.
struct CqSlot {
    /// The CQ's address; 0 for an empty slot.
    cq: usize,
    poll: Option<PollFn>,
    cell: Option<Arc<DomainCell>>,
    gate: Option<GateRef>,
}

/// The managed CQs (open addressing, linear probing, at most half full) and the patched contexts with their
/// poll ops, as one immutable value.
struct Snapshot {
    mask: usize,
    slots: Box<[CqSlot]>,
    contexts: Box<[(usize, PollFn)]>,
}

impl Snapshot {
    fn new(w: &Writer) -> Snapshot {
        let len = (2 * w.cqs.len()).next_power_of_two().max(4);
        let mut slots: Box<[CqSlot]> = (0..len).map(|_| CqSlot { cq: 0, poll: None, cell: None, gate: None }).collect();
        let mask = len - 1;
        for e in &w.cqs {
            let poll = w.contexts.iter().find(|c| c.ctx == e.ctx).map(|c| c.originals.poll);
            let mut i = hash(e.cq) & mask;
            while slots[i].cq != 0 {
                i = (i + 1) & mask;
            }
            slots[i] = CqSlot { cq: e.cq, poll, cell: Some(e.domain.cell().clone()), gate: Some(e.gate.clone()) };
        }
        let contexts = w.contexts.iter().map(|c| (c.ctx, c.originals.poll)).collect();
        Snapshot { mask, slots, contexts }
    }

    /// The slot of a managed CQ.
    #[inline]
    fn cq(&self, cq: usize) -> Option<&CqSlot> {
        let mut i = hash(cq) & self.mask;
        loop {
            // SAFETY: `i <= mask` < `slots.len()`.
            let s = unsafe { self.slots.get_unchecked(i) };
            if s.cq == cq {
                return Some(s);
            }
            if s.cq == 0 {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The provider's poll op of a patched context.
    #[inline]
    fn context(&self, ctx: usize) -> Option<PollFn> {
        self.contexts.iter().find(|c| c.0 == ctx).map(|c| c.1)
    }
}

/// The current snapshot; NULL until a context is patched.
static SNAPSHOT: AtomicPtr<Snapshot> = AtomicPtr::new(std::ptr::null_mut());
/// Readers of the snapshot, in two counters: a reader counts itself in the one [`READING`] names while it loads
/// the snapshot and copies out what it needs (no lock, no call: a few instructions), and never uses the snapshot
/// after. A writer that replaced the snapshot points new readers at the other counter and waits for the first
/// to drain, which it does at once, before it frees the old snapshot.
static READERS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
static READING: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` on the current snapshot (None before the first), counted as a reader: `f` copies out, it must not
/// block.
#[inline]
fn read_snapshot<R>(f: impl FnOnce(Option<&Snapshot>) -> R) -> R {
    let i = READING.load(Ordering::SeqCst) & 1;
    READERS[i].fetch_add(1, Ordering::SeqCst);
    let snap = SNAPSHOT.load(Ordering::SeqCst);
    // SAFETY: a snapshot is freed only after it was replaced and both counters were then seen drained of the
    // readers that could have loaded it (`publish`); this reader is counted.
    let r = f(unsafe { snap.as_ref() });
    READERS[i].fetch_sub(1, Ordering::Release);
    r
}

// ---- the writers' side ---------------------------------------------------------------------------------------

struct ContextEntry {
    ctx: usize,
    originals: Originals,
    /// Managed CQs of the context; its entry is put back when this reaches 0.
    cqs: usize,
}

struct CqEntry {
    cq: usize,
    ctx: usize,
    domain: Arc<Domain>,
    gate: GateRef,
}

/// The writers' side, under one mutex: the managed CQs with their domains (for qpair creation and stats), the
/// patched contexts, and how many managed CQs fall in each route bucket.
struct Writer {
    cqs: Vec<CqEntry>,
    contexts: Vec<ContextEntry>,
    buckets: Vec<u32>,
    /// Owner records taken out of their slot (bucket, record), until no poller can hold them.
    retired: Vec<(usize, *mut Owner)>,
}

// SAFETY: the retired records are only reached under the mutex, and freed as `Box`es made on any thread; an
// `Owner` holds an `Arc<DomainCell>` (Send + Sync) and plain values.
unsafe impl Send for Writer {}

static WRITER: Mutex<Writer> =
    Mutex::new(Writer { cqs: Vec::new(), contexts: Vec::new(), buckets: Vec::new(), retired: Vec::new() });

fn writer() -> MutexGuard<'static, Writer> {
    WRITER.lock().unwrap_or_else(|e| e.into_inner())
}

/// Replaces the snapshot by one of `w`; the old one is freed once no poller can be reading it.
fn publish(w: &Writer) {
    let new = Box::into_raw(Box::new(Snapshot::new(w)));
    let old = SNAPSHOT.swap(new, Ordering::SeqCst);
    if old.is_null() {
        return;
    }
    // Readers that counted themselves before the swap may hold `old`; those after it see `new`. New readers go to
    // the other counter, so the one in use drains (its readers only copy out), then the other, for readers that
    // read the index before the flip and counted themselves after.
    let first = READING.fetch_add(1, Ordering::SeqCst) & 1;
    for i in [first, first ^ 1] {
        let mut spins = 0u32;
        while READERS[i].load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins % 64 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
    // SAFETY: made by `Box::into_raw` above (in an earlier call), unreachable since the swap, and no reader holds
    // it (both counters drained after the swap).
    drop(unsafe { Box::from_raw(old) });
}

/// Frees the retired owner records no poller can hold any more.
fn reclaim_owners(w: &mut Writer) {
    w.retired.retain(|&(b, rec)| {
        // SeqCst, as the readers' increment and the slot's clearing: a 0 read here, after the clearing, means
        // every poller that counted itself before the clearing has left, and those after it cannot see `rec`.
        if RECORDS[b].readers.load(Ordering::SeqCst) != 0 {
            return true;
        }
        // SAFETY: made by `Box::into_raw` in `set_owner`, out of its slot, and no poller holds it (above).
        drop(unsafe { Box::from_raw(rec) });
        false
    });
}

/// Makes `cq`, a managed CQ of `w` whose gate is its bucket slot's, the slot's owner.
fn install_owner(w: &Writer, cq: usize) {
    let slot = &OWNERS[bucket(cq)];
    let Some(e) = w.cqs.iter().find(|e| e.cq == cq) else { return };
    let Some(c) = w.contexts.iter().find(|c| c.ctx == e.ctx) else { return };
    let rec = Box::into_raw(Box::new(Owner { cq, poll: c.originals.poll, cell: e.domain.cell().clone(), gate: e.gate.clone() }));
    slot.gate.set_needs_sqdisc(false);
    slot.poll.store(c.originals.poll as usize, Ordering::Release);
    RECORDS[bucket(cq)].owner.store(rec, Ordering::SeqCst);
    slot.key.store(cq, Ordering::Release);
}

/// Patches `ctx` if it is not (its poll op and route words first, then the entry), and returns its ops.
///
/// # Safety
/// `ctx` is a live device context.
unsafe fn install(w: &mut Writer, ctx: *mut ibv_context) -> Result<Originals, &'static str> {
    if let Some(c) = w.contexts.iter().find(|c| c.ctx == ctx as usize) {
        return Ok(c.originals);
    }
    // SAFETY: `ctx` is live (caller's promise); field reads.
    let (poll, notify) = unsafe { ((*ctx).ops.poll_cq, (*ctx).ops.req_notify_cq) };
    let poll = poll.ok_or("the device context has no poll_cq op")?;
    let ours = poll_cq as PollFn as usize;
    if poll as usize == ours {
        return Err("the context's poll_cq is already replaced by another copy of this provider");
    }
    let originals = Originals { poll, notify };
    w.contexts.push(ContextEntry { ctx: ctx as usize, originals, cqs: 0 });
    publish(w);
    if MIXED_POLLS.load(Ordering::Relaxed) == 0 {
        match ONLY_POLL.load(Ordering::Relaxed) {
            0 => {
                ONLY_POLL.store(poll as usize, Ordering::Relaxed);
                set_unmanaged_routes(w);
            }
            only if only == poll as usize => {}
            _ => {
                MIXED_POLLS.store(1, Ordering::Relaxed);
                ONLY_POLL.store(0, Ordering::Relaxed);
                set_unmanaged_routes(w);
            }
        }
    }
    // SAFETY: `ops.poll_cq` is an aligned, pointer-sized field of the live context (`Option<fn>` has the layout
    // of a pointer); other threads may be reading it in `ibv_poll_cq` right now, so it is replaced with one
    // atomic store, and either value they read is valid. The snapshot and the routes are written first.
    unsafe {
        let entry = std::ptr::addr_of_mut!((*ctx).ops.poll_cq).cast::<AtomicUsize>();
        (*entry).store(ours, Ordering::Release);
    }
    Ok(originals)
}

/// Every bucket without a managed CQ routes to [`unmanaged_route`].
fn set_unmanaged_routes(w: &Writer) {
    let route = unmanaged_route();
    for (i, Route(r)) in ROUTES.iter().enumerate() {
        if w.buckets.get(i).copied().unwrap_or(0) == 0 {
            r.store(route);
        }
    }
}

/// Routes `cq` (a CQ of a live context) through `domain` from now on, patching its context if needed; returns
/// the provider's ops for it and the CQ's gate (new, or the one it has if it was managed already).
///
/// # Safety
/// `cq` is a live CQ whose context stays alive while the CQ is managed.
pub(crate) unsafe fn manage(cq: *mut ibv_cq, domain: &Arc<Domain>) -> Result<(Originals, GateRef), &'static str> {
    let mut w = writer();
    // SAFETY: `cq` is live (caller's promise); a field read.
    let ctx = unsafe { (*cq).context };
    // SAFETY: the CQ's live context.
    let originals = unsafe { install(&mut w, ctx) }?;
    let key = cq as usize;
    if let Some(e) = w.cqs.iter_mut().find(|e| e.cq == key) {
        e.domain = domain.clone();
        let gate = e.gate.clone();
        publish(&w);
        if retire_owner(&mut w, key) {
            install_owner(&w, key);
        }
        return Ok((originals, gate));
    }
    let slot = &OWNERS[bucket(key)];
    let owns = slot.key.load(Ordering::Relaxed) == 0 && RECORDS[bucket(key)].owner.load(Ordering::Relaxed).is_null();
    let gate = if owns { GateRef::Slot(&slot.gate) } else { GateRef::Own(Arc::new(CqGate::new())) };
    w.cqs.push(CqEntry { cq: key, ctx: ctx as usize, domain: domain.clone(), gate: gate.clone() });
    if let Some(c) = w.contexts.iter_mut().find(|c| c.ctx == ctx as usize) {
        c.cqs += 1;
    }
    publish(&w);
    if w.buckets.is_empty() {
        w.buckets = vec![0; ROUTES_LEN];
    }
    let b = bucket(key);
    w.buckets[b] += 1;
    if owns {
        install_owner(&w, key);
    }
    ROUTES[b].0.store(route_managed);
    reclaim_owners(&mut w);
    Ok((originals, gate))
}

/// Polls of `cq` go straight to the provider again; its context's entry is put back if it was its last
/// managed CQ.
pub(crate) fn unmanage(cq: *mut ibv_cq) {
    let mut w = writer();
    let key = cq as usize;
    let Some(at) = w.cqs.iter().position(|e| e.cq == key) else { return };
    let e = w.cqs.swap_remove(at);
    let b = bucket(key);
    w.buckets[b] -= 1;
    if w.buckets[b] == 0 {
        ROUTES[b].0.store(unmanaged_route());
    }
    retire_owner(&mut w, key);
    let mut restore = None;
    if let Some(at) = w.contexts.iter().position(|c| c.ctx == e.ctx) {
        w.contexts[at].cqs -= 1;
        if w.contexts[at].cqs == 0 {
            restore = Some(w.contexts.swap_remove(at));
        }
    }
    if let Some(c) = &restore {
        // SAFETY: the context is live (`manage`'s caller's promise: it outlives its managed CQs); its entry is put
        // back with one atomic store, before the snapshot stops naming it, so that a poller that finds it missing
        // finds the provider's op in the context.
        unsafe {
            let entry = std::ptr::addr_of_mut!((*(c.ctx as *mut ibv_context)).ops.poll_cq).cast::<AtomicUsize>();
            (*entry).store(c.originals.poll as usize, Ordering::Release);
        }
    }
    publish(&w);
    reclaim_owners(&mut w);
    if w.cqs.is_empty() {
        w.cqs = Vec::new();
        w.contexts = Vec::new();
    }
    drop(w);
    drop(e);
}

/// Takes `cq` out of its bucket's slot, if it is the owner (the record goes to [`reclaim_owners`]); returns
/// whether it was. The slot is free for the next CQ managed in the bucket; the CQs of the bucket managed
/// meanwhile keep their own gates.
fn retire_owner(w: &mut Writer, cq: usize) -> bool {
    let b = bucket(cq);
    let slot = &OWNERS[b];
    if slot.key.load(Ordering::Relaxed) != cq {
        return false;
    }
    slot.key.store(0, Ordering::SeqCst);
    let rec = RECORDS[b].owner.swap(std::ptr::null_mut(), Ordering::SeqCst);
    if !rec.is_null() {
        w.retired.push((b, rec));
    }
    true
}

/// The domain that manages `cq`, if any.
pub(crate) fn domain_of(cq: *mut ibv_cq) -> Option<Arc<Domain>> {
    writer().cqs.iter().find(|e| e.cq == cq as usize).map(|e| e.domain.clone())
}

/// How many contexts are patched and how many CQs managed (tests).
#[cfg(test)]
fn counts() -> (usize, usize) {
    let w = writer();
    (w.contexts.len(), w.cqs.len())
}

// ---- the poll path -------------------------------------------------------------------------------------------

/// The replacement `poll_cq`: one hash, one indirect jump.
///
/// # Safety
/// Called by `ibv_poll_cq` with a live CQ and `wc` holding `n` entries.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the bucket index is below `ROUTES_LEN`; every route is a `PollFn` for any CQ of a patched context
    // (or one that was), called as `ibv_poll_cq` would have.
    let offset = cq as usize & ((ROUTES_LEN - 1) << ROUTE_SHIFT);
    // SAFETY: `offset` is `bucket(cq) * 16`, the byte offset of a route inside `ROUTES` (16-byte routes); every
    // route is a `PollFn` for any CQ of a patched context (or one that was), called as `ibv_poll_cq` would have.
    unsafe { (*std::ptr::addr_of!(ROUTES).cast::<u8>().add(offset).cast::<Route>()).0.load()(cq, n, wc) }
}

/// The route of a bucket that may hold a managed CQ.
///
/// # Safety
/// As for [`poll_cq`].
unsafe extern "C" fn route_managed(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the bucket index is below `ROUTES_LEN`.
    let slot = unsafe { OWNERS.get_unchecked(bucket(cq as usize)) };
    if slot.key.load(Ordering::Acquire) != cq as usize {
        // SAFETY: as `poll_cq` promises.
        return unsafe { route_snapshot(cq, n, wc) };
    }
    let gate = &slot.gate;
    if !gate.try_enter_quiet(thread_id()) {
        // The turn is another thread's, or sqdisc has work.
        // SAFETY: as `poll_cq` promises.
        return unsafe { route_owner_wait(cq, n, wc) };
    }
    let poll = slot.poll.load(Ordering::Acquire);
    if slot.key.load(Ordering::Acquire) != cq as usize {
        // SAFETY: as `poll_cq` promises; this thread has the slot's turn.
        return unsafe { route_owner_work(cq, n, wc) };
    }
    // Only the turn's holder touches these.
    slot.held_cq.store(cq as usize, Ordering::Relaxed);
    slot.held_n.store(n as usize, Ordering::Relaxed);
    slot.held_wc.store(wc as usize, Ordering::Relaxed);
    // SAFETY: the device's op of the CQ (stored from a `PollFn` before the key, which still names the CQ after
    // the op was read), called as `ibv_poll_cq` would have; this thread has the CQ's turn.
    let found = unsafe { std::mem::transmute::<usize, PollFn>(poll)(cq, n, wc) };
    if found > 0 {
        // SAFETY: the slot's held arguments are this poll's (`poll_cq`'s promises hold for them); `found` CQEs are
        // in its `wc`; this thread has the slot's turn.
        return unsafe { route_owner_found_held(slot, found) };
    }
    gate.leave();
    found
}

/// [`route_owner_found`] with the arguments the turn's holder kept in the slot.
///
/// # Safety
/// As for [`route_owner_found`], with the slot's held arguments those of the poll.
#[cold]
#[inline(never)]
unsafe fn route_owner_found_held(slot: &OwnerSlot, found: c_int) -> c_int {
    let cq = slot.held_cq.load(Ordering::Relaxed) as *mut ibv_cq;
    let n = slot.held_n.load(Ordering::Relaxed) as c_int;
    let wc = slot.held_wc.load(Ordering::Relaxed) as *mut ibv_wc;
    // SAFETY: the caller's promise.
    unsafe { route_owner_found(cq, n, wc, found) }
}

/// Runs `f` with the record of `cq`, its bucket's owner, counted in the slot's readers; `None` if `cq` is not
/// the owner (any more).
#[inline(always)]
fn with_owner<R>(cq: *mut ibv_cq, f: impl FnOnce(&Owner) -> R) -> Option<R> {
    let slot = &RECORDS[bucket(cq as usize)];
    slot.readers.fetch_add(1, Ordering::SeqCst);
    let rec = slot.owner.load(Ordering::SeqCst);
    // SAFETY: a record loaded from its slot while counted in `readers` stays allocated until the count is left
    // (`reclaim_owners`); its fields are immutable.
    let r = unsafe { rec.as_ref() }.filter(|o| o.cq == cq as usize).map(f);
    slot.readers.fetch_sub(1, Ordering::Release);
    r
}

/// [`route_managed`] for an owner whose turn was not free or whose sqdisc has work.
///
/// # Safety
/// As for [`poll_cq`].
#[cold]
#[inline(never)]
unsafe fn route_owner_wait(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the caller's promise.
    unsafe { route_owner_slow(cq, n, wc, false) }
}

/// [`route_managed`] for a CQ that stopped owning its slot while this thread took the slot's turn.
///
/// # Safety
/// As for [`poll_cq`], with the slot's turn taken.
#[cold]
#[inline(never)]
unsafe fn route_owner_work(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the caller's promise.
    unsafe { route_owner_slow(cq, n, wc, true) }
}

/// [`route_managed`] for an owner whose turn was not free or whose sqdisc has work.
///
/// # Safety
/// As for [`poll_cq`]; `have_turn`: this thread took the slot's turn.
#[cold]
#[inline(never)]
unsafe fn route_owner_slow(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc, have_turn: bool) -> c_int {
    // SAFETY: the caller's promise; the record's cell and gate live while it is held.
    let got = with_owner(cq, |o| unsafe { poll_gated_slow(&o.cell, &o.gate, o.poll, cq, n, wc, have_turn) });
    match got {
        Some(got) => got,
        None => {
            if have_turn {
                OWNERS[bucket(cq as usize)].gate.leave();
            }
            // SAFETY: as `poll_cq` promises.
            unsafe { route_snapshot(cq, n, wc) }
        }
    }
}

/// The CQEs the device gave [`route_managed`] for its bucket's owner, through sqdisc; gives the turn back.
///
/// # Safety
/// As for [`poll_cq`], with the slot's turn taken and `found` CQEs in `wc`.
#[inline(always)]
unsafe fn route_owner_found(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc, found: c_int) -> c_int {
    // SAFETY: the caller's promise; the record's cell lives while it is held.
    let got = with_owner(cq, |o| unsafe { poll_found_boundary(&o.cell, cq, n, wc, found as usize) });
    OWNERS[bucket(cq as usize)].gate.leave();
    // Unmanaged meanwhile: the device's answer as it is.
    got.unwrap_or(found)
}

/// A CQ of a bucket with a managed CQ that is not the bucket's owner: looked up in the snapshot.
///
/// # Safety
/// As for [`poll_cq`].
#[inline(never)]
unsafe fn route_snapshot(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    let found = read_snapshot(|snap| match snap?.cq(cq as usize)? {
        CqSlot { poll: Some(poll), cell: Some(cell), gate: Some(gate), .. } => Some((*poll, cell.clone(), gate.clone())),
        _ => None,
    });
    match found {
        // SAFETY: as `ibv_poll_cq` promises; the cell and gate are held.
        Some((poll, cell, gate)) => unsafe { poll_gated(&cell, &gate, poll, cq, n, wc) },
        // SAFETY: as `poll_cq` promises.
        None => unsafe { route_unmanaged(cq, n, wc) },
    }
}

/// A CQ that is not managed, from a bucket that may hold a managed one.
///
/// # Safety
/// As for [`poll_cq`].
#[inline]
unsafe fn route_unmanaged(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    match ONLY_POLL.load(Ordering::Relaxed) {
        // SAFETY: as `poll_cq` promises.
        0 => unsafe { route_lookup(cq, n, wc) },
        // SAFETY: stored from a `PollFn`: the op of every context ever patched; as `ibv_poll_cq` would call it.
        only => unsafe { std::mem::transmute::<usize, PollFn>(only)(cq, n, wc) },
    }
}

/// The route of a bucket with no managed CQ while patched contexts have different ops (or before the first
/// context is patched): the op of the CQ's context.
///
/// # Safety
/// As for [`poll_cq`].
unsafe extern "C" fn route_lookup(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: `cq` is live (caller's promise); a field read.
    let ctx = unsafe { (*cq).context };
    let found = read_snapshot(|snap| snap?.context(ctx as usize));
    if let Some(poll) = found {
        // SAFETY: the provider's op of the CQ's context, as `ibv_poll_cq` would call it.
        return unsafe { poll(cq, n, wc) };
    }
    context_op(cq, n, wc)
}

/// A CQ whose context the snapshot does not name: it was patched no more (its entry put back: the provider's
/// op is in the context again), or this thread has not seen it patched yet; the writers' mutex orders it after
/// the thread that did.
#[cold]
#[inline(never)]
fn context_op(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    let ours = poll_cq as PollFn as usize;
    let op = {
        let w = writer();
        // SAFETY: `cq` is live (`poll_cq`'s caller's promise); field reads.
        let ctx = unsafe { (*cq).context };
        match w.contexts.iter().find(|c| c.ctx == ctx as usize) {
            Some(c) => c.originals.poll as usize,
            // SAFETY: the live context's op, read as one word (writers store it atomically).
            None => unsafe { (*std::ptr::addr_of!((*ctx).ops.poll_cq).cast::<AtomicUsize>()).load(Ordering::Acquire) },
        }
    };
    if op == 0 || op == ours {
        return -libc::EINVAL;
    }
    // SAFETY: the provider's op of the CQ's context (a `PollFn`, non-NULL), as `ibv_poll_cq` would call it.
    unsafe { std::mem::transmute::<usize, PollFn>(op)(cq, n, wc) }
}

/// Polls a managed CQ: takes the CQ's turn, then, when an empty poll needs nothing of sqdisc (no owed flush
/// completions, no idle tail watched: `CqGate`'s flag), asks the device first and goes to sqdisc, under
/// the domain's lock, only with the CQEs it found; else polls through sqdisc under the lock. The common case, the
/// turn free and the device's answer empty, stays in this function; the rest is out of line.
///
/// # Safety
/// As for [`poll_cq`]; `original` is the provider's op for `cq`.
#[inline(always)]
unsafe fn poll_gated(cell: &DomainCell, gate: &CqGate, original: PollFn, cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    if !gate.try_enter_quiet(thread_id()) {
        // SAFETY: the caller's promise.
        return unsafe { poll_gated_slow(cell, gate, original, cq, n, wc, false) };
    }
    // SAFETY: the provider's own op, called as `ibv_poll_cq` would have; this thread has the CQ's turn.
    let found = unsafe { original(cq, n, wc) };
    if found > 0 {
        // SAFETY: the caller's promise; `found` CQEs are in `wc`, and this thread has the CQ's turn.
        return unsafe { poll_gated_found(cell, gate, cq, n, wc, found) };
    }
    gate.leave();
    found
}

/// The CQEs the device gave [`poll_gated`], through sqdisc; gives the CQ's turn back.
///
/// # Safety
/// As for [`poll_gated`], with the CQ's turn taken and `found` CQEs in `wc`.
#[cold]
#[inline(never)]
unsafe fn poll_gated_found(cell: &DomainCell, gate: &CqGate, cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc, found: c_int) -> c_int {
    // SAFETY: the caller's promise.
    let got = unsafe { poll_found_boundary(cell, cq, n, wc, found as usize) };
    gate.leave();
    got
}

/// [`poll_gated`] when the turn was not free or sqdisc has work: waits for the turn (or, for a poll from inside
/// this thread's own poll of the CQ, lets sqdisc refuse it as it would without the gate), then polls through
/// sqdisc, or as [`poll_gated`] does if sqdisc has no work after all.
///
/// # Safety
/// As for [`poll_gated`]; `have_turn`: this thread took the CQ's turn.
#[cold]
#[inline(never)]
unsafe fn poll_gated_slow(cell: &DomainCell, gate: &CqGate, original: PollFn, cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc, have_turn: bool) -> c_int {
    let entered = if have_turn {
        if gate.needs_sqdisc() {
            Entered::Sqdisc
        } else {
            Entered::Device
        }
    } else {
        gate.enter(thread_id())
    };
    let got = match entered {
        // A poll from inside this thread's own poll of the CQ: sqdisc refuses it, as it would without the gate.
        // SAFETY: the caller's promise.
        Entered::Reentered => return unsafe { poll_managed_boundary(cell, original, cq, n, wc) },
        // SAFETY: the caller's promise; this thread has the turn.
        Entered::Sqdisc => unsafe { poll_managed_boundary(cell, original, cq, n, wc) },
        // SAFETY: as in `poll_gated`; this thread has the turn.
        Entered::Device => match unsafe { original(cq, n, wc) } {
            found if found <= 0 => found,
            // SAFETY: the caller's promise; `found` CQEs are in `wc`.
            found => unsafe { poll_found_boundary(cell, cq, n, wc, found as usize) },
        },
    };
    gate.leave();
    got
}

/// [`poll_managed`] behind a panic boundary, for a poll that asks the device itself.
///
/// # Safety
/// As for [`poll_managed`].
#[inline(never)]
unsafe fn poll_managed_boundary(cell: &DomainCell, original: PollFn, cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the caller's promise.
    catch_unwind(AssertUnwindSafe(|| unsafe { poll_managed(cell, original, cq, n, wc, None) })).unwrap_or(-libc::EIO)
}

/// [`poll_managed`] behind a panic boundary, for the CQEs the device's op gave the caller: the common poll that
/// finds work, compiled on its own so that it carries nothing of the other's path.
///
/// # Safety
/// As for [`poll_managed`], with `found` > 0 CQEs in `wc`.
#[inline(never)]
unsafe fn poll_found_boundary(cell: &DomainCell, cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc, found: usize) -> c_int {
    // This path never calls the device's op again (a CQ unmanaged meanwhile gets the device's answer as it is);
    // `route_lookup`, which finds the op of the CQ's context, stands for it.
    // SAFETY: the caller's promise.
    catch_unwind(AssertUnwindSafe(|| unsafe { poll_managed(cell, route_lookup, cq, n, wc, Some(found)) })).unwrap_or(-libc::EIO)
}

/// Polls a managed CQ through sqdisc, under its domain's lock; with `found`, the device's op was called already
/// and put that many CQEs in `wc`.
///
/// # Safety
/// As for [`poll_cq`]; `original` is the provider's op for `cq`.
#[inline(always)]
unsafe fn poll_managed(cell: &DomainCell, original: PollFn, cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc, found: Option<usize>) -> c_int {
    // CQEs found by the device's op are in `wc`, of `n` >= `found` > 0 entries: nothing to check.
    if found.is_none() && (n <= 0 || wc.is_null()) {
        return 0;
    }
    // SAFETY: `wc` holds `n` writable entries (caller's promise), `n` > 0 (checked, or the device's op found CQEs).
    let out = unsafe { std::slice::from_raw_parts_mut(wc, n as usize) };
    let held = cell.lock();
    let state = held.borrow();
    let Some(m) = state.cq(cq) else {
        drop(state);
        drop(held);
        return match found {
            // Unmanaged in the meantime: the device's answer as it is.
            Some(k) => k as c_int,
            // SAFETY: unmanaged in the meantime: the provider's own op.
            None => unsafe { original(cq, n, wc) },
        };
    };
    let result = match found {
        None => {
            let mut k = take_pending(&m.pending, out);
            if k < out.len() {
                match m.sqd.poll(&mut out[k..]) {
                    Ok(got) => k += got,
                    Err(e) if k == 0 => {
                        m.update_gate();
                        return -e.errno();
                    }
                    Err(_) => {}
                }
                // Flushes owed for WRs that never reached the SQ come after the CQEs that made them due.
                k += take_pending(&m.pending, &mut out[k..]);
            }
            k as c_int
        }
        Some(got) if m.pending.borrow().is_empty() => match m.sqd.poll_found(out, got) {
            Ok(mut k) => {
                k += take_pending(&m.pending, &mut out[k..]);
                k as c_int
            }
            Err(e) => -e.errno(),
        },
        Some(got) => found_after_owed(m, out, got),
    };
    if result > 0 {
        m.book.scan(&m.sqd, &out[..result as usize]);
    }
    m.update_gate();
    result
}

/// [`poll_managed`]'s CQEs found while completions were owed before them (owed by another thread's flush since
/// the poll's check): they go first, then these, then what these made due.
#[cold]
#[inline(never)]
fn found_after_owed(m: &crate::domain::ManagedCq, out: &mut [ibv_wc], got: usize) -> c_int {
    let owed_before = m.pending.borrow().len();
    match m.sqd.poll_found(out, got) {
        Ok(k) => {
            // SAFETY: `ibv_wc` is plain C data (no destructor, no pointers owned): a bitwise copy is a copy.
            let seen: Vec<ibv_wc> = out[..k].iter().map(|w| unsafe { std::ptr::read(w) }).collect();
            {
                let mut p = m.pending.borrow_mut();
                let newer: Vec<ibv_wc> = p.drain(owed_before..).collect();
                p.extend(seen);
                p.extend(newer);
            }
            take_pending(&m.pending, out) as c_int
        }
        Err(e) => -e.errno(),
    }
}

#[inline(always)]
fn take_pending(pending: &crate::domain::Pending, out: &mut [ibv_wc]) -> usize {
    let mut p = pending.borrow_mut();
    if p.is_empty() {
        return 0;
    }
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

    /// The tests share the process-wide tables: one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    static DEVICE_POLLS: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn device_poll(_cq: *mut ibv_cq, _n: c_int, _wc: *mut ibv_wc) -> c_int {
        DEVICE_POLLS.fetch_add(1, Ordering::Relaxed);
        0
    }

    /// A device context with the device's poll op, and CQs of it (zeroed verbs structures, as far as this
    /// module reads them).
    struct Device {
        ctx: Box<ibv_context>,
        #[allow(clippy::vec_box)] // the CQs keep their addresses while the vector grows
        cqs: Vec<Box<ibv_cq>>,
    }

    impl Device {
        fn new(cqs: usize) -> Device {
            // SAFETY: plain C structures; all zeroes is a valid value.
            let mut ctx: Box<ibv_context> = Box::new(unsafe { std::mem::zeroed() });
            ctx.ops.poll_cq = Some(device_poll);
            let mut d = Device { ctx, cqs: Vec::new() };
            for _ in 0..cqs {
                // SAFETY: as above.
                let mut cq: Box<ibv_cq> = Box::new(unsafe { std::mem::zeroed() });
                cq.context = &mut *d.ctx;
                d.cqs.push(cq);
            }
            d
        }

        fn cq(&mut self, i: usize) -> *mut ibv_cq {
            &mut *self.cqs[i]
        }

        /// `ibv_poll_cq`, as libibverbs' inline function does it.
        fn poll(&mut self, i: usize) -> c_int {
            let cq = self.cq(i);
            let mut wc = [0u8; std::mem::size_of::<ibv_wc>()];
            // SAFETY: the context's op, with a live CQ of it and room for one entry.
            unsafe { ((*(*cq).context).ops.poll_cq.expect("an op"))(cq, 1, wc.as_mut_ptr().cast()) }
        }

        fn patched(&self) -> bool {
            self.ctx.ops.poll_cq.map(|f| f as usize) == Some(poll_cq as PollFn as usize)
        }
    }

    fn cell_of(cq: *mut ibv_cq) -> Option<*const DomainCell> {
        read_snapshot(|snap| snap?.cq(cq as usize)?.cell.as_ref().map(Arc::as_ptr))
    }

    /// Contexts are patched while they have a managed CQ and put back after, with no limit on how many a
    /// process goes through: 1,000 live at once, then 1,000 more one after the other.
    #[test]
    fn contexts_come_and_go_without_limit() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let domain = Domain::new();
        let mut devices: Vec<Device> = (0..1000).map(|_| Device::new(2)).collect();
        for d in &mut devices {
            // SAFETY: a live CQ of a live context, unmanaged below before either goes.
            unsafe { manage(d.cq(0), &domain) }.expect("managed");
            assert!(d.patched());
        }
        assert_eq!(counts(), (1000, 1000));
        let before = DEVICE_POLLS.load(Ordering::Relaxed);
        for d in &mut devices {
            // The managed CQ reaches the device through the domain (which has no sqdisc CQ for it here: the
            // device's op); the other CQ straight.
            assert_eq!(d.poll(0), 0);
            assert_eq!(d.poll(1), 0);
            assert_eq!(cell_of(d.cq(0)), Some(Arc::as_ptr(domain.cell())));
            assert_eq!(cell_of(d.cq(1)), None);
        }
        assert_eq!(DEVICE_POLLS.load(Ordering::Relaxed) - before, 2000);
        for d in &mut devices {
            unmanage(d.cq(0));
            assert!(!d.patched(), "the context's poll_cq is put back with its last managed CQ");
            assert_eq!(d.poll(1), 0);
        }
        assert_eq!(counts(), (0, 0));
        drop(devices);
        for _ in 0..1000 {
            let mut d = Device::new(1);
            // SAFETY: as above.
            unsafe { manage(d.cq(0), &domain) }.expect("managed");
            assert_eq!(d.poll(0), 0);
            unmanage(d.cq(0));
            assert!(!d.patched());
        }
        assert_eq!(counts(), (0, 0));
    }

    /// Pollers on two threads poll managed and unmanaged CQs through their contexts' `poll_cq` (routes, the
    /// buckets' static slots and turns, the snapshot) while a third thread makes CQs managed and unmanaged on
    /// devices that come and go (contexts patched and put back, owner records and snapshots reclaimed): every
    /// poll reaches the device. Run under ThreadSanitizer too (docs/testing.md).
    #[test]
    fn polls_stay_exact_while_cqs_and_devices_come_and_go() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let domain = Domain::new();
        let mut stable = Device::new(8);
        let mut plain = Device::new(4);
        for i in 0..8 {
            // SAFETY: live CQs of a live context, unmanaged below before either goes.
            unsafe { manage(stable.cq(i), &domain) }.expect("managed");
        }
        let stable_cqs: Vec<usize> = (0..8).map(|i| stable.cq(i) as usize).collect();
        let plain_cqs: Vec<usize> = (0..4).map(|i| plain.cq(i) as usize).collect();
        let stop = AtomicBool::new(false);
        let poll_raw = |cq: usize| {
            let cq = cq as *mut ibv_cq;
            let mut wc = [0u8; std::mem::size_of::<ibv_wc>()];
            // SAFETY: `ibv_poll_cq` as libibverbs inlines it: the context's op (read as one word: the writer
            // replaces it atomically), a live CQ, room for one entry.
            unsafe {
                let op = (*std::ptr::addr_of!((*(*cq).context).ops.poll_cq).cast::<AtomicUsize>()).load(Ordering::Acquire);
                std::mem::transmute::<usize, PollFn>(op)(cq, 1, wc.as_mut_ptr().cast())
            }
        };
        let polled = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mut rounds = 0u64;
                    while !stop.load(Ordering::Relaxed) || rounds == 0 {
                        for &k in stable_cqs.iter().chain(&plain_cqs) {
                            assert_eq!(poll_raw(k), 0);
                            polled.fetch_add(1, Ordering::Relaxed);
                        }
                        rounds += 1;
                    }
                });
            }
            for round in 0..200 {
                let mut d = Device::new(4);
                let other = Domain::new();
                for i in 0..4 {
                    // SAFETY: as above.
                    unsafe { manage(d.cq(i), if i % 2 == 0 { &domain } else { &other }) }.expect("managed");
                }
                for i in 0..4 {
                    assert_eq!(d.poll(i), 0);
                    unmanage(d.cq((i + round) % 4));
                }
                assert!(!d.patched());
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert!(polled.load(Ordering::Relaxed) >= 24);
        for i in 0..8 {
            assert_eq!(stable.poll(i), 0);
            unmanage(stable.cq(i));
        }
        assert!(!stable.patched());
        assert_eq!(plain.poll(0), 0);
        assert_eq!(counts(), (0, 0));
    }

    /// Pollers on other threads find every CQ that stays managed, and none that never was, while other CQs
    /// and their contexts come and go under them (snapshots replaced and reclaimed, entries put back).
    #[test]
    fn lookups_stay_exact_while_cqs_and_contexts_come_and_go() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let domain = Domain::new();
        let mut stable = Device::new(8);
        let mut absent = Device::new(8);
        for i in 0..8 {
            // SAFETY: live CQs of a live context, unmanaged below before either goes.
            unsafe { manage(stable.cq(i), &domain) }.expect("managed");
        }
        let stable_cqs: Vec<usize> = (0..8).map(|i| stable.cq(i) as usize).collect();
        let absent_cqs: Vec<usize> = (0..8).map(|i| absent.cq(i) as usize).collect();
        let stop = AtomicBool::new(false);
        let cell = Arc::as_ptr(domain.cell()) as usize;
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mut rounds = 0u64;
                    while !stop.load(Ordering::Relaxed) || rounds == 0 {
                        for &k in &stable_cqs {
                            assert_eq!(cell_of(k as *mut ibv_cq).map(|c| c as usize), Some(cell), "lost {k:#x}");
                        }
                        for &k in &absent_cqs {
                            assert!(cell_of(k as *mut ibv_cq).is_none(), "found {k:#x}");
                        }
                        rounds += 1;
                    }
                });
            }
            for round in 0..100 {
                let mut d = Device::new(6);
                let other = Domain::new();
                for i in 0..6 {
                    // SAFETY: as above.
                    unsafe { manage(d.cq(i), if i % 2 == 0 { &domain } else { &other }) }.expect("managed");
                }
                for i in 0..6 {
                    assert_eq!(d.poll(i), 0);
                    unmanage(d.cq((i + round) % 6));
                }
                assert!(!d.patched());
            }
            stop.store(true, Ordering::Relaxed);
        });
        for i in 0..8 {
            unmanage(stable.cq(i));
            assert!(cell_of(stable.cq(i)).is_none());
        }
        assert!(!stable.patched());
        assert_eq!(absent.poll(0), 0);
        assert_eq!(counts(), (0, 0));
    }
}
