/* Deferred invalidation, per-MR tracking with deferred deregistration and deallocation, and buffer
 * verification, through the C API on the scripted device: when the LocalInv of sqd_invalidate reaches the
 * HCA (after a CQE covers the earlier WRs, or at once with the fence), what its `done` callback gets, what
 * happens to it when the queue fails; when sqd_defer_mr actions and sqd_defer_dereg_mr deregistrations run for
 * tracked and untracked MRs; deferred deallocation failures; SQD_QUEUE_VERIFY_BUFFERS; deferred actions that
 * post and defer again; and the bad input of each of these functions.
 *
 * Mirrors tests/deferred.rs. Each scenario prints "PASS <name>" or "FAIL <name>: <why>"; a failed scenario is
 * torn down and the next one runs; the exit status is non-zero if any failed. */

#include "support/harness.h"

/* ---- WR chains ---------------------------------------------------------------------------------------------- */

#define CHAIN_CAP 16
static unsigned char data[CHAIN_CAP][64]; /* the SENDs' source buffers (never really transmitted) */

struct chain {
    struct ibv_send_wr wr[CHAIN_CAP];
    struct ibv_sge sge[CHAIN_CAP][2];
    int n;
};

static struct chain ch;

/* SENDs with wr_ids [from, to), one 64-byte SGE each with lkey 7, all with `flags`. */
static struct chain *sends(struct chain *c, uint64_t from, uint64_t to, unsigned flags)
{
    memset(c, 0, sizeof *c);
    CHECK(to - from <= CHAIN_CAP);
    c->n = (int)(to - from);
    for (int i = 0; i < c->n; i++) {
        c->sge[i][0] = (struct ibv_sge){.addr = (uintptr_t)data[i], .length = 64, .lkey = 7};
        c->wr[i].wr_id = from + (uint64_t)i;
        c->wr[i].opcode = IBV_WR_SEND;
        c->wr[i].send_flags = flags;
        c->wr[i].num_sge = 1;
        c->wr[i].sg_list = c->sge[i];
        c->wr[i].next = i + 1 < c->n ? &c->wr[i + 1] : NULL;
    }
    return c;
}

static void post_ok(struct mq *m, struct chain *c)
{
    struct ibv_send_wr *bad = NULL;
    CHECK_EQ(sqd_post_send(m->q, c->wr, &bad), 0);
    CHECK(bad == NULL);
}

/* ---- observing ----------------------------------------------------------------------------------------------- */

/* What a `done` callback of sqd_invalidate received. */
struct done_log {
    struct sqd_completion c[8];
    int n;
};

static void on_done(void *ctx, const struct sqd_completion *c)
{
    struct done_log *d = ctx;
    if (d->n < 8)
        d->c[d->n] = *c;
    d->n++;
}

/* The LocalInv WQEs the provider saw: their invalidated rkeys and send flags. Returns how many. */
static int local_invs(struct mq *m, uint32_t *rkeys, uint32_t *flags, int cap)
{
    int n = 0;
    uint64_t posted = dstats(m).wqes_posted;
    for (uint64_t i = 0; i < posted; i++) {
        struct sqd_scripted_wqe w = wqe(m, (size_t)i);
        if (w.opcode != IBV_WR_LOCAL_INV)
            continue;
        CHECK(n < cap);
        rkeys[n] = w.imm_data;
        flags[n] = w.send_flags;
        n++;
    }
    return n;
}

static int count_local_invs(struct mq *m)
{
    uint32_t k[8], f[8];
    return local_invs(m, k, f, 8);
}

/* The done log holds exactly one completion: `wr_id`, IBV_WC_LOCAL_INV, `status`, `flags`. */
static void done_once(const struct done_log *d, uint64_t wr_id, uint32_t status, uint32_t flags)
{
    CHECK_EQ(d->n, 1);
    CHECK_EQ(d->c[0].wr_id, wr_id);
    CHECK_EQ(d->c[0].opcode, IBV_WC_LOCAL_INV);
    CHECK_EQ(d->c[0].status, status);
    CHECK_EQ(d->c[0].flags, flags);
}

static struct ibv_mr *reg_mr(struct rig *r, void *addr, size_t len)
{
    struct ibv_mr *mr = NULL;
    CHECK_EQ(sqd_scripted_reg_mr(r->dev, addr, len, IBV_ACCESS_LOCAL_WRITE, &mr), 0);
    CHECK(mr != NULL);
    return mr;
}

/* ---- deferred invalidation ------------------------------------------------------------------------------- */

