/* Bad input to every sqd_* function: each is refused with a negative errno and a relevant sqd_last_error()
 * message, never a crash, and leaves the objects it was given usable. NULL pointers, bad queue attributes, bad
 * WRs (with an exact *bad_wr and the ULP's chain untouched), re-entrant calls from callbacks, freeing busy
 * objects, the CQ budget, a QP managed twice.
 *
 * Each scenario prints "PASS <name>" or "FAIL <name>: <why>"; a failed scenario is torn down and the next one
 * runs; the exit status is non-zero if any failed. */

#include "support/harness.h"

/* ---- a managed queue on the scripted device --------------------------------------------------------------- */

/* A QP of depth sq (receive depth rq, 2 SGEs, 16 inline bytes) on `send_cq`/`recv_cq`. */
static struct ibv_qp *make_qp(struct rig *r, struct ibv_cq *send_cq, struct ibv_cq *recv_cq, uint32_t sq, uint32_t rq)
{
    struct sqd_scripted_qp_caps caps = {
        .max_send_wr = sq, .max_recv_wr = rq ? rq : 1, .max_send_sge = 2, .max_recv_sge = 2, .max_inline_data = 16};
    struct ibv_qp *qp = NULL;
    CHECK_EQ(sqd_scripted_create_qp(r->dev, send_cq, recv_cq, &caps, &qp), 0);
    return qp;
}

static struct sqd_queue_attr attr_for(struct ibv_qp *qp, struct mq *m)
{
    struct sqd_scripted_qp_caps caps;
    CHECK_EQ(sqd_scripted_qp_caps(qp, &caps), 0);
    return (struct sqd_queue_attr){.sq_depth = caps.max_send_wr,
                                   .max_send_sge = caps.max_send_sge,
                                   .max_inline_data = caps.max_inline_data,
                                   .signal_interval = caps.max_send_wr < 4 ? caps.max_send_wr : 4,
                                   .release = m ? on_release : NULL,
                                   .release_ctx = m};
}

/* A managed queue on the rig's CQ (receives managed there too when rq > 0). */
static struct mq *add_small_queue(struct rig *r, uint32_t sq, uint32_t rq, uint32_t backlog)
{
    struct mq *m = rig_add_mq(r);
    m->qp = make_qp(r, r->cq, r->cq, sq, rq);
    struct sqd_queue_attr attr = attr_for(m->qp, m);
    attr.rq_depth = rq;
    attr.backlog_depth = backlog;
    CHECK_EQ(sqd_queue_new(r->scq, rq ? r->scq : NULL, m->qp, &attr, &m->q), 0);
    return m;
}

static uint64_t device_wqes(struct mq *m)
{
    struct sqd_scripted_qp_stats s;
    CHECK_EQ(sqd_scripted_qp_stats(m->qp, &s), 0);
    return s.wqes_posted;
}

/* ---- WR chains ---------------------------------------------------------------------------------------------- */

#define CHAIN_CAP 8
static unsigned char data[CHAIN_CAP][64];

struct chain {
    struct ibv_send_wr wr[CHAIN_CAP];
    struct ibv_sge sge[CHAIN_CAP][4];
    int n;
};

/* n SENDs with wr_ids first.., one 8-byte SGE each (room for 4); WR 1 signaled by the ULP. */
static struct ibv_send_wr *make_chain(struct chain *c, uint64_t first, int n)
{
    memset(c, 0, sizeof *c);
    c->n = n;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 4; k++)
            c->sge[i][k] = (struct ibv_sge){.addr = (uintptr_t)&data[i][k * 16], .length = 8, .lkey = 5};
        c->wr[i].wr_id = first + (uint64_t)i;
        c->wr[i].opcode = IBV_WR_SEND;
        c->wr[i].send_flags = i == 1 ? IBV_SEND_SIGNALED : 0;
        c->wr[i].num_sge = 1;
        c->wr[i].sg_list = c->sge[i];
        c->wr[i].next = i + 1 < n ? &c->wr[i + 1] : NULL;
    }
    return c->wr;
}

/* ---- scenarios --------------------------------------------------------------------------------------------- */

