/* One device registry per process, with two copies of sqdisc loaded: libsqdisc (the software HCA's library) and
 * the copy inside libsqdisc_spdk. The sim registers itself through libsqdisc's sqd_device_register; the objects
 * the SPDK provider's handles hold (its qpair's QP, the poll group's CQ, an SRQ) must be seen by the sim, which
 * refuses to destroy them (-EBUSY) instead of leaving the provider to a use after free, and the provider's SRQs
 * must be made and destroyed by the sim's own calls, with no help from the program (no ibv_create_srq stand-in). */

#include <infiniband/verbs.h>
#include <sqdisc.h>
#include <sqdisc_sim.h>
#include <sqdisc_spdk.h>

#include "support/spdk_standin.h"

#include "support/spdk_world.h"

/* The provider's qpair and the poll group's CQ are held by the provider's copy of sqdisc: the sim says so. */
static void objects_held_by_the_provider_are_not_destroyed(void)
{
    struct world w;
    struct rdma_cm_id id;
    current = "objects_held_by_the_provider_are_not_destroyed";
    world_new(&w, NULL, 256);

    struct spdk_rdma_provider_qp *q = qpair_new(&w, &id, 8, 8, NULL, NULL);
    CHECK(q != NULL && q->qp != NULL);
    /* The QP's handle lives in libsqdisc_spdk, the sim in libsqdisc: one registry, so the sim knows. */
    CHECK_EQ(sqd_sim_destroy_qp(q->qp), -EBUSY);
    CHECK(strstr(sqd_last_error(), "still managed") != NULL);
    CHECK_EQ(sqd_sim_destroy_cq(w.cq), -EBUSY);
    CHECK_EQ(sqd_sim_free(w.sim), -EBUSY);

    /* The QP still works: a send reaches the peer and its completion reaches SPDK. */
    peer_connect(&w, q->qp, 4);
    struct ibv_send_wr wr, *bad = NULL;
    struct ibv_sge sge;
    send_wr(&w, &wr, &sge, 77);
    CHECK(spdk_rdma_provider_qp_queue_send_wrs(q, &wr));
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), 0);
    struct ibv_wc wc[4];
    CHECK_EQ(reap(&w, wc, 4, 1, 100), 1);
    CHECK_EQ(wc[0].wr_id, 77);
    CHECK_EQ(wc[0].status, IBV_WC_SUCCESS);

    int destroyed = standin.destroy_qp;
    spdk_rdma_provider_qp_destroy(q); /* the provider drops its handle, then destroys the QP */
    CHECK_EQ(standin.destroy_qp, destroyed + 1);
    CHECK(id.qp == NULL); /* the stand-in's destroy succeeded: the handle was gone first */
    world_free(&w); /* the CQ is destroyed there: no handle holds it any more (the last qpair is gone) */
    printf("PASS %s\n", current);
}

/* The provider's SRQ is made and destroyed by the sim's registered calls; the sim refuses it while the
 * provider's SRQ handle holds it. */
static void the_providers_srq_reaches_the_sims_own_calls(void)
{
    struct world w;
    current = "the_providers_srq_reaches_the_sims_own_calls";
    world_new(&w, NULL, 256);
    int created = standin.srqs_created, destroyed = standin.srqs_destroyed;

    struct spdk_rdma_provider_srq_init_attr sa;
    memset(&sa, 0, sizeof sa);
    sa.pd = w.pd;
    sa.srq_init_attr.attr.max_wr = 16;
    sa.srq_init_attr.attr.max_sge = 1;
    struct spdk_rdma_provider_srq *srq = spdk_rdma_provider_srq_create(&sa);
    CHECK(srq != NULL && srq->srq != NULL);
    CHECK_EQ(standin.srqs_created, created + 1);
    CHECK(srq->srq->context == sqd_sim_context(w.sim));
    CHECK_EQ(sqd_sim_destroy_srq(srq->srq), -EBUSY); /* held by the provider's SRQ handle */
    CHECK_EQ(spdk_rdma_provider_srq_destroy(srq), 0);
    CHECK_EQ(standin.srqs_destroyed, destroyed + 1);
    world_free(&w);
    printf("PASS %s\n", current);
}

int main(void)
{
    objects_held_by_the_provider_are_not_destroyed();
    the_providers_srq_reaches_the_sims_own_calls();
    return 0;
}
