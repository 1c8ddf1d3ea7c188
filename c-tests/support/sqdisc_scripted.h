#ifndef SQDISC_SCRIPTED_H
#define SQDISC_SCRIPTED_H

/* Generated from the library's sources by `make header`; do not edit by hand. */

#include <sqdisc.h>

/**
 * A scripted verbs device: a real `struct ibv_context` and `struct ibv_pd`, and the CQs and QPs made on it.
 *
 * The context's ops callbacks find the device through a pointer to it, so it never moves (it is made
 * pinned). Freeing it frees every object it made. Not thread-safe: one thread at a time per device.
 */
struct sqd_scripted;

/**
 * The capabilities of a scripted QP (granted exactly as requested).
 */
struct sqd_scripted_qp_caps {
    /**
     * Send queue depth: 1..=32768.
     */
    uint32_t max_send_wr;
    /**
     * Receive queue depth: 1..=32768.
     */
    uint32_t max_recv_wr;
    /**
     * SGEs per send WR: 1..=64.
     */
    uint32_t max_send_sge;
    /**
     * SGEs per receive WR: 1..=64.
     */
    uint32_t max_recv_sge;
    /**
     * Bytes of inline data per send WR: 0..=4096.
     */
    uint32_t max_inline_data;
};

/**
 * Counters and state of one scripted QP.
 */
struct sqd_scripted_qp_stats {
    /**
     * `post_send` calls that posted at least one WQE.
     */
    uint64_t doorbells;
    /**
     * Send WQEs accepted (including WQEs posted while in error, which flush at once).
     */
    uint64_t wqes_posted;
    /**
     * Accepted send WQEs with `IBV_SEND_SIGNALED`.
     */
    uint64_t signaled_wqes;
    /**
     * Send slots held now: posted, and no CQE at or after them polled yet.
     */
    uint64_t outstanding;
    /**
     * The largest `outstanding` ever reached.
     */
    uint64_t max_outstanding;
    /**
     * Send WQEs executed by `complete` or `fail` (not flushed ones).
     */
    uint64_t executed;
    /**
     * CQEs generated for this QP, send and receive, including CQEs lost to a CQ overrun.
     */
    uint64_t cqes_generated;
    /**
     * `IBV_WC_WR_FLUSH_ERR` CQEs generated for this QP (send and receive).
     */
    uint64_t flushed;
    /**
     * Receive WRs accepted.
     */
    uint64_t recv_posted;
    /**
     * Receive slots held now: posted, and their CQE not polled yet.
     */
    uint64_t recv_outstanding;
    /**
     * Violations recorded against this QP.
     */
    uint64_t violations;
    /**
     * The QP is in the error state.
     */
    bool in_error;
};

/**
 * Counters and state of one scripted CQ.
 */
struct sqd_scripted_cq_stats {
    /**
     * CQEs the CQ holds (its `cqe`).
     */
    uint64_t capacity;
    /**
     * CQEs queued now, not yet polled.
     */
    uint64_t queued;
    /**
     * The largest `queued` ever reached.
     */
    uint64_t max_queued;
    /**
     * CQEs lost because the CQ was full.
     */
    uint64_t overruns;
    /**
     * The CQ overran (a real CQ would now be unusable).
     */
    bool in_error;
    /**
     * `req_notify_cq` calls.
     */
    uint64_t arms;
};

/**
 * A copy of one send WQE as posted, with its fate so far.
 */
