/* contract_by_hand: see contract_by_hand.h. Written for the instruction count of its common path: the post's one walk
 * of the chain (checks, slot, token, signal), the provider call, the restore walk; the poll's provider call, the
 * token's lookup and the release walk. */
#include "contract_by_hand.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* A token: the queue's index from bit INDEX_SHIFT, the WR's sequence number modulo 2^SEQ_BITS below. The bit
 * between them takes the carry of a post's tokens counted past the field's end, which no reader looks at, so
 * that the walk counts tokens without a test for the wrap. */
#define SEQ_BITS 48
#define SEQ_MASK ((UINT64_C(1) << SEQ_BITS) - 1)
#define INDEX_SHIFT (SEQ_BITS + 1)

/* A slot's meta: the work completion's opcode in the low byte, then these. */
enum { ULP_SIGNALED = 1u << 8, ADDED_SIGNAL = 1u << 9, INTERNAL = 1u << 10 };

/* The send flags a plain WR may carry (IBV_SEND_INLINE needs checks of its own: not plain). */
#define PLAIN_FLAGS ((unsigned)(IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED))
#define NOT_PLAIN 0xffu

struct slot {
    uint64_t wr_id;
    uint32_t meta;
};

struct hand_queue {
    struct hand_cq *cq;
    struct ibv_qp *qp;
    uint32_t qp_num, index;
    struct slot *ring;
    uint64_t mask, depth;
    uint64_t head, done, tail; /* sequence numbers: next to post, first not completed, first not released */
    uint64_t token_base;
    uint32_t interval, run; /* the policy: WRs posted unsignaled since the last signaled one */
    /* Per opcode: max_send_sge + 1 if a plain opcode (else 0), and above it the slot's meta. */
    uint64_t quiet[16];
    uint64_t last_cycle; /* the CQ's poll cycle of the last post */
    uint64_t markers;    /* internal slots posted and not released */
    int watched;
    void (*release)(void *, const struct sqd_completion *);
    void (*batch)(void *, const struct sqd_release_batch *); /* an indexed queue's */
    void *ctx;
    struct hand_stats stats;
};

struct hand_cq {
    struct ibv_cq *cq;
    struct hand_queue **table, **watch;
    uint32_t size, nwatch;
    uint32_t posted_watched; /* watched queues posted to in this poll cycle */
    uint64_t cycle;
};

/* The work-completion opcode of each plain send opcode (ibv_wr_opcode below 16), NOT_PLAIN for the rest. */
static uint8_t plain_wc_opcode[16];
/* The WRs of one post call the policy signals that the restore's list holds; a call with more (a chain of over
 * 8 intervals) restores every WR's flags from its slot. */
#define MAX_ADDED 8

static void init_table(void)
{
    memset(plain_wc_opcode, NOT_PLAIN, sizeof plain_wc_opcode);
    plain_wc_opcode[IBV_WR_RDMA_WRITE] = IBV_WC_RDMA_WRITE;
    plain_wc_opcode[IBV_WR_RDMA_WRITE_WITH_IMM] = IBV_WC_RDMA_WRITE;
    plain_wc_opcode[IBV_WR_SEND] = IBV_WC_SEND;
    plain_wc_opcode[IBV_WR_SEND_WITH_IMM] = IBV_WC_SEND;
    plain_wc_opcode[IBV_WR_RDMA_READ] = IBV_WC_RDMA_READ;
    plain_wc_opcode[IBV_WR_LOCAL_INV] = IBV_WC_LOCAL_INV;
    plain_wc_opcode[IBV_WR_SEND_WITH_INV] = IBV_WC_SEND;
}

struct hand_cq *hand_cq_new(struct ibv_cq *cq)
{
    init_table();
    struct hand_cq *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->cq = cq;
    /* Entry 0 is never a queue's: no token is a bare sequence number. */
    if (!(c->table = calloc(1, sizeof *c->table)) || !(c->watch = calloc(1, sizeof *c->watch))) {
        hand_cq_free(c);
        return NULL;
    }
    c->size = 1;
    return c;
}

void hand_cq_free(struct hand_cq *c)
{
    if (!c)
        return;
    free(c->table);
    free(c->watch);
    free(c);
}

