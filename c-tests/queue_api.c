/* The semantics contract of a managed queue, through the C API, on the scripted device: credits, backlog
 * order, exact bad_wr on -EAGAIN, bounded signaling, liveness of an idle unsignaled tail, the completions
 * sqd_cq_poll shows, ordered releases (implied, error, flush, never posted), re-entrant posts from release
 * callbacks, sqd_defer barriers, drain, receives, several queues on one CQ, pass-through CQEs and the stats.
 *
 * Mirrors tests/queue.rs. Each scenario prints "PASS <name>" or "FAIL <name>: <why>"; a failed scenario is
 * torn down and the next one runs; the exit status is non-zero if any failed. */

#include "support/harness.h"

/* ---- WR chains ---------------------------------------------------------------------------------------------- */

#define CHAIN_CAP 64
static unsigned char data[1024 * 64]; /* the WRs' (never really transmitted) source buffers */

struct chain {
    struct ibv_send_wr wr[CHAIN_CAP];
    struct ibv_sge sge[CHAIN_CAP];
    int n;
};

static uintptr_t buf_of(uint64_t id) { return (uintptr_t)&data[(id % 1024) * 64]; }

static struct chain *chain_add(struct chain *c, uint64_t id, enum ibv_wr_opcode op, unsigned flags)
{
    CHECK(c->n < CHAIN_CAP);
    struct ibv_send_wr *w = &c->wr[c->n];
    memset(w, 0, sizeof *w);
    c->sge[c->n] = (struct ibv_sge){.addr = buf_of(id), .length = 64, .lkey = 7};
    w->wr_id = id;
    w->opcode = op;
    w->send_flags = flags;
    w->num_sge = 1;
    w->sg_list = &c->sge[c->n];
    if (op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_READ) {
        w->wr.rdma.remote_addr = 0x5000000 + id;
        w->wr.rdma.rkey = 0x99;
    }
    if (c->n > 0)
        c->wr[c->n - 1].next = w;
    c->n++;
    return c;
}

/* SENDs with wr_ids [from, to), all with `flags`. */
static struct chain *sends(struct chain *c, uint64_t from, uint64_t to, unsigned flags)
{
    c->n = 0;
    for (uint64_t id = from; id < to; id++)
        chain_add(c, id, IBV_WR_SEND, flags);
    return c;
}

static int post(struct mq *m, struct chain *c, struct ibv_send_wr **bad)
{
    struct ibv_send_wr *dummy;
    return sqd_post_send(m->q, c->wr, bad ? bad : &dummy);
}

static void post_ok(struct mq *m, struct chain *c) { CHECK_EQ(post(m, c, NULL), 0); }

static int post_recvs(struct mq *m, uint64_t from, uint64_t to)
{
    struct ibv_sge sge[CHAIN_CAP];
    struct ibv_recv_wr wr[CHAIN_CAP], *bad = NULL;
    int n = (int)(to - from);
    CHECK(n > 0 && n <= CHAIN_CAP);
    for (int i = 0; i < n; i++) {
        sge[i] = (struct ibv_sge){.addr = buf_of(900 + from + i), .length = 64, .lkey = 9};
        wr[i] = (struct ibv_recv_wr){.wr_id = from + i, .next = i + 1 < n ? &wr[i + 1] : NULL, .sg_list = &sge[i],
                                     .num_sge = 1};
    }
    return sqd_post_recv(m->q, wr, &bad);
}

/* ---- scenarios --------------------------------------------------------------------------------------------- */

static struct chain ch, ch2; /* large: keep them off the stack */

static void credits_and_backlog_order(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 8, .signal_interval = 4, .backlog_depth = 32}, 64);
    post_ok(m, sends(&ch, 0, 20, 0));
    struct sqd_queue_stats s = qstats(m);
    CHECK_EQ(s.accepted, 20);
    CHECK_EQ(s.in_provider, 8);
    CHECK_EQ(s.backlog, 12);
    CHECK_EQ(s.credits, 0);
    CHECK_EQ(dstats(m).wqes_posted, 8);
    /* The ULP may reuse its chain at once: parked WRs were copied. */
    memset(&ch, 0xA5, sizeof ch);
    for (int i = 0; i < 100 && m->nlog < 20; i++) {
        complete(m, 3);
        poll_all(the_rig->scq);
        CHECK(dstats(m).max_outstanding <= 8);
    }
    released_in_order(m, 0, 20);
    for (size_t i = 0; i < 20; i++) {
        CHECK_EQ(m->log[i].status, IBV_WC_SUCCESS);
        CHECK_EQ(m->log[i].opcode, IBV_WC_SEND);
        CHECK_EQ(m->log[i].flags & SQD_COMPLETION_NEVER_POSTED, 0);
    }
    struct sqd_scripted_qp_stats d = dstats(m);
    CHECK(d.max_outstanding <= 8);
    no_violations(the_rig);
    /* The provider saw the 20 SENDs in post order (markers aside), with their own buffers. */
    uint64_t next = 0;
    for (size_t i = 0; i < d.wqes_posted; i++) {
        struct sqd_scripted_wqe w = wqe(m, i);
        if (w.opcode != IBV_WR_SEND)
            continue;
        CHECK(w.first_sge_addr == buf_of(next));
        CHECK_EQ(w.first_sge_length, 64);
        CHECK_EQ(w.first_sge_lkey, 7);
        next++;
    }
    CHECK_EQ(next, 20);
    s = qstats(m);
    CHECK_EQ(s.parked, 12);
    CHECK_EQ(s.backlog_peak, 12);
    CHECK_EQ(s.backlog, 0);
    CHECK_EQ(s.released, 20);
    CHECK_EQ(s.refused, 0);
    callbacks_ok(m);
}

