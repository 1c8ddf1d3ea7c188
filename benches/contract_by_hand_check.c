/* contract_by_hand_check: the by-hand reference (benches/contract_by_hand.c) keeps what its header says on the
 * null provider, paths the benchmark's loop never takes included: a bad WR refused with the WRs before it
 * posted and the chain put back, a post with no free slot refused, a WR the ULP signals returned by the poll
 * with its wr_id, an idle unsignaled tail covered, every WR released once and in order, chains posted across
 * the end of the tokens' sequence field, an indexed queue's batches by index. Run by `make bench-guard`. Prints
 * "by-hand reference: ok" or exits non-zero naming the first check that failed. */

#include "contract_by_hand.h"
#include "null_provider.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                                        \
    do {                                                                                                   \
        if (!(cond)) {                                                                                     \
            fprintf(stderr, "contract_by_hand_check: line %d: %s\n", __LINE__, #cond);                    \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

#define DEPTH 8
#define INTERVAL 4
#define LONG 64 /* 16 intervals in one post */

static uint64_t released, next_index;

static void on_release(void *ctx, const struct sqd_completion *c)
{
    (void)ctx;
    CHECK(c->wr_id == 100 + released && c->status == IBV_WC_SUCCESS && c->opcode == IBV_WC_SEND);
    released++;
}

static void on_batch(void *ctx, const struct sqd_release_batch *b)
{
    (void)ctx;
    CHECK(b->wr_ids == NULL && b->first == next_index && b->status == IBV_WC_SUCCESS && b->count > 0);
    next_index += b->count;
}

static struct ibv_sge sge = {.addr = 0x1000, .length = 64, .lkey = 1};

/* A chain of n SENDs with wr_ids from `first`. */
static void chain(struct ibv_send_wr *wr, unsigned n, uint64_t first)
{
    for (unsigned i = 0; i < n; i++)
        wr[i] = (struct ibv_send_wr){.wr_id = first + i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                                     .next = i + 1 < n ? &wr[i + 1] : NULL};
}

static int poll_all(struct hand_cq *cq, struct ibv_wc *wc)
{
    int n, all = 0;
    while ((n = hand_cq_poll(cq, 16, wc + all)) > 0)
        all += n;
    CHECK(n == 0);
    return all;
}

int main(void)
{
    struct null_device *dev = null_device_new();
    CHECK(dev);
    struct ibv_cq *cq = null_create_cq(dev, 64);
    struct ibv_qp_init_attr attr = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                    .cap = {.max_send_wr = DEPTH, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *qp = null_create_qp(dev, &attr), *qp2 = null_create_qp(dev, &attr);
    CHECK(cq && qp && qp2);
    struct hand_cq *hcq = hand_cq_new(cq);
    struct hand_queue *q = hand_queue_new(hcq, qp, DEPTH, 1, INTERVAL, on_release, NULL);
    CHECK(hcq && q);
    struct ibv_send_wr wr[DEPTH + 2], *bad;
    struct ibv_wc wc[32];
    struct hand_stats st;

    /* A bad WR in the middle (num_sge above max_send_sge): the two before it posted, the chain put back. */
    chain(wr, 4, 100);
    wr[2].num_sge = 2;
    CHECK(hand_post_send(q, wr, &bad) == -EINVAL && bad == &wr[2]);
    CHECK(wr[0].wr_id == 100 && wr[1].wr_id == 101 && wr[1].next == &wr[2] && wr[0].send_flags == 0);
    hand_queue_stats(q, &st);
    CHECK(st.accepted == 2 && st.doorbells == 1);

    /* A WR the ULP signals: its CQE is returned with its wr_id, and it releases the WRs before it. */
    chain(wr, 2, 102);
    wr[1].send_flags = IBV_SEND_SIGNALED;
    CHECK(hand_post_send(q, wr, &bad) == 0 && bad == NULL && wr[1].wr_id == 103);
    CHECK(poll_all(hcq, wc) == 1 && wc[0].wr_id == 103 && wc[0].status == IBV_WC_SUCCESS && released == 4);

    /* Every slot taken: the WRs with a free slot posted (the last of them signaled, as it takes the last
     * slot), the next refused. */
    chain(wr, DEPTH + 1, 104);
    CHECK(hand_post_send(q, wr, &bad) == -ENOBUFS && bad == &wr[DEPTH]);
    CHECK(wr[DEPTH - 1].send_flags == 0 && wr[DEPTH - 1].wr_id == 104 + DEPTH - 1);
    CHECK(poll_all(hcq, wc) == 0 && released == 4 + DEPTH);

    /* An unsignaled tail (one WR) covered once a poll cycle passes without a post. */
    chain(wr, 1, 104 + DEPTH);
    CHECK(hand_post_send(q, wr, &bad) == 0);
    CHECK(poll_all(hcq, wc) == 0 && released == 4 + DEPTH); /* posted in this cycle: not idle yet */
    CHECK(poll_all(hcq, wc) == 0 && released == 4 + DEPTH); /* idle: the marker posted */
    CHECK(poll_all(hcq, wc) == 0 && released == 5 + DEPTH); /* the marker's CQE */
    hand_queue_stats(q, &st);
    CHECK(st.accepted == 5 + DEPTH && st.released == st.accepted);

    /* A chain of more intervals than the restore's list holds: every WR's flags put back all the same. */
    struct ibv_qp_init_attr deep = attr;
    deep.cap.max_send_wr = LONG;
    struct ibv_qp *qp3 = null_create_qp(dev, &deep);
    CHECK(qp3);
    struct hand_queue *ql = hand_queue_new(hcq, qp3, LONG, 1, INTERVAL, on_release, NULL);
    CHECK(ql);
    static struct ibv_send_wr long_chain[LONG];
    released = 0;
    chain(long_chain, LONG, 100);
    CHECK(hand_post_send(ql, long_chain, &bad) == 0);
    for (unsigned i = 0; i < LONG; i++)
        CHECK(long_chain[i].send_flags == 0 && long_chain[i].wr_id == 100 + i);
    CHECK(poll_all(hcq, wc) == 0 && released == LONG);

    /* Chains posted across the end of the tokens' sequence field: found and released as any others. */
    struct ibv_qp *qp4 = null_create_qp(dev, &attr);
    struct hand_queue *qw = hand_queue_new(hcq, qp4, DEPTH, 1, INTERVAL, on_release, NULL);
    CHECK(qp4 && qw);
    hand_queue_start_at(qw, (UINT64_C(1) << 48) - 3);
    released = 0;
    for (unsigned round = 0; round < 3; round++) {
        chain(wr, INTERVAL, 100 + round * INTERVAL);
        CHECK(hand_post_send(qw, wr, &bad) == 0);
        CHECK(poll_all(hcq, wc) == 0 && released == (round + 1) * INTERVAL);
    }

    /* An indexed queue on the same CQ: batches from index 0 on, across a covered tail. */
    struct hand_queue *qi = hand_queue_new_indexed(hcq, qp2, DEPTH, 1, INTERVAL, on_batch, NULL);
    CHECK(qi);
    for (int round = 0; round < 5; round++) {
        chain(wr, 3, 0);
        CHECK(hand_post_send_indexed(qi, wr, &bad) == 0);
        poll_all(hcq, wc);
    }
    for (int i = 0; i < 3; i++)
        poll_all(hcq, wc);
    hand_queue_stats(qi, &st);
    CHECK(st.accepted == 15 && st.released == 15 && next_index == 15);

    hand_queue_free(q);
    hand_queue_free(qw);
    hand_queue_free(ql);
    hand_queue_free(qi);
    hand_cq_free(hcq);
    CHECK(null_destroy_qp(qp) == 0 && null_destroy_qp(qp2) == 0 && null_destroy_qp(qp3) == 0 &&
          null_destroy_qp(qp4) == 0 && null_destroy_cq(cq) == 0);
    CHECK(null_device_free(dev) == 0);
    printf("by-hand reference: ok\n");
    return 0;
}
