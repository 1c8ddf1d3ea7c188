//! One connection to the daemon per opened device context: requests and their replies, one at a time (a
//! mutex orders the threads of the process that share the context).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use sqdisc_sim_proto::{decode, encode, recv_message, send_message, Reply, Request, PROTOCOL_VERSION};

pub struct Conn {
    inner: Mutex<Inner>,
    /// The daemon has gone (its socket closed or failed): every later request fails at once with `EIO`.
    dead: AtomicBool,
}

struct Inner {
    sock: OwnedFd,
    buf: Vec<u8>,
}

/// A failed request: a positive errno and a message.
#[derive(Debug)]
pub struct Failure {
    pub errno: i32,
    pub message: String,
}

impl Failure {
    pub fn new(errno: i32, message: impl Into<String>) -> Failure {
        Failure { errno, message: message.into() }
    }
}

pub type Result<T> = std::result::Result<T, Failure>;

fn connect_socket() -> std::io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let path = sqdisc_sim_proto::socket_path();
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
    if bytes.len() >= addr.sun_path.len() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "socket path too long"));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    // SAFETY: `addr` is a valid `sockaddr_un` of `len` bytes.
    if unsafe { libc::connect(sock.as_raw_fd(), std::ptr::addr_of!(addr).cast(), len) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(sock)
}

fn program_name() -> String {
    std::fs::read_to_string("/proc/self/comm").map(|s| s.trim().to_string()).unwrap_or_else(|_| "?".into())
}

impl Conn {
    /// Connects and says hello; returns the connection and the client's end of its asynchronous event socket.
    pub fn open() -> Result<(Conn, OwnedFd)> {
        let sock = connect_socket().map_err(|e| {
            Failure::new(e.raw_os_error().unwrap_or(libc::ENODEV), format!("no sqdisc-sim daemon at {}: {e}", sqdisc_sim_proto::socket_path().display()))
        })?;
        let conn = Conn { inner: Mutex::new(Inner { sock, buf: Vec::new() }), dead: AtomicBool::new(false) };
        let (reply, fd) = conn.ask_fd(&Request::Hello { version: PROTOCOL_VERSION, program: program_name() })?;
        match (reply, fd) {
            (Reply::Welcome { .. }, Some(fd)) => Ok((conn, fd)),
            (Reply::Welcome { .. }, None) => Err(Failure::new(libc::EPROTO, "the daemon sent no event socket")),
            (other, _) => Err(Failure::new(libc::EPROTO, format!("unexpected answer to hello: {other:?}"))),
        }
    }

    /// Whether the daemon is reachable (for the device list).
    pub fn daemon_listening() -> bool {
        connect_socket().is_ok()
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    /// Sends a request and waits for its reply, with the descriptor that came with it. A `Reply::Error`
    /// becomes a `Failure`.
    pub fn ask_fd(&self, request: &Request) -> Result<(Reply, Option<OwnedFd>)> {
        if self.is_dead() {
            return Err(Failure::new(libc::EIO, "the sqdisc-sim daemon has gone"));
        }
        let bytes = encode(request);
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Inner { sock, buf } = &mut *inner;
        let result = send_message(sock.as_raw_fd(), &bytes, None).and_then(|()| recv_message(sock.as_raw_fd(), buf));
        let fd = match result {
            Ok(Some(fd)) => fd,
            Ok(None) => {
                self.dead.store(true, Ordering::Relaxed);
                return Err(Failure::new(libc::EIO, "the sqdisc-sim daemon closed the connection"));
            }
            Err(e) => {
                self.dead.store(true, Ordering::Relaxed);
                return Err(Failure::new(libc::EIO, format!("the sqdisc-sim daemon cannot be reached: {e}")));
            }
        };
        match decode::<Reply>(buf) {
            Some(Reply::Error { errno, message }) => Err(Failure::new(errno, message)),
            Some(reply) => Ok((reply, fd)),
            None => {
                self.dead.store(true, Ordering::Relaxed);
                Err(Failure::new(libc::EPROTO, "a malformed answer from the sqdisc-sim daemon"))
            }
        }
    }

    /// Sends a request the daemon does not answer (an asynchronous post).
    pub fn tell(&self, request: &Request) -> Result<()> {
        if self.is_dead() {
            return Err(Failure::new(libc::EIO, "the sqdisc-sim daemon has gone"));
        }
        let bytes = encode(request);
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        send_message(inner.sock.as_raw_fd(), &bytes, None).map_err(|e| {
            self.dead.store(true, Ordering::Relaxed);
            Failure::new(libc::EIO, format!("the sqdisc-sim daemon cannot be reached: {e}"))
        })
    }

    pub fn ask(&self, request: &Request) -> Result<Reply> {
        self.ask_fd(request).map(|(r, _)| r)
    }
}
