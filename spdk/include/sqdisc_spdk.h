/*
 * libsqdisc_spdk: an SPDK RDMA provider backed by sqdisc.
 *
 * The library exports SPDK's 14 RDMA provider functions (spdk_rdma_provider_*) with SPDK's signatures and
 * structure layouts, so that it can take the place of SPDK's libspdk_rdma_provider; docs/spdk.md tells how.
 * SPDK itself includes its own declarations (include/spdk_internal/rdma_provider.h): this header is for
 * programs outside SPDK that drive the provider (tests, tools), and for the three sqd_spdk_* functions that
 * read a qpair's and a CQ's counters.
 *
 * The declarations below match SPDK v25.05, v25.09, v26.01, v26.05 and master (commit 3230130e6a), whose
 * include/spdk_internal/rdma_provider.h is the same file, on LP64 platforms; SQD_SPDK_ASSERT_LAYOUT pins every
 * size and offset at compile time. The library reaches the connection manager as the running SPDK does:
 * through SPDK's spdk_rdma_cm_* where the process has them (master), else through librdmacm (the releases). If SPDK's header was included
 * first (SPDK_RDMA_H defined), SPDK's declarations are used and only the sqd_spdk_* functions are added.
 *
 * Environment, read when the process makes its first qpair: SQDISC_SPDK_BACKLOG_LIMIT=<n> sets the most WRs
 * the qpairs of one CQ may park at once, all together (sqd_cq_set_backlog_limit); default 16, 0 for no limit
 * (each qpair's backlog then keeps room for max_send_wr WRs of its own, about 115 KB for a qpair of max_send_wr
 * 256 and 16 SGEs; with the default such a qpair costs under 16 KB at rest). A flush that would park past the
 * limit returns ENOMEM with *bad_wr at the first WR not taken, as ibv_post_send on a full SQ. With
 * SQDISC_SPDK_VERIFY_BUFFERS=1, every send WR's source bytes are checksummed at flush and at release, and a
 * difference is logged (docs/spdk.md).
 *
 * Thread safety: as SPDK's provider. The functions of one qpair or SRQ are called from one thread at a time
 * (its poll group's); qpairs and SRQs of different poll groups may be used from different threads at once.
 */
#ifndef SQDISC_SPDK_H
#define SQDISC_SPDK_H

#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sqdisc.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef SPDK_RDMA_H
/* ---- SPDK's provider interface, as SPDK declares it ------------------------------------------------- */

struct spdk_memory_domain;

/* Counters the provider keeps for SPDK: WRs handed to queue_*, doorbells rung by flush_*. */
struct spdk_rdma_provider_wr_stats {
	uint64_t num_submitted_wrs;
	uint64_t doorbell_updates;
};

struct spdk_rdma_provider_qp_stats {
	struct spdk_rdma_provider_wr_stats send;
	struct spdk_rdma_provider_wr_stats recv;
};

/* SPDK's spdk_memory_domain_transfer_data_cb; the sqdisc provider refuses qpairs that set it. */
typedef int (*sqd_spdk_domain_transfer_fn)(void);

struct spdk_rdma_provider_qp_init_attr {
	void *qp_context;
	struct ibv_cq *send_cq;
	struct ibv_cq *recv_cq;
	struct ibv_srq *srq;
	struct ibv_qp_cap cap; /* requested; the granted caps are written back */
	struct ibv_pd *pd;
	struct spdk_rdma_provider_qp_stats *stats; /* shared counters, or NULL for the qpair's own */
	sqd_spdk_domain_transfer_fn domain_transfer;
};

struct spdk_rdma_provider_send_wr_list {
	struct ibv_send_wr *first;
	struct ibv_send_wr *last;
};

struct spdk_rdma_provider_recv_wr_list {
	struct ibv_recv_wr *first;
	struct ibv_recv_wr *last;
};

/* A qpair. SPDK reads qp and domain; the rest is the provider's. */
struct spdk_rdma_provider_qp {
	struct ibv_qp *qp;
	struct rdma_cm_id *cm_id;
	struct spdk_memory_domain *domain;
	struct spdk_rdma_provider_send_wr_list send_wrs;
	struct spdk_rdma_provider_recv_wr_list recv_wrs;
	struct spdk_rdma_provider_qp_stats *stats;
	bool shared_stats;
};

struct spdk_rdma_provider_srq_init_attr {
	struct ibv_pd *pd;
	struct spdk_rdma_provider_wr_stats *stats; /* shared counters, or NULL */
	struct ibv_srq_init_attr srq_init_attr;    /* requested; the granted attributes are written back */
};

struct spdk_rdma_provider_srq {
	struct ibv_srq *srq;
	struct spdk_rdma_provider_recv_wr_list recv_wrs;
	struct spdk_rdma_provider_wr_stats *stats;
	bool shared_stats;
};

