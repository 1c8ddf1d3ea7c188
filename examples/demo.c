/* sqdisc demo: 64 SENDs through a managed 16-slot send queue, on the scripted test device.
 *
 * The ULP hands one chain of 64 WRs to sqd_post_send. The queue posts what the SQ has credits for, parks the
 * rest in its backlog, signals every few WRs so slots come back, and releases every WR, in order, once a polled
 * CQE proves the HCA is done with it. The ULP sees exactly the completion it asked for.
 *
 * Build: make demo   (or: cc -std=c11 demo.c $(pkg-config --cflags --libs sqdisc)) */
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

int main(void)
{
    printf("sqdisc %s demo: a managed send queue on the scripted test device\n\n", sqd_version());

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
    struct sqd_queue_stats st;
    struct sqd_cq_stats cs;
    sqd_queue_stats(q, &st);
    sqd_cq_stats(scq, &cs);
    printf("An RC QP with a %u-slot send queue, on a CQ of %llu entries (the queue reserves %llu of them).\n",
           caps.max_send_wr, (unsigned long long)cs.capacity, (unsigned long long)cs.reserved);
    printf("The queue signals at least every %u WRs, and parks up to %u WRs when the SQ is full.\n\n",
           st.signal_interval, attr.backlog_depth);

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
    sqd_queue_stats(q, &st);
    printf("sqd_post_send(64 SENDs, only the last one IBV_SEND_SIGNALED):\n");
    printf("  %u went to the provider at once, %u wait in the backlog.\n\n", st.in_provider, st.backlog);

    /* The "HCA" executes what it holds; polling releases WRs and feeds it the backlog as slots free up. */
    struct ibv_wc wc[8];
    unsigned shown = 0;
    for (int round = 1; app.released < NWR && round <= 100; round++) {
        int executed = sqd_scripted_complete(qp, INT_MAX);
        unsigned before = app.released;
        int n = sqd_cq_poll(scq, 8, wc);
        if (n < 0) {
            fprintf(stderr, "poll: %s\n", sqd_last_error());
            return 1;
        }
        sqd_queue_stats(q, &st);
        printf("round %d: the HCA executed %d WQEs; sqd_cq_poll ", round, executed);
        if (app.released > before)
            printf("released WRs %u..%u", before, app.released - 1);
        else
            printf("released nothing");
        printf(" and showed %d completion(s);\n         now %u in the provider, %u in the backlog\n", n,
               st.in_provider, st.backlog);
        for (int k = 0; k < n; k++, shown++)
            printf("         completion for the ULP: wr_id %llu, %s\n", (unsigned long long)wc[k].wr_id,
                   ibv_wc_status_str(wc[k].status));
    }

    struct sqd_scripted_qp_stats dq;
    sqd_queue_stats(q, &st);
    sqd_scripted_qp_stats(qp, &dq);
    sqd_cq_stats(scq, &cs);
    printf("\nWhat the managed queue did:\n");
    printf("  posted %llu WRs into a %u-slot SQ: %llu parked in the backlog, the provider never held more than %llu\n",
           (unsigned long long)st.accepted, caps.max_send_wr, (unsigned long long)st.parked,
           (unsigned long long)dq.max_outstanding);
    printf("  %llu CQEs for %llu WRs (%.2f per WR), %llu of them hidden from the ULP; %llu markers\n",
           (unsigned long long)st.send_cqes, (unsigned long long)st.accepted,
           (double)st.send_cqes / (double)st.accepted, (unsigned long long)cs.hidden,
           (unsigned long long)st.markers);
    printf("  the ULP saw %u completion(s): exactly the ones it asked for\n", shown);
    printf("  all %u released %s (%u implied by a later CQE), device rule violations: %d\n", app.released,
           app.in_order == NWR ? "in order" : "OUT OF ORDER", app.implied, sqd_scripted_violation_count(dev));

    int ok = app.released == NWR && app.in_order == NWR && dq.max_outstanding <= caps.max_send_wr &&
             sqd_scripted_violation_count(dev) == 0;
    if (sqd_queue_free(q) || sqd_cq_free(scq)) {
        fprintf(stderr, "free: %s\n", sqd_last_error());
        ok = 0;
    }
    sqd_scripted_free(dev);
    return ok ? 0 : 1;
}
