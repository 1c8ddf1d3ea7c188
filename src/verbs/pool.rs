//! The backlog pool of a CQ: storage for the WRs parked by the queues whose sends complete on the CQ.
//!
//! Entries are grouped by shape (the `max_send_sge` and `max_inline_data` of the queues that use them), one
//! class per shape, so an entry always fits any WR of the queues of its class. A class holds storage for the
//! `backlog_depth` of all its queues together, or for the CQ's limit when the ULP set a lower one
//! (`sqd_cq_set_backlog_limit`); the limit also caps the WRs parked on the CQ at once, all classes together.
//! Storage grows only on the control path (a queue's creation, a new limit), in chunks of contiguous memory
//! (entries, SGE lists, inline bytes: three allocations per chunk), and is kept for later queues of the same
//! shape until the last queue of the class goes. Parking takes an entry from the class's free list and
//! unparking gives it back: no allocation per WR.

use std::ptr;

use rdma_sys::{ibv_send_wr, ibv_sge};

use super::staged::StagedWr;
use crate::alloc;
use crate::discipline::backlog::{EntryId, ParkStore};
use crate::error::{Error, Result};

/// The state of a CQ's backlog pool, where the queues whose sends complete on the CQ park WRs (`struct
/// sqd_backlog_pool_stats` in C).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BacklogPoolStats {
    /// The most WRs the queues whose sends complete on the CQ may park at once, all together, as set by
    /// `sqd_cq_set_backlog_limit`; 0 (the default): no limit but each queue's own `backlog_depth`.
    pub limit: u32,
    /// WRs parked now, all queues together.
    pub parked: u32,
    /// Most WRs parked at once.
    pub peak: u64,
    /// WRs the pool has storage for now, all shapes together.
    pub capacity: u64,
    /// The sum of the `backlog_depth` of the queues whose sends complete on the CQ.
    pub demand: u64,
    /// Bytes of the pool's storage: per WR it has room for, a WR record, `max_send_sge` SGEs (at least one) and
    /// `max_inline_data` bytes of the queues of its shape. The queue whose creation made the pool grow counts
    /// the growth in its `sqd_queue_stats.bytes` too.
    pub bytes: u64,
    /// WRs refused with `-EAGAIN` because the limit was reached (their queue's own backlog had room).
    pub exhausted: u64,
    /// Distinct shapes (`max_send_sge`, `max_inline_data`) of the queues using the pool: each has its storage.
    pub shapes: u32,
    pub _reserved0: u32,
}

/// Most entries one chunk holds (the entry id's index field has 24 bits).
const CHUNK_MAX: u64 = 1 << 20;
const INDEX_BITS: u32 = 24;
const CHUNK_BITS: u32 = 24;
const FIELD_MASK: u64 = (1 << 24) - 1;

/// Storage for `len` entries of one shape, allocated together. Only raw pointers to it are kept, so that a
/// reference to one entry never overlaps a pointer to another (the pump links entries by raw pointer).
struct Chunk {
    entries: *mut StagedWr,
    len: usize,
    sges: *mut ibv_sge,
    sges_len: usize,
    inline: *mut u8,
    inline_len: usize,
}

impl Chunk {
    fn new(len: usize, max_sge: u32, max_inline: u32) -> Result<Chunk> {
        let sge_per = max_sge.max(1) as usize;
        let what = "the CQ's backlog pool";
        let sges = alloc::boxed_slice(len.saturating_mul(sge_per), ibv_sge { addr: 0, length: 0, lkey: 0 }, what)?;
        let inline = alloc::boxed_slice(len.saturating_mul(max_inline as usize), 0u8, what)?;
        let mut entries: Vec<StagedWr> = alloc::vec_with_capacity(len, what)?;
        let (sges_len, inline_len) = (sges.len(), inline.len());
        let sges = Box::into_raw(sges).cast::<ibv_sge>();
        let inline = Box::into_raw(inline).cast::<u8>();
        for i in 0..len {
            entries.push(StagedWr::new(sges.wrapping_add(i * sge_per), inline.wrapping_add(i * max_inline as usize)));
        }
        let entries = Box::into_raw(entries.into_boxed_slice()).cast::<StagedWr>();
        Ok(Chunk { entries, len, sges, sges_len, inline, inline_len })
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: the three pointers came from `Box::into_raw` of boxed slices of these lengths in `Chunk::new`,
        // and are freed once, here; no reference into them outlives the pool that owns the chunk.
        unsafe {
            drop(Box::from_raw(ptr::slice_from_raw_parts_mut(self.entries, self.len)));
            drop(Box::from_raw(ptr::slice_from_raw_parts_mut(self.sges, self.sges_len)));
            drop(Box::from_raw(ptr::slice_from_raw_parts_mut(self.inline, self.inline_len)));
        }
    }
}

