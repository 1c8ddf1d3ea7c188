/* The contract of libsqdisc_spdk, SPDK's RDMA provider backed by sqdisc: the 14 spdk_rdma_provider_*
 * functions called the way SPDK's NVMe-oF target and NVMe-RDMA host call them, on the software HCA, with the
 * stand-ins of support/spdk_standin.h for the SPDK functions the provider needs. SPDK polls its CQs itself
 * through ibv_poll_cq, so every completion here is read that way too. Prints "PASS <name>" per scenario;
 * exits non-zero on the first failure. */

#define SQD_SPDK_ASSERT_LAYOUT 1
#include <sqdisc_spdk.h>
#include <sqdisc_sim.h>

#include "support/spdk_standin.h"

#include "support/spdk_world.h"

static int a_transfer_callback(void)
{
    return 0;
}

/* ---- scenarios -------------------------------------------------------------------------------------------- */

static void create_writes_back_caps_and_refuses_what_it_cannot_do(void)
{
    struct world w;
    struct rdma_cm_id id;
    struct spdk_rdma_provider_qp_init_attr a;
    struct spdk_rdma_provider_qp_stats shared = {{0, 0}, {0, 0}};
    current = "create_writes_back_caps_and_refuses_what_it_cannot_do";
    world_new(&w, NULL, 1024);

    CHECK(!spdk_rdma_provider_accel_sequence_supported());
    CHECK(spdk_rdma_provider_qp_create(&id, NULL) == NULL);
    CHECK(standin.errors > 0);

    memset(&a, 0, sizeof a);
    memset(&id, 0, sizeof id);
    a.send_cq = a.recv_cq = w.cq;
    a.pd = w.pd;
    a.cap.max_send_wr = 100000; /* clamped by the device: the granted caps are written back */
    a.cap.max_recv_wr = 8;
    a.cap.max_send_sge = 4;
    a.cap.max_recv_sge = 1;
    a.domain_transfer = a_transfer_callback;
    int errors = standin.errors;
    CHECK(spdk_rdma_provider_qp_create(&id, &a) == NULL);
    CHECK(standin.errors == errors + 1 && strstr(standin.last_log, "memory domain transfer"));
    a.domain_transfer = NULL;

    /* The CQ is far too small for 32768 sends and cannot grow (as on iWARP): the qpair is refused, with the
     * numbers, and no QP is left over. */
    int made = standin.create_qp, destroyed = standin.destroy_qp;
    standin.resize_fail = EOPNOTSUPP;
    CHECK(spdk_rdma_provider_qp_create(&id, &a) == NULL);
    CHECK(strstr(standin.last_log, "CQ too small") != NULL);
    CHECK(strstr(standin.last_log, "ibv_resize_cq failed") != NULL);
    CHECK_EQ(standin.create_qp, made + 1);
    CHECK_EQ(standin.destroy_qp, destroyed + 1);
    CHECK_EQ(sqd_spdk_cq_stats(w.cq, &(struct sqd_cq_stats){0}), -ENOENT);
    standin.resize_fail = 0;

    /* SPDK grows the CQ (ibv_resize_cq) before it adds a qpair: the provider reads the new size. */
    CHECK_EQ(sqd_sim_resize_cq(w.cq, 40000), 0);
    a.stats = &shared;
    int resizes = standin.resizes;
    struct spdk_rdma_provider_qp *q = spdk_rdma_provider_qp_create(&id, &a);
    CHECK(q != NULL);
    CHECK_EQ(standin.resizes, resizes);
    CHECK_EQ(a.cap.max_send_wr, 32768);
    CHECK(q->qp == id.qp && q->cm_id == &id && q->qp->qp_num != 0);
    CHECK(q->domain == (struct spdk_memory_domain *)&standin.domain && standin.domain.refs == 1);
    CHECK(q->stats == &shared && q->shared_stats);
    CHECK(q->send_wrs.first == NULL && q->recv_wrs.first == NULL);
    struct sqd_cq_stats cs;
    CHECK_EQ(sqd_spdk_cq_stats(w.cq, &cs), 0);
    CHECK_EQ(cs.capacity, 40000);
    CHECK_EQ(cs.reserved, 32768 + 1 + 8);

    /* A second one does not fit: the provider grows the CQ itself, by exactly what the qpair reserves. */
    struct rdma_cm_id id3;
    memset(&id3, 0, sizeof id3);
    a.cap.max_send_wr = 100000;
    a.cap.max_recv_wr = 8;
    struct spdk_rdma_provider_qp *q3 = spdk_rdma_provider_qp_create(&id3, &a);
    CHECK(q3 != NULL);
    CHECK_EQ(standin.resizes, resizes + 1);
    CHECK_EQ(sqd_spdk_cq_stats(w.cq, &cs), 0);
    CHECK_EQ(cs.capacity, 2 * (32768 + 1 + 8));
    CHECK_EQ(cs.reserved, cs.capacity);
    CHECK_EQ(w.cq->cqe, cs.capacity);
    spdk_rdma_provider_qp_destroy(q3);
    CHECK_EQ(spdk_rdma_provider_qp_accept(q, NULL), 0);
    CHECK_EQ(standin.accept, 1);
    CHECK_EQ(spdk_rdma_provider_qp_complete_connect(q), 0);

    /* A failing rdma_cm create_qp: NULL, nothing managed. */
    struct rdma_cm_id id2;
    standin.create_qp_fail = ENOMEM;
    CHECK(qpair_new(&w, &id2, 8, 8, NULL, NULL) == NULL);
    CHECK(strstr(standin.last_log, "spdk_rdma_cm_create_qp failed") != NULL);

    spdk_rdma_provider_qp_destroy(q);
    spdk_rdma_provider_qp_destroy(NULL);
    CHECK(id.qp == NULL);
    CHECK_EQ(sqd_spdk_cq_stats(w.cq, &cs), -ENOENT);
    world_free(&w);
    printf("PASS %s\n", current);
}

