#ifndef SQDISC_SIM_H
#define SQDISC_SIM_H

/* Generated from the library's sources by `make header`; do not edit by hand. */

#include <sqdisc.h>

/**
 * `flags`: posting into a full SQ or RQ is also logged as a violation (it always fails with `ENOMEM`).
 */
#define SQD_SIM_STRICT 1

/**
 * `flags`: null mode. Every send WQE completes at once at post time (a CQE for signaled ones, respecting
 * the CQ's capacity and the SQ slot rule); no data moves and no peer is needed. For measuring a ULP's or the
 * library's own cost.
 */
#define SQD_SIM_NULL 2

/**
 * `flags`: an arm (`ibv_req_notify_cq`) of a CQ that already holds a CQE the arm would fire for raises the
 * completion event at once, as ConnectX HCAs do. Without it, only a CQE added after the arm fires: IBA's
 * Request Completion Notification, and what rxe and siw do.
 */
#define SQD_SIM_ARM_PENDING 4

/**
 * `rnr_retry` value meaning "retry forever" (IBA: an RNR retry count of 7 is infinite).
 */
#define SQD_SIM_RNR_RETRY_FOREVER 7

/**
 * Fault: the QP moves to the error state at step `at_step` (or at once if that step has passed), as after
 * a fatal local error: its unfinished WQEs and posted receives flush.
 */
#define SQD_SIM_FAULT_QP_FATAL 1

/**
 * Fault: the next request of the QP that its peer executes fails the peer's rkey check: the WQE completes
 * with `IBV_WC_REM_ACCESS_ERR` and both QPs go to error (as a real rkey violation).
 */
#define SQD_SIM_FAULT_REMOTE_ACCESS 2

/**
 * Fault: the QP's posted receives are withheld for `count` steps: SENDs to it get RNR NAKs meanwhile.
 */
#define SQD_SIM_FAULT_RECV_STARVE 3

/**
 * Fault: the QP's next send WQE not yet transmitted fails at transmission with `status` and `vendor_err`
 * (an error CQE, signaled or not; the QP goes to error).
 */
#define SQD_SIM_FAULT_FAIL_NEXT 4

/**
 * Fault: the next `count` request packets the QP sends are lost on the wire.
 */
#define SQD_SIM_FAULT_LOSE_REQUESTS 5

/**
 * Fault: the next `count` response packets (ACK, NAK, read/atomic response) sent to the QP are lost.
 */
#define SQD_SIM_FAULT_LOSE_ACKS 6

/**
 * Violation: a send WR was posted into a full SQ (strict mode only; the post fails with `ENOMEM`).
 */
#define SQD_SIM_VIOLATION_SQ_OVERFLOW 1

/**
 * Violation: a receive WR was posted into a full RQ (strict mode only; the post fails with `ENOMEM`).
 */
#define SQD_SIM_VIOLATION_RQ_OVERFLOW 2

/**
 * Violation: a CQE was pushed into a full CQ; it is lost, the CQ and its QPs go to error.
 */
#define SQD_SIM_VIOLATION_CQ_OVERRUN 3

/**
 * Violation: a retransmission read source bytes that differ from the first transmission of that WQE: the
 * buffer was changed before the HCA was done with it (rule 3 of the seed discussion).
 */
#define SQD_SIM_VIOLATION_SOURCE_MODIFIED 4

/**
 * Violation: an MR was deregistered or invalidated (LocalInv, SEND_WITH_INV) while a send WQE the HCA is not
 * finished with references it through an SGE (rules 3 and 4).
 */
#define SQD_SIM_VIOLATION_MR_IN_USE 5

/**
 * Violation: an invalid WR (unsupported opcode, too many SGEs, NULL sg_list, inline data too large, ...);
 * the post fails with `EINVAL`.
 */
#define SQD_SIM_VIOLATION_BAD_WR 6

/**
 * Violation: a send WR was posted to a QP that is not connected yet; the post fails with `EINVAL`.
 */
#define SQD_SIM_VIOLATION_QP_STATE 7

