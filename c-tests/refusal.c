/* A provider that refuses a send WR at post time (sqd_scripted_refuse_opcode), through the C API: the exact
 * bad_wr and the rollback of a post the provider stops partway, the WRs accepted before the refused one released
 * without further posts, a backlogged WR the provider refuses when the library posts it (its release, the stats,
 * sqd_queue_last_refusal, the WRs behind it), a deferred LocalInv the provider refuses, the WRs sqd_post_send
 * refuses itself because providers would, and sqd_queue_drain while its marker is still with the provider.
 *
 * Mirrors tests/refusal.rs. Each scenario prints "PASS <name>" or "FAIL <name>: <why>". */

#include "support/harness.h"

#define CHAIN_CAP 16
static unsigned char data[CHAIN_CAP * 64];

struct chain {
    struct ibv_send_wr wr[CHAIN_CAP];
    struct ibv_sge sge[CHAIN_CAP];
    int n;
};

static struct chain ch;

/* Appends a WR of `op` with one SGE of `len` bytes (none when `len` is 0). */
static void add(struct chain *c, uint64_t id, enum ibv_wr_opcode op, unsigned flags, uint32_t len)
{
    CHECK(c->n < CHAIN_CAP);
    struct ibv_send_wr *w = &c->wr[c->n];
    memset(w, 0, sizeof *w);
    c->sge[c->n] = (struct ibv_sge){.addr = (uintptr_t)&data[c->n * 64], .length = len, .lkey = 7};
    w->wr_id = id;
    w->opcode = op;
    w->send_flags = flags;
    w->num_sge = len ? 1 : 0;
    w->sg_list = len ? &c->sge[c->n] : NULL;
    if (c->n > 0)
        c->wr[c->n - 1].next = w;
    c->n++;
}

/* SENDs [from, to), the WR `read` an RDMA READ (the opcode the scenarios make the provider refuse). */
static struct chain *sends_with_read(uint64_t from, uint64_t to, uint64_t read, unsigned flags)
{
    ch.n = 0;
    for (uint64_t id = from; id < to; id++)
        add(&ch, id, id == read ? IBV_WR_RDMA_READ : IBV_WR_SEND, flags, 64);
    return &ch;
}

/* Completes and polls until `want` releases are logged; fails as soon as 8 rounds in a row release nothing. */
static void drive(struct rig *r, struct mq *m, size_t want)
{
    int idle = 0;
    while (m->nlog < want) {
        size_t before = m->nlog;
        complete(m, INT_MAX);
        poll_all(r->scq);
        idle = m->nlog == before ? idle + 1 : 0;
        if (idle == 8) {
            struct sqd_queue_stats s = qstats(m);
            fail_now("no release in 8 rounds of complete + poll: %zu of %zu released; backlog %u, in_provider %u, "
                     "credits %u, closed %u",
                     m->nlog, want, s.backlog, s.in_provider, s.credits, s.closed);
        }
    }
}

