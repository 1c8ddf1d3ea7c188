/* Batched releases through the C API (sqd_queue_set_release_batch, sqd_queue_set_release_failures): a batch
 * callback and the per-WR release callback together release every WR exactly once and in post order;
 * successes come in batches, each saying where it starts (`first`), or with sqd_queue_set_release_failures
 * make no call and only count; what a batch cannot carry (WRs released as never posted) comes through the
 * per-WR callback; on a queue with SQD_QUEUE_INDEXED both carry indexes instead of wr_ids; bad calls fail with a
 * clear errno and message.
 *
 * Each scenario prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is non-zero if any failed. */

#include "support/harness.h"

#define WRS 24

static unsigned char buf[64];

/* Every release either callback saw, in order: wr_id, status, and whether it came in a batch. */
static struct seen {
    uint64_t wr_id;
    uint32_t status;
    int batched;
} seen[256];
static size_t nseen, batches;
static char batch_error[160];
static int indexed; /* the queue under test has SQD_QUEUE_INDEXED */

static void on_batch(void *ctx, const struct sqd_release_batch *b)
{
    struct mq *m = ctx;
    struct sqd_queue_stats s;
    if (b->count == 0 && !batch_error[0])
        snprintf(batch_error, sizeof batch_error, "an empty batch");
    /* Releases come once each in post order: a batch starts at the count of releases before it. */
    if (b->first != nseen && !batch_error[0])
        snprintf(batch_error, sizeof batch_error, "a batch from index %llu after %zu releases", (unsigned long long)b->first, nseen);
    if ((b->wr_ids == NULL) != indexed && !batch_error[0])
        snprintf(batch_error, sizeof batch_error, "wr_ids %s on a queue %s SQD_QUEUE_INDEXED", b->wr_ids ? "set" : "NULL",
                 indexed ? "with" : "without");
    /* Inside the call, the whole batch counts as released. */
    if (sqd_queue_stats(m->q, &s) == 0 && s.released != nseen + b->count && !batch_error[0])
        snprintf(batch_error, sizeof batch_error, "stats.released %llu inside a batch of %u after %zu releases",
                 (unsigned long long)s.released, b->count, nseen);
    for (uint32_t i = 0; i < b->count && nseen < 256; i++)
        seen[nseen++] = (struct seen){b->wr_ids ? b->wr_ids[i] : b->first + i, b->status, 1};
    batches++;
}

/* A failures-only batch: never a success, and each one's first WR the next index after what was released. */
static void on_batch_failures(void *ctx, const struct sqd_release_batch *b)
{
    struct mq *m = ctx;
    struct sqd_queue_stats s;
    if (b->status == IBV_WC_SUCCESS && !batch_error[0])
        snprintf(batch_error, sizeof batch_error, "a batch of %u successes", b->count);
    if (sqd_queue_stats(m->q, &s) == 0 && s.released != b->first + b->count && !batch_error[0])
        snprintf(batch_error, sizeof batch_error, "stats.released %llu inside a batch of %u from index %llu",
                 (unsigned long long)s.released, b->count, (unsigned long long)b->first);
    for (uint32_t i = 0; i < b->count && nseen < 256; i++)
        seen[nseen++] = (struct seen){b->wr_ids[i], b->status, 1};
    batches++;
}

/* The per-WR callback's releases go to the same list (after the rig's own log). */
static void per_wr_hook(struct mq *m, const struct sqd_completion *c)
{
    (void)m;
    if (nseen < 256)
        seen[nseen++] = (struct seen){c->wr_id, c->status, 0};
}

static void post_sends(struct mq *m, uint64_t first, int n)
{
    struct ibv_sge sge[WRS];
    struct ibv_send_wr wr[WRS], *bad = NULL;
    CHECK(n > 0 && n <= WRS);
    for (int i = 0; i < n; i++) {
        sge[i] = (struct ibv_sge){.addr = (uintptr_t)buf, .length = sizeof buf, .lkey = 1};
        wr[i] = (struct ibv_send_wr){.wr_id = first + (uint64_t)i, .next = i + 1 < n ? &wr[i + 1] : NULL,
                                     .sg_list = &sge[i], .num_sge = 1, .opcode = IBV_WR_SEND};
    }
    CHECK_EQ(sqd_post_send(m->q, wr, &bad), 0);
    CHECK(bad == NULL);
}

static struct mq *batched_queue(struct qcfg cfg)
{
    nseen = batches = 0;
    batch_error[0] = 0;
    indexed = (cfg.flags & SQD_QUEUE_INDEXED) != 0;
    struct mq *m = rig1(cfg, 256);
    m->hook = per_wr_hook;
    CHECK_EQ(sqd_queue_set_release_batch(m->q, on_batch, m), 0);
    return m;
}