/// The entries of one shape.
struct ShapeClass {
    max_sge: u32,
    max_inline: u32,
    queues: u32,
    /// The sum of its queues' `backlog_depth`.
    demand: u64,
    capacity: u64,
    chunks: Vec<Chunk>,
    /// The free entries, linked through their `next`.
    free: EntryId,
}

impl ShapeClass {
    fn entry_bytes(&self) -> u64 {
        entry_bytes(self.max_sge, self.max_inline) as u64
    }
}

/// Bytes of pool storage per parked WR of a queue with these limits.
pub fn entry_bytes(max_sge: u32, max_inline: u32) -> usize {
    std::mem::size_of::<StagedWr>() + max_sge.max(1) as usize * std::mem::size_of::<ibv_sge>() + max_inline as usize
}

#[derive(Default)]
pub struct BacklogPool {
    classes: Vec<ShapeClass>,
    limit: u32,
    parked: u32,
    peak: u64,
    exhausted: u64,
}

impl BacklogPool {
    /// Storage a class should have: its queues' demand, or the limit if lower.
    fn target(&self, c: &ShapeClass) -> u64 {
        if self.limit == 0 {
            c.demand
        } else {
            c.demand.min(u64::from(self.limit))
        }
    }

    /// Grows class `k` to its target; returns the bytes added.
    fn grow(&mut self, k: usize) -> Result<u64> {
        let target = self.target(&self.classes[k]);
        let c = &mut self.classes[k];
        let mut added = 0;
        while c.capacity < target {
            let n = (target - c.capacity).min(CHUNK_MAX);
            if c.chunks.len() as u64 > FIELD_MASK {
                return Err(Error::new(libc::ENOMEM, "the CQ's backlog pool has too many chunks"));
            }
            let bytes = n * c.entry_bytes();
            alloc::reserve(&mut c.chunks, 1, "the CQ's backlog pool")?;
            let chunk = Chunk::new(n as usize, c.max_sge, c.max_inline).map_err(|e| {
                Error::new(
                    e.errno(),
                    format!(
                        "{}: {n} more parked WRs of {} SGEs and {} inline bytes ({bytes} bytes)",
                        e.message(),
                        c.max_sge.max(1),
                        c.max_inline
                    ),
                )
            })?;
            let ci = c.chunks.len() as u64;
            c.chunks.push(chunk);
            // Thread the new entries onto the free list, the lowest index first.
            for i in (0..n).rev() {
                let id = EntryId((k as u64) << (INDEX_BITS + CHUNK_BITS) | ci << INDEX_BITS | i);
                let head = c.free;
                entry_of(c, id).next = head;
                c.free = id;
            }
            c.capacity += n;
            added += bytes;
        }
        Ok(added)
    }

    /// A queue of this shape that may park `depth` WRs joins the pool: its class (made if it is the first of
    /// its shape) grows to hold them, within the limit. Returns the class and the bytes the pool grew by.
    /// `ENOMEM` (nothing changed but storage already added, kept for later) if the storage cannot be allocated.
    pub fn join(&mut self, max_sge: u32, max_inline: u32, depth: u32) -> Result<(u16, u64)> {
        let k = match self.classes.iter().position(|c| (c.max_sge, c.max_inline) == (max_sge, max_inline)) {
            Some(k) => k,
            None if self.classes.len() > u16::MAX as usize => {
                return Err(Error::new(libc::ENOMEM, "the CQ's backlog pool has too many distinct WR shapes"));
            }
            None => {
                alloc::reserve(&mut self.classes, 1, "the CQ's backlog pool")?;
                self.classes.push(ShapeClass {
                    max_sge,
                    max_inline,
                    queues: 0,
                    demand: 0,
                    capacity: 0,
                    chunks: Vec::new(),
                    free: EntryId::NONE,
                });
                self.classes.len() - 1
            }
        };
        self.classes[k].demand += u64::from(depth);
        self.classes[k].queues += 1;
        match self.grow(k) {
            Ok(bytes) => Ok((k as u16, bytes)),
            Err(e) => {
                self.leave(k as u16, depth);
                Err(e)
            }
        }
    }

    /// A queue leaves the pool (it gave back its entries first). The last queue of a shape frees the class's
    /// storage.
    pub fn leave(&mut self, class: u16, depth: u32) {
        let c = &mut self.classes[class as usize];
        c.demand -= u64::from(depth);
        c.queues -= 1;
        if c.queues == 0 {
            c.chunks.clear();
            c.capacity = 0;
            c.free = EntryId::NONE;
        }
    }

