//! The checker's logic: what the ULP did, as plain data, against the four rules. No pointer is dereferenced
//! here; the FFI edge ([`crate::edge`]) reads the verbs structures and memory and hands over values.
#![forbid(unsafe_code)]

pub mod config;
pub mod hash;
pub mod kind;
pub mod log;
pub mod model;