static void queue_and_flush_keep_order_wr_ids_and_counters(void)
{
    struct world w;
    struct rdma_cm_id id;
    current = "queue_and_flush_keep_order_wr_ids_and_counters";
    world_new(&w, NULL, 1024);
    struct spdk_rdma_provider_qp *q = qpair_new(&w, &id, 16, 8, NULL, NULL);
    CHECK(q != NULL);
    CHECK(!q->shared_stats && q->stats != NULL);
    peer_connect(&w, q->qp, 64);

    struct ibv_send_wr wrs[6];
    struct ibv_sge sges[6];
    struct ibv_send_wr *bad = (struct ibv_send_wr *)&bad;
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), 0); /* empty: nothing, no doorbell */
    CHECK_EQ(q->stats->send.doorbell_updates, 0);
    for (int i = 0; i < 6; i++)
        send_wr(&w, &wrs[i], &sges[i], 100 + (uint64_t)i);
    link_wrs(wrs, 2);
    link_wrs(wrs + 2, 4);
    CHECK(spdk_rdma_provider_qp_queue_send_wrs(q, &wrs[0]));  /* the list was empty */
    CHECK(!spdk_rdma_provider_qp_queue_send_wrs(q, &wrs[2])); /* appended */
    CHECK_EQ(q->stats->send.num_submitted_wrs, 6);
    CHECK(q->send_wrs.first == &wrs[0] && q->send_wrs.last == &wrs[5] && wrs[1].next == &wrs[2]);
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), 0);
    CHECK(bad == NULL && q->send_wrs.first == NULL);
    CHECK_EQ(q->stats->send.doorbell_updates, 1);
    /* The chain SPDK handed over is as it was: wr_ids, flags, links. */
    for (int i = 0; i < 6; i++) {
        CHECK_EQ(wrs[i].wr_id, 100 + i);
        CHECK_EQ(wrs[i].send_flags, IBV_SEND_SIGNALED);
    }
    CHECK(wrs[5].next == NULL);

    struct ibv_wc wc[16];
    int n = reap(&w, wc, 16, 6, 50);
    CHECK_EQ(n, 6);
    for (int i = 0; i < 6; i++) {
        CHECK_EQ(wc[i].wr_id, 100 + i);
        CHECK_EQ(wc[i].status, IBV_WC_SUCCESS);
        CHECK_EQ(wc[i].opcode, IBV_WC_SEND);
        CHECK_EQ(wc[i].qp_num, q->qp->qp_num);
    }
    CHECK_EQ(reap(&w, wc, 16, 1, 5), 0);

    /* Receives on the qpair's own RQ: queue/flush, then the peer's SENDs land with SPDK's wr_ids. */
    struct ibv_recv_wr rwr[3];
    struct ibv_sge rsge[3];
    recv_wrs(&w, rwr, rsge, 3, 500, 1);
    struct ibv_recv_wr *rbad = NULL;
    CHECK(spdk_rdma_provider_qp_queue_recv_wrs(q, &rwr[0]));
    CHECK_EQ(q->stats->recv.num_submitted_wrs, 3);
    CHECK_EQ(spdk_rdma_provider_qp_flush_recv_wrs(q, &rbad), 0);
    CHECK(rbad == NULL);
    CHECK_EQ(q->stats->recv.doorbell_updates, 1);
    for (int i = 0; i < 3; i++) {
        struct ibv_sge s = {.addr = (uintptr_t)w.peer.buf, .length = 8, .lkey = w.peer.mr->lkey};
        struct ibv_send_wr sw = {.wr_id = 7, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
                                 .send_flags = IBV_SEND_SIGNALED};
        struct ibv_send_wr *sbad = NULL;
        CHECK_EQ(ibv_post_send(w.peer.qp, &sw, &sbad), 0);
    }
    n = reap(&w, wc, 16, 3, 50);
    CHECK_EQ(n, 3);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(wc[i].wr_id, 500 + i);
        CHECK_EQ(wc[i].opcode, IBV_WC_RECV);
        CHECK_EQ(wc[i].byte_len, 8);
    }
    CHECK_EQ(qstats(q).recv_outstanding, 0);

    spdk_rdma_provider_qp_destroy(q);
    world_free(&w);
    printf("PASS %s\n", current);
}

