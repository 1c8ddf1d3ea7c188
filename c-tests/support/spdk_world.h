/* What the SPDK provider's C tests share: checks that end the program, and a world on the software HCA: a
 * poll group's CQ made and polled as SPDK does, target qpairs made through the provider, peer QPs made raw,
 * SPDK-shaped WRs. Include after <sqdisc_spdk.h>, <sqdisc_sim.h> and "spdk_standin.h". Functions are
 * `static inline` so a test that does not use one is not warned about it. */

#ifndef SQDISC_C_TESTS_SPDK_WORLD_H
#define SQDISC_C_TESTS_SPDK_WORLD_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Checks end the program and report the last spdk_log line. */
#define EXIT_CHECK_CONTEXT standin.last_log
#define EXIT_CHECK_CONTEXT_NAME "last spdk_log"
#include "exit_checks.h"

/* ---- a target qpair (through the provider) connected to a peer QP (raw, on the same device) --------------- */

#define BUF 4096

struct peer {
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    char *buf;
};

struct world {
    struct sqd_sim *sim;
    struct ibv_pd *pd;
    struct ibv_cq *cq; /* the poll group's CQ, made and polled by "SPDK" */
    char *buf;         /* the target's data buffer */
    struct ibv_mr *mr;
    struct peer peer;
};

static inline void world_new(struct world *w, const struct sqd_sim_config *cfg, int cqe)
{
    struct sqd_sim_config def;
    memset(w, 0, sizeof *w);
    if (!cfg) {
        sqd_sim_config_default(&def);
        cfg = &def;
    }
    CHECK_EQ(sqd_sim_new(cfg, &w->sim), 0);
    standin.sim = w->sim;
    CHECK_EQ(standin_count_srqs(w->sim), 0);
    w->pd = sqd_sim_pd(w->sim);
    CHECK_EQ(sqd_sim_create_cq(w->sim, cqe, &w->cq), 0);
    w->buf = calloc(1, BUF);
    w->peer.buf = calloc(1, BUF);
    CHECK(w->buf && w->peer.buf);
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    CHECK_EQ(sqd_sim_reg_mr(w->sim, w->buf, BUF, access, &w->mr), 0);
    CHECK_EQ(sqd_sim_reg_mr(w->sim, w->peer.buf, BUF, access, &w->peer.mr), 0);
    CHECK_EQ(sqd_sim_create_cq(w->sim, 4096, &w->peer.cq), 0);
}

/* A peer QP with `recvs` receives posted, connected to `qp`. */
static inline struct ibv_qp *peer_connect(struct world *w, struct ibv_qp *qp, int recvs)
{
    struct ibv_qp_init_attr a;
    struct sqd_sim_conn_attr conn = {.rnr_retry = SQD_SIM_RNR_RETRY_FOREVER, .retry_cnt = 7, .max_rd_atomic = 16};
    struct ibv_qp *p = NULL;
    memset(&a, 0, sizeof a);
    a.send_cq = a.recv_cq = w->peer.cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = 64;
    a.cap.max_recv_wr = 1024;
    a.cap.max_send_sge = a.cap.max_recv_sge = 4;
    CHECK_EQ(sqd_sim_create_qp(w->sim, &a, &p), 0);
    for (int i = 0; i < recvs; i++) {
        struct ibv_sge sge = {.addr = (uintptr_t)w->peer.buf, .length = 64, .lkey = w->peer.mr->lkey};
        struct ibv_recv_wr r = {.wr_id = 0x9000u + (unsigned)i, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
        CHECK_EQ(ibv_post_recv(p, &r, &bad), 0);
    }
    CHECK_EQ(sqd_sim_connect(qp, p, &conn), 0);
    w->peer.qp = p;
    return p;
}

static inline void world_free(struct world *w)
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
    CHECK_EQ(standin.domain.refs, 0);
}

