#ifndef SQDISC_CHECK_H
#define SQDISC_CHECK_H

/* libsqdisc_check: a send-queue discipline checker for verbs programs (docs/check.md).
 *
 * Preloaded (LD_PRELOAD=libsqdisc_check.so ./program) it needs none of these functions: it interposes
 * libibverbs' ibv_create_cq, ibv_resize_cq, ibv_destroy_cq, ibv_create_qp, ibv_modify_qp, ibv_destroy_qp,
 * ibv_reg_mr, ibv_reg_mr_iova, ibv_reg_mr_iova2, ibv_reg_dmabuf_mr and ibv_dereg_mr, and replaces the
 * post_send, post_recv and poll_cq entries of each device context's ops table, forwarding every call to the
 * provider unchanged. The functions below are for programs that create verbs objects some other way (the
 * software HCA's sqd_sim_* functions, a provider's own constructors) or want the findings in-process.
 * Linking a program against -lsqdisc_check interposes the same libibverbs functions as preloading does.
 *
 * Every function returns 0 or a negative errno unless it says otherwise (sqd_check_last_error then says why),
 * and never aborts (except in abort mode, at a violation, by design). Thread-safe: one lock guards the
 * checker. */

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

/* Kinds of findings (sqd_check_kind_str names them; the names that are the same as the software HCA's
 * violation log are the same rule). */
#define SQD_CHECK_SQ_OVERFLOW 1       /* a post beyond the SQ slots polled CQEs freed (before the provider sees it) */
#define SQD_CHECK_UNSIGNALED_RUN 2    /* as many unsignaled WQEs in a row as the SQ has slots */
#define SQD_CHECK_IDLE_TAIL 3         /* an SQ ending in unsignaled WQEs, no post for idle_ms, its send CQ polled */
#define SQD_CHECK_CQ_UNDERSIZED 4     /* a CQ smaller than every SQ and RQ slot of its QPs (at QP creation) */
#define SQD_CHECK_MR_IN_USE 5         /* dereg, or LocalInv on another QP, of an MR a WQE no CQE covers uses */
#define SQD_CHECK_UNFENCED_INV 6      /* a LocalInv without IBV_SEND_FENCE behind an uncovered WQE using its MR */
#define SQD_CHECK_SOURCE_MODIFIED 7   /* a sampled source buffer changed before a CQE covered its WQE */
#define SQD_CHECK_UNSIGNALED_FLUSH 8  /* notice: a flush CQE for an unsignaled WQE */
#define SQD_CHECK_KINDS 8

/* `wqe_index` of a finding about no particular send WQE. */
#define SQD_CHECK_NO_WQE UINT64_MAX

/* Bytes of `text` in struct sqd_check_record, the NUL included. */
#define SQD_CHECK_TEXT 256

/* `mode` of struct sqd_check_config (SQDISC_CHECK=off|log|abort). */
#define SQD_CHECK_MODE_OFF 0
#define SQD_CHECK_MODE_LOG 1
#define SQD_CHECK_MODE_ABORT 2

/* One finding, as sqd_check_record copies it out. */
struct sqd_check_record {
    uint32_t kind;           /* SQD_CHECK_* */
    uint32_t qp_num;         /* the QP it is recorded against (for an MR in use: the QP of the WQE using it) */
    uint64_t wqe_index;      /* the send WQE it concerns on that QP (0 = the first accepted), or SQD_CHECK_NO_WQE */
    uint64_t time_ns;        /* nanoseconds since the checker started */
    char text[SQD_CHECK_TEXT]; /* one line starting with the kind's name, NUL-terminated, truncated to fit */
};

/* What the checker does; the environment (docs/check.md) sets the initial values. */
struct sqd_check_config {
    uint32_t mode;           /* SQD_CHECK_MODE_*; from off, nothing but off is accepted (-EINVAL) */
    uint32_t sample_every;   /* checksum the source of one send WR in this many (0: never); SQDISC_CHECK_SAMPLE, 64 */
    uint32_t sample_bytes;   /* bytes of a sampled source checksummed; SQDISC_CHECK_SAMPLE_BYTES, 4096 */
    uint32_t idle_ms;        /* the idle-tail time (0: never); SQDISC_CHECK_IDLE_MS, 1000 */
    uint32_t first;          /* occurrences of each kind kept for the report; SQDISC_CHECK_FIRST, 10 */
};

