//! The device and its contexts: `ibv_get_device_list`, `ibv_open_device`, the query functions.

use std::collections::HashSet;
use std::ffi::{c_char, c_int};
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use rdma_sys::{
    _compat_ibv_port_attr, ibv_context, ibv_device, ibv_device_attr, ibv_gid, ibv_gid_entry, ibv_port_attr, verbs_context,
};

use crate::conn::Conn;
use crate::{guarded, report};

/// The node GUID the daemon's device reports (as `sqdisc-sim`'s `NODE_GUID`); the port GID is derived from it.
pub const NODE_GUID: u64 = 0x0002_c903_0053_5153;
pub const DEVICE_NAME: &[u8] = b"sqd_sim0";
/// The port's LID: every process sees the same port of the same device, as two processes on one HCA do.
pub const PORT_LID: u16 = 1;

/// A device context: libibverbs' extended context (its ops we do not have are NULL, so libibverbs' inline
/// extended verbs report "not supported"), with the connection to the daemon.
#[repr(C)]
pub struct Context {
    pub vctx: verbs_context,
    pub conn: Conn,
    /// The client's end of the asynchronous event socket (`context->async_fd`).
    pub async_fd: OwnedFd,
    /// `IBV_EVENT_DEVICE_FATAL` was handed out after the daemon went.
    pub fatal_reported: AtomicBool,
    /// The context's QPs by number: a polled completion names its QP by number.
    pub qps_by_num: Mutex<std::collections::HashMap<u32, usize>>,
}

/// Live contexts by address: control calls check a context is one of ours before they follow it.
fn live() -> &'static Mutex<HashSet<usize>> {
    static LIVE: OnceLock<Mutex<HashSet<usize>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(HashSet::new()))
}

/// The context behind `ctx`, if it is a live one of ours.
///
/// # Safety
/// `ctx` is NULL or a pointer a caller got from `ibv_open_device`; the context is not closed concurrently.
pub unsafe fn context<'a>(ctx: *mut ibv_context) -> Option<&'a Context> {
    if ctx.is_null() {
        return None;
    }
    let outer = (ctx as usize).checked_sub(std::mem::offset_of!(Context, vctx) + std::mem::offset_of!(verbs_context, context))?;
    if !live().lock().unwrap_or_else(|p| p.into_inner()).contains(&outer) {
        return None;
    }
    // SAFETY: `outer` is the address of a live `Context` made by `ibv_open_device` (checked just above).
    Some(unsafe { &*(outer as *const Context) })
}

/// The context of an object's `context` field, for the data path: no registry look-up.
///
/// # Safety
/// `ctx` is the `context` field of an object this library made, whose context is alive.
pub unsafe fn context_fast<'a>(ctx: *mut ibv_context) -> &'a Context {
    let outer = ctx as usize - std::mem::offset_of!(Context, vctx) - std::mem::offset_of!(verbs_context, context);
    // SAFETY: as the caller promises, `ctx` is the `context` member of a live `Context`.
    unsafe { &*(outer as *const Context) }
}

struct Device(ibv_device);
// SAFETY: the device record is written once, then only read.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

fn device() -> *mut ibv_device {
    static DEVICE: OnceLock<Device> = OnceLock::new();
    let d = DEVICE.get_or_init(|| {
        // SAFETY: `ibv_device` is plain data: zero is valid.
        let mut dev: ibv_device = unsafe { std::mem::zeroed() };
        for (d, s) in dev.name.iter_mut().zip(DEVICE_NAME) {
            *d = *s as c_char;
        }
        for (d, s) in dev.dev_name.iter_mut().zip(b"uverbs_sqd_sim0") {
            *d = *s as c_char;
        }
        dev.node_type = rdma_sys::ibv_node_type::IBV_NODE_CA;
        dev.transport_type = rdma_sys::ibv_transport_type::IBV_TRANSPORT_IB;
        Device(dev)
    });
    std::ptr::addr_of!(d.0).cast_mut()
}

