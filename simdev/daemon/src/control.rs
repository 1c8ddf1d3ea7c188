//! The commands: the daemon in the foreground, starting it in the background, and asking it for its state.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sqdisc_sim::{SimConfig, SimDevice, SQD_SIM_ARM_PENDING, SQD_SIM_STRICT};
use sqdisc_sim_proto::{decode, encode, recv_message, send_message, DeviceSettings, Reply, Request, ViolationInfo, PROTOCOL_VERSION};

use crate::server::Server;
use crate::{sys, Settings};

type Result<T> = std::result::Result<T, String>;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn lock_path(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

fn log_path(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".log");
    PathBuf::from(p)
}

fn device_settings(s: &Settings) -> DeviceSettings {
    DeviceSettings {
        seed: s.seed,
        loss_ppm: s.loss_ppm,
        ack_loss_ppm: s.ack_loss_ppm,
        retrans_timeout: s.retrans_timeout,
        rnr_delay: s.rnr_delay,
        strict: s.strict,
        arm_pending: s.arm_pending,
    }
}

/// The daemon, in this process, until `stop` or SIGTERM/SIGINT. At the end it prints the violation log.
pub fn daemon(socket: &Path, settings: Settings) -> Result<ExitCode> {
    let dir = socket.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    let lock = lock_path(socket);
    let Some(lock_fd) = sys::try_lock(&lock).map_err(|e| format!("cannot lock {}: {e}", lock.display()))? else {
        let pid = std::fs::read_to_string(&lock).unwrap_or_default();
        return Err(format!("a daemon already serves {} (pid {})", socket.display(), pid.trim()));
    };
    let mut lock_file = std::fs::File::from(lock_fd);
    let _ = lock_file.set_len(0);
    let _ = write!(lock_file, "{}", std::process::id());

    // The lock is ours: a socket file left there is a dead daemon's.
    let _ = std::fs::remove_file(socket);
    let listener = sys::listen(socket).map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
    let _ = std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600));

    let config = SimConfig {
        seed: settings.seed,
        loss_ppm: settings.loss_ppm,
        ack_loss_ppm: settings.ack_loss_ppm,
        retrans_timeout: settings.retrans_timeout,
        rnr_delay: settings.rnr_delay,
        flags: if settings.strict { SQD_SIM_STRICT } else { 0 } | if settings.arm_pending { SQD_SIM_ARM_PENDING } else { 0 },
        ..SimConfig::default()
    };
    let dev = SimDevice::new(&config).map_err(|e| format!("bad settings: {}", e.message()))?;
    // SAFETY: prctl with an integer argument; a timer slack of 1 µs lets the loop's short sleeps (one `tick`)
    // end on time instead of up to 50 µs late.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000) };
    // SAFETY: `on_signal` only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    eprintln!("sqdisc-sim: daemon (pid {}) serving {} with {:?}", std::process::id(), socket.display(), device_settings(&settings));
    let mut server = Server::new(dev, device_settings(&settings), Duration::from_micros(settings.tick_us), listener)
        .map_err(|e| format!("cannot start: {e}"))?;
    let violations = server.run(&STOP).map_err(|e| format!("stopped by an error: {e}"))?;
    let _ = std::fs::remove_file(socket);
    eprintln!("sqdisc-sim: daemon stopping; {} violation(s) logged", violations.len());
    for v in &violations {
        eprintln!("{}", violation_line(v));
    }
    drop(lock_file);
    Ok(ExitCode::SUCCESS)
}

fn violation_line(v: &ViolationInfo) -> String {
    let wqe = v.wqe_index.map_or_else(|| "-".to_string(), |w| w.to_string());
    let who = if v.pid == 0 { "no process".to_string() } else { format!("pid {} ({})", v.pid, v.program) };
    format!("step {} {who} qp {:#x} wqe {wqe}: {}", v.step, v.qp_num, v.text)
}

/// A connection to the daemon, said hello to.
struct Connection {
    sock: std::os::fd::OwnedFd,
    buf: Vec<u8>,
}

