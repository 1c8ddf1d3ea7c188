/* The software HCA from C: a sim, two connected QPs, registered memory, SEND/RECV and RDMA WRITE through the
 * real inline ibv_post_send / ibv_post_recv / ibv_poll_cq of <infiniband/verbs.h>, the oracle, a strict-mode
 * SQ overflow in the violation log, flushes, and teardown. Prints "PASS <name>" per check; exits non-zero on
 * the first failure. */

#include <sqdisc_sim.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include "support/exit_checks.h"

static void pass(void) { printf("PASS %s\n", current); }

static char client_buf[4096];
static char server_buf[4096];

static struct ibv_qp_init_attr qp_attr(struct ibv_cq *cq, uint32_t depth) {
    struct ibv_qp_init_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.send_cq = cq;
    attr.recv_cq = cq;
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = depth;
    attr.cap.max_recv_wr = depth;
    attr.cap.max_send_sge = 2;
    attr.cap.max_recv_sge = 2;
    attr.cap.max_inline_data = 64;
    return attr;
}

/* Polls `cq` (each call advances the model one step) until `n` completions arrived or 1000 calls were made. */
static int poll_n(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
    int got = 0;
    for (int i = 0; i < 1000 && got < n; i++) {
        int r = ibv_poll_cq(cq, n - got, wc + got);
        CHECK(r >= 0);
        got += r;
    }
    return got;
}

