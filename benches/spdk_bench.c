/* spdk_bench: what libsqdisc_spdk costs SPDK per WR, against a provider that does what SPDK's verbs provider
 * does (a list appended by queue_send_wrs, one ibv_post_send per flush), on the null provider of the
 * benchmarks (benches/null_provider.h: a few instructions per WR, every WQE complete at post), so that what is
 * measured is the providers' own work.
 *
 * The loop is the NVMe-oF target's: requests of three unsignaled RDMA WRITEs chained before a signaled
 * response SEND, admitted while SPDK's send depth allows (max_send_wr = 2 * qd), each queued with
 * queue_send_wrs; one flush per round of B requests (-b); then one ibv_poll_cq of up to 32 completions, a
 * SEND's completion freeing its four WRs as SPDK accounts them.
 *
 *   verbs    the provider functions of this file: SPDK's verbs provider's behaviour, written here
 *   sqdisc   libsqdisc_spdk (the CQ polled through its interposed poll_cq)
 *   by-hand  the verbs provider's list, its flush and SPDK's poll going through benches/contract_by_hand.c with
 *            no release callback: sqdisc's promises kept by hand, in C, in SPDK's own code, as SPDK would
 *            keep them without a library (target loop only)
 *
 * With -m host, the loop is the NVMe-RDMA host's instead: per request, one receive for the response queued with
 * queue_recv_wrs and one signaled capsule SEND with queue_send_wrs, max_send_wr = max_recv_wr = qd, both lists
 * flushed once per round of B requests (receives first); the null device, with echo on, completes the receive
 * when the SEND is posted, as the target's response would, and a request ends with both completions polled.
 *
 * With -m srq, the loop is the target's as SPDK runs it by default, on a shared receive queue: a request begins
 * with the receive completion of its capsule (its receive reposted to the SRQ through srq_queue_recv_wrs, the
 * list flushed before the sends), then its three WRITEs and its SEND; the SRQ holds 2 * qd receives, the first
 * qd capsules arrive at the start (null_qp_deliver) and each response SEND brings the next (echo), so that qd
 * requests are in flight. Five WRs and two completions per request.
 *
 * usage: spdk_bench verbs|sqdisc|by-hand [-m target|host|srq] [-n requests] [-b batch] [-q qd]
 * Output: one line of key=value pairs (wrs, cqes, doorbells, provider). Instructions per WR come from two
 * callgrind runs, -n N and -n 0, subtracted (scripts/bench.sh). */

#define _GNU_SOURCE
#include <sqdisc_spdk.h>

#include "contract_by_hand.h"
#include "null_provider.h"
#include "spdk_null_standin.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIE(...)                                                                                             \
    do {                                                                                                     \
        fprintf(stderr, "spdk_bench: " __VA_ARGS__);                                                         \
        fprintf(stderr, " (line %d; last log: %s)\n", __LINE__, bench.last_log);                          \
        exit(1);                                                                                             \
    } while (0)

#define WRITES 3
#define PER (WRITES + 1)
#define MAX_QD 256

/* ---- the verbs provider's behaviour, for comparison --------------------------------------------------------- */

struct verbs_qp {
    struct ibv_qp *qp;
    struct ibv_send_wr *first, *last;
    uint64_t submitted, doorbells;
};

static int verbs_queue(struct verbs_qp *v, struct ibv_send_wr *first)
{
    struct ibv_send_wr *last = first;
    v->submitted++;
    while (last->next) {
        last = last->next;
        v->submitted++;
    }
    int was_empty = v->first == NULL;
    if (was_empty)
        v->first = first;
    else
        v->last->next = first;
    v->last = last;
    return was_empty;
}

static int verbs_flush(struct verbs_qp *v, struct ibv_send_wr **bad)
{
    if (!v->first)
        return 0;
    int rc = ibv_post_send(v->qp, v->first, bad);
    v->first = NULL;
    v->doorbells++;
    return rc;
}

/* verbs_flush through the queue that keeps sqdisc's promises by hand. */
static int by_hand_flush(struct verbs_qp *v, struct hand_queue *q, struct ibv_send_wr **bad)
{
    if (!v->first)
        return 0;
    int rc = hand_post_send(q, v->first, bad);
    v->first = NULL;
    v->doorbells++;
    return rc;
}