struct hand_queue *hand_queue_new(struct hand_cq *c, struct ibv_qp *qp, uint32_t sq_depth, uint32_t max_send_sge,
                                    uint32_t interval, void (*release)(void *, const struct sqd_completion *), void *ctx)
{
    if (!c || !qp || !sq_depth || (sq_depth & (sq_depth - 1)) || !interval)
        return NULL;
    struct hand_queue *q = calloc(1, sizeof *q);
    struct hand_queue **table = realloc(c->table, (c->size + 1) * sizeof *table);
    struct hand_queue **watch = table ? realloc(c->watch, (c->size + 1) * sizeof *watch) : NULL;
    if (table)
        c->table = table;
    if (watch)
        c->watch = watch;
    if (!q || !table || !watch || !(q->ring = calloc(sq_depth, sizeof *q->ring))) {
        free(q);
        return NULL;
    }
    q->cq = c;
    q->qp = qp;
    q->qp_num = qp->qp_num;
    q->index = c->size;
    q->mask = sq_depth - 1;
    q->depth = sq_depth;
    q->token_base = (uint64_t)q->index << INDEX_SHIFT;
    q->interval = interval;
    for (unsigned op = 0; op < 16; op++)
        q->quiet[op] = plain_wc_opcode[op] == NOT_PLAIN ? 0 : (uint64_t)(max_send_sge + 1) | (uint64_t)plain_wc_opcode[op] << 32;
    q->release = release;
    q->ctx = ctx;
    c->table[c->size++] = q;
    return q;
}

struct hand_queue *hand_queue_new_indexed(struct hand_cq *c, struct ibv_qp *qp, uint32_t sq_depth,
                                          uint32_t max_send_sge, uint32_t interval,
                                          void (*batch)(void *, const struct sqd_release_batch *), void *ctx)
{
    if (!batch)
        return NULL;
    struct hand_queue *q = hand_queue_new(c, qp, sq_depth, max_send_sge, interval, NULL, ctx);
    if (q)
        q->batch = batch;
    return q;
}

void hand_queue_start_at(struct hand_queue *q, uint64_t seq)
{
    if (q && q->head == 0)
        q->head = q->done = q->tail = seq;
}

void hand_queue_free(struct hand_queue *q)
{
    if (!q)
        return;
    q->cq->table[q->index] = NULL;
    for (uint32_t i = 0; i < q->cq->nwatch; i++)
        if (q->cq->watch[i] == q)
            q->cq->watch[i] = q->cq->watch[--q->cq->nwatch];
    q->cq->posted_watched = 0;
    free(q->ring);
    free(q);
}

void hand_queue_stats(const struct hand_queue *q, struct hand_stats *out)
{
    *out = q->stats;
}

/* Puts back the ULP's wr_ids in the `n` WRs from `w`, whose slots are from `sl` on in the ring, and takes
 * IBV_SEND_SIGNALED back from the `nadded` WRs in `added`. */
static inline void restore(const struct slot *ring, const struct slot *ring_end, const struct slot *sl,
                           struct ibv_send_wr *w, uint64_t n, struct ibv_send_wr *const *added, unsigned nadded)
{
    for (; n; n--, w = w->next) {
        w->wr_id = sl->wr_id;
        if (++sl == ring_end)
            sl = ring;
    }
    for (unsigned i = 0; i < nadded; i++)
        added[i]->send_flags &= ~(unsigned)IBV_SEND_SIGNALED;
}

/* Restores the `n` WRs from `first` (posted from `seq`) reading each slot's flags: for the cold paths. */
static void restore_slow(const struct hand_queue *q, struct ibv_send_wr *w, uint64_t seq, uint64_t n)
{
    for (const uint64_t end = seq + n; seq != end; seq++, w = w->next) {
        const struct slot *sl = &q->ring[seq & q->mask];
        w->wr_id = sl->wr_id;
        if (sl->meta & ADDED_SIGNAL)
            w->send_flags &= ~(unsigned)IBV_SEND_SIGNALED;
    }
}

/* The provider refused `pbad` of the run of `n` WRs from `first`: the WRs before it were posted, the rest
 * were not and are no longer admitted. */
__attribute__((cold, noinline)) static int refused(struct hand_queue *q, struct ibv_send_wr *first, uint64_t n,
                                                    struct ibv_send_wr *pbad, int rc, struct ibv_send_wr **bad)
{
    uint64_t took = 0;
    for (struct ibv_send_wr *w = first; w && w != pbad && took < n; w = w->next)
        took++;
    restore_slow(q, first, q->head, n);
    q->head += took;
    q->stats.accepted += took;
    *bad = pbad;
    return -(rc > 0 ? rc : EIO);
}