int main(void) {
    struct sqd_sim *sim = NULL;
    struct sqd_sim_config cfg;
    struct ibv_cq *cq_a = NULL, *cq_b = NULL, *cq_c = NULL;
    struct ibv_qp *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    struct ibv_mr *mr_client = NULL, *mr_server = NULL;
    struct ibv_wc wc[16];

    current = "create";
    CHECK_EQ(sqd_sim_new(NULL, NULL), -EINVAL);
    CHECK(strlen(sqd_last_error()) > 0);
    sqd_sim_config_default(&cfg);
    CHECK_EQ(cfg.steps_per_poll, 1);
    cfg.seed = 42;
    cfg.flags = SQD_SIM_STRICT;
    cfg.wire_delay_min = 5;
    cfg.wire_delay_max = 1;
    CHECK_EQ(sqd_sim_new(&cfg, &sim), -EINVAL);
    cfg.wire_delay_min = 1;
    cfg.wire_delay_max = 3;
    CHECK_EQ(sqd_sim_new(&cfg, &sim), 0);
    CHECK(sim != NULL);
    CHECK(sqd_sim_context(sim) != NULL);
    CHECK(sqd_sim_pd(sim) != NULL);
    CHECK(sqd_sim_pd(sim)->context == sqd_sim_context(sim));
    CHECK_EQ(sqd_sim_create_cq(sim, 64, &cq_a), 0);
    CHECK_EQ(sqd_sim_create_cq(sim, 64, &cq_b), 0);
    CHECK_EQ(cq_a->cqe, 64);
    struct ibv_qp_init_attr attr = qp_attr(cq_a, 16);
    attr.cap.max_send_sge = 1000; /* clamped, and the grant written back */
    CHECK_EQ(sqd_sim_create_qp(sim, &attr, &a), 0);
    CHECK_EQ(attr.cap.max_send_sge, 32);
    attr = qp_attr(cq_b, 16);
    CHECK_EQ(sqd_sim_create_qp(sim, &attr, &b), 0);
    CHECK(a->qp_num != b->qp_num);
    CHECK_EQ(a->state, IBV_QPS_INIT);
    CHECK_EQ(sqd_sim_connect(a, a, NULL), -EINVAL);
    CHECK_EQ(sqd_sim_connect(a, b, NULL), 0);
    CHECK_EQ(a->state, IBV_QPS_RTS);
    CHECK_EQ(sqd_sim_reg_mr(sim, client_buf, sizeof client_buf, IBV_ACCESS_LOCAL_WRITE, &mr_client), 0);
    CHECK_EQ(sqd_sim_reg_mr(sim, server_buf, sizeof server_buf,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, &mr_server),
             0);
    CHECK(mr_client->addr == client_buf && mr_client->length == sizeof client_buf);
    CHECK(mr_client->lkey != mr_server->lkey);
    CHECK(mr_client->context == sqd_sim_context(sim));
    pass();

    current = "send and receive through the inline verbs";
    {
        struct ibv_sge rsge = {.addr = (uintptr_t)server_buf, .length = 128, .lkey = mr_server->lkey};
        struct ibv_recv_wr rwr = {.wr_id = 7, .next = NULL, .sg_list = &rsge, .num_sge = 1}, *rbad = NULL;
        CHECK_EQ(ibv_post_recv(b, &rwr, &rbad), 0);
        memcpy(client_buf, "hello, responder", 16);
        struct ibv_sge sge = {.addr = (uintptr_t)client_buf, .length = 16, .lkey = mr_client->lkey};
        struct ibv_send_wr wr, *bad = NULL;
        memset(&wr, 0, sizeof wr);
        wr.wr_id = 1;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND_WITH_IMM;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.imm_data = htonl(0xabcd);
        CHECK_EQ(ibv_post_send(a, &wr, &bad), 0);
        CHECK_EQ(sqd_sim_buffer_busy(sim, client_buf, 16), 1);
        CHECK_EQ(sqd_sim_wqe_finished(a, 0), 0);
        CHECK_EQ(poll_n(cq_a, 1, wc), 1);
        CHECK_EQ(wc[0].wr_id, 1);
        CHECK_EQ(wc[0].status, IBV_WC_SUCCESS);
        CHECK_EQ(wc[0].opcode, IBV_WC_SEND);
        CHECK_EQ(sqd_sim_wqe_finished(a, 0), 1);
        CHECK_EQ(sqd_sim_wqe_finished(a, 1), -ENOENT);
        CHECK_EQ(sqd_sim_buffer_busy(sim, client_buf, 16), 0);
        CHECK_EQ(poll_n(cq_b, 1, wc), 1);
        CHECK_EQ(wc[0].wr_id, 7);
        CHECK_EQ(wc[0].status, IBV_WC_SUCCESS);
        CHECK_EQ(wc[0].opcode, IBV_WC_RECV);
        CHECK_EQ(wc[0].byte_len, 16);
        CHECK(wc[0].wc_flags & IBV_WC_WITH_IMM);
        CHECK_EQ(ntohl(wc[0].imm_data), 0xabcd);
        CHECK_EQ(wc[0].src_qp, a->qp_num);
        CHECK(memcmp(server_buf, "hello, responder", 16) == 0);
    }
    pass();

    current = "rdma write";
    {
        memcpy(client_buf + 64, "written remotely", 16);
        struct ibv_sge sge = {.addr = (uintptr_t)(client_buf + 64), .length = 16, .lkey = mr_client->lkey};
        struct ibv_send_wr wr, *bad = NULL;
        memset(&wr, 0, sizeof wr);
        wr.wr_id = 2;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = (uintptr_t)(server_buf + 1024);
        wr.wr.rdma.rkey = mr_server->rkey;
        CHECK_EQ(ibv_post_send(a, &wr, &bad), 0);
        CHECK(sqd_sim_run_until_idle(sim, 1000) > 0);
        CHECK(memcmp(server_buf + 1024, "written remotely", 16) == 0);
        CHECK_EQ(ibv_poll_cq(cq_a, 16, wc), 1);
        CHECK_EQ(wc[0].opcode, IBV_WC_RDMA_WRITE);
        CHECK_EQ(ibv_req_notify_cq(cq_a, 0), 0);
    }
    pass();

    current = "a remote access error is reported and flushes";
    {
        struct ibv_send_wr wr, *bad = NULL;
        struct ibv_sge sge = {.addr = (uintptr_t)client_buf, .length = 8, .lkey = mr_client->lkey};
        memset(&wr, 0, sizeof wr);
        wr.wr_id = 3;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.wr.rdma.remote_addr = (uintptr_t)client_buf; /* the client MR has no remote write access */
        wr.wr.rdma.rkey = mr_client->rkey;
        CHECK_EQ(ibv_post_send(a, &wr, &bad), 0);
        CHECK_EQ(poll_n(cq_a, 1, wc), 1);
        CHECK_EQ(wc[0].wr_id, 3);
        CHECK_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
        CHECK_EQ(a->state, IBV_QPS_ERR);
        wr.wr_id = 4;
        CHECK_EQ(ibv_post_send(a, &wr, &bad), 0);
        CHECK_EQ(ibv_poll_cq(cq_a, 16, wc), 1);
        CHECK_EQ(wc[0].wr_id, 4);
        CHECK_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
    }
    pass();

    current = "strict mode logs an SQ overflow";
    {
        CHECK_EQ(sqd_sim_create_cq(sim, 8, &cq_c), 0);
        attr = qp_attr(cq_c, 2);
        CHECK_EQ(sqd_sim_create_qp(sim, &attr, &c), 0);
        CHECK_EQ(sqd_sim_create_qp(sim, &attr, &d), 0);
        CHECK_EQ(sqd_sim_connect(c, d, NULL), 0);
        struct ibv_send_wr wr[3], *bad = NULL;
        memset(wr, 0, sizeof wr);
        for (int i = 0; i < 3; i++) {
            wr[i].wr_id = 100 + (uint64_t)i;
            wr[i].opcode = IBV_WR_RDMA_WRITE; /* zero length: no SGE, no rkey needed */
            wr[i].next = i < 2 ? &wr[i + 1] : NULL;
        }
        CHECK_EQ(sqd_sim_violation_count(sim), 0);
        CHECK_EQ(ibv_post_send(c, wr, &bad), ENOMEM);
        CHECK(bad == &wr[2]);
        CHECK_EQ(sqd_sim_violation_count(sim), 1);
        struct sqd_sim_violation v;
        CHECK_EQ(sqd_sim_violation(sim, 0, &v), 0);
        CHECK_EQ(v.kind, SQD_SIM_VIOLATION_SQ_OVERFLOW);
        CHECK_EQ(v.qp_num, c->qp_num);
        CHECK_EQ(v.wqe_index, 2);
        CHECK(strncmp(v.text, "SQ overflow", 11) == 0);
        CHECK(strcmp(sqd_sim_violation_kind_str(v.kind), "SQ overflow") == 0);
        CHECK(strcmp(sqd_sim_violation_kind_str(999), "unknown") == 0);
        CHECK_EQ(sqd_sim_violation(sim, 1, &v), -ENOENT);
        /* Executed and acknowledged, but no CQE to poll: the SQ stays full. */
        CHECK(sqd_sim_run_until_idle(sim, 1000) >= 0);
        CHECK_EQ(ibv_poll_cq(cq_c, 8, wc), 0);
        CHECK_EQ(ibv_post_send(c, &wr[2], &bad), ENOMEM);
        CHECK_EQ(sqd_sim_violation_count(sim), 2);
    }
    pass();

    current = "faults, stats and errors";
    {
        struct sqd_sim_fault f;
        memset(&f, 0, sizeof f);
        f.kind = 99;
        f.qp = d;
        CHECK_EQ(sqd_sim_inject(sim, &f), -EINVAL);
        f.kind = SQD_SIM_FAULT_QP_FATAL;
        CHECK_EQ(sqd_sim_inject(sim, &f), 0);
        CHECK_EQ(d->state, IBV_QPS_ERR);
        CHECK_EQ(sqd_sim_step(sim, 3), 0);
        struct sqd_sim_stats s;
        CHECK_EQ(sqd_sim_stats(sim, &s), 0);
        CHECK(s.doorbells >= 4);
        CHECK(s.steps > 0);
        CHECK_EQ(s.violations, 2);
        CHECK_EQ(s.sq_overflows, 2);
        CHECK(s.flushes >= 1);
        CHECK_EQ(sqd_sim_stats(NULL, &s), -EINVAL);
        CHECK_EQ(sqd_sim_destroy_cq(cq_c), -EBUSY);
    }
    pass();

    current = "teardown";
    CHECK_EQ(sqd_sim_dereg_mr(mr_client), 0);
    CHECK_EQ(sqd_sim_destroy_qp(d), 0);
    CHECK_EQ(sqd_sim_destroy_qp(c), 0);
    CHECK_EQ(sqd_sim_destroy_cq(cq_c), 0);
    sqd_sim_free(sim); /* frees a, b, cq_a, cq_b, mr_server */
    sqd_sim_free(NULL);
    pass();
    return 0;
}
