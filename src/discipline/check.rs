//! Validation of a send WR against the queue's limits, before anything is posted or parked.

use super::opcode::{
    allows_inline, wc_opcode, SEND_FLAGS_RC, SEND_INLINE, SEND_SIGNALED, WR_ATOMIC_CMP_AND_SWP, WR_ATOMIC_FETCH_AND_ADD, WR_BIND_MW,
};
use crate::error::{Error, Result};

/// The fields of a WR the checks need.
#[derive(Debug, Clone, Copy)]
pub struct WrShape {
    pub opcode: u32,
    pub send_flags: u32,
    pub num_sge: i32,
    pub sg_list_null: bool,
}

/// Limits of the queue, as granted by the QP, and the table its quiet runs look a WR's opcode up in.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_send_sge: u32,
    pub max_inline_data: u32,
    /// Per opcode below 16, what a quiet run needs of it (`quiet_wc_opcode`): the bound `num_sge` must stay under
    /// (as unsigned) and the work-completion opcode. The bound is `max_send_sge + 1` for an opcode
    /// `PLAIN_WC_OPCODE` gives, 0 for the others, so that one compare tests the opcode and the count at once.
    /// Held per queue: a table the compiler cannot see into stays a load and a compare in the quiet run's loop.
    /// Of a constant table, the compiler makes a bit test whose mask takes a register the loop needs, and
    /// reloads the mask at every WR.
    quiet: [QuietOpcode; 16],
}

impl Limits {
    /// The limits a queue's QP granted.
    pub fn new(max_send_sge: u32, max_inline_data: u32) -> Limits {
        // `num_sge` is an `int`: a count of 2^31 or more is negative, so the limit stays below 2^31 and a negative
        // count, compared as unsigned, is always over it.
        let max_send_sge = max_send_sge.min(i32::MAX as u32);
        let bound = max_send_sge + 1;
        let quiet = PLAIN_WC_OPCODE.map(|op| QuietOpcode::new(if op == NOT_PLAIN { 0 } else { bound }, op));
        Limits { max_send_sge, max_inline_data, quiet }
    }
}

/// An entry of `Limits::quiet`: the bound in the low half, the work-completion opcode in the high half, read as
/// one word.
#[derive(Debug, Clone, Copy)]
struct QuietOpcode(u64);

