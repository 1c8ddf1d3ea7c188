//! What the provider hands SPDK with an error status, counted per qpair, so that "every flush completion SPDK
//! should see reaches it exactly once" can be measured (`sqd_spdk_qp_counters`) and not only argued.
//!
//! A qpair's [`Ledger`] holds the error completions SPDK is owed and has not had yet, by wr_id: a WR whose
//! release has an error status (its own CQE or a flush CQE: the device's), and each completion the provider
//! makes itself (a WR flushed from the backlog or posted after the failure, a WR the device refused when the
//! provider posted it from the backlog). Every completion a poll hands SPDK with an error status is then
//! matched against that: it settles one owed completion of its wr_id, or, if none is owed, it is a duplicate.
//! What is still owed when SPDK destroys the qpair never reached it. The successful completions are not
//! looked at: the poll path pays one comparison per completion it hands over.
//!
//! The CQ-side [`Book`] finds a completion's ledger by its QP number (qpairs of the CQ register there), and
//! keeps what the provider says once per CQ.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use rdma_sys::{ibv_wc, ibv_wc_status};

/// `struct sqd_spdk_qp_counters` (sqdisc_spdk.h): a qpair's error completions and what the provider could not
/// tell SPDK otherwise. Grows only at the end; `size` says how much of it a caller has.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct QpCounters {
    pub size: u32,
    pub qp_num: u32,
    pub send_flushes: u64,
    pub recv_flushes: u64,
    pub owed_flushes: u64,
    pub other_errors: u64,
    pub duplicates: u64,
    pub owed: u64,
    pub refused: u64,
    pub refused_errno: i32,
    pub cq_not_grown: u32,
    pub out_of_order: u64,
    pub out_of_order_shown: u64,
}

/// The size of the first version of [`QpCounters`]: the least a caller may pass.
pub const QP_COUNTERS_V1: usize = std::mem::size_of::<QpCounters>();

/// What a qpair is owed for one wr_id, by origin.
#[derive(Default, Clone, Copy)]
struct Owed {
    send: u32,
    recv: u32,
    own: u32,
}

#[derive(Default)]
struct Inner {
    c: QpCounters,
    owed: HashMap<u64, Owed>,
    refusal_logged: bool,
    /// The qpair receives through an SRQ, whose receives are released by the SRQ (which knows no qpair).
    srq: bool,
}

/// A qpair's error completions: owed and handed (module doc).
#[derive(Default)]
pub(crate) struct Ledger {
    inner: RefCell<Inner>,
}

/// Where an owed error completion comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A send WR's release with an error status: its CQE is the device's.
    Send,
    /// A receive's.
    Recv,
    /// A completion the provider makes (`qp::flush_wc`).
    Own,
}

impl Ledger {
    pub fn new(qp_num: u32) -> Rc<Ledger> {
        let l = Ledger::default();
        l.inner.borrow_mut().c.qp_num = qp_num;
        Rc::new(l)
    }

    /// The qpair receives through an SRQ: an error completion owed nothing may be one of its receives.
    pub fn set_srq(&self) {
        self.inner.borrow_mut().srq = true;
    }

    /// The qpair's CQ could not grow to its worst case: it signals every WR instead.
    pub fn set_cq_not_grown(&self) {
        self.inner.borrow_mut().c.cq_not_grown = 1;
    }

    /// SPDK is owed one more error completion of `wr_id`.
    pub fn owe(&self, wr_id: u64, origin: Origin) {
        let mut i = self.inner.borrow_mut();
        let e = i.owed.entry(wr_id).or_default();
        match origin {
            Origin::Send => e.send += 1,
            Origin::Recv => e.recv += 1,
            Origin::Own => e.own += 1,
        }
        i.c.owed += 1;
    }

    /// A WR the device refused when the provider posted it from the backlog (its errno); true for the qpair's
    /// first, which the caller logs.
    pub fn refused(&self, errno: u32) -> bool {
        let mut i = self.inner.borrow_mut();
        i.c.refused += 1;
        i.c.refused_errno = errno as i32;
        !std::mem::replace(&mut i.refusal_logged, true)
    }

    /// A completion with an error status handed to SPDK: settles what its wr_id is owed, device CQEs first (a
    /// provider's own completion of a wr_id is always owed after them); false if nothing was owed.
    fn handed(&self, wc: &ibv_wc) -> bool {
        let mut i = self.inner.borrow_mut();
        let flush = wc.status == ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
        let Some(e) = i.owed.get_mut(&wc.wr_id) else {
            // An SRQ's receive is released by the SRQ, which records nothing here: counted as a receive's,
            // with no check that it came once (the device's CQE is the only one of an SRQ receive).
            if i.srq {
                if flush {
                    i.c.recv_flushes += 1;
                } else {
                    i.c.other_errors += 1;
                }
                return true;
            }
            return false;
        };
        let kind = if e.send > 0 {
            e.send -= 1;
            if flush { 0 } else { 3 }
        } else if e.recv > 0 {
            e.recv -= 1;
            if flush { 1 } else { 3 }
        } else {
            e.own -= 1;
            2
        };
        if e.send == 0 && e.recv == 0 && e.own == 0 {
            i.owed.remove(&wc.wr_id);
        }
        let c = &mut i.c;
        c.owed -= 1;
        match kind {
            0 => c.send_flushes += 1,
            1 => c.recv_flushes += 1,
            2 => c.owed_flushes += 1,
            _ => c.other_errors += 1,
        }
        true
    }