static int verbs_queue_recv(struct verbs_qp *v, struct ibv_recv_wr **first, struct ibv_recv_wr **last,
                            struct ibv_recv_wr *wr)
{
    (void)v;
    int was_empty = *first == NULL;
    if (was_empty)
        *first = wr;
    else
        (*last)->next = wr;
    *last = wr;
    return was_empty;
}

static char data[PER][64];

struct request {
    struct ibv_send_wr wr[PER];
    struct ibv_sge sge[PER];
};

/* The request in slot s: three WRITEs chained before a signaled SEND, wr_ids s * PER + j. */
static inline void fill_request(struct request *r, unsigned s)
{
    for (int j = 0; j < PER; j++) {
        r->sge[j].addr = (uintptr_t)data[j];
        r->sge[j].length = 64;
        r->sge[j].lkey = 0x1234;
        r->wr[j].wr_id = (uint64_t)s * PER + (uint64_t)j;
        r->wr[j].sg_list = &r->sge[j];
        r->wr[j].num_sge = 1;
        r->wr[j].opcode = j < WRITES ? IBV_WR_RDMA_WRITE : IBV_WR_SEND;
        r->wr[j].send_flags = j < WRITES ? 0 : IBV_SEND_SIGNALED;
        r->wr[j].next = j + 1 < PER ? &r->wr[j + 1] : NULL;
    }
}

/* Allocations so far, when benches/alloc_count.so is preloaded (the script subtracts a shorter run). */
static unsigned long long allocs_so_far(void)
{
    typedef void (*alloc_counts_fn)(unsigned long long *, unsigned long long *, long long *);
    alloc_counts_fn counts = (alloc_counts_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "bench_alloc_counts");
    unsigned long long allocs = 0, frees = 0;
    long long live = 0;
    if (counts)
        counts(&allocs, &frees, &live);
    return allocs;
}

/* The null device of a run (with echo set by `echo`, unless NULL), its CQ, and a PD standing for the device's (the
 * null device reads no SGE and has no PD). */
static struct ibv_cq *bench_device(int (*echo)(struct null_device *), struct ibv_pd *pd)
{
    bench.dev = null_device_new();
    if (!bench.dev || (echo && echo(bench.dev)))
        DIE("null_device_new");
    struct ibv_cq *cq = null_create_cq(bench.dev, 4096);
    if (!cq)
        DIE("create_cq");
    memset(pd, 0, sizeof *pd);
    pd->context = cq->context;
    return cq;
}

/* ---- the host's loop ----------------------------------------------------------------------------------------- */

struct host_request {
    struct ibv_send_wr s;
    struct ibv_sge ss;
    struct ibv_recv_wr r;
    struct ibv_sge rs;
    int left;
};

