/* The behaviour of a stand-in for SPDK's own libspdk_rdma_provider (the verbs provider), built for each
 * release with that release's soname: it reaches the connection manager as that release's provider does
 * (spdk_rdma_cm_* where the release has libspdk_rdma_cm, STANDIN_SPDK_RDMA_CM; librdmacm directly before)
 * and takes the memory domain from libspdk_rdma_utils. Its accel_sequence_supported answers true, which tells
 * it apart from libsqdisc_spdk in scripts/check-spdk-dropin.sh. */
#define _GNU_SOURCE
#include <sqdisc_spdk.h>

#include <stddef.h>
#include <stdlib.h>

struct spdk_memory_domain *spdk_rdma_utils_get_memory_domain(struct ibv_pd *pd);
int spdk_rdma_utils_put_memory_domain(struct spdk_memory_domain *domain);
#ifdef STANDIN_SPDK_RDMA_CM
int spdk_rdma_cm_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
void spdk_rdma_cm_destroy_qp(struct rdma_cm_id *id);
int spdk_rdma_cm_accept(struct rdma_cm_id *id, struct rdma_conn_param *param);
int spdk_rdma_cm_disconnect(struct rdma_cm_id *id);
#define CM(fn) spdk_rdma_cm_##fn
#else
#define CM(fn) rdma_##fn
#endif

static struct spdk_rdma_provider_srq fake_srq;

struct spdk_rdma_provider_srq *spdk_rdma_provider_srq_create(struct spdk_rdma_provider_srq_init_attr *a)
{
    (void)a;
    return &fake_srq;
}
int spdk_rdma_provider_srq_destroy(struct spdk_rdma_provider_srq *s) { (void)s; return 0; }
bool spdk_rdma_provider_srq_queue_recv_wrs(struct spdk_rdma_provider_srq *s, struct ibv_recv_wr *f)
{
    (void)s;
    (void)f;
    return true;
}
int spdk_rdma_provider_srq_flush_recv_wrs(struct spdk_rdma_provider_srq *s, struct ibv_recv_wr **b)
{
    (void)s;
    (void)b;
    return 0;
}
struct spdk_rdma_provider_qp *spdk_rdma_provider_qp_create(struct rdma_cm_id *id,
                                                           struct spdk_rdma_provider_qp_init_attr *a)
{
    struct ibv_qp_init_attr init = {.qp_context = a->qp_context, .send_cq = a->send_cq, .recv_cq = a->recv_cq,
                                    .srq = a->srq, .cap = a->cap, .qp_type = IBV_QPT_RC};
    struct spdk_rdma_provider_qp *q = calloc(1, sizeof *q);
    if (q == NULL || CM(create_qp)(id, a->pd, &init) != 0) {
        free(q);
        return NULL;
    }
    q->qp = id->qp;
    q->cm_id = id;
    q->domain = spdk_rdma_utils_get_memory_domain(a->pd);
    a->cap = init.cap;
    return q;
}
int spdk_rdma_provider_qp_accept(struct spdk_rdma_provider_qp *q, struct rdma_conn_param *p)
{
    return CM(accept)(q->cm_id, p);
}
int spdk_rdma_provider_qp_complete_connect(struct spdk_rdma_provider_qp *q) { (void)q; return 0; }
void spdk_rdma_provider_qp_destroy(struct spdk_rdma_provider_qp *q)
{
    if (q == NULL)
        return;
    if (q->qp)
        CM(destroy_qp)(q->cm_id);
    if (q->domain)
        spdk_rdma_utils_put_memory_domain(q->domain);
    free(q);
}
int spdk_rdma_provider_qp_disconnect(struct spdk_rdma_provider_qp *q) { return CM(disconnect)(q->cm_id); }
bool spdk_rdma_provider_qp_queue_send_wrs(struct spdk_rdma_provider_qp *q, struct ibv_send_wr *f)
{
    (void)q;
    (void)f;
    return true;
}
int spdk_rdma_provider_qp_flush_send_wrs(struct spdk_rdma_provider_qp *q, struct ibv_send_wr **b)
{
    (void)q;
    (void)b;
    return 0;
}
bool spdk_rdma_provider_qp_queue_recv_wrs(struct spdk_rdma_provider_qp *q, struct ibv_recv_wr *f)
{
    (void)q;
    (void)f;
    return true;
}
int spdk_rdma_provider_qp_flush_recv_wrs(struct spdk_rdma_provider_qp *q, struct ibv_recv_wr **b)
{
    (void)q;
    (void)b;
    return 0;
}
bool spdk_rdma_provider_accel_sequence_supported(void) { return true; }