static void unsignaled_writes_before_a_signaled_send_show_only_the_send(void)
{
    struct world w;
    struct rdma_cm_id id;
    current = "unsignaled_writes_before_a_signaled_send_show_only_the_send";
    world_new(&w, NULL, 1024);
    struct spdk_rdma_provider_qp *q = qpair_new(&w, &id, 32, 8, NULL, NULL);
    CHECK(q != NULL);
    peer_connect(&w, q->qp, 256);

    /* 40 requests of 3 WRITEs and a response SEND, submitted as SPDK does (queue per request, one flush per
     * poll), with SPDK's send-depth accounting: the SEND's completion frees the whole request. */
    enum { REQS = 40, PER = 4 };
    static struct ibv_send_wr wrs[REQS][PER];
    static struct ibv_sge sges[REQS][PER];
    int depth = 0, done = 0, next = 0;
    struct ibv_wc wc[32];
    while (done < REQS) {
        while (next < REQS && depth + PER <= 32) {
            for (int k = 0; k < 3; k++)
                write_wr(&w, &wrs[next][k], &sges[next][k], (uint64_t)next * 10 + (uint64_t)k, 0);
            send_wr(&w, &wrs[next][3], &sges[next][3], (uint64_t)next * 10 + 3);
            link_wrs(wrs[next], PER);
            spdk_rdma_provider_qp_queue_send_wrs(q, wrs[next]);
            depth += PER;
            next++;
        }
        struct ibv_send_wr *bad = NULL;
        CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), 0);
        int n = ibv_poll_cq(w.cq, 32, wc);
        CHECK(n >= 0);
        for (int i = 0; i < n; i++) {
            /* Only SPDK's signaled SENDs: no completion for the WRITEs nor for sqdisc's own signals. */
            CHECK_EQ(wc[i].status, IBV_WC_SUCCESS);
            CHECK_EQ(wc[i].opcode, IBV_WC_SEND);
            CHECK_EQ(wc[i].wr_id, (uint64_t)done * 10 + 3);
            depth -= PER;
            done++;
        }
    }
    CHECK_EQ(depth, 0);
    struct sqd_queue_stats s = qstats(q);
    CHECK_EQ(s.accepted, REQS * PER);
    CHECK_EQ(s.signaled_by_ulp, REQS);
    struct sqd_cq_stats cs;
    CHECK_EQ(sqd_spdk_cq_stats(w.cq, &cs), 0);
    CHECK_EQ(cs.visible, REQS);
    CHECK_EQ(q->stats->send.num_submitted_wrs, REQS * PER);

    spdk_rdma_provider_qp_destroy(q);
    world_free(&w);
    printf("PASS %s\n", current);
}

