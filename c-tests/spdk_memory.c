/* What a qpair of SPDK's shape costs through libsqdisc_spdk at rest, and what SPDK sees when the backlog-pool
 * limit of its CQ is reached.
 *   - 1,024 qpairs of the NVMe-oF target's shape (max_send_wr 256, 16 send SGEs, 128 receives of 2 SGEs) on 16
 *     CQs, with the default settings: the heap the provider adds per qpair, over what the device's own QPs of
 *     the same caps take (measured the same way, with raw QPs), is printed and must be at most 16 KiB; so must
 *     each qpair's sqdisc allocation (sqd_queue_stats.bytes, in every mode). The heap figure is not checked
 *     under AddressSanitizer and valgrind, whose allocators mallinfo2 does not see.
 *   - The same shape with SQDISC_SPDK_BACKLOG_LIMIT=0 (no limit; this program run again in a child): each qpair
 *     then keeps room for its whole backlog, well over 16 KiB. A value that is not a number is logged and the
 *     default kept.
 *   - The limit reached under SPDK: three qpairs of 8 on one CQ fill their SQs and park, together, as many WRs as
 *     the default limit (16); the next flush gets what a full SQ gives raw verbs, ENOMEM with *bad_wr at the
 *     first WR not taken, the WRs before it taken; every WR taken completes once with its own wr_id, and the WRs
 *     not taken, flushed again, complete too: nothing is lost.
 * Prints "PASS <name>" per scenario. */

#define _GNU_SOURCE
#include <sqdisc_spdk.h>
#include <sqdisc_sim.h>

#include "support/spdk_standin.h"

#include "support/spdk_world.h"

#include <malloc.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define QPAIRS 1024
#define CQS 16
#define SEND 256
#define SEND_SGE 16
#define RECV 128
#define AT_REST_MAX (16 * 1024)
#define DEFAULT_LIMIT 16

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static int under_valgrind(void)
{
    const char *p = getenv("LD_PRELOAD");
    return p && (strstr(p, "vgpreload") || strstr(p, "valgrind"));
}

static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks;
}

static void spdk_cap(struct ibv_qp_cap *c)
{
    memset(c, 0, sizeof *c);
    c->max_send_wr = SEND;
    c->max_recv_wr = RECV;
    c->max_send_sge = SEND_SGE;
    c->max_recv_sge = 2;
}

/* `n` qpairs of SPDK's shape on `ncq` CQs of `sim`, through the provider (or raw QPs when `raw`); returns the
 * heap they added, and the largest and total sqd_queue_stats.bytes. */
static size_t make_qpairs(struct sqd_sim *sim, struct ibv_cq **cqs, int ncq, int n, int raw, struct rdma_cm_id *ids,
                          struct spdk_rdma_provider_qp **q, struct ibv_qp **rq, uint64_t *max_bytes,
                          uint64_t *sum_bytes)
{
    size_t before = heap_in_use();
    *max_bytes = *sum_bytes = 0;
    for (int i = 0; i < n; i++) {
        struct ibv_cq *cq = cqs[i % ncq];
        if (raw) {
            struct ibv_qp_init_attr a;
            memset(&a, 0, sizeof a);
            a.send_cq = a.recv_cq = cq;
            a.qp_type = IBV_QPT_RC;
            spdk_cap(&a.cap);
            CHECK_EQ(sqd_sim_create_qp(sim, &a, &rq[i]), 0);
            continue;
        }
        struct spdk_rdma_provider_qp_init_attr a;
        memset(&a, 0, sizeof a);
        memset(&ids[i], 0, sizeof ids[i]);
        a.qp_context = &ids[i];
        a.send_cq = a.recv_cq = cq;
        a.pd = sqd_sim_pd(sim);
        spdk_cap(&a.cap);
        q[i] = spdk_rdma_provider_qp_create(&ids[i], &a);
        CHECK(q[i] != NULL);
    }
    size_t added = heap_in_use() - before;
    for (int i = 0; !raw && i < n; i++) {
        struct sqd_queue_stats s;
        CHECK_EQ(sqd_spdk_qp_stats(q[i], &s), 0);
        *sum_bytes += s.bytes;
        if (s.bytes > *max_bytes)
            *max_bytes = s.bytes;
    }
    return added;
}

static struct sqd_sim *sim_with_cqs(struct ibv_cq **cqs, int ncq, int per_cq)
{
    struct sqd_sim_config cfg;
    struct sqd_sim *sim = NULL;
    sqd_sim_config_default(&cfg);
    CHECK_EQ(sqd_sim_new(&cfg, &sim), 0);
    standin.sim = sim;
    /* Room for every qpair's reservation: max_send_wr + 1 and max_recv_wr each. */
    for (int i = 0; i < ncq; i++)
        CHECK_EQ(sqd_sim_create_cq(sim, per_cq * (SEND + 1 + RECV), &cqs[i]), 0);
    return sim;
}

