//! Where a memory region's bytes live. The in-process sim reads and writes registered memory of its own
//! process directly; the device daemon (`sqdisc-sim`) registers its clients' memory, which lives in other
//! processes, through a [`Memory`] that reaches it there. Every DMA of the model goes through the MR it uses,
//! so a retransmission reads the source again wherever it lives.

/// Registered memory outside this process. Both calls are for ranges the model has checked lie inside a
/// registered region; they return false when the bytes cannot be reached (the process has gone), which the
/// model treats as a protection error of that access.
pub trait Memory: Send + Sync {
    /// Reads `buf.len()` bytes at `addr`.
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool;
    /// Writes `data` at `addr`.
    fn write(&self, addr: u64, data: &[u8]) -> bool;
}
