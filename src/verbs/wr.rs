//! Borrowed WR chains: the ULP's `ibv_send_wr` / `ibv_recv_wr` lists for the duration of one post call.
//!
//! The queue rewrites a WR's `wr_id` and `send_flags`, and cuts the chain with `next`, while it posts; it puts
//! every field back before the call returns, so the ULP finds its chain exactly as it passed it (a queue with
//! `QueueConfig::no_restore` puts back only the links, and the WRs it did not accept).

use std::marker::PhantomData;
use std::ptr::{self, NonNull};

use rdma_sys::{ibv_recv_wr, ibv_send_wr, ibv_sge};

use crate::discipline::check::{QuietShape, WrShape};

/// A chain of send WRs lent by the ULP for one call.
pub struct SendChain<'a> {
    head: Option<NonNull<ibv_send_wr>>,
    _chain: PhantomData<&'a mut ibv_send_wr>,
}

impl<'a> SendChain<'a> {
    /// # Safety
    /// `head` is NULL or the first of a NULL-terminated chain of valid `ibv_send_wr`s, each writable, whose
    /// `sg_list` (when `num_sge > 0` and non-NULL) points to `num_sge` readable `ibv_sge`s, and whose inline
    /// SGEs (with `IBV_SEND_INLINE`) point to readable bytes; nobody else touches them for `'a`.
    pub unsafe fn from_raw(head: *mut ibv_send_wr) -> SendChain<'a> {
        SendChain { head: NonNull::new(head), _chain: PhantomData }
    }
    pub fn first(&self) -> Option<WrPtr<'a>> {
        self.head.map(|p| WrPtr { p, _chain: PhantomData })
    }
}

/// One WR of a lent chain.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct WrPtr<'a> {
    p: NonNull<ibv_send_wr>,
    _chain: PhantomData<&'a mut ibv_send_wr>,
}

// Every accessor below reads or writes one field through the raw pointer: no reference to the WR is ever held,
// so copies of a `WrPtr` never alias a live reference.
impl<'a> WrPtr<'a> {
    #[inline]
    pub fn as_ptr(self) -> *mut ibv_send_wr {
        self.p.as_ptr()
    }
    #[inline]
    pub fn next(self) -> Option<WrPtr<'a>> {
        // SAFETY: the chain's contract makes every WR readable for 'a.
        let n = unsafe { ptr::addr_of!((*self.p.as_ptr()).next).read() };
        NonNull::new(n).map(|p| WrPtr { p, _chain: PhantomData })
    }
    #[inline]
    pub fn set_next(self, next: Option<WrPtr<'a>>) {
        let n = next.map_or(ptr::null_mut(), |w| w.as_ptr());
        // SAFETY: the chain's contract makes every WR writable for 'a.
        unsafe { ptr::addr_of_mut!((*self.p.as_ptr()).next).write(n) }
    }
    #[inline]
    pub fn wr_id(self) -> u64 {
        // SAFETY: readable for 'a.
        unsafe { ptr::addr_of!((*self.p.as_ptr()).wr_id).read() }
    }
    #[inline]
    pub fn set_wr_id(self, v: u64) {
        // SAFETY: writable for 'a.
        unsafe { ptr::addr_of_mut!((*self.p.as_ptr()).wr_id).write(v) }
    }
    #[inline]
    pub fn send_flags(self) -> u32 {
        // SAFETY: readable for 'a.
        unsafe { ptr::addr_of!((*self.p.as_ptr()).send_flags).read() }
    }
    #[inline]
    pub fn set_send_flags(self, v: u32) {
        // SAFETY: writable for 'a.
        unsafe { ptr::addr_of_mut!((*self.p.as_ptr()).send_flags).write(v) }
    }
    #[inline]
    pub fn shape(self) -> WrShape {
        let w = self.p.as_ptr();
        // SAFETY: readable for 'a; plain field reads.
        unsafe {
            WrShape {
                opcode: ptr::addr_of!((*w).opcode).read(),
                send_flags: ptr::addr_of!((*w).send_flags).read(),
                num_sge: ptr::addr_of!((*w).num_sge).read(),
                sg_list_null: ptr::addr_of!((*w).sg_list).read().is_null(),
            }
        }
    }
    /// The fields `quiet_wc_opcode` tests, the opcode and the flags read as one word.
    #[inline]
    pub fn quiet_shape(self) -> QuietShape {
        // `send_flags` follows `opcode` in `struct ibv_send_wr` (verbs.h), so that both are one 8-byte word.
        const _: () = assert!(std::mem::offset_of!(ibv_send_wr, send_flags) == std::mem::offset_of!(ibv_send_wr, opcode) + 4);
        let w = self.p.as_ptr();
        // SAFETY: readable for 'a; the word is the two adjacent u32 fields `opcode` and `send_flags` (asserted
        // above), read unaligned since the pair is only 4-byte aligned.
        let pair = unsafe { ptr::addr_of!((*w).opcode).cast::<[u32; 2]>().read_unaligned() };
        // SAFETY: readable for 'a; plain field reads.
        let (num_sge, sg_list) = unsafe { (ptr::addr_of!((*w).num_sge).read(), ptr::addr_of!((*w).sg_list).read()) };
        QuietShape { opcode_flags: u64::from(pair[0]) | u64::from(pair[1]) << 32, num_sge, sg_list_null: sg_list.is_null() }
    }
    /// The SGE list; call only after `check_shape` accepted the WR (num_sge in range, list non-NULL if needed).
    #[inline]
    pub fn sges(self) -> &'a [ibv_sge] {
        let w = self.p.as_ptr();
        // SAFETY: readable for 'a; the caller checked num_sge >= 0 and a non-NULL list when num_sge > 0.
        unsafe {
            let n = ptr::addr_of!((*w).num_sge).read();
            let list = ptr::addr_of!((*w).sg_list).read();
            if n <= 0 || list.is_null() {
                &[]
            } else {
                std::slice::from_raw_parts(list, n as usize)
            }
        }
    }
    /// Total bytes the SGEs describe.
    #[inline]
    pub fn total_len(self) -> u64 {
        self.sges().iter().map(|s| s.length as u64).sum()
    }
    /// `wr.atomic.remote_addr` (meaningful for atomic opcodes only).
    #[inline]
    pub fn atomic_remote_addr(self) -> u64 {
        let w = self.p.as_ptr();
        // SAFETY: readable for 'a; every member of the `wr` union is plain integers, so any bit pattern is valid.
        unsafe { ptr::addr_of!((*w).wr.atomic.remote_addr).read() }
    }
    /// Whether `bind_mw.mw` is NULL (meaningful for `IBV_WR_BIND_MW` only).
    #[inline]
    pub fn bind_mw_is_null(self) -> bool {
        let w = self.p.as_ptr();
        // SAFETY: readable for 'a; the union's members are plain pointers and integers: a pointer read of any bits.
        unsafe { ptr::addr_of!((*w).bind_mw_tso_union.bind_mw.mw).read().is_null() }
    }
    /// Copies the whole WR structure (for the backlog).
    pub(crate) fn read_struct(self) -> ibv_send_wr {
        // SAFETY: readable for 'a; `ibv_send_wr` is plain data (pointers and integers).
        unsafe { ptr::read(self.p.as_ptr()) }
    }
}

