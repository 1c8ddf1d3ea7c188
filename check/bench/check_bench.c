/* What the checker costs per WR: a hand-moderated raw-verbs poster (a signaled WR every 32nd, credits from
 * polled CQEs, chains of B WRs of one 64-byte SGE) on the null provider of the benchmarks
 * (benches/null_provider.c), with the checker attached or not. scripts/bench-check.sh counts the instructions
 * with callgrind and reports docs/check.md's table.
 *
 * usage: check_bench plain|check BATCH WRS SAMPLE_EVERY
 *   plain  the null provider's ops called directly (the checker not attached)
 *   check  sqd_check_attach on the device, its CQ, QP and MR tracked; SAMPLE_EVERY as SQDISC_CHECK_SAMPLE,
 *          the other settings as the environment gives them (the defaults: the idle-tail rule on)
 * Runs 1024 WRs of warm-up, then WRS WRs. */
#include "../../benches/null_provider.h"
#include <sqdisc_check.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEPTH 128
#define SIGNAL_EVERY 32
#define MAX_BATCH 64

static struct ibv_qp *qp;
static struct ibv_cq *cq;
static uint64_t posted, covered; /* WRs posted; WRs covered by a polled CQE */
static struct ibv_mr mr;
static char buf[64 * DEPTH];

static void poll_once(void)
{
    struct ibv_wc wc[16];
    int n = ibv_poll_cq(cq, 16, wc);
    for (int i = 0; i < n; i++)
        covered = wc[i].wr_id + 1;
}

static void run(uint64_t wrs, int batch)
{
    static struct ibv_send_wr wr[MAX_BATCH];
    static struct ibv_sge sge[MAX_BATCH];
    uint64_t end = posted + wrs;
    while (posted < end) {
        while (DEPTH - (posted - covered) < (uint64_t)batch)
            poll_once();
        for (int i = 0; i < batch; i++) {
            uint64_t seq = posted + (uint64_t)i;
            sge[i] = (struct ibv_sge){.addr = (uintptr_t)(buf + 64 * (seq % DEPTH)), .length = 64, .lkey = mr.lkey};
            wr[i] = (struct ibv_send_wr){.wr_id = seq, .sg_list = &sge[i], .num_sge = 1, .opcode = IBV_WR_SEND,
                                         .send_flags = seq % SIGNAL_EVERY == SIGNAL_EVERY - 1 ? IBV_SEND_SIGNALED : 0,
                                         .next = i + 1 < batch ? &wr[i + 1] : NULL};
        }
        struct ibv_send_wr *bad = NULL;
        if (ibv_post_send(qp, wr, &bad)) {
            fprintf(stderr, "check_bench: post_send refused\n");
            exit(1);
        }
        posted += (uint64_t)batch;
        poll_once();
    }
}

int main(int argc, char **argv)
{
    if (argc != 5 || (strcmp(argv[1], "plain") && strcmp(argv[1], "check"))) {
        fprintf(stderr, "usage: check_bench plain|check BATCH WRS SAMPLE_EVERY\n");
        return 2;
    }
    int batch = atoi(argv[2]);
    uint64_t wrs = strtoull(argv[3], NULL, 10);
    if (batch < 1 || batch > MAX_BATCH || SIGNAL_EVERY % batch || wrs % (uint64_t)SIGNAL_EVERY) {
        fprintf(stderr, "check_bench: BATCH must divide %d and WRS be a multiple of it\n", SIGNAL_EVERY);
        return 2;
    }
    struct null_device *dev = null_device_new();
    cq = null_create_cq(dev, 2 * DEPTH);
    struct ibv_qp_init_attr attr = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                    .cap = {.max_send_wr = DEPTH, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
    qp = null_create_qp(dev, &attr);
    if (!dev || !cq || !qp)
        return 1;
    mr = (struct ibv_mr){.context = qp->context, .addr = buf, .length = sizeof buf, .lkey = 0x1234, .rkey = 0x1234};
    if (!strcmp(argv[1], "check")) {
        struct sqd_check_config c;
        sqd_check_get_config(&c);
        c.mode = SQD_CHECK_MODE_LOG;
        c.sample_every = (uint32_t)atoi(argv[4]);
        if (sqd_check_set_config(&c) || sqd_check_attach(qp->context) || sqd_check_track_cq(cq) ||
            sqd_check_track_qp(qp, &attr) || sqd_check_track_mr(&mr))
            return 1;
    }
    run(1024, batch);
    run(wrs, batch);
    while (covered < posted)
        poll_once();
    if (!strcmp(argv[1], "check")) {
        if (sqd_check_count(0) != 0) {
            sqd_check_write_report(2);
            return 1;
        }
        sqd_check_untrack_mr(&mr);
        sqd_check_untrack_qp(qp);
        sqd_check_untrack_cq(cq);
    }
    null_destroy_qp(qp);
    null_destroy_cq(cq);
    null_device_free(dev);
    return 0;
}
