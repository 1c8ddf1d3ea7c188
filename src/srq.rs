//! A managed shared receive queue: receives posted once, consumed by any of the queues attached to it.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Mutex;

use crate::attach::AttachedSrq;
use crate::completion::{Completion, SQD_COMPLETION_RECV};
use crate::discipline::srq::{SrqSlots, MAX_SRQS, SRQ_TOKEN_BASE};
use crate::discipline::token::{Direction, Token};
use crate::error::{Error, Result};
use crate::limits::MAX_DEPTH;
use crate::post_error::RecvPostError;
use crate::release::{call, ReleaseHandler};
use crate::verbs::{RecvChain, SrqHandle};

/// Counters of a managed SRQ (`struct sqd_srq_stats` in C).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SrqStats {
    /// The SRQ's depth (its granted `max_wr`).
    pub depth: u32,
    /// Receives posted and not yet released.
    pub posted: u32,
    /// Receives ever posted.
    pub total_posted: u64,
    /// Receive CQEs reaped.
    pub cqes: u64,
    /// CQEs naming no posted receive (dropped and counted).
    pub stray_cqes: u64,
    /// Queues attached.
    pub queues: u32,
    /// Times the low-watermark callback ran.
    pub low_events: u32,
}

/// Ids for SRQ tokens, process-wide (an SRQ's receives may complete on any CQ).
static SRQ_IDS: Mutex<Vec<bool>> = Mutex::new(Vec::new());

fn take_id() -> Result<u32> {
    let mut ids = SRQ_IDS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = ids.iter().position(|used| !used) {
        ids[i] = true;
        return Ok(i as u32);
    }
    if ids.len() as u32 >= MAX_SRQS {
        return Err(Error::new(libc::ENOSPC, format!("too many managed SRQs (at most {MAX_SRQS} at once)")));
    }
    crate::alloc::reserve(&mut ids, 1, "the table of SRQ ids")?;
    ids.push(true);
    Ok(ids.len() as u32 - 1)
}

fn give_id(id: u32) {
    SRQ_IDS.lock().unwrap_or_else(|e| e.into_inner())[id as usize] = false;
}

pub(crate) struct SrqState {
    slots: SrqSlots,
    due: std::collections::VecDeque<Completion>,
    low_armed: bool,
    low_events: u32,
}

pub(crate) struct SrqShared {
    handle: SrqHandle,
    pub(crate) id: u32,
    state: RefCell<SrqState>,
    releasing: Cell<bool>,
    release: Option<ReleaseHandler>,
    low_watermark: u32,
    low: Option<Box<dyn Fn(u32)>>,
    /// No release handler and no low watermark: a release would call nothing and count nothing, so none is
    /// kept (`due` stays empty, with no room reserved) and `on_cqe` only frees the receive's slot.
    silent: bool,
    pub(crate) queues: Cell<u32>,
    /// `release_all` gave back receives the device still holds: a QP attached later could consume them into
    /// buffers the ULP has reused, and a post could overflow the SRQ, so it takes no more queues or receives.
    retired: Cell<bool>,
}

/// An `ibv_srq` under management ([`Srq::new`]).
///
/// Its receives are released (through its own release handler, flag [`SQD_COMPLETION_RECV`](crate::SQD_COMPLETION_RECV))
/// when their own completion is reaped on any managed CQ where a queue attached to it completes receives.
/// Threads: used by the thread that polls the CQs of its queues, which never carry a lock
/// ([`Queue::with_srq`](crate::Queue::with_srq) refuses such a CQ).
pub struct Srq {
    pub(crate) shared: Rc<SrqShared>,
}

impl Srq {
    /// Takes an SRQ of `depth` receives (its granted `max_wr`) under management. `low` runs (from a poll) each
    /// time the number of posted receives drops below `low_watermark` (0: never), so the ULP can refill.
    pub fn new(
        handle: SrqHandle,
        depth: u32,
        release: Option<ReleaseHandler>,
        low_watermark: u32,
        low: Option<Box<dyn Fn(u32)>>,
    ) -> Result<Srq> {
        if depth == 0 || depth > MAX_DEPTH {
            return Err(Error::invalid(format!("SRQ depth {depth} is outside 1..={MAX_DEPTH}")));
        }
        if low_watermark > depth {
            return Err(Error::invalid(format!("low_watermark {low_watermark} is above the SRQ depth {depth}")));
        }
        // Storage first, so that a failure leaves nothing to undo. `due` holds at most every posted receive:
        // reserved now, it never grows (allocates) while releasing.
        let slots = SrqSlots::new(depth)?;
        let silent = release.is_none() && low_watermark == 0;
        let mut due = std::collections::VecDeque::new();
        if !silent {
            crate::alloc::reserve_deque(&mut due, depth as usize, "the SRQ's due releases")?;
        }
        let id = take_id()?;
        Ok(Srq {
            shared: Rc::new(SrqShared {
                handle,
                id,
                state: RefCell::new(SrqState {
                    slots,
                    due,
                    low_armed: true,
                    low_events: 0,
                }),
                releasing: Cell::new(false),
                release,
                low_watermark,
                low,
                silent,
                queues: Cell::new(0),
                retired: Cell::new(false),
            }),
        })
    }

