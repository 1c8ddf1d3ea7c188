/* Completions that arrive for a queue after it was released by an asynchronous event and freed: the CQ drops
 * every one of them (they carry the library's wr_ids, never the program's), however many such queues were freed
 * before the next poll, and counts them in sqd_cq_stats.stray.
 *
 * Each scenario prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is non-zero if any failed. */

#include "support/harness.h"

#define QUEUES 100
#define SENDS 8

static unsigned char buf[64];

static void post_unsignaled_sends(struct sqd_queue *q, uint64_t first, int n)
{
    struct ibv_sge sge[SENDS];
    struct ibv_send_wr wr[SENDS], *bad = NULL;
    CHECK(n > 0 && n <= SENDS);
    for (int i = 0; i < n; i++) {
        sge[i] = (struct ibv_sge){.addr = (uintptr_t)buf, .length = sizeof buf, .lkey = 1};
        wr[i] = (struct ibv_send_wr){.wr_id = first + (uint64_t)i, .next = i + 1 < n ? &wr[i + 1] : NULL,
                                     .sg_list = &sge[i], .num_sge = 1, .opcode = IBV_WR_SEND};
    }
    CHECK_EQ(sqd_post_send(q, wr, &bad), 0);
}

/* The program's wr_ids are 1000 * (queue + 1) + i: anything else reaching it is a token it never posted. */
static void only_posted_wr_ids(const struct ibv_wc *wc, int n)
{
    for (int i = 0; i < n; i++) {
        uint64_t id = wc[i].wr_id;
        if (id < 1000 || id % 1000 >= SENDS || id / 1000 > QUEUES)
            fail_now("a completion with wr_id %#llx (qp %#x, status %d) reached the program, which never posted it",
                     (unsigned long long)id, wc[i].qp_num, (int)wc[i].status);
    }
}

static struct ibv_qp *qps[QUEUES];

/* QUEUES queues on one CQ, SENDS unsignaled WRs each; every QP has a fatal error, each queue is told, released
 * and freed; only then does the device flush. `before_free` WQEs of each QP execute before the event. */
static void freed_abandoned_queues(int before_free)
{
    struct rig *r = rig_new(QUEUES * (SENDS + 1));
    struct sqd_scripted_qp_caps want = {.max_send_wr = SENDS, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1};
    for (int k = 0; k < QUEUES; k++) {
        struct sqd_queue *q = NULL;
        CHECK_EQ(sqd_scripted_create_qp(r->dev, r->cq, r->cq, &want, &qps[k]), 0);
        struct sqd_queue_attr attr = {.sq_depth = SENDS, .max_send_sge = 1, .signal_interval = SENDS / 2};
        CHECK_EQ(sqd_queue_new(r->scq, NULL, qps[k], &attr, &q), 0);
        post_unsignaled_sends(q, 1000 * (uint64_t)(k + 1), SENDS);
        if (before_free)
            CHECK_EQ(sqd_scripted_complete(qps[k], before_free), before_free);
        CHECK_EQ(sqd_queue_async_event(q, IBV_EVENT_QP_FATAL), 0);
        CHECK_EQ(sqd_queue_free(q), 0);
    }
    for (int k = 0; k < QUEUES; k++)
        CHECK_EQ(sqd_scripted_set_error(qps[k]), 0);
    struct sqd_cq_stats before = cqstats(r->scq);
    int shown_n = poll_all(r->scq);
    only_posted_wr_ids(shown, shown_n);
    CHECK_EQ(shown_n, 0);
    struct sqd_cq_stats after = cqstats(r->scq);
    CHECK_EQ(after.passthrough - before.passthrough, 0);
    CHECK_EQ(after.visible - before.visible, 0);
    CHECK(after.cqes - before.cqes > 0);
    CHECK_EQ(after.stray - before.stray, after.cqes - before.cqes);
    CHECK_EQ(after.queues, 0);
    CHECK_EQ(after.reserved, 0);
    no_violations(r);
}

static void late_completions_of_a_hundred_freed_queues_are_all_dropped(void)
{
    freed_abandoned_queues(0);
    /* Every WQE flushed with its own CQE, and every one was dropped. */
    CHECK_EQ(cqstats(the_rig->scq).stray, QUEUES * SENDS);
}

static void late_completions_after_some_executed_are_all_dropped(void)
{
    /* 3 WQEs of each QP executed before the event (WR 3 signaled by the policy: its CQE covers 0..3), the
     * rest flushes after the free. */
    freed_abandoned_queues(SENDS / 2 + 1);
}

static void a_queue_attached_after_a_freed_one_keeps_its_completions(void)
{
    /* A queue freed after the event, then a new queue of another QP, then the flush of the old one: the new
     * queue's completions reach the program, the old one's do not. */
    struct rig *r = rig_new(64);
    struct mq *fresh;
    struct sqd_scripted_qp_caps want = {.max_send_wr = SENDS, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1};
    struct ibv_qp *old = NULL;
    struct sqd_queue *q = NULL;
    CHECK_EQ(sqd_scripted_create_qp(r->dev, r->cq, r->cq, &want, &old), 0);
    struct sqd_queue_attr attr = {.sq_depth = SENDS, .max_send_sge = 1};
    CHECK_EQ(sqd_queue_new(r->scq, NULL, old, &attr, &q), 0);
    post_unsignaled_sends(q, 1000, SENDS);
    CHECK_EQ(sqd_queue_async_event(q, IBV_EVENT_QP_FATAL), 0);
    CHECK_EQ(sqd_queue_free(q), 0);
    fresh = add_queue(r, (struct qcfg){.sq_depth = SENDS});
    post_unsignaled_sends(fresh->q, 2000, 2);
    CHECK_EQ(sqd_scripted_set_error(old), 0);
    CHECK_EQ(sqd_scripted_set_error(fresh->qp), 0);
    int n = poll_all(r->scq);
    /* The fresh queue's two WRs flush: both shown (error completions always are), with the program's ids. */
    CHECK_EQ(n, 2);
    CHECK_EQ(shown[0].wr_id, 2000);
    CHECK_EQ(shown[1].wr_id, 2001);
    CHECK_EQ(cqstats(r->scq).stray, SENDS);
    CHECK_EQ(cqstats(r->scq).passthrough, 0);
    released_in_order(fresh, 2000, 2);
}

int main(void)
{
    run("late completions of a hundred freed queues are all dropped",
        late_completions_of_a_hundred_freed_queues_are_all_dropped);
    run("late completions after some executed are all dropped", late_completions_after_some_executed_are_all_dropped);
    run("a queue attached after a freed one keeps its completions",
        a_queue_attached_after_a_freed_one_keeps_its_completions);
    return harness_finish("freed_queues");
}
