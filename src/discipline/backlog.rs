//! The software backlog: a bounded FIFO of WRs accepted while the SQ had no credits.
//!
//! Every entry's storage is built once at queue creation (the caller supplies a constructor), so parking a WR
//! copies into memory that already exists: no allocation per WR.

use crate::alloc;
use crate::error::Result;

#[derive(Debug)]
pub struct Backlog<T> {
    entries: Box<[T]>,
    first: usize,
    len: usize,
}

impl<T> Backlog<T> {
    /// A backlog of `depth` entries, each built by `make` now; the first error of `make` (or `ENOMEM` for the
    /// entries' own storage) is returned, and what was built so far is freed.
    pub fn new(depth: usize, mut make: impl FnMut() -> Result<T>) -> Result<Backlog<T>> {
        let mut entries: Vec<T> = alloc::vec_with_capacity(depth, "the backlog's entries")?;
        for _ in 0..depth {
            entries.push(make()?);
        }
        Ok(Backlog { entries: entries.into_boxed_slice(), first: 0, len: 0 })
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    #[inline]
    pub fn capacity(&self) -> usize {
        self.entries.len()
    }
    #[inline]
    pub fn is_full(&self) -> bool {
        self.len == self.entries.len()
    }

    #[inline]
    fn index(&self, i: usize) -> usize {
        let j = self.first + i;
        if j >= self.entries.len() {
            j - self.entries.len()
        } else {
            j
        }
    }

    /// The storage of the next entry to append; `commit_push` makes it part of the FIFO. `None` when full.
    #[inline]
    pub fn vacant(&mut self) -> Option<&mut T> {
        if self.is_full() {
            return None;
        }
        let i = self.index(self.len);
        Some(&mut self.entries[i])
    }

    #[inline]
    pub fn commit_push(&mut self) {
        debug_assert!(!self.is_full());
        self.len += 1;
    }

    /// The `i`-th oldest entry.
    #[inline]
    pub fn get_mut(&mut self, i: usize) -> &mut T {
        assert!(i < self.len);
        let j = self.index(i);
        &mut self.entries[j]
    }

    /// The storage's base pointer, the physical index of the oldest entry and the storage length: entry `i`
    /// lives at `(first + i) % len`. For code that must hand a chain of entries to a provider in one call.
    pub fn raw_parts(&mut self) -> (*mut T, usize, usize) {
        (self.entries.as_mut_ptr(), self.first, self.entries.len())
    }

    /// Drops the `n` oldest entries (their storage stays for reuse).
    #[inline]
    pub fn pop_front(&mut self, n: usize) {
        assert!(n <= self.len);
        self.first = self.index(n);
        self.len -= n;
        if self.len == 0 {
            self.first = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_order_wraps_and_bounds() {
        let mut b: Backlog<u32> = Backlog::new(3, || Ok(0)).unwrap();
        for round in 0..5u32 {
            for k in 0..3 {
                *b.vacant().unwrap() = round * 10 + k;
                b.commit_push();
            }
            assert!(b.vacant().is_none(), "a full backlog refuses");
            assert_eq!(*b.get_mut(0), round * 10);
            b.pop_front(1);
            assert_eq!(*b.get_mut(0), round * 10 + 1);
            b.pop_front(2);
            assert!(b.is_empty());
        }
    }

    #[test]
    fn zero_depth_is_always_full() {
        let mut b: Backlog<u8> = Backlog::new(0, || Ok(0)).unwrap();
        assert!(b.is_full() && b.vacant().is_none());
    }
}
