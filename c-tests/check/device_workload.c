/* A verbs program that knows nothing of the checker nor of the sim: linked only against libibverbs, it opens
 * the sim's device (sqd_sim0, under `sqdisc-sim run`), breaks each of the checker's rules once and prints every
 * return code and completion.
 *
 * scripts/check-checker.sh runs it under `sqdisc-sim run`, plain and with libsqdisc_check.so preloaded (no
 * adapter of any kind): the output must be the same byte for byte and the report must name every kind.
 *
 * The device runs on its own clock, so each step waits for the completions it expects (with a time limit)
 * instead of polling a fixed number of times, and a completion whose status depends on timing (the SEND whose
 * MR is deregistered while it is in flight) is printed without its status. */
#include "../sim_device/common.h"

#include <stdint.h>

static struct ibv_pd *pd;

static void must(int rc, const char *what)
{
    if (rc)
        die("%s failed: %d (%s)", what, rc, strerror(rc > 0 ? rc : errno));
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

/* Polls until `want` completions came (or 5 s passed), printing each; `quiet_status` leaves out the status of
 * that wr_id. Then polls for `linger_ms` more, printing whatever else comes. */
static void reap(struct ibv_cq *cq, int want, uint64_t quiet_status, int linger_ms)
{
    struct ibv_wc wc[16];
    int got = 0;
    double deadline = now_s() + 5.0, linger_end = 0;
    for (;;) {
        int n = ibv_poll_cq(cq, 16, wc);
        if (n < 0)
            die("ibv_poll_cq: %d", n);
        for (int k = 0; k < n; k++) {
            if (wc[k].wr_id == quiet_status)
                printf("wc qp %u wr_id %llu\n", wc[k].qp_num, (unsigned long long)wc[k].wr_id);
            else
                printf("wc qp %u wr_id %llu status %d\n", wc[k].qp_num, (unsigned long long)wc[k].wr_id,
                       wc[k].status);
        }
        got += n;
        double now = now_s();
        if (got >= want && linger_end == 0)
            linger_end = now + linger_ms / 1000.0;
        if (linger_end != 0 && now >= linger_end)
            return;
        if (now > deadline) {
            printf("timed out: %d of %d completions\n", got, want);
            return;
        }
    }
}

static void to_state(struct ibv_qp *qp, enum ibv_qp_state state, uint32_t dest_qpn)
{
    struct ibv_qp_attr a = {.qp_state = state};
    int mask = IBV_QP_STATE;
    switch (state) {
    case IBV_QPS_INIT:
        a.port_num = 1;
        a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        break;
    case IBV_QPS_RTR:
        a.path_mtu = IBV_MTU_1024;
        a.dest_qp_num = dest_qpn;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 1;
        a.ah_attr.dlid = 1;
        a.ah_attr.port_num = 1;
        mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                IBV_QP_MIN_RNR_TIMER;
        break;
    case IBV_QPS_RTS:
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.max_rd_atomic = 1;
        mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
        break;
    default:
        break;
    }
    must(ibv_modify_qp(qp, &a, mask), "ibv_modify_qp");
}

/* Two RC QPs on `cq`, connected to each other; `b` gets 32 receives. */
static void pair(struct ibv_cq *cq, int sq, struct ibv_qp **a, struct ibv_qp **b, struct ibv_mr *rmr, char *rbuf)
{
    struct ibv_qp_init_attr at = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = (uint32_t)sq, .max_recv_wr = 32, .max_send_sge = 1,
                                          .max_recv_sge = 1}};
    struct ibv_qp_init_attr bt = at;
    *a = ibv_create_qp(pd, &at);
    *b = ibv_create_qp(pd, &bt);
    if (!*a || !*b)
        die("ibv_create_qp: %s", strerror(errno));
    for (int i = 0; i < 32; i++) {
        struct ibv_sge sge = {.addr = (uintptr_t)(rbuf + 64 * i), .length = 64, .lkey = rmr->lkey};
        struct ibv_recv_wr wr = {.wr_id = 1000 + (uint64_t)i, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
        must(ibv_post_recv(*b, &wr, &bad), "ibv_post_recv");
    }
    to_state(*a, IBV_QPS_INIT, 0);
    to_state(*b, IBV_QPS_INIT, 0);
    to_state(*a, IBV_QPS_RTR, (*b)->qp_num);
    to_state(*b, IBV_QPS_RTR, (*a)->qp_num);
    to_state(*a, IBV_QPS_RTS, 0);
    to_state(*b, IBV_QPS_RTS, 0);
}

