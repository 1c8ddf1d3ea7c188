/* One side of an RC transfer between two processes on the device daemon, for the killed-peer test.
 *
 *   peer victim DIR     receives SENDs for ever, reposting its receives; writes DIR/victim.busy once 50 have
 *                       arrived (the test then kills it with SIGKILL)
 *   peer survivor DIR   keeps 32 signaled 4 KiB SENDs in flight until one fails. It must fail as towards a
 *                       real peer that died: IBV_WC_RETRY_EXC_ERR for the oldest WR, IBV_WC_WR_FLUSH_ERR for
 *                       every later one, and a WR posted afterwards flushed too. Then it writes
 *                       DIR/survivor.checked, waits for DIR/survivor.release (the test looks at the daemon's
 *                       status meanwhile) and exits 0.
 */
#include "common.h"

enum { MSG = 4096, DEPTH = 32, RECVS = 128 };

static void post_recv(struct ibv_qp *qp, struct ibv_mr *mr, char *buf, uint64_t id)
{
    struct ibv_sge sge = { (uintptr_t)(buf + (id % RECVS) * MSG), MSG, mr->lkey };
    struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
    if (ibv_post_recv(qp, &wr, &bad))
        die("ibv_post_recv: %s", strerror(errno));
}

static int post_send(struct ibv_qp *qp, struct ibv_mr *mr, char *buf, uint64_t id)
{
    struct ibv_sge sge = { (uintptr_t)(buf + (id % DEPTH) * MSG), MSG, mr->lkey };
    struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                              .send_flags = IBV_SEND_SIGNALED }, *bad;
    return ibv_post_send(qp, &wr, &bad);
}

int main(int argc, char **argv)
{
    prog_name = "peer";
    if (argc != 3 || (strcmp(argv[1], "victim") && strcmp(argv[1], "survivor")))
        die("usage: peer victim|survivor DIR");
    int victim = strcmp(argv[1], "victim") == 0;
    const char *dir = argv[2];
    setvbuf(stdout, NULL, _IOLBF, 0);

    struct ibv_context *ctx = open_sim_device();
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, 2 * RECVS, NULL, NULL, 0);
    size_t len = (size_t)RECVS * MSG;
    char *buf = calloc(1, len);
    if (!pd || !cq || !buf)
        die("setup: %s", strerror(errno));
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
    if (!mr)
        die("ibv_reg_mr: %s", strerror(errno));
    struct ibv_qp *qp = make_rc_qp(pd, cq, DEPTH, RECVS);
    if (victim)
        for (uint64_t i = 0; i < RECVS; i++)
            post_recv(qp, mr, buf, i);
    exchange_and_connect(qp, dir, argv[1], victim ? "survivor" : "victim");
    printf("%s: pid %d qp %#x connected\n", argv[1], (int)getpid(), qp->qp_num);

    struct ibv_wc wc[16];
    if (victim) {
        uint64_t got = 0, next = RECVS;
        char path[4096];
        snprintf(path, sizeof path, "%s/victim.busy", dir);
        for (;;) {
            int n = ibv_poll_cq(cq, 16, wc);
            if (n < 0)
                die("ibv_poll_cq: %d", n);
            for (int i = 0; i < n; i++) {
                if (wc[i].status != IBV_WC_SUCCESS)
                    die("receive failed: %s", ibv_wc_status_str(wc[i].status));
                post_recv(qp, mr, buf, next++);
                if (++got == 50)
                    write_file(path, "%d\n", (int)getpid());
            }
        }
    }

    uint64_t next = 0, done_ok = 0, flushed = 0, outstanding = 0;
    int failed = 0;
    double end = now_s() + 30;
    while (now_s() < end) {
        while (!failed && outstanding < DEPTH) {
            if (post_send(qp, mr, buf, next))
                die("ibv_post_send: %s", strerror(errno));
            next++;
            outstanding++;
        }
        int n = ibv_poll_cq(cq, 16, wc);
        if (n < 0)
            die("ibv_poll_cq: %d", n);
        for (int i = 0; i < n; i++) {
            outstanding--;
            if (!failed) {
                if (wc[i].status == IBV_WC_SUCCESS) {
                    done_ok++;
                    continue;
                }
                if (wc[i].status != IBV_WC_RETRY_EXC_ERR)
                    die("the first failed WR (wr_id %lu) has status %s, not RETRY_EXC_ERR", (unsigned long)wc[i].wr_id,
                        ibv_wc_status_str(wc[i].status));
                if (wc[i].wr_id != done_ok)
                    die("RETRY_EXC_ERR for wr_id %lu, not the oldest outstanding WR %lu", (unsigned long)wc[i].wr_id,
                        (unsigned long)done_ok);
                printf("survivor: %lu SENDs completed, then RETRY_EXC_ERR for wr_id %lu\n", (unsigned long)done_ok,
                       (unsigned long)wc[i].wr_id);
                failed = 1;
                continue;
            }
            if (wc[i].status != IBV_WC_WR_FLUSH_ERR)
                die("wr_id %lu after the failure has status %s, not WR_FLUSH_ERR", (unsigned long)wc[i].wr_id,
                    ibv_wc_status_str(wc[i].status));
            flushed++;
        }
        if (failed && outstanding == 0)
            break;
    }
    if (!failed || outstanding != 0)
        die("no failure within 30 s (%lu SENDs completed, %lu outstanding)", (unsigned long)done_ok, (unsigned long)outstanding);
    printf("survivor: %lu later WRs flushed (WR_FLUSH_ERR)\n", (unsigned long)flushed);

    /* The QP is in the error state: a WR posted now is flushed too. */
    if (post_send(qp, mr, buf, next))
        die("ibv_post_send after the failure: %s (an RC QP in error flushes it)", strerror(errno));
    int n = 0;
    for (double e = now_s() + 5; n == 0 && now_s() < e;)
        n = ibv_poll_cq(cq, 1, wc);
    if (n != 1 || wc[0].status != IBV_WC_WR_FLUSH_ERR || wc[0].wr_id != next)
        die("a WR posted to the QP in error was not flushed (poll %d, status %s)", n, n == 1 ? ibv_wc_status_str(wc[0].status) : "-");
    printf("survivor: a WR posted afterwards flushed too\n");

    char path[4096];
    snprintf(path, sizeof path, "%s/survivor.checked", dir);
    write_file(path, "%d\n", (int)getpid());
    snprintf(path, sizeof path, "%s/survivor.release", dir);
    if (wait_file(path, 20, NULL))
        die("no %s within 20 s", path);
    ibv_destroy_qp(qp);
    ibv_dereg_mr(mr);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    free(buf);
    printf("survivor: PASS\n");
    return 0;
}
