/* The software HCA as a storage target sees it, from C through the real inline verbs: target QPs taking their
 * receives from one SRQ (ibv_post_srq_recv), a receive CQ on a completion channel armed with
 * ibv_req_notify_cq and waited for with poll(2) on the channel's fd, the SRQ limit event and the last-WQE event
 * read from the async fd, the -EBUSY rules, and teardown. Prints "PASS <name>" per check; exits non-zero on
 * the first failure. */

#include <sqdisc_sim.h>

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "support/exit_checks.h"

static void pass(void) { printf("PASS %s\n", current); }

static int readable(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN, .revents = 0};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

static char initiator_buf[256];
static char target_buf[4096];

static struct ibv_qp_init_attr qp_attr(struct ibv_cq *cq, struct ibv_srq *srq) {
    struct ibv_qp_init_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.send_cq = cq;
    attr.recv_cq = cq;
    attr.srq = srq;
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = 16;
    attr.cap.max_recv_wr = 16;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    return attr;
}

int main(void) {
    struct sqd_sim *sim = NULL;
    struct sqd_sim_config cfg;
    struct ibv_comp_channel *ch = NULL;
    struct ibv_cq *icq = NULL, *tcq = NULL;
    struct ibv_srq *srq = NULL;
    struct ibv_qp *ini[2], *tgt[2];
    struct ibv_mr *imr = NULL, *tmr = NULL;
    struct ibv_wc wc[16];
    int ctx_tag = 0;

    current = "create";
    sqd_sim_config_default(&cfg);
    cfg.steps_per_poll = 0; /* polling does not advance time: sqd_sim_step does */
    CHECK_EQ(sqd_sim_new(&cfg, &sim), 0);
    CHECK_EQ(sqd_sim_create_comp_channel(sim, &ch), 0);
    CHECK(ch->context == sqd_sim_context(sim) && ch->fd >= 0);
    CHECK_EQ(sqd_sim_create_cq_ex(sim, 64, ch, &ctx_tag, 1, &tcq), -EINVAL); /* one completion vector */
    CHECK_EQ(sqd_sim_create_cq_ex(sim, 64, ch, &ctx_tag, 0, &tcq), 0);
    CHECK(tcq->channel == ch && tcq->cq_context == &ctx_tag);
    CHECK_EQ(sqd_sim_create_cq(sim, 64, &icq), 0);
    struct ibv_srq_init_attr sattr;
    memset(&sattr, 0, sizeof sattr);
    sattr.srq_context = &ctx_tag;
    sattr.attr.max_wr = 1u << 20; /* clamped, and the grant written back */
    sattr.attr.max_sge = 1;
    CHECK_EQ(sqd_sim_create_srq(sim, &sattr, &srq), 0);
    CHECK_EQ(sattr.attr.max_wr, 32768);
    CHECK(srq->context == sqd_sim_context(sim) && srq->pd == sqd_sim_pd(sim) && srq->srq_context == &ctx_tag);
    for (int i = 0; i < 2; i++) {
        struct ibv_qp_init_attr a = qp_attr(icq, NULL);
        CHECK_EQ(sqd_sim_create_qp(sim, &a, &ini[i]), 0);
        a = qp_attr(tcq, srq);
        CHECK_EQ(sqd_sim_create_qp(sim, &a, &tgt[i]), 0);
        CHECK_EQ(a.cap.max_recv_wr, 0);
        CHECK_EQ(sqd_sim_connect(ini[i], tgt[i], NULL), 0);
    }
    CHECK_EQ(sqd_sim_reg_mr(sim, initiator_buf, sizeof initiator_buf, IBV_ACCESS_LOCAL_WRITE, &imr), 0);
    CHECK_EQ(sqd_sim_reg_mr(sim, target_buf, sizeof target_buf, IBV_ACCESS_LOCAL_WRITE, &tmr), 0);
    pass();

    current = "receives through ibv_post_srq_recv";
    {
        struct ibv_sge sge[4];
        struct ibv_recv_wr wr[4], *bad = NULL;
        for (int i = 0; i < 4; i++) {
            sge[i] = (struct ibv_sge){.addr = (uintptr_t)(target_buf + 64 * i), .length = 64, .lkey = tmr->lkey};
            wr[i] = (struct ibv_recv_wr){.wr_id = 100 + i, .next = i < 3 ? &wr[i + 1] : NULL, .sg_list = &sge[i], .num_sge = 1};
        }
        CHECK_EQ(ibv_post_srq_recv(srq, wr, &bad), 0);
        wr[0].next = NULL;
        CHECK_EQ(ibv_post_recv(tgt[0], wr, &bad), EINVAL); /* its receives come from the SRQ */
        CHECK(bad == &wr[0]);
        CHECK_EQ(sqd_sim_modify_srq_limit(srq, 99999), -EINVAL);
        CHECK_EQ(sqd_sim_modify_srq_limit(srq, 2), 0);
    }
    pass();

    current = "event mode: arm, poll again, sleep on the channel fd";
    {
        CHECK_EQ(ibv_req_notify_cq(tcq, 0), 0);
        CHECK_EQ(ibv_poll_cq(tcq, 16, wc), 0); /* armed and empty: safe to sleep */
        CHECK(!readable(ch->fd));
        memcpy(initiator_buf, "write me down", 13);
        for (int i = 0; i < 3; i++) {
            struct ibv_sge sge = {.addr = (uintptr_t)initiator_buf, .length = 13, .lkey = imr->lkey};
            struct ibv_send_wr swr, *sbad = NULL;
            memset(&swr, 0, sizeof swr);
            swr.wr_id = i;
            swr.sg_list = &sge;
            swr.num_sge = 1;
            swr.opcode = IBV_WR_SEND;
            swr.send_flags = IBV_SEND_SIGNALED;
            CHECK_EQ(ibv_post_send(ini[i % 2], &swr, &sbad), 0);
            CHECK(sqd_sim_run_until_idle(sim, 1000) >= 0); /* one message at a time: SRQ order is arrival order */
        }
        CHECK(readable(ch->fd));
        struct ibv_cq *ev_cq = NULL;
        void *ev_ctx = NULL;
        CHECK_EQ(sqd_sim_get_cq_event(ch, &ev_cq, &ev_ctx), 0);
        CHECK(ev_cq == tcq && ev_ctx == &ctx_tag);
        CHECK_EQ(sqd_sim_get_cq_event(ch, &ev_cq, &ev_ctx), -EAGAIN); /* one shot */
        CHECK(!readable(ch->fd));
        CHECK_EQ(ibv_poll_cq(tcq, 16, wc), 3);
        CHECK_EQ(wc[0].wr_id, 100);
        CHECK_EQ(wc[0].qp_num, tgt[0]->qp_num);
        CHECK_EQ(wc[1].wr_id, 101);
        CHECK_EQ(wc[1].qp_num, tgt[1]->qp_num);
        CHECK_EQ(wc[2].byte_len, 13);
        CHECK(memcmp(target_buf + 128, "write me down", 13) == 0);
        CHECK_EQ(sqd_sim_destroy_cq(tcq), -EBUSY); /* QPs use it, and the event is not acknowledged */
        CHECK_EQ(sqd_sim_ack_cq_events(tcq, 2), -EINVAL);
        CHECK_EQ(sqd_sim_ack_cq_events(tcq, 1), 0);
        CHECK_EQ(tcq->comp_events_completed, 1);
    }
    pass();

    current = "async events: SRQ limit, last WQE reached";
    {
        int afd = sqd_sim_async_fd(sim);
        CHECK(afd >= 0);
        CHECK(readable(afd));
        struct ibv_async_event ev;
        CHECK_EQ(sqd_sim_get_async_event(sim, &ev), 0);
        CHECK_EQ(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
        CHECK(ev.element.srq == srq);
        CHECK_EQ(sqd_sim_get_async_event(sim, &ev), -EAGAIN);
        CHECK(!readable(afd));
        CHECK_EQ(sqd_sim_set_error(tgt[0]), 0);
        CHECK(readable(afd));
        CHECK_EQ(sqd_sim_get_async_event(sim, &ev), 0);
        CHECK_EQ(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
        CHECK(ev.element.qp == tgt[0]);
        CHECK_EQ(sqd_sim_get_async_event(NULL, &ev), -EINVAL);
    }
    pass();

    current = "teardown";
    CHECK_EQ(sqd_sim_destroy_srq(srq), -EBUSY);
    CHECK_EQ(sqd_sim_destroy_comp_channel(ch), -EBUSY);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(sqd_sim_destroy_qp(tgt[i]), 0);
        CHECK_EQ(sqd_sim_destroy_qp(ini[i]), 0);
    }
    CHECK_EQ(sqd_sim_destroy_srq(srq), 0);
    CHECK_EQ(sqd_sim_destroy_cq(tcq), 0);
    CHECK_EQ(sqd_sim_destroy_comp_channel(ch), 0);
    sqd_sim_free(sim); /* frees icq and the MRs */
    pass();
    return 0;
}
