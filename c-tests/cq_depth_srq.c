/* Sizing a CQ for queues that receive through SRQs: sqd_cq_depth_for_srqs counts each SRQ's depth once, as
 * sqd_queue_new reserves it on the receive CQ, so a CQ of exactly that depth takes every planned queue and no
 * more; on the software HCA, through the installed library.
 *
 * Each scenario prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is non-zero if any failed. */

#include "support/harness.h"

#include <sqdisc_sim.h>

#define PLANNED 6
#define SQ_DEPTH 16
#define SRQ_DEPTH 64

/* The scenario's objects, freed by sim_teardown() after it whatever happened. */
static struct sqd_sim *sim;
static struct sqd_cq *scq;
static struct sqd_srq *msrq[2];
static struct sqd_queue *queues[PLANNED + 1];

static void sim_teardown(void)
{
    for (int i = 0; i <= PLANNED; i++) {
        sqd_queue_free(queues[i]);
        queues[i] = NULL;
    }
    for (int i = 0; i < 2; i++) {
        sqd_srq_free(msrq[i]);
        msrq[i] = NULL;
    }
    sqd_cq_free(scq);
    scq = NULL;
    sqd_sim_free(sim);
    sim = NULL;
}

static struct ibv_srq *new_srq(uint32_t depth, struct sqd_srq **managed)
{
    struct ibv_srq_init_attr sa;
    struct ibv_srq *srq = NULL;
    memset(&sa, 0, sizeof sa);
    sa.attr.max_wr = depth;
    sa.attr.max_sge = 1;
    CHECK_EQ(sqd_sim_create_srq(sim, &sa, &srq), 0);
    CHECK_EQ(sa.attr.max_wr, depth);
    struct sqd_srq_attr ma = {.depth = sa.attr.max_wr};
    CHECK_EQ(sqd_srq_new(srq, &ma, managed), 0);
    return srq;
}

/* A QP on `srq` (or, with `srq` NULL, with an RQ of `rq_depth`) whose sends and receives complete on `cq`,
 * managed as queues[i] on `scq`. */
static int new_queue_rq(struct ibv_cq *cq, struct ibv_srq *srq, struct sqd_srq *managed, uint32_t rq_depth, int i)
{
    struct ibv_qp_init_attr a;
    struct ibv_qp *qp = NULL;
    memset(&a, 0, sizeof a);
    a.send_cq = a.recv_cq = cq;
    a.srq = srq;
    a.qp_type = IBV_QPT_RC;
    a.cap = (struct ibv_qp_cap){.max_send_wr = SQ_DEPTH, .max_recv_wr = rq_depth, .max_send_sge = 1, .max_recv_sge = 1};
    CHECK_EQ(sqd_sim_create_qp(sim, &a, &qp), 0);
    CHECK_EQ(a.cap.max_send_wr, SQ_DEPTH);
    CHECK_EQ(a.cap.max_recv_wr, srq ? 0 : rq_depth);
    struct sqd_queue_attr qa = {.sq_depth = SQ_DEPTH, .max_send_sge = 1, .rq_depth = srq ? 0 : rq_depth, .srq = managed};
    return sqd_queue_new(scq, scq, qp, &qa, &queues[i]);
}

static int new_queue(struct ibv_cq *cq, struct ibv_srq *srq, struct sqd_srq *managed, int i)
{
    return new_queue_rq(cq, srq, managed, 0, i);
}

static void new_sim(void)
{
    struct sqd_sim_config cfg;
    sqd_sim_config_default(&cfg);
    CHECK_EQ(sqd_sim_new(&cfg, &sim), 0);
}

