//! Backlog entries: deep copies of WRs that wait for credits, and the pump that posts them.
//!
//! A parked WR keeps the ULP's fields, its own copy of the SGE list, and — for `IBV_SEND_INLINE` — its own copy
//! of the inline bytes, so the ULP may reuse its WR structs and inline buffers as soon as the post returns.
//! (Non-inline data buffers are another matter: they must stay stable until the WR's release, as for any WR.)

use std::ptr;

use rdma_sys::{ibv_send_wr, ibv_sge};

use super::qp::{PostFailure, QpHandle};
use super::wr::{SendChain, WrPtr};
use crate::discipline::opcode::{SEND_INLINE, SEND_SIGNALED};
use crate::discipline::send::{Parked, SendState};
use crate::discipline::token::{Direction, Token};
use crate::alloc;

pub struct StagedWr {
    wr: ibv_send_wr,
    ulp_wr_id: u64,
    ulp_flags: u32,
    wc_opcode: u8,
    op: bool,
    sges: Box<[ibv_sge]>,
    inline: Box<[u8]>,
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
    /// Storage for one parked WR of up to `max_sge` SGEs and `max_inline` inline bytes.
    pub fn new(max_sge: u32, max_inline: u32) -> crate::error::Result<StagedWr> {
        let sges = alloc::boxed_slice(max_sge.max(1) as usize, ibv_sge { addr: 0, length: 0, lkey: 0 }, "a backlog entry's SGEs")?;
        let inline = alloc::boxed_slice(max_inline as usize, 0u8, "a backlog entry's inline data")?;
        Ok(StagedWr {
            // SAFETY: all-zero is a valid `ibv_send_wr` (integers, NULL pointers, unions of those).
            wr: unsafe { std::mem::zeroed() },
            ulp_wr_id: 0,
            ulp_flags: 0,
            wc_opcode: 0,
            op: false,
            sges,
            inline,
        })
    }

    /// Bytes of storage one entry of these limits takes.
    pub fn footprint_for(max_sge: u32, max_inline: u32) -> usize {
        std::mem::size_of::<StagedWr>() + max_sge.max(1) as usize * std::mem::size_of::<ibv_sge>() + max_inline as usize
    }

    /// Copies a checked WR (its shape and inline length fit this entry's storage).
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
                // caller checked the total fits `self.inline`.
                let bytes = unsafe { std::slice::from_raw_parts(s.addr as usize as *const u8, len) };
                self.inline[at..at + len].copy_from_slice(bytes);
                at += len;
            }
            self.sges[0] = ibv_sge { addr: self.inline.as_ptr() as usize as u64, length: at as u32, lkey: 0 };
            self.wr.num_sge = i32::from(at > 0);
        } else {
            self.sges[..sges.len()].copy_from_slice(sges);
        }
        self.wr.sg_list = self.sges.as_mut_ptr();
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
/// a refusal, marks the refused WR (see `SendState::refuse_front`) and returns the provider's failure.
pub fn pump_backlog(state: &mut SendState<StagedWr>, qp: &QpHandle, index: u32) -> Result<usize, PostFailure> {
    let mut n = 0;
    while state.can_pump(n) {
        let (seq, signaled, e) = state.admit_parked(n);
        e.prepare(Token::new(index, Direction::Send, seq).0, signaled);
        n += 1;
    }
    if n == 0 {
        return Ok(0);
    }
    // Link entries 0..n into one chain. Every pointer derives from one base pointer and no reference into the
    // storage is made until the provider has returned.
    let (base, first, len) = state.backlog_raw_parts();
    let wr_at = |i: usize| -> *mut ibv_send_wr {
        // SAFETY: `(first + i) % len` is in bounds of the storage `base` points to (len > 0 since n > 0).
        unsafe { ptr::addr_of_mut!((*base.add((first + i) % len)).wr) }
    };
    for i in 0..n - 1 {
        // SAFETY: both entries are in bounds and not otherwise borrowed.
        unsafe { (*wr_at(i)).next = wr_at(i + 1) };
    }
    // SAFETY: a NULL-terminated chain of `n` entries (the last one's `next` was cleared by `prepare`) whose
    // SGE lists live in their own storage, all valid and untouched for the duration of the call.
    let chain = unsafe { SendChain::from_raw(wr_at(0)) };
    let result = qp.post_chain(chain.first().expect("n > 0"));
    match result {
        Ok(()) => {
            state.pumped(n);
            Ok(n)
        }
        Err(f) => {
            // The WRs before the refused one went in; it and the ones after did not. The refused WR is not
            // retried (the provider would refuse it again and stall every WR behind it): it is released, refused.
            state.rollback((n - f.posted) as u64, false);
            state.pumped(f.posted);
            state.refuse_front(f.errno);
            Err(f)
        }
    }
}