    fn duplicate(&self) {
        self.inner.borrow_mut().c.duplicates += 1;
    }

    pub fn counters(&self) -> QpCounters {
        let mut c = self.inner.borrow().c;
        c.size = QP_COUNTERS_V1 as u32;
        c
    }
}

/// A managed CQ's registry of the ledgers of the qpairs that complete on it, and what it said once.
#[derive(Default)]
pub(crate) struct Book {
    ledgers: RefCell<Vec<(u32, Rc<Ledger>)>>,
    /// Late completions (a device out of RC order) the CQ showed that a scan has accounted for.
    late_seen: Cell<u64>,
    /// The CQ could not grow for a qpair, and said so.
    pub grow_logged: Cell<bool>,
}

impl Book {
    pub fn register(&self, qp_num: u32, ledger: &Rc<Ledger>) {
        let mut l = self.ledgers.borrow_mut();
        if !l.iter().any(|(n, _)| *n == qp_num) {
            l.push((qp_num, ledger.clone()));
        }
    }

    pub fn unregister(&self, qp_num: u32) {
        self.ledgers.borrow_mut().retain(|(n, _)| *n != qp_num);
    }

    /// Accounts for the completions a poll of the CQ hands SPDK: only those with an error status cost more than
    /// a comparison.
    #[inline(always)]
    pub fn scan(&self, cq: &sqdisc::Cq, out: &[ibv_wc]) {
        for wc in out {
            if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
                self.error_handed(cq, wc);
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn error_handed(&self, cq: &sqdisc::Cq, wc: &ibv_wc) {
        let ledger = self.ledgers.borrow().iter().find(|(n, _)| *n == wc.qp_num).map(|(_, l)| l.clone());
        let Some(ledger) = ledger else { return };
        if ledger.handed(wc) {
            return;
        }
        // Not owed: a late completion a device out of RC order gave for a WR that sqdisc had retired already
        // (sqdisc shows those of WRs SPDK signaled: they are SPDK's only completion of the WR), else a second
        // completion of a WR.
        let shown = cq.out_of_order().shown;
        if shown > self.late_seen.get() {
            self.late_seen.set(self.late_seen.get() + 1);
        } else {
            ledger.duplicate();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The layout sqdisc_spdk.h declares (and its `_Static_assert` pins).
    #[test]
    fn counters_layout_matches_the_header() {
        assert_eq!(size_of::<QpCounters>(), 88);
        assert_eq!(
            [offset_of!(QpCounters, send_flushes), offset_of!(QpCounters, owed), offset_of!(QpCounters, refused_errno), offset_of!(QpCounters, cq_not_grown), offset_of!(QpCounters, out_of_order)],
            [8, 48, 64, 68, 72]
        );
    }

    fn wc(wr_id: u64, status: ibv_wc_status::Type) -> ibv_wc {
        // SAFETY: plain data; all zeroes is valid.
        let mut w: ibv_wc = unsafe { std::mem::zeroed() };
        w.wr_id = wr_id;
        w.status = status;
        w
    }

    /// Each owed completion is settled once, by origin; a second completion of a wr_id owed once is not.
    #[test]
    fn each_owed_completion_settles_once() {
        let l = Ledger::new(7);
        l.owe(1, Origin::Send);
        l.owe(2, Origin::Recv);
        l.owe(3, Origin::Own);
        l.owe(4, Origin::Send);
        l.owe(4, Origin::Own);
        assert_eq!(l.counters().owed, 5);
        let flush = ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
        for id in [1, 2, 3, 4, 4] {
            assert!(l.handed(&wc(id, flush)));
        }
        assert!(!l.handed(&wc(1, flush)), "owed once, handed twice");
        l.owe(5, Origin::Send);
        assert!(l.handed(&wc(5, ibv_wc_status::IBV_WC_RETRY_EXC_ERR)));
        let c = l.counters();
        assert_eq!((c.send_flushes, c.recv_flushes, c.owed_flushes, c.other_errors, c.owed), (2, 1, 2, 1, 0));
        assert_eq!((c.qp_num, c.size as usize), (7, QP_COUNTERS_V1));
        // A qpair on an SRQ: an error completion owed nothing is one of the SRQ's receives.
        l.set_srq();
        assert!(l.handed(&wc(9, flush)));
        assert_eq!((l.counters().recv_flushes, l.counters().duplicates), (2, 0));
    }
}