static void a_cq_sized_for_queues_on_one_srq_takes_them_all_and_no_more(void)
{
    new_sim();
    struct sqd_queue_plan plans[PLANNED];
    for (int i = 0; i < PLANNED; i++)
        plans[i] = (struct sqd_queue_plan){.sq_depth = SQ_DEPTH, .rq_depth = 0};
    uint32_t srq_depth = SRQ_DEPTH;
    uint64_t depth = 0;
    CHECK_EQ(sqd_cq_depth_for_srqs(plans, PLANNED, &srq_depth, 1, &depth), 0);
    CHECK_EQ(depth, PLANNED * (SQ_DEPTH + 1) + SRQ_DEPTH);
    /* Without SRQs it is sqd_cq_depth_for, which knows nothing of them: SRQ_DEPTH short. */
    uint64_t plain = 0;
    CHECK_EQ(sqd_cq_depth_for(plans, PLANNED, &plain), 0);
    CHECK_EQ(plain + SRQ_DEPTH, depth);
    CHECK_EQ(sqd_cq_depth_for_srqs(plans, PLANNED, NULL, 0, &plain), 0);
    CHECK_EQ(plain + SRQ_DEPTH, depth);

    struct ibv_cq *cq = NULL;
    CHECK_EQ(sqd_sim_create_cq(sim, (int)depth, &cq), 0);
    CHECK_EQ(sqd_cq_new(cq, &scq), 0);
    struct ibv_srq *srq = new_srq(SRQ_DEPTH, &msrq[0]);
    for (int i = 0; i < PLANNED; i++)
        CHECK_EQ(new_queue(cq, srq, msrq[0], i), 0);
    struct sqd_cq_stats s = cqstats(scq);
    CHECK_EQ(s.reserved, depth);
    CHECK_EQ(s.capacity, depth);
    CHECK_EQ(s.queues, PLANNED);
    /* One queue more than planned does not fit. */
    reset_error();
    CHECK_EQ(new_queue(cq, srq, msrq[0], PLANNED), -ENOSPC);
    CHECK(strstr(sqd_last_error(), "CQ too small") != NULL);
    CHECK(queues[PLANNED] == NULL);
}

static void each_srq_counts_once_beside_queues_with_their_own_receives(void)
{
    /* Two SRQs with two queues on each, and two queues with their own receive queues, all on one CQ. */
    new_sim();
    struct sqd_queue_plan plans[PLANNED];
    for (int i = 0; i < PLANNED; i++)
        plans[i] = (struct sqd_queue_plan){.sq_depth = SQ_DEPTH, .rq_depth = i < 4 ? 0 : 8};
    uint32_t srq_depths[2] = {SRQ_DEPTH, SRQ_DEPTH / 2};
    uint64_t depth = 0;
    CHECK_EQ(sqd_cq_depth_for_srqs(plans, PLANNED, srq_depths, 2, &depth), 0);
    CHECK_EQ(depth, PLANNED * (SQ_DEPTH + 1) + 2 * 8 + SRQ_DEPTH + SRQ_DEPTH / 2);
    struct ibv_cq *cq = NULL;
    CHECK_EQ(sqd_sim_create_cq(sim, (int)depth, &cq), 0);
    CHECK_EQ(sqd_cq_new(cq, &scq), 0);
    struct ibv_srq *srq[2] = {new_srq(srq_depths[0], &msrq[0]), new_srq(srq_depths[1], &msrq[1])};
    for (int i = 0; i < PLANNED; i++) {
        if (i < 4)
            CHECK_EQ(new_queue(cq, srq[i % 2], msrq[i % 2], i), 0);
        else
            CHECK_EQ(new_queue_rq(cq, NULL, NULL, 8, i), 0);
    }
    CHECK_EQ(cqstats(scq).reserved, depth);
    CHECK_EQ(new_queue(cq, srq[0], msrq[0], PLANNED), -ENOSPC);
}

static void bad_input_is_refused(void)
{
    struct sqd_queue_plan plan = {.sq_depth = 1, .rq_depth = 1};
    uint32_t srq_depth = 4;
    uint64_t out = 0;
    EXPECT_ERR(sqd_cq_depth_for_srqs(&plan, 1, &srq_depth, 1, NULL), EINVAL, "out is NULL");
    EXPECT_ERR(sqd_cq_depth_for_srqs(NULL, 1, &srq_depth, 1, &out), EINVAL, "plans is NULL");
    EXPECT_ERR(sqd_cq_depth_for_srqs(&plan, 1, NULL, 1, &out), EINVAL, "srq_depths is NULL");
    CHECK_EQ(sqd_cq_depth_for_srqs(NULL, 0, NULL, 0, &out), 0);
    CHECK_EQ(out, 0);
    CHECK_EQ(sqd_cq_depth_for_srqs(&plan, 1, &srq_depth, 1, &out), 0);
    CHECK_EQ(out, 2 + 1 + 4);
}

int main(void)
{
    run("a CQ sized for queues on one SRQ takes them all and no more",
        a_cq_sized_for_queues_on_one_srq_takes_them_all_and_no_more);
    sim_teardown();
    run("each SRQ counts once beside queues with their own receives",
        each_srq_counts_once_beside_queues_with_their_own_receives);
    sim_teardown();
    run("bad input is refused", bad_input_is_refused);
    return harness_finish("cq_depth_srq");
}