static void successes_come_in_batches(void)
{
    struct mq *m = batched_queue((struct qcfg){.sq_depth = 16, .signal_interval = 8});
    size_t bytes_with = qstats(m).bytes;
    post_sends(m, 0, 16);
    complete(m, INT_MAX);
    poll_all(the_rig->scq);
    CHECK(!batch_error[0]);
    CHECK_EQ(nseen, 16);
    for (size_t i = 0; i < 16; i++) {
        CHECK_EQ(seen[i].wr_id, i);
        CHECK_EQ(seen[i].status, IBV_WC_SUCCESS);
        CHECK(seen[i].batched);
    }
    CHECK_EQ(batches, 2); /* one per signaled CQE: WRs 0..7 and 8..15 */
    CHECK_EQ(m->nlog, 0);
    CHECK_EQ(qstats(m).released, 16);
    CHECK(bytes_with > 0);
    no_violations(the_rig);
}

/* Settles the queue; both callbacks together saw `n` releases, of wr_ids (or indexes) 0 to n - 1 in order. */
static void settle_in_order(struct mq *m, size_t n)
{
    settle(the_rig, m);
    CHECK(!batch_error[0]);
    callbacks_ok(m);
    CHECK_EQ(nseen, n);
    for (size_t i = 0; i < n; i++)
        CHECK_EQ(seen[i].wr_id, i);
}

static void a_failure_keeps_order_across_both_callbacks(void)
{
    struct mq *m = batched_queue((struct qcfg){.sq_depth = 8, .signal_interval = 4, .backlog_depth = 8});
    post_sends(m, 0, 12); /* 0..7 posted, 8..11 parked */
    CHECK_EQ(complete(m, 2), 2);
    CHECK_EQ(sqd_scripted_fail(m->qp, IBV_WC_REM_ACCESS_ERR, 7), 0); /* WR 2 fails, 3..7 are flushed */
    settle_in_order(m, 12);
    CHECK_EQ(seen[0].status, IBV_WC_SUCCESS);
    CHECK_EQ(seen[1].status, IBV_WC_SUCCESS);
    CHECK_EQ(seen[2].status, IBV_WC_REM_ACCESS_ERR);
    CHECK(seen[2].batched);
    for (size_t i = 3; i < 12; i++)
        CHECK_EQ(seen[i].status, IBV_WC_WR_FLUSH_ERR);
    /* The parked WRs were never posted: that needs the per-WR completion's flag, so they come one by one. */
    for (size_t i = 8; i < 12; i++) {
        CHECK(!seen[i].batched);
        CHECK(m->log[i - 8].flags & SQD_COMPLETION_NEVER_POSTED);
    }
}

/* The same failure on an indexed queue, with every WR's wr_id the same: each release and batch carries the
 * WR's index, the error completion poll shows carries the failing WR's, and no batch array is allocated. */
static void an_indexed_queue_releases_indexes(void)
{
    struct mq *m = batched_queue((struct qcfg){.sq_depth = 8, .signal_interval = 4, .backlog_depth = 8, .flags = SQD_QUEUE_INDEXED});
    post_sends(m, 0, 1); /* index 0 */
    settle(the_rig, m);
    struct ibv_sge sge[12];
    struct ibv_send_wr wr[12], *bad = NULL;
    for (int i = 0; i < 12; i++) {
        sge[i] = (struct ibv_sge){.addr = (uintptr_t)buf, .length = sizeof buf, .lkey = 1};
        wr[i] = (struct ibv_send_wr){.wr_id = 0xdead, .next = i + 1 < 12 ? &wr[i + 1] : NULL, .sg_list = &sge[i],
                                     .num_sge = 1, .opcode = IBV_WR_SEND};
    }
    CHECK_EQ(sqd_post_send(m->q, wr, &bad), 0); /* indexes 1..8 posted, 9..12 parked */
    CHECK_EQ(complete(m, 2), 2);
    CHECK_EQ(sqd_scripted_fail(m->qp, IBV_WC_REM_ACCESS_ERR, 7), 0); /* index 3 fails, 4..8 are flushed */
    struct ibv_wc wc[16];
    int n = sqd_cq_poll(the_rig->scq, 16, wc);
    CHECK(n > 0);
    CHECK_EQ(wc[0].wr_id, 3);
    CHECK_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
    settle_in_order(m, 13);
    CHECK_EQ(seen[3].status, IBV_WC_REM_ACCESS_ERR);
    /* The parked WRs come one by one, with their indexes too. */
    CHECK(m->nlog >= 4);
    for (size_t k = 0; k < 4; k++) {
        CHECK(!seen[9 + k].batched);
        CHECK_EQ(m->log[m->nlog - 4 + k].wr_id, 9 + k);
        CHECK(m->log[m->nlog - 4 + k].flags & SQD_COMPLETION_NEVER_POSTED);
    }
    /* The batch array: none on an indexed queue. */
    struct mq *plain = add_queue(the_rig, (struct qcfg){.sq_depth = 8, .flags = SQD_QUEUE_INDEXED});
    size_t before = qstats(plain).bytes;
    CHECK_EQ(sqd_queue_set_release_batch(plain->q, on_batch, plain), 0);
    CHECK_EQ(qstats(plain).bytes, before);
}

