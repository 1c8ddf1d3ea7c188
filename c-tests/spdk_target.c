/* The SPDK NVMe-oF target's workload shape through libsqdisc_spdk on the software HCA: one poll group, many
 * qpairs on its CQ (created at SPDK's default size and grown by SPDK's own formula before each qpair), each
 * request answered by unsignaled RDMA WRITEs chained before a signaled response SEND, admitted by SPDK's
 * send-depth rule, flushed once per poll, completions read with ibv_poll_cq in batches of 32 and accounted as
 * SPDK does (a SEND's completion frees its request's WRs, a flushed WRITE frees itself). Faults: request and
 * ACK loss, QPs failing mid-run, SPDK disconnecting a qpair on its first error and destroying it once its
 * depth is back to zero. Checked, for several seeds: every flush succeeds, the send and receive depths of
 * every qpair return to zero, each request ends exactly once, no completion is unknown or repeated, and the
 * device (strict mode) sees no SQ overflow and no CQ overrun. */

#include <sqdisc_spdk.h>
#include <sqdisc_sim.h>

#include "support/spdk_standin.h"

#include "support/spdk_world.h"

enum {
    QPAIRS = 48,
    QD = 32,                /* SPDK's max_queue_depth */
    SEND_WR = 2 * QD,       /* SPDK asks max_send_wr = 2 * qd */
    WRITES = 3,             /* data WRs per request */
    REQS_PER_QPAIR = 120,
    SPDK_CQ = 4096,         /* DEFAULT_NVMF_RDMA_CQ_SIZE */
};

#define MAX_WR_PER_QP(qd) ((qd) * 3 + 2) /* SPDK's CQ growth per qpair */

/* wr_id: qpair << 32 | request << 8 | kind (0..2 WRITE k, 3 SEND, 4 RECV) */
#define WRID(q, r, k) (((uint64_t)(q) << 32) | ((uint64_t)(r) << 8) | (uint64_t)(k))

struct request {
    struct ibv_send_wr wr[WRITES + 1];
    struct ibv_sge sge[WRITES + 1];
    int outstanding_data; /* SPDK's num_outstanding_data_wr */
    int in_flight;
    int ended;            /* completions that ended it (must end up 1) */
    int ok;
};

struct qpair {
    struct rdma_cm_id id;
    struct spdk_rdma_provider_qp *q;
    struct ibv_qp *peer;
    struct request req[REQS_PER_QPAIR];
    struct ibv_recv_wr rwr[QD];
    struct ibv_sge rsge[QD];
    int next, send_depth, max_send_depth, recv_depth;
    int disconnecting, destroyed, fatal_at;
};

static struct qpair qps[QPAIRS];

static void request_wrs(struct world *w, int qi, int ri)
{
    struct request *r = &qps[qi].req[ri];
    for (int k = 0; k < WRITES; k++) {
        write_wr(w, &r->wr[k], &r->sge[k], WRID(qi, ri, k), 0);
        r->wr[k].wr.rdma.remote_addr = (uintptr_t)w->peer.buf + 1024 + (uint64_t)k * 64;
    }
    send_wr(w, &r->wr[WRITES], &r->sge[WRITES], WRID(qi, ri, WRITES));
    link_wrs(r->wr, WRITES + 1);
}

/* What sqdisc did underneath, summed over the qpairs when they are destroyed, and the flush completions SPDK
 * saw: reported with the run (docs/spdk.md quotes it). */
static struct {
    unsigned long long accepted, policy_signals, markers, parked, flushes;
    unsigned long long errors_seen[QPAIRS]; /* error completions SPDK polled, per qpair */
} underneath;

/* One ibv_wc, accounted as SPDK's target accounts it. */
static void on_wc(struct world *w, const struct ibv_wc *wc)
{
    underneath.flushes += wc->status == IBV_WC_WR_FLUSH_ERR;
    int qi = (int)(wc->wr_id >> 32), ri = (int)((wc->wr_id >> 8) & 0xffffff), kind = (int)(wc->wr_id & 0xff);
    CHECK(qi >= 0 && qi < QPAIRS && !qps[qi].destroyed);
    underneath.errors_seen[qi] += wc->status != IBV_WC_SUCCESS;
    struct qpair *p = &qps[qi];
    CHECK_EQ(wc->qp_num, p->q->qp->qp_num);
    if (wc->status != IBV_WC_SUCCESS && !p->disconnecting) {
        /* SPDK disconnects a qpair on its first error completion. */
        p->disconnecting = 1;
        CHECK_EQ(spdk_rdma_provider_qp_disconnect(p->q), 0);
    }
    if (kind == 4) {
        CHECK(ri < QD && wc->status != IBV_WC_SUCCESS); /* the peer sends nothing: receives only flush */
        p->recv_depth--;
        return;
    }
    CHECK(ri < p->next);
    struct request *r = &p->req[ri];
    CHECK(r->in_flight);
    if (kind < WRITES) {
        /* Only a failed WRITE completes: unsignaled ones never show on success. */
        CHECK(wc->status != IBV_WC_SUCCESS);
        r->outstanding_data--;
        p->send_depth--;
    } else {
        CHECK_EQ(kind, WRITES);
        p->send_depth -= r->outstanding_data + 1;
        r->outstanding_data = 0;
        r->in_flight = 0;
        r->ended++;
        r->ok = wc->status == IBV_WC_SUCCESS;
    }
    CHECK(p->send_depth >= 0 && r->outstanding_data >= 0);
    (void)w;
}

