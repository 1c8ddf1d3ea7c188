//! The WR lists SPDK's provider interface keeps in its public structures: `queue_*` appends a chain,
//! `flush_*` hands the whole list over and reports a failure through `*bad_wr`, with SPDK's counters.

use std::ffi::c_int;
use std::ptr;

use rdma_sys::{ibv_recv_wr, ibv_send_wr};

use crate::abi::WrStats;

/// A verbs WR type linked through `next`.
pub(crate) trait Linked: Sized {
    /// # Safety
    /// `wr` is a valid WR.
    unsafe fn next_slot(wr: *mut Self) -> *mut *mut Self;
}

impl Linked for ibv_send_wr {
    unsafe fn next_slot(wr: *mut Self) -> *mut *mut Self {
        // SAFETY: `wr` is valid (the caller's promise); a field address.
        unsafe { ptr::addr_of_mut!((*wr).next) }
    }
}

impl Linked for ibv_recv_wr {
    unsafe fn next_slot(wr: *mut Self) -> *mut *mut Self {
        // SAFETY: as above.
        unsafe { ptr::addr_of_mut!((*wr).next) }
    }
}

/// Appends the chain `first..` to the list `first_slot..last_slot`, counting its WRs in
/// `stats.num_submitted_wrs`; true if the list was empty.
///
/// # Safety
/// `first` is a valid chain; the list is empty or holds valid chains queued before.
pub(crate) unsafe fn queue<W: Linked>(first_slot: &mut *mut W, last_slot: &mut *mut W, first: *mut W, stats: &mut WrStats) -> bool {
    let mut count = 1;
    let mut last = first;
    // SAFETY: each `next` of a valid chain is NULL or a valid WR.
    while !unsafe { *W::next_slot(last) }.is_null() {
        // SAFETY: as above.
        last = unsafe { *W::next_slot(last) };
        count += 1;
    }
    stats.num_submitted_wrs += count;
    let was_empty = first_slot.is_null();
    if was_empty {
        *first_slot = first;
    } else {
        // SAFETY: the list's last WR is valid (the caller's promise).
        unsafe { *W::next_slot(*last_slot) = first };
    }
    *last_slot = last;
    was_empty
}

/// Takes the list for a flush, counting a doorbell in `stats`; `None` when it is empty (nothing to post).
pub(crate) fn take<W>(first_slot: &mut *mut W, stats: &mut WrStats) -> Option<*mut W> {
    let first = std::mem::replace(first_slot, ptr::null_mut());
    if first.is_null() {
        return None;
    }
    stats.doorbell_updates += 1;
    Some(first)
}

/// Reports a flush's result as SPDK's providers do: 0 and `*bad_wr = NULL`, or the errno with `*bad_wr` the
/// first WR not taken.
///
/// # Safety
/// `bad_wr` is non-NULL and writable.
pub(crate) unsafe fn finish<W>(bad_wr: *mut *mut W, result: Result<(), (c_int, *mut W)>) -> c_int {
    let (rc, bad) = match result {
        Ok(()) => (0, ptr::null_mut()),
        Err(e) => e,
    };
    // SAFETY: the caller's promise.
    unsafe { *bad_wr = bad };
    rc
}
