/* sqd_bench: the workloads behind `make bench` (scripts/bench.sh), on one of two providers (-P):
 *
 *   null   benches/null_provider.c, a provider of a few instructions per WR (every WQE completes at post; a
 *          CQE frees every SQ slot up to its WQE): what is measured is the poster's own work.
 *   sim    the software HCA's null mode (SQD_SIM_NULL: every WQE completes at post): the poster's work plus
 *          the software HCA's post/poll path, 800 to 1,700 instructions per WR. The default.
 *
 * Three posters run the same loop over one RC QP of sq_depth D (default 128) and one CQ:
 *
 *     repeat: wait (poll) until the SQ has room for the next batch; fill and post a batch of B WRs (SEND, S SGEs
 *             each, one chain, one post call); poll the CQ once (up to 32 work completions).
 *
 *   raw-signal     ibv_post_send + ibv_poll_cq (the inline verbs, through the context's ops table), every WR
 *                  signaled; bookkeeping: a completion counter.
 *   raw-moderated  the same with hand-written moderation, the best a careful C programmer does: wr_id = sequence
 *                  number, IBV_SEND_SIGNALED every D/4 WRs (and on the WR that takes the last free slot), a CQE
 *                  frees every slot up to its wr_id; no callbacks.
 *   raw-lean       raw-moderated written leaner still: one function with its counters in locals (no helper
 *                  calls), the ring index (sequence mod D, D a power of two) as wr_id, and one poll of up to 32
 *                  completions per post (more only while the SQ has no room for the next batch).
 *   sqdisc         sqd_post_send + sqd_cq_poll on a managed queue (signal_interval 0 = D/4, backlog D) with a
 *                  release callback that counts.
 *   sqdisc-batch   the same with a batch release callback (sqd_queue_set_release_batch) that counts.
 *   sqdisc-lean    sqdisc-batch on a queue that leaves posted WRs as posted (SQD_QUEUE_NO_RESTORE): the loop
 *                  fills every WR before each post anyway.
 *   sqdisc-indexed sqdisc-batch on a queue that names WRs by their index (SQD_QUEUE_INDEXED): no wr_ids kept
 *                  or handed back; the batch callback checks that each batch starts at the index it expects.
 *   by-hand        the sqdisc poster's loop and release callback on benches/contract_by_hand.c: the default API's
 *                  per-WR promises kept by hand in plain C, without sqdisc.
 *   by-hand-indexed the same for sqdisc-indexed: WRs named by index, a batch callback per run of releases.
 *
 * Each run first posts a warm-up (-w WRs), then the measured part (-n WRs), then drains and frees everything.
 * Instructions per WR come from two callgrind runs of different -n, subtracted (the scripts do that). The
 * program itself prints, for the measured part: CQEs and doorbells from the provider's counters (and, for
 * sqdisc, from sqd_queue_stats), heap allocations when the alloc_count shim is preloaded, and with -r R the wall-clock
 * ns/WR of R repetitions (median and min; information only).
 *
 *   scale   sqdisc only: Q queues (-q) of depth D on one CQ; WR k goes to queue k mod Q, signaled by the ULP;
 *           the CQ is polled until empty after every P posts (-p, default 8).
 *   memory  for queues of depth D with backlog -k, max_send_sge S, max_inline_data 64: sqd_queue_stats.bytes
 *           of the first and of the last of -q queues, the heap (malloc_usable_size, with the shim) that
 *           sqd_queue_new takes for each of the two, and the CQ's backlog pool (sqd_cq_backlog_pool_stats);
 *           with -L L the CQ's backlog pool is limited to L parked WRs (sqd_cq_set_backlog_limit) first.
 *
 * usage: sqd_bench MODE [-P sim|null] [-n wrs] [-w warmup] [-b batch] [-s sges] [-d depth] [-q queues]
 *                       [-p poll_every] [-k backlog] [-L pool_limit] [-r reps] [-o 1]
 * -o 1: the per-WR release callback also checks that each release is the next WR posted (a SEND, a success).
 * Output: one line of key=value pairs. Exits non-zero on any unexpected result. */

#define _GNU_SOURCE
#include <sqdisc_sim.h>

#include "contract_by_hand.h"
#include "null_provider.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_BATCH 32
#define MAX_SGES 16
#define WC_MAX 32

enum mode { RAW_SIGNAL, RAW_MODERATED, SQDISC, SCALE, MEMORY, SQDISC_BATCH, SQDISC_LEAN, SQDISC_INDEXED, RAW_LEAN, BY_HAND, BY_HAND_INDEXED };
static const char *const mode_names[] = {"raw-signal", "raw-moderated", "sqdisc",      "scale",
                                         "memory",     "sqdisc-batch",  "sqdisc-lean", "sqdisc-indexed",
                                         "raw-lean",   "by-hand",       "by-hand-indexed"};

/* The posters on sqdisc (managed_run with KIND_SQDISC). */
static int is_sqdisc_poster(enum mode m)
{
    return m == SQDISC || m == SQDISC_BATCH || m == SQDISC_LEAN || m == SQDISC_INDEXED;
}