static void a_deferred_local_inv_waits_for_a_cqe_covering_every_earlier_wr(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 8}, 64);
    struct done_log d = {0};
    post_ok(m, sends(&ch, 0, 3, 0));
    CHECK_EQ(sqd_invalidate(m->q, 0xbeef, 77, 0, on_done, &d), 0);
    CHECK_EQ(count_local_invs(m), 0); /* not posted while the earlier WRs are not proven done */
    complete(m, INT_MAX);             /* the SENDs execute, but nothing signaled covers them yet */
    poll_all(the_rig->scq);
    CHECK_EQ(count_local_invs(m), 0);
    poll_all(the_rig->scq); /* idle tail: the library covers it with a signaled marker */
    complete(m, INT_MAX);
    CHECK_EQ(poll_all(the_rig->scq), 0);
    released_in_order(m, 0, 3);
    uint32_t rkeys[4], flags[4];
    CHECK_EQ(local_invs(m, rkeys, flags, 4), 1); /* posted right after the covering CQE */
    CHECK_EQ(rkeys[0], 0xbeef);
    CHECK(flags[0] & IBV_SEND_SIGNALED); /* signaled: its own completion reports it */
    CHECK_EQ(flags[0] & IBV_SEND_FENCE, 0);
    CHECK_EQ(d.n, 0);
    complete(m, INT_MAX);
    CHECK_EQ(poll_all(the_rig->scq), 0); /* its completion is the library's: not shown */
    done_once(&d, 77, IBV_WC_SUCCESS, 0);
    CHECK_EQ(m->nlog, 3); /* the ULP's release callback never sees the library's LocalInv */
    /* Exactly once: more cycles change nothing. */
    for (int i = 0; i < 3; i++) {
        complete(m, INT_MAX);
        CHECK_EQ(poll_all(the_rig->scq), 0);
    }
    CHECK_EQ(d.n, 1);
    CHECK_EQ(m->nlog, 3);
    CHECK_EQ(count_local_invs(m), 1);
    no_violations(the_rig);
    callbacks_ok(m);
}

static void a_fenced_local_inv_is_posted_at_once_with_the_fence(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 8}, 64);
    struct done_log d = {0};
    post_ok(m, sends(&ch, 0, 3, 0));
    CHECK_EQ(sqd_invalidate(m->q, 0x51, 5, SQD_INVALIDATE_FENCE, on_done, &d), 0);
    uint32_t rkeys[4], flags[4];
    CHECK_EQ(local_invs(m, rkeys, flags, 4), 1);
    CHECK_EQ(rkeys[0], 0x51);
    CHECK_EQ(flags[0], IBV_SEND_SIGNALED | IBV_SEND_FENCE);
    CHECK_EQ(d.n, 0);
    complete(m, INT_MAX);
    CHECK_EQ(poll_all(the_rig->scq), 0);
    released_in_order(m, 0, 3); /* its CQE also retires the WRs before it */
    done_once(&d, 5, IBV_WC_SUCCESS, 0);
    no_violations(the_rig);
}

static void an_invalidation_pending_when_the_queue_fails_is_reported_never_posted(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 8}, 64);
    struct done_log d = {0};
    post_ok(m, sends(&ch, 0, 3, 0));
    CHECK_EQ(sqd_invalidate(m->q, 0x99, 9, 0, on_done, &d), 0);
    CHECK_EQ(sqd_scripted_fail(m->qp, IBV_WC_REM_ACCESS_ERR, 0), 0);
    poll_all(the_rig->scq);
    done_once(&d, 9, IBV_WC_WR_FLUSH_ERR, SQD_COMPLETION_NEVER_POSTED);
    CHECK_EQ(count_local_invs(m), 0);
    CHECK_EQ(m->nlog, 3);
    CHECK_EQ(m->log[0].status, IBV_WC_REM_ACCESS_ERR);
    CHECK(qstats(m).closed);
}

