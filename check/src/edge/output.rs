//! Where the report goes: at exit, on SIGINT/SIGTERM, at the first violation in abort mode, or on request.

use std::ffi::c_int;
use std::io::Write;
use std::sync::Once;

use super::state::{lock, try_lock, State};

static HOOKS: Once = Once::new();
static EXIT_HOOK: Once = Once::new();

/// Registers the exit hook, once per process.
fn install_exit_hook() {
    EXIT_HOOK.call_once(|| {
        // SAFETY: `at_exit` is an `extern "C" fn()` that never unwinds (it catches panics).
        unsafe { libc::atexit(at_exit) };
    });
}

/// In the shared library, the exit hook is registered when the library is loaded, so that a program the
/// checker never attaches to (one that uses no verbs, or only tracks objects) still gets its report.
#[cfg(sqdisc_check_library)]
#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

#[cfg(sqdisc_check_library)]
extern "C" fn on_load() {
    install_exit_hook();
}

/// Registers the exit hook and, unless `SQDISC_CHECK_SIGNALS=0`, the SIGINT/SIGTERM hooks (only for signals the
/// program has not taken itself). Once per process.
pub fn install_hooks() {
    install_exit_hook();
    HOOKS.call_once(|| {
        let on_signal = lock().as_ref().is_some_and(|st| st.checker.cfg.on_signal);
        if on_signal {
            for sig in [libc::SIGINT, libc::SIGTERM] {
                // SAFETY: plain sigaction calls with valid, zero-initialised structures; the handler is
                // installed only where the disposition is the default one, with SA_RESETHAND so that re-raising the
                // signal ends the process as it would have ended.
                unsafe {
                    let mut old: libc::sigaction = std::mem::zeroed();
                    if libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_DFL {
                        let mut sa: libc::sigaction = std::mem::zeroed();
                        sa.sa_sigaction = on_signal_handler as extern "C" fn(c_int) as usize;
                        sa.sa_flags = libc::SA_RESETHAND;
                        libc::sigemptyset(&mut sa.sa_mask);
                        libc::sigaction(sig, &sa, std::ptr::null_mut());
                    }
                }
            }
        }
    });
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let g = lock();
        if let Some(st) = g.as_ref() {
            if !st.off() {
                let report = exit_report(st);
                let path = st.checker.cfg.report_path.clone();
                drop(g);
                emit(path.as_deref(), &report);
            }
        }
    });
}

/// The report at exit: the findings, and a line saying so when no device context was ever attached (the
/// program's posts and polls then went unwatched).
fn exit_report(st: &State) -> String {
    let mut report = st.checker.log.report("exit");
    if st.contexts.is_empty() {
        report.push_str(
            "nothing watched: no device context was attached (no CQ or QP was made through libibverbs, and \
             sqd_check_attach was not called), so no post or poll was checked\n",
        );
    }
    report
}

extern "C" fn on_signal_handler(sig: c_int) {
    // Best effort: the report needs the lock and the allocator; if another thread holds the lock, the signal
    // ends the process without it.
    let _ = std::panic::catch_unwind(|| {
        if let Some(g) = try_lock() {
            if let Some(st) = g.as_ref() {
                let report = st.checker.log.report(&format!("signal {sig}"));
                let path = st.checker.cfg.report_path.clone();
                drop(g);
                emit(path.as_deref(), &report);
            }
        }
    });
    // SAFETY: SA_RESETHAND restored the default disposition: the signal now ends the process as it would have.
    unsafe { libc::raise(sig) };
}

/// In abort mode after a violation: the report to write before aborting.
pub fn take_abort(st: &mut State) -> Option<String> {
    if !st.checker.abort_now {
        return None;
    }
    st.checker.abort_now = false;
    Some(st.checker.log.report("SQDISC_CHECK=abort: first violation"))
}

/// Writes `report` where the configuration says and aborts the process.
pub fn abort_with(report: &str) -> ! {
    let path = lock().as_ref().and_then(|st| st.checker.cfg.report_path.clone());
    emit(path.as_deref(), report);
    std::process::abort()
}

/// Writes `report` to the file named by `path` (`%p`: the process id), or to standard error.
pub fn emit(path: Option<&str>, report: &str) {
    if let Some(p) = path {
        let p = p.replace("%p", &std::process::id().to_string());
        match std::fs::File::create(&p).and_then(|mut f| f.write_all(report.as_bytes())) {
            Ok(()) => return,
            Err(e) => eprintln!("sqdisc-check: cannot write the report to {p}: {e}; it follows"),
        }
    }
    let _ = std::io::stderr().write_all(report.as_bytes());
}

/// Writes the report to a file descriptor (the C API).
pub fn write_to_fd(fd: c_int, report: &str) -> c_int {
    let mut rest = report.as_bytes();
    while !rest.is_empty() {
        // SAFETY: writes from a valid buffer of `rest.len()` bytes to the caller's descriptor.
        let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
        if n < 0 {
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
            if e == libc::EINTR {
                continue;
            }
            return -e;
        }
        rest = &rest[n as usize..];
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::config::Config;
    use crate::rules::hash::FastMap;
    use crate::rules::model::Checker;

    #[test]
    fn the_exit_report_says_when_nothing_was_watched() {
        let (cfg, _) = Config::from_vars(|_| None);
        let mut st = State { checker: Checker::new(cfg), contexts: FastMap::default() };
        let r = exit_report(&st);
        assert!(r.starts_with("sqdisc-check report (exit): 0 violations\n"), "{r}");
        assert!(r.contains("\nnothing watched: no device context was attached"), "{r}");
        st.contexts.insert(1, super::super::state::Originals { post_send: None, post_recv: None, poll_cq: None });
        assert!(!exit_report(&st).contains("nothing watched"));
    }
}
