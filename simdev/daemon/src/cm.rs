//! The connection manager (what librdmacm's `rdma_cm` does with a kernel): identifiers bound to this
//! machine's addresses, listeners, and the connection handshake between two processes' identifiers — REQ
//! (CONNECT_REQUEST), REP (the accept), RTU (ESTABLISHED), DREQ (DISCONNECTED) and REJ (REJECTED) — with
//! each side's QP connected to the other's in the model as the handshake goes.
//!
//! Addresses: any address of this machine (loopback, and the addresses of its interfaces), IPv4 or IPv6.
//! Route resolution always succeeds for a resolved local address: every process uses the same device.

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;

use rdma_sys::ibv_qp;
use sqdisc_sim::SimConnAttr;
use sqdisc_sim_proto::{encode, CmAddr, CmEvent, CmParam, Reply};

use crate::server::Server;
use crate::sys;

// enum rdma_cm_event_type
const ADDR_RESOLVED: u32 = 0;
const ADDR_ERROR: u32 = 1;
const ROUTE_RESOLVED: u32 = 2;
const ROUTE_ERROR: u32 = 3;
const CONNECT_REQUEST: u32 = 4;
const CONNECT_RESPONSE: u32 = 5;
const REJECTED: u32 = 8;
const ESTABLISHED: u32 = 9;
const DISCONNECTED: u32 = 10;

/// IB CM reject reasons the events carry in `status` (IBA 12.6.7.2, Table 112).
const REJ_INVALID_SERVICE_ID: i32 = 8;
const REJ_CONSUMER_DEFINED: i32 = 28;

const FIRST_EPHEMERAL_PORT: u16 = 40000;

/// A client's CM event channel: the daemon's end of its socket and the events not yet sent.
pub struct CmChannel {
    pub tx: OwnedFd,
    pub pending: VecDeque<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    Listening,
    /// REQ sent (active) or received (passive), no answer yet.
    Requested,
    /// Active side told CONNECT_RESPONSE: its program moves its own QP, then `rdma_establish`.
    Responded,
    Connected,
    Disconnected,
}

struct Id {
    client: u64,
    cookie: u64,
    channel: u64,
    local: Option<CmAddr>,
    remote: Option<CmAddr>,
    state: State,
    qp: Option<*mut ibv_qp>,
    peer: Option<u64>,
    /// Made by a CONNECT_REQUEST, on the listening side.
    passive: bool,
    /// The REQ's parameters (kept on the passive id) or the REP's (on the active id, once accepted).
    param: CmParam,
}

#[derive(Default)]
pub struct Cm {
    ids: HashMap<u64, Id>,
    next_id: u64,
    next_port: u16,
    /// Route resolutions under way: the identifier and when its `ROUTE_RESOLVED` is due.
    routes: Vec<(std::time::Instant, u64)>,
}

/// How long `rdma_resolve_route` takes. On InfiniBand it is a path record query to the subnet manager and back,
/// hundreds of microseconds or more, not an instant; a program that connects right after resolving the route
/// meets a peer that has had that long to listen, as on a real fabric.
pub const ROUTE_QUERY: std::time::Duration = std::time::Duration::from_millis(1);

fn unspecified(a: &CmAddr) -> bool {
    a.ip.iter().all(|b| *b == 0)
}

fn loopback(a: &CmAddr) -> bool {
    match i32::from(a.family) {
        libc::AF_INET => a.ip[0] == 127,
        _ => a.ip[..15].iter().all(|b| *b == 0) && a.ip[15] == 1,
    }
}

/// Whether `a` is an address of this machine (loopback, an interface's, or the unspecified address).
fn local(a: &CmAddr) -> bool {
    if unspecified(a) || loopback(a) {
        return true;
    }
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `list` receives a list the call allocates, freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return false;
    }
    let mut found = false;
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: a non-NULL address of the node; its family says which struct it is.
            let fam = unsafe { (*ifa.ifa_addr).sa_family } as i32;
            if fam == i32::from(a.family) && fam == libc::AF_INET {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                found |= sin.sin_addr.s_addr.to_ne_bytes() == a.ip[..4];
            } else if fam == i32::from(a.family) && fam == libc::AF_INET6 {
                // SAFETY: an AF_INET6 address is a sockaddr_in6.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                found |= sin6.sin6_addr.s6_addr == a.ip;
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: the list getifaddrs allocated, freed once.
    unsafe { libc::freeifaddrs(list) };
    found
}