static void null_arguments_of_cq_functions(void)
{
    struct rig *r = rig_new(16);
    struct sqd_cq *out = NULL;
    struct ibv_wc wc[4];
    struct sqd_cq_stats cs;
    EXPECT_ERR(sqd_cq_new(NULL, &out), EINVAL, "cq is NULL");
    CHECK(out == NULL);
    EXPECT_ERR(sqd_cq_new(r->cq, NULL), EINVAL, "out is NULL");
    CHECK_EQ(sqd_cq_free(NULL), 0);
    EXPECT_ERR(sqd_cq_poll(NULL, 4, wc), EINVAL, "cq is NULL");
    EXPECT_ERR(sqd_cq_poll(r->scq, 4, NULL), EINVAL, "wc is NULL");
    EXPECT_ERR(sqd_cq_poll(r->scq, -1, wc), EINVAL, "max is -1");
    EXPECT_ERR(sqd_cq_poll(r->scq, INT_MIN, wc), EINVAL, "max");
    CHECK_EQ(sqd_cq_poll(r->scq, 0, NULL), 0); /* NULL wc is refused only with max > 0 */
    EXPECT_ERR(sqd_cq_stats(NULL, &cs), EINVAL, "cq is NULL");
    EXPECT_ERR(sqd_cq_stats(r->scq, NULL), EINVAL, "out is NULL");
    /* CQs that no provider made. */
    struct ibv_cq fake;
    memset(&fake, 0, sizeof fake);
    fake.cqe = 16;
    EXPECT_ERR(sqd_cq_new(&fake, &out), EINVAL, "context");
    CHECK(out == NULL);
    fake = *r->cq;
    fake.cqe = 0;
    EXPECT_ERR(sqd_cq_new(&fake, &out), EINVAL, "cqe");
    CHECK(out == NULL);
    /* The CQ handle still works. */
    CHECK_EQ(sqd_cq_poll(r->scq, 4, wc), 0);
    CHECK_EQ(cqstats(r->scq).queues, 0);
}

static void null_arguments_of_queue_new_and_free(void)
{
    struct rig *r = rig_new(64);
    struct ibv_qp *qp = make_qp(r, r->cq, r->cq, 8, 0);
    struct sqd_queue_attr attr = attr_for(qp, NULL);
    struct sqd_queue *q = NULL;
    EXPECT_ERR(sqd_queue_new(NULL, NULL, qp, &attr, &q), EINVAL, "send_cq is NULL");
    CHECK(q == NULL);
    EXPECT_ERR(sqd_queue_new(r->scq, NULL, NULL, &attr, &q), EINVAL, "qp is NULL");
    EXPECT_ERR(sqd_queue_new(r->scq, NULL, qp, NULL, &q), EINVAL, "attr is NULL");
    EXPECT_ERR(sqd_queue_new(r->scq, NULL, qp, &attr, NULL), EINVAL, "out is NULL");
    CHECK(q == NULL);
    CHECK_EQ(sqd_queue_free(NULL), 0);
    struct sqd_cq_stats cs = cqstats(r->scq);
    CHECK_EQ(cs.queues, 0);
    CHECK_EQ(cs.reserved, 0);
    /* Nothing was left attached: the same QP can be managed now. */
    CHECK_EQ(sqd_queue_new(r->scq, NULL, qp, &attr, &q), 0);
    CHECK_EQ(sqd_queue_free(q), 0);
}