static void a_deferred_local_inv_without_credits_is_parked_and_posted_in_order(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 4, .signal_interval = 4, .backlog_depth = 8}, 64);
    struct done_log d = {0};
    post_ok(m, sends(&ch, 0, 4, 0));
    post_ok(m, sends(&ch, 4, 6, 0)); /* parked */
    CHECK_EQ(qstats(m).backlog, 2);
    CHECK_EQ(sqd_invalidate(m->q, 0x42, 1, 0, on_done, &d), 0);
    for (int i = 0; i < 10; i++) {
        complete(m, INT_MAX);
        poll_all(the_rig->scq);
    }
    released_in_order(m, 0, 6);
    done_once(&d, 1, IBV_WC_SUCCESS, 0);
    /* The LocalInv went to the provider after all six SENDs (markers aside). */
    uint64_t posted = dstats(m).wqes_posted;
    int sends_seen = 0, inv_at = -1;
    for (uint64_t i = 0; i < posted; i++) {
        struct sqd_scripted_wqe w = wqe(m, (size_t)i);
        if (w.opcode == IBV_WR_SEND)
            sends_seen++;
        else if (w.opcode == IBV_WR_LOCAL_INV)
            inv_at = sends_seen;
    }
    CHECK_EQ(sends_seen, 6);
    CHECK_EQ(inv_at, 6);
    no_violations(the_rig);
}

/* ---- per-MR tracking, deferred deregistration and deallocation ----------------------------------------------- */

struct fired {
    const char *what[8];
    size_t released_before[8]; /* the queue's release count when it fired */
    int n;
};

static struct fired fired;

struct fire_ctx {
    const char *what;
    struct mq *m;
};

static void record_fire(void *ctx)
{
    struct fire_ctx *f = ctx;
    if (fired.n < 8) {
        fired.what[fired.n] = f->what;
        fired.released_before[fired.n] = f->m->nlog;
    }
    fired.n++;
}

static void a_tracked_mr_is_released_as_soon_as_the_wrs_using_it_are(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 2}, 64);
    struct ibv_mr *used = reg_mr(the_rig, data[0], 64), *other = reg_mr(the_rig, data[1], sizeof data - 64);
    struct ibv_mr *idle = reg_mr(the_rig, data[2], 64);
    memset(&fired, 0, sizeof fired);
    CHECK_EQ(sqd_queue_track_mr(m->q, used), 0);
    CHECK_EQ(qstats(m).tracked_mrs, 1);
    /* WR 0 uses `used`; WRs 1..5 use `other` (untracked). */
    sends(&ch, 0, 6, 0);
    ch.sge[0][0].lkey = used->lkey;
    for (int i = 1; i < 6; i++)
        ch.sge[i][0].lkey = other->lkey;
    post_ok(m, &ch);
    struct fire_ctx fu = {"used", m}, fo = {"other", m}, fi = {"idle", m};
    CHECK_EQ(sqd_defer_mr(m->q, used, record_fire, &fu), 0);
    CHECK_EQ(sqd_defer_mr(m->q, other, record_fire, &fo), 0);
    CHECK_EQ(fired.n, 0);
    complete(m, INT_MAX);
    poll_all(the_rig->scq);
    poll_all(the_rig->scq);
    complete(m, INT_MAX);
    poll_all(the_rig->scq);
    released_in_order(m, 0, 6);
    CHECK_EQ(fired.n, 2);
    /* Tracked: right after the release of its only user, before WR 1's. */
    CHECK(strcmp(fired.what[0], "used") == 0);
    CHECK_EQ(fired.released_before[0], 1);
    /* Untracked: after every WR accepted before it. */
    CHECK(strcmp(fired.what[1], "other") == 0);
    CHECK_EQ(fired.released_before[1], 6);
    /* A tracked MR no in-flight WR uses: at once. */
    CHECK_EQ(sqd_queue_track_mr(m->q, idle), 0);
    CHECK_EQ(sqd_defer_mr(m->q, idle, record_fire, &fi), 0);
    CHECK_EQ(fired.n, 3);
    CHECK(strcmp(fired.what[2], "idle") == 0);
    CHECK_EQ(sqd_queue_untrack_mr(m->q, idle), 0);
    CHECK_EQ(qstats(m).tracked_mrs, 1);
    CHECK_EQ(sqd_queue_untrack_mr(m->q, used), 0);
    CHECK_EQ(qstats(m).tracked_mrs, 0);
    no_violations(the_rig);
}

/* The device's MR count at each release, seen from inside the release callback. */
static int mr_count_at_release[16];

static void note_mr_count(struct mq *m, const struct sqd_completion *c)
{
    (void)c;
    if (m->nlog <= 16)
        mr_count_at_release[m->nlog - 1] = sqd_scripted_mr_count(the_rig->dev);
}

