//! Malformed and truncated messages on the daemon's socket: the client that sent one is dropped, with its
//! reason in the daemon's log, and the daemon goes on serving its other clients.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqdisc_sim_proto::{decode, encode, recv_message, send_message, Reply, Request, PROTOCOL_VERSION};

struct Daemon {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
    log: PathBuf,
}

impl Daemon {
    fn start(name: &str) -> Daemon {
        let dir = std::env::temp_dir().join(format!("sqdisc-sim-faults-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("socket");
        let log = dir.join("daemon.log");
        let child = Command::new(env!("CARGO_BIN_EXE_sqdisc-sim"))
            .arg("--socket")
            .arg(&socket)
            .arg("daemon")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("the daemon starts");
        let d = Daemon { child, dir, socket, log };
        let deadline = Instant::now() + Duration::from_secs(10);
        while connect(&d.socket).is_err() {
            assert!(Instant::now() < deadline, "the daemon did not listen within 10 s: {}", d.log_text());
            std::thread::sleep(Duration::from_millis(10));
        }
        d
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log has a line containing `text`.
    fn wait_log(&self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let log = self.log_text();
            if let Some(line) = log.lines().find(|l| l.contains(text)) {
                return line.to_string();
            }
            assert!(Instant::now() < deadline, "no log line with {text:?} within 5 s; the log:\n{log}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn connect(path: &Path) -> std::io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: plain system call.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain data; zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    assert!(bytes.len() < addr.sun_path.len());
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    // SAFETY: `addr` is a valid `sockaddr_un` of `len` bytes.
    if unsafe { libc::connect(sock.as_raw_fd(), std::ptr::addr_of!(addr).cast(), len) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // A test must not wait for ever on a daemon that does not answer.
    let tv = libc::timeval { tv_sec: 5, tv_usec: 0 };
    // SAFETY: `tv` is a valid timeval for SO_RCVTIMEO.
    unsafe {
        libc::setsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, std::ptr::addr_of!(tv).cast(), std::mem::size_of::<libc::timeval>() as libc::socklen_t)
    };
    Ok(sock)
}

/// Sends raw bytes as one message, and returns the reply: `None` when the daemon closed the connection.
fn exchange(sock: &OwnedFd, bytes: &[u8]) -> Option<Reply> {
    send_message(sock.as_raw_fd(), bytes, None).expect("send");
    let mut buf = Vec::new();
    match recv_message(sock.as_raw_fd(), &mut buf) {
        Ok(Some(_)) => Some(decode(&buf).expect("a well-formed reply")),
        Ok(None) => None,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => None,
        Err(e) => panic!("no reply and no hang-up: {e}"),
    }
}

fn hello(sock: &OwnedFd, program: &str) {
    let r = exchange(sock, &encode(&Request::Hello { version: PROTOCOL_VERSION, program: program.into() }));
    assert!(matches!(r, Some(Reply::Welcome { .. })), "hello answered {r:?}");
}

/// The other client, still served: its status lists it.
fn still_served(good: &OwnedFd, after: &str) {
    match exchange(good, &encode(&Request::Status)) {
        Some(Reply::Status { clients, .. }) => {
            assert!(clients.iter().any(|c| c.program == "good-client"), "after {after}: the good client is not listed: {clients:?}")
        }
        other => panic!("after {after}: the good client's status request got {other:?}"),
    }
}

#[test]
fn a_malformed_message_drops_only_its_client() {
    let d = Daemon::start("malformed");
    let good = connect(&d.socket).unwrap();
    hello(&good, "good-client");
    let pid = std::process::id();

    // Bytes that are no message at all, as the first message.
    let c = connect(&d.socket).unwrap();
    assert_eq!(exchange(&c, &[0xff; 7]), None, "garbage was answered");
    let line = d.wait_log(&format!("dropped pid {pid} (?): it sent a malformed message of 7 bytes"));
    eprintln!("logged: {line}");
    still_served(&good, "garbage");

    // A request cut short, after a hello.
    let c = connect(&d.socket).unwrap();
    hello(&c, "truncating");
    let full = encode(&Request::RegMr { addr: 0x1000, length: 4096, iova: 0x1000, access: 1 });
    let cut = &full[..full.len() / 2];
    assert_eq!(exchange(&c, cut), None, "a truncated request was answered");
    d.wait_log(&format!("dropped pid {pid} (truncating): it sent a malformed message of {} bytes", cut.len()));
    still_served(&good, "a truncated request");

    // A request of a kind no version has (an unknown enum variant).
    let c = connect(&d.socket).unwrap();
    hello(&c, "unknown-kind");
    let mut unknown = 9999u32.to_le_bytes().to_vec();
    unknown.extend_from_slice(&[0; 16]);
    assert_eq!(exchange(&c, &unknown), None, "an unknown request was answered");
    d.wait_log(&format!("dropped pid {pid} (unknown-kind): it sent a malformed message of {} bytes", unknown.len()));
    still_served(&good, "an unknown request kind");

    // A string length far beyond the message: bincode must not allocate it.
    let c = connect(&d.socket).unwrap();
    let mut huge = 0u32.to_le_bytes().to_vec(); // Hello
    huge.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    huge.extend_from_slice(&u64::MAX.to_le_bytes()); // the program name's length
    assert_eq!(exchange(&c, &huge), None, "a hello with an impossible length was answered");
    d.wait_log(&format!("dropped pid {pid} (?): it sent a malformed message of {} bytes", huge.len()));
    still_served(&good, "an impossible length");

    // Well-formed messages out of order.
    let c = connect(&d.socket).unwrap();
    assert_eq!(exchange(&c, &encode(&Request::Status)), None, "a request before hello was answered");
    d.wait_log(&format!("dropped pid {pid} (?): its first message was not a hello"));
    let c = connect(&d.socket).unwrap();
    hello(&c, "twice");
    assert_eq!(exchange(&c, &encode(&Request::Hello { version: PROTOCOL_VERSION, program: "twice".into() })), None);
    d.wait_log(&format!("dropped pid {pid} (twice): it said hello twice"));
    let c = connect(&d.socket).unwrap();
    match exchange(&c, &encode(&Request::Hello { version: PROTOCOL_VERSION + 1, program: "future".into() })) {
        Some(Reply::Error { errno, message }) => {
            assert_eq!(errno, libc::EPROTO);
            assert!(message.contains(&format!("this daemon speaks {PROTOCOL_VERSION}")), "{message}");
        }
        other => panic!("another protocol version got {other:?}"),
    }
    d.wait_log(&format!("dropped pid {pid} (?): it speaks protocol version {}", PROTOCOL_VERSION + 1));

    // Well-formed requests that name objects the client does not have: errors, and the client stays.
    let c = connect(&d.socket).unwrap();
    hello(&c, "bad-ids");
    for r in [
        Request::DestroyQp { qp: 424242 },
        Request::PostSend { qp: 7, wrs: Vec::new() },
        Request::PollCq { cq: 99, max: 16 },
        Request::DeregMr { mr: 5 },
    ] {
        match exchange(&c, &encode(&r)) {
            Some(Reply::Error { errno, message }) => assert!(errno > 0 && !message.is_empty(), "{r:?}: errno {errno} {message:?}"),
            other => panic!("{r:?} got {other:?}"),
        }
    }
    match exchange(&c, &encode(&Request::Status)) {
        Some(Reply::Status { clients, .. }) => assert!(clients.iter().any(|c| c.program == "bad-ids")),
        other => panic!("the client with bad ids was dropped: {other:?}"),
    }
    still_served(&good, "everything");
}