impl Connection {
    fn open(socket: &Path) -> std::io::Result<Connection> {
        let sock = sys::connect(socket)?;
        let mut c = Connection { sock, buf: Vec::new() };
        match c.ask(&Request::Hello { version: PROTOCOL_VERSION, program: "sqdisc-sim".into() })? {
            Reply::Welcome { .. } => Ok(c),
            Reply::Error { errno, message } => Err(std::io::Error::new(std::io::Error::from_raw_os_error(errno).kind(), message)),
            other => Err(std::io::Error::other(format!("unexpected answer {other:?}"))),
        }
    }

    fn ask(&mut self, request: &Request) -> std::io::Result<Reply> {
        send_message(self.sock.as_raw_fd(), &encode(request), None)?;
        match recv_message(self.sock.as_raw_fd(), &mut self.buf)? {
            Some(_) => decode(&self.buf).ok_or_else(|| std::io::Error::other("a malformed answer")),
            None => Err(std::io::Error::other("the daemon closed the connection")),
        }
    }
}

fn connect(socket: &Path) -> Result<Connection> {
    Connection::open(socket).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            format!("no daemon on {}: {e} (start one with `sqdisc-sim start`)", socket.display())
        }
        _ => format!("cannot use the daemon on {}: {e}", socket.display()),
    })
}

/// Starts the daemon in the background unless one runs; returns its pid.
pub fn start(socket: &Path, settings: Settings) -> Result<u32> {
    if let Ok(mut c) = Connection::open(socket) {
        if let Ok(Reply::Status { daemon_pid, .. }) = c.ask(&Request::Status) {
            return Err(format!("a daemon already serves {} (pid {daemon_pid})", socket.display()));
        }
    }
    spawn(socket, settings)
}

