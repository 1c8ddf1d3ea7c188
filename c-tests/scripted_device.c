/* The scripted test device from C: creation, the real inline ibv_post_send / ibv_post_recv / ibv_poll_cq /
 * ibv_req_notify_cq of <infiniband/verbs.h>, and the scripting calls. Prints "PASS <name>" per check; exits
 * non-zero on the first failure. */

#include <sqdisc_scripted.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

static const char *current = "setup";

#define CHECK(cond)                                                                                        \
    do {                                                                                                   \
        if (!(cond)) {                                                                                     \
            fprintf(stderr, "FAIL %s: %s:%d: %s (last error: %s)\n", current, __FILE__, __LINE__, #cond,  \
                    sqd_last_error());                                                                     \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

#define CHECK_EQ(a, b)                                                                                     \
    do {                                                                                                   \
        long long a_ = (long long)(a), b_ = (long long)(b);                                                \
        if (a_ != b_) {                                                                                    \
            fprintf(stderr, "FAIL %s: %s:%d: %s == %lld, expected %s == %lld (last error: %s)\n", current, \
                    __FILE__, __LINE__, #a, a_, #b, b_, sqd_last_error());                                 \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

static void pass(void) { printf("PASS %s\n", current); }

static char buffer[4096];

static struct ibv_send_wr make_send(uint64_t wr_id, int signaled, struct ibv_sge *sge) {
    struct ibv_send_wr wr;
    memset(&wr, 0, sizeof wr);
    sge->addr = (uintptr_t)buffer;
    sge->length = 64;
    sge->lkey = 0x11;
    wr.wr_id = wr_id;
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    return wr;
}

static int post_one(struct ibv_qp *qp, uint64_t wr_id, int signaled) {
    struct ibv_sge sge;
    struct ibv_send_wr wr = make_send(wr_id, signaled, &sge), *bad = NULL;
    return ibv_post_send(qp, &wr, &bad);
}

static int post_recv_one(struct ibv_qp *qp, uint64_t wr_id) {
    struct ibv_sge sge = {.addr = (uintptr_t)buffer, .length = sizeof buffer, .lkey = 0x11};
    struct ibv_recv_wr wr = {.wr_id = wr_id, .next = NULL, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
    return ibv_post_recv(qp, &wr, &bad);
}

static struct sqd_scripted_qp_stats qp_stats(struct ibv_qp *qp) {
    struct sqd_scripted_qp_stats s;
    CHECK_EQ(sqd_scripted_qp_stats(qp, &s), 0);
    return s;
}

int main(void) {
    struct sqd_scripted *dev = NULL;
    struct ibv_cq *cq = NULL, *cq2 = NULL;
    struct ibv_qp *qp = NULL;
    struct ibv_wc wc[16];
    struct sqd_scripted_qp_caps caps = {
        .max_send_wr = 4, .max_recv_wr = 2, .max_send_sge = 2, .max_recv_sge = 1, .max_inline_data = 16};

    current = "create";
    CHECK_EQ(sqd_scripted_new(NULL), -EINVAL);
    CHECK_EQ(sqd_scripted_new(&dev), 0);
    CHECK(dev != NULL);
    CHECK(sqd_scripted_context(dev) != NULL);
    CHECK(sqd_scripted_pd(dev) != NULL);
    CHECK(sqd_scripted_pd(dev)->context == sqd_scripted_context(dev));
    CHECK(sqd_scripted_context(NULL) == NULL);
    CHECK_EQ(sqd_scripted_create_cq(dev, 0, &cq), -EINVAL);
    CHECK(strstr(sqd_last_error(), "cqe") != NULL);
    CHECK_EQ(sqd_scripted_create_cq(dev, 16, &cq), 0);
    CHECK_EQ(cq->cqe, 16);
    CHECK(cq->context == sqd_scripted_context(dev));
    CHECK_EQ(sqd_scripted_create_qp(dev, cq, cq, &caps, &qp), 0);
    CHECK(qp->context == sqd_scripted_context(dev));
    CHECK(qp->pd == sqd_scripted_pd(dev));
    CHECK(qp->send_cq == cq && qp->recv_cq == cq);
    CHECK(qp->qp_num != 0);
    CHECK_EQ(qp->qp_type, IBV_QPT_RC);
    CHECK_EQ(qp->state, IBV_QPS_RTS);
    {
        struct sqd_scripted_qp_caps got;
        CHECK_EQ(sqd_scripted_qp_caps(qp, &got), 0);
        CHECK(memcmp(&got, &caps, sizeof got) == 0);
    }
    pass();

    current = "bad_caps";
    {
        struct sqd_scripted_qp_caps bad = caps;
        struct ibv_qp *none = NULL;
        bad.max_send_wr = 0;
        CHECK_EQ(sqd_scripted_create_qp(dev, cq, cq, &bad, &none), -EINVAL);
        CHECK(strstr(sqd_last_error(), "max_send_wr") != NULL);
        bad = caps;
        bad.max_inline_data = 1u << 30;
        CHECK_EQ(sqd_scripted_create_qp(dev, cq, cq, &bad, &none), -EINVAL);
        CHECK_EQ(sqd_scripted_create_qp(dev, cq, NULL, &caps, &none), -EINVAL);
        CHECK_EQ(sqd_scripted_create_qp(dev, cq, cq, NULL, &none), -EINVAL);
        CHECK(none == NULL);
    }
    pass();

    current = "sq_full_enomem_bad_wr";
    {
        struct ibv_sge sges[6];
        struct ibv_send_wr wrs[6], *bad = NULL;
        for (int i = 0; i < 6; i++) {
            wrs[i] = make_send(100 + i, 0, &sges[i]);
            wrs[i].next = i < 5 ? &wrs[i + 1] : NULL;
        }
        CHECK_EQ(ibv_post_send(qp, wrs, &bad), ENOMEM);
        CHECK(bad == &wrs[4]);
        struct sqd_scripted_qp_stats s = qp_stats(qp);
        CHECK_EQ(s.wqes_posted, 4);
        CHECK_EQ(s.outstanding, 4);
        CHECK_EQ(s.doorbells, 1);
        CHECK_EQ(sqd_scripted_violation_count(dev), 1);
        char text[256];
        int len = sqd_scripted_violation(dev, 0, text, sizeof text);
        CHECK(len > 0 && (size_t)len == strlen(text));
        CHECK(strncmp(text, "SQ overflow", 11) == 0);
        char small[4];
        CHECK_EQ(sqd_scripted_violation(dev, 0, small, sizeof small), len);
        CHECK(strcmp(small, "SQ ") == 0);
        CHECK_EQ(sqd_scripted_violation(dev, 0, NULL, 0), len);
        CHECK_EQ(sqd_scripted_violation(dev, 1, text, sizeof text), -ENOENT);
    }
    pass();

    current = "unsignaled_never_frees";
    CHECK_EQ(sqd_scripted_complete(qp, 10), 4);
    CHECK_EQ(ibv_poll_cq(cq, 16, wc), 0);
    CHECK_EQ(post_one(qp, 200, 1), ENOMEM);
    CHECK_EQ(qp_stats(qp).outstanding, 4);
    {
        struct sqd_scripted_wqe w;
        CHECK_EQ(sqd_scripted_wqe(qp, 0, &w), 0);
        CHECK_EQ(w.wr_id, 100);
        CHECK_EQ(w.opcode, IBV_WR_SEND);
        CHECK_EQ(w.first_sge_length, 64);
        CHECK_EQ(w.first_sge_lkey, 0x11);
        CHECK(w.first_sge_addr == (uintptr_t)buffer);
        CHECK(w.executed && !w.signaled && !w.flushed);
        CHECK_EQ(sqd_scripted_wqe(qp, 4, &w), -ENOENT);
    }
    pass();

    /* A fresh QP on a shared CQ: signaled CQEs free slots when polled. */
    current = "signaled_frees_when_polled";
    {
        struct ibv_qp *qp2 = NULL;
        CHECK_EQ(sqd_scripted_create_qp(dev, cq, cq, &caps, &qp2), 0);
        CHECK(qp2->qp_num != qp->qp_num);
        CHECK_EQ(post_one(qp2, 1, 0), 0);
        CHECK_EQ(post_one(qp2, 2, 1), 0);
        CHECK_EQ(post_one(qp2, 3, 0), 0);
        CHECK_EQ(post_one(qp2, 4, 0), 0);
        CHECK_EQ(sqd_scripted_complete(qp2, 4), 4);
        CHECK_EQ(qp_stats(qp2).outstanding, 4);
        CHECK_EQ(ibv_req_notify_cq(cq, 0), 0);
        CHECK_EQ(ibv_poll_cq(cq, 16, wc), 1);
        CHECK_EQ(wc[0].wr_id, 2);
        CHECK_EQ(wc[0].status, IBV_WC_SUCCESS);
        CHECK_EQ(wc[0].opcode, IBV_WC_SEND);
        CHECK_EQ(wc[0].qp_num, qp2->qp_num);
        CHECK_EQ(qp_stats(qp2).outstanding, 2);
        CHECK_EQ(qp_stats(qp).outstanding, 4);
        struct sqd_scripted_cq_stats c;
        CHECK_EQ(sqd_scripted_cq_stats(cq, &c), 0);
        CHECK_EQ(c.arms, 1);
        CHECK_EQ(c.queued, 0);
        CHECK_EQ(sqd_scripted_destroy_qp(qp2), 0);
    }
    pass();

    current = "fail_then_flush";
    {
        struct ibv_qp *q = NULL;
        CHECK_EQ(sqd_scripted_create_cq(dev, 16, &cq2), 0);
        CHECK_EQ(sqd_scripted_create_qp(dev, cq2, cq2, &caps, &q), 0);
        CHECK_EQ(post_recv_one(q, 50), 0);
        CHECK_EQ(post_one(q, 1, 1), 0);
        CHECK_EQ(post_one(q, 2, 0), 0);
        CHECK_EQ(post_one(q, 3, 0), 0);
        CHECK_EQ(sqd_scripted_complete(q, 1), 1);
        CHECK_EQ(sqd_scripted_fail(q, IBV_WC_RETRY_EXC_ERR, 0x81), 0);
        CHECK_EQ(q->state, IBV_QPS_ERR);
        CHECK(qp_stats(q).in_error);
        CHECK_EQ(ibv_poll_cq(cq2, 16, wc), 4);
        CHECK_EQ(wc[0].wr_id, 1);
        CHECK_EQ(wc[0].status, IBV_WC_SUCCESS);
        CHECK_EQ(wc[1].wr_id, 2);
        CHECK_EQ(wc[1].status, IBV_WC_RETRY_EXC_ERR);
        CHECK_EQ(wc[1].vendor_err, 0x81);
        CHECK_EQ(wc[2].wr_id, 3);
        CHECK_EQ(wc[2].status, IBV_WC_WR_FLUSH_ERR);
        CHECK_EQ(wc[3].wr_id, 50);
        CHECK_EQ(wc[3].status, IBV_WC_WR_FLUSH_ERR);
        /* Posting to an errored QP: accepted, flushed at once even though unsignaled. */
        CHECK_EQ(post_one(q, 4, 0), 0);
        CHECK_EQ(ibv_poll_cq(cq2, 16, wc), 1);
        CHECK_EQ(wc[0].wr_id, 4);
        CHECK_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
        struct sqd_scripted_qp_stats s = qp_stats(q);
        CHECK_EQ(s.outstanding, 0);
        CHECK_EQ(s.recv_outstanding, 0);
        CHECK_EQ(s.flushed, 3);
        CHECK_EQ(sqd_scripted_fail(q, IBV_WC_RETRY_EXC_ERR, 0), -ENOENT);
        CHECK_EQ(sqd_scripted_destroy_cq(cq2), -EBUSY);
        CHECK_EQ(sqd_scripted_destroy_qp(q), 0);
        CHECK_EQ(sqd_scripted_destroy_cq(cq2), 0);
    }
    pass();

    current = "receive_and_set_error";
    {
        struct ibv_qp *q = NULL;
        uint32_t imm = htonl(0xabcd);
        CHECK_EQ(sqd_scripted_create_cq(dev, 16, &cq2), 0);
        CHECK_EQ(sqd_scripted_create_qp(dev, cq2, cq2, &caps, &q), 0);
        CHECK_EQ(sqd_scripted_deliver(q, 10, NULL), -ENOENT);
        CHECK_EQ(post_recv_one(q, 60), 0);
        CHECK_EQ(post_recv_one(q, 61), 0);
        CHECK_EQ(post_recv_one(q, 62), ENOMEM);
        CHECK_EQ(sqd_scripted_deliver(q, 123, &imm), 0);
        CHECK_EQ(ibv_poll_cq(cq2, 16, wc), 1);
        CHECK_EQ(wc[0].wr_id, 60);
        CHECK_EQ(wc[0].opcode, IBV_WC_RECV);
        CHECK_EQ(wc[0].byte_len, 123);
        CHECK(wc[0].wc_flags & IBV_WC_WITH_IMM);
        CHECK_EQ(ntohl(wc[0].imm_data), 0xabcd);
        CHECK_EQ(post_one(q, 7, 0), 0);
        CHECK_EQ(sqd_scripted_set_error(q), 0);
        CHECK_EQ(ibv_poll_cq(cq2, 16, wc), 2);
        CHECK_EQ(wc[0].wr_id, 7);
        CHECK_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
        CHECK_EQ(wc[1].wr_id, 61);
        CHECK_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
    }
    pass();

    current = "cq_overrun";
    {
        struct ibv_cq *tiny = NULL;
        struct ibv_qp *q = NULL;
        int before = sqd_scripted_violation_count(dev);
        CHECK_EQ(sqd_scripted_create_cq(dev, 1, &tiny), 0);
        CHECK_EQ(sqd_scripted_create_qp(dev, tiny, tiny, &caps, &q), 0);
        CHECK_EQ(post_one(q, 1, 1), 0);
        CHECK_EQ(post_one(q, 2, 1), 0);
        CHECK_EQ(sqd_scripted_complete(q, 2), 2);
        struct sqd_scripted_cq_stats c;
        CHECK_EQ(sqd_scripted_cq_stats(tiny, &c), 0);
        CHECK_EQ(c.overruns, 1);
        CHECK(c.in_error);
        CHECK_EQ(sqd_scripted_violation_count(dev), before + 1);
        char text[256];
        CHECK(sqd_scripted_violation(dev, (size_t)before, text, sizeof text) > 0);
        CHECK(strncmp(text, "CQ overrun", 10) == 0);
        CHECK_EQ(ibv_poll_cq(tiny, 16, wc), 1);
        CHECK_EQ(wc[0].wr_id, 1);
    }
    pass();

    current = "null_arguments";
    CHECK_EQ(sqd_scripted_complete(NULL, 1), -EINVAL);
    CHECK_EQ(sqd_scripted_complete(qp, -1), -EINVAL);
    CHECK_EQ(sqd_scripted_qp_stats(qp, NULL), -EINVAL);
    CHECK_EQ(sqd_scripted_cq_stats(NULL, NULL), -EINVAL);
    CHECK_EQ(sqd_scripted_destroy_qp(NULL), -EINVAL);
    CHECK_EQ(sqd_scripted_violation_count(NULL), -EINVAL);
    pass();

    current = "free";
    sqd_scripted_free(dev); /* frees every CQ and QP still alive */
    sqd_scripted_free(NULL);
    pass();
    return 0;
}
