//! librdmacm's connection manager on the sim device: event channels, identifiers, address and route
//! resolution, the connection handshake, and librdmacm's synchronous helpers (`rdma_create_ep`,
//! `rdma_get_request`, `rdma_getaddrinfo`). The daemon brokers the handshake between processes and connects
//! both QPs as it goes; this side keeps the program's `struct rdma_cm_id`s and builds its `rdma_cm_event`s.
//!
//! Every identifier works on one device context per process, opened at first use and shared, as librdmacm
//! shares the contexts it opens for its devices (`rdma_get_devices`).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Mutex, OnceLock};

use rdma_sys::{
    ibv_comp_channel, ibv_context, ibv_cq, ibv_pd, ibv_qp, ibv_qp_attr, ibv_qp_init_attr, ibv_qp_init_attr_ex, ibv_qp_state, rdma_addrinfo,
    rdma_cm_event, rdma_cm_id, rdma_conn_param, rdma_event_channel,
};
use sqdisc_sim_proto::{decode, recv_message_interruptible, CmAddr, CmEvent, CmParam, Reply, Request};

use crate::context::{context, Context};
use crate::qp::qp_obj;
use crate::{guarded, report, set_errno};

// enum rdma_cm_event_type
const ADDR_RESOLVED: u32 = 0;
const ADDR_ERROR: u32 = 1;
const ROUTE_RESOLVED: u32 = 2;
const ROUTE_ERROR: u32 = 3;
const CONNECT_REQUEST: u32 = 4;
const CONNECT_RESPONSE: u32 = 5;
const CONNECT_ERROR: u32 = 6;
const UNREACHABLE: u32 = 7;
const REJECTED: u32 = 8;
const ESTABLISHED: u32 = 9;
const DISCONNECTED: u32 = 10;

const RAI_PASSIVE: c_int = 1;
/// librdmacm limits private data to what a REQ carries.
const MAX_PRIVATE_DATA: usize = 56;

#[repr(C)]
struct Channel {
    ch: rdma_event_channel,
    id: u64,
    /// The client's end of the channel's socket (`ch.fd`).
    sock: OwnedFd,
}

/// An identifier: the program's struct first, then what this side keeps of it.
#[repr(C)]
struct Id {
    id: rdma_cm_id,
    daemon: u64,
    /// Made without a channel: its calls wait for their own events on a channel of its own.
    sync: bool,
    remote_qp_num: u32,
    param: CmParam,
    /// CQs and channels `rdma_create_qp` made for the QP (destroyed with it).
    own_cqs: bool,
    /// `rdma_create_ep` on a passive address: the QP attributes each `rdma_get_request` uses.
    ep_attr: Option<ibv_qp_init_attr>,
    ep_pd: *mut ibv_pd,
}

#[repr(C)]
struct Event {
    ev: rdma_cm_event,
    private: Vec<u8>,
}

struct Shared(usize);

/// The process's device context for the connection manager, opened at first use.
fn cm_context() -> Option<&'static Context> {
    static CTX: OnceLock<Shared> = OnceLock::new();
    let ptr = CTX
        .get_or_init(|| {
            let mut n = 0;
            // SAFETY: our own device list functions.
            let list = unsafe { crate::context::ibv_get_device_list(&mut n) };
            if list.is_null() || n == 0 {
                // SAFETY: as above; NULL is accepted.
                unsafe { crate::context::ibv_free_device_list(list) };
                return Shared(0);
            }
            // SAFETY: the list has one device.
            let ctx = unsafe { crate::context::ibv_open_device(*list) };
            // SAFETY: as above.
            unsafe { crate::context::ibv_free_device_list(list) };
            Shared(ctx as usize)
        })
        .0;
    if ptr == 0 {
        return None;
    }
    // SAFETY: a context opened above and never closed.
    unsafe { context(ptr as *mut ibv_context) }
}

fn ctx_ptr(c: &Context) -> *mut ibv_context {
    std::ptr::addr_of!(c.vctx.context).cast_mut()
}

/// The process's default PD on the CM context (librdmacm allocates one per device for identifiers given none).
fn default_pd(c: &Context) -> *mut ibv_pd {
    static PD: OnceLock<Shared> = OnceLock::new();
    // SAFETY: our own PD allocation on a live context.
    PD.get_or_init(|| Shared(unsafe { crate::objects::ibv_alloc_pd(ctx_ptr(c)) } as usize)).0 as *mut ibv_pd
}

/// Daemon id → the program's identifier.
fn ids() -> &'static Mutex<HashMap<u64, usize>> {
    static IDS: OnceLock<Mutex<HashMap<u64, usize>>> = OnceLock::new();
    IDS.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lookup(daemon: u64) -> Option<*mut Id> {
    ids().lock().unwrap_or_else(|p| p.into_inner()).get(&daemon).map(|p| *p as *mut Id)
}

fn no_device() -> c_int {
    eprintln!("sqdisc-sim: librdmacm: no sqdisc-sim daemon answers (start one: sqdisc-sim start)");
    set_errno(libc::ENODEV);
    -1
}

fn fail(name: &str, f: &crate::conn::Failure) -> c_int {
    report(name, f);
    -1
}

/// A request whose answer is only success or failure: 0, or -1 with errno set.
fn call(name: &str, request: &Request) -> c_int {
    match ask(name, request) {
        Ok(_) => 0,
        Err(rc) => rc,
    }
}

fn ask(name: &str, request: &Request) -> Result<Reply, c_int> {
    let Some(c) = cm_context() else { return Err(no_device()) };
    c.conn.ask(request).map_err(|f| fail(name, &f))
}

// ---- addresses ----