#ifdef __cplusplus
extern "C" {
#endif

/* Replaces the post_send, post_recv and poll_cq entries of ctx->ops with the checker's, once per context; the
 * provider's are kept and called for every call. The entries stay replaced for the life of the process. Objects
 * of the context are checked only once tracked (automatic for those made through the interposed functions).
 * Errors: -EINVAL for NULL. With checking off (SQDISC_CHECK=off), returns 0 and changes nothing. */
int sqd_check_attach(struct ibv_context *ctx);

/* Forgets every QP, CQ and MR of `ctx` without reporting anything: call it before the device is freed. The ops
 * stay replaced. Errors: -EINVAL for NULL. */
int sqd_check_detach(struct ibv_context *ctx);

/* Tracks a CQ of an attached context (its capacity: cq->cqe). Errors: -EINVAL for NULL. */
int sqd_check_track_cq(struct ibv_cq *cq);

/* The CQ now holds `cqe` CQEs (after a resize); an undersized CQ is reported. Errors: -EINVAL for NULL or
 * cqe < 1. */
int sqd_check_resize_cq(struct ibv_cq *cq, int cqe);

/* Forgets a CQ (call it when it is destroyed). Errors: -EINVAL for NULL. */
int sqd_check_untrack_cq(struct ibv_cq *cq);

/* Tracks a QP of an attached context: `attr` holds the caps the provider granted (as ibv_create_qp writes them
 * back) and sq_sig_all; the CQs and the SRQ are read from the QP. Its CQs are checked at once: a CQ smaller
 * than every SQ and RQ slot of the QPs tracked on it is reported (SQD_CHECK_CQ_UNDERSIZED). Track the CQs
 * first. Errors: -EINVAL for NULL. */
int sqd_check_track_qp(struct ibv_qp *qp, const struct ibv_qp_init_attr *attr);

/* Forgets a QP: call it before destroying it. The sampled sources of its WQEs that no CQE covered are checked
 * one last time (SQD_CHECK_SOURCE_MODIFIED). Errors: -EINVAL for NULL. */
int sqd_check_untrack_qp(struct ibv_qp *qp);

/* The QP was moved to `state` (an enum ibv_qp_state): IBV_QPS_ERR stops the SQ-credit rule for it (a QP in
 * error flushes what it is given); IBV_QPS_RESET empties its queues. Other states change nothing.
 * Errors: -EINVAL for NULL. */
int sqd_check_qp_state(struct ibv_qp *qp, int state);

/* Tracks an MR whose lkey/rkey name mr->addr .. mr->addr + mr->length in this process. Errors: -EINVAL for NULL. */
int sqd_check_track_mr(struct ibv_mr *mr);

/* The MR is about to be deregistered: reported if a WQE that no polled CQE covers still uses it
 * (SQD_CHECK_MR_IN_USE), then forgotten. Call it before deregistering. Errors: -EINVAL for NULL. */
int sqd_check_untrack_mr(struct ibv_mr *mr);

/* Findings of `kind` so far; kind 0: every violation (notices excluded). 0 for an unknown kind. */
uint64_t sqd_check_count(uint32_t kind);

/* Copies the `index`-th kept finding of `kind` (0 = the oldest; `first` are kept per kind) into *out.
 * Errors: -EINVAL for an unknown kind or NULL out; -ENOENT past the last kept one. */
int sqd_check_record(uint32_t kind, size_t index, struct sqd_check_record *out);

/* The name of a kind ("SQ overflow", "MR invalidated while in use", ...), or "unknown": a static
 * NUL-terminated string, never NULL. */
const char *sqd_check_kind_str(uint32_t kind);

/* Writes the report (the counts per kind, then the kept findings, one line each) to `fd`.
 * Errors: the negative errno of write(2). */
int sqd_check_write_report(int fd);

/* Forgets every finding; the tracked objects stay. */
int sqd_check_reset(void);

/* Why the last failing sqd_check_* call of this thread failed: a NUL-terminated string, valid until the next
 * failing call of the thread; "" if none failed. Never NULL. */
const char *sqd_check_last_error(void);

/* Copies the configuration into *out. Errors: -EINVAL for NULL. */
int sqd_check_get_config(struct sqd_check_config *out);

/* Sets the configuration (read during the call). Errors: -EINVAL for NULL, an unknown mode, or turning
 * checking on when it started off. */
int sqd_check_set_config(const struct sqd_check_config *cfg);

#ifdef __cplusplus
}
#endif

#endif /* SQDISC_CHECK_H */