static void bad_queue_attributes(void)
{
    struct rig *r = rig_new(64);
    struct ibv_qp *qp = make_qp(r, r->cq, r->cq, 8, 4);
    struct sqd_queue *q = NULL;
    struct sqd_queue_attr good = attr_for(qp, NULL), a;

    a = good;
    a.sq_depth = 0;
    EXPECT_ERR(sqd_queue_new(r->scq, NULL, qp, &a, &q), EINVAL, "sq_depth 0");
    a = good;
    a.sq_depth = (1u << 20) + 1;
    a.signal_interval = 0;
    EXPECT_ERR(sqd_queue_new(r->scq, NULL, qp, &a, &q), EINVAL, "sq_depth 1048577");
    a.sq_depth = UINT32_MAX;
    EXPECT_ERR(sqd_queue_new(r->scq, NULL, qp, &a, &q), EINVAL, "sq_depth");
    /* The message names the field that is out of range, and only that one. */
    a = good;
    a.backlog_depth = (1u << 20) + 1;
    EXPECT_ERR(sqd_queue_new(r->scq, NULL, qp, &a, &q), EINVAL, "backlog_depth 1048577 is above 1048576");
    CHECK(strstr(sqd_last_error(), "rq_depth") == NULL);
    a = good;
    a.rq_depth = UINT32_MAX;
    EXPECT_ERR(sqd_queue_new(r->scq, r->scq, qp, &a, &q), EINVAL, "rq_depth 4294967295 is above 1048576");
    CHECK(strstr(sqd_last_error(), "backlog_depth") == NULL);
    a = good;
    a.signal_interval = 9;
    EXPECT_ERR(sqd_queue_new(r->scq, NULL, qp, &a, &q), EINVAL, "signal_interval 9");
    a = good;
    a.flags = 1u << 5; /* bit 0 is SQD_QUEUE_VERIFY_BUFFERS: the lowest bits are taken */
    EXPECT_ERR(sqd_queue_new(r->scq, NULL, qp, &a, &q), EINVAL, "flags");
    a.flags = 0x80000000u;
    EXPECT_ERR(sqd_queue_new(r->scq, NULL, qp, &a, &q), EINVAL, "flags");
    a = good;
    a.rq_depth = 4;
    EXPECT_ERR(sqd_queue_new(r->scq, NULL, qp, &a, &q), EINVAL, "recv_cq");
    a = good;
    a.rq_depth = 0;
    EXPECT_ERR(sqd_queue_new(r->scq, r->scq, qp, &a, &q), EINVAL, "rq_depth");
    CHECK(q == NULL);


    /* CQs that are not the QP's. */
    struct ibv_cq *cq2 = NULL;
    CHECK_EQ(sqd_scripted_create_cq(r->dev, 64, &cq2), 0);
    CHECK_EQ(sqd_cq_new(cq2, &r->extra_scq[0]), 0);
    struct sqd_cq *scq2 = r->extra_scq[0];
    a = good;
    EXPECT_ERR(sqd_queue_new(scq2, NULL, qp, &a, &q), EINVAL, "send CQ");
    struct ibv_qp *split = make_qp(r, r->cq, cq2, 8, 4); /* sends on cq, receives on cq2 */
    a = attr_for(split, NULL);
    a.rq_depth = 4;
    EXPECT_ERR(sqd_queue_new(r->scq, r->scq, split, &a, &q), EINVAL, "recv CQ");
    EXPECT_ERR(sqd_queue_new(scq2, scq2, split, &a, &q), EINVAL, "send CQ");
    CHECK(q == NULL);

    /* A QP that is not RC. */
    struct ibv_qp ud = *qp;
    ud.qp_type = IBV_QPT_UD;
    a = good;
    EXPECT_ERR(sqd_queue_new(r->scq, NULL, &ud, &a, &q), EINVAL, "RC");
    CHECK(q == NULL);

    /* None of the refusals reserved anything; the right arguments still work. */
    CHECK_EQ(cqstats(r->scq).reserved, 0);
    CHECK_EQ(cqstats(r->scq).queues, 0);
    CHECK_EQ(cqstats(scq2).reserved, 0);
    a = attr_for(split, NULL);
    a.rq_depth = 4;
    CHECK_EQ(sqd_queue_new(r->scq, scq2, split, &a, &q), 0);
    CHECK_EQ(cqstats(r->scq).reserved, 9);
    CHECK_EQ(cqstats(scq2).reserved, 4);
    CHECK_EQ(sqd_queue_free(q), 0);
    CHECK_EQ(cqstats(r->scq).reserved, 0);
    CHECK_EQ(cqstats(scq2).reserved, 0);
}