static void chain_is_the_ulps(struct chain *c, uint64_t first_id, unsigned flags)
{
    for (int i = 0; i < c->n; i++) {
        CHECK_EQ(c->wr[i].wr_id, first_id + (uint64_t)i);
        CHECK_EQ(c->wr[i].send_flags, flags);
        CHECK(c->wr[i].next == (i + 1 < c->n ? &c->wr[i + 1] : NULL));
        CHECK(c->wr[i].sg_list == &c->sge[i]);
        CHECK_EQ(c->wr[i].num_sge, 1);
        CHECK_EQ(c->wr[i].opcode, IBV_WR_SEND);
    }
}

static void eagain_names_the_first_wr_not_taken(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 6, .signal_interval = 2, .backlog_depth = 0}, 64);
    struct ibv_send_wr *bad = NULL;
    CHECK_EQ(post(m, sends(&ch, 100, 110, 0), &bad), -EAGAIN);
    CHECK(bad == &ch.wr[6]);
    CHECK(strstr(sqd_last_error(), "credit") != NULL);
    CHECK_EQ(qstats(m).accepted, 6);
    CHECK(qstats(m).refused >= 1);
    CHECK_EQ(dstats(m).wqes_posted, 6);
    chain_is_the_ulps(&ch, 100, 0);
    /* Once credits return, posting the rest succeeds. */
    complete(m, 6);
    poll_all(the_rig->scq);
    released_in_order(m, 100, 6);
    post_ok(m, sends(&ch, 106, 110, 0));
    settle(the_rig, m);
    released_in_order(m, 100, 10);
    CHECK(dstats(m).max_outstanding <= 6);
    no_violations(the_rig);
    callbacks_ok(m);
}

/* Longest run of unsignaled WQEs the provider was given. */
static int longest_unsignaled_run(struct mq *m)
{
    int run = 0, longest = 0;
    uint64_t n = dstats(m).wqes_posted;
    for (size_t i = 0; i < n; i++) {
        struct sqd_scripted_wqe w = wqe(m, i);
        CHECK_EQ(w.signaled, (w.send_flags & IBV_SEND_SIGNALED) != 0);
        run = w.signaled ? 0 : run + 1;
        if (run > longest)
            longest = run;
    }
    return longest;
}

static void signaling_is_moderated_and_bounded(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 64, .signal_interval = 8}, 128);
    CHECK_EQ(qstats(m).signal_interval, 8);
    for (uint64_t round = 0; round < 40; round++) {
        post_ok(m, sends(&ch, round * 4, round * 4 + 4, 0));
        complete(m, INT_MAX);
        CHECK_EQ(poll_all(the_rig->scq), 0); /* nothing was signaled by the ULP */
    }
    CHECK(longest_unsignaled_run(m) < 8);
    struct sqd_queue_stats s = qstats(m);
    CHECK_EQ(s.accepted, 160);
    CHECK(s.send_cqes * 8 <= s.accepted + 8);
    CHECK_EQ(s.markers, 0);
    CHECK_EQ(s.signaled_by_ulp, 0);
    CHECK(dstats(m).max_outstanding <= 64);
    no_violations(the_rig);
    callbacks_ok(m);
}

static void signaling_one_wr_per_post(void)
{
    /* A ULP posting one WR per call, polling between posts: still bounded runs and few CQEs. */
    struct mq *m = rig1((struct qcfg){.sq_depth = 32, .signal_interval = 8}, 64);
    for (uint64_t id = 0; id < 160; id++) {
        post_ok(m, sends(&ch, id, id + 1, 0));
        complete(m, INT_MAX);
        CHECK_EQ(poll_all(the_rig->scq), 0);
    }
    CHECK(longest_unsignaled_run(m) < 8);
    struct sqd_queue_stats s = qstats(m);
    CHECK(s.send_cqes * 8 <= s.accepted + 8);
    settle(the_rig, m);
    released_in_order(m, 0, 160);
    no_violations(the_rig);
    callbacks_ok(m);
}

static void default_signal_interval(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16}, 64);
    CHECK_EQ(qstats(m).signal_interval, 4); /* max(1, sq_depth / 4) */
    struct mq *m2 = add_queue(the_rig, (struct qcfg){.sq_depth = 2});
    CHECK_EQ(qstats(m2).signal_interval, 1);
    post_ok(m2, sends(&ch, 0, 2, 0));
    CHECK(longest_unsignaled_run(m2) == 0);
    settle(the_rig, m2);
    released_in_order(m2, 0, 2);
}

static void a_lone_unsignaled_wr_is_released_without_further_posts(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 4}, 64);
    post_ok(m, sends(&ch, 7, 8, 0));
    CHECK(!wqe(m, 0).signaled); /* moderated: posted unsignaled */
    complete(m, INT_MAX);
    CHECK_EQ(poll_all(the_rig->scq), 0);
    CHECK_EQ(m->nlog, 0); /* no CQE covers it yet */
    CHECK_EQ(poll_all(the_rig->scq), 0);
    CHECK_EQ(qstats(m).markers, 1); /* the second poll cycle without a post covered the idle tail */
    CHECK_EQ(cqstats(the_rig->scq).tail_markers, 1);
    struct sqd_scripted_wqe mk = wqe(m, 1);
    CHECK(mk.signaled);
    CHECK_EQ(mk.opcode, IBV_WR_RDMA_WRITE);
    CHECK_EQ(mk.total_length, 0);
    complete(m, INT_MAX);
    CHECK_EQ(poll_all(the_rig->scq), 0); /* the marker's CQE is not shown */
    CHECK_EQ(m->nlog, 1);
    CHECK_EQ(m->log[0].wr_id, 7);
    CHECK_EQ(m->log[0].status, IBV_WC_SUCCESS);
    CHECK_EQ(m->log[0].opcode, IBV_WC_SEND);
    CHECK(m->log[0].flags & SQD_COMPLETION_IMPLIED);
    struct sqd_cq_stats c = cqstats(the_rig->scq);
    CHECK_EQ(c.hidden, 1);
    CHECK_EQ(c.visible, 0);
    /* No more markers once nothing is outstanding. */
    poll_all(the_rig->scq);
    poll_all(the_rig->scq);
    CHECK_EQ(qstats(m).markers, 1);
    CHECK_EQ(qstats(m).in_provider, 0);
    no_violations(the_rig);
    callbacks_ok(m);
}

