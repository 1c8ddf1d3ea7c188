/* MRs tracked precisely (sqd_queue_track_mr) and handed over with sqd_defer_dereg_mr: the queue stops tracking
 * an MR once it has deregistered it (the count drops, the per-SGE scan does not grow, a later MR with the same
 * lkey can be tracked), and an MR tracked while WRs accepted before are still unreleased is deregistered only
 * after them — on the software HCA, with an ACK lost so that the HCA must retransmit from the MR.
 *
 * Each scenario prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is non-zero if any failed. */

#include "support/harness.h"

#include <sqdisc_sim.h>

static unsigned char data[4][64];

static struct ibv_mr *reg_mr(void *addr, size_t len)
{
    struct ibv_mr *mr = NULL;
    CHECK_EQ(sqd_scripted_reg_mr(the_rig->dev, addr, len, IBV_ACCESS_LOCAL_WRITE, &mr), 0);
    CHECK(mr != NULL);
    return mr;
}

/* `n` SENDs with wr_ids [first, first + n), each reading 64 bytes through `lkey`; the last one signaled. */
static void post_sends(struct mq *m, uint64_t first, int n, uint32_t lkey)
{
    struct ibv_sge sge[8];
    struct ibv_send_wr wr[8], *bad = NULL;
    CHECK(n > 0 && n <= 8);
    for (int i = 0; i < n; i++) {
        sge[i] = (struct ibv_sge){.addr = (uintptr_t)data[i % 4], .length = 64, .lkey = lkey};
        wr[i] = (struct ibv_send_wr){.wr_id = first + (uint64_t)i, .next = i + 1 < n ? &wr[i + 1] : NULL,
                                     .sg_list = &sge[i], .num_sge = 1, .opcode = IBV_WR_SEND,
                                     .send_flags = i + 1 == n ? IBV_SEND_SIGNALED : 0};
    }
    CHECK_EQ(sqd_post_send(m->q, wr, &bad), 0);
    CHECK(bad == NULL);
}

/* ---- the deregistration untracks the MR --------------------------------------------------------------------- */

static void a_tracked_mr_is_untracked_when_its_deferred_deregistration_runs(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 4}, 64);
    struct ibv_mr *mr = reg_mr(data[0], 64);
    uint32_t lkey = mr->lkey;
    CHECK_EQ(sqd_queue_track_mr(m->q, mr), 0);
    post_sends(m, 0, 3, lkey);
    CHECK_EQ(sqd_defer_dereg_mr(m->q, mr), 0);
    /* Not run yet: the WRs using it are in flight, and the MR is still tracked (their uses still count). */
    CHECK_EQ(sqd_scripted_mr_count(the_rig->dev), 1);
    CHECK_EQ(qstats(m).tracked_mrs, 1);
    CHECK_EQ(qstats(m).deferred, 1);
    settle(the_rig, m);
    released_in_order(m, 0, 3);
    CHECK_EQ(sqd_scripted_mr_count(the_rig->dev), 0);
    CHECK_EQ(qstats(m).deferred, 0);
    CHECK_EQ(qstats(m).teardown_failures, 0);
    /* Deregistered: no longer tracked. */
    CHECK_EQ(qstats(m).tracked_mrs, 0);
    /* A device reuses keys: a later MR with the same lkey (here, a stand-in that carries it) can be tracked. */
    struct ibv_mr same_key;
    memset(&same_key, 0, sizeof same_key);
    same_key.lkey = lkey;
    CHECK_EQ(sqd_queue_track_mr(m->q, &same_key), 0);
    CHECK_EQ(qstats(m).tracked_mrs, 1);
    CHECK_EQ(sqd_queue_untrack_mr(m->q, &same_key), 0);
    callbacks_ok(m);
    no_violations(the_rig);
}

static void mrs_handed_over_one_after_another_leave_nothing_tracked(void)
{
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 4}, 64);
    /* 2000 MRs, each tracked, used by a WR, and handed over: the queue tracks none of them afterwards. */
    for (int i = 0; i < 2000; i++) {
        struct ibv_mr *mr = reg_mr(data[i % 4], 64);
        CHECK_EQ(sqd_queue_track_mr(m->q, mr), 0);
        post_sends(m, (uint64_t)i, 1, mr->lkey);
        CHECK_EQ(sqd_defer_dereg_mr(m->q, mr), 0);
        settle(the_rig, m);
        CHECK_EQ(qstats(m).tracked_mrs, 0);
    }
    CHECK_EQ(sqd_scripted_mr_count(the_rig->dev), 0);
    CHECK_EQ(qstats(m).released, 2000);
    CHECK_EQ(qstats(m).teardown_failures, 0);
    /* An MR handed over idle (nothing in flight) is deregistered, and untracked, at once. */
    struct ibv_mr *idle = reg_mr(data[0], 64);
    CHECK_EQ(sqd_queue_track_mr(m->q, idle), 0);
    CHECK_EQ(sqd_defer_dereg_mr(m->q, idle), 0);
    CHECK_EQ(sqd_scripted_mr_count(the_rig->dev), 0);
    CHECK_EQ(qstats(m).tracked_mrs, 0);
    callbacks_ok(m);
    no_violations(the_rig);
}

