//! A client's requests, carried out on the model. Every object a request names must be one this client made
//! on this connection; anything else is `EINVAL` with a message, never a pointer followed.

use std::os::fd::OwnedFd;

use rdma_sys::{
    ibv_cq, ibv_qp_init_attr, ibv_qp_state, ibv_qp_type, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_srq, ibv_srq_init_attr, ibv_wc,
};
use sqdisc_sim::SimConnAttr;
use sqdisc_sim_proto::{QpCaps, QpTransition, RecvWr, Reply, Request, SendWr, SharedCounter, Wc, MAX_POLL};

use crate::client::{Channel, Cq, Owner, Qp};
use crate::memory::RegionMemory;
use crate::server::Server;
use crate::sys;

type Answer = (Reply, Option<OwnedFd>);

fn no_such(what: &str, id: u64) -> Answer {
    (Reply::error(libc::EINVAL, format!("no {what} {id:#x} was made on this connection")), None)
}

fn failed(e: sqdisc_sim::Error) -> Answer {
    (Reply::error(e.errno(), e.message().to_string()), None)
}

fn done() -> Answer {
    (Reply::Done, None)
}

impl Server {
    pub(crate) fn handle(&mut self, token: u64, request: Request) -> Answer {
        match request {
            Request::RegMr { addr, length, iova, access } => {
                let client = self.client(token);
                let mem = RegionMemory { process: client.memory.clone(), delta: addr.wrapping_sub(iova) };
                let Ok(len) = usize::try_from(length) else { return (Reply::error(libc::EINVAL, "length too large"), None) };
                match self.dev.reg_mr_in(std::sync::Arc::new(mem), iova, len, access) {
                    Ok(mr) => {
                        self.client(token).mrs.insert(mr as u64, mr);
                        // SAFETY: a live MR the device just made.
                        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
                        (Reply::Mr { mr: mr as u64, lkey, rkey }, None)
                    }
                    Err(e) => failed(e),
                }
            }
            Request::DeregMr { mr } => {
                let Some(obj) = self.client(token).mrs.remove(&mr) else { return no_such("MR", mr) };
                match self.dev.dereg_mr(obj) {
                    Ok(()) => done(),
                    Err(e) => failed(e),
                }
            }
            Request::CreateCompChannel => self.create_channel(token),
            Request::DestroyCompChannel { channel } => {
                let Some(c) = self.client(token).channels.get(&channel) else { return no_such("completion channel", channel) };
                let obj = c.obj;
                if let Err(e) = self.dev.destroy_comp_channel(obj) {
                    return failed(e);
                }
                let c = self.client(token).channels.remove(&channel).expect("looked up above");
                self.unwatch_channel(c.token, c.obj);
                done()
            }
            Request::CreateCq { cqe, channel, comp_vector, cookie } => {
                let ch = match channel {
                    None => std::ptr::null_mut(),
                    Some(id) => match self.client(token).channels.get(&id) {
                        Some(c) => c.obj,
                        None => return no_such("completion channel", id),
                    },
                };
                let queued = match SharedCounter::create() {
                    Ok(q) => q,
                    Err(e) => return (Reply::error(e.raw_os_error().unwrap_or(libc::ENOMEM), format!("no shared page for the CQ: {e}")), None),
                };
                let shared = match queued.share() {
                    Ok(fd) => fd,
                    Err(e) => return (Reply::error(e.raw_os_error().unwrap_or(libc::EMFILE), format!("cannot share the CQ's page: {e}")), None),
                };
                match self.dev.create_cq_ex(cqe, ch, cookie as *mut libc::c_void, comp_vector) {
                    Ok(cq) => {
                        self.client(token).cqs.insert(cq as u64, Cq { obj: cq, queued });
                        self.owners.insert(cq as usize, Owner { client: token, cookie });
                        // SAFETY: a live CQ the device just made.
                        (Reply::Cq { cq: cq as u64, cqe: unsafe { (*cq).cqe } }, Some(shared))
                    }
                    Err(e) => failed(e),
                }
            }
            Request::ResizeCq { cq, cqe } => {
                let Some(obj) = self.client(token).cqs.get(&cq).map(|c| c.obj) else { return no_such("CQ", cq) };
                match self.dev.resize_cq(obj, cqe) {
                    // SAFETY: a live CQ of this client.
                    Ok(()) => (Reply::Cq { cq, cqe: unsafe { (*obj).cqe } }, None),
                    Err(e) => failed(e),
                }
            }
            Request::DestroyCq { cq } => {
                let Some(obj) = self.client(token).cqs.get(&cq).map(|c| c.obj) else { return no_such("CQ", cq) };
                if let Err(e) = self.dev.destroy_cq(obj) {
                    return failed(e);
                }
                self.client(token).cqs.remove(&cq);
                self.owners.remove(&(obj as usize));
                done()
            }
            Request::PollCq { cq, max } => {
                let Some(obj) = self.client(token).cqs.get(&cq).map(|c| c.obj) else { return no_such("CQ", cq) };
                let answer = self.poll(obj, max.min(MAX_POLL));
                let left = self.dev.cq_queued(obj).unwrap_or(0);
                if let Some(c) = self.client(token).cqs.get(&cq) {
                    c.queued.set(left as u64);
                }
                answer
            }
            Request::ReqNotifyCq { cq, solicited_only } => {
                let Some(obj) = self.client(token).cqs.get(&cq).map(|c| c.obj) else { return no_such("CQ", cq) };
                // SAFETY: a live CQ of the device; the op is the device's own `req_notify_cq`.
                let rc = unsafe {
                    let f = (*(*obj).context).ops.req_notify_cq.expect("the sim has req_notify_cq");
                    f(obj, i32::from(solicited_only))
                };
                if rc == 0 {
                    done()
                } else {
                    (Reply::error(rc, "ibv_req_notify_cq failed"), None)
                }
            }
            Request::CreateSrq { max_wr, max_sge, srq_limit, cookie } => {
                // SAFETY: plain data; zero is valid.
                let mut attr: ibv_srq_init_attr = unsafe { std::mem::zeroed() };
                attr.srq_context = cookie as *mut libc::c_void;
                attr.attr.max_wr = max_wr;
                attr.attr.max_sge = max_sge;
                match self.dev.create_srq(&mut attr) {
                    Ok(srq) => {
                        if srq_limit > 0 {
                            if let Err(e) = self.dev.modify_srq_limit(srq, srq_limit) {
                                let _ = self.dev.destroy_srq(srq);
                                return failed(e);
                            }
                        }
                        self.client(token).srqs.insert(srq as u64, srq);
                        self.owners.insert(srq as usize, Owner { client: token, cookie });
                        (Reply::Srq { srq: srq as u64, max_wr: attr.attr.max_wr, max_sge: attr.attr.max_sge }, None)
                    }
                    Err(e) => failed(e),
                }
            }
            Request::ModifySrq { srq, srq_limit } => {
                let Some(&obj) = self.client(token).srqs.get(&srq) else { return no_such("SRQ", srq) };
                match self.dev.modify_srq_limit(obj, srq_limit) {
                    Ok(()) => done(),
                    Err(e) => failed(e),
                }
            }
            Request::QuerySrq { srq } => {
                let Some(&obj) = self.client(token).srqs.get(&srq) else { return no_such("SRQ", srq) };
                match self.dev.srq_state(obj) {
                    Ok((limit, _, _)) => (Reply::SrqState { srq_limit: limit }, None),
                    Err(e) => failed(e),
                }
            }
            Request::DestroySrq { srq } => {
                let Some(&obj) = self.client(token).srqs.get(&srq) else { return no_such("SRQ", srq) };
                if let Err(e) = self.dev.destroy_srq(obj) {
                    return failed(e);
                }
                self.client(token).srqs.remove(&srq);
                self.owners.remove(&(obj as usize));
                done()
            }
            Request::PostSrqRecv { srq, wrs } => {
                let Some(&obj) = self.client(token).srqs.get(&srq) else { return no_such("SRQ", srq) };
                post_recvs(&wrs, |wr, bad| {
                    // SAFETY: a live SRQ of the device; `wr` is a valid chain built by `post_recvs`.
                    unsafe { ((*(*obj).context).ops.post_srq_recv.expect("the sim has post_srq_recv"))(obj, wr, bad) }
                })
            }
            Request::CreateQp { send_cq, recv_cq, srq, qp_type, caps, sq_sig_all, cookie } => {
                self.create_qp(token, send_cq, recv_cq, srq, qp_type, caps, sq_sig_all, cookie)
            }
            Request::ModifyQp { qp, to } => self.modify_qp(token, qp, to),
            Request::QueryQpState { qp } => {
                let Some(q) = self.client(token).qps.get(&qp) else { return no_such("QP", qp) };
                let (obj, tracked) = (q.obj, q.state);
                match self.dev.qp_in_error(obj) {
                    Ok(true) => (Reply::QpState { state: ibv_qp_state::IBV_QPS_ERR }, None),
                    Ok(false) => (Reply::QpState { state: tracked }, None),
                    Err(e) => failed(e),
                }
            }
            Request::DestroyQp { qp } => {
                let Some(q) = self.client(token).qps.get(&qp) else { return no_such("QP", qp) };
                let obj = q.obj;
                // SAFETY: a live QP of this client.
                let qp_num = unsafe { (*obj).qp_num };
                self.note_violations();
                if let Err(e) = self.dev.destroy_qp(obj) {
                    return failed(e);
                }
                self.forget_qp_owner(qp_num);
                self.client(token).qps.remove(&qp);
                self.owners.remove(&(obj as usize));
                self.cm_forget_qp(obj);
                done()
            }
            Request::PostSend { qp, wrs } => {
                let Some(q) = self.client(token).qps.get(&qp) else { return no_such("QP", qp) };
                let obj = q.obj;
                post_sends(&wrs, |wr, bad| {
                    // SAFETY: a live QP of the device; `wr` is a valid chain built by `post_sends`.
                    unsafe { ((*(*obj).context).ops.post_send.expect("the sim has post_send"))(obj, wr, bad) }
                })
            }
            Request::PostSendAsync { qp, wrs } => {
                let answer = self.handle(token, Request::PostSend { qp, wrs });
                self.check_async(token, "send", answer)
            }
            Request::PostRecvAsync { qp, wrs } => {
                let answer = self.handle(token, Request::PostRecv { qp, wrs });
                self.check_async(token, "receive", answer)
            }
            Request::PostSrqRecvAsync { srq, wrs } => {
                let answer = self.handle(token, Request::PostSrqRecv { srq, wrs });
                self.check_async(token, "SRQ receive", answer)
            }
            Request::PostRecv { qp, wrs } => {
                let Some(q) = self.client(token).qps.get(&qp) else { return no_such("QP", qp) };
                let obj = q.obj;
                post_recvs(&wrs, |wr, bad| {
                    // SAFETY: a live QP of the device; `wr` is a valid chain built by `post_recvs`.
                    unsafe { ((*(*obj).context).ops.post_recv.expect("the sim has post_recv"))(obj, wr, bad) }
                })
            }
            Request::CmCreateChannel => self.cm_create_channel(token),
            Request::CmDestroyChannel { channel } => self.cm_destroy_channel(token, channel),
            Request::CmCreateId { channel, port_space, cookie } => self.cm_create_id(token, channel, port_space, cookie),
            Request::CmDestroyId { id } => self.cm_destroy_id(token, id),
            Request::CmMigrateId { id, channel } => self.cm_migrate(token, id, channel),
            Request::CmBind { id, addr } => self.cm_bind(token, id, addr),
            Request::CmListen { id, .. } => self.cm_listen(token, id),
            Request::CmResolveAddr { id, src, dst } => self.cm_resolve_addr(token, id, src, dst),
            Request::CmResolveRoute { id } => self.cm_resolve_route(token, id),
            Request::CmSetQp { id, qp } => self.cm_set_qp(token, id, qp),
            Request::CmConnect { id, param } => self.cm_connect(token, id, param),
            Request::CmAccept { id, param } => self.cm_accept(token, id, param),
            Request::CmReject { id, private_data } => self.cm_reject(token, id, private_data),
            Request::CmEstablish { id } => self.cm_establish(token, id),
            Request::CmDisconnect { id } => self.cm_disconnect(token, id),
            Request::Hello { .. } | Request::Status | Request::Report | Request::Shutdown | Request::FailQps { .. } => {
                unreachable!("answered by the server loop")
            }
        }
    }

