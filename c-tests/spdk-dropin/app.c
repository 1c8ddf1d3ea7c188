/* A program linked the way SPDK's applications link the provider (by its soname, or its archive inside
 * --whole-archive); prints which provider answered: "sqdisc" or "spdk". */
#include <sqdisc_spdk.h>

#include <stdarg.h>
#include <stdio.h>

/* SPDK's functions the sqdisc provider calls, as a program linked with SPDK's libraries would have them. */
int spdk_rdma_cm_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
void spdk_rdma_cm_destroy_qp(struct rdma_cm_id *id);
int spdk_rdma_cm_accept(struct rdma_cm_id *id, struct rdma_conn_param *param);
int spdk_rdma_cm_disconnect(struct rdma_cm_id *id);
struct spdk_memory_domain *spdk_rdma_utils_get_memory_domain(struct ibv_pd *pd);
int spdk_rdma_utils_put_memory_domain(struct spdk_memory_domain *domain);
void spdk_log(int level, const char *file, const int line, const char *func, const char *format, ...);

int spdk_rdma_cm_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    (void)id;
    (void)pd;
    (void)attr;
    return -1;
}
void spdk_rdma_cm_destroy_qp(struct rdma_cm_id *id) { (void)id; }
int spdk_rdma_cm_accept(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
    (void)id;
    (void)param;
    return 0;
}
int spdk_rdma_cm_disconnect(struct rdma_cm_id *id) { (void)id; return 0; }
struct spdk_memory_domain *spdk_rdma_utils_get_memory_domain(struct ibv_pd *pd) { (void)pd; return NULL; }
int spdk_rdma_utils_put_memory_domain(struct spdk_memory_domain *domain) { (void)domain; return 0; }

static int logged;
void spdk_log(int level, const char *file, const int line, const char *func, const char *format, ...)
{
    (void)level;
    (void)file;
    (void)line;
    (void)func;
    (void)format;
    logged++;
}

int main(void)
{
    /* SPDK's verbs-like providers differ here: the stand-in says true, sqdisc's says false; and sqdisc's
     * qp_create refuses a NULL attr through spdk_log. */
    int sqdisc = !spdk_rdma_provider_accel_sequence_supported();
    struct spdk_rdma_provider_qp *q = spdk_rdma_provider_qp_create(NULL, NULL);
    if (sqdisc && q == NULL && logged == 1) {
        printf("sqdisc\n");
        return 0;
    }
    if (!sqdisc && q != NULL && logged == 0) {
        printf("spdk\n");
        return 0;
    }
    printf("mixed: accel %d, qp %p, logged %d\n", !sqdisc, (void *)q, logged);
    return 1;
}