static void null_arguments_of_queue_functions(void)
{
    struct rig *r = rig_new(64);
    struct mq *m = add_small_queue(r, 8, 0, 0);
    struct chain c;
    struct ibv_send_wr *wr = make_chain(&c, 0, 1), *bad = NULL;
    struct ibv_sge rsge = {.addr = (uintptr_t)data[0], .length = 64, .lkey = 5};
    struct ibv_recv_wr rwr = {.wr_id = 1, .sg_list = &rsge, .num_sge = 1}, *rbad = NULL;
    struct sqd_queue_stats qs;

    EXPECT_ERR(sqd_post_send(NULL, wr, &bad), EINVAL, "q is NULL");
    EXPECT_ERR(sqd_post_send(m->q, NULL, &bad), EINVAL, "wr is NULL");
    EXPECT_ERR(sqd_post_send(m->q, wr, NULL), EINVAL, "bad_wr is NULL");
    EXPECT_ERR(sqd_post_recv(NULL, &rwr, &rbad), EINVAL, "q is NULL");
    EXPECT_ERR(sqd_post_recv(m->q, NULL, &rbad), EINVAL, "wr is NULL");
    EXPECT_ERR(sqd_post_recv(m->q, &rwr, NULL), EINVAL, "bad_wr is NULL");
    EXPECT_ERR(sqd_defer(NULL, (sqd_defer_fn)NULL, NULL), EINVAL, "q is NULL");
    EXPECT_ERR(sqd_defer(m->q, (sqd_defer_fn)NULL, NULL), EINVAL, "fn is NULL");
    EXPECT_ERR(sqd_queue_drain(NULL), EINVAL, "q is NULL");
    EXPECT_ERR(sqd_queue_stats(NULL, &qs), EINVAL, "q is NULL");
    EXPECT_ERR(sqd_queue_stats(m->q, NULL), EINVAL, "out is NULL");
    /* Nothing was accepted, posted or closed. */
    qs = qstats(m);
    CHECK_EQ(qs.accepted, 0);
    CHECK_EQ(qs.closed, 0);
    CHECK_EQ(qs.deferred, 0);
    CHECK_EQ(device_wqes(m), 0);
    CHECK_EQ(c.wr[0].wr_id, 0);
    CHECK_EQ(c.wr[0].send_flags, 0);
    /* Receives on a queue that does not manage them. */
    rbad = NULL;
    EXPECT_ERR(sqd_post_recv(m->q, &rwr, &rbad), EINVAL, "does not manage receives");
    CHECK(rbad == &rwr);
    /* The queue still works. */
    CHECK_EQ(sqd_post_send(m->q, wr, &bad), 0);
    CHECK(bad == NULL);
    settle(r, m);
    CHECK_EQ(m->nlog, 1);
    no_violations(r);
}

/* One kind of bad WR: `make_bad` spoils c->wr[i]; the message must contain `what`. */
struct bad_case {
    const char *name;
    void (*make_bad)(struct chain *c, int i);
    const char *what;
};

static void too_many_sges(struct chain *c, int i) { c->wr[i].num_sge = 3; }
static void negative_sges(struct chain *c, int i) { c->wr[i].num_sge = -1; }
static void null_sg_list(struct chain *c, int i) { c->wr[i].sg_list = NULL; }
static void inline_too_long(struct chain *c, int i)
{
    c->wr[i].send_flags |= IBV_SEND_INLINE;
    c->sge[i][0].length = 17;
}
static void inline_too_long_in_two_sges(struct chain *c, int i)
{
    c->wr[i].send_flags |= IBV_SEND_INLINE;
    c->wr[i].num_sge = 2;
    c->sge[i][0].length = 10;
    c->sge[i][1].length = 10;
}
static void inline_read(struct chain *c, int i)
{
    c->wr[i].opcode = IBV_WR_RDMA_READ;
    c->wr[i].send_flags |= IBV_SEND_INLINE;
    c->wr[i].wr.rdma.remote_addr = 0x1000;
    c->wr[i].wr.rdma.rkey = 3;
}
static void unknown_opcode(struct chain *c, int i) { c->wr[i].opcode = (enum ibv_wr_opcode)77; }
static void unknown_flag(struct chain *c, int i) { c->wr[i].send_flags |= 1u << 12; }