fn is_device(dev: *mut ibv_device) -> bool {
    std::ptr::eq(dev, device())
}

/// `ibv_get_device_list`: the daemon's device when a daemon listens, else an empty list.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    guarded("ibv_get_device_list", std::ptr::null_mut(), || {
        let present = Conn::daemon_listening();
        let n = usize::from(present);
        // SAFETY: calloc of n + 1 pointers; NULL on failure is handled.
        let list = unsafe { libc::calloc(n + 1, std::mem::size_of::<*mut ibv_device>()) }.cast::<*mut ibv_device>();
        if list.is_null() {
            crate::set_errno(libc::ENOMEM);
            return list;
        }
        if present {
            // SAFETY: `list` holds n + 1 = 2 entries.
            unsafe { *list = device() };
        }
        if !num_devices.is_null() {
            // SAFETY: a non-NULL out-pointer of the caller.
            unsafe { *num_devices = n as c_int };
        }
        list
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: `list` came from `ibv_get_device_list` (calloc) or is NULL.
    unsafe { libc::free(list.cast()) };
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    if !is_device(dev) {
        crate::set_errno(libc::EINVAL);
        return std::ptr::null();
    }
    // SAFETY: our device record, alive for the process.
    unsafe { (*dev).name.as_ptr() }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    if !is_device(dev) {
        return 0;
    }
    NODE_GUID.to_be()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    if is_device(dev) {
        0
    } else {
        -1
    }
}

/// `ibv_open_device`: a connection to the daemon.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    guarded("ibv_open_device", std::ptr::null_mut(), || {
        if !is_device(dev) {
            crate::set_errno(libc::ENODEV);
            eprintln!("sqdisc-sim: ibv_open_device: not the sqdisc-sim device");
            return std::ptr::null_mut();
        }
        let (conn, async_fd) = match Conn::open() {
            Ok(c) => c,
            Err(f) => {
                report("ibv_open_device", &f);
                return std::ptr::null_mut();
            }
        };
        // SAFETY: `verbs_context` is plain data (pointers, ints, nullable fn pointers, a pthread mutex whose
        // zero pattern is the static initializer on Linux): zero is valid.
        let mut vctx: verbs_context = unsafe { std::mem::zeroed() };
        vctx.sz = std::mem::size_of::<verbs_context>();
        let c = &mut vctx.context;
        c.device = dev;
        c.cmd_fd = -1;
        c.async_fd = async_fd.as_raw_fd();
        c.num_comp_vectors = 1;
        c.abi_compat = usize::MAX as *mut libc::c_void;
        crate::datapath::install(&mut c.ops);
        crate::qp::install_extended(&mut vctx);
        let ctx = Box::into_raw(Box::new(Context { vctx, conn, async_fd, fatal_reported: AtomicBool::new(false), qps_by_num: Mutex::new(Default::default()) }));
        live().lock().unwrap_or_else(|p| p.into_inner()).insert(ctx as usize);
        // SAFETY: just made; the box stays where it is until `ibv_close_device`.
        unsafe { std::ptr::addr_of_mut!((*ctx).vctx.context) }
    })
}

/// `ibv_close_device`: the daemon destroys whatever the context still had.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    guarded("ibv_close_device", -1, || {
        // SAFETY: a context pointer of the caller; checked against the live set.
        let Some(c) = (unsafe { context(ctx) }) else {
            crate::set_errno(libc::EINVAL);
            return -1;
        };
        let outer = c as *const Context as usize;
        live().lock().unwrap_or_else(|p| p.into_inner()).remove(&outer);
        // SAFETY: made by `Box::into_raw` in `ibv_open_device` and now out of the live set: freed once.
        drop(unsafe { Box::from_raw(outer as *mut Context) });
        0
    })
}

