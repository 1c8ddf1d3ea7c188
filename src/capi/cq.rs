//! C API: cq.
