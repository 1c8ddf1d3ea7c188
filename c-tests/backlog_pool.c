/* The backlog pool of a CQ, through the C API: WRs parked by the queues whose sends complete on one CQ share
 * its storage (sqd_cq_set_backlog_limit, sqd_cq_backlog_pool_stats). A queue with a deep backlog is small at
 * rest once the pool has its room; a WR that finds the pool at its limit is refused with -EAGAIN, *bad_wr at it
 * and a message, and is taken once releases have emptied the pool; WRs parked by several queues are released
 * exactly once, in post order per queue; NULL arguments are refused.
 *
 * Mirrors tests/backlog_pool.rs. Each scenario prints "PASS <name>" or "FAIL <name>: <why>". */

#include "support/harness.h"

#define CHAIN_CAP 32
static unsigned char data[CHAIN_CAP * 64];

struct chain {
    struct ibv_send_wr wr[CHAIN_CAP];
    struct ibv_sge sge[CHAIN_CAP];
};

/* SENDs of 64 bytes with wr_ids [from, to), unsignaled, linked into one chain. */
static struct ibv_send_wr *sends(struct chain *c, uint64_t from, uint64_t to)
{
    int n = (int)(to - from);
    CHECK(n > 0 && n <= CHAIN_CAP);
    for (int i = 0; i < n; i++) {
        struct ibv_send_wr *w = &c->wr[i];
        memset(w, 0, sizeof *w);
        c->sge[i] = (struct ibv_sge){.addr = (uintptr_t)&data[i * 64], .length = 64, .lkey = 7};
        w->wr_id = from + (uint64_t)i;
        w->opcode = IBV_WR_SEND;
        w->num_sge = 1;
        w->sg_list = &c->sge[i];
        w->next = i + 1 < n ? &c->wr[i + 1] : NULL;
    }
    return c->wr;
}

static struct sqd_backlog_pool_stats pool_stats(struct sqd_cq *scq)
{
    struct sqd_backlog_pool_stats s;
    CHECK_EQ(sqd_cq_backlog_pool_stats(scq, &s), 0);
    return s;
}

/* Completes everything each queue's QP holds and polls, `rounds` times. */
static void drive_all(struct rig *r, int rounds)
{
    for (int k = 0; k < rounds; k++)
        for (int i = 0; i < r->nmq; i++) {
            complete(r->mq[i], INT_MAX);
            poll_all(r->scq);
        }
}

/* A queue of sq_depth 256, 16 SGEs, backlog 256 and 64 inline bytes on a CQ whose pool is limited to 256
 * parked WRs: the first queue makes the pool's room, every later one reports at most 16 KB. */
static void a_queue_with_a_deep_backlog_is_small_at_rest(void)
{
    struct rig *r = rig_new(4096);
    CHECK_EQ(sqd_cq_set_backlog_limit(r->scq, 256), 0);
    for (int i = 0; i < 3; i++) {
        struct mq *m = rig_add_mq(r);
        struct sqd_scripted_qp_caps caps = {
            .max_send_wr = 256, .max_recv_wr = 1, .max_send_sge = 16, .max_recv_sge = 1, .max_inline_data = 64};
        CHECK_EQ(sqd_scripted_create_qp(r->dev, r->cq, r->cq, &caps, &m->qp), 0);
        CHECK_EQ(sqd_scripted_qp_caps(m->qp, &caps), 0);
        CHECK_EQ(caps.max_send_wr, 256);
        CHECK_EQ(caps.max_send_sge, 16);
        struct sqd_queue_attr attr = {.sq_depth = 256, .max_send_sge = 16, .max_inline_data = 64,
                                      .backlog_depth = 256, .release = on_release, .release_ctx = m};
        CHECK_EQ(sqd_queue_new(r->scq, NULL, m->qp, &attr, &m->q), 0);
        struct sqd_queue_stats s = qstats(m);
        if (i > 0 && s.bytes > 16384)
            fail_now("queue %d (256/16/256) reports %llu bytes, above 16384", i, (unsigned long long)s.bytes);
    }
    struct sqd_backlog_pool_stats p = pool_stats(r->scq);
    CHECK_EQ(p.limit, 256);
    CHECK_EQ(p.capacity, 256);
    CHECK_EQ(p.demand, 3 * 256);
    CHECK_EQ(p.parked, 0);
    CHECK_EQ(p.shapes, 1);
    CHECK(p.bytes >= 256 * (16 * 16 + 64));
}