/**
 * `wqe_index` of a violation that concerns no particular send WQE.
 */
#define SQD_SIM_NO_WQE 18446744073709551615ull

/**
 * Bytes of `text` in `struct sqd_sim_violation`, including the terminating NUL.
 */
#define SQD_SIM_VIOLATION_TEXT 256

/**
 * A simulated HCA: a real `struct ibv_context` and `struct ibv_pd`, and the MRs, CQs and QPs made on it.
 *
 * The ops callbacks find the device through a pointer stored in the context, so it never moves (it is made
 * pinned). Freeing it frees every object it made.
 *
 * Thread-safe: any number of threads may call into one sim at once (data-path ops, `sqd_sim_*` calls,
 * stepping); each call holds the device-wide lock for its duration. Only `sqd_sim_free` and the
 * `sqd_sim_destroy_*` calls must not race other calls on the objects they free.
 */
struct sqd_sim;

/**
 * How a simulated HCA behaves (`struct sqd_sim_config` in C). Start from the defaults (`sqd_sim_config_default`).
 */
struct sqd_sim_config {
    /**
     * Decides every random choice of the run.
     */
    uint64_t seed;
    /**
     * Request packets lost on the wire, per million.
     */
    uint32_t loss_ppm;
    /**
     * Response packets (ACK, NAK, read/atomic responses) lost, per million.
     */
    uint32_t ack_loss_ppm;
    /**
     * One-way wire delay of a packet, in steps, uniform in `wire_delay_min..=wire_delay_max` (at least 1).
     * Packets between two QPs keep their order.
     */
    uint32_t wire_delay_min;
    uint32_t wire_delay_max;
    /**
     * Responder ACK coalescing: an ACK leaves this many steps after the first request it acknowledges; it
     * acknowledges every request executed by then.
     */
    uint32_t ack_delay;
    /**
     * Steps without acknowledgement progress after which the requester retransmits (go-back-N).
     */
    uint32_t retrans_timeout;
    /**
     * Steps a requester waits after an RNR NAK before retrying.
     */
    uint32_t rnr_delay;
    /**
     * Steps run at the start of every `ibv_poll_cq` call (0: polling does not advance time).
     */
    uint32_t steps_per_poll;
    /**
     * Send WQEs a QP transmits (or executes, for local ones) per step.
     */
    uint32_t tx_per_step;
    /**
     * `SQD_SIM_STRICT`, `SQD_SIM_NULL`, `SQD_SIM_ARM_PENDING`.
     */
    uint32_t flags;
};

/**
 * Connection attributes (`struct sqd_sim_conn_attr` in C): what `ibv_modify_qp` to RTR/RTS would set.
 */
struct sqd_sim_conn_attr {
    /**
     * RNR retries before `IBV_WC_RNR_RETRY_EXC_ERR`; 7 = forever. 0..=7.
     */
    uint32_t rnr_retry;
    /**
     * Transport retries (timeouts, sequence NAKs) before `IBV_WC_RETRY_EXC_ERR`. 0..=7.
     */
    uint32_t retry_cnt;
    /**
     * RDMA READ / ATOMIC requests outstanding at once (1..=16); more stall the SQ (head of line).
     */
    uint32_t max_rd_atomic;
};

/**
 * A fault to inject (`struct sqd_sim_fault` in C).
 */
struct sqd_sim_fault {
    /**
     * `SQD_SIM_FAULT_*`.
     */
    uint32_t kind;
    /**
     * The QP the fault applies to.
     */
    struct ibv_qp *qp;
    /**
     * `SQD_SIM_FAULT_QP_FATAL`: the step at which the QP fails.
     */
    uint64_t at_step;
    /**
     * Packets (`LOSE_*`) or steps (`RECV_STARVE`).
     */
    uint32_t count;
    /**
     * `SQD_SIM_FAULT_FAIL_NEXT`: the `enum ibv_wc_status` error and vendor error of the failing WQE.
     */
    uint32_t status;
    uint32_t vendor_err;
};