/// A chain of receive WRs lent by the ULP for one call.
pub struct RecvChain<'a> {
    head: Option<NonNull<ibv_recv_wr>>,
    _chain: PhantomData<&'a mut ibv_recv_wr>,
}

impl<'a> RecvChain<'a> {
    /// # Safety
    /// `head` is NULL or the first of a NULL-terminated chain of valid, writable `ibv_recv_wr`s that nobody else
    /// touches for `'a`.
    pub unsafe fn from_raw(head: *mut ibv_recv_wr) -> RecvChain<'a> {
        RecvChain { head: NonNull::new(head), _chain: PhantomData }
    }
    pub fn first(&self) -> Option<RecvWrPtr<'a>> {
        self.head.map(|p| RecvWrPtr { p, _chain: PhantomData })
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RecvWrPtr<'a> {
    p: NonNull<ibv_recv_wr>,
    _chain: PhantomData<&'a mut ibv_recv_wr>,
}

impl<'a> RecvWrPtr<'a> {
    #[inline]
    pub fn as_ptr(self) -> *mut ibv_recv_wr {
        self.p.as_ptr()
    }
    #[inline]
    pub fn next(self) -> Option<RecvWrPtr<'a>> {
        // SAFETY: readable for 'a.
        let n = unsafe { ptr::addr_of!((*self.p.as_ptr()).next).read() };
        NonNull::new(n).map(|p| RecvWrPtr { p, _chain: PhantomData })
    }
    #[inline]
    pub fn set_next(self, next: Option<RecvWrPtr<'a>>) {
        let n = next.map_or(ptr::null_mut(), |w| w.as_ptr());
        // SAFETY: writable for 'a.
        unsafe { ptr::addr_of_mut!((*self.p.as_ptr()).next).write(n) }
    }
    #[inline]
    pub fn wr_id(self) -> u64 {
        // SAFETY: readable for 'a.
        unsafe { ptr::addr_of!((*self.p.as_ptr()).wr_id).read() }
    }
    #[inline]
    pub fn set_wr_id(self, v: u64) {
        // SAFETY: writable for 'a.
        unsafe { ptr::addr_of_mut!((*self.p.as_ptr()).wr_id).write(v) }
    }
    #[inline]
    pub fn num_sge(self) -> (i32, bool) {
        // SAFETY: readable for 'a.
        unsafe { (ptr::addr_of!((*self.p.as_ptr()).num_sge).read(), ptr::addr_of!((*self.p.as_ptr()).sg_list).read().is_null()) }
    }
    /// Whether `num_sge` is not negative and the SGE list is not NULL where it is read.
    #[inline]
    pub fn sge_list_ok(self) -> bool {
        let (num_sge, list_null) = self.num_sge();
        num_sge >= 0 && !(num_sge > 0 && list_null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discipline::check::QuietShape;

    #[test]
    fn the_quiet_shape_is_the_shapes_fields_read_as_one_word() {
        for (opcode, send_flags) in [(0u32, 0u32), (2, 0x8), (4, 0x2), (15, 0xffff_fff0), (u32::MAX, 1), (0x1234_5678, 0x9abc_def0)] {
            for (num_sge, list) in [(1, true), (0, false), (-3, true)] {
                let mut sge = ibv_sge { addr: 0, length: 0, lkey: 0 };
                // SAFETY: an all-zero `ibv_send_wr` is a valid value (NULL pointers, zero integers, a zeroed union).
                let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
                wr.opcode = opcode;
                wr.send_flags = send_flags;
                wr.num_sge = num_sge;
                wr.sg_list = if list { &mut sge } else { ptr::null_mut() };
                // SAFETY: `wr` is a valid, writable chain of one WR for the test's duration.
                let w = unsafe { SendChain::from_raw(&mut wr) }.first().unwrap();
                let (quiet, want) = (w.quiet_shape(), QuietShape::of(&w.shape()));
                assert_eq!((quiet.opcode_flags, quiet.num_sge, quiet.sg_list_null), (want.opcode_flags, want.num_sge, want.sg_list_null));
                assert_eq!(quiet.opcode_flags, u64::from(opcode) | u64::from(send_flags) << 32);
            }
        }
    }
}
