/* Where the cause of a queue's failure shows when the failing WR is the library's own idle-tail marker: an
 * unsignaled RDMA READ loses its response, and the marker that covers it fails at transmission with
 * IBV_WC_REM_OP_ERR (vendor error 0xbeef). The device reports the marker's error once the READ before it has
 * completed (retransmitted, successfully), so the READ is released as successful and the ULP sees no completion
 * at all: sqd_queue_stats must hold the marker's status and vendor error. And a queue that only ever saw
 * flushes records the flush. On the software HCA, time driven by sqd_sim_step. */

#include "support/harness.h"

#include <sqdisc_sim.h>

static char local_buf[64];
static char remote_buf[64];

struct world {
    struct sqd_sim *sim;
    struct ibv_cq *cq_a, *cq_b;
    struct ibv_qp *a, *b;
    struct ibv_mr *mr_local, *mr_remote;
    struct sqd_cq *scq;
    struct sqd_queue *q;
    struct sqd_completion rel[8];
    int nrel;
};
static struct world w;

static void log_release(void *ctx, const struct sqd_completion *c)
{
    struct world *x = ctx;
    if (x->nrel < 8)
        x->rel[x->nrel] = *c;
    x->nrel++;
}

static struct sqd_sim_stats simstats(void)
{
    struct sqd_sim_stats s;
    CHECK_EQ(sqd_sim_stats(w.sim, &s), 0);
    return s;
}

/* Two connected RC QPs (depth 16) on the sim, whose time only sqd_sim_step advances; a local MR and a remote
 * one the peer may read; QP a managed on its CQ with signal interval 4. */
static void world_new(void)
{
    struct sqd_sim_config cfg;
    sqd_sim_config_default(&cfg);
    cfg.steps_per_poll = 0; /* polling does not advance time: sqd_sim_step does */
    CHECK_EQ(sqd_sim_new(&cfg, &w.sim), 0);
    CHECK_EQ(sqd_sim_create_cq(w.sim, 64, &w.cq_a), 0);
    CHECK_EQ(sqd_sim_create_cq(w.sim, 64, &w.cq_b), 0);
    struct ibv_qp_init_attr qa = {.send_cq = w.cq_a, .recv_cq = w.cq_a, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 16, .max_recv_wr = 1, .max_send_sge = 1,
                                          .max_recv_sge = 1}};
    CHECK_EQ(sqd_sim_create_qp(w.sim, &qa, &w.a), 0);
    struct ibv_qp_init_attr qb = qa;
    qb.send_cq = qb.recv_cq = w.cq_b;
    CHECK_EQ(sqd_sim_create_qp(w.sim, &qb, &w.b), 0);
    CHECK_EQ(sqd_sim_connect(w.a, w.b, NULL), 0);
    CHECK_EQ(sqd_sim_reg_mr(w.sim, local_buf, sizeof local_buf, IBV_ACCESS_LOCAL_WRITE, &w.mr_local), 0);
    CHECK_EQ(sqd_sim_reg_mr(w.sim, remote_buf, sizeof remote_buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ,
                            &w.mr_remote),
             0);
    CHECK_EQ(sqd_cq_new(w.cq_a, &w.scq), 0);
    struct sqd_queue_attr attr = {.sq_depth = qa.cap.max_send_wr, .max_send_sge = 1, .signal_interval = 4,
                                  .release = log_release, .release_ctx = &w};
    CHECK_EQ(sqd_queue_new(w.scq, NULL, w.a, &attr, &w.q), 0);
}

static void world_free(void)
{
    if (w.q) {
        struct ibv_wc wc[8];
        for (int i = 0; i < 64 && sqd_queue_drain(w.q) == -EINPROGRESS; i++) {
            sqd_sim_step(w.sim, 1);
            sqd_cq_poll(w.scq, 8, wc);
        }
        if (sqd_queue_free(w.q) != 0)
            printf("FAIL %s: teardown: the queue cannot be freed: %s\n", current, sqd_last_error());
    }
    if (w.scq && sqd_cq_free(w.scq) != 0)
        printf("FAIL %s: teardown: the CQ cannot be freed: %s\n", current, sqd_last_error());
    sqd_sim_free(w.sim);
    memset(&w, 0, sizeof w);
}

