/* What the C tests share: checks that end a scenario, the scenario runner, the last-error sentinel for
 * bad-input checks, and a rig of managed queues on the scripted device with a log of their releases.
 *
 * Header-only and not a test itself (scripts/c-tests.sh builds only the .c files directly in c-tests): a test includes it as
 * "support/harness.h" before anything else. Every function is `static inline`, so a test that does not use
 * the rig is not warned about what it leaves unused.
 *
 * Output: each scenario prints "PASS <name>" or "FAIL <name>: <file>:<line>: <why>"; a failed scenario is
 * torn down and the next one runs; harness_finish() gives the exit status (non-zero if any failed). */

#ifndef SQDISC_C_TESTS_HARNESS_H
#define SQDISC_C_TESTS_HARNESS_H

#include <infiniband/verbs.h>
#include <sqdisc.h>
#include <sqdisc_scripted.h>

#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- checks --------------------------------------------------------------------------------------------- */

static const char *current = "setup"; /* the scenario running */
static int failures;                  /* scenarios failed so far */
static jmp_buf scenario_exit;

/* A failed check ends the scenario (longjmp back to run()). Never used inside a release or deferred callback,
 * which runs inside the library: callbacks record problems (see cb_fail) and the scenario checks them after. */
#define CHECK(cond)                                                                                          \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            printf("FAIL %s: %s:%d: %s (last error: \"%s\")\n", current, __FILE__, __LINE__, #cond,          \
                   sqd_last_error());                                                                        \
            longjmp(scenario_exit, 1);                                                                       \
        }                                                                                                    \
    } while (0)