enum provider { SIM, NULL_PROVIDER };

struct bench {
    enum mode mode;
    enum provider provider;
    uint64_t wrs, warmup;
    unsigned batch, sges, depth, queues, poll_every, backlog, reps;
    unsigned pool_limit; /* sqd_cq_set_backlog_limit, when nonzero */
    unsigned interval;
    int check_order; /* -o 1: on_release_in_order for the posters with a per-WR callback */

    struct sqd_sim *sim;
    struct null_device *null;
    struct ibv_cq *cq;
    struct ibv_qp **qps;
    struct sqd_cq *scq;
    struct sqd_queue **q;
    struct ibv_mr *mr;
    struct hand_cq *hcq; /* the by-hand poster's */
    struct hand_queue *hq;

    /* The ULP's bookkeeping. raw-signal: completions counted; raw-moderated: the sequence after the newest
     * completed signaled WR; sqdisc: releases counted. */
    uint64_t posted, completed;
    unsigned unsignaled;

    struct ibv_send_wr wr[MAX_BATCH];
    struct ibv_sge sge[MAX_BATCH][MAX_SGES];
    struct ibv_wc wc[WC_MAX];
};

static char data[MAX_BATCH * MAX_SGES][64];

#define DIE(...)                                                                                           \
    do {                                                                                                   \
        fprintf(stderr, "sqd_bench: " __VA_ARGS__);                                                        \
        fprintf(stderr, " (line %d; last error: %s)\n", __LINE__, sqd_last_error());                      \
        exit(1);                                                                                           \
    } while (0)

/* ---- allocation counting (only when benches/alloc_count.so is preloaded) ------------------------------- */

typedef void (*alloc_counts_fn)(unsigned long long *, unsigned long long *, long long *);
static alloc_counts_fn alloc_counts;

struct allocs {
    unsigned long long allocs, frees;
    long long live;
};

static struct allocs allocs_now(void)
{
    struct allocs a = {0, 0, 0};
    if (alloc_counts)
        alloc_counts(&a.allocs, &a.frees, &a.live);
    return a;
}

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* ---- setup --------------------------------------------------------------------------------------------- */

static void on_release(void *ctx, const struct sqd_completion *c)
{
    struct bench *b = ctx;
    if (c->status != IBV_WC_SUCCESS)
        DIE("release of wr_id %" PRIu64 " with status %u", c->wr_id, c->status);
    b->completed++;
}

/* on_release that also checks the order (-o): the posters' wr_ids are their sequence numbers. */
static void on_release_in_order(void *ctx, const struct sqd_completion *c)
{
    struct bench *b = ctx;
    if (c->status != IBV_WC_SUCCESS || c->wr_id != b->completed || c->opcode != IBV_WC_SEND)
        DIE("release of wr_id %" PRIu64 " (expected %" PRIu64 ") with status %u, opcode %u", c->wr_id, b->completed,
            c->status, c->opcode);
    b->completed++;
}

static void on_release_batch(void *ctx, const struct sqd_release_batch *r)
{
    struct bench *b = ctx;
    if (r->status != IBV_WC_SUCCESS)
        DIE("release of %u WRs from wr_id %" PRIu64 " with status %u", r->count, r->wr_ids[0], r->status);
    b->completed += r->count;
}

/* An indexed queue's batch: its WRs are the `count` from index `first`, which is the count of WRs released
 * before it (releases come once each in post order). */
static void on_release_batch_indexed(void *ctx, const struct sqd_release_batch *r)
{
    struct bench *b = ctx;
    if (r->status != IBV_WC_SUCCESS || r->wr_ids != NULL || r->first != b->completed)
        DIE("release of %u WRs from index %" PRIu64 " (expected %" PRIu64 ") with status %u", r->count, r->first,
            b->completed, r->status);
    b->completed += r->count;
}

/* The counters of whichever provider runs the bench. */
struct provider_stats {
    uint64_t wqes, cqes, doorbells;
};

static struct provider_stats provider_stats(const struct bench *b)
{
    if (b->provider == NULL_PROVIDER) {
        struct null_stats s;
        null_device_stats(b->null, &s);
        return (struct provider_stats){s.wqes, s.cqes, s.doorbells};
    }
    struct sqd_sim_stats s;
    sqd_sim_stats(b->sim, &s);
    return (struct provider_stats){s.wqes, s.cqes, s.doorbells};
}

static uint32_t lkey;