/**
 * Device-wide counters (`struct sqd_sim_stats` in C).
 */
struct sqd_sim_stats {
    /**
     * Steps run so far (the current time).
     */
    uint64_t steps;
    /**
     * `post_send` calls that posted at least one WQE.
     */
    uint64_t doorbells;
    /**
     * Send WQEs accepted.
     */
    uint64_t wqes;
    /**
     * Receive WQEs accepted.
     */
    uint64_t recvs;
    /**
     * CQEs generated (send and receive, success and error, including those lost to an overrun).
     */
    uint64_t cqes;
    /**
     * Request packets sent, first transmissions and retransmissions.
     */
    uint64_t packets;
    /**
     * Request packets sent again (go-back-N, RNR retry).
     */
    uint64_t retransmissions;
    /**
     * Retransmission timeouts that fired.
     */
    uint64_t timeouts;
    /**
     * Request packets lost on the wire.
     */
    uint64_t packets_lost;
    /**
     * Response packets lost on the wire.
     */
    uint64_t acks_lost;
    /**
     * Duplicate requests seen by responders.
     */
    uint64_t duplicates;
    /**
     * RNR NAKs sent by responders.
     */
    uint64_t rnr_naks;
    /**
     * Sequence-error NAKs sent by responders.
     */
    uint64_t seq_naks;
    /**
     * `IBV_WC_WR_FLUSH_ERR` CQEs generated.
     */
    uint64_t flushes;
    /**
     * Error CQEs other than flushes.
     */
    uint64_t errors;
    /**
     * CQEs lost because their CQ was full or in error.
     */
    uint64_t cq_overruns;
    /**
     * Posts refused because the SQ was full.
     */
    uint64_t sq_overflows;
    /**
     * Posts refused because the RQ was full.
     */
    uint64_t rq_overflows;
    /**
     * Violations logged.
     */
    uint64_t violations;
    /**
     * Bytes read from registered memory (sources, READ targets at the responder).
     */
    uint64_t bytes_read;
    /**
     * Bytes written into registered memory.
     */
    uint64_t bytes_written;
    /**
     * QP visits made by steps: a step visits only the QPs with work (a send WQE not completed, an ACK due), so
     * this grows with the work done, not with the number of QPs.
     */
    uint64_t qp_ticks;
    /**
     * Asynchronous events raised.
     */
    uint64_t async_events;
    /**
     * Completion events queued on completion channels.
     */
    uint64_t comp_events;
};

/**
 * One logged violation, as `sqd_sim_violation` copies it out.
 */
struct sqd_sim_violation {
    /**
     * `SQD_SIM_VIOLATION_*`; `sqd_sim_violation_kind_str` names it.
     */
    uint32_t kind;
    /**
     * The QP it is recorded against (0 when none).
     */
    uint32_t qp_num;
    /**
     * Index of the send WQE involved on that QP (0 = first ever posted), or `SQD_SIM_NO_WQE`.
     */
    uint64_t wqe_index;
    /**
     * The step at which it happened.
     */
    uint64_t step;
    /**
     * A description starting with the kind's name, NUL-terminated, truncated to fit.
     */
    char text[SQD_SIM_VIOLATION_TEXT];
};

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * Fills `*cfg` with the defaults: seed 1, no loss, wire delay 1..=3 steps, ACK delay 2, retransmission
 * timeout 24, RNR delay 8, 1 step per `ibv_poll_cq` call, 4 WQEs transmitted per step per QP, no flags.
 * NULL is a no-op.
 */
void sqd_sim_config_default(struct sqd_sim_config *cfg);

/**
 * Creates a software HCA: a `struct ibv_context` whose data-path ops (`ibv_post_send`, `ibv_post_recv`,
 * `ibv_poll_cq`, `ibv_req_notify_cq`) run the model, and a protection domain. `cfg` NULL means the defaults
 * (`sqd_sim_config_default`); it is read during the call only.
 *
 * On success stores the sim in `*out` and returns 0; the caller owns it and frees it with `sqd_sim_free`.
 * Errors: `-EINVAL` if `out` is NULL or the configuration is out of range (`wire_delay_min` above
 * `wire_delay_max`, `tx_per_step` or `retrans_timeout` 0, a loss rate above 1000000 ppm, unknown flags).
 */
