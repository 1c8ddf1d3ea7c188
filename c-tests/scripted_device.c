/* The scripted test device from C: creation, the real inline ibv_post_send / ibv_post_recv / ibv_poll_cq /
 * ibv_req_notify_cq of <infiniband/verbs.h>, and the scripting calls. The scenarios build on each other's
 * device state, so the first that fails (its "FAIL <name>: ..." line) stops the run; each passed one prints
 * "PASS <name>". */

#include "support/harness.h"

#include <arpa/inet.h>

static char buffer[4096];

static struct ibv_send_wr make_send(uint64_t wr_id, int signaled, struct ibv_sge *sge)
{
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

static int post_one(struct ibv_qp *qp, uint64_t wr_id, int signaled)
{
    struct ibv_sge sge;
    struct ibv_send_wr wr = make_send(wr_id, signaled, &sge), *bad = NULL;
    return ibv_post_send(qp, &wr, &bad);
}

static int post_recv_one(struct ibv_qp *qp, uint64_t wr_id)
{
    struct ibv_sge sge = {.addr = (uintptr_t)buffer, .length = sizeof buffer, .lkey = 0x11};
    struct ibv_recv_wr wr = {.wr_id = wr_id, .next = NULL, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
    return ibv_post_recv(qp, &wr, &bad);
}

static struct sqd_scripted_qp_stats qp_stats(struct ibv_qp *qp)
{
    struct sqd_scripted_qp_stats s;
    CHECK_EQ(sqd_scripted_qp_stats(qp, &s), 0);
    return s;
}

/* The state the scenarios share, in the order they make it. */
static struct sqd_scripted *dev;
static struct ibv_cq *cq, *cq2;
static struct ibv_qp *qp;
static struct ibv_wc wc[16];
static const struct sqd_scripted_qp_caps caps = {
    .max_send_wr = 4, .max_recv_wr = 2, .max_send_sge = 2, .max_recv_sge = 1, .max_inline_data = 16};

static void create(void)
{
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
}

static void bad_caps(void)
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

static void sq_full_enomem_bad_wr(void)
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

static void unsignaled_never_frees(void)
{
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
}

/* A fresh QP on a shared CQ: signaled CQEs free slots when polled. */
static void signaled_frees_when_polled(void)
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

static void fail_then_flush(void)
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

static void receive_and_set_error(void)
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

static void cq_overrun(void)
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

static void memory_registration(void)
{
    static unsigned char region[256];
    struct ibv_mr *a = NULL, *b = NULL, *none = NULL;
    CHECK_EQ(sqd_scripted_mr_count(dev), 0);
    CHECK_EQ(sqd_scripted_reg_mr(dev, region, sizeof region, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, &a), 0);
    CHECK_EQ(sqd_scripted_reg_mr(dev, region + 128, 128, 0, &b), 0);
    CHECK_EQ(sqd_scripted_mr_count(dev), 2);
    CHECK(a->context == sqd_scripted_context(dev));
    CHECK(a->pd == sqd_scripted_pd(dev));
    CHECK(a->addr == region);
    CHECK_EQ(a->length, sizeof region);
    CHECK(b->addr == region + 128);
    CHECK_EQ(b->length, 128);
    uint32_t keys[4] = {a->lkey, a->rkey, b->lkey, b->rkey};
    for (int i = 0; i < 4; i++) {
        CHECK(keys[i] != 0);
        for (int j = 0; j < i; j++)
            CHECK(keys[i] != keys[j]);
    }
    CHECK_EQ(sqd_scripted_dereg_mr(a), 0);
    CHECK_EQ(sqd_scripted_mr_count(dev), 1);
    CHECK_EQ(sqd_scripted_dereg_mr(a), -EINVAL); /* deregistered already: looked up, never read */
    CHECK(strstr(sqd_last_error(), "not a registered MR") != NULL);
    CHECK_EQ(sqd_scripted_dereg_mr(NULL), -EINVAL);
    CHECK_EQ(sqd_scripted_reg_mr(NULL, region, 1, 0, &none), -EINVAL);
    CHECK_EQ(sqd_scripted_reg_mr(dev, region, 1, 0, NULL), -EINVAL);
    CHECK(none == NULL);
    CHECK_EQ(sqd_scripted_mr_count(NULL), -EINVAL);
    CHECK_EQ(sqd_scripted_mr_count(dev), 1); /* `b` stays: sqd_scripted_free frees it */
}

static void local_inv_recorded(void)
{
    struct ibv_qp *q = NULL;
    struct ibv_cq *c = NULL;
    CHECK_EQ(sqd_scripted_create_cq(dev, 8, &c), 0);
    CHECK_EQ(sqd_scripted_create_qp(dev, c, c, &caps, &q), 0);
    struct ibv_send_wr inv, *bad = NULL;
    memset(&inv, 0, sizeof inv);
    inv.wr_id = 31;
    inv.opcode = IBV_WR_LOCAL_INV;
    inv.send_flags = IBV_SEND_SIGNALED | IBV_SEND_FENCE;
    inv.invalidate_rkey = 0xbeef;
    CHECK_EQ(ibv_post_send(q, &inv, &bad), 0);
    struct sqd_scripted_wqe w;
    CHECK_EQ(sqd_scripted_wqe(q, 0, &w), 0);
    CHECK_EQ(w.opcode, IBV_WR_LOCAL_INV);
    CHECK_EQ(w.imm_data, 0xbeef); /* invalidate_rkey shares the field */
    CHECK_EQ(w.send_flags, IBV_SEND_SIGNALED | IBV_SEND_FENCE);
    CHECK_EQ(w.num_sge, 0);
    CHECK_EQ(sqd_scripted_complete(q, 1), 1);
    CHECK_EQ(ibv_poll_cq(c, 16, wc), 1);
    CHECK_EQ(wc[0].wr_id, 31);
    CHECK_EQ(wc[0].status, IBV_WC_SUCCESS);
    CHECK_EQ(wc[0].opcode, IBV_WC_LOCAL_INV);
    CHECK_EQ(sqd_scripted_destroy_qp(q), 0);
    CHECK_EQ(sqd_scripted_destroy_cq(c), 0);
}

static void null_arguments(void)
{
    CHECK_EQ(sqd_scripted_complete(NULL, 1), -EINVAL);
    CHECK_EQ(sqd_scripted_complete(qp, -1), -EINVAL);
    CHECK_EQ(sqd_scripted_qp_stats(qp, NULL), -EINVAL);
    CHECK_EQ(sqd_scripted_cq_stats(NULL, NULL), -EINVAL);
    CHECK_EQ(sqd_scripted_destroy_qp(NULL), -EINVAL);
    CHECK_EQ(sqd_scripted_violation_count(NULL), -EINVAL);
}

static void free_device(void)
{
    sqd_scripted_free(dev); /* frees every CQ and QP still alive */
    dev = NULL;
    sqd_scripted_free(NULL);
}

int main(void)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } scenarios[] = {
        {"create", create},
        {"bad_caps", bad_caps},
        {"sq_full_enomem_bad_wr", sq_full_enomem_bad_wr},
        {"unsignaled_never_frees", unsignaled_never_frees},
        {"signaled_frees_when_polled", signaled_frees_when_polled},
        {"fail_then_flush", fail_then_flush},
        {"receive_and_set_error", receive_and_set_error},
        {"cq_overrun", cq_overrun},
        {"memory_registration", memory_registration},
        {"local_inv_recorded", local_inv_recorded},
        {"null_arguments", null_arguments},
        {"free", free_device},
    };
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0] && !failures; i++)
        run(scenarios[i].name, scenarios[i].fn);
    sqd_scripted_free(dev); /* NULL unless a scenario failed before "free" */
    return harness_finish("scripted_device");
}
