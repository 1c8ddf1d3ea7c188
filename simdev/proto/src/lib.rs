//! The messages between the device daemon of the software HCA (`sqdisc-sim`) and the processes that use its
//! device through the preload library, and how they travel.
//!
//! One `SOCK_SEQPACKET` unix socket per opened device context carries requests and their replies, one message
//! each (bincode), in order: the client sends a [`Request`], the daemon answers with one [`Reply`] before it
//! reads the next. A reply may carry a file descriptor (`SCM_RIGHTS`): the client's end of a completion
//! channel, and of the context's asynchronous event socket. Those two kinds of socket carry fixed-size
//! [`EventRecord`]s from the daemon to the client, which the client reads when it wants an event, so they are
//! pollable, blocking or not, as the program set them.
//!
//! Objects are named by the daemon's ids (`u64`), valid only on the connection that made them. Each object the
//! client makes also carries a `cookie` of the client's own (the address of its `struct ibv_cq`, ...), which
//! the daemon hands back in events about that object.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod io;
mod path;
mod shm;

pub use io::{recv_message, send_message, EventRecord, MAX_MESSAGE};
pub use path::{socket_path, PRELOAD_ENV, SOCKET_ENV};
pub use shm::SharedCounter;

use serde::{Deserialize, Serialize};

/// Bumped whenever a message changes shape; a daemon refuses a client of another version.
pub const PROTOCOL_VERSION: u32 = 5;

/// The most CQEs one `PollCq` returns.
pub const MAX_POLL: u32 = 1024;

/// One scatter/gather element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// One send work request, as the client copied it out of its `struct ibv_send_wr`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendWr {
    pub wr_id: u64,
    pub opcode: u32,
    pub send_flags: u32,
    /// `num_sge` as the program gave it (the SGEs are copied only when it is in range and `sg_list` is set).
    pub num_sge: i32,
    pub null_sg_list: bool,
    pub sges: Vec<Sge>,
    /// With `IBV_SEND_INLINE`: the bytes of the SGEs, read at post time in the client, as an HCA copies them.
    pub inline_data: Option<Vec<u8>>,
    pub remote_addr: u64,
    pub rkey: u32,
    /// `imm_data` or `invalidate_rkey`.
    pub imm: u32,
    pub compare_add: u64,
    pub swap: u64,
}

/// One receive work request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecvWr {
    pub wr_id: u64,
    pub num_sge: i32,
    pub null_sg_list: bool,
    pub sges: Vec<Sge>,
}

/// One work completion (the fields of `struct ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
    /// A send completion: its QP's send slots below this count are free now. `None` for a receive completion.
    pub sq_freed: Option<u64>,
}

/// QP capacities (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// What `ibv_modify_qp` asks of the daemon: the target state and the connection attributes it carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpTransition {
    /// `enum ibv_qp_state`.
    pub state: u32,
    pub dest_qp_num: u32,
    pub rnr_retry: u8,
    pub retry_cnt: u8,
    pub max_rd_atomic: u8,
}

/// Settings of the daemon's device (`sqdisc-sim start --...`), as `struct sqd_sim_config` has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSettings {
    pub seed: u64,
    pub loss_ppm: u32,
    pub ack_loss_ppm: u32,
    pub retrans_timeout: u32,
    pub rnr_delay: u32,
    pub strict: bool,
    pub arm_pending: bool,
}

