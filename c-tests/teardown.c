/* Teardown in every order, through the installed library: each order gives its documented result (0, or
 * -EBUSY with a message, the object left valid), never a use after free (this runs under ASan+UBSan and
 * valgrind too). tests/teardown.rs has the same scenarios in Rust, for Miri. */

#include "support/harness.h"

#include <sqdisc_sim.h>

struct one {
    struct sqd_scripted *dev;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct sqd_cq *scq;
    struct sqd_queue *q;
};

static void one_new(struct one *o, sqd_release_fn release, void *ctx)
{
    struct sqd_scripted_qp_caps caps = {.max_send_wr = 8, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1};
    CHECK_EQ(sqd_scripted_new(&o->dev), 0);
    CHECK_EQ(sqd_scripted_create_cq(o->dev, 32, &o->cq), 0);
    CHECK_EQ(sqd_scripted_create_qp(o->dev, o->cq, o->cq, &caps, &o->qp), 0);
    CHECK_EQ(sqd_cq_new(o->cq, &o->scq), 0);
    struct sqd_queue_attr attr = {.sq_depth = 8, .max_send_sge = 1, .backlog_depth = 8, .release = release,
                                  .release_ctx = ctx};
    CHECK_EQ(sqd_queue_new(o->scq, NULL, o->qp, &attr, &o->q), 0);
}

static int post_sends(struct sqd_queue *q, uint64_t first, int n)
{
    static char buf[64];
    struct ibv_sge sge[16];
    struct ibv_send_wr wr[16], *bad;
    for (int i = 0; i < n; i++) {
        sge[i] = (struct ibv_sge){.addr = (uintptr_t)buf, .length = sizeof buf, .lkey = 1};
        wr[i] = (struct ibv_send_wr){.wr_id = first + (uint64_t)i, .next = i + 1 < n ? &wr[i + 1] : NULL,
                                     .sg_list = &sge[i], .num_sge = 1, .opcode = IBV_WR_SEND,
                                     .send_flags = i + 1 == n ? IBV_SEND_SIGNALED : 0};
    }
    return sqd_post_send(q, wr, &bad);
}

static void drive(struct one *o, uint64_t released)
{
    struct ibv_wc wc[16];
    struct sqd_queue_stats st;
    for (int i = 0; i < 50; i++) {
        CHECK_EQ(sqd_queue_stats(o->q, &st), 0);
        if (st.released == released)
            return;
        CHECK(sqd_scripted_complete(o->qp, INT_MAX) >= 0);
        CHECK(sqd_cq_poll(o->scq, 16, wc) >= 0);
    }
    fail_now("not released after 50 rounds");
}

static void device_objects_under_live_handles_are_ebusy(void)
{
    struct one o = {0};
    one_new(&o, NULL, NULL);
    EXPECT_ERR(sqd_scripted_destroy_qp(o.qp), EBUSY, "sqd_queue_free it first");
    EXPECT_ERR(sqd_scripted_destroy_cq(o.cq), EBUSY, "sqd_cq_free it first");
    EXPECT_ERR(sqd_scripted_free(o.dev), EBUSY, "still managed");
    EXPECT_ERR(sqd_cq_free(o.scq), EBUSY, "queue(s) attached");
    /* Nothing was freed: the queue still posts and completes through them. */
    CHECK_EQ(post_sends(o.q, 0, 4), 0);
    EXPECT_ERR(sqd_queue_free(o.q), EBUSY, "not yet released");
    drive(&o, 4);
    CHECK_EQ(sqd_queue_free(o.q), 0);
    CHECK_EQ(sqd_scripted_destroy_qp(o.qp), 0);
    EXPECT_ERR(sqd_scripted_free(o.dev), EBUSY, "1 object(s)");
    CHECK_EQ(sqd_cq_free(o.scq), 0);
    CHECK_EQ(sqd_scripted_destroy_cq(o.cq), 0);
    CHECK_EQ(sqd_scripted_free(o.dev), 0);
}

static void the_device_frees_what_no_handle_holds(void)
{
    struct one o = {0};
    one_new(&o, NULL, NULL);
    CHECK_EQ(sqd_queue_free(o.q), 0);
    CHECK_EQ(sqd_cq_free(o.scq), 0);
    CHECK_EQ(sqd_scripted_free(o.dev), 0); /* its CQ and QP with it */
}

static void free_of_null_is_a_no_op(void)
{
    CHECK_EQ(sqd_queue_free(NULL), 0);
    CHECK_EQ(sqd_cq_free(NULL), 0);
    CHECK_EQ(sqd_srq_free(NULL), 0);
    CHECK_EQ(sqd_scripted_free(NULL), 0);
    CHECK_EQ(sqd_sim_free(NULL), 0);
}

