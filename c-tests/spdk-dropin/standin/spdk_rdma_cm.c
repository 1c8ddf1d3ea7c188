/* The behaviour a stand-in libspdk_rdma_cm needs, for a release that has that library: the wrappers over
 * librdmacm that SPDK's verbs provider calls there, each passing the call on to librdmacm. The map's other
 * symbols are stubs. */
#include "trace.h"

#include <rdma/rdma_cma.h>

int spdk_rdma_cm_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
void spdk_rdma_cm_destroy_qp(struct rdma_cm_id *id);
int spdk_rdma_cm_accept(struct rdma_cm_id *id, struct rdma_conn_param *param);
int spdk_rdma_cm_disconnect(struct rdma_cm_id *id);

int spdk_rdma_cm_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    dropin_trace("spdk_rdma_cm_create_qp");
    return rdma_create_qp(id, pd, attr);
}

void spdk_rdma_cm_destroy_qp(struct rdma_cm_id *id)
{
    dropin_trace("spdk_rdma_cm_destroy_qp");
    rdma_destroy_qp(id);
}

int spdk_rdma_cm_accept(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
    dropin_trace("spdk_rdma_cm_accept");
    return rdma_accept(id, param);
}

int spdk_rdma_cm_disconnect(struct rdma_cm_id *id)
{
    dropin_trace("spdk_rdma_cm_disconnect");
    return rdma_disconnect(id);
}
