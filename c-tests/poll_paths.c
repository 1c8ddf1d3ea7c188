/* sqd_cq_poll takes one of two ways through the library: the common call (a CQ made without flags, max > 0, an
 * array) goes straight to the poll, every other one (a SQD_CQ_THREAD_SAFE CQ, max <= 0, a NULL array) through
 * the general path that takes the CQ's lock first; and inside the poll, a CQ found empty is handled apart from
 * one that returned CQEs. The same calls must give the same results, counters and idle-tail markers every way:
 * each scenario runs on a CQ of each kind, checks what the contract says, and the two runs' transcripts (every
 * return value and counter they saw) must be equal.
 *
 * Each scenario prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is non-zero if any failed. */

#include "support/harness.h"

#define TRANSCRIPT_CAP 256

struct transcript {
    long long v[TRANSCRIPT_CAP];
    int n;
};

static struct transcript runs[2];
static struct transcript *rec; /* the run being recorded */

static long long note(long long v)
{
    CHECK(rec->n < TRANSCRIPT_CAP);
    rec->v[rec->n++] = v;
    return v;
}

/* Records the CQ's counters and each queue's markers and releases. */
static void note_state(struct rig *r)
{
    struct sqd_cq_stats s = cqstats(r->scq);
    note((long long)s.polls);
    note((long long)s.cqes);
    note((long long)s.visible);
    note((long long)s.hidden);
    note((long long)s.stray);
    note((long long)s.passthrough);
    note((long long)s.tail_markers);
    for (int i = 0; i < r->nmq; i++) {
        note((long long)qstats(r->mq[i]).markers);
        note((long long)r->mq[i]->nlog);
    }
}

/* A rig whose managed CQ was made with `cq_flags`. */
static struct rig *rig_with(uint32_t cq_flags, int cqe)
{
    struct rig *r = rig_new(cqe);
    CHECK_EQ(sqd_cq_free(r->scq), 0);
    r->scq = NULL;
    CHECK_EQ(sqd_cq_new_ex(r->cq, cq_flags, &r->scq), 0);
    return r;
}

static int poll4(struct rig *r)
{
    struct ibv_wc wc[4];
    int n = sqd_cq_poll(r->scq, 4, wc);
    for (int i = 0; i < n; i++)
        note((long long)wc[i].wr_id);
    return (int)note(n);
}

/* n SENDs on m, wr_ids first.., none signaled by the ULP but `signaled_at` (-1: none). */
static void post(struct mq *m, uint64_t first, int n, int signaled_at)
{
    static char buf[64];
    struct ibv_sge sge[8];
    struct ibv_send_wr wr[8], *bad = NULL;
    CHECK(n <= 8);
    for (int i = 0; i < n; i++) {
        sge[i] = (struct ibv_sge){.addr = (uintptr_t)buf, .length = 8, .lkey = 1};
        wr[i] = (struct ibv_send_wr){.wr_id = first + (uint64_t)i,
                                     .next = i + 1 < n ? &wr[i + 1] : NULL,
                                     .sg_list = &sge[i],
                                     .num_sge = 1,
                                     .opcode = IBV_WR_SEND,
                                     .send_flags = i == signaled_at ? IBV_SEND_SIGNALED : 0};
    }
    CHECK_EQ(sqd_post_send(m->q, wr, &bad), 0);
}

/* An unsignaled tail gets its marker at the end of the second poll after its post, whether the polls in
 * between find the CQ empty (`hidden_cqes` 0) or reap CQEs of another queue that the ULP does not see. */