    /// An asynchronous post the model refused: the client's checks said it fits, so they disagree with the
    /// model. Logged and counted (`status`), never silent.
    fn check_async(&mut self, token: u64, what: &str, answer: Answer) -> Answer {
        match answer.0 {
            Reply::Posted { errno: 0, .. } => {}
            other => {
                self.async_refusals += 1;
                let pid = self.client(token).pid;
                eprintln!("sqdisc-sim: pid {pid}: a {what} post its client found certain to fit was refused: {other:?}");
            }
        }
        (Reply::Done, None)
    }

    fn create_channel(&mut self, token: u64) -> Answer {
        let (ours, theirs) = match sys::event_pair() {
            Ok(p) => p,
            Err(e) => return (Reply::error(e.raw_os_error().unwrap_or(libc::EMFILE), format!("no event socket: {e}")), None),
        };
        let obj = match self.dev.create_comp_channel() {
            Ok(c) => c,
            Err(e) => return failed(e),
        };
        let watch = match self.watch_channel(token, obj) {
            Ok(t) => t,
            Err(e) => {
                let _ = self.dev.destroy_comp_channel(obj);
                return (Reply::error(e.raw_os_error().unwrap_or(libc::ENOMEM), format!("cannot watch the channel: {e}")), None);
            }
        };
        let id = obj as u64;
        self.client(token).channels.insert(id, Channel { obj, token: watch, tx: ours, pending: Default::default() });
        (Reply::Channel { channel: id }, Some(theirs))
    }

