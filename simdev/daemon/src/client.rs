//! One connected process: its socket, the objects it made on the device, and the events waiting to be sent to
//! it.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use rdma_sys::{ibv_comp_channel, ibv_cq, ibv_mr, ibv_qp, ibv_srq};
use sqdisc_sim_proto::{ClientInfo, EventRecord};

use crate::memory::ProcessMemory;
use crate::server::Server;
use crate::sys;

/// Who owns a CQ, QP or SRQ of the model: the client's token and its cookie for the object.
pub struct Owner {
    pub client: u64,
    pub cookie: u64,
}

pub struct Channel {
    pub obj: *mut ibv_comp_channel,
    pub token: u64,
    /// The daemon's end of the channel's event socket.
    pub tx: OwnedFd,
    pub pending: VecDeque<[u8; EventRecord::SIZE]>,
}

pub struct Cq {
    pub obj: *mut ibv_cq,
    /// How many CQEs it holds, shared with the client, which polls only when it is not 0.
    pub queued: sqdisc_sim_proto::SharedCounter,
}

pub struct Qp {
    pub obj: *mut ibv_qp,
    /// `enum ibv_qp_state` as the client last moved it.
    pub state: u32,
    pub dest_qp_num: Option<u32>,
}

pub struct Client {
    pub sock: OwnedFd,
    pub pid: libc::pid_t,
    /// Set by the hello.
    pub program: Option<String>,
    pub memory: Arc<ProcessMemory>,
    /// The daemon's end of the context's asynchronous event socket.
    pub async_tx: Option<OwnedFd>,
    pub async_pending: VecDeque<[u8; EventRecord::SIZE]>,
    pub mrs: HashMap<u64, *mut ibv_mr>,
    pub cqs: HashMap<u64, Cq>,
    pub qps: HashMap<u64, Qp>,
    pub srqs: HashMap<u64, *mut ibv_srq>,
    pub channels: HashMap<u64, Channel>,
    pub cm_channels: HashMap<u64, crate::cm::CmChannel>,
    pub next_cm_channel: u64,
}

impl Client {
    pub fn new(sock: OwnedFd, pid: libc::pid_t) -> Client {
        Client {
            sock,
            pid,
            program: None,
            memory: ProcessMemory::new(pid),
            async_tx: None,
            async_pending: VecDeque::new(),
            mrs: HashMap::new(),
            cqs: HashMap::new(),
            qps: HashMap::new(),
            srqs: HashMap::new(),
            channels: HashMap::new(),
            cm_channels: HashMap::new(),
            next_cm_channel: 0,
        }
    }

    pub fn info(&self) -> Option<ClientInfo> {
        Some(ClientInfo {
            pid: self.pid as u32,
            program: self.program.clone()?,
            qps: self.qps.len() as u32,
            cqs: self.cqs.len() as u32,
            mrs: self.mrs.len() as u32,
        })
    }

    pub fn has_pending_events(&self) -> bool {
        !self.async_pending.is_empty()
            || self.channels.values().any(|c| !c.pending.is_empty())
            || self.cm_channels.values().any(|c| !c.pending.is_empty())
    }

    pub fn queue_channel_event(&mut self, channel: *mut ibv_comp_channel, rec: EventRecord) {
        if let Some(c) = self.channels.values_mut().find(|c| c.obj == channel) {
            c.pending.push_back(rec.to_bytes());
        }
    }

    pub fn queue_async_event(&mut self, rec: EventRecord) {
        self.async_pending.push_back(rec.to_bytes());
    }

    /// Sends what the client's event sockets have room for; the rest waits for the next turn. A client that has
    /// closed its end of a channel no longer wants its events: they are discarded.
    pub fn flush_events(&mut self) -> io::Result<()> {
        for c in self.channels.values_mut() {
            flush(&c.tx, &mut c.pending);
        }
        if let Some(tx) = &self.async_tx {
            flush(tx, &mut self.async_pending);
        }
        for c in self.cm_channels.values_mut() {
            flush(&c.tx, &mut c.pending);
        }
        Ok(())
    }
}

/// Sends the pending records or messages of an event socket while it has room; the rest waits for the next
/// turn. A client that has closed its end no longer wants them: they are discarded.
fn flush<T: AsRef<[u8]>>(tx: &OwnedFd, pending: &mut VecDeque<T>) {
    while let Some(rec) = pending.front() {
        match sys::send_record(tx, rec.as_ref()) {
            Ok(true) => {
                pending.pop_front();
            }
            Ok(false) => return,
            Err(_) => {
                pending.clear();
                return;
            }
        }
    }
}

/// Destroys every object of a client, QPs first, and stops touching its memory.
pub fn destroy_all(server: &mut Server, token: u64) {
    server.cm_drop_client(token);
    let client = server.client(token);
    client.memory.forget();
    let qps: Vec<*mut ibv_qp> = client.qps.drain().map(|(_, q)| q.obj).collect();
    let srqs: Vec<*mut ibv_srq> = client.srqs.drain().map(|(_, s)| s).collect();
    let cqs: Vec<*mut ibv_cq> = client.cqs.drain().map(|(_, c)| c.obj).collect();
    let channels: Vec<Channel> = client.channels.drain().map(|(_, c)| c).collect();
    let mrs: Vec<*mut ibv_mr> = client.mrs.drain().map(|(_, m)| m).collect();
    for qp in qps {
        // SAFETY: a live QP of the device, made for this client.
        let qpn = unsafe { (*qp).qp_num };
        server.owners.remove(&(qp as usize));
        server.cm_forget_qp(qp);
        if let Err(e) = server.dev.destroy_qp(qp) {
            eprintln!("sqdisc-sim: cleanup: destroy qp: {e}");
        }
        server.forget_qp_owner(qpn);
    }
    for srq in srqs {
        server.owners.remove(&(srq as usize));
        if let Err(e) = server.dev.destroy_srq(srq) {
            eprintln!("sqdisc-sim: cleanup: destroy srq: {e}");
        }
    }
    for cq in cqs {
        server.owners.remove(&(cq as usize));
        if let Err(e) = server.dev.destroy_cq(cq) {
            eprintln!("sqdisc-sim: cleanup: destroy cq: {e}");
        }
    }
    for c in channels {
        server.unwatch_channel(c.token, c.obj);
        if let Err(e) = server.dev.destroy_comp_channel(c.obj) {
            eprintln!("sqdisc-sim: cleanup: destroy channel: {e}");
        }
    }
    for mr in mrs {
        if let Err(e) = server.dev.dereg_mr(mr) {
            eprintln!("sqdisc-sim: cleanup: dereg mr: {e}");
        }
    }
}
