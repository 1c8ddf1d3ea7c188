//! Messages on `SOCK_SEQPACKET` sockets (one datagram per message, with at most one file descriptor), and the
//! fixed-size event records of the channel and async-event sockets.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// The largest message either side sends or accepts: a post of many WRs with inline data stays well below it.
pub const MAX_MESSAGE: usize = 1 << 20;

/// Sends `bytes` as one message, with `fd` (if any) as its `SCM_RIGHTS` payload. Retries on `EINTR`.
pub fn send_message(sock: RawFd, bytes: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    // Room for one descriptor: CMSG_SPACE(sizeof(int)) is 24 on Linux x86-64 and aarch64; 64 covers any.
    let mut control = [0u64; 8];
    // SAFETY: `msghdr` is plain data; zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: `msg` has a control buffer of `space` bytes (within `control`), so CMSG_FIRSTHDR is a valid
        // pointer into it, with room for one header and one descriptor.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        }
    }
    loop {
        // SAFETY: `msg` points to `iov` and `control`, alive for the call; MSG_NOSIGNAL: a peer that has gone
        // gives EPIPE, not SIGPIPE.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one message into `buf` (cleared first). `Ok(None)` at end of stream (the peer closed); a message
/// longer than [`MAX_MESSAGE`] is an `InvalidData` error. A descriptor that came with it is returned owned.
pub fn recv_message(sock: RawFd, buf: &mut Vec<u8>) -> io::Result<Option<Option<OwnedFd>>> {
    receive(sock, buf, true)
}

/// As [`recv_message`], but a signal that interrupts the wait ends it with an `Interrupted` error, as a blocked
/// read of a kernel event file ends with `EINTR`: for the waits a program may break with a signal
/// (`rdma_get_cm_event`).
pub fn recv_message_interruptible(sock: RawFd, buf: &mut Vec<u8>) -> io::Result<Option<Option<OwnedFd>>> {
    receive(sock, buf, false)
}

fn receive(sock: RawFd, buf: &mut Vec<u8>, restart: bool) -> io::Result<Option<Option<OwnedFd>>> {
    // Received into the buffer's spare capacity: zeroing a megabyte per message would cost more than the rest.
    buf.clear();
    buf.reserve(MAX_MESSAGE);
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: MAX_MESSAGE };
    let mut control = [0u64; 8];
    // SAFETY: `msghdr` is plain data; zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let n = loop {
        // SAFETY: `msg` points to `iov` (over `buf`) and `control`, alive for the call. MSG_CMSG_CLOEXEC: a
        // received descriptor is not inherited by programs the process runs.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted || !restart {
            buf.clear();
            return Err(e);
        }
    };
    let mut fd = None;
    // SAFETY: `msg` was filled by recvmsg; CMSG_FIRSTHDR/NXTHDR walk its control buffer within its length.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let raw = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>().add(i));
                    // The first descriptor is kept; any more (a peer that sends them) are closed.
                    let owned = OwnedFd::from_raw_fd(raw);
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        buf.clear();
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a message longer than {MAX_MESSAGE} bytes")));
    }
    if n == 0 && fd.is_none() {
        buf.clear();
        return Ok(None);
    }
    // SAFETY: recvmsg wrote `n` bytes (at most MAX_MESSAGE, within the reserved capacity) at the buffer's start.
    unsafe { buf.set_len(n) };
    Ok(Some(fd))
}

/// One event on a completion channel's or a context's asynchronous event socket: 16 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRecord {
    /// `EVENT_*`.
    pub kind: u32,
    /// `enum ibv_event_type` for asynchronous events.
    pub event_type: u32,
    /// The client's cookie of the object, or the port number for port events.
    pub cookie: u64,
}

impl EventRecord {
    pub const SIZE: usize = 16;

    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&self.kind.to_le_bytes());
        b[4..8].copy_from_slice(&self.event_type.to_le_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8; 16]) -> EventRecord {
        EventRecord {
            kind: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            event_type: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            cookie: u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
        }
    }
}
