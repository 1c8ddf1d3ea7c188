/* A stand-in for SPDK's own libspdk_rdma_provider (as built by SPDK, soname libspdk_rdma_provider.so.9): the
 * same 14 symbols, each answering in a way that tells it apart from libsqdisc_spdk. Only the drop-in check
 * (scripts/check-spdk-dropin.sh) uses it: it shows which library a program's calls reach. */
#define _GNU_SOURCE
#include <sqdisc_spdk.h>

#include <stddef.h>

static struct spdk_rdma_provider_qp fake_qp;
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
    (void)id;
    (void)a;
    return &fake_qp;
}
int spdk_rdma_provider_qp_accept(struct spdk_rdma_provider_qp *q, struct rdma_conn_param *p)
{
    (void)q;
    (void)p;
    return 0;
}
int spdk_rdma_provider_qp_complete_connect(struct spdk_rdma_provider_qp *q) { (void)q; return 0; }
void spdk_rdma_provider_qp_destroy(struct spdk_rdma_provider_qp *q) { (void)q; }
int spdk_rdma_provider_qp_disconnect(struct spdk_rdma_provider_qp *q) { (void)q; return 0; }
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