fn same_ip(a: &CmAddr, b: &CmAddr) -> bool {
    a.family == b.family && a.ip == b.ip
}

fn conn_attr(retry: u8, rnr_retry: u8, depth: u8) -> SimConnAttr {
    SimConnAttr { rnr_retry: u32::from(rnr_retry.min(7)), retry_cnt: u32::from(retry.min(7)), max_rd_atomic: u32::from(depth.clamp(1, 16)) }
}

type Answer = (Reply, Option<OwnedFd>);

fn err(errno: i32, message: impl Into<String>) -> Answer {
    (Reply::error(errno, message), None)
}

impl Server {
    pub(crate) fn cm_create_channel(&mut self, token: u64) -> Answer {
        let (ours, theirs) = match sys::event_pair() {
            Ok(p) => p,
            Err(e) => return err(e.raw_os_error().unwrap_or(libc::EMFILE), format!("no event socket: {e}")),
        };
        let client = self.client(token);
        client.next_cm_channel += 1;
        let id = client.next_cm_channel;
        client.cm_channels.insert(id, CmChannel { tx: ours, pending: VecDeque::new() });
        (Reply::CmChannel { channel: id }, Some(theirs))
    }

    pub(crate) fn cm_destroy_channel(&mut self, token: u64, channel: u64) -> Answer {
        if self.cm.ids.values().any(|i| i.client == token && i.channel == channel) {
            return err(libc::EBUSY, "the channel still has identifiers");
        }
        match self.client(token).cm_channels.remove(&channel) {
            Some(_) => (Reply::Done, None),
            None => err(libc::EINVAL, format!("no CM channel {channel} on this connection")),
        }
    }

    pub(crate) fn cm_create_id(&mut self, token: u64, channel: u64, port_space: u32, cookie: u64) -> Answer {
        if !self.client(token).cm_channels.contains_key(&channel) {
            return err(libc::EINVAL, format!("no CM channel {channel} on this connection"));
        }
        if port_space != rdma_sys::rdma_port_space::RDMA_PS_TCP {
            return err(libc::EPROTONOSUPPORT, format!("port space {port_space:#x}: the sim device connects RC QPs only (RDMA_PS_TCP)"));
        }
        self.cm.next_id += 1;
        let id = self.cm.next_id;
        let rec = Id {
            client: token,
            cookie,
            channel,
            local: None,
            remote: None,
            state: State::Idle,
            qp: None,
            peer: None,
            passive: false,
            param: CmParam::default(),
        };
        self.cm.ids.insert(id, rec);
        (Reply::CmId { id }, None)
    }

    fn own_id(&mut self, token: u64, id: u64) -> Result<&mut Id, Answer> {
        match self.cm.ids.get_mut(&id) {
            Some(i) if i.client == token => Ok(i),
            _ => Err(err(libc::EINVAL, format!("no CM identifier {id} on this connection"))),
        }
    }

    fn emit(&mut self, id: u64, mut ev: CmEvent) {
        let Some(rec) = self.cm.ids.get(&id) else { return };
        ev.id = id;
        if ev.cookie == 0 {
            ev.cookie = rec.cookie;
        }
        let (client, channel) = (rec.client, rec.channel);
        if let Some(ch) = self.client_opt(client).and_then(|c| c.cm_channels.get_mut(&channel)) {
            ch.pending.push_back(encode(&ev));
        }
    }

    fn event(kind: u32, status: i32) -> CmEvent {
        CmEvent { event: kind, status, id: 0, cookie: 0, listen_id: 0, param: CmParam::default(), src: None, dst: None, remote_qp_num: 0 }
    }

    fn port_in_use(&self, addr: &CmAddr, except: u64) -> bool {
        self.cm.ids.iter().any(|(k, i)| {
            *k != except
                && matches!(i.state, State::Listening | State::Idle)
                && i.peer.is_none()
                && i.local.is_some_and(|l| l.port == addr.port && l.family == addr.family && (unspecified(&l) || unspecified(addr) || l.ip == addr.ip))
        })
    }

