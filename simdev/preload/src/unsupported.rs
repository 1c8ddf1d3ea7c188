//! What the sim device does not have: unreliable datagrams (address handles) and multicast. Each call fails
//! as a device without the feature fails it, with a message that says so.

use std::ffi::c_int;

use rdma_sys::{ibv_ah, ibv_ah_attr, ibv_context, ibv_gid, ibv_grh, ibv_pd, ibv_qp, ibv_wc};

use crate::set_errno;

fn refuse(name: &str) {
    eprintln!("sqdisc-sim: {name}: the sim device models RC QPs only (no UD address handles, no multicast)");
    set_errno(libc::EOPNOTSUPP);
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(_pd: *mut ibv_pd, _attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    refuse("ibv_create_ah");
    std::ptr::null_mut()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(_pd: *mut ibv_pd, _wc: *mut ibv_wc, _grh: *mut ibv_grh, _port: u8) -> *mut ibv_ah {
    refuse("ibv_create_ah_from_wc");
    std::ptr::null_mut()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(_ctx: *mut ibv_context, _port: u8, _wc: *mut ibv_wc, _grh: *mut ibv_grh, _attr: *mut ibv_ah_attr) -> c_int {
    refuse("ibv_init_ah_from_wc");
    -1
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(_ah: *mut ibv_ah) -> c_int {
    libc::EINVAL
}

#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    refuse("ibv_attach_mcast");
    libc::EOPNOTSUPP
}

#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    refuse("ibv_detach_mcast");
    libc::EOPNOTSUPP
}