static inline struct spdk_rdma_provider_qp *qpair_new(struct world *w, struct rdma_cm_id *id, uint32_t send, uint32_t recv,
                                               struct ibv_srq *srq, struct spdk_rdma_provider_qp_stats *stats)
{
    struct spdk_rdma_provider_qp_init_attr a;
    memset(&a, 0, sizeof a);
    memset(id, 0, sizeof *id);
    a.qp_context = id;
    a.send_cq = a.recv_cq = w->cq;
    a.srq = srq;
    a.pd = w->pd;
    a.cap.max_send_wr = send;
    a.cap.max_recv_wr = srq ? 0 : recv;
    a.cap.max_send_sge = 4;
    a.cap.max_recv_sge = 1;
    a.stats = stats;
    return spdk_rdma_provider_qp_create(id, &a);
}

static inline void sge_of(struct world *w, struct ibv_sge *s, uint32_t off, uint32_t len)
{
    s->addr = (uintptr_t)w->buf + off;
    s->length = len;
    s->lkey = w->mr->lkey;
}

/* `n` receives of 64 bytes into the target's buffer, wr_ids first_id.., chained when `linked`. */
static inline void recv_wrs(struct world *w, struct ibv_recv_wr *r, struct ibv_sge *s, int n, uint64_t first_id,
                            int linked)
{
    memset(r, 0, (size_t)n * sizeof *r);
    for (int i = 0; i < n; i++) {
        sge_of(w, &s[i], 3584, 64);
        r[i].wr_id = first_id + (uint64_t)i;
        r[i].sg_list = &s[i];
        r[i].num_sge = 1;
        r[i].next = linked && i + 1 < n ? &r[i + 1] : NULL;
    }
}

/* SPDK's WRs: an RDMA WRITE (unsignaled unless asked) and a SEND. */
static inline void write_wr(struct world *w, struct ibv_send_wr *wr, struct ibv_sge *s, uint64_t id, int signaled)
{
    memset(wr, 0, sizeof *wr);
    sge_of(w, s, (uint32_t)(id % 32) * 64, 64);
    wr->wr_id = id;
    wr->opcode = IBV_WR_RDMA_WRITE;
    wr->sg_list = s;
    wr->num_sge = 1;
    wr->send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    wr->wr.rdma.remote_addr = (uintptr_t)w->peer.buf + 2048;
    wr->wr.rdma.rkey = w->peer.mr->rkey;
}

static inline void send_wr(struct world *w, struct ibv_send_wr *wr, struct ibv_sge *s, uint64_t id)
{
    memset(wr, 0, sizeof *wr);
    sge_of(w, s, 3072, 16);
    wr->wr_id = id;
    wr->opcode = IBV_WR_SEND;
    wr->sg_list = s;
    wr->num_sge = 1;
    wr->send_flags = IBV_SEND_SIGNALED;
}

static inline void link_wrs(struct ibv_send_wr *wrs, int n)
{
    for (int i = 0; i < n; i++)
        wrs[i].next = i + 1 < n ? &wrs[i + 1] : NULL;
}

/* Polls the poll group's CQ as SPDK does (ibv_poll_cq, batches of 32) until `want` completions arrived or
 * `rounds` polls found nothing; returns how many, stored in `out`. */
static inline int reap(struct world *w, struct ibv_wc *out, int cap, int want, int rounds)
{
    int got = 0, idle = 0;
    while (got < want && idle < rounds) {
        int room = cap - got < 32 ? cap - got : 32;
        int n = ibv_poll_cq(w->cq, room, out + got);
        CHECK(n >= 0);
        got += n;
        idle = n ? 0 : idle + 1;
        if (got == cap)
            break;
    }
    return got;
}

static inline struct sqd_queue_stats qstats(const struct spdk_rdma_provider_qp *q)
{
    struct sqd_queue_stats s;
    CHECK_EQ(sqd_spdk_qp_stats(q, &s), 0);
    return s;
}

/* The qpair's error-completion counters (sqd_spdk_qp_counters), checked to be of this size and this QP. */
static inline struct sqd_spdk_qp_counters counters(const struct spdk_rdma_provider_qp *q)
{
    struct sqd_spdk_qp_counters c;
    memset(&c, 0, sizeof c);
    c.size = sizeof c;
    CHECK_EQ(sqd_spdk_qp_counters(q, &c), 0);
    CHECK_EQ(c.size, sizeof c);
    CHECK_EQ(c.qp_num, q->qp->qp_num);
    return c;
}

#endif