    fn ephemeral(&mut self, addr: CmAddr, except: u64) -> Option<CmAddr> {
        for _ in 0..25000 {
            if self.cm.next_port < FIRST_EPHEMERAL_PORT {
                self.cm.next_port = FIRST_EPHEMERAL_PORT;
            }
            let port = self.cm.next_port;
            self.cm.next_port = port.wrapping_add(1);
            let candidate = CmAddr { port, ..addr };
            let taken = self.cm.ids.iter().any(|(k, i)| *k != except && i.local.is_some_and(|l| l.port == port));
            if !taken {
                return Some(candidate);
            }
        }
        None
    }

    pub(crate) fn cm_bind(&mut self, token: u64, id: u64, addr: CmAddr) -> Answer {
        if let Err(a) = self.own_id(token, id) {
            return a;
        }
        if !local(&addr) {
            return err(libc::EADDRNOTAVAIL, "not an address of this machine");
        }
        let bound = if addr.port == 0 {
            match self.ephemeral(addr, id) {
                Some(a) => a,
                None => return err(libc::EADDRINUSE, "no free port"),
            }
        } else if self.port_in_use(&addr, id) {
            return err(libc::EADDRINUSE, format!("port {} is in use by another identifier", addr.port));
        } else {
            addr
        };
        self.cm.ids.get_mut(&id).expect("checked").local = Some(bound);
        (Reply::CmAddress { addr: bound }, None)
    }

    pub(crate) fn cm_listen(&mut self, token: u64, id: u64) -> Answer {
        let rec = match self.own_id(token, id) {
            Ok(r) => r,
            Err(a) => return a,
        };
        if rec.local.is_none() {
            return err(libc::EINVAL, "rdma_listen before rdma_bind_addr");
        }
        rec.state = State::Listening;
        (Reply::Done, None)
    }

    pub(crate) fn cm_resolve_addr(&mut self, token: u64, id: u64, src: Option<CmAddr>, dst: CmAddr) -> Answer {
        let bound = match self.own_id(token, id) {
            Ok(r) => r.local,
            Err(a) => return a,
        };
        if !local(&dst) || src.is_some_and(|s| !local(&s)) {
            self.emit(id, Self::event(ADDR_ERROR, -libc::EHOSTUNREACH));
            return err(libc::EHOSTUNREACH, "the sim device reaches only this machine's own addresses");
        }
        let base = src.filter(|s| !unspecified(s)).or(bound.filter(|b| !unspecified(b))).unwrap_or(CmAddr { port: 0, ..dst });
        let port = src.map(|s| s.port).filter(|p| *p != 0).or(bound.map(|b| b.port).filter(|p| *p != 0));
        let local_addr = match port {
            Some(p) => CmAddr { port: p, ..base },
            None => match self.ephemeral(base, id) {
                Some(a) => a,
                None => return err(libc::EADDRINUSE, "no free port"),
            },
        };
        let rec = self.cm.ids.get_mut(&id).expect("checked");
        rec.local = Some(local_addr);
        rec.remote = Some(dst);
        self.emit(id, Self::event(ADDR_RESOLVED, 0));
        (Reply::CmAddress { addr: local_addr }, None)
    }

    pub(crate) fn cm_resolve_route(&mut self, token: u64, id: u64) -> Answer {
        let remote = match self.own_id(token, id) {
            Ok(r) => r.remote,
            Err(a) => return a,
        };
        if remote.is_none() {
            self.emit(id, Self::event(ROUTE_ERROR, -libc::EINVAL));
            return err(libc::EINVAL, "rdma_resolve_route before rdma_resolve_addr");
        }
        self.cm.routes.push((std::time::Instant::now() + ROUTE_QUERY, id));
        (Reply::Done, None)
    }

    /// Emits `ROUTE_RESOLVED` for each route resolution that is due; returns when the next one is, if any.
    pub(crate) fn cm_resolve_due(&mut self) -> Option<std::time::Instant> {
        let now = std::time::Instant::now();
        let mut due = Vec::new();
        self.cm.routes.retain(|&(at, id)| {
            let ready = at <= now;
            if ready {
                due.push(id);
            }
            !ready
        });
        for id in due {
            self.emit(id, Self::event(ROUTE_RESOLVED, 0));
        }
        self.cm.routes.iter().map(|&(at, _)| at).min()
    }

