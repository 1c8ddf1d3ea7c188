/* The README example: 64 SENDs through a managed 16-slot send queue, on the scripted test device.
 * Build: cc -std=c11 example.c $(pkg-config --cflags --libs sqdisc)
 * (This copy also checks its own results and exits non-zero if they are wrong: the README example is tested.) */
#include <sqdisc.h>
#include <sqdisc_scripted.h>
#include <infiniband/verbs.h>

#include <limits.h>
#include <stdio.h>

#define NWR 64

struct app {                 /* the ULP's state, handed to the release callback */
    unsigned released, in_order, implied;
};

/* Called once per WR, in post order, when the HCA is provably done with it: its buffers may be reused now. */
static void on_release(void *ctx, const struct sqd_completion *c)
{
    struct app *app = ctx;
    if (c->wr_id == app->released && c->status == IBV_WC_SUCCESS)
        app->in_order++;
    if (c->flags & SQD_COMPLETION_IMPLIED) /* retired by a later CQE, not one of its own */
        app->implied++;
    app->released++;
}

static int failed;
static void check(int ok, const char *name)
{
    printf("%s README_example: %s\n", ok ? "PASS" : "FAIL", name);
    failed |= !ok;
}

int main(void)
{
    /* A device with a 64-entry CQ and an RC QP; read back the caps it granted. */
    struct sqd_scripted *dev = NULL;
    struct ibv_cq *cq = NULL;
    struct ibv_qp *qp = NULL;
    struct sqd_scripted_qp_caps caps = {.max_send_wr = 16, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1};
    if (sqd_scripted_new(&dev) || sqd_scripted_create_cq(dev, 64, &cq) ||
        sqd_scripted_create_qp(dev, cq, cq, &caps, &qp) || sqd_scripted_qp_caps(qp, &caps)) {
        fprintf(stderr, "device: %s\n", sqd_last_error());
        return 1;
    }

    /* Put the CQ and the QP's send queue under management. */
    struct app app = {0};
    struct sqd_cq *scq = NULL;
    struct sqd_queue *q = NULL;
    struct sqd_queue_attr attr = {.sq_depth = caps.max_send_wr, .max_send_sge = caps.max_send_sge,
                                  .max_inline_data = caps.max_inline_data, .backlog_depth = NWR,
                                  .release = on_release, .release_ctx = &app};
    if (sqd_cq_new(cq, &scq) || sqd_queue_new(scq, NULL, qp, &attr, &q)) {
        fprintf(stderr, "sqdisc: %s\n", sqd_last_error());
        return 1;
    }

    /* One chain of 64 SENDs; the ULP asks for a completion on the last one only. */
    static char buf[NWR][64];
    struct ibv_sge sge[NWR];
    struct ibv_send_wr wr[NWR], *bad = NULL;
    for (int i = 0; i < NWR; i++) {
        sge[i] = (struct ibv_sge){.addr = (uintptr_t)buf[i], .length = sizeof buf[i], .lkey = 1};
        wr[i] = (struct ibv_send_wr){.wr_id = i, .next = i + 1 < NWR ? &wr[i + 1] : NULL, .sg_list = &sge[i],
                                     .num_sge = 1, .opcode = IBV_WR_SEND,
                                     .send_flags = i == NWR - 1 ? IBV_SEND_SIGNALED : 0};
    }
    if (sqd_post_send(q, wr, &bad)) {
        fprintf(stderr, "post: %s\n", sqd_last_error());
        return 1;
    }
    struct sqd_queue_stats posted;
    sqd_queue_stats(q, &posted);

    /* The "HCA" executes what it holds; polling releases WRs and feeds it the backlog as slots free up. */
    struct ibv_wc wc[8];
    unsigned shown = 0, last_shown = 0;
    for (int round = 0; app.released < NWR && round < 100; round++) {
        sqd_scripted_complete(qp, INT_MAX);
        int n = sqd_cq_poll(scq, 8, wc);
        for (int k = 0; k < n; k++, shown++) {
            printf("completion shown: wr_id %llu, %s\n", (unsigned long long)wc[k].wr_id,
                   ibv_wc_status_str(wc[k].status));
            last_shown = (unsigned)wc[k].wr_id;
        }
    }

    struct sqd_queue_stats st;
    struct sqd_scripted_qp_stats dq;
    sqd_queue_stats(q, &st);
    sqd_scripted_qp_stats(qp, &dq);
    printf("WRs posted: %llu (%llu parked in the backlog), provider held at most %llu of %u slots\n",
           (unsigned long long)st.accepted, (unsigned long long)st.parked,
           (unsigned long long)dq.max_outstanding, caps.max_send_wr);
    printf("completions shown: %u; releases: %u (%u in order, %u implied)\n", shown, app.released,
           app.in_order, app.implied);
    printf("CQEs: %llu for %llu WRs (%.3f per WR), markers: %llu\n", (unsigned long long)st.send_cqes,
           (unsigned long long)st.accepted, (double)st.send_cqes / (double)st.accepted,
           (unsigned long long)st.markers);

    check(posted.accepted == NWR && posted.in_provider == caps.max_send_wr, "all 64 accepted, 16 posted at once");
    check(posted.backlog == NWR - caps.max_send_wr && st.parked == NWR - caps.max_send_wr, "48 parked");
    check(dq.max_outstanding <= caps.max_send_wr && sqd_scripted_violation_count(dev) == 0, "credits kept");
    check(shown == 1 && last_shown == NWR - 1, "only the ULP-signaled completion is shown");
    check(app.released == NWR && app.in_order == NWR && st.released == NWR, "all released once, in order");
    check(app.implied == NWR - st.send_cqes && st.send_cqes * 4 <= NWR, "about one CQE per 4 WRs");

    check(sqd_queue_free(q) == 0 && sqd_cq_free(scq) == 0, "queue and CQ freed");
    sqd_scripted_free(dev);
    return failed;
}