static const struct bad_case bad_cases[] = {
    {"num_sge above max_send_sge", too_many_sges, "num_sge 3"},
    {"negative num_sge", negative_sges, "num_sge -1"},
    {"NULL sg_list", null_sg_list, "sg_list is NULL"},
    {"inline above max_inline_data", inline_too_long, "max_inline_data"},
    {"inline above max_inline_data in two SGEs", inline_too_long_in_two_sges, "20 bytes"},
    {"IBV_SEND_INLINE on RDMA_READ", inline_read, "IBV_SEND_INLINE"},
    {"unknown opcode", unknown_opcode, "opcode 77"},
    {"unknown send_flags bit", unknown_flag, "0x1000"},
};

/* Checks every kind of bad WR on `m`, alone and in the middle of a chain. */
static void refuse_bad_wrs(struct rig *r, struct mq *m)
{
    static struct chain c, before;
    uint64_t base = 0;
    for (size_t k = 0; k < sizeof bad_cases / sizeof bad_cases[0]; k++) {
        const struct bad_case *bc = &bad_cases[k];
        /* 1. Alone: nothing is accepted and *bad_wr is the WR. */
        struct ibv_send_wr *bad = NULL;
        make_chain(&c, 1000 + k, 1);
        bc->make_bad(&c, 0);
        before = c;
        uint64_t accepted = qstats(m).accepted, wqes = device_wqes(m);
        EXPECT_ERR(sqd_post_send(m->q, c.wr, &bad), EINVAL, bc->what);
        CHECK(bad == &c.wr[0]);
        CHECK(memcmp(&c, &before, sizeof c) == 0);
        CHECK_EQ(qstats(m).accepted, accepted);
        CHECK_EQ(device_wqes(m), wqes);

        /* 2. In the middle of a chain of 4: the two before it are accepted, it and the one after are not, and
         * the ULP's chain (wr_ids, flags, links, SGEs) is exactly as it was. */
        make_chain(&c, base, 4);
        bc->make_bad(&c, 2);
        before = c;
        bad = NULL;
        size_t released = m->nlog;
        EXPECT_ERR(sqd_post_send(m->q, c.wr, &bad), EINVAL, bc->what);
        if (bad != &c.wr[2]) {
            printf("FAIL %s: %s: *bad_wr is WR %ld of the chain, expected 2\n", current, bc->name,
                   bad ? (long)(bad - c.wr) : -1L);
            longjmp(scenario_exit, 1);
        }
        for (int i = 0; i < 4; i++) {
            CHECK_EQ(c.wr[i].wr_id, before.wr[i].wr_id);
            CHECK_EQ(c.wr[i].send_flags, before.wr[i].send_flags);
            CHECK(c.wr[i].next == before.wr[i].next);
            CHECK(c.wr[i].sg_list == before.wr[i].sg_list);
            CHECK_EQ(c.wr[i].num_sge, before.wr[i].num_sge);
            CHECK_EQ(c.wr[i].opcode, before.wr[i].opcode);
        }
        CHECK(memcmp(&c, &before, sizeof c) == 0);
        CHECK_EQ(qstats(m).accepted, accepted + 2);
        CHECK_EQ(device_wqes(m) + qstats(m).backlog, wqes + 2);
        settle(r, m);
        CHECK_EQ(m->nlog, released + 2);
        CHECK_EQ(m->log[released].wr_id, base);
        CHECK_EQ(m->log[released + 1].wr_id, base + 1);
        base += 4;
    }
    no_violations(r);
}

static void bad_wrs_are_refused_exactly(void)
{
    struct rig *r = rig_new(64);
    refuse_bad_wrs(r, add_small_queue(r, 16, 0, 0));
}

/* The same when the WRs before the bad one go to the backlog (one SQ slot): they are parked, still accepted. */
static void bad_wrs_are_refused_exactly_behind_parked_ones(void)
{
    struct rig *r = rig_new(64);
    struct mq *m = add_small_queue(r, 1, 0, 8);
    refuse_bad_wrs(r, m);
    CHECK(qstats(m).parked > 0);
    CHECK_EQ(qstats(m).backlog, 0);
}

