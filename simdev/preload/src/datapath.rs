//! The context's data-path ops (what libibverbs' inline `ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`,
//! `ibv_poll_cq` and `ibv_req_notify_cq` call): each copies what it needs out of the program's structures and
//! asks the daemon, where the model runs.

use std::ffi::c_int;

use rdma_sys::{ibv_context_ops, ibv_cq, ibv_qp, ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_srq, ibv_wc, ibv_wc_status, ibv_wr_opcode};
use sqdisc_sim_proto::{RecvWr, Reply, Request, SendWr, Sge, Wc, MAX_POLL};

use crate::context::context_fast;
use crate::objects::{cq_parts, Srq};
use crate::qp::{qp_context, qp_obj};
use crate::{guarded, report};

pub fn install(ops: &mut ibv_context_ops) {
    ops.post_send = Some(post_send);
    ops.post_recv = Some(post_recv);
    ops.post_srq_recv = Some(post_srq_recv);
    ops.poll_cq = Some(poll_cq);
    ops.req_notify_cq = Some(req_notify_cq);
}

/// Copies `n` SGEs when `n` is within `max` and the list is set (else the daemon's model refuses the WR by
/// its count alone).
///
/// # Safety
/// A non-NULL `list` holds `n` SGEs when `0 <= n <= max` (the verbs contract).
unsafe fn copy_sges(list: *const ibv_sge, n: i32, max: u32) -> Vec<Sge> {
    if n <= 0 || n as u32 > max || list.is_null() {
        return Vec::new();
    }
    // SAFETY: as the caller promises.
    let s = unsafe { std::slice::from_raw_parts(list, n as usize) };
    s.iter().map(|s| Sge { addr: s.addr, length: s.length, lkey: s.lkey }).collect()
}

/// # Safety
/// `w` is a valid send WR of the program (its SGEs, and with `IBV_SEND_INLINE` their bytes, readable).
unsafe fn send_wr(w: &ibv_send_wr, max_sge: u32, max_inline: u32) -> SendWr {
    let atomic = w.opcode == ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
    let (remote_addr, rkey, compare_add, swap) = if atomic {
        // SAFETY: for atomic opcodes the `atomic` member is the one filled; all members are plain data.
        let a = unsafe { w.wr.atomic };
        (a.remote_addr, a.rkey, a.compare_add, a.swap)
    } else {
        // SAFETY: as above, for the `rdma` member.
        let r = unsafe { w.wr.rdma };
        (r.remote_addr, r.rkey, 0, 0)
    };
    // SAFETY: as the caller promises.
    let sges = unsafe { copy_sges(w.sg_list, w.num_sge, max_sge) };
    let mut inline_data = None;
    if w.send_flags & ibv_send_flags::IBV_SEND_INLINE.0 != 0 {
        let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
        if total <= u64::from(max_inline) {
            let mut data = Vec::with_capacity(total as usize);
            for s in &sges {
                if s.length > 0 {
                    // SAFETY: with IBV_SEND_INLINE the program's SGE bytes are readable during the call; copied
                    // now, as an HCA copies inline data at post time.
                    data.extend_from_slice(unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) });
                }
            }
            inline_data = Some(data);
        }
    }
    SendWr {
        wr_id: w.wr_id,
        opcode: w.opcode,
        send_flags: w.send_flags,
        num_sge: w.num_sge,
        null_sg_list: w.num_sge > 0 && w.sg_list.is_null(),
        sges,
        inline_data,
        remote_addr,
        rkey,
        // SAFETY: both members of the union are a `u32`.
        imm: unsafe { w.imm_data_invalidated_rkey_union.imm_data },
        compare_add,
        swap,
    }
}

/// Most WRs one post message to the daemon carries. A program may post a chain of thousands of WRs at once (SPDK's
/// NVMe-oF target fills a 4095-deep SRQ with one `ibv_post_srq_recv`); as one `SOCK_SEQPACKET` message that is
/// more than the socket's send buffer and `sendmsg` fails with `EMSGSIZE`. So a chain goes in messages of at
/// most this many WRs, in order, each posted as verbs posts a chain (the WRs before a refused one are posted):
/// 64 WRs of 32 SGEs and their inline bytes stay far below the default send buffer (about 208 KiB).
pub const POST_CHUNK: usize = 64;

/// Splits a chain's WRs into the messages that carry them, in order.
fn chunks<T>(mut wrs: Vec<T>) -> Vec<Vec<T>> {
    let mut out = Vec::with_capacity(wrs.len().div_ceil(POST_CHUNK).max(1));
    while wrs.len() > POST_CHUNK {
        let rest = wrs.split_off(POST_CHUNK);
        out.push(std::mem::replace(&mut wrs, rest));
    }
    out.push(wrs);
    out
}