int sqd_sim_new(const struct sqd_sim_config *cfg, struct sqd_sim **out);

/**
 * Frees a sim and every MR, CQ, QP, SRQ and channel made on it. NULL is a no-op (returns 0). Every pointer
 * obtained from it dangles afterwards; registered memory is no longer touched. No other call may use the sim
 * concurrently.
 *
 * Returns 0, or `-EBUSY` while any of its CQs, QPs or SRQs is still held by a library handle (`sqd_cq`,
 * `sqd_queue`, `sqd_srq`): free those first. The sim is then left as it was, still valid.
 */
int sqd_sim_free(struct sqd_sim *sim);

/**
 * The sim's `struct ibv_context`, owned by the sim (valid until `sqd_sim_free`). Only the data-path ops are
 * set; other verbs (`ibv_create_qp`, `ibv_reg_mr`, `ibv_modify_qp`, ...) must not be called on it: use the
 * `sqd_sim_*` equivalents. NULL if `sim` is NULL.
 */
struct ibv_context *sqd_sim_context(const struct sqd_sim *sim);

/**
 * The sim's protection domain, owned by the sim (valid until `sqd_sim_free`). NULL if `sim` is NULL.
 */
struct ibv_pd *sqd_sim_pd(const struct sqd_sim *sim);

/**
 * Registers `len` bytes at `addr` with `access` (`IBV_ACCESS_*`), as `ibv_reg_mr` does, and stores a real
 * `struct ibv_mr` (`lkey`, `rkey` (equal, never reused), `addr`, `length`, `context`, `pd`) in `*out`.
 *
 * The memory must stay valid (and writable, with a write permission) until the MR is deregistered or the sim
 * freed: the model reads and writes it (DMA) inside `ibv_poll_cq` and `sqd_sim_step`. The sim owns the MR.
 * Errors: `-EINVAL` for a NULL `sim`/`out`, a NULL `addr` with `len` > 0, negative `access`, or a remote
 * write/atomic permission without `IBV_ACCESS_LOCAL_WRITE`.
 */
int sqd_sim_reg_mr(const struct sqd_sim *sim, void *addr, size_t len, int access, struct ibv_mr **out);

/**
 * Deregisters an MR made by `sqd_sim_reg_mr`, as `ibv_dereg_mr` does: its keys are invalid at once (a later
 * DMA through them — e.g. a retransmission — fails with `IBV_WC_LOC_PROT_ERR`), and `mr` dangles. If a send
 * WQE the HCA is not finished with references it, an "MR invalidated while in use" violation is logged.
 * Errors: `-EINVAL` if `mr` is NULL or not a live sim MR.
 */
int sqd_sim_dereg_mr(struct ibv_mr *mr);

/**
 * Creates a CQ holding exactly `cqe` CQEs (`cq->cqe == cqe`). A CQE pushed into a full CQ is lost, the CQ and
 * every QP using it go to error, and a "CQ overrun" violation is logged.
 *
 * On success stores the CQ in `*out` and returns 0; the sim owns it. Errors: `-EINVAL` for a NULL argument or
 * `cqe` outside 1..=4194304.
 */
int sqd_sim_create_cq(const struct sqd_sim *sim, int cqe, struct ibv_cq **out);

/**
 * Resizes a CQ as `ibv_resize_cq` does: it holds `cqe` CQEs from now on (1..=4194304) and `cq->cqe` says so.
 * Tell a `struct sqd_cq` managing it with `sqd_cq_update_capacity`. Errors: `-EINVAL` if `cq` is NULL or not a
 * live sim CQ, or `cqe` is out of range or below the CQEs the CQ holds now.
 */
int sqd_sim_resize_cq(struct ibv_cq *cq,
                      int cqe);