static void a_flush_bigger_than_the_sq_is_backlogged_where_raw_verbs_fail_with_enomem(void)
{
    struct world w;
    struct rdma_cm_id id;
    current = "a_flush_bigger_than_the_sq_is_backlogged_where_raw_verbs_fail_with_enomem";
    world_new(&w, NULL, 1024);
    struct spdk_rdma_provider_qp *q = qpair_new(&w, &id, 8, 8, NULL, NULL);
    CHECK(q != NULL);
    peer_connect(&w, q->qp, 64);

    /* Raw verbs, for comparison, on a QP of the same depth: the ninth WR fails with ENOMEM. */
    struct ibv_qp_init_attr ra;
    struct ibv_qp *raw = NULL;
    memset(&ra, 0, sizeof ra);
    ra.send_cq = ra.recv_cq = w.peer.cq;
    ra.qp_type = IBV_QPT_RC;
    ra.cap.max_send_wr = 8;
    ra.cap.max_recv_wr = 1;
    ra.cap.max_send_sge = ra.cap.max_recv_sge = 1;
    CHECK_EQ(sqd_sim_create_qp(w.sim, &ra, &raw), 0);
    struct ibv_qp *keep = w.peer.qp;
    struct ibv_qp *raw_peer = peer_connect(&w, raw, 0);
    w.peer.qp = keep;

    enum { N = 20 };
    struct ibv_send_wr wrs[N], *bad = NULL;
    struct ibv_sge sges[N];
    for (int i = 0; i < N; i++)
        write_wr(&w, &wrs[i], &sges[i], (uint64_t)i, i == N - 1);
    link_wrs(wrs, N);
    CHECK_EQ(ibv_post_send(raw, wrs, &bad), ENOMEM);
    CHECK(bad == &wrs[8]);
    CHECK_EQ(sqd_sim_destroy_qp(raw), 0);
    CHECK_EQ(sqd_sim_destroy_qp(raw_peer), 0);

    /* The provider takes them: 8 into the SQ, the rest into the qpair's backlog, which holds max_send_wr WRs
     * (all SPDK ever has outstanding, so sqdisc's own signaled markers never cost SPDK an ENOMEM). Past that
     * it refuses as a full SQ does, ENOMEM, *bad_wr at the first WR not taken. */
    wrs[15].send_flags = IBV_SEND_SIGNALED;
    spdk_rdma_provider_qp_queue_send_wrs(q, wrs);
    bad = NULL;
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), ENOMEM);
    CHECK(bad == &wrs[16]);
    struct sqd_queue_stats s = qstats(q);
    CHECK_EQ(s.accepted, 16);
    CHECK_EQ(s.backlog, 8);
    CHECK_EQ(s.in_provider, 8);
    struct ibv_wc wc[8];
    CHECK_EQ(reap(&w, wc, 8, 1, 200), 1);
    CHECK_EQ(wc[0].wr_id, 15);
    CHECK_EQ(wc[0].status, IBV_WC_SUCCESS);
    s = qstats(q);
    CHECK_EQ(s.released, 16);
    CHECK_EQ(s.backlog, 0);
    /* The WRs not taken, posted again. */
    spdk_rdma_provider_qp_queue_send_wrs(q, &wrs[16]);
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), 0);
    CHECK_EQ(reap(&w, wc, 8, 1, 200), 1);
    CHECK_EQ(wc[0].wr_id, N - 1);
    CHECK_EQ(qstats(q).released, N);

    spdk_rdma_provider_qp_destroy(q);
    world_free(&w);
    printf("PASS %s\n", current);
}

static void a_bad_wr_fails_the_flush_at_exactly_that_wr(void)
{
    struct world w;
    struct rdma_cm_id id;
    current = "a_bad_wr_fails_the_flush_at_exactly_that_wr";
    world_new(&w, NULL, 1024);
    struct spdk_rdma_provider_qp *q = qpair_new(&w, &id, 16, 8, NULL, NULL);
    CHECK(q != NULL);
    peer_connect(&w, q->qp, 64);

    struct ibv_send_wr wrs[5], *bad = NULL;
    struct ibv_sge sges[5];
    for (int i = 0; i < 5; i++)
        send_wr(&w, &wrs[i], &sges[i], 40 + (uint64_t)i);
    wrs[2].num_sge = 99; /* above max_send_sge */
    link_wrs(wrs, 5);
    spdk_rdma_provider_qp_queue_send_wrs(q, wrs);
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), EINVAL);
    CHECK(bad == &wrs[2]);
    CHECK(wrs[2].next == &wrs[3] && wrs[3].next == &wrs[4] && wrs[4].next == NULL);
    CHECK(q->send_wrs.first == NULL); /* as SPDK's providers: the list is handed over either way */
    CHECK_EQ(q->stats->send.doorbell_updates, 1);
    struct ibv_wc wc[8];
    CHECK_EQ(reap(&w, wc, 8, 2, 50), 2);
    CHECK_EQ(wc[0].wr_id, 40);
    CHECK_EQ(wc[1].wr_id, 41);
    CHECK_EQ(reap(&w, wc, 8, 1, 5), 0);
    CHECK_EQ(qstats(q).accepted, 2);

    spdk_rdma_provider_qp_destroy(q);
    world_free(&w);
    printf("PASS %s\n", current);
}

