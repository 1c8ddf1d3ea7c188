/* A stand-in for an SPDK application of one release, linked as that release's applications are (against its
 * libraries by soname, or with every archive inside --whole-archive), against stand-ins of that release's
 * libraries that export exactly what the release exports (scripts/check-spdk-dropin.sh builds them).
 *
 * It drives one qpair through the provider as SPDK's NVMe-oF target does (create, accept, disconnect with
 * the completions reaped, destroy) on the software HCA, and prints which provider answered ("spdk" or
 * "sqdisc") followed by every call that reached SPDK's libraries or librdmacm, in order. librdmacm cannot
 * connect on the software HCA: the four functions a provider calls are defined here, on sqd_sim_*, and take
 * precedence over librdmacm's (the program exports them, -rdynamic). */
#include <sqdisc_sim.h>
#include <sqdisc_spdk.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

void dropin_trace(const char *event);

static char trace[2048];
static struct sqd_sim *sim;

void dropin_trace(const char *event)
{
    size_t n = strlen(trace);
    snprintf(trace + n, sizeof trace - n, " %s", event);
}

int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    struct ibv_qp *qp = NULL;
    int rc;
    (void)pd;
    dropin_trace("rdma_create_qp");
    rc = sqd_sim_create_qp(sim, attr, &qp);
    if (rc) {
        errno = -rc;
        return -1;
    }
    id->qp = qp;
    return 0;
}

void rdma_destroy_qp(struct rdma_cm_id *id)
{
    dropin_trace("rdma_destroy_qp");
    if (id->qp && sqd_sim_destroy_qp(id->qp) == 0)
        id->qp = NULL;
}

int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
    (void)id;
    (void)param;
    dropin_trace("rdma_accept");
    return 0;
}

/* As for IB and RoCE: the QP moves to the error state. */
int rdma_disconnect(struct rdma_cm_id *id)
{
    dropin_trace("rdma_disconnect");
    if (!id->qp || sqd_sim_set_error(id->qp) != 0) {
        errno = EINVAL;
        return -1;
    }
    return 0;
}

static int fail(const char *what)
{
    printf("%s failed;%s\n", what, trace);
    return 1;
}

int main(void)
{
    struct sqd_sim_config cfg;
    struct ibv_cq *cq = NULL;
    struct rdma_cm_id id;
    struct spdk_rdma_provider_qp_init_attr attr;
    struct spdk_rdma_provider_qp *q;
    struct ibv_wc wc[16];
    int is_spdk = spdk_rdma_provider_accel_sequence_supported();

    sqd_sim_config_default(&cfg);
    if (sqd_sim_new(&cfg, &sim) != 0 || sqd_sim_create_cq(sim, 256, &cq) != 0)
        return fail("software HCA setup");
    memset(&id, 0, sizeof id);
    memset(&attr, 0, sizeof attr);
    attr.qp_context = &id;
    attr.send_cq = attr.recv_cq = cq;
    attr.pd = sqd_sim_pd(sim);
    attr.cap.max_send_wr = 16;
    attr.cap.max_recv_wr = 16;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    q = spdk_rdma_provider_qp_create(&id, &attr);
    if (q == NULL)
        return fail("qp_create");
    if (spdk_rdma_provider_qp_accept(q, NULL) != 0)
        return fail("qp_accept");
    if (spdk_rdma_provider_qp_disconnect(q) != 0)
        return fail("qp_disconnect");
    while (ibv_poll_cq(cq, 16, wc) > 0)
        ;
    spdk_rdma_provider_qp_destroy(q);
    if (sqd_sim_destroy_cq(cq) != 0)
        return fail("destroying the CQ");
    sqd_sim_free(sim);
    printf("%s%s\n", is_spdk ? "spdk" : "sqdisc", trace);
    return 0;
}
