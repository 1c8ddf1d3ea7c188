//! `libsqdisc_sim_preload.so`: makes unmodified verbs programs find and use the sqdisc-sim device.
//!
//! Preloaded (`LD_PRELOAD`, as `sqdisc-sim run` sets it), it defines the functions of libibverbs that find
//! devices and make and destroy objects (`ibv_get_device_list`, `ibv_open_device`, `ibv_reg_mr`,
//! `ibv_create_qp`, `ibv_modify_qp`, ...) and those of librdmacm's connection manager, in front of the real
//! libraries, which need a kernel device. Each becomes a request to the device daemon. The data path —
//! libibverbs' inline `ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`, `ibv_poll_cq`,
//! `ibv_req_notify_cq` — reaches this library through the context's ops table, as it reaches a hardware
//! provider, and goes to the daemon too, where the model runs.
//!
//! Every entry point runs inside a panic boundary: a bug here fails that call, it never unwinds into C.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![allow(clippy::missing_safety_doc)]

mod conn;
mod cm;
mod context;
mod datapath;
mod events;
mod objects;
mod qp;
mod unsupported;

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`; a panic becomes `on_panic` (and a message), never an unwind into the caller.
pub(crate) fn guarded<T>(name: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        eprintln!("sqdisc-sim: {name}: internal error");
        set_errno(libc::EIO);
        on_panic
    })
}

pub(crate) fn set_errno(e: i32) {
    // SAFETY: `__errno_location` returns the calling thread's errno, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Reports a failure as the verbs call would: errno set, a message on stderr for anything other than a full
/// queue or a nonblocking read with nothing to read (those are normal).
pub(crate) fn report(name: &str, f: &conn::Failure) {
    set_errno(f.errno);
    if f.errno != libc::EAGAIN && f.errno != libc::ENOMEM {
        eprintln!("sqdisc-sim: {name}: {}", f.message);
    }
}
