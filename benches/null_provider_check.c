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

    /* Echo with an SRQ: the SRQ keeps receives up to its depth; a SEND completes the oldest waiting one with a
     * receive CQE naming the QP, as does null_qp_deliver; a QP without an SRQ is refused on such a device. */
    struct null_device *dev4 = null_device_new();
    CHECK(dev4 && null_device_set_echo_srq(dev4) == 0);
    struct ibv_cq *cq4 = null_create_cq(dev4, 16);
    struct ibv_srq_init_attr sa;
    memset(&sa, 0, sizeof sa);
    sa.attr.max_wr = 3;
    struct ibv_srq *srq = null_create_srq(dev4, &sa);
    CHECK(cq4 && srq && srq->context == cq4->context);
    attr.send_cq = attr.recv_cq = cq4;
    attr.srq = NULL;
    CHECK(null_create_qp(dev4, &attr) == NULL);
    attr.srq = srq;
    struct ibv_qp *qp4 = null_create_qp(dev4, &attr);
    CHECK(qp4 && qp4->srq == srq);
    struct ibv_recv_wr rw[4], *rbad = NULL;
    memset(rw, 0, sizeof rw);
    for (int i = 0; i < 4; i++) {
        rw[i].wr_id = 100 + (uint64_t)i;
        rw[i].next = i + 1 < 4 ? &rw[i + 1] : NULL;
    }
    CHECK(ibv_post_srq_recv(srq, rw, &rbad) == ENOMEM && rbad == &rw[3]);
    CHECK(null_qp_deliver(qp4, 1) == 1);
    CHECK(post(qp4, 7, IBV_SEND_SIGNALED, NULL) == 0);
    CHECK(ibv_poll_cq(cq4, 8, wc) == 3);
    CHECK(wc[0].opcode == IBV_WC_RECV && wc[0].wr_id == 100 && wc[0].qp_num == qp4->qp_num);
    CHECK(wc[1].opcode == IBV_WC_SEND && wc[1].wr_id == 7);
    CHECK(wc[2].opcode == IBV_WC_RECV && wc[2].wr_id == 101 && wc[2].status == IBV_WC_SUCCESS);
    CHECK(null_qp_deliver(qp4, 5) == 1); /* one receive left waiting */
    CHECK(ibv_poll_cq(cq4, 8, wc) == 1 && wc[0].wr_id == 102);
    rw[3].next = NULL;
    CHECK(ibv_post_srq_recv(srq, &rw[3], &rbad) == 0); /* the completed ones freed their room */

    /* Echo without an SRQ: the QP's own receives, completed the same way; a QP on an SRQ is refused. */
    struct null_device *dev5 = null_device_new();
    CHECK(dev5 && null_device_set_echo(dev5) == 0);
    struct ibv_cq *cq5 = null_create_cq(dev5, 16);
    attr.send_cq = attr.recv_cq = cq5;
    attr.cap.max_recv_wr = 2;
    CHECK(null_create_qp(dev5, &attr) == NULL);
    attr.srq = NULL;
    struct ibv_qp *qp5 = null_create_qp(dev5, &attr);
    CHECK(qp5);
    rw[1].next = NULL;
    CHECK(ibv_post_recv(qp5, rw, &rbad) == 0);
    CHECK(post(qp5, 8, IBV_SEND_SIGNALED, NULL) == 0 && null_qp_deliver(qp5, 2) == 1);
    CHECK(ibv_poll_cq(cq5, 8, wc) == 3 && wc[0].wr_id == 8 && wc[1].wr_id == 100 && wc[2].wr_id == 101);

    null_destroy_qp(qp4);
    CHECK(null_destroy_srq(srq) == 0);
    null_destroy_cq(cq4);
    null_destroy_qp(qp5);
    null_destroy_cq(cq5);
    CHECK(null_device_free(dev4) == 0 && null_device_free(dev5) == 0);

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