/// A request from a client to the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// The first message of a connection. The daemon takes the process id and user from the socket
    /// (`SO_PEERCRED`), not from this.
    Hello { version: u32, program: String },
    RegMr { addr: u64, length: u64, iova: u64, access: u32 },
    DeregMr { mr: u64 },
    CreateCompChannel,
    DestroyCompChannel { channel: u64 },
    CreateCq { cqe: i32, channel: Option<u64>, comp_vector: i32, cookie: u64 },
    ResizeCq { cq: u64, cqe: i32 },
    DestroyCq { cq: u64 },
    PollCq { cq: u64, max: u32 },
    ReqNotifyCq { cq: u64, solicited_only: bool },
    CreateSrq { max_wr: u32, max_sge: u32, srq_limit: u32, cookie: u64 },
    ModifySrq { srq: u64, srq_limit: u32 },
    QuerySrq { srq: u64 },
    DestroySrq { srq: u64 },
    PostSrqRecv { srq: u64, wrs: Vec<RecvWr> },
    CreateQp { send_cq: u64, recv_cq: u64, srq: Option<u64>, qp_type: u32, caps: QpCaps, sq_sig_all: bool, cookie: u64 },
    ModifyQp { qp: u64, to: QpTransition },
    QueryQpState { qp: u64 },
    DestroyQp { qp: u64 },
    PostSend { qp: u64, wrs: Vec<SendWr> },
    PostRecv { qp: u64, wrs: Vec<RecvWr> },
    /// Posts the client has found certain to be accepted (its copy of the slot counts says they fit, the QP
    /// is connected, every WR passes the device's checks): no reply, so a post costs no round trip. A refusal
    /// would be a bug of the client's checks; the daemon logs it.
    PostSendAsync { qp: u64, wrs: Vec<SendWr> },
    PostRecvAsync { qp: u64, wrs: Vec<RecvWr> },
    PostSrqRecvAsync { srq: u64, wrs: Vec<RecvWr> },
    /// librdmacm: a channel of connection events; the client's end of its socket comes with the reply, and
    /// carries [`CmEvent`]s.
    CmCreateChannel,
    CmDestroyChannel { channel: u64 },
    /// A connection identifier; `cookie` is the client's `struct rdma_cm_id`, given back in its events.
    CmCreateId { channel: u64, port_space: u32, cookie: u64 },
    CmDestroyId { id: u64 },
    CmMigrateId { id: u64, channel: u64 },
    /// Binds to a local address (port 0: one is chosen); the answer is the address bound.
    CmBind { id: u64, addr: CmAddr },
    CmListen { id: u64, backlog: i32 },
    /// Resolves `dst` (a local address of this machine) from `src` (or from the address the id is bound to);
    /// the answer carries the source address and an ADDR_RESOLVED (or ADDR_ERROR) event follows.
    CmResolveAddr { id: u64, src: Option<CmAddr>, dst: CmAddr },
    CmResolveRoute { id: u64 },
    /// Associates the id with a QP the client made on this connection (`rdma_create_qp`), or none.
    CmSetQp { id: u64, qp: Option<u64> },
    CmConnect { id: u64, param: CmParam },
    CmAccept { id: u64, param: CmParam },
    CmReject { id: u64, private_data: Vec<u8> },
    /// The active side of a connection whose QP the program moves itself: RTU, both sides established.
    CmEstablish { id: u64 },
    CmDisconnect { id: u64 },
    /// `sqdisc-sim status`: the daemon's state.
    Status,
    /// `sqdisc-sim report`: the violation log.
    Report,
    /// `sqdisc-sim stop`.
    Shutdown,
    /// `sqdisc-sim fail-qps`: make up to `max` connected QPs of process `pid` fatal now (a QP_FATAL fault at the
    /// current step), for fault runs of unmodified programs. Appended last: earlier variants keep their codes.
    FailQps { pid: u32, max: u32 },
}

/// One process connected to the daemon, for `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientInfo {
    pub pid: u32,
    pub program: String,
    pub qps: u32,
    pub cqs: u32,
    pub mrs: u32,
}

/// One logged violation, with the process whose QP it is recorded against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViolationInfo {
    pub step: u64,
    pub kind: u32,
    pub qp_num: u32,
    pub wqe_index: Option<u64>,
    /// The process that owned the QP when the violation was logged (0 when none).
    pub pid: u32,
    pub program: String,
    pub text: String,
}

