//! Buffer-stability verification: a checksum of every SGE a WR reads, taken when the WR is accepted and
//! compared when it is released. A difference means the ULP wrote into a buffer the HCA could still read (for a
//! retransmission) — a bug a lossless test run never exposes.
//!
//! Only WRs that read local memory are covered: SEND, SEND_WITH_IMM/INV, RDMA WRITE (with or without
//! immediate), not inline (inline data is copied at post). Reading the bytes relies on the `SendChain` contract
//! extended for queues with verification: the bytes each SGE describes stay readable until the WR's release.

use super::wr::WrPtr;
use crate::alloc;
use crate::error::Result;
use crate::discipline::opcode::{
    SEND_INLINE, WR_RDMA_WRITE, WR_RDMA_WRITE_WITH_IMM, WR_SEND, WR_SEND_WITH_IMM, WR_SEND_WITH_INV,
};

#[derive(Debug, Clone, Copy, Default)]
struct Snap {
    addr: u64,
    len: u32,
    sum: u64,
}

/// Checksums of the SGEs of every accepted, unreleased WR, indexed by acceptance order.
#[derive(Debug)]
pub struct VerifyStore {
    snaps: Box<[Snap]>,
    counts: Box<[u8]>,
    max_sge: usize,
    mask: u64,
}

/// A 64-bit checksum of `bytes` (word-at-a-time multiply-xor: about a cycle per byte, not cryptographic).
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0x243F_6A88_85A3_08D3 ^ bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        h = (h ^ w).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    }
    for (i, b) in chunks.remainder().iter().enumerate() {
        h = (h ^ ((*b as u64) << (8 * i))).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    h ^ (h >> 31)
}

fn reads_local_memory(opcode: u32, send_flags: u32) -> bool {
    send_flags & SEND_INLINE == 0
        && matches!(opcode, WR_SEND | WR_SEND_WITH_IMM | WR_SEND_WITH_INV | WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM)
}

/// # Safety
/// `addr..addr+len` is readable.
unsafe fn sum_at(addr: u64, len: u32) -> u64 {
    if len == 0 {
        return checksum(&[]);
    }
    // SAFETY: the caller's promise.
    checksum(unsafe { std::slice::from_raw_parts(addr as usize as *const u8, len as usize) })
}

impl VerifyStore {
    /// Room for `entries` WRs in flight or parked at once, of up to `max_sge` SGEs each.
    pub fn new(entries: usize, max_sge: u32) -> Result<VerifyStore> {
        let cap = entries.max(1).next_power_of_two();
        let max_sge = max_sge.max(1) as usize;
        let snaps = alloc::boxed_slice(cap.saturating_mul(max_sge), Snap::default(), "buffer verification's checksums")?;
        let counts = alloc::boxed_slice(cap, 0u8, "buffer verification's counts")?;
        Ok(VerifyStore { snaps, counts, max_sge, mask: cap as u64 - 1 })
    }

    /// Bytes of storage for `entries` WRs of up to `max_sge` SGEs (what `new` allocates).
    pub fn footprint_for(entries: usize, max_sge: u32) -> usize {
        let cap = entries.max(1).next_power_of_two();
        alloc::bytes_of::<Snap>(cap.saturating_mul(max_sge.max(1) as usize)).saturating_add(cap)
    }

    /// Bytes of storage.
    pub fn footprint(&self) -> usize {
        std::mem::size_of_val(&*self.snaps) + self.counts.len()
    }

    /// Records the checksums of WR number `k` (in acceptance order).
    pub fn record(&mut self, k: u64, w: WrPtr<'_>) {
        let slot = (k & self.mask) as usize;
        let shape = w.shape();
        if !reads_local_memory(shape.opcode, shape.send_flags) {
            self.counts[slot] = 0;
            return;
        }
        let sges = w.sges();
        for (i, s) in sges.iter().enumerate().take(self.max_sge) {
            // SAFETY: the SendChain contract for verifying queues: the SGE's bytes are readable now and until
            // the WR's release.
            let sum = unsafe { sum_at(s.addr, s.length) };
            self.snaps[slot * self.max_sge + i] = Snap { addr: s.addr, len: s.length, sum };
        }
        self.counts[slot] = sges.len().min(self.max_sge) as u8;
    }

    /// Records that WR number `k` has nothing to verify (a library operation).
    pub fn record_none(&mut self, k: u64) {
        self.counts[(k & self.mask) as usize] = 0;
    }

    /// Compares WR number `k` at its release: the index of the first SGE whose bytes changed, if any.
    pub fn check(&self, k: u64) -> Option<u32> {
        let slot = (k & self.mask) as usize;
        (0..self.counts[slot] as usize).find_map(|i| {
            let s = self.snaps[slot * self.max_sge + i];
            // SAFETY: recorded from an SGE under the same contract; the WR is being released now, so its bytes
            // are still the ULP's to keep readable.
            (unsafe { sum_at(s.addr, s.len) } != s.sum).then_some(i as u32)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::checksum;

    #[test]
    fn checksum_sees_every_byte_and_the_length() {
        let base: Vec<u8> = (0..37u8).collect();
        let h = checksum(&base);
        for i in 0..base.len() {
            let mut b = base.clone();
            b[i] ^= 1;
            assert_ne!(checksum(&b), h, "byte {i}");
        }
        assert_ne!(checksum(&base[..36]), h);
        assert_ne!(checksum(&[0u8; 8]), checksum(&[0u8; 16]));
    }
}