    pub(crate) fn cm_set_qp(&mut self, token: u64, id: u64, qp: Option<u64>) -> Answer {
        let obj = match qp {
            None => None,
            Some(q) => match self.client(token).qps.get(&q) {
                Some(rec) => Some(rec.obj),
                None => return err(libc::EINVAL, format!("no QP {q:#x} on this connection")),
            },
        };
        match self.own_id(token, id) {
            Ok(r) => {
                r.qp = obj;
                (Reply::Done, None)
            }
            Err(a) => a,
        }
    }

    /// Forgets a QP that is being destroyed wherever an identifier names it.
    pub(crate) fn cm_forget_qp(&mut self, qp: *mut ibv_qp) {
        for i in self.cm.ids.values_mut() {
            if i.qp == Some(qp) {
                i.qp = None;
            }
        }
    }

    /// Records a QP the handshake connected as in RTS towards `dest` (what `ibv_query_qp` reports).
    fn mark_connected(&mut self, qp: *mut ibv_qp, dest: u32) {
        let Some(client) = self.owners.get(&(qp as usize)).map(|o| o.client) else { return };
        if let Some(rec) = self.client_opt(client).and_then(|c| c.qps.get_mut(&(qp as u64))) {
            rec.state = rdma_sys::ibv_qp_state::IBV_QPS_RTS;
            rec.dest_qp_num = Some(dest);
        }
    }

    fn qp_num(qp: Option<*mut ibv_qp>, fallback: u32) -> u32 {
        // SAFETY: a QP an identifier names is live (identifiers forget QPs as they are destroyed).
        qp.map_or(fallback, |q| unsafe { (*q).qp_num })
    }

    pub(crate) fn cm_connect(&mut self, token: u64, id: u64, param: CmParam) -> Answer {
        let (remote, local_addr, qp, state) = match self.own_id(token, id) {
            Ok(r) => (r.remote, r.local, r.qp, r.state),
            Err(a) => return a,
        };
        let (Some(dst), Some(src)) = (remote, local_addr) else {
            return err(libc::EINVAL, "rdma_connect before the address and route are resolved");
        };
        if state != State::Idle {
            return err(libc::EISCONN, "the identifier is already connecting or connected");
        }
        let listener = self.cm.ids.iter().find_map(|(k, i)| {
            let l = i.local?;
            let matches = i.state == State::Listening && l.port == dst.port && (unspecified(&l) || same_ip(&l, &dst));
            matches.then_some(*k)
        });
        let Some(listener) = listener else {
            self.emit(id, Self::event(REJECTED, REJ_INVALID_SERVICE_ID));
            return (Reply::Done, None);
        };
        let (lclient, lchannel) = {
            let l = &self.cm.ids[&listener];
            (l.client, l.channel)
        };
        let mut req = param.clone();
        req.qp_num = Self::qp_num(qp, param.qp_num);
        self.cm.next_id += 1;
        let passive = self.cm.next_id;
        let local_passive = CmAddr { port: dst.port, ..dst };
        self.cm.ids.insert(
            passive,
            Id {
                client: lclient,
                cookie: 0,
                channel: lchannel,
                local: Some(local_passive),
                remote: Some(src),
                state: State::Requested,
                qp: None,
                peer: Some(id),
                passive: true,
                param: req.clone(),
            },
        );
        let active = self.cm.ids.get_mut(&id).expect("checked");
        active.peer = Some(passive);
        active.state = State::Requested;
        active.param = req.clone();
        let mut ev = Self::event(CONNECT_REQUEST, 0);
        ev.listen_id = listener;
        ev.param = as_received(req);
        ev.src = Some(local_passive);
        ev.dst = Some(src);
        ev.remote_qp_num = ev.param.qp_num;
        self.emit(passive, ev);
        (Reply::Done, None)
    }

