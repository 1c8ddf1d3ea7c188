/* Event mode: a post made after the poller armed the CQ must still produce a completion. Unsignaled WRs
 * produce no CQE, and a poller asleep on the completion channel polls only when one raises an event, so a post
 * that leaves an unsignaled tail on a queue whose CQ is armed must leave a signaled WQE behind it (sqd_cq_arm,
 * SQD_CQ_THREAD_SAFE). Two scenarios on the software HCA's null mode (every WQE completes at post; signaled
 * ones raise the event of an armed CQ):
 *   - another thread posts while the poller sleeps on the channel's fd, on a SQD_CQ_THREAD_SAFE CQ;
 *   - the poller itself arms, posts, then sleeps.
 * A poller sleep that ends without an event (POLLER_SLEEP_MS, far beyond what a covered tail needs) fails the
 * test: the releases would have waited for a wakeup that may never come. */

#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include "support/harness.h"

#include <sqdisc_sim.h>

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#define ROUNDS 4
#define PER_ROUND 3        /* unsignaled WRs per post: fewer than the signal interval */
#define POLLER_SLEEP_MS 10000
#define DEPTH 16

struct world {
    struct sqd_sim *sim;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct sqd_cq *scq;
    struct sqd_queue *q;
    atomic_ullong released;
    atomic_int wrong_status;
    /* the poller thread */
    atomic_int sleeping;  /* armed (sqd_cq_arm returned 0) and about to sleep or asleep on the fd */
    atomic_int timed_out; /* a sleep ended without an event */
    atomic_int arm_error;
    atomic_int wakeups;
};
static struct world w;

static void count_release(void *ctx, const struct sqd_completion *c)
{
    struct world *x = ctx;
    if (c->status != IBV_WC_SUCCESS)
        atomic_fetch_add(&x->wrong_status, 1);
    atomic_fetch_add(&x->released, 1);
}

static long long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Takes and acknowledges every completion event queued on the channel; returns how many. */
static int take_events(void)
{
    struct ibv_cq *ev_cq;
    void *ev_ctx;
    int n = 0;
    while (sqd_sim_get_cq_event(w.ch, &ev_cq, &ev_ctx) == 0) {
        sqd_sim_ack_cq_events(ev_cq, 1);
        n++;
    }
    return n;
}

static void world_new(uint32_t cq_flags)
{
    memset(&w, 0, sizeof w);
    struct sqd_sim_config cfg;
    sqd_sim_config_default(&cfg);
    cfg.flags = SQD_SIM_NULL | SQD_SIM_STRICT;
    CHECK_EQ(sqd_sim_new(&cfg, &w.sim), 0);
    CHECK_EQ(sqd_sim_create_comp_channel(w.sim, &w.ch), 0);
    CHECK_EQ(sqd_sim_create_cq_ex(w.sim, 4 * DEPTH, w.ch, NULL, 0, &w.cq), 0);
    struct ibv_qp_init_attr qa = {.send_cq = w.cq, .recv_cq = w.cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = DEPTH, .max_recv_wr = 1, .max_send_sge = 1,
                                          .max_recv_sge = 1}};
    CHECK_EQ(sqd_sim_create_qp(w.sim, &qa, &w.qp), 0);
    CHECK_EQ(sqd_cq_new_ex(w.cq, cq_flags, &w.scq), 0);
    struct sqd_queue_attr attr = {.sq_depth = qa.cap.max_send_wr, .max_send_sge = 1, .signal_interval = 8,
                                  .release = count_release, .release_ctx = &w};
    CHECK_EQ(sqd_queue_new(w.scq, NULL, w.qp, &attr, &w.q), 0);
}

static void world_free(void)
{
    struct ibv_wc wc[16];
    for (int i = 0; i < 4 && w.scq; i++) /* a failed scenario may leave a tail for the polls to cover */
        sqd_cq_poll(w.scq, 16, wc);
    if (w.q && sqd_queue_free(w.q) != 0)
        printf("FAIL %s: teardown: the queue cannot be freed: %s\n", current, sqd_last_error());
    if (w.scq && sqd_cq_free(w.scq) != 0)
        printf("FAIL %s: teardown: the CQ cannot be freed: %s\n", current, sqd_last_error());
    take_events();
    sqd_sim_free(w.sim);
    w.q = NULL;
    w.scq = NULL;
    w.sim = NULL;
}

/* Posts PER_ROUND unsignaled SENDs, with wr_ids from `first`. */
static int post_unsignaled(uint64_t first)
{
    static char buf[8];
    struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = sizeof buf, .lkey = 1};
    struct ibv_send_wr wr[PER_ROUND], *bad = NULL;
    for (int i = 0; i < PER_ROUND; i++)
        wr[i] = (struct ibv_send_wr){.wr_id = first + (uint64_t)i, .next = i + 1 < PER_ROUND ? &wr[i + 1] : NULL,
                                     .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND};
    return sqd_post_send(w.q, wr, &bad);
}