fn nth<T>(first: *mut T, n: u32, next: impl Fn(*mut T) -> *mut T) -> *mut T {
    let mut cur = first;
    for _ in 0..n {
        if cur.is_null() {
            break;
        }
        cur = next(cur);
    }
    cur
}

unsafe extern "C" fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    guarded("ibv_post_send", libc::EIO, || {
        let set_bad = |at: *mut ibv_send_wr| {
            if !bad_wr.is_null() {
                // SAFETY: the caller's out-pointer.
                unsafe { *bad_wr = at };
            }
        };
        // SAFETY: reached through the QP's context ops: a live QP of this library.
        let (c, q) = unsafe { (qp_context(qp), qp_obj(qp)) };
        let mut wrs = Vec::new();
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: the program's WR chain, valid as `ibv_post_send` requires.
            let w = unsafe { &*cur };
            // SAFETY: as above.
            wrs.push(unsafe { send_wr(w, q.caps.max_send_sge, q.caps.max_inline_data) });
            cur = w.next;
        }
        // Held across the requests, so that the QP's posts reach the daemon in the order they are counted.
        let mut m = q.mirror.lock().unwrap_or_else(|p| p.into_inner());
        let mut base = 0u32;
        for wrs in chunks(wrs) {
            let n = wrs.len() as u64;
            let room = u64::from(q.caps.max_send_wr).saturating_sub(m.posted - m.freed);
            if m.connected && n <= room && wrs.iter().all(|w| send_fits(w, q)) {
                match c.conn.tell(&Request::PostSendAsync { qp: q.id, wrs }) {
                    Ok(()) => m.posted += n,
                    Err(f) => {
                        report("ibv_post_send", &f);
                        // SAFETY: the chain walked above.
                        set_bad(nth(wr, base, |w| unsafe { (*w).next }));
                        return f.errno;
                    }
                }
                base += n as u32;
                continue;
            }
            let reply = c.conn.ask(&Request::PostSend { qp: q.id, wrs });
            if let Ok(Reply::Posted { errno, index }) = &reply {
                m.posted += if *errno == 0 { n } else { u64::from(*index) };
            }
            match reply {
                Ok(Reply::Posted { errno: 0, .. }) => {}
                Ok(Reply::Posted { errno, index }) => {
                    // SAFETY: the chain walked above.
                    set_bad(nth(wr, base + index, |w| unsafe { (*w).next }));
                    return errno;
                }
                Ok(_) => {
                    // SAFETY: as above.
                    set_bad(nth(wr, base, |w| unsafe { (*w).next }));
                    return libc::EPROTO;
                }
                Err(f) => {
                    report("ibv_post_send", &f);
                    // SAFETY: as above.
                    set_bad(nth(wr, base, |w| unsafe { (*w).next }));
                    return f.errno;
                }
            }
            base += n as u32;
        }
        0
    })
}

/// # Safety
/// `wr` is the program's receive WR chain, valid as `ibv_post_recv` requires.
unsafe fn recv_wrs(wr: *mut ibv_recv_wr, max_sge: u32) -> Vec<RecvWr> {
    let mut out = Vec::new();
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: as the caller promises.
        let w = unsafe { &*cur };
        out.push(RecvWr {
            wr_id: w.wr_id,
            num_sge: w.num_sge,
            null_sg_list: w.num_sge > 0 && w.sg_list.is_null(),
            // SAFETY: as the caller promises.
            sges: unsafe { copy_sges(w.sg_list, w.num_sge, max_sge) },
        });
        cur = w.next;
    }
    out
}

/// The result of one message of a receive chain whose first WR is the chain's `base`-th.
fn posted(name: &str, reply: crate::conn::Result<Reply>, wr: *mut ibv_recv_wr, base: u32, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    let set_bad = |at: *mut ibv_recv_wr| {
        if !bad_wr.is_null() {
            // SAFETY: the caller's out-pointer.
            unsafe { *bad_wr = at };
        }
    };
    match reply {
        Ok(Reply::Posted { errno: 0, .. }) => 0,
        Ok(Reply::Posted { errno, index }) => {
            // SAFETY: the program's chain, walked before.
            set_bad(nth(wr, base + index, |w| unsafe { (*w).next }));
            errno
        }
        Ok(_) => {
            // SAFETY: as above.
            set_bad(nth(wr, base, |w| unsafe { (*w).next }));
            libc::EPROTO
        }
        Err(f) => {
            report(name, &f);
            // SAFETY: as above.
            set_bad(nth(wr, base, |w| unsafe { (*w).next }));
            f.errno
        }
    }
}

