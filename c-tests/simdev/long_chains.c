/* Long WR chains posted through the sim device (sqdisc-sim's preload library), in one call each: SPDK's NVMe-oF
 * target fills a 4095-deep SRQ with one ibv_post_srq_recv, which once failed with EMSGSIZE (one socket message
 * for the whole chain: its receives have two SGEs, command capsule and in-capsule data). Also: a chain longer than the SRQ takes exactly its depth, and bad_wr is the first WR
 * not posted. Run under `sqdisc-sim run` (scripts/simdev-tests.sh). */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...) do { fprintf(stderr, "long_chains: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

int main(void)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n < 1)
        FAIL("no device (is the sim's preload library loaded?)");
    struct ibv_context *ctx = ibv_open_device(list[0]);
    if (!ctx)
        FAIL("ibv_open_device failed");
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    enum { DEPTH = 4095, LEN = 64 };
    char *buf = calloc(DEPTH + 8, LEN);
    struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, (size_t)(DEPTH + 8) * LEN, IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (!mr)
        FAIL("PD or MR failed");
    struct ibv_srq_init_attr sa = { .attr = { .max_wr = DEPTH, .max_sge = 2 } };
    struct ibv_srq *srq = ibv_create_srq(pd, &sa);
    if (!srq)
        FAIL("ibv_create_srq(%d) failed", DEPTH);
    unsigned depth = sa.attr.max_wr; /* what the device granted, at least DEPTH */

    /* One chain of `depth` receives, then one more chain of 8: the first is taken whole, the second not at all. */
    struct ibv_sge *sge = calloc(2 * (depth + 8), sizeof(*sge));
    struct ibv_recv_wr *wr = calloc(depth + 8, sizeof(*wr));
    for (unsigned i = 0; i < depth + 8; i++) {
        char *at = buf + (size_t)(i % (DEPTH + 8)) * LEN;
        sge[2 * i] = (struct ibv_sge){ .addr = (uintptr_t)at, .length = LEN / 2, .lkey = mr->lkey };
        sge[2 * i + 1] = (struct ibv_sge){ .addr = (uintptr_t)(at + LEN / 2), .length = LEN / 2, .lkey = mr->lkey };
        wr[i] = (struct ibv_recv_wr){ .wr_id = i, .sg_list = &sge[2 * i], .num_sge = 2, .next = &wr[i + 1] };
    }
    wr[depth - 1].next = NULL;
    wr[depth + 7].next = NULL;
    struct ibv_recv_wr *bad = NULL;
    int rc = ibv_post_srq_recv(srq, wr, &bad);
    if (rc != 0)
        FAIL("a chain of %u SRQ receives: errno %d (%s), bad_wr at %ld", depth, rc, strerror(rc), bad ? (long)(bad - wr) : -1L);
    bad = NULL;
    rc = ibv_post_srq_recv(srq, &wr[depth], &bad);
    if (rc == 0 || bad != &wr[depth])
        FAIL("a chain into a full SRQ: rc %d, bad_wr at %ld (want an error at %u)", rc, bad ? (long)(bad - wr) : -1L, depth);

    /* A QP's RQ: a chain of 1000 receives into an RQ of 1000. */
    struct ibv_cq *cq = ibv_create_cq(ctx, 4096, NULL, NULL, 0);
    struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                   .cap = { .max_send_wr = 16, .max_recv_wr = 1000, .max_send_sge = 1, .max_recv_sge = 2 } };
    struct ibv_qp *qp = cq ? ibv_create_qp(pd, &qa) : NULL;
    if (!qp)
        FAIL("CQ or QP failed");
    struct ibv_qp_attr init = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qp_access_flags = IBV_ACCESS_LOCAL_WRITE };
    if (ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        FAIL("ibv_modify_qp(INIT) failed");
    for (unsigned i = 0; i < 1000; i++)
        wr[i].next = i + 1 < 1000 ? &wr[i + 1] : NULL;
    bad = NULL;
    rc = ibv_post_recv(qp, wr, &bad);
    if (rc != 0)
        FAIL("a chain of 1000 receives: errno %d, bad_wr at %ld", rc, bad ? (long)(bad - wr) : -1L);

    ibv_destroy_qp(qp);
    ibv_destroy_cq(cq);
    ibv_destroy_srq(srq);
    ibv_dereg_mr(mr);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    free(buf);
    free(sge);
    free(wr);
    printf("long_chains: ok (SRQ depth %u)\n", depth);
    return 0;
}