static int host_loop(int use_sqdisc, uint64_t n, unsigned batch, unsigned qd)
{
    struct ibv_pd pd;
    struct ibv_cq *cq = bench_device(null_device_set_echo, &pd);
    struct rdma_cm_id id;
    memset(&id, 0, sizeof id);
    struct spdk_rdma_provider_qp *sq = NULL;
    struct verbs_qp vq;
    memset(&vq, 0, sizeof vq);
    struct ibv_recv_wr *rfirst = NULL, *rlast = NULL;
    struct spdk_rdma_provider_qp_init_attr a;
    memset(&a, 0, sizeof a);
    a.send_cq = a.recv_cq = cq;
    a.pd = &pd;
    a.cap.max_send_wr = qd;
    a.cap.max_recv_wr = qd;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    if (use_sqdisc) {
        sq = spdk_rdma_provider_qp_create(&id, &a);
        if (!sq)
            DIE("qp_create");
    } else {
        struct ibv_qp_init_attr qa;
        memset(&qa, 0, sizeof qa);
        qa.send_cq = qa.recv_cq = cq;
        qa.qp_type = IBV_QPT_RC;
        qa.cap = a.cap;
        vq.qp = null_create_qp(bench.dev, &qa);
        if (!vq.qp)
            DIE("create_qp");
    }
    struct host_request *req = calloc(qd, sizeof *req);
    unsigned *free_slots = calloc(qd, sizeof *free_slots);
    if (!req || !free_slots)
        DIE("calloc");
    unsigned nfree = qd;
    for (unsigned i = 0; i < qd; i++)
        free_slots[i] = i;
    uint64_t started = 0, done = 0;
    struct ibv_wc wc[32];
    while (done < n) {
        for (unsigned k = 0; k < batch && started < n && nfree; k++) {
            unsigned s = free_slots[--nfree];
            struct host_request *r = &req[s];
            r->rs = (struct ibv_sge){.addr = (uintptr_t)data[0], .length = 64, .lkey = 0x1234};
            r->r = (struct ibv_recv_wr){.wr_id = (uint64_t)s * 2 + 1, .sg_list = &r->rs, .num_sge = 1};
            r->ss = (struct ibv_sge){.addr = (uintptr_t)data[1], .length = 64, .lkey = 0x1234};
            r->s = (struct ibv_send_wr){.wr_id = (uint64_t)s * 2, .sg_list = &r->ss, .num_sge = 1,
                                        .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
            r->left = 2;
            if (use_sqdisc) {
                spdk_rdma_provider_qp_queue_recv_wrs(sq, &r->r);
                spdk_rdma_provider_qp_queue_send_wrs(sq, &r->s);
            } else {
                verbs_queue_recv(&vq, &rfirst, &rlast, &r->r);
                verbs_queue(&vq, &r->s);
            }
            started++;
        }
        int rc;
        if (use_sqdisc) {
            struct ibv_recv_wr *rbad = NULL;
            struct ibv_send_wr *bad = NULL;
            rc = spdk_rdma_provider_qp_flush_recv_wrs(sq, &rbad);
            rc = rc ? rc : spdk_rdma_provider_qp_flush_send_wrs(sq, &bad);
        } else {
            struct ibv_recv_wr *rbad = NULL;
            struct ibv_send_wr *bad = NULL;
            rc = rfirst ? ibv_post_recv(vq.qp, rfirst, &rbad) : 0;
            rfirst = NULL;
            rc = rc ? rc : verbs_flush(&vq, &bad);
        }
        if (rc)
            DIE("flush: %d", rc);
        int got = ibv_poll_cq(cq, 32, wc);
        if (got < 0)
            DIE("poll");
        for (int i = 0; i < got; i++) {
            enum ibv_wc_opcode want = wc[i].wr_id % 2 ? IBV_WC_RECV : IBV_WC_SEND;
            if (wc[i].status != IBV_WC_SUCCESS || wc[i].opcode != want || wc[i].wr_id / 2 >= qd)
                DIE("unexpected completion wr_id %" PRIu64 " status %d", wc[i].wr_id, wc[i].status);
            unsigned s = (unsigned)(wc[i].wr_id / 2);
            if (--req[s].left == 0) {
                free_slots[nfree++] = s;
                done++;
            }
        }
    }
    struct null_stats st;
    null_device_stats(bench.dev, &st);
    printf("provider=%s mode=host requests=%" PRIu64 " wrs=%" PRIu64 " cqes=%" PRIu64 " doorbells=%" PRIu64
           " allocs=%llu\n", use_sqdisc ? "sqdisc" : "verbs", n, n * 2, st.cqes, st.doorbells, allocs_so_far());
    if (use_sqdisc)
        spdk_rdma_provider_qp_destroy(sq);
    else if (null_destroy_qp(vq.qp))
        DIE("destroy_qp");
    if (null_destroy_cq(cq) || null_device_free(bench.dev))
        DIE("teardown");
    free(req);
    free(free_slots);
    return 0;
}

/* ---- the target's loop on an SRQ (-m srq); the target's plain loop is main's ------------------------------- */

/* A receive completion's wr_id is its buffer's index below SRQ_TAG's bit; a send's, s * PER + j. */
#define SRQ_TAG (1ull << 40)

static int srq_loop(int use_sqdisc, uint64_t n, unsigned batch, unsigned qd)
{
    struct ibv_pd pd;
    struct ibv_cq *cq = bench_device(null_device_set_echo_srq, &pd);
    const unsigned max_send = 2 * qd, slots = max_send / PER, nrecv = 2 * qd;

    struct spdk_rdma_provider_srq *psrq = NULL;
    struct ibv_srq *srq;
    if (use_sqdisc) {
        struct spdk_rdma_provider_srq_init_attr sa;
        memset(&sa, 0, sizeof sa);
        sa.pd = &pd;
        sa.srq_init_attr.attr.max_wr = nrecv;
        sa.srq_init_attr.attr.max_sge = 1;
        psrq = spdk_rdma_provider_srq_create(&sa);
        if (!psrq)
            DIE("srq_create");
        srq = psrq->srq;
    } else {
        struct ibv_srq_init_attr sa;
        memset(&sa, 0, sizeof sa);
        sa.attr.max_wr = nrecv;
        sa.attr.max_sge = 1;
        srq = null_create_srq(bench.dev, &sa);
        if (!srq)
            DIE("create_srq");
    }
    struct rdma_cm_id id;
    memset(&id, 0, sizeof id);
    struct spdk_rdma_provider_qp *sq = NULL;
    struct verbs_qp vq;
    memset(&vq, 0, sizeof vq);
    struct ibv_qp *qp;
    struct spdk_rdma_provider_qp_init_attr a;
    memset(&a, 0, sizeof a);
    a.send_cq = a.recv_cq = cq;
    a.srq = srq;
    a.pd = &pd;
    a.cap.max_send_wr = max_send;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    if (use_sqdisc) {
        sq = spdk_rdma_provider_qp_create(&id, &a);
        if (!sq)
            DIE("qp_create");
        qp = sq->qp;
    } else {
        struct ibv_qp_init_attr qa;
        memset(&qa, 0, sizeof qa);
        qa.send_cq = qa.recv_cq = cq;
        qa.srq = srq;
        qa.qp_type = IBV_QPT_RC;
        qa.cap = a.cap;
        vq.qp = qp = null_create_qp(bench.dev, &qa);
        if (!qp)
            DIE("create_qp");
    }

    struct request *req = calloc(slots, sizeof *req);
    unsigned *free_slots = calloc(slots, sizeof *free_slots);
    struct ibv_recv_wr *rwr = calloc(nrecv, sizeof *rwr);
    struct ibv_sge *rsge = calloc(nrecv, sizeof *rsge);
    uint64_t *capsules = calloc(nrecv, sizeof *capsules);
    if (!req || !free_slots || !rwr || !rsge || !capsules)
        DIE("calloc");
    unsigned nfree = slots;
    for (unsigned i = 0; i < slots; i++)
        free_slots[i] = i;
    struct ibv_recv_wr *rfirst = NULL, *rlast = NULL;
    for (unsigned i = 0; i < nrecv; i++) {
        rsge[i] = (struct ibv_sge){.addr = (uintptr_t)data[0], .length = 64, .lkey = 0x1234};
        rwr[i] = (struct ibv_recv_wr){.wr_id = SRQ_TAG | i, .sg_list = &rsge[i], .num_sge = 1};
        if (use_sqdisc)
            spdk_rdma_provider_srq_queue_recv_wrs(psrq, &rwr[i]);
        else
            verbs_queue_recv(&vq, &rfirst, &rlast, &rwr[i]);
    }
    struct ibv_recv_wr *rbad = NULL;
    if (use_sqdisc ? spdk_rdma_provider_srq_flush_recv_wrs(psrq, &rbad) : ibv_post_srq_recv(srq, rfirst, &rbad))
        DIE("posting the SRQ's receives");
    rfirst = NULL;
    if (null_qp_deliver(qp, qd) != (int)qd)
        DIE("the first capsules");
    /* Capsules arrived and not yet taken up by a request: a FIFO of receive indexes. */
    unsigned cap_head = 0, cap_tail = 0;
    uint64_t started = 0, done = 0;
    unsigned depth = 0;
    struct ibv_wc wc[32];
    while (done < n) {
        for (unsigned k = 0; k < batch && started < n && cap_head != cap_tail && depth + PER <= max_send && nfree; k++) {
            unsigned i = (unsigned)capsules[cap_tail++ % nrecv];
            unsigned s = free_slots[--nfree];
            struct request *r = &req[s];
            fill_request(r, s);
            rwr[i].next = NULL;
            if (use_sqdisc) {
                spdk_rdma_provider_srq_queue_recv_wrs(psrq, &rwr[i]);
                spdk_rdma_provider_qp_queue_send_wrs(sq, r->wr);
            } else {
                verbs_queue_recv(&vq, &rfirst, &rlast, &rwr[i]);
                verbs_queue(&vq, r->wr);
            }
            depth += PER;
            started++;
        }
        int rc;
        struct ibv_send_wr *bad = NULL;
        if (use_sqdisc) {
            rc = spdk_rdma_provider_srq_flush_recv_wrs(psrq, &rbad);
            rc = rc ? rc : spdk_rdma_provider_qp_flush_send_wrs(sq, &bad);
        } else {
            rc = rfirst ? ibv_post_srq_recv(srq, rfirst, &rbad) : 0;
            rfirst = NULL;
            rc = rc ? rc : verbs_flush(&vq, &bad);
        }
        if (rc)
            DIE("flush: %d", rc);
        int got = ibv_poll_cq(cq, 32, wc);
        if (got < 0)
            DIE("poll");
        for (int i = 0; i < got; i++) {
            if (wc[i].status != IBV_WC_SUCCESS)
                DIE("completion wr_id %" PRIu64 " status %d", wc[i].wr_id, wc[i].status);
            if (wc[i].opcode == IBV_WC_RECV && (wc[i].wr_id & SRQ_TAG) && (wc[i].wr_id & ~SRQ_TAG) < nrecv) {
                capsules[cap_head++ % nrecv] = wc[i].wr_id & ~SRQ_TAG;
            } else if (wc[i].opcode == IBV_WC_SEND && wc[i].wr_id % PER == WRITES && wc[i].wr_id / PER < slots) {
                free_slots[nfree++] = (unsigned)(wc[i].wr_id / PER);
                depth -= PER;
                done++;
            } else {
                DIE("unexpected completion wr_id %" PRIu64 " opcode %d", wc[i].wr_id, wc[i].opcode);
            }
        }
    }
    struct null_stats st;
    null_device_stats(bench.dev, &st);
    printf("provider=%s mode=srq requests=%" PRIu64 " wrs=%" PRIu64 " cqes=%" PRIu64 " doorbells=%" PRIu64
           " allocs=%llu\n", use_sqdisc ? "sqdisc" : "verbs", n, n * (PER + 1), st.cqes, st.doorbells, allocs_so_far());
    if (use_sqdisc) {
        spdk_rdma_provider_qp_destroy(sq);
        if (spdk_rdma_provider_srq_destroy(psrq))
            DIE("srq_destroy");
    } else if (null_destroy_qp(vq.qp) || null_destroy_srq(srq)) {
        DIE("destroy");
    }
    if (null_destroy_cq(cq) || null_device_free(bench.dev))
        DIE("teardown");
    free(req);
    free(free_slots);
    free(rwr);
    free(rsge);
    free(capsules);
    return 0;
}


int main(int argc, char **argv)
{
    if (argc < 2)
        DIE("usage: spdk_bench verbs|sqdisc|by-hand [-m target|host|srq] [-n requests] [-b batch] [-q qd]");
    int use_sqdisc = strcmp(argv[1], "sqdisc") == 0, by_hand = strcmp(argv[1], "by-hand") == 0;
    if (!use_sqdisc && !by_hand && strcmp(argv[1], "verbs") != 0)
        DIE("unknown provider %s", argv[1]);
    uint64_t n = 20000;
    unsigned batch = 8, qd = 64;
    int host = 0, with_srq = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m")) {
            host = !strcmp(argv[i + 1], "host");
            with_srq = !strcmp(argv[i + 1], "srq");
            if (!host && !with_srq && strcmp(argv[i + 1], "target"))
                DIE("unknown mode %s", argv[i + 1]);
        }
        else if (!strcmp(argv[i], "-n"))
            n = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "-b"))
            batch = (unsigned)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-q"))
            qd = (unsigned)atoi(argv[i + 1]);
        else
            DIE("unknown option %s", argv[i]);
    }
    if (by_hand && (host || with_srq))
        DIE("by-hand runs the target's loop only");
    if (host) {
        if (batch < 1 || qd < 2 || qd > MAX_QD || batch > qd)
            DIE("need 1 <= batch <= qd <= %d", MAX_QD);
        return host_loop(use_sqdisc, n, batch, qd);
    }
    if (batch < 1 || qd < 2 || qd > MAX_QD / 2 || batch * PER > 2 * qd)
        DIE("need 1 <= batch, 2 <= qd <= %d, batch * %d <= 2 * qd", MAX_QD / 2, PER);
    if (with_srq)
        return srq_loop(use_sqdisc, n, batch, qd);
    unsigned max_send = 2 * qd, slots = max_send / PER;

    struct ibv_pd pd;
    struct ibv_cq *cq = bench_device(NULL, &pd);

    struct rdma_cm_id id;
    memset(&id, 0, sizeof id);
    struct spdk_rdma_provider_qp *sq = NULL;
    struct verbs_qp vq;
    memset(&vq, 0, sizeof vq);
    struct spdk_rdma_provider_qp_init_attr a;
    memset(&a, 0, sizeof a);
    a.send_cq = a.recv_cq = cq;
    a.pd = &pd;
    a.cap.max_send_wr = max_send;
    a.cap.max_recv_wr = 1;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    if (use_sqdisc) {
        sq = spdk_rdma_provider_qp_create(&id, &a);
        if (!sq)
            DIE("qp_create");
    } else {
        struct ibv_qp_init_attr qa;
        memset(&qa, 0, sizeof qa);
        qa.send_cq = qa.recv_cq = cq;
        qa.qp_type = IBV_QPT_RC;
        qa.cap = a.cap;
        vq.qp = null_create_qp(bench.dev, &qa);
        if (!vq.qp)
            DIE("create_qp");
    }
    struct hand_cq *hcq = NULL;
    struct hand_queue *hq = NULL;
    if (by_hand && (!(hcq = hand_cq_new(cq)) || !(hq = hand_queue_new(hcq, vq.qp, max_send, 1, max_send / 4, NULL, NULL))))
        DIE("hand_queue_new");

    struct request *req = calloc(slots, sizeof *req);
    unsigned *free_slots = calloc(slots, sizeof *free_slots);
    if (!req || !free_slots)
        DIE("calloc");
    unsigned nfree = slots;
    for (unsigned i = 0; i < slots; i++)
        free_slots[i] = i;
    uint64_t started = 0, done = 0;
    unsigned depth = 0;
    struct ibv_wc wc[32];
    while (done < n) {
        for (unsigned k = 0; k < batch && started < n && depth + PER <= max_send && nfree; k++) {
            unsigned s = free_slots[--nfree];
            struct request *r = &req[s];
            fill_request(r, s);
            if (use_sqdisc)
                spdk_rdma_provider_qp_queue_send_wrs(sq, r->wr);
            else
                verbs_queue(&vq, r->wr);
            depth += PER;
            started++;
        }
        struct ibv_send_wr *bad = NULL;
        int rc = use_sqdisc ? spdk_rdma_provider_qp_flush_send_wrs(sq, &bad)
                 : by_hand  ? by_hand_flush(&vq, hq, &bad)
                            : verbs_flush(&vq, &bad);
        if (rc)
            DIE("flush: %d", rc);
        int got = by_hand ? hand_cq_poll(hcq, 32, wc) : ibv_poll_cq(cq, 32, wc);
        if (got < 0)
            DIE("poll");
        for (int i = 0; i < got; i++) {
            if (wc[i].status != IBV_WC_SUCCESS || wc[i].opcode != IBV_WC_SEND || wc[i].wr_id % PER != WRITES)
                DIE("unexpected completion wr_id %" PRIu64 " status %d", wc[i].wr_id, wc[i].status);
            free_slots[nfree++] = (unsigned)(wc[i].wr_id / PER);
            depth -= PER;
            done++;
        }
    }

    struct null_stats st;
    null_device_stats(bench.dev, &st);
    printf("provider=%s requests=%" PRIu64 " wrs=%" PRIu64 " cqes=%" PRIu64 " doorbells=%" PRIu64 " allocs=%llu\n",
           argv[1], n, n * PER, st.cqes, st.doorbells, allocs_so_far());
    if (by_hand) {
        struct hand_stats hs;
        hand_queue_stats(hq, &hs);
        if (hs.accepted != n * PER || hs.released != hs.accepted)
            DIE("by-hand: %" PRIu64 " WRs accepted, %" PRIu64 " released", hs.accepted, hs.released);
        hand_queue_free(hq);
        hand_cq_free(hcq);
    }
    if (use_sqdisc)
        spdk_rdma_provider_qp_destroy(sq);
    else if (null_destroy_qp(vq.qp))
        DIE("destroy_qp");
    if (null_destroy_cq(cq) || null_device_free(bench.dev))
        DIE("teardown");
    free(req);
    free(free_slots);
    return 0;
}
