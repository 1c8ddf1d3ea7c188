//! Memory regions (as rxe's `rxe_mr.c`): registration, keys, invalidation (dereg, LocalInv, SEND_WITH_INV)
//! with the "MR invalidated while in use" check, and DMA through lkeys and rkeys.

use std::ffi::c_void;
use std::sync::Arc;

use rdma_sys::{ibv_access_flags, ibv_mr};

use crate::{Error, Result};
use super::{Model, key};
use super::qp::QpModel;
use super::super::memory::Memory;
use super::super::{SQD_SIM_VIOLATION_MR_IN_USE, violation_kind_str};
use super::wr::Sge;

const LOCAL_WRITE: u32 = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
pub(super) const REMOTE_WRITE: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
pub(super) const REMOTE_READ: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
pub(super) const REMOTE_ATOMIC: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;

pub(super) struct MrModel {
    pub(super) obj: *mut ibv_mr,
    pub(super) addr: u64,
    pub(super) len: u64,
    access: u32,
    /// False once invalidated (LocalInv, SEND_WITH_INV); the object lives until deregistration.
    valid: bool,
    /// Where the registered bytes live: `None` for this process's memory, else another process's, reached
    /// through the `Memory` given at registration (the device daemon's clients).
    mem: Option<Arc<dyn Memory>>,
}

impl Drop for MrModel {
    fn drop(&mut self) {
        // SAFETY: `obj` came from `Box::into_raw` in `Model::reg_mr` and is freed only here, once.
        drop(unsafe { Box::from_raw(self.obj) });
    }
}

impl MrModel {
    fn covers(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|end| end <= self.addr + self.len)
    }
}

impl Model {
    pub(crate) fn owns_mr(&self, mr: *mut ibv_mr) -> bool {
        self.mr_by_obj.contains_key(&key(mr))
    }

    pub(crate) fn reg_mr(&mut self, addr: *mut c_void, len: usize, access: u32) -> Result<*mut ibv_mr> {
        self.reg_mr_in(None, addr, len, access)
    }

    /// Registers `[addr, addr + len)` of `mem` (`None`: this process's memory).
    pub(crate) fn reg_mr_in(&mut self, mem: Option<Arc<dyn Memory>>, addr: *mut c_void, len: usize, access: u32) -> Result<*mut ibv_mr> {
        if addr.is_null() && len > 0 {
            return Err(Error::invalid("addr is NULL"));
        }
        if access & (REMOTE_WRITE | REMOTE_ATOMIC) != 0 && access & LOCAL_WRITE == 0 {
            return Err(Error::invalid("IBV_ACCESS_REMOTE_WRITE and REMOTE_ATOMIC need IBV_ACCESS_LOCAL_WRITE"));
        }
        if (addr as u64).checked_add(len as u64).is_none() {
            return Err(Error::invalid("addr + len overflows"));
        }
        let k = self.next_key;
        self.next_key = self.next_key.checked_add(0x101).ok_or_else(|| Error::new(libc::ENOSPC, "sim ran out of MR keys"))?;
        let obj = Box::into_raw(Box::new(ibv_mr {
            context: self.ctx,
            pd: self.pd,
            addr,
            length: len,
            handle: k,
            lkey: k,
            rkey: k,
        }));
        self.mrs.insert(k, MrModel { obj, addr: addr as u64, len: len as u64, access, valid: true, mem });
        self.mr_by_obj.insert(key(obj), k);
        Ok(obj)
    }

    /// The first unfinished send WQE (of `extra` or any live QP) whose SGEs use `mr_key`.
    fn mr_user(&self, extra: Option<&QpModel>, mr_key: u32) -> Option<(u32, u64, u64)> {
        extra.into_iter().chain(self.live_qps()).find_map(|q| {
            q.sq.iter().find(|w| !w.done && w.inline.is_none() && w.sges.iter().any(|s| s.lkey == mr_key)).map(|w| (q.qpn, w.index, w.wr_id))
        })
    }

    /// Logs an "MR invalidated while in use" violation if an unfinished WQE references `mr_key`.
    fn check_mr_unused(&mut self, q: Option<&mut QpModel>, mr_key: u32, what: &str) {
        let user = self.mr_user(q.as_deref(), mr_key);
        if let Some((qpn, index, wr_id)) = user {
            let text = format!(
                "{}: {what} key {mr_key:#x} while send WQE #{index} (wr_id {wr_id:#x}) of qp {qpn:#x} still references \
                 it and the HCA is not finished with it (it may be (re)transmitted)",
                violation_kind_str(SQD_SIM_VIOLATION_MR_IN_USE)
            );
            // Recorded against the QP whose WQE is affected.
            let q_user = match q {
                Some(x) if x.qpn == qpn => Some(x),
                _ => None,
            };
            if let Some(x) = q_user {
                self.violation(Some(x), SQD_SIM_VIOLATION_MR_IN_USE, Some(index), text);
            } else if let Some(&slot) = self.qp_by_num.get(&qpn) {
                let mut other = self.qps[slot].take();
                self.violation(other.as_mut(), SQD_SIM_VIOLATION_MR_IN_USE, Some(index), text);
                self.qps[slot] = other;
            }
        }
    }

