/* The checker's rules through its C API, on the software HCA: each kind is reported with the QP and WQE it
 * concerns, SQ overflows and undersized CQs before the provider sees the post, and a program that keeps the
 * rules gets no finding. Linked against libsqdisc (the sim) and libsqdisc_check. */
#define _POSIX_C_SOURCE 200809L
#include <sqdisc_sim.h>
#include <sqdisc_check.h>
#include <infiniband/verbs.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures;
#define CHECK(cond, ...)                                                                                         \
    do {                                                                                                         \
        if (!(cond)) {                                                                                           \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                               \
            printf(__VA_ARGS__);                                                                                 \
            printf("\n");                                                                                        \
            failures++;                                                                                          \
        }                                                                                                        \
    } while (0)

static struct sqd_sim *sim;
static struct ibv_context *ctx;
static char bufs[16][4096], rbuf[4][64 * 64];
static struct ibv_mr *mr[16], *rmr[4];

/* The spy sits between the checker and the sim: it sees what the provider sees, when it sees it. */
static int (*sim_post_send)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **);
static uint64_t spy_watch = UINT64_MAX, spy_overflows_seen = UINT64_MAX;
static int spy_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    for (struct ibv_send_wr *w = wr; w; w = w->next)
        if (w->wr_id == spy_watch)
            spy_overflows_seen = sqd_check_count(SQD_CHECK_SQ_OVERFLOW);
    return sim_post_send(qp, wr, bad);
}

static void must(int rc, const char *what)
{
    if (rc) {
        printf("FAIL setup: %s: %d\n", what, rc);
        exit(1);
    }
}

static int post(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode op, unsigned flags, int b, uint32_t len,
                uint32_t inv_rkey)
{
    struct ibv_sge sge = {.addr = b >= 0 ? (uintptr_t)bufs[b] : 0, .length = len, .lkey = b >= 0 ? mr[b]->lkey : 0};
    struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = b >= 0 ? &sge : NULL, .num_sge = b >= 0, .opcode = op,
                             .send_flags = flags},
                       *bad = NULL;
    wr.invalidate_rkey = inv_rkey;
    return ibv_post_send(qp, &wr, &bad);
}

static int poll_n(struct ibv_cq *cq, int polls)
{
    struct ibv_wc wc[32];
    int got = 0;
    for (int i = 0; i < polls; i++) {
        int n = ibv_poll_cq(cq, 32, wc);
        got += n > 0 ? n : 0;
    }
    return got;
}

static struct ibv_cq *cq_of(int cqe)
{
    struct ibv_cq *cq;
    must(sqd_sim_create_cq(sim, cqe, &cq), "create_cq");
    must(sqd_check_track_cq(cq), "track_cq");
    return cq;
}