impl QuietOpcode {
    const fn new(sge_bound: u32, wc_opcode: u8) -> QuietOpcode {
        QuietOpcode(sge_bound as u64 | (wc_opcode as u64) << 32)
    }
    #[inline]
    fn sge_bound(self) -> u32 {
        self.0 as u32
    }
    #[inline]
    fn wc_opcode(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// Checks the shape of a WR; returns its work-completion opcode. Inline length is checked separately
/// (`check_inline`), since measuring it reads the SGE list.
#[inline]
pub fn check_shape(w: &WrShape, lim: &Limits) -> Result<u8> {
    let Some(op) = wc_opcode(w.opcode) else {
        return Err(Error::invalid(format!("WR opcode {} is not a send opcode valid on an RC queue", w.opcode)));
    };
    if w.send_flags & !SEND_FLAGS_RC != 0 {
        return Err(Error::invalid(format!(
            "WR send_flags 0x{:x} has unknown or unsupported bits 0x{:x} (RC allows FENCE, SIGNALED, SOLICITED, INLINE)",
            w.send_flags,
            w.send_flags & !SEND_FLAGS_RC
        )));
    }
    if w.num_sge < 0 || w.num_sge as u32 > lim.max_send_sge {
        return Err(Error::invalid(format!("WR num_sge {} is outside 0..={} (max_send_sge)", w.num_sge, lim.max_send_sge)));
    }
    if w.num_sge > 0 && w.sg_list_null {
        return Err(Error::invalid(format!("WR has num_sge {} but sg_list is NULL", w.num_sge)));
    }
    if w.send_flags & SEND_INLINE != 0 && !allows_inline(w.opcode) {
        return Err(Error::invalid(format!("IBV_SEND_INLINE is not valid with WR opcode {}", w.opcode)));
    }
    Ok(op)
}

/// The flags a plain WR may carry: `SEND_FLAGS_RC` without INLINE (whose length needs the SGE list).
const PLAIN_FLAGS: u32 = SEND_FLAGS_RC & !SEND_INLINE;
/// Marks an opcode that `plain_wc_opcode` leaves to the full checks.
const NOT_PLAIN: u8 = u8::MAX;
/// The work-completion opcode of each `ibv_wr_opcode` below 16 that needs no check beyond the shape's, else
/// `NOT_PLAIN`: atomics and BIND_MW have checks of their own, other values are errors.
const PLAIN_WC_OPCODE: [u8; 16] = {
    let mut t = [NOT_PLAIN; 16];
    let mut i = 0;
    while i < 16 {
        if !matches!(i as u32, WR_ATOMIC_CMP_AND_SWP | WR_ATOMIC_FETCH_AND_ADD | WR_BIND_MW) {
            if let Some(op) = wc_opcode(i as u32) {
                t[i] = op;
            }
        }
        i += 1;
    }
    t
};

/// The work-completion opcode of a WR that passes every check with nothing more to test: a valid non-atomic,
/// non-BIND_MW opcode, RC flags without INLINE, `num_sge` in `0..=max_send_sge` and a list. `None` means only
/// that the full checks (`check_shape` and the rest) must decide (a WR without SGEs and without a list is valid,
/// but goes there).
/// One test for the common WR, so that the checks cost little per WR on the post path.
#[inline]
pub fn plain_wc_opcode(w: &WrShape, lim: &Limits) -> Option<u8> {
    let op = *PLAIN_WC_OPCODE.get(w.opcode as usize)?;
    // A negative count as unsigned is huge, so one comparison bounds it on both sides; with the list required,
    // a count of 0 needs no test of its own (its list is not read).
    let bad = (w.send_flags & !PLAIN_FLAGS != 0)
        | (w.num_sge as u32 > lim.max_send_sge)
        | w.sg_list_null
        | (op == NOT_PLAIN);
    if bad {
        None
    } else {
        Some(op)
    }
}

/// The flags a WR may carry and still be admitted in a quiet run (`quiet_wc_opcode`): FENCE and SOLICITED.
const QUIET_FLAGS: u32 = PLAIN_FLAGS & !SEND_SIGNALED;

/// The fields of a WR a quiet run tests (`quiet_wc_opcode`): the opcode and the flags as one word (opcode in the
/// low half, `send_flags` in the high half), so that one mask tests both.
#[derive(Debug, Clone, Copy)]
pub struct QuietShape {
    pub opcode_flags: u64,
    pub num_sge: i32,
    pub sg_list_null: bool,
}

impl QuietShape {
    #[inline]
    pub fn of(w: &WrShape) -> QuietShape {
        QuietShape { opcode_flags: w.opcode as u64 | (w.send_flags as u64) << 32, num_sge: w.num_sge, sg_list_null: w.sg_list_null }
    }
}

/// The bits of `QuietShape::opcode_flags` that end a quiet run: an opcode of 16 or more, and any flag but
/// `QUIET_FLAGS`.
const QUIET_REJECT: u64 = !((QUIET_FLAGS as u64) << 32 | (PLAIN_WC_OPCODE.len() as u64 - 1));

/// `plain_wc_opcode` for a WR of a quiet run (one the signal policy leaves unsignaled): `None` as well when the
/// ULP signals it, which ends the run. One mask tests the opcode's range, the signal and the flags the full
/// checks need. The opcode comes as a `u32` (below 256) for `Slot::unsignaled`, with no conversion to make.
#[inline]
pub fn quiet_wc_opcode(w: &QuietShape, lim: &Limits) -> Option<u32> {
    if w.opcode_flags & QUIET_REJECT != 0 {
        return None;
    }
    let i = w.opcode_flags as usize & (PLAIN_WC_OPCODE.len() - 1);
    let e = lim.quiet[i];
    if w.num_sge as u32 >= e.sge_bound() || w.sg_list_null {
        None
    } else {
        Some(e.wc_opcode())
    }
}

/// Whether the opcode is an atomic (its WR needs `check_atomic`).
#[inline]
pub fn is_atomic(wr_opcode: u32) -> bool {
    matches!(wr_opcode, WR_ATOMIC_CMP_AND_SWP | WR_ATOMIC_FETCH_AND_ADD)
}

/// An atomic operates on one naturally aligned 64-bit word (IBA atomics): its local SGEs receive the 8 bytes of
/// the original value and its remote address is 8-byte aligned. Providers refuse other atomics at post time,
/// so the queue refuses them first: parked, such a WR would be refused only when the library posts it.
#[inline]
pub fn check_atomic(total_len: u64, remote_addr: u64) -> Result<()> {
    if total_len != 8 {
        return Err(Error::invalid(format!(
            "atomic WR has SGEs of {total_len} bytes in all; an atomic returns exactly 8 (the 64-bit original value)"
        )));
    }
    if remote_addr % 8 != 0 {
        return Err(Error::invalid(format!("atomic WR remote_addr {remote_addr:#x} is not 8-byte aligned")));
    }
    Ok(())
}

/// A BIND_MW WR names the memory window it binds; with none, no provider can post it.
#[inline]
pub fn check_bind_mw(mw_null: bool) -> Result<()> {
    if mw_null {
        return Err(Error::invalid("IBV_WR_BIND_MW WR has a NULL bind_mw.mw"));
    }
    Ok(())
}

#[inline]
pub fn check_inline(total: u64, lim: &Limits) -> Result<()> {
    if total > lim.max_inline_data as u64 {
        return Err(Error::invalid(format!(
            "inline WR carries {} bytes, more than max_inline_data {}",
            total, lim.max_inline_data
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discipline::opcode::*;

    fn lim() -> Limits {
        Limits::new(2, 64)
    }
    fn shape(opcode: u32, send_flags: u32, num_sge: i32) -> WrShape {
        WrShape { opcode, send_flags, num_sge, sg_list_null: false }
    }

    #[test]
    fn accepts_good_and_names_what_is_bad() {
        assert_eq!(check_shape(&shape(WR_SEND, SEND_SIGNALED | SEND_INLINE, 2), &lim()).unwrap(), WC_SEND);
        assert_eq!(check_shape(&shape(WR_RDMA_READ, SEND_FENCE, 1), &lim()).unwrap(), WC_RDMA_READ);
        let e = check_shape(&shape(42, 0, 1), &lim()).unwrap_err();
        assert!(e.message().contains("opcode 42"), "{}", e.message());
        let e = check_shape(&shape(WR_SEND, 0x100, 1), &lim()).unwrap_err();
        assert!(e.message().contains("0x100"), "{}", e.message());
        let e = check_shape(&shape(WR_SEND, 0, 3), &lim()).unwrap_err();
        assert!(e.message().contains("num_sge 3"), "{}", e.message());
        assert!(check_shape(&shape(WR_SEND, 0, -1), &lim()).is_err());
        assert!(check_shape(&WrShape { sg_list_null: true, ..shape(WR_SEND, 0, 1) }, &lim()).is_err());
        assert!(check_shape(&shape(WR_RDMA_READ, SEND_INLINE, 1), &lim()).is_err());
        assert_eq!(check_inline(65, &lim()).unwrap_err().errno(), libc::EINVAL);
        assert!(check_atomic(8, 0x1000).is_ok());
        assert!(check_atomic(16, 0x1000).unwrap_err().message().contains("16 bytes"));
        assert!(check_atomic(0, 0x1000).is_err());
        assert!(check_atomic(8, 0x1004).unwrap_err().message().contains("0x1004"));
        assert!(is_atomic(WR_ATOMIC_FETCH_AND_ADD) && is_atomic(WR_ATOMIC_CMP_AND_SWP) && !is_atomic(WR_RDMA_READ));
        assert!(check_bind_mw(true).is_err() && check_bind_mw(false).is_ok());
        assert!(check_inline(64, &lim()).is_ok());
    }

    /// The fast test accepts exactly what the full checks accept with nothing more to test, with the same
    /// opcode, over every opcode, every flag combination and the edges of num_sge and sg_list.
    #[test]
    fn plain_wc_opcode_agrees_with_the_full_checks() {
        for max_send_sge in [2, i32::MAX as u32, u32::MAX] {
            agrees_with_the_full_checks(&Limits::new(max_send_sge, 64));
        }
    }

    fn agrees_with_the_full_checks(lim: &Limits) {
        // Under Miri, which looks for undefined behaviour in code that has no unsafe block, every 17th shape (a
        // prime, so that the sample takes every value of each inner loop): the whole product takes minutes there
        // and milliseconds natively, where `make test` runs all of it.
        let stride = if cfg!(miri) { 17 } else { 1 };
        let mut plain = 0;
        let mut shape = 0usize;
        for opcode in (0..20u32).chain([16, 255, 0x1_0000, u32::MAX]) {
            for send_flags in (0..32u32).chain([0x100, 0x8000_0000]) {
                for num_sge in [-1, 0, 1, 2, 3, i32::MIN, i32::MAX, i32::MAX - 1] {
                    for sg_list_null in [false, true] {
                        shape += 1;
                        if shape % stride != 0 {
                            continue;
                        }
                        let w = WrShape { opcode, send_flags, num_sge, sg_list_null };
                        let full = check_shape(&w, lim).ok();
                        let more = send_flags & SEND_INLINE != 0
                            || is_atomic(opcode)
                            || opcode == WR_BIND_MW
                            || (num_sge == 0 && sg_list_null);
                        let want = if more { None } else { full };
                        assert_eq!(plain_wc_opcode(&w, lim), want, "{w:?} {lim:?}");
                        // A quiet run takes the same WRs, but those the ULP signals.
                        let quiet = if send_flags & SEND_SIGNALED != 0 { None } else { want };
                        assert_eq!(quiet_wc_opcode(&QuietShape::of(&w), lim), quiet.map(u32::from), "{w:?} {lim:?}");
                        plain += usize::from(want.is_some());
                    }
                }
            }
        }
        assert!(plain > 0);
    }
}