/* SPDK's accounting on a flush: one completion per WR, unsignaled WRITEs included, each with its own wr_id. */
static void disconnect_flushes_every_outstanding_wr_once_backlog_included(void)
{
    struct world w;
    struct rdma_cm_id id;
    current = "disconnect_flushes_every_outstanding_wr_once_backlog_included";
    world_new(&w, NULL, 1024);
    struct spdk_rdma_provider_qp *q = qpair_new(&w, &id, 8, 4, NULL, NULL);
    CHECK(q != NULL);
    peer_connect(&w, q->qp, 64);

    struct ibv_recv_wr rwr[4], *rbad = NULL;
    struct ibv_sge rsge[4];
    recv_wrs(&w, rwr, rsge, 4, 900, 1);
    spdk_rdma_provider_qp_queue_recv_wrs(q, rwr);
    CHECK_EQ(spdk_rdma_provider_qp_flush_recv_wrs(q, &rbad), 0);

    /* 14 WRs on an 8-deep SQ: some wait in the backlog when the QP goes to the error state. */
    enum { N = 14 };
    struct ibv_send_wr wrs[N], *bad = NULL;
    struct ibv_sge sges[N];
    for (int i = 0; i < N; i++) {
        if (i % 2)
            send_wr(&w, &wrs[i], &sges[i], 1000 + (uint64_t)i);
        else
            write_wr(&w, &wrs[i], &sges[i], 1000 + (uint64_t)i, 0);
    }
    link_wrs(wrs, N);
    spdk_rdma_provider_qp_queue_send_wrs(q, wrs);
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), 0);
    CHECK(qstats(q).backlog > 0);
    CHECK_EQ(spdk_rdma_provider_qp_disconnect(q), 0);
    CHECK_EQ(standin.disconnect, 1);

    struct ibv_wc wc[64];
    int n = reap(&w, wc, 64, N + 4, 200);
    CHECK_EQ(n, N + 4);
    int seen[N] = {0}, recvs = 0, last = -1;
    for (int i = 0; i < n; i++) {
        CHECK_EQ(wc[i].status, IBV_WC_WR_FLUSH_ERR);
        CHECK_EQ(wc[i].qp_num, q->qp->qp_num);
        if (wc[i].wr_id >= 900 && wc[i].wr_id < 904) {
            recvs++;
            continue;
        }
        int k = (int)(wc[i].wr_id - 1000);
        CHECK(k >= 0 && k < N);
        CHECK(k > last); /* in post order */
        last = k;
        seen[k]++;
    }
    CHECK_EQ(recvs, 4);
    for (int k = 0; k < N; k++)
        CHECK_EQ(seen[k], 1);
    CHECK_EQ(reap(&w, wc, 64, 1, 10), 0);

    /* WRs SPDK still posts to the failed qpair are taken and flushed, as raw verbs would. */
    struct ibv_send_wr late[2];
    struct ibv_sge lsge[2];
    write_wr(&w, &late[0], &lsge[0], 2000, 0);
    send_wr(&w, &late[1], &lsge[1], 2001);
    link_wrs(late, 2);
    spdk_rdma_provider_qp_queue_send_wrs(q, late);
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), 0);
    CHECK(bad == NULL);
    CHECK_EQ(reap(&w, wc, 64, 2, 10), 2);
    CHECK(wc[0].wr_id == 2000 && wc[1].wr_id == 2001);
    CHECK(wc[0].status == IBV_WC_WR_FLUSH_ERR && wc[1].status == IBV_WC_WR_FLUSH_ERR);
    struct sqd_cq_stats cs;
    CHECK_EQ(sqd_spdk_cq_stats(w.cq, &cs), 0);
    CHECK_EQ(cs.stray, 0);

    spdk_rdma_provider_qp_destroy(q);
    world_free(&w);
    printf("PASS %s\n", current);
}