static void deferred_deregistration_of_a_tracked_mr_runs_once_right_after_its_last_user(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 2}, 64);
    struct ibv_mr *mr = reg_mr(the_rig, data[2], 64);
    CHECK_EQ(sqd_scripted_mr_count(the_rig->dev), 1);
    CHECK_EQ(sqd_queue_track_mr(m->q, mr), 0);
    sends(&ch, 0, 4, 0);
    ch.sge[2][0].lkey = mr->lkey; /* WR 2 uses it */
    post_ok(m, &ch);
    m->hook = note_mr_count;
    CHECK_EQ(sqd_defer_dereg_mr(m->q, mr), 0);
    CHECK_EQ(sqd_scripted_mr_count(the_rig->dev), 1); /* WR 2 may still read it */
    settle(the_rig, m);
    released_in_order(m, 0, 4);
    /* Registered during the releases of WRs 0..2; gone by WR 3's: deregistered right after WR 2's release. */
    CHECK_EQ(mr_count_at_release[0], 1);
    CHECK_EQ(mr_count_at_release[1], 1);
    CHECK_EQ(mr_count_at_release[2], 1);
    CHECK_EQ(mr_count_at_release[3], 0);
    CHECK_EQ(sqd_scripted_mr_count(the_rig->dev), 0);
    /* Exactly once: a second deregistration would have been refused by the device and counted. */
    CHECK_EQ(qstats(m).teardown_failures, 0);
    no_violations(the_rig);
}

static void deferred_deregistration_of_an_untracked_mr_waits_for_every_earlier_wr(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 2}, 64);
    struct ibv_mr *mr = reg_mr(the_rig, data[0], 64);
    sends(&ch, 0, 4, 0);
    ch.sge[0][0].lkey = mr->lkey; /* only WR 0 uses it, but the queue does not know that */
    post_ok(m, &ch);
    m->hook = note_mr_count;
    CHECK_EQ(sqd_defer_dereg_mr(m->q, mr), 0);
    settle(the_rig, m);
    released_in_order(m, 0, 4);
    for (int i = 0; i < 4; i++)
        CHECK_EQ(mr_count_at_release[i], 1);
    CHECK_EQ(sqd_scripted_mr_count(the_rig->dev), 0);
    CHECK_EQ(qstats(m).teardown_failures, 0);
    /* Nothing in flight: at once. */
    struct ibv_mr *idle = reg_mr(the_rig, data[1], 64);
    CHECK_EQ(sqd_scripted_mr_count(the_rig->dev), 1);
    CHECK_EQ(sqd_defer_dereg_mr(m->q, idle), 0);
    CHECK_EQ(sqd_scripted_mr_count(the_rig->dev), 0);
    CHECK_EQ(qstats(m).teardown_failures, 0);
}

static void a_failed_deallocation_is_counted(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 2}, 64);
    /* Memory windows whose provider has no dealloc_mw (the scripted device sets only data-path ops). */
    static struct ibv_mw mw[2];
    memset(mw, 0, sizeof mw);
    for (int i = 0; i < 2; i++) {
        mw[i].context = sqd_scripted_context(the_rig->dev);
        mw[i].pd = sqd_scripted_pd(the_rig->dev);
        mw[i].rkey = 0x700 + (uint32_t)i;
        mw[i].type = IBV_MW_TYPE_1;
    }
    CHECK_EQ(sqd_defer_dealloc_mw(m->q, &mw[0]), 0); /* nothing outstanding: runs at once */
    CHECK_EQ(qstats(m).teardown_failures, 1);
    post_ok(m, sends(&ch, 0, 2, 0));
    CHECK_EQ(sqd_defer_dealloc_mw(m->q, &mw[1]), 0); /* after the two SENDs */
    CHECK_EQ(qstats(m).teardown_failures, 1);
    CHECK_EQ(qstats(m).deferred, 1);
    settle(the_rig, m);
    CHECK_EQ(qstats(m).teardown_failures, 2);
    CHECK_EQ(qstats(m).deferred, 0);
}

/* ---- buffer verification ------------------------------------------------------------------------------------ */

static unsigned char bufs[8][100];
static unsigned char inline_src[8];