/**
 * Destroys a CQ made by `sqd_sim_create_cq` or `sqd_sim_create_cq_ex`; its completion events still queued on
 * its channel are discarded. Errors: `-EINVAL` if `cq` is NULL or not a live sim CQ; `-EBUSY` while a QP uses
 * it, or while completion events taken for it are not all acknowledged (`sqd_sim_ack_cq_events`; libibverbs'
 * `ibv_destroy_cq` would wait for them), or while an `sqd_cq` manages it (`sqd_cq_free` it first). On success
 * `cq` dangles.
 */
int sqd_sim_destroy_cq(struct ibv_cq *cq);

/**
 * Creates an RC QP from `attr`, as `ibv_create_qp` does: `qp_type` must be `IBV_QPT_RC`, `send_cq`/`recv_cq`
 * CQs of this sim, `srq` NULL or an SRQ of this sim (`sqd_sim_create_srq`): the QP then takes its receives
 * from the SRQ, oldest first, and has no receive queue of its own (`ibv_post_recv` on it fails with `EINVAL`;
 * `attr->cap.max_recv_wr`/`max_recv_sge` are written back as 0). Caps are honoured, clamped to the device
 * limits (WRs 1..=32768, SGEs 1..=32, inline 0..=1024), and the granted caps are written back to `attr->cap`.
 * `sq_sig_all` makes every send WR signaled.
 *
 * The QP starts in INIT (receives may be posted; sends fail with `EINVAL` until `sqd_sim_connect`); in null
 * mode it starts in RTS. On success stores the QP in `*out`; the sim owns it.
 * Errors: `-EINVAL` for a NULL argument, a QP type other than RC, or CQs or an SRQ not of this sim.
 */
int sqd_sim_create_qp(const struct sqd_sim *sim, struct ibv_qp_init_attr *attr, struct ibv_qp **out);

/**
 * Connects two QPs of the same sim to each other and moves both to RTS, as both sides' `ibv_modify_qp` to
 * RTR and RTS would. `attr` (read during the call) applies to both; NULL means the defaults: `rnr_retry` 7
 * (forever), `retry_cnt` 7, `max_rd_atomic` 4.
 * Errors: `-EINVAL` for NULL or foreign QPs, QPs of different sims, the same QP twice, a QP already connected
 * or in error, or attributes out of range (`rnr_retry`, `retry_cnt` 0..=7; `max_rd_atomic` 1..=16).
 */
int sqd_sim_connect(struct ibv_qp *a, struct ibv_qp *b, const struct sqd_sim_conn_attr *attr);

/**
 * Moves a QP to the error state, as `ibv_modify_qp` to `IBV_QPS_ERR` does: every send WQE the HCA is not
 * finished with, then every posted receive, completes with its own `IBV_WC_WR_FLUSH_ERR` CQE, in order,
 * signaled or not; later posts are accepted and flushed at once. Its peer is not told (its requests to this
 * QP go unanswered). Errors: `-EINVAL` if `qp` is NULL or not a live sim QP.
 */
int sqd_sim_set_error(struct ibv_qp *qp);

/**
 * Makes the HCA's `post_send` refuse send WRs of `qp`, as a provider refuses a WR it does not support:
 * from now on every send WR of `qp` with `opcode` (an `enum ibv_wr_opcode` value) is refused with `errnum` (a
 * positive errno) whenever it is posted: `post_send` returns it with `*bad_wr` at that WR, and it and the WRs
 * after it in that chain are not posted. No violation is recorded. `errnum` 0 lifts the refusal of `opcode`.
 *
 * Errors: `-EINVAL` if `qp` is NULL or not a live sim QP, or `errnum` is outside 0..=4095.
 */
int sqd_sim_refuse_opcode(struct ibv_qp *qp, uint32_t opcode, int errnum);

/**
 * Destroys a QP made by `sqd_sim_create_qp`, whatever it holds; its CQEs not yet polled are removed from its
 * CQs. Errors: `-EINVAL` if `qp` is NULL or not a live sim QP; `-EBUSY` while an `sqd_queue` manages it
 * (`sqd_queue_free` it first). On success `qp` dangles.
 */