static void a_backlogged_wr_the_provider_refuses_is_released_refused_and_the_rest_flow(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 4, .signal_interval = 2, .backlog_depth = 16}, 64);
    struct ibv_send_wr *bad = NULL;
    CHECK_EQ(sqd_post_send(m->q, sends_with_read(0, 4, 99, 0)->wr, &bad), 0);
    CHECK_EQ(sqd_scripted_refuse_opcode(m->qp, IBV_WR_RDMA_READ, EINVAL), 0);
    CHECK_EQ(sqd_post_send(m->q, sends_with_read(4, 10, 6, 0)->wr, &bad), 0); /* parked: the SQ is full */
    CHECK(bad == NULL);
    CHECK_EQ(qstats(m).backlog, 6);
    drive(the_rig, m, 10);
    released_in_order(m, 0, 10);
    for (int i = 0; i < 10; i++) {
        const struct sqd_completion *c = &m->log[i];
        if (i == 6) {
            CHECK_EQ(c->status, IBV_WC_LOC_QP_OP_ERR);
            CHECK_EQ(c->flags, SQD_COMPLETION_REFUSED | SQD_COMPLETION_NEVER_POSTED);
            CHECK_EQ(c->vendor_err, EINVAL);
            CHECK_EQ(c->opcode, IBV_WC_RDMA_READ);
        } else {
            CHECK_EQ(c->status, IBV_WC_SUCCESS);
            CHECK_EQ(c->flags & (SQD_COMPLETION_REFUSED | SQD_COMPLETION_NEVER_POSTED), 0);
        }
    }
    struct sqd_queue_stats s = qstats(m);
    CHECK_EQ(s.accepted, 10);
    CHECK_EQ(s.released, 10);
    CHECK_EQ(s.closed, 0);
    CHECK_EQ(s.failed_status, 0);
    CHECK_EQ(s.provider_refused, 1);
    CHECK_EQ(s.provider_refused_errno, EINVAL);

    char text[512];
    int len = sqd_queue_last_refusal(m->q, text, sizeof text);
    CHECK(len > 0 && (size_t)len < sizeof text);
    CHECK_EQ(strlen(text), len);
    if (!strstr(text, "wr_id 0x6") || !strstr(text, "errno 22"))
        fail_now("sqd_queue_last_refusal: \"%s\"", text);
    char small[8];
    CHECK_EQ(sqd_queue_last_refusal(m->q, small, sizeof small), len); /* cut, NUL-terminated */
    CHECK_EQ(strlen(small), 7);
    CHECK(strncmp(small, text, 7) == 0);
    CHECK_EQ(sqd_queue_last_refusal(m->q, NULL, 0), len);
    EXPECT_ERR(sqd_queue_last_refusal(m->q, NULL, 4), EINVAL, "buf is NULL");
    EXPECT_ERR(sqd_queue_last_refusal(NULL, text, sizeof text), EINVAL, "q is NULL");

    /* The queue is open: later WRs go through. */
    CHECK_EQ(sqd_post_send(m->q, sends_with_read(10, 12, 99, 0)->wr, &bad), 0);
    drive(the_rig, m, 12);
    released_in_order(m, 0, 12);
    callbacks_ok(m);
    no_violations(the_rig);
}

static void a_refused_post_names_the_refused_wr_and_releases_the_ones_before_it(void)
{
    /* Interval 4: WR 3 would be the signaled one. Refused, it leaves 0..2 posted unsignaled: the queue must
     * cover them without further posts. */
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 4, .backlog_depth = 8}, 64);
    CHECK_EQ(sqd_scripted_refuse_opcode(m->qp, IBV_WR_RDMA_READ, EINVAL), 0);
    struct chain *c = sends_with_read(0, 6, 3, 0);
    struct ibv_send_wr *bad = NULL;
    CHECK_EQ(sqd_post_send(m->q, c->wr, &bad), -EINVAL);
    CHECK(bad == &c->wr[3]);
    for (int i = 0; i < 6; i++) {
        CHECK_EQ(c->wr[i].wr_id, i);
        CHECK_EQ(c->wr[i].send_flags, 0);
        CHECK(c->wr[i].next == (i + 1 < 6 ? &c->wr[i + 1] : NULL));
    }
    struct sqd_queue_stats s = qstats(m);
    CHECK_EQ(s.accepted, 3);
    CHECK_EQ(s.in_provider, 3);
    CHECK_EQ(s.credits, 13);
    CHECK_EQ(s.provider_refused, 0); /* the caller was told: not an accepted WR */
    CHECK_EQ(dstats(m).wqes_posted, 3);
    drive(the_rig, m, 3);
    released_in_order(m, 0, 3);
    CHECK_EQ(qstats(m).markers, 1);
    callbacks_ok(m);
    no_violations(the_rig);
}

static void an_idle_tail_marker_the_provider_refuses_is_tried_again_and_reported(void)
{
    /* The marker is a zero-length RDMA WRITE: while the provider refuses WRITEs the tail stays uncovered, and
     * the refusal shows in the stats and in sqd_queue_last_refusal; once WRITEs are taken again the next poll
     * cycle covers it, without another post. */
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 8, .backlog_depth = 0}, 64);
    struct ibv_send_wr *bad = NULL;
    CHECK_EQ(sqd_post_send(m->q, sends_with_read(0, 3, 99, 0)->wr, &bad), 0);
    CHECK_EQ(sqd_scripted_refuse_opcode(m->qp, IBV_WR_RDMA_WRITE, EINVAL), 0);
    for (int i = 0; i < 4; i++) {
        complete(m, INT_MAX);
        poll_all(the_rig->scq);
    }
    CHECK_EQ(m->nlog, 0);
    struct sqd_queue_stats s = qstats(m);
    CHECK_EQ(s.markers, 0);
    CHECK(s.markers_refused >= 1);
    CHECK_EQ(s.provider_refused, 0); /* a marker is no accepted WR */
    CHECK_EQ(s.provider_refused_errno, EINVAL);
    CHECK_EQ(s.closed, 0);
    char text[512];
    CHECK(sqd_queue_last_refusal(m->q, text, sizeof text) > 0);
    if (!strstr(text, "marker") || !strstr(text, "errno 22"))
        fail_now("sqd_queue_last_refusal: \"%s\"", text);
    CHECK_EQ(sqd_scripted_refuse_opcode(m->qp, IBV_WR_RDMA_WRITE, 0), 0);
    drive(the_rig, m, 3);
    released_in_order(m, 0, 3);
    CHECK_EQ(qstats(m).markers, 1);
    callbacks_ok(m);
    no_violations(the_rig);
}

