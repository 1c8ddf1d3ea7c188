//! What each send opcode does: whether it is answered with data (READ, atomics), executes locally (LocalInv),
//! carries a payload read from the SGEs, and which work-completion opcode it completes with.

use rdma_sys::{ibv_wc_opcode, ibv_wr_opcode};

pub(super) fn is_read_or_atomic(op: u32) -> bool {
    matches!(op, ibv_wr_opcode::IBV_WR_RDMA_READ | ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP | ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD)
}

pub(super) fn is_atomic(op: u32) -> bool {
    matches!(op, ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP | ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD)
}

pub(super) fn is_local(op: u32) -> bool {
    op == ibv_wr_opcode::IBV_WR_LOCAL_INV
}

/// Opcodes whose payload is read from the SGEs at (re)transmission.
pub(super) fn carries_data(op: u32) -> bool {
    matches!(
        op,
        ibv_wr_opcode::IBV_WR_SEND
            | ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
            | ibv_wr_opcode::IBV_WR_SEND_WITH_INV
            | ibv_wr_opcode::IBV_WR_RDMA_WRITE
            | ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
    )
}

/// The work-completion opcode of a successful send WQE, or `None` for an opcode the model does not support.
pub(super) fn wc_opcode(wr_opcode: u32) -> Option<u32> {
    use ibv_wc_opcode::*;
    use ibv_wr_opcode::*;
    Some(match wr_opcode {
        IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_SEND_WITH_INV => IBV_WC_SEND,
        IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => IBV_WC_RDMA_WRITE,
        IBV_WR_RDMA_READ => IBV_WC_RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP => IBV_WC_COMP_SWAP,
        IBV_WR_ATOMIC_FETCH_AND_ADD => IBV_WC_FETCH_ADD,
        IBV_WR_LOCAL_INV => IBV_WC_LOCAL_INV,
        _ => return None,
    })
}
