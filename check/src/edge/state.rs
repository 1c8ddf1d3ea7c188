//! The one checker of the process, behind a lock, with the provider ops of every attached context.

use std::ffi::c_int;
use std::sync::{Mutex, MutexGuard, Once};

use rdma_sys::{ibv_cq, ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_wc};

use crate::rules::config::{Config, Mode};
use crate::rules::hash::FastMap;
use crate::rules::model::Checker;

pub type PostSendFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type PollFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;

/// The provider's own data-path ops of an attached context.
#[derive(Clone, Copy)]
pub struct Originals {
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub poll_cq: Option<PollFn>,
}

pub struct State {
    pub checker: Checker,
    pub contexts: FastMap<usize, Originals>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
static WARN: Once = Once::new();

/// Locks the state, creating it from the environment the first time. A panic while it was held (a bug here)
/// does not stop the checker: the state is used as it was left.
pub fn lock() -> MutexGuard<'static, Option<State>> {
    let mut g = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        let (cfg, warnings) = Config::from_vars(|k| std::env::var(k).ok());
        WARN.call_once(|| {
            for w in warnings {
                eprintln!("sqdisc-check: {w}");
            }
        });
        *g = Some(State { checker: Checker::new(cfg), contexts: FastMap::default() });
    }
    g
}

/// Like [`lock`], but gives up at once if another thread holds the lock (for a signal handler).
pub fn try_lock() -> Option<MutexGuard<'static, Option<State>>> {
    match STATE.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

impl State {
    pub fn off(&self) -> bool {
        self.checker.cfg.mode == Mode::Off
    }
}
