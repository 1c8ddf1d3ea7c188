/* null_provider_check: the null provider (benches/null_provider.c) behaves as null_provider.h says, so that the
 * benchmark's yardstick is a provider that a moderation bug would trip over. Run by `make bench-guard`.
 * Through the inline ibv_post_send/ibv_poll_cq only, as the posters use it. Prints "null provider: ok" or exits
 * non-zero naming the first check that failed. */

#include "null_provider.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                                        \
    do {                                                                                                   \
        if (!(cond)) {                                                                                     \
            fprintf(stderr, "null_provider_check: line %d: %s\n", __LINE__, #cond);                       \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

#define DEPTH 4

static int post(struct ibv_qp *qp, uint64_t wr_id, unsigned flags, uint64_t *bad_id)
{
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = flags;
    int ret = ibv_post_send(qp, &wr, &bad);
    if (ret && bad_id)
        *bad_id = bad ? bad->wr_id : ~0ull;
    return ret;
}

int main(void)
{
    struct null_device *dev = null_device_new();
    CHECK(dev);
    struct ibv_cq *cq = null_create_cq(dev, 3);
    CHECK(cq && cq->cqe == 4 && cq->context);
    struct ibv_qp_init_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.send_cq = cq;
    attr.recv_cq = cq;
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = DEPTH;
    struct ibv_qp *qp = null_create_qp(dev, &attr);
    CHECK(qp && qp->context == cq->context && qp->send_cq == cq && qp->state == IBV_QPS_RTS);
    CHECK(verbs_get_ctx(qp->context) != NULL); /* an extended context, as real providers have */

    /* Unsignaled WQEs hold their slots: the fifth post finds none. */
    uint64_t bad_id = 0;
    for (uint64_t i = 0; i < DEPTH; i++)
        CHECK(post(qp, i, 0, NULL) == 0);
    struct ibv_wc wc[8];
    CHECK(ibv_poll_cq(cq, 8, wc) == 0);
    CHECK(post(qp, 99, IBV_SEND_SIGNALED, &bad_id) == ENOMEM && bad_id == 99);

    /* A chain stops at the first WR without a slot; *bad_wr names it. */
    struct null_device *dev2 = null_device_new();
    struct ibv_cq *cq2 = null_create_cq(dev2, 8);
    attr.send_cq = attr.recv_cq = cq2;
    struct ibv_qp *qp2 = null_create_qp(dev2, &attr);
    CHECK(qp2);
    struct ibv_send_wr chain[DEPTH + 2], *bad = NULL;
    memset(chain, 0, sizeof chain);
    for (int i = 0; i < DEPTH + 2; i++) {
        chain[i].wr_id = (uint64_t)i;
        chain[i].opcode = IBV_WR_SEND;
        chain[i].send_flags = i == 1 ? IBV_SEND_SIGNALED : 0;
        chain[i].next = i + 1 < DEPTH + 2 ? &chain[i + 1] : NULL;
    }
    CHECK(ibv_post_send(qp2, chain, &bad) == ENOMEM && bad == &chain[DEPTH]);

    /* Only the signaled WQE makes a CQE, at once; it frees its slot and every slot before it (2 of 4). */
    CHECK(ibv_poll_cq(qp2->send_cq, 8, wc) == 1);
    CHECK(wc[0].wr_id == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].opcode == IBV_WC_SEND &&
          wc[0].qp_num == qp2->qp_num);
    CHECK(post(qp2, 10, 0, NULL) == 0 && post(qp2, 11, 0, NULL) == 0);
    CHECK(post(qp2, 12, 0, &bad_id) == ENOMEM && bad_id == 12);
    CHECK(ibv_poll_cq(cq2, 8, wc) == 0);

    struct null_stats s;
    null_device_stats(dev2, &s);
    CHECK(s.wqes == DEPTH + 2 && s.cqes == 1 && s.doorbells == 3 && s.refused == 2);

    /* A CQ overrun is reported by every later poll. */
    struct ibv_cq *small = null_create_cq(dev2, 1);
    attr.send_cq = attr.recv_cq = small;
    struct ibv_qp *qp3 = null_create_qp(dev2, &attr);
    CHECK(small && qp3);
    CHECK(post(qp3, 1, IBV_SEND_SIGNALED, NULL) == 0 && post(qp3, 2, IBV_SEND_SIGNALED, NULL) == 0);
    errno = 0;
    CHECK(ibv_poll_cq(small, 8, wc) == -1 && errno == EOVERFLOW);

    CHECK(null_device_free(dev) == -1); /* objects left */
    null_destroy_qp(qp);
    null_destroy_cq(cq);
    null_destroy_qp(qp2);
    null_destroy_qp(qp3);
    null_destroy_cq(cq2);
    null_destroy_cq(small);
    CHECK(null_device_free(dev) == 0 && null_device_free(dev2) == 0);
    printf("null provider: ok\n");
    return 0;
}