struct sqd_scripted_wqe {
    uint64_t wr_id;
    /**
     * `enum ibv_wr_opcode` value.
     */
    uint32_t opcode;
    /**
     * `enum ibv_send_flags` bits.
     */
    uint32_t send_flags;
    int32_t num_sge;
    /**
     * Length of the first SGE (0 when there is none).
     */
    uint32_t first_sge_length;
    /**
     * Address of the first SGE (0 when there is none).
     */
    uint64_t first_sge_addr;
    /**
     * Sum of the lengths of all SGEs.
     */
    uint64_t total_length;
    /**
     * lkey of the first SGE (0 when there is none).
     */
    uint32_t first_sge_lkey;
    /**
     * The WR's `imm_data` (network byte order) or `invalidate_rkey`: the same field.
     */
    uint32_t imm_data;
    /**
     * `wr.rdma.remote_addr`, or `wr.atomic.remote_addr` for atomics.
     */
    uint64_t remote_addr;
    /**
     * `wr.rdma.rkey`, or `wr.atomic.rkey` for atomics.
     */
    uint32_t rkey;
    /**
     * Completion status once `executed` or `flushed` (`enum ibv_wc_status`), else 0.
     */
    uint32_t status;
    /**
     * `wr.atomic.compare_add` for atomics, else 0.
     */
    uint64_t compare_add;
    /**
     * `wr.atomic.swap` for atomics, else 0.
     */
    uint64_t swap;
    /**
     * Posted with `IBV_SEND_SIGNALED`.
     */
    bool signaled;
    /**
     * Executed (successfully, or failed by `fail`).
     */
    bool executed;
    /**
     * Flushed with `IBV_WC_WR_FLUSH_ERR`.
     */
    bool flushed;
};

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * Creates a scripted verbs device: a `struct ibv_context` whose data-path ops (`ibv_post_send`,
 * `ibv_post_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`) run a test-scripted model, and a protection domain.
 *
 * On success stores the device in `*out` and returns 0; the caller owns it and frees it with
 * `sqd_scripted_free`. Errors: `-EINVAL` if `out` is NULL.
 * Not thread-safe: a device and its objects are used by one thread at a time.
 */
int sqd_scripted_new(struct sqd_scripted **out);

/**
 * Frees a device and every CQ, QP and MR made on it. NULL is a no-op (returns 0).
 *
 * Every pointer obtained from the device (context, PD, CQs, QPs) dangles afterwards.
 * Not thread-safe: no other call may use the device or its objects concurrently.
 *
 * Returns 0, or `-EBUSY` while any of its CQs or QPs is still held by a library handle (`sqd_cq`,
 * `sqd_queue`): free those first. The device is then left as it was, still valid.
 */
int sqd_scripted_free(struct sqd_scripted *dev);

/**
 * The device's `struct ibv_context`, owned by the device (valid until `sqd_scripted_free`). Its ops table
 * reaches the model, so libibverbs' inline data-path functions work on the device's objects. Only the
 * data-path ops are set; other verbs must not be called. NULL if `dev` is NULL.
 */
struct ibv_context *sqd_scripted_context(const struct sqd_scripted *dev);

/**
 * The device's protection domain, owned by the device (valid until `sqd_scripted_free`). NULL if `dev` is NULL.
 */
struct ibv_pd *sqd_scripted_pd(const struct sqd_scripted *dev);

/**
 * Creates a CQ holding exactly `cqe` CQEs (`cq->cqe == cqe`). A CQE pushed into a full CQ is lost and
 * recorded as a "CQ overrun" violation.
 *
 * On success stores the CQ in `*out` and returns 0. The device owns the CQ: destroy it with
 * `sqd_scripted_destroy_cq`, or let `sqd_scripted_free` free it. Errors: `-EINVAL` for a NULL argument or
 * `cqe` outside 1..=4194304.
 */
int sqd_scripted_create_cq(const struct sqd_scripted *dev, int cqe, struct ibv_cq **out);

/**
 * Destroys a CQ made by `sqd_scripted_create_cq`.
 *
 * Errors: `-EINVAL` if `cq` is NULL or not a live scripted CQ; `-EBUSY` while a QP uses it (as send or
 * receive CQ) or an `sqd_cq` manages it (`sqd_cq_free` it first). On success `cq` dangles.
 */
int sqd_scripted_destroy_cq(struct ibv_cq *cq);

