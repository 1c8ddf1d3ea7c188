/* SPDK's NVMe-RDMA host through libsqdisc_spdk: its qpairs must connect wherever SPDK's own provider lets them.
 * The host gives a qpair of depth n a CQ of 2 * n CQEs (nvme_rdma.c: the CQ of a qpair outside a poll group,
 * and WC_PER_QPAIR for a poll group's), n sends and n receives, and signals every SEND it posts. On a device
 * that neither resizes CQs nor rounds their size up (here the software HCA with ibv_resize_cq failing), the
 * qpair must still be made, and a disconnect with everything outstanding must not overrun the CQ; one CQE
 * less and the qpair is refused, with the numbers in SPDK's log. Prints "PASS <name>" per scenario. */

#include <sqdisc_spdk.h>
#include <sqdisc_sim.h>

#include "support/spdk_standin.h"

#include "support/spdk_world.h"

#define DEPTH 32

static uint64_t cq_overruns(struct world *w)
{
    struct sqd_sim_stats st;
    CHECK_EQ(sqd_sim_stats(w->sim, &st), 0);
    return st.cq_overruns;
}

/* A capsule SEND of the host: one signaled WR per request. */
static void capsule(struct world *w, struct ibv_send_wr *wr, struct ibv_sge *s, uint64_t id)
{
    send_wr(w, wr, s, id);
}

static void host_qpair_fits_a_cq_of_twice_its_depth(void)
{
    struct world w;
    struct rdma_cm_id id;
    struct sqd_cq_stats cs;
    current = "host_qpair_fits_a_cq_of_twice_its_depth";
    world_new(&w, NULL, 2 * DEPTH);
    standin.resize_fail = EOPNOTSUPP;
    int resizes = standin.resizes;

    struct spdk_rdma_provider_qp *q = qpair_new(&w, &id, DEPTH, DEPTH, NULL, NULL);
    CHECK(q != NULL);
    CHECK_EQ(standin.resizes, resizes);
    CHECK_EQ(sqd_spdk_cq_stats(w.cq, &cs), 0);
    CHECK_EQ(cs.capacity, 2 * DEPTH);
    CHECK_EQ(cs.reserved, 2 * DEPTH);
    peer_connect(&w, q->qp, 4 * DEPTH);

    /* Receives for the responses, then two rounds of n capsules, each request queued on its own and the
     * batch flushed, as the host does; the completions are reaped in between. */
    struct ibv_recv_wr r[DEPTH], *bad_r = NULL;
    struct ibv_sge rs[DEPTH];
    recv_wrs(&w, r, rs, DEPTH, 0x5000, 1);
    CHECK(spdk_rdma_provider_qp_queue_recv_wrs(q, r));
    CHECK_EQ(spdk_rdma_provider_qp_flush_recv_wrs(q, &bad_r), 0);
    struct ibv_send_wr s[DEPTH], *bad = NULL;
    struct ibv_sge ss[DEPTH];
    struct ibv_wc wc[4 * DEPTH];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < DEPTH; i++) {
            capsule(&w, &s[i], &ss[i], (uint64_t)(round * DEPTH + i));
            spdk_rdma_provider_qp_queue_send_wrs(q, &s[i]);
        }
        CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), 0);
        if (round == 0) {
            int got = reap(&w, wc, 4 * DEPTH, DEPTH, 50);
            CHECK_EQ(got, DEPTH);
            for (int i = 0; i < got; i++)
                CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_SEND && wc[i].wr_id == (uint64_t)i);
        }
    }

    /* Disconnect with n sends and n receives outstanding: at most 2 n CQEs, on a CQ of 2 n, all reaped. */
    CHECK_EQ(spdk_rdma_provider_qp_disconnect(q), 0);
    int got = reap(&w, wc, 4 * DEPTH, 2 * DEPTH, 50);
    CHECK_EQ(got, 2 * DEPTH);
    int sends = 0, recvs = 0;
    for (int i = 0; i < got; i++) {
        sends += wc[i].wr_id >= DEPTH && wc[i].wr_id < 2 * DEPTH;
        recvs += wc[i].wr_id >= 0x5000 && wc[i].wr_id < 0x5000 + DEPTH;
    }
    CHECK_EQ(sends, DEPTH);
    CHECK_EQ(recvs, DEPTH);
    struct sqd_queue_stats qs = qstats(q);
    CHECK_EQ(qs.markers, 0);
    CHECK_EQ(cq_overruns(&w), 0);
    spdk_rdma_provider_qp_destroy(q);
    standin.resize_fail = 0;
    world_free(&w);
    printf("PASS %s\n", current);
}