    pub fn depth(&self) -> u32 {
        self.shared.state.borrow().slots.depth()
    }

    /// Posts a chain of receives (`EAGAIN` at the first beyond the depth).
    pub fn post_recv<'a>(&self, chain: RecvChain<'a>) -> std::result::Result<(), RecvPostError<'a>> {
        self.shared.post_recv(chain)
    }

    /// `EBUSY` while queues are attached or receives are posted (see [`Srq::release_all`]).
    pub fn check_free(&self) -> Result<()> {
        let q = self.shared.queues.get();
        let posted = self.shared.state.borrow().slots.posted();
        if q > 0 || posted > 0 || self.shared.releasing.get() {
            return Err(Error::new(
                libc::EBUSY,
                format!("the SRQ has {q} queue(s) attached and {posted} receive(s) posted (or is running a callback)"),
            ));
        }
        Ok(())
    }

    /// With no queue attached nothing can consume the posted receives any more (the SRQ is being destroyed, or
    /// it is in error: `IBV_EVENT_SRQ_ERR`): release them all now with `IBV_WC_WR_FLUSH_ERR` and
    /// `SQD_COMPLETION_NEVER_POSTED`. `EBUSY` while queues are attached. If it released any, the device still
    /// holds them, so the SRQ then takes no more receives or queues (`EIO`): only freeing it is left.
    pub fn release_all(&self) -> Result<()> {
        if self.shared.queues.get() > 0 {
            return Err(Error::new(libc::EBUSY, "queues are still attached to the SRQ: their QPs may consume its receives"));
        }
        {
            let mut st = self.shared.state.borrow_mut();
            let st = &mut *st;
            if st.slots.posted() > 0 {
                self.shared.retired.set(true);
            }
            let silent = self.shared.silent;
            st.slots.release_all(|r| {
                if !silent {
                    st.due.push_back(Completion::from((r, true)));
                }
            });
        }
        // Nothing will consume these receives: no low-watermark call (the ULP must not refill what it tears down).
        self.shared.deliver_releases(None);
        Ok(())
    }

    pub fn stats(&self) -> SrqStats {
        let st = self.shared.state.borrow();
        SrqStats {
            depth: st.slots.depth(),
            posted: st.slots.posted(),
            total_posted: st.slots.total_posted,
            cqes: st.slots.cqes,
            stray_cqes: st.slots.stray_cqes,
            queues: self.shared.queues.get(),
            low_events: st.low_events,
        }
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        give_id(self.shared.id);
    }
}

impl SrqShared {
    pub(crate) fn handle(&self) -> &SrqHandle {
        &self.handle
    }

    pub(crate) fn depth(&self) -> u32 {
        self.state.borrow().slots.depth()
    }

    pub(crate) fn posted(&self) -> u32 {
        self.state.borrow().slots.posted()
    }

