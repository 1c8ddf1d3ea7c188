//! The few system calls the daemon makes that std does not wrap: `SOCK_SEQPACKET` unix sockets, peer
//! credentials, epoll, and a sleep on it with a sub-millisecond timeout.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn sockaddr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: `sockaddr_un` is plain data; zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("socket path {} is too long", path.display())));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

/// A nonblocking `SOCK_SEQPACKET` socket listening at `path`.
pub fn listen(path: &Path) -> io::Result<OwnedFd> {
    // SAFETY: plain system call.
    let fd = check(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) })?;
    // SAFETY: `fd` is a new descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let (addr, len) = sockaddr(path)?;
    // SAFETY: `addr` is a valid `sockaddr_un` of `len` bytes.
    check(unsafe { libc::bind(sock.as_raw_fd(), std::ptr::addr_of!(addr).cast(), len) })?;
    // SAFETY: plain system call on our socket.
    check(unsafe { libc::listen(sock.as_raw_fd(), 128) })?;
    Ok(sock)
}

/// A blocking `SOCK_SEQPACKET` connection to `path`.
pub fn connect(path: &Path) -> io::Result<OwnedFd> {
    // SAFETY: plain system call.
    let fd = check(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` is a new descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let (addr, len) = sockaddr(path)?;
    // SAFETY: `addr` is a valid `sockaddr_un` of `len` bytes.
    check(unsafe { libc::connect(sock.as_raw_fd(), std::ptr::addr_of!(addr).cast(), len) })?;
    Ok(sock)
}

/// The next pending connection, nonblocking; `None` when there is none.
pub fn accept(listener: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    // SAFETY: plain system call on our listening socket; no address is asked for.
    let fd = unsafe { libc::accept4(listener.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock { Ok(None) } else { Err(e) };
    }
    // SAFETY: `fd` is a new descriptor nobody else owns.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// The process id and user id of the peer of a unix socket.
pub fn peer_credentials(sock: &OwnedFd) -> io::Result<(libc::pid_t, libc::uid_t)> {
    // SAFETY: `ucred` is plain data.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is writable for `len` bytes.
    check(unsafe { libc::getsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, std::ptr::addr_of_mut!(cred).cast(), &mut len) })?;
    Ok((cred.pid, cred.uid))
}

/// A `SOCK_SEQPACKET` socket pair: the daemon's end nonblocking, the client's end blocking (the program sets
/// it as it likes).
pub fn event_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors.
    check(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) })?;
    // SAFETY: both are new descriptors nobody else owns.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    set_nonblocking(&ours)?;
    Ok((ours, theirs))
}

pub fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: plain fcntl on our descriptor.
    let flags = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
    Ok(())
}

/// Sends one record on a nonblocking event socket: `Ok(false)` when its buffer is full.
pub fn send_record(fd: &OwnedFd, bytes: &[u8]) -> io::Result<bool> {
    // SAFETY: `bytes` is readable for its length; MSG_NOSIGNAL: a closed peer gives EPIPE, not SIGPIPE.
    let n = unsafe { libc::send(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock { Ok(false) } else { Err(e) };
    }
    Ok(true)
}

pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: plain system call.
        let fd = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: a new descriptor nobody else owns.
        Ok(Epoll { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    pub fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32, u64: token };
        // SAFETY: `ev` is a valid event for the call.
        check(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) })?;
        Ok(())
    }

    pub fn remove(&self, fd: RawFd) {
        // SAFETY: plain system call; a descriptor not in the set only gives an error, which is ignored.
        unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
    }

    /// Waits up to `timeout` (`None`: for ever) for descriptors to be ready; their tokens go into `out`.
    pub fn wait(&self, timeout: Option<Duration>, out: &mut Vec<u64>) -> io::Result<()> {
        out.clear();
        if let Some(t) = timeout {
            // Sleep on the epoll descriptor with ppoll, whose timeout has nanoseconds (epoll_wait's has
            // milliseconds); then collect what is ready without waiting.
            let mut p = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            let ts = libc::timespec { tv_sec: t.as_secs() as libc::time_t, tv_nsec: t.subsec_nanos() as libc::c_long };
            // SAFETY: one valid pollfd and a valid timespec; no signal mask.
            let n = unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                return if e.kind() == io::ErrorKind::Interrupted { Ok(()) } else { Err(e) };
            }
            if n == 0 {
                return Ok(());
            }
        }
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        let ms = if timeout.is_some() { 0 } else { -1 };
        // SAFETY: `events` has room for 64 entries.
        let n = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), events.as_mut_ptr(), 64, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted { Ok(()) } else { Err(e) };
        }
        out.extend(events[..n as usize].iter().map(|e| e.u64));
        Ok(())
    }
}

/// Takes an exclusive lock on `path` (made if missing, mode 0600) without waiting: `Ok(None)` when another
/// process holds it. The lock lives as long as the returned descriptor.
pub fn try_lock(path: &Path) -> io::Result<Option<OwnedFd>> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    // SAFETY: `c` is a valid C string.
    let fd = check(unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC, 0o600) })?;
    // SAFETY: a new descriptor nobody else owns.
    let file = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain system call on our descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock { Ok(None) } else { Err(e) };
    }
    Ok(Some(file))
}
