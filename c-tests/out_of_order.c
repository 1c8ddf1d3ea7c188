/* A provider that completes send WQEs out of RC order, through the C API: the late completion of a WR the ULP
 * signaled is shown by sqd_cq_poll with its wr_id, the first such completion is kept in sqd_cq_out_of_order
 * and described once by sqd_cq_out_of_order_message, and bad arguments get -EINVAL.
 *
 * The scripted device completes in order; a poll op of this test, put into the device context's ops before the
 * CQ is taken under management, returns the first two CQEs it meets in the opposite order while `swaps` is set.
 *
 * Mirrors tests/out_of_order.rs. Each scenario prints "PASS <name>" or "FAIL <name>: <why>". */

#include "support/harness.h"

static int (*device_poll)(struct ibv_cq *, int, struct ibv_wc *);
static struct ibv_wc held[64];
static int nheld;
static int swaps;

static int reordering_poll(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    for (;;) {
        int got = device_poll(cq, 64 - nheld, held + nheld);
        if (got < 0)
            return got;
        nheld += got;
        if (got == 0 || nheld == 64)
            break;
    }
    if (swaps > 0 && nheld >= 2) {
        struct ibv_wc first = held[0];
        held[0] = held[1];
        held[1] = first;
        swaps--;
    }
    int k = nheld < n ? nheld : n;
    memcpy(wc, held, (size_t)k * sizeof *wc);
    memmove(held, held + k, (size_t)(nheld - k) * sizeof *held);
    nheld -= k;
    return k;
}

/* One queue on a fresh device whose managed CQ polls through reordering_poll. */
static struct mq *reordering_rig(struct qcfg cfg)
{
    struct rig *r = calloc(1, sizeof *r);
    CHECK(r != NULL);
    the_rig = r;
    CHECK_EQ(sqd_scripted_new(&r->dev), 0);
    CHECK_EQ(sqd_scripted_create_cq(r->dev, 64, &r->cq), 0);
    device_poll = r->cq->context->ops.poll_cq;
    r->cq->context->ops.poll_cq = reordering_poll;
    nheld = 0;
    swaps = 0;
    CHECK_EQ(sqd_cq_new(r->cq, &r->scq), 0);
    return add_queue(r, cfg);
}

static unsigned char data[4][64];
static struct ibv_sge sge[4];
static struct ibv_send_wr wr[4];

/* Posts READ(id) and SEND(id + 1), both signaled. */
static void post_read_send(struct mq *m, uint64_t id)
{
    memset(wr, 0, sizeof wr);
    for (int i = 0; i < 2; i++) {
        sge[i] = (struct ibv_sge){.addr = (uintptr_t)data[i], .length = 64, .lkey = 7};
        wr[i].wr_id = id + (uint64_t)i;
        wr[i].opcode = i == 0 ? IBV_WR_RDMA_READ : IBV_WR_SEND;
        wr[i].send_flags = IBV_SEND_SIGNALED;
        wr[i].num_sge = 1;
        wr[i].sg_list = &sge[i];
    }
    wr[0].next = &wr[1];
    struct ibv_send_wr *bad = NULL;
    CHECK_EQ(sqd_post_send(m->q, wr, &bad), 0);
}