static void bad_receives_are_refused_exactly(void)
{
    struct rig *r = rig_new(64);
    struct mq *m = add_small_queue(r, 8, 4, 0);
    struct ibv_sge sge[3] = {{.addr = (uintptr_t)data[0], .length = 64, .lkey = 5},
                             {.addr = (uintptr_t)data[1], .length = 64, .lkey = 5},
                             {.addr = (uintptr_t)data[2], .length = 64, .lkey = 5}};
    struct ibv_recv_wr wr[3], *bad = NULL;
    for (int i = 0; i < 3; i++)
        wr[i] = (struct ibv_recv_wr){.wr_id = 10 + i, .next = i < 2 ? &wr[i + 1] : NULL, .sg_list = &sge[i],
                                     .num_sge = 1};
    wr[1].sg_list = NULL;
    EXPECT_ERR(sqd_post_recv(m->q, wr, &bad), EINVAL, "sg_list");
    CHECK(bad == &wr[1]);
    CHECK_EQ(wr[0].wr_id, 10);
    CHECK(wr[0].next == &wr[1] && wr[1].next == &wr[2] && wr[2].next == NULL);
    CHECK_EQ(qstats(m).recv_outstanding, 1);
    wr[1].sg_list = &sge[1];
    wr[1].num_sge = -2;
    EXPECT_ERR(sqd_post_recv(m->q, &wr[1], &bad), EINVAL, "num_sge -2");
    CHECK(bad == &wr[1]);
    CHECK_EQ(qstats(m).recv_outstanding, 1);
    CHECK_EQ(sqd_scripted_deliver(m->qp, 8, NULL), 0);
    CHECK_EQ(poll_all(r->scq), 1);
    CHECK_EQ(m->nlog, 1);
    CHECK_EQ(m->log[0].wr_id, 10);
    CHECK_EQ(qstats(m).recv_outstanding, 0);
}

/* Calls made from inside a release callback, and what they returned. */
static struct {
    struct sqd_cq *cq;
    int poll_rc, cq_free_rc, queue_free_rc, calls;
    char poll_msg[200], cq_free_msg[200], queue_free_msg[200];
} reentry;

static void reenter_from_release(struct mq *m, const struct sqd_completion *c)
{
    struct ibv_wc wc[4];
    (void)c;
    if (reentry.calls++)
        return;
    reentry.poll_rc = sqd_cq_poll(reentry.cq, 4, wc);
    snprintf(reentry.poll_msg, sizeof reentry.poll_msg, "%s", sqd_last_error());
    reentry.cq_free_rc = sqd_cq_free(reentry.cq);
    snprintf(reentry.cq_free_msg, sizeof reentry.cq_free_msg, "%s", sqd_last_error());
    reentry.queue_free_rc = sqd_queue_free(m->q);
    snprintf(reentry.queue_free_msg, sizeof reentry.queue_free_msg, "%s", sqd_last_error());
}

static void reentrant_calls_from_a_release_callback(void)
{
    struct rig *r = rig_new(64);
    struct mq *m = add_small_queue(r, 8, 0, 0);
    memset(&reentry, 0, sizeof reentry);
    reentry.cq = r->scq;
    m->hook = reenter_from_release;
    struct chain c;
    CHECK_EQ(sqd_post_send(m->q, make_chain(&c, 0, 2), &(struct ibv_send_wr *){NULL}), 0);
    CHECK_EQ(sqd_scripted_complete(m->qp, 2), 2);
    CHECK_EQ(poll_all(r->scq), 1);
    CHECK_EQ(m->nlog, 2);
    CHECK(reentry.calls >= 1);
    CHECK_EQ(reentry.poll_rc, -EBUSY);
    CHECK(strstr(reentry.poll_msg, "re-entered") != NULL);
    CHECK_EQ(reentry.cq_free_rc, -EBUSY);
    CHECK(strstr(reentry.cq_free_msg, "polled") != NULL);
    CHECK_EQ(reentry.queue_free_rc, -EBUSY);
    CHECK(strstr(reentry.queue_free_msg, "own callbacks") != NULL);
    /* Both objects are still valid and work. */
    m->hook = NULL;
    CHECK_EQ(sqd_post_send(m->q, make_chain(&c, 2, 2), &(struct ibv_send_wr *){NULL}), 0);
    settle(r, m);
    CHECK_EQ(m->nlog, 4);
    CHECK_EQ(m->log[3].wr_id, 3);
    CHECK_EQ(sqd_queue_free(m->q), 0);
    m->q = NULL;
    CHECK_EQ(sqd_cq_free(r->scq), 0);
    r->scq = NULL;
}