    #[allow(clippy::too_many_arguments)]
    fn create_qp(&mut self, token: u64, send_cq: u64, recv_cq: u64, srq: Option<u64>, qp_type: u32, caps: QpCaps, sq_sig_all: bool, cookie: u64) -> Answer {
        if qp_type != ibv_qp_type::IBV_QPT_RC {
            return (Reply::error(libc::EOPNOTSUPP, format!("qp_type {qp_type} is not supported: the sim models RC QPs only")), None);
        }
        let client = self.client(token);
        let Some(scq) = client.cqs.get(&send_cq).map(|c| c.obj) else { return no_such("CQ", send_cq) };
        let Some(rcq) = client.cqs.get(&recv_cq).map(|c| c.obj) else { return no_such("CQ", recv_cq) };
        let srq_obj: *mut ibv_srq = match srq {
            None => std::ptr::null_mut(),
            Some(id) => match client.srqs.get(&id) {
                Some(&s) => s,
                None => return no_such("SRQ", id),
            },
        };
        // SAFETY: plain data; zero is valid.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = scq;
        attr.recv_cq = rcq;
        attr.srq = srq_obj;
        attr.qp_type = qp_type;
        attr.sq_sig_all = i32::from(sq_sig_all);
        attr.qp_context = cookie as *mut libc::c_void;
        attr.cap.max_send_wr = caps.max_send_wr;
        attr.cap.max_recv_wr = caps.max_recv_wr;
        attr.cap.max_send_sge = caps.max_send_sge;
        attr.cap.max_recv_sge = caps.max_recv_sge;
        attr.cap.max_inline_data = caps.max_inline_data;
        match self.dev.create_qp(&mut attr) {
            Ok(qp) => {
                // SAFETY: a live QP the device just made.
                let qp_num = unsafe { (*qp).qp_num };
                let client = self.client(token);
                client.qps.insert(qp as u64, Qp { obj: qp, state: ibv_qp_state::IBV_QPS_RESET, dest_qp_num: None });
                let owner = (client.pid as u32, client.program.clone().unwrap_or_default());
                self.owners.insert(qp as usize, Owner { client: token, cookie });
                self.qp_owner.insert(qp_num, owner);
                let c = attr.cap;
                let caps = QpCaps {
                    max_send_wr: c.max_send_wr,
                    max_recv_wr: c.max_recv_wr,
                    max_send_sge: c.max_send_sge,
                    max_recv_sge: c.max_recv_sge,
                    max_inline_data: c.max_inline_data,
                };
                (Reply::Qp { qp: qp as u64, qp_num, caps }, None)
            }
            Err(e) => failed(e),
        }
    }