/* Creates an SRQ on init_attr->pd, managed by sqdisc. NULL on failure (logged through spdk_log). */
struct spdk_rdma_provider_srq *spdk_rdma_provider_srq_create(struct spdk_rdma_provider_srq_init_attr *init_attr);
/* Destroys an SRQ (NULL: 0). Receives still posted are released; EBUSY while qpairs still use it. */
int spdk_rdma_provider_srq_destroy(struct spdk_rdma_provider_srq *rdma_srq);
/* Appends a chain of receives to the SRQ's list; true iff the list was empty. */
bool spdk_rdma_provider_srq_queue_recv_wrs(struct spdk_rdma_provider_srq *rdma_srq, struct ibv_recv_wr *first);
/* Posts the queued receives in order; on failure returns an errno and *bad_wr is the first not posted. */
int spdk_rdma_provider_srq_flush_recv_wrs(struct spdk_rdma_provider_srq *rdma_srq, struct ibv_recv_wr **bad_wr);

/* Creates the qpair's RC QP (rdma_create_qp, or spdk_rdma_cm_create_qp where SPDK has it) and puts it under a
 * sqdisc queue on its CQs. Its worst case (max_send_wr + 1 CQEs on the send CQ, max_recv_wr on the receive CQ,
 * an SRQ's depth once per CQ) must fit what the CQs have left; they are grown with ibv_resize_cq if not, and
 * where they cannot grow the qpair signals every WR and needs max_send_wr on the send CQ. NULL when the QP
 * cannot be made or does not fit even so: the reason, with the numbers, goes to spdk_log. */
struct spdk_rdma_provider_qp *spdk_rdma_provider_qp_create(struct rdma_cm_id *cm_id,
		struct spdk_rdma_provider_qp_init_attr *qp_attr);
int spdk_rdma_provider_qp_accept(struct spdk_rdma_provider_qp *spdk_rdma_qp, struct rdma_conn_param *conn_param);
int spdk_rdma_provider_qp_complete_connect(struct spdk_rdma_provider_qp *spdk_rdma_qp);
/* Destroys the qpair and its QP. WRs still outstanding are released; their completions never reach SPDK. */
void spdk_rdma_provider_qp_destroy(struct spdk_rdma_provider_qp *spdk_rdma_qp);
/* Disconnects (rdma_disconnect, or spdk_rdma_cm_disconnect): the QP goes to the error state and every
 * outstanding WR flushes. */
int spdk_rdma_provider_qp_disconnect(struct spdk_rdma_provider_qp *spdk_rdma_qp);
/* Appends a chain of send WRs to the qpair's list; true iff the list was empty. */
bool spdk_rdma_provider_qp_queue_send_wrs(struct spdk_rdma_provider_qp *spdk_rdma_qp, struct ibv_send_wr *first);
/* Hands the queued WRs to the sqdisc queue in order (SQ slots, else its backlog: never ENOMEM); on failure
 * returns an errno and *bad_wr is the chain of exactly the WRs not taken. */
int spdk_rdma_provider_qp_flush_send_wrs(struct spdk_rdma_provider_qp *spdk_rdma_qp, struct ibv_send_wr **bad_wr);
bool spdk_rdma_provider_qp_queue_recv_wrs(struct spdk_rdma_provider_qp *spdk_rdma_qp, struct ibv_recv_wr *first);
int spdk_rdma_provider_qp_flush_recv_wrs(struct spdk_rdma_provider_qp *spdk_rdma_qp, struct ibv_recv_wr **bad_wr);
/* false: the sqdisc provider does not support accel sequences (as SPDK's verbs provider). */
bool spdk_rdma_provider_accel_sequence_supported(void);

#ifdef SQD_SPDK_ASSERT_LAYOUT
#include <stddef.h>
_Static_assert(sizeof(struct spdk_rdma_provider_qp_init_attr) == 80 &&
	       offsetof(struct spdk_rdma_provider_qp_init_attr, cap) == 32 &&
	       offsetof(struct spdk_rdma_provider_qp_init_attr, pd) == 56 &&
	       offsetof(struct spdk_rdma_provider_qp_init_attr, domain_transfer) == 72, "qp_init_attr layout");
_Static_assert(sizeof(struct spdk_rdma_provider_qp) == 72 &&
	       offsetof(struct spdk_rdma_provider_qp, domain) == 16 &&
	       offsetof(struct spdk_rdma_provider_qp, send_wrs) == 24 &&
	       offsetof(struct spdk_rdma_provider_qp, recv_wrs) == 40 &&
	       offsetof(struct spdk_rdma_provider_qp, stats) == 56 &&
	       offsetof(struct spdk_rdma_provider_qp, shared_stats) == 64, "qp layout");
_Static_assert(sizeof(struct spdk_rdma_provider_srq_init_attr) == 40 &&
	       offsetof(struct spdk_rdma_provider_srq_init_attr, srq_init_attr) == 16, "srq_init_attr layout");
