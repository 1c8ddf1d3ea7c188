//! Where the daemon listens.

use std::path::PathBuf;

/// The environment variable that names the daemon's socket (both sides).
pub const SOCKET_ENV: &str = "SQDISC_SIM_SOCKET";
/// The environment variable that names the preload library (`sqdisc-sim run`).
pub const PRELOAD_ENV: &str = "SQDISC_SIM_PRELOAD";

/// The daemon's socket: `$SQDISC_SIM_SOCKET`, else `$XDG_RUNTIME_DIR/sqdisc-sim/socket`, else
/// `/tmp/sqdisc-sim-<uid>/socket`. The folder is the user's own (mode 0700), so only that user reaches it.
pub fn socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os(SOCKET_ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()) {
        return PathBuf::from(dir).join("sqdisc-sim").join("socket");
    }
    // SAFETY: getuid cannot fail and has no argument.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/tmp/sqdisc-sim-{uid}")).join("socket")
}