static void freeing_busy_objects(void)
{
    struct rig *r = rig_new(64);
    struct mq *m = add_small_queue(r, 8, 0, 0);
    struct chain c;
    struct ibv_send_wr *bad = NULL;
    CHECK_EQ(sqd_post_send(m->q, make_chain(&c, 0, 3), &bad), 0);
    EXPECT_ERR(sqd_queue_free(m->q), EBUSY, "not yet released");
    EXPECT_ERR(sqd_cq_free(r->scq), EBUSY, "attached");
    /* The queue still works: more WRs, then everything is released in order. */
    CHECK_EQ(sqd_post_send(m->q, make_chain(&c, 3, 4), &bad), 0);
    CHECK_EQ(sqd_scripted_complete(m->qp, 1), 1);
    poll_all(r->scq);
    EXPECT_ERR(sqd_queue_free(m->q), EBUSY, "not yet released");
    settle(r, m);
    CHECK_EQ(m->nlog, 7);
    for (int i = 0; i < 7; i++)
        CHECK_EQ(m->log[i].wr_id, i);
    EXPECT_ERR(sqd_cq_free(r->scq), EBUSY, "attached");
    CHECK_EQ(sqd_queue_free(m->q), 0);
    m->q = NULL;
    CHECK_EQ(sqd_cq_free(r->scq), 0);
    r->scq = NULL;
    no_violations(r);
}

static void cq_budget_refuses_a_queue_that_does_not_fit(void)
{
    struct rig *r = rig_new(40);
    add_small_queue(r, 16, 0, 0); /* reserves 17 of 40 */
    struct ibv_qp *qp2 = make_qp(r, r->cq, r->cq, 32, 0);
    struct sqd_queue_attr a = attr_for(qp2, NULL);
    struct sqd_queue *q2 = NULL;
    EXPECT_ERR(sqd_queue_new(r->scq, NULL, qp2, &a, &q2), ENOSPC, "needs 33");
    check_message("the same refusal", "holds 40", __FILE__, __LINE__);
    check_message("the same refusal", "23 are free", __FILE__, __LINE__);
    CHECK(q2 == NULL);
    CHECK_EQ(cqstats(r->scq).reserved, 17);
    CHECK_EQ(cqstats(r->scq).queues, 1);
    /* A queue that fits exactly. */
    a.sq_depth = 22;
    CHECK_EQ(sqd_queue_new(r->scq, NULL, qp2, &a, &q2), 0);
    CHECK_EQ(cqstats(r->scq).reserved, 40);
    /* Now even the smallest queue does not fit. */
    struct ibv_qp *qp3 = make_qp(r, r->cq, r->cq, 1, 0);
    struct sqd_queue_attr a3 = attr_for(qp3, NULL);
    a3.signal_interval = 0;
    struct sqd_queue *q3 = NULL;
    /* signal_interval 0 at sq_depth 1 signals every WR: 1 CQE, no marker's (as signal_interval 1). */
    EXPECT_ERR(sqd_queue_new(r->scq, NULL, qp3, &a3, &q3), ENOSPC, "needs 1 (sq_depth 1 + every WR signaled");
    /* Receives on the same CQ count too: sq_depth + rq_depth + 1. */
    CHECK_EQ(sqd_queue_free(q2), 0);
    CHECK_EQ(cqstats(r->scq).reserved, 17);
    struct ibv_qp *qp4 = make_qp(r, r->cq, r->cq, 16, 8);
    struct sqd_queue_attr a4 = attr_for(qp4, NULL);
    a4.rq_depth = 8;
    struct sqd_queue *q4 = NULL;
    EXPECT_ERR(sqd_queue_new(r->scq, r->scq, qp4, &a4, &q4), ENOSPC, "needs 25");
    a4.rq_depth = 6;
    CHECK_EQ(sqd_queue_new(r->scq, r->scq, qp4, &a4, &q4), 0);
    CHECK_EQ(cqstats(r->scq).reserved, 40);
    CHECK_EQ(sqd_queue_free(q4), 0);
    CHECK_EQ(cqstats(r->scq).reserved, 17);
}