static void setup(struct bench *b)
{
    uint64_t cqe = (uint64_t)b->queues * (b->depth + 1);
    if (cqe > 4194304)
        DIE("%u queues of depth %u need a CQ of %" PRIu64 " CQEs, above the sim's 4194304", b->queues, b->depth, cqe);
    if (b->provider == NULL_PROVIDER) {
        if (!(b->null = null_device_new()))
            DIE("null_device_new");
        if (!(b->cq = null_create_cq(b->null, (int)cqe)))
            DIE("null_create_cq(%" PRIu64 ")", cqe);
        lkey = 1; /* the null provider reads no SGE */
    } else {
        struct sqd_sim_config cfg;
        sqd_sim_config_default(&cfg);
        cfg.flags = SQD_SIM_NULL;
        if (sqd_sim_new(&cfg, &b->sim))
            DIE("sqd_sim_new");
        if (sqd_sim_create_cq(b->sim, (int)cqe, &b->cq))
            DIE("sqd_sim_create_cq(%" PRIu64 ")", cqe);
        if (sqd_sim_reg_mr(b->sim, data, sizeof data, IBV_ACCESS_LOCAL_WRITE, &b->mr))
            DIE("sqd_sim_reg_mr");
        lkey = b->mr->lkey;
    }
    b->qps = calloc(b->queues, sizeof *b->qps);
    b->q = calloc(b->queues, sizeof *b->q);
    if (!b->qps || !b->q)
        DIE("out of memory");
    int managed = is_sqdisc_poster(b->mode) || b->mode == SCALE || b->mode == MEMORY;
    unsigned long long first_allocs = 0, last_allocs = 0;
    long long first_heap = 0, last_heap = 0;
    if (managed && sqd_cq_new(b->cq, &b->scq))
        DIE("sqd_cq_new");
    if (managed && b->pool_limit && sqd_cq_set_backlog_limit(b->scq, b->pool_limit))
        DIE("sqd_cq_set_backlog_limit(%u): %s", b->pool_limit, sqd_last_error());
    for (unsigned i = 0; i < b->queues; i++) {
        struct ibv_qp_init_attr attr;
        memset(&attr, 0, sizeof attr);
        attr.send_cq = b->cq;
        attr.recv_cq = b->cq;
        attr.qp_type = IBV_QPT_RC;
        attr.cap.max_send_wr = b->depth;
        attr.cap.max_recv_wr = 1;
        attr.cap.max_send_sge = b->sges;
        attr.cap.max_recv_sge = 1;
        attr.cap.max_inline_data = 64;
        if (b->provider == NULL_PROVIDER) {
            if (!(b->qps[i] = null_create_qp(b->null, &attr)))
                DIE("null_create_qp #%u", i);
        } else if (sqd_sim_create_qp(b->sim, &attr, &b->qps[i])) {
            DIE("sqd_sim_create_qp #%u", i);
        }
        if (attr.cap.max_send_wr != b->depth)
            DIE("the sim granted max_send_wr %u, not %u", attr.cap.max_send_wr, b->depth);
        if (b->mode == BY_HAND || b->mode == BY_HAND_INDEXED) {
            unsigned interval = b->depth / 4 ? b->depth / 4 : 1;
            if (!(b->hcq = hand_cq_new(b->cq)))
                DIE("hand_cq_new");
            b->hq = b->mode == BY_HAND
                        ? hand_queue_new(b->hcq, b->qps[i], b->depth, b->sges, interval,
                                         b->check_order ? on_release_in_order : on_release, b)
                        : hand_queue_new_indexed(b->hcq, b->qps[i], b->depth, b->sges, interval,
                                                 on_release_batch_indexed, b);
            if (!b->hq)
                DIE("hand_queue_new");
        }
        if (!managed)
            continue;
        struct sqd_queue_attr qa = {
            .sq_depth = attr.cap.max_send_wr,
            .max_send_sge = attr.cap.max_send_sge,
            .max_inline_data = attr.cap.max_inline_data,
            .signal_interval = 0,
            .backlog_depth = b->backlog,
            .release = b->check_order ? on_release_in_order : on_release,
            .release_ctx = b,
            .flags = b->mode == SQDISC_LEAN ? SQD_QUEUE_NO_RESTORE : b->mode == SQDISC_INDEXED ? SQD_QUEUE_INDEXED : 0,
        };
        struct allocs before = allocs_now();
        if (sqd_queue_new(b->scq, NULL, b->qps[i], &qa, &b->q[i]))
            DIE("sqd_queue_new #%u", i);
        if ((b->mode == SQDISC_BATCH || b->mode == SQDISC_LEAN) && sqd_queue_set_release_batch(b->q[i], on_release_batch, b))
            DIE("sqd_queue_set_release_batch: %s", sqd_last_error());
        if (b->mode == SQDISC_INDEXED && sqd_queue_set_release_batch(b->q[i], on_release_batch_indexed, b))
            DIE("sqd_queue_set_release_batch: %s", sqd_last_error());
        if (b->mode == MEMORY && (i == 0 || i + 1 == b->queues)) {
            struct allocs after = allocs_now();
            if (i == 0) {
                first_allocs = after.allocs - before.allocs;
                first_heap = after.live - before.live;
            }
            last_allocs = after.allocs - before.allocs;
            last_heap = after.live - before.live;
        }
    }
    if (b->mode == MEMORY) {
        struct sqd_queue_stats qs, last;
        struct sqd_backlog_pool_stats ps;
        if (sqd_queue_stats(b->q[0], &qs) || sqd_queue_stats(b->q[b->queues - 1], &last))
            DIE("sqd_queue_stats");
        if (sqd_cq_backlog_pool_stats(b->scq, &ps))
            DIE("sqd_cq_backlog_pool_stats");
        /* The first queue on a fresh CQ also pays for the CQ's table (and, with a backlog, for the pool's room
         * when the pool is limited); with -q 2 or more, the last queue's heap is what one more queue costs. */
        printf("mode=memory depth=%u backlog=%u sges=%u queues=%u pool_limit=%u bytes=%" PRIu64 " last_bytes=%" PRIu64
               " allocs=%llu heap_bytes=%lld last_allocs=%llu last_heap_bytes=%lld pool_bytes=%" PRIu64
               " pool_capacity=%" PRIu64 "\n",
               b->depth, b->backlog, b->sges, b->queues, b->pool_limit, qs.bytes, last.bytes, first_allocs, first_heap,
               last_allocs, last_heap, ps.bytes, ps.capacity);
    }
    b->interval = b->depth / 4 ? b->depth / 4 : 1;
    for (unsigned i = 0; i < MAX_BATCH; i++) {
        for (unsigned j = 0; j < MAX_SGES; j++)
            b->sge[i][j] = (struct ibv_sge){
                .addr = (uintptr_t)data[i * MAX_SGES + j], .length = sizeof data[0], .lkey = lkey};
        b->wr[i] = (struct ibv_send_wr){.sg_list = b->sge[i], .num_sge = (int)b->sges, .opcode = IBV_WR_SEND};
    }
}