static void an_mr_tracked_elsewhere_stays_tracked_there(void)
{
    /* The deregistration untracks the MR on the queue it was handed to only: a plain sqd_defer_mr leaves it
     * tracked, and so does an untracked MR's deregistration for the MRs that are tracked. */
    struct mq *m = rig1((struct qcfg){.sq_depth = 16, .signal_interval = 4}, 64);
    struct ibv_mr *kept = reg_mr(data[0], 64), *gone = reg_mr(data[1], 64);
    CHECK_EQ(sqd_queue_track_mr(m->q, kept), 0);
    post_sends(m, 0, 2, kept->lkey);
    CHECK_EQ(sqd_defer_dereg_mr(m->q, gone), 0); /* not tracked */
    settle(the_rig, m);
    CHECK_EQ(sqd_scripted_mr_count(the_rig->dev), 1);
    CHECK_EQ(qstats(m).tracked_mrs, 1);
    CHECK_EQ(sqd_queue_untrack_mr(m->q, kept), 0);
    CHECK_EQ(sqd_scripted_dereg_mr(kept), 0);
    callbacks_ok(m);
    no_violations(the_rig);
}

/* ---- tracking an MR with WRs already in flight (the software HCA) ------------------------------------------- */

/* The scenario's objects, freed by sim_teardown() after it whatever happened. */
static struct sqd_sim *sim;
static struct ibv_qp *ini;
static struct sqd_cq *scq;
static struct sqd_queue *q;
static unsigned char src[256], dst[256];

static void sim_teardown(void)
{
    struct ibv_wc wc[4];
    if (q && sqd_queue_free(q) != 0) {
        sqd_sim_set_error(ini);
        for (int i = 0; i < 1000 && sqd_queue_free(q) != 0; i++) {
            sqd_sim_step(sim, 1);
            sqd_cq_poll(scq, 4, wc);
        }
    }
    sqd_cq_free(scq);
    sqd_sim_free(sim);
    q = NULL;
    scq = NULL;
    ini = NULL;
    sim = NULL;
}

struct observed {
    struct sqd_queue *q;
    int releases;
    uint32_t status;
    uint32_t deferred_at_release; /* stats.deferred seen from inside the release: the dereg still waits */
    int stats_rc;
};

static void observe_release(void *ctx, const struct sqd_completion *c)
{
    struct observed *o = ctx;
    struct sqd_queue_stats s;
    o->releases++;
    o->status = c->status;
    o->stats_rc = sqd_queue_stats(o->q, &s);
    o->deferred_at_release = s.deferred;
}

static void no_sim_violations(void)
{
    int n = sqd_sim_violation_count(sim);
    CHECK(n >= 0);
    if (n > 0) {
        struct sqd_sim_violation v;
        CHECK_EQ(sqd_sim_violation(sim, 0, &v), 0);
        fail_now("%d violation(s) on the software HCA, the first: %s", n, v.text);
    }
}

