//! The daemon's event loop: one sim (one model, one clock, one violation log) serving every connected process.
//!
//! One thread does everything, in order: it accepts connections, answers each client's requests one at a time,
//! advances time while anything is in flight, and forwards the completion and asynchronous events the model
//! raises to the clients whose objects they concern. The model is only ever touched from this thread, between
//! messages, so every client sees the RC rules the in-process sim keeps: one SQ's completions in post order.
//!
//! Time: while traffic moves (a packet on the wire, an ACK due, a WQE to transmit: `SimDevice::urgent`) the loop
//! runs steps back to back, between the requests it serves; while something waits only for a timer
//! (retransmission, RNR retry) it runs one step every `tick` of wall time, so timeouts keep a wall-clock scale
//! and a stalled QP does not spin the daemon. Either way one-sided operations progress and events fire whatever
//! the programs do; a poll that reaches the daemon runs `steps_per_poll`
//! steps first besides, as in process. A client polls only a CQ that holds something (a counter in shared
//! memory says so), so busy polling of an empty CQ costs the daemon nothing.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::time::{Duration, Instant};

use rdma_sys::ibv_comp_channel;
use sqdisc_sim::{AsyncElement, SimDevice};
use sqdisc_sim_proto::{
    decode, encode, recv_message, send_message, DeviceSettings, EventRecord, Reply, Request, ViolationInfo, EVENT_ASYNC_CQ,
    EVENT_ASYNC_QP, EVENT_ASYNC_SRQ, EVENT_COMPLETION, PROTOCOL_VERSION,
};

use crate::client::{Client, Owner};
use crate::sys::{self, Epoll};

const LISTENER: u64 = 0;
const MODEL_ASYNC: u64 = 1;
/// Tokens of client sockets and channel descriptors start here.
const FIRST_TOKEN: u64 = 16;

/// What an epoll token names.
enum Target {
    Client,
    /// A completion channel of the model (its eventfd), owned by client `.0`.
    Channel(u64, *mut ibv_comp_channel),
    /// A connection refused (another user's), kept until it has sent its first message or hung up.
    Refused,
}

/// Refused connections kept open at most at once (each is closed at its first message); beyond that a refused
/// connection is closed at once, without its reason.
const MAX_REFUSED: usize = 64;

pub struct Server {
    pub(crate) dev: Pin<Box<SimDevice>>,
    pub(crate) settings: DeviceSettings,
    tick: Duration,
    epoll: Epoll,
    listener: OwnedFd,
    clients: HashMap<u64, Client>,
    /// Refused connections, by token (see `Target::Refused`).
    refused: HashMap<u64, OwnedFd>,
    targets: HashMap<u64, Target>,
    next_token: u64,
    /// Who owns each CQ, QP and SRQ of the model (by address), for routing its events.
    pub(crate) owners: HashMap<usize, Owner>,
    /// The violation log with the process each violation's QP belonged to when it was logged.
    violations: Vec<ViolationInfo>,
    /// QP number to (pid, program), for the violation log.
    pub(crate) qp_owner: HashMap<u32, (u32, String)>,
    /// The connection manager's identifiers.
    pub(crate) cm: crate::cm::Cm,
    last_step: Instant,
    /// Asynchronous posts the model refused (a disagreement between a client's checks and the model).
    pub(crate) async_refusals: u64,
    shutdown: bool,
    uid: libc::uid_t,
    buf: Vec<u8>,
}

impl Server {
    pub fn new(dev: Pin<Box<SimDevice>>, settings: DeviceSettings, tick: Duration, listener: OwnedFd) -> io::Result<Server> {
        let epoll = Epoll::new()?;
        epoll.add(listener.as_raw_fd(), LISTENER)?;
        epoll.add(dev.async_fd(), MODEL_ASYNC)?;
        Ok(Server {
            dev,
            settings,
            tick,
            epoll,
            listener,
            clients: HashMap::new(),
            refused: HashMap::new(),
            targets: HashMap::new(),
            next_token: FIRST_TOKEN,
            owners: HashMap::new(),
            violations: Vec::new(),
            qp_owner: HashMap::new(),
            cm: Default::default(),
            last_step: Instant::now(),
            async_refusals: 0,
            shutdown: false,
            // SAFETY: geteuid cannot fail.
            uid: unsafe { libc::geteuid() },
            buf: Vec::new(),
        })
    }

    fn token(&mut self) -> u64 {
        let t = self.next_token;
        self.next_token += 1;
        t
    }