static void idle_tail(uint32_t cq_flags, int hidden_cqes)
{
    struct rig *r = rig_with(cq_flags, 64);
    struct mq *a = add_queue(r, (struct qcfg){.sq_depth = 16, .signal_interval = 4});
    struct mq *b = add_queue(r, (struct qcfg){.sq_depth = 16, .signal_interval = 4});
    CHECK_EQ(poll4(r), 0);
    post(a, 0, 3, -1);
    for (int round = 0; round < 2; round++) {
        CHECK_EQ(qstats(a).markers, 0);
        if (hidden_cqes) {
            post(b, 100 + 4 * (uint64_t)round, 4, -1); /* the library signals the 4th: one hidden CQE */
            CHECK_EQ(complete(b, INT_MAX), 4);
        }
        CHECK_EQ(poll4(r), 0);
        note_state(r);
    }
    CHECK_EQ(qstats(a).markers, 1);
    CHECK_EQ(cqstats(r->scq).tail_markers, 1);
    CHECK_EQ(b->nlog, hidden_cqes ? 8 : 0);
    /* The marker's CQE releases the tail and is not shown. */
    CHECK_EQ(complete(a, INT_MAX), 4);
    CHECK_EQ(poll4(r), 0);
    released_in_order(a, 0, 3);
    CHECK_EQ(cqstats(r->scq).visible, 0);
    note_state(r);
}

static void visible_completions_and_odd_arguments(uint32_t cq_flags)
{
    struct rig *r = rig_with(cq_flags, 64);
    struct mq *a = add_queue(r, (struct qcfg){.sq_depth = 16, .signal_interval = 4});
    struct ibv_wc wc[8];
    CHECK_EQ(note(sqd_cq_poll(r->scq, 0, NULL)), 0);
    CHECK_EQ(note(sqd_cq_poll(r->scq, 0, wc)), 0);
    EXPECT_ERR(note(sqd_cq_poll(r->scq, -1, wc)), EINVAL, "max is -1");
    EXPECT_ERR(note(sqd_cq_poll(r->scq, 4, NULL)), EINVAL, "wc is NULL");
    note_state(r);
    /* Six WRs, the ULP signals the 2nd and the 6th: two completions shown, with its wr_ids. */
    post(a, 10, 6, 1);
    post(a, 16, 1, 0);
    CHECK_EQ(complete(a, INT_MAX), 7);
    int n = sqd_cq_poll(r->scq, 8, wc);
    CHECK_EQ(note(n), 2);
    CHECK_EQ(note((long long)wc[0].wr_id), 11);
    CHECK_EQ(note((long long)wc[1].wr_id), 16);
    released_in_order(a, 10, 7);
    /* A poll with room for one completion while two wait: one now, one on the next call. */
    post(a, 17, 2, 0);
    post(a, 19, 1, 0);
    CHECK_EQ(complete(a, INT_MAX), 3);
    CHECK_EQ(note(sqd_cq_poll(r->scq, 1, wc)), 1);
    CHECK_EQ(note((long long)wc[0].wr_id), 17);
    CHECK_EQ(note(sqd_cq_poll(r->scq, 1, wc)), 1);
    CHECK_EQ(note((long long)wc[0].wr_id), 19);
    CHECK_EQ(poll4(r), 0);
    released_in_order(a, 10, 10);
    note_state(r);
}

/* Calls made from a release callback: polling the same CQ again is refused. */
static int reentry_rc;
static char reentry_msg[200];
static struct sqd_cq *reentry_cq;

static void poll_again(struct mq *m, const struct sqd_completion *c)
{
    struct ibv_wc wc[4];
    (void)c;
    m->hook = NULL;
    reentry_rc = sqd_cq_poll(reentry_cq, 4, wc);
    snprintf(reentry_msg, sizeof reentry_msg, "%s", sqd_last_error());
}

static void reentered(uint32_t cq_flags)
{
    struct rig *r = rig_with(cq_flags, 64);
    struct mq *a = add_queue(r, (struct qcfg){.sq_depth = 16, .signal_interval = 4});
    reentry_rc = 0;
    reentry_cq = r->scq;
    a->hook = poll_again;
    post(a, 0, 2, 1);
    CHECK_EQ(complete(a, INT_MAX), 2);
    CHECK_EQ(poll4(r), 1);
    CHECK_EQ(note(reentry_rc), -EBUSY);
    CHECK(strstr(reentry_msg, "re-entered") != NULL);
    released_in_order(a, 0, 2);
    /* The CQ polls again once the callback returned. */
    CHECK_EQ(poll4(r), 0);
    note_state(r);
}