/**
 * Creates an RC QP in the RTS state (`qp->qp_num` unique and nonzero, `qp->pd`, `qp->send_cq`,
 * `qp->recv_cq` set) with exactly the given caps.
 *
 * On success stores the QP in `*out` and returns 0. The device owns the QP: destroy it with
 * `sqd_scripted_destroy_qp`, or let `sqd_scripted_free` free it. `caps` is read during the call only.
 * Errors: `-EINVAL` for a NULL argument, CQs not made by this device, or caps out of range
 * (`max_send_wr`, `max_recv_wr` 1..=32768; `max_send_sge`, `max_recv_sge` 1..=64; `max_inline_data` 0..=4096).
 */
int sqd_scripted_create_qp(const struct sqd_scripted *dev,
                           struct ibv_cq *send_cq,
                           struct ibv_cq *recv_cq,
                           const struct sqd_scripted_qp_caps *caps,
                           struct ibv_qp **out);

/**
 * Destroys a QP made by `sqd_scripted_create_qp`, whatever it holds; its CQEs not yet polled are removed from
 * its CQs. Errors: `-EINVAL` if `qp` is NULL or not a live scripted QP; `-EBUSY` while an `sqd_queue` manages
 * it (`sqd_queue_free` it first). On success `qp` dangles.
 */
int sqd_scripted_destroy_qp(struct ibv_qp *qp);

/**
 * Scripts the device: the next `n` send WQEs of `qp` not yet executed execute successfully, in order. Each
 * signaled one pushes a success CQE (`wr_id`, `IBV_WC_SUCCESS`, the `ibv_wc_opcode` matching its WR opcode,
 * `byte_len`, `qp_num`) to the send CQ. No slot is freed until a CQE is polled.
 *
 * Returns how many executed (>= 0, fewer than `n` if fewer were waiting). Errors: `-EINVAL` if `qp` is NULL
 * or not a live scripted QP, or `n` < 0.
 */
int sqd_scripted_complete(struct ibv_qp *qp, int n);

/**
 * Scripts the device: the next send WQE of `qp` not yet executed fails with `status` (an `enum ibv_wc_status`
 * error) and `vendor_err`: it yields an error CQE whether signaled or not. The QP moves to the error state,
 * then every later send WQE and every posted receive flushes with its own `IBV_WC_WR_FLUSH_ERR` CQE, in order.
 * On these CQEs only `wr_id`, `status`, `qp_num` and `vendor_err` are meaningful.
 *
 * Errors: `-EINVAL` if `qp` is NULL or not a live scripted QP, or `status` is `IBV_WC_SUCCESS`; `-ENOENT` if
 * no send WQE is waiting (nothing changes).
 */
int sqd_scripted_fail(struct ibv_qp *qp,
                      uint32_t status,
                      uint32_t vendor_err);

/**
 * Scripts the device: moves `qp` to the error state, as `ibv_modify_qp` to `IBV_QPS_ERR` would. Every send
 * WQE not yet executed, then every posted receive, flushes with its own `IBV_WC_WR_FLUSH_ERR` CQE, in order;
 * later posts are accepted and flushed at once. Errors: `-EINVAL` if `qp` is NULL or not a live scripted QP.
 */
int sqd_scripted_set_error(struct ibv_qp *qp);

/**
 * Scripts the device: a message arrives for `qp`. Its oldest posted receive completes with `IBV_WC_RECV`,
 * `byte_len`, and, when `imm_data` is not NULL, `IBV_WC_WITH_IMM` and `*imm_data` (network byte order, as in
 * `struct ibv_wc`). `imm_data` is read during the call only.
 *
 * Errors: `-EINVAL` if `qp` is NULL or not a live scripted QP; `-ENOENT` if no receive is posted.
 */
int sqd_scripted_deliver(struct ibv_qp *qp, uint32_t byte_len, const uint32_t *imm_data);

/**
 * Scripts the device: makes its `post_send` refuse send WRs of `qp`, as a provider refuses a WR it does not
 * support: from now on every send WR of `qp` with `opcode` (an `enum ibv_wr_opcode` value) is refused with
 * `errnum` (a positive errno) whenever it is posted: `post_send` returns it with `*bad_wr` at that WR, and it and
 * the WRs after it in that chain are not posted. No violation is recorded. `errnum` 0 lifts the refusal of
 * `opcode`.
 *
 * Errors: `-EINVAL` if `qp` is NULL or not a live scripted QP, or `errnum` is outside 0..=4095.
 */