/* Two queues share a pool limited to 6 parked WRs. */
static void an_exhausted_pool_refuses_with_eagain_until_releases_free_it(void)
{
    struct rig *r = rig_new(256);
    CHECK_EQ(sqd_cq_set_backlog_limit(r->scq, 6), 0);
    struct mq *a = add_queue(r, (struct qcfg){.sq_depth = 4, .backlog_depth = 8});
    struct mq *b = add_queue(r, (struct qcfg){.sq_depth = 4, .backlog_depth = 8});
    static struct chain ca, cb;
    struct ibv_send_wr *bad = NULL;
    /* A: 4 posted, 6 parked, the 11th refused although A's own backlog has room. */
    EXPECT_ERR(sqd_post_send(a->q, sends(&ca, 0, 12), &bad), EAGAIN, "backlog pool is exhausted");
    CHECK(bad == &ca.wr[10]);
    struct sqd_queue_stats sa = qstats(a);
    CHECK_EQ(sa.accepted, 10);
    CHECK_EQ(sa.backlog, 6);
    CHECK_EQ(sa.refused, 1);
    struct sqd_backlog_pool_stats p = pool_stats(r->scq);
    CHECK_EQ(p.parked, 6);
    CHECK_EQ(p.exhausted, 1);
    /* B: 4 posted, none parks. */
    EXPECT_ERR(sqd_post_send(b->q, sends(&cb, 100, 106), &bad), EAGAIN, "sqd_cq_set_backlog_limit");
    CHECK(bad == &cb.wr[4]);
    CHECK_EQ(qstats(b).accepted, 4);
    CHECK_EQ(qstats(b).backlog, 0);
    /* A's completions move its parked WRs to its SQ: the pool empties. */
    complete(a, INT_MAX);
    poll_all(r->scq);
    complete(a, INT_MAX);
    poll_all(r->scq);
    CHECK_EQ(pool_stats(r->scq).parked, 0);
    /* B's refused WRs are taken now. */
    CHECK_EQ(sqd_post_send(b->q, sends(&cb, 104, 110), &bad), 0);
    CHECK(bad == NULL);
    CHECK_EQ(qstats(b).backlog, 6);
    drive_all(r, 4);
    released_in_order(a, 0, 10);
    released_in_order(b, 100, 10);
    CHECK_EQ(pool_stats(r->scq).parked, 0);
    CHECK_EQ(pool_stats(r->scq).peak, 6);
    callbacks_ok(a);
    callbacks_ok(b);
    no_violations(r);
}

/* Three queues park through a pool smaller than their backlogs together: chains handed out in turns, some
 * refused and handed out again later; every WR is released once, in order per queue. */
static void queues_sharing_a_pool_release_every_parked_wr_once_in_order(void)
{
    struct rig *r = rig_new(1024);
    CHECK_EQ(sqd_cq_set_backlog_limit(r->scq, 10), 0);
    struct mq *m[3];
    uint64_t next[3] = {0, 0, 0};
    const uint64_t total = 120;
    for (int i = 0; i < 3; i++)
        m[i] = add_queue(r, (struct qcfg){.sq_depth = 4, .signal_interval = 2, .backlog_depth = 8});
    static struct chain c;
    int refusals = 0;
    for (int round = 0; round < 400 && (next[0] < total || next[1] < total || next[2] < total); round++) {
        int i = round % 3;
        uint64_t to = next[i] + 1 + (uint64_t)(round % 7);
        if (to > total)
            to = total;
        if (next[i] < to) {
            struct ibv_send_wr *bad = NULL, *head = sends(&c, (uint64_t)i * 1000000 + next[i], (uint64_t)i * 1000000 + to);
            int rc = sqd_post_send(m[i]->q, head, &bad);
            if (rc == 0) {
                next[i] = to;
            } else {
                CHECK_EQ(rc, -EAGAIN);
                CHECK(bad >= c.wr && bad < c.wr + CHAIN_CAP);
                next[i] += (uint64_t)(bad - c.wr);
                refusals++;
            }
        }
        CHECK(pool_stats(r->scq).parked <= 10);
        complete(m[(round / 2) % 3], round % 4);
        poll_all(r->scq);
    }
    for (int k = 0; k < 3; k++)
        CHECK_EQ(next[k], total);
    drive_all(r, 60);
    for (int k = 0; k < 3; k++) {
        released_in_order(m[k], (uint64_t)k * 1000000, total);
        for (size_t j = 0; j < total; j++)
            CHECK_EQ(m[k]->log[j].status, IBV_WC_SUCCESS);
        callbacks_ok(m[k]);
    }
    struct sqd_backlog_pool_stats p = pool_stats(r->scq);
    CHECK_EQ(p.parked, 0);
    CHECK(refusals > 0 && p.exhausted > 0);
    no_violations(r);
}

static void null_arguments_are_refused(void)
{
    struct rig *r = rig_new(16);
    struct sqd_backlog_pool_stats p;
    EXPECT_ERR(sqd_cq_set_backlog_limit(NULL, 4), EINVAL, "cq");
    EXPECT_ERR(sqd_cq_backlog_pool_stats(NULL, &p), EINVAL, "cq");
    EXPECT_ERR(sqd_cq_backlog_pool_stats(r->scq, NULL), EINVAL, "out");
    p = pool_stats(r->scq);
    CHECK_EQ(p.limit, 0);
    CHECK_EQ(p.capacity, 0);
}

int main(void)
{
    run("a_queue_with_a_deep_backlog_is_small_at_rest", a_queue_with_a_deep_backlog_is_small_at_rest);
    run("an_exhausted_pool_refuses_with_eagain_until_releases_free_it",
        an_exhausted_pool_refuses_with_eagain_until_releases_free_it);
    run("queues_sharing_a_pool_release_every_parked_wr_once_in_order",
        queues_sharing_a_pool_release_every_parked_wr_once_in_order);
    run("null_arguments_are_refused", null_arguments_are_refused);
    return harness_finish("backlog_pool");
}