static void spdk_shaped_qpairs_are_small_at_rest(void)
{
    static struct rdma_cm_id ids[QPAIRS];
    static struct spdk_rdma_provider_qp *q[QPAIRS];
    static struct ibv_qp *rq[QPAIRS];
    struct ibv_cq *cqs[CQS];
    uint64_t max_bytes, sum_bytes, unused;
    current = "spdk_shaped_qpairs_are_small_at_rest";
    struct sqd_sim *sim = sim_with_cqs(cqs, CQS, QPAIRS / CQS);

    size_t raw = make_qpairs(sim, cqs, CQS, QPAIRS, 1, ids, q, rq, &unused, &unused);
    for (int i = 0; i < QPAIRS; i++)
        CHECK_EQ(sqd_sim_destroy_qp(rq[i]), 0);
    size_t ours = make_qpairs(sim, cqs, CQS, QPAIRS, 0, ids, q, rq, &max_bytes, &sum_bytes);
    long per_qpair = ((long)ours - (long)raw) / QPAIRS;
    printf("%s: %d qpairs (max_send_wr %d, %d SGEs, %d receives) on %d CQs: heap %zu bytes through the provider, "
           "%zu for the device's raw QPs alone: %ld bytes per qpair added by the provider; sqdisc's allocation per "
           "qpair (sqd_queue_stats.bytes) %llu on average, %llu at most\n",
           current, QPAIRS, SEND, SEND_SGE, RECV, CQS, ours, raw, per_qpair,
           (unsigned long long)(sum_bytes / QPAIRS), (unsigned long long)max_bytes);
    CHECK(max_bytes <= AT_REST_MAX);
    for (int i = 0; i < QPAIRS; i++)
        spdk_rdma_provider_qp_destroy(q[i]);
    for (int i = 0; i < CQS; i++)
        CHECK_EQ(sqd_sim_destroy_cq(cqs[i]), 0);
    CHECK_EQ(sqd_sim_free(sim), 0);
    CHECK_EQ(standin.domain.refs, 0);
    if (UNDER_ASAN || under_valgrind()) {
        printf("SKIP %s heap figure: the heap is %s's, which mallinfo2 does not see\n", current,
               UNDER_ASAN ? "AddressSanitizer" : "valgrind");
    } else {
        CHECK(per_qpair > 0 && per_qpair <= AT_REST_MAX);
    }
    printf("PASS %s\n", current);
}

/* The child: one qpair of SPDK's shape, its sqd_queue_stats.bytes printed as "bytes=N". */
static int one_qpair_bytes(void)
{
    struct ibv_cq *cq;
    struct rdma_cm_id id;
    struct spdk_rdma_provider_qp *q;
    struct ibv_qp *rq;
    uint64_t max_bytes, sum_bytes;
    current = "child";
    struct sqd_sim *sim = sim_with_cqs(&cq, 1, 1);
    size_t raw = make_qpairs(sim, &cq, 1, 1, 1, &id, &q, &rq, &max_bytes, &sum_bytes);
    CHECK_EQ(sqd_sim_destroy_qp(rq), 0);
    size_t ours = make_qpairs(sim, &cq, 1, 1, 0, &id, &q, &rq, &max_bytes, &sum_bytes);
    printf("bytes=%llu errors=%d heap=%ld\n", (unsigned long long)max_bytes, standin.errors, (long)ours - (long)raw);
    spdk_rdma_provider_qp_destroy(q);
    CHECK_EQ(sqd_sim_destroy_cq(cq), 0);
    CHECK_EQ(sqd_sim_free(sim), 0);
    return 0;
}

