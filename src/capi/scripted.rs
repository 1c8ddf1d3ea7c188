//! C API: scripted.