static void poll_shows_what_raw_verbs_would(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 4}, 64);
    /* 0,1 unsignaled; 2 signaled by the ULP; 3..6 moderated (6 signaled by the interval). */
    sends(&ch, 0, 2, 0);
    chain_add(&ch, 2, IBV_WR_SEND, IBV_SEND_SIGNALED);
    for (uint64_t id = 3; id < 7; id++)
        chain_add(&ch, id, IBV_WR_SEND, 0);
    post_ok(m, &ch);
    /* The ULP's chain is its own again: flags as it set them. */
    for (int i = 0; i < 7; i++) {
        CHECK_EQ(ch.wr[i].wr_id, i);
        CHECK_EQ(ch.wr[i].send_flags, i == 2 ? IBV_SEND_SIGNALED : 0);
    }
    CHECK_EQ(dstats(m).doorbells, 1); /* one post, one doorbell */
    complete(m, INT_MAX);
    CHECK_EQ(poll_all(the_rig->scq), 1);
    CHECK_EQ(shown[0].wr_id, 2);
    CHECK_EQ(shown[0].status, IBV_WC_SUCCESS);
    CHECK_EQ(shown[0].opcode, IBV_WC_SEND);
    CHECK_EQ(shown[0].qp_num, m->qp->qp_num);
    CHECK_EQ(shown[0].byte_len, 64);
    released_in_order(m, 0, 7);
    static const int implied[7] = {1, 1, 0, 1, 1, 1, 0};
    for (int i = 0; i < 7; i++) {
        CHECK_EQ(m->log[i].status, IBV_WC_SUCCESS);
        CHECK_EQ(m->log[i].opcode, IBV_WC_SEND);
        CHECK_EQ(m->log[i].vendor_err, 0);
        CHECK_EQ((m->log[i].flags & SQD_COMPLETION_IMPLIED) != 0, implied[i]);
        CHECK_EQ(m->log[i].flags & (SQD_COMPLETION_NEVER_POSTED | SQD_COMPLETION_RECV), 0);
    }
    callbacks_ok(m);
}

static void opcodes_come_from_the_wr(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 4}, 64);
    ch.n = 0;
    chain_add(&ch, 10, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED);
    chain_add(&ch, 11, IBV_WR_RDMA_READ, 0);
    chain_add(&ch, 12, IBV_WR_RDMA_READ, IBV_SEND_SIGNALED);
    chain_add(&ch, 13, IBV_WR_SEND_WITH_IMM, IBV_SEND_SIGNALED);
    ch.wr[3].imm_data = 0x01020304;
    post_ok(m, &ch);
    struct sqd_scripted_wqe w = wqe(m, 0);
    CHECK_EQ(w.remote_addr, 0x5000000 + 10);
    CHECK_EQ(w.rkey, 0x99);
    CHECK_EQ(wqe(m, 3).imm_data, 0x01020304);
    complete(m, INT_MAX);
    CHECK_EQ(poll_all(the_rig->scq), 3);
    CHECK_EQ(shown[0].wr_id, 10);
    CHECK_EQ(shown[0].opcode, IBV_WC_RDMA_WRITE);
    CHECK_EQ(shown[1].wr_id, 12);
    CHECK_EQ(shown[1].opcode, IBV_WC_RDMA_READ);
    CHECK_EQ(shown[2].wr_id, 13);
    CHECK_EQ(shown[2].opcode, IBV_WC_SEND);
    released_in_order(m, 10, 4);
    CHECK_EQ(m->log[0].opcode, IBV_WC_RDMA_WRITE);
    CHECK_EQ(m->log[1].opcode, IBV_WC_RDMA_READ);
    CHECK(m->log[1].flags & SQD_COMPLETION_IMPLIED);
    CHECK_EQ(m->log[2].opcode, IBV_WC_RDMA_READ);
    CHECK_EQ(m->log[3].opcode, IBV_WC_SEND);
    callbacks_ok(m);
}