    /// `ibv_modify_qp`: RESET and INIT change nothing in the model; RTR connects the QP to `dest_qp_num` (it
    /// accepts that QP's requests from now on); RTS sets the retry counts; ERR flushes.
    fn modify_qp(&mut self, token: u64, qp: u64, to: QpTransition) -> Answer {
        use ibv_qp_state::*;
        let Some(q) = self.client(token).qps.get(&qp) else { return no_such("QP", qp) };
        let (obj, dest) = (q.obj, q.dest_qp_num);
        let attr = |t: &QpTransition| SimConnAttr {
            rnr_retry: u32::from(t.rnr_retry.min(7)),
            retry_cnt: u32::from(t.retry_cnt.min(7)),
            max_rd_atomic: u32::from(t.max_rd_atomic.clamp(1, 16)),
        };
        let result = match to.state {
            IBV_QPS_RESET | IBV_QPS_INIT => Ok(None),
            IBV_QPS_RTR => self.dev.connect_to(obj, to.dest_qp_num, &SimConnAttr::default()).map(|()| Some(to.dest_qp_num)),
            IBV_QPS_RTS => match dest {
                Some(d) => self.dev.connect_to(obj, d, &attr(&to)).map(|()| Some(d)),
                None => return (Reply::error(libc::EINVAL, "RTS before RTR: the QP has no destination"), None),
            },
            IBV_QPS_ERR => self.dev.set_error(obj).map(|()| dest),
            other => return (Reply::error(libc::EOPNOTSUPP, format!("QP state {other} is not modelled (RESET, INIT, RTR, RTS and ERR are)")), None),
        };
        match result {
            Ok(d) => {
                let q = self.client(token).qps.get_mut(&qp).expect("looked up above");
                q.state = to.state;
                if d.is_some() {
                    q.dest_qp_num = d;
                }
                done()
            }
            Err(e) => failed(e),
        }
    }

