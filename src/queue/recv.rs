//! The post path of a managed queue's receives.

use crate::discipline::token::{Direction, Token};
use crate::error::Error;
use crate::post_error::RecvPostError;
use crate::verbs::{RecvChain, RecvWrPtr};

use super::QueueShared;

impl QueueShared {
    /// `Queue::post_recv`: posts the chain's receives with their tokens while the RQ has credits, and restores
    /// their wr_ids.
    pub(super) fn post_recv<'a>(&self, chain: RecvChain<'a>) -> std::result::Result<(), RecvPostError<'a>> {
        let Some(first) = chain.first() else { return Ok(()) };
        let mut st = self.state.borrow_mut();
        let Some(recv) = st.recv.as_mut() else {
            return Err(RecvPostError {
                error: Error::invalid("this queue does not manage receives (rq_depth 0)"),
                bad: first,
            });
        };
        if recv.is_abandoned() {
            // An asynchronous event said no CQE may come any more: a receive posted now would never be released.
            return Err(RecvPostError {
                error: Error::new(libc::EIO, "the queue was released by an asynchronous event; it takes no more receives"),
                bad: first,
            });
        }
        // The common post, one well-formed receive with a credit, without the chain's walks.
        if first.next().is_none() && first.sge_list_ok() {
            let wr_id = first.wr_id();
            if let Some(seq) = recv.admit(wr_id) {
                first.set_wr_id(Token::new(self.recv_index, Direction::Recv, seq).0);
                let r = self.qp.post_recv_chain(first);
                first.set_wr_id(wr_id);
                return r.map_err(|f| {
                    recv.rollback(1);
                    RecvPostError { error: Error::new(f.errno, format!("the provider's post_recv failed (errno {})", f.errno)), bad: first }
                });
            }
        }
        // The WRs carry tokens while the provider reads them; the ULP's wr_ids wait in the ring slots, so
        // restoring them afterwards needs no allocation.
        let first_seq = recv.seq_base() + recv.outstanding();
        let mut admitted = 0usize;
        let mut cur = Some(first);
        let mut last: Option<RecvWrPtr<'a>> = None;
        let mut stop: Option<RecvPostError<'a>> = None;
        while let Some(w) = cur {
            if !w.sge_list_ok() {
                let (num_sge, _) = w.num_sge();
                stop = Some(RecvPostError { error: Error::invalid(format!("receive WR has num_sge {num_sge} and a NULL or bad sg_list")), bad: w });
                break;
            }
            let Some(seq) = recv.admit(w.wr_id()) else {
                stop = Some(RecvPostError {
                    error: Error::new(libc::EAGAIN, format!("no receive credit (rq_depth {})", recv.depth())),
                    bad: w,
                });
                break;
            };
            debug_assert_eq!(seq, first_seq + admitted as u64);
            admitted += 1;
            w.set_wr_id(Token::new(self.recv_index, Direction::Recv, seq).0);
            last = Some(w);
            cur = w.next();
        }
        let Some(last) = last else { return Err(stop.expect("nothing admitted means a stop")) };
        let cut = last.next();
        last.set_next(None);
        let r = self.qp.post_recv_chain(first);
        last.set_next(cut);
        let mut w = first;
        for i in 0..admitted {
            w.set_wr_id(recv.wr_id_of(first_seq + i as u64));
            if i + 1 < admitted {
                w = w.next().expect("run is linked");
            }
        }
        match r {
            Ok(()) => stop.map_or(Ok(()), Err),
            Err(f) => {
                recv.rollback((admitted - f.posted) as u64);
                let mut bad = first;
                for _ in 0..f.posted {
                    bad = bad.next().expect("run is linked");
                }
                Err(RecvPostError { error: Error::new(f.errno, format!("the provider's post_recv failed (errno {})", f.errno)), bad })
            }
        }
    }
}