static void the_same_qp_managed_twice(void)
{
    struct rig *r = rig_new(64);
    struct mq *m = add_small_queue(r, 8, 0, 0);
    struct sqd_queue_attr a = attr_for(m->qp, NULL);
    struct sqd_queue *q2 = NULL;
    EXPECT_ERR(sqd_queue_new(r->scq, NULL, m->qp, &a, &q2), EBUSY, "already managed");
    CHECK(q2 == NULL);
    CHECK_EQ(cqstats(r->scq).queues, 1);
    CHECK_EQ(cqstats(r->scq).reserved, 9);
    /* The first queue is unaffected. */
    struct chain c;
    CHECK_EQ(sqd_post_send(m->q, make_chain(&c, 0, 2), &(struct ibv_send_wr *){NULL}), 0);
    settle(r, m);
    CHECK_EQ(m->nlog, 2);
    /* Once it is freed, the QP may be managed again. */
    CHECK_EQ(sqd_queue_free(m->q), 0);
    m->q = NULL;
    CHECK_EQ(sqd_queue_new(r->scq, NULL, m->qp, &a, &q2), 0);
    CHECK_EQ(sqd_queue_free(q2), 0);
}

static void posting_on_closed_queues(void)
{
    struct rig *r = rig_new(64);
    struct mq *m = add_small_queue(r, 8, 0, 0);
    struct chain c;
    struct ibv_send_wr *bad = NULL;
    CHECK_EQ(sqd_queue_drain(m->q), 0); /* idle: done at once */
    EXPECT_ERR(sqd_post_send(m->q, make_chain(&c, 0, 2), &bad), EIO, "draining");
    CHECK(bad == &c.wr[0]);
    CHECK_EQ(qstats(m).accepted, 0);
    struct mq *f = add_small_queue(r, 8, 0, 0);
    CHECK_EQ(sqd_post_send(f->q, make_chain(&c, 0, 1), &bad), 0);
    CHECK_EQ(sqd_scripted_fail(f->qp, IBV_WC_LOC_PROT_ERR, 9), 0);
    poll_all(r->scq);
    EXPECT_ERR(sqd_post_send(f->q, make_chain(&c, 1, 2), &bad), EIO, "failed");
    CHECK(bad == &c.wr[0]);
    CHECK_EQ(f->nlog, 1);
}

int main(void)
{
    run("null_arguments_of_cq_functions", null_arguments_of_cq_functions);
    run("null_arguments_of_queue_new_and_free", null_arguments_of_queue_new_and_free);
    run("bad_queue_attributes", bad_queue_attributes);
    run("null_arguments_of_queue_functions", null_arguments_of_queue_functions);
    run("bad_wrs_are_refused_exactly", bad_wrs_are_refused_exactly);
    run("bad_wrs_are_refused_exactly_behind_parked_ones", bad_wrs_are_refused_exactly_behind_parked_ones);
    run("bad_receives_are_refused_exactly", bad_receives_are_refused_exactly);
    run("reentrant_calls_from_a_release_callback", reentrant_calls_from_a_release_callback);
    run("freeing_busy_objects", freeing_busy_objects);
    run("cq_budget_refuses_a_queue_that_does_not_fit", cq_budget_refuses_a_queue_that_does_not_fit);
    run("the_same_qp_managed_twice", the_same_qp_managed_twice);
    run("posting_on_closed_queues", posting_on_closed_queues);
    return harness_finish("bad_input");
}
