/* What libsqdisc_spdk sees and cannot tell SPDK through the provider interface: a WR the device refused when
 * the provider posted it from the backlog (SPDK's flush had taken it), and a CQ that cannot grow to a qpair's
 * worst case. Each is said through spdk_log once (per qpair, per CQ), with the numbers, and counted in
 * sqd_spdk_qp_counters. (A completion of a WQE already retired is covered by spdk_provider.c's
 * a_late_completion_of_a_wr_spdk_signaled_reaches_spdk_and_is_logged_once.) Prints "PASS <name>" per
 * scenario; exits non-zero on the first failure. */

#define SQD_SPDK_ASSERT_LAYOUT 1
#include <sqdisc_spdk.h>
#include <sqdisc_sim.h>

#include "support/spdk_standin.h"

#include "support/spdk_world.h"

/* Four WRITEs fill a 4-deep SQ; a SEND waits in the backlog; the device then refuses SENDs. When the WRITEs
 * complete the provider posts the SEND, the device refuses it, and SPDK, whose flush took it, gets it as a
 * completion with IBV_WC_LOC_QP_OP_ERR and the errno; the first refusal is logged, later ones only counted. */
static void a_wr_the_device_refuses_from_the_backlog_reaches_spdk_and_is_logged_once(void)
{
    struct world w;
    struct rdma_cm_id id;
    current = "a_wr_the_device_refuses_from_the_backlog_reaches_spdk_and_is_logged_once";
    world_new(&w, NULL, 1024);
    struct spdk_rdma_provider_qp *q = qpair_new(&w, &id, 4, 0, NULL, NULL);
    CHECK(q != NULL);
    peer_connect(&w, q->qp, 64);
    int logs = standin.logs;

    for (int round = 0; round < 2; round++) {
        enum { N = 5 };
        uint64_t base = 100 + (uint64_t)round * 10;
        struct ibv_send_wr wrs[N], *bad = NULL;
        struct ibv_sge sges[N];
        for (int i = 0; i < N - 1; i++)
            write_wr(&w, &wrs[i], &sges[i], base + (uint64_t)i, i == N - 2);
        send_wr(&w, &wrs[N - 1], &sges[N - 1], base + N - 1);
        link_wrs(wrs, N);
        CHECK_EQ(sqd_sim_refuse_opcode(q->qp, IBV_WR_SEND, 0), 0);
        spdk_rdma_provider_qp_queue_send_wrs(q, wrs);
        CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), 0);
        CHECK_EQ(qstats(q).backlog, 1);
        CHECK_EQ(sqd_sim_refuse_opcode(q->qp, IBV_WR_SEND, EOPNOTSUPP), 0);

        struct ibv_wc wc[8];
        CHECK_EQ(reap(&w, wc, 8, 2, 1000), 2);
        CHECK_EQ(wc[0].wr_id, base + N - 2);
        CHECK_EQ(wc[0].status, IBV_WC_SUCCESS);
        CHECK_EQ(wc[1].wr_id, base + N - 1);
        CHECK_EQ(wc[1].status, IBV_WC_LOC_QP_OP_ERR);
        CHECK_EQ(wc[1].vendor_err, EOPNOTSUPP);
        CHECK_EQ(wc[1].qp_num, q->qp->qp_num);
        CHECK_EQ(reap(&w, wc, 8, 1, 20), 0);

        struct sqd_spdk_qp_counters c = counters(q);
        CHECK_EQ(c.refused, (uint64_t)round + 1);
        CHECK_EQ(c.refused_errno, EOPNOTSUPP);
        CHECK_EQ(c.owed_flushes, (uint64_t)round + 1);
        CHECK_EQ(c.owed, 0);
        CHECK_EQ(c.duplicates, 0);
        CHECK_EQ(standin.logs, logs + 1); /* once per qpair */
        CHECK(strstr(standin.last_log, "the device refused WR 0x68") != NULL); /* the first: 104 */
        CHECK(strstr(standin.last_log, "errno 95") != NULL);
    }
    /* At destroy, the count. */
    spdk_rdma_provider_qp_destroy(q);
    CHECK_EQ(standin.logs, logs + 2);
    CHECK(strstr(standin.last_log, "refused 2 WRs posted from the backlog") != NULL);
    world_free(&w);
    printf("PASS %s\n", current);
}

/* A CQ of 9 CQEs that cannot grow (ibv_resize_cq fails, as on iWARP) and a qpair of max_send_wr 8 (the device
 * grants one receive), whose worst case is 10: the qpair signals every WR instead, which fits, says so once for the CQ with the numbers, and
 * counts it. A second qpair on that CQ (SPDK grew it by itself meanwhile) falls back too, counted, not logged
 * again. */
static void a_cq_that_cannot_grow_is_logged_once_per_cq_and_counted(void)
{
    struct world w;
    struct rdma_cm_id id1, id2;
    current = "a_cq_that_cannot_grow_is_logged_once_per_cq_and_counted";
    world_new(&w, NULL, 9);
    standin.resize_fail = EOPNOTSUPP;
    int logs = standin.logs;
    struct spdk_rdma_provider_qp *q1 = qpair_new(&w, &id1, 8, 0, NULL, NULL);
    CHECK(q1 != NULL);
    CHECK_EQ(standin.logs, logs + 1);
    CHECK(strstr(standin.last_log, "growing the CQ from 9 to 10 CQEs with ibv_resize_cq failed (errno 95)") != NULL);
    CHECK(strstr(standin.last_log, "signals every WR instead") != NULL);
    CHECK(strstr(standin.last_log, "max_send_wr 8") != NULL);
    CHECK_EQ(counters(q1).cq_not_grown, 1);
    CHECK_EQ(qstats(q1).signal_interval, 1);

    CHECK_EQ(sqd_sim_resize_cq(w.cq, 18), 0);
    struct spdk_rdma_provider_qp *q2 = qpair_new(&w, &id2, 8, 0, NULL, NULL);
    CHECK(q2 != NULL);
    CHECK_EQ(standin.logs, logs + 1); /* once per CQ */
    CHECK_EQ(counters(q2).cq_not_grown, 1);
    standin.resize_fail = 0;

    spdk_rdma_provider_qp_destroy(q2);
    spdk_rdma_provider_qp_destroy(q1);
    world_free(&w);
    printf("PASS %s\n", current);
}

int main(void)
{
    a_wr_the_device_refuses_from_the_backlog_reaches_spdk_and_is_logged_once();
    a_cq_that_cannot_grow_is_logged_once_per_cq_and_counted();
    return 0;
}