int sqd_sim_destroy_qp(struct ibv_qp *qp);

/**
 * Advances the model by `steps` steps (transmissions, wire, responders, ACKs, timers, completions).
 * `ibv_poll_cq` also advances it (`steps_per_poll` per call). Errors: `-EINVAL` if `sim` is NULL.
 */
int sqd_sim_step(const struct sqd_sim *sim, uint32_t steps);

/**
 * Runs steps until nothing is in flight: no send WQE waiting to be transmitted, acknowledged or completed on
 * a connected QP, no packet on the wire, no ACK pending. CQEs not yet polled do not count.
 * Returns the number of steps run (>= 0, saturating at INT_MAX). Errors: `-EINVAL` if `sim` is NULL;
 * `-ETIMEDOUT` after `max_steps` steps (e.g. an RNR retry that never ends).
 */
int sqd_sim_run_until_idle(const struct sqd_sim *sim, uint32_t max_steps);

/**
 * Injects a fault (`f` is read during the call): `SQD_SIM_FAULT_QP_FATAL` (the QP fails at step
 * `at_step`), `SQD_SIM_FAULT_REMOTE_ACCESS` (its next request fails the peer's rkey check),
 * `SQD_SIM_FAULT_RECV_STARVE` (its posted receives are withheld for `count` steps), `SQD_SIM_FAULT_FAIL_NEXT`
 * (its next send WQE fails at transmission with `status`/`vendor_err`), `SQD_SIM_FAULT_LOSE_REQUESTS` /
 * `SQD_SIM_FAULT_LOSE_ACKS` (its next `count` request / response packets are lost).
 * Errors: `-EINVAL` for a NULL argument, an unknown kind, a QP not of this sim, or `FAIL_NEXT` with
 * `IBV_WC_SUCCESS`.
 */
int sqd_sim_inject(const struct sqd_sim *sim, const struct sqd_sim_fault *f);

/**
 * Oracle: 1 if any send WQE the HCA is not truly finished with (it could still be transmitted or
 * retransmitted — not yet acknowledged and completed — or, for RDMA READ/atomics, still be written) references
 * bytes of `[addr, addr + len)` through its SGEs, else 0. Inline data never counts (copied at post time).
 * Errors: `-EINVAL` if `sim` is NULL.
 */
int sqd_sim_buffer_busy(const struct sqd_sim *sim,
                        const void *addr,
                        size_t len);

/**
 * Oracle: 1 if the HCA is finished with the `wqe_index`-th send WQE posted on `qp` (0 = first ever posted;
 * refused posts do not count), 0 if not. Errors: `-EINVAL` if `qp` is NULL or not a live sim QP; `-ENOENT`
 * beyond the last posted WQE.
 */
int sqd_sim_wqe_finished(struct ibv_qp *qp, uint64_t wqe_index);

/**
 * Copies the sim's counters into `*out` and returns 0. Errors: `-EINVAL` for a NULL argument.
 */
int sqd_sim_stats(const struct sqd_sim *sim, struct sqd_sim_stats *out);

/**
 * The number of violations logged (>= 0). Errors: `-EINVAL` if `sim` is NULL.
 */
int sqd_sim_violation_count(const struct sqd_sim *sim);

/**
 * Copies the `index`-th violation (0 = oldest) into `*out` and returns 0.
 * Errors: `-EINVAL` for a NULL argument; `-ENOENT` if fewer than `index + 1` were logged.
 */
int sqd_sim_violation(const struct sqd_sim *sim, size_t index, struct sqd_sim_violation *out);

/**
 * The name of a violation kind (`"SQ overflow"`, `"CQ overrun"`, `"source modified while in flight"`,
 * `"MR invalidated while in use"`, ...), or `"unknown"`: a static NUL-terminated string, never NULL.
 */
const char *sqd_sim_violation_kind_str(uint32_t kind);

