//! Property-based fault campaigns against the software HCA, with shrinking.
//!
//! Each case is a random program (`campaign/ops.rs`): managed CQs and queues created and freed, every RC
//! opcode posted with and without signaled/fence/inline, receives on RQs and a shared SRQ, the peer sending,
//! polls and arms, defers, invalidations and deferred deregistrations, drains, asynchronous events, and
//! faults (request and ACK loss, delay, RNR, remote access errors, failing WQEs, QP fatal, a CQ overrun by a
//! QP outside the budget, an SRQ error), on a sim with random loss and delays. `campaign/world.rs` runs it
//! and checks the invariants after every operation, against the sim's oracle; the case ends by draining and
//! freeing everything, and the thread's live heap allocations must be back where they started.
//!
//! A failing case is shrunk by proptest to a minimal one and printed as Rust: paste it into a `#[test]` below
//! as `replay(Case { .. })`.
//!
//! `cargo test` runs a bounded campaign (`SQDISC_CAMPAIGN_CASES`, default 2500, about 40 s in a debug build). `make soak` runs it for
//! `SQDISC_CAMPAIGN_SECS` seconds (default 600). `SQDISC_CAMPAIGN_SEED` picks the generator's seed.

#[path = "campaign/ops.rs"]
mod ops;
mod sim_support;
#[path = "campaign/world.rs"]
mod world;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

#[allow(unused_imports)]
use ops::{Case, Fault::*, Op::*, Opc::*, Recv::*, Sim, Wr, Wrs};
use world::{Report, World};

// ---- leak accounting -----------------------------------------------------------------------------------

/// Counts this thread's live heap allocations, so a case can prove it freed everything it allocated.
struct Counting;

