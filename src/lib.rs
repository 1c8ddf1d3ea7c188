//! sqdisc: a managed send queue for RDMA verbs.
//!
//! A ULP hands its `ibv_send_wr`s to a [`Queue`] instead of calling `ibv_post_send`. The queue keeps the four
//! rules of send-queue discipline by construction: SQ and CQ credits, periodic (moderated) signaling, stable
//! resources until a completion proves the HCA is done (announced by one ordered release per WR), and
//! deferred actions that run only once a completion covers every earlier WR.
//!
//! Layers: [`discipline`] is the safe, FFI-free state machine; [`verbs`] is the only code that touches verbs
//! objects (through the `struct ibv_context` ops table); [`Cq`] and [`Queue`] join the two into the public Rust
//! API; `capi` is the C ABI, a thin client of that API. The software HCA and the scripted test device are the
//! crate `sqdisc-sim` (`sim/`), which registers its devices through the device seam ([`verbs::device`]).

// Every unsafe operation sits in its own `unsafe` block with a `// SAFETY:` comment, also inside an `unsafe fn`;
// a lost error or a discarded `Result` is a bug. src/discipline forbids `unsafe` outright.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unused_must_use)]
#![deny(rust_2018_idioms)]

mod alloc;
mod attach;
mod completion;
mod cq;
pub mod discipline;
pub mod error;
mod srq;
pub mod verbs;
mod limits;
mod post_error;
mod queue;
mod release;

#[cfg(feature = "capi")]
mod capi;

pub use completion::{
    Completion, SQD_COMPLETION_BUFFER_MODIFIED, SQD_COMPLETION_IMPLIED, SQD_COMPLETION_NEVER_POSTED, SQD_COMPLETION_RECV,
    SQD_COMPLETION_REFUSED, SQD_COMPLETION_REMOTE_INV,
};
pub use cq::{BacklogPoolStats, Cq, CqStats, OutOfOrder, SQD_OUT_OF_ORDER_SHOWN, SQD_OUT_OF_ORDER_ULP_WR};
pub use error::{Error, Result};
pub use srq::{Srq, SrqStats};
pub use limits::{MAX_DEPTH, MAX_INLINE, MAX_SGE};
pub use post_error::{PostError, RecvPostError};
pub use queue::{Deferred, InvalidateMode, OutOfOrderHook, Queue, QueueConfig, QueueStats};
pub use release::{BatchHandler, ReleaseBatch, ReleaseHandler};