/// The daemon's answer to a [`Request`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// Failed: a positive errno and what went wrong.
    Error { errno: i32, message: String },
    Done,
    Welcome { daemon_pid: u32, node_guid: u64 },
    Mr { mr: u64, lkey: u32, rkey: u32 },
    /// The client's end of the channel's socket travels with this reply.
    Channel { channel: u64 },
    /// With `CreateCq`, the CQ's shared counter of the CQEs it holds travels with this reply.
    Cq { cq: u64, cqe: i32 },
    Polled { wcs: Vec<Wc> },
    Srq { srq: u64, max_wr: u32, max_sge: u32 },
    /// The SRQ's armed limit (0: not armed).
    SrqState { srq_limit: u32 },
    Qp { qp: u64, qp_num: u32, caps: QpCaps },
    /// `enum ibv_qp_state`.
    QpState { state: u32 },
    /// A post stopped early: `errno` for the WR at `index` (the ones before it are posted); 0 when all were.
    Posted { errno: i32, index: u32 },
    Status { daemon_pid: u32, settings: DeviceSettings, steps: u64, clients: Vec<ClientInfo>, violations: u64, async_refusals: u64 },
    CmChannel { channel: u64 },
    CmId { id: u64 },
    CmAddress { addr: CmAddr },
    Report { violations: Vec<ViolationInfo> },
    /// The QPs `FailQps` made fatal, by number.
    Failed { qp_nums: Vec<u32> },
}

impl Request {
    /// Whether the daemon answers the request (every request but the asynchronous posts).
    pub fn answered(&self) -> bool {
        !matches!(self, Request::PostSendAsync { .. } | Request::PostRecvAsync { .. } | Request::PostSrqRecvAsync { .. })
    }
}

impl Reply {
    pub fn error(errno: i32, message: impl Into<String>) -> Reply {
        Reply::Error { errno, message: message.into() }
    }
}

/// Encodes a message.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    bincode::serialize(msg).expect("messages always serialize")
}

/// Decodes a message; `None` for bytes that are not one (truncated, malformed, another version's).
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Option<T> {
    bincode::deserialize(bytes).ok()
}

/// `EventRecord::kind`: a completion event of the CQ whose cookie is `cookie`.
pub const EVENT_COMPLETION: u32 = 1;
/// `EventRecord::kind`: an asynchronous event (`event_type`) about the CQ, QP or SRQ `cookie`, or the port or
/// device (`cookie` 0).
pub const EVENT_ASYNC_CQ: u32 = 2;
pub const EVENT_ASYNC_QP: u32 = 3;
pub const EVENT_ASYNC_SRQ: u32 = 4;
pub const EVENT_ASYNC_PORT: u32 = 5;

/// A socket address of the connection manager: IPv4 or IPv6, in network byte order as `sockaddr_in(6)` has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CmAddr {
    /// `AF_INET` or `AF_INET6`.
    pub family: u16,
    /// The port, in host byte order.
    pub port: u16,
    /// The address: the first 4 bytes for IPv4.
    pub ip: [u8; 16],
    pub scope_id: u32,
}

/// `struct rdma_conn_param` without its pointer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmParam {
    pub private_data: Vec<u8>,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// One connection event (`struct rdma_cm_event`), sent on a CM channel's socket as one message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmEvent {
    /// `enum rdma_cm_event_type`.
    pub event: u32,
    pub status: i32,
    /// The daemon's id the event is for: a new one for CONNECT_REQUEST.
    pub id: u64,
    /// The client's cookie of that id; 0 for a new id (CONNECT_REQUEST).
    pub cookie: u64,
    /// CONNECT_REQUEST: the daemon's id of the listening identifier.
    pub listen_id: u64,
    pub param: CmParam,
    /// CONNECT_REQUEST: the new id's local and remote addresses.
    pub src: Option<CmAddr>,
    pub dst: Option<CmAddr>,
    /// ESTABLISHED and CONNECT_RESPONSE: the QP number of the other side.
    pub remote_qp_num: u32,
}
