//! Work requests as the ops layer copies them out of the caller's `ibv_send_wr` / `ibv_recv_wr` chains: the
//! model never reads the caller's WR structures itself.

/// One scatter/gather element, copied at post time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// One send work request, copied out of the caller's `ibv_send_wr` by the ops layer.
pub(crate) struct SendRequest {
    pub wr_id: u64,
    pub opcode: u32,
    pub flags: u32,
    pub num_sge: i32,
    /// `num_sge > 0` with a NULL `sg_list`.
    pub null_sg_list: bool,
    /// The SGEs (empty in null mode or when `num_sge` is out of range).
    pub sges: Vec<Sge>,
    /// Sum of the SGE lengths (as far as they were read).
    pub total_len: u64,
    /// Inline data copied at post time (`IBV_SEND_INLINE` within `max_inline_data`).
    pub inline: Option<Vec<u8>>,
    pub remote_addr: u64,
    pub rkey: u32,
    /// `imm_data` (network byte order) or `invalidate_rkey`: the same field of the WR.
    pub imm: u32,
    pub compare_add: u64,
    pub swap: u64,
}

/// One receive work request, copied by the ops layer.
pub(crate) struct RecvRequest {
    pub wr_id: u64,
    pub num_sge: i32,
    pub null_sg_list: bool,
    pub sges: Vec<Sge>,
}
