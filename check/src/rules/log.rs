//! The findings: counts per kind, the first occurrences of each, and the report.

use std::fmt::Write;

use super::kind::{Kind, ALL, KINDS};

/// `wqe_index` of a finding about no particular send WQE.
pub const NO_WQE: u64 = u64::MAX;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub kind: Kind,
    pub qp_num: u32,
    pub wqe_index: u64,
    /// Nanoseconds since the checker started.
    pub time_ns: u64,
    /// One line, starting with the kind's name.
    pub text: String,
}

#[derive(Debug, Default)]
pub struct Log {
    counts: [u64; KINDS + 1],
    records: Vec<Vec<Record>>,
    first: usize,
}

impl Log {
    pub fn new(first: u32) -> Log {
        Log { counts: [0; KINDS + 1], records: vec![Vec::new(); KINDS + 1], first: first as usize }
    }

    pub fn set_first(&mut self, first: u32) {
        self.first = first as usize;
    }

    /// Records a finding; true if it is a violation (not a notice).
    pub fn add(&mut self, r: Record) -> bool {
        let k = r.kind as usize;
        self.counts[k] += 1;
        if self.records[k].len() < self.first {
            self.records[k].push(r.clone());
        }
        r.kind.is_violation()
    }

    pub fn count(&self, kind: Kind) -> u64 {
        self.counts[kind as usize]
    }

    /// Violations of every kind (notices excluded).
    pub fn violations(&self) -> u64 {
        ALL.iter().filter(|k| k.is_violation()).map(|&k| self.count(k)).sum()
    }

    pub fn record(&self, kind: Kind, index: usize) -> Option<&Record> {
        self.records[kind as usize].get(index)
    }

    pub fn clear(&mut self) {
        let first = self.first;
        *self = Log::new(first as u32);
        self.first = first;
    }

    /// The report: counts per kind, then the first occurrences of each, one line each.
    pub fn report(&self, why: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "sqdisc-check report ({why}): {} violations", self.violations());
        for k in ALL {
            let n = self.count(k);
            if n > 0 {
                let what = if k.is_violation() { "" } else { " (notice)" };
                let _ = writeln!(s, "  {:>10}  {}{what} ({})", n, k.name(), k.rule());
            }
        }
        for k in ALL {
            let recs = &self.records[k as usize];
            if recs.is_empty() {
                continue;
            }
            let _ = writeln!(s, "first {} of {} {}:", recs.len(), self.count(k), k.name());
            for r in recs {
                let _ = writeln!(s, "  {}", line(r));
            }
        }
        s
    }
}

/// One finding as a report line: time, QP, WQE, then the text.
pub fn line(r: &Record) -> String {
    let wqe = if r.wqe_index == NO_WQE { String::from("-") } else { format!("#{}", r.wqe_index) };
    format!(
        "[{:>6}.{:06} s] qp {:#x} wqe {wqe}: {}",
        r.time_ns / 1_000_000_000,
        r.time_ns % 1_000_000_000 / 1000,
        r.qp_num,
        r.text
    )
}