static void after_a_refused_post_the_signal_interval_counts_from_the_wrs_really_posted(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 8}, 64);
    CHECK_EQ(sqd_scripted_refuse_opcode(m->qp, IBV_WR_RDMA_READ, EINVAL), 0);
    struct ibv_send_wr *bad = NULL;
    CHECK_EQ(sqd_post_send(m->q, sends_with_read(0, 5, 3, 0)->wr, &bad), -EINVAL);
    CHECK(bad == &ch.wr[3]);
    /* 0..2 form an unsignaled run of 3: with interval 8, the fifth WR of the next post is the 8th in a row. */
    CHECK_EQ(sqd_post_send(m->q, sends_with_read(3, 8, 99, 0)->wr, &bad), 0);
    CHECK_EQ(dstats(m).wqes_posted, 8);
    for (size_t i = 0; i < 8; i++)
        CHECK_EQ(!!(wqe(m, i).send_flags & IBV_SEND_SIGNALED), i == 7);
    drive(the_rig, m, 8);
    released_in_order(m, 0, 8);
    no_violations(the_rig);
}

static struct sqd_completion done_seen[4];
static int done_count;

static void on_done(void *ctx, const struct sqd_completion *c)
{
    (void)ctx;
    if (done_count < 4)
        done_seen[done_count] = *c;
    done_count++;
}

static void a_deferred_local_inv_the_provider_refuses_reports_it(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 8, .signal_interval = 2, .backlog_depth = 8}, 64);
    CHECK_EQ(sqd_scripted_refuse_opcode(m->qp, IBV_WR_LOCAL_INV, EOPNOTSUPP), 0);
    done_count = 0;
    /* Nothing outstanding: the LocalInv is posted at once, and refused. */
    CHECK_EQ(sqd_invalidate(m->q, 0x77, 5, 0, on_done, NULL), 0);
    CHECK_EQ(done_count, 1);
    CHECK_EQ(done_seen[0].wr_id, 5);
    CHECK_EQ(done_seen[0].status, IBV_WC_LOC_QP_OP_ERR);
    CHECK_EQ(done_seen[0].flags, SQD_COMPLETION_REFUSED | SQD_COMPLETION_NEVER_POSTED);
    CHECK_EQ(done_seen[0].vendor_err, EOPNOTSUPP);
    struct sqd_queue_stats s = qstats(m);
    CHECK_EQ(s.provider_refused, 1);
    CHECK_EQ(s.provider_refused_errno, EOPNOTSUPP);
    CHECK_EQ(s.accepted, s.released);
    char text[256];
    CHECK(sqd_queue_last_refusal(m->q, text, sizeof text) > 0);
    if (!strstr(text, "LocalInv") || !strstr(text, "wr_id 0x5"))
        fail_now("sqd_queue_last_refusal: \"%s\"", text);
    /* Sends still flow. */
    struct ibv_send_wr *bad = NULL;
    CHECK_EQ(sqd_post_send(m->q, sends_with_read(0, 3, 99, 0)->wr, &bad), 0);
    drive(the_rig, m, 3);
    released_in_order(m, 0, 3);
    no_violations(the_rig);
}