static void an_error_in_the_middle_fails_the_queue_and_flushes_in_order(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 4, .backlog_depth = 8}, 64);
    post_ok(m, sends(&ch, 0, 16, 0));
    post_ok(m, sends(&ch, 16, 20, 0)); /* parked: no credit */
    CHECK_EQ(qstats(m).backlog, 4);
    CHECK_EQ(complete(m, 5), 5); /* 0..=4 execute; 3 was signaled by the interval */
    CHECK_EQ(sqd_scripted_fail(m->qp, IBV_WC_REM_ACCESS_ERR, 0x42), 0); /* 5 fails, later WQEs flush */
    int n = poll_all(the_rig->scq);
    /* The CQE of 3 freed slots before the error CQE was reaped, so 16..19 left the backlog into the (already
     * failed) QP and flush too. Raw verbs shows the error and a flush for every later WR, signaled or not. */
    CHECK_EQ(n, 15);
    CHECK_EQ(shown[0].wr_id, 5);
    CHECK_EQ(shown[0].status, IBV_WC_REM_ACCESS_ERR);
    CHECK_EQ(shown[0].vendor_err, 0x42);
    CHECK_EQ(shown[0].qp_num, m->qp->qp_num);
    for (int i = 1; i < n; i++) {
        CHECK_EQ(shown[i].wr_id, 5 + i);
        CHECK_EQ(shown[i].status, IBV_WC_WR_FLUSH_ERR);
        CHECK_EQ(shown[i].qp_num, m->qp->qp_num);
    }
    released_in_order(m, 0, 20);
    for (int i = 0; i < 5; i++)
        CHECK_EQ(m->log[i].status, IBV_WC_SUCCESS);
    CHECK_EQ(m->log[5].status, IBV_WC_REM_ACCESS_ERR);
    CHECK_EQ(m->log[5].vendor_err, 0x42);
    CHECK_EQ(m->log[5].opcode, IBV_WC_SEND);
    CHECK_EQ(m->log[5].flags, 0);
    for (int i = 6; i < 20; i++) {
        CHECK_EQ(m->log[i].status, IBV_WC_WR_FLUSH_ERR);
        CHECK_EQ(m->log[i].flags, 0);
        CHECK_EQ(m->log[i].opcode, IBV_WC_SEND);
    }
    struct sqd_queue_stats s = qstats(m);
    CHECK_EQ(s.closed, 1);
    CHECK_EQ(s.failed_status, IBV_WC_REM_ACCESS_ERR);
    /* Later posts are refused with -EIO, *bad_wr at the first WR. */
    struct ibv_send_wr *bad = NULL;
    CHECK_EQ(post(m, sends(&ch, 30, 32, 0), &bad), -EIO);
    CHECK(bad == &ch.wr[0]);
    CHECK(strstr(sqd_last_error(), "failed") != NULL);
    CHECK_EQ(qstats(m).accepted, 20);
    CHECK_EQ(sqd_queue_free(m->q), 0);
    m->q = NULL;
    no_violations(the_rig);
    callbacks_ok(m);
}

static void backlog_of_a_failed_queue_is_released_as_never_posted(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 8, .signal_interval = 4, .backlog_depth = 8}, 64);
    post_ok(m, sends(&ch, 0, 13, 0)); /* 8 posted, 5 parked */
    CHECK_EQ(sqd_scripted_fail(m->qp, IBV_WC_REM_ACCESS_ERR, 1), 0); /* 0 fails, 1..7 flush */
    int n = poll_all(the_rig->scq);
    CHECK_EQ(n, 8); /* only posted WRs have completions */
    CHECK_EQ(shown[0].status, IBV_WC_REM_ACCESS_ERR);
    released_in_order(m, 0, 13);
    CHECK_EQ(m->log[0].status, IBV_WC_REM_ACCESS_ERR);
    CHECK_EQ(m->log[0].vendor_err, 1);
    for (int i = 0; i < 8; i++)
        CHECK_EQ(m->log[i].flags & SQD_COMPLETION_NEVER_POSTED, 0);
    for (int i = 8; i < 13; i++) {
        CHECK_EQ(m->log[i].status, IBV_WC_WR_FLUSH_ERR);
        CHECK(m->log[i].flags & SQD_COMPLETION_NEVER_POSTED);
        CHECK_EQ(m->log[i].opcode, IBV_WC_SEND);
    }
    CHECK_EQ(dstats(m).wqes_posted, 8); /* the parked WRs never reached the provider */
    CHECK_EQ(qstats(m).backlog, 0);
    no_violations(the_rig);
    callbacks_ok(m);
}

static void post_next_from_release(struct mq *m, const struct sqd_completion *c)
{
    if (c->wr_id >= 50)
        return;
    struct ibv_sge sge = {.addr = buf_of(c->wr_id + 1), .length = 64, .lkey = 7};
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = c->wr_id + 1;
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    int rc = sqd_post_send(m->q, &wr, &bad);
    if (rc != 0)
        cb_fail(m, "sqd_post_send from a release callback", rc);
}

static void a_release_callback_may_post_on_its_own_queue(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 4, .signal_interval = 2}, 64);
    m->hook = post_next_from_release;
    post_ok(m, sends(&ch, 0, 1, IBV_SEND_SIGNALED));
    for (int i = 0; i < 500 && m->nlog < 51; i++) {
        complete(m, INT_MAX);
        poll_all(the_rig->scq);
    }
    callbacks_ok(m);
    released_in_order(m, 0, 51);
    CHECK_EQ(qstats(m).accepted, 51);
    CHECK(dstats(m).max_outstanding <= 4);
    no_violations(the_rig);
}

/* sqd_defer: record how many releases preceded the action. */
static size_t defer_seen[8];
static int ndefer;
static struct mq *defer_mq;

static void deferred_action(void *ctx)
{
    (void)ctx;
    if (ndefer < 8)
        defer_seen[ndefer] = defer_mq->nlog;
    ndefer++;
}

static void deferred_actions_are_completion_barriers(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 4}, 64);
    defer_mq = m;
    ndefer = 0;
    CHECK_EQ(sqd_defer(m->q, deferred_action, NULL), 0);
    CHECK_EQ(ndefer, 1); /* nothing outstanding: ran before sqd_defer returned */
    CHECK_EQ(defer_seen[0], 0);
    post_ok(m, sends(&ch, 0, 3, 0));
    CHECK_EQ(sqd_defer(m->q, deferred_action, NULL), 0);
    CHECK_EQ(ndefer, 1);
    CHECK_EQ(qstats(m).deferred, 1);
    post_ok(m, sends(&ch, 3, 5, 0));
    for (int i = 0; i < 20 && m->nlog < 5; i++) {
        complete(m, INT_MAX);
        poll_all(the_rig->scq);
    }
    released_in_order(m, 0, 5);
    CHECK_EQ(ndefer, 2);
    CHECK_EQ(defer_seen[1], 3); /* after release 2, before release 3 */
    CHECK_EQ(qstats(m).deferred, 0);
    /* Idle again: at once. */
    CHECK_EQ(sqd_defer(m->q, deferred_action, NULL), 0);
    CHECK_EQ(ndefer, 3);
    callbacks_ok(m);
}

/* Each release posts two more WRs (ids taken from a counter at post time) until 200 were posted, on a queue
 * whose SQ is smaller than what is in flight, so callbacks post into the backlog while it is being drained. */