unsafe extern "C" fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    guarded("ibv_post_recv", libc::EIO, || {
        // SAFETY: reached through the QP's context ops: a live QP of this library.
        let (c, q) = unsafe { (qp_context(qp), qp_obj(qp)) };
        // SAFETY: the program's chain.
        let wrs = unsafe { recv_wrs(wr, q.caps.max_recv_sge) };
        // SAFETY: as above.
        let on_srq = unsafe { !(*qp).srq.is_null() };
        let mut m = q.mirror.lock().unwrap_or_else(|p| p.into_inner());
        let mut base = 0u32;
        for wrs in chunks(wrs) {
            let n = wrs.len() as u64;
            let room = u64::from(q.caps.max_recv_wr).saturating_sub(m.recv_posted - m.recv_polled);
            let rc = if !on_srq && n <= room && wrs.iter().all(|w| recv_fits(w, q.caps.max_recv_sge)) {
                match c.conn.tell(&Request::PostRecvAsync { qp: q.id, wrs }) {
                    Ok(()) => {
                        m.recv_posted += n;
                        0
                    }
                    Err(f) => posted("ibv_post_recv", Err(f), wr, base, bad_wr),
                }
            } else {
                let reply = c.conn.ask(&Request::PostRecv { qp: q.id, wrs });
                if let Ok(Reply::Posted { errno, index }) = &reply {
                    m.recv_posted += if *errno == 0 { n } else { u64::from(*index) };
                }
                posted("ibv_post_recv", reply, wr, base, bad_wr)
            };
            if rc != 0 {
                return rc;
            }
            base += n as u32;
        }
        0
    })
}

unsafe extern "C" fn post_srq_recv(srq: *mut ibv_srq, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    guarded("ibv_post_srq_recv", libc::EIO, || {
        // SAFETY: reached through the SRQ's context ops: a live SRQ of this library.
        let (c, s) = unsafe { (context_fast((*srq).context), &*srq.cast::<Srq>()) };
        // SAFETY: the program's chain.
        let wrs = unsafe { recv_wrs(wr, s.max_sge) };
        let mut m = s.mirror.lock().unwrap_or_else(|p| p.into_inner());
        let mut base = 0u32;
        for wrs in chunks(wrs) {
            let n = wrs.len() as u64;
            let room = u64::from(s.max_wr).saturating_sub(m.0 - m.1);
            let rc = if n <= room && wrs.iter().all(|w| recv_fits(w, s.max_sge)) {
                match c.conn.tell(&Request::PostSrqRecvAsync { srq: s.id, wrs }) {
                    Ok(()) => {
                        m.0 += n;
                        0
                    }
                    Err(f) => posted("ibv_post_srq_recv", Err(f), wr, base, bad_wr),
                }
            } else {
                let reply = c.conn.ask(&Request::PostSrqRecv { srq: s.id, wrs });
                if let Ok(Reply::Posted { errno, index }) = &reply {
                    m.0 += if *errno == 0 { n } else { u64::from(*index) };
                }
                posted("ibv_post_srq_recv", reply, wr, base, bad_wr)
            };
            if rc != 0 {
                return rc;
            }
            base += n as u32;
        }
        0
    })
}

unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    guarded("ibv_poll_cq", -libc::EIO, || {
        if num_entries < 0 || (num_entries > 0 && wc.is_null()) {
            return -libc::EINVAL;
        }
        // SAFETY: reached through the CQ's context ops: a live CQ of this library.
        let (c, obj) = unsafe { cq_parts(cq) };
        if obj.queued.as_ref().is_some_and(|q| q.get() == 0) && !c.conn.is_dead() {
            // Nothing to take: no round trip. The daemon advances time by itself meanwhile, so let it run.
            std::thread::yield_now();
            return 0;
        }
        let max = (num_entries as u32).min(MAX_POLL);
        match c.conn.ask(&Request::PollCq { cq: obj.id, max }) {
            Ok(Reply::Polled { wcs }) => {
                note_polled(c, &wcs);
                for (i, w) in wcs.iter().enumerate().take(max as usize) {
                    // SAFETY: plain data; zero is valid.
                    let mut out: ibv_wc = unsafe { std::mem::zeroed() };
                    out.wr_id = w.wr_id;
                    out.status = w.status;
                    out.opcode = w.opcode;
                    out.vendor_err = w.vendor_err;
                    out.byte_len = w.byte_len;
                    out.imm_data_invalidated_rkey_union.imm_data = w.imm;
                    out.qp_num = w.qp_num;
                    out.src_qp = w.src_qp;
                    out.wc_flags = w.wc_flags;
                    out.pkey_index = w.pkey_index;
                    out.slid = w.slid;
                    out.sl = w.sl;
                    out.dlid_path_bits = w.dlid_path_bits;
                    // SAFETY: the program's array of `num_entries` entries; `i < max <= num_entries`.
                    unsafe { wc.add(i).write(out) };
                }
                wcs.len().min(max as usize) as c_int
            }
            Ok(_) => -libc::EPROTO,
            Err(f) => {
                report("ibv_poll_cq", &f);
                -f.errno
            }
        }
    })
}