/* The rest of a post whose walk stopped at `w` (no credit, or a WR that is not plain) after admitting `n`. */
__attribute__((cold, noinline)) static int post_stopped(struct hand_queue *q, struct ibv_send_wr *first,
                                                         struct ibv_send_wr *last, uint64_t n, struct ibv_send_wr *w,
                                                         int no_credit, struct ibv_send_wr **bad)
{
    if (n) {
        struct ibv_send_wr *pbad = NULL;
        last->next = NULL;
        int rc = q->qp->context->ops.post_send(q->qp, first, &pbad);
        last->next = w;
        q->stats.doorbells++;
        if (rc)
            return refused(q, first, n, pbad, rc, bad);
        restore_slow(q, first, q->head, n);
        q->head += n;
        q->stats.accepted += n;
    }
    *bad = w;
    return no_credit ? -ENOBUFS : -EINVAL;
}

/* A plain WR's opcode and flags, read as one word (`send_flags` follows `opcode` in struct ibv_send_wr), fail
 * this mask if the opcode is 16 or more or a flag is not plain; IBV_SEND_SIGNALED fails it too, so that a WR
 * the ULP signals takes the walk's other branch. */
#define QUIET_REJECT (~((uint64_t)(PLAIN_FLAGS & ~(unsigned)IBV_SEND_SIGNALED) << 32 | 15))

_Static_assert(offsetof(struct ibv_send_wr, send_flags) == offsetof(struct ibv_send_wr, opcode) + 4,
               "send_flags follows opcode");

/* The post of both kinds of queue: `keep` (a constant) for one that keeps and restores the ULP's wr_ids. */
__attribute__((always_inline)) static inline int post_send(struct hand_queue *q, struct ibv_send_wr *wr,
                                                           struct ibv_send_wr **bad, const int keep)
{
    if (!q || !bad)
        return -EINVAL;
    *bad = wr;
    if (!wr)
        return 0;
    /* In locals: the walk's stores into the WRs could alias the queue's fields. */
    struct slot *const ring = q->ring, *const ring_end = q->ring + q->depth;
    const uint64_t head = q->head, interval = q->interval;
    const uint64_t *const table = q->quiet;
    /* Tokens are counted in the walk; one past the sequence field's end carries into the bit above it. */
    const uint64_t first = q->token_base | (head & SEQ_MASK);
    /* The token one past the last free slot's; the interval's last WR's (`interval` after the last signaled
     * WR's); the WR the policy signals next: that one, or the one that takes the last free slot. */
    const uint64_t end = first + (q->depth - (head - q->tail));
    uint64_t interval_end = first + (interval - q->run) - 1;
    uint64_t next_signal = interval_end < end - 1 ? interval_end : end - 1;
    struct ibv_send_wr *added[MAX_ADDED];
    unsigned nadded = 0;
    uint64_t token = first;
    struct slot *sl = ring + (head & q->mask);
    struct ibv_send_wr *w = wr, *last = wr;
    do {
        uint64_t pair;
        memcpy(&pair, &w->opcode, sizeof pair);
        const uint64_t entry = table[pair & 15];
        if (token >= next_signal || (pair & QUIET_REJECT)) {
            /* A WR that is signaled (by the ULP or the policy), needs more than the quiet test, or finds no
             * credit. */
            const unsigned flags = (unsigned)(pair >> 32);
            if (token == end || (pair >> 32 & ~(uint64_t)PLAIN_FLAGS) || (uint32_t)pair > 15 ||
                (uint32_t)w->num_sge >= (uint32_t)entry || !w->sg_list) {
                q->run = (uint32_t)(token + interval - 1 - interval_end);
                return post_stopped(q, wr, last, token - first, w, token == end, bad);
            }
            if (keep)
                sl->wr_id = w->wr_id;
            if (flags & IBV_SEND_SIGNALED) {
                sl->meta = (uint32_t)(entry >> 32) | ULP_SIGNALED;
            } else {
                sl->meta = (uint32_t)(entry >> 32) | ADDED_SIGNAL;
                w->send_flags = flags | IBV_SEND_SIGNALED;
                if (nadded < MAX_ADDED)
                    added[nadded] = w;
                nadded++;
            }
            interval_end = token + interval;
            next_signal = interval_end < end - 1 ? interval_end : end - 1;
        } else {
            if ((uint32_t)w->num_sge >= (uint32_t)entry || !w->sg_list) {
                q->run = (uint32_t)(token + interval - 1 - interval_end);
                return post_stopped(q, wr, last, token - first, w, 0, bad);
            }
            if (keep)
                sl->wr_id = w->wr_id;
            sl->meta = (uint32_t)(entry >> 32);
        }
        w->wr_id = token++;
        if (++sl == ring_end)
            sl = ring;
        last = w;
        w = w->next;
    } while (w);
    const uint64_t n = token - first;
    /* The run since the last signaled WR: the WR after a signal starts a new interval. */
    const uint32_t run = (uint32_t)(token + interval - 1 - interval_end);
    struct ibv_send_wr *pbad = NULL;
    int rc = q->qp->context->ops.post_send(q->qp, wr, &pbad);
    q->stats.doorbells++;
    if (rc) {
        q->run = run;
        return refused(q, wr, n, pbad, rc, bad);
    }
    if (keep && nadded <= MAX_ADDED)
        restore(ring, ring_end, ring + (head & q->mask), wr, n, added, nadded);
    else if (keep)
        restore_slow(q, wr, head, n);
    q->head = head + n;
    q->run = run;
    q->stats.accepted += n;
    struct hand_cq *const c = q->cq;
    if (q->last_cycle != c->cycle) {
        q->last_cycle = c->cycle;
        c->posted_watched += q->watched;
    }
    if (run && !q->watched) {
        q->watched = 1;
        c->posted_watched++;
        c->watch[c->nwatch++] = q;
    }
    *bad = NULL;
    return 0;
}