static void destroy_with_wrs_outstanding_leaves_the_cq_clean_for_the_others(void)
{
    struct world w;
    struct rdma_cm_id id1, id2;
    current = "destroy_with_wrs_outstanding_leaves_the_cq_clean_for_the_others";
    world_new(&w, NULL, 1024);
    struct spdk_rdma_provider_qp *q1 = qpair_new(&w, &id1, 8, 4, NULL, NULL);
    struct spdk_rdma_provider_qp *q2 = qpair_new(&w, &id2, 8, 4, NULL, NULL);
    CHECK(q1 && q2);
    struct ibv_qp *p1 = peer_connect(&w, q1->qp, 64);
    w.peer.qp = NULL;
    struct ibv_qp *p2 = peer_connect(&w, q2->qp, 64);

    struct ibv_send_wr a[12], b[2], *bad = NULL;
    struct ibv_sge as[12], bs[2];
    for (int i = 0; i < 12; i++)
        write_wr(&w, &a[i], &as[i], 10 + (uint64_t)i, i == 11);
    link_wrs(a, 12);
    spdk_rdma_provider_qp_queue_send_wrs(q1, a);
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q1, &bad), 0);
    for (int i = 0; i < 2; i++)
        send_wr(&w, &b[i], &bs[i], 70 + (uint64_t)i);
    link_wrs(b, 2);
    spdk_rdma_provider_qp_queue_send_wrs(q2, b);
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q2, &bad), 0);
    CHECK_EQ(sqd_sim_step(w.sim, 3), 0); /* some CQEs of both qpairs are in the CQ now */

    spdk_rdma_provider_qp_destroy(q1); /* 12 WRs outstanding, some in the backlog */
    CHECK(id1.qp == NULL);
    CHECK_EQ(sqd_sim_destroy_qp(p1), 0);
    struct ibv_wc wc[16];
    int n = reap(&w, wc, 16, 2, 100);
    CHECK_EQ(n, 2);
    CHECK(wc[0].wr_id == 70 && wc[1].wr_id == 71);
    CHECK_EQ(reap(&w, wc, 16, 1, 20), 0);
    struct sqd_cq_stats cs;
    CHECK_EQ(sqd_spdk_cq_stats(w.cq, &cs), 0);
    CHECK_EQ(cs.queues, 1);
    CHECK_EQ(cs.passthrough, 0);

    spdk_rdma_provider_qp_destroy(q2);
    CHECK_EQ(sqd_spdk_cq_stats(w.cq, &cs), -ENOENT);
    w.peer.qp = p2;
    world_free(&w);
    printf("PASS %s\n", current);
}

static void cqs_without_provider_qpairs_pass_through_untouched(void)
{
    struct world w;
    struct rdma_cm_id id;
    current = "cqs_without_provider_qpairs_pass_through_untouched";
    world_new(&w, NULL, 1024);
    struct spdk_rdma_provider_qp *q = qpair_new(&w, &id, 8, 4, NULL, NULL);
    CHECK(q != NULL);
    /* A raw QP on another CQ of the same device: its completions come back exactly as posted. */
    struct ibv_cq *other = NULL;
    CHECK_EQ(sqd_sim_create_cq(w.sim, 64, &other), 0);
    struct ibv_qp_init_attr ra;
    struct ibv_qp *raw = NULL;
    memset(&ra, 0, sizeof ra);
    ra.send_cq = ra.recv_cq = other;
    ra.qp_type = IBV_QPT_RC;
    ra.cap.max_send_wr = ra.cap.max_recv_wr = 8;
    ra.cap.max_send_sge = ra.cap.max_recv_sge = 1;
    CHECK_EQ(sqd_sim_create_qp(w.sim, &ra, &raw), 0);
    peer_connect(&w, raw, 8);
    struct ibv_send_wr wr, *bad = NULL;
    struct ibv_sge s;
    write_wr(&w, &wr, &s, 0xabcdef, 1);
    CHECK_EQ(ibv_post_send(raw, &wr, &bad), 0);
    struct ibv_wc wc;
    int n = 0;
    for (int i = 0; i < 100 && n == 0; i++)
        n = ibv_poll_cq(other, 1, &wc);
    CHECK_EQ(n, 1);
    CHECK_EQ(wc.wr_id, 0xabcdef);
    CHECK_EQ(wc.qp_num, raw->qp_num);
    CHECK_EQ(sqd_spdk_cq_stats(other, &(struct sqd_cq_stats){0}), -ENOENT);

    spdk_rdma_provider_qp_destroy(q);
    CHECK_EQ(sqd_sim_destroy_qp(w.peer.qp), 0);
    w.peer.qp = NULL;
    CHECK_EQ(sqd_sim_destroy_qp(raw), 0);
    CHECK_EQ(sqd_sim_destroy_cq(other), 0);
    world_free(&w);
    printf("PASS %s\n", current);
}