/* Two connected QPs on `cq`, SQ depth `sq`, 64 receives posted on the second (receive buffers `r`). */
static void pair(struct ibv_cq *cq, uint32_t sq, struct ibv_qp **a, struct ibv_qp **b, int r)
{
    struct ibv_qp_init_attr at = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = sq, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp_init_attr bt = at;
    must(sqd_sim_create_qp(sim, &at, a), "create_qp");
    must(sqd_check_track_qp(*a, &at), "track_qp");
    must(sqd_sim_create_qp(sim, &bt, b), "create_qp");
    must(sqd_check_track_qp(*b, &bt), "track_qp");
    must(sqd_sim_connect(*a, *b, NULL), "connect");
    for (int i = 0; i < 64; i++) {
        struct ibv_sge sge = {.addr = (uintptr_t)(rbuf[r] + 64 * i), .length = 64, .lkey = rmr[r]->lkey};
        struct ibv_recv_wr wr = {.wr_id = 5000 + (uint64_t)i, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
        must(ibv_post_recv(*b, &wr, &bad), "post_recv");
    }
}

static void destroy(struct ibv_qp *qp)
{
    sqd_check_untrack_qp(qp);
    must(sqd_sim_destroy_qp(qp), "destroy_qp");
}

static struct sqd_check_record rec(uint32_t kind, size_t i)
{
    struct sqd_check_record r;
    memset(&r, 0, sizeof r);
    int rc = sqd_check_record(kind, i, &r);
    CHECK(rc == 0, "record %u/%zu: %d", kind, i, rc);
    return r;
}

static void set_config(uint32_t sample_every, uint32_t idle_ms)
{
    struct sqd_check_config c;
    must(sqd_check_get_config(&c), "get_config");
    c.mode = SQD_CHECK_MODE_LOG;
    c.sample_every = sample_every;
    c.idle_ms = idle_ms;
    c.first = 100;
    must(sqd_check_set_config(&c), "set_config");
}

int main(void)
{
    struct sqd_sim_config cfg;
    sqd_sim_config_default(&cfg);
    cfg.flags = SQD_SIM_STRICT;
    must(sqd_sim_new(&cfg, &sim), "sqd_sim_new");
    ctx = sqd_sim_context(sim);
    sim_post_send = ctx->ops.post_send;
    ctx->ops.post_send = spy_post_send;
    must(sqd_check_attach(ctx), "attach");
    CHECK(ctx->ops.post_send != spy_post_send, "attach replaced post_send");
    CHECK(sqd_check_attach(ctx) == 0, "attaching twice is a no-op");
    set_config(1, 0);
    for (int i = 0; i < 16; i++) {
        must(sqd_sim_reg_mr(sim, bufs[i], sizeof bufs[i], IBV_ACCESS_LOCAL_WRITE, &mr[i]), "reg_mr");
        must(sqd_check_track_mr(mr[i]), "track_mr");
    }
    for (int i = 0; i < 4; i++) {
        must(sqd_sim_reg_mr(sim, rbuf[i], sizeof rbuf[i], IBV_ACCESS_LOCAL_WRITE, &rmr[i]), "reg_mr");
        must(sqd_check_track_mr(rmr[i]), "track_mr");
    }

    /* ---- a program that keeps every rule: no finding ----------------------------------------------------- */
    struct ibv_cq *good_cq = cq_of(2 * (8 + 64));
    struct ibv_qp *ga, *gb;
    pair(good_cq, 8, &ga, &gb, 0);
    CHECK(sqd_check_count(0) == 0, "a CQ holding every slot is not undersized: %llu", (unsigned long long)sqd_check_count(0));
    unsigned outstanding = 0, sent = 0, slots = 0;
    for (int round = 0; round < 2000 && sent < 500; round++) {
        while (slots < 8 && sent < 500) { /* credits: post only into slots polled CQEs freed */
            unsigned flags = sent % 4 == 3 ? IBV_SEND_SIGNALED : 0;
            CHECK(post(ga, sent, IBV_WR_SEND, flags, 0, 64, 0) == 0, "post %u", sent);
            sent++, slots++, outstanding++;
        }
        struct ibv_wc wc[32];
        int n = ibv_poll_cq(good_cq, 32, wc);
        for (int k = 0; k < n; k++) {
            if (wc[k].qp_num == ga->qp_num && wc[k].status == IBV_WC_SUCCESS) {
                slots -= 4; /* a signaled CQE every 4th WR frees the 4 slots up to it */
            } else if (wc[k].qp_num == gb->qp_num) {
                struct ibv_sge sge = {.addr = (uintptr_t)rbuf[0], .length = 64, .lkey = rmr[0]->lkey};
                struct ibv_recv_wr r = {.wr_id = wc[k].wr_id, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
                ibv_post_recv(gb, &r, &bad);
            }
        }
    }
    CHECK(sent == 500, "the clean program posted %u of 500", sent);
    CHECK(sqd_check_count(0) == 0, "no violation in a program that keeps the rules, got %llu",
          (unsigned long long)sqd_check_count(0));

    /* ---- CQ sizing, at QP creation ------------------------------------------------------------------------ */
    struct ibv_cq *small = cq_of(16);
    struct ibv_qp *sa, *sb;
    pair(small, 8, &sa, &sb, 1);
    CHECK(sqd_check_count(SQD_CHECK_CQ_UNDERSIZED) == 2, "both QPs on the 16-CQE CQ found it undersized: %llu",
          (unsigned long long)sqd_check_count(SQD_CHECK_CQ_UNDERSIZED));
    struct sqd_check_record r = rec(SQD_CHECK_CQ_UNDERSIZED, 0);
    CHECK(r.qp_num == sa->qp_num && r.wqe_index == SQD_CHECK_NO_WQE, "qp %u wqe %llu", r.qp_num,
          (unsigned long long)r.wqe_index);
    CHECK(strncmp(r.text, "CQ undersized", 13) == 0 && strstr(r.text, "holds 16 CQEs") && strstr(r.text, "72 outstanding"),
          "%s", r.text);

    /* ---- SQ credits and the unsignaled run: reported before the provider sees the post ------------------- */
    struct ibv_cq *cq2 = cq_of(1024);
    struct ibv_qp *qa, *qb;
    pair(cq2, 8, &qa, &qb, 2);
    sqd_check_reset();
    for (uint64_t i = 0; i < 7; i++)
        post(qa, i, IBV_WR_SEND, 0, 1, 64, 0);
    CHECK(sqd_check_count(SQD_CHECK_UNSIGNALED_RUN) == 0, "7 unsignaled WQEs on an SQ of 8 are not yet a run");
    post(qa, 7, IBV_WR_SEND, 0, 1, 64, 0);
    CHECK(sqd_check_count(SQD_CHECK_UNSIGNALED_RUN) == 1, "the 8th unsignaled WQE is a run as long as the SQ");
    r = rec(SQD_CHECK_UNSIGNALED_RUN, 0);
    CHECK(r.qp_num == qa->qp_num && r.wqe_index == 7, "run: qp %u wqe %llu", r.qp_num, (unsigned long long)r.wqe_index);
    spy_watch = 8;
    int rc = post(qa, 8, IBV_WR_SEND, IBV_SEND_SIGNALED, 1, 64, 0);
    CHECK(rc == ENOMEM, "the sim refuses the 9th WR: %d", rc);
    CHECK(spy_overflows_seen == 1, "the overflow was reported before the provider saw the WR (%llu when it did)",
          (unsigned long long)spy_overflows_seen);
    r = rec(SQD_CHECK_SQ_OVERFLOW, 0);
    CHECK(r.qp_num == qa->qp_num && r.wqe_index == 8 && strncmp(r.text, "SQ overflow", 11) == 0, "qp %u wqe %llu: %s",
          r.qp_num, (unsigned long long)r.wqe_index, r.text);
    struct sqd_sim_violation sv;
    int nv = sqd_sim_violation_count(sim);
    CHECK(nv >= 1 && sqd_sim_violation(sim, (size_t)nv - 1, &sv) == 0 && sv.kind == SQD_SIM_VIOLATION_SQ_OVERFLOW &&
              sv.wqe_index == 8 && sv.qp_num == qa->qp_num,
          "the sim logged the same overflow (qp %u wqe %llu)", sv.qp_num, (unsigned long long)sv.wqe_index);
    CHECK(sqd_check_count(0) == 2, "run + overflow: %llu", (unsigned long long)sqd_check_count(0));

    /* ---- sources: sampled, checked when a CQE covers the WQE --------------------------------------------- */
    struct ibv_cq *cq3 = cq_of(1024);
    struct ibv_qp *ma, *mb;
    pair(cq3, 64, &ma, &mb, 3);
    sqd_check_reset();
    post(ma, 0, IBV_WR_SEND, 0, 2, 256, 0);
    post(ma, 1, IBV_WR_SEND, IBV_SEND_SIGNALED, 3, 256, 0);
    bufs[2][10] ^= 1; /* the unsignaled WQE's source; its CQE is the signaled one's */
    poll_n(cq3, 50);
    CHECK(sqd_check_count(SQD_CHECK_SOURCE_MODIFIED) == 1, "one modified source: %llu",
          (unsigned long long)sqd_check_count(SQD_CHECK_SOURCE_MODIFIED));
    r = rec(SQD_CHECK_SOURCE_MODIFIED, 0);
    CHECK(r.qp_num == ma->qp_num && r.wqe_index == 0, "qp %u wqe %llu", r.qp_num, (unsigned long long)r.wqe_index);
    set_config(0, 0); /* sampling off: not seen */
    post(ma, 2, IBV_WR_SEND, IBV_SEND_SIGNALED, 2, 256, 0);
    bufs[2][11] ^= 1;
    poll_n(cq3, 50);
    CHECK(sqd_check_count(SQD_CHECK_SOURCE_MODIFIED) == 1, "sampling off checks nothing");
    set_config(1, 0);

    /* ---- MRs: deregistration and LocalInv of an MR in use ------------------------------------------------ */
    sqd_check_reset();
    post(ma, 3, IBV_WR_SEND, 0, 4, 64, 0);                             /* WQE #3 uses mr[4] */
    post(ma, 4, IBV_WR_LOCAL_INV, IBV_SEND_FENCE, -1, 0, mr[4]->rkey); /* fenced: ordered behind it */
    CHECK(sqd_check_count(0) == 0, "a fenced LocalInv behind the SEND is fine: %llu", (unsigned long long)sqd_check_count(0));
    post(ma, 5, IBV_WR_SEND, 0, 5, 64, 0);                             /* WQE #5 uses mr[5] */
    post(ma, 6, IBV_WR_LOCAL_INV, 0, -1, 0, mr[5]->rkey);
    CHECK(sqd_check_count(SQD_CHECK_UNFENCED_INV) == 1, "unfenced LocalInv behind the SEND");
    r = rec(SQD_CHECK_UNFENCED_INV, 0);
    CHECK(r.qp_num == ma->qp_num && r.wqe_index == 5 && strstr(r.text, "LOCAL_INV WQE #6"), "qp %u wqe %llu: %s", r.qp_num,
          (unsigned long long)r.wqe_index, r.text);
    post(ma, 7, IBV_WR_SEND, 0, 6, 64, 0); /* WQE #7 uses mr[6]; another QP invalidates it */
    post(qb, 100, IBV_WR_LOCAL_INV, IBV_SEND_FENCE, -1, 0, mr[6]->rkey);
    CHECK(sqd_check_count(SQD_CHECK_MR_IN_USE) == 1, "LocalInv on another QP of an MR in use");
    r = rec(SQD_CHECK_MR_IN_USE, 0);
    CHECK(r.qp_num == ma->qp_num && r.wqe_index == 7, "recorded against the QP using it: qp %u wqe %llu", r.qp_num,
          (unsigned long long)r.wqe_index);
    post(ma, 8, IBV_WR_SEND, 0, 7, 64, 0);
    CHECK(sqd_check_untrack_mr(mr[7]) == 0, "untrack_mr");
    must(sqd_sim_dereg_mr(mr[7]), "dereg_mr");
    CHECK(sqd_check_count(SQD_CHECK_MR_IN_USE) == 2, "dereg of an MR in use");
    r = rec(SQD_CHECK_MR_IN_USE, 1);
    CHECK(r.qp_num == ma->qp_num && r.wqe_index == 8 && strstr(r.text, "ibv_dereg_mr"), "qp %u wqe %llu: %s", r.qp_num,
          (unsigned long long)r.wqe_index, r.text);
    poll_n(cq3, 100);
    must(sqd_check_untrack_mr(mr[8]), "untrack_mr"); /* nothing uses it */
    must(sqd_sim_dereg_mr(mr[8]), "dereg_mr");
    CHECK(sqd_check_count(SQD_CHECK_MR_IN_USE) == 2, "dereg of an unused MR is fine");

    /* ---- idle unsignaled tail ----------------------------------------------------------------------------- */
    sqd_check_reset();
    set_config(1, 5);
    struct ibv_cq *cq4 = cq_of(1024);
    struct ibv_qp *ta, *tb;
    pair(cq4, 64, &ta, &tb, 3);
    post(ta, 0, IBV_WR_SEND, IBV_SEND_SIGNALED, 9, 64, 0);
    post(ta, 1, IBV_WR_SEND, 0, 9, 64, 0);
    poll_n(cq4, 20);
    struct timespec ms20 = {0, 20 * 1000 * 1000};
    nanosleep(&ms20, NULL);
    poll_n(cq4, 3);
    CHECK(sqd_check_count(SQD_CHECK_IDLE_TAIL) == 1, "idle tail: %llu", (unsigned long long)sqd_check_count(SQD_CHECK_IDLE_TAIL));
    r = rec(SQD_CHECK_IDLE_TAIL, 0);
    CHECK(r.qp_num == ta->qp_num && r.wqe_index == 1, "qp %u wqe %llu", r.qp_num, (unsigned long long)r.wqe_index);
    post(ta, 2, IBV_WR_SEND, IBV_SEND_SIGNALED, 9, 64, 0); /* covered now */
    poll_n(cq4, 20);
    nanosleep(&ms20, NULL);
    poll_n(cq4, 3);
    CHECK(sqd_check_count(SQD_CHECK_IDLE_TAIL) == 1, "a signaled tail is not idle");
    set_config(1, 0);

    /* ---- flushes of unsignaled WQEs: a notice, not a violation --------------------------------------------- */
    sqd_check_reset();
    post(ta, 3, IBV_WR_SEND, 0, 9, 64, 0);
    post(ta, 4, IBV_WR_SEND, 0, 9, 64, 0);
    must(sqd_sim_set_error(ta), "set_error");
    sqd_check_qp_state(ta, IBV_QPS_ERR);
    poll_n(cq4, 10);
    CHECK(sqd_check_count(SQD_CHECK_UNSIGNALED_FLUSH) == 2, "two unsignaled flushes: %llu",
          (unsigned long long)sqd_check_count(SQD_CHECK_UNSIGNALED_FLUSH));
    CHECK(sqd_check_count(0) == 0, "notices are not violations");
    r = rec(SQD_CHECK_UNSIGNALED_FLUSH, 1);
    CHECK(r.qp_num == ta->qp_num && r.wqe_index == 4, "qp %u wqe %llu", r.qp_num, (unsigned long long)r.wqe_index);

    /* ---- bad input ----------------------------------------------------------------------------------------- */
    CHECK(sqd_check_attach(NULL) == -EINVAL, "attach NULL");
    CHECK(sqd_check_track_qp(NULL, NULL) == -EINVAL, "track_qp NULL");
    CHECK(sqd_check_track_qp(ta, NULL) == -EINVAL, "track_qp NULL attr");
    CHECK(sqd_check_track_cq(NULL) == -EINVAL && sqd_check_track_mr(NULL) == -EINVAL, "track NULL");
    CHECK(sqd_check_untrack_qp(NULL) == -EINVAL && sqd_check_untrack_cq(NULL) == -EINVAL &&
              sqd_check_untrack_mr(NULL) == -EINVAL && sqd_check_detach(NULL) == -EINVAL,
          "untrack NULL");
    CHECK(sqd_check_resize_cq(cq4, 0) == -EINVAL, "resize to 0");
    CHECK(sqd_check_record(0, 0, &r) == -EINVAL && sqd_check_record(99, 0, &r) == -EINVAL, "record of no kind");
    CHECK(sqd_check_record(SQD_CHECK_SQ_OVERFLOW, 0, NULL) == -EINVAL, "record NULL out");
    CHECK(sqd_check_record(SQD_CHECK_SQ_OVERFLOW, 1000, &r) == -ENOENT, "record past the end");
    CHECK(strcmp(sqd_check_kind_str(99), "unknown") == 0 && strcmp(sqd_check_kind_str(1), "SQ overflow") == 0 &&
              strcmp(sqd_check_kind_str(SQD_CHECK_MR_IN_USE), sqd_sim_violation_kind_str(SQD_SIM_VIOLATION_MR_IN_USE)) == 0,
          "kind names");
    CHECK(sqd_check_count(99) == 0, "count of no kind");
    CHECK(sqd_check_get_config(NULL) == -EINVAL && sqd_check_set_config(NULL) == -EINVAL, "config NULL");
    struct sqd_check_config bad_mode = {.mode = 7};
    CHECK(sqd_check_set_config(&bad_mode) == -EINVAL, "unknown mode");
    CHECK(sqd_check_write_report(-1) == -EBADF && strstr(sqd_check_last_error(), "fd -1"), "report to a bad fd: %s",
          sqd_check_last_error());
    CHECK(sqd_check_track_qp(NULL, NULL) == -EINVAL && strstr(sqd_check_last_error(), "sqd_check_track_qp"), "message: %s",
          sqd_check_last_error());

    /* ---- teardown ------------------------------------------------------------------------------------------ */
    struct ibv_qp *all[] = {ga, gb, sa, sb, qa, qb, ma, mb, ta, tb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        destroy(all[i]);
    sqd_check_detach(ctx);
    must(sqd_sim_free(sim), "sqd_sim_free");
    if (failures) {
        sqd_check_write_report(1);
        printf("api_rules: %d failures\n", failures);
        return 1;
    }
    printf("api_rules: all checks passed\n");
    return 0;
}