static void an_mr_tracked_under_wrs_in_flight_is_deregistered_only_after_them(void)
{
    struct sqd_sim_config cfg;
    sqd_sim_config_default(&cfg);
    cfg.steps_per_poll = 0; /* time moves only in sqd_sim_step */
    CHECK_EQ(sqd_sim_new(&cfg, &sim), 0);
    struct ibv_cq *icq = NULL, *tcq = NULL;
    CHECK_EQ(sqd_sim_create_cq(sim, 64, &icq), 0);
    CHECK_EQ(sqd_sim_create_cq(sim, 64, &tcq), 0);
    struct ibv_qp_init_attr a;
    memset(&a, 0, sizeof a);
    a.send_cq = a.recv_cq = icq;
    a.qp_type = IBV_QPT_RC;
    a.cap = (struct ibv_qp_cap){.max_send_wr = 8, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1};
    struct ibv_qp *tgt = NULL;
    CHECK_EQ(sqd_sim_create_qp(sim, &a, &ini), 0);
    a.send_cq = a.recv_cq = tcq;
    CHECK_EQ(sqd_sim_create_qp(sim, &a, &tgt), 0);
    CHECK_EQ(sqd_sim_connect(ini, tgt, NULL), 0);
    struct ibv_mr *smr = NULL, *dmr = NULL;
    CHECK_EQ(sqd_sim_reg_mr(sim, src, sizeof src, IBV_ACCESS_LOCAL_WRITE, &smr), 0);
    CHECK_EQ(sqd_sim_reg_mr(sim, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE, &dmr), 0);
    struct ibv_sge rsge = {.addr = (uintptr_t)dst, .length = sizeof dst, .lkey = dmr->lkey};
    struct ibv_recv_wr rwr = {.wr_id = 1, .sg_list = &rsge, .num_sge = 1}, *rbad = NULL;
    CHECK_EQ(ibv_post_recv(tgt, &rwr, &rbad), 0);

    static struct observed o;
    memset(&o, 0, sizeof o);
    CHECK_EQ(sqd_cq_new(icq, &scq), 0);
    struct sqd_queue_attr qa = {.sq_depth = 8, .max_send_sge = 1, .release = observe_release, .release_ctx = &o};
    CHECK_EQ(sqd_queue_new(scq, NULL, ini, &qa, &q), 0);
    o.q = q;

    /* The SEND's ACK is lost: the peer has executed it, but the HCA must send it again from the MR. */
    struct sqd_sim_fault f = {.kind = SQD_SIM_FAULT_LOSE_ACKS, .qp = ini, .count = 1};
    CHECK_EQ(sqd_sim_inject(sim, &f), 0);
    memcpy(src, "tracked late", 12);
    struct ibv_sge sge = {.addr = (uintptr_t)src, .length = 12, .lkey = smr->lkey};
    struct ibv_send_wr wr = {.wr_id = 77, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad = NULL;
    CHECK_EQ(sqd_post_send(q, &wr, &bad), 0);
    CHECK_EQ(sqd_sim_step(sim, 10), 0);
    struct sqd_sim_stats ss;
    CHECK_EQ(sqd_sim_stats(sim, &ss), 0);
    CHECK_EQ(ss.acks_lost, 1);
    CHECK_EQ(sqd_sim_buffer_busy(sim, src, 12), 1);

    /* Tracked only now, then handed over: the SEND accepted before may use it. */
    CHECK_EQ(sqd_queue_track_mr(q, smr), 0);
    CHECK_EQ(sqd_defer_dereg_mr(q, smr), 0);
    struct sqd_queue_stats st;
    CHECK_EQ(sqd_queue_stats(q, &st), 0);
    CHECK_EQ(st.deferred, 1);
    no_sim_violations();

    struct ibv_wc wc[4];
    for (int i = 0; i < 500 && o.releases == 0; i++) {
        CHECK_EQ(sqd_sim_step(sim, 1), 0);
        CHECK(sqd_cq_poll(scq, 4, wc) >= 0);
    }
    CHECK_EQ(o.releases, 1);
    CHECK_EQ(o.stats_rc, 0);
    CHECK_EQ(o.status, IBV_WC_SUCCESS);
    CHECK_EQ(o.deferred_at_release, 1); /* deregistered right after the release, not before */
    CHECK_EQ(sqd_sim_stats(sim, &ss), 0);
    CHECK(ss.retransmissions >= 1);
    CHECK_EQ(sqd_queue_stats(q, &st), 0);
    CHECK_EQ(st.deferred, 0);
    CHECK_EQ(st.teardown_failures, 0);
    CHECK_EQ(st.tracked_mrs, 0);
    CHECK_EQ(sqd_sim_buffer_busy(sim, src, 12), 0);
    no_sim_violations();
    CHECK(memcmp(dst, "tracked late", 12) == 0);

    CHECK_EQ(sqd_queue_free(q), 0);
    q = NULL;
}

int main(void)
{
    run("a tracked MR is untracked when its deferred deregistration runs",
        a_tracked_mr_is_untracked_when_its_deferred_deregistration_runs);
    run("MRs handed over one after another leave nothing tracked",
        mrs_handed_over_one_after_another_leave_nothing_tracked);
    run("an MR tracked elsewhere stays tracked there", an_mr_tracked_elsewhere_stays_tracked_there);
    run("an MR tracked under WRs in flight is deregistered only after them",
        an_mr_tracked_under_wrs_in_flight_is_deregistered_only_after_them);
    sim_teardown();
    return harness_finish("tracked_mr");
}
