//! The discipline core: the state machines behind a managed queue, in safe Rust with no FFI types.
//!
//! Nothing here touches a verbs object. [`SendState`] decides, for each WR the ULP hands over, whether it is
//! posted now (with which token and whether signaled), parked in the backlog, or refused; it retires slots when
//! completions arrive and hands out releases in post order. [`RecvState`] does the same for receives.
//! [`Backlog`] is a queue's bounded list of WRs that wait for credits (their storage is a
//! [`backlog::ParkStore`] shared per CQ), [`budget`] does the CQ arithmetic, [`token`] packs a queue index, a direction and a sequence number into a 64-bit wr_id, and
//! [`late`] bounds the completions that may still arrive for WRs already released.

#![forbid(unsafe_code)]

pub mod backlog;
pub mod budget;
pub mod check;
pub mod late;
pub mod opcode;
pub mod recv;
pub mod ring;
pub mod send;
pub mod signal;
pub mod srq;
pub mod token;

pub use backlog::Backlog;
pub use recv::RecvState;
pub use ring::{Slot, SlotRing};
pub use send::{Admit, Release, SendState};
pub use signal::SignalPolicy;
pub use token::{Direction, Token};
