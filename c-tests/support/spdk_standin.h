/* Stand-ins for what libsqdisc_spdk calls outside sqdisc, so that the SPDK provider runs on the software HCA
 * in a test program without SPDK:
 *   - SPDK master's rdma_cm wrappers (spdk_rdma_cm_create_qp / destroy_qp / accept / disconnect), on sqd_sim_*:
 *     disconnect moves the QP to the error state, as rdma_disconnect does for IB and RoCE. A program that
 *     defines them makes the provider use them, as in SPDK master; the releases' path, librdmacm directly, is
 *     driven by scripts/check-spdk-dropin.sh;
 *   - SPDK's memory-domain refcount (spdk_rdma_utils_get/put_memory_domain) and its logger (spdk_log);
 *   - libibverbs' ibv_resize_cq, which reaches a provider through private driver ops the software HCA does not
 *     have: this definition in the program takes precedence over libibverbs'.
 * The program must export them to the shared library (link with -rdynamic). Include this file in one
 * translation unit, after setting standin.sim to the device. It counts every call so tests can check them.
 * The provider's SRQs reach the software HCA through the device seam (sqd_device_register), which the copy of
 * sqdisc inside libsqdisc_spdk shares with libsqdisc: standin_count_srqs wraps the sim's registered
 * create_srq / destroy_srq to count them. */

#ifndef SQDISC_C_TESTS_SPDK_STANDIN_H
#define SQDISC_C_TESTS_SPDK_STANDIN_H

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sqdisc_sim.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

struct spdk_memory_domain {
    int refs;
};

static struct {
    struct sqd_sim *sim;
    int create_qp_fail;            /* make the next spdk_rdma_cm_create_qp fail with this errno */
    int create_qp, destroy_qp, accept, disconnect;
    int srqs_created, srqs_destroyed;
    int resize_fail;               /* make ibv_resize_cq fail with this errno (a device that cannot resize) */
    int resizes;
    struct spdk_memory_domain domain;
    int logs, errors;
    char last_log[512];
} standin;

int spdk_rdma_cm_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
void spdk_rdma_cm_destroy_qp(struct rdma_cm_id *id);
int spdk_rdma_cm_accept(struct rdma_cm_id *id, struct rdma_conn_param *param);
int spdk_rdma_cm_disconnect(struct rdma_cm_id *id);
struct spdk_memory_domain *spdk_rdma_utils_get_memory_domain(struct ibv_pd *pd);
int spdk_rdma_utils_put_memory_domain(struct spdk_memory_domain *domain);
void spdk_log(int level, const char *file, const int line, const char *func, const char *format, ...);

int spdk_rdma_cm_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    struct ibv_qp *qp = NULL;
    int rc;
    (void)pd;
    standin.create_qp++;
    if (standin.create_qp_fail) {
        errno = standin.create_qp_fail;
        standin.create_qp_fail = 0;
        return -1;
    }
    rc = sqd_sim_create_qp(standin.sim, attr, &qp);
    if (rc) {
        errno = -rc;
        return -1;
    }
    id->qp = qp;
    return 0;
}

void spdk_rdma_cm_destroy_qp(struct rdma_cm_id *id)
{
    standin.destroy_qp++;
    if (id->qp && sqd_sim_destroy_qp(id->qp) == 0)
        id->qp = NULL;
}

int spdk_rdma_cm_accept(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
    (void)id;
    (void)param;
    standin.accept++;
    return 0;
}

int spdk_rdma_cm_disconnect(struct rdma_cm_id *id)
{
    standin.disconnect++;
    if (!id->qp || sqd_sim_set_error(id->qp) != 0) {
        errno = EINVAL;
        return -1;
    }
    return 0;
}

struct spdk_memory_domain *spdk_rdma_utils_get_memory_domain(struct ibv_pd *pd)
{
    (void)pd;
    standin.domain.refs++;
    return &standin.domain;
}

int spdk_rdma_utils_put_memory_domain(struct spdk_memory_domain *domain)
{
    if (domain != &standin.domain || domain->refs <= 0)
        return -EINVAL;
    domain->refs--;
    return 0;
}

void spdk_log(int level, const char *file, const int line, const char *func, const char *format, ...)
{
    va_list ap;
    (void)file;
    (void)line;
    (void)func;
    standin.logs++;
    if (level == 0)
        standin.errors++;
    va_start(ap, format);
    vsnprintf(standin.last_log, sizeof standin.last_log, format, ap);
    va_end(ap);
}

/* The sim's own device ops, called by the counting ones below. */
static struct sqd_device_ops standin_sim_ops;

static int standin_create_srq(void *device, struct ibv_pd *pd, struct ibv_srq_init_attr *attr, struct ibv_srq **srq)
{
    int rc = standin_sim_ops.create_srq(device, pd, attr, srq);
    if (rc == 0)
        standin.srqs_created++;
    return rc;
}

static int standin_destroy_srq(void *device, struct ibv_srq *srq)
{
    int rc = standin_sim_ops.destroy_srq(device, srq);
    if (rc == 0)
        standin.srqs_destroyed++;
    return rc;
}

/* Counts the SRQs made and destroyed on `sim` through the device seam, whichever copy of sqdisc asks. Returns 0,
 * or what failed (negative). */
static inline int standin_count_srqs(struct sqd_sim *sim)
{
    struct ibv_context *ctx = sqd_sim_context(sim);
    struct sqd_device_ops ops;
    int rc;
    memset(&ops, 0, sizeof ops);
    ops.size = sizeof ops;
    rc = sqd_device_lookup(ctx, &ops);
    if (rc != 1)
        return rc < 0 ? rc : -ENOENT;
    standin_sim_ops = ops;
    ops.create_srq = standin_create_srq;
    ops.destroy_srq = standin_destroy_srq;
    rc = sqd_device_unregister(ctx);
    return rc ? rc : sqd_device_register(ctx, &ops);
}

int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
    if (standin.resize_fail)
        return standin.resize_fail;
    standin.resizes++;
    return -sqd_sim_resize_cq(cq, cqe);
}

#endif
