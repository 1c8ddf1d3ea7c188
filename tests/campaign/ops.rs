//! The campaign's programs: what one case is (the sim's knobs and a list of operations), how proptest
//! generates and shrinks them, and how a case prints as Rust that a regression test can paste.

use std::fmt;

use proptest::collection::vec;
use proptest::prelude::*;

/// Queue slots a program can address (a slot holds at most one managed queue at a time).
pub const SLOTS: u8 = 4;
/// Managed CQ slots.
pub const CQS: u8 = 3;

/// The opcodes of the RC WRs a program posts through a managed queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opc {
    Write,
    WriteImm,
    SendPlain,
    SendImm,
    /// SEND_WITH_INV of a peer rkey registered for it alone.
    SendInv,
    Read,
    Cas,
    Faa,
    /// A ULP LocalInv of a local key registered for it alone (no SGE uses it).
    LocalInv,
}

/// One WR of a post.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wr {
    pub opc: Opc,
    /// Bytes of the SGE (0: no SGE; atomics always use 8).
    pub len: u32,
    pub signaled: bool,
    pub fence: bool,
    /// `IBV_SEND_INLINE` (SENDs and WRITEs only).
    pub inline: bool,
}

/// Where a queue's receives come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)] // `NoRecv` says more than `No` in a printed reproduction
pub enum Recv {
    /// Sends only.
    NoRecv,
    /// Its own RQ of 8, managed (`rq_depth` 8).
    OwnRq,
    /// The managed SRQ.
    Shared,
}

/// A fault on one queue's connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The next `n` request packets of the queue's QP are lost.
    LoseRequests(u8),
    /// The next `n` responses (ACK, NAK, read response) to the queue's QP are lost.
    LoseAcks(u8),
    /// The QP's next request fails the peer's rkey check (`IBV_WC_REM_ACCESS_ERR`, both QPs to error).
    RemoteAccess,
    /// The peer withholds its receives for `n` steps: the queue's SENDs are RNR NAKed meanwhile.
    Starve(u8),
    /// The QP's next untransmitted WQE fails (`IBV_WC_LOC_QP_OP_ERR`).
    FailNext,
    /// `IBV_EVENT_QP_FATAL` `n` steps from now.
    Fatal(u8),
    /// The ULP moves the QP to the error state (`ibv_modify_qp` to ERR).
    SetError,
}

/// One operation of a program. Slots and CQs that do not exist make an operation a no-op, so every
/// sub-list of a program is a program (what shrinking needs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    NewCq { cq: u8, cqe: u16 },
    FreeCq { cq: u8 },
    NewQueue { slot: u8, send_cq: u8, recv_cq: u8, recv: Recv, sq: u8, interval: u8, backlog: u8, verify: bool },
    FreeQueue { slot: u8 },
    Post { slot: u8, wrs: Wrs },
    PostRecv { slot: u8, n: u8 },
    SrqPost { n: u8 },
    /// The peer sends `n` messages to the queue (consuming its receives or the SRQ's).
    PeerSend { slot: u8, n: u8, imm: bool },
    Poll { cq: u8 },
    Arm { cq: u8 },
    Step { n: u8 },
    Defer { slot: u8 },
    Invalidate { slot: u8, fenced: bool },
    DeferDereg { slot: u8 },
    Drain { slot: u8 },
    /// Take the sim's asynchronous events and hand each to its owner (queue or CQ).
    Events,
    Inject { slot: u8, fault: Fault },
    /// A raw QP without a CQ budget floods a managed CQ: overrun, `IBV_EVENT_CQ_ERR`.
    Overrun { cq: u8 },
    /// The SRQ fails (`IBV_EVENT_SRQ_ERR`).
    SrqError,
}

/// A post's WRs (prints as `Wrs(vec![...])`).
#[derive(Clone, PartialEq, Eq)]
pub struct Wrs(pub Vec<Wr>);

impl fmt::Debug for Wrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Wrs(vec![")?;
        for (i, w) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{w:?}")?;
        }
        write!(f, "])")
    }
}

/// The sim's knobs for one case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sim {
    pub seed: u64,
    pub loss_ppm: u32,
    pub ack_loss_ppm: u32,
    pub delay_max: u32,
    pub ack_delay: u32,
    pub tx_per_step: u32,
}

/// One case: a sim and a program.
#[derive(Clone, PartialEq, Eq)]
pub struct Case {
    pub sim: Sim,
    pub ops: Vec<Op>,
}

impl fmt::Debug for Case {
    /// Rust source: `Case { sim: Sim { .. }, ops: vec![ .. ] }`, with `use campaign::ops::{*, Op::*, ...}` in
    /// scope (as in `tests/campaign.rs`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Case {{")?;
        writeln!(f, "    sim: {:?},", self.sim)?;
        writeln!(f, "    ops: vec![")?;
        for op in &self.ops {
            writeln!(f, "        {op:?},")?;
        }
        writeln!(f, "    ],")?;
        write!(f, "}}")
    }
}

