//! A queue's software backlog: the bounded FIFO of WRs it accepted while the SQ had no credits.
//!
//! The entries' storage is not the queue's: it lives in a store shared by the queues of one CQ (the backlog
//! pool), which hands out an entry per parked WR and takes it back when the WR leaves the backlog. The queue
//! keeps only its cap (`backlog_depth`), its count and the two ends of its list, which runs through the
//! entries themselves. So a queue at rest holds no backlog storage, and parking a WR only links an entry that
//! already exists: no allocation per WR.

/// What a backlog entry must tell the core about the WR it holds.
pub trait Parked {
    fn wr_id(&self) -> u64;
    /// `ibv_wc_opcode` of the WR.
    fn wc_opcode(&self) -> u8;
    /// The ULP asked for a completion.
    fn ulp_signaled(&self) -> bool;
    /// A library operation (see `Slot::OP`).
    fn is_op(&self) -> bool;
}

/// Names one entry of a [`ParkStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryId(pub u64);

/// cbindgen:ignore
impl EntryId {
    /// No entry: the end of a list.
    pub const NONE: EntryId = EntryId(u64::MAX);
}

/// Where parked WRs live: entries handed out to backlogs and taken back, each with a link to the next entry of
/// its backlog.
pub trait ParkStore {
    type Entry: Parked;
    fn entry(&mut self, id: EntryId) -> &mut Self::Entry;
    /// The entry after `id` in its backlog.
    fn next(&mut self, id: EntryId) -> EntryId;
    fn set_next(&mut self, id: EntryId, next: EntryId);
    /// Takes back an entry that left its backlog.
    fn free(&mut self, id: EntryId);
}

#[derive(Debug)]
pub struct Backlog {
    cap: usize,
    len: usize,
    head: EntryId,
    tail: EntryId,
}

impl Backlog {
    /// An empty backlog that holds at most `cap` WRs.
    pub fn new(cap: usize) -> Backlog {
        Backlog { cap, len: 0, head: EntryId::NONE, tail: EntryId::NONE }
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
        self.cap
    }
    #[inline]
    pub fn is_full(&self) -> bool {
        self.len == self.cap
    }

    /// The oldest entry (`EntryId::NONE` when empty).
    #[inline]
    pub fn front(&self) -> EntryId {
        self.head
    }

    /// Appends `id`, an entry the store just handed out and the caller filled. The caller checked `!is_full()`.
    pub fn push(&mut self, id: EntryId, store: &mut impl ParkStore) {
        debug_assert!(!self.is_full());
        store.set_next(id, EntryId::NONE);
        if self.len == 0 {
            self.head = id;
        } else {
            store.set_next(self.tail, id);
        }
        self.tail = id;
        self.len += 1;
    }

    /// Drops the `n` oldest entries and gives them back to the store.
    pub fn pop_front(&mut self, n: usize, store: &mut impl ParkStore) {
        assert!(n <= self.len);
        for _ in 0..n {
            let id = self.head;
            self.head = store.next(id);
            store.free(id);
        }
        self.len -= n;
        if self.len == 0 {
            self.head = EntryId::NONE;
            self.tail = EntryId::NONE;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A store of `u32` values with a free list, as the tests of the backlog and of `SendState` need.
    #[derive(Default)]
    pub(crate) struct VecStore {
        pub entries: Vec<(u32, EntryId)>,
        pub free: Vec<u64>,
    }

    impl Parked for u32 {
        fn wr_id(&self) -> u64 {
            u64::from(*self)
        }
        fn wc_opcode(&self) -> u8 {
            0
        }
        fn ulp_signaled(&self) -> bool {
            false
        }
        fn is_op(&self) -> bool {
            false
        }
    }

    impl VecStore {
        pub(crate) fn take(&mut self, value: u32) -> EntryId {
            let id = match self.free.pop() {
                Some(i) => i,
                None => {
                    self.entries.push((0, EntryId::NONE));
                    self.entries.len() as u64 - 1
                }
            };
            self.entries[id as usize].0 = value;
            EntryId(id)
        }
        pub(crate) fn in_use(&self) -> usize {
            self.entries.len() - self.free.len()
        }
    }

    impl ParkStore for VecStore {
        type Entry = u32;
        fn entry(&mut self, id: EntryId) -> &mut u32 {
            &mut self.entries[id.0 as usize].0
        }
        fn next(&mut self, id: EntryId) -> EntryId {
            self.entries[id.0 as usize].1
        }
        fn set_next(&mut self, id: EntryId, next: EntryId) {
            self.entries[id.0 as usize].1 = next;
        }
        fn free(&mut self, id: EntryId) {
            self.free.push(id.0);
        }
    }

    #[test]
    fn fifo_order_through_a_shared_store() {
        let mut store = VecStore::default();
        let (mut a, mut b) = (Backlog::new(3), Backlog::new(2));
        for round in 0..5u32 {
            for k in 0..3 {
                let id = store.take(round * 10 + k);
                a.push(id, &mut store);
                if k < 2 {
                    let id = store.take(1000 + round * 10 + k);
                    b.push(id, &mut store);
                }
            }
            assert!(a.is_full() && b.is_full());
            assert_eq!(*store.entry(a.front()), round * 10);
            assert_eq!(*store.entry(b.front()), 1000 + round * 10);
            a.pop_front(1, &mut store);
            assert_eq!(*store.entry(a.front()), round * 10 + 1);
            a.pop_front(2, &mut store);
            b.pop_front(2, &mut store);
            assert!(a.is_empty() && b.is_empty() && a.front() == EntryId::NONE);
            assert_eq!(store.in_use(), 0, "every entry went back to the store");
        }
        assert_eq!(store.entries.len(), 5, "entries are reused");
    }

    #[test]
    fn zero_depth_is_always_full() {
        let b = Backlog::new(0);
        assert!(b.is_full() && b.is_empty());
    }
}
