/* What libsqdisc_spdk calls outside sqdisc, for the SPDK benchmarks on the null provider (null_provider.h):
 * SPDK master's rdma_cm wrappers (spdk_rdma_cm_create_qp / destroy_qp / accept / disconnect) make and destroy
 * QPs of the null device `bench_dev`, SPDK's memory-domain refcount and logger are counted stand-ins,
 * ibv_resize_cq refuses (the benchmarks size their CQs for every qpair's reservation), and ibv_create_srq /
 * ibv_destroy_srq make and destroy SRQs of the null device (libibverbs would reach a provider's private ops). The program exports them
 * to the shared library (link with -rdynamic). Include in one translation unit. */

#ifndef SQDISC_BENCH_SPDK_NULL_STANDIN_H
#define SQDISC_BENCH_SPDK_NULL_STANDIN_H

#include "null_provider.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <rdma/rdma_cma.h>

struct spdk_memory_domain {
    int refs;
};

static struct {
    struct null_device *dev;
    struct spdk_memory_domain domain;
    char last_log[512];
} bench;

int spdk_rdma_cm_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
void spdk_rdma_cm_destroy_qp(struct rdma_cm_id *id);
int spdk_rdma_cm_accept(struct rdma_cm_id *id, struct rdma_conn_param *param);
int spdk_rdma_cm_disconnect(struct rdma_cm_id *id);
struct spdk_memory_domain *spdk_rdma_utils_get_memory_domain(struct ibv_pd *pd);
int spdk_rdma_utils_put_memory_domain(struct spdk_memory_domain *domain);
void spdk_log(int level, const char *file, const int line, const char *func, const char *format, ...);

int spdk_rdma_cm_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    (void)pd;
    id->qp = null_create_qp(bench.dev, attr);
    if (!id->qp) {
        errno = ENOMEM;
        return -1;
    }
    return 0;
}

void spdk_rdma_cm_destroy_qp(struct rdma_cm_id *id)
{
    if (id->qp && null_destroy_qp(id->qp) == 0)
        id->qp = NULL;
}

int spdk_rdma_cm_accept(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
    (void)id;
    (void)param;
    return 0;
}

int spdk_rdma_cm_disconnect(struct rdma_cm_id *id)
{
    (void)id;
    return 0;
}

struct spdk_memory_domain *spdk_rdma_utils_get_memory_domain(struct ibv_pd *pd)
{
    (void)pd;
    bench.domain.refs++;
    return &bench.domain;
}

int spdk_rdma_utils_put_memory_domain(struct spdk_memory_domain *domain)
{
    if (domain != &bench.domain || domain->refs <= 0)
        return -EINVAL;
    domain->refs--;
    return 0;
}

void spdk_log(int level, const char *file, const int line, const char *func, const char *format, ...)
{
    va_list ap;
    (void)level;
    (void)file;
    (void)line;
    (void)func;
    va_start(ap, format);
    vsnprintf(bench.last_log, sizeof bench.last_log, format, ap);
    va_end(ap);
}

struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
    (void)pd;
    struct ibv_srq *srq = null_create_srq(bench.dev, attr);
    if (!srq)
        errno = EINVAL;
    return srq;
}

int ibv_destroy_srq(struct ibv_srq *srq)
{
    return null_destroy_srq(srq);
}

int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
    (void)cq;
    (void)cqe;
    return EOPNOTSUPP;
}

#endif