static void verification_catches_writes_into_in_flight_buffers_and_is_silent_otherwise(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 4, .backlog_depth = 4,
                                      .flags = SQD_QUEUE_VERIFY_BUFFERS},
                        64);
    for (int i = 0; i < 8; i++)
        memset(bufs[i], i, sizeof bufs[i]);
    memset(inline_src, 1, sizeof inline_src);
    /* WRs 0..5: one 100-byte SGE each; WR 6: inline; WR 7: two SGEs. */
    sends(&ch, 0, 8, 0);
    for (int i = 0; i < 6; i++)
        ch.sge[i][0] = (struct ibv_sge){.addr = (uintptr_t)bufs[i], .length = sizeof bufs[i], .lkey = 7};
    ch.sge[6][0] = (struct ibv_sge){.addr = (uintptr_t)inline_src, .length = sizeof inline_src, .lkey = 0};
    ch.wr[6].send_flags = IBV_SEND_INLINE;
    ch.sge[7][0] = (struct ibv_sge){.addr = (uintptr_t)bufs[6], .length = 50, .lkey = 7};
    ch.sge[7][1] = (struct ibv_sge){.addr = (uintptr_t)bufs[7], .length = 50, .lkey = 7};
    ch.wr[7].num_sge = 2;
    post_ok(m, &ch);
    bufs[3][50] ^= 0xff;  /* the ULP writes into WR 3's buffer while the HCA may still read it */
    bufs[7][10] ^= 0x01;  /* and into WR 7's second SGE */
    inline_src[0] = 9;    /* inline data was copied at post: changing it is fine */
    bufs[6][75] ^= 0xff;  /* outside the bytes WR 7 sends from bufs[6] (its first 50) */
    complete(m, INT_MAX);
    poll_all(the_rig->scq);
    poll_all(the_rig->scq);
    complete(m, INT_MAX);
    poll_all(the_rig->scq);
    released_in_order(m, 0, 8);
    for (size_t i = 0; i < 8; i++) {
        int flagged = (m->log[i].flags & SQD_COMPLETION_BUFFER_MODIFIED) != 0;
        CHECK_EQ(flagged, i == 3 || i == 7);
        CHECK_EQ(m->log[i].status, IBV_WC_SUCCESS);
        CHECK_EQ(m->log[i].opcode, IBV_WC_SEND);
    }
    CHECK_EQ(m->log[3].modified_sge, 0);
    CHECK_EQ(m->log[7].modified_sge, 1);
    CHECK_EQ(qstats(m).verify_mismatches, 2);
    callbacks_ok(m);
}

static void without_verification_nothing_is_checked(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 4}, 64);
    memset(bufs[0], 0, sizeof bufs[0]);
    sends(&ch, 0, 1, 0);
    ch.sge[0][0] = (struct ibv_sge){.addr = (uintptr_t)bufs[0], .length = sizeof bufs[0], .lkey = 7};
    post_ok(m, &ch);
    bufs[0][0] = 1;
    settle(the_rig, m);
    released_in_order(m, 0, 1);
    CHECK_EQ(m->log[0].flags & SQD_COMPLETION_BUFFER_MODIFIED, 0);
    CHECK_EQ(qstats(m).verify_mismatches, 0);
}

/* ---- a deferred action that posts and defers again ---------------------------------------------------------- */

static struct {
    struct mq *m;
    const char *seen[4];
    int n;
} chained;

static struct chain ch_cb; /* the chain the deferred action posts */

static void second_action(void *ctx)
{
    (void)ctx;
    if (chained.n < 4)
        chained.seen[chained.n] = "second";
    chained.n++;
}

static void first_action(void *ctx)
{
    (void)ctx;
    struct mq *m = chained.m;
    if (chained.n < 4)
        chained.seen[chained.n] = "first";
    chained.n++;
    struct ibv_send_wr *bad = NULL;
    sends(&ch_cb, 10, 11, IBV_SEND_SIGNALED);
    int rc = sqd_post_send(m->q, ch_cb.wr, &bad);
    if (rc != 0)
        cb_fail(m, "sqd_post_send from a deferred action", rc);
    rc = sqd_defer(m->q, second_action, NULL);
    if (rc != 0)
        cb_fail(m, "sqd_defer from a deferred action", rc);
}

static void a_deferred_action_may_post_and_defer_again(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 4}, 64);
    memset(&chained, 0, sizeof chained);
    chained.m = m;
    post_ok(m, sends(&ch, 0, 2, IBV_SEND_SIGNALED));
    CHECK_EQ(sqd_defer(m->q, first_action, NULL), 0);
    CHECK_EQ(chained.n, 0);
    complete(m, INT_MAX);
    poll_all(the_rig->scq);
    callbacks_ok(m);
    CHECK_EQ(chained.n, 1);
    CHECK(strcmp(chained.seen[0], "first") == 0);
    CHECK_EQ(m->nlog, 2); /* WR 10, posted by the action, is not released yet */
    complete(m, INT_MAX);
    poll_all(the_rig->scq);
    CHECK_EQ(chained.n, 2);
    CHECK(strcmp(chained.seen[1], "second") == 0);
    CHECK_EQ(m->nlog, 3);
    CHECK_EQ(m->log[0].wr_id, 0);
    CHECK_EQ(m->log[1].wr_id, 1);
    CHECK_EQ(m->log[2].wr_id, 10);
    callbacks_ok(m);
}