/// Whether a send WR certainly passes the device's checks (the model's, `post_send_on`): a WR this says no
/// to is posted with a round trip, and the model decides.
fn send_fits(w: &SendWr, q: &crate::qp::Qp) -> bool {
    use ibv_wr_opcode::*;
    let known = matches!(
        w.opcode,
        IBV_WR_SEND
            | IBV_WR_SEND_WITH_IMM
            | IBV_WR_SEND_WITH_INV
            | IBV_WR_RDMA_WRITE
            | IBV_WR_RDMA_WRITE_WITH_IMM
            | IBV_WR_RDMA_READ
            | IBV_WR_ATOMIC_CMP_AND_SWP
            | IBV_WR_ATOMIC_FETCH_AND_ADD
            | IBV_WR_LOCAL_INV
    );
    let carries_data = matches!(w.opcode, IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_SEND_WITH_INV | IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM);
    let atomic = matches!(w.opcode, IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD);
    let total: u64 = w.sges.iter().map(|s| u64::from(s.length)).sum();
    let inline = w.send_flags & ibv_send_flags::IBV_SEND_INLINE.0 != 0;
    known
        && w.num_sge >= 0
        && w.num_sge as u32 <= q.caps.max_send_sge
        && w.sges.len() == w.num_sge as usize
        && !w.null_sg_list
        && (!inline || (carries_data && total <= u64::from(q.caps.max_inline_data) && w.inline_data.is_some()))
        && (!atomic || (total == 8 && w.remote_addr % 8 == 0))
}

fn recv_fits(w: &RecvWr, max_sge: u32) -> bool {
    w.num_sge >= 0 && w.num_sge as u32 <= max_sge && w.sges.len() == w.num_sge as usize && !w.null_sg_list
}

/// Counts what the polled completions free in the copies of the slot counts of their QPs and SRQs, and their
/// QPs' error completions.
fn note_polled(c: &crate::context::Context, wcs: &[Wc]) {
    if wcs.is_empty() {
        return;
    }
    let qps = c.qps_by_num.lock().unwrap_or_else(|p| p.into_inner());
    for w in wcs {
        let Some(&ptr) = qps.get(&w.qp_num) else { continue };
        // SAFETY: a live QP of this context (QPs leave the map before they are freed).
        let q = unsafe { &*(ptr as *const crate::qp::Qp) };
        if w.status != ibv_wc_status::IBV_WC_SUCCESS {
            let mut m = q.mirror.lock().unwrap_or_else(|p| p.into_inner());
            if w.status == ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                m.flush_polled += 1;
            } else {
                m.error_polled += 1;
            }
        }
        match w.sq_freed {
            Some(f) => {
                let mut m = q.mirror.lock().unwrap_or_else(|p| p.into_inner());
                m.freed = m.freed.max(f);
            }
            None => {
                let srq = q.qpx.qp_base.srq;
                if srq.is_null() {
                    q.mirror.lock().unwrap_or_else(|p| p.into_inner()).recv_polled += 1;
                } else {
                    // SAFETY: the QP's SRQ outlives it (verbs: an SRQ is destroyed after its QPs).
                    let s = unsafe { &*srq.cast::<Srq>() };
                    s.mirror.lock().unwrap_or_else(|p| p.into_inner()).1 += 1;
                }
            }
        }
    }
}

unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guarded("ibv_req_notify_cq", libc::EIO, || {
        // SAFETY: reached through the CQ's context ops: a live CQ of this library.
        let (c, obj) = unsafe { cq_parts(cq) };
        match c.conn.ask(&Request::ReqNotifyCq { cq: obj.id, solicited_only: solicited_only != 0 }) {
            Ok(_) => 0,
            Err(f) => {
                report("ibv_req_notify_cq", &f);
                f.errno
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain longer than one message goes in order, in messages of at most `POST_CHUNK` WRs, none empty
    /// (SPDK's target posts 4095 SRQ receives in one call: one message of them exceeded the socket's buffer).
    #[test]
    fn long_chains_go_in_bounded_messages_in_order() {
        for n in [0usize, 1, POST_CHUNK - 1, POST_CHUNK, POST_CHUNK + 1, 4095] {
            let parts = chunks((0..n).collect::<Vec<_>>());
            assert!(parts.iter().all(|p| p.len() <= POST_CHUNK), "{n}");
            assert!(n == 0 || parts.iter().all(|p| !p.is_empty()), "{n}");
            assert_eq!(parts.concat(), (0..n).collect::<Vec<_>>(), "{n}");
        }
    }
}