/// # Safety
/// `sa` is NULL or a valid `sockaddr_in` / `sockaddr_in6` (by its family).
unsafe fn to_addr(sa: *const libc::sockaddr) -> Option<CmAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: as the caller promises.
    let family = unsafe { (*sa).sa_family } as i32;
    let mut a = CmAddr { family: family as u16, port: 0, ip: [0; 16], scope_id: 0 };
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let sin = unsafe { &*sa.cast::<libc::sockaddr_in>() };
            a.port = u16::from_be(sin.sin_port);
            a.ip[..4].copy_from_slice(&sin.sin_addr.s_addr.to_ne_bytes());
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            let sin6 = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
            a.port = u16::from_be(sin6.sin6_port);
            a.ip = sin6.sin6_addr.s6_addr;
            a.scope_id = sin6.sin6_scope_id;
        }
        _ => return None,
    }
    Some(a)
}

/// Writes `a` as a `sockaddr_in(6)` into `out` (room for a `sockaddr_storage`).
fn write_addr(a: &CmAddr, out: *mut libc::sockaddr_storage) {
    // SAFETY: plain data; zero is valid.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    if i32::from(a.family) == libc::AF_INET {
        // SAFETY: a sockaddr_storage holds a sockaddr_in.
        let sin = unsafe { &mut *std::ptr::addr_of_mut!(st).cast::<libc::sockaddr_in>() };
        sin.sin_family = libc::AF_INET as libc::sa_family_t;
        sin.sin_port = a.port.to_be();
        sin.sin_addr.s_addr = u32::from_ne_bytes([a.ip[0], a.ip[1], a.ip[2], a.ip[3]]);
    } else {
        // SAFETY: a sockaddr_storage holds a sockaddr_in6.
        let sin6 = unsafe { &mut *std::ptr::addr_of_mut!(st).cast::<libc::sockaddr_in6>() };
        sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        sin6.sin6_port = a.port.to_be();
        sin6.sin6_addr.s6_addr = a.ip;
        sin6.sin6_scope_id = a.scope_id;
    }
    // SAFETY: `out` has room for a sockaddr_storage (the caller's contract).
    unsafe { out.write(st) };
}

fn set_src(id: &mut rdma_cm_id, a: &CmAddr) {
    // The union's storage member spans it; written whole.
    write_addr(a, std::ptr::addr_of_mut!(id.route.addr.src_addr_union.src_storage));
}

fn set_dst(id: &mut rdma_cm_id, a: &CmAddr) {
    write_addr(a, std::ptr::addr_of_mut!(id.route.addr.dst_addr_union.dst_storage));
}

// ---- channels ----

