/* A verbs program that knows nothing of the checker: linked only against libibverbs and the software HCA
 * (libsqdisc, where the sim lives), it breaks each rule once and prints every return code and completion.
 *
 * scripts/check-checker.sh runs it plain, then with LD_PRELOAD="libsqdisc_check.so sim_shim.so": the output
 * must be the same byte for byte (the checker changes nothing the program sees), and the report must name
 * every kind. With SQDISC_CHECK=abort it must abort at the first violation (the undersized CQ) with the
 * report. With WORKLOAD_WAIT set it waits for a signal at the end: SIGTERM must write the report. */
#define _POSIX_C_SOURCE 200809L
#include <sqdisc_sim.h>
#include <infiniband/verbs.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct sqd_sim *sim;

static void must(int rc, const char *what)
{
    if (rc) {
        fprintf(stderr, "preload_workload: %s failed: %d\n", what, rc);
        exit(1);
    }
}

static int send(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode op, unsigned flags, void *buf, uint32_t len,
                struct ibv_mr *mr, uint32_t inv_rkey)
{
    struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = len, .lkey = mr ? mr->lkey : 0};
    struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = mr ? &sge : NULL, .num_sge = mr ? 1 : 0, .opcode = op,
                             .send_flags = flags},
                       *bad = NULL;
    if (op == IBV_WR_LOCAL_INV)
        wr.invalidate_rkey = inv_rkey;
    int rc = ibv_post_send(qp, &wr, &bad);
    printf("post_send qp %u wr_id %llu -> %d\n", qp->qp_num, (unsigned long long)wr_id, rc);
    return rc;
}

/* Polls `polls` times, printing every completion. */
static void poll(struct ibv_cq *cq, int polls)
{
    struct ibv_wc wc[16];
    for (int i = 0; i < polls; i++) {
        int n = ibv_poll_cq(cq, 16, wc);
        for (int k = 0; k < n; k++)
            printf("wc qp %u wr_id %llu status %d\n", wc[k].qp_num, (unsigned long long)wc[k].wr_id, wc[k].status);
        if (n < 0)
            printf("poll -> %d\n", n);
    }
}

static void pair(struct ibv_cq *cq, int sq, struct ibv_qp **a, struct ibv_qp **b, struct ibv_mr *rmr, char *rbuf)
{
    struct ibv_qp_init_attr at = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = (uint32_t)sq, .max_recv_wr = 32, .max_send_sge = 1,
                                          .max_recv_sge = 1}};
    struct ibv_qp_init_attr bt = at;
    must(sqd_sim_create_qp(sim, &at, a), "create_qp");
    must(sqd_sim_create_qp(sim, &bt, b), "create_qp");
    must(sqd_sim_connect(*a, *b, NULL), "connect");
    for (int i = 0; i < 32; i++) {
        struct ibv_sge sge = {.addr = (uintptr_t)(rbuf + 64 * i), .length = 64, .lkey = rmr->lkey};
        struct ibv_recv_wr wr = {.wr_id = 1000 + (uint64_t)i, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
        must(ibv_post_recv(*b, &wr, &bad), "post_recv");
    }
}

int main(void)
{
    struct sqd_sim_config cfg;
    sqd_sim_config_default(&cfg);
    cfg.flags = SQD_SIM_STRICT;
    must(sqd_sim_new(&cfg, &sim), "sqd_sim_new");
    static char buf[8][4096], rbuf[2][64 * 32];
    struct ibv_mr *mr[8], *rmr[2];
    for (int i = 0; i < 8; i++)
        must(sqd_sim_reg_mr(sim, buf[i], sizeof buf[i], IBV_ACCESS_LOCAL_WRITE, &mr[i]), "reg_mr");
    for (int i = 0; i < 2; i++)
        must(sqd_sim_reg_mr(sim, rbuf[i], sizeof rbuf[i], IBV_ACCESS_LOCAL_WRITE, &rmr[i]), "reg_mr");

    /* A CQ of 256 for the well-sized pair; a CQ of 8 for a pair whose 8 + 8 send and 32 + 32 receive slots
     * could flush into it: undersized. */
    struct ibv_cq *big, *small;
    must(sqd_sim_create_cq(sim, 256, &big), "create_cq");
    must(sqd_sim_create_cq(sim, 8, &small), "create_cq");
    struct ibv_qp *a, *b, *c, *d;
    pair(big, 8, &a, &b, rmr[0], rbuf[0]);
    pair(small, 8, &c, &d, rmr[1], rbuf[1]);

    /* Rule 1 and 2: eight unsignaled SENDs fill the SQ (a run as long as the SQ); the ninth finds it full. */
    for (int i = 0; i < 9; i++)
        send(a, (uint64_t)i, IBV_WR_SEND, 0, buf[0], 64, mr[0], 0);
    poll(big, 50);

    /* Rule 3: a signaled SEND's source rewritten before its CQE. */
    send(c, 100, IBV_WR_SEND, IBV_SEND_SIGNALED, buf[1], 64, mr[1], 0);
    memset(buf[1], 0x5a, 64);
    poll(small, 50);

    /* Rule 4: a LocalInv of an MR a SEND before it uses, without the fence. */
    send(c, 102, IBV_WR_SEND, 0, buf[3], 64, mr[3], 0);
    send(c, 103, IBV_WR_LOCAL_INV, IBV_SEND_SIGNALED, NULL, 0, NULL, mr[3]->rkey);
    poll(small, 50);

    /* Rule 1: an unsignaled tail, then the program waits on its CQ. */
    send(c, 104, IBV_WR_SEND, 0, buf[4], 64, mr[4], 0);
    poll(small, 5);
    struct timespec ms30 = {0, 30 * 1000 * 1000};
    nanosleep(&ms30, NULL);
    poll(small, 5);

    /* Rule 3: an MR deregistered while a SEND that uses it is in flight. */
    send(c, 105, IBV_WR_SEND, IBV_SEND_SIGNALED, buf[2], 64, mr[2], 0);
    must(sqd_sim_dereg_mr(mr[2]), "dereg_mr");
    poll(small, 50);

    /* The QP fails with an unsignaled WQE unfinished: it flushes with a CQE the program never asked for. */
    send(c, 106, IBV_WR_SEND, 0, buf[5], 64, mr[5], 0);
    must(sqd_sim_set_error(c), "set_error");
    poll(small, 10);

    must(sqd_sim_destroy_qp(a), "destroy_qp");
    must(sqd_sim_destroy_qp(b), "destroy_qp");
    must(sqd_sim_destroy_qp(c), "destroy_qp");
    must(sqd_sim_destroy_qp(d), "destroy_qp");
    must(sqd_sim_destroy_cq(big), "destroy_cq");
    must(sqd_sim_destroy_cq(small), "destroy_cq");
    printf("sim violations: %d\n", sqd_sim_violation_count(sim));
    must(sqd_sim_free(sim), "sqd_sim_free");
    if (getenv("WORKLOAD_WAIT")) { /* the script ends it with SIGTERM, as a server is stopped */
        printf("waiting\n");
        fflush(stdout);
        for (;;)
            pause();
    }
    printf("done\n");
    return 0;
}