static void a_late_completion_the_ulp_signaled_is_shown_and_the_first_is_kept(void)
{
    struct mq *m = reordering_rig((struct qcfg){.sq_depth = 16, .signal_interval = 8});
    post_read_send(m, 10);
    swaps = 1;
    complete(m, INT_MAX);
    CHECK_EQ(poll_all(the_rig->scq), 2);
    CHECK_EQ(shown[0].wr_id, 11);
    CHECK_EQ(shown[0].opcode, IBV_WC_SEND);
    CHECK_EQ(shown[1].wr_id, 10);
    CHECK_EQ(shown[1].opcode, IBV_WC_RDMA_READ);
    CHECK_EQ(shown[1].status, IBV_WC_SUCCESS);
    released_in_order(m, 10, 2);
    CHECK(m->log[0].flags & SQD_COMPLETION_IMPLIED);

    struct sqd_cq_out_of_order o;
    memset(&o, 0xff, sizeof o);
    CHECK_EQ(sqd_cq_out_of_order(the_rig->scq, &o), 0);
    CHECK_EQ(o.count, 1);
    CHECK_EQ(o.shown, 1);
    CHECK_EQ(o.qp_num, m->qp->qp_num);
    CHECK_EQ(o.wqe, 0);
    CHECK_EQ(o.wr_id, 10);
    CHECK_EQ(o.opcode, IBV_WC_RDMA_READ);
    CHECK_EQ(o.status, IBV_WC_SUCCESS);
    CHECK_EQ(o.flags, SQD_OUT_OF_ORDER_ULP_WR | SQD_OUT_OF_ORDER_SHOWN);

    char msg[512];
    int len = sqd_cq_out_of_order_message(the_rig->scq, msg, sizeof msg);
    CHECK(len > 0 && (size_t)len < sizeof msg);
    CHECK_EQ(strlen(msg), (size_t)len);
    CHECK(strstr(msg, "out of RC order") != NULL);
    CHECK(strstr(msg, "wr_id 0xa") != NULL);
    char small[8];
    CHECK_EQ(sqd_cq_out_of_order_message(the_rig->scq, small, sizeof small), len);
    CHECK_EQ(strlen(small), sizeof small - 1);
    CHECK_EQ(sqd_cq_out_of_order_message(the_rig->scq, NULL, 0), len);

    /* A second one is counted; the first stays. */
    post_read_send(m, 12);
    swaps = 1;
    complete(m, INT_MAX);
    CHECK_EQ(poll_all(the_rig->scq), 2);
    CHECK_EQ(shown[1].wr_id, 12);
    CHECK_EQ(sqd_cq_out_of_order(the_rig->scq, &o), 0);
    CHECK_EQ(o.count, 2);
    CHECK_EQ(o.shown, 2);
    CHECK_EQ(o.wr_id, 10);
    char again[512];
    CHECK_EQ(sqd_cq_out_of_order_message(the_rig->scq, again, sizeof again), len);
    CHECK(strcmp(again, msg) == 0);
    CHECK_EQ(qstats(m).stray_cqes, 0);
    released_in_order(m, 10, 4);
}

static void in_order_nothing_is_kept(void)
{
    struct mq *m = reordering_rig((struct qcfg){.sq_depth = 16, .signal_interval = 8});
    post_read_send(m, 1);
    complete(m, INT_MAX);
    CHECK_EQ(poll_all(the_rig->scq), 2);
    CHECK_EQ(shown[0].wr_id, 1);
    struct sqd_cq_out_of_order o;
    memset(&o, 0xff, sizeof o);
    CHECK_EQ(sqd_cq_out_of_order(the_rig->scq, &o), 0);
    CHECK_EQ(o.count, 0);
    CHECK_EQ(o.wr_id, 0);
    CHECK_EQ(o.flags, 0);
    char msg[16] = "x";
    CHECK_EQ(sqd_cq_out_of_order_message(the_rig->scq, msg, sizeof msg), 0);
    CHECK_EQ(msg[0], 0);
}

static void bad_arguments_are_refused(void)
{
    rig_new(16);
    struct sqd_cq_out_of_order o;
    char buf[8];
    EXPECT_ERR(sqd_cq_out_of_order(NULL, &o), EINVAL, "cq");
    EXPECT_ERR(sqd_cq_out_of_order(the_rig->scq, NULL), EINVAL, "out");
    EXPECT_ERR(sqd_cq_out_of_order_message(NULL, buf, sizeof buf), EINVAL, "cq");
    EXPECT_ERR(sqd_cq_out_of_order_message(the_rig->scq, NULL, 4), EINVAL, "buf");
}

int main(void)
{
    run("a_late_completion_the_ulp_signaled_is_shown_and_the_first_is_kept",
        a_late_completion_the_ulp_signaled_is_shown_and_the_first_is_kept);
    run("in_order_nothing_is_kept", in_order_nothing_is_kept);
    run("bad_arguments_are_refused", bad_arguments_are_refused);
    return harness_finish("out_of_order");
}