/**
 * Creates a CQ as `ibv_create_cq` does: `cqe` CQEs (1..=4194304, `cq->cqe == cqe`), on completion channel
 * `channel` (NULL: none; else made by `sqd_sim_create_comp_channel` on this sim: its `refcnt` counts the CQ),
 * with `cq_context` (stored in `cq->cq_context`, returned by `sqd_sim_get_cq_event`) and `comp_vector` (the sim
 * has one: 0). `ibv_req_notify_cq(cq, solicited_only)` then arms it: the next CQE added (any, or with
 * `solicited_only` a receive of a message sent with `IBV_SEND_SOLICITED` or an unsuccessful one) disarms it and
 * queues one completion event on the channel. CQEs already in the CQ when it is armed do not fire it: arm,
 * then poll once more before sleeping.
 *
 * On success stores the CQ in `*out` and returns 0; the sim owns it. Errors: `-EINVAL` for a NULL `sim`/`out`,
 * `cqe` out of range, a channel not of this sim, `comp_vector` other than 0.
 */
int sqd_sim_create_cq_ex(const struct sqd_sim *sim,
                         int cqe,
                         struct ibv_comp_channel *channel,
                         void *cq_context,
                         int comp_vector,
                         struct ibv_cq **out);

/**
 * Creates a completion channel, as `ibv_create_comp_channel` does: a real `struct ibv_comp_channel` (`context`,
 * `fd`, `refcnt`) whose `fd` is a nonblocking eventfd, readable exactly while completion events are queued on
 * the channel: wait on it with poll/epoll/select, then take the events with `sqd_sim_get_cq_event`. Never
 * `read(2)` the fd, and do not call libibverbs' `ibv_get_cq_event`/`ibv_ack_cq_events` on it (they need a
 * kernel device): use `sqd_sim_get_cq_event`/`sqd_sim_ack_cq_events`.
 *
 * On success stores the channel in `*out` and returns 0; the sim owns it (freed by `sqd_sim_free` if not
 * destroyed). Errors: `-EINVAL` for a NULL argument; `-EMFILE`/`-ENFILE` when no fd is left.
 */
int sqd_sim_create_comp_channel(const struct sqd_sim *sim,
                                struct ibv_comp_channel **out);

/**
 * Destroys a completion channel made by `sqd_sim_create_comp_channel`; its fd is closed and `channel` dangles.
 * Errors: `-EINVAL` for NULL or a channel not of a sim; `-EBUSY` while a CQ uses it (as
 * `ibv_destroy_comp_channel`).
 */
int sqd_sim_destroy_comp_channel(struct ibv_comp_channel *channel);

/**
 * Takes the oldest completion event queued on `channel`, without blocking (the non-blocking form of
 * `ibv_get_cq_event`): stores the CQ it is for in `*cq` and that CQ's `cq_context` in `*cq_context`, returns 0.
 * Every event taken must be acknowledged with `sqd_sim_ack_cq_events` before the CQ is destroyed.
 * Errors: `-EAGAIN` when none is queued (the channel's fd is then not readable: sleep on it); `-EINVAL` for a
 * NULL argument or a channel not of a sim.
 *
 * Time: the sim advances only inside `ibv_poll_cq` (`steps_per_poll`), `sqd_sim_step` and
 * `sqd_sim_run_until_idle`. A ULP that sleeps on the fd needs something else to advance time while it sleeps:
 * typically a driver thread calling `sqd_sim_step(sim, 1)` in a loop (the sim is thread-safe).
 */
int sqd_sim_get_cq_event(struct ibv_comp_channel *channel,
                         struct ibv_cq **cq,
                         void **cq_context);

/**
 * Acknowledges `nevents` completion events taken for `cq` with `sqd_sim_get_cq_event` (as `ibv_ack_cq_events`;
 * `cq->comp_events_completed` counts them). `sqd_sim_destroy_cq` fails with `-EBUSY` while some are
 * unacknowledged. Errors: `-EINVAL` for a CQ not of a sim, or more events than are unacknowledged.
 */
int sqd_sim_ack_cq_events(struct ibv_cq *cq,
                          uint32_t nevents);