static void srq_receives_reach_spdk_and_destroy_follows_the_verbs_rules(void)
{
    struct world w;
    struct rdma_cm_id id1, id2;
    struct spdk_rdma_provider_wr_stats srq_stats = {0, 0};
    current = "srq_receives_reach_spdk_and_destroy_follows_the_verbs_rules";
    world_new(&w, NULL, 1024);

    CHECK(spdk_rdma_provider_srq_create(NULL) == NULL);
    struct spdk_rdma_provider_srq_init_attr sa;
    memset(&sa, 0, sizeof sa);
    sa.pd = w.pd;
    sa.stats = &srq_stats;
    sa.srq_init_attr.attr.max_wr = 64;
    sa.srq_init_attr.attr.max_sge = 1;
    struct spdk_rdma_provider_srq *srq = spdk_rdma_provider_srq_create(&sa);
    CHECK(srq != NULL && srq->srq != NULL && srq->shared_stats && srq->stats == &srq_stats);
    CHECK_EQ(standin.srqs_created, 1);

    struct spdk_rdma_provider_qp *q1 = qpair_new(&w, &id1, 8, 0, srq->srq, NULL);
    struct spdk_rdma_provider_qp *q2 = qpair_new(&w, &id2, 8, 0, srq->srq, NULL);
    CHECK(q1 && q2);
    struct sqd_cq_stats cs;
    CHECK_EQ(sqd_spdk_cq_stats(w.cq, &cs), 0);
    CHECK_EQ(cs.reserved, 2 * (8 + 1) + 64); /* the SRQ's depth once */

    struct ibv_recv_wr rwr[6], *rbad = NULL;
    struct ibv_sge rsge[6];
    recv_wrs(&w, rwr, rsge, 6, 300, 0);
    rwr[0].next = &rwr[1];
    CHECK(spdk_rdma_provider_srq_queue_recv_wrs(srq, &rwr[0]));
    for (int i = 2; i < 6; i++)
        CHECK(!spdk_rdma_provider_srq_queue_recv_wrs(srq, &rwr[i]));
    CHECK_EQ(srq_stats.num_submitted_wrs, 6);
    CHECK_EQ(spdk_rdma_provider_srq_flush_recv_wrs(srq, &rbad), 0);
    CHECK(rbad == NULL && srq->recv_wrs.first == NULL);
    CHECK_EQ(srq_stats.doorbell_updates, 1);

    struct ibv_qp *p1 = peer_connect(&w, q1->qp, 0);
    w.peer.qp = NULL;
    struct ibv_qp *p2 = peer_connect(&w, q2->qp, 0);
    for (int i = 0; i < 4; i++) {
        struct ibv_sge s = {.addr = (uintptr_t)w.peer.buf, .length = 12, .lkey = w.peer.mr->lkey};
        struct ibv_send_wr sw = {.wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
                                 .send_flags = IBV_SEND_SIGNALED};
        struct ibv_send_wr *sbad = NULL;
        CHECK_EQ(ibv_post_send(i % 2 ? p2 : p1, &sw, &sbad), 0);
    }
    struct ibv_wc wc[8];
    CHECK_EQ(reap(&w, wc, 8, 4, 100), 4);
    int on1 = 0, on2 = 0;
    for (int i = 0; i < 4; i++) {
        CHECK_EQ(wc[i].wr_id, 300 + i); /* SRQ receives are consumed oldest first */
        CHECK_EQ(wc[i].opcode, IBV_WC_RECV);
        CHECK_EQ(wc[i].byte_len, 12);
        on1 += wc[i].qp_num == q1->qp->qp_num;
        on2 += wc[i].qp_num == q2->qp->qp_num;
    }
    CHECK(on1 == 2 && on2 == 2);

    /* As ibv_destroy_srq: not while a QP uses it. */
    CHECK_EQ(spdk_rdma_provider_srq_destroy(srq), EBUSY);
    spdk_rdma_provider_qp_destroy(q1);
    spdk_rdma_provider_qp_destroy(q2);
    CHECK_EQ(sqd_sim_destroy_qp(p1), 0);
    CHECK_EQ(spdk_rdma_provider_srq_destroy(srq), 0); /* the two receives still posted never complete */
    CHECK_EQ(standin.srqs_destroyed, 1);
    CHECK_EQ(spdk_rdma_provider_srq_destroy(NULL), 0);
    w.peer.qp = p2;
    world_free(&w);
    printf("PASS %s\n", current);
}

/* A device that completes the poll group's send WQEs out of RC order: reordering_poll, put into the device
 * context's ops before the provider takes them over (the provider keeps it as the device's poll op), returns
 * the first two CQEs of the poll group's CQ it meets in the opposite order while `ooo.swaps` is set. */
static struct {
    int (*device_poll)(struct ibv_cq *, int, struct ibv_wc *);
    struct ibv_cq *cq;
    struct ibv_wc held[64];
    int nheld, swaps;
} ooo;