    fn poll(&mut self, cq: *mut ibv_cq, max: u32) -> Answer {
        let mut polled: Vec<(ibv_wc, Option<u64>)> = Vec::new();
        let result = self.dev.poll_cq_slots(cq, max as usize, |_, wc, freed| polled.push((wc, freed)));
        self.stepped();
        if let Err(e) = result {
            return failed(e);
        }
        let wcs = polled
            .iter()
            .map(|(w, freed)| Wc {
                wr_id: w.wr_id,
                status: w.status,
                opcode: w.opcode,
                vendor_err: w.vendor_err,
                byte_len: w.byte_len,
                // SAFETY: both members of the union are a `u32`; any bit pattern is valid.
                imm: unsafe { w.imm_data_invalidated_rkey_union.imm_data },
                qp_num: w.qp_num,
                src_qp: w.src_qp,
                wc_flags: w.wc_flags,
                pkey_index: w.pkey_index,
                slid: w.slid,
                sl: w.sl,
                dlid_path_bits: w.dlid_path_bits,
                sq_freed: *freed,
            })
            .collect();
        (Reply::Polled { wcs }, None)
    }
}

/// Builds a chain of `ibv_send_wr` from `wrs` (inline data in buffers of the daemon's own, since the model
/// copies it at post time) and posts it with `post`; the reply names the first WR refused.
fn post_sends(wrs: &[SendWr], post: impl FnOnce(*mut ibv_send_wr, *mut *mut ibv_send_wr) -> i32) -> Answer {
    if wrs.is_empty() {
        return (Reply::Posted { errno: 0, index: 0 }, None);
    }
    let mut sges: Vec<Vec<ibv_sge>> = Vec::with_capacity(wrs.len());
    for w in wrs {
        let list = match &w.inline_data {
            Some(data) => vec![ibv_sge { addr: data.as_ptr() as u64, length: data.len() as u32, lkey: 0 }],
            None => w.sges.iter().map(|s| ibv_sge { addr: s.addr, length: s.length, lkey: s.lkey }).collect(),
        };
        sges.push(list);
    }
    // SAFETY: plain data; zero is valid.
    let mut chain: Vec<ibv_send_wr> = wrs.iter().map(|_| unsafe { std::mem::zeroed() }).collect();
    for (i, w) in wrs.iter().enumerate() {
        let c = &mut chain[i];
        c.wr_id = w.wr_id;
        c.opcode = w.opcode;
        c.send_flags = w.send_flags;
        c.imm_data_invalidated_rkey_union.imm_data = w.imm;
        let (num_sge, list) = match &w.inline_data {
            Some(_) => (1, sges[i].as_mut_ptr()),
            None if w.null_sg_list => (w.num_sge, std::ptr::null_mut()),
            None if w.num_sge as usize != sges[i].len() => (w.num_sge, std::ptr::null_mut()),
            None => (w.num_sge, sges[i].as_mut_ptr()),
        };
        c.num_sge = num_sge;
        c.sg_list = list;
        if w.opcode == rdma_sys::ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == rdma_sys::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD {
            c.wr.atomic.remote_addr = w.remote_addr;
            c.wr.atomic.rkey = w.rkey;
            c.wr.atomic.compare_add = w.compare_add;
            c.wr.atomic.swap = w.swap;
        } else {
            c.wr.rdma.remote_addr = w.remote_addr;
            c.wr.rdma.rkey = w.rkey;
        }
    }
    let base = chain.as_mut_ptr();
    for i in 0..chain.len() - 1 {
        // SAFETY: `i + 1` is in bounds of `chain`, which does not move while the chain is used.
        chain[i].next = unsafe { base.add(i + 1) };
    }
    let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
    let rc = post(base, &mut bad);
    let index = if rc == 0 || bad.is_null() { 0 } else { (bad as usize - base as usize) / std::mem::size_of::<ibv_send_wr>() };
    (Reply::Posted { errno: rc, index: index as u32 }, None)
}