static uint64_t next_id;

static void post_two_from_release(struct mq *m, const struct sqd_completion *c)
{
    (void)c;
    for (int k = 0; k < 2 && next_id < 200; k++) {
        struct ibv_sge sge = {.addr = buf_of(next_id), .length = 64, .lkey = 7};
        struct ibv_send_wr wr, *bad = NULL;
        memset(&wr, 0, sizeof wr);
        wr.wr_id = next_id;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = next_id % 7 == 0 ? IBV_SEND_SIGNALED : 0;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        int rc = sqd_post_send(m->q, &wr, &bad);
        if (rc != 0) {
            cb_fail(m, "sqd_post_send from a release callback", rc);
            return;
        }
        next_id++;
    }
}

static void release_callbacks_posting_into_the_backlog_keep_order(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 4, .signal_interval = 2, .backlog_depth = 256}, 64);
    m->hook = post_two_from_release;
    next_id = 6;
    post_ok(m, sends(&ch, 0, 6, 0));
    for (int i = 0; i < 1000 && m->nlog < 200; i++) {
        complete(m, 1 + i % 3);
        poll_all(the_rig->scq);
    }
    callbacks_ok(m);
    released_in_order(m, 0, 200);
    CHECK(qstats(m).parked > 0);
    CHECK(dstats(m).max_outstanding <= 4);
    no_violations(the_rig);
}

/* A barrier set from inside a release callback covers the WRs accepted so far, including later ones in the
 * same poll; a barrier pending when the queue fails runs after the last of its WRs is released. */
static void defer_from_release(struct mq *m, const struct sqd_completion *c)
{
    if (c->wr_id == 1) {
        int rc = sqd_defer(m->q, deferred_action, NULL);
        if (rc != 0)
            cb_fail(m, "sqd_defer from a release callback", rc);
    }
}

static void deferred_actions_set_from_callbacks_and_on_failure(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 8, .signal_interval = 4, .backlog_depth = 8}, 64);
    defer_mq = m;
    ndefer = 0;
    m->hook = defer_from_release;
    post_ok(m, sends(&ch, 0, 4, 0)); /* 3 is signaled by the interval */
    complete(m, INT_MAX);
    poll_all(the_rig->scq);
    released_in_order(m, 0, 4);
    CHECK_EQ(ndefer, 1);
    CHECK_EQ(defer_seen[0], 4); /* set during release 1, ran after release 3 (the last accepted then) */
    m->hook = NULL;
    /* 8 posted, 4 parked; a barrier behind all 12; the QP fails on the first. */
    post_ok(m, sends(&ch, 4, 16, 0));
    CHECK_EQ(sqd_defer(m->q, deferred_action, NULL), 0);
    CHECK_EQ(ndefer, 1);
    CHECK_EQ(sqd_scripted_fail(m->qp, IBV_WC_LOC_PROT_ERR, 0), 0);
    poll_all(the_rig->scq);
    released_in_order(m, 0, 16);
    CHECK_EQ(ndefer, 2);
    CHECK_EQ(defer_seen[1], 16);
    CHECK_EQ(qstats(m).deferred, 0);
    callbacks_ok(m);
}

static void drain_releases_everything_and_free_waits_for_it(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 8, .signal_interval = 4, .backlog_depth = 8}, 64);
    post_ok(m, sends(&ch, 0, 11, 0)); /* 8 posted, 3 parked */
    CHECK_EQ(sqd_queue_free(m->q), -EBUSY);
    CHECK(strstr(sqd_last_error(), "not yet released") != NULL);
    CHECK_EQ(sqd_scripted_set_error(m->qp), 0); /* the ULP moves the QP to error */
    CHECK_EQ(sqd_queue_drain(m->q), -EINPROGRESS);
    CHECK(strstr(sqd_last_error(), "drain") != NULL);
    CHECK_EQ(qstats(m).closed, 1);
    struct ibv_send_wr *bad = NULL;
    CHECK_EQ(post(m, sends(&ch, 20, 21, 0), &bad), -EIO);
    CHECK(bad == &ch.wr[0]);
    int n = poll_all(the_rig->scq);
    CHECK_EQ(n, 8); /* every posted WR flushes visibly */
    for (int i = 0; i < n; i++) {
        CHECK_EQ(shown[i].wr_id, i);
        CHECK_EQ(shown[i].status, IBV_WC_WR_FLUSH_ERR);
    }
    CHECK_EQ(sqd_queue_drain(m->q), 0);
    released_in_order(m, 0, 11);
    for (int i = 0; i < 8; i++)
        CHECK_EQ(m->log[i].flags & SQD_COMPLETION_NEVER_POSTED, 0);
    for (int i = 8; i < 11; i++) {
        CHECK(m->log[i].flags & SQD_COMPLETION_NEVER_POSTED);
        CHECK_EQ(m->log[i].status, IBV_WC_WR_FLUSH_ERR);
    }
    CHECK_EQ(sqd_queue_drain(m->q), 0); /* idempotent */
    CHECK_EQ(sqd_queue_free(m->q), 0);
    m->q = NULL;
    no_violations(the_rig);
    callbacks_ok(m);
}

static void drain_of_a_healthy_queue_covers_the_unsignaled_tail_at_once(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 8}, 64);
    post_ok(m, sends(&ch, 0, 3, 0));
    CHECK_EQ(sqd_queue_drain(m->q), -EINPROGRESS);
    CHECK_EQ(qstats(m).markers, 1);
    complete(m, INT_MAX);
    CHECK_EQ(poll_all(the_rig->scq), 0);
    CHECK_EQ(sqd_queue_drain(m->q), 0);
    released_in_order(m, 0, 3);
    for (int i = 0; i < 3; i++)
        CHECK_EQ(m->log[i].status, IBV_WC_SUCCESS);
    CHECK_EQ(sqd_queue_free(m->q), 0);
    m->q = NULL;
    no_violations(the_rig);
    callbacks_ok(m);
}

