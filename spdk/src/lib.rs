//! libsqdisc_spdk: an SPDK RDMA provider backed by sqdisc.
//!
//! SPDK's NVMe-oF target and NVMe-RDMA host reach verbs through 14 `spdk_rdma_provider_*` functions. This
//! library exports the same functions, with SPDK's signatures and structure layouts ([`abi`]), so it can
//! replace SPDK's verbs provider without a change to SPDK. Underneath, every qpair's QP is a sqdisc queue:
//! SQ credits and a backlog instead of ENOMEM, CQ budget checks that refuse a qpair whose flush could overrun
//! the poll group's CQ, moderation where SPDK left WRs unsignaled — while SPDK, which polls its CQs itself,
//! sees exactly the completions raw verbs would give it ([`interpose`]). docs/spdk.md is the user's guide.
//!
//! Every function here is an FFI edge: SPDK's pointers are trusted as SPDK's own provider trusts them.

pub mod abi;
mod cm;
mod domain;
mod flushes;
mod interpose;
mod qp;
mod srq;
mod wr_list;

use std::ffi::{c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`; a panic (a bug here) becomes `on_panic` instead of unwinding into SPDK.
fn boundary<R>(on_panic: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        log_error("internal error (panic) in the sqdisc SPDK provider");
        on_panic
    })
}

fn log(level: c_int, msg: &str) {
    let msg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    // SAFETY: SPDK's logger with a "%s\n" format and one NUL-terminated string argument.
    unsafe {
        abi::spdk_log(level, c"sqdisc_spdk".as_ptr(), 0, c"provider".as_ptr(), c"%s\n".as_ptr(), msg.as_ptr());
    }
}

pub(crate) fn log_error(msg: &str) {
    log(abi::LOG_ERROR, msg);
}

pub(crate) fn log_warn(msg: &str) {
    log(abi::LOG_WARN, msg);
}