/* Runs this program as the child with SQDISC_SPDK_BACKLOG_LIMIT=`value`; returns its bytes and log errors. */
static void child_bytes(const char *self, const char *value, unsigned long long *bytes, int *errors)
{
    int fd[2];
    CHECK_EQ(pipe(fd), 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        setenv("SQDISC_SPDK_BACKLOG_LIMIT", value, 1);
        execl(self, self, "one-qpair", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char buf[256] = {0};
    size_t got = 0;
    ssize_t r;
    while (got + 1 < sizeof buf && (r = read(fd[0], buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)r;
    close(fd[0]);
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_EQ(sscanf(buf, "bytes=%llu errors=%d", bytes, errors), 2);
}

static void the_limit_is_set_by_the_environment(const char *self)
{
    unsigned long long unlimited, bad, set;
    int e_unlimited, e_bad, e_set;
    current = "the_limit_is_set_by_the_environment";
    child_bytes(self, "0", &unlimited, &e_unlimited);
    child_bytes(self, "many", &bad, &e_bad);
    child_bytes(self, "16", &set, &e_set);
    printf("%s: one qpair of SPDK's shape: %llu bytes with SQDISC_SPDK_BACKLOG_LIMIT=0 (no limit), %llu with the "
           "default (an invalid value), %llu with 16\n", current, unlimited, bad, set);
    CHECK(unlimited > 4 * AT_REST_MAX);
    CHECK_EQ(e_unlimited, 0);
    CHECK_EQ(e_bad, 1); /* logged */
    CHECK(bad <= AT_REST_MAX && bad == set);
    CHECK_EQ(e_set, 0);
    printf("PASS %s\n", current);
}

static void reaching_the_limit_looks_like_a_full_sq_and_loses_nothing(void)
{
    struct world w;
    struct rdma_cm_id id[3];
    struct spdk_rdma_provider_qp *q[3];
    struct ibv_qp *peer[3];
    enum { DEPTH = 8, N = 2 * DEPTH };
    static struct ibv_send_wr wrs[3][N];
    static struct ibv_sge sges[3][N];
    struct ibv_send_wr *bad = NULL;
    struct ibv_wc wc[64];
    current = "reaching_the_limit_looks_like_a_full_sq_and_loses_nothing";
    world_new(&w, NULL, 1024);
    for (int k = 0; k < 3; k++) {
        q[k] = qpair_new(&w, &id[k], DEPTH, 8, NULL, NULL);
        CHECK(q[k] != NULL);
        peer[k] = peer_connect(&w, q[k]->qp, 0);
        /* 16 WRITEs per qpair, every eighth signaled; wr_ids k*100 + i. */
        for (int i = 0; i < N; i++)
            write_wr(&w, &wrs[k][i], &sges[k][i], (uint64_t)k * 100 + (uint64_t)i, i % DEPTH == DEPTH - 1);
        link_wrs(wrs[k], N);
    }
    w.peer.qp = NULL;
    /* Qpairs 0 and 1: 8 WRs into the SQ, 8 parked each: 16 parked on the CQ, its limit. */
    for (int k = 0; k < 2; k++) {
        spdk_rdma_provider_qp_queue_send_wrs(q[k], wrs[k]);
        CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q[k], &bad), 0);
        CHECK(bad == NULL);
        CHECK_EQ(qstats(q[k]).backlog, DEPTH);
    }
    /* Qpair 2: 8 into its SQ; the ninth would park past the limit: ENOMEM, *bad_wr at it, as raw verbs'
     * ibv_post_send on a full SQ. */
    spdk_rdma_provider_qp_queue_send_wrs(q[2], wrs[2]);
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q[2], &bad), ENOMEM);
    CHECK(bad == &wrs[2][DEPTH]);
    CHECK_EQ(qstats(q[2]).accepted, DEPTH);
    CHECK_EQ(qstats(q[2]).backlog, 0);
    /* SPDK's chain is as it was: the WRs not taken still linked in order. */
    for (int i = DEPTH; i < N; i++) {
        CHECK_EQ(wrs[2][i].wr_id, 200u + (unsigned)i);
        CHECK(wrs[2][i].next == (i + 1 < N ? &wrs[2][i + 1] : NULL));
    }
    /* Every WR taken completes: the signaled ones show (two per qpair for 0 and 1, one for 2). */
    int seen[3] = {0};
    int got = reap(&w, wc, 64, 5, 100000);
    CHECK_EQ(got, 5);
    for (int i = 0; i < got; i++) {
        CHECK_EQ(wc[i].status, IBV_WC_SUCCESS);
        int k = (int)(wc[i].wr_id / 100), j = (int)(wc[i].wr_id % 100);
        CHECK(k >= 0 && k < 3 && j == DEPTH * (seen[k] + 1) - 1);
        seen[k]++;
    }
    CHECK(seen[0] == 2 && seen[1] == 2 && seen[2] == 1);
    for (int k = 0; k < 3; k++) {
        struct sqd_queue_stats s = qstats(q[k]);
        CHECK_EQ(s.released, k < 2 ? N : DEPTH);
        CHECK_EQ(s.backlog, 0);
    }
    /* The WRs not taken, flushed again, complete too. */
    spdk_rdma_provider_qp_queue_send_wrs(q[2], bad);
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q[2], &bad), 0);
    CHECK_EQ(reap(&w, wc, 64, 1, 100000), 1);
    CHECK_EQ(wc[0].wr_id, 200u + N - 1);
    CHECK_EQ(qstats(q[2]).released, N);
    CHECK_EQ(reap(&w, wc, 64, 1, 10), 0);
    for (int k = 0; k < 3; k++) {
        spdk_rdma_provider_qp_destroy(q[k]);
        CHECK_EQ(sqd_sim_destroy_qp(peer[k]), 0);
    }
    world_free(&w);
    printf("PASS %s\n", current);
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "one-qpair"))
        return one_qpair_bytes();
    if (getenv("SQDISC_SPDK_BACKLOG_LIMIT")) {
        printf("SKIP spdk_memory: SQDISC_SPDK_BACKLOG_LIMIT is set in the environment\n");
        return 0;
    }
    spdk_shaped_qpairs_are_small_at_rest();
    reaching_the_limit_looks_like_a_full_sq_and_loses_nothing();
    the_limit_is_set_by_the_environment(argv[0]);
    return 0;
}
