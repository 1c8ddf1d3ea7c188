//! Earlier versions of C functions, kept for binaries linked against an earlier release.
//!
//! The export map (`sqdisc.map`) gives each function the version node of the release that added it. When a
//! release changes what a function does to memory its caller owns, the earlier behaviour stays exported
//! under the earlier node, as an older version of the same name. A binary linked against 0.1.0, whose
//! references carry no version (0.1.0's exports had none), binds to the oldest version of a name, so it gets
//! the function it was built for; a binary linked since gets the default version.
//!
//! The versions are given by `.symver` directives, assembled only into the build that links libsqdisc.so
//! with the export map (the Makefile sets `--cfg sqdisc_symbol_versions`): a library linked without the map
//! has no node to put them in. The map lists such a name in every node that has a version of it.

use std::ptr;

use super::handle::sqd_queue;
use super::queue::sqd_queue_stats;
use crate::queue::QueueStats;

/// The size of `struct sqd_queue_stats` in 0.1.0: the fields up to `bytes`. 0.2.0 appended
/// `provider_refused` and `provider_refused_errno`.
pub(crate) const QUEUE_STATS_0_1_SIZE: usize = std::mem::offset_of!(QueueStats, provider_refused);
const _: () = assert!(QUEUE_STATS_0_1_SIZE == 184, "0.1.0's struct sqd_queue_stats is 184 bytes");

/// `sqd_queue_stats@SQDISC_0`: fills the 0.1.0 struct (184 bytes) and not a byte beyond it, where the
/// current function would write the 0.2.0 fields over whatever the caller keeps after its smaller struct.
#[no_mangle]
pub extern "C" fn sqdisc_queue_stats_0_1(q: *const sqd_queue, out: *mut u8) -> i32 {
    if out.is_null() {
        // The same checks and message as the current version.
        return sqd_queue_stats(q, ptr::null_mut());
    }
    let mut now = QueueStats::default();
    let ret = sqd_queue_stats(q, &mut now);
    if ret == 0 {
        // SAFETY: a caller of this version passes a 0.1.0 `struct sqd_queue_stats`, QUEUE_STATS_0_1_SIZE
        // writable bytes, whose layout is the prefix of the current struct; `now` is larger than that.
        unsafe { ptr::copy_nonoverlapping(ptr::from_ref(&now).cast::<u8>(), out, QUEUE_STATS_0_1_SIZE) };
    }
    ret
}

// The current function becomes the default version (`@@@` renames it, so that the map cannot also give the
// plain name the first node that lists it), the 0.1.0 one the older version. The Makefile's archive step
// undoes both: a static link has no versions.
#[cfg(sqdisc_symbol_versions)]
std::arch::global_asm!(
    ".symver sqd_queue_stats, sqd_queue_stats@@@SQDISC_0.2",
    ".symver sqdisc_queue_stats_0_1, sqd_queue_stats@SQDISC_0",
);
