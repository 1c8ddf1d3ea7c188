/* spdk_poll_bench: what libsqdisc_spdk's interposed poll_cq costs each ibv_poll_cq, on the null provider of the
 * benchmarks (benches/null_provider.h).
 *
 * The first qpair libsqdisc_spdk makes on a device context replaces the context's poll_cq op, so every CQ of
 * that context is polled through the provider from then on, whether a qpair of the provider uses it or not.
 * Each mode polls one empty CQ -n times (SPDK's pollers poll their CQs continuously, mostly finding nothing):
 *
 *   unpatched    no qpair of the provider on the context: ibv_poll_cq reaches the device's op directly
 *   passthrough  a qpair of the provider on another CQ of the context: the polled CQ has no managed QP and
 *                goes through the provider's lookup to the device's op
 *   managed      the polled CQ is the one the provider's qpair uses: polled through sqdisc
 *
 * usage: spdk_poll_bench unpatched|passthrough|managed [-n polls]
 * Instructions per poll come from two callgrind runs, -n N and -n 0, subtracted (scripts/bench-spdk.sh). */

#include <sqdisc_spdk.h>

#include "null_provider.h"
#include "spdk_null_standin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIE(...)                                                                                             \
    do {                                                                                                     \
        fprintf(stderr, "spdk_poll_bench: " __VA_ARGS__);                                                    \
        fprintf(stderr, " (line %d; last log: %s)\n", __LINE__, bench.last_log);                          \
        exit(1);                                                                                             \
    } while (0)

int main(int argc, char **argv)
{
    if (argc < 2)
        DIE("usage: spdk_poll_bench unpatched|passthrough|managed [-n polls]");
    const char *mode = argv[1];
    int patched = strcmp(mode, "unpatched") != 0, managed = strcmp(mode, "managed") == 0;
    if (patched && !managed && strcmp(mode, "passthrough") != 0)
        DIE("unknown mode %s", mode);
    unsigned long n = 100000;
    if (argc == 4 && !strcmp(argv[2], "-n"))
        n = strtoul(argv[3], NULL, 10);
    else if (argc != 2)
        DIE("usage: spdk_poll_bench unpatched|passthrough|managed [-n polls]");

    bench.dev = null_device_new();
    if (!bench.dev)
        DIE("null_device_new");
    struct ibv_cq *qp_cq = null_create_cq(bench.dev, 1024), *other_cq = null_create_cq(bench.dev, 1024);
    if (!qp_cq || !other_cq)
        DIE("create_cq");
    struct ibv_pd pd; /* the null device has no PD: one stands for it */
    memset(&pd, 0, sizeof pd);
    pd.context = qp_cq->context;
    struct rdma_cm_id id;
    memset(&id, 0, sizeof id);
    struct spdk_rdma_provider_qp *q = NULL;
    if (patched) {
        struct spdk_rdma_provider_qp_init_attr a;
        memset(&a, 0, sizeof a);
        a.send_cq = a.recv_cq = qp_cq;
        a.pd = &pd;
        a.cap.max_send_wr = 64;
        a.cap.max_recv_wr = 64;
        a.cap.max_send_sge = a.cap.max_recv_sge = 1;
        q = spdk_rdma_provider_qp_create(&id, &a);
        if (!q)
            DIE("qp_create");
    }
    struct ibv_cq *polled = managed ? qp_cq : other_cq;
    struct ibv_wc wc[32];
    unsigned long found = 0;
    for (unsigned long i = 0; i < n; i++) {
        int got = ibv_poll_cq(polled, 32, wc);
        if (got < 0)
            DIE("poll: %d", got);
        found += (unsigned long)got;
    }
    printf("mode=%s polls=%lu completions=%lu\n", mode, n, found);
    spdk_rdma_provider_qp_destroy(q);
    if (null_destroy_cq(qp_cq) || null_destroy_cq(other_cq) || null_device_free(bench.dev))
        DIE("teardown");
    return 0;
}
