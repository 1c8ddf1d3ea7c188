/* The sim's preload library counts, per QP, the completions the program polled with IBV_WC_WR_FLUSH_ERR and
 * with another error status, and with SQDISC_SIM_QP_STATS=1 writes them to standard error when the QP is
 * destroyed (scripts/spdk-e2e.sh compares SPDK's own provider with libsqdisc_spdk by them). A QP with 7
 * receives moved to the error state: 7 flushes polled, the line says 7; a QP with none says 0. Run under
 * `sqdisc-sim run` (scripts/simdev-tests.sh). */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, "qp_stats: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
    struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                   .cap = { .max_send_wr = 4, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 } };
    struct ibv_qp *qp = ibv_create_qp(pd, &qa);
    if (!qp)
        FAIL("ibv_create_qp failed");
    struct ibv_qp_attr init = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qp_access_flags = IBV_ACCESS_LOCAL_WRITE };
    if (ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        FAIL("ibv_modify_qp(INIT) failed");
    return qp;
}

/* Destroys `qp` with standard error sent to a file, and returns what was written there. */
static char *destroy_and_capture(struct ibv_qp *qp, char *out, size_t len)
{
    char path[] = "/tmp/qp_stats.XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        FAIL("mkstemp failed");
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    int rc = ibv_destroy_qp(qp);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    if (rc)
        FAIL("ibv_destroy_qp: %d", rc);
    ssize_t n = pread(fd, out, len - 1, 0);
    out[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    return out;
}

int main(void)
{
    setenv("SQDISC_SIM_QP_STATS", "1", 1);
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n < 1)
        FAIL("no device (is the sim's preload library loaded?)");
    struct ibv_context *ctx = ibv_open_device(list[0]);
    struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
    static char buf[4096];
    struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE) : NULL;
    struct ibv_cq *cq = mr ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
    if (!cq)
        FAIL("context, PD, MR or CQ failed");

    enum { RECVS = 7 };
    struct ibv_qp *qp = make_qp(pd, cq), *quiet = make_qp(pd, cq);
    for (int i = 0; i < RECVS; i++) {
        struct ibv_sge sge = { .addr = (uintptr_t)buf + 64u * (unsigned)i, .length = 64, .lkey = mr->lkey };
        struct ibv_recv_wr wr = { .wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1 }, *bad = NULL;
        if (ibv_post_recv(qp, &wr, &bad))
            FAIL("ibv_post_recv failed");
    }
    struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
    if (ibv_modify_qp(qp, &err, IBV_QP_STATE))
        FAIL("ibv_modify_qp(ERR) failed");
    int got = 0;
    for (int polls = 0; got < RECVS && polls < 100000; polls++) {
        struct ibv_wc wc[8];
        int k = ibv_poll_cq(cq, 8, wc);
        if (k < 0)
            FAIL("ibv_poll_cq: %d", k);
        for (int i = 0; i < k; i++)
            if (wc[i].status != IBV_WC_WR_FLUSH_ERR)
                FAIL("a completion with status %d", wc[i].status);
        got += k;
    }
    if (got != RECVS)
        FAIL("%d flushes polled, want %d", got, RECVS);

    char line[512], want[128];
    snprintf(want, sizeof want, "sqdisc-sim qp stats: qp=%#x flush_cqes=%d error_cqes=0\n", qp->qp_num, RECVS);
    uint32_t quiet_num = quiet->qp_num;
    if (strcmp(destroy_and_capture(qp, line, sizeof line), want) != 0)
        FAIL("the failed QP's line is \"%s\", want \"%s\"", line, want);
    snprintf(want, sizeof want, "sqdisc-sim qp stats: qp=%#x flush_cqes=0 error_cqes=0\n", quiet_num);
    if (strcmp(destroy_and_capture(quiet, line, sizeof line), want) != 0)
        FAIL("the quiet QP's line is \"%s\", want \"%s\"", line, want);

    ibv_destroy_cq(cq);
    ibv_dereg_mr(mr);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    printf("qp_stats: ok\n");
    return 0;
}
