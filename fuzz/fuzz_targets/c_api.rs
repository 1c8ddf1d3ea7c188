//! Fuzz target `c_api`: arbitrary programs of calls into the public C API, on the scripted device or the
//! software HCA.
//!
//! The input decodes (with `arbitrary`) into a device, two CQs, four QPs and a list of operations: queues made
//! with good and bad attributes, WR chains with bad opcodes, flags, SGE counts, NULL SGE lists, overlong inline
//! data and up to 256 WRs, receives, polls and arms with odd `max` values, drains, frees (that must succeed or
//! must return -EBUSY), deferred actions, invalidations, MR tracking, async events of every type, NULL and
//! malformed arguments, and calls made again from inside release callbacks; queues with a batch release
//! callback (`sqd_queue_set_release_batch`, or on the odd slots `sqd_queue_set_release_failures`, set at
//! creation or later) and queues made with
//! `SQD_QUEUE_NO_RESTORE` or `SQD_QUEUE_INDEXED`; on the software HCA also a managed SRQ that some QPs receive from (posted to,
//! released, failed, freed in every order). Every call goes through the symbols declared by include/*.h.
//!
//! Checked after every call: the result is 0, a count, or a negative errno of the documented set, and a
//! failure leaves a new, non-empty `sqd_last_error()`. Checked along the way: releases come once per accepted
//! WR, in post order per queue, per WR or in non-empty batches alike (a failures-only queue's successes counted
//! from its `released`, each as the next WR it owes, and never in a batch); the statuses of a queue's sends are
//! successes, then at most one error, then flushes, and each agrees with the WR's completion when `sqd_cq_poll`
//! or `sqd_cq_arm` returns one; `sqd_queue_set_release_batch` refuses a second call, a queue without `release`
//! and calls from the queue's own callbacks; a deferred action runs once, when what it waits for is released;
//! `*bad_wr` and the ULP's chain after `sqd_post_send` (with `SQD_QUEUE_NO_RESTORE`, of the accepted WRs only
//! the links; with `SQD_QUEUE_INDEXED`, no wr_id); frees refuse exactly while something is outstanding;
//! completions returned for a managed QP carry the ULP's own wr_ids (an indexed queue's sends: the index of
//! one it accepted); each batch starts at the count of the queue's send releases before it; an indexed
//! queue's releases carry the index that count gives and its batches no wr_ids; an SRQ receive is released once, by the SRQ. Checked at the end, after teardown
//! (QPs to error, drain, poll, free): every accepted WR, receive and invalidation was released exactly once,
//! the queues' counters agree, every object frees, and, when the program told the library only the truth, the
//! device saw no SQ overflow or CQ overrun. AddressSanitizer and LeakSanitizer watch the whole run; a panic
//! anywhere aborts.
#![no_main]

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_void, CStr};
use std::ptr::{self, null, null_mut};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
// The library itself: linked so that its exported sqd_* symbols resolve the declarations below.
use sqdisc as _;
use sqdisc_sim as _;

#[allow(non_camel_case_types, non_upper_case_globals, non_snake_case, dead_code, clippy::all)]
mod ffi {
    include!(concat!(env!("OUT_DIR"), "/capi.rs"));
}
use ffi::*;

const NQ: usize = 4;
const BUF: usize = 1 << 16;
const WC: usize = 64;
const MAX_CHAIN: usize = 256;

// ---- the program --------------------------------------------------------------------------------------------

#[derive(Arbitrary, Debug)]
struct Program {
    device: Device,
    cqe: [u8; 2],
    thread_safe: [bool; 2],
    qps: [QpSpec; NQ],
    /// On the sim: an SRQ, and which QP of each connected pair receives from it.
    srq: Option<SrqSpec>,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
struct SrqSpec {
    max_wr: u8,
    /// QP 1 (of pair 0, 1) and QP 3 (of pair 2, 3) take their receives from the SRQ.
    attach: [bool; 2],
}

/// Calls made from inside the SRQ's release callback.
#[derive(Arbitrary, Debug, Clone, Copy, Default)]
enum SrqReentry {
    #[default]
    Nothing,
    Refill,
    FreeSelf,
    ReleaseAll,
    Stats,
}

#[derive(Arbitrary, Debug)]
enum Device {
    Scripted,
    Sim { seed: u8, loss_ppm: u16, ack_loss_ppm: u16, null_mode: bool, steps_per_poll: u8 },
}

#[derive(Arbitrary, Debug)]
struct QpSpec {
    send_cq: bool,
    recv_cq: bool,
    sq: u8,
    rq: u8,
    sge: u8,
    inline: u8,
}

/// A number for an attribute: usually what the QP was granted, sometimes anything.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Num {
    Granted,
    Zero,
    Small(u8),
    Any(u32),
}