static void wrs_every_provider_refuses_are_refused_at_post(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 2, .signal_interval = 2, .backlog_depth = 8}, 64);
    struct ibv_send_wr *bad = NULL;
    /* A fetch-and-add with a 16-byte SGE: an atomic returns exactly 8 bytes. */
    ch.n = 0;
    add(&ch, 0, IBV_WR_SEND, 0, 64);
    add(&ch, 1, IBV_WR_ATOMIC_FETCH_AND_ADD, 0, 16);
    EXPECT_ERR(sqd_post_send(m->q, ch.wr, &bad), EINVAL, "16 bytes");
    CHECK(bad == &ch.wr[1]);
    /* An atomic on a misaligned remote address. */
    ch.n = 0;
    add(&ch, 2, IBV_WR_ATOMIC_CMP_AND_SWP, 0, 8);
    ch.wr[0].wr.atomic.remote_addr = 0x1004;
    EXPECT_ERR(sqd_post_send(m->q, ch.wr, &bad), EINVAL, "not 8-byte aligned");
    CHECK(bad == &ch.wr[0]);
    /* A BIND_MW without a window. */
    ch.n = 0;
    add(&ch, 3, IBV_WR_BIND_MW, 0, 0);
    EXPECT_ERR(sqd_post_send(m->q, ch.wr, &bad), EINVAL, "bind_mw.mw");
    CHECK(bad == &ch.wr[0]);
    /* With the SQ full the same atomic is refused, not parked. */
    CHECK_EQ(sqd_post_send(m->q, sends_with_read(10, 11, 99, 0)->wr, &bad), 0);
    CHECK_EQ(qstats(m).credits, 0);
    ch.n = 0;
    add(&ch, 1, IBV_WR_ATOMIC_FETCH_AND_ADD, 0, 16);
    EXPECT_ERR(sqd_post_send(m->q, ch.wr, &bad), EINVAL, "atomic");
    CHECK_EQ(qstats(m).backlog, 0);
    /* An 8-byte atomic is taken (parked). */
    ch.n = 0;
    add(&ch, 20, IBV_WR_ATOMIC_FETCH_AND_ADD, 0, 8);
    CHECK_EQ(sqd_post_send(m->q, ch.wr, &bad), 0);
    CHECK_EQ(qstats(m).backlog, 1);
    drive(the_rig, m, 3);
    CHECK_EQ(m->log[0].wr_id, 0);
    CHECK_EQ(m->log[1].wr_id, 10);
    CHECK_EQ(m->log[2].wr_id, 20);
    for (int i = 0; i < 3; i++)
        CHECK_EQ(m->log[i].status, IBV_WC_SUCCESS);
    no_violations(the_rig);
}

static void drain_is_not_done_while_its_marker_is_with_the_provider(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 8, .signal_interval = 4}, 16);
    struct ibv_send_wr *bad = NULL;
    CHECK_EQ(sqd_post_send(m->q, sends_with_read(0, 1, 99, 0)->wr, &bad), 0);
    CHECK_EQ(sqd_queue_drain(m->q), -EINPROGRESS);
    CHECK_EQ(qstats(m).markers, 1);
    /* WR 0 fails with its own CQE; the drain marker flushes behind it, and that CQE stays in the CQ. */
    CHECK_EQ(sqd_scripted_fail(m->qp, IBV_WC_REM_ACCESS_ERR, 0), 0);
    struct ibv_wc wc[1];
    CHECK_EQ(sqd_cq_poll(the_rig->scq, 1, wc), 1);
    CHECK_EQ(wc[0].wr_id, 0);
    released_in_order(m, 0, 1);
    struct sqd_queue_stats s = qstats(m);
    CHECK_EQ(s.released, s.accepted);
    CHECK_EQ(s.in_provider, 1);
    CHECK_EQ(sqd_queue_drain(m->q), -EINPROGRESS);
    EXPECT_ERR(sqd_queue_free(m->q), EBUSY, "not yet released");
    poll_all(the_rig->scq);
    CHECK_EQ(sqd_queue_drain(m->q), 0);
    CHECK_EQ(sqd_queue_free(m->q), 0);
    m->q = NULL;
}

int main(void)
{
    run("a_backlogged_wr_the_provider_refuses_is_released_refused_and_the_rest_flow",
        a_backlogged_wr_the_provider_refuses_is_released_refused_and_the_rest_flow);
    run("a_refused_post_names_the_refused_wr_and_releases_the_ones_before_it",
        a_refused_post_names_the_refused_wr_and_releases_the_ones_before_it);
    run("an_idle_tail_marker_the_provider_refuses_is_tried_again_and_reported",
        an_idle_tail_marker_the_provider_refuses_is_tried_again_and_reported);
    run("after_a_refused_post_the_signal_interval_counts_from_the_wrs_really_posted",
        after_a_refused_post_the_signal_interval_counts_from_the_wrs_really_posted);
    run("a_deferred_local_inv_the_provider_refuses_reports_it", a_deferred_local_inv_the_provider_refuses_reports_it);
    run("wrs_every_provider_refuses_are_refused_at_post", wrs_every_provider_refuses_are_refused_at_post);
    run("drain_is_not_done_while_its_marker_is_with_the_provider",
        drain_is_not_done_while_its_marker_is_with_the_provider);
    return harness_finish("refusal");
}
