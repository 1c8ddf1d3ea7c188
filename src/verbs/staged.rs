//! Backlog entries: deep copies of WRs that wait for credits, and the pump that posts them.
//!
//! An entry lives in its CQ's backlog pool (`pool.rs`), with its SGE list and inline bytes in the pool's
//! storage. A parked WR keeps the ULP's fields, its own copy of the SGE list, and — for `IBV_SEND_INLINE` — its own copy
//! of the inline bytes, so the ULP may reuse its WR structs and inline buffers as soon as the post returns.
//! (Non-inline data buffers are another matter: they must stay stable until the WR's release, as for any WR.)

use std::ptr;

use rdma_sys::{ibv_send_wr, ibv_sge};

use super::qp::{PostFailure, QpHandle};
use super::wr::{SendChain, WrPtr};
use crate::discipline::opcode::{SEND_INLINE, SEND_SIGNALED};
use super::pool::BacklogPool;
use crate::discipline::backlog::{EntryId, ParkStore, Parked};
use crate::discipline::send::SendState;
use crate::discipline::token::{Direction, Token};

pub struct StagedWr {
    pub(super) wr: ibv_send_wr,
    /// The next entry of the same backlog (or of the pool's free list).
    pub(super) next: EntryId,
    ulp_wr_id: u64,
    ulp_flags: u32,
    wc_opcode: u8,
    op: bool,
    /// This entry's SGE list and inline bytes, in its pool chunk (room for the limits of its shape).
    sges: *mut ibv_sge,
    inline: *mut u8,
}

impl Parked for StagedWr {
    fn wr_id(&self) -> u64 {
        self.ulp_wr_id
    }
    fn wc_opcode(&self) -> u8 {
        self.wc_opcode
    }
    fn ulp_signaled(&self) -> bool {
        self.ulp_flags & SEND_SIGNALED != 0
    }
    fn is_op(&self) -> bool {
        self.op
    }
}

impl StagedWr {
    /// An empty entry whose SGE list and inline bytes live at `sges` and `inline` (storage of the pool's chunk,
    /// as large as the shape of the entry's class asks).
    pub(super) fn new(sges: *mut ibv_sge, inline: *mut u8) -> StagedWr {
        StagedWr {
            // SAFETY: all-zero is a valid `ibv_send_wr` (integers, NULL pointers, unions of those).
            wr: unsafe { std::mem::zeroed() },
            next: EntryId::NONE,
            ulp_wr_id: 0,
            ulp_flags: 0,
            wc_opcode: 0,
            op: false,
            sges,
            inline,
        }
    }

    /// Copies a checked WR (its shape and inline length fit the limits of the entry's class).
    pub fn stage_from(&mut self, src: WrPtr<'_>, wc_opcode: u8) {
        let sges = src.sges();
        self.wr = src.read_struct();
        self.wr.next = ptr::null_mut();
        self.ulp_wr_id = self.wr.wr_id;
        self.ulp_flags = self.wr.send_flags;
        self.wc_opcode = wc_opcode;
        self.op = false;
        if self.ulp_flags & SEND_INLINE != 0 {
            let mut at = 0usize;
            for s in sges {
                let len = s.length as usize;
                // SAFETY: the SendChain contract makes an inline WR's SGEs point to `length` readable bytes; the
                // caller checked the total fits `max_inline_data`, the room this entry has at `inline`, which no
                // other entry and no reference overlaps.
                unsafe { ptr::copy_nonoverlapping(s.addr as usize as *const u8, self.inline.add(at), len) };
                at += len;
            }
            // SAFETY: every entry has room for at least one SGE at `sges`.
            unsafe { self.sges.write(ibv_sge { addr: self.inline as usize as u64, length: at as u32, lkey: 0 }) };
            self.wr.num_sge = i32::from(at > 0);
        } else {
            // SAFETY: the caller checked `num_sge <= max_send_sge`, the room this entry has at `sges`, which no
            // other entry overlaps; the source is the ULP's list, distinct from the pool.
            unsafe { ptr::copy_nonoverlapping(sges.as_ptr(), self.sges, sges.len()) };
        }
        self.wr.sg_list = self.sges;
    }

    /// Parks a library LocalInv operation `op_id` for `rkey`.
    pub fn stage_local_inv(&mut self, op_id: u64, rkey: u32, fence: bool) {
        self.wr = local_inv_wr(0, rkey, fence);
        self.ulp_wr_id = op_id;
        self.ulp_flags = self.wr.send_flags;
        self.wc_opcode = crate::discipline::opcode::WC_LOCAL_INV;
        self.op = true;
    }

    fn prepare(&mut self, token: u64, signaled: bool) {
        self.wr.wr_id = token;
        self.wr.send_flags = if signaled { self.ulp_flags | SEND_SIGNALED } else { self.ulp_flags };
        self.wr.next = ptr::null_mut();
    }
}

/// A signaled `IBV_WR_LOCAL_INV` of `rkey`, fenced (Local Invalidate Fence) when asked.
pub(crate) fn local_inv_wr(token: u64, rkey: u32, fence: bool) -> ibv_send_wr {
    // SAFETY: all-zero is a valid `ibv_send_wr` (integers, NULL pointers, unions of those).
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = token;
    wr.opcode = crate::discipline::opcode::WR_LOCAL_INV;
    wr.send_flags = SEND_SIGNALED | if fence { crate::discipline::opcode::SEND_FENCE } else { 0 };
    wr.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
    wr
}

/// Posts as many parked WRs as credits allow, oldest first, with one provider call. Returns how many went in; on
/// a refusal, marks the refused WR (see `SendState::refuse_front`) and returns the provider's failure. The
/// entries of the WRs that went in go back to `pool`.
pub fn pump_backlog(state: &mut SendState<StagedWr>, pool: &mut BacklogPool, qp: &QpHandle, index: u32) -> Result<usize, PostFailure> {
    let mut n = 0;
    let mut id = state.backlog_front();
    let mut first: *mut ibv_send_wr = ptr::null_mut();
    let mut last: *mut ibv_send_wr = ptr::null_mut();
    // Link the entries into one chain by raw pointers into the pool's storage (no reference to an entry is
    // live once its pointer is taken, and none is made until the provider has returned).
    while state.can_pump(n) {
        let e = pool.entry(id);
        let (seq, signaled) = state.admit_parked(e);
        e.prepare(Token::new(index, Direction::Send, seq).0, signaled);
        let wr = pool.wr_ptr(id);
        if last.is_null() {
            first = wr;
        } else {
            // SAFETY: `last` points to the WR of an entry of this backlog, in the pool's storage; no reference
            // to it is live.
            unsafe { (*last).next = wr };
        }
        last = wr;
        id = pool.next(id);
        n += 1;
    }
    if n == 0 {
        return Ok(0);
    }
    // SAFETY: a NULL-terminated chain of `n` entries (the last one's `next` was cleared by `prepare`) whose
    // SGE lists live in the pool's storage, all valid and untouched for the duration of the call.
    let chain = unsafe { SendChain::from_raw(first) };
    let result = qp.post_chain(chain.first().expect("n > 0"));
    match result {
        Ok(()) => {
            state.pumped(n, pool);
            Ok(n)
        }
        Err(f) => {
            // The WRs before the refused one went in; it and the ones after did not. The refused WR is not
            // retried (the provider would refuse it again and stall every WR behind it): it is released, refused.
            state.rollback((n - f.posted) as u64, false);
            state.pumped(f.posted, pool);
            state.refuse_front(f.errno);
            Err(f)
        }
    }
}