static void teardown(struct bench *b)
{
    hand_queue_free(b->hq);
    hand_cq_free(b->hcq);
    for (unsigned i = 0; i < b->queues; i++)
        if (b->q[i] && sqd_queue_free(b->q[i]))
            DIE("sqd_queue_free #%u", i);
    if (b->scq && sqd_cq_free(b->scq))
        DIE("sqd_cq_free");
    if (b->provider == NULL_PROVIDER) {
        for (unsigned i = 0; i < b->queues; i++)
            null_destroy_qp(b->qps[i]);
        null_destroy_cq(b->cq);
        if (null_device_free(b->null))
            DIE("null_device_free: objects left");
    } else {
        sqd_sim_free(b->sim);
    }
    free(b->qps);
    free(b->q);
}

/* ---- raw verbs, every WR signaled ---------------------------------------------------------------------- */

static void raw_signal_poll(struct bench *b)
{
    int n = ibv_poll_cq(b->cq, WC_MAX, b->wc);
    if (n < 0)
        DIE("ibv_poll_cq: %d", n);
    for (int i = 0; i < n; i++)
        if (b->wc[i].status != IBV_WC_SUCCESS)
            DIE("completion status %d", b->wc[i].status);
    b->completed += (unsigned)n;
}

static void raw_signal_run(struct bench *b, uint64_t wrs)
{
    uint64_t end = b->posted + wrs;
    struct ibv_send_wr *bad;
    while (b->posted < end) {
        unsigned n = end - b->posted < b->batch ? (unsigned)(end - b->posted) : b->batch;
        while (b->depth - (b->posted - b->completed) < n)
            raw_signal_poll(b);
        for (unsigned i = 0; i < n; i++) {
            b->wr[i].wr_id = b->posted + i;
            b->wr[i].send_flags = IBV_SEND_SIGNALED;
            b->wr[i].next = i + 1 < n ? &b->wr[i + 1] : NULL;
        }
        if (ibv_post_send(b->qps[0], b->wr, &bad))
            DIE("ibv_post_send");
        b->posted += n;
        raw_signal_poll(b);
    }
}

/* ---- raw verbs, hand-written moderation ---------------------------------------------------------------- */

static void raw_moderated_poll(struct bench *b)
{
    int n = ibv_poll_cq(b->cq, WC_MAX, b->wc);
    if (n < 0)
        DIE("ibv_poll_cq: %d", n);
    for (int i = 0; i < n; i++) {
        if (b->wc[i].status != IBV_WC_SUCCESS)
            DIE("completion status %d", b->wc[i].status);
        b->completed = b->wc[i].wr_id + 1; /* a CQE completes every WR up to it */
    }
}

static void raw_moderated_run(struct bench *b, uint64_t wrs)
{
    uint64_t end = b->posted + wrs;
    struct ibv_send_wr *bad;
    while (b->posted < end) {
        unsigned n = end - b->posted < b->batch ? (unsigned)(end - b->posted) : b->batch;
        while (b->depth - (b->posted - b->completed) < n)
            raw_moderated_poll(b);
        for (unsigned i = 0; i < n; i++) {
            uint64_t seq = b->posted + i;
            unsigned flags = 0;
            /* Signal every interval-th WR, and the one that takes the last free slot (else a full SQ of
             * unsignaled WRs never completes). */
            if (++b->unsignaled == b->interval || b->depth - (seq - b->completed) == 1) {
                flags = IBV_SEND_SIGNALED;
                b->unsignaled = 0;
            }
            b->wr[i].wr_id = seq;
            b->wr[i].send_flags = flags;
            b->wr[i].next = i + 1 < n ? &b->wr[i + 1] : NULL;
        }
        if (ibv_post_send(b->qps[0], b->wr, &bad))
            DIE("ibv_post_send");
        b->posted += n;
        raw_moderated_poll(b);
    }
}