/* ---- bad input ---------------------------------------------------------------------------------------------- */

static void noop_action(void *ctx) { (void)ctx; }

static void bad_input_of_the_deferred_functions(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 8, .signal_interval = 4}, 64);
    struct ibv_mr *mr = reg_mr(the_rig, data[0], 64), *other = reg_mr(the_rig, data[1], 64);
    struct done_log d = {0};

    EXPECT_ERR(sqd_invalidate(NULL, 1, 1, 0, on_done, &d), EINVAL, "q is NULL");
    EXPECT_ERR(sqd_invalidate(m->q, 1, 1, 1u << 1, on_done, &d), EINVAL, "flags");
    EXPECT_ERR(sqd_invalidate(m->q, 1, 1, 0x80000000u | SQD_INVALIDATE_FENCE, on_done, &d), EINVAL, "flags");
    CHECK_EQ(count_local_invs(m), 0);

    EXPECT_ERR(sqd_queue_track_mr(NULL, mr), EINVAL, "q is NULL");
    EXPECT_ERR(sqd_queue_track_mr(m->q, NULL), EINVAL, "mr is NULL");
    CHECK_EQ(sqd_queue_track_mr(m->q, mr), 0);
    EXPECT_ERR(sqd_queue_track_mr(m->q, mr), EEXIST, "already tracked");
    CHECK_EQ(qstats(m).tracked_mrs, 1);

    EXPECT_ERR(sqd_queue_untrack_mr(NULL, mr), EINVAL, "q is NULL");
    EXPECT_ERR(sqd_queue_untrack_mr(m->q, NULL), EINVAL, "mr is NULL");
    EXPECT_ERR(sqd_queue_untrack_mr(m->q, other), ENOENT, "not tracked");
    CHECK_EQ(sqd_queue_untrack_mr(m->q, mr), 0);
    EXPECT_ERR(sqd_queue_untrack_mr(m->q, mr), ENOENT, "not tracked");

    EXPECT_ERR(sqd_defer_mr(NULL, mr, noop_action, NULL), EINVAL, "q is NULL");
    EXPECT_ERR(sqd_defer_mr(m->q, NULL, noop_action, NULL), EINVAL, "mr is NULL");
    EXPECT_ERR(sqd_defer_mr(m->q, mr, NULL, NULL), EINVAL, "fn is NULL");

    EXPECT_ERR(sqd_defer_dereg_mr(NULL, mr), EINVAL, "q is NULL");
    EXPECT_ERR(sqd_defer_dereg_mr(m->q, NULL), EINVAL, "mr is NULL");
    CHECK_EQ(sqd_scripted_mr_count(the_rig->dev), 2); /* refused calls took nothing over */

    EXPECT_ERR(sqd_defer_dealloc_mw(NULL, NULL), EINVAL, "q is NULL");
    EXPECT_ERR(sqd_defer_dealloc_mw(m->q, NULL), EINVAL, "mw is NULL");

    struct sqd_queue_stats s = qstats(m);
    CHECK_EQ(s.deferred, 0);
    CHECK_EQ(s.teardown_failures, 0);
    CHECK_EQ(s.accepted, 0);
    CHECK_EQ(d.n, 0);
}

static void queue_new_refuses_unknown_attr_flags(void)
{
    struct rig *r = rig_new(64);
    struct mq *m = rig_add_mq(r);
    struct sqd_scripted_qp_caps caps = {
        .max_send_wr = 8, .max_recv_wr = 1, .max_send_sge = 4, .max_recv_sge = 4, .max_inline_data = 64};
    CHECK_EQ(sqd_scripted_create_qp(r->dev, r->cq, r->cq, &caps, &m->qp), 0);
    struct sqd_queue_attr attr = {.sq_depth = 8, .max_send_sge = 4, .max_inline_data = 64, .signal_interval = 4,
                                  .release = on_release, .release_ctx = m, .flags = 1u << 5};
    struct sqd_queue *q = NULL;
    EXPECT_ERR(sqd_queue_new(r->scq, NULL, m->qp, &attr, &q), EINVAL, "flags");
    CHECK(q == NULL);
    attr.flags = SQD_QUEUE_VERIFY_BUFFERS | (1u << 31);
    EXPECT_ERR(sqd_queue_new(r->scq, NULL, m->qp, &attr, &q), EINVAL, "flags");
    CHECK(q == NULL);
    CHECK_EQ(cqstats(r->scq).queues, 0);
    attr.flags = SQD_QUEUE_VERIFY_BUFFERS; /* the known flag is taken */
    CHECK_EQ(sqd_queue_new(r->scq, NULL, m->qp, &attr, &m->q), 0);
}