    /// Sets the limit (0: none) and grows every class to its new target. `ENOMEM` if storage cannot be
    /// allocated: the old limit stays.
    pub fn set_limit(&mut self, limit: u32) -> Result<()> {
        let old = self.limit;
        self.limit = limit;
        for k in 0..self.classes.len() {
            if let Err(e) = self.grow(k) {
                self.limit = old;
                return Err(e);
            }
        }
        Ok(())
    }

    /// Whether the limit lets one more WR park (the queue's class then has a free entry for it, unless its own
    /// backlog is full).
    pub fn has_room(&self) -> bool {
        self.limit == 0 || self.parked < self.limit
    }

    /// An entry of `class` for a WR to park, or `EAGAIN` when the limit is reached.
    #[inline]
    pub fn take(&mut self, class: u16) -> Result<EntryId> {
        let c = &mut self.classes[class as usize];
        let id = c.free;
        if (self.limit != 0 && self.parked >= self.limit) || id == EntryId::NONE {
            return Err(self.exhausted_error());
        }
        c.free = entry_of(c, id).next;
        self.parked += 1;
        self.peak = self.peak.max(u64::from(self.parked));
        Ok(id)
    }

    #[cold]
    fn exhausted_error(&mut self) -> Error {
        self.exhausted += 1;
        let limit = if self.limit == 0 { "none".to_string() } else { self.limit.to_string() };
        Error::new(
            libc::EAGAIN,
            format!(
                "no SQ credit, and the CQ's backlog pool is exhausted: {} WRs are parked on the CQ's queues, its limit \
                 (sqd_cq_set_backlog_limit) is {limit}; retry after releases",
                self.parked
            ),
        )
    }

    /// The WR of entry `id`, for linking entries into one chain.
    #[inline]
    pub fn wr_ptr(&mut self, id: EntryId) -> *mut ibv_send_wr {
        let (c, k, i) = split(id);
        let chunk = &self.classes[c].chunks[k];
        assert!(i < chunk.len);
        // SAFETY: `i < len`, so the entry is in bounds of the chunk's allocation; only a raw pointer is made.
        unsafe { ptr::addr_of_mut!((*chunk.entries.add(i)).wr) }
    }

    pub fn stats(&self) -> BacklogPoolStats {
        let classes = self.classes.iter().filter(|c| c.queues > 0);
        BacklogPoolStats {
            limit: self.limit,
            parked: self.parked,
            peak: self.peak,
            capacity: self.classes.iter().map(|c| c.capacity).sum(),
            demand: self.classes.iter().map(|c| c.demand).sum(),
            bytes: self.classes.iter().map(|c| c.capacity * c.entry_bytes()).sum(),
            exhausted: self.exhausted,
            shapes: classes.count() as u32,
            _reserved0: 0,
        }
    }
}

fn split(id: EntryId) -> (usize, usize, usize) {
    let c = id.0 >> (INDEX_BITS + CHUNK_BITS);
    let k = (id.0 >> INDEX_BITS) & FIELD_MASK;
    let i = id.0 & FIELD_MASK;
    (c as usize, k as usize, i as usize)
}

/// The entry `id` of class `c`.
#[inline]
fn entry_of(c: &mut ShapeClass, id: EntryId) -> &mut StagedWr {
    let (_, k, i) = split(id);
    let chunk = &c.chunks[k];
    assert!(i < chunk.len);
    // SAFETY: `i < len`: in bounds of the chunk's entries, which live as long as the class; the reference
    // borrows the class mutably, so no other reference to the entry exists meanwhile.
    unsafe { &mut *chunk.entries.add(i) }
}

impl ParkStore for BacklogPool {
    type Entry = StagedWr;
    #[inline]
    fn entry(&mut self, id: EntryId) -> &mut StagedWr {
        let (c, _, _) = split(id);
        entry_of(&mut self.classes[c], id)
    }
    #[inline]
    fn next(&mut self, id: EntryId) -> EntryId {
        self.entry(id).next
    }
    #[inline]
    fn set_next(&mut self, id: EntryId, next: EntryId) {
        self.entry(id).next = next;
    }
    #[inline]
    fn free(&mut self, id: EntryId) {
        let (k, _, _) = split(id);
        let c = &mut self.classes[k];
        let head = c.free;
        entry_of(c, id).next = head;
        c.free = id;
        self.parked -= 1;
    }
}
