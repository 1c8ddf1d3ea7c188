//! A managed queue's deferred actions and library operations (LocalInv WRs of deferred invalidation).

use crate::completion::Completion;
use crate::discipline::backlog::ParkStore;
use crate::discipline::send::Admit;
use crate::discipline::token::{Direction, Token};
use crate::error::{Error, Result};
use crate::release::{ReleaseHandler, call};

use super::{Action, InvalidateMode, Op, QueueShared, closed_error, refusal_message};

impl QueueShared {
    /// Runs `action` once every WR accepted so far is released, or, with `lkey`, once every WR accepted so far
    /// that uses that tracked MR is (`Queue::defer`, `Queue::defer_mr`).
    pub(super) fn defer_action(&self, lkey: Option<u32>, action: Action) -> Result<()> {
        {
            let mut st = self.state.borrow_mut();
            st.barriers.reserve(1)?;
            let target = match lkey.and_then(|k| st.tracked.iter().find(|t| t.lkey == k)) {
                Some(t) => t.last_use,
                None => st.send.accepted(),
            };
            st.barriers.push(target, action);
        }
        self.run_releases();
        Ok(())
    }

    /// `Queue::invalidate`: a LocalInv WR of the library's own for `rkey`, posted once every WR accepted before
    /// it is released (`Deferred`) or at once behind `IBV_SEND_FENCE` (`Fenced`), and reported through `done`.
    pub(super) fn invalidate(&self, rkey: u32, mode: InvalidateMode, wr_id: u64, done: Option<ReleaseHandler>) -> Result<()> {
        let fence = mode == InvalidateMode::Fenced;
        {
            let mut st = self.state.borrow_mut();
            if let Some(c) = st.send.closed() {
                return Err(closed_error(c));
            }
            // A fenced LocalInv that cannot be posted now (no SQ slot, or WRs already parked: it goes behind
            // them, as `admit_op` decides) is parked; with no room to park it, it is refused, so that it is never
            // left waiting where a drain could report it before the WRs accepted ahead of it.
            if fence && st.send.postable() == 0 {
                let why = if st.send.credits() == 0 { "no SQ credit" } else { "WRs wait in the backlog" };
                if st.send.backlog_len() == st.send.backlog_capacity() {
                    return Err(Error::new(libc::EAGAIN, format!("{why} and no backlog room for the fenced LocalInv")));
                }
                if !self.send_cq.pool.borrow().has_room() {
                    return Err(Error::new(
                        libc::EAGAIN,
                        format!(
                            "{why} for the fenced LocalInv, and the send CQ's backlog pool is at its limit \
                             (sqd_cq_set_backlog_limit)"
                        ),
                    ));
                }
            }
            // Room for the barrier that posts it (or retries it when the SQ and the backlog are full).
            st.barriers.reserve(1)?;
            let id = st.new_op(Op { rkey, fence, wr_id, done })?;
            if fence {
                drop(st);
                self.post_op(id);
            } else {
                let target = st.send.accepted();
                st.barriers.push(target, Action::PostOp(id));
            }
        }
        self.run_releases();
        Ok(())
    }

    /// Posts (or parks) library operation `id`. A queue that no longer takes WRs completes it at once as
    /// never posted; one without room retries after the next release.
    pub(super) fn post_op(&self, id: u32) {
        let never_posted = |vendor_err: u32| Completion {
            wr_id: id as u64,
            status: crate::discipline::opcode::WC_WR_FLUSH_ERR as u32,
            opcode: crate::discipline::opcode::WC_LOCAL_INV as u32,
            vendor_err,
            flags: crate::completion::SQD_COMPLETION_NEVER_POSTED,
            ..Completion::default()
        };
        let finished = {
            let mut guard = self.state.borrow_mut();
            let st = &mut *guard;
            let (rkey, fence) = {
                let op = st.ops[id as usize].as_ref().expect("a posted op is pending");
                (op.rkey, op.fence)
            };
            if st.send.closed().is_some() {
                Some(st.finish_op(never_posted(0)))
            } else {
                let admitted = st.send.admit_op(id as u64, crate::discipline::opcode::WC_LOCAL_INV);
                if matches!(admitted, Admit::Post { .. }) {
                    let k = st.send.accepted() - 1;
                    if let Some(v) = &mut st.verify {
                        v.record_none(k);
                    }
                }
                match admitted {
                    Admit::Post { seq, .. } => {
                        st.doorbells += 1;
                        let token = Token::new(self.send_index, Direction::Send, seq).0;
                        match self.qp.post_local_inv(token, rkey, fence) {
                            Ok(()) => None,
                            Err(errno) => {
                                // The provider refused it: nothing reached the HCA; report it as refused.
                                st.send.rollback(1, true);
                                st.send.note_provider_refusal(errno);
                                let wr_id = st.ops[id as usize].as_ref().map_or(0, |o| o.wr_id);
                                let what = format!("the deferred LocalInv of sqd_invalidate wr_id {wr_id:#x}");
                                st.last_refusal = Some(refusal_message(&what, errno));
                                let mut c = never_posted(errno as u32);
                                c.status = crate::discipline::opcode::WC_LOC_QP_OP_ERR as u32;
                                c.flags |= crate::completion::SQD_COMPLETION_REFUSED;
                                Some(st.finish_op(c))
                            }
                        }
                    }
                    Admit::Park => {
                        let mut pool = self.send_cq.pool.borrow_mut();
                        match pool.take(self.pool_class) {
                            Ok(e) => {
                                pool.entry(e).stage_local_inv(id as u64, rkey, fence);
                                st.send.commit_park(e, &mut *pool);
                                let k = st.send.accepted() - 1;
                                if let Some(v) = &mut st.verify {
                                    v.record_none(k);
                                }
                            }
                            // The CQ's pool is exhausted: retried after the queue's next release, as when its
                            // own backlog is full (a queue that parks has WRs outstanding).
                            Err(_) => {
                                let target = st.send.released() + 1;
                                st.barriers.push(target, Action::PostOp(id));
                            }
                        }
                        None
                    }
                    Admit::Full => {
                        let target = st.send.released() + 1;
                        st.barriers.push(target, Action::PostOp(id));
                        None
                    }
                }
            }
        };
        if let Some((done, c)) = finished {
            call(done.as_ref(), &c);
        }
    }
}
