//! Send opcodes and flags as the core knows them: the `ibv_wr_opcode` / `ibv_send_flags` values of the verbs
//! ABI (stable numbers from `<infiniband/verbs.h>`), and the work-completion opcode each one yields.

pub const WR_RDMA_WRITE: u32 = 0;
pub const WR_RDMA_WRITE_WITH_IMM: u32 = 1;
pub const WR_SEND: u32 = 2;
pub const WR_SEND_WITH_IMM: u32 = 3;
pub const WR_RDMA_READ: u32 = 4;
pub const WR_ATOMIC_CMP_AND_SWP: u32 = 5;
pub const WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
pub const WR_LOCAL_INV: u32 = 7;
pub const WR_BIND_MW: u32 = 8;
pub const WR_SEND_WITH_INV: u32 = 9;

pub const SEND_FENCE: u32 = 1;
pub const SEND_SIGNALED: u32 = 2;
pub const SEND_SOLICITED: u32 = 4;
pub const SEND_INLINE: u32 = 8;
/// The flags a WR on an RC queue may carry.
pub const SEND_FLAGS_RC: u32 = SEND_FENCE | SEND_SIGNALED | SEND_SOLICITED | SEND_INLINE;

pub const WC_SEND: u8 = 0;
pub const WC_RDMA_WRITE: u8 = 1;
pub const WC_RDMA_READ: u8 = 2;
pub const WC_COMP_SWAP: u8 = 3;
pub const WC_FETCH_ADD: u8 = 4;
pub const WC_BIND_MW: u8 = 5;
pub const WC_LOCAL_INV: u8 = 6;
pub const WC_RECV: u8 = 128;

pub const WC_SUCCESS: u8 = 0;
pub const WC_LOC_QP_OP_ERR: u8 = 2;
pub const WC_WR_FLUSH_ERR: u8 = 5;

/// The work-completion opcode of a send opcode valid on RC, or `None` for anything else.
#[inline]
pub const fn wc_opcode(wr_opcode: u32) -> Option<u8> {
    Some(match wr_opcode {
        WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM => WC_RDMA_WRITE,
        WR_SEND | WR_SEND_WITH_IMM | WR_SEND_WITH_INV => WC_SEND,
        WR_RDMA_READ => WC_RDMA_READ,
        WR_ATOMIC_CMP_AND_SWP => WC_COMP_SWAP,
        WR_ATOMIC_FETCH_AND_ADD => WC_FETCH_ADD,
        WR_LOCAL_INV => WC_LOCAL_INV,
        WR_BIND_MW => WC_BIND_MW,
        _ => return None,
    })
}

/// Whether inline data makes sense for the opcode (it carries local data to the peer).
#[inline]
pub fn allows_inline(wr_opcode: u32) -> bool {
    matches!(wr_opcode, WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM | WR_SEND | WR_SEND_WITH_IMM | WR_SEND_WITH_INV)
}