/* Covers an unsignaled tail with a signaled zero-length RDMA WRITE and waits for it (end of run only). */
static void raw_moderated_drain(struct bench *b)
{
    if (b->unsignaled) {
        struct ibv_send_wr marker = {.wr_id = b->posted, .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
        struct ibv_send_wr *bad;
        while (b->posted - b->completed >= b->depth)
            raw_moderated_poll(b);
        if (ibv_post_send(b->qps[0], &marker, &bad))
            DIE("ibv_post_send (marker)");
        b->posted++;
        b->unsignaled = 0;
    }
    while (b->completed < b->posted)
        raw_moderated_poll(b);
}

/* ---- raw verbs, hand-written moderation, as lean as it gets ------------------------------------------- */

/* raw-moderated with its bookkeeping in locals and nothing out of line: the wr_id is the WR's ring index (its
 * sequence number mod the depth, a power of two), a CQE completes every WR up to its index. */
static void raw_lean_run(struct bench *b, uint64_t wrs)
{
    struct ibv_qp *qp = b->qps[0];
    struct ibv_cq *cq = b->cq;
    struct ibv_wc *wc = b->wc;
    const uint64_t mask = b->depth - 1, depth = b->depth, interval = b->interval, batch = b->batch;
    uint64_t posted = b->posted, completed = b->completed, end = posted + wrs;
    unsigned unsignaled = b->unsignaled;
    struct ibv_send_wr *bad;
    while (posted < end) {
        unsigned n = end - posted < batch ? (unsigned)(end - posted) : (unsigned)batch;
        for (unsigned i = 0; i < n; i++) {
            uint64_t seq = posted + i;
            unsigned flags = 0;
            if (++unsignaled == interval || depth - (seq - completed) == 1) {
                flags = IBV_SEND_SIGNALED;
                unsignaled = 0;
            }
            b->wr[i].wr_id = seq & mask;
            b->wr[i].send_flags = flags;
            b->wr[i].next = i + 1 < n ? &b->wr[i + 1] : NULL;
        }
        if (ibv_post_send(qp, b->wr, &bad))
            DIE("ibv_post_send");
        posted += n;
        /* One poll per post; more only while the SQ has no room for the next batch. */
        do {
            int got = ibv_poll_cq(cq, WC_MAX, wc);
            if (got > 0) {
                for (int i = 0; i < got; i++)
                    if (wc[i].status != IBV_WC_SUCCESS)
                        DIE("completion status %d", wc[i].status);
                completed += ((wc[got - 1].wr_id - completed) & mask) + 1;
            } else if (got < 0) {
                DIE("ibv_poll_cq: %d", got);
            }
        } while (depth - (posted - completed) < batch);
    }
    b->posted = posted;
    b->completed = completed;
    b->unsignaled = unsignaled;
}

/* raw_moderated_drain for raw-lean's wr_ids (ring indexes). */
static void raw_lean_drain(struct bench *b)
{
    const uint64_t mask = b->depth - 1;
    struct ibv_send_wr *bad;
    if (b->unsignaled) {
        struct ibv_send_wr marker = {.wr_id = b->posted & mask, .opcode = IBV_WR_RDMA_WRITE,
                                     .send_flags = IBV_SEND_SIGNALED};
        if (b->posted - b->completed >= b->depth)
            DIE("raw-lean: a full SQ left unsignaled");
        if (ibv_post_send(b->qps[0], &marker, &bad))
            DIE("ibv_post_send (marker)");
        b->posted++;
        b->unsignaled = 0;
    }
    for (int k = 0; b->completed < b->posted; k++) {
        if (k > 1000)
            DIE("raw-lean: completions missing");
        int got = ibv_poll_cq(b->cq, WC_MAX, b->wc);
        if (got < 0)
            DIE("ibv_poll_cq: %d", got);
        for (int i = 0; i < got; i++)
            if (b->wc[i].status != IBV_WC_SUCCESS)
                DIE("completion status %d", b->wc[i].status);
        if (got > 0)
            b->completed += ((b->wc[got - 1].wr_id - b->completed) & mask) + 1;
    }
}

/* With -o 1: the chain of `n` WRs just posted is as the loop built it (wr_ids, flags, links). */
static void check_restored(const struct bench *b, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        if (b->wr[i].wr_id != b->posted + i || b->wr[i].send_flags != 0 || b->wr[i].next != (i + 1 < n ? &b->wr[i + 1] : NULL))
            DIE("WR %u of the chain was not restored: wr_id %" PRIu64 ", send_flags %#x", i, b->wr[i].wr_id,
                b->wr[i].send_flags);
}

/* ---- sqdisc -------------------------------------------------------------------------------------------- */

static void sqdisc_poll(struct bench *b)
{
    int n = sqd_cq_poll(b->scq, WC_MAX, b->wc);
    if (n < 0)
        DIE("sqd_cq_poll: %d", n);
    for (int i = 0; i < n; i++)
        if (b->wc[i].status != IBV_WC_SUCCESS)
            DIE("completion status %d", b->wc[i].status);
}

/* ---- sqdisc's contract kept by hand --------------------------------------------------------------------- */

/* sqdisc_poll on benches/contract_by_hand.c. */
static void by_hand_poll(struct bench *b)
{
    int n = hand_cq_poll(b->hcq, WC_MAX, b->wc);
    if (n < 0)
        DIE("hand_cq_poll: %d", n);
    for (int i = 0; i < n; i++)
        if (b->wc[i].status != IBV_WC_SUCCESS)
            DIE("completion status %d", b->wc[i].status);
}

/* ---- the loop of the posters with a managed queue ------------------------------------------------------ */

enum managed_kind { KIND_SQDISC, KIND_BY_HAND, KIND_BY_HAND_INDEXED };

/* sqdisc's posters, or the by-hand reference's. `kind` and `check` (-o 1 on a poster that restores: the chain is
 * checked after each post) are constants, so that each poster's loop is only its own: the measured runs have no
 * check. */
__attribute__((always_inline)) static inline void managed_run(struct bench *b, uint64_t wrs, const enum managed_kind kind,
                                                              const int check)
{
    uint64_t end = b->posted + wrs;
    struct ibv_send_wr *bad;
    while (b->posted < end) {
        unsigned n = end - b->posted < b->batch ? (unsigned)(end - b->posted) : b->batch;
        while (b->depth - (b->posted - b->completed) < n) {
            if (kind == KIND_SQDISC)
                sqdisc_poll(b);
            else
                by_hand_poll(b);
        }
        for (unsigned i = 0; i < n; i++) {
            b->wr[i].wr_id = b->posted + i;
            b->wr[i].send_flags = 0;
            b->wr[i].next = i + 1 < n ? &b->wr[i + 1] : NULL;
        }
        int rc = kind == KIND_SQDISC    ? sqd_post_send(b->q[0], b->wr, &bad)
                 : kind == KIND_BY_HAND ? hand_post_send(b->hq, b->wr, &bad)
                                        : hand_post_send_indexed(b->hq, b->wr, &bad);
        if (rc)
            DIE("post: %d", rc);
        if (check)
            check_restored(b, n);
        b->posted += n;
        if (kind == KIND_SQDISC)
            sqdisc_poll(b);
        else
            by_hand_poll(b);
    }
}

/* ---- scale: many queues on one CQ ---------------------------------------------------------------------- */

static uint64_t scale_cqes;

static void scale_poll_until_empty(struct bench *b)
{
    int n;
    do {
        n = sqd_cq_poll(b->scq, WC_MAX, b->wc);
        if (n < 0)
            DIE("sqd_cq_poll: %d", n);
        for (int i = 0; i < n; i++)
            if (b->wc[i].status != IBV_WC_SUCCESS)
                DIE("completion status %d", b->wc[i].status);
        scale_cqes += (uint64_t)n;
    } while (n == WC_MAX);
}

static void scale_run(struct bench *b, uint64_t wrs)
{
    struct ibv_send_wr *bad;
    for (uint64_t k = 0; k < wrs; k++) {
        struct ibv_send_wr *w = &b->wr[0];
        w->wr_id = b->posted;
        w->send_flags = IBV_SEND_SIGNALED;
        w->next = NULL;
        if (sqd_post_send(b->q[b->posted % b->queues], w, &bad))
            DIE("sqd_post_send (queue %" PRIu64 ")", b->posted % b->queues);
        b->posted++;
        if (b->posted % b->poll_every == 0)
            scale_poll_until_empty(b);
    }
    scale_poll_until_empty(b);
}

/* ---- driver -------------------------------------------------------------------------------------------- */

/* Kept out of line so that callgrind can collect just it (--toggle-collect=measured) for the profiles. */
__attribute__((noinline)) void measured(struct bench *b, uint64_t wrs)
{
    switch (b->mode) {
    case RAW_SIGNAL: raw_signal_run(b, wrs); break;
    case RAW_MODERATED: raw_moderated_run(b, wrs); break;
    case RAW_LEAN: raw_lean_run(b, wrs); break;
    case BY_HAND:
        if (b->check_order)
            managed_run(b, wrs, KIND_BY_HAND, 1);
        else
            managed_run(b, wrs, KIND_BY_HAND, 0);
        break;
    case BY_HAND_INDEXED: managed_run(b, wrs, KIND_BY_HAND_INDEXED, 0); break;
    case SQDISC:
    case SQDISC_BATCH:
        if (b->check_order)
            managed_run(b, wrs, KIND_SQDISC, 1);
        else
            managed_run(b, wrs, KIND_SQDISC, 0);
        break;
    case SQDISC_LEAN:
    case SQDISC_INDEXED: managed_run(b, wrs, KIND_SQDISC, 0); break;
    case SCALE: scale_run(b, wrs); break;
    case MEMORY: break;
    }
}

static void drain(struct bench *b)
{
    switch (b->mode) {
    case RAW_SIGNAL:
        while (b->completed < b->posted)
            raw_signal_poll(b);
        break;
    case RAW_MODERATED: raw_moderated_drain(b); break;
    case RAW_LEAN: raw_lean_drain(b); break;
    case BY_HAND:
    case BY_HAND_INDEXED:
        for (int i = 0; b->completed < b->posted; i++) {
            if (i > 1000)
                DIE("the by-hand poster did not release every WR");
            by_hand_poll(b);
        }
        break;
    case SQDISC:
    case SQDISC_BATCH:
    case SQDISC_LEAN:
    case SQDISC_INDEXED:
        for (int i = 0; b->completed < b->posted; i++) {
            if (i > 1000)
                DIE("sqdisc did not release every WR");
            sqdisc_poll(b);
        }
        break;
    case SCALE:
        for (int i = 0; b->completed < b->posted; i++) {
            if (i > 1000)
                DIE("sqdisc did not release every WR");
            scale_poll_until_empty(b);
        }
        break;
    case MEMORY: break;
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static unsigned long arg(const char *s, const char *what)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (*s == '\0' || *end != '\0')
        DIE("bad %s: %s", what, s);
    return v;
}

int main(int argc, char **argv)
{
    static struct bench b;
    if (argc < 2)
        DIE("usage: sqd_bench raw-signal|raw-moderated|raw-lean|sqdisc|sqdisc-batch|sqdisc-lean|sqdisc-indexed|by-hand|by-hand-indexed|scale|memory [-P sim|null] [-n wrs] [-w warmup] "
            "[-b batch] [-s sges] [-d depth] [-q queues] [-p poll_every] [-k backlog] [-L pool_limit] [-r reps] [-o 1]");
    int found = 0;
    for (int m = RAW_SIGNAL; m <= BY_HAND_INDEXED; m++)
        if (strcmp(argv[1], mode_names[m]) == 0) {
            b.mode = (enum mode)m;
            found = 1;
        }
    if (!found)
        DIE("unknown mode %s", argv[1]);
    b.wrs = 20000;
    b.warmup = 1024;
    b.batch = 1;
    b.sges = 1;
    b.depth = 128;
    b.queues = 1;
    b.poll_every = 8;
    b.backlog = (unsigned)-1;
    b.reps = 0;
    for (int i = 2; i < argc; i++) {
        if (argv[i][0] != '-' || argv[i][1] == '\0' || argv[i][2] != '\0' || i + 1 >= argc)
            DIE("bad argument %s", argv[i]);
        if (argv[i][1] == 'P') {
            if (strcmp(argv[i + 1], "null") == 0)
                b.provider = NULL_PROVIDER;
            else if (strcmp(argv[i + 1], "sim") == 0)
                b.provider = SIM;
            else
                DIE("unknown provider %s (sim or null)", argv[i + 1]);
            i++;
            continue;
        }
        unsigned long v = arg(argv[i + 1], argv[i]);
        switch (argv[i][1]) {
        case 'n': b.wrs = v; break;
        case 'w': b.warmup = v; break;
        case 'b': b.batch = (unsigned)v; break;
        case 's': b.sges = (unsigned)v; break;
        case 'd': b.depth = (unsigned)v; break;
        case 'q': b.queues = (unsigned)v; break;
        case 'p': b.poll_every = (unsigned)v; break;
        case 'k': b.backlog = (unsigned)v; break;
        case 'L': b.pool_limit = (unsigned)v; break;
        case 'r': b.reps = (unsigned)v; break;
        case 'o': b.check_order = v != 0; break;
        default: DIE("unknown option %s", argv[i]);
        }
        i++;
    }
    if (b.backlog == (unsigned)-1)
        b.backlog = b.depth;
    if (b.batch < 1 || b.batch > MAX_BATCH || b.sges < 1 || b.sges > MAX_SGES || b.depth < 4 || b.queues < 1 ||
        b.poll_every < 1 || b.batch > b.depth)
        DIE("batch 1..%d (at most depth), sges 1..%d, depth >= 4, queues >= 1, poll_every >= 1", MAX_BATCH, MAX_SGES);
    if (b.mode != SCALE && b.mode != MEMORY && b.queues != 1)
        DIE("-q is for the scale mode");
    if (b.mode == SCALE && b.poll_every > b.depth)
        DIE("-p must be at most the depth");
    if ((b.mode == RAW_LEAN || b.mode == BY_HAND || b.mode == BY_HAND_INDEXED) && (b.depth & (b.depth - 1)))
        DIE("%s needs a depth that is a power of two", mode_names[b.mode]);
    alloc_counts = (alloc_counts_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "bench_alloc_counts");

    setup(&b);
    if (b.mode == MEMORY) {
        teardown(&b);
        return 0;
    }

    measured(&b, b.warmup);
    struct provider_stats s0, s1;
    struct sqd_queue_stats q0, q1;
    memset(&q0, 0, sizeof q0);
    memset(&q1, 0, sizeof q1);
    struct hand_stats h0 = {0, 0, 0, 0}, h1 = {0, 0, 0, 0};
    s0 = provider_stats(&b);
    if (is_sqdisc_poster(b.mode))
        sqd_queue_stats(b.q[0], &q0);
    if (b.mode == BY_HAND || b.mode == BY_HAND_INDEXED)
        hand_queue_stats(b.hq, &h0);
    uint64_t cqes0 = scale_cqes;
    struct allocs a0 = allocs_now();
    double t0 = now_ns();
    measured(&b, b.wrs);
    double t1 = now_ns();
    struct allocs a1 = allocs_now();
    s1 = provider_stats(&b);
    if (is_sqdisc_poster(b.mode))
        sqd_queue_stats(b.q[0], &q1);
    if (b.mode == BY_HAND || b.mode == BY_HAND_INDEXED)
        hand_queue_stats(b.hq, &h1);
    uint64_t polled = scale_cqes - cqes0;

    /* Timed repetitions (after the counted part, so they change no counter above). */
    double median = 0, best = 0;
    if (b.reps > 0) {
        double *per = calloc(b.reps, sizeof *per);
        if (!per)
            DIE("out of memory");
        per[0] = (t1 - t0) / (double)(b.wrs ? b.wrs : 1);
        for (unsigned r = 1; r < b.reps; r++) {
            double t = now_ns();
            measured(&b, b.wrs);
            per[r] = (now_ns() - t) / (double)(b.wrs ? b.wrs : 1);
        }
        qsort(per, b.reps, sizeof *per, cmp_double);
        median = per[b.reps / 2];
        best = per[0];
        free(per);
    }
    drain(&b);
    if (is_sqdisc_poster(b.mode)) {
        struct sqd_queue_stats q;
        sqd_queue_stats(b.q[0], &q);
        if (q.released != q.accepted || q.released != b.posted)
            DIE("released %" PRIu64 " of %" PRIu64 " accepted", q.released, q.accepted);
    }
    if (b.mode == BY_HAND || b.mode == BY_HAND_INDEXED) {
        struct hand_stats f;
        hand_queue_stats(b.hq, &f);
        if (f.released != f.accepted || f.released != b.posted || b.completed != b.posted)
            DIE("the by-hand poster released %" PRIu64 " of %" PRIu64 " accepted (%" PRIu64 " posted)", f.released, f.accepted,
                b.posted);
    }

    double n = b.wrs ? (double)b.wrs : 1.0;
    printf("mode=%s provider=%s batch=%u sges=%u depth=%u queues=%u wrs=%" PRIu64 " warmup=%" PRIu64, mode_names[b.mode],
           b.provider == NULL_PROVIDER ? "null" : "sim", b.batch,
           b.sges, b.depth, b.queues, b.wrs, b.warmup);
    printf(" wqes=%" PRIu64 " cqes=%" PRIu64 " doorbells=%" PRIu64 " cqes_per_wr=%.5f doorbells_per_wr=%.5f",
           s1.wqes - s0.wqes, s1.cqes - s0.cqes, s1.doorbells - s0.doorbells, (double)(s1.cqes - s0.cqes) / n,
           (double)(s1.doorbells - s0.doorbells) / n);
    if (is_sqdisc_poster(b.mode))
        printf(" q_send_cqes=%" PRIu64 " q_doorbells=%" PRIu64 " q_markers=%" PRIu64 " q_parked=%" PRIu64
               " q_signaled_by_policy=%" PRIu64,
               q1.send_cqes - q0.send_cqes, q1.doorbells - q0.doorbells, q1.markers - q0.markers,
               q1.parked - q0.parked, q1.signaled_by_policy - q0.signaled_by_policy);
    if (b.mode == BY_HAND || b.mode == BY_HAND_INDEXED)
        printf(" q_send_cqes=%" PRIu64 " q_doorbells=%" PRIu64 " q_parked=0", h1.cqes - h0.cqes, h1.doorbells - h0.doorbells);
    if (b.mode == SCALE)
        printf(" polled=%" PRIu64, polled);
    if (alloc_counts)
        printf(" allocs=%llu frees=%llu allocs_per_wr=%.5f", a1.allocs - a0.allocs, a1.frees - a0.frees,
               (double)(a1.allocs - a0.allocs) / n);
    if (b.reps > 0)
        printf(" reps=%u ns_per_wr_median=%.1f ns_per_wr_min=%.1f", b.reps, median, best);
    printf("\n");
    teardown(&b);
    return 0;
}