static void one_cqe_short_of_the_host_sizing_is_refused_with_the_numbers(void)
{
    struct world w;
    struct rdma_cm_id id;
    current = "one_cqe_short_of_the_host_sizing_is_refused_with_the_numbers";
    world_new(&w, NULL, 2 * DEPTH - 1);
    standin.resize_fail = EOPNOTSUPP;
    int made = standin.create_qp, destroyed = standin.destroy_qp, errors = standin.errors;
    CHECK(qpair_new(&w, &id, DEPTH, DEPTH, NULL, NULL) == NULL);
    CHECK_EQ(standin.errors, errors + 1);
    CHECK(strstr(standin.last_log, "CQ too small") != NULL);
    CHECK(strstr(standin.last_log, "holds 63 CQEs") != NULL);
    CHECK(strstr(standin.last_log, "needs 64") != NULL);
    CHECK(strstr(standin.last_log, "ibv_resize_cq failed") != NULL);
    CHECK_EQ(standin.create_qp, made + 1);
    CHECK_EQ(standin.destroy_qp, destroyed + 1);
    standin.resize_fail = 0;
    world_free(&w);
    printf("PASS %s\n", current);
}

/* The same fit for a caller that leaves WRs unsignaled (the target's WRITEs before its SEND): the provider
 * signals them itself, and SPDK still sees only the completions it asked for. */
static void unsignaled_writes_on_an_exact_cq_still_show_only_the_send(void)
{
    struct world w;
    struct rdma_cm_id id;
    current = "unsignaled_writes_on_an_exact_cq_still_show_only_the_send";
    world_new(&w, NULL, 2 * DEPTH);
    standin.resize_fail = EOPNOTSUPP;
    struct spdk_rdma_provider_qp *q = qpair_new(&w, &id, DEPTH, DEPTH, NULL, NULL);
    CHECK(q != NULL);
    peer_connect(&w, q->qp, 4 * DEPTH);
    struct ibv_send_wr wrs[4], *bad = NULL;
    struct ibv_sge sg[4];
    struct ibv_wc wc[4 * DEPTH];
    int shown = 0;
    for (int req = 0; req < 3 * DEPTH; req++) {
        for (int i = 0; i < 3; i++)
            write_wr(&w, &wrs[i], &sg[i], (uint64_t)(req * 4 + i), 0);
        send_wr(&w, &wrs[3], &sg[3], (uint64_t)(req * 4 + 3));
        link_wrs(wrs, 4);
        spdk_rdma_provider_qp_queue_send_wrs(q, wrs);
        CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), 0);
        int got = reap(&w, wc, 4 * DEPTH, 1, 50);
        for (int i = 0; i < got; i++) {
            CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_SEND);
            CHECK_EQ(wc[i].wr_id % 4, 3);
        }
        shown += got;
    }
    CHECK_EQ(shown, 3 * DEPTH);
    CHECK_EQ(qstats(q).markers, 0);
    CHECK_EQ(spdk_rdma_provider_qp_disconnect(q), 0);
    reap(&w, wc, 4 * DEPTH, 4 * DEPTH, 20);
    CHECK_EQ(cq_overruns(&w), 0);
    spdk_rdma_provider_qp_destroy(q);
    standin.resize_fail = 0;
    world_free(&w);
    printf("PASS %s\n", current);
}

int main(void)
{
    host_qpair_fits_a_cq_of_twice_its_depth();
    one_cqe_short_of_the_host_sizing_is_refused_with_the_numbers();
    unsignaled_writes_on_an_exact_cq_still_show_only_the_send();
    return 0;
}