static void failed_creates_leave_null_and_hold_nothing(void)
{
    struct one o = {0};
    struct sqd_scripted_qp_caps caps = {.max_send_wr = 8, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1};
    struct ibv_cq *small;
    struct ibv_qp *qp;
    struct sqd_cq *scq = (struct sqd_cq *)&o, *small_scq;
    CHECK_EQ(sqd_scripted_new(&o.dev), 0);
    CHECK_EQ(sqd_scripted_create_cq(o.dev, 4, &small), 0);
    CHECK_EQ(sqd_scripted_create_qp(o.dev, small, small, &caps, &qp), 0);
    EXPECT_ERR(sqd_cq_new_ex(small, 0x80, &scq), EINVAL, "unknown bits");
    CHECK(scq == NULL);
    CHECK_EQ(sqd_cq_free(scq), 0);
    CHECK_EQ(sqd_cq_new(small, &small_scq), 0);
    struct sqd_queue *q = (struct sqd_queue *)&o;
    struct sqd_queue_attr attr = {.sq_depth = 8, .max_send_sge = 1};
    EXPECT_ERR(sqd_queue_new(small_scq, NULL, qp, &attr, &q), ENOSPC, "");
    CHECK(q == NULL);
    CHECK_EQ(sqd_queue_free(q), 0);
    struct sqd_cq_stats st;
    CHECK_EQ(sqd_cq_stats(small_scq, &st), 0);
    CHECK_EQ(st.queues, 0);
    CHECK_EQ(st.reserved, 0);
    CHECK_EQ(sqd_scripted_destroy_qp(qp), 0); /* the refused queue holds nothing */
    CHECK_EQ(sqd_cq_free(small_scq), 0);
    CHECK_EQ(sqd_scripted_free(o.dev), 0);
}

/* ---- frees from inside callbacks ------------------------------------------------------------------------- */

struct frees {
    struct one *o;
    struct sqd_queue *victim; /* an idle queue on the same CQ: freed from the first callback */
    struct ibv_qp *victim_qp;
    int calls, busy, victim_rc, victim_qp_rc;
};

static void try_frees(struct frees *f)
{
    f->calls++;
    if (sqd_queue_free(f->o->q) == -EBUSY && sqd_cq_free(f->o->scq) == -EBUSY &&
        sqd_scripted_destroy_qp(f->o->qp) == -EBUSY && sqd_scripted_free(f->o->dev) == -EBUSY)
        f->busy++;
    if (f->victim) {
        f->victim_rc = sqd_queue_free(f->victim);
        f->victim_qp_rc = sqd_scripted_destroy_qp(f->victim_qp);
        f->victim = NULL;
    }
}

static void release_frees(void *ctx, const struct sqd_completion *c)
{
    (void)c;
    try_frees(ctx);
}

static void deferred_frees(void *ctx)
{
    try_frees(ctx);
}

static void frees_from_callbacks_are_ebusy_except_for_other_idle_queues(void)
{
    struct one o = {0};
    struct frees f = {.o = &o, .victim_rc = 1, .victim_qp_rc = 1};
    one_new(&o, release_frees, &f);
    struct sqd_scripted_qp_caps caps = {.max_send_wr = 4, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1};
    CHECK_EQ(sqd_scripted_create_qp(o.dev, o.cq, o.cq, &caps, &f.victim_qp), 0);
    struct sqd_queue_attr attr = {.sq_depth = 4, .max_send_sge = 1};
    CHECK_EQ(sqd_queue_new(o.scq, NULL, f.victim_qp, &attr, &f.victim), 0);
    CHECK_EQ(post_sends(o.q, 0, 3), 0);
    CHECK_EQ(sqd_defer(o.q, deferred_frees, &f), 0);
    drive(&o, 3);
    CHECK_EQ(f.calls, 4); /* three releases, then the deferred action */
    CHECK_EQ(f.busy, 4);
    CHECK_EQ(f.victim_rc, 0);
    CHECK_EQ(f.victim_qp_rc, 0);
    CHECK_EQ(sqd_queue_free(o.q), 0);
    CHECK_EQ(sqd_cq_free(o.scq), 0);
    CHECK_EQ(sqd_scripted_free(o.dev), 0);
}

/* ---- SRQs and the software HCA --------------------------------------------------------------------------- */

static int srq_released;

static void count_release(void *ctx, const struct sqd_completion *c)
{
    (void)ctx;
    (void)c;
    srq_released++;
}