#define CHECK_EQ(a, b)                                                                                       \
    do {                                                                                                     \
        long long a_ = (long long)(a), b_ = (long long)(b);                                                  \
        if (a_ != b_) {                                                                                      \
            printf("FAIL %s: %s:%d: %s is %lld, expected %s = %lld (last error: \"%s\")\n", current,         \
                   __FILE__, __LINE__, #a, a_, #b, b_, sqd_last_error());                                    \
            longjmp(scenario_exit, 1);                                                                       \
        }                                                                                                    \
    } while (0)

/* Prints "FAIL <scenario>: <message>" and ends the scenario. */
static inline _Noreturn void fail_now(const char *fmt, ...)
{
    va_list ap;
    printf("FAIL %s: ", current);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    longjmp(scenario_exit, 1);
}

/* ---- expected errors ------------------------------------------------------------------------------------ */

/* sqd_last_error() is not cleared by successful calls, so before each bad call it is set to a sentinel
 * message (a failing sqd_cq_poll with max -4242 on a CQ of its own); the bad call must replace it. */
#define SENTINEL "-4242"

static struct sqd_scripted *sentinel_dev;
static struct sqd_cq *sentinel_cq;

static inline void reset_error(void)
{
    struct ibv_wc wc;
    if (!sentinel_cq) {
        struct ibv_cq *cq = NULL;
        if (sqd_scripted_new(&sentinel_dev) != 0 || sqd_scripted_create_cq(sentinel_dev, 1, &cq) != 0 ||
            sqd_cq_new(cq, &sentinel_cq) != 0)
            fail_now("cannot make the sentinel CQ: %s", sqd_last_error());
    }
    if (sqd_cq_poll(sentinel_cq, -4242, &wc) != -EINVAL || !strstr(sqd_last_error(), SENTINEL))
        fail_now("cannot set the sentinel error (got \"%s\")", sqd_last_error());
}

static inline void check_message(const char *expr, const char *substr, const char *file, int line)
{
    const char *msg = sqd_last_error();
    if (!msg || !msg[0] || strstr(msg, SENTINEL) || !strstr(msg, substr))
        fail_now("%s:%d: %s: sqd_last_error() is \"%s\", expected a new message containing \"%s\"", file, line,
                 expr, msg ? msg : "(NULL)", substr);
}

/* `expr` returns -err and leaves a message containing `substr`. */
#define EXPECT_ERR(expr, err, substr)                                                                        \
    do {                                                                                                     \
        reset_error();                                                                                       \
        long long rc_ = (long long)(expr);                                                                   \
        if (rc_ != -(long long)(err)) {                                                                      \
            printf("FAIL %s: %s:%d: %s returned %lld, expected -%s = %lld (last error: \"%s\")\n", current,  \
                   __FILE__, __LINE__, #expr, rc_, #err, -(long long)(err), sqd_last_error());               \
            longjmp(scenario_exit, 1);                                                                       \
        }                                                                                                    \
        check_message(#expr, substr, __FILE__, __LINE__);                                                    \
    } while (0)

/* ---- a rig: managed queues on the scripted device, with a log of their releases ---------------------------- */

#define LOG_CAP 4096
#define MAX_QUEUES 4

struct mq;
typedef void (*hook_fn)(struct mq *m, const struct sqd_completion *c);

struct mq {
    struct ibv_qp *qp;
    struct sqd_queue *q;
    struct sqd_completion log[LOG_CAP]; /* every release, in the order the callback saw them */
    size_t nlog;
    hook_fn hook;       /* run after logging each release, from inside the callback */
    char cb_error[160]; /* the first problem a callback saw */
};

struct rig {
    struct sqd_scripted *dev;
    struct ibv_cq *cq;           /* the managed CQ, as the provider made it */
    struct sqd_cq *scq;
    struct sqd_cq *extra_scq[2]; /* more managed CQs, polled while tearing down and freed after the queues */
    struct mq *mq[MAX_QUEUES];
    int nmq;
};

static struct rig *the_rig; /* torn down by run() whatever happens */

static inline void on_release(void *ctx, const struct sqd_completion *c)
{
    struct mq *m = ctx;
    if (m->nlog < LOG_CAP)
        m->log[m->nlog] = *c;
    else if (!m->cb_error[0])
        snprintf(m->cb_error, sizeof m->cb_error, "more than %d releases", LOG_CAP);
    m->nlog++;
    if (m->hook)
        m->hook(m, c);
}

/* Records the first problem seen inside a callback. */
static inline void cb_fail(struct mq *m, const char *what, int rc)
{
    if (!m->cb_error[0])
        snprintf(m->cb_error, sizeof m->cb_error, "%s returned %d (%s)", what, rc, sqd_last_error());
}

/* A fresh device with one managed CQ holding `cqe`; run() tears it down. */
static inline struct rig *rig_new(int cqe)
{
    struct rig *r = calloc(1, sizeof *r);
    CHECK(r != NULL);
    the_rig = r;
    CHECK_EQ(sqd_scripted_new(&r->dev), 0);
    CHECK_EQ(sqd_scripted_create_cq(r->dev, cqe, &r->cq), 0);
    CHECK_EQ(sqd_cq_new(r->cq, &r->scq), 0);
    return r;
}

/* A new, empty queue slot of the rig (the caller makes the QP and the queue). */
static inline struct mq *rig_add_mq(struct rig *r)
{
    CHECK(r->nmq < MAX_QUEUES);
    struct mq *m = calloc(1, sizeof *m);
    CHECK(m != NULL);
    r->mq[r->nmq++] = m;
    return m;
}

struct qcfg {
    uint32_t sq_depth, signal_interval, backlog_depth, rq_depth;
    uint32_t flags; /* sqd_queue_attr.flags */
};

/* A QP with exactly these depths (4 SGEs, 64 inline bytes), managed with the caps it was granted. Its sends
 * complete on `send_cq` (managed as `ssq`), its receives on `recv_cq` (managed as `srq` when rq_depth > 0). */
static inline struct mq *add_queue_on(struct rig *r, struct ibv_cq *send_cq, struct sqd_cq *ssq,
                                      struct ibv_cq *recv_cq, struct sqd_cq *srq, struct qcfg cfg)
{
    struct mq *m = rig_add_mq(r);
    struct sqd_scripted_qp_caps want = {.max_send_wr = cfg.sq_depth,
                                        .max_recv_wr = cfg.rq_depth ? cfg.rq_depth : 1,
                                        .max_send_sge = 4,
                                        .max_recv_sge = 4,
                                        .max_inline_data = 64},
                                got;
    CHECK_EQ(sqd_scripted_create_qp(r->dev, send_cq, recv_cq, &want, &m->qp), 0);
    CHECK_EQ(sqd_scripted_qp_caps(m->qp, &got), 0);
    struct sqd_queue_attr attr = {.sq_depth = got.max_send_wr,
                                  .max_send_sge = got.max_send_sge,
                                  .max_inline_data = got.max_inline_data,
                                  .rq_depth = cfg.rq_depth ? got.max_recv_wr : 0,
                                  .signal_interval = cfg.signal_interval,
                                  .backlog_depth = cfg.backlog_depth,
                                  .release = on_release,
                                  .release_ctx = m,
                                  .flags = cfg.flags};
    CHECK_EQ(sqd_queue_new(ssq, cfg.rq_depth ? srq : NULL, m->qp, &attr, &m->q), 0);
    CHECK(m->q != NULL);
    return m;
}

static inline struct mq *add_queue(struct rig *r, struct qcfg cfg)
{
    return add_queue_on(r, r->cq, r->scq, r->cq, r->scq, cfg);
}

/* One queue on a fresh device whose CQ holds `cqe`. */
static inline struct mq *rig1(struct qcfg cfg, int cqe)
{
    return add_queue(rig_new(cqe), cfg);
}

/* Frees the rig; queues a failed scenario left busy are flushed and drained first. A queue or CQ that still
 * cannot be freed fails the scenario. */
static inline void rig_teardown(struct rig *r)
{
    if (!r)
        return;
    int bad = 0;
    for (int i = r->nmq - 1; i >= 0; i--) {
        struct mq *m = r->mq[i];
        m->hook = NULL;
        if (m->q && sqd_queue_free(m->q) != 0) {
            struct ibv_wc wc[16];
            sqd_scripted_set_error(m->qp);
            for (int k = 0; k < 64 && sqd_queue_drain(m->q) == -EINPROGRESS; k++) {
                sqd_cq_poll(r->scq, 16, wc);
                for (int j = 0; j < 2; j++)
                    if (r->extra_scq[j])
                        sqd_cq_poll(r->extra_scq[j], 16, wc);
            }
            if (sqd_queue_free(m->q) != 0) {
                printf("FAIL %s: teardown: queue %d cannot be freed: %s\n", current, i, sqd_last_error());
                bad = 1;
            }
        }
        free(m);
    }
    if (sqd_cq_free(r->scq) != 0) {
        printf("FAIL %s: teardown: CQ cannot be freed: %s\n", current, sqd_last_error());
        bad = 1;
    }
    for (int j = 0; j < 2; j++)
        if (sqd_cq_free(r->extra_scq[j]) != 0) {
            printf("FAIL %s: teardown: CQ %d cannot be freed: %s\n", current, j + 1, sqd_last_error());
            bad = 1;
        }
    sqd_scripted_free(r->dev);
    free(r);
    if (bad)
        longjmp(scenario_exit, 1);
}

/* ---- driving and observing -------------------------------------------------------------------------------- */

#define SHOWN_CAP 1024
static struct ibv_wc shown[SHOWN_CAP]; /* what the last poll_all showed */

/* Polls `scq` until it returns fewer than asked (4 at a time); stores what it showed in shown[], returns how
 * many. */
static inline int poll_all(struct sqd_cq *scq)
{
    int total = 0;
    for (;;) {
        struct ibv_wc wc[4];
        int n = sqd_cq_poll(scq, 4, wc);
        CHECK(n >= 0 && n <= 4);
        for (int i = 0; i < n; i++) {
            CHECK(total < SHOWN_CAP);
            shown[total++] = wc[i];
        }
        if (n < 4)
            return total;
    }
}

/* The scripted HCA executes the next `n` send WQEs of `m`; returns how many it did. */
static inline int complete(struct mq *m, int n)
{
    int got = sqd_scripted_complete(m->qp, n);
    CHECK(got >= 0);
    return got;
}

static inline struct sqd_queue_stats qstats(struct mq *m)
{
    struct sqd_queue_stats s;
    CHECK_EQ(sqd_queue_stats(m->q, &s), 0);
    return s;
}

static inline struct sqd_cq_stats cqstats(struct sqd_cq *c)
{
    struct sqd_cq_stats s;
    CHECK_EQ(sqd_cq_stats(c, &s), 0);
    return s;
}

static inline struct sqd_scripted_qp_stats dstats(struct mq *m)
{
    struct sqd_scripted_qp_stats s;
    CHECK_EQ(sqd_scripted_qp_stats(m->qp, &s), 0);
    return s;
}

static inline struct sqd_scripted_wqe wqe(struct mq *m, size_t i)
{
    struct sqd_scripted_wqe w;
    CHECK_EQ(sqd_scripted_wqe(m->qp, i, &w), 0);
    return w;
}

static inline void no_violations(struct rig *r)
{
    int n = sqd_scripted_violation_count(r->dev);
    if (n != 0) {
        char text[256];
        sqd_scripted_violation(r->dev, 0, text, sizeof text);
        fail_now("%d device violation(s), the first: %s", n, text);
    }
}

static inline void callbacks_ok(struct mq *m)
{
    if (m->cb_error[0])
        fail_now("in a callback: %s", m->cb_error);
}

/* The releases logged so far have wr_ids first, first+1, ... (exactly once each, in post order). */
static inline void released_in_order(struct mq *m, uint64_t first, size_t count)
{
    CHECK_EQ(m->nlog, count);
    for (size_t i = 0; i < count; i++)
        CHECK_EQ(m->log[i].wr_id, first + i);
}

/* Completes and polls until every WR accepted on `m` is released (or gives up). */
static inline void settle(struct rig *r, struct mq *m)
{
    for (int round = 0; round < 200; round++) {
        struct sqd_queue_stats s = qstats(m);
        if (s.accepted == s.released)
            return;
        complete(m, INT_MAX);
        poll_all(r->scq);
    }
    CHECK(!"settle: WRs still unreleased after 200 rounds of complete + poll");
}

/* ---- runner ---------------------------------------------------------------------------------------------- */

/* Runs one scenario and tears down the rig it made: "PASS <name>" if both go through, else the FAIL line the
 * failed check printed. */
static inline void run(const char *name, void (*scenario)(void))
{
    volatile int ok = 0;
    current = name;
    the_rig = NULL;
    if (setjmp(scenario_exit) == 0) {
        scenario();
        ok = 1;
    }
    if (setjmp(scenario_exit) == 0)
        rig_teardown(the_rig);
    else
        ok = 0;
    the_rig = NULL;
    if (ok)
        printf("PASS %s\n", name);
    else
        failures++;
}

/* The exit status of test `program`: prints "FAIL <program>: N scenario(s) failed" and returns 1 if any did. */
static inline int harness_finish(const char *program)
{
    sqd_cq_free(sentinel_cq);
    sqd_scripted_free(sentinel_dev);
    sentinel_cq = NULL;
    sentinel_dev = NULL;
    if (failures) {
        printf("FAIL %s: %d scenario(s) failed\n", program, failures);
        return 1;
    }
    return 0;
}

#endif /* SQDISC_C_TESTS_HARNESS_H */