/* Runs `scenario` on a CQ without flags, then on a thread-safe one, and compares the transcripts. */
#define BOTH_WAYS(name, call)                                                                                \
    static void name(void)                                                                                   \
    {                                                                                                        \
        uint32_t flags[2] = {0, SQD_CQ_THREAD_SAFE};                                                         \
        for (int k = 0; k < 2; k++) {                                                                        \
            rec = &runs[k];                                                                                  \
            rec->n = 0;                                                                                      \
            uint32_t cq_flags = flags[k];                                                                    \
            call;                                                                                            \
            rig_teardown(the_rig);                                                                           \
            the_rig = NULL;                                                                                  \
        }                                                                                                    \
        CHECK_EQ(runs[1].n, runs[0].n);                                                                      \
        for (int i = 0; i < runs[0].n; i++)                                                                  \
            if (runs[0].v[i] != runs[1].v[i])                                                                \
                fail_now("entry %d of the transcript: %lld without flags, %lld thread-safe", i, runs[0].v[i], \
                         runs[1].v[i]);                                                                      \
    }

BOTH_WAYS(an_idle_tail_is_covered_alike_after_empty_polls, idle_tail(cq_flags, 0))
BOTH_WAYS(an_idle_tail_is_covered_alike_after_polls_of_hidden_cqes, idle_tail(cq_flags, 1))
BOTH_WAYS(completions_and_odd_arguments_alike, visible_completions_and_odd_arguments(cq_flags))
BOTH_WAYS(a_reentered_poll_is_refused_alike, reentered(cq_flags))

/* The empty and the hidden-CQE polls of idle_tail leave the tail's marker at the same poll, with the same
 * counters but those of the CQEs reaped. */
static void empty_and_hidden_polls_cover_alike(void)
{
    struct transcript t[2];
    for (int k = 0; k < 2; k++) {
        rec = &t[k];
        rec->n = 0;
        idle_tail(0, k);
        rig_teardown(the_rig);
        the_rig = NULL;
    }
    CHECK_EQ(t[0].n, t[1].n);
    /* Per note_state: polls, cqes, visible, hidden, stray, passthrough, tail_markers, then per queue markers
     * and releases. The first entry is the empty poll before the post; each round notes the poll's count first. */
    const int state = 7 + 2 * 2;
    for (int round = 0; round < 2; round++) {
        int at = 1 + round * (1 + state) + 1;
        CHECK_EQ(t[0].v[at], t[1].v[at]);         /* polls */
        CHECK_EQ(t[0].v[at + 6], t[1].v[at + 6]); /* tail_markers */
        CHECK_EQ(t[0].v[at + 7], t[1].v[at + 7]); /* the tail queue's markers */
        CHECK_EQ(t[0].v[at + 8], t[1].v[at + 8]); /* its releases */
        CHECK_EQ(t[1].v[at + 3], round + 1);      /* hidden CQEs reaped so far */
    }
}

int main(void)
{
    run("an_idle_tail_is_covered_alike_after_empty_polls", an_idle_tail_is_covered_alike_after_empty_polls);
    run("an_idle_tail_is_covered_alike_after_polls_of_hidden_cqes",
        an_idle_tail_is_covered_alike_after_polls_of_hidden_cqes);
    run("completions_and_odd_arguments_alike", completions_and_odd_arguments_alike);
    run("a_reentered_poll_is_refused_alike", a_reentered_poll_is_refused_alike);
    run("empty_and_hidden_polls_cover_alike", empty_and_hidden_polls_cover_alike);
    return harness_finish("poll_paths");
}