impl Num {
    fn get(self, granted: u32) -> u32 {
        match self {
            Num::Granted => granted,
            Num::Zero => 0,
            Num::Small(n) => u32::from(n % 70),
            Num::Any(n) => n,
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum CqSel {
    Own,
    Other,
    Null,
}

#[derive(Arbitrary, Debug, Clone, Copy, Default)]
enum Reentry {
    #[default]
    Nothing,
    PostSame,
    PollSame,
    PollOther,
    FreeSelf,
    FreeCq,
    Drain,
    Defer,
    Invalidate,
    Fatal,
    Stats,
    PostRecv,
}

#[derive(Arbitrary, Debug)]
struct AttrSpec {
    sq: Num,
    sge: Num,
    inline: Num,
    rq: Num,
    manage_recv: bool,
    signal_interval: Num,
    backlog: u8,
    /// `attr.flags`: bits 0 to 2 (`SQD_QUEUE_VERIFY_BUFFERS`, `SQD_QUEUE_NO_RESTORE`, `SQD_QUEUE_INDEXED`), or
    /// all 32 bits with `any_flags`. Bit 7 ([`ATTR_BATCH`]) is no queue flag: it gives the queue a batch release
    /// callback.
    flags: u32,
    any_flags: bool,
    send_cq: CqSel,
    recv_cq: CqSel,
    no_release: bool,
    reentry: Reentry,
    /// Name the managed SRQ in `attr.srq`.
    use_srq: bool,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum MaxSel {
    Small(u8),
    Zero,
    Negative(i32),
    NullWc(i32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum EvSel {
    Known(u8),
    Any(u32),
}

impl EvSel {
    fn get(self) -> u32 {
        match self {
            EvSel::Known(n) => u32::from(n % 22),
            EvSel::Any(n) => n,
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum OpSel {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    CmpSwap,
    FetchAdd,
    LocalInv,
    BindMw,
    SendInv,
    Raw(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum NsgeSel {
    Count(u8),
    Raw(i32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct SgeSpec {
    off: u16,
    len: u16,
    bad_key: bool,
}

#[derive(Arbitrary, Debug, Clone)]
struct WrSpec {
    op: OpSel,
    /// Bit 0 signaled, 1 inline, 2 fence, 3 solicited.
    flags: u8,
    unknown_flags: Option<u32>,
    nsge: NsgeSel,
    sges: [SgeSpec; 2],
    null_list: bool,
    imm: u32,
    remote_off: u16,
}

#[derive(Arbitrary, Debug, Clone)]
struct RecvSpec {
    nsge: NsgeSel,
    sge: SgeSpec,
    null_list: bool,
}

#[derive(Arbitrary, Debug)]
enum DevOp {
    Complete { qp: u8, n: u8 },
    Fail { qp: u8, status: u8, vendor_err: u32 },
    SetError { qp: u8 },
    Deliver { qp: u8, len: u16, imm: Option<u32> },
    Step { n: u8 },
    Fault { qp: u8, kind: u8, count: u8, status: u8 },
    Events,
    SrqError,
}

#[derive(Arbitrary, Debug)]
enum Op {
    NewQueue { slot: u8, attr: AttrSpec },
    FreeQueue { slot: u8 },
    PostSend { slot: u8, wrs: Vec<WrSpec>, repeat: u8 },
    PostRecv { slot: u8, wrs: Vec<RecvSpec> },
    Poll { cq: u8, max: MaxSel },
    Arm { cq: u8, solicited: bool, max: MaxSel },
    Drain { slot: u8 },
    Defer { slot: u8 },
    DeferMr { slot: u8 },
    Track { slot: u8, untrack: bool },
    DeferDereg { slot: u8, off: u16, len: u16 },
    Invalidate { slot: u8, rkey: u32, flags: u32, done: bool },
    QueueEvent { slot: u8, ev: EvSel },
    CqEvent { cq: u8, ev: EvSel },
    Dev(DevOp),
    Stats { slot: u8 },
    Bad { which: u8, arg: u32 },
    CqFree { cq: u8 },
    CqNew { cq: u8, flags: u32 },
    DepthFor { plans: Vec<(u32, u32)>, null_plans: bool, null_out: bool },
    /// Bit 7 of `slot` ([`SET_BATCH`]) also calls `sqd_queue_set_release_batch` on the queue, now.
    SetReentry { slot: u8, reentry: Reentry },
    SrqNew { depth: Num, low_watermark: u8, flags: u32, no_release: bool, reentry: SrqReentry },
    SrqFree,
    SrqPostRecv { wrs: Vec<RecvSpec> },
    SrqReleaseAll,
    SrqStats,
}

// ---- the world: the objects made and the model of what the library owes -----------------------------------

const KIND_SEND: u64 = 1;
const KIND_RECV: u64 = 2;
const KIND_INV: u64 = 3;
const KIND_SRQ: u64 = 4;
/// The slot field of SRQ receives' wr_ids (queue slots are 0..NQ).
const SRQ_SLOT: usize = 0xf;
/// The most SGE checksums (`sq_depth + backlog_depth` times `max_send_sge`) a queue made with
/// `SQD_QUEUE_VERIFY_BUFFERS` may need; a queue that would need more is made without it. The library allocates
/// them at creation (24 bytes each, rounded up to a power of two of WRs), and one queue near the limits would
/// take more memory than libFuzzer allows the whole run (2 GB).
const MAX_VERIFY_CHECKSUMS: u64 = 1 << 21;
/// The bit of `AttrSpec::flags` that makes `new_queue` set a batch release callback on the queue it made.
const ATTR_BATCH: u32 = 0x80;
/// The bit of `Op::SetReentry`'s slot that sets a batch release callback on the live queue (also later than
/// its creation, with WRs outstanding; or a second time, which must be refused).
const SET_BATCH: u8 = 0x80;

fn make_id(kind: u64, slot: usize, seq: u64) -> u64 {
    kind << 60 | (slot as u64) << 56 | seq
}

fn split_id(id: u64) -> (u64, usize, u64) {
    (id >> 60, ((id >> 56) & 0xf) as usize, id & ((1 << 56) - 1))
}

#[derive(Default)]
struct Slot {
    qp: *mut ibv_qp,
    send_cq: usize,
    recv_cq: usize,
    caps: (u32, u32, u32, u32), // max_send_wr, max_recv_wr, max_send_sge, max_inline_data
    q: *mut sqd_queue,
    /// The queue's attributes match what the QP was granted (so the device must never be overrun).
    honest: bool,
    manages_recv: bool,
    uses_cqs: [bool; 2],
    /// A CQE may still come for a WQE the library has already given back (after an async event told it to
    /// release everything, or a queue freed after one): completions of this QP are not checked any more.
    tainted: bool,
    reentry: Reentry,
    /// Made without a release callback: its releases cannot be seen, only counted by the queue.
    blind: bool,
    /// `sqd_queue_set_release_batch` (or `sqd_queue_set_release_failures`) succeeded: common send releases may
    /// come in batches.
    batched: bool,
    /// The batch callback was set with `sqd_queue_set_release_failures` (the odd slots): successes may be
    /// released without a call, seen only in `released` (`catch_up`).
    quiet: bool,
    /// `sqd_invalidate` was called on the queue: its LocalInvs count in `sqd_queue_stats.released`, so its
    /// quiet successes could not be counted from it; such a queue is not made quiet, and a quiet one takes no
    /// invalidation.
    ever_invalidated: bool,
    /// Made with `SQD_QUEUE_VERIFY_BUFFERS`: every release goes to `release`, none in a batch.
    verifies: bool,
    /// Made with `SQD_QUEUE_NO_RESTORE` (or `SQD_QUEUE_INDEXED`): of the WRs `sqd_post_send` accepted, only
    /// `next` is restored.
    no_restore: bool,
    /// Made with `SQD_QUEUE_INDEXED`: sends are named by their index, no wr_id is restored.
    indexed: bool,
    /// The wr_id of each send WR the queue accepted, by index.
    ids: Vec<u64>,
    /// The statuses of the queue's send releases so far (per-WR and batched alike).
    send_order: StatusOrder,
    /// A send's status as its release or `sqd_cq_poll` gave it, whichever came first, until the other comes:
    /// the two must agree (a batch's one status is each of its WRs' own).
    send_statuses: HashMap<u64, SeenStatus>,
    next_seq: u64,
    sends: VecDeque<u64>,
    accepted: u64,
    released: u64,
    recvs: VecDeque<u64>,
    invs: Vec<u64>,
    defers: u64,
    tracked: bool,
    /// The QP receives from the SRQ.
    on_srq: bool,
    /// The queue was made with `attr.srq`: it is attached to the managed SRQ.
    srq_attached: bool,
}

/// The order in which an RC requester completes a queue's sends, and so the order of their release statuses:
/// successes, then at most one error, then only flushes. A WR the provider refused when the library posted it
/// from the backlog (`SQD_COMPLETION_REFUSED`) stands outside it: the queue stays open after one.
#[derive(Default)]
struct StatusOrder {
    /// The first status other than success released so far.
    first_failure: Option<u32>,
}

impl StatusOrder {
    fn next(&mut self, slot: usize, wr_id: u64, status: u32) {
        let Some(first) = self.first_failure else {
            if status != IBV_WC_SUCCESS {
                self.first_failure = Some(status);
            }
            return;
        };
        let after = if first == IBV_WC_WR_FLUSH_ERR { "a flush" } else { "an error" };
        assert!(status != IBV_WC_SUCCESS, "slot {slot}: wr_id {wr_id:#x} released as a success after {after} ({first})");
        assert!(status == IBV_WC_WR_FLUSH_ERR, "slot {slot}: wr_id {wr_id:#x} released with error {status} after {after} ({first})");
    }
}

/// Where a send's status was seen first.
#[derive(Clone, Copy, Debug, PartialEq)]
enum SeenStatus {
    Released(u32),
    Polled(u32),
}

/// A send's status, seen at its release or in a completion that `sqd_cq_poll` or `sqd_cq_arm` returned: the
/// first sighting is kept, the second must agree with it. A WR has at most one completion the ULP sees (its
/// own CQE: signaled, or an error or flush), and none if it was refused or released as never posted.
fn see_status(s: &mut Slot, slot: usize, wr_id: u64, seen: SeenStatus) {
    use std::collections::hash_map::Entry;
    match s.send_statuses.entry(wr_id) {
        Entry::Vacant(e) => {
            e.insert(seen);
        }
        Entry::Occupied(e) => {
            let (released, polled) = match (*e.get(), seen) {
                (SeenStatus::Released(r), SeenStatus::Polled(p)) | (SeenStatus::Polled(p), SeenStatus::Released(r)) => (r, p),
                (first, _) => panic!("slot {slot}: wr_id {wr_id:#x} seen twice: {first:?}, then {seen:?}"),
            };
            assert_eq!(released, polled, "slot {slot}: wr_id {wr_id:#x} released with status {released}, its completion has {polled}");
            e.remove();
        }
    }
}

/// The managed SRQ and what it owes.
struct SrqModel {
    raw: *mut ibv_srq,
    granted: u32,
    handle: Cell<*mut sqd_srq>,
    depth: Cell<u32>,
    low_watermark: Cell<u32>,
    blind: Cell<bool>,
    reentry: Cell<SrqReentry>,
    /// Posted and not yet released (released in any order).
    recvs: RefCell<Vec<u64>>,
    next_seq: Cell<u64>,
    /// Inside the SRQ's release callback.
    releasing: Cell<bool>,
    /// `sqd_srq_release_all` gave back receives the device still holds: the handle takes no more receives or
    /// queues, and the `ibv_srq` may not be managed again (the header's rule).
    retired: Cell<bool>,
}

struct World {
    scripted: *mut sqd_scripted,
    sim: *mut sqd_sim,
    raw_cq: [*mut ibv_cq; 2],
    cq: [Cell<*mut sqd_cq>; 2],
    polling: [Cell<bool>; 2],
    slots: [RefCell<Slot>; NQ],
    buf: *mut u8,
    mr: *mut ibv_mr,
    wc: RefCell<Vec<ibv_wc>>,
    /// Every queue told the truth and no async event was invented: the device must see no overflow.
    truthful: Cell<bool>,
    depth: Cell<u32>,
    in_teardown: Cell<bool>,
    srq: Option<SrqModel>,
}

thread_local! {
    static WORLD: Cell<*const World> = const { Cell::new(null()) };
}

fn world<'a>() -> &'a World {
    let p = WORLD.with(Cell::get);
    assert!(!p.is_null(), "a callback ran outside a program");
    // SAFETY: set by `run` to a World that outlives every call into the library made while it is set; the
    // World is only ever accessed through shared references (its mutable parts are Cells and RefCells).
    unsafe { &*p }
}

// ---- every call's result ------------------------------------------------------------------------------------

const SENTINEL: &str = "dev is NULL";

/// Leaves a known message in `sqd_last_error()`, so that a failing call that leaves none is noticed.
fn sentinel() {
    // SAFETY: a NULL device is refused before anything is read. No call this target checks names a NULL device.
    let rc = unsafe { sqd_scripted_violation(null(), 0, null_mut(), 0) };
    assert_eq!(rc, -libc::EINVAL);
}

fn last_error() -> String {
    // SAFETY: sqd_last_error never returns NULL and the string is valid until the next failing call.
    unsafe { CStr::from_ptr(sqd_last_error()) }.to_string_lossy().into_owned()
}

const ERRNOS: &[i32] = &[
    libc::EINVAL,
    libc::EBUSY,
    libc::EAGAIN,
    libc::EIO,
    libc::ENOSPC,
    libc::EINPROGRESS,
    libc::ENOENT,
    libc::EEXIST,
    libc::EOPNOTSUPP,
    libc::ENOMEM,
];

/// Runs one library call between a sentinel and the checks every call must pass.
fn call(what: &str, f: impl FnOnce() -> i32) -> i32 {
    sentinel();
    let rc = f();
    if rc < 0 {
        let msg = last_error();
        assert!(ERRNOS.contains(&-rc), "{what} returned {rc}, not a documented errno ({msg})");
        assert!(!msg.is_empty(), "{what} returned {rc} and left no message");
        assert!(msg != SENTINEL, "{what} returned {rc} and left no message of its own");
        assert!(!msg.contains("panic"), "{what}: {msg}");
    }
    rc
}

fn expect(what: &str, want: i32, f: impl FnOnce() -> i32) {
    let rc = call(what, f);
    assert_eq!(rc, want, "{what} returned {rc}, expected {want} ({})", last_error());
}

// ---- callbacks ------------------------------------------------------------------------------------------------

unsafe extern "C" fn on_release(ctx: *mut c_void, c: *const sqd_completion) {
    let slot = ctx as usize;
    // SAFETY: the library passes a completion valid for the duration of the call.
    let c = unsafe { &*c };
    let w = world();
    let reentry = {
        let mut s = w.slots[slot].borrow_mut();
        let recv = c.flags & SQD_COMPLETION_RECV != 0;
        if s.quiet && !recv {
            // The successes released without a call before this WR.
            let upto = if s.indexed {
                c.wr_id
            } else {
                let at = s.sends.iter().position(|&id| id == c.wr_id);
                s.released + at.unwrap_or_else(|| panic!("slot {slot}: released wr_id {:#x}, not outstanding", c.wr_id)) as u64
            };
            catch_up(&mut s, slot, upto);
        }
        let wr_id = if s.indexed && !recv { wr_id_of_index(&s, slot, c.wr_id) } else { c.wr_id };
        let (kind, from, _) = split_id(wr_id);
        assert_eq!(from, slot, "slot {slot} released wr_id {wr_id:#x} of another queue");
        if recv {
            assert_eq!(kind, KIND_RECV, "a receive release with wr_id {wr_id:#x}");
            let front = s.recvs.pop_front();
            assert_eq!(front, Some(wr_id), "slot {slot}: receive released out of order or twice");
        } else {
            release_send(&mut s, slot, wr_id, c.status, c.flags & SQD_COMPLETION_REFUSED != 0);
        }
        if c.flags & SQD_COMPLETION_REFUSED != 0 {
            // A parked WR the provider refused when the library posted it.
            assert!(c.flags & SQD_COMPLETION_NEVER_POSTED != 0, "a refused release not marked never posted");
            assert_eq!(c.status, IBV_WC_LOC_QP_OP_ERR, "a refused release with status {}", c.status);
            assert!(c.vendor_err != 0, "a refused release without the provider's errno");
        } else if c.flags & SQD_COMPLETION_NEVER_POSTED != 0 {
            assert_eq!(c.status, IBV_WC_WR_FLUSH_ERR, "a never-posted release with status {}", c.status);
        }
        s.reentry
    };
    reenter_once(slot, reentry);
}

/// The wr_id of the send an indexed queue releases with `index`: the next one it owes (releases come once each
/// in post order), of those it accepted.
fn wr_id_of_index(s: &Slot, slot: usize, index: u64) -> u64 {
    assert_eq!(index, s.released, "slot {slot}: a send release with index {index} after {} send releases", s.released);
    *s.ids.get(index as usize).unwrap_or_else(|| panic!("slot {slot}: a send release with index {index}, of {} accepted", s.ids.len()))
}

/// What every release of a send WR owes, whether it comes to `release` or in a batch: it is the queue's oldest
/// outstanding WR (so each is released once, in post order), and its status keeps the queue's status order.
fn release_send(s: &mut Slot, slot: usize, wr_id: u64, status: u32, refused: bool) {
    let (kind, from, _) = split_id(wr_id);
    assert_eq!(from, slot, "slot {slot} released wr_id {wr_id:#x} of another queue");
    assert_eq!(kind, KIND_SEND, "a send release with wr_id {wr_id:#x}");
    let front = s.sends.pop_front();
    assert_eq!(front, Some(wr_id), "slot {slot}: send released out of order or twice");
    s.released += 1;
    if !refused {
        s.send_order.next(slot, wr_id, status);
        see_status(s, slot, wr_id, SeenStatus::Released(status));
    }
}

/// A quiet queue's successes released without a call before the send release of index `upto`: each is the
/// queue's oldest outstanding WR, released as a success.
fn catch_up(s: &mut Slot, slot: usize, upto: u64) {
    assert!(s.quiet || upto == s.released, "slot {slot}: a send release of index {upto} after {} send releases", s.released);
    while s.released < upto {
        let id = *s.sends.front().unwrap_or_else(|| panic!("slot {slot}: released up to index {upto}, of {} accepted", s.ids.len()));
        release_send(s, slot, id, IBV_WC_SUCCESS, false);
    }
}

/// Outside the callbacks: a quiet queue's successes released without a call, counted from the queue's own
/// `released` (a quiet queue has no LocalInv: `ever_invalidated`).
fn sync_quiet(slot: usize) {
    let w = world();
    let (q, quiet) = {
        let s = w.slots[slot].borrow();
        (s.q, s.quiet)
    };
    // Inside a callback a pass of the queue may be under way: `released` may count releases still to come.
    // (Teardown runs at depth 1 to stop re-entry, but from the top: no callback of it calls this.)
    if q.is_null() || !quiet || (w.depth.get() != 0 && !w.in_teardown.get()) {
        return;
    }
    let mut st = sqd_queue_stats::default();
    // SAFETY: a live queue and a valid out struct.
    expect("sqd_queue_stats", 0, || unsafe { sqd_queue_stats(q, &mut st) });
    let mut s = w.slots[slot].borrow_mut();
    catch_up(&mut s, slot, st.released);
}

unsafe extern "C" fn on_release_batch(ctx: *mut c_void, b: *const sqd_release_batch) {
    let slot = ctx as usize;
    // SAFETY: the library passes a batch valid for the duration of the call.
    let b = unsafe { &*b };
    assert!(b.count >= 1, "slot {slot}: an empty release batch");
    assert!(b.status != IBV_WC_SUCCESS || b.vendor_err == 0, "slot {slot}: a batch of successes with vendor_err {:#x}", b.vendor_err);
    let w = world();
    let reentry = {
        let mut s = w.slots[slot].borrow_mut();
        assert!(s.batched, "slot {slot}: a release batch on a queue without a batch callback");
        assert!(!s.verifies, "slot {slot}: a release batch on a queue that verifies buffers");
        assert!(!s.quiet || b.status != IBV_WC_SUCCESS, "slot {slot}: a batch of successes for a callback of failures only");
        catch_up(&mut s, slot, b.first);
        assert_eq!(b.first, s.released, "slot {slot}: a release batch from index {} after {} send releases", b.first, s.released);
        let ids: Vec<u64> = if s.indexed {
            assert!(b.wr_ids.is_null(), "slot {slot}: an indexed queue's release batch with wr_ids");
            let range = b.first as usize..(b.first + u64::from(b.count)) as usize;
            s.ids.get(range).unwrap_or_else(|| panic!("slot {slot}: a release batch of {} from index {}, of {} accepted", b.count, b.first, s.ids.len())).to_vec()
        } else {
            assert!(!b.wr_ids.is_null(), "slot {slot}: a release batch of {} without wr_ids", b.count);
            // SAFETY: `wr_ids` holds `count` wr_ids, valid for the duration of the call.
            unsafe { std::slice::from_raw_parts(b.wr_ids, b.count as usize) }.to_vec()
        };
        // A batch carries posted WRs only (never refused ones): each wr_id passes every check of `release`.
        for id in ids {
            release_send(&mut s, slot, id, b.status, false);
        }
        s.reentry
    };
    reenter_once(slot, reentry);
}

/// From a release callback of the queue in `slot` (not from one nested in another callback's calls): the
/// re-entrant calls the program chose for it.
fn reenter_once(slot: usize, reentry: Reentry) {
    let w = world();
    if w.depth.get() == 0 {
        w.depth.set(1);
        reenter(slot, reentry);
        w.depth.set(0);
    }
}

/// `sqd_queue_set_release_batch` from inside one of the queue's own callbacks (a release, a batch, a deferred
/// action): refused (`-EINVAL` first for a queue without `release`), and nothing changes.
fn set_release_batch_inside(slot: usize) {
    let (q, blind) = {
        let s = world().slots[slot].borrow();
        (s.q, s.blind)
    };
    if q.is_null() {
        return;
    }
    let want = if blind { -libc::EINVAL } else { -libc::EBUSY };
    // SAFETY: `q` is live: the library is running one of its callbacks.
    expect("sqd_queue_set_release_batch from the queue's own callback", want, || unsafe {
        sqd_queue_set_release_batch(q, Some(on_release_batch), slot as *mut c_void)
    });
    // SAFETY: as above.
    expect("sqd_queue_set_release_failures from the queue's own callback", want, || unsafe {
        sqd_queue_set_release_failures(q, Some(on_release_batch), slot as *mut c_void)
    });
}

unsafe extern "C" fn on_inv_done(ctx: *mut c_void, c: *const sqd_completion) {
    // SAFETY: `ctx` is the Box leaked for this invalidation by `invalidate`; taken back once (a second call
    // would be a double free, which AddressSanitizer reports).
    let (slot, id) = *unsafe { Box::from_raw(ctx as *mut (usize, u64)) };
    // SAFETY: valid for the duration of the call.
    let c = unsafe { &*c };
    assert_eq!(c.wr_id, id, "invalidation done with another wr_id");
    assert_eq!(c.opcode, IBV_WC_LOCAL_INV, "invalidation done with opcode {}", c.opcode);
    let w = world();
    let mut s = w.slots[slot].borrow_mut();
    let at = s.invs.iter().position(|&i| i == id).expect("invalidation done twice or never asked");
    s.invs.swap_remove(at);
}

unsafe extern "C" fn on_srq_release(_ctx: *mut c_void, c: *const sqd_completion) {
    // SAFETY: the library passes a completion valid for the duration of the call.
    let c = unsafe { &*c };
    let w = world();
    let m = w.srq.as_ref().expect("an SRQ release in a program without an SRQ");
    assert!(c.flags & SQD_COMPLETION_RECV != 0, "an SRQ release without SQD_COMPLETION_RECV");
    let (kind, from, _) = split_id(c.wr_id);
    assert!(kind == KIND_SRQ && from == SRQ_SLOT, "the SRQ released wr_id {:#x}, not one of its receives", c.wr_id);
    if c.flags & SQD_COMPLETION_NEVER_POSTED != 0 {
        assert_eq!(c.status, IBV_WC_WR_FLUSH_ERR, "a never-posted SRQ release with status {}", c.status);
    }
    {
        let mut r = m.recvs.borrow_mut();
        let at = r.iter().position(|&i| i == c.wr_id).expect("an SRQ receive released twice, or never posted");
        r.swap_remove(at);
    }
    let was = m.releasing.replace(true);
    if w.depth.get() == 0 {
        w.depth.set(1);
        srq_reenter(m.reentry.get());
        w.depth.set(0);
    }
    m.releasing.set(was);
}

unsafe extern "C" fn on_srq_low(_ctx: *mut c_void, posted: u32) {
    let m = world().srq.as_ref().expect("an SRQ low-watermark call in a program without an SRQ");
    assert!(posted < m.low_watermark.get(), "the low-watermark call said {posted} posted, not below {}", m.low_watermark.get());
}

struct DeferCtx {
    slot: usize,
    /// Send WRs accepted when the action was registered.
    barrier: u64,
    /// `sqd_defer`: runs exactly when the release count reaches the barrier; `sqd_defer_mr`: at the latest then.
    exact: bool,
    blind: bool,
}

unsafe extern "C" fn on_defer(ctx: *mut c_void) {
    // SAFETY: the Box leaked by `defer`; taken back once (twice would be a double free).
    let d = unsafe { Box::from_raw(ctx as *mut DeferCtx) };
    let w = world();
    let mut s = w.slots[d.slot].borrow_mut();
    if d.blind {
    } else if d.exact {
        // The WRs before the barrier are all released now: a quiet queue's successes among them made no call.
        if s.quiet {
            catch_up(&mut s, d.slot, d.barrier);
        }
        assert_eq!(s.released, d.barrier, "slot {}: a deferred action ran after {} releases, not {}", d.slot, s.released, d.barrier);
    } else {
        assert!(s.released <= d.barrier, "slot {}: a deferred action ran late", d.slot);
    }
    s.defers -= 1;
    drop(s);
    set_release_batch_inside(d.slot);
}

/// Calls made again from inside a release callback.
fn reenter(slot: usize, r: Reentry) {
    let w = world();
    let (q, scq, rcq) = {
        let s = w.slots[slot].borrow();
        (s.q, s.send_cq, s.recv_cq)
    };
    if q.is_null() {
        return;
    }
    if !matches!(r, Reentry::Nothing) {
        set_release_batch_inside(slot);
    }
    match r {
        Reentry::Nothing => {}
        Reentry::PostSame => {
            let spec = WrSpec {
                op: OpSel::Send,
                flags: 0,
                unknown_flags: None,
                nsge: NsgeSel::Count(1),
                sges: [SgeSpec { off: 0, len: 8, bad_key: false }; 2],
                null_list: false,
                imm: 0,
                remote_off: 0,
            };
            post_send(slot, std::slice::from_ref(&spec), 1);
        }
        Reentry::PollSame => poll(scq, MaxSel::Small(3)),
        Reentry::PollOther => poll(1 - scq, MaxSel::Small(3)),
        Reentry::FreeSelf => {
            // SAFETY: `q` is live: the library is running one of its callbacks.
            expect("sqd_queue_free from its own callback", -libc::EBUSY, || unsafe { sqd_queue_free(q) });
        }
        Reentry::FreeCq => {
            // Its receive CQ when the queue is attached there (it may manage no receives), else its send CQ.
            let uses_rcq = w.slots[slot].borrow().uses_cqs[rcq];
            let cq = w.cq[if uses_rcq { rcq } else { scq }].get();
            // SAFETY: a managed CQ with this queue attached (it cannot be freed meanwhile).
            expect("sqd_cq_free of a CQ with a queue", -libc::EBUSY, || unsafe { sqd_cq_free(cq) });
        }
        Reentry::Drain => drain(slot),
        Reentry::Defer => defer(slot, false),
        Reentry::Invalidate => invalidate(slot, 0x77, 0, true),
        Reentry::Fatal => queue_event(slot, IBV_EVENT_QP_FATAL),
        Reentry::Stats => stats(slot),
        Reentry::PostRecv => post_recv(slot, &[RecvSpec { nsge: NsgeSel::Count(1), sge: SgeSpec { off: 0, len: 64, bad_key: false }, null_list: false }]),
    }
}

// ---- operations ----------------------------------------------------------------------------------------------

fn sge_of(w: &World, spec: SgeSpec, upper: bool) -> ibv_sge {
    let half = BUF / 2;
    let len = usize::from(spec.len) % (half + 1);
    let off = usize::from(spec.off) % (half - len + 1) + if upper { half } else { 0 };
    // SAFETY: `mr` is the device MR over `buf`, live for the whole program.
    let lkey = unsafe { (*w.mr).lkey };
    ibv_sge {
        // SAFETY: off + len <= BUF: the SGE lies inside the buffer.
        addr: unsafe { w.buf.add(off) } as u64,
        length: len as u32,
        lkey: if spec.bad_key { lkey ^ 0x5a5a } else { lkey },
    }
}

fn nsge(sel: NsgeSel) -> i32 {
    match sel {
        NsgeSel::Count(n) => i32::from(n % 5),
        NsgeSel::Raw(n) => n,
    }
}

/// SGE storage for `n` SGEs: at least as many as the WR claims, up to the library's own limit, so that an
/// accepted WR never makes the library read past what the caller gave it.
fn sge_count_to_allocate(n: i32) -> usize {
    if n <= 0 {
        1
    } else {
        (n as usize).min(1025)
    }
}

fn opcode(sel: OpSel) -> u32 {
    match sel {
        OpSel::Send => IBV_WR_SEND,
        OpSel::SendImm => IBV_WR_SEND_WITH_IMM,
        OpSel::Write => IBV_WR_RDMA_WRITE,
        OpSel::WriteImm => IBV_WR_RDMA_WRITE_WITH_IMM,
        OpSel::Read => IBV_WR_RDMA_READ,
        OpSel::CmpSwap => IBV_WR_ATOMIC_CMP_AND_SWP,
        OpSel::FetchAdd => IBV_WR_ATOMIC_FETCH_AND_ADD,
        OpSel::LocalInv => IBV_WR_LOCAL_INV,
        OpSel::BindMw => IBV_WR_BIND_MW,
        OpSel::SendInv => IBV_WR_SEND_WITH_INV,
        OpSel::Raw(n) => n,
    }
}

fn post_send(slot: usize, specs: &[WrSpec], repeat: u8) {
    let w = world();
    let (q, first_seq, no_restore) = {
        let s = w.slots[slot].borrow();
        (s.q, s.next_seq, s.no_restore)
    };
    let n = (specs.len() * usize::from(repeat.max(1))).min(MAX_CHAIN);
    if n == 0 || q.is_null() {
        return;
    }
    let mut sges: Vec<Vec<ibv_sge>> = Vec::with_capacity(n);
    let mut wrs: Vec<ibv_send_wr> = Vec::with_capacity(n);
    // SAFETY: the MR is live for the whole program.
    let rkey = unsafe { (*w.mr).rkey };
    for i in 0..n {
        let spec = &specs[i % specs.len()];
        let k = nsge(spec.nsge);
        let read_into = matches!(spec.op, OpSel::Read | OpSel::CmpSwap | OpSel::FetchAdd);
        let list: Vec<ibv_sge> = (0..sge_count_to_allocate(k)).map(|j| sge_of(w, spec.sges[j % 2], read_into)).collect();
        sges.push(list);
        let mut wr = ibv_send_wr::default();
        wr.wr_id = make_id(KIND_SEND, slot, first_seq + i as u64);
        wr.num_sge = k;
        wr.opcode = opcode(spec.op);
        let mut flags = 0;
        for (bit, f) in [(1, IBV_SEND_SIGNALED), (2, IBV_SEND_INLINE), (4, IBV_SEND_FENCE), (8, IBV_SEND_SOLICITED)] {
            if spec.flags & bit != 0 {
                flags |= f;
            }
        }
        wr.send_flags = flags | spec.unknown_flags.unwrap_or(0);
        wr.__bindgen_anon_1.imm_data = spec.imm;
        let remote = BUF / 2 + (usize::from(spec.remote_off) % (BUF / 2 - 64)) / 8 * 8;
        if matches!(spec.op, OpSel::CmpSwap | OpSel::FetchAdd) {
            wr.wr.atomic.remote_addr = w.buf as u64 + remote as u64;
            wr.wr.atomic.rkey = rkey;
            wr.wr.atomic.compare_add = 1;
            wr.wr.atomic.swap = 2;
        } else {
            wr.wr.rdma.remote_addr = w.buf as u64 + remote as u64;
            wr.wr.rdma.rkey = rkey;
        }
        wrs.push(wr);
    }
    for i in 0..n {
        let spec = &specs[i % specs.len()];
        wrs[i].sg_list = if spec.null_list { null_mut() } else { sges[i].as_mut_ptr() };
    }
    let base = wrs.as_mut_ptr();
    for i in 0..n - 1 {
        // SAFETY: i + 1 < n = wrs.len(); `wrs` is not moved or resized until the call returns.
        wrs[i].next = unsafe { base.add(i + 1) };
    }
    let before: Vec<(u64, usize, usize, i32, u32, u32)> =
        wrs.iter().map(|r| (r.wr_id, r.next as usize, r.sg_list as usize, r.num_sge, r.opcode, r.send_flags)).collect();
    let sges_before: Vec<Vec<(u64, u32, u32)>> = sges.iter().map(|l| l.iter().map(|s| (s.addr, s.length, s.lkey)).collect()).collect();
    w.slots[slot].borrow_mut().next_seq += n as u64;

    let mut bad: *mut ibv_send_wr = ptr::dangling_mut();
    // SAFETY: `q` is a live queue; the chain and its SGE lists stay valid and unmoved during the call.
    let rc = call("sqd_post_send", || unsafe { sqd_post_send(q, base, &mut bad) });
    let accepted = if rc == 0 {
        assert!(bad.is_null(), "sqd_post_send returned 0 with *bad_wr set");
        n
    } else {
        assert!(rc != -libc::ENOMEM || !w.slots[slot].borrow().honest, "the provider was given more than it holds");
        let at = (bad as usize).wrapping_sub(base as usize) / std::mem::size_of::<ibv_send_wr>();
        assert!(
            (bad as usize) >= (base as usize) && at < n && (bad as usize - base as usize) % std::mem::size_of::<ibv_send_wr>() == 0,
            "sqd_post_send returned {rc} with *bad_wr outside the chain"
        );
        at
    };
    let indexed = w.slots[slot].borrow().indexed;
    for (i, r) in wrs.iter().enumerate() {
        if no_restore && i < accepted {
            // SQD_QUEUE_NO_RESTORE: of a WR the call accepted, only the link is the caller's again.
            assert_eq!(r.next as usize, before[i].1, "sqd_post_send (SQD_QUEUE_NO_RESTORE) changed the link of WR {i}");
            continue;
        }
        // SQD_QUEUE_INDEXED: no wr_id is restored, not even of the WRs not accepted.
        let wr_id = if indexed { before[i].0 } else { r.wr_id };
        let now = (wr_id, r.next as usize, r.sg_list as usize, r.num_sge, r.opcode, r.send_flags);
        assert_eq!(now, before[i], "sqd_post_send did not restore WR {i} of the chain");
    }
    for (i, l) in sges.iter().enumerate() {
        let now: Vec<(u64, u32, u32)> = l.iter().map(|s| (s.addr, s.length, s.lkey)).collect();
        assert_eq!(now, sges_before[i], "sqd_post_send changed the SGE list of WR {i}");
    }
    let mut s = w.slots[slot].borrow_mut();
    if indexed {
        s.ids.extend((0..accepted).map(|i| make_id(KIND_SEND, slot, first_seq + i as u64)));
    }
    if !s.blind {
        for i in 0..accepted {
            s.sends.push_back(make_id(KIND_SEND, slot, first_seq + i as u64));
        }
        s.accepted += accepted as u64;
    }
}

/// Builds a chain of receives from `specs` (wr_ids from `id`), posts it with `post`, and checks what every
/// receive post owes: `*bad_wr` NULL on success, else inside the chain, and the chain restored. Returns the
/// result and how many receives were taken.
fn post_recv_chain(
    what: &str,
    specs: &[RecvSpec],
    id: impl Fn(usize) -> u64,
    post: impl FnOnce(*mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32,
) -> (i32, usize) {
    let w = world();
    let n = specs.len();
    let mut sges: Vec<Vec<ibv_sge>> = specs.iter().map(|sp| (0..sge_count_to_allocate(nsge(sp.nsge))).map(|_| sge_of(w, sp.sge, true)).collect()).collect();
    let mut wrs: Vec<ibv_recv_wr> = Vec::with_capacity(n);
    for (i, sp) in specs.iter().enumerate() {
        let mut wr = ibv_recv_wr::default();
        wr.wr_id = id(i);
        wr.num_sge = nsge(sp.nsge);
        wr.sg_list = if sp.null_list { null_mut() } else { sges[i].as_mut_ptr() };
        wrs.push(wr);
    }
    let base = wrs.as_mut_ptr();
    for i in 0..n - 1 {
        // SAFETY: i + 1 < n; `wrs` stays in place during the call.
        wrs[i].next = unsafe { base.add(i + 1) };
    }
    let before: Vec<(u64, usize, usize, i32)> = wrs.iter().map(|r| (r.wr_id, r.next as usize, r.sg_list as usize, r.num_sge)).collect();
    let mut bad: *mut ibv_recv_wr = ptr::dangling_mut();
    let rc = call(what, || post(base, &mut bad));
    let taken = if rc == 0 {
        assert!(bad.is_null(), "{what} returned 0 with *bad_wr set");
        n
    } else {
        let at = (bad as usize).wrapping_sub(base as usize) / std::mem::size_of::<ibv_recv_wr>();
        assert!((bad as usize) >= (base as usize) && at < n, "{what} returned {rc} with *bad_wr outside the chain");
        at
    };
    for (i, r) in wrs.iter().enumerate() {
        assert_eq!((r.wr_id, r.next as usize, r.sg_list as usize, r.num_sge), before[i], "{what} did not restore WR {i}");
    }
    drop(sges);
    (rc, taken)
}

fn post_recv(slot: usize, specs: &[RecvSpec]) {
    let w = world();
    let (q, first_seq) = {
        let s = w.slots[slot].borrow();
        (s.q, s.next_seq)
    };
    let n = specs.len().min(64);
    if n == 0 || q.is_null() {
        return;
    }
    w.slots[slot].borrow_mut().next_seq += n as u64;
    let (_, accepted) = post_recv_chain(
        "sqd_post_recv",
        &specs[..n],
        |i| make_id(KIND_RECV, slot, first_seq + i as u64),
        // SAFETY: a live queue; the chain is valid during the call.
        |head, bad| unsafe { sqd_post_recv(q, head, bad) },
    );
    let mut s = w.slots[slot].borrow_mut();
    if !s.blind {
        for i in 0..accepted {
            s.recvs.push_back(make_id(KIND_RECV, slot, first_seq + i as u64));
        }
    }
}

// ---- the managed SRQ --------------------------------------------------------------------------------------------

/// Queues now attached to the managed SRQ.
fn srq_queues(w: &World) -> usize {
    w.slots.iter().filter(|s| {
        let s = s.borrow();
        !s.q.is_null() && s.srq_attached
    }).count()
}

fn srq_new(depth: Num, low: u8, flags: u32, no_release: bool, reentry: SrqReentry) {
    let w = world();
    let Some(m) = &w.srq else { return };
    if !m.handle.get().is_null() || m.retired.get() {
        return;
    }
    let depth = depth.get(m.granted);
    let low_watermark = u32::from(low) % (depth.min(64) + 2);
    let attr = sqd_srq_attr {
        depth,
        low_watermark,
        release: if no_release { None } else { Some(on_srq_release) },
        release_ctx: null_mut(),
        low: Some(on_srq_low),
        low_ctx: null_mut(),
        flags: if flags & 0x100 != 0 { flags } else { 0 },
    };
    let mut out: *mut sqd_srq = ptr::dangling_mut();
    // SAFETY: a live SRQ of the sim, not managed now; `attr` and `out` are valid.
    let rc = call("sqd_srq_new", || unsafe { sqd_srq_new(m.raw, &attr, &mut out) });
    let good = (1..=1 << 20).contains(&depth) && low_watermark <= depth && attr.flags == 0;
    assert_eq!(rc == 0, good, "sqd_srq_new(depth {depth}, low {low_watermark}, flags {:#x}) returned {rc}", attr.flags);
    if rc != 0 {
        assert!(out.is_null(), "sqd_srq_new failed and left *out set");
        return;
    }
    assert!(m.recvs.borrow().is_empty());
    m.handle.set(out);
    m.depth.set(depth);
    m.low_watermark.set(low_watermark);
    m.blind.set(no_release);
    m.reentry.set(reentry);
    if depth > m.granted {
        w.truthful.set(false);
    }
}

fn srq_free() {
    let w = world();
    let Some(m) = &w.srq else { return };
    let h = m.handle.get();
    if h.is_null() {
        // SAFETY: NULL is a no-op.
        expect("sqd_srq_free(NULL)", 0, || unsafe { sqd_srq_free(null_mut()) });
        return;
    }
    let busy = srq_queues(w) > 0 || m.releasing.get() || srq_posted(h) > 0;
    // SAFETY: a live managed SRQ.
    let rc = call("sqd_srq_free", || unsafe { sqd_srq_free(h) });
    assert_eq!(rc, if busy { -libc::EBUSY } else { 0 }, "sqd_srq_free returned {rc} ({})", last_error());
    if rc == 0 {
        assert!(m.blind.get() || m.recvs.borrow().is_empty(), "the SRQ was freed with receives never released");
        m.handle.set(null_mut());
        m.recvs.borrow_mut().clear();
    }
}

/// The SRQ model and its live handle, when the program has an SRQ under management now.
fn managed_srq<'a>() -> Option<(&'a World, &'a SrqModel, *mut sqd_srq)> {
    let w = world();
    let m = w.srq.as_ref()?;
    let h = m.handle.get();
    (!h.is_null()).then_some((w, m, h))
}

/// The SRQ's posted receives, from its counters (which the model checks in `srq_stats`).
fn srq_posted(h: *mut sqd_srq) -> u32 {
    let mut st = sqd_srq_stats::default();
    // SAFETY: a live managed SRQ and a valid out struct.
    expect("sqd_srq_stats", 0, || unsafe { sqd_srq_stats(h, &mut st) });
    st.posted
}

fn srq_post_recv(specs: &[RecvSpec]) {
    let Some((w, m, h)) = managed_srq() else { return };
    let n = specs.len().min(64);
    if n == 0 {
        return;
    }
    let first_seq = m.next_seq.get();
    m.next_seq.set(first_seq + n as u64);
    let (rc, accepted) = post_recv_chain(
        "sqd_srq_post_recv",
        &specs[..n],
        |i| make_id(KIND_SRQ, SRQ_SLOT, first_seq + i as u64),
        // SAFETY: a live managed SRQ; the chain is valid during the call.
        |head, bad| unsafe { sqd_srq_post_recv(h, head, bad) },
    );
    assert!(rc != -libc::ENOMEM || m.depth.get() > m.granted, "the SRQ was given more receives than it holds");
    assert!(!m.retired.get() || (rc == -libc::EIO && accepted == 0), "a retired SRQ returned {rc} with {accepted} receives taken");
    if !m.blind.get() {
        m.recvs.borrow_mut().extend((0..accepted).map(|i| make_id(KIND_SRQ, SRQ_SLOT, first_seq + i as u64)));
    }
    // A QP on the SRQ whose queue is not attached to it consumes receives on a CQ that reserved nothing for them.
    let unreserved = w.slots.iter().any(|s| {
        let s = s.borrow();
        s.on_srq && (s.q.is_null() || !s.srq_attached)
    });
    if accepted > 0 && unreserved {
        w.truthful.set(false);
    }
}

fn srq_release_all() {
    let Some((w, m, h)) = managed_srq() else { return };
    let before = m.recvs.borrow().clone();
    let posted = srq_posted(h);
    // SAFETY: a live managed SRQ.
    let rc = call("sqd_srq_release_all", || unsafe { sqd_srq_release_all(h) });
    let attached = srq_queues(w) > 0;
    assert_eq!(rc, if attached { -libc::EBUSY } else { 0 }, "sqd_srq_release_all returned {rc} ({})", last_error());
    if rc == 0 && posted > 0 {
        m.retired.set(true);
    }
    // From inside the SRQ's own callback the releases are handed out by the loop that ran it, after it returns.
    // What its release callbacks posted meanwhile (a refill) stays posted.
    if rc == 0 && !m.releasing.get() && !m.blind.get() {
        let left = m.recvs.borrow();
        assert!(before.iter().all(|id| !left.contains(id)), "sqd_srq_release_all left receives unreleased");
        assert_eq!(srq_posted(h) as usize, left.len(), "sqd_srq_release_all: receives posted afterwards");
    }
}

fn srq_stats() {
    let Some((w, m, h)) = managed_srq() else { return };
    let mut st = sqd_srq_stats::default();
    // SAFETY: a live managed SRQ and a valid out struct.
    expect("sqd_srq_stats", 0, || unsafe { sqd_srq_stats(h, &mut st) });
    assert_eq!(st.depth, m.depth.get());
    assert!(st.posted <= st.depth, "the SRQ holds {} receives in depth {}", st.posted, st.depth);
    assert_eq!(st.queues as usize, srq_queues(w), "queues attached to the SRQ");
    if !m.blind.get() && !m.releasing.get() && w.depth.get() == 0 {
        assert_eq!(st.posted as usize, m.recvs.borrow().len(), "receives posted to the SRQ and not released");
    }
}

/// Calls made again from inside the SRQ's release callback.
fn srq_reenter(r: SrqReentry) {
    match r {
        SrqReentry::Nothing => {}
        SrqReentry::Refill => srq_post_recv(&[RecvSpec { nsge: NsgeSel::Count(1), sge: SgeSpec { off: 0, len: 64, bad_key: false }, null_list: false }]),
        SrqReentry::FreeSelf => {
            let h = world().srq.as_ref().map_or(null_mut(), |m| m.handle.get());
            // SAFETY: a live managed SRQ: it is running one of its callbacks.
            expect("sqd_srq_free from its own callback", -libc::EBUSY, || unsafe { sqd_srq_free(h) });
        }
        SrqReentry::ReleaseAll => srq_release_all(),
        SrqReentry::Stats => srq_stats(),
    }
}

// ---- polling ------------------------------------------------------------------------------------------------------

fn poll(cq: usize, max: MaxSel) {
    let w = world();
    let handle = w.cq[cq].get();
    if handle.is_null() {
        return;
    }
    let was_polling = w.polling[cq].replace(true);
    let mut wc = w.wc.take();
    let (m, p) = match max {
        MaxSel::Small(n) => (1 + i32::from(n) % WC as i32, wc.as_mut_ptr()),
        MaxSel::Zero => (0, wc.as_mut_ptr()),
        MaxSel::Negative(n) => (n.min(-1), wc.as_mut_ptr()),
        MaxSel::NullWc(n) => (n, null_mut()),
    };
    // SAFETY: a managed CQ; `p` is NULL or holds WC >= max entries.
    let rc = call("sqd_cq_poll", || unsafe { sqd_cq_poll(handle, m, p) });
    w.polling[cq].set(was_polling);
    if was_polling {
        assert_eq!(rc, -libc::EBUSY, "sqd_cq_poll re-entered from a callback returned {rc}");
    } else if m < 0 || (p.is_null() && m > 0) {
        assert_eq!(rc, -libc::EINVAL, "sqd_cq_poll with max {m} and wc {p:?} returned {rc}");
    } else if m == 0 {
        assert_eq!(rc, 0);
    }
    if rc > 0 {
        assert!(rc <= m, "sqd_cq_poll stored {rc} completions in room for {m}");
        check_wcs(&wc[..rc as usize]);
    }
    w.wc.replace(wc);
}

/// Completions of a QP managed by a live queue carry the ULP's own wr_ids: never one of the library's.
fn check_wcs(wcs: &[ibv_wc]) {
    let w = world();
    for c in wcs {
        for (i, slot) in w.slots.iter().enumerate() {
            let mut s = slot.borrow_mut();
            // SAFETY: the QPs live until the device is freed at the end of the program.
            if s.q.is_null() || s.tainted || s.qp.is_null() || unsafe { (*s.qp).qp_num } != c.qp_num {
                continue;
            }
            let mut wr_id = c.wr_id;
            if s.indexed && split_id(wr_id).0 == 0 {
                // An indexed queue's send completion: the index of a WR it accepted.
                wr_id = *s.ids.get(wr_id as usize).unwrap_or_else(|| panic!("slot {i}: a completion with index {wr_id}, of {} accepted", s.ids.len()));
            }
            let (kind, from, seq) = split_id(wr_id);
            let srq_recv = kind == KIND_SRQ && from == SRQ_SLOT && s.on_srq && w.srq.as_ref().is_some_and(|m| seq < m.next_seq.get());
            assert!(
                srq_recv || (kind == KIND_SEND || kind == KIND_RECV) && from == i && seq < s.next_seq,
                "slot {i}: a completion with wr_id {:#x} (status {}) that the ULP never posted",
                c.wr_id,
                c.status
            );
            if kind == KIND_SEND && !s.blind {
                see_status(&mut s, i, wr_id, SeenStatus::Polled(c.status));
            }
        }
    }
}

fn arm(cq: usize, solicited: bool, max: MaxSel) {
    let w = world();
    let handle = w.cq[cq].get();
    if handle.is_null() {
        return;
    }
    let was_polling = w.polling[cq].replace(true);
    let mut wc = w.wc.take();
    let (m, p) = match max {
        MaxSel::Small(n) => (1 + i32::from(n) % WC as i32, wc.as_mut_ptr()),
        MaxSel::Zero => (0, wc.as_mut_ptr()),
        MaxSel::Negative(n) => (n.min(-1), wc.as_mut_ptr()),
        MaxSel::NullWc(n) => (n, null_mut()),
    };
    // SAFETY: as in `poll`.
    let rc = call("sqd_cq_arm", || unsafe { sqd_cq_arm(handle, i32::from(solicited), m, p) });
    w.polling[cq].set(was_polling);
    if m <= 0 || p.is_null() {
        assert_eq!(rc, -libc::EINVAL, "sqd_cq_arm with max {m} and wc {p:?} returned {rc}");
    }
    if rc > 0 {
        assert!(rc <= m);
        check_wcs(&wc[..rc as usize]);
    }
    w.wc.replace(wc);
}

fn drain(slot: usize) {
    let q = world().slots[slot].borrow().q;
    if !q.is_null() {
        // SAFETY: a live queue.
        call("sqd_queue_drain", || unsafe { sqd_queue_drain(q) });
    }
}

fn defer(slot: usize, mr: bool) {
    let w = world();
    let (q, barrier, tracked, blind) = {
        let s = w.slots[slot].borrow();
        (s.q, s.accepted, s.tracked, s.blind)
    };
    if q.is_null() {
        return;
    }
    let ctx = Box::into_raw(Box::new(DeferCtx { slot, barrier, exact: !(mr && tracked), blind })) as *mut c_void;
    w.slots[slot].borrow_mut().defers += 1;
    let rc = if mr {
        // SAFETY: a live queue and MR; `on_defer` takes `ctx` back when it runs.
        call("sqd_defer_mr", || unsafe { sqd_defer_mr(q, w.mr, Some(on_defer), ctx) })
    } else {
        // SAFETY: as above.
        call("sqd_defer", || unsafe { sqd_defer(q, Some(on_defer), ctx) })
    };
    assert_eq!(rc, 0, "deferring an action failed: {}", last_error());
}

fn invalidate(slot: usize, rkey: u32, flags: u32, done: bool) {
    let w = world();
    let (q, seq) = {
        let mut s = w.slots[slot].borrow_mut();
        if s.quiet {
            // Its quiet successes are counted from `released`, which a LocalInv would count too.
            return;
        }
        s.ever_invalidated |= !s.q.is_null();
        s.next_seq += 1;
        (s.q, s.next_seq - 1)
    };
    if q.is_null() {
        return;
    }
    let id = make_id(KIND_INV, slot, seq);
    let ctx = Box::into_raw(Box::new((slot, id)));
    if done {
        w.slots[slot].borrow_mut().invs.push(id);
    }
    let (f, c): (sqd_release_fn, *mut c_void) = if done { (Some(on_inv_done), ctx as *mut c_void) } else { (None, null_mut()) };
    // SAFETY: a live queue; `on_inv_done` takes `ctx` back once when it runs.
    let rc = call("sqd_invalidate", || unsafe { sqd_invalidate(q, rkey, id, flags, f, c) });
    if flags & !SQD_INVALIDATE_FENCE != 0 {
        assert_eq!(rc, -libc::EINVAL, "sqd_invalidate with unknown flags returned {rc}");
    }
    if rc != 0 || !done {
        let mut s = w.slots[slot].borrow_mut();
        if let Some(at) = s.invs.iter().position(|&i| i == id) {
            s.invs.swap_remove(at);
        }
        // SAFETY: not handed over (refused, or no callback): still ours.
        drop(unsafe { Box::from_raw(ctx) });
    }
}

fn queue_event(slot: usize, ev: u32) {
    let w = world();
    let q = w.slots[slot].borrow().q;
    if q.is_null() {
        return;
    }
    // SAFETY: a live queue.
    let rc = call("sqd_queue_async_event", || unsafe { sqd_queue_async_event(q, ev) });
    let known = [IBV_EVENT_QP_FATAL, IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR, IBV_EVENT_COMM_EST, IBV_EVENT_SQ_DRAINED, IBV_EVENT_PATH_MIG, IBV_EVENT_QP_LAST_WQE_REACHED];
    assert_eq!(rc == 0, known.contains(&ev), "sqd_queue_async_event({ev}) returned {rc}");
    if ev == IBV_EVENT_QP_LAST_WQE_REACHED && w.slots[slot].borrow().on_srq && !w.in_teardown.get() {
        // Invented: the QP may still consume SRQ receives after its queue is freed.
        w.slots[slot].borrow_mut().tainted = true;
        w.truthful.set(false);
    }
    if [IBV_EVENT_QP_FATAL, IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR].contains(&ev) {
        sync_quiet(slot);
        let mut s = w.slots[slot].borrow_mut();
        // From inside a callback the releases may still be under way in the call that ran it (and a quiet
        // queue's successes are counted only outside: `sync_quiet`).
        let outside = w.depth.get() == 0 || w.in_teardown.get();
        assert!(!outside || (s.sends.is_empty() && s.recvs.is_empty()), "slot {slot}: a fatal QP event left WRs unreleased");
        s.tainted = true;
        w.truthful.set(false);
    }
}

fn cq_event(cq: usize, ev: u32) {
    let w = world();
    let handle = w.cq[cq].get();
    if handle.is_null() {
        return;
    }
    // SAFETY: a managed CQ.
    let rc = call("sqd_cq_async_event", || unsafe { sqd_cq_async_event(handle, ev) });
    assert_eq!(rc == 0, ev == IBV_EVENT_CQ_ERR, "sqd_cq_async_event({ev}) returned {rc}");
    if rc == 0 {
        w.truthful.set(false);
        for i in 0..w.slots.len() {
            sync_quiet(i);
        }
        for (i, slot) in w.slots.iter().enumerate() {
            let mut s = slot.borrow_mut();
            if !s.q.is_null() && s.uses_cqs[cq] {
                let outside = w.depth.get() == 0;
                assert!(!outside || (s.sends.is_empty() && s.recvs.is_empty()), "slot {i}: IBV_EVENT_CQ_ERR left WRs unreleased");
                s.tainted = true;
            }
        }
    }
}

fn stats(slot: usize) {
    sync_quiet(slot);
    let w = world();
    let q = w.slots[slot].borrow().q;
    if q.is_null() {
        return;
    }
    let mut st = sqd_queue_stats::default();
    // SAFETY: a live queue and a valid out struct.
    expect("sqd_queue_stats", 0, || unsafe { sqd_queue_stats(q, &mut st) });
    let s = w.slots[slot].borrow();
    // The queue's counters include its own LocalInvs (sqd_invalidate), which the caller did not post.
    assert!(st.accepted >= s.accepted, "slot {slot}: the queue counts {} accepted, the caller {}", st.accepted, s.accepted);
    assert!(st.released >= s.released, "slot {slot}: the queue counts {} released, the callback saw {}", st.released, s.released);
    // A quiet queue's successes released without a call are counted here only outside the callbacks.
    let exact = !s.quiet || w.depth.get() == 0 || w.in_teardown.get();
    assert!(!exact || st.accepted - st.released >= s.sends.len() as u64, "slot {slot}: fewer WRs outstanding than the caller has");
    assert_eq!(st.deferred as u64 >= s.defers, true, "slot {slot}: fewer deferred actions waiting than registered");
    if !s.blind {
        assert_eq!(u64::from(st.recv_outstanding), s.recvs.len() as u64, "slot {slot}: receives outstanding");
    }
}

fn free_queue(slot: usize) -> i32 {
    sync_quiet(slot);
    let w = world();
    let (q, outstanding) = {
        let s = w.slots[slot].borrow();
        (s.q, !s.sends.is_empty() || !s.recvs.is_empty())
    };
    if q.is_null() {
        // SAFETY: NULL is a no-op.
        expect("sqd_queue_free(NULL)", 0, || unsafe { sqd_queue_free(null_mut()) });
        return 0;
    }
    // SAFETY: a live queue.
    let rc = call("sqd_queue_free", || unsafe { sqd_queue_free(q) });
    if rc == 0 {
        assert!(!outstanding, "slot {slot}: sqd_queue_free succeeded with WRs not released");
        let mut s = w.slots[slot].borrow_mut();
        assert!(s.invs.is_empty(), "slot {slot}: freed with an invalidation never reported");
        assert_eq!(s.defers, 0, "slot {slot}: freed with a deferred action that never ran");
        s.q = null_mut();
        s.tracked = false;
        s.srq_attached = false;
        if !s.honest {
            w.truthful.set(false);
        }
        s.uses_cqs = [false; 2];
    } else {
        assert_eq!(rc, -libc::EBUSY, "sqd_queue_free returned {rc}");
    }
    rc
}

fn new_queue(slot: usize, a: &AttrSpec) {
    let w = world();
    let (qp, caps, own_s, own_r, exists) = {
        let s = w.slots[slot].borrow();
        (s.qp, s.caps, s.send_cq, s.recv_cq, !s.q.is_null())
    };
    if exists || qp.is_null() {
        return;
    }
    let pick = |sel: CqSel, own: usize| match sel {
        CqSel::Own => own,
        CqSel::Other => 1 - own,
        CqSel::Null => 2,
    };
    let srq = if a.use_srq { w.srq.as_ref().map_or(null_mut(), |m| m.handle.get()) } else { null_mut() };
    let on_srq = w.slots[slot].borrow().on_srq;
    let scq_i = pick(a.send_cq, own_s);
    let rcq_i = if a.manage_recv || !srq.is_null() { pick(a.recv_cq, own_r) } else { 2 };
    let handle = |i: usize| if i < 2 { w.cq[i].get() } else { null_mut() };
    let sq = a.sq.get(caps.0);
    let sge = a.sge.get(caps.2);
    let inline = a.inline.get(caps.3);
    let rq = if a.manage_recv { a.rq.get(caps.1) } else { 0 };
    let mut flags = if a.any_flags { a.flags } else { a.flags & (SQD_QUEUE_VERIFY_BUFFERS | SQD_QUEUE_NO_RESTORE | SQD_QUEUE_INDEXED) };
    let checksums = u64::from(sq.saturating_add(u32::from(a.backlog))) * u64::from(sge.max(1));
    if checksums > MAX_VERIFY_CHECKSUMS {
        flags &= !SQD_QUEUE_VERIFY_BUFFERS;
    }
    let attr = sqd_queue_attr {
        sq_depth: sq,
        max_send_sge: sge,
        max_inline_data: inline,
        rq_depth: rq,
        signal_interval: a.signal_interval.get(0),
        backlog_depth: u32::from(a.backlog),
        release: if a.no_release { None } else { Some(on_release) },
        release_ctx: slot as *mut c_void,
        flags,
        srq,
    };
    let mut out: *mut sqd_queue = ptr::dangling_mut();
    // SAFETY: CQ handles are NULL or live; `qp` is a live QP of the device; `attr` and `out` are valid.
    let rc = call("sqd_queue_new", || unsafe { sqd_queue_new(handle(scq_i), handle(rcq_i), qp, &attr, &mut out) });
    if rc != 0 {
        assert!(out.is_null(), "sqd_queue_new failed and left *out set");
        return;
    }
    assert!(!out.is_null());
    let known_flags = SQD_QUEUE_VERIFY_BUFFERS | SQD_QUEUE_NO_RESTORE | SQD_QUEUE_INDEXED;
    assert!(scq_i == own_s && sq >= 1 && attr.flags & !known_flags == 0, "sqd_queue_new accepted a bad queue");
    assert!(srq.is_null() || (on_srq && rq == 0 && rcq_i == own_r), "sqd_queue_new accepted a queue on an SRQ its QP does not use");
    assert!(srq.is_null() || !w.srq.as_ref().is_some_and(|m| m.retired.get()), "sqd_queue_new accepted a queue on a retired SRQ");
    assert!(!on_srq || rq == 0, "sqd_queue_new accepted managed receives for a QP on an SRQ");
    let mut s = w.slots[slot].borrow_mut();
    s.srq_attached = !srq.is_null();
    if on_srq && srq.is_null() {
        // Its QP consumes the SRQ's receives on a CQ that reserved nothing for them, and its queue cannot map
        // their completions: the ULP broke the rules for this QP.
        s.tainted = true;
        w.truthful.set(false);
    }
    s.q = out;
    s.honest = sq <= caps.0 && sge <= caps.2 && inline <= caps.3 && rq <= caps.1 && !s.tainted;
    if !s.honest {
        w.truthful.set(false);
    }
    s.manages_recv = rq > 0;
    s.uses_cqs = [false; 2];
    s.uses_cqs[scq_i] = true;
    if rcq_i < 2 {
        s.uses_cqs[rcq_i] = true;
    }
    s.reentry = a.reentry;
    s.blind = a.no_release;
    s.batched = false;
    s.quiet = false;
    s.ever_invalidated = false;
    s.verifies = attr.flags & SQD_QUEUE_VERIFY_BUFFERS != 0;
    s.indexed = attr.flags & SQD_QUEUE_INDEXED != 0;
    s.no_restore = attr.flags & (SQD_QUEUE_NO_RESTORE | SQD_QUEUE_INDEXED) != 0;
    s.ids.clear();
    s.send_order = StatusOrder::default();
    s.send_statuses.clear();
    s.accepted = 0;
    s.released = 0;
    s.next_seq += 1;
    drop(s);
    if a.flags & ATTR_BATCH != 0 {
        set_release_batch(slot);
    }
}

/// `sqd_queue_set_release_batch` on the queue in `slot`, outside its callbacks: 0 the first time, `-EBUSY`
/// after that, `-EINVAL` on a queue without `release`; `-ENOMEM` is allowed where 0 is due.
fn set_release_batch(slot: usize) {
    let w = world();
    let (q, blind, batched, quiet) = {
        let s = w.slots[slot].borrow();
        // The odd slots take failures only, unless the queue has LocalInvs (`ever_invalidated`).
        (s.q, s.blind, s.batched, slot % 2 == 1 && !s.ever_invalidated)
    };
    if q.is_null() {
        return;
    }
    // SAFETY: a live queue; `on_release_batch` may be called with this ctx (the slot) while the queue exists.
    let rc = if quiet {
        call("sqd_queue_set_release_failures", || unsafe {
            sqd_queue_set_release_failures(q, Some(on_release_batch), slot as *mut c_void)
        })
    } else {
        call("sqd_queue_set_release_batch", || unsafe {
            sqd_queue_set_release_batch(q, Some(on_release_batch), slot as *mut c_void)
        })
    };
    let want = if blind {
        -libc::EINVAL
    } else if batched {
        -libc::EBUSY
    } else {
        0
    };
    assert!(rc == want || (want == 0 && rc == -libc::ENOMEM), "setting the batch callback returned {rc}, expected {want} ({})", last_error());
    if rc == 0 {
        let mut s = w.slots[slot].borrow_mut();
        s.batched = true;
        s.quiet = quiet;
    }
}

/// The CQs' handles: a CQ with queues on it must refuse to be freed.
fn free_cq(cq: usize) {
    let w = world();
    let handle = w.cq[cq].get();
    if handle.is_null() {
        // SAFETY: NULL is a no-op.
        expect("sqd_cq_free(NULL)", 0, || unsafe { sqd_cq_free(null_mut()) });
        return;
    }
    let attached = w.slots.iter().any(|s| {
        let s = s.borrow();
        !s.q.is_null() && s.uses_cqs[cq]
    });
    // SAFETY: a managed CQ.
    let rc = call("sqd_cq_free", || unsafe { sqd_cq_free(handle) });
    if attached || w.polling[cq].get() {
        assert_eq!(rc, -libc::EBUSY, "sqd_cq_free of a CQ in use returned {rc}");
    } else {
        assert_eq!(rc, 0, "sqd_cq_free of an idle CQ returned {rc}: {}", last_error());
        w.cq[cq].set(null_mut());
    }
}

fn new_cq(cq: usize, flags: u32) {
    let w = world();
    if !w.cq[cq].get().is_null() {
        return;
    }
    let mut out: *mut sqd_cq = ptr::dangling_mut();
    // SAFETY: a live CQ of the device, not managed now.
    let rc = call("sqd_cq_new_ex", || unsafe { sqd_cq_new_ex(w.raw_cq[cq], flags, &mut out) });
    if flags & !SQD_CQ_THREAD_SAFE != 0 {
        assert_eq!(rc, -libc::EINVAL);
    }
    if rc == 0 {
        w.cq[cq].set(out);
    } else {
        assert!(out.is_null());
    }
}

fn live_queue(w: &World) -> *mut sqd_queue {
    w.slots.iter().map(|s| s.borrow().q).find(|q| !q.is_null()).unwrap_or(null_mut())
}

/// NULL and malformed arguments: each must be refused cleanly and change nothing.
fn bad_call(which: u8, arg: u32) {
    let w = world();
    let q = live_queue(w);
    let cq = w.cq[0].get();
    let mut out_cq: *mut sqd_cq = ptr::dangling_mut();
    let mut out_q: *mut sqd_queue = ptr::dangling_mut();
    let mut wc = [ibv_wc::default(); 2];
    let mut u = 0u64;
    let mut sge = sge_of(w, SgeSpec { off: 0, len: 8, bad_key: false }, false);
    let mut swr = ibv_send_wr { opcode: IBV_WR_SEND, num_sge: 1, sg_list: &mut sge, ..Default::default() };
    let mut rwr = ibv_recv_wr { num_sge: 1, sg_list: &mut sge, ..Default::default() };
    let mut sbad: *mut ibv_send_wr = null_mut();
    let mut rbad: *mut ibv_recv_wr = null_mut();
    let einval = -libc::EINVAL;
    // SAFETY (every call below): each passes NULL (or a malformed value) where the header says it is refused
    // with -EINVAL before anything is read; the other arguments are live objects or valid out pointers.
    unsafe {
        match which % 36 {
            0 => expect("sqd_cq_new(NULL)", einval, || sqd_cq_new(null_mut(), &mut out_cq)),
            1 => expect("sqd_cq_new(out NULL)", einval, || sqd_cq_new(w.raw_cq[0], null_mut())),
            2 => expect("sqd_cq_new_ex(bad flags)", einval, || sqd_cq_new_ex(w.raw_cq[0], arg | 2, &mut out_cq)),
            3 => expect("sqd_cq_poll(NULL)", einval, || sqd_cq_poll(null_mut(), 2, wc.as_mut_ptr())),
            4 => expect("sqd_cq_stats(NULL)", einval, || sqd_cq_stats(null(), &mut sqd_cq_stats::default())),
            5 if !cq.is_null() => expect("sqd_cq_stats(out NULL)", einval, || sqd_cq_stats(cq, null_mut())),
            6 => expect("sqd_cq_arm(NULL)", einval, || sqd_cq_arm(null_mut(), 0, 2, wc.as_mut_ptr())),
            7 => expect("sqd_cq_async_event(NULL)", einval, || sqd_cq_async_event(null_mut(), arg)),
            8 => expect("sqd_cq_depth_for(NULL plans)", einval, || sqd_cq_depth_for(null(), arg as usize | 1, &mut u)),
            9 => expect("sqd_cq_depth_for(out NULL)", einval, || sqd_cq_depth_for(null(), 0, null_mut())),
            10 => expect("sqd_queue_new(NULL cq)", einval, || sqd_queue_new(null_mut(), null_mut(), w.slots[0].borrow().qp, &sqd_queue_attr::default(), &mut out_q)),
            11 if !cq.is_null() => expect("sqd_queue_new(NULL qp)", einval, || sqd_queue_new(cq, null_mut(), null_mut(), &sqd_queue_attr { sq_depth: 4, ..Default::default() }, &mut out_q)),
            12 if !cq.is_null() => expect("sqd_queue_new(NULL attr)", einval, || sqd_queue_new(cq, null_mut(), w.slots[0].borrow().qp, null(), &mut out_q)),
            13 if !cq.is_null() => expect("sqd_queue_new(NULL out)", einval, || sqd_queue_new(cq, null_mut(), w.slots[0].borrow().qp, &sqd_queue_attr::default(), null_mut())),
            14 => expect("sqd_post_send(NULL q)", einval, || sqd_post_send(null_mut(), &mut swr, &mut sbad)),
            15 if !q.is_null() => expect("sqd_post_send(NULL wr)", einval, || sqd_post_send(q, null_mut(), &mut sbad)),
            16 if !q.is_null() => expect("sqd_post_send(NULL bad_wr)", einval, || sqd_post_send(q, &mut swr, null_mut())),
            17 => expect("sqd_post_recv(NULL q)", einval, || sqd_post_recv(null_mut(), &mut rwr, &mut rbad)),
            18 if !q.is_null() => expect("sqd_post_recv(NULL wr)", einval, || sqd_post_recv(q, null_mut(), &mut rbad)),
            19 if !q.is_null() => expect("sqd_post_recv(NULL bad_wr)", einval, || sqd_post_recv(q, &mut rwr, null_mut())),
            20 => expect("sqd_defer(NULL q)", einval, || sqd_defer(null_mut(), Some(on_defer), null_mut())),
            21 if !q.is_null() => expect("sqd_defer(NULL fn)", einval, || sqd_defer(q, None, null_mut())),
            22 => expect("sqd_queue_drain(NULL)", einval, || sqd_queue_drain(null_mut())),
            23 => expect("sqd_queue_stats(NULL)", einval, || sqd_queue_stats(null(), &mut sqd_queue_stats::default())),
            24 if !q.is_null() => expect("sqd_queue_stats(out NULL)", einval, || sqd_queue_stats(q, null_mut())),
            25 => expect("sqd_invalidate(NULL)", einval, || sqd_invalidate(null_mut(), arg, 0, 0, None, null_mut())),
            26 if !q.is_null() => expect("sqd_invalidate(bad flags)", einval, || sqd_invalidate(q, arg, 0, arg | 2, None, null_mut())),
            27 => expect("sqd_queue_track_mr(NULL)", einval, || sqd_queue_track_mr(null_mut(), w.mr)),
            28 if !q.is_null() => expect("sqd_queue_track_mr(NULL mr)", einval, || sqd_queue_track_mr(q, null())),
            29 if !q.is_null() => expect("sqd_queue_untrack_mr(NULL mr)", einval, || sqd_queue_untrack_mr(q, null())),
            30 if !q.is_null() => expect("sqd_defer_mr(NULL mr)", einval, || sqd_defer_mr(q, null(), Some(on_defer), null_mut())),
            31 if !q.is_null() => expect("sqd_defer_mr(NULL fn)", einval, || sqd_defer_mr(q, w.mr, None, null_mut())),
            32 if !q.is_null() => expect("sqd_defer_dereg_mr(NULL mr)", einval, || sqd_defer_dereg_mr(q, null_mut())),
            33 if !q.is_null() => expect("sqd_defer_dealloc_mw(NULL mw)", einval, || sqd_defer_dealloc_mw(q, null_mut())),
            34 => {
                expect("sqd_queue_async_event(NULL)", einval, || sqd_queue_async_event(null_mut(), arg));
                expect("sqd_srq_new(NULL)", einval, || sqd_srq_new(null_mut(), &sqd_srq_attr::default(), &mut null_mut()));
                expect("sqd_srq_free(NULL)", 0, || sqd_srq_free(null_mut()));
                expect("sqd_srq_post_recv(NULL)", einval, || sqd_srq_post_recv(null_mut(), &mut rwr, &mut rbad));
                expect("sqd_srq_release_all(NULL)", einval, || sqd_srq_release_all(null_mut()));
                expect("sqd_srq_stats(NULL)", einval, || sqd_srq_stats(null(), &mut sqd_srq_stats::default()));
                expect("sqd_queue_free(NULL)", 0, || sqd_queue_free(null_mut()));
                expect("sqd_cq_free(NULL)", 0, || sqd_cq_free(null_mut()));
                expect("sqd_queue_set_release_batch(NULL q)", einval, || sqd_queue_set_release_batch(null_mut(), Some(on_release_batch), null_mut()));
                if !q.is_null() {
                    expect("sqd_queue_set_release_batch(NULL fn)", einval, || sqd_queue_set_release_batch(q, None, null_mut()));
                }
                if let Some(m) = &w.srq {
                    let mut out: *mut sqd_srq = null_mut();
                    let attr = sqd_srq_attr { depth: m.granted, ..Default::default() };
                    expect("sqd_srq_new(NULL attr)", einval, || sqd_srq_new(m.raw, null(), &mut out));
                    expect("sqd_srq_new(NULL out)", einval, || sqd_srq_new(m.raw, &attr, null_mut()));
                    assert!(out.is_null(), "a refused sqd_srq_new left a handle");
                    let h = m.handle.get();
                    if !h.is_null() {
                        expect("sqd_srq_post_recv(NULL wr)", einval, || sqd_srq_post_recv(h, null_mut(), &mut rbad));
                        expect("sqd_srq_post_recv(NULL bad_wr)", einval, || sqd_srq_post_recv(h, &mut rwr, null_mut()));
                        expect("sqd_srq_stats(out NULL)", einval, || sqd_srq_stats(h, null_mut()));
                    }
                }
            }
            35 => {
                // A CQ no provider made, and a QP that is not RC.
                let mut fake = ibv_cq { cqe: 16, ..Default::default() };
                expect("sqd_cq_new(fake CQ)", einval, || sqd_cq_new(&mut fake, &mut out_cq));
                let qp = w.slots[0].borrow().qp;
                if !cq.is_null() && !qp.is_null() {
                    let mut ud = *qp;
                    ud.qp_type = IBV_QPT_UD;
                    let attr = sqd_queue_attr { sq_depth: 1, max_send_sge: 1, ..Default::default() };
                    expect("sqd_queue_new(UD QP)", einval, || sqd_queue_new(cq, null_mut(), &mut ud, &attr, &mut out_q));
                }
            }
            _ => {}
        }
    }
    assert!(out_cq.is_null() || out_cq == ptr::dangling_mut(), "a refused sqd_cq_new left a handle");
    assert!(out_q.is_null() || out_q == ptr::dangling_mut(), "a refused sqd_queue_new left a handle");
}

fn dev_op(op: &DevOp) {
    let w = world();
    let qp_of = |i: u8| w.slots[usize::from(i) % NQ].borrow().qp;
    // SAFETY (every call below): the device, its QPs and CQs are live until the end of the program.
    unsafe {
        if !w.scripted.is_null() {
            match *op {
                DevOp::Complete { qp, n } => {
                    sqd_scripted_complete(qp_of(qp), i32::from(n));
                }
                DevOp::Fail { qp, status, vendor_err } => {
                    sqd_scripted_fail(qp_of(qp), 1 + u32::from(status) % 21, vendor_err);
                }
                DevOp::SetError { qp } => {
                    sqd_scripted_set_error(qp_of(qp));
                }
                DevOp::Deliver { qp, len, imm } => {
                    let imm = imm.as_ref().map_or(null(), |v| v as *const u32);
                    sqd_scripted_deliver(qp_of(qp), u32::from(len), imm);
                }
                DevOp::Step { .. } | DevOp::Fault { .. } | DevOp::Events | DevOp::SrqError => {}
            }
        } else {
            match *op {
                DevOp::Complete { n, .. } | DevOp::Step { n } => {
                    sqd_sim_step(w.sim, u32::from(n % 32));
                }
                DevOp::SetError { qp } => {
                    sqd_sim_set_error(qp_of(qp));
                }
                DevOp::Fail { qp, status, vendor_err } => {
                    let f = sqd_sim_fault { kind: SQD_SIM_FAULT_FAIL_NEXT, qp: qp_of(qp), status: 1 + u32::from(status) % 21, vendor_err, ..Default::default() };
                    sqd_sim_inject(w.sim, &f);
                }
                DevOp::Fault { qp, kind, count, status } => {
                    let f = sqd_sim_fault {
                        kind: 1 + u32::from(kind) % 6,
                        qp: qp_of(qp),
                        at_step: u64::from(count),
                        count: u32::from(count % 8),
                        status: 1 + u32::from(status) % 21,
                        vendor_err: 0,
                    };
                    sqd_sim_inject(w.sim, &f);
                }
                DevOp::Deliver { .. } | DevOp::Events => forward_sim_events(),
                DevOp::SrqError => {
                    if let Some(m) = &w.srq {
                        assert_eq!(sqd_sim_srq_set_error(m.raw), 0);
                    }
                }
            }
        }
    }
}

/// The sim's asynchronous events, handed to the library as a ULP's event loop would.
fn forward_sim_events() {
    let w = world();
    for _ in 0..64 {
        let mut ev = ibv_async_event::default();
        // SAFETY: a live sim and a valid out struct.
        if unsafe { sqd_sim_get_async_event(w.sim, &mut ev) } != 0 {
            break;
        }
        // SAFETY: `element` is the union member that the event type names, as verbs defines it.
        let (cq, qp) = unsafe { (ev.element.cq, ev.element.qp) };
        match ev.event_type {
            IBV_EVENT_CQ_ERR => {
                if let Some(i) = (0..2).find(|&i| w.raw_cq[i] == cq) {
                    let handle = w.cq[i].get();
                    if !handle.is_null() {
                        // SAFETY: a managed CQ.
                        expect("sqd_cq_async_event(IBV_EVENT_CQ_ERR)", 0, || unsafe { sqd_cq_async_event(handle, ev.event_type) });
                    }
                }
            }
            IBV_EVENT_SRQ_ERR | IBV_EVENT_SRQ_LIMIT_REACHED | IBV_EVENT_DEVICE_FATAL | IBV_EVENT_PORT_ACTIVE | IBV_EVENT_PORT_ERR
            | IBV_EVENT_LID_CHANGE | IBV_EVENT_PKEY_CHANGE | IBV_EVENT_SM_CHANGE | IBV_EVENT_CLIENT_REREGISTER | IBV_EVENT_GID_CHANGE
            | IBV_EVENT_WQ_FATAL => {}
            t => {
                if let Some(slot) = (0..NQ).find(|&i| w.slots[i].borrow().qp == qp) {
                    let q = w.slots[slot].borrow().q;
                    if !q.is_null() {
                        // SAFETY: a live queue.
                        expect("sqd_queue_async_event (from the sim)", 0, || unsafe { sqd_queue_async_event(q, t) });
                    }
                }
            }
        }
    }
}

fn slot_of(i: u8) -> usize {
    usize::from(i) % NQ
}

fn apply(op: &Op) {
    let w = world();
    match op {
        Op::NewQueue { slot, attr } => new_queue(slot_of(*slot), attr),
        Op::FreeQueue { slot } => {
            free_queue(slot_of(*slot));
        }
        Op::PostSend { slot, wrs, repeat } => post_send(slot_of(*slot), wrs, *repeat),
        Op::PostRecv { slot, wrs } => post_recv(slot_of(*slot), wrs),
        Op::Poll { cq, max } => poll(usize::from(*cq) % 2, *max),
        Op::Arm { cq, solicited, max } => arm(usize::from(*cq) % 2, *solicited, *max),
        Op::Drain { slot } => drain(slot_of(*slot)),
        Op::Defer { slot } => defer(slot_of(*slot), false),
        Op::DeferMr { slot } => defer(slot_of(*slot), true),
        Op::Track { slot, untrack } => {
            let slot = slot_of(*slot);
            let (q, tracked) = {
                let s = w.slots[slot].borrow();
                (s.q, s.tracked)
            };
            if q.is_null() {
                return;
            }
            if *untrack {
                // SAFETY: a live queue and MR.
                let rc = call("sqd_queue_untrack_mr", || unsafe { sqd_queue_untrack_mr(q, w.mr) });
                assert_eq!(rc, if tracked { 0 } else { -libc::ENOENT });
                w.slots[slot].borrow_mut().tracked = false;
            } else {
                // SAFETY: a live queue and MR.
                let rc = call("sqd_queue_track_mr", || unsafe { sqd_queue_track_mr(q, w.mr) });
                assert_eq!(rc, if tracked { -libc::EEXIST } else { 0 });
                w.slots[slot].borrow_mut().tracked = true;
            }
        }
        Op::DeferDereg { slot, off, len } => {
            let q = w.slots[slot_of(*slot)].borrow().q;
            if q.is_null() {
                return;
            }
            let sge = sge_of(w, SgeSpec { off: *off, len: *len, bad_key: false }, false);
            let mut mr: *mut ibv_mr = null_mut();
            // SAFETY: the range lies inside the buffer, which outlives the device.
            let rc = unsafe {
                if w.scripted.is_null() {
                    sqd_sim_reg_mr(w.sim, sge.addr as *mut c_void, sge.length as usize, 0, &mut mr)
                } else {
                    sqd_scripted_reg_mr(w.scripted, sge.addr as *mut c_void, sge.length as usize, 0, &mut mr)
                }
            };
            if rc == 0 {
                // SAFETY: a live queue; the MR is handed over.
                expect("sqd_defer_dereg_mr", 0, || unsafe { sqd_defer_dereg_mr(q, mr) });
            }
        }
        Op::Invalidate { slot, rkey, flags, done } => {
            let flags = if flags & 0x100 != 0 { *flags } else { flags & SQD_INVALIDATE_FENCE };
            invalidate(slot_of(*slot), *rkey, flags, *done)
        }
        Op::QueueEvent { slot, ev } => queue_event(slot_of(*slot), ev.get()),
        Op::CqEvent { cq, ev } => cq_event(usize::from(*cq) % 2, ev.get()),
        Op::Dev(d) => dev_op(d),
        Op::Stats { slot } => stats(slot_of(*slot)),
        Op::Bad { which, arg } => bad_call(*which, *arg),
        Op::CqFree { cq } => free_cq(usize::from(*cq) % 2),
        Op::CqNew { cq, flags } => new_cq(usize::from(*cq) % 2, if flags & 0x100 != 0 { *flags } else { flags & 1 }),
        Op::DepthFor { plans, null_plans, null_out } => {
            let plans: Vec<sqd_queue_plan> = plans.iter().take(64).map(|&(s, r)| sqd_queue_plan { sq_depth: s, rq_depth: r }).collect();
            let p = if *null_plans { null() } else { plans.as_ptr() };
            let mut out = 0u64;
            let o = if *null_out { null_mut() } else { &mut out as *mut u64 };
            // SAFETY: `p` is NULL or holds plans.len() entries; `o` is NULL or valid.
            let rc = call("sqd_cq_depth_for", || unsafe { sqd_cq_depth_for(p, plans.len(), o) });
            let bad = *null_out || (*null_plans && !plans.is_empty());
            assert_eq!(rc, if bad { -libc::EINVAL } else { 0 });
            if !bad {
                let want: u64 = plans.iter().map(|p| if p.sq_depth > 0 { u64::from(p.sq_depth) + 1 } else { 0 } + u64::from(p.rq_depth)).sum();
                assert_eq!(out, want, "sqd_cq_depth_for");
            }
        }
        Op::SetReentry { slot, reentry } => {
            w.slots[slot_of(*slot)].borrow_mut().reentry = *reentry;
            if slot & SET_BATCH != 0 {
                set_release_batch(slot_of(*slot));
            }
        }
        Op::SrqNew { depth, low_watermark, flags, no_release, reentry } => srq_new(*depth, *low_watermark, *flags, *no_release, *reentry),
        Op::SrqFree => srq_free(),
        Op::SrqPostRecv { wrs } => srq_post_recv(wrs),
        Op::SrqReleaseAll => srq_release_all(),
        Op::SrqStats => srq_stats(),
    }
}

// ---- setup and teardown ---------------------------------------------------------------------------------------

fn setup(p: &Program, buf: *mut u8) -> World {
    let mut scripted: *mut sqd_scripted = null_mut();
    let mut sim: *mut sqd_sim = null_mut();
    let mut raw_cq = [null_mut(); 2];
    let cqe = |i: usize| 2 + i32::from(p.cqe[i]) * 2;
    let mut mr: *mut ibv_mr = null_mut();
    let mut slots: [RefCell<Slot>; NQ] = Default::default();
    let mut srq: Option<SrqModel> = None;
    // SAFETY (setup): every call gets valid out pointers and live objects of the device it makes.
    unsafe {
        match p.device {
            Device::Scripted => {
                assert_eq!(sqd_scripted_new(&mut scripted), 0);
                for (i, cq) in raw_cq.iter_mut().enumerate() {
                    assert_eq!(sqd_scripted_create_cq(scripted, cqe(i), cq), 0);
                }
                assert_eq!(sqd_scripted_reg_mr(scripted, buf.cast(), BUF, 0xf, &mut mr), 0);
            }
            Device::Sim { seed, loss_ppm, ack_loss_ppm, null_mode, steps_per_poll } => {
                let mut cfg = sqd_sim_config::default();
                sqd_sim_config_default(&mut cfg);
                cfg.seed = u64::from(seed);
                cfg.loss_ppm = u32::from(loss_ppm) * 4;
                cfg.ack_loss_ppm = u32::from(ack_loss_ppm) * 4;
                cfg.steps_per_poll = u32::from(steps_per_poll % 4);
                cfg.flags = if null_mode { SQD_SIM_NULL } else { 0 };
                assert_eq!(sqd_sim_new(&cfg, &mut sim), 0);
                for (i, cq) in raw_cq.iter_mut().enumerate() {
                    assert_eq!(sqd_sim_create_cq(sim, cqe(i), cq), 0);
                }
                let access = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC) as i32;
                assert_eq!(sqd_sim_reg_mr(sim, buf.cast(), BUF, access, &mut mr), 0);
                if let Some(spec) = &p.srq {
                    let mut attr = ibv_srq_init_attr::default();
                    attr.attr.max_wr = 1 + u32::from(spec.max_wr % 64);
                    attr.attr.max_sge = 4;
                    let mut raw: *mut ibv_srq = null_mut();
                    assert_eq!(sqd_sim_create_srq(sim, &mut attr, &mut raw), 0);
                    srq = Some(SrqModel {
                        raw,
                        granted: attr.attr.max_wr,
                        handle: Cell::new(null_mut()),
                        depth: Cell::new(0),
                        low_watermark: Cell::new(0),
                        blind: Cell::new(false),
                        reentry: Cell::new(SrqReentry::Nothing),
                        recvs: RefCell::new(Vec::new()),
                        next_seq: Cell::new(0),
                        releasing: Cell::new(false),
                        retired: Cell::new(false),
                    });
                }
            }
        }
        for (i, spec) in p.qps.iter().enumerate() {
            let mut s = Slot::default();
            s.send_cq = usize::from(spec.send_cq);
            s.recv_cq = usize::from(spec.recv_cq);
            let caps = sqd_scripted_qp_caps {
                max_send_wr: 1 + u32::from(spec.sq % 64),
                max_recv_wr: 1 + u32::from(spec.rq % 32),
                max_send_sge: 1 + u32::from(spec.sge % 4),
                max_recv_sge: 4,
                max_inline_data: u32::from(spec.inline),
            };
            if !scripted.is_null() {
                let mut got = caps;
                if sqd_scripted_create_qp(scripted, raw_cq[s.send_cq], raw_cq[s.recv_cq], &caps, &mut s.qp) == 0 {
                    assert_eq!(sqd_scripted_qp_caps(s.qp, &mut got), 0);
                }
                s.caps = (got.max_send_wr, got.max_recv_wr, got.max_send_sge, got.max_inline_data);
            } else {
                let srq_raw = match (&srq, &p.srq) {
                    (Some(m), Some(spec)) if i % 2 == 1 && spec.attach[i / 2] => m.raw,
                    _ => null_mut(),
                };
                s.on_srq = !srq_raw.is_null();
                let mut attr = ibv_qp_init_attr {
                    send_cq: raw_cq[s.send_cq],
                    recv_cq: raw_cq[s.recv_cq],
                    srq: srq_raw,
                    qp_type: IBV_QPT_RC,
                    cap: ibv_qp_cap {
                        max_send_wr: caps.max_send_wr,
                        max_recv_wr: caps.max_recv_wr,
                        max_send_sge: caps.max_send_sge,
                        max_recv_sge: caps.max_recv_sge,
                        max_inline_data: caps.max_inline_data,
                    },
                    ..Default::default()
                };
                assert_eq!(sqd_sim_create_qp(sim, &mut attr, &mut s.qp), 0);
                s.caps = (attr.cap.max_send_wr, attr.cap.max_recv_wr, attr.cap.max_send_sge, attr.cap.max_inline_data);
                if i % 2 == 1 {
                    // Pairs (0, 1) and (2, 3) are connected to each other (already in RTS in null mode).
                    let a = slots[i - 1].get_mut().qp;
                    sqd_sim_connect(a, s.qp, null());
                }
            }
            slots[i] = RefCell::new(s);
        }
    }
    World {
        scripted,
        sim,
        raw_cq,
        cq: [Cell::new(null_mut()), Cell::new(null_mut())],
        polling: Default::default(),
        slots,
        buf,
        mr,
        wc: RefCell::new(vec![ibv_wc::default(); WC]),
        truthful: Cell::new(true),
        depth: Cell::new(0),
        in_teardown: Cell::new(false),
        srq,
    }
}

/// QPs to error, drain and poll until everything is released, then free every object; the model must agree.
fn teardown(thread_safe: [bool; 2]) {
    let w = world();
    let _ = thread_safe;
    w.depth.set(1); // no more re-entrant calls from callbacks
    w.in_teardown.set(true);
    for slot in 0..NQ {
        let qp = w.slots[slot].borrow().qp;
        if qp.is_null() {
            continue;
        }
        // SAFETY: a live QP of the device.
        unsafe {
            if w.scripted.is_null() {
                sqd_sim_set_error(qp);
            } else {
                sqd_scripted_set_error(qp);
            }
        }
    }
    for slot in 0..NQ {
        let q = w.slots[slot].borrow().q;
        if q.is_null() {
            continue;
        }
        let mut done = false;
        for _ in 0..300 {
            // SAFETY: a live queue.
            let rc = call("sqd_queue_drain", || unsafe { sqd_queue_drain(q) });
            if rc == 0 {
                done = true;
                break;
            }
            assert!(rc == -libc::EINPROGRESS || rc == -libc::EIO, "sqd_queue_drain returned {rc} ({})", last_error());
            for cq in 0..2 {
                poll(cq, MaxSel::Small(63));
            }
            if !w.sim.is_null() {
                // SAFETY: a live sim.
                unsafe { sqd_sim_step(w.sim, 4) };
            }
        }
        if !done {
            let honest = w.slots[slot].borrow().honest;
            assert!(!honest, "slot {slot}: drain never finished on a QP in error: {}", last_error());
            // A queue that was told more than its QP holds: the device refused some WRs for good. Tell it the
            // QP is dead, which releases everything.
            queue_event(slot, IBV_EVENT_QP_FATAL);
            // SAFETY: a live queue.
            expect("sqd_queue_drain after IBV_EVENT_QP_FATAL", 0, || unsafe { sqd_queue_drain(q) });
        }
        if w.slots[slot].borrow().srq_attached {
            // Its QP is in error: the sim has raised (or raised earlier, perhaps before this queue existed)
            // IBV_EVENT_QP_LAST_WQE_REACHED. Report it, then poll its receive CQ empty, as the header says.
            forward_sim_events();
            queue_event(slot, IBV_EVENT_QP_LAST_WQE_REACHED);
            for _ in 0..8 {
                for cq in 0..2 {
                    poll(cq, MaxSel::Small(63));
                }
            }
        }
        sync_quiet(slot);
        {
            let s = w.slots[slot].borrow();
            assert!(s.sends.is_empty(), "slot {slot}: {} accepted WRs never released", s.sends.len());
            assert!(s.recvs.is_empty(), "slot {slot}: {} receives never released", s.recvs.len());
            assert!(s.invs.is_empty(), "slot {slot}: an invalidation never reported");
            assert_eq!(s.defers, 0, "slot {slot}: a deferred action never ran");
        }
        stats(slot);
        let mut st = sqd_queue_stats::default();
        // SAFETY: a live queue and a valid out struct.
        expect("sqd_queue_stats", 0, || unsafe { sqd_queue_stats(q, &mut st) });
        assert_eq!(st.accepted, st.released, "slot {slot}: drained with WRs the queue counts unreleased");
        assert_eq!((st.backlog, st.recv_outstanding, st.deferred), (0, 0, 0), "slot {slot}: drained with work left");
        assert_eq!(free_queue(slot), 0, "slot {slot}: free after drain: {}", last_error());
    }
    if let Some(m) = &w.srq {
        let h = m.handle.get();
        if !h.is_null() {
            // No queue is attached any more, so no QP can consume the SRQ's receives through the library.
            // SAFETY: a live managed SRQ.
            expect("sqd_srq_release_all", 0, || unsafe { sqd_srq_release_all(h) });
            assert!(m.blind.get() || m.recvs.borrow().is_empty(), "{} SRQ receives never released", m.recvs.borrow().len());
            srq_stats();
            // SAFETY: as above; nothing is posted or attached.
            expect("sqd_srq_free", 0, || unsafe { sqd_srq_free(h) });
            m.handle.set(null_mut());
        }
    }
    for cq in 0..2 {
        let handle = w.cq[cq].get();
        if !handle.is_null() {
            // SAFETY: a managed CQ with no queue left.
            expect("sqd_cq_free", 0, || unsafe { sqd_cq_free(handle) });
            w.cq[cq].set(null_mut());
        }
    }
    // SAFETY: every handle on the device is freed; the device frees what it made.
    unsafe {
        if !w.scripted.is_null() {
            if w.truthful.get() {
                let n = sqd_scripted_violation_count(w.scripted);
                for i in 0..n.max(0) as usize {
                    let mut text = [0 as std::ffi::c_char; 256];
                    sqd_scripted_violation(w.scripted, i, text.as_mut_ptr(), text.len());
                    let t = CStr::from_ptr(text.as_ptr()).to_string_lossy();
                    assert!(!t.starts_with("SQ overflow") && !t.starts_with("CQ overrun"), "the device was overrun: {t}");
                }
            }
            sqd_scripted_free(w.scripted);
        } else {
            if w.truthful.get() {
                let n = sqd_sim_violation_count(w.sim);
                for i in 0..n.max(0) as usize {
                    let mut v = sqd_sim_violation { kind: 0, qp_num: 0, wqe_index: 0, step: 0, text: [0; 256] };
                    sqd_sim_violation(w.sim, i, &mut v);
                    let t = CStr::from_ptr(v.text.as_ptr()).to_string_lossy();
                    assert!(v.kind != SQD_SIM_VIOLATION_SQ_OVERFLOW && v.kind != SQD_SIM_VIOLATION_CQ_OVERRUN, "the device was overrun: {t}");
                }
            }
            sqd_sim_free(w.sim);
        }
    }
}

fn run(p: &Program) {
    let mut buf = vec![0u8; BUF];
    let w = setup(p, buf.as_mut_ptr());
    WORLD.with(|c| c.set(&w));
    for i in 0..2 {
        new_cq(i, u32::from(p.thread_safe[i]));
    }
    for op in p.ops.iter().take(400) {
        apply(op);
    }
    teardown(p.thread_safe);
    WORLD.with(|c| c.set(null()));
    drop(w);
    drop(buf);
}

fuzz_target!(|p: Program| {
    run(&p);
});