thread_local! {
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

fn bump(n: i64) {
    let _ = LIVE.try_with(|c| c.set(c.get() + n));
}

fn live() -> i64 {
    LIVE.with(|c| c.get())
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a const-initialised
// thread-local `Cell` without a destructor, which allocates nothing and is never borrowed across a call.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's own layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            bump(1);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's own layout.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            bump(1);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`, with this layout.
        unsafe { System.dealloc(ptr, layout) };
        bump(-1);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`; a reallocation neither adds nor removes a live allocation.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

// ---- running cases -------------------------------------------------------------------------------------

/// Runs one case: every operation, then the teardown. `Err` names the first broken rule.
fn run_case(case: &Case) -> Result<Report, String> {
    let mut w = World::new(&case.sim);
    for (k, op) in case.ops.iter().enumerate() {
        w.apply(op).map_err(|e| format!("after op #{k} {op:?}: {e}"))?;
    }
    w.finish().map_err(|e| format!("in teardown: {e}"))
}

/// `run_case` plus the leak check: the thread's live allocations are the same before and after.
fn run_checked(case: &Case) -> Result<Report, String> {
    let before = live();
    let r = run_case(case);
    let leaked = live() - before;
    let report = r?;
    if leaked != 0 {
        return Err(format!("{leaked} heap allocation(s) still live after everything was freed"));
    }
    Ok(report)
}

/// Replays one case (a regression test pastes a shrunk case here).
#[allow(dead_code)]
fn replay(case: Case) {
    warm_up();
    if let Err(e) = run_checked(&case) {
        panic!("{e}\n{case:?}");
    }
}

/// One-time allocations of the process (registries the library and the sim keep, the thread's first use of
/// some std facilities) happen here, before any case is measured.
fn warm_up() {
    let case = Case {
        sim: Sim { seed: 1, loss_ppm: 0, ack_loss_ppm: 0, delay_max: 1, ack_delay: 0, tx_per_step: 1 },
        ops: vec![
            NewCq { cq: 0, cqe: 160 },
            NewQueue { slot: 1, send_cq: 0, recv_cq: 0, recv: Shared, sq: 4, interval: 0, backlog: 4, verify: false },
            Post { slot: 1, wrs: Wrs(vec![Wr { opc: SendPlain, len: 8, signaled: false, fence: false, inline: false }]) },
        ],
    };
    let _ = run_case(&case);
}

/// A number from the environment, decimal or `0x` hexadecimal; a value that is neither stops the run, rather than
/// running with the default.
fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
        None => v.replace('_', "").parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("{name}={v:?} is not a number (decimal or 0x hexadecimal): {e}")))
}

#[derive(Default)]
struct Totals {
    cases: Cell<u64>,
    ops: Cell<u64>,
    faults: Cell<u64>,
    lost: Cell<u64>,
    rnr: Cell<u64>,
    releases: Cell<u64>,
    defers: Cell<u64>,
    probes: Cell<u64>,
    events: Cell<u64>,
}

impl Totals {
    fn add(&self, r: &Report) {
        let add = |c: &Cell<u64>, n: u64| c.set(c.get() + n);
        add(&self.cases, 1);
        add(&self.ops, r.ops);
        add(&self.faults, r.faults);
        add(&self.lost, r.lost);
        add(&self.rnr, r.rnr_naks);
        add(&self.releases, r.releases);
        add(&self.defers, r.defers);
        add(&self.probes, r.rkeys_probed);
        add(&self.events, r.async_events);
    }
}

/// Runs batches of cases until `cases` were run or `deadline` passed; panics with the shrunk case on failure.
fn campaign(seed: u64, cases: u64, deadline: Option<Duration>, max_ops: usize) -> Totals {
    warm_up();
    let start = Instant::now();
    let totals = Totals::default();
    let mut batch = 0u64;
    const BATCH: u64 = 32;
    while totals.cases.get() < cases && deadline.is_none_or(|d| start.elapsed() < d) {
        let n = BATCH.min(cases - totals.cases.get());
        let config = Config { cases: n as u32, max_shrink_iters: 4096, failure_persistence: None, ..Config::default() };
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        bytes[8..16].copy_from_slice(&batch.to_le_bytes());
        let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
        let shrinking = Cell::new(false);
        let result = runner.run(&ops::case(max_ops).boxed(), |case| match run_checked(&case) {
            Ok(r) => {
                if !shrinking.get() {
                    totals.add(&r);
                }
                Ok(())
            }
            Err(e) => {
                shrinking.set(true);
                Err(TestCaseError::fail(e))
            }
        });
        match result {
            Ok(()) => {}
            Err(TestError::Fail(why, case)) => panic!(
                "fault campaign failed (SQDISC_CAMPAIGN_SEED={seed}, batch {batch}): {why}\n\
                 minimal reproduction (paste into tests/campaign.rs: #[test] fn name() {{ replay(...) }}):\n{case:?}"
            ),
            Err(TestError::Abort(why)) => panic!("fault campaign aborted: {why}"),
        }
        batch += 1;
    }
    eprintln!(
        "fault campaign (SQDISC_CAMPAIGN_SEED={seed}): {} cases, {} operations, {} faults injected, {} packets/responses lost, \
         {} RNR NAKs, {} releases checked, {} barriers, {} invalidated rkeys probed, {} async events, in {:.1}s",
        totals.cases.get(),
        totals.ops.get(),
        totals.faults.get(),
        totals.lost.get(),
        totals.rnr.get(),
        totals.releases.get(),
        totals.defers.get(),
        totals.probes.get(),
        totals.events.get(),
        start.elapsed().as_secs_f64()
    );
    totals
}

fn soak() -> bool {
    std::env::var("SQDISC_SOAK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The bounded campaign `cargo test` runs; `make soak` (`SQDISC_SOAK=1`) runs it for a duration instead.
#[test]
fn fault_campaign() {
    let seed = env_u64("SQDISC_CAMPAIGN_SEED").unwrap_or(0x5eed_0001);
    let (cases, deadline) = if soak() {
        (env_u64("SQDISC_CAMPAIGN_CASES").unwrap_or(u64::MAX), Some(Duration::from_secs(env_u64("SQDISC_CAMPAIGN_SECS").unwrap_or(600))))
    } else {
        (env_u64("SQDISC_CAMPAIGN_CASES").unwrap_or(2500), env_u64("SQDISC_CAMPAIGN_SECS").map(Duration::from_secs))
    };
    let t = campaign(seed, cases, deadline, 64);
    // Not vacuous: the programs reached the paths the campaign is about.
    assert!(t.cases.get() > 0);
    assert!(t.faults.get() > 0 && t.lost.get() > 0, "no fault was injected");
    assert!(t.releases.get() > 0 && t.defers.get() > 0 && t.probes.get() > 0, "releases, barriers or rkey probes never happened");
}

// ---- the checks' own checks --------------------------------------------------------------------------------

/// The leak check is not blind: an allocation left live is counted.
#[test]
fn a_leak_is_caught() {
    warm_up();
    let before = live();
    std::mem::forget(vec![1u8; 16]);
    assert_eq!(live() - before, 1, "the allocation counter sees a leaked allocation");
}

// ---- regressions: shrunk cases of bugs the campaign found ---------------------------------------------

/// The simulator of the shrunk cases below: no loss, no delay beyond one step, `tx_per_step` packets a step.
fn calm(tx_per_step: u32) -> Sim {
    Sim { seed: 0, loss_ppm: 0, ack_loss_ppm: 0, delay_max: 1, ack_delay: 0, tx_per_step }
}

/// A receive posted after an asynchronous event abandoned the queue (here `IBV_EVENT_CQ_ERR` of its receive
/// CQ) was accepted and handed to a QP whose CQ takes no CQE any more: it was never released, and the queue
/// could never be freed.
#[test]
fn a_receive_posted_after_the_queue_was_abandoned_is_refused() {
    replay(Case {
        sim: calm(4),
        ops: vec![
            NewCq { cq: 0, cqe: 160 },
            NewCq { cq: 1, cqe: 160 },
            NewQueue { slot: 0, send_cq: 0, recv_cq: 1, recv: OwnRq, sq: 8, interval: 0, backlog: 8, verify: false },
            Overrun { cq: 1 },
            Step { n: 120 },
            Events,
            PostRecv { slot: 0, n: 1 },
        ],
    });
}

/// Found by a soak run: a queue that signals every WR reserves its SQ depth alone on its send CQ (it never posts
/// a marker), so it fits a CQ of exactly that many CQEs; the campaign's model of the reservation still counted
/// a marker and called the library's acceptance a CQ overrun risk.
#[test]
fn a_queue_signaling_every_wr_fits_a_cq_of_its_sq_depth() {
    replay(Case {
        sim: calm(1),
        ops: vec![
            NewCq { cq: 2, cqe: 13 },
            NewQueue { slot: 2, send_cq: 2, recv_cq: 0, recv: NoRecv, sq: 13, interval: 1, backlog: 0, verify: false },
        ],
    });
}

/// Found by a soak run (seed 7): requests lost past the retry count make the transport give up on the queue's
/// idle-tail marker, a WQE of the library's own, whose error completion no release carries; the ULP's next WR
/// is released flushed. The campaign's model took that flush for a failure no fault explains: it learned of a
/// transport failure from releases only, not from the queue's failure status (`QueueStats::failed_status`),
/// which is where the library reports a cause its own WQE met.
#[test]
fn a_transport_failure_on_the_librarys_marker_explains_the_flushes_after_it() {
    let write = Wr { opc: Write, len: 0, signaled: false, fence: false, inline: false };
    replay(Case {
        sim: calm(1),
        ops: [ops::prologue(), vec![
            Post { slot: 0, wrs: Wrs(vec![write, write, write]) },
            NewCq { cq: 0, cqe: 8 }, // CQ 0 exists: only the peers' pump after every operation runs
            SrqPost { n: 1 },
            Inject { slot: 0, fault: LoseRequests(4) },
            Inject { slot: 0, fault: LoseRequests(4) },
            Arm { cq: 0 },
            Post { slot: 0, wrs: Wrs(vec![write]) },
            Poll { cq: 0 },
            FreeQueue { slot: 0 },
        ]]
        .concat(),
    });
}

/// Found by soak runs (seeds 99 and 424242): on a send CQ that an intruder overran, the flush CQE of the queue's
/// idle-tail marker was lost; the queue holds the marker until the CQ's CQ_ERR event releases everything on the
/// CQ, so `check_free` answers EBUSY with every WR of the ULP's released. The campaign's model required Ok there.
#[test]
fn a_queue_on_an_overrun_cq_may_wait_for_a_lost_cqe_of_its_own() {
    let read = Wr { opc: Read, len: 0, signaled: false, fence: false, inline: false };
    let write = Wr { opc: Write, len: 0, signaled: false, fence: false, inline: false };
    replay(Case {
        sim: Sim { seed: 577254271249699696, loss_ppm: 0, ack_loss_ppm: 0, delay_max: 3, ack_delay: 2, tx_per_step: 2 },
        ops: [ops::prologue(), vec![
            NewQueue { slot: 3, send_cq: 1, recv_cq: 0, recv: NoRecv, sq: 9, interval: 4, backlog: 0, verify: false },
            Overrun { cq: 1 },
            Poll { cq: 0 },
            Step { n: 33 },
            Post { slot: 3, wrs: Wrs(vec![read, read]) },
            Inject { slot: 3, fault: SetError },
            Step { n: 1 },
            Overrun { cq: 0 },
            Post { slot: 1, wrs: Wrs(vec![write, write, write, write, write]) },
            NewCq { cq: 0, cqe: 8 },
            Events,
            Step { n: 1 },
            Step { n: 33 },
            Poll { cq: 1 },
            FreeQueue { slot: 3 },
        ]].concat(),
    });
}
