//! A counter in a page of shared memory (a memfd): the daemon writes how many CQEs a CQ holds, the CQ's owner
//! reads it, and polls the daemon only when it is not 0. An empty poll, what a busy-polling program does most,
//! then costs no round trip.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

const PAGE: usize = 4096;

pub struct SharedCounter {
    fd: OwnedFd,
    ptr: *mut AtomicU64,
}

// SAFETY: the mapping is owned by the value and only reached through atomic operations.
unsafe impl Send for SharedCounter {}
// SAFETY: as above.
unsafe impl Sync for SharedCounter {}

impl SharedCounter {
    /// A new counter, 0, writable (the daemon's side).
    pub fn create() -> io::Result<SharedCounter> {
        // SAFETY: a NUL-terminated name and flags; returns a new descriptor or -1.
        let fd = unsafe { libc::memfd_create(c"sqdisc-sim-cq".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain system call on our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), PAGE as libc::off_t) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Self::map(fd, libc::PROT_READ | libc::PROT_WRITE)
    }

    /// Maps a counter another process made, to read it (the client's side).
    pub fn open(fd: OwnedFd) -> io::Result<SharedCounter> {
        Self::map(fd, libc::PROT_READ)
    }

    fn map(fd: OwnedFd, prot: libc::c_int) -> io::Result<SharedCounter> {
        // SAFETY: maps one page of a memfd of at least that size; the result is checked.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), PAGE, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedCounter { fd, ptr: p.cast() })
    }

    /// A descriptor of the memory, to send to the other process.
    pub fn share(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }

    pub fn get(&self) -> u64 {
        // SAFETY: the mapping is alive while `self` is; page-aligned, so aligned for an AtomicU64.
        unsafe { (*self.ptr).load(Ordering::Acquire) }
    }

    pub fn set(&self, v: u64) {
        // SAFETY: as above (only the writable side calls this).
        unsafe { (*self.ptr).store(v, Ordering::Release) }
    }
}

impl Drop for SharedCounter {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), PAGE) };
    }
}
