/* Thread-safe mode: several threads post to their own queues on one SQD_CQ_THREAD_SAFE CQ while another
 * thread polls it, on the software HCA's null mode. Every WR must be released exactly once, in post order per
 * queue, the CQ must never overrun, and the device must log no violation. */

#include "support/harness.h"

#include <sqdisc_sim.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#define POSTERS 4
#define PER_THREAD 5000
#define DEPTH 32

struct poster {
    struct sqd_queue *q;
    uint64_t next_release;          /* only touched by release callbacks, which run under the CQ's lock */
    atomic_int order_errors;
    atomic_int status_errors;
    atomic_ullong released;
    atomic_int post_errors;
    unsigned seed;
};

static atomic_int posters_done;

static void on_poster_release(void *ctx, const struct sqd_completion *c)
{
    struct poster *p = ctx;
    if (c->wr_id != p->next_release)
        atomic_fetch_add(&p->order_errors, 1);
    if (c->status != IBV_WC_SUCCESS)
        atomic_fetch_add(&p->status_errors, 1);
    p->next_release = c->wr_id + 1;
    atomic_fetch_add(&p->released, 1);
}

static void *post_loop(void *arg)
{
    struct poster *p = arg;
    static char buf[64];
    struct ibv_sge sge[8];
    struct ibv_send_wr wr[8], *bad;
    uint64_t id = 0;
    while (id < PER_THREAD) {
        p->seed = p->seed * 1103515245u + 12345u; /* a small LCG: rand_r is not C11 */
        unsigned n = 1 + (p->seed >> 16) % 8;
        if (n > PER_THREAD - id)
            n = (unsigned)(PER_THREAD - id);
        for (unsigned i = 0; i < n; i++) {
            sge[i] = (struct ibv_sge){.addr = (uintptr_t)buf, .length = sizeof buf, .lkey = 1};
            wr[i] = (struct ibv_send_wr){.wr_id = id + i, .next = i + 1 < n ? &wr[i + 1] : NULL, .sg_list = &sge[i],
                                         .num_sge = 1, .opcode = IBV_WR_SEND,
                                         .send_flags = (id + i) % 97 == 0 ? IBV_SEND_SIGNALED : 0};
        }
        int rc = sqd_post_send(p->q, wr, &bad);
        if (rc == 0) {
            id += n;
        } else if (rc == -EAGAIN) {
            id += (uint64_t)(bad - wr); /* the WRs before *bad_wr were accepted */
            sched_yield();
        } else {
            atomic_fetch_add(&p->post_errors, 1);
            break;
        }
    }
    atomic_fetch_add(&posters_done, 1);
    return NULL;
}

static void posters_and_a_poller(void)
{
    struct sqd_sim_config cfg;
    sqd_sim_config_default(&cfg);
    cfg.flags = SQD_SIM_NULL | SQD_SIM_STRICT;
    struct sqd_sim *sim = NULL;
    CHECK_EQ(sqd_sim_new(&cfg, &sim), 0);
    struct ibv_cq *cq = NULL;
    CHECK_EQ(sqd_sim_create_cq(sim, POSTERS * (DEPTH + 1), &cq), 0);
    struct sqd_cq *scq = NULL;
    CHECK_EQ(sqd_cq_new_ex(cq, SQD_CQ_THREAD_SAFE, &scq), 0);

    static struct poster posters[POSTERS];
    for (int i = 0; i < POSTERS; i++) {
        struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                      .cap = {.max_send_wr = DEPTH, .max_recv_wr = 1, .max_send_sge = 1,
                                              .max_recv_sge = 1}};
        struct ibv_qp *qp = NULL;
        CHECK_EQ(sqd_sim_create_qp(sim, &qa, &qp), 0);
        memset(&posters[i], 0, sizeof posters[i]);
        posters[i].seed = 1234u + (unsigned)i;
        struct sqd_queue_attr attr = {.sq_depth = qa.cap.max_send_wr, .max_send_sge = 1, .backlog_depth = 16,
                                      .release = on_poster_release, .release_ctx = &posters[i]};
        CHECK_EQ(sqd_queue_new(scq, NULL, qp, &attr, &posters[i].q), 0);
    }

    atomic_store(&posters_done, 0);
    pthread_t t[POSTERS];
    for (int i = 0; i < POSTERS; i++)
        CHECK_EQ(pthread_create(&t[i], NULL, post_loop, &posters[i]), 0);

    /* The poller: this thread. */
    struct ibv_wc wc[16];
    unsigned long long shown = 0, total = 0;
    long polls = 0;
    while (total < (unsigned long long)POSTERS * PER_THREAD && polls < 100000000L) {
        int n = sqd_cq_poll(scq, 16, wc);
        CHECK(n >= 0);
        shown += (unsigned long long)n;
        polls++;
        total = 0;
        for (int i = 0; i < POSTERS; i++)
            total += atomic_load(&posters[i].released);
        if (n == 0 && atomic_load(&posters_done) < POSTERS)
            sched_yield();
    }
    for (int i = 0; i < POSTERS; i++)
        CHECK_EQ(pthread_join(t[i], NULL), 0);

    unsigned long long signaled = 0;
    for (int i = 0; i < POSTERS; i++) {
        struct poster *p = &posters[i];
        CHECK_EQ(atomic_load(&p->post_errors), 0);
        CHECK_EQ(atomic_load(&p->released), PER_THREAD);
        CHECK_EQ(atomic_load(&p->order_errors), 0);
        CHECK_EQ(atomic_load(&p->status_errors), 0);
        struct sqd_queue_stats st;
        CHECK_EQ(sqd_queue_stats(p->q, &st), 0);
        CHECK_EQ(st.accepted, PER_THREAD);
        CHECK_EQ(st.released, PER_THREAD);
        signaled += st.signaled_by_ulp;
        CHECK_EQ(sqd_queue_free(p->q), 0);
    }
    CHECK_EQ(shown, signaled); /* exactly the ULP-signaled completions were shown */
    CHECK_EQ(sqd_sim_violation_count(sim), 0);
    CHECK_EQ(sqd_cq_free(scq), 0);
    sqd_sim_free(sim);
}

int main(void)
{
    run("posters_and_a_poller_on_a_thread_safe_cq", posters_and_a_poller);
    return harness_finish("threads");
}