/* With sqd_queue_set_release_failures: the successes make no call, yet count as released; the failure and the
 * flushes behind it come in batches, the parked WRs through the per-WR callback, in post order. */
static void only_failures_make_a_call(void)
{
    nseen = batches = 0;
    batch_error[0] = 0;
    indexed = 0;
    struct mq *m = rig1((struct qcfg){.sq_depth = 8, .signal_interval = 4, .backlog_depth = 8}, 256);
    m->hook = per_wr_hook;
    CHECK_EQ(sqd_queue_set_release_failures(m->q, on_batch_failures, m), 0);
    EXPECT_ERR(sqd_queue_set_release_batch(m->q, on_batch, m), EBUSY, "already set");
    post_sends(m, 0, 8);
    complete(m, INT_MAX);
    poll_all(the_rig->scq);
    CHECK_EQ(batches, 0);
    CHECK_EQ(nseen, 0);
    CHECK_EQ(qstats(m).released, 8);
    post_sends(m, 8, 12); /* 8..15 posted, 16..19 parked */
    CHECK_EQ(complete(m, 2), 2);
    CHECK_EQ(sqd_scripted_fail(m->qp, IBV_WC_REM_ACCESS_ERR, 7), 0); /* WR 10 fails, 11..15 are flushed */
    settle(the_rig, m);
    CHECK(!batch_error[0]);
    callbacks_ok(m);
    CHECK_EQ(qstats(m).released, 20);
    CHECK_EQ(nseen, 10); /* 10..19: the successes 8 and 9 made no call */
    for (size_t i = 0; i < nseen; i++) {
        CHECK_EQ(seen[i].wr_id, 10 + i);
        CHECK_EQ(seen[i].status, i == 0 ? IBV_WC_REM_ACCESS_ERR : IBV_WC_WR_FLUSH_ERR);
        CHECK_EQ(seen[i].batched, i < 6);
    }
}

static void noop_batch(void *ctx, const struct sqd_release_batch *b)
{
    (void)ctx;
    (void)b;
}

static struct mq *inner_q;
static int inner_rc = 1;

static void set_from_inside(void *ctx)
{
    (void)ctx;
    inner_rc = sqd_queue_set_release_batch(inner_q->q, noop_batch, NULL);
}

static void bad_calls_fail_clearly(void)
{
    struct rig *r = rig_new(64);
    EXPECT_ERR(sqd_queue_set_release_batch(NULL, noop_batch, NULL), EINVAL, "q is NULL");
    /* A queue without a per-WR release callback. */
    struct mq *bare = rig_add_mq(r);
    struct sqd_scripted_qp_caps want = {.max_send_wr = 8, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1};
    CHECK_EQ(sqd_scripted_create_qp(r->dev, r->cq, r->cq, &want, &bare->qp), 0);
    struct sqd_queue_attr attr = {.sq_depth = 8, .max_send_sge = 1};
    CHECK_EQ(sqd_queue_new(r->scq, NULL, bare->qp, &attr, &bare->q), 0);
    EXPECT_ERR(sqd_queue_set_release_batch(bare->q, noop_batch, NULL), EINVAL, "no release handler");
    EXPECT_ERR(sqd_queue_set_release_failures(bare->q, noop_batch, NULL), EINVAL, "no release handler");
    EXPECT_ERR(sqd_queue_set_release_failures(NULL, noop_batch, NULL), EINVAL, "q is NULL");
    struct mq *m = add_queue(r, (struct qcfg){.sq_depth = 8, .signal_interval = 4});
    EXPECT_ERR(sqd_queue_set_release_batch(m->q, NULL, NULL), EINVAL, "fn is NULL");
    size_t before = qstats(m).bytes;
    CHECK_EQ(sqd_queue_set_release_batch(m->q, noop_batch, NULL), 0);
    CHECK_EQ(qstats(m).bytes, before + 8 * 8); /* 8 bytes per SQ slot */
    EXPECT_ERR(sqd_queue_set_release_batch(m->q, noop_batch, NULL), EBUSY, "already set");
    /* From the queue's own deferred action, which runs inside its release pass. */
    inner_q = add_queue(r, (struct qcfg){.sq_depth = 8, .signal_interval = 4});
    CHECK_EQ(sqd_defer(inner_q->q, set_from_inside, NULL), 0);
    CHECK_EQ(inner_rc, -EBUSY);
}

int main(void)
{
    run("successes come in batches", successes_come_in_batches);
    run("a failure keeps order across both callbacks", a_failure_keeps_order_across_both_callbacks);
    run("an indexed queue releases indexes", an_indexed_queue_releases_indexes);
    run("only failures make a call", only_failures_make_a_call);
    run("bad calls fail clearly", bad_calls_fail_clearly);
    return harness_finish("release_batch");
}