static size_t count_recv_releases(struct mq *m, uint64_t *ids, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < m->nlog && i < LOG_CAP; i++)
        if (m->log[i].flags & SQD_COMPLETION_RECV) {
            if (k < cap)
                ids[k] = m->log[i].wr_id;
            k++;
        }
    return k;
}

static void receives_are_mapped_released_and_flushed(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 8, .signal_interval = 4, .rq_depth = 4}, 64);
    CHECK_EQ(post_recvs(m, 0, 4), 0);
    CHECK_EQ(post_recvs(m, 4, 5), -EAGAIN);
    CHECK_EQ(qstats(m).recv_outstanding, 4);
    post_ok(m, sends(&ch, 100, 101, IBV_SEND_SIGNALED));
    CHECK_EQ(sqd_scripted_deliver(m->qp, 77, NULL), 0);
    complete(m, 1);
    int n = poll_all(the_rig->scq);
    CHECK_EQ(n, 2);
    int saw_recv = 0, saw_send = 0;
    for (int i = 0; i < n; i++) {
        if (shown[i].opcode == IBV_WC_RECV) {
            CHECK_EQ(shown[i].wr_id, 0);
            CHECK_EQ(shown[i].status, IBV_WC_SUCCESS);
            CHECK_EQ(shown[i].byte_len, 77);
            CHECK_EQ(shown[i].wc_flags & IBV_WC_WITH_IMM, 0);
            saw_recv++;
        } else {
            CHECK_EQ(shown[i].wr_id, 100);
            CHECK_EQ(shown[i].opcode, IBV_WC_SEND);
            saw_send++;
        }
        CHECK_EQ(shown[i].qp_num, m->qp->qp_num);
    }
    CHECK(saw_recv == 1 && saw_send == 1);
    /* A freed receive credit takes a new receive; a message with immediate data. */
    CHECK_EQ(post_recvs(m, 4, 5), 0);
    uint32_t imm = 0xdeadbeef;
    CHECK_EQ(sqd_scripted_deliver(m->qp, 5, &imm), 0);
    CHECK_EQ(poll_all(the_rig->scq), 1);
    CHECK_EQ(shown[0].wr_id, 1);
    CHECK_EQ(shown[0].opcode, IBV_WC_RECV);
    CHECK(shown[0].wc_flags & IBV_WC_WITH_IMM);
    CHECK_EQ(shown[0].imm_data, 0xdeadbeef);
    /* QP error: the other receives flush, visibly and in order. */
    CHECK_EQ(sqd_scripted_set_error(m->qp), 0);
    n = poll_all(the_rig->scq);
    CHECK_EQ(n, 3);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(shown[i].wr_id, 2 + i);
        CHECK_EQ(shown[i].status, IBV_WC_WR_FLUSH_ERR);
    }
    uint64_t ids[8];
    CHECK_EQ(count_recv_releases(m, ids, 8), 5);
    for (int i = 0; i < 5; i++)
        CHECK_EQ(ids[i], i);
    for (size_t i = 0; i < m->nlog; i++)
        if (m->log[i].flags & SQD_COMPLETION_RECV) {
            CHECK_EQ(m->log[i].status, m->log[i].wr_id < 2 ? IBV_WC_SUCCESS : IBV_WC_WR_FLUSH_ERR);
            if (m->log[i].wr_id >= 2)
                CHECK_EQ(m->log[i].opcode, IBV_WC_RECV);
        }
    struct sqd_queue_stats s = qstats(m);
    CHECK_EQ(s.recv_posted, 5);
    CHECK_EQ(s.recv_cqes, 5);
    CHECK_EQ(s.recv_outstanding, 0);
    CHECK_EQ(sqd_queue_free(m->q), 0);
    m->q = NULL;
    no_violations(the_rig);
    callbacks_ok(m);
}

static void receives_on_their_own_cq(void)
{
    struct rig *r = rig_new(32);
    struct ibv_cq *rcq = NULL;
    CHECK_EQ(sqd_scripted_create_cq(r->dev, 8, &rcq), 0);
    CHECK_EQ(sqd_cq_new(rcq, &r->extra_scq[0]), 0);
    struct sqd_cq *srq = r->extra_scq[0];
    struct mq *m = add_queue_on(r, r->cq, r->scq, rcq, srq, (struct qcfg){.sq_depth = 8, .rq_depth = 8});
    /* The budget: sq_depth + 1 on the send CQ, rq_depth on the receive CQ. */
    CHECK_EQ(cqstats(r->scq).reserved, 9);
    CHECK_EQ(cqstats(srq).reserved, 8);
    CHECK_EQ(cqstats(srq).queues, 1);
    CHECK_EQ(post_recvs(m, 0, 2), 0);
    post_ok(m, sends(&ch, 50, 51, IBV_SEND_SIGNALED));
    CHECK_EQ(sqd_scripted_deliver(m->qp, 10, NULL), 0);
    complete(m, INT_MAX);
    CHECK_EQ(poll_all(r->scq), 1);
    CHECK_EQ(shown[0].wr_id, 50);
    CHECK_EQ(poll_all(srq), 1);
    CHECK_EQ(shown[0].wr_id, 0);
    CHECK_EQ(shown[0].opcode, IBV_WC_RECV);
    CHECK_EQ(sqd_scripted_set_error(m->qp), 0);
    CHECK_EQ(poll_all(srq), 1);
    CHECK_EQ(shown[0].wr_id, 1);
    CHECK_EQ(shown[0].status, IBV_WC_WR_FLUSH_ERR);
    CHECK_EQ(m->nlog, 3);
    CHECK_EQ(sqd_cq_free(srq), -EBUSY);
    CHECK_EQ(sqd_queue_free(m->q), 0);
    m->q = NULL;
    CHECK_EQ(cqstats(srq).reserved, 0);
    CHECK_EQ(cqstats(r->scq).reserved, 0);
    no_violations(r);
    callbacks_ok(m);
}