static void an_srq_in_use_refuses_every_free_until_its_queues_and_receives_are_gone(void)
{
    struct sqd_sim *sim;
    struct ibv_cq *cq;
    struct ibv_srq *srq;
    struct ibv_qp *qp;
    CHECK_EQ(sqd_sim_new(NULL, &sim), 0);
    CHECK_EQ(sqd_sim_create_cq(sim, 64, &cq), 0);
    struct ibv_srq_init_attr sattr = {.attr = {.max_wr = 8, .max_sge = 1}};
    CHECK_EQ(sqd_sim_create_srq(sim, &sattr, &srq), 0);
    struct ibv_qp_init_attr qattr = {.send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC,
                                     .cap = {.max_send_wr = 8, .max_send_sge = 1}};
    CHECK_EQ(sqd_sim_create_qp(sim, &qattr, &qp), 0);

    struct sqd_cq *scq;
    struct sqd_srq *ssrq;
    struct sqd_queue *q;
    CHECK_EQ(sqd_cq_new(cq, &scq), 0);
    struct sqd_srq_attr srq_attr = {.depth = 8, .release = count_release};
    CHECK_EQ(sqd_srq_new(srq, &srq_attr, &ssrq), 0);
    struct sqd_queue_attr attr = {.sq_depth = 8, .max_send_sge = 1, .srq = ssrq};
    CHECK_EQ(sqd_queue_new(scq, scq, qp, &attr, &q), 0);

    struct ibv_sge sge[3] = {{0}};
    struct ibv_recv_wr rwr[3], *bad;
    for (int i = 0; i < 3; i++)
        rwr[i] = (struct ibv_recv_wr){.wr_id = (uint64_t)i, .next = i < 2 ? &rwr[i + 1] : NULL, .sg_list = &sge[i],
                                      .num_sge = 1};
    CHECK_EQ(sqd_srq_post_recv(ssrq, rwr, &bad), 0);

    EXPECT_ERR(sqd_srq_free(ssrq), EBUSY, "1 queue(s) attached and 3 receive(s) posted");
    EXPECT_ERR(sqd_srq_release_all(ssrq), EBUSY, "queues are still attached");
    EXPECT_ERR(sqd_sim_destroy_srq(srq), EBUSY, "");
    EXPECT_ERR(sqd_sim_destroy_qp(qp), EBUSY, "sqd_queue_free it first");
    EXPECT_ERR(sqd_sim_destroy_cq(cq), EBUSY, "");
    EXPECT_ERR(sqd_sim_free(sim), EBUSY, "3 object(s) of the sim");
    EXPECT_ERR(sqd_queue_free(q), EBUSY, "LAST_WQE_REACHED");
    CHECK_EQ(sqd_queue_async_event(q, IBV_EVENT_QP_FATAL), 0);
    CHECK_EQ(sqd_queue_free(q), 0);
    EXPECT_ERR(sqd_srq_free(ssrq), EBUSY, "0 queue(s) attached and 3 receive(s) posted");
    CHECK_EQ(sqd_srq_release_all(ssrq), 0);
    CHECK_EQ(srq_released, 3);
    CHECK_EQ(sqd_srq_free(ssrq), 0);
    EXPECT_ERR(sqd_sim_destroy_srq(srq), EBUSY, "used by 1 QP(s)"); /* the sim's own rule */
    CHECK_EQ(sqd_sim_destroy_qp(qp), 0);
    CHECK_EQ(sqd_sim_destroy_srq(srq), 0);
    EXPECT_ERR(sqd_sim_free(sim), EBUSY, "1 object(s)");
    CHECK_EQ(sqd_cq_free(scq), 0);
    CHECK_EQ(sqd_sim_free(sim), 0); /* frees its CQ */
}

int main(void)
{
    run("device_objects_under_live_handles_are_ebusy", device_objects_under_live_handles_are_ebusy);
    run("the_device_frees_what_no_handle_holds", the_device_frees_what_no_handle_holds);
    run("free_of_null_is_a_no_op", free_of_null_is_a_no_op);
    run("failed_creates_leave_null_and_hold_nothing", failed_creates_leave_null_and_hold_nothing);
    run("frees_from_callbacks_are_ebusy_except_for_other_idle_queues",
        frees_from_callbacks_are_ebusy_except_for_other_idle_queues);
    run("an_srq_in_use_refuses_every_free_until_its_queues_and_receives_are_gone",
        an_srq_in_use_refuses_every_free_until_its_queues_and_receives_are_gone);
    return harness_finish("teardown");
}
