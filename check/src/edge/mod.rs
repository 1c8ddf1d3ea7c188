//! The FFI edge: the only code that dereferences verbs pointers or reads the ULP's memory.

pub mod api;
pub mod interpose;
pub mod ops;
pub mod output;
pub mod state;