/// Channels not destroyed yet, by address.
fn live_channels() -> &'static Mutex<std::collections::HashSet<usize>> {
    static LIVE: OnceLock<Mutex<std::collections::HashSet<usize>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(std::collections::HashSet::new()))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guarded("rdma_create_event_channel", std::ptr::null_mut(), || {
        let Some(c) = cm_context() else {
            no_device();
            return std::ptr::null_mut();
        };
        match c.conn.ask_fd(&Request::CmCreateChannel) {
            Ok((Reply::CmChannel { channel }, Some(sock))) => {
                let fd = sock.as_raw_fd();
                let ch: *mut rdma_event_channel = Box::into_raw(Box::new(Channel { ch: rdma_event_channel { fd }, id: channel, sock })).cast();
                live_channels().lock().unwrap_or_else(|p| p.into_inner()).insert(ch as usize);
                ch
            }
            Ok(_) => {
                set_errno(libc::EPROTO);
                std::ptr::null_mut()
            }
            Err(f) => {
                fail("rdma_create_event_channel", &f);
                std::ptr::null_mut()
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guarded("rdma_destroy_event_channel", (), || {
        if channel.is_null() {
            return;
        }
        live_channels().lock().unwrap_or_else(|p| p.into_inner()).remove(&(channel as usize));
        // SAFETY: a channel this library made (the caller's contract).
        let id = unsafe { (*channel.cast::<Channel>()).id };
        if let Err(e) = ask("rdma_destroy_event_channel", &Request::CmDestroyChannel { channel: id }) {
            let _ = e;
        }
        // SAFETY: made by `Box::into_raw`; freed once (its socket closes with it).
        drop(unsafe { Box::from_raw(channel.cast::<Channel>()) });
    })
}

// ---- identifiers ----

fn new_id(daemon: u64, channel: *mut rdma_event_channel, context: *mut c_void, ps: u32, sync: bool) -> *mut Id {
    // SAFETY: `rdma_cm_id` is plain data (pointers, ints, address unions): zero is valid.
    let mut id: rdma_cm_id = unsafe { std::mem::zeroed() };
    id.channel = channel;
    id.context = context;
    id.ps = ps;
    id.qp_type = rdma_sys::ibv_qp_type::IBV_QPT_RC;
    id.port_num = 1;
    let obj = Box::into_raw(Box::new(Id { id, daemon, sync, remote_qp_num: 0, param: CmParam::default(), own_cqs: false, ep_attr: None, ep_pd: std::ptr::null_mut() }));
    ids().lock().unwrap_or_else(|p| p.into_inner()).insert(daemon, obj as usize);
    obj
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(channel: *mut rdma_event_channel, out: *mut *mut rdma_cm_id, context: *mut c_void, ps: u32) -> c_int {
    guarded("rdma_create_id", -1, || {
        if out.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        let (chan, sync) = if channel.is_null() {
            // SAFETY: our own function.
            let own = unsafe { rdma_create_event_channel() };
            if own.is_null() {
                return -1;
            }
            (own, true)
        } else {
            (channel, false)
        };
        // SAFETY: a channel of this library.
        let chan_id = unsafe { (*chan.cast::<Channel>()).id };
        match ask("rdma_create_id", &Request::CmCreateId { channel: chan_id, port_space: ps, cookie: 0 }) {
            Ok(Reply::CmId { id }) => {
                let obj = new_id(id, chan, context, ps, sync);
                // SAFETY: the caller's out-pointer.
                unsafe { *out = obj.cast() };
                0
            }
            Ok(_) => {
                set_errno(libc::EPROTO);
                -1
            }
            Err(rc) => {
                if sync {
                    // SAFETY: the channel made above.
                    unsafe { rdma_destroy_event_channel(chan) };
                }
                rc
            }
        }
    })
}

/// # Safety
/// `id` is NULL or an identifier of this library.
unsafe fn id_obj<'a>(id: *mut rdma_cm_id) -> Option<&'a mut Id> {
    if id.is_null() {
        set_errno(libc::EINVAL);
        return None;
    }
    // SAFETY: as the caller promises: an `Id` whose first field is the `rdma_cm_id`.
    Some(unsafe { &mut *id.cast::<Id>() })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guarded("rdma_destroy_id", -1, || {
        // SAFETY: the caller's identifier.
        let Some(obj) = (unsafe { id_obj(id) }) else { return -1 };
        let _ = ask("rdma_destroy_id", &Request::CmDestroyId { id: obj.daemon });
        ids().lock().unwrap_or_else(|p| p.into_inner()).remove(&obj.daemon);
        let (sync, channel) = (obj.sync, obj.id.channel);
        // SAFETY: made by `Box::into_raw` in `new_id`; freed once.
        drop(unsafe { Box::from_raw(id.cast::<Id>()) });
        if sync {
            // SAFETY: the identifier's own channel, made with it.
            unsafe { rdma_destroy_event_channel(channel) };
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int {
    guarded("rdma_migrate_id", -1, || {
        // SAFETY: the caller's identifier.
        let Some(obj) = (unsafe { id_obj(id) }) else { return -1 };
        let (chan, sync) = if channel.is_null() {
            // SAFETY: our own function.
            let own = unsafe { rdma_create_event_channel() };
            if own.is_null() {
                return -1;
            }
            (own, true)
        } else {
            (channel, false)
        };
        // SAFETY: a channel of this library.
        let chan_id = unsafe { (*chan.cast::<Channel>()).id };
        if let Err(rc) = ask("rdma_migrate_id", &Request::CmMigrateId { id: obj.daemon, channel: chan_id }) {
            return rc;
        }
        let (old, old_sync) = (obj.id.channel, obj.sync);
        obj.id.channel = chan;
        obj.sync = sync;
        if old_sync {
            // SAFETY: the identifier's previous own channel.
            unsafe { rdma_destroy_event_channel(old) };
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    guarded("rdma_bind_addr", -1, || {
        // SAFETY: the caller's identifier.
        let Some(obj) = (unsafe { id_obj(id) }) else { return -1 };
        // SAFETY: the caller's address.
        let Some(a) = (unsafe { to_addr(addr) }) else {
            set_errno(libc::EAFNOSUPPORT);
            return -1;
        };
        match ask("rdma_bind_addr", &Request::CmBind { id: obj.daemon, addr: a }) {
            Ok(Reply::CmAddress { addr }) => {
                set_src(&mut obj.id, &addr);
                if let Some(c) = cm_context() {
                    obj.id.verbs = ctx_ptr(c);
                }
                0
            }
            Ok(_) => {
                set_errno(libc::EPROTO);
                -1
            }
            Err(rc) => rc,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    guarded("rdma_listen", -1, || {
        // SAFETY: the caller's identifier.
        let Some(obj) = (unsafe { id_obj(id) }) else { return -1 };
        call("rdma_listen", &Request::CmListen { id: obj.daemon, backlog })
    })
}

/// Reads the next event of a channel into a new `Event` (blocking as the channel's descriptor is).
///
/// # Safety
/// `channel` is a channel of this library.
unsafe fn read_event(channel: *mut rdma_event_channel) -> Result<*mut Event, c_int> {
    // SAFETY: as the caller promises.
    let fd = unsafe { (*channel).fd };
    let mut buf = Vec::new();
    // A signal ends the wait, as it ends librdmacm's read of the kernel's event file (-1, EINTR).
    let ev: CmEvent = match recv_message_interruptible(fd, &mut buf) {
        Ok(Some(_)) => match decode(&buf) {
            Some(e) => e,
            None => {
                set_errno(libc::EPROTO);
                return Err(-1);
            }
        },
        Ok(None) if !live_channels().lock().unwrap_or_else(|p| p.into_inner()).contains(&(channel as usize)) => {
            // The program destroyed the channel while this thread waited on it: with a kernel device such a
            // read never returns, and programs rely on that (a CM thread left blocked until exit).
            loop {
                std::thread::park();
            }
        }
        Ok(None) => {
            eprintln!("sqdisc-sim: rdma_get_cm_event: the sqdisc-sim daemon has gone");
            set_errno(libc::ENODEV);
            return Err(-1);
        }
        Err(e) => {
            set_errno(e.raw_os_error().unwrap_or(libc::EIO));
            return Err(-1);
        }
    };
    let mut target = lookup(ev.id);
    let mut listen: *mut Id = std::ptr::null_mut();
    if ev.event == CONNECT_REQUEST {
        listen = lookup(ev.listen_id).unwrap_or(std::ptr::null_mut());
        if listen.is_null() {
            set_errno(libc::EPROTO);
            return Err(-1);
        }
        // SAFETY: a live identifier of this process (found in the map).
        let l = unsafe { &*listen };
        let new = new_id(ev.id, l.id.channel, l.id.context, l.id.ps, false);
        // SAFETY: just made.
        let n = unsafe { &mut *new };
        n.id.verbs = l.id.verbs;
        if n.id.verbs.is_null() {
            if let Some(c) = cm_context() {
                n.id.verbs = ctx_ptr(c);
            }
        }
        n.id.pd = l.id.pd;
        if let Some(s) = ev.src {
            set_src(&mut n.id, &s);
        }
        if let Some(d) = ev.dst {
            set_dst(&mut n.id, &d);
        }
        n.remote_qp_num = ev.remote_qp_num;
        n.param = ev.param.clone();
        target = Some(new);
    }
    let Some(target) = target else {
        // An event for an identifier already destroyed: nothing to give the program.
        set_errno(libc::EAGAIN);
        return Err(-2);
    };
    // SAFETY: a live identifier of this process.
    let t = unsafe { &mut *target };
    match ev.event {
        CONNECT_RESPONSE => {
            t.remote_qp_num = ev.remote_qp_num;
            t.param = ev.param.clone();
        }
        ESTABLISHED => {
            t.remote_qp_num = ev.remote_qp_num;
            if !t.id.qp.is_null() {
                // The daemon connected the QP in the handshake: it is in RTS now, as librdmacm leaves it.
                // SAFETY: the identifier's live QP.
                unsafe { mark_rts(t.id.qp, ev.remote_qp_num) };
            }
        }
        _ => {}
    }
    let mut private = ev.param.private_data.clone();
    private.truncate(MAX_PRIVATE_DATA.max(196));
    // SAFETY: plain data; zero is valid.
    let mut out: Box<Event> = Box::new(Event { ev: unsafe { std::mem::zeroed() }, private });
    out.ev.id = target.cast();
    out.ev.listen_id = listen.cast();
    out.ev.event = ev.event;
    out.ev.status = ev.status;
    // SAFETY: plain data; zero is valid.
    let mut conn: rdma_conn_param = unsafe { std::mem::zeroed() };
    conn.private_data = if out.private.is_empty() { std::ptr::null() } else { out.private.as_ptr().cast() };
    conn.private_data_len = out.private.len() as u8;
    conn.responder_resources = ev.param.responder_resources;
    conn.initiator_depth = ev.param.initiator_depth;
    conn.flow_control = ev.param.flow_control;
    conn.retry_count = ev.param.retry_count;
    conn.rnr_retry_count = ev.param.rnr_retry_count;
    conn.srq = ev.param.srq;
    conn.qp_num = ev.remote_qp_num;
    out.ev.param.conn = conn;
    let ptr = Box::into_raw(out);
    t.id.event = ptr.cast();
    Ok(ptr)
}

/// # Safety
/// `qp` is a live QP of this library.
unsafe fn mark_rts(qp: *mut ibv_qp, dest: u32) {
    // SAFETY: as the caller promises.
    unsafe { (*qp).state = ibv_qp_state::IBV_QPS_RTS };
    // SAFETY: as the caller promises.
    let q = unsafe { qp_obj(qp) };
    let mut a = q.attr.lock().unwrap_or_else(|p| p.into_inner());
    a.qp_state = ibv_qp_state::IBV_QPS_RTS;
    a.dest_qp_num = dest;
    q.mirror.lock().unwrap_or_else(|p| p.into_inner()).connected = true;
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(channel: *mut rdma_event_channel, event: *mut *mut rdma_cm_event) -> c_int {
    guarded("rdma_get_cm_event", -1, || {
        if channel.is_null() || event.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        loop {
            // SAFETY: the caller's channel.
            match unsafe { read_event(channel) } {
                Ok(e) => {
                    // SAFETY: the caller's out-pointer.
                    unsafe { *event = e.cast() };
                    return 0;
                }
                Err(-2) => continue,
                Err(rc) => return rc,
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    if event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: made by `Box::into_raw` in `read_event`; freed once.
    drop(unsafe { Box::from_raw(event.cast::<Event>()) });
    0
}

/// Waits on a synchronous identifier's own channel for the event that completes its call.
fn wait_for(obj: &mut Id, want: u32) -> c_int {
    loop {
        // SAFETY: the identifier's own channel.
        let e = match unsafe { read_event(obj.id.channel) } {
            Ok(e) => e,
            Err(-2) => continue,
            Err(rc) => return rc,
        };
        // SAFETY: the event just read.
        let (kind, status) = unsafe { ((*e).ev.event, (*e).ev.status) };
        // SAFETY: as above.
        unsafe { rdma_ack_cm_event(e.cast()) };
        if kind == want {
            return 0;
        }
        let errno = match kind {
            REJECTED => libc::ECONNREFUSED,
            ADDR_ERROR | ROUTE_ERROR | UNREACHABLE => libc::EHOSTUNREACH,
            CONNECT_ERROR => libc::ECONNABORTED,
            DISCONNECTED => libc::ECONNRESET,
            _ => continue,
        };
        let _ = status;
        set_errno(errno);
        return -1;
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(id: *mut rdma_cm_id, src: *mut libc::sockaddr, dst: *mut libc::sockaddr, _timeout_ms: c_int) -> c_int {
    guarded("rdma_resolve_addr", -1, || {
        // SAFETY: the caller's identifier.
        let Some(obj) = (unsafe { id_obj(id) }) else { return -1 };
        // SAFETY: the caller's addresses.
        let (s, d) = unsafe { (to_addr(src), to_addr(dst)) };
        let Some(d) = d else {
            set_errno(libc::EAFNOSUPPORT);
            return -1;
        };
        match ask("rdma_resolve_addr", &Request::CmResolveAddr { id: obj.daemon, src: s, dst: d }) {
            Ok(Reply::CmAddress { addr }) => {
                set_src(&mut obj.id, &addr);
                set_dst(&mut obj.id, &d);
                if let Some(c) = cm_context() {
                    obj.id.verbs = ctx_ptr(c);
                }
                if obj.sync {
                    return wait_for(obj, ADDR_RESOLVED);
                }
                0
            }
            Ok(_) => {
                set_errno(libc::EPROTO);
                -1
            }
            Err(rc) => rc,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    guarded("rdma_resolve_route", -1, || {
        // SAFETY: the caller's identifier.
        let Some(obj) = (unsafe { id_obj(id) }) else { return -1 };
        match ask("rdma_resolve_route", &Request::CmResolveRoute { id: obj.daemon }) {
            Ok(_) if obj.sync => wait_for(obj, ROUTE_RESOLVED),
            Ok(_) => 0,
            Err(rc) => rc,
        }
    })
}

// ---- QPs ----

/// Makes a channel and a CQ of `cqe` entries for an identifier's QP, as librdmacm does when given none.
fn make_cq(ctx: *mut ibv_context, cqe: u32) -> Option<(*mut ibv_comp_channel, *mut ibv_cq)> {
    // SAFETY: our own functions on a live context.
    unsafe {
        let ch = crate::objects::ibv_create_comp_channel(ctx);
        if ch.is_null() {
            return None;
        }
        let cq = crate::objects::ibv_create_cq(ctx, cqe.max(1) as c_int, std::ptr::null_mut(), ch, 0);
        if cq.is_null() {
            crate::objects::ibv_destroy_comp_channel(ch);
            return None;
        }
        Some((ch, cq))
    }
}

fn free_own_cqs(obj: &mut Id) {
    if !obj.own_cqs {
        return;
    }
    obj.own_cqs = false;
    // SAFETY: CQs and channels this identifier made in `attach_qp`, no longer used by a QP.
    unsafe {
        for (cq, ch) in [(obj.id.send_cq, obj.id.send_cq_channel), (obj.id.recv_cq, obj.id.recv_cq_channel)] {
            if !cq.is_null() {
                crate::objects::ibv_destroy_cq(cq);
            }
            if !ch.is_null() {
                crate::objects::ibv_destroy_comp_channel(ch);
            }
        }
    }
    obj.id.send_cq = std::ptr::null_mut();
    obj.id.recv_cq = std::ptr::null_mut();
    obj.id.send_cq_channel = std::ptr::null_mut();
    obj.id.recv_cq_channel = std::ptr::null_mut();
}

/// Creates the identifier's QP with `create` (after making CQs if the attributes have none), moves it to INIT
/// and tells the daemon, which connects it in the handshake.
fn attach_qp(
    obj: &mut Id,
    pd: *mut ibv_pd,
    mut send_cq: *mut ibv_cq,
    mut recv_cq: *mut ibv_cq,
    caps: (u32, u32),
    create: impl FnOnce(*mut ibv_pd, *mut ibv_cq, *mut ibv_cq) -> *mut ibv_qp,
) -> c_int {
    let Some(c) = cm_context() else { return no_device() };
    let ctx = ctx_ptr(c);
    let pd = if pd.is_null() { if obj.id.pd.is_null() { default_pd(c) } else { obj.id.pd } } else { pd };
    if send_cq.is_null() || recv_cq.is_null() {
        let Some((sch, scq)) = make_cq(ctx, caps.0) else { return -1 };
        let Some((rch, rcq)) = make_cq(ctx, caps.1) else {
            // SAFETY: made just above.
            unsafe {
                crate::objects::ibv_destroy_cq(scq);
                crate::objects::ibv_destroy_comp_channel(sch);
            }
            return -1;
        };
        obj.id.send_cq_channel = sch;
        obj.id.send_cq = scq;
        obj.id.recv_cq_channel = rch;
        obj.id.recv_cq = rcq;
        obj.own_cqs = true;
        send_cq = scq;
        recv_cq = rcq;
    }
    let qp = create(pd, send_cq, recv_cq);
    if qp.is_null() {
        free_own_cqs(obj);
        return -1;
    }
    // SAFETY: plain data; zero is valid.
    let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
    attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
    attr.port_num = 1;
    attr.qp_access_flags = 1 | 2 | 4 | 8;
    let mask = rdma_sys::ibv_qp_attr_mask::IBV_QP_STATE.0 | rdma_sys::ibv_qp_attr_mask::IBV_QP_PORT.0 | rdma_sys::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0;
    // SAFETY: our own functions on the QP just made.
    let rc = unsafe { crate::qp::ibv_modify_qp(qp, &mut attr, mask as c_int) };
    // SAFETY: as above.
    let qid = unsafe { qp_obj(qp) }.id;
    let set = ask("rdma_create_qp", &Request::CmSetQp { id: obj.daemon, qp: Some(qid) });
    if rc != 0 || set.is_err() {
        // SAFETY: as above.
        unsafe { crate::qp::ibv_destroy_qp(qp) };
        free_own_cqs(obj);
        set_errno(if rc != 0 { rc } else { libc::EIO });
        return -1;
    }
    obj.id.qp = qp;
    obj.id.pd = pd;
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> c_int {
    guarded("rdma_create_qp", -1, || {
        // SAFETY: the caller's identifier.
        let Some(obj) = (unsafe { id_obj(id) }) else { return -1 };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the caller's attribute struct, non-NULL.
        let a = unsafe { &mut *attr };
        let caps = (a.cap.max_send_wr, a.cap.max_recv_wr);
        let (scq, rcq) = (a.send_cq, a.recv_cq);
        let attr_ptr: *mut ibv_qp_init_attr = a;
        attach_qp(obj, pd, scq, rcq, caps, |pd, scq, rcq| {
            // SAFETY: the caller's attribute struct; our own ibv_create_qp.
            unsafe {
                (*attr_ptr).send_cq = scq;
                (*attr_ptr).recv_cq = rcq;
                crate::qp::ibv_create_qp(pd, attr_ptr)
            }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(id: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> c_int {
    guarded("rdma_create_qp_ex", -1, || {
        // SAFETY: the caller's identifier.
        let Some(obj) = (unsafe { id_obj(id) }) else { return -1 };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the caller's attribute struct, non-NULL.
        let a = unsafe { &mut *attr };
        let caps = (a.cap.max_send_wr, a.cap.max_recv_wr);
        let (scq, rcq) = (a.send_cq, a.recv_cq);
        let attr_ptr: *mut ibv_qp_init_attr_ex = a;
        let Some(c) = cm_context() else { return no_device() };
        let ctx = ctx_ptr(c);
        let pd = if a.comp_mask & rdma_sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0 != 0 { a.pd } else { std::ptr::null_mut() };
        attach_qp(obj, pd, scq, rcq, caps, |pd, scq, rcq| {
            // SAFETY: the caller's attribute struct; the context's own create_qp_ex op.
            unsafe {
                (*attr_ptr).send_cq = scq;
                (*attr_ptr).recv_cq = rcq;
                (*attr_ptr).pd = pd;
                (*attr_ptr).comp_mask |= rdma_sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0;
                let vctx = ctx.cast::<u8>().sub(std::mem::offset_of!(rdma_sys::verbs_context, context)).cast::<rdma_sys::verbs_context>();
                match (*vctx).create_qp_ex {
                    Some(f) => f(ctx, attr_ptr),
                    None => std::ptr::null_mut(),
                }
            }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guarded("rdma_destroy_qp", (), || {
        // SAFETY: the caller's identifier.
        let Some(obj) = (unsafe { id_obj(id) }) else { return };
        if obj.id.qp.is_null() {
            return;
        }
        let _ = ask("rdma_destroy_qp", &Request::CmSetQp { id: obj.daemon, qp: None });
        // SAFETY: the identifier's live QP.
        unsafe { crate::qp::ibv_destroy_qp(obj.id.qp) };
        obj.id.qp = std::ptr::null_mut();
        free_own_cqs(obj);
    })
}

// ---- the handshake ----

/// # Safety
/// `p` is NULL or the caller's valid `rdma_conn_param`.
unsafe fn to_param(p: *const rdma_conn_param) -> CmParam {
    if p.is_null() {
        return CmParam { responder_resources: 1, initiator_depth: 1, retry_count: 7, rnr_retry_count: 7, ..CmParam::default() };
    }
    // SAFETY: as the caller promises.
    let p = unsafe { &*p };
    let len = usize::from(p.private_data_len).min(MAX_PRIVATE_DATA.max(196));
    let private_data = if p.private_data.is_null() || len == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller's private data of `private_data_len` bytes.
        unsafe { std::slice::from_raw_parts(p.private_data.cast::<u8>(), len) }.to_vec()
    };
    CmParam {
        private_data,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: p.flow_control,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: p.srq,
        qp_num: p.qp_num,
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guarded("rdma_connect", -1, || {
        // SAFETY: the caller's identifier.
        let Some(obj) = (unsafe { id_obj(id) }) else { return -1 };
        // SAFETY: the caller's parameters or NULL.
        let p = unsafe { to_param(param) };
        match ask("rdma_connect", &Request::CmConnect { id: obj.daemon, param: p }) {
            Ok(_) if obj.sync => wait_for(obj, ESTABLISHED),
            Ok(_) => 0,
            Err(rc) => rc,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guarded("rdma_accept", -1, || {
        // SAFETY: the caller's identifier.
        let Some(obj) = (unsafe { id_obj(id) }) else { return -1 };
        // SAFETY: the caller's parameters or NULL.
        let p = unsafe { to_param(param) };
        match ask("rdma_accept", &Request::CmAccept { id: obj.daemon, param: p }) {
            Ok(_) => {
                if !obj.id.qp.is_null() {
                    // SAFETY: the identifier's live QP, connected by the daemon.
                    unsafe { mark_rts(obj.id.qp, obj.remote_qp_num) };
                }
                if obj.sync {
                    return wait_for(obj, ESTABLISHED);
                }
                0
            }
            Err(rc) => rc,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_reject(id: *mut rdma_cm_id, private_data: *const c_void, len: u8) -> c_int {
    guarded("rdma_reject", -1, || {
        // SAFETY: the caller's identifier.
        let Some(obj) = (unsafe { id_obj(id) }) else { return -1 };
        let data = if private_data.is_null() || len == 0 {
            Vec::new()
        } else {
            // SAFETY: the caller's `len` bytes.
            unsafe { std::slice::from_raw_parts(private_data.cast::<u8>(), usize::from(len)) }.to_vec()
        };
        call("rdma_reject", &Request::CmReject { id: obj.daemon, private_data: data })
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guarded("rdma_establish", -1, || {
        // SAFETY: the caller's identifier.
        let Some(obj) = (unsafe { id_obj(id) }) else { return -1 };
        call("rdma_establish", &Request::CmEstablish { id: obj.daemon })
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guarded("rdma_disconnect", -1, || {
        // SAFETY: the caller's identifier.
        let Some(obj) = (unsafe { id_obj(id) }) else { return -1 };
        match ask("rdma_disconnect", &Request::CmDisconnect { id: obj.daemon }) {
            Ok(_) => {
                if !obj.id.qp.is_null() {
                    // SAFETY: the identifier's live QP, moved to error by the daemon.
                    unsafe { (*obj.id.qp).state = ibv_qp_state::IBV_QPS_ERR };
                }
                0
            }
            Err(rc) => rc,
        }
    })
}

/// `rdma_init_qp_attr`: the attributes that move a QP the program manages itself to `attr->qp_state` for
/// this connection.
#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(id: *mut rdma_cm_id, attr: *mut ibv_qp_attr, mask: *mut c_int) -> c_int {
    guarded("rdma_init_qp_attr", -1, || {
        // SAFETY: the caller's identifier.
        let Some(obj) = (unsafe { id_obj(id) }) else { return -1 };
        if attr.is_null() || mask.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        use rdma_sys::ibv_qp_attr_mask as m;
        // SAFETY: the caller's attribute struct, non-NULL.
        let a = unsafe { &mut *attr };
        let bits = match a.qp_state {
            ibv_qp_state::IBV_QPS_INIT => {
                a.qp_access_flags = 1 | 2 | 4 | 8;
                a.pkey_index = 0;
                a.port_num = 1;
                m::IBV_QP_STATE.0 | m::IBV_QP_ACCESS_FLAGS.0 | m::IBV_QP_PKEY_INDEX.0 | m::IBV_QP_PORT.0
            }
            ibv_qp_state::IBV_QPS_RTR => {
                a.path_mtu = rdma_sys::ibv_mtu::IBV_MTU_4096;
                a.dest_qp_num = obj.remote_qp_num;
                a.rq_psn = 0;
                a.max_dest_rd_atomic = obj.param.responder_resources.max(1);
                a.min_rnr_timer = 12;
                a.ah_attr.dlid = crate::context::PORT_LID;
                a.ah_attr.port_num = 1;
                m::IBV_QP_STATE.0
                    | m::IBV_QP_AV.0
                    | m::IBV_QP_PATH_MTU.0
                    | m::IBV_QP_DEST_QPN.0
                    | m::IBV_QP_RQ_PSN.0
                    | m::IBV_QP_MAX_DEST_RD_ATOMIC.0
                    | m::IBV_QP_MIN_RNR_TIMER.0
            }
            ibv_qp_state::IBV_QPS_RTS => {
                a.timeout = 14;
                a.retry_cnt = obj.param.retry_count.min(7);
                a.rnr_retry = obj.param.rnr_retry_count.min(7);
                a.sq_psn = 0;
                a.max_rd_atomic = obj.param.initiator_depth.max(1);
                m::IBV_QP_STATE.0 | m::IBV_QP_TIMEOUT.0 | m::IBV_QP_RETRY_CNT.0 | m::IBV_QP_RNR_RETRY.0 | m::IBV_QP_SQ_PSN.0 | m::IBV_QP_MAX_QP_RD_ATOMIC.0
            }
            _ => {
                set_errno(libc::EINVAL);
                return -1;
            }
        };
        // SAFETY: the caller's non-NULL mask.
        unsafe { *mask = bits as c_int };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_notify(_id: *mut rdma_cm_id, _event: u32) -> c_int {
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(id: *mut rdma_cm_id, level: c_int, optname: c_int, _optval: *mut c_void, _optlen: usize) -> c_int {
    // SAFETY: the caller's identifier.
    if unsafe { id_obj(id) }.is_none() {
        return -1;
    }
    // RDMA_OPTION_ID: TOS, REUSEADDR, AFONLY, ACK_TIMEOUT; RDMA_OPTION_IB: PATH. None changes the model.
    match (level, optname) {
        (0, 0..=3) | (1, 1) => 0,
        _ => {
            set_errno(libc::ENOSYS);
            -1
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(_id: *mut rdma_cm_id, _addr: *mut libc::sockaddr, _context: *mut c_void) -> c_int {
    eprintln!("sqdisc-sim: rdma_join_multicast: the sim device models RC QPs only (no multicast)");
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(_id: *mut rdma_cm_id, _addr: *mut libc::sockaddr) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

// ---- devices ----

#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guarded("rdma_get_devices", std::ptr::null_mut(), || {
        let ctx = cm_context().map(ctx_ptr);
        let n = usize::from(ctx.is_some());
        // SAFETY: calloc of n + 1 pointers; NULL is handled.
        let list = unsafe { libc::calloc(n + 1, std::mem::size_of::<*mut ibv_context>()) }.cast::<*mut ibv_context>();
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return list;
        }
        if let Some(c) = ctx {
            // SAFETY: the list has room for n + 1 = 2 entries.
            unsafe { *list = c };
        }
        if !num.is_null() {
            // SAFETY: the caller's out-pointer.
            unsafe { *num = n as c_int };
        }
        list
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: a list `rdma_get_devices` allocated, or NULL.
    unsafe { libc::free(list.cast()) };
}

// ---- librdmacm's synchronous helpers ----

/// `rdma_getaddrinfo`: numeric and host names of this machine; RC connections only.
#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(node: *const c_char, service: *const c_char, hints: *const rdma_addrinfo, res: *mut *mut rdma_addrinfo) -> c_int {
    guarded("rdma_getaddrinfo", -1, || {
        if res.is_null() || (node.is_null() && service.is_null()) {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the caller's hints or NULL.
        let (flags, family) = if hints.is_null() { (0, 0) } else { unsafe { ((*hints).ai_flags, (*hints).ai_family) } };
        let passive = flags & RAI_PASSIVE != 0;
        // SAFETY: plain data; zero is valid.
        let mut h: libc::addrinfo = unsafe { std::mem::zeroed() };
        h.ai_family = if family == 0 { libc::AF_INET } else { family };
        h.ai_socktype = libc::SOCK_STREAM;
        h.ai_flags = if passive { libc::AI_PASSIVE } else { 0 };
        let mut found: *mut libc::addrinfo = std::ptr::null_mut();
        // SAFETY: NUL-terminated strings of the caller or NULL; `found` receives a list freed below.
        let rc = unsafe { libc::getaddrinfo(node, service, &h, &mut found) };
        if rc != 0 || found.is_null() {
            set_errno(libc::ENOENT);
            return rc.min(-1);
        }
        // SAFETY: the first entry of the list getaddrinfo returned.
        let (addr, len) = unsafe { ((*found).ai_addr, (*found).ai_addrlen) };
        // SAFETY: calloc of one zeroed rdma_addrinfo and one sockaddr_storage; freed by rdma_freeaddrinfo.
        let (ai, sa) = unsafe {
            (
                libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()).cast::<rdma_addrinfo>(),
                libc::calloc(1, std::mem::size_of::<libc::sockaddr_storage>()).cast::<libc::sockaddr>(),
            )
        };
        if ai.is_null() || sa.is_null() {
            // SAFETY: freeing what was allocated (NULL is fine).
            unsafe {
                libc::free(ai.cast());
                libc::free(sa.cast());
                libc::freeaddrinfo(found);
            }
            set_errno(libc::ENOMEM);
            return -1;
        }
        // SAFETY: `sa` has room for a sockaddr_storage; `addr` is `len` bytes; `ai` is a zeroed struct.
        unsafe {
            std::ptr::copy_nonoverlapping(addr.cast::<u8>(), sa.cast::<u8>(), len as usize);
            let a = &mut *ai;
            a.ai_flags = flags;
            a.ai_family = (*found).ai_family;
            a.ai_qp_type = rdma_sys::ibv_qp_type::IBV_QPT_RC as c_int;
            a.ai_port_space = rdma_sys::rdma_port_space::RDMA_PS_TCP as c_int;
            if passive {
                a.ai_src_addr = sa;
                a.ai_src_len = len;
            } else {
                a.ai_dst_addr = sa;
                a.ai_dst_len = len;
            }
            libc::freeaddrinfo(found);
            *res = ai;
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut cur = res;
    while !cur.is_null() {
        // SAFETY: a list `rdma_getaddrinfo` allocated.
        unsafe {
            let next = (*cur).ai_next;
            libc::free((*cur).ai_src_addr.cast());
            libc::free((*cur).ai_dst_addr.cast());
            libc::free(cur.cast());
            cur = next;
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(out: *mut *mut rdma_cm_id, res: *mut rdma_addrinfo, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> c_int {
    guarded("rdma_create_ep", -1, || {
        if out.is_null() || res.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        let mut id: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: our own function; a synchronous identifier.
        if unsafe { rdma_create_id(std::ptr::null_mut(), &mut id, std::ptr::null_mut(), rdma_sys::rdma_port_space::RDMA_PS_TCP) } != 0 {
            return -1;
        }
        // SAFETY: the caller's addrinfo.
        let r = unsafe { &*res };
        if !attr.is_null() {
            // As librdmacm: the QP's type is the address's.
            // SAFETY: the caller's attribute struct.
            unsafe { (*attr).qp_type = if r.ai_qp_type == 0 { rdma_sys::ibv_qp_type::IBV_QPT_RC } else { r.ai_qp_type as u32 } };
        }
        // SAFETY: the identifier just made.
        let obj = unsafe { &mut *id.cast::<Id>() };
        let rc = if r.ai_flags & RAI_PASSIVE != 0 {
            // SAFETY: our own function with the caller's address.
            let rc = unsafe { rdma_bind_addr(id, r.ai_src_addr) };
            if rc == 0 && !attr.is_null() {
                // SAFETY: the caller's attributes, copied for each request.
                obj.ep_attr = Some(unsafe { std::ptr::read(attr) });
                obj.ep_pd = pd;
            }
            rc
        } else {
            // SAFETY: our own functions with the caller's addresses.
            let mut rc = unsafe { rdma_resolve_addr(id, r.ai_src_addr, r.ai_dst_addr, 2000) };
            if rc == 0 {
                // SAFETY: as above.
                rc = unsafe { rdma_resolve_route(id, 2000) };
            }
            if rc == 0 && !attr.is_null() {
                // SAFETY: as above.
                rc = unsafe { rdma_create_qp(id, pd, attr) };
            }
            rc
        };
        if rc != 0 {
            // SAFETY: the identifier made above.
            unsafe { rdma_destroy_id(id) };
            return -1;
        }
        // SAFETY: the caller's out-pointer.
        unsafe { *out = id };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guarded("rdma_destroy_ep", (), || {
        // SAFETY: our own functions on the caller's identifier.
        unsafe {
            if !id.is_null() && !(*id).qp.is_null() {
                rdma_destroy_qp(id);
            }
            rdma_destroy_id(id);
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(listen: *mut rdma_cm_id, out: *mut *mut rdma_cm_id) -> c_int {
    guarded("rdma_get_request", -1, || {
        // SAFETY: the caller's identifier.
        let Some(l) = (unsafe { id_obj(listen) }) else { return -1 };
        if out.is_null() || !l.sync {
            set_errno(libc::EINVAL);
            return -1;
        }
        let new = loop {
            // SAFETY: the listening identifier's own channel.
            let e = match unsafe { read_event(l.id.channel) } {
                Ok(e) => e,
                Err(-2) => continue,
                Err(rc) => return rc,
            };
            // SAFETY: the event just read.
            let (kind, id) = unsafe { ((*e).ev.event, (*e).ev.id) };
            // SAFETY: as above.
            unsafe { rdma_ack_cm_event(e.cast()) };
            if kind == CONNECT_REQUEST {
                break id;
            }
        };
        // The new identifier is synchronous too: a channel of its own.
        // SAFETY: our own function on the identifier just made.
        if unsafe { rdma_migrate_id(new, std::ptr::null_mut()) } != 0 {
            return -1;
        }
        if let Some(mut attr) = l.ep_attr.as_ref().map(|a| {
            // SAFETY: plain data; a bitwise copy is valid.
            unsafe { std::ptr::read(a) }
        }) {
            let pd = l.ep_pd;
            // SAFETY: our own function on the new identifier.
            if unsafe { rdma_create_qp(new, pd, &mut attr) } != 0 {
                // SAFETY: as above.
                unsafe { rdma_destroy_id(new) };
                return -1;
            }
        }
        // SAFETY: the caller's out-pointer.
        unsafe { *out = new };
        0
    })
}
