//! PDs, MRs, completion channels, CQs and SRQs. Each object is the verbs struct the program sees, followed by
//! the daemon's id for it; the struct comes first, so the program's pointer is the object's.

use std::ffi::{c_int, c_void};

use rdma_sys::{ibv_comp_channel, ibv_context, ibv_cq, ibv_mr, ibv_pd, ibv_srq, ibv_srq_attr, ibv_srq_init_attr};
use sqdisc_sim_proto::{Reply, Request};

use crate::context::{context, context_fast, Context};
use crate::{guarded, report, set_errno};

#[repr(C)]
pub struct Mr {
    pub mr: ibv_mr,
    pub id: u64,
}

#[repr(C)]
pub struct Channel {
    pub ch: ibv_comp_channel,
    pub id: u64,
}

#[repr(C)]
pub struct Cq {
    pub cq: ibv_cq,
    pub id: u64,
    /// How many CQEs the CQ holds, published by the daemon: a poll asks the daemon only when it is not 0.
    pub queued: Option<sqdisc_sim_proto::SharedCounter>,
}

#[repr(C)]
pub struct Srq {
    pub srq: ibv_srq,
    pub id: u64,
    pub max_wr: u32,
    pub max_sge: u32,
    /// Receives posted and receive completions of its QPs polled (as `qp::Mirror`).
    pub mirror: std::sync::Mutex<(u64, u64)>,
}

/// The context of a PD, checked live.
///
/// # Safety
/// `pd` is NULL or a PD of this library.
pub unsafe fn pd_context<'a>(pd: *mut ibv_pd) -> Option<&'a Context> {
    if pd.is_null() {
        return None;
    }
    // SAFETY: a PD this library made; its context is checked against the live set.
    unsafe { context((*pd).context) }
}

fn unexpected(name: &str, reply: Reply) {
    eprintln!("sqdisc-sim: {name}: unexpected answer {reply:?}");
    set_errno(libc::EPROTO);
}

#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    // SAFETY: a context pointer of the caller; checked against the live set.
    if unsafe { context(ctx) }.is_none() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // The sim has one protection domain: a PD is the program's own record.
    Box::into_raw(Box::new(ibv_pd { context: ctx, handle: 1 }))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    // SAFETY: a PD pointer of the caller.
    if unsafe { pd_context(pd) }.is_none() {
        return libc::EINVAL;
    }
    // SAFETY: made by `Box::into_raw` in `ibv_alloc_pd`; the caller frees it once.
    drop(unsafe { Box::from_raw(pd) });
    0
}

