//! The largest sizes a queue or an SRQ accepts.

/// Largest depth (SQ, RQ or backlog) a queue accepts.
pub const MAX_DEPTH: u32 = 1 << 20;
/// Largest `max_send_sge` a queue accepts.
pub const MAX_SGE: u32 = 1024;
/// Largest `max_inline_data` a queue accepts.
pub const MAX_INLINE: u32 = 1 << 16;