int hand_post_send(struct hand_queue *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    return post_send(q, wr, bad, 1);
}

int hand_post_send_indexed(struct hand_queue *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    return post_send(q, wr, bad, 0);
}

/* Hands the `count` WRs from the release point to an indexed queue's batch callback, with `status`. */
static void release_run(struct hand_queue *q, uint64_t count, uint32_t status)
{
    const struct sqd_release_batch b = {
        .wr_ids = NULL, .count = (uint32_t)count, .status = status, .first = q->stats.released};
    q->tail += count;
    q->stats.released += count;
    q->batch(q->ctx, &b);
}

/* `release_indexed` with markers in the ring: each run of WRs between them in a batch of its own. */
__attribute__((cold, noinline)) static void release_around_markers(struct hand_queue *q, uint64_t upto,
                                                                    uint32_t status)
{
    while (q->tail <= upto) {
        uint64_t k = 0;
        while (q->tail + k <= upto && !(q->ring[(q->tail + k) & q->mask].meta & INTERNAL))
            k++;
        if (k && q->tail + k == upto + 1 && status != IBV_WC_SUCCESS) {
            if (k > 1)
                release_run(q, k - 1, IBV_WC_SUCCESS);
            release_run(q, 1, status);
        } else if (k) {
            release_run(q, k, IBV_WC_SUCCESS);
        }
        if (q->tail <= upto) {
            q->markers--;
            q->tail++;
        }
    }
}

/* An indexed queue's releases up to `upto` (a CQE's sequence number, `status` its status): one batch call for
 * the run, its first index the count of WRs released before it; the WR of an error CQE in a batch of its own. */
static inline void release_indexed(struct hand_queue *q, uint64_t upto, uint32_t status)
{
    if (q->markers) {
        release_around_markers(q, upto, status);
        return;
    }
    uint64_t n = upto + 1 - q->tail;
    if (status != IBV_WC_SUCCESS && n > 1) {
        release_run(q, n - 1, IBV_WC_SUCCESS);
        n = 1;
    }
    release_run(q, n, status);
}

/* Releases without a callback the WRs of `q` up to `upto`: for a queue with none (failures only). A run of
 * successes with no marker in the ring only moves the release point. */
static void release_silently(struct hand_queue *q, uint64_t upto)
{
    if (!q->markers) {
        q->stats.released += upto + 1 - q->tail;
        q->tail = upto + 1;
        return;
    }
    for (; q->tail <= upto; q->tail++) {
        if (q->ring[q->tail & q->mask].meta & INTERNAL)
            q->markers--;
        else
            q->stats.released++;
    }
}

/* Releases the WRs of `q` up to `upto` (a CQE's sequence number, `status` its status), in order, one callback
 * each; the release point moves before each callback, so that a callback may post into the slot just freed. */