    pub(crate) fn cm_accept(&mut self, token: u64, id: u64, param: CmParam) -> Answer {
        let (peer, qp, state, req) = match self.own_id(token, id) {
            Ok(r) => (r.peer, r.qp, r.state, r.param.clone()),
            Err(a) => return a,
        };
        let Some(active) = peer.filter(|_| state == State::Requested) else {
            return err(libc::EINVAL, "rdma_accept on an identifier with no connection request");
        };
        let Some((aqp, aparam)) = self.cm.ids.get(&active).map(|a| (a.qp, a.param.clone())) else {
            return err(libc::ECONNRESET, "the connecting side has gone");
        };
        let passive_qpn = Self::qp_num(qp, param.qp_num);
        let active_qpn = Self::qp_num(aqp, aparam.qp_num);
        if let Some(q) = qp {
            let attr = conn_attr(req.retry_count, req.rnr_retry_count, param.initiator_depth);
            if let Err(e) = self.dev.connect_to(q, active_qpn, &attr) {
                return err(e.errno(), e.message().to_string());
            }
            self.mark_connected(q, active_qpn);
        }
        let mut rep = param.clone();
        rep.qp_num = passive_qpn;
        {
            let p = self.cm.ids.get_mut(&id).expect("checked");
            p.state = State::Connected;
        }
        match aqp {
            Some(q) => {
                let attr = conn_attr(req.retry_count, param.rnr_retry_count, req.initiator_depth);
                if let Err(e) = self.dev.connect_to(q, passive_qpn, &attr) {
                    eprintln!("sqdisc-sim: accept: the connecting side's QP cannot be connected: {}", e.message());
                }
                self.mark_connected(q, passive_qpn);
                let a = self.cm.ids.get_mut(&active).expect("checked");
                a.state = State::Connected;
                a.param = rep.clone();
                let mut ev = Self::event(ESTABLISHED, 0);
                ev.param = as_received(rep);
                ev.remote_qp_num = passive_qpn;
                self.emit(active, ev);
                let mut ev = Self::event(ESTABLISHED, 0);
                ev.remote_qp_num = active_qpn;
                self.emit(id, ev);
            }
            None => {
                // The connecting program moves its QP itself (rdma_init_qp_attr), then rdma_establish.
                let a = self.cm.ids.get_mut(&active).expect("checked");
                a.state = State::Responded;
                a.param = rep.clone();
                let mut ev = Self::event(CONNECT_RESPONSE, 0);
                ev.param = as_received(rep);
                ev.remote_qp_num = passive_qpn;
                self.emit(active, ev);
            }
        }
        (Reply::Done, None)
    }

    pub(crate) fn cm_establish(&mut self, token: u64, id: u64) -> Answer {
        let (peer, state) = match self.own_id(token, id) {
            Ok(r) => (r.peer, r.state),
            Err(a) => return a,
        };
        let Some(passive) = peer.filter(|_| state == State::Responded) else {
            return err(libc::EINVAL, "rdma_establish with no connection response");
        };
        self.cm.ids.get_mut(&id).expect("checked").state = State::Connected;
        let aqpn = Self::qp_num(self.cm.ids[&id].qp, 0);
        let mut ev = Self::event(ESTABLISHED, 0);
        ev.remote_qp_num = aqpn;
        self.emit(passive, ev);
        (Reply::Done, None)
    }

    pub(crate) fn cm_reject(&mut self, token: u64, id: u64, private_data: Vec<u8>) -> Answer {
        let (peer, state) = match self.own_id(token, id) {
            Ok(r) => (r.peer, r.state),
            Err(a) => return a,
        };
        let Some(active) = peer.filter(|_| state == State::Requested) else {
            return err(libc::EINVAL, "rdma_reject on an identifier with no connection request");
        };
        let p = self.cm.ids.get_mut(&id).expect("checked");
        p.state = State::Idle;
        p.peer = None;
        if let Some(a) = self.cm.ids.get_mut(&active) {
            a.state = State::Idle;
            a.peer = None;
        }
        let mut ev = Self::event(REJECTED, REJ_CONSUMER_DEFINED);
        ev.param.private_data = private_data;
        self.emit(active, ev);
        (Reply::Done, None)
    }

