//! Fallible allocation: storage whose size the caller chooses (depths, SGE and inline limits, the number of
//! objects and deferred actions) is allocated with `try_reserve`, so that running out of memory is an
//! `ENOMEM` error naming the bytes asked for, not an abort of the process.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use crate::error::{Error, Result};

/// The error for `bytes` bytes of `what` that could not be allocated.
pub(crate) fn out_of_memory(bytes: usize, what: &str) -> Error {
    Error::new(libc::ENOMEM, format!("cannot allocate {bytes} bytes for {what}"))
}

/// Bytes of `n` values of `T` (saturating: a count that overflows is as unallocatable as it is large).
pub(crate) fn bytes_of<T>(n: usize) -> usize {
    n.saturating_mul(std::mem::size_of::<T>())
}

/// An empty vector with room for exactly `n` values.
pub(crate) fn vec_with_capacity<T>(n: usize, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| out_of_memory(bytes_of::<T>(n), what))?;
    Ok(v)
}

/// `n` copies of `value`.
pub(crate) fn boxed_slice<T: Clone>(n: usize, value: T, what: &str) -> Result<Box<[T]>> {
    let mut v = vec_with_capacity(n, what)?;
    v.resize(n, value);
    Ok(v.into_boxed_slice())
}

/// Room in `v` for `more` values beyond its length.
pub(crate) fn reserve<T>(v: &mut Vec<T>, more: usize, what: &str) -> Result<()> {
    v.try_reserve(more).map_err(|_| out_of_memory(bytes_of::<T>(v.len().saturating_add(more)), what))
}

/// Room in `v` for `more` values beyond its length.
pub(crate) fn reserve_deque<T>(v: &mut VecDeque<T>, more: usize, what: &str) -> Result<()> {
    v.try_reserve(more).map_err(|_| out_of_memory(bytes_of::<T>(v.len().saturating_add(more)), what))
}

/// Room in `m` for `more` entries beyond its length.
pub(crate) fn reserve_map<K: Eq + Hash, V>(m: &mut HashMap<K, V>, more: usize, what: &str) -> Result<()> {
    m.try_reserve(more).map_err(|_| out_of_memory(bytes_of::<(K, V)>(m.len().saturating_add(more)), what))
}

/// `Box::new(value)`, or `ENOMEM` when the allocation fails. For the C API's handles.
#[cfg(any(feature = "capi", test))]
pub(crate) fn boxed<T>(value: T, what: &str) -> Result<Box<T>> {
    let layout = std::alloc::Layout::new::<T>();
    if layout.size() == 0 {
        return Ok(Box::new(value));
    }
    // SAFETY: the layout has a nonzero size, as `alloc` requires.
    let p = unsafe { std::alloc::alloc(layout) }.cast::<T>();
    if p.is_null() {
        return Err(out_of_memory(layout.size(), what));
    }
    // SAFETY: `p` is a fresh allocation of the global allocator with `T`'s layout, so writing a `T` into it and
    // owning it as a `Box<T>` (which frees it with the same layout) is what `Box::new` does.
    unsafe {
        p.write(value);
        Ok(Box::from_raw(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_impossible_size_is_enomem_naming_the_bytes() {
        let e = vec_with_capacity::<u64>(usize::MAX / 4, "a test").unwrap_err();
        assert_eq!(e.errno(), libc::ENOMEM);
        assert!(e.message().contains(&format!("{} bytes for a test", usize::MAX)), "{}", e.message());
        let b = boxed_slice(3, 7u16, "three").unwrap();
        assert_eq!(&*b, &[7, 7, 7]);
        assert_eq!(*boxed(5u32, "one").unwrap(), 5);
    }
}