/// The device's attributes: the sim's limits.
pub fn device_attr(attr: &mut ibv_device_attr) {
    // SAFETY: plain data; zero is valid.
    *attr = unsafe { std::mem::zeroed() };
    let fw = b"sqdisc-sim 0.1";
    for (d, s) in attr.fw_ver.iter_mut().zip(fw) {
        *d = *s as c_char;
    }
    attr.node_guid = NODE_GUID.to_be();
    attr.sys_image_guid = NODE_GUID.to_be();
    attr.max_mr_size = u64::MAX;
    attr.page_size_cap = 0xffff_f000;
    attr.vendor_id = 0x5153; // "QS": no IEEE OUI of a real vendor
    attr.vendor_part_id = 1;
    attr.hw_ver = 1;
    attr.max_qp = 1 << 20;
    attr.max_qp_wr = 1 << 15;
    attr.device_cap_flags = rdma_sys::ibv_device_cap_flags::IBV_DEVICE_RC_RNR_NAK_GEN.0
        | rdma_sys::ibv_device_cap_flags::IBV_DEVICE_CHANGE_PHY_PORT.0;
    attr.max_sge = 32;
    attr.max_sge_rd = 32;
    attr.max_cq = 1 << 20;
    attr.max_cqe = 1 << 22;
    attr.max_mr = 1 << 20;
    attr.max_pd = 1 << 20;
    attr.max_qp_rd_atom = 16;
    attr.max_ee_rd_atom = 0;
    attr.max_res_rd_atom = 16 << 10;
    attr.max_qp_init_rd_atom = 16;
    attr.atomic_cap = rdma_sys::ibv_atomic_cap::IBV_ATOMIC_HCA;
    attr.max_srq = 1 << 20;
    attr.max_srq_wr = 1 << 15;
    attr.max_srq_sge = 32;
    attr.max_pkeys = 1;
    attr.local_ca_ack_delay = 15;
    attr.phys_port_cnt = 1;
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(ctx: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    // SAFETY: a context pointer of the caller; checked against the live set.
    if unsafe { context(ctx) }.is_none() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL attribute struct of the caller.
    device_attr(unsafe { &mut *attr });
    0
}

/// `ibv_query_port` (the symbol libibverbs' inline `ibv_query_port` calls): port 1, active, InfiniBand link
/// layer, 4096-byte MTU.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(ctx: *mut ibv_context, port: u8, attr: *mut _compat_ibv_port_attr) -> c_int {
    // SAFETY: a context pointer of the caller; checked against the live set.
    if unsafe { context(ctx) }.is_none() || attr.is_null() {
        return libc::EINVAL;
    }
    if port != 1 {
        return libc::EINVAL;
    }
    // SAFETY: plain data; zero is valid.
    let mut a: ibv_port_attr = unsafe { std::mem::zeroed() };
    a.state = rdma_sys::ibv_port_state::IBV_PORT_ACTIVE;
    a.max_mtu = rdma_sys::ibv_mtu::IBV_MTU_4096;
    a.active_mtu = rdma_sys::ibv_mtu::IBV_MTU_4096;
    a.gid_tbl_len = 1;
    a.port_cap_flags = 0;
    a.max_msg_sz = 1 << 31;
    a.pkey_tbl_len = 1;
    a.lid = PORT_LID;
    a.sm_lid = PORT_LID;
    a.max_vl_num = 1; // VL0 only
    a.active_width = 2; // 4x
    a.active_speed = 32; // EDR
    a.phys_state = 5; // LinkUp
    a.link_layer = 1; // IBV_LINK_LAYER_INFINIBAND
    // Programs built against older headers pass the older, smaller struct: it has every field up to
    // `link_layer`, then padding to the same 4-byte alignment, so the whole of today's struct fits.
    // SAFETY: `attr` is the caller's port attribute struct, at least `offset_of(flags)` bytes long.
    unsafe { std::ptr::copy_nonoverlapping(std::ptr::addr_of!(a).cast::<u8>(), attr.cast::<u8>(), std::mem::offset_of!(ibv_port_attr, flags)) };
    0
}