    /// DREQ: both sides' QPs go to error (librdmacm moves the QP of the side that disconnects; the other
    /// side's program does the same when it disconnects in turn), and each side gets DISCONNECTED once.
    pub(crate) fn cm_disconnect(&mut self, token: u64, id: u64) -> Answer {
        let (peer, state, qp) = match self.own_id(token, id) {
            Ok(r) => (r.peer, r.state, r.qp),
            Err(a) => return a,
        };
        if let Some(q) = qp {
            let _ = self.dev.set_error(q);
        }
        if matches!(state, State::Connected | State::Responded | State::Requested) {
            self.disconnect_pair(id, peer);
            return (Reply::Done, None);
        }
        if state == State::Disconnected {
            return (Reply::Done, None);
        }
        err(libc::ENOTCONN, "rdma_disconnect on an identifier that is not connected")
    }

    fn disconnect_pair(&mut self, id: u64, peer: Option<u64>) {
        for k in std::iter::once(id).chain(peer) {
            if let Some(r) = self.cm.ids.get_mut(&k) {
                if r.state != State::Disconnected {
                    r.state = State::Disconnected;
                    self.emit(k, Self::event(DISCONNECTED, 0));
                }
            }
        }
    }

    pub(crate) fn cm_destroy_id(&mut self, token: u64, id: u64) -> Answer {
        if let Err(a) = self.own_id(token, id) {
            return a;
        }
        self.drop_id(id);
        (Reply::Done, None)
    }

    /// Removes an identifier; a peer still connected or waiting is told as a real peer would be: a connecting
    /// side whose request is dropped unanswered is rejected (REJ), any other connected or waiting peer is
    /// disconnected (DREQ).
    fn drop_id(&mut self, id: u64) {
        let Some(rec) = self.cm.ids.remove(&id) else { return };
        let Some(peer) = rec.peer else { return };
        let Some(p) = self.cm.ids.get_mut(&peer) else { return };
        match p.state {
            State::Disconnected | State::Idle | State::Listening => {}
            State::Requested if rec.passive => {
                p.state = State::Idle;
                p.peer = None;
                self.emit(peer, Self::event(REJECTED, REJ_CONSUMER_DEFINED));
            }
            _ => {
                p.state = State::Disconnected;
                self.emit(peer, Self::event(DISCONNECTED, 0));
            }
        }
    }

    pub(crate) fn cm_migrate(&mut self, token: u64, id: u64, channel: u64) -> Answer {
        if !self.client(token).cm_channels.contains_key(&channel) {
            return err(libc::EINVAL, format!("no CM channel {channel} on this connection"));
        }
        match self.own_id(token, id) {
            Ok(r) => {
                r.channel = channel;
                (Reply::Done, None)
            }
            Err(a) => a,
        }
    }

    /// Drops every identifier of a client that has gone.
    pub(crate) fn cm_drop_client(&mut self, token: u64) {
        let ids: Vec<u64> = self.cm.ids.iter().filter(|(_, i)| i.client == token).map(|(k, _)| *k).collect();
        for id in ids {
            self.drop_id(id);
        }
    }
}

/// The connection parameters of a REQ or REP as the side that receives it sees them. The CM reports the remote
/// side's values from the receiver's point of view: the sender's `initiator_depth` (RDMA READs it issues) is
/// the receiver's `responder_resources` (READs it must serve), and the other way round, as the IB CM formats
/// its REQ and REP events. librdmacm programs rely on it: SPDK's NVMe-oF target refuses a host whose
/// CONNECT_REQUEST shows `initiator_depth` 0 (the host sets only `responder_resources`).
pub(crate) fn as_received(mut p: CmParam) -> CmParam {
    std::mem::swap(&mut p.responder_resources, &mut p.initiator_depth);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The receiver of a REQ or REP sees the sender's initiator depth as its responder resources and the other
    /// way round (SPDK's NVMe host sets only `responder_resources`; its target requires a non-zero
    /// `initiator_depth` in the CONNECT_REQUEST).
    #[test]
    fn the_receiver_sees_depth_and_resources_swapped() {
        let sent = CmParam { responder_resources: 16, initiator_depth: 0, retry_count: 7, ..CmParam::default() };
        let got = as_received(sent.clone());
        assert_eq!((got.responder_resources, got.initiator_depth, got.retry_count), (0, 16, 7));
    }
}