/// As `post_sends`, for receive WRs.
fn post_recvs(wrs: &[RecvWr], post: impl FnOnce(*mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32) -> Answer {
    if wrs.is_empty() {
        return (Reply::Posted { errno: 0, index: 0 }, None);
    }
    let mut sges: Vec<Vec<ibv_sge>> =
        wrs.iter().map(|w| w.sges.iter().map(|s| ibv_sge { addr: s.addr, length: s.length, lkey: s.lkey }).collect()).collect();
    // SAFETY: plain data; zero is valid.
    let mut chain: Vec<ibv_recv_wr> = wrs.iter().map(|_| unsafe { std::mem::zeroed() }).collect();
    for (i, w) in wrs.iter().enumerate() {
        chain[i].wr_id = w.wr_id;
        chain[i].num_sge = w.num_sge;
        chain[i].sg_list = if w.null_sg_list || w.num_sge as usize != sges[i].len() { std::ptr::null_mut() } else { sges[i].as_mut_ptr() };
    }
    let base = chain.as_mut_ptr();
    for i in 0..chain.len() - 1 {
        // SAFETY: `i + 1` is in bounds of `chain`, which does not move while the chain is used.
        chain[i].next = unsafe { base.add(i + 1) };
    }
    let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
    let rc = post(base, &mut bad);
    let index = if rc == 0 || bad.is_null() { 0 } else { (bad as usize - base as usize) / std::mem::size_of::<ibv_recv_wr>() };
    (Reply::Posted { errno: rc, index: index as u32 }, None)
}