    pub(crate) fn dereg_mr(&mut self, mr: *mut ibv_mr) -> Result<()> {
        let k = *self.mr_by_obj.get(&key(mr)).ok_or_else(|| Error::invalid(format!("mr {mr:p} is not an MR of this sim device")))?;
        self.check_mr_unused(None, k, "ibv_dereg_mr deregistered");
        self.mr_by_obj.remove(&key(mr));
        self.mrs.remove(&k);
        Ok(())
    }

    /// Invalidates the MR whose rkey is `rkey`; false if there is none valid.
    pub(super) fn invalidate(&mut self, q: Option<&mut QpModel>, rkey: u32, what: &str) -> bool {
        if !self.mrs.get(&rkey).is_some_and(|m| m.valid) {
            return false;
        }
        self.check_mr_unused(q, rkey, what);
        if let Some(m) = self.mrs.get_mut(&rkey) {
            m.valid = false;
        }
        true
    }

    /// DMA read through lkeys: every SGE must lie in a valid MR (IBA: local protection checks at the time the
    /// HCA accesses the memory).
    pub(super) fn dma_read(&mut self, sges: &[Sge]) -> std::result::Result<Vec<u8>, String> {
        let total: usize = sges.iter().map(|s| s.len as usize).sum();
        let mut out: Vec<u8> = Vec::with_capacity(total);
        for s in sges.iter().filter(|s| s.len > 0) {
            match self.mrs.get(&s.lkey) {
                Some(m) if m.valid && m.covers(s.addr, u64::from(s.len)) => {}
                Some(m) if !m.valid => return Err(format!("lkey {:#x} was invalidated", s.lkey)),
                Some(_) => return Err(format!("SGE [{:#x}, +{}) is outside the MR of lkey {:#x}", s.addr, s.len, s.lkey)),
                None => return Err(format!("lkey {:#x} is not registered", s.lkey)),
            }
            let at = out.len();
            out.resize(at + s.len as usize, 0);
            if !self.mr_read(s.lkey, s.addr, &mut out[at..]) {
                return Err(format!("the memory of lkey {:#x} at [{:#x}, +{}) could not be read (its process is gone)", s.lkey, s.addr, s.len));
            }
        }
        self.stats.bytes_read += total as u64;
        Ok(out)
    }

    /// DMA write (scatter) through lkeys that must allow local write.
    pub(super) fn dma_scatter(&mut self, sges: &[Sge], data: &[u8]) -> bool {
        let mut left = data.len() as u64;
        for s in sges {
            if left == 0 {
                break;
            }
            let n = left.min(u64::from(s.len));
            if !self.mrs.get(&s.lkey).is_some_and(|m| m.valid && m.access & LOCAL_WRITE != 0 && m.covers(s.addr, n)) {
                return false;
            }
            left -= n;
        }
        if left > 0 {
            return false;
        }
        let mut off = 0usize;
        for s in sges {
            if off == data.len() {
                break;
            }
            let n = (data.len() - off).min(s.len as usize);
            if !self.mr_write(s.lkey, s.addr, &data[off..off + n]) {
                return false;
            }
            off += n;
        }
        self.stats.bytes_written += data.len() as u64;
        true
    }

    /// The responder's rkey check (IBA 9.7.4.1.3 style: key valid, range inside the region, access allowed).
    pub(super) fn remote_ok(&self, rkey: u32, addr: u64, len: u64, access: u32) -> bool {
        self.mrs.get(&rkey).is_some_and(|m| m.valid && m.access & access != 0 && m.covers(addr, len))
    }
}

impl Model {
    /// Reads `buf.len()` bytes at `addr` of the MR keyed `key`, which the caller has checked covers them.
    /// False if its memory cannot be read (another process's that has gone).
    pub(super) fn mr_read(&self, key: u32, addr: u64, buf: &mut [u8]) -> bool {
        match self.mrs.get(&key) {
            Some(m) if !m.covers(addr, buf.len() as u64) => false,
            Some(MrModel { mem: Some(mem), .. }) => mem.read(addr, buf),
            Some(_) => {
                // SAFETY: `[addr, addr + len)` lies inside a valid MR of this process's memory, which its
                // registrant keeps readable while registered (`reg_mr` contract); `buf` holds `len` bytes.
                unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), buf.len()) };
                true
            }
            _ => false,
        }
    }

    /// Writes `data` at `addr` of the MR keyed `key`, which the caller has checked covers it and allows the
    /// write. False if its memory cannot be written.
    pub(super) fn mr_write(&self, key: u32, addr: u64, data: &[u8]) -> bool {
        match self.mrs.get(&key) {
            Some(m) if !m.covers(addr, data.len() as u64) => false,
            Some(MrModel { mem: Some(mem), .. }) => mem.write(addr, data),
            Some(_) => {
                // SAFETY: `[addr, addr + len)` lies inside a valid MR of this process's memory registered with a
                // write permission, which its registrant keeps writable while registered; `data` is in bounds.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) };
                true
            }
            None => false,
        }
    }
}
