/* libsqdisc_spdk over a process's life: device contexts and CQs come and go (device resets, hot-plug: each
 * re-add is a new ibv_context), and the provider keeps no limit on how many and nothing of those that went.
 *   - 1,000 device contexts opened, used and closed, up to 100 of them open at once, each with a qpair that
 *     sends and receives its completion through the provider; every qpair is created;
 *   - 100,000 connect/disconnect cycles on 4 devices that are closed and reopened every 1,000 cycles: the
 *     heap in use after each block of 1,000 (devices closed) stays within a bound of its level after the
 *     first block, and is printed. The bound (64 KiB) is far above what the allocator's own bookkeeping
 *     moves, and far below what a leak of one small allocation per cycle (99,000 of them) or per device
 *     reopened (396) would add. Under valgrind the cycles are 10,000 (its own leak check covers the rest);
 *     under AddressSanitizer and valgrind, whose allocators mallinfo2 does not see, the figure is not checked.
 * Prints "PASS <name>" per scenario. */

#define _GNU_SOURCE
#include <sqdisc_spdk.h>
#include <sqdisc_sim.h>

#include "support/spdk_standin.h"

#include "support/spdk_world.h"

#include <malloc.h>
#include <stdlib.h>

#define CONTEXTS 1000
#define OPEN_AT_ONCE 100
#define DEVICES 4
#define BLOCK 1000
#define CYCLES 100000
#define FLAT_BOUND (64 * 1024)

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

/* world_free without its check that no memory domain is held: other devices' qpairs hold theirs. */
static void device_free(struct world *w)
{
    if (w->peer.qp)
        CHECK_EQ(sqd_sim_destroy_qp(w->peer.qp), 0);
    CHECK_EQ(sqd_sim_destroy_cq(w->peer.cq), 0);
    CHECK_EQ(sqd_sim_destroy_cq(w->cq), 0);
    CHECK_EQ(sqd_sim_dereg_mr(w->mr), 0);
    CHECK_EQ(sqd_sim_dereg_mr(w->peer.mr), 0);
    CHECK_EQ(sqd_sim_violation_count(w->sim), 0);
    sqd_sim_free(w->sim);
    free(w->buf);
    free(w->peer.buf);
    memset(w, 0, sizeof *w);
}

/* A qpair on `w` (made the current device of the stand-in), connected to a fresh peer QP with two receives. */
static struct spdk_rdma_provider_qp *connect_qpair(struct world *w, struct rdma_cm_id *id)
{
    standin.sim = w->sim;
    struct spdk_rdma_provider_qp *q = qpair_new(w, id, 16, 8, NULL, NULL);
    CHECK(q != NULL);
    peer_connect(w, q->qp, 2);
    return q;
}

/* One signaled SEND through the provider, its completion polled through the device's patched context. */
static void send_one(struct world *w, struct spdk_rdma_provider_qp *q, uint64_t id)
{
    struct ibv_send_wr wr, *bad = NULL;
    struct ibv_sge s;
    struct ibv_wc wc[4];
    send_wr(w, &wr, &s, id);
    CHECK(spdk_rdma_provider_qp_queue_send_wrs(q, &wr));
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), 0);
    CHECK_EQ(reap(w, wc, 4, 1, 100000), 1);
    CHECK_EQ(wc[0].wr_id, id);
    CHECK_EQ(wc[0].status, IBV_WC_SUCCESS);
}

/* Disconnect (the QP to the error state: nothing outstanding, nothing to flush) and destroy. */
static void disconnect_qpair(struct world *w, struct spdk_rdma_provider_qp *q)
{
    struct ibv_wc wc[4];
    CHECK_EQ(spdk_rdma_provider_qp_disconnect(q), 0);
    CHECK_EQ(reap(w, wc, 4, 1, 3), 0);
    spdk_rdma_provider_qp_destroy(q);
    CHECK_EQ(sqd_sim_destroy_qp(w->peer.qp), 0);
    w->peer.qp = NULL;
}

static void a_thousand_device_contexts_open_use_and_close(void)
{
    static struct world dev[OPEN_AT_ONCE];
    static struct rdma_cm_id ids[OPEN_AT_ONCE];
    struct spdk_rdma_provider_qp *q[OPEN_AT_ONCE] = {0};
    current = "a_thousand_device_contexts_open_use_and_close";
    for (int i = 0; i < CONTEXTS; i++) {
        int k = i % OPEN_AT_ONCE;
        if (q[k]) {
            disconnect_qpair(&dev[k], q[k]);
            device_free(&dev[k]);
        }
        world_new(&dev[k], NULL, 256);
        q[k] = connect_qpair(&dev[k], &ids[k]);
        send_one(&dev[k], q[k], 0x1000u + (unsigned)i);
    }
    for (int k = 0; k < OPEN_AT_ONCE; k++) {
        /* Still in use after all the others came and went. */
        send_one(&dev[k], q[k], 0x9000u + (unsigned)k);
        disconnect_qpair(&dev[k], q[k]);
        device_free(&dev[k]);
    }
    CHECK_EQ(standin.domain.refs, 0);
    printf("PASS %s (%d contexts, %d open at once)\n", current, CONTEXTS, OPEN_AT_ONCE);
}

static void churn_keeps_memory_flat(void)
{
    static struct world dev[DEVICES];
    struct rdma_cm_id id;
    current = "churn_keeps_memory_flat";
    int valgrind = under_valgrind();
    long cycles = valgrind ? CYCLES / 10 : CYCLES;
    size_t first = 0, high = 0, last = 0;
    for (long c = 0; c < cycles; c++) {
        if (c % BLOCK == 0)
            for (int d = 0; d < DEVICES; d++)
                world_new(&dev[d], NULL, 256);
        struct world *w = &dev[c % DEVICES];
        struct spdk_rdma_provider_qp *q = connect_qpair(w, &id);
        send_one(w, q, (uint64_t)c);
        disconnect_qpair(w, q);
        if ((c + 1) % BLOCK == 0) {
            for (int d = 0; d < DEVICES; d++)
                device_free(&dev[d]);
            struct mallinfo2 mi = mallinfo2();
            last = mi.uordblks;
            if (c + 1 == BLOCK)
                first = last;
            if (last > high)
                high = last;
        }
    }
    CHECK_EQ(standin.domain.refs, 0);
    printf("%s: heap in use after the first %d cycles %zu bytes, after %ld cycles %zu bytes, highest %zu (+%zd)\n",
           current, BLOCK, first, cycles, last, high, (ssize_t)(high - first));
    if (UNDER_ASAN || valgrind) {
        printf("SKIP %s memory figure: the heap is %s's, which mallinfo2 does not see (%ld cycles run)\n", current,
               valgrind ? "valgrind" : "AddressSanitizer", cycles);
        printf("PASS %s: %ld cycles on %d devices reopened every %d\n", current, cycles, DEVICES, BLOCK);
        return;
    }
    CHECK(high >= first);
    CHECK(high - first <= FLAT_BOUND);
    printf("PASS %s (%ld cycles, heap within %d bytes of its level after the first %d)\n", current, cycles, FLAT_BOUND,
           BLOCK);
}

int main(void)
{
    a_thousand_device_contexts_open_use_and_close();
    churn_keeps_memory_flat();
    return 0;
}
