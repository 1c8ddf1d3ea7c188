/* The README example: 64 RDMA WRITEs through a managed 16-slot send queue, on the software HCA.
 * Build: cc -std=c11 example.c $(pkg-config --cflags --libs sqdisc sqdisc_sim)
 * (This copy also checks its own results and exits non-zero if they are wrong: the README example is tested.) */
#include <sqdisc.h>
#include <sqdisc_sim.h>
#include <infiniband/verbs.h>

#include <stdio.h>
#include <string.h>

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
    /* Two connected RC QPs on a software HCA, and memory the peer lets us write; read back the granted caps. */
    struct sqd_sim_config cfg;
    struct sqd_sim *sim = NULL;
    struct ibv_cq *cq = NULL, *peer_cq = NULL;
    struct ibv_qp *qp = NULL, *peer = NULL;
    struct ibv_mr *src_mr = NULL, *dst_mr = NULL;
    static char src[NWR][64], dst[NWR][64];
    for (int i = 0; i < NWR; i++)
        memset(src[i], 'a' + i % 26, sizeof src[i]);
    sqd_sim_config_default(&cfg);
    struct ibv_qp_init_attr ia = {.qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 16, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp_init_attr pa;
    if (sqd_sim_new(&cfg, &sim) || sqd_sim_create_cq(sim, 64, &cq) || sqd_sim_create_cq(sim, 64, &peer_cq)) {
        fprintf(stderr, "device: %s\n", sqd_last_error());
        return 1;
    }
    ia.send_cq = ia.recv_cq = cq;
    pa = ia;
    pa.send_cq = pa.recv_cq = peer_cq;
    if (sqd_sim_create_qp(sim, &ia, &qp) || sqd_sim_create_qp(sim, &pa, &peer) || sqd_sim_connect(qp, peer, NULL) ||
        sqd_sim_reg_mr(sim, src, sizeof src, IBV_ACCESS_LOCAL_WRITE, &src_mr) ||
        sqd_sim_reg_mr(sim, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, &dst_mr)) {
        fprintf(stderr, "device: %s\n", sqd_last_error());
        return 1;
    }

    /* Put the CQ and the QP's send queue under management. */
    struct app app = {0};
    struct sqd_cq *scq = NULL;
    struct sqd_queue *q = NULL;
    struct sqd_queue_attr attr = {.sq_depth = ia.cap.max_send_wr, .max_send_sge = ia.cap.max_send_sge,
                                  .max_inline_data = ia.cap.max_inline_data, .backlog_depth = NWR,
                                  .release = on_release, .release_ctx = &app};
    if (sqd_cq_new(cq, &scq) || sqd_queue_new(scq, NULL, qp, &attr, &q)) {
        fprintf(stderr, "sqdisc: %s\n", sqd_last_error());
        return 1;
    }

    /* One chain of 64 RDMA WRITEs; the ULP asks for a completion on the last one only. */
    struct ibv_sge sge[NWR];
    struct ibv_send_wr wr[NWR], *bad = NULL;
    for (int i = 0; i < NWR; i++) {
        sge[i] = (struct ibv_sge){.addr = (uintptr_t)src[i], .length = sizeof src[i], .lkey = src_mr->lkey};
        wr[i] = (struct ibv_send_wr){.wr_id = i, .next = i + 1 < NWR ? &wr[i + 1] : NULL, .sg_list = &sge[i],
                                     .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                                     .send_flags = i == NWR - 1 ? IBV_SEND_SIGNALED : 0,
                                     .wr.rdma = {.remote_addr = (uintptr_t)dst[i], .rkey = dst_mr->rkey}};
    }
    if (sqd_post_send(q, wr, &bad)) {
        fprintf(stderr, "post: %s\n", sqd_last_error());
        return 1;
    }
    struct sqd_queue_stats posted;
    sqd_queue_stats(q, &posted);

    /* The HCA executes what it holds; polling releases WRs and feeds it the backlog as slots free up. */
    struct ibv_wc wc[8];
    unsigned shown = 0, last_shown = 0;
    for (int round = 0; app.released < NWR && round < 1000; round++) {
        sqd_sim_run_until_idle(sim, 1000000);
        int n = sqd_cq_poll(scq, 8, wc);
        for (int k = 0; k < n; k++, shown++) {
            printf("completion shown: wr_id %llu, %s\n", (unsigned long long)wc[k].wr_id,
                   ibv_wc_status_str(wc[k].status));
            last_shown = (unsigned)wc[k].wr_id;
        }
    }

    struct sqd_queue_stats st;
    sqd_queue_stats(q, &st);
    printf("WRs posted: %llu (%llu parked in the backlog)\n", (unsigned long long)st.accepted,
           (unsigned long long)st.parked);
    printf("completions shown: %u; releases: %u (%u in order, %u implied)\n", shown, app.released,
           app.in_order, app.implied);
    printf("CQEs: %llu for %llu WRs (%.3f per WR), markers: %llu\n", (unsigned long long)st.send_cqes,
           (unsigned long long)st.accepted, (double)st.send_cqes / (double)st.accepted,
           (unsigned long long)st.markers);

    check(posted.accepted == NWR && posted.in_provider == ia.cap.max_send_wr, "all 64 accepted, 16 posted at once");
    check(posted.backlog == NWR - ia.cap.max_send_wr && st.parked == NWR - ia.cap.max_send_wr, "48 parked");
    check(sqd_sim_violation_count(sim) == 0, "credits kept: the HCA saw no rule broken");
    check(shown == 1 && last_shown == NWR - 1, "only the ULP-signaled completion is shown");
    check(app.released == NWR && app.in_order == NWR && st.released == NWR, "all released once, in order");
    check(app.implied == NWR - st.send_cqes && st.send_cqes * 4 <= NWR, "about one CQE per 4 WRs");
    check(memcmp(src, dst, sizeof src) == 0, "every WRITE landed in the peer's memory");

    check(sqd_queue_free(q) == 0 && sqd_cq_free(scq) == 0, "queue and CQ freed");
    sqd_sim_destroy_qp(qp);
    sqd_sim_destroy_qp(peer);
    sqd_sim_destroy_cq(cq);
    sqd_sim_destroy_cq(peer_cq);
    sqd_sim_dereg_mr(src_mr);
    sqd_sim_dereg_mr(dst_mr);
    sqd_sim_free(sim);
    return failed;
}