static void queues_sharing_a_cq_keep_their_completions_apart(void)
{
    struct rig *r = rig_new(64);
    struct mq *a = add_queue(r, (struct qcfg){.sq_depth = 8, .signal_interval = 4, .backlog_depth = 8});
    struct mq *b = add_queue(r, (struct qcfg){.sq_depth = 8, .signal_interval = 4, .backlog_depth = 8});
    CHECK_EQ(cqstats(r->scq).queues, 2);
    CHECK_EQ(cqstats(r->scq).reserved, 18);
    /* The same ULP wr_ids on both queues. */
    post_ok(a, sends(&ch, 0, 12, IBV_SEND_SIGNALED));
    post_ok(b, sends(&ch2, 0, 12, 0));
    CHECK_EQ(sqd_scripted_fail(b->qp, IBV_WC_REM_OP_ERR, 3), 0);
    for (int i = 0; i < 20 && (a->nlog < 12 || b->nlog < 12); i++) {
        complete(a, INT_MAX);
        int n = poll_all(r->scq);
        for (int k = 0; k < n; k++) {
            CHECK(shown[k].qp_num == a->qp->qp_num || shown[k].qp_num == b->qp->qp_num);
            if (shown[k].qp_num == a->qp->qp_num)
                CHECK_EQ(shown[k].status, IBV_WC_SUCCESS);
            else
                CHECK(shown[k].status != IBV_WC_SUCCESS);
        }
    }
    released_in_order(a, 0, 12);
    released_in_order(b, 0, 12);
    for (int i = 0; i < 12; i++)
        CHECK_EQ(a->log[i].status, IBV_WC_SUCCESS);
    CHECK_EQ(b->log[0].status, IBV_WC_REM_OP_ERR);
    CHECK_EQ(b->log[0].vendor_err, 3);
    for (int i = 1; i < 12; i++)
        CHECK_EQ(b->log[i].status, IBV_WC_WR_FLUSH_ERR);
    CHECK_EQ(qstats(a).closed, 0);
    CHECK_EQ(qstats(b).closed, 1);
    /* Queue a is unaffected by b's failure. */
    post_ok(a, sends(&ch, 12, 14, 0));
    settle(r, a);
    released_in_order(a, 0, 14);
    no_violations(r);
    callbacks_ok(a);
    callbacks_ok(b);
}

static void unmanaged_qps_completions_pass_through(void)
{
    struct rig *r = rig_new(64);
    struct mq *m = add_queue(r, (struct qcfg){.sq_depth = 8, .signal_interval = 4});
    /* A second QP on the same CQ that the ULP drives with raw verbs. */
    struct sqd_scripted_qp_caps caps = {.max_send_wr = 4, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1};
    struct ibv_qp *raw = NULL;
    CHECK_EQ(sqd_scripted_create_qp(r->dev, r->cq, r->cq, &caps, &raw), 0);
    struct ibv_sge sge = {.addr = buf_of(1), .length = 16, .lkey = 3};
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = 0xabcdef;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    CHECK_EQ(ibv_post_send(raw, &wr, &bad), 0);
    CHECK_EQ(sqd_scripted_complete(raw, 1), 1);
    post_ok(m, sends(&ch, 1, 2, IBV_SEND_SIGNALED));
    complete(m, INT_MAX);
    int n = poll_all(r->scq);
    CHECK_EQ(n, 2);
    int saw_raw = 0;
    for (int i = 0; i < n; i++)
        if (shown[i].qp_num == raw->qp_num) {
            CHECK_EQ(shown[i].wr_id, 0xabcdef);
            CHECK_EQ(shown[i].byte_len, 16);
            saw_raw = 1;
        } else {
            CHECK_EQ(shown[i].wr_id, 1);
        }
    CHECK(saw_raw);
    CHECK_EQ(cqstats(r->scq).passthrough, 1);
    CHECK_EQ(m->nlog, 1);
    callbacks_ok(m);
}

static void stats_are_consistent(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 8, .signal_interval = 4, .backlog_depth = 16, .rq_depth = 2}, 64);
    int visible = 0;
    CHECK_EQ(post_recvs(m, 0, 2), 0);
    for (uint64_t round = 0; round < 10; round++) {
        sends(&ch, round * 5, round * 5 + 5, 0);
        ch.wr[2].send_flags = IBV_SEND_SIGNALED;
        post_ok(m, &ch);
        complete(m, 4);
        visible += poll_all(the_rig->scq);
    }
    CHECK_EQ(sqd_scripted_deliver(m->qp, 1, NULL), 0);
    for (int i = 0; i < 10; i++) {
        complete(m, INT_MAX);
        visible += poll_all(the_rig->scq);
    }
    CHECK_EQ(sqd_scripted_set_error(m->qp), 0); /* flushes the last receive */
    visible += poll_all(the_rig->scq);
    struct sqd_queue_stats s = qstats(m);
    struct sqd_cq_stats c = cqstats(the_rig->scq);
    struct sqd_scripted_qp_stats d = dstats(m);
    struct sqd_scripted_cq_stats dc;
    CHECK_EQ(sqd_scripted_cq_stats(the_rig->cq, &dc), 0);
    CHECK_EQ(s.accepted, 50);
    CHECK_EQ(s.released, 50);
    CHECK_EQ(s.in_provider, 0);
    CHECK_EQ(s.credits, 8);
    CHECK_EQ(s.backlog, 0);
    CHECK_EQ(s.deferred, 0);
    CHECK_EQ(s.recv_posted, 2);
    CHECK_EQ(s.recv_cqes, 2);
    CHECK_EQ(s.recv_outstanding, 0);
    CHECK_EQ(s.stray_cqes, 0);
    CHECK_EQ(s.signaled_by_ulp, 10);
    CHECK_EQ(s.wqes, d.wqes_posted);
    CHECK_EQ(s.wqes, s.accepted + s.markers);
    CHECK_EQ(s.doorbells, d.doorbells);
    CHECK_EQ(s.signaled_by_ulp + s.signaled_by_policy + s.markers, d.signaled_wqes);
    CHECK_EQ(s.send_cqes + s.recv_cqes, d.cqes_generated);
    CHECK_EQ(m->nlog, 52); /* 50 sends and 2 receives */
    CHECK_EQ(c.capacity, 64);
    CHECK_EQ(c.reserved, 8 + 2 + 1);
    CHECK_EQ(c.queues, 1);
    CHECK_EQ(c.cqes, s.send_cqes + s.recv_cqes);
    CHECK_EQ(c.visible, visible);
    CHECK_EQ(visible, 10 + 2); /* ULP-signaled sends and receives */
    CHECK_EQ(c.hidden, c.cqes - c.visible);
    CHECK_EQ(c.passthrough, 0);
    CHECK_EQ(c.stray, 0);
    CHECK(c.polls > 0);
    CHECK_EQ(c.tail_markers, s.markers);
    CHECK_EQ(dc.queued, 0);
    CHECK_EQ(dc.overruns, 0);
    CHECK(d.max_outstanding <= 8);
    no_violations(the_rig);
    callbacks_ok(m);
}