static void a_failed_markers_status_and_vendor_error_show_in_the_stats(void)
{
    world_new();

    /* The READ's response is lost on the way back. */
    struct sqd_sim_fault lose = {.kind = SQD_SIM_FAULT_LOSE_ACKS, .qp = w.a, .count = 1};
    CHECK_EQ(sqd_sim_inject(w.sim, &lose), 0);
    struct ibv_sge sge = {.addr = (uintptr_t)local_buf, .length = sizeof local_buf, .lkey = w.mr_local->lkey};
    struct ibv_send_wr rd = {.wr_id = 77, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ}, *bad = NULL;
    rd.wr.rdma.remote_addr = (uintptr_t)remote_buf;
    rd.wr.rdma.rkey = w.mr_remote->rkey;
    CHECK_EQ(sqd_post_send(w.q, &rd, &bad), 0);
    for (int i = 0; i < 16 && simstats().acks_lost == 0; i++)
        CHECK_EQ(sqd_sim_step(w.sim, 1), 0);
    CHECK_EQ(simstats().acks_lost, 1);
    CHECK_EQ(simstats().retransmissions, 0); /* the READ waits for its retransmission timeout */

    /* The next WQE the QP transmits — the idle-tail marker the polls below post — fails. */
    struct sqd_sim_fault fail = {.kind = SQD_SIM_FAULT_FAIL_NEXT, .qp = w.a, .status = IBV_WC_REM_OP_ERR,
                                 .vendor_err = 0xbeef};
    CHECK_EQ(sqd_sim_inject(w.sim, &fail), 0);
    struct ibv_wc wc[8];
    int shown = 0;
    for (int i = 0; i < 2; i++) {
        int n = sqd_cq_poll(w.scq, 8, wc);
        CHECK_EQ(n, 0);
    }
    struct sqd_queue_stats st;
    CHECK_EQ(sqd_queue_stats(w.q, &st), 0);
    CHECK_EQ(st.markers, 1);
    /* The marker's failure is reported only once the READ before it completed: the READ waits for its
     * retransmission timeout, is read again, and succeeds; then the marker's error completion arrives. */
    for (int i = 0; i < 400 && w.nrel == 0; i++) {
        CHECK_EQ(sqd_sim_step(w.sim, 1), 0);
        int n = sqd_cq_poll(w.scq, 8, wc + shown);
        CHECK(n >= 0 && shown + n <= 8);
        shown += n;
    }
    CHECK_EQ(simstats().errors, 1);
    CHECK(simstats().retransmissions >= 1);

    /* The ULP sees no completion: the READ was unsignaled and succeeded (the marker's error completion proves
     * it finished, completions being in order), and the marker's completion is the library's own... */
    CHECK_EQ(shown, 0);
    CHECK_EQ(w.nrel, 1);
    CHECK_EQ(w.rel[0].wr_id, 77);
    CHECK_EQ(w.rel[0].status, IBV_WC_SUCCESS);
    CHECK_EQ(w.rel[0].vendor_err, 0);
    /* ...so the stats are where the cause shows: the marker's status and vendor error. */
    CHECK_EQ(sqd_queue_stats(w.q, &st), 0);
    CHECK_EQ(st.closed, 1);
    CHECK_EQ(st.failed_status, IBV_WC_REM_OP_ERR);
    CHECK_EQ(st.failed_vendor_err, 0xbeef);
    EXPECT_ERR(sqd_post_send(w.q, &rd, &bad), EIO, "status 11, vendor error 0xbeef"); /* IBV_WC_REM_OP_ERR */
    CHECK_EQ(sqd_queue_drain(w.q), 0);
    world_free();
}

/* A queue whose only error is a flush (the ULP moved the QP to the error state) records the flush. */
static void flush_only_is_recorded(void)
{
    world_new();
    CHECK_EQ(sqd_sim_set_error(w.a), 0);
    struct ibv_sge sge = {.addr = (uintptr_t)local_buf, .length = 8, .lkey = w.mr_local->lkey};
    struct ibv_send_wr wr = {.wr_id = 5, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED}, *bad = NULL;
    CHECK_EQ(sqd_post_send(w.q, &wr, &bad), 0);
    struct ibv_wc wc[8];
    for (int i = 0; i < 8 && w.nrel == 0; i++) {
        CHECK_EQ(sqd_sim_step(w.sim, 1), 0);
        CHECK(sqd_cq_poll(w.scq, 8, wc) >= 0);
    }
    CHECK_EQ(w.nrel, 1);
    struct sqd_queue_stats st;
    CHECK_EQ(sqd_queue_stats(w.q, &st), 0);
    CHECK_EQ(st.failed_status, IBV_WC_WR_FLUSH_ERR);
    CHECK_EQ(st.failed_vendor_err, 0);
    world_free();
}

int main(void)
{
    run("a failed marker's status and vendor error show in the stats",
        a_failed_markers_status_and_vendor_error_show_in_the_stats);
    if (w.sim)
        world_free();
    run("a queue that only ever saw flushes records the flush", flush_only_is_recorded);
    if (w.sim)
        world_free();
    return harness_finish("failure_cause");
}
