//! Randomized runs against the scripted device: whatever the mix of posts, chain lengths, flags, completions,
//! errors and polls, every accepted WR is released exactly once and in order, the provider never holds more
//! than sq_depth WQEs, and the ULP sees exactly the completions raw verbs would give it.

mod common;

use std::collections::BTreeSet;

use common::*;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn run(make: Make, seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let depth = 2 + rng.below(30) as u32;
    let interval = 1 + rng.below(depth as u64) as u32;
    let backlog = if rng.below(3) == 0 { 0 } else { rng.below(40) as u32 };
    let rig = Rig::on(make, config(depth, interval, backlog), depth as i32 + 1);
    let mut next_id = 0u64;
    let mut accepted: Vec<u64> = Vec::new();
    let mut ulp_signaled = BTreeSet::new();
    let mut shown: Vec<(u64, u32)> = Vec::new();
    let mut failed = false;
    for _step in 0..300 {
        match rng.below(10) {
            0..=3 => {
                let n = 1 + rng.below(12);
                let mut chain = Chain::new();
                let mut ids = Vec::new();
                for _ in 0..n {
                    let flags = if rng.below(5) == 0 { SIGNALED } else { 0 };
                    chain = chain.push(next_id, WR_SEND, flags, &[16]);
                    ids.push((next_id, flags));
                    next_id += 1;
                }
                let taken = match rig.post(&mut chain) {
                    Ok(()) => ids.len(),
                    Err((errno, bad)) => {
                        assert!(errno == libc::EAGAIN || errno == libc::EIO, "errno {errno}");
                        bad.expect("bad_wr points into the chain")
                    }
                };
                for &(id, flags) in &ids[..taken] {
                    accepted.push(id);
                    if flags & SIGNALED != 0 {
                        ulp_signaled.insert(id);
                    }
                }
                for (i, w) in chain.wrs.iter().enumerate() {
                    assert_eq!((w.wr_id, w.send_flags), ids[i], "the chain is restored");
                }
            }
            4..=6 => {
                rig.complete(rng.below(depth as u64 + 1) as usize);
            }
            7 if !failed && rng.below(15) == 0 => {
                if rig.dev.fail(rig.qp, WC_REM_ACCESS_ERR, 9).is_ok() {
                    failed = true;
                }
            }
            _ => {
                shown.extend(rig.poll_all().into_iter().map(|(id, st, _)| (id, st)));
            }
        }
    }
    // Quiesce: complete and poll until everything is released.
    for _ in 0..(4 * depth as usize + 50) {
        rig.complete(usize::MAX);
        shown.extend(rig.poll_all().into_iter().map(|(id, st, _)| (id, st)));
        if rig.log.borrow().len() == accepted.len() {
            break;
        }
    }
    let log = rig.log.borrow();
    assert_eq!(log.iter().map(|c| c.wr_id).collect::<Vec<_>>(), accepted, "seed {seed}: exactly once, in order");
    let dq = rig.dev.qp_stats(rig.qp).unwrap();
    assert!(dq.max_outstanding <= depth as u64, "seed {seed}: provider held {} > {depth}", dq.max_outstanding);
    assert!(rig.dev.violations().is_empty(), "seed {seed}: {:?}", rig.dev.violations());
    // What the ULP saw: its signaled WRs that succeeded, and every WR that completed in error (posted ones).
    let expect: Vec<(u64, u32)> = log
        .iter()
        .filter(|c| !c.never_posted() && (c.status != WC_SUCCESS || ulp_signaled.contains(&c.wr_id)))
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(shown, expect, "seed {seed}: poll shows what raw verbs would");
    assert!(log.iter().all(|c| c.status == WC_SUCCESS || failed), "seed {seed}");
    drop(log);
    rig.q().check_free().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
}

#[test]
fn random_workloads_keep_every_rule_on_the_scripted_device() {
    for seed in 1..=400 {
        run(scripted, seed);
    }
}

#[test]
fn random_workloads_keep_every_rule_on_the_software_hca() {
    for seed in 1..=200 {
        run(sim, seed);
    }
}
