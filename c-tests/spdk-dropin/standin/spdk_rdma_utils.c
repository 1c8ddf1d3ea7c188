/* The behaviour a stand-in libspdk_rdma_utils needs: the memory-domain reference SPDK's providers take for a
 * qpair's PD, counted. The map's other symbols are stubs. */
#include "trace.h"

#include <errno.h>
#include <stddef.h>

struct ibv_pd;
struct spdk_memory_domain {
    int refs;
};
static struct spdk_memory_domain domain;

struct spdk_memory_domain *spdk_rdma_utils_get_memory_domain(struct ibv_pd *pd);
int spdk_rdma_utils_put_memory_domain(struct spdk_memory_domain *d);

struct spdk_memory_domain *spdk_rdma_utils_get_memory_domain(struct ibv_pd *pd)
{
    dropin_trace("spdk_rdma_utils_get_memory_domain");
    if (pd == NULL)
        return NULL;
    domain.refs++;
    return &domain;
}

int spdk_rdma_utils_put_memory_domain(struct spdk_memory_domain *d)
{
    dropin_trace("spdk_rdma_utils_put_memory_domain");
    if (d != &domain || domain.refs <= 0)
        return -EINVAL;
    domain.refs--;
    return 0;
}