int sqd_scripted_refuse_opcode(struct ibv_qp *qp,
                               uint32_t opcode,
                               int errnum);

/**
 * Copies the counters and state of `qp` into `*out` and returns 0.
 * Errors: `-EINVAL` if an argument is NULL or `qp` is not a live scripted QP.
 */
int sqd_scripted_qp_stats(struct ibv_qp *qp, struct sqd_scripted_qp_stats *out);

/**
 * Copies the caps `qp` was granted (exactly those requested) into `*out` and returns 0.
 * Errors: `-EINVAL` if an argument is NULL or `qp` is not a live scripted QP.
 */
int sqd_scripted_qp_caps(struct ibv_qp *qp, struct sqd_scripted_qp_caps *out);

/**
 * Copies the counters and state of `cq` into `*out` and returns 0.
 * Errors: `-EINVAL` if an argument is NULL or `cq` is not a live scripted CQ.
 */
int sqd_scripted_cq_stats(struct ibv_cq *cq, struct sqd_scripted_cq_stats *out);

/**
 * Copies the `index`-th send WQE ever posted on `qp` (0 = first; as posted, plus whether it was signaled,
 * executed or flushed) into `*out` and returns 0.
 * Errors: `-EINVAL` if an argument is NULL or `qp` is not a live scripted QP; `-ENOENT` if fewer than
 * `index + 1` send WQEs were posted.
 */
int sqd_scripted_wqe(struct ibv_qp *qp, size_t index, struct sqd_scripted_wqe *out);

/**
 * Registers `len` bytes at `addr` on the device: stores in `*out` a real `struct ibv_mr` with `context` (the
 * device's), `pd` (the device's), `addr`, `length`, and a nonzero `lkey` and `rkey` distinct from each other and
 * from those of every other MR of the device. `access` (`enum ibv_access_flags` bits) is accepted as given: the
 * device enforces no access rights and never reads the memory.
 *
 * The device owns the MR: deregister it with `sqd_scripted_dereg_mr`, hand it to `sqd_defer_dereg_mr` (the
 * library deregisters it through the device), or let `sqd_scripted_free` free it. Returns 0, or `-EINVAL` for
 * a NULL `dev` or `out`.
 */
int sqd_scripted_reg_mr(const struct sqd_scripted *dev,
                        void *addr,
                        size_t len,
                        int access,
                        struct ibv_mr **out);

/**
 * Deregisters (frees) an MR made by `sqd_scripted_reg_mr`; on success `mr` dangles. The pointer itself is
 * looked up, never read, so an MR deregistered already is refused safely (unless its address was reused).
 * Returns 0, or `-EINVAL` if `mr` is NULL or not a registered MR of a live scripted device.
 */
int sqd_scripted_dereg_mr(struct ibv_mr *mr);

/**
 * The number of MRs registered on the device now (>= 0). Errors: `-EINVAL` if `dev` is NULL.
 */
int sqd_scripted_mr_count(const struct sqd_scripted *dev);

/**
 * The number of violations (SQ/RQ overflow, invalid WR, CQ overrun) recorded on the device (>= 0).
 * Errors: `-EINVAL` if `dev` is NULL.
 */
int sqd_scripted_violation_count(const struct sqd_scripted *dev);

/**
 * Copies the text of the `index`-th violation (0 = oldest; it starts with its kind, e.g. "SQ overflow:" or
 * "CQ overrun:") into `buf`, truncated to `len - 1` bytes and NUL-terminated when `len` > 0, as `snprintf`
 * does. Returns the full length of the text (excluding the NUL). `buf` may be NULL when `len` is 0.
 * Errors: `-EINVAL` if `dev` is NULL, or `buf` is NULL with `len` > 0; `-ENOENT` if there is no such violation.
 */
int sqd_scripted_violation(const struct sqd_scripted *dev,
                           size_t index,
                           char *buf,
                           size_t len);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* SQDISC_SCRIPTED_H */