static inline void release_upto(struct hand_queue *q, uint64_t upto, uint32_t status)
{
    void (*const release)(void *, const struct sqd_completion *) = q->release;
    if (!release) {
        release_silently(q, upto);
        return;
    }
    void *const ctx = q->ctx;
    const struct slot *const ring = q->ring;
    const uint64_t mask = q->mask;
    struct sqd_completion c;
    memset(&c, 0, sizeof c);
    c.flags = SQD_COMPLETION_IMPLIED;
    uint64_t tail = q->tail;
    while (tail < upto) {
        const struct slot sl = ring[tail & mask];
        q->tail = ++tail;
        if (sl.meta & INTERNAL) {
            q->markers--;
            continue;
        }
        q->stats.released++;
        c.wr_id = sl.wr_id;
        c.opcode = sl.meta & 0xff;
        release(ctx, &c);
    }
    const struct slot sl = ring[tail & mask];
    q->tail = tail + 1;
    if (sl.meta & INTERNAL) {
        q->markers--;
        return;
    }
    q->stats.released++;
    c.wr_id = sl.wr_id;
    c.opcode = sl.meta & 0xff;
    c.status = status;
    c.flags = 0;
    release(ctx, &c);
}

/* An indexed queue's WR at `seq`, not yet released: its index (the WRs before it, markers not counted). */
static uint64_t wr_index(const struct hand_queue *q, uint64_t seq)
{
    uint64_t index = q->stats.released + (seq - q->tail);
    for (uint64_t s = q->tail; q->markers && s < seq; s++)
        index -= (q->ring[s & q->mask].meta & INTERNAL) != 0;
    return index;
}

/* A queue's unsignaled tail, idle for a poll cycle, is covered by a signaled zero-length RDMA WRITE. */
__attribute__((cold, noinline)) static void cover_idle_tails(struct hand_cq *c)
{
    for (uint32_t i = 0; i < c->nwatch;) {
        struct hand_queue *q = c->watch[i];
        if (q->last_cycle == c->cycle) {
            i++;
            continue;
        }
        if (q->run && q->head - q->tail < q->depth) {
            struct ibv_send_wr marker = {.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
            struct ibv_send_wr *pbad;
            marker.wr_id = q->token_base | (q->head & SEQ_MASK);
            q->ring[q->head & q->mask] = (struct slot){.wr_id = 0, .meta = IBV_WC_RDMA_WRITE | INTERNAL};
            if (q->qp->context->ops.post_send(q->qp, &marker, &pbad)) {
                i++;
                continue;
            }
            q->stats.doorbells++;
            q->head++;
            q->run = 0;
            q->markers++;
        } else if (q->run) {
            i++;
            continue;
        }
        q->watched = 0;
        c->watch[i] = c->watch[--c->nwatch];
    }
}

int hand_cq_poll(struct hand_cq *c, int num_entries, struct ibv_wc *wc)
{
    if (!c || num_entries < 0 || (num_entries && !wc))
        return -EINVAL;
    int n = c->cq->context->ops.poll_cq(c->cq, num_entries, wc);
    if (n <= 0) {
        if (n < 0)
            return n;
        if (c->nwatch != c->posted_watched)
            cover_idle_tails(c);
        c->posted_watched = 0;
        c->cycle++;
        return 0;
    }
    int kept = 0;
    for (int i = 0; i < n; i++) {
        const uint64_t token = wc[i].wr_id;
        const uint64_t index = token >> INDEX_SHIFT;
        struct hand_queue *q = index < c->size ? c->table[index] : NULL;
        /* A CQE that names no queue's posted WR: dropped. */
        if (!q || q->qp_num != wc[i].qp_num)
            continue;
        const uint64_t seq = q->done + ((token - q->done) & SEQ_MASK);
        if (seq >= q->head)
            continue;
        const struct slot *sl = &q->ring[seq & q->mask];
        q->stats.cqes++;
        q->done = seq + 1;
        if ((sl->meta & ULP_SIGNALED) || wc[i].status != IBV_WC_SUCCESS) {
            if (!(sl->meta & INTERNAL)) {
                wc[kept] = wc[i];
                wc[kept].wr_id = q->batch ? wr_index(q, seq) : sl->wr_id;
                kept++;
            }
        }
        if (q->batch)
            release_indexed(q, seq, wc[i].status);
        else
            release_upto(q, seq, wc[i].status);
    }
    if (c->nwatch != c->posted_watched)
        cover_idle_tails(c);
    c->posted_watched = 0;
    c->cycle++;
    return kept;
}