static void invalidate_on_a_failed_queue_is_refused(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 8, .signal_interval = 4}, 64);
    struct done_log d = {0};
    post_ok(m, sends(&ch, 0, 1, 0));
    CHECK_EQ(sqd_scripted_fail(m->qp, IBV_WC_RETRY_EXC_ERR, 0), 0);
    poll_all(the_rig->scq);
    CHECK_EQ(m->nlog, 1);
    EXPECT_ERR(sqd_invalidate(m->q, 0x10, 3, 0, on_done, &d), EIO, "failed");
    EXPECT_ERR(sqd_invalidate(m->q, 0x10, 3, SQD_INVALIDATE_FENCE, on_done, &d), EIO, "failed");
    CHECK_EQ(d.n, 0); /* a refused invalidation reports nothing */
    CHECK_EQ(count_local_invs(m), 0);
    /* A draining queue refuses too. */
    struct mq *m2 = add_queue(the_rig, (struct qcfg){.sq_depth = 8, .signal_interval = 4});
    CHECK_EQ(sqd_queue_drain(m2->q), 0);
    EXPECT_ERR(sqd_invalidate(m2->q, 0x10, 3, 0, on_done, &d), EIO, "draining");
    CHECK_EQ(d.n, 0);
}

/* [WRITE(B), WRITE(B), READ(B), WRITE(A)] with READs refused by the provider: the post fails at the READ with
 * 2 WRs accepted. MR A (tracked before the post) is used by no WR the provider took, so sqd_defer_mr on it runs
 * at once, and so does sqd_defer_dereg_mr (the deregistration, ownership passed). */
static void a_tracked_mr_named_only_by_refused_wrs_is_released_at_once(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 4, .backlog_depth = 8}, 64);
    struct ibv_mr *a = reg_mr(the_rig, data[3], 64), *b = reg_mr(the_rig, data[0], 3 * 64);
    memset(&fired, 0, sizeof fired);
    CHECK_EQ(sqd_queue_track_mr(m->q, a), 0);
    CHECK_EQ(sqd_scripted_refuse_opcode(m->qp, IBV_WR_RDMA_READ, EINVAL), 0);
    sends(&ch, 0, 4, 0);
    for (int i = 0; i < 4; i++) {
        ch.wr[i].opcode = i == 2 ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
        ch.sge[i][0].lkey = i == 3 ? a->lkey : b->lkey;
    }
    struct ibv_send_wr *bad = NULL;
    CHECK_EQ(sqd_post_send(m->q, ch.wr, &bad), -EINVAL);
    CHECK(bad == &ch.wr[2]);
    CHECK_EQ(qstats(m).accepted, 2);
    static struct fire_ctx fa; /* static: on a failure the action may still run at teardown */
    fa = (struct fire_ctx){"a", m};
    CHECK_EQ(sqd_defer_mr(m->q, a, record_fire, &fa), 0);
    CHECK_EQ(fired.n, 1); /* at once: no WR the provider took uses it */
    int mrs = sqd_scripted_mr_count(the_rig->dev);
    CHECK_EQ(sqd_defer_dereg_mr(m->q, a), 0);
    CHECK_EQ(sqd_scripted_mr_count(the_rig->dev), mrs - 1);
    CHECK_EQ(qstats(m).tracked_mrs, 0);
    settle(the_rig, m);
    released_in_order(m, 0, 2);
    CHECK_EQ(sqd_scripted_dereg_mr(b), 0);
}

/* SQ depth 4, backlog 2, every WR signaled: SENDs 0..3 fill the SQ; READ 4 (refused by the provider) and SEND 5
 * are parked; WR 0's completion frees a slot and the pump stops at the refused READ. With one SQ slot free and
 * the backlog full, a fenced sqd_invalidate can be neither posted (it would overtake READ 4 and SEND 5) nor
 * parked: -EAGAIN, and nothing is recorded. With room in the backlog it is parked behind them and reports once,
 * after all six. */
