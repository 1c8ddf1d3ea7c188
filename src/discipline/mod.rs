//! The discipline core: safe Rust, no FFI types.