/* SQD_QUEUE_NO_RESTORE: the WRs posted may keep the library's values, but the links, the WRs not taken (here
 * the ones beyond the SQ and the backlog: -EAGAIN) and every release are as without the flag. */
static void no_restore_keeps_links_and_releases(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 8, .signal_interval = 4, .backlog_depth = 2,
                                      .flags = SQD_QUEUE_NO_RESTORE},
                        64);
    static struct chain c;
    sends(&c, 1000, 1012, 0);
    struct ibv_send_wr *bad = NULL;
    CHECK_EQ(post(m, &c, &bad), -EAGAIN);
    CHECK(bad == &c.wr[10]);
    for (int i = 0; i < c.n; i++)
        CHECK(c.wr[i].next == (i + 1 < c.n ? &c.wr[i + 1] : NULL));
    for (int i = 10; i < 12; i++) {
        CHECK_EQ(c.wr[i].wr_id, 1000 + i);
        CHECK_EQ(c.wr[i].send_flags, 0);
    }
    int changed = 0;
    for (int i = 0; i < 8; i++)
        changed += c.wr[i].wr_id != (uint64_t)(1000 + i);
    CHECK(changed > 0); /* left as posted: the flag is in effect */
    settle(the_rig, m);
    released_in_order(m, 1000, 10);
    /* Unknown flag bits are still refused. */
    struct mq *other = rig_add_mq(the_rig);
    struct sqd_scripted_qp_caps want = {.max_send_wr = 8, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1};
    CHECK_EQ(sqd_scripted_create_qp(the_rig->dev, the_rig->cq, the_rig->cq, &want, &other->qp), 0);
    struct sqd_queue_attr attr = {.sq_depth = 8, .max_send_sge = 1, .flags = SQD_QUEUE_INDEXED << 1};
    EXPECT_ERR(sqd_queue_new(the_rig->scq, NULL, other->qp, &attr, &other->q), EINVAL, "unknown bits");
}

int main(void)
{
    run("credits_and_backlog_order", credits_and_backlog_order);
    run("no_restore_keeps_links_and_releases", no_restore_keeps_links_and_releases);
    run("eagain_names_the_first_wr_not_taken", eagain_names_the_first_wr_not_taken);
    run("signaling_is_moderated_and_bounded", signaling_is_moderated_and_bounded);
    run("signaling_one_wr_per_post", signaling_one_wr_per_post);
    run("default_signal_interval", default_signal_interval);
    run("a_lone_unsignaled_wr_is_released_without_further_posts",
        a_lone_unsignaled_wr_is_released_without_further_posts);
    run("poll_shows_what_raw_verbs_would", poll_shows_what_raw_verbs_would);
    run("opcodes_come_from_the_wr", opcodes_come_from_the_wr);
    run("an_error_in_the_middle_fails_the_queue_and_flushes_in_order",
        an_error_in_the_middle_fails_the_queue_and_flushes_in_order);
    run("backlog_of_a_failed_queue_is_released_as_never_posted",
        backlog_of_a_failed_queue_is_released_as_never_posted);
    run("a_release_callback_may_post_on_its_own_queue", a_release_callback_may_post_on_its_own_queue);
    run("deferred_actions_are_completion_barriers", deferred_actions_are_completion_barriers);
    run("release_callbacks_posting_into_the_backlog_keep_order",
        release_callbacks_posting_into_the_backlog_keep_order);
    run("deferred_actions_set_from_callbacks_and_on_failure", deferred_actions_set_from_callbacks_and_on_failure);
    run("drain_releases_everything_and_free_waits_for_it", drain_releases_everything_and_free_waits_for_it);
    run("drain_of_a_healthy_queue_covers_the_unsignaled_tail_at_once",
        drain_of_a_healthy_queue_covers_the_unsignaled_tail_at_once);
    run("receives_are_mapped_released_and_flushed", receives_are_mapped_released_and_flushed);
    run("receives_on_their_own_cq", receives_on_their_own_cq);
    run("queues_sharing_a_cq_keep_their_completions_apart", queues_sharing_a_cq_keep_their_completions_apart);
    run("unmanaged_qps_completions_pass_through", unmanaged_qps_completions_pass_through);
    run("stats_are_consistent", stats_are_consistent);
    return harness_finish("queue_api");
}
