//! The data path: a context's `post_send`, `post_recv` and `poll_cq` entries replaced by wrappers that check,
//! then call the provider's own op with the same arguments and return its result unchanged.
//!
//! libibverbs' `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are inline functions that call
//! `ctx->ops.<op>`, so the ops table is the only place where a program's data path can be seen without a
//! change to the program. An entry stays replaced for the life of the process: putting it back while another
//! thread may be inside `ibv_poll_cq` could not be made safe.

use std::cell::RefCell;
use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use rdma_sys::{ibv_context, ibv_cq, ibv_qp, ibv_qp_state, ibv_recv_wr, ibv_send_wr, ibv_wc};

use super::output;
use super::state::{lock, Originals, PollFn, PostRecvFn, PostSendFn};
use crate::rules::model::{Memory, Samples, SendWr, Sge, Wc};

/// Reads the ULP's registered memory for the source-buffer verifier.
pub struct ProcessMemory;

impl Memory for ProcessMemory {
    fn checksum(&self, ranges: &[(usize, usize)]) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &(addr, len) in ranges {
            let p = addr as *const u8;
            let words = len / 8;
            for i in 0..words {
                // SAFETY: the rules hand over only ranges inside an MR that is registered right now (an MR's
                // samples are dropped when it is deregistered), and registered memory is mapped. Volatile, unaligned
                // reads: the ULP may be changing the bytes (that is what is being checked).
                let w = unsafe { ptr::read_volatile(p.add(i * 8).cast::<[u8; 8]>()) };
                h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0x0000_0100_0000_01b3);
            }
            for i in words * 8..len {
                // SAFETY: as above, one byte of the same range.
                let b = unsafe { ptr::read_volatile(p.add(i)) };
                h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        h
    }
}

/// Reused buffers for one call, so that checking a WR allocates nothing of its own.
#[derive(Default)]
struct Scratch {
    wrs: Vec<SendWr>,
    ptrs: Vec<usize>,
    sges: Vec<Sge>,
    samples: Samples,
    recv_ids: Vec<u64>,
    wcs: Vec<Wc>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        // Re-entered from a provider op (never expected): a fresh scratch.
        Err(_) => f(&mut Scratch::default()),
    })
}

/// Replaces the data-path ops of `ctx` (once per context) and keeps the provider's.
///
/// # Safety
/// `ctx` is a live device context that stays alive while any of its QPs or CQs is used.
pub unsafe fn attach(ctx: *mut ibv_context) -> Result<(), c_int> {
    if ctx.is_null() {
        return Err(-libc::EINVAL);
    }
    let mut g = lock();
    let Some(st) = g.as_mut() else { return Err(-libc::EIO) };
    if st.off() {
        return Ok(());
    }
    // SAFETY: `ctx` is live (caller's promise); plain field reads.
    let (send, recv, poll) = unsafe { ((*ctx).ops.post_send, (*ctx).ops.post_recv, (*ctx).ops.poll_cq) };
    let ours = send.map(|f| f as usize) == Some(post_send as PostSendFn as usize);
    if ours && st.contexts.contains_key(&(ctx as usize)) {
        return Ok(());
    }
    if ours {
        // Ours, but its originals are lost (cannot happen: they are never removed).
        return Err(-libc::EIO);
    }
    st.contexts.insert(ctx as usize, Originals { post_send: send, post_recv: recv, poll_cq: poll });
    // SAFETY: each entry is an aligned, pointer-sized field of the live context (`Option<fn>` has the layout of
    // a pointer). Other threads may be reading them in `ibv_post_send` etc. right now, so each is replaced with
    // one atomic store, and either value they read is valid. An op the provider does not have stays NULL.
    unsafe {
        if send.is_some() {
            let slot = ptr::addr_of_mut!((*ctx).ops.post_send).cast::<AtomicUsize>();
            (*slot).store(post_send as PostSendFn as usize, Ordering::Release);
        }
        if recv.is_some() {
            let slot = ptr::addr_of_mut!((*ctx).ops.post_recv).cast::<AtomicUsize>();
            (*slot).store(post_recv as PostRecvFn as usize, Ordering::Release);
        }
        if poll.is_some() {
            let slot = ptr::addr_of_mut!((*ctx).ops.poll_cq).cast::<AtomicUsize>();
            (*slot).store(poll_cq as PollFn as usize, Ordering::Release);
        }
    }
    drop(g);
    output::install_hooks();
    Ok(())
}

fn originals(ctx: *mut ibv_context) -> Option<Originals> {
    lock().as_ref().and_then(|st| st.contexts.get(&(ctx as usize)).copied())
}

/// The replacement `post_send`.
///
/// # Safety
/// Called by `ibv_post_send` with a live QP of an attached context and a chain the provider may read.
pub unsafe extern "C" fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad: *mut *mut ibv_send_wr) -> c_int {
    // SAFETY: as `ibv_post_send` promises.
    catch_unwind(AssertUnwindSafe(|| unsafe { post_send_inner(qp, wr, bad) })).unwrap_or(libc::EIO)
}