fn reg(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: c_int) -> *mut ibv_mr {
    guarded("ibv_reg_mr", std::ptr::null_mut(), || {
        // SAFETY: a PD pointer of the caller.
        let Some(c) = (unsafe { pd_context(pd) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        let request = Request::RegMr { addr: addr as u64, length: length as u64, iova, access: access as u32 };
        match c.conn.ask(&request) {
            Ok(Reply::Mr { mr, lkey, rkey }) => {
                // SAFETY: a PD of a live context.
                let context = unsafe { (*pd).context };
                let obj = Mr { mr: ibv_mr { context, pd, addr, length, handle: lkey, lkey, rkey }, id: mr };
                Box::into_raw(Box::new(obj)).cast()
            }
            Ok(other) => {
                unexpected("ibv_reg_mr", other);
                std::ptr::null_mut()
            }
            Err(f) => {
                report("ibv_reg_mr", &f);
                std::ptr::null_mut()
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr {
    reg(pd, addr, length, addr as u64, access)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: c_int) -> *mut ibv_mr {
    reg(pd, addr, length, iova, access)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: u32) -> *mut ibv_mr {
    // The optional access bits (relaxed ordering, ...) change nothing in the model.
    let access = access & 0x000f_ffff;
    reg(pd, addr, length, iova, access as c_int)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(_pd: *mut ibv_pd, _offset: u64, _length: usize, _iova: u64, _fd: c_int, _access: c_int) -> *mut ibv_mr {
    eprintln!("sqdisc-sim: ibv_reg_dmabuf_mr: dma-buf memory is not supported by the sim device");
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guarded("ibv_dereg_mr", libc::EIO, || {
        if mr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: an MR of this library (the caller's contract); its context is checked live.
        let Some(c) = (unsafe { context((*mr).context) }) else { return libc::EINVAL };
        let obj = mr.cast::<Mr>();
        // SAFETY: an MR this library made: a `Mr` whose first field is the `ibv_mr`.
        let id = unsafe { (*obj).id };
        match c.conn.ask(&Request::DeregMr { mr: id }) {
            Ok(_) | Err(crate::conn::Failure { errno: libc::EIO, .. }) => {
                // SAFETY: made by `Box::into_raw` in `reg`; freed once, here.
                drop(unsafe { Box::from_raw(obj) });
                0
            }
            Err(f) => {
                report("ibv_dereg_mr", &f);
                f.errno
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    guarded("ibv_create_comp_channel", std::ptr::null_mut(), || {
        // SAFETY: a context pointer of the caller; checked against the live set.
        let Some(c) = (unsafe { context(ctx) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        match c.conn.ask_fd(&Request::CreateCompChannel) {
            Ok((Reply::Channel { channel }, Some(fd))) => {
                let fd = crate::context::into_raw(fd);
                Box::into_raw(Box::new(Channel { ch: ibv_comp_channel { context: ctx, fd, refcnt: 0 }, id: channel })).cast()
            }
            Ok((other, _)) => {
                unexpected("ibv_create_comp_channel", other);
                std::ptr::null_mut()
            }
            Err(f) => {
                report("ibv_create_comp_channel", &f);
                std::ptr::null_mut()
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    guarded("ibv_destroy_comp_channel", -1, || {
        if ch.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: a channel of this library (the caller's contract).
        let (ctx, refcnt, id, fd) = unsafe { ((*ch).context, (*ch).refcnt, (*ch.cast::<Channel>()).id, (*ch).fd) };
        // SAFETY: checked against the live set.
        let Some(c) = (unsafe { context(ctx) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if refcnt > 0 {
            set_errno(libc::EBUSY);
            return -1;
        }
        match c.conn.ask(&Request::DestroyCompChannel { channel: id }) {
            Ok(_) | Err(crate::conn::Failure { errno: libc::EIO, .. }) => {
                crate::context::close_raw(fd);
                // SAFETY: made by `Box::into_raw` in `ibv_create_comp_channel`; freed once.
                drop(unsafe { Box::from_raw(ch.cast::<Channel>()) });
                0
            }
            Err(f) => {
                report("ibv_destroy_comp_channel", &f);
                -1
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(ctx: *mut ibv_context, cqe: c_int, cq_context: *mut c_void, channel: *mut ibv_comp_channel, comp_vector: c_int) -> *mut ibv_cq {
    guarded("ibv_create_cq", std::ptr::null_mut(), || {
        // SAFETY: a context pointer of the caller; checked against the live set.
        let Some(c) = (unsafe { context(ctx) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        // SAFETY: a channel of this library or NULL (the caller's contract).
        let channel_id = (!channel.is_null()).then(|| unsafe { (*channel.cast::<Channel>()).id });
        // SAFETY: `ibv_cq` is plain data (pointers, ints, zero-initializable pthread objects): zero is valid.
        let mut obj: Box<Cq> = Box::new(Cq { cq: unsafe { std::mem::zeroed() }, id: 0, queued: None });
        let cookie = std::ptr::addr_of_mut!(obj.cq) as u64;
        match c.conn.ask_fd(&Request::CreateCq { cqe, channel: channel_id, comp_vector, cookie }) {
            Ok((Reply::Cq { cq, cqe }, fd)) => {
                obj.id = cq;
                obj.queued = fd.and_then(|fd| sqdisc_sim_proto::SharedCounter::open(fd).ok());
                obj.cq.context = ctx;
                obj.cq.channel = channel;
                obj.cq.cq_context = cq_context;
                obj.cq.cqe = cqe;
                if !channel.is_null() {
                    // SAFETY: as above; libibverbs counts a channel's CQs in `refcnt`.
                    unsafe { (*channel).refcnt += 1 };
                }
                Box::into_raw(obj).cast()
            }
            Ok((other, _)) => {
                unexpected("ibv_create_cq", other);
                std::ptr::null_mut()
            }
            Err(f) => {
                report("ibv_create_cq", &f);
                std::ptr::null_mut()
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guarded("ibv_resize_cq", libc::EIO, || {
        if cq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a CQ of this library (the caller's contract); its context is checked live.
        let Some(c) = (unsafe { context((*cq).context) }) else { return libc::EINVAL };
        // SAFETY: as above.
        let id = unsafe { (*cq.cast::<Cq>()).id };
        match c.conn.ask(&Request::ResizeCq { cq: id, cqe }) {
            Ok(Reply::Cq { cqe, .. }) => {
                // SAFETY: as above.
                unsafe { (*cq).cqe = cqe };
                0
            }
            Ok(_) => libc::EPROTO,
            Err(f) => {
                report("ibv_resize_cq", &f);
                f.errno
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guarded("ibv_destroy_cq", libc::EIO, || {
        if cq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a CQ of this library (the caller's contract); its context is checked live.
        let Some(c) = (unsafe { context((*cq).context) }) else { return libc::EINVAL };
        // SAFETY: as above.
        let (id, channel) = unsafe { ((*cq.cast::<Cq>()).id, (*cq).channel) };
        match c.conn.ask(&Request::DestroyCq { cq: id }) {
            Ok(_) | Err(crate::conn::Failure { errno: libc::EIO, .. }) => {
                if !channel.is_null() {
                    // SAFETY: the CQ's channel outlives it (libibverbs' rule, `refcnt`).
                    unsafe { (*channel).refcnt -= 1 };
                }
                // SAFETY: made by `Box::into_raw` in `ibv_create_cq`; freed once.
                drop(unsafe { Box::from_raw(cq.cast::<Cq>()) });
                0
            }
            Err(f) => {
                report("ibv_destroy_cq", &f);
                f.errno
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    guarded("ibv_create_srq", std::ptr::null_mut(), || {
        // SAFETY: a PD pointer of the caller.
        let Some(c) = (unsafe { pd_context(pd) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's attribute struct, non-NULL.
        let a = unsafe { &mut *attr };
        // SAFETY: plain data; zero is valid.
        let mut obj: Box<Srq> = Box::new(Srq { srq: unsafe { std::mem::zeroed() }, id: 0, max_wr: 0, max_sge: 0, mirror: Default::default() });
        let cookie = std::ptr::addr_of_mut!(obj.srq) as u64;
        let request = Request::CreateSrq { max_wr: a.attr.max_wr, max_sge: a.attr.max_sge, srq_limit: a.attr.srq_limit, cookie };
        match c.conn.ask(&request) {
            Ok(Reply::Srq { srq, max_wr, max_sge }) => {
                a.attr.max_wr = max_wr;
                a.attr.max_sge = max_sge;
                obj.id = srq;
                obj.max_wr = max_wr;
                obj.max_sge = max_sge;
                // SAFETY: a PD of a live context.
                obj.srq.context = unsafe { (*pd).context };
                obj.srq.srq_context = a.srq_context;
                obj.srq.pd = pd;
                Box::into_raw(obj).cast()
            }
            Ok(other) => {
                unexpected("ibv_create_srq", other);
                std::ptr::null_mut()
            }
            Err(f) => {
                report("ibv_create_srq", &f);
                std::ptr::null_mut()
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    guarded("ibv_modify_srq", libc::EIO, || {
        if srq.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: an SRQ of this library (the caller's contract); its context is checked live.
        let Some(c) = (unsafe { context((*srq).context) }) else { return libc::EINVAL };
        if mask & rdma_sys::ibv_srq_attr_mask::IBV_SRQ_MAX_WR.0 as c_int != 0 {
            eprintln!("sqdisc-sim: ibv_modify_srq: resizing an SRQ is not supported by the sim device");
            return libc::EOPNOTSUPP;
        }
        if mask & rdma_sys::ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as c_int == 0 {
            return 0;
        }
        // SAFETY: as above; the caller's attribute struct.
        let (id, limit) = unsafe { ((*srq.cast::<Srq>()).id, (*attr).srq_limit) };
        match c.conn.ask(&Request::ModifySrq { srq: id, srq_limit: limit }) {
            Ok(_) => 0,
            Err(f) => {
                report("ibv_modify_srq", &f);
                f.errno
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guarded("ibv_query_srq", libc::EIO, || {
        if srq.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: an SRQ of this library (the caller's contract); its context is checked live.
        let Some(c) = (unsafe { context((*srq).context) }) else { return libc::EINVAL };
        // SAFETY: as above.
        let s = unsafe { &*srq.cast::<Srq>() };
        match c.conn.ask(&Request::QuerySrq { srq: s.id }) {
            Ok(Reply::SrqState { srq_limit }) => {
                // SAFETY: the caller's attribute struct, non-NULL.
                unsafe { attr.write(ibv_srq_attr { max_wr: s.max_wr, max_sge: s.max_sge, srq_limit }) };
                0
            }
            Ok(_) => libc::EPROTO,
            Err(f) => {
                report("ibv_query_srq", &f);
                f.errno
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guarded("ibv_destroy_srq", libc::EIO, || {
        if srq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: an SRQ of this library (the caller's contract); its context is checked live.
        let Some(c) = (unsafe { context((*srq).context) }) else { return libc::EINVAL };
        // SAFETY: as above.
        let id = unsafe { (*srq.cast::<Srq>()).id };
        match c.conn.ask(&Request::DestroySrq { srq: id }) {
            Ok(_) | Err(crate::conn::Failure { errno: libc::EIO, .. }) => {
                // SAFETY: made by `Box::into_raw` in `ibv_create_srq`; freed once.
                drop(unsafe { Box::from_raw(srq.cast::<Srq>()) });
                0
            }
            Err(f) => {
                report("ibv_destroy_srq", &f);
                f.errno
            }
        }
    })
}

/// The context of a CQ, for the data path.
///
/// # Safety
/// `cq` is a live CQ of this library.
pub unsafe fn cq_parts<'a>(cq: *mut ibv_cq) -> (&'a Context, &'a Cq) {
    // SAFETY: as the caller promises.
    unsafe { (context_fast((*cq).context), &*cq.cast::<Cq>()) }
}