    /// Runs until a `Shutdown` request or `stop` becomes true; returns the violation log.
    pub fn run(&mut self, stop: &std::sync::atomic::AtomicBool) -> io::Result<Vec<ViolationInfo>> {
        let mut ready = Vec::new();
        while !self.shutdown && !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let busy = self.dev.busy();
            let urgent = busy && self.dev.urgent();
            let pending = self.clients.values().any(Client::has_pending_events);
            let route_due = self.cm_resolve_due().map(|at| at.saturating_duration_since(Instant::now()));
            let timeout = if urgent {
                Duration::ZERO
            } else if busy {
                self.tick.saturating_sub(self.last_step.elapsed())
            } else if pending {
                Duration::from_millis(1)
            } else {
                Duration::from_millis(200)
            };
            self.epoll.wait(Some(route_due.map_or(timeout, |r| timeout.min(r))), &mut ready)?;
            for &token in &ready {
                match token {
                    LISTENER => self.accept_all(),
                    MODEL_ASYNC => {}
                    t => match self.targets.get(&t) {
                        Some(Target::Client) => self.serve(t),
                        Some(Target::Refused) => self.close_refused(t),
                        Some(Target::Channel(..)) | None => {}
                    },
                }
            }
            if urgent || (self.dev.busy() && self.last_step.elapsed() >= self.tick) {
                self.dev.step(1);
                self.last_step = Instant::now();
            }
            self.forward_events();
            self.note_violations();
        }
        // Every client's objects go with the daemon.
        let tokens: Vec<u64> = self.clients.keys().copied().collect();
        for t in tokens {
            self.drop_client(t, None);
        }
        self.note_violations();
        Ok(std::mem::take(&mut self.violations))
    }

    fn accept_all(&mut self) {
        loop {
            match sys::accept(&self.listener) {
                Ok(Some(sock)) => self.admit(sock),
                Ok(None) => return,
                Err(e) => {
                    eprintln!("sqdisc-sim: accept failed: {e}");
                    return;
                }
            }
        }
    }

    fn admit(&mut self, sock: OwnedFd) {
        let (pid, uid) = match sys::peer_credentials(&sock) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("sqdisc-sim: a connection without credentials was refused: {e}");
                return;
            }
        };
        if uid != self.uid && uid != 0 {
            let reply = Reply::error(libc::EACCES, format!("this daemon belongs to uid {}; uid {uid} may not use it", self.uid));
            let _ = send_message(sock.as_raw_fd(), &encode(&reply), None);
            eprintln!("sqdisc-sim: refused pid {pid}: it runs as uid {uid}, the daemon as uid {}", self.uid);
            // Closed only once the client's first message (its hello) has been read: a unix socket closed with
            // a message unread makes the peer's next receive fail with ECONNRESET, before it could read the
            // reason queued for it.
            if self.refused.len() < MAX_REFUSED {
                let token = self.token();
                if self.epoll.add(sock.as_raw_fd(), token).is_ok() {
                    self.targets.insert(token, Target::Refused);
                    self.refused.insert(token, sock);
                }
            }
            return;
        }
        let token = self.token();
        if let Err(e) = self.epoll.add(sock.as_raw_fd(), token) {
            eprintln!("sqdisc-sim: cannot watch the connection of pid {pid}: {e}");
            return;
        }
        self.targets.insert(token, Target::Client);
        self.clients.insert(token, Client::new(sock, pid));
    }

    /// A refused connection has sent something or hung up: read what it sent, then close it.
    fn close_refused(&mut self, token: u64) {
        let Some(sock) = self.refused.remove(&token) else { return };
        let mut buf = std::mem::take(&mut self.buf);
        while let Ok(Some(_)) = recv_message(sock.as_raw_fd(), &mut buf) {}
        self.buf = buf;
        self.epoll.remove(sock.as_raw_fd());
        self.targets.remove(&token);
    }

    /// Answers every request waiting on a client's socket.
    fn serve(&mut self, token: u64) {
        loop {
            let Some(client) = self.clients.get(&token) else { return };
            let fd = client.sock.as_raw_fd();
            let mut buf = std::mem::take(&mut self.buf);
            let got = recv_message(fd, &mut buf);
            let request: Option<Request> = match &got {
                Ok(Some(_)) => decode(&buf),
                _ => None,
            };
            let len = buf.len();
            self.buf = buf;
            match got {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => return self.drop_client(token, Some(format!("its socket failed: {e}"))),
                Ok(None) => return self.drop_client(token, None),
                Ok(Some(_)) => {}
            }
            let Some(request) = request else {
                return self.drop_client(token, Some(format!("it sent a malformed message of {len} bytes")));
            };
            let hello = self.clients[&token].program.is_some();
            let (reply, fd_out) = match (hello, request) {
                (false, Request::Hello { version, program }) => {
                    if version != PROTOCOL_VERSION {
                        let r = Reply::error(libc::EPROTO, format!("protocol version {version}; this daemon speaks {PROTOCOL_VERSION}"));
                        let _ = send_message(fd, &encode(&r), None);
                        return self.drop_client(token, Some(format!("it speaks protocol version {version}")));
                    }
                    self.hello(token, program)
                }
                (false, _) => return self.drop_client(token, Some("its first message was not a hello".into())),
                (true, Request::Hello { .. }) => return self.drop_client(token, Some("it said hello twice".into())),
                (true, Request::Status) => (self.status(), None),
                (true, Request::Report) => {
                    self.note_violations();
                    (Reply::Report { violations: self.violations.clone() }, None)
                }
                (true, Request::FailQps { pid, max }) => (self.fail_qps(pid, max), None),
                (true, Request::Shutdown) => {
                    self.shutdown = true;
                    (Reply::Done, None)
                }
                (true, request) if !request.answered() => {
                    self.handle(token, request);
                    continue;
                }
                (true, request) => self.handle(token, request),
            };
            let sent = send_message(fd, &encode(&reply), fd_out.as_ref().map(AsRawFd::as_raw_fd));
            if let Err(e) = sent {
                return self.drop_client(token, Some(format!("its reply could not be sent: {e}")));
            }
            self.forward_events();
        }
    }

    fn hello(&mut self, token: u64, program: String) -> (Reply, Option<OwnedFd>) {
        let (ours, theirs) = match sys::event_pair() {
            Ok(p) => p,
            Err(e) => return (Reply::error(e.raw_os_error().unwrap_or(libc::EMFILE), format!("no event socket: {e}")), None),
        };
        let client = self.clients.get_mut(&token).expect("serving it");
        client.program = Some(program);
        client.async_tx = Some(ours);
        (Reply::Welcome { daemon_pid: std::process::id(), node_guid: crate::NODE_GUID }, Some(theirs))
    }

    /// Registers a model channel's eventfd so its completion events are forwarded as they come.
    pub(crate) fn watch_channel(&mut self, client: u64, channel: *mut ibv_comp_channel) -> io::Result<u64> {
        let token = self.token();
        // SAFETY: `channel` was just made by the device and is alive; its fd is the model's eventfd.
        let fd = unsafe { (*channel).fd };
        self.epoll.add(fd, token)?;
        self.targets.insert(token, Target::Channel(client, channel));
        Ok(token)
    }

    pub(crate) fn unwatch_channel(&mut self, token: u64, channel: *mut ibv_comp_channel) {
        // SAFETY: the channel is still alive (removed from the model after this).
        self.epoll.remove(unsafe { (*channel).fd });
        self.targets.remove(&token);
    }

    pub(crate) fn client(&mut self, token: u64) -> &mut Client {
        self.clients.get_mut(&token).expect("a live client")
    }

    pub(crate) fn client_opt(&mut self, token: u64) -> Option<&mut Client> {
        self.clients.get_mut(&token)
    }

    /// Drops a client: every object it made is destroyed, QPs first (their peers then time out, as a real
    /// peer's would), and its memory is never touched again.
    fn drop_client(&mut self, token: u64, why: Option<String>) {
        self.note_violations();
        let Some(client) = self.clients.get(&token) else { return };
        if let Some(why) = &why {
            eprintln!("sqdisc-sim: dropped pid {} ({}): {why}", client.pid, client.program.as_deref().unwrap_or("?"));
        }
        self.epoll.remove(client.sock.as_raw_fd());
        self.targets.remove(&token);
        crate::client::destroy_all(self, token);
        self.clients.remove(&token);
    }

    /// Publishes how many CQEs each CQ that got one holds now, in the counter its owner reads before polling.
    fn publish_cqs(&mut self) {
        let mut changed = Vec::new();
        self.dev.take_cq_changes(|cq, n| changed.push((cq, n)));
        for (cq, n) in changed {
            let Some(client) = self.owners.get(&(cq as usize)).map(|o| o.client) else { continue };
            if let Some(c) = self.clients.get(&client).and_then(|c| c.cqs.get(&(cq as u64))) {
                c.queued.set(n as u64);
            }
        }
    }

    /// Sends each client the completion and asynchronous events the model has for its objects.
    fn forward_events(&mut self) {
        self.publish_cqs();
        let channels: Vec<(u64, *mut ibv_comp_channel)> = self
            .targets
            .values()
            .filter_map(|t| match t {
                Target::Channel(c, ch) => Some((*c, *ch)),
                Target::Client | Target::Refused => None,
            })
            .collect();
        for (client, ch) in channels {
            while let Ok((cq, cookie)) = self.dev.get_cq_event(ch) {
                // Acknowledged at once: the client counts its own acknowledgements (ibv_ack_cq_events).
                let _ = self.dev.ack_cq_events(cq, 1);
                let rec = EventRecord { kind: EVENT_COMPLETION, event_type: 0, cookie: cookie as u64 };
                if let Some(c) = self.clients.get_mut(&client) {
                    c.queue_channel_event(ch, rec);
                }
            }
        }
        while let Some(ev) = self.dev.get_async_event() {
            let (kind, addr) = match ev.element {
                AsyncElement::Cq(p) => (EVENT_ASYNC_CQ, p as usize),
                AsyncElement::Qp(p) => (EVENT_ASYNC_QP, p as usize),
                AsyncElement::Srq(p) => (EVENT_ASYNC_SRQ, p as usize),
            };
            if let Some(owner) = self.owners.get(&addr) {
                let rec = EventRecord { kind, event_type: ev.event_type as u32, cookie: owner.cookie };
                if let Some(c) = self.clients.get_mut(&owner.client) {
                    c.queue_async_event(rec);
                }
            }
        }
        let mut broken = Vec::new();
        for (&token, c) in self.clients.iter_mut() {
            if let Err(e) = c.flush_events() {
                broken.push((token, e));
            }
        }
        for (token, e) in broken {
            self.drop_client(token, Some(format!("its event socket failed: {e}")));
        }
    }

    /// Forgets the owner of a QP that is being destroyed, after noting the violations logged so far (which
    /// may name it), so that the table holds live QPs only.
    pub(crate) fn forget_qp_owner(&mut self, qp_num: u32) {
        self.note_violations();
        self.qp_owner.remove(&qp_num);
    }

    /// Copies new violations of the model into the log, each with the process that owns its QP now.
    pub(crate) fn note_violations(&mut self) {
        let n = self.dev.violation_count();
        while self.violations.len() < n {
            let Some(v) = self.dev.violation(self.violations.len()) else { break };
            let (pid, program) = self.qp_owner.get(&v.qp_num).cloned().unwrap_or((0, String::new()));
            self.violations.push(ViolationInfo { step: v.step, kind: v.kind, qp_num: v.qp_num, wqe_index: v.wqe_index, pid, program, text: v.text });
        }
    }

    fn status(&mut self) -> Reply {
        self.note_violations();
        let clients = self.clients.values().filter_map(Client::info).collect();
        Reply::Status {
            daemon_pid: std::process::id(),
            settings: self.settings,
            steps: self.dev.now(),
            clients,
            violations: self.violations.len() as u64,
            async_refusals: self.async_refusals,
        }
    }

    /// `sqdisc-sim fail-qps`: up to `max` connected QPs of process `pid`, lowest QP number first, fail at the
    /// current step (`SQD_SIM_FAULT_QP_FATAL`): their WQEs flush and their peers retry into
    /// `IBV_WC_RETRY_EXC_ERR`, as when a real HCA's QP goes fatal.
    fn fail_qps(&mut self, pid: u32, max: u32) -> Reply {
        let mut qps: Vec<(u32, *mut rdma_sys::ibv_qp)> = Vec::new();
        for c in self.clients.values().filter(|c| c.pid as u32 == pid) {
            for q in c.qps.values().filter(|q| q.dest_qp_num.is_some()) {
                // SAFETY: a live QP of the model (a client's QPs are destroyed only with their entries).
                qps.push((unsafe { (*q.obj).qp_num }, q.obj));
            }
        }
        qps.sort_by_key(|&(n, _)| n);
        let now = self.dev.now();
        let mut failed = Vec::new();
        for (n, qp) in qps.into_iter().take(max as usize) {
            let fault = sqdisc_sim::SimFault { at_step: now, ..sqdisc_sim::SimFault::new(sqdisc_sim::SQD_SIM_FAULT_QP_FATAL, qp) };
            match self.dev.inject(&fault) {
                Ok(()) => failed.push(n),
                Err(e) => return Reply::error(e.errno(), format!("QP {n:#x}: {}", e.message())),
            }
        }
        eprintln!("sqdisc-sim: fail-qps: pid {pid}: QP(s) {failed:x?} made fatal at step {now}");
        Reply::Failed { qp_nums: failed }
    }

    /// The time of the last step, for requests that step the model (polls).
    pub(crate) fn stepped(&mut self) {
        self.last_step = Instant::now();
    }
}
