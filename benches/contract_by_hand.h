/* contract_by_hand: the default API's per-WR promises kept by hand, in plain C, without sqdisc: what a ULP pays
 * to keep them itself (the `by-hand` poster of benches/sqd_bench.c, a reference row of `make bench`). Written
 * once with care for its common path (locals for what the walks' stores could alias, one walk per post, the
 * opcode and flags tested as one word against a per-opcode table, tokens counted), without the per-path
 * specializations of sqdisc's own path. Not a library: one thread, no backlog.
 *
 * What it keeps of sqdisc's contract, on the path the bench runs:
 *   - every WR checked before the provider sees it (the opcode a plain RC send opcode, the flags FENCE, SIGNALED,
 *     SOLICITED only, num_sge within max_send_sge, a non-NULL sg_list: sqdisc also takes a NULL list with no
 *     SGE, through its full checks), a bad one refused with -EINVAL and *bad;
 *   - credits: a WR is posted only into a free SQ slot;
 *   - moderated signaling: the WR the ULP signals, every interval-th WR and the WR that takes the last free slot
 *     are posted with IBV_SEND_SIGNALED;
 *   - each WR posted with a token (the queue's index and the WR's sequence number) as its wr_id, the ULP's wr_id
 *     kept in a ring slot; the chain restored as the ULP built it once the provider took it (wr_ids, flags);
 *     one provider call per post call;
 *   - a CQE found by its token: the queue's table entry, its QP number, the sequence number within the WRs
 *     posted and not completed (anything else is dropped); only the ULP's signaled WRs' CQEs are
 *     returned by the poll, with the ULP's wr_id;
 *   - one release callback per WR, in post order, exactly once, with its wr_id, status and opcode; the release
 *     point moved before each callback, so that a callback may post into the slot its WR freed;
 *   - an unsignaled tail covered when its queue goes idle (a poll cycle with no post to it): a signaled
 *     zero-length RDMA WRITE;
 *   - the counters sqd_queue_stats shows: accepted, released, CQEs, doorbells.
 * What it leaves out: the backlog (a post with no credit for a WR fails with -ENOBUFS: the bench waits for
 * room, so its common path pays only the credit test), locks, deferred actions and MR tracking (a state byte's
 * test in sqdisc), receives, and the recovery of a failed QP (an error CQE is released with its status). */
#ifndef SQD_CONTRACT_BY_HAND_H
#define SQD_CONTRACT_BY_HAND_H

#include <sqdisc.h>

#include <infiniband/verbs.h>
#include <stdint.h>

struct hand_cq;
struct hand_queue;

struct hand_cq *hand_cq_new(struct ibv_cq *cq);
void hand_cq_free(struct hand_cq *cq);

/* A queue on `cq` for `qp`, of `sq_depth` (a power of two) slots, signal interval `interval`, with the release
 * callback `release` (sqdisc's signature), or none (NULL: as a ULP that learns of failures from the error CQEs
 * the poll returns, and needs no call for a success, as libsqdisc_spdk uses sqdisc). */
struct hand_queue *hand_queue_new(struct hand_cq *cq, struct ibv_qp *qp, uint32_t sq_depth, uint32_t max_send_sge,
                                    uint32_t interval, void (*release)(void *, const struct sqd_completion *), void *ctx);
/* A queue that names its WRs by index (as SQD_QUEUE_INDEXED): no wr_id kept or restored, the releases of each
 * CQE handed to `batch` (sqdisc's signature, wr_ids NULL), as with sqd_queue_set_release_batch. Post to it with
 * hand_post_send_indexed. */
struct hand_queue *hand_queue_new_indexed(struct hand_cq *cq, struct ibv_qp *qp, uint32_t sq_depth,
                                          uint32_t max_send_sge, uint32_t interval,
                                          void (*batch)(void *, const struct sqd_release_batch *), void *ctx);
/* For the reference's own check: a queue with nothing posted yet numbers its WRs from `seq` on (to post across
 * the end of the tokens' sequence field). */
void hand_queue_start_at(struct hand_queue *q, uint64_t seq);
void hand_queue_free(struct hand_queue *q);

int hand_post_send(struct hand_queue *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int hand_post_send_indexed(struct hand_queue *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int hand_cq_poll(struct hand_cq *cq, int num_entries, struct ibv_wc *wc);

struct hand_stats {
    uint64_t accepted, released, cqes, doorbells;
};
void hand_queue_stats(const struct hand_queue *q, struct hand_stats *out);

#endif