/* The poller: arm, sleep on the fd until an event, take it, repeat until every WR is released. */
static void *poller(void *arg)
{
    (void)arg;
    struct ibv_wc wc[16];
    while (atomic_load(&w.released) < (unsigned long long)ROUNDS * PER_ROUND) {
        int n = sqd_cq_arm(w.scq, 0, 16, wc);
        if (n < 0) {
            atomic_store(&w.arm_error, n);
            break;
        }
        if (n > 0)
            continue; /* handled; arm (and poll) again before sleeping */
        if (atomic_load(&w.released) >= (unsigned long long)ROUNDS * PER_ROUND)
            break;
        atomic_store(&w.sleeping, 1);
        struct pollfd p = {.fd = w.ch->fd, .events = POLLIN, .revents = 0};
        int r = poll(&p, 1, POLLER_SLEEP_MS);
        atomic_store(&w.sleeping, 0);
        if (r <= 0) {
            atomic_store(&w.timed_out, 1);
            break;
        }
        atomic_fetch_add(&w.wakeups, take_events());
    }
    return NULL;
}

static void another_thread_posts_while_the_poller_sleeps(void)
{
    world_new(SQD_CQ_THREAD_SAFE);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, poller, NULL), 0);
    int failed_round = -1, post_rc = 0;
    for (int round = 0; round < ROUNDS && failed_round < 0; round++) {
        /* Wait for the poller to arm and go to sleep (bounded: it does so at once). */
        long long start = now_ms();
        while (!atomic_load(&w.sleeping) && !atomic_load(&w.timed_out) && now_ms() - start < POLLER_SLEEP_MS)
            sched_yield();
        post_rc = post_unsignaled((uint64_t)round * PER_ROUND);
        if (post_rc != 0) {
            failed_round = round;
            break;
        }
        /* The releases come once the poller is woken; it gives up after POLLER_SLEEP_MS without an event. */
        while (atomic_load(&w.released) < (unsigned long long)(round + 1) * PER_ROUND && !atomic_load(&w.timed_out) &&
               !atomic_load(&w.arm_error))
            sched_yield();
        if (atomic_load(&w.released) < (unsigned long long)(round + 1) * PER_ROUND)
            failed_round = round;
    }
    CHECK_EQ(pthread_join(t, NULL), 0);
    CHECK_EQ(post_rc, 0);
    CHECK_EQ(atomic_load(&w.arm_error), 0);
    if (atomic_load(&w.timed_out))
        fail_now("round %d: the poller slept %d ms on the channel without an event: the unsignaled WRs another "
                 "thread posted after sqd_cq_arm produced no completion (%llu of %d released)",
                 failed_round, POLLER_SLEEP_MS, (unsigned long long)atomic_load(&w.released), ROUNDS * PER_ROUND);
    CHECK_EQ(failed_round, -1);
    CHECK_EQ(atomic_load(&w.released), ROUNDS * PER_ROUND);
    CHECK_EQ(atomic_load(&w.wrong_status), 0);
    struct sqd_queue_stats st;
    CHECK_EQ(sqd_queue_stats(w.q, &st), 0);
    CHECK_EQ(st.accepted, ROUNDS * PER_ROUND);
    CHECK_EQ(st.released, ROUNDS * PER_ROUND);
    CHECK_EQ(st.in_provider, 0);
    CHECK_EQ(sqd_sim_violation_count(w.sim), 0);
    world_free();
}

static void the_poller_posts_after_arming(void)
{
    world_new(0);
    struct ibv_wc wc[16];
    CHECK_EQ(sqd_cq_arm(w.scq, 0, 16, wc), 0);
    CHECK_EQ(post_unsignaled(0), 0);
    /* About to sleep: the post must have left something that raises the event. */
    struct pollfd p = {.fd = w.ch->fd, .events = POLLIN, .revents = 0};
    int r = poll(&p, 1, POLLER_SLEEP_MS);
    if (r != 1)
        fail_now("the channel stayed quiet for %d ms after unsignaled WRs were posted on an armed CQ",
                 POLLER_SLEEP_MS);
    CHECK_EQ(take_events(), 1);
    CHECK_EQ(sqd_cq_poll(w.scq, 16, wc), 0); /* the cover is the library's own: nothing to show */
    CHECK_EQ(atomic_load(&w.released), PER_ROUND);
    struct sqd_queue_stats st;
    CHECK_EQ(sqd_queue_stats(w.q, &st), 0);
    CHECK_EQ(st.markers, 1);
    /* Once polled, the CQ is no longer armed: a post leaves its tail to the polls, as in polling mode. */
    CHECK_EQ(post_unsignaled(PER_ROUND), 0);
    CHECK_EQ(sqd_queue_stats(w.q, &st), 0);
    CHECK_EQ(st.markers, 1);
    CHECK_EQ(st.in_provider, PER_ROUND);
    for (int i = 0; i < 3; i++) /* the second poll covers the idle tail, the third reaps the cover */
        CHECK_EQ(sqd_cq_poll(w.scq, 16, wc), 0);
    CHECK_EQ(atomic_load(&w.released), 2 * PER_ROUND);
    CHECK_EQ(sqd_sim_violation_count(w.sim), 0);
    world_free();
}

int main(void)
{
    run("another thread posts unsignaled WRs while the poller sleeps on the armed CQ",
        another_thread_posts_while_the_poller_sleeps);
    if (w.sim)
        world_free();
    run("the poller posts unsignaled WRs after arming, then sleeps", the_poller_posts_after_arming);
    if (w.sim)
        world_free();
    return harness_finish("armed_tail");
}