/**
 * Takes the oldest asynchronous event of the sim, without blocking (the sim's `ibv_get_async_event`; the
 * libibverbs function reads a kernel fd and cannot be used): fills `out->element` (`cq`, `qp` or `srq`, per
 * the type) and `out->event_type`, returns 0. The sim raises: `IBV_EVENT_CQ_ERR` (a CQ overran; it takes no
 * more CQEs), `IBV_EVENT_QP_FATAL` (a QP went to error with no CQE of its own to say so: an injected fatal
 * error, or its CQ overran), `IBV_EVENT_QP_LAST_WQE_REACHED` (a QP on an SRQ went to error and completed its
 * last receive), `IBV_EVENT_SRQ_LIMIT_REACHED` (an armed SRQ limit was crossed), `IBV_EVENT_SRQ_ERR` (an SRQ
 * failed). Events need no acknowledgement; events naming an object are discarded when it is destroyed.
 * Errors: `-EAGAIN` when none is pending; `-EINVAL` for a NULL argument.
 */
int sqd_sim_get_async_event(const struct sqd_sim *sim, struct ibv_async_event *out);

/**
 * A file descriptor (nonblocking eventfd, owned by the sim) that is readable exactly while asynchronous events
 * are pending, for poll/epoll/select; take the events with `sqd_sim_get_async_event`, never `read(2)` it.
 * Errors: `-EINVAL` if `sim` is NULL.
 */
int sqd_sim_async_fd(const struct sqd_sim *sim);

/**
 * Creates a shared receive queue, as `ibv_create_srq` does: a real `struct ibv_srq` (`context`, `pd`,
 * `srq_context` from `attr`). `attr->attr.max_wr` (1..=32768) and `attr->attr.max_sge` (1..=32) are clamped and
 * written back; `attr->attr.srq_limit` is ignored (arm it with `sqd_sim_modify_srq_limit`). Post receives with
 * libibverbs' `ibv_post_srq_recv` (the context's `post_srq_recv` op): a chain is taken in order up to the first
 * WR refused (`ENOMEM` when `max_wr` receives are held — a receive's slot is freed when its CQE is polled —,
 * `EINVAL` for a bad SGE count or an SRQ in error), `*bad_wr` at it.
 *
 * On success stores the SRQ in `*out` and returns 0; the sim owns it. Errors: `-EINVAL` for a NULL argument.
 */
int sqd_sim_create_srq(const struct sqd_sim *sim,
                       struct ibv_srq_init_attr *attr,
                       struct ibv_srq **out);

/**
 * Destroys an SRQ; receives still posted on it never complete, and `srq` dangles.
 * Errors: `-EINVAL` for NULL or an SRQ not of a sim; `-EBUSY` while a QP uses it or an `sqd_srq` manages it
 * (`sqd_srq_free` it first).
 */
int sqd_sim_destroy_srq(struct ibv_srq *srq);

/**
 * Sets the SRQ's limit, as `ibv_modify_srq` with `IBV_SRQ_LIMIT`: a nonzero `limit` arms it — when a QP takes
 * a receive and fewer than `limit` receives remain posted, the sim raises one `IBV_EVENT_SRQ_LIMIT_REACHED`
 * and disarms it (`ibv_modify_srq(3)`, `ibv_query_srq(3)`: 0 means not armed); 0 disarms.
 * Errors: `-EINVAL` for NULL, an SRQ not of a sim, or `limit` above the SRQ's `max_wr`.
 */
int sqd_sim_modify_srq_limit(struct ibv_srq *srq,
                             uint32_t limit);

/**
 * Fault: the SRQ fails (a catastrophic SRQ error). The sim raises `IBV_EVENT_SRQ_ERR`; the SRQ hands out no
 * more receives and refuses posts; every QP on it goes to error (its send WQEs flush) and gets
 * `IBV_EVENT_QP_LAST_WQE_REACHED`. Errors: `-EINVAL` for NULL or an SRQ not of a sim.
 */
int sqd_sim_srq_set_error(struct ibv_srq *srq);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* SQDISC_SIM_H */