static void a_fenced_local_inv_behind_a_full_backlog_is_refused_with_eagain(void)
{
    for (uint32_t backlog = 2; backlog <= 3; backlog++) {
        struct mq *m = rig1((struct qcfg){.sq_depth = 4, .signal_interval = 1, .backlog_depth = backlog}, 64);
        struct done_log d = {0};
        post_ok(m, sends(&ch, 0, 4, 0));
        CHECK_EQ(sqd_scripted_refuse_opcode(m->qp, IBV_WR_RDMA_READ, EINVAL), 0);
        sends(&ch, 4, 6, 0);
        ch.wr[0].opcode = IBV_WR_RDMA_READ;
        post_ok(m, &ch);
        complete(m, 1);
        poll_all(the_rig->scq);
        struct sqd_queue_stats s = qstats(m);
        CHECK_EQ(s.released, 1);
        CHECK_EQ(s.credits, 1);
        CHECK_EQ(s.backlog, 2);
        if (backlog == 2) {
            EXPECT_ERR(sqd_invalidate(m->q, 0x77, 9, SQD_INVALIDATE_FENCE, on_done, &d), EAGAIN, "backlog");
            CHECK_EQ(qstats(m).accepted, 6);
        } else {
            CHECK_EQ(sqd_invalidate(m->q, 0x77, 9, SQD_INVALIDATE_FENCE, on_done, &d), 0);
            CHECK_EQ(qstats(m).accepted, 7);
            CHECK_EQ(qstats(m).backlog, 3);
            CHECK_EQ(count_local_invs(m), 0);
        }
        for (int i = 0; i < 6; i++) {
            complete(m, INT_MAX);
            poll_all(the_rig->scq);
        }
        released_in_order(m, 0, 6);
        if (backlog == 2) {
            CHECK_EQ(d.n, 0);
            CHECK_EQ(count_local_invs(m), 0);
        } else {
            done_once(&d, 9, IBV_WC_SUCCESS, 0);
            CHECK_EQ(count_local_invs(m), 1);
        }
        rig_teardown(the_rig);
        the_rig = NULL;
    }
}

int main(void)
{
    run("a_deferred_local_inv_waits_for_a_cqe_covering_every_earlier_wr",
        a_deferred_local_inv_waits_for_a_cqe_covering_every_earlier_wr);
    run("a_fenced_local_inv_is_posted_at_once_with_the_fence", a_fenced_local_inv_is_posted_at_once_with_the_fence);
    run("an_invalidation_pending_when_the_queue_fails_is_reported_never_posted",
        an_invalidation_pending_when_the_queue_fails_is_reported_never_posted);
    run("a_deferred_local_inv_without_credits_is_parked_and_posted_in_order",
        a_deferred_local_inv_without_credits_is_parked_and_posted_in_order);
    run("a_tracked_mr_is_released_as_soon_as_the_wrs_using_it_are",
        a_tracked_mr_is_released_as_soon_as_the_wrs_using_it_are);
    run("deferred_deregistration_of_a_tracked_mr_runs_once_right_after_its_last_user",
        deferred_deregistration_of_a_tracked_mr_runs_once_right_after_its_last_user);
    run("deferred_deregistration_of_an_untracked_mr_waits_for_every_earlier_wr",
        deferred_deregistration_of_an_untracked_mr_waits_for_every_earlier_wr);
    run("a_failed_deallocation_is_counted", a_failed_deallocation_is_counted);
    run("verification_catches_writes_into_in_flight_buffers_and_is_silent_otherwise",
        verification_catches_writes_into_in_flight_buffers_and_is_silent_otherwise);
    run("without_verification_nothing_is_checked", without_verification_nothing_is_checked);
    run("a_deferred_action_may_post_and_defer_again", a_deferred_action_may_post_and_defer_again);
    run("bad_input_of_the_deferred_functions", bad_input_of_the_deferred_functions);
    run("queue_new_refuses_unknown_attr_flags", queue_new_refuses_unknown_attr_flags);
    run("invalidate_on_a_failed_queue_is_refused", invalidate_on_a_failed_queue_is_refused);
    run("a_tracked_mr_named_only_by_refused_wrs_is_released_at_once",
        a_tracked_mr_named_only_by_refused_wrs_is_released_at_once);
    run("a_fenced_local_inv_behind_a_full_backlog_is_refused_with_eagain",
        a_fenced_local_inv_behind_a_full_backlog_is_refused_with_eagain);
    return harness_finish("deferred_api");
}
