//! The only code that touches verbs objects.
//!
//! Data-path calls go through the `struct ibv_context` ops table, exactly as libibverbs' inline
//! `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` do, so any provider works unchanged: a real HCA's, the
//! scripted test device, the software HCA. Handles are built by `unsafe` constructors whose contracts the C
//! layer upholds; their methods are then safe.

mod callback;
mod cq;
mod qp;
mod staged;
mod wr;

pub use callback::{ForeignDeferred, ForeignRelease};
pub use cq::CqHandle;
pub use qp::{PostFailure, QpHandle};
pub use staged::{pump_backlog, StagedWr};
pub use wr::{RecvChain, RecvWrPtr, SendChain, WrPtr};

pub use rdma_sys::{ibv_cq, ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_wc};

/// libibverbs providers return a positive errno; some return it negated. Normalise to positive.
fn errno_of(ret: i32) -> i32 {
    if ret == 0 {
        0
    } else {
        ret.abs()
    }
}