fn wr() -> impl Strategy<Value = Wr> {
    let opc = prop_oneof![
        4 => Just(Opc::Write),
        2 => Just(Opc::WriteImm),
        4 => Just(Opc::SendPlain),
        2 => Just(Opc::SendImm),
        1 => Just(Opc::SendInv),
        2 => Just(Opc::Read),
        1 => Just(Opc::Cas),
        1 => Just(Opc::Faa),
        1 => Just(Opc::LocalInv),
    ];
    (opc, 0u32..=64, prop::bool::weighted(0.2), prop::bool::weighted(0.1), prop::bool::weighted(0.15))
        .prop_map(|(opc, len, signaled, fence, inline)| Wr { opc, len, signaled, fence, inline })
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        3 => (1u8..8).prop_map(Fault::LoseRequests),
        3 => (1u8..8).prop_map(Fault::LoseAcks),
        1 => Just(Fault::RemoteAccess),
        2 => (1u8..60).prop_map(Fault::Starve),
        1 => Just(Fault::FailNext),
        1 => (0u8..30).prop_map(Fault::Fatal),
        1 => Just(Fault::SetError),
    ]
}

fn recv() -> impl Strategy<Value = Recv> {
    prop_oneof![2 => Just(Recv::NoRecv), 2 => Just(Recv::OwnRq), 1 => Just(Recv::Shared)]
}

fn op() -> impl Strategy<Value = Op> {
    let slot = 0..SLOTS;
    let cq = 0..CQS;
    prop_oneof![
        2 => (cq.clone(), 8u16..160).prop_map(|(cq, cqe)| Op::NewCq { cq, cqe }),
        1 => cq.clone().prop_map(|cq| Op::FreeCq { cq }),
        4 => (slot.clone(), cq.clone(), cq.clone(), recv(), 1u8..=24, 0u8..=8, 0u8..=24, prop::bool::weighted(0.2)).prop_map(
            |(slot, send_cq, recv_cq, recv, sq, interval, backlog, verify)| Op::NewQueue { slot, send_cq, recv_cq, recv, sq, interval, backlog, verify }
        ),
        1 => slot.clone().prop_map(|slot| Op::FreeQueue { slot }),
        12 => (slot.clone(), vec(wr(), 1..12)).prop_map(|(slot, wrs)| Op::Post { slot, wrs: Wrs(wrs) }),
        2 => (slot.clone(), 1u8..8).prop_map(|(slot, n)| Op::PostRecv { slot, n }),
        1 => (1u8..16).prop_map(|n| Op::SrqPost { n }),
        2 => (slot.clone(), 1u8..6, any::<bool>()).prop_map(|(slot, n, imm)| Op::PeerSend { slot, n, imm }),
        8 => cq.clone().prop_map(|cq| Op::Poll { cq }),
        2 => cq.clone().prop_map(|cq| Op::Arm { cq }),
        3 => (1u8..40).prop_map(|n| Op::Step { n }),
        2 => slot.clone().prop_map(|slot| Op::Defer { slot }),
        2 => (slot.clone(), any::<bool>()).prop_map(|(slot, fenced)| Op::Invalidate { slot, fenced }),
        1 => slot.clone().prop_map(|slot| Op::DeferDereg { slot }),
        1 => slot.clone().prop_map(|slot| Op::Drain { slot }),
        2 => Just(Op::Events),
        4 => (slot.clone(), fault()).prop_map(|(slot, fault)| Op::Inject { slot, fault }),
        1 => cq.prop_map(|cq| Op::Overrun { cq }),
        1 => Just(Op::SrqError),
    ]
}

fn sim() -> impl Strategy<Value = Sim> {
    (
        any::<u64>(),
        prop_oneof![Just(0u32), 0u32..60_000],
        prop_oneof![Just(0u32), 0u32..60_000],
        1u32..6,
        0u32..4,
        1u32..5,
    )
        .prop_map(|(seed, loss_ppm, ack_loss_ppm, delay_max, ack_delay, tx_per_step)| Sim {
            seed,
            loss_ppm,
            ack_loss_ppm,
            delay_max,
            ack_delay,
            tx_per_step,
        })
}

/// What every program starts with: two CQs and two queues on them, so that most operations have something to
/// act on (shrinking may remove those too).
pub fn prologue() -> Vec<Op> {
    vec![
        Op::NewCq { cq: 0, cqe: 160 },
        Op::NewCq { cq: 1, cqe: 160 },
        Op::NewQueue { slot: 0, send_cq: 0, recv_cq: 1, recv: Recv::OwnRq, sq: 8, interval: 0, backlog: 8, verify: false },
        Op::NewQueue { slot: 1, send_cq: 1, recv_cq: 1, recv: Recv::Shared, sq: 6, interval: 2, backlog: 4, verify: false },
    ]
}

/// Cases of up to `max_ops` operations, each after the `prologue`.
pub fn case(max_ops: usize) -> impl Strategy<Value = Case> {
    let prologue = prologue();
    (sim(), vec(op(), 1..max_ops)).prop_map(move |(sim, body)| {
        let mut ops = prologue.clone();
        ops.extend(body);
        Case { sim, ops }
    })
}
