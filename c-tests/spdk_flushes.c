/* libsqdisc_spdk under a QP made fatal with WRs on the SQ, in the qpair's backlog and posted after the failure:
 * SPDK must see each of them complete exactly once, with IBV_WC_WR_FLUSH_ERR, in post order, as raw verbs would
 * give it, and sqd_spdk_qp_counters must say where each came from (the device's flush CQEs, the provider's own)
 * with no duplicate and nothing left owed. Prints "PASS <name>" per scenario; exits non-zero on the first
 * failure. */

#define SQD_SPDK_ASSERT_LAYOUT 1
#include <sqdisc_spdk.h>
#include <sqdisc_sim.h>

#include "support/spdk_standin.h"

#include "support/spdk_world.h"

enum { SQ = 8, RECVS = 4, BEFORE = 14, AFTER = 3, SENDS = BEFORE + AFTER };

static void every_wr_of_a_fatal_qp_completes_once_in_post_order(void)
{
    struct world w;
    struct rdma_cm_id id;
    current = "every_wr_of_a_fatal_qp_completes_once_in_post_order";
    world_new(&w, NULL, 1024);
    struct spdk_rdma_provider_qp *q = qpair_new(&w, &id, SQ, RECVS, NULL, NULL);
    CHECK(q != NULL);
    peer_connect(&w, q->qp, 64);

    struct ibv_recv_wr rwr[RECVS], *rbad = NULL;
    struct ibv_sge rsge[RECVS];
    recv_wrs(&w, rwr, rsge, RECVS, 900, 1);
    spdk_rdma_provider_qp_queue_recv_wrs(q, rwr);
    CHECK_EQ(spdk_rdma_provider_qp_flush_recv_wrs(q, &rbad), 0);

    /* SPDK's shape: unsignaled WRITEs and signaled SENDs. 14 on an 8-deep SQ: 8 reach the SQ, 6 wait in the
     * backlog when the device makes the QP fatal (as `sqdisc-sim fail-qps` does to SPDK's host). */
    struct ibv_send_wr wrs[SENDS], *bad = NULL;
    struct ibv_sge sges[SENDS];
    for (int i = 0; i < SENDS; i++) {
        if (i % 3 == 2)
            send_wr(&w, &wrs[i], &sges[i], 1000 + (uint64_t)i);
        else
            write_wr(&w, &wrs[i], &sges[i], 1000 + (uint64_t)i, 0);
    }
    link_wrs(wrs, BEFORE);
    wrs[BEFORE - 1].next = NULL;
    spdk_rdma_provider_qp_queue_send_wrs(q, wrs);
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), 0);
    struct sqd_queue_stats s = qstats(q);
    CHECK_EQ(s.in_provider, SQ);
    CHECK_EQ(s.backlog, BEFORE - SQ);
    struct sqd_spdk_qp_counters c = counters(q);
    CHECK_EQ(c.owed, 0);

    CHECK_EQ(sqd_sim_set_error(q->qp), 0);

    /* SPDK polls a little of it, learns of the failure, and still posts: those WRs are taken and flushed too. */
    struct ibv_wc wc[64];
    int n = reap(&w, wc, 3, 3, 200);
    CHECK_EQ(n, 3);
    link_wrs(&wrs[BEFORE], AFTER);
    spdk_rdma_provider_qp_queue_send_wrs(q, &wrs[BEFORE]);
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), 0);
    CHECK(bad == NULL);
    n += reap(&w, wc + n, 64 - n, SENDS + RECVS - n, 200);
    CHECK_EQ(n, SENDS + RECVS);
    CHECK_EQ(reap(&w, wc + n, 64 - n, 1, 20), 0); /* and nothing more */

    int seen[SENDS] = {0}, recvs = 0, last = -1;
    for (int i = 0; i < n; i++) {
        CHECK_EQ(wc[i].status, IBV_WC_WR_FLUSH_ERR);
        CHECK_EQ(wc[i].qp_num, q->qp->qp_num);
        if (wc[i].wr_id >= 900 && wc[i].wr_id < 900 + RECVS) {
            recvs++;
            continue;
        }
        int k = (int)(wc[i].wr_id - 1000);
        CHECK(k >= 0 && k < SENDS);
        CHECK(k > last); /* in post order */
        last = k;
        seen[k]++;
    }
    CHECK_EQ(recvs, RECVS);
    for (int k = 0; k < SENDS; k++)
        CHECK_EQ(seen[k], 1);

    /* Where each came from: the SQ's WRs and the receives from the device's flush CQEs, the backlog's and the
     * late posts' from the provider; none twice, none still owed. */
    c = counters(q);
    CHECK_EQ(c.send_flushes, SQ);
    CHECK_EQ(c.recv_flushes, RECVS);
    CHECK_EQ(c.owed_flushes, BEFORE - SQ + AFTER);
    CHECK_EQ(c.other_errors, 0);
    CHECK_EQ(c.duplicates, 0);
    CHECK_EQ(c.owed, 0);
    CHECK_EQ(c.refused, 0);
    CHECK_EQ(c.cq_not_grown, 0);
    struct sqd_cq_stats cs;
    CHECK_EQ(sqd_spdk_cq_stats(w.cq, &cs), 0);
    CHECK_EQ(cs.stray, 0);

    int logs = standin.logs;
    spdk_rdma_provider_qp_destroy(q);
    CHECK_EQ(standin.logs, logs); /* nothing owed, nothing twice: nothing to say */
    world_free(&w);
    printf("PASS %s\n", current);
}

