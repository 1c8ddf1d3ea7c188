//! A client's registered memory, read and written in its own process (`process_vm_readv`/`process_vm_writev`),
//! so the model keeps its semantics across processes: a retransmission reads the source buffer again, at that
//! moment, wherever it lives.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sqdisc_sim::memory::Memory;

/// The memory of one client process. `gone` is set when the client disconnects: its memory is never touched
/// after that, even before its MRs are deregistered.
pub struct ProcessMemory {
    pid: libc::pid_t,
    gone: AtomicBool,
}

impl ProcessMemory {
    pub fn new(pid: libc::pid_t) -> Arc<ProcessMemory> {
        Arc::new(ProcessMemory { pid, gone: AtomicBool::new(false) })
    }

    pub fn forget(&self) {
        self.gone.store(true, Ordering::Relaxed);
    }
}

/// One MR's view of its process's memory: the model addresses it by `iova`, the process by `addr`.
pub struct RegionMemory {
    pub process: Arc<ProcessMemory>,
    /// `addr - iova` (wrapping): what turns a model address into the process's.
    pub delta: u64,
}

impl Memory for RegionMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        if self.process.gone.load(Ordering::Relaxed) {
            return false;
        }
        let at = addr.wrapping_add(self.delta);
        let mut done = 0usize;
        while done < buf.len() {
            let local = libc::iovec { iov_base: buf[done..].as_mut_ptr().cast(), iov_len: buf.len() - done };
            let remote = libc::iovec { iov_base: at.wrapping_add(done as u64) as *mut libc::c_void, iov_len: buf.len() - done };
            // SAFETY: `local` covers the rest of `buf`, writable; `remote` names the other process's memory,
            // which the kernel checks (an unmapped range fails with EFAULT, a gone process with ESRCH).
            let n = unsafe { libc::process_vm_readv(self.process.pid, &local, 1, &remote, 1, 0) };
            if n <= 0 {
                return false;
            }
            done += n as usize;
        }
        true
    }

    fn write(&self, addr: u64, data: &[u8]) -> bool {
        if self.process.gone.load(Ordering::Relaxed) {
            return false;
        }
        let at = addr.wrapping_add(self.delta);
        let mut done = 0usize;
        while done < data.len() {
            let local = libc::iovec { iov_base: data[done..].as_ptr() as *mut libc::c_void, iov_len: data.len() - done };
            let remote = libc::iovec { iov_base: at.wrapping_add(done as u64) as *mut libc::c_void, iov_len: data.len() - done };
            // SAFETY: `local` covers the rest of `data`, only read; `remote` is checked by the kernel as above.
            let n = unsafe { libc::process_vm_writev(self.process.pid, &local, 1, &remote, 1, 0) };
            if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
                // The process is dying: the kernel has taken its memory away, but its socket is not closed yet,
                // so the daemon has not destroyed its QPs. A real HCA writes into the pinned pages of a dying
                // process until the kernel destroys its QPs (QPs go before MRs): the write succeeds, and its
                // bytes go with the process. Failing it here made the peer's SEND complete with
                // IBV_WC_REM_OP_ERR instead of, a moment later, RETRY_EXC_ERR as towards any dead peer.
                return true;
            }
            if n <= 0 {
                return false;
            }
            done += n as usize;
        }
        true
    }
}
