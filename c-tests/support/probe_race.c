/* Probe for scripts/tsan.sh: a thread posts to a queue while another polls its CQ, on a CQ made WITHOUT
 * SQD_CQ_THREAD_SAFE, which the API forbids. ThreadSanitizer must report a data race inside the library;
 * if it does not, a clean threads.c run would prove nothing.
 *
 * The two threads share only relaxed atomics, which order nothing: so however the scheduler runs them (the
 * poster may finish before the poller starts), no happens-before edge hides the library's accesses from each
 * other, and the poster keeps posting until the poller has polled a while, so that their accesses overlap in
 * time as well. */
#include <sqdisc.h>
#include <sqdisc_sim.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

static struct sqd_queue *q;
static atomic_int stop, polls; /* atomic, relaxed: the only races are the library's */

static void *poster(void *arg)
{
    (void)arg;
    static char buf[64];
    for (int i = 0; i < 2000 || atomic_load_explicit(&polls, memory_order_relaxed) < 200; i++) {
        struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = sizeof buf, .lkey = 1};
        struct ibv_send_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND}, *bad;
        sqd_post_send(q, &wr, &bad);
    }
    atomic_store_explicit(&stop, 1, memory_order_relaxed);
    return NULL;
}

int main(void)
{
    struct sqd_sim_config cfg;
    sqd_sim_config_default(&cfg);
    cfg.flags = SQD_SIM_NULL;
    struct sqd_sim *sim;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    sqd_sim_new(&cfg, &sim);
    sqd_sim_create_cq(sim, 256, &cq);
    struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 32, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
    sqd_sim_create_qp(sim, &qa, &qp);
    struct sqd_cq *scq;
    sqd_cq_new(cq, &scq); /* no SQD_CQ_THREAD_SAFE: the race below is the caller's bug */
    struct sqd_queue_attr attr = {.sq_depth = qa.cap.max_send_wr, .max_send_sge = 1, .backlog_depth = 4096};
    sqd_queue_new(scq, NULL, qp, &attr, &q);
    pthread_t t;
    pthread_create(&t, NULL, poster, NULL);
    struct ibv_wc wc[16];
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        sqd_cq_poll(scq, 16, wc);
        atomic_fetch_add_explicit(&polls, 1, memory_order_relaxed);
    }
    pthread_join(t, NULL);
    return 0; /* leaks on purpose: the probe only has to race */
}