fn spawn(socket: &Path, s: Settings) -> Result<u32> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    if let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path(socket))
        .map_err(|e| format!("cannot open the log {}: {e}", log_path(socket).display()))?;
    let mut cmd = Command::new(exe);
    cmd.arg("--socket").arg(socket).arg("daemon");
    cmd.args(["--seed", &s.seed.to_string(), "--loss-ppm", &s.loss_ppm.to_string(), "--ack-loss-ppm", &s.ack_loss_ppm.to_string()]);
    cmd.args(["--retrans-timeout", &s.retrans_timeout.to_string(), "--rnr-delay", &s.rnr_delay.to_string(), "--tick-us", &s.tick_us.to_string()]);
    if s.strict {
        cmd.arg("--strict");
    }
    if s.arm_pending {
        cmd.arg("--arm-pending");
    }
    cmd.stdin(Stdio::null()).stdout(log.try_clone().map_err(|e| e.to_string())?).stderr(log);
    // The daemon outlives this command and the program it runs: its own session, no controlling terminal.
    // SAFETY: setsid is async-signal-safe and touches nothing of this process's state.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot start the daemon: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let mut text = String::new();
            let _ = std::fs::File::open(log_path(socket)).and_then(|mut f| f.read_to_string(&mut text));
            let last = text.lines().rev().find(|l| l.starts_with("sqdisc-sim:")).unwrap_or("");
            return Err(format!("the daemon exited at start ({status}): {last}"));
        }
        if let Ok(mut c) = Connection::open(socket) {
            if let Ok(Reply::Status { daemon_pid, .. }) = c.ask(&Request::Status) {
                return Ok(daemon_pid);
            }
        }
        if Instant::now() > deadline {
            return Err(format!("the daemon did not answer on {} within 10 s", socket.display()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn stop(socket: &Path) -> Result<ExitCode> {
    let mut c = connect(socket)?;
    let pid = match c.ask(&Request::Status).map_err(|e| e.to_string())? {
        Reply::Status { daemon_pid, .. } => daemon_pid,
        other => return Err(format!("unexpected answer {other:?}")),
    };
    c.ask(&Request::Shutdown).map_err(|e| e.to_string())?;
    // Wait until it has gone (its socket file goes last).
    let deadline = Instant::now() + Duration::from_secs(10);
    // SAFETY: kill with signal 0 only asks whether the process exists.
    while unsafe { libc::kill(pid as libc::pid_t, 0) } == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("sqdisc-sim: daemon (pid {pid}) stopped");
    Ok(ExitCode::SUCCESS)
}

pub fn status(socket: &Path) -> Result<ExitCode> {
    let mut c = connect(socket)?;
    match c.ask(&Request::Status).map_err(|e| e.to_string())? {
        Reply::Status { daemon_pid, settings, steps, clients, violations, async_refusals } => {
            println!("daemon pid {daemon_pid} on {}", socket.display());
            println!("settings: {settings:?}");
            println!("step {steps}, {violations} violation(s) logged");
            if async_refusals > 0 {
                println!("{async_refusals} post(s) a client found certain to fit were refused by the model (see the daemon log)");
            }
            // This command is one of the clients; it is not listed.
            let others: Vec<_> = clients.iter().filter(|c| c.program != "sqdisc-sim").collect();
            println!("{} client process(es)", others.len());
            for c in others {
                println!("  pid {} {}: {} QP(s), {} CQ(s), {} MR(s)", c.pid, c.program, c.qps, c.cqs, c.mrs);
            }
            Ok(ExitCode::SUCCESS)
        }
        other => Err(format!("unexpected answer {other:?}")),
    }
}

/// `sqdisc-sim fail-qps --pid P [--max N]`: prints the QPs made fatal; exits 1 when there was none.
pub fn fail_qps(socket: &Path, pid: u32, max: u32) -> Result<ExitCode> {
    let mut c = connect(socket)?;
    match c.ask(&Request::FailQps { pid, max }).map_err(|e| e.to_string())? {
        Reply::Failed { qp_nums } => {
            println!("sqdisc-sim: pid {pid}: {} QP(s) made fatal: {qp_nums:#x?}", qp_nums.len());
            Ok(if qp_nums.is_empty() { ExitCode::FAILURE } else { ExitCode::SUCCESS })
        }
        other => Err(format!("unexpected answer {other:?}")),
    }
}

pub fn report(socket: &Path) -> Result<ExitCode> {
    let mut c = connect(socket)?;
    match c.ask(&Request::Report).map_err(|e| e.to_string())? {
        Reply::Report { violations } => {
            println!("{} violation(s)", violations.len());
            for v in &violations {
                println!("{}", violation_line(v));
            }
            Ok(if violations.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(3) })
        }
        other => Err(format!("unexpected answer {other:?}")),
    }
}

/// Where the preload library is: `$SQDISC_SIM_PRELOAD`, else beside this program, else in `../lib`.
fn preload_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(sqdisc_sim_proto::PRELOAD_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    for candidate in [dir.join("libsqdisc_sim_preload.so"), dir.join("../lib/libsqdisc_sim_preload.so")] {
        if candidate.exists() {
            return candidate.canonicalize().map_err(|e| e.to_string());
        }
    }
    Err(format!("libsqdisc_sim_preload.so is neither beside {} nor in ../lib: set {}", exe.display(), sqdisc_sim_proto::PRELOAD_ENV))
}

/// Runs `program` with the preload library, starting a daemon first if none answers.
pub fn run(socket: &Path, settings: Settings, program: &[String]) -> Result<ExitCode> {
    let preload = preload_path()?;
    match Connection::open(socket) {
        Ok(_) => {}
        // No daemon: no socket file, or one that nobody listens on (a daemon that died).
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused) => {
            spawn(socket, settings)?;
        }
        // A daemon that refuses this program (another user's), or a socket this user may not reach: starting
        // another daemon there would fail too, with a less useful message.
        Err(e) => return Err(format!("cannot use the daemon on {}: {e}", socket.display())),
    }
    // Last in LD_PRELOAD: a library preloaded before it that interposes verbs calls (the checker,
    // libsqdisc_check.so) finds the device's functions as the next definition.
    let mut ld: OsString = std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()).unwrap_or_default();
    if !ld.is_empty() {
        ld.push(":");
    }
    ld.push(preload);
    let err = Command::new(&program[0]).args(&program[1..]).env("LD_PRELOAD", ld).env(sqdisc_sim_proto::SOCKET_ENV, socket).exec();
    Err(format!("cannot run {}: {err}", program[0]))
}