int main(void)
{
    prog_name = "device_workload";
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct ibv_context *ctx = open_sim_device();
    pd = ibv_alloc_pd(ctx);
    if (!pd)
        die("ibv_alloc_pd: %s", strerror(errno));
    static char buf[8][4096], rbuf[2][64 * 32];
    struct ibv_mr *mr[8], *rmr[2];
    for (int i = 0; i < 8; i++)
        if (!(mr[i] = ibv_reg_mr(pd, buf[i], sizeof buf[i], IBV_ACCESS_LOCAL_WRITE)))
            die("ibv_reg_mr: %s", strerror(errno));
    for (int i = 0; i < 2; i++)
        if (!(rmr[i] = ibv_reg_mr(pd, rbuf[i], sizeof rbuf[i], IBV_ACCESS_LOCAL_WRITE)))
            die("ibv_reg_mr: %s", strerror(errno));

    /* A CQ of 256 for the well-sized pair; a CQ of 8 for a pair whose 8 + 8 send and 32 + 32 receive slots
     * could flush into it: undersized. */
    struct ibv_cq *big = ibv_create_cq(ctx, 256, NULL, NULL, 0), *small = ibv_create_cq(ctx, 8, NULL, NULL, 0);
    if (!big || !small)
        die("ibv_create_cq: %s", strerror(errno));
    struct ibv_qp *a, *b, *c, *d;
    pair(big, 8, &a, &b, rmr[0], rbuf[0]);
    pair(small, 8, &c, &d, rmr[1], rbuf[1]);

    /* Rules 1 and 2: eight unsignaled SENDs fill the SQ (a run as long as the SQ); the ninth finds it full. Their
     * receives complete on b. */
    for (int i = 0; i < 9; i++)
        send(a, (uint64_t)i, IBV_WR_SEND, 0, buf[0], 64, mr[0], 0);
    reap(big, 8, UINT64_MAX, 20);

    /* Rule 3: a signaled SEND's source rewritten before its CQE. */
    send(c, 100, IBV_WR_SEND, IBV_SEND_SIGNALED, buf[1], 64, mr[1], 0);
    memset(buf[1], 0x5a, 64);
    reap(small, 2, UINT64_MAX, 20);

    /* Rule 4: a LocalInv of an MR a SEND before it uses, without the fence. */
    send(c, 102, IBV_WR_SEND, 0, buf[3], 64, mr[3], 0);
    send(c, 103, IBV_WR_LOCAL_INV, IBV_SEND_SIGNALED, NULL, 0, NULL, mr[3]->rkey);
    reap(small, 2, UINT64_MAX, 20);

    /* Rule 1: an unsignaled tail, then the program waits on its CQ (its receive completes on d). */
    send(c, 104, IBV_WR_SEND, 0, buf[4], 64, mr[4], 0);
    reap(small, 1, UINT64_MAX, 30);

    /* Rule 3: an MR deregistered while a SEND that uses it is in flight (whether the device had read it by then
     * is a matter of timing, so that completion's status is not printed, nor d's receive, if any). */
    send(c, 105, IBV_WR_SEND, IBV_SEND_SIGNALED, buf[2], 64, mr[2], 0);
    must(ibv_dereg_mr(mr[2]), "ibv_dereg_mr");
    {
        struct ibv_wc wc[16];
        int got = 0;
        double deadline = now_s() + 5.0;
        while (now_s() < deadline) {
            int n = ibv_poll_cq(small, 16, wc);
            for (int k = 0; k < n; k++)
                if (wc[k].wr_id == 105) {
                    printf("wc qp %u wr_id 105\n", wc[k].qp_num);
                    got = 1;
                }
            if (got)
                break;
        }
        if (!got)
            printf("timed out: no completion of wr_id 105\n");
    }

    /* An unsignaled WQE on a failed QP flushes with a CQE the program never asked for. (Posted after the QP
     * failed: posted before, it might complete, unsignaled, before the failure, as on any HCA.) */
    struct ibv_qp_attr err = {.qp_state = IBV_QPS_ERR};
    must(ibv_modify_qp(c, &err, IBV_QP_STATE), "ibv_modify_qp(ERR)");
    send(c, 106, IBV_WR_SEND, 0, buf[5], 64, mr[5], 0);
    {
        struct ibv_wc wc[16];
        int got = 0;
        double deadline = now_s() + 5.0;
        while (!got && now_s() < deadline) {
            int n = ibv_poll_cq(small, 16, wc);
            for (int k = 0; k < n; k++)
                if (wc[k].wr_id == 106) {
                    printf("wc qp %u wr_id 106 status %d\n", wc[k].qp_num, wc[k].status);
                    got = 1;
                }
        }
        if (!got)
            printf("timed out: no completion of wr_id 106\n");
    }

    must(ibv_destroy_qp(a), "ibv_destroy_qp");
    must(ibv_destroy_qp(b), "ibv_destroy_qp");
    must(ibv_destroy_qp(c), "ibv_destroy_qp");
    must(ibv_destroy_qp(d), "ibv_destroy_qp");
    must(ibv_destroy_cq(big), "ibv_destroy_cq");
    must(ibv_destroy_cq(small), "ibv_destroy_cq");
    for (int i = 0; i < 8; i++)
        if (i != 2)
            must(ibv_dereg_mr(mr[i]), "ibv_dereg_mr");
    for (int i = 0; i < 2; i++)
        must(ibv_dereg_mr(rmr[i]), "ibv_dereg_mr");
    must(ibv_dealloc_pd(pd), "ibv_dealloc_pd");
    must(ibv_close_device(ctx), "ibv_close_device");
    printf("done\n");
    return 0;
}