_Static_assert(sizeof(struct spdk_rdma_provider_srq) == 40 &&
	       offsetof(struct spdk_rdma_provider_srq, stats) == 24 &&
	       offsetof(struct spdk_rdma_provider_srq, shared_stats) == 32, "srq layout");
_Static_assert(sizeof(struct spdk_rdma_provider_qp_stats) == 32, "qp_stats layout");
#endif
#endif /* SPDK_RDMA_H */

/* ---- sqdisc's view -------------------------------------------------------------------------------- */

/* The SPDK releases whose provider interface this library implements. */
#define SQD_SPDK_INTERFACE "SPDK v25.05, v25.09, v26.01, v26.05 and master (rdma_provider.h unchanged since commit d1c46ed8e5)"

/* Copies the sqdisc counters of a qpair's queue (credits, backlog, CQEs, markers...) into *out. Returns 0 or
 * -EINVAL (NULL argument). */
int sqd_spdk_qp_stats(const struct spdk_rdma_provider_qp *qp, struct sqd_queue_stats *out);

/* Copies the sqdisc counters of a CQ that qpairs of this provider use (capacity, reserved CQEs, CQEs
 * passed through...) into *out. `polls` counts the polls that went through sqdisc: an empty poll that the
 * provider answers from the device alone (nothing owed, no idle tail watched) is not counted. Returns 0,
 * -EINVAL (NULL argument), or -ENOENT (no qpair uses cq now). */
int sqd_spdk_cq_stats(struct ibv_cq *cq, struct sqd_cq_stats *out);

/* The provider's own counters of a qpair (sqd_spdk_qp_counters): the completions it handed SPDK with an error
 * status, and what it could not tell SPDK otherwise. Set `size` to sizeof(struct sqd_spdk_qp_counters) before the
 * call; later versions only add members at the end, and the call writes at most `size` bytes and sets `size` to
 * the bytes it wrote (the members past it are not this library's). */
struct sqd_spdk_qp_counters {
	uint32_t size;
	uint32_t qp_num;
	/* IBV_WC_WR_FLUSH_ERR completions handed to SPDK of send WRs that reached the SQ (the device's CQEs) */
	uint64_t send_flushes;
	/* ... of receives (the device's CQEs); on a qpair with an SRQ, every error completion of a receive, which
	 * the SRQ releases: not checked for duplicates */
	uint64_t recv_flushes;
	/* completions the provider made itself, handed to SPDK: WRs flushed from its backlog or posted after the QP
	 * failed (IBV_WC_WR_FLUSH_ERR), and WRs the device refused when posted from the backlog (see `refused`) */
	uint64_t owed_flushes;
	/* the device's CQEs with an error status other than a flush handed to SPDK (the failing WR's own) */
	uint64_t other_errors;
	/* error completions handed to SPDK for a WR that was owed none: a second completion of one post */
	uint64_t duplicates;
	/* error completions owed to SPDK and not handed yet; when SPDK destroys the qpair, those it never got */
	uint64_t owed;
	/* WRs the device refused (its post_send failed) when the provider posted them from the qpair's backlog,
	 * after SPDK's flush had taken them: each reaches SPDK as a completion with status IBV_WC_LOC_QP_OP_ERR and
	 * the errno in vendor_err; the first is logged through spdk_log */
	uint64_t refused;
	int32_t refused_errno; /* the newest such refusal's errno, else 0 */
	/* 1 when the qpair's CQ could not grow (ibv_resize_cq failed) to its worst case and the qpair signals every
	 * WR instead; logged through spdk_log once per CQ */
	uint32_t cq_not_grown;
	/* completions the device gave out of RC order: for a WQE a later completion had already retired (logged
	 * through spdk_log once per qpair, with the first one's WQE, wr_id and opcode), and of those, the ones handed
	 * to SPDK (of WRs SPDK signaled: its only completion of the WR) */
	uint64_t out_of_order;
	uint64_t out_of_order_shown;
};

#ifdef SQD_SPDK_ASSERT_LAYOUT
#include <stddef.h>
_Static_assert(sizeof(struct sqd_spdk_qp_counters) == 88 && offsetof(struct sqd_spdk_qp_counters, send_flushes) == 8 &&
	       offsetof(struct sqd_spdk_qp_counters, refused_errno) == 64 &&
	       offsetof(struct sqd_spdk_qp_counters, out_of_order) == 72, "sqd_spdk_qp_counters layout");
#endif

/* Copies the provider's counters of a qpair into *out (out->size set by the caller, see above). Returns 0, or
 * -EINVAL (NULL argument, out->size below 88, a qpair being destroyed). */
int sqd_spdk_qp_counters(const struct spdk_rdma_provider_qp *qp, struct sqd_spdk_qp_counters *out);

#ifdef __cplusplus
}
#endif

#endif /* SQDISC_SPDK_H */
