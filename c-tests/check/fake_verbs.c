/* Test stand-in for libibverbs' control path, so that the checker's interposed ibv_* functions can be run here,
 * where there is no RDMA device: ibv_create_cq, ibv_create_qp, ibv_modify_qp, ibv_reg_mr, ibv_dereg_mr,
 * ibv_destroy_qp and ibv_destroy_cq make and free objects on a software HCA (the sim) given with
 * fake_verbs_use. A program linked against this library ahead of libibverbs calls these the way it would call
 * libibverbs'; preloaded, libsqdisc_check's definitions come first and forward here through
 * dlsym(RTLD_NEXT), as they forward to libibverbs on a real system. */
#include <sqdisc_sim.h>
#include <infiniband/verbs.h>

#include <errno.h>

static struct sqd_sim *the_sim;

void fake_verbs_use(struct sqd_sim *sim);
void fake_verbs_use(struct sqd_sim *sim)
{
    the_sim = sim;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context, struct ibv_comp_channel *channel,
                             int comp_vector)
{
    struct ibv_cq *cq = NULL;
    if (ctx != sqd_sim_context(the_sim) ||
        sqd_sim_create_cq_ex(the_sim, cqe, channel, cq_context, comp_vector, &cq))
        return NULL;
    return cq;
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
    return -sqd_sim_destroy_cq(cq);
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    struct ibv_qp *qp = NULL;
    if (pd != sqd_sim_pd(the_sim) || sqd_sim_create_qp(the_sim, attr, &qp))
        return NULL;
    return qp;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
    if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_ERR)
        return -sqd_sim_set_error(qp);
    return EINVAL; /* the sim connects with sqd_sim_connect */
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
    return -sqd_sim_destroy_qp(qp);
}

#undef ibv_reg_mr
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    struct ibv_mr *mr = NULL;
    if (pd != sqd_sim_pd(the_sim) || sqd_sim_reg_mr(the_sim, addr, len, access, &mr))
        return NULL;
    return mr;
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
    return -sqd_sim_dereg_mr(mr);
}