fn port_gid() -> ibv_gid {
    let mut raw = [0u8; 16];
    raw[0] = 0xfe;
    raw[1] = 0x80;
    raw[8..].copy_from_slice(&NODE_GUID.to_be_bytes());
    ibv_gid { raw }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(ctx: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> c_int {
    // SAFETY: a context pointer of the caller; checked against the live set.
    if unsafe { context(ctx) }.is_none() || gid.is_null() || port != 1 || index != 0 {
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: a non-NULL out-pointer of the caller.
    unsafe { gid.write(port_gid()) };
    0
}

fn gid_entry(out: *mut ibv_gid_entry) {
    // SAFETY: plain data; zero is valid.
    let mut e: ibv_gid_entry = unsafe { std::mem::zeroed() };
    e.gid = port_gid();
    e.gid_index = 0;
    e.port_num = 1;
    e.gid_type = 0; // IBV_GID_TYPE_IB
    // SAFETY: the caller's entry, checked non-NULL by the callers below.
    unsafe { out.write(e) };
}

/// `ibv_query_gid_ex` (behind libibverbs' inline of that name).
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(ctx: *mut ibv_context, port: u32, index: u32, entry: *mut ibv_gid_entry, flags: u32, size: usize) -> c_int {
    // SAFETY: a context pointer of the caller; checked against the live set.
    if unsafe { context(ctx) }.is_none() || entry.is_null() || flags != 0 || size < std::mem::size_of::<ibv_gid_entry>() {
        return libc::EINVAL;
    }
    if port != 1 || index != 0 {
        return libc::ENODATA;
    }
    gid_entry(entry);
    0
}

/// `ibv_query_gid_table` (behind libibverbs' inline of that name): one entry.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(ctx: *mut ibv_context, entries: *mut ibv_gid_entry, max: usize, flags: u32, size: usize) -> isize {
    // SAFETY: a context pointer of the caller; checked against the live set.
    if unsafe { context(ctx) }.is_none() || flags != 0 || size < std::mem::size_of::<ibv_gid_entry>() {
        return -(libc::EINVAL as isize);
    }
    if max == 0 || entries.is_null() {
        return -(libc::EINVAL as isize);
    }
    gid_entry(entries);
    1
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(ctx: *mut ibv_context, port: u8, index: c_int, pkey: *mut u16) -> c_int {
    // SAFETY: a context pointer of the caller; checked against the live set.
    if unsafe { context(ctx) }.is_none() || pkey.is_null() || port != 1 || index != 0 {
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: a non-NULL out-pointer of the caller.
    unsafe { *pkey = 0xffffu16.to_be() };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(ctx: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    // SAFETY: a context pointer of the caller; checked against the live set.
    if unsafe { context(ctx) }.is_none() || port != 1 || u16::from_be(pkey) & 0x7fff != 0x7fff {
        return -1;
    }
    0
}

/// Leaks a descriptor into a raw fd the program sees (a channel's `fd`); closed by `close_raw`.
pub fn into_raw(fd: OwnedFd) -> c_int {
    fd.into_raw_fd()
}

pub fn close_raw(fd: c_int) {
    // SAFETY: a descriptor `into_raw` handed out, closed once by the object that owns it.
    unsafe { libc::close(fd) };
}

/// Whether the daemon is gone for this context.
pub fn fatal_once(c: &Context) -> bool {
    !c.fatal_reported.swap(true, Ordering::Relaxed)
}

/// `ibv_query_gid_type` (libibverbs' private symbol, used by `ibv_devinfo`): the one GID is an InfiniBand GID.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(ctx: *mut ibv_context, port: u8, index: u32, gid_type: *mut u32) -> c_int {
    // SAFETY: a context pointer of the caller; checked against the live set.
    if unsafe { context(ctx) }.is_none() || gid_type.is_null() || port != 1 || index != 0 {
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: a non-NULL out-pointer of the caller.
    unsafe { *gid_type = 0 }; // IBV_GID_TYPE_SYSFS_IB_ROCE_V1: an IB GID
    0
}