/* A qpair destroyed before SPDK polled the flushes it was owed: the counters say how many it never got, and
 * the provider says so once, with the numbers. */
static void flushes_never_polled_are_counted_and_logged_at_destroy(void)
{
    struct world w;
    struct rdma_cm_id id;
    current = "flushes_never_polled_are_counted_and_logged_at_destroy";
    world_new(&w, NULL, 1024);
    struct spdk_rdma_provider_qp *q = qpair_new(&w, &id, 4, 0, NULL, NULL);
    CHECK(q != NULL);
    peer_connect(&w, q->qp, 64);
    enum { N = 6 };
    struct ibv_send_wr wrs[N], *bad = NULL;
    struct ibv_sge sges[N];
    for (int i = 0; i < N; i++)
        write_wr(&w, &wrs[i], &sges[i], 3000 + (uint64_t)i, i == N - 1);
    link_wrs(wrs, N);
    spdk_rdma_provider_qp_queue_send_wrs(q, wrs);
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), 0);
    CHECK_EQ(sqd_sim_set_error(q->qp), 0);
    /* SPDK polls the SQ's four flushes and no more: the backlog's two, which they made due, stay owed. */
    struct ibv_wc wc[8];
    CHECK_EQ(reap(&w, wc, 4, 4, 200), 4);
    for (int i = 0; i < 4; i++)
        CHECK_EQ(wc[i].wr_id, 3000 + (uint64_t)i);
    struct sqd_spdk_qp_counters c = counters(q);
    CHECK_EQ(c.send_flushes, 4);
    CHECK_EQ(c.owed, 2);

    int logs = standin.logs;
    spdk_rdma_provider_qp_destroy(q);
    CHECK_EQ(standin.logs, logs + 1);
    CHECK(strstr(standin.last_log, "error completion(s) owed to SPDK and not handed") != NULL);
    CHECK(strstr(standin.last_log, "destroyed with 2 error completion(s) owed to SPDK and not handed, 0 handed twice (4 flushes of sends") != NULL);
    world_free(&w);
    printf("PASS %s\n", current);
}

static void counters_refuse_a_size_below_the_first_version(void)
{
    struct world w;
    struct rdma_cm_id id;
    current = "counters_refuse_a_size_below_the_first_version";
    world_new(&w, NULL, 1024);
    struct spdk_rdma_provider_qp *q = qpair_new(&w, &id, 4, 0, NULL, NULL);
    CHECK(q != NULL);
    struct sqd_spdk_qp_counters c;
    memset(&c, 0, sizeof c);
    c.size = 8;
    CHECK_EQ(sqd_spdk_qp_counters(q, &c), -EINVAL);
    CHECK(strstr(standin.last_log, "below the first version") != NULL);
    c.size = sizeof c;
    CHECK_EQ(sqd_spdk_qp_counters(NULL, &c), -EINVAL);
    CHECK_EQ(sqd_spdk_qp_counters(q, NULL), -EINVAL);
    /* A caller built against a later, larger struct gets this version's part, and its size. */
    struct {
        struct sqd_spdk_qp_counters c;
        uint64_t later;
    } big;
    memset(&big, 0xab, sizeof big);
    big.c.size = sizeof big;
    CHECK_EQ(sqd_spdk_qp_counters(q, &big.c), 0);
    CHECK_EQ(big.c.size, sizeof c);
    CHECK_EQ(big.later, 0xababababababababull);
    spdk_rdma_provider_qp_destroy(q);
    world_free(&w);
    printf("PASS %s\n", current);
}

int main(void)
{
    every_wr_of_a_fatal_qp_completes_once_in_post_order();
    flushes_never_polled_are_counted_and_logged_at_destroy();
    counters_refuse_a_size_below_the_first_version();
    return 0;
}
