//! A software device's `struct ibv_context`, and how a verbs op finds the device from it.
//!
//! The context handed out is the first field of a `repr(C)` [`ContextObj`], so the op's `context` pointer is also
//! a pointer to it. Whether a context is one of ours is decided without reading past `struct ibv_context`:
//! its `abi_compat` holds the address of a static of the device kind (which also makes libibverbs' extended
//! verbs report "not supported", true of devices with only the data-path ops), and only then is the magic
//! number after it read.

use std::ffi::c_void;

use rdma_sys::ibv_context;

/// What marks a context as one device kind's: a static whose (unique) address goes in `abi_compat`, and a
/// number checked after that matches.
pub(crate) struct ContextMark {
    pub sentinel: &'static u8,
    pub magic: u64,
}

impl ContextMark {
    fn sentinel(&self) -> *const c_void {
        std::ptr::from_ref(self.sentinel).cast()
    }
}

/// A device's `ibv_context` and the way back to the device.
#[repr(C)]
pub(crate) struct ContextObj<D> {
    ctx: ibv_context,
    magic: u64,
    device: *const D,
}

impl<D> ContextObj<D> {
    /// `ctx`, marked with `mark`, on the heap, not yet tied to a device ([`ContextObj::tie`]); freed by
    /// `Box::from_raw`.
    pub fn boxed(mut ctx: ibv_context, mark: &ContextMark) -> *mut ContextObj<D> {
        ctx.abi_compat = mark.sentinel().cast_mut();
        Box::into_raw(Box::new(ContextObj { ctx, magic: mark.magic, device: std::ptr::null() }))
    }

    /// Ties the context to its device, which must not move while the context is in use.
    ///
    /// # Safety
    /// `obj` came from [`ContextObj::boxed`] and is not in use by another thread; `device` is pinned and outlives
    /// every use of the context.
    pub unsafe fn tie(obj: *mut ContextObj<D>, device: &D) {
        // SAFETY: as the caller promises.
        unsafe { (*obj).device = device };
    }

    /// The device of `ctx`, if `ctx` is a context of `mark`'s kind tied to one.
    ///
    /// # Safety
    /// `ctx` is NULL or points to a live `struct ibv_context`; when it is of `mark`'s kind, its device outlives
    /// `'a`.
    pub unsafe fn device<'a>(ctx: *mut ibv_context, mark: &ContextMark) -> Option<&'a D> {
        if ctx.is_null() {
            return None;
        }
        // SAFETY: the caller promises `ctx` points to a live context; only `abi_compat`, present in every
        // `struct ibv_context`, is read before the context is known to be ours.
        if !std::ptr::eq(unsafe { (*ctx).abi_compat }.cast_const(), mark.sentinel()) {
            return None;
        }
        let obj = ctx.cast::<ContextObj<D>>();
        // SAFETY: `abi_compat` is the kind's sentinel, so `ctx` is the first field of a `ContextObj<D>` made by
        // `boxed`.
        let (magic, device) = unsafe { ((*obj).magic, (*obj).device) };
        if magic != mark.magic || device.is_null() {
            return None;
        }
        // SAFETY: `device` was tied by `tie` to the pinned device, alive for `'a` as the caller promises.
        Some(unsafe { &*device })
    }
}
