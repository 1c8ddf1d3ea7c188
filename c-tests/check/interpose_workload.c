/* A verbs program that builds its CQs, QPs and MRs with libibverbs' functions (here c-tests/check/fake_verbs.c,
 * which makes them on the software HCA) and knows nothing of the checker. scripts/check-checker.sh runs it plain
 * and with LD_PRELOAD=libsqdisc_check.so alone: the checker must see its objects through the interposed
 * ibv_* functions and report an undersized CQ, an SQ overflow, an MR deregistered in use and an unsignaled
 * flush after ibv_modify_qp to the error state, while the program's output stays the same. */
#include <sqdisc_sim.h>
#include <infiniband/verbs.h>

#include <stdio.h>
#include <stdlib.h>

void fake_verbs_use(struct sqd_sim *sim);

static void must(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "interpose_workload: %s failed\n", what);
        exit(1);
    }
}

static void drain(struct ibv_cq *cq, int polls)
{
    struct ibv_wc wc[16];
    for (int i = 0; i < polls; i++) {
        int n = ibv_poll_cq(cq, 16, wc);
        for (int k = 0; k < n; k++)
            printf("wc qp %u wr_id %llu status %d\n", wc[k].qp_num, (unsigned long long)wc[k].wr_id, wc[k].status);
    }
}

int main(void)
{
    struct sqd_sim_config cfg;
    sqd_sim_config_default(&cfg);
    cfg.flags = SQD_SIM_STRICT;
    struct sqd_sim *sim;
    must(sqd_sim_new(&cfg, &sim) == 0, "sqd_sim_new");
    fake_verbs_use(sim);
    struct ibv_context *ctx = sqd_sim_context(sim);
    struct ibv_pd *pd = sqd_sim_pd(sim);
    static char buf[2][4096], rbuf[64 * 16];

    struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0); /* 4 + 4 send and 16 + 16 receive slots: too small */
    must(cq != NULL, "ibv_create_cq");
    struct ibv_qp_init_attr at = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 4, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp_init_attr bt = at;
    struct ibv_qp *a = ibv_create_qp(pd, &at), *b = ibv_create_qp(pd, &bt);
    must(a && b && sqd_sim_connect(a, b, NULL) == 0, "ibv_create_qp");
    struct ibv_mr *mr0 = ibv_reg_mr(pd, buf[0], sizeof buf[0], IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *mr1 = ibv_reg_mr(pd, buf[1], sizeof buf[1], IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *rmr = ibv_reg_mr(pd, rbuf, sizeof rbuf, IBV_ACCESS_LOCAL_WRITE);
    must(mr0 && mr1 && rmr, "ibv_reg_mr");
    for (int i = 0; i < 16; i++) {
        struct ibv_sge sge = {.addr = (uintptr_t)(rbuf + 64 * i), .length = 64, .lkey = rmr->lkey};
        struct ibv_recv_wr wr = {.wr_id = 100 + (uint64_t)i, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
        must(ibv_post_recv(b, &wr, &bad) == 0, "ibv_post_recv");
    }
    /* Five posts into four slots, the last two from mr1; mr1 deregistered with its WQEs in flight. */
    for (int i = 0; i < 5; i++) {
        struct ibv_sge sge = {.addr = (uintptr_t)buf[i < 3 ? 0 : 1], .length = 64, .lkey = (i < 3 ? mr0 : mr1)->lkey};
        struct ibv_send_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND},
                           *bad = NULL;
        printf("post %d -> %d\n", i, ibv_post_send(a, &wr, &bad));
    }
    printf("dereg -> %d\n", ibv_dereg_mr(mr1));
    struct ibv_qp_attr err = {.qp_state = IBV_QPS_ERR};
    printf("modify -> %d\n", ibv_modify_qp(a, &err, IBV_QP_STATE));
    drain(cq, 20);
    must(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0 && ibv_destroy_cq(cq) == 0, "destroy");
    must(ibv_dereg_mr(mr0) == 0 && ibv_dereg_mr(rmr) == 0, "ibv_dereg_mr");
    printf("sim violations: %d\n", sqd_sim_violation_count(sim));
    must(sqd_sim_free(sim) == 0, "sqd_sim_free");
    printf("done\n");
    return 0;
}
