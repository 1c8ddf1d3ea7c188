//! The kinds of findings, their names (the sim's wording where the rule is the same) and the rule each breaks.

/// What a finding is about. The numbers are the C API's `SQD_CHECK_*` constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    SqOverflow = 1,
    UnsignaledRun = 2,
    IdleTail = 3,
    CqUndersized = 4,
    MrInUse = 5,
    UnfencedInvalidate = 6,
    SourceModified = 7,
    UnsignaledFlush = 8,
}

/// Kinds 1..=KINDS exist; index 0 is unused.
pub const KINDS: usize = 8;

pub const ALL: [Kind; KINDS] = [
    Kind::SqOverflow,
    Kind::UnsignaledRun,
    Kind::IdleTail,
    Kind::CqUndersized,
    Kind::MrInUse,
    Kind::UnfencedInvalidate,
    Kind::SourceModified,
    Kind::UnsignaledFlush,
];

impl Kind {
    pub fn from_u32(k: u32) -> Option<Kind> {
        ALL.get((k as usize).wrapping_sub(1)).copied()
    }

    /// The name a report line starts with.
    pub fn name(self) -> &'static str {
        match self {
            Kind::SqOverflow => "SQ overflow",
            Kind::UnsignaledRun => "unsignaled run",
            Kind::IdleTail => "idle unsignaled tail",
            Kind::CqUndersized => "CQ undersized",
            Kind::MrInUse => "MR invalidated while in use",
            Kind::UnfencedInvalidate => "unfenced LocalInv",
            Kind::SourceModified => "source modified while in flight",
            Kind::UnsignaledFlush => "flush of an unsignaled WQE",
        }
    }

    /// The rule of the linux-rdma discussion of June 2017 that the finding breaks.
    pub fn rule(self) -> &'static str {
        match self {
            Kind::SqOverflow => "rule 2, credits",
            Kind::UnsignaledRun | Kind::IdleTail => "rule 1, periodic signaling",
            Kind::CqUndersized => "rule 2, CQ sizing",
            Kind::MrInUse | Kind::SourceModified => "rule 3, stable resources",
            Kind::UnfencedInvalidate => "rule 4, deferred invalidation",
            Kind::UnsignaledFlush => "a completion the ULP did not ask for",
        }
    }

    /// A violation breaks a rule; a notice reports something the ULP may not expect but that is not a bug in
    /// itself (abort mode ignores notices).
    pub fn is_violation(self) -> bool {
        self != Kind::UnsignaledFlush
    }
}