static void run_seed(uint64_t seed)
{
    struct world w;
    struct sqd_sim_config cfg;
    char name[64];
    snprintf(name, sizeof name, "spdk_target_workload_seed_%llu", (unsigned long long)seed);
    current = name;
    sqd_sim_config_default(&cfg);
    cfg.seed = seed;
    cfg.loss_ppm = 10000;
    cfg.ack_loss_ppm = 10000;
    cfg.wire_delay_min = 1;
    cfg.wire_delay_max = 4;
    cfg.flags = SQD_SIM_STRICT;
    world_new(&w, &cfg, SPDK_CQ);
    memset(qps, 0, sizeof qps);

    int required = 0, num_cqe = SPDK_CQ;
    for (int i = 0; i < QPAIRS; i++) {
        struct qpair *p = &qps[i];
        /* nvmf_rdma_resize_cq */
        required += MAX_WR_PER_QP(QD);
        if (num_cqe < required) {
            num_cqe = num_cqe * 2 > required ? num_cqe * 2 : required;
            CHECK_EQ(sqd_sim_resize_cq(w.cq, num_cqe), 0);
        }
        p->q = qpair_new(&w, &p->id, SEND_WR, QD, NULL, NULL);
        CHECK(p->q != NULL);
        p->max_send_depth = SEND_WR;
        w.peer.qp = NULL;
        p->peer = peer_connect(&w, p->q->qp, SEND_WR); /* a receive for every response in a window */
        /* The target's receives for commands (the peer sends none here: they flush at the end). */
        for (int k = 0; k < QD; k++) {
            sge_of(&w, &p->rsge[k], 3584, 64);
            p->rwr[k].wr_id = WRID(i, k, 4);
            p->rwr[k].sg_list = &p->rsge[k];
            p->rwr[k].num_sge = 1;
            p->rwr[k].next = NULL;
            spdk_rdma_provider_qp_queue_recv_wrs(p->q, &p->rwr[k]);
        }
        struct ibv_recv_wr *rbad = NULL;
        CHECK_EQ(spdk_rdma_provider_qp_flush_recv_wrs(p->q, &rbad), 0);
        p->recv_depth = QD;
        /* A few QPs fail mid-run (a fatal local error at a step the seed decides), one on a remote access
         * error of its first request. */
        p->fatal_at = -1;
        if (i % 4 == 1) {
            p->fatal_at = 20 + (int)((seed * 131 + (uint64_t)i * 17) % 150);
            struct sqd_sim_fault f = {.kind = SQD_SIM_FAULT_QP_FATAL, .qp = p->q->qp, .at_step = (uint64_t)p->fatal_at};
            CHECK_EQ(sqd_sim_inject(w.sim, &f), 0);
        } else if (i == 3) {
            p->fatal_at = 0;
            struct sqd_sim_fault f = {.kind = SQD_SIM_FAULT_REMOTE_ACCESS, .qp = p->q->qp};
            CHECK_EQ(sqd_sim_inject(w.sim, &f), 0);
        }
    }
    struct ibv_wc pwc[64];

    int active = QPAIRS, polls = 0, ended = 0, failed = 0;
    struct ibv_wc wc[32];
    while (active > 0) {
        CHECK(++polls < 200000);
        for (int i = 0; i < QPAIRS; i++) {
            struct qpair *p = &qps[i];
            if (p->destroyed)
                continue;
            if (p->disconnecting) {
                if (p->send_depth == 0 && p->recv_depth == 0) {
                    struct sqd_queue_stats qs = qstats(p->q);
                    underneath.accepted += qs.accepted;
                    underneath.policy_signals += qs.signaled_by_policy;
                    underneath.markers += qs.markers;
                    underneath.parked += qs.parked;
                    /* The provider's own account of the error completions it handed agrees with what SPDK
                     * polled: none twice, none still owed. */
                    struct sqd_spdk_qp_counters fc = {.size = sizeof fc};
                    CHECK_EQ(sqd_spdk_qp_counters(p->q, &fc), 0);
                    CHECK_EQ(fc.duplicates, 0);
                    CHECK_EQ(fc.owed, 0);
                    CHECK_EQ(fc.send_flushes + fc.recv_flushes + fc.owed_flushes + fc.other_errors,
                             underneath.errors_seen[i]);
                    spdk_rdma_provider_qp_destroy(p->q);
                    CHECK_EQ(sqd_sim_destroy_qp(p->peer), 0);
                    p->destroyed = 1;
                    active--;
                }
                continue;
            }
            /* SPDK's admission: a request's WRs go out only if they fit max_send_depth. */
            while (p->next < REQS_PER_QPAIR && p->send_depth + WRITES + 1 <= p->max_send_depth) {
                struct request *r = &p->req[p->next];
                request_wrs(&w, i, p->next);
                r->outstanding_data = WRITES;
                r->in_flight = 1;
                spdk_rdma_provider_qp_queue_send_wrs(p->q, r->wr);
                p->send_depth += WRITES + 1;
                p->next++;
            }
            struct ibv_send_wr *bad = NULL;
            CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(p->q, &bad), 0);
            if (p->next == REQS_PER_QPAIR && p->send_depth == 0) {
                /* All requests done: SPDK disconnects and waits for the receives to flush. */
                p->disconnecting = 1;
                CHECK_EQ(spdk_rdma_provider_qp_disconnect(p->q), 0);
            }
        }
        int n = ibv_poll_cq(w.cq, 32, wc);
        CHECK(n >= 0);
        for (int k = 0; k < n; k++)
            on_wc(&w, &wc[k]);
        /* The hosts: keep a receive posted for every response. */
        int pn = ibv_poll_cq(w.peer.cq, 64, pwc);
        CHECK(pn >= 0);
        for (int k = 0; k < pn; k++) {
            if (pwc[k].status != IBV_WC_SUCCESS || pwc[k].opcode != IBV_WC_RECV)
                continue;
            for (int i = 0; i < QPAIRS; i++) {
                if (!qps[i].destroyed && qps[i].peer->qp_num == pwc[k].qp_num) {
                    struct ibv_sge s = {.addr = (uintptr_t)w.peer.buf, .length = 64, .lkey = w.peer.mr->lkey};
                    struct ibv_recv_wr r = {.wr_id = 1, .sg_list = &s, .num_sge = 1}, *rb = NULL;
                    CHECK_EQ(ibv_post_recv(qps[i].peer, &r, &rb), 0);
                }
            }
        }
    }
    for (int i = 0; i < QPAIRS; i++) {
        struct qpair *p = &qps[i];
        CHECK_EQ(p->send_depth, 0);
        CHECK_EQ(p->recv_depth, 0);
        for (int r = 0; r < p->next; r++) {
            CHECK_EQ(p->req[r].ended, 1);
            ended++;
            failed += !p->req[r].ok;
        }
        if (getenv("SPDK_TARGET_VERBOSE"))
            printf("  qpair %d: %d requests, fatal_at %d\n", i, p->next, p->fatal_at);
        /* A qpair without a failed QP finished every request. */
        if (p->fatal_at < 0)
            CHECK_EQ(p->next, REQS_PER_QPAIR);
    }
    struct sqd_sim_stats st;
    CHECK_EQ(sqd_sim_stats(w.sim, &st), 0);
    CHECK(st.packets_lost > 0 && st.acks_lost > 0 && st.retransmissions > 0);
    CHECK(failed > 0); /* the failed QPs cut requests short */
    CHECK_EQ(sqd_spdk_cq_stats(w.cq, &(struct sqd_cq_stats){0}), -ENOENT);
    /* SPDK ends every request with a signaled SEND and admits no more WRs than max_send_wr: sqdisc never has
     * to post a marker or park a WR for it; what it brings here is the CQ budget and exact flushes. */
    CHECK_EQ(underneath.markers, 0);
    CHECK_EQ(underneath.parked, 0);
    CHECK(underneath.flushes > 0);
    w.peer.qp = NULL;
    world_free(&w); /* no violation: no SQ overflow, no CQ overrun */
    printf("PASS %s: %d requests ended once (%d failed with their QP), %llu packets and %llu ACKs lost, "
           "%llu retransmissions, CQ grown to %d; underneath: %llu WRs, %llu signaled by moderation, %llu markers, "
           "%llu through the backlog, %llu flush completions delivered\n",
           current, ended, failed, (unsigned long long)st.packets_lost, (unsigned long long)st.acks_lost,
           (unsigned long long)st.retransmissions, num_cqe, underneath.accepted, underneath.policy_signals,
           underneath.markers, underneath.parked, underneath.flushes);
    memset(&underneath, 0, sizeof underneath);
}

int main(void)
{
    for (uint64_t seed = 1; seed <= 3; seed++)
        run_seed(seed);
    return 0;
}