    /// `EIO` once `release_all` gave back receives the device still holds (see `retired`).
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.retired.get() {
            return Err(Error::new(
                libc::EIO,
                "sqd_srq_release_all released receives the SRQ still holds: it takes no more receives or queues (free it)",
            ));
        }
        Ok(())
    }

    fn post_recv<'a>(&self, chain: RecvChain<'a>) -> std::result::Result<(), RecvPostError<'a>> {
        let Some(first) = chain.first() else { return Ok(()) };
        if let Err(error) = self.check_open() {
            return Err(RecvPostError { error, bad: first });
        }
        let mut st = self.state.borrow_mut();
        // The common post, one well-formed receive with a free slot, without the chain's walks.
        if first.next().is_none() && first.sge_list_ok() {
            let wr_id = first.wr_id();
            if let Some(field) = st.slots.admit(wr_id) {
                st.low_armed = st.low_armed || st.slots.posted() >= self.low_watermark;
                first.set_wr_id(Token::new(SRQ_TOKEN_BASE + self.id, Direction::Recv, field).0);
                let r = self.handle.post_chain(first);
                first.set_wr_id(wr_id);
                return r.map_err(|f| {
                    st.slots.rollback(field);
                    RecvPostError { error: Error::new(f.errno, format!("the provider's post_srq_recv failed (errno {})", f.errno)), bad: first }
                });
            }
        }
        // The WRs carry tokens while the provider reads them; each token names the slot holding the ULP's
        // wr_id, so restoring them afterwards needs no allocation.
        let mut admitted = 0usize;
        let mut cur = Some(first);
        let mut last = None;
        let mut stop = None;
        while let Some(w) = cur {
            if !w.sge_list_ok() {
                let (num_sge, _) = w.num_sge();
                stop = Some(RecvPostError { error: Error::invalid(format!("receive WR has num_sge {num_sge} and a NULL or bad sg_list")), bad: w });
                break;
            }
            let Some(field) = st.slots.admit(w.wr_id()) else {
                stop = Some(RecvPostError {
                    error: Error::new(libc::EAGAIN, format!("the SRQ is full (depth {})", st.slots.depth())),
                    bad: w,
                });
                break;
            };
            admitted += 1;
            w.set_wr_id(Token::new(SRQ_TOKEN_BASE + self.id, Direction::Recv, field).0);
            last = Some(w);
            cur = w.next();
        }
        st.low_armed = st.low_armed || st.slots.posted() >= self.low_watermark;
        let Some(last) = last else { return Err(stop.expect("nothing admitted means a stop")) };
        let cut = last.next();
        last.set_next(None);
        let r = self.handle.post_chain(first);
        last.set_next(cut);
        let refused_from = r.as_ref().err().map_or(admitted, |f| f.posted);
        let mut w = first;
        for i in 0..admitted {
            let field = Token(w.wr_id()).field();
            w.set_wr_id(st.slots.wr_id_of(field));
            if i >= refused_from {
                st.slots.rollback(field);
            }
            if i + 1 < admitted {
                w = w.next().expect("run is linked");
            }
        }
        match r {
            Ok(()) => stop.map_or(Ok(()), Err),
            Err(f) => {
                let mut bad = first;
                for _ in 0..f.posted {
                    bad = bad.next().expect("run is linked");
                }
                Err(RecvPostError { error: Error::new(f.errno, format!("the provider's post_srq_recv failed (errno {})", f.errno)), bad })
            }
        }
    }

    /// Maps a receive CQE and hands out the releases due, then runs the low-watermark callback if the posted
    /// receives dropped below it; the ULP's wr_id, or `None` for a stray. The release goes to the handler
    /// directly when nothing waits before it and no pass of this SRQ runs; from one of its callbacks (a poll
    /// of another CQ) it waits in `due` for the running pass, which hands it out next, as before.
    pub(crate) fn on_cqe(&self, token: Token, status: u8, vendor_err: u32, wc_opcode: u8, remote_inv: Option<u32>) -> Option<u64> {
        if self.silent {
            // Nothing to hand out, nothing to count: the CQE only frees its slot.
            return self.state.borrow_mut().slots.on_cqe(token.field(), status, vendor_err, wc_opcode, remote_inv).map(|r| r.wr_id);
        }
        let (wr_id, direct) = {
            let mut st = self.state.borrow_mut();
            match st.slots.on_cqe(token.field(), status, vendor_err, wc_opcode, remote_inv) {
                Some(r) => {
                    let mut c = Completion::from((r, true));
                    c.flags |= SQD_COMPLETION_RECV;
                    if !self.releasing.get() && st.due.is_empty() {
                        (Some(r.wr_id), Some(c))
                    } else {
                        st.due.push_back(c);
                        (Some(r.wr_id), None)
                    }
                }
                None => (None, None),
            }
        };
        if self.deliver_releases(direct) {
            self.check_low_watermark();
        }
        wr_id
    }

    /// Hands out `first` (a release due before any in `due`; `None` if the pass is already running), then the
    /// releases in `due`; `false` if a release pass was already running (it hands out these too).
    fn deliver_releases(&self, first: Option<Completion>) -> bool {
        if self.releasing.replace(true) {
            debug_assert!(first.is_none(), "a release handed out directly while a pass runs");
            return false;
        }
        struct Clear<'a>(&'a Cell<bool>);
        impl Drop for Clear<'_> {
            fn drop(&mut self) {
                self.0.set(false);
            }
        }
        let _clear = Clear(&self.releasing);
        if let Some(c) = first {
            call(self.release.as_ref(), &c);
        }
        loop {
            let next = self.state.borrow_mut().due.pop_front();
            match next {
                Some(c) => call(self.release.as_ref(), &c),
                None => break,
            }
        }
        true
    }

    fn check_low_watermark(&self) {
        let low = {
            let mut st = self.state.borrow_mut();
            let posted = st.slots.posted();
            if st.low_armed && posted < self.low_watermark {
                st.low_armed = false;
                st.low_events += 1;
                Some(posted)
            } else {
                None
            }
        };
        if let (Some(posted), Some(f)) = (low, &self.low) {
            f(posted);
        }
    }
}

/// What the CQs where its queues complete receives call on it (`CqShared::attach_srq`).
impl AttachedSrq for SrqShared {
    fn id(&self) -> u32 {
        self.id
    }
    fn depth(&self) -> u32 {
        SrqShared::depth(self)
    }
    fn on_cqe(&self, token: Token, status: u8, vendor_err: u32, wc_opcode: u8, remote_inv: Option<u32>) -> Option<u64> {
        SrqShared::on_cqe(self, token, status, vendor_err, wc_opcode, remote_inv)
    }
    fn is_silent(&self) -> bool {
        self.silent
    }
}