/// # Safety
/// As for [`post_send`].
unsafe fn post_send_inner(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad: *mut *mut ibv_send_wr) -> c_int {
    // SAFETY: `qp` is live (caller's promise).
    let (ctx, state) = unsafe { ((*qp).context, (*qp).state) };
    with_scratch(|s| {
        s.wrs.clear();
        s.ptrs.clear();
        s.sges.clear();
        let mut p = wr;
        while !p.is_null() {
            // SAFETY: every WR of the chain is readable (caller's promise), and so are `num_sge` SGEs at a
            // non-NULL `sg_list`, as the provider itself will read them.
            unsafe {
                let w = &*p;
                let n = if w.sg_list.is_null() || w.num_sge <= 0 { 0 } else { w.num_sge as usize };
                let first = s.sges.len();
                for i in 0..n {
                    let g = &*w.sg_list.add(i);
                    s.sges.push(Sge { addr: g.addr, len: g.length, lkey: g.lkey });
                }
                s.wrs.push(SendWr {
                    wr_id: w.wr_id,
                    opcode: w.opcode,
                    flags: w.send_flags,
                    invalidate_rkey: w.imm_data_invalidated_rkey_union.invalidated_rkey,
                    first_sge: first,
                    num_sge: n,
                });
                s.ptrs.push(p as usize);
                p = w.next;
            }
        }
        let (original, abort) = {
            let mut g = lock();
            let Some(st) = g.as_mut() else { return libc::EIO };
            let Some(o) = st.contexts.get(&(ctx as usize)).and_then(|o| o.post_send) else { return libc::EINVAL };
            st.checker.before_post(
                qp as usize,
                &s.wrs,
                &s.sges,
                state == ibv_qp_state::IBV_QPS_ERR,
                &ProcessMemory,
                &mut s.samples,
            );
            (o, output::take_abort(st))
        };
        if let Some(report) = abort {
            output::abort_with(&report);
        }
        // SAFETY: the provider's own op, called as `ibv_post_send` would have.
        let rc = unsafe { original(qp, wr, bad) };
        let accepted = if rc == 0 {
            s.wrs.len()
        } else {
            // SAFETY: on failure the provider stored the first WR it refused in `*bad` (or left it as it was).
            let b = if bad.is_null() { 0 } else { (unsafe { *bad }) as usize };
            s.ptrs.iter().position(|&x| x == b).unwrap_or(0)
        };
        if let Some(st) = lock().as_mut() {
            st.checker.after_post(qp as usize, &s.wrs, &s.sges, accepted, &mut s.samples);
        }
        rc
    })
}

/// The replacement `post_recv`.
///
/// # Safety
/// Called by `ibv_post_recv` with a live QP of an attached context and a readable chain.
pub unsafe extern "C" fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr) -> c_int {
    // SAFETY: as `ibv_post_recv` promises.
    catch_unwind(AssertUnwindSafe(|| unsafe { post_recv_inner(qp, wr, bad) })).unwrap_or(libc::EIO)
}

/// # Safety
/// As for [`post_recv`].
unsafe fn post_recv_inner(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr) -> c_int {
    // SAFETY: `qp` is live (caller's promise).
    let ctx = unsafe { (*qp).context };
    let Some(original) = originals(ctx).and_then(|o| o.post_recv) else { return libc::EINVAL };
    // SAFETY: the provider's own op, called as `ibv_post_recv` would have.
    let rc = unsafe { original(qp, wr, bad) };
    // SAFETY: on failure `*bad` is the first refused WR (or unchanged); the chain is readable.
    let stop = if rc == 0 || bad.is_null() { ptr::null_mut() } else { unsafe { *bad } };
    with_scratch(|s| {
        s.recv_ids.clear();
        let mut p = wr;
        while !p.is_null() && p != stop {
            // SAFETY: a WR of the readable chain.
            unsafe {
                s.recv_ids.push((*p).wr_id);
                p = (*p).next;
            }
        }
        if let Some(st) = lock().as_mut() {
            st.checker.after_post_recv(qp as usize, &s.recv_ids);
        }
    });
    rc
}

/// The replacement `poll_cq`.
///
/// # Safety
/// Called by `ibv_poll_cq` with a live CQ of an attached context and `wc` holding `n` entries.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: as `ibv_poll_cq` promises.
    catch_unwind(AssertUnwindSafe(|| unsafe { poll_cq_inner(cq, n, wc) })).unwrap_or(-libc::EIO)
}

/// # Safety
/// As for [`poll_cq`].
unsafe fn poll_cq_inner(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: `cq` is live (caller's promise).
    let ctx = unsafe { (*cq).context };
    let Some(original) = originals(ctx).and_then(|o| o.poll_cq) else { return -libc::EINVAL };
    // SAFETY: the provider's own op, called as `ibv_poll_cq` would have.
    let got = unsafe { original(cq, n, wc) };
    if got < 0 {
        return got;
    }
    let abort = with_scratch(|s| {
        s.wcs.clear();
        for i in 0..got as usize {
            // SAFETY: the provider filled the first `got` entries.
            let w = unsafe { &*wc.add(i) };
            s.wcs.push(Wc { wr_id: w.wr_id, status: w.status, opcode: w.opcode, qp_num: w.qp_num });
        }
        let mut g = lock();
        let st = g.as_mut()?;
        st.checker.after_poll(cq as usize, &s.wcs, &ProcessMemory);
        output::take_abort(st)
    });
    if let Some(report) = abort {
        output::abort_with(&report);
    }
    got
}
