//! C API: queue.