static int reordering_poll(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    if (cq != ooo.cq)
        return ooo.device_poll(cq, n, wc);
    int got = ooo.device_poll(cq, 64 - ooo.nheld, ooo.held + ooo.nheld);
    if (got < 0)
        return got;
    ooo.nheld += got;
    if (ooo.swaps > 0) {
        if (ooo.nheld < 2)
            return 0;
        struct ibv_wc first = ooo.held[0];
        ooo.held[0] = ooo.held[1];
        ooo.held[1] = first;
        ooo.swaps--;
    }
    int k = ooo.nheld < n ? ooo.nheld : n;
    memcpy(wc, ooo.held, (size_t)k * sizeof *wc);
    memmove(ooo.held, ooo.held + k, (size_t)(ooo.nheld - k) * sizeof *ooo.held);
    ooo.nheld -= k;
    return k;
}

/* Two SENDs SPDK signaled; the device completes the second first. SPDK matches completions by wr_id, so it must
 * get both, as raw verbs would give them: the late one is handed over, not dropped, and the provider says once
 * per qpair, through spdk_log, that the device completes out of RC order. */
static void a_late_completion_of_a_wr_spdk_signaled_reaches_spdk_and_is_logged_once(void)
{
    struct world w;
    struct rdma_cm_id id;
    current = "a_late_completion_of_a_wr_spdk_signaled_reaches_spdk_and_is_logged_once";
    world_new(&w, NULL, 1024);
    ooo.device_poll = w.cq->context->ops.poll_cq;
    ooo.cq = w.cq;
    ooo.nheld = ooo.swaps = 0;
    w.cq->context->ops.poll_cq = reordering_poll;
    struct spdk_rdma_provider_qp *q = qpair_new(&w, &id, 16, 8, NULL, NULL);
    CHECK(q != NULL);
    peer_connect(&w, q->qp, 64);

    int errors = standin.errors;
    for (int round = 0; round < 2; round++) {
        struct ibv_send_wr wrs[2];
        struct ibv_sge sges[2];
        uint64_t base = 100 + (uint64_t)round * 10;
        send_wr(&w, &wrs[0], &sges[0], base);
        send_wr(&w, &wrs[1], &sges[1], base + 1);
        link_wrs(wrs, 2);
        ooo.swaps = 1;
        spdk_rdma_provider_qp_queue_send_wrs(q, wrs);
        struct ibv_send_wr *bad = NULL;
        CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), 0);
        struct ibv_wc wc[8];
        CHECK_EQ(reap(&w, wc, 8, 2, 1000), 2);
        CHECK_EQ(wc[0].wr_id, base + 1);
        CHECK_EQ(wc[1].wr_id, base);
        CHECK_EQ(wc[1].status, IBV_WC_SUCCESS);
        CHECK_EQ(wc[1].opcode, IBV_WC_SEND);
        CHECK_EQ(wc[1].qp_num, q->qp->qp_num);
        CHECK_EQ(standin.errors, errors + 1); /* once per qpair, not per completion */
        CHECK(strstr(standin.last_log, "out of RC order") != NULL);
    }
    struct sqd_queue_stats s = qstats(q);
    CHECK_EQ(s.stray_cqes, 0);
    CHECK_EQ(s.released, s.accepted);
    /* Counted: both late completions, both handed to SPDK. */
    struct sqd_spdk_qp_counters c = {.size = sizeof c};
    CHECK_EQ(sqd_spdk_qp_counters(q, &c), 0);
    CHECK_EQ(c.out_of_order, 2);
    CHECK_EQ(c.out_of_order_shown, 2);
    CHECK_EQ(c.duplicates, 0);

    spdk_rdma_provider_qp_destroy(q);
    world_free(&w);
    printf("PASS %s\n", current);
}

int main(void)
{
    create_writes_back_caps_and_refuses_what_it_cannot_do();
    queue_and_flush_keep_order_wr_ids_and_counters();
    unsignaled_writes_before_a_signaled_send_show_only_the_send();
    a_flush_bigger_than_the_sq_is_backlogged_where_raw_verbs_fail_with_enomem();
    a_bad_wr_fails_the_flush_at_exactly_that_wr();
    disconnect_flushes_every_outstanding_wr_once_backlog_included();
    destroy_with_wrs_outstanding_leaves_the_cq_clean_for_the_others();
    cqs_without_provider_qpairs_pass_through_untouched();
    srq_receives_reach_spdk_and_destroy_follows_the_verbs_rules();
    /* Last: its context's poll op differs from the others'. */
    a_late_completion_of_a_wr_spdk_signaled_reaches_spdk_and_is_logged_once();
    return 0;
}
