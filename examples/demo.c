/* sqdisc demo: one NVMe-oF-like request/response ULP, run twice on the software HCA with the same seed and the
 * same packet loss: once "the 2017 way" on raw verbs, once through sqdisc. It prints the two runs side by side.
 *
 * The ULP. An initiator QP and a target QP, connected on one simulated HCA. For each request the initiator
 * registers an MR over its slot's I/O buffer (a 64-byte command capsule followed by the data buffer), writes
 * the command (request id, data address, rkey, length) into the capsule and SENDs it. The target, on receiving
 * it, fills a staging buffer with the data (a pattern derived from the request id), RDMA WRITEs it into the
 * initiator's data buffer in 256-byte chunks and SENDs a response. On the response the initiator checks the
 * data, invalidates the rkey it exposed (LocalInv), deregisters the MR and reuses the slot for the next request.
 * `--depth` requests are in flight; the run issues `--requests` of them.
 *
 * The raw ULP does what ULPs did before the linux-rdma discussion of June 2017 ("All ULPs must ..."):
 *   - it signals only every 32nd SEND (the target's RDMA WRITEs never) and sizes its SQs by a naive count of
 *     requests in flight: posts fail with ENOMEM, and a run of big requests fills the target's SQ with
 *     unsignaled WQEs that no completion will ever free (rules 1 and 2);
 *   - its CQs hold the signaled completions only, not the flush of every outstanding WR (rule 2);
 *   - the target reuses its one staging buffer and its one response buffer as soon as it has posted the WRITEs
 *     and the SEND, so a retransmission carries another request's bytes (rule 3);
 *   - the initiator takes the response as proof that its SEND is done: it posts the LocalInv of the rkey at
 *     once, without the fence, reuses the slot's capsule and data buffer for the next request, and deregisters
 *     the MR when the LocalInv completes (rules 3 and 4).
 * The sqdisc ULP is the same code with posts through sqd_post_send / sqd_post_recv, polls through sqd_cq_poll,
 * buffers reused in release callbacks only, sqd_invalidate (deferred until a completion covers the SEND),
 * sqd_defer_dereg_mr, and CQs sized by sqd_cq_depth_for.
 *
 * When a connection fails (an error completion, the QP in error) or stalls (no progress for a keep-alive
 * period), both sides disconnect (QPs to error: everything flushes), the requests in flight are lost, and the
 * initiator reconnects with new QPs and CQs, as an NVMe-oF host does. docs/demo.md explains the table.
 *
 * Exit status: 0 when the sqdisc run is clean (every request completed with correct data, no QP failure, no
 * ENOMEM, no CQ overrun, no violation logged by the sim), 1 otherwise, 2 for a bad command line. The raw run
 * is expected to fail.
 *
 * Build: make demo   (or: cc -std=c11 demo.c $(pkg-config --cflags --libs sqdisc)) */
#define _POSIX_C_SOURCE 200809L

#include <sqdisc.h>
#include <sqdisc_sim.h>
#include <infiniband/verbs.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CAPSULE 64                       /* bytes of a command capsule, a response, a receive buffer */
#define CHUNK 256                        /* bytes per RDMA WRITE */
#define MAX_CHUNKS 4
#define MAX_DATA (CHUNK * MAX_CHUNKS)    /* the largest request */
#define SLOT_BYTES (CAPSULE + MAX_DATA)  /* an initiator slot's I/O buffer: capsule, then data */
#define SIGNAL_EVERY 32                  /* the ULP asks for a completion on every 32nd SEND */
#define KEEPALIVE_STEPS 2000             /* a connection without progress for this long is declared dead */
#define DISCONNECT_STEPS 16              /* steps between deciding to disconnect and the QPs' move to error */
#define MAX_DEPTH 1024
#define DEFAULT_LOSS 5000                /* 0.5% of request packets lost */
#define DEFAULT_ACK_LOSS 20000           /* 2% of ACKs lost */
#define DEFAULT_REQUESTS 20000
#define DEFAULT_DEPTH 16
#define MAX_REQUESTS 100000000ull

#define TAG_RECV (1ull << 63)            /* wr_id of a receive */
#define TAG_INV (1ull << 62)             /* wr_id of the initiator's LocalInv */
#define TAG_LAST (1ull << 61)            /* wr_id of the target's response SEND (after its WRITEs) */

struct opts {
    uint64_t seed;
    uint32_t loss_ppm, ack_loss_ppm;
    uint64_t requests;
    uint32_t depth;
};

/* What one run measured: the rows of the table. */
struct results {
    uint64_t ok, corrupted, unwritten, bogus, lost; /* requests: correct data, wrong data (of which: data
                                             not written yet), lost with a connection; bogus: responses
                                             that named no request in flight */
    uint64_t connections, failures, stalls, stalls_sq_full, enomem;
    uint64_t send_wrs, send_cqes;         /* send WRs the ULP asked for; send CQEs reaped */
    uint64_t inv_requested, inv_ok, inv_unsafe;
    uint64_t err_status[32];              /* error completions (not flush) the ULP saw, by status */
    uint64_t violations[8];               /* by SQD_SIM_VIOLATION_* kind (0: unknown kinds) */
    uint64_t mr_in_use_dereg;             /* MR-in-use violations caused by a deregistration */
    struct sqd_sim_stats sim;
    double seconds;
};

struct command {  /* what the capsule carries */
    uint64_t rid, addr;
    uint32_t rkey, len;
};

struct response {
    uint64_t rid;
    uint32_t status, pad;
};

struct run;

/* An initiator slot: one request at a time. */
struct islot {
    struct run *run;
    unsigned idx;
    unsigned char *buf;    /* capsule at 0, data at CAPSULE */
    struct ibv_mr *mr;     /* the request's MR, while the ULP owns it */
    uint32_t rkey;
    uint64_t rid;
    uint32_t len;
    bool busy, sent, responded, inv_posted, send_released, inv_done;
};

/* A target slot (sqdisc run): staging and response buffers, free again at the response SEND's release. */
struct tslot {
    bool busy;
};

struct run {
    bool managed;                         /* false: raw verbs, the 2017 way; true: through sqdisc */
    const struct opts *o;
    unsigned depth, isq, tsq;             /* queue depth; initiator and target SQ depths */
    struct sqd_sim *sim;

    unsigned char *ibufs, *irecv, *trecv, *tstage, *tresp;
    struct ibv_mr *irecv_mr, *trecv_mr, *tstage_mr, *tresp_mr;
    struct islot *slots;
    struct tslot *tslots;
    struct command *fifo;                 /* commands the target received and has not served yet */
    unsigned fifo_head, fifo_len;

    /* the connection */
    bool up, failed, saw_status;          /* saw_status: an error status other than flush was seen */
    struct ibv_cq *icq, *tcq;
    struct ibv_qp *iqp, *tqp;
    struct sqd_cq *sicq, *stcq;
    struct sqd_queue *iq, *tq;

    /* the raw initiator's MRs waiting for their LocalInv (posted or not yet: ENOMEM), oldest first */
    struct ibv_mr **inv_mr;
    uint64_t inv_head, inv_posted, inv_tail;
    unsigned inv_cap;

    /* the raw target's chain that hit ENOMEM, retried after a completion */
    struct ibv_send_wr chain[MAX_CHUNKS + 1];
    struct ibv_sge chain_sge[MAX_CHUNKS + 1];
    struct ibv_send_wr *pending;

    uint64_t next_rid, i_sends, t_sends, last_progress;
    struct results r;
};

/* ---- the data: lengths and patterns derived from the request id ------------------------------------------ */

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Mostly one chunk, some two, a few four: the same sequence in both runs. */
static uint32_t request_len(const struct opts *o, uint64_t rid)
{
    uint64_t h = mix(o->seed * 0x100000001b3ull ^ mix(rid));
    unsigned p = (unsigned)(h % 100);
    uint32_t chunks = p < 80 ? 1 : p < 95 ? 2 : 4;
    return chunks * CHUNK - (uint32_t)((h >> 32) % (CHUNK / 2));
}

static uint64_t pattern_word(uint64_t rid, uint32_t i)
{
    return mix(rid ^ 0x5eed5eed5eed5eedull) + i * 0x9e3779b97f4a7c15ull;
}

static void fill_pattern(unsigned char *p, uint64_t rid, uint32_t len)
{
    for (uint32_t i = 0; i < len; i += 8) {
        uint64_t w = pattern_word(rid, i);
        memcpy(p + i, &w, len - i < 8 ? len - i : 8);
    }
}

static bool check_pattern(const unsigned char *p, uint64_t rid, uint32_t len)
{
    for (uint32_t i = 0; i < len; i += 8) {
        uint64_t w = pattern_word(rid, i);
        if (memcmp(p + i, &w, len - i < 8 ? len - i : 8) != 0)
            return false;
    }
    return true;
}

static uint64_t sim_steps(const struct run *run)
{
    struct sqd_sim_stats s;
    return sqd_sim_stats(run->sim, &s) == 0 ? s.steps : 0;
}

static void die(const char *what)
{
    fprintf(stderr, "demo: %s: %s\n", what, sqd_last_error());
    exit(1);
}

static void saw_error(struct run *run, enum ibv_wc_status status)
{
    if (status != IBV_WC_WR_FLUSH_ERR && (unsigned)status < 32) {
        run->r.err_status[status]++;
        run->saw_status = true;
    }
    run->failed = true;
}

/* ---- receives ------------------------------------------------------------------------------------------- */

static void post_recv(struct run *run, bool target, unsigned i)
{
    unsigned char *buf = (target ? run->trecv : run->irecv) + (size_t)i * CAPSULE;
    struct ibv_mr *mr = target ? run->trecv_mr : run->irecv_mr;
    struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = CAPSULE, .lkey = mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = TAG_RECV | i, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
    int rc = run->managed ? sqd_post_recv(target ? run->tq : run->iq, &wr, &bad)
                          : ibv_post_recv(target ? run->tqp : run->iqp, &wr, &bad);
    if (rc)
        run->failed = true; /* a QP in error refuses nothing; anything else ends the connection */
}

/* ---- the initiator -------------------------------------------------------------------------------------- */

static void slot_reset(struct islot *s)
{
    s->busy = s->sent = s->responded = s->inv_posted = s->send_released = s->inv_done = false;
}

/* sqdisc: a slot is free once its SEND is released and its invalidation is done. */
static void maybe_free_slot(struct islot *s)
{
    if (s->busy && s->send_released && s->inv_done) {
        slot_reset(s);
        s->run->last_progress = sim_steps(s->run);
    }
}

static void on_initiator_release(void *ctx, const struct sqd_completion *c)
{
    struct run *run = ctx;
    if (c->status != IBV_WC_SUCCESS)
        saw_error(run, (enum ibv_wc_status)c->status);
    if (c->flags & SQD_COMPLETION_RECV)
        return;
    struct islot *s = &run->slots[c->wr_id & 0xffffffffu];
    s->send_released = true;
    maybe_free_slot(s);
}

static void on_invalidated(void *ctx, const struct sqd_completion *c)
{
    struct islot *s = ctx;
    struct run *run = s->run;
    if (c->status == IBV_WC_SUCCESS) {
        run->r.inv_ok++;
        /* No remote access with the rkey can succeed now; the SEND that used the MR was covered before the
         * LocalInv was posted. The library deregisters the MR once no WR of the queue can reference it. */
        if (sqd_defer_dereg_mr(run->iq, s->mr) == 0)
            s->mr = NULL;
    } else {
        saw_error(run, (enum ibv_wc_status)c->status);
    }
    s->inv_done = true;
    maybe_free_slot(s);
}

/* Raw: posts the LocalInvs waiting in the ring, the 2017 way: unfenced, at once, signaled because the MR is
 * deregistered when the LocalInv completes. Those that find the SQ full wait for the next completion. */
static void raw_post_invs(struct run *run)
{
    while (run->inv_posted < run->inv_tail && !run->failed) {
        unsigned k = (unsigned)(run->inv_posted % run->inv_cap);
        struct ibv_send_wr inv = {.wr_id = TAG_INV | k, .opcode = IBV_WR_LOCAL_INV,
                                  .send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = run->inv_mr[k]->rkey},
                           *bad = NULL;
        int rc = ibv_post_send(run->iqp, &inv, &bad);
        if (rc == ENOMEM) {
            run->r.enomem++;
            return;
        }
        if (rc) {
            run->failed = true;
            return;
        }
        run->inv_posted++;
        run->r.send_wrs++;
    }
}

static void post_command(struct run *run, struct islot *s)
{
    struct ibv_sge sge = {.addr = (uintptr_t)s->buf, .length = sizeof(struct command), .lkey = s->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = s->idx, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = run->i_sends % SIGNAL_EVERY == SIGNAL_EVERY - 1 ? IBV_SEND_SIGNALED : 0},
                       *bad = NULL;
    int rc = run->managed ? -sqd_post_send(run->iq, &wr, &bad) : ibv_post_send(run->iqp, &wr, &bad);
    if (rc == ENOMEM || rc == EAGAIN) {
        run->r.enomem++;
        if (run->managed)
            run->failed = true; /* cannot happen: the backlog holds every request in flight */
    } else if (rc) {
        run->failed = true;
    } else {
        s->sent = true;
        run->i_sends++;
        run->r.send_wrs++;
    }
}

/* Starts a request in every free slot; `retry`: a completion was just polled, so the raw ULP tries again the
 * posts that found its SQ full. */
static void initiator_submit(struct run *run, bool retry)
{
    for (unsigned i = 0; i < run->depth && !run->failed; i++) {
        struct islot *s = &run->slots[i];
        if (!s->busy && run->next_rid < run->o->requests) {
            s->busy = true;
            s->rid = run->next_rid++;
            s->len = request_len(run->o, s->rid);
            memset(s->buf + CAPSULE, 0xee, MAX_DATA); /* no stale data can pass the check */
            if (sqd_sim_reg_mr(run->sim, s->buf, SLOT_BYTES, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
                               &s->mr))
                die("sqd_sim_reg_mr");
            s->rkey = s->mr->rkey;
            struct command cmd = {.rid = s->rid, .addr = (uintptr_t)(s->buf + CAPSULE), .rkey = s->rkey,
                                  .len = s->len};
            memset(s->buf, 0, CAPSULE);
            memcpy(s->buf, &cmd, sizeof cmd);
            post_command(run, s);
        } else if (s->busy && !s->sent && retry) {
            post_command(run, s);
        }
    }
    if (!run->managed && retry)
        raw_post_invs(run);
}

/* A response arrived in receive buffer `i`. */
static void initiator_response(struct run *run, unsigned i)
{
    struct response resp;
    memcpy(&resp, run->irecv + (size_t)i * CAPSULE, sizeof resp);
    struct islot *s = NULL;
    for (unsigned k = 0; k < run->depth; k++)
        if (run->slots[k].busy && run->slots[k].sent && !run->slots[k].responded && run->slots[k].rid == resp.rid)
            s = &run->slots[k];
    if (!s) {
        run->r.bogus++; /* a response naming no request in flight */
        return;
    }
    s->responded = true;
    run->last_progress = sim_steps(run);
    if (check_pattern(s->buf + CAPSULE, s->rid, s->len)) {
        run->r.ok++;
    } else {
        run->r.corrupted++;
        run->r.unwritten += s->buf[CAPSULE] == 0xee && s->buf[CAPSULE + s->len - 1] == 0xee;
    }
    run->r.inv_requested++;
    if (run->managed) {
        /* Posted once a completion covers every WR accepted before it, so the SEND that used the MR is done. */
        if (sqd_invalidate(run->iq, s->rkey, TAG_INV | s->idx, 0, on_invalidated, s)) {
            run->failed = true;
        } else {
            s->inv_posted = true;
            run->r.send_wrs++;
        }
        return;
    }
    /* The 2017 way: the response proves the target got the command, so "the SEND is done": invalidate the
     * rkey now, and reuse the slot (capsule and data buffer) for the next request at once. */
    if (run->inv_tail - run->inv_head == run->inv_cap) {
        run->failed = true; /* more LocalInvs waiting than the ring holds: give up the connection */
        return;
    }
    run->inv_mr[run->inv_tail++ % run->inv_cap] = s->mr;
    s->mr = NULL;
    slot_reset(s);
    raw_post_invs(run);
}

static int initiator_poll(struct run *run)
{
    struct ibv_wc wc[32];
    int n = run->managed ? sqd_cq_poll(run->sicq, 32, wc) : ibv_poll_cq(run->icq, 32, wc);
    if (n < 0) {
        run->failed = true;
        return 0;
    }
    for (int k = 0; k < n; k++) {
        if (!run->managed && !(wc[k].wr_id & TAG_RECV))
            run->r.send_cqes++;
        if (wc[k].status != IBV_WC_SUCCESS) {
            if (!run->managed) /* sqdisc: seen in the release callbacks */
                saw_error(run, wc[k].status);
            continue;
        }
        if (wc[k].wr_id & TAG_RECV) {
            unsigned i = (unsigned)(wc[k].wr_id & 0xffffffffu);
            initiator_response(run, i);
            post_recv(run, false, i);
        } else if (!run->managed && (wc[k].wr_id & TAG_INV)) {
            /* raw: the LocalInv completed; deregister its MR */
            unsigned idx = (unsigned)(wc[k].wr_id & 0xffffffffu);
            run->r.inv_ok++;
            sqd_sim_dereg_mr(run->inv_mr[idx]);
            run->inv_mr[idx] = NULL;
            while (run->inv_head < run->inv_posted && !run->inv_mr[run->inv_head % run->inv_cap])
                run->inv_head++;
            run->last_progress = sim_steps(run);
        }
    }
    return n;
}

/* ---- the target ----------------------------------------------------------------------------------------- */

static void on_target_release(void *ctx, const struct sqd_completion *c)
{
    struct run *run = ctx;
    if (c->status != IBV_WC_SUCCESS)
        saw_error(run, (enum ibv_wc_status)c->status);
    if (!(c->flags & SQD_COMPLETION_RECV) && (c->wr_id & TAG_LAST)) {
        run->tslots[c->wr_id & 0xffffffffu].busy = false; /* staging and response buffers reusable now */
        run->last_progress = sim_steps(run);
    }
}

/* Serves the oldest received command: WRITE the data in chunks, then SEND the response. */
static void target_serve(struct run *run)
{
    if (!run->fifo_len)
        return;
    unsigned ts = 0;
    if (run->managed) {
        while (ts < run->depth && run->tslots[ts].busy)
            ts++;
        if (ts == run->depth)
            return; /* every staging buffer is still in flight */
        run->tslots[ts].busy = true;
    } /* raw: one staging buffer and one response buffer, reused at once */
    struct command cmd = run->fifo[run->fifo_head];
    run->fifo_head = (run->fifo_head + 1) % run->depth;
    run->fifo_len--;

    unsigned char *stage = run->tstage + (size_t)ts * MAX_DATA;
    unsigned char *respbuf = run->tresp + (size_t)ts * CAPSULE;
    uint32_t len = cmd.len <= MAX_DATA ? cmd.len : MAX_DATA;
    fill_pattern(stage, cmd.rid, len);
    struct response resp = {.rid = cmd.rid};
    memcpy(respbuf, &resp, sizeof resp);

    unsigned n = 0;
    for (uint32_t off = 0; off < len; off += CHUNK, n++) {
        run->chain_sge[n] = (struct ibv_sge){.addr = (uintptr_t)(stage + off),
                                             .length = len - off < CHUNK ? len - off : CHUNK,
                                             .lkey = run->tstage_mr->lkey};
        run->chain[n] = (struct ibv_send_wr){.wr_id = ((uint64_t)n << 32) | ts, .sg_list = &run->chain_sge[n],
                                             .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE};
        run->chain[n].wr.rdma.remote_addr = cmd.addr + off;
        run->chain[n].wr.rdma.rkey = cmd.rkey;
    }
    run->chain_sge[n] = (struct ibv_sge){.addr = (uintptr_t)respbuf, .length = sizeof resp,
                                         .lkey = run->tresp_mr->lkey};
    run->chain[n] = (struct ibv_send_wr){.wr_id = TAG_LAST | ts, .sg_list = &run->chain_sge[n], .num_sge = 1,
                                         .opcode = IBV_WR_SEND,
                                         .send_flags = run->t_sends % SIGNAL_EVERY == SIGNAL_EVERY - 1
                                                           ? IBV_SEND_SIGNALED : 0};
    run->t_sends++;
    for (unsigned k = 0; k < n; k++)
        run->chain[k].next = &run->chain[k + 1];
    run->chain[n].next = NULL;
    run->r.send_wrs += n + 1;

    struct ibv_send_wr *bad = NULL;
    int rc = run->managed ? -sqd_post_send(run->tq, run->chain, &bad) : ibv_post_send(run->tqp, run->chain, &bad);
    if (rc == ENOMEM || rc == EAGAIN) {
        run->r.enomem++;
        if (run->managed)
            run->failed = true; /* cannot happen: the backlog holds every request in flight */
        else
            run->pending = bad; /* the rest of the chain waits; its buffers are already rewritten */
    } else if (rc) {
        run->failed = true;
    }
}

static int target_poll(struct run *run)
{
    struct ibv_wc wc;
    int n = run->managed ? sqd_cq_poll(run->stcq, 1, &wc) : ibv_poll_cq(run->tcq, 1, &wc);
    if (n < 0) {
        run->failed = true;
        return 0;
    }
    if (n == 1) {
        if (!run->managed && !(wc.wr_id & TAG_RECV))
            run->r.send_cqes++;
        if (wc.status != IBV_WC_SUCCESS) {
            if (!run->managed)
                saw_error(run, wc.status);
        } else if (wc.wr_id & TAG_RECV) {
            unsigned i = (unsigned)(wc.wr_id & 0xffffffffu);
            if (run->fifo_len < run->depth) {
                memcpy(&run->fifo[(run->fifo_head + run->fifo_len) % run->depth],
                       run->trecv + (size_t)i * CAPSULE, sizeof(struct command));
                run->fifo_len++;
            }
            post_recv(run, true, i);
        }
    }
    if (run->pending) {
        if (n == 1) { /* a completion may have freed SQ slots: try the rest of the chain again */
            struct ibv_send_wr *bad = NULL;
            int rc = ibv_post_send(run->tqp, run->pending, &bad);
            if (rc == ENOMEM) {
                run->r.enomem++;
                run->pending = bad;
            } else {
                run->pending = NULL;
                if (rc)
                    run->failed = true;
            }
        }
    } else {
        target_serve(run);
    }
    return n;
}

/* ---- connections ---------------------------------------------------------------------------------------- */

static void connect_both(struct run *run)
{
    uint64_t icqe = 2 * run->depth + 1, tcqe = run->depth + 1; /* raw: signaled completions and receives only */
    if (run->managed) {
        struct sqd_queue_plan ip = {.sq_depth = run->isq, .rq_depth = run->depth};
        struct sqd_queue_plan tp = {.sq_depth = run->tsq, .rq_depth = run->depth};
        if (sqd_cq_depth_for(&ip, 1, &icqe) || sqd_cq_depth_for(&tp, 1, &tcqe))
            die("sqd_cq_depth_for");
    }
    if (sqd_sim_create_cq(run->sim, (int)icqe, &run->icq) || sqd_sim_create_cq(run->sim, (int)tcqe, &run->tcq))
        die("sqd_sim_create_cq");
    struct ibv_qp_init_attr ia = {.send_cq = run->icq, .recv_cq = run->icq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = run->isq, .max_recv_wr = run->depth,
                                          .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp_init_attr ta = ia;
    ta.send_cq = ta.recv_cq = run->tcq;
    ta.cap.max_send_wr = run->tsq;
    if (sqd_sim_create_qp(run->sim, &ia, &run->iqp) || sqd_sim_create_qp(run->sim, &ta, &run->tqp))
        die("sqd_sim_create_qp");
    if (sqd_sim_connect(run->iqp, run->tqp, NULL))
        die("sqd_sim_connect");
    if (run->managed) {
        struct sqd_queue_attr qa = {.sq_depth = ia.cap.max_send_wr, .max_send_sge = ia.cap.max_send_sge,
                                    .max_inline_data = ia.cap.max_inline_data, .rq_depth = ia.cap.max_recv_wr,
                                    .backlog_depth = 2 * run->depth, .release = on_initiator_release,
                                    .release_ctx = run};
        if (sqd_cq_new(run->icq, &run->sicq) || sqd_queue_new(run->sicq, run->sicq, run->iqp, &qa, &run->iq))
            die("sqdisc initiator queue");
        qa.sq_depth = ta.cap.max_send_wr;
        qa.rq_depth = ta.cap.max_recv_wr;
        qa.backlog_depth = (MAX_CHUNKS + 1) * run->depth;
        qa.release = on_target_release;
        if (sqd_cq_new(run->tcq, &run->stcq) || sqd_queue_new(run->stcq, run->stcq, run->tqp, &qa, &run->tq))
            die("sqdisc target queue");
    }
    run->up = true;
    run->failed = run->saw_status = false;
    run->r.connections++;
    run->last_progress = sim_steps(run);
    for (unsigned i = 0; i < run->depth; i++) {
        post_recv(run, false, i);
        post_recv(run, true, i);
    }
}

/* Disconnects (both QPs to error: every outstanding WR and receive flushes), reaps what is left, frees the
 * connection. Requests without a response are lost. */
static void disconnect_both(struct run *run)
{
    /* A disconnect takes a moment: what is on the wire (a NAK for a failed WRITE, say) still arrives. */
    sqd_sim_step(run->sim, DISCONNECT_STEPS);
    sqd_sim_set_error(run->iqp);
    sqd_sim_set_error(run->tqp);
    struct ibv_wc wc[64];
    if (run->managed) {
        int ri = -EINPROGRESS, rt = -EINPROGRESS;
        for (int k = 0; k < 10000 && (ri || rt); k++) {
            ri = sqd_queue_drain(run->iq);
            rt = sqd_queue_drain(run->tq);
            if (sqd_cq_poll(run->sicq, 64, wc) < 0 || sqd_cq_poll(run->stcq, 64, wc) < 0)
                break;
        }
        struct sqd_queue_stats qs;
        for (int side = 0; side < 2; side++) {
            sqd_queue_stats(side ? run->tq : run->iq, &qs);
            run->r.send_cqes += qs.send_cqes;
            /* The error of a WR the library added (an idle-tail marker) is not shown; the queue keeps it. */
            if (!run->saw_status && qs.failed_status && qs.failed_status != IBV_WC_WR_FLUSH_ERR &&
                qs.failed_status < 32)
                saw_error(run, (enum ibv_wc_status)qs.failed_status);
        }
        if (ri || rt || sqd_queue_free(run->iq) || sqd_queue_free(run->tq) || sqd_cq_free(run->sicq) ||
            sqd_cq_free(run->stcq))
            die("sqdisc teardown");
        run->iq = run->tq = NULL;
        run->sicq = run->stcq = NULL;
    } else {
        for (int k = 0; k < 100; k++) {
            int got = 0;
            for (int side = 0; side < 2; side++) {
                int n = ibv_poll_cq(side ? run->tcq : run->icq, 64, wc);
                for (int j = 0; j < n; j++) {
                    run->r.send_cqes += !(wc[j].wr_id & TAG_RECV);
                    if (wc[j].status != IBV_WC_SUCCESS)
                        saw_error(run, wc[j].status);
                }
                got += n > 0 ? n : 0;
            }
            if (!got)
                break;
        }
    }
    if (sqd_sim_destroy_qp(run->iqp) || sqd_sim_destroy_qp(run->tqp) || sqd_sim_destroy_cq(run->icq) ||
        sqd_sim_destroy_cq(run->tcq))
        die("sim teardown");
    for (unsigned i = 0; i < run->depth; i++) {
        struct islot *s = &run->slots[i];
        if (s->busy && !s->responded)
            run->r.lost++;
        if (s->mr) {
            sqd_sim_dereg_mr(s->mr);
            s->mr = NULL;
        }
        slot_reset(s);
        run->tslots[i].busy = false;
    }
    for (uint64_t k = run->inv_head; k < run->inv_tail; k++) {
        struct ibv_mr **mr = &run->inv_mr[k % run->inv_cap];
        if (*mr)
            sqd_sim_dereg_mr(*mr);
        *mr = NULL;
    }
    run->inv_head = run->inv_posted = run->inv_tail = 0;
    run->fifo_len = 0;
    run->pending = NULL;
    run->up = false;
}

static bool all_idle(const struct run *run)
{
    if (run->inv_head != run->inv_tail)
        return false;
    for (unsigned i = 0; i < run->depth; i++)
        if (run->slots[i].busy || run->tslots[i].busy)
            return false;
    return true;
}

/* ---- one run -------------------------------------------------------------------------------------------- */

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n, size);
    if (!p) {
        fprintf(stderr, "demo: out of memory\n");
        exit(1);
    }
    return p;
}

static void run_workload(struct run *run, bool managed, const struct opts *o)
{
    memset(run, 0, sizeof *run);
    run->managed = managed;
    run->o = o;
    run->depth = o->depth;
    run->isq = 2 * o->depth;                  /* a SEND and a LocalInv per request in flight */
    run->tsq = (MAX_CHUNKS + 1) * o->depth;   /* up to four WRITEs and a SEND per request in flight */

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    struct sqd_sim_config cfg;
    sqd_sim_config_default(&cfg);
    cfg.seed = o->seed;
    cfg.loss_ppm = o->loss_ppm;
    cfg.ack_loss_ppm = o->ack_loss_ppm;
    cfg.wire_delay_min = 1;
    cfg.wire_delay_max = 4;
    cfg.flags = SQD_SIM_STRICT;
    if (sqd_sim_new(&cfg, &run->sim))
        die("sqd_sim_new");

    unsigned d = run->depth;
    run->ibufs = xcalloc(d, SLOT_BYTES);
    run->irecv = xcalloc(d, CAPSULE);
    run->trecv = xcalloc(d, CAPSULE);
    run->tstage = xcalloc(d, MAX_DATA);
    run->tresp = xcalloc(d, CAPSULE);
    run->slots = xcalloc(d, sizeof *run->slots);
    run->tslots = xcalloc(d, sizeof *run->tslots);
    run->fifo = xcalloc(d, sizeof *run->fifo);
    run->inv_cap = 8 * d;
    run->inv_mr = xcalloc(run->inv_cap, sizeof *run->inv_mr);
    for (unsigned i = 0; i < d; i++) {
        run->slots[i] = (struct islot){.run = run, .idx = i, .buf = run->ibufs + (size_t)i * SLOT_BYTES};
    }
    if (sqd_sim_reg_mr(run->sim, run->irecv, (size_t)d * CAPSULE, IBV_ACCESS_LOCAL_WRITE, &run->irecv_mr) ||
        sqd_sim_reg_mr(run->sim, run->trecv, (size_t)d * CAPSULE, IBV_ACCESS_LOCAL_WRITE, &run->trecv_mr) ||
        sqd_sim_reg_mr(run->sim, run->tstage, (size_t)d * MAX_DATA, IBV_ACCESS_LOCAL_WRITE, &run->tstage_mr) ||
        sqd_sim_reg_mr(run->sim, run->tresp, (size_t)d * CAPSULE, IBV_ACCESS_LOCAL_WRITE, &run->tresp_mr))
        die("sqd_sim_reg_mr");

    for (;;) {
        bool done_issuing = run->r.ok + run->r.corrupted + run->r.lost >= o->requests;
        if (!run->up) {
            if (done_issuing)
                break;
            connect_both(run);
        }
        if (done_issuing && all_idle(run)) {
            disconnect_both(run); /* the end: the same disconnect, nothing in flight */
            break;
        }
        int got = initiator_poll(run);
        initiator_submit(run, got > 0);
        target_poll(run);
        /* QP in error: what an IBV_EVENT_QP_FATAL / IBV_EVENT_CQ_ERR async event would tell the ULP */
        if (run->iqp->state == IBV_QPS_ERR || run->tqp->state == IBV_QPS_ERR)
            run->failed = true;
        if (!run->failed && sim_steps(run) - run->last_progress > KEEPALIVE_STEPS) {
            run->r.stalls++;
            if (run->pending)
                run->r.stalls_sq_full++; /* the target waits for SQ slots no completion will free */
            run->failed = true;
        }
        if (run->failed) {
            run->r.failures++;
            disconnect_both(run);
        }
    }

    int nv = sqd_sim_violation_count(run->sim);
    for (int i = 0; i < nv; i++) {
        struct sqd_sim_violation v;
        if (sqd_sim_violation(run->sim, (size_t)i, &v))
            continue;
        run->r.violations[v.kind < 8 ? v.kind : 0]++;
        if (v.kind == SQD_SIM_VIOLATION_MR_IN_USE) {
            if (strstr(v.text, "LOCAL_INV"))
                run->r.inv_unsafe++;
            else
                run->r.mr_in_use_dereg++;
        }
    }
    sqd_sim_stats(run->sim, &run->r.sim);
    sqd_sim_free(run->sim); /* frees the long-lived MRs too */
    free(run->ibufs);
    free(run->irecv);
    free(run->trecv);
    free(run->tstage);
    free(run->tresp);
    free(run->slots);
    free(run->tslots);
    free(run->fifo);
    free(run->inv_mr);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    run->r.seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
}

/* ---- the report ----------------------------------------------------------------------------------------- */

static uint64_t qp_failures(const struct results *r)
{
    return r->sim.errors;
}

static void row(const char *label, uint64_t raw, uint64_t managed)
{
    printf("  %-44s %16llu %16llu\n", label, (unsigned long long)raw, (unsigned long long)managed);
}

static void row_text(const char *label, const char *raw, const char *managed)
{
    printf("  %-44s %16s %16s\n", label, raw, managed);
}

static void print_table(const struct results *a, const struct results *b)
{
    char x[64], y[64];
    printf("  %-44s %16s %16s\n", "", "raw verbs (2017)", "through sqdisc");
    row("requests completed with correct data", a->ok, b->ok);
    row("data corruptions detected", a->corrupted + a->bogus, b->corrupted + b->bogus);
    row("requests lost with a failed connection", a->lost, b->lost);
    row("QP failures (error CQEs other than flush)", qp_failures(a), qp_failures(b));
    row("connections failed (QP error or stall)", a->failures, b->failures);
    row("  of them stalled (keep-alive expired)", a->stalls, b->stalls);
    row("ENOMEM returns from post_send", a->enomem, b->enomem);
    row("CQ overruns (CQEs lost)", a->sim.cq_overruns, b->sim.cq_overruns);
    row("violations logged by the sim", a->sim.violations, b->sim.violations);
    for (uint32_t k = 1; k < 8; k++)
        if (a->violations[k] || b->violations[k]) {
            snprintf(x, sizeof x, "  %s", sqd_sim_violation_kind_str(k));
            row(x, a->violations[k], b->violations[k]);
        }
    if (a->violations[0] || b->violations[0])
        row("  unknown kind", a->violations[0], b->violations[0]);
    snprintf(x, sizeof x, "%.3f", a->send_wrs ? (double)a->send_cqes / (double)a->send_wrs : 0.0);
    snprintf(y, sizeof y, "%.3f", b->send_wrs ? (double)b->send_cqes / (double)b->send_wrs : 0.0);
    row_text("send CQEs per send WR", x, y);
    row("doorbells", a->sim.doorbells, b->sim.doorbells);
    snprintf(x, sizeof x, "%llu of %llu",
             (unsigned long long)(a->inv_ok > a->inv_unsafe ? a->inv_ok - a->inv_unsafe : 0),
             (unsigned long long)a->inv_requested);
    snprintf(y, sizeof y, "%llu of %llu",
             (unsigned long long)(b->inv_ok > b->inv_unsafe ? b->inv_ok - b->inv_unsafe : 0),
             (unsigned long long)b->inv_requested);
    row_text("invalidations done safely", x, y);
    row("packets retransmitted", a->sim.retransmissions, b->sim.retransmissions);
    snprintf(x, sizeof x, "%.2f s", a->seconds);
    snprintf(y, sizeof y, "%.2f s", b->seconds);
    row_text("wall time", x, y);
}

static void explain(const struct results *a)
{
    printf("\nWhy the raw run failed (the rules of the 2017 linux-rdma discussion):\n");
    int lines = 0;
    if (a->stalls_sq_full) {
        printf("  rule 1: the target signaled only every %dnd response SEND and never its WRITEs; a run of big "
               "requests\n          filled its SQ with unsignaled WQEs no completion would ever free, and the "
               "connection\n          stalled (%llu times) until the keep-alive expired.\n",
               SIGNAL_EVERY, (unsigned long long)a->stalls_sq_full);
        lines++;
    }
    if (a->enomem) {
        printf("  rule 2: %llu posts found the SQ full (ENOMEM): the ULP counted requests in flight, not SQ slots "
               "freed\n          by polled completions.\n",
               (unsigned long long)a->enomem);
        lines++;
    }
    if (a->sim.cq_overruns) {
        printf("  rule 2: the CQs were sized for the signaled completions only; when a connection failed, every\n"
               "          outstanding WR and receive flushed with its own CQE and %llu CQEs were lost (CQ "
               "overrun).\n",
               (unsigned long long)a->sim.cq_overruns);
        lines++;
    }
    if (a->corrupted > a->unwritten) {
        printf("  rule 3: source buffer reused before its completion: the target rewrote its one staging buffer "
               "right\n          after posting the WRITEs; a retransmission sent the next request's bytes "
               "(%llu requests got wrong data).\n",
               (unsigned long long)(a->corrupted - a->unwritten));
        lines++;
    }
    if (a->unwritten || a->bogus || a->stalls > a->stalls_sq_full) {
        printf("  rule 3: the target rewrote its one response buffer before the response SEND completed; a "
               "retransmitted\n          response named a later request:\n");
        if (a->unwritten)
            printf("          - %llu requests completed before their data arrived\n",
                   (unsigned long long)a->unwritten);
        if (a->bogus)
            printf("          - %llu responses named no request in flight\n", (unsigned long long)a->bogus);
        if (a->stalls > a->stalls_sq_full)
            printf("          - %llu times a request never got its response (keep-alive expired)\n",
                   (unsigned long long)(a->stalls - a->stalls_sq_full));
        lines++;
    }
    if (a->violations[SQD_SIM_VIOLATION_SOURCE_MODIFIED]) {
        printf("  rule 3: the sim saw %llu retransmissions read bytes that had changed since the first "
               "transmission.\n",
               (unsigned long long)a->violations[SQD_SIM_VIOLATION_SOURCE_MODIFIED]);
        lines++;
    }
    if (a->inv_unsafe) {
        printf("  rule 4: the LocalInv, posted without the fence as soon as the response arrived, is not ordered "
               "behind\n          the SEND that still used the MR (IBA Table 79): %llu times it killed the MR "
               "of a SEND\n          not yet acknowledged.\n",
               (unsigned long long)a->inv_unsafe);
        lines++;
    }
    if (a->mr_in_use_dereg) {
        printf("  rule 4: %llu MRs were deregistered while a SEND not yet acknowledged still used them.\n",
               (unsigned long long)a->mr_in_use_dereg);
        lines++;
    }
    if (a->err_status[IBV_WC_LOC_PROT_ERR]) {
        printf("  rule 4: %llu times the SEND was retransmitted after that and found its lkey invalid "
               "(IBV_WC_LOC_PROT_ERR):\n          the QP failed.\n",
               (unsigned long long)a->err_status[IBV_WC_LOC_PROT_ERR]);
        lines++;
    }
    if (a->err_status[IBV_WC_REM_ACCESS_ERR]) {
        printf("  rule 3, follow-on: %llu WRITEs reached an rkey the initiator had already invalidated after a "
               "response\n          that came before its data (IBV_WC_REM_ACCESS_ERR): the QPs failed.\n",
               (unsigned long long)a->err_status[IBV_WC_REM_ACCESS_ERR]);
        lines++;
    }
    for (unsigned s = 0; s < 32; s++)
        if (s != IBV_WC_LOC_PROT_ERR && s != IBV_WC_REM_ACCESS_ERR && a->err_status[s]) {
            printf("  follow-on: %llu completions with %s (a consequence of the failures above)\n",
                   (unsigned long long)a->err_status[s], ibv_wc_status_str((enum ibv_wc_status)s));
            lines++;
        }
    if (!lines)
        printf("  it did not fail with these flags: try more requests or more loss.\n");
}

/* What must hold for the sqdisc run; prints what did not. */
static bool clean(const struct opts *o, const struct results *b)
{
    bool ok = true;
#define EXPECT(cond, ...)                                                                                        \
    do {                                                                                                         \
        if (!(cond)) {                                                                                           \
            printf("  NOT CLEAN: " __VA_ARGS__);                                                                 \
            printf("\n");                                                                                        \
            ok = false;                                                                                          \
        }                                                                                                        \
    } while (0)
    EXPECT(b->ok == o->requests, "%llu of %llu requests completed with correct data", (unsigned long long)b->ok,
           (unsigned long long)o->requests);
    EXPECT(b->corrupted + b->bogus == 0, "%llu data corruptions", (unsigned long long)(b->corrupted + b->bogus));
    EXPECT(qp_failures(b) == 0, "%llu QP failures", (unsigned long long)qp_failures(b));
    for (unsigned s = 0; s < 32; s++)
        if (b->err_status[s])
            printf("    %llu completions with %s\n", (unsigned long long)b->err_status[s],
                   ibv_wc_status_str((enum ibv_wc_status)s));
    EXPECT(b->stalls == 0, "%llu stalls", (unsigned long long)b->stalls);
    EXPECT(b->enomem == 0, "%llu ENOMEM/EAGAIN returns", (unsigned long long)b->enomem);
    EXPECT(b->sim.cq_overruns == 0, "%llu CQ overruns", (unsigned long long)b->sim.cq_overruns);
    EXPECT(b->sim.violations == 0, "%llu violations logged", (unsigned long long)b->sim.violations);
    EXPECT(b->inv_ok == b->inv_requested, "%llu of %llu invalidations done", (unsigned long long)b->inv_ok,
           (unsigned long long)b->inv_requested);
#undef EXPECT
    return ok;
}

/* ---- the command line ----------------------------------------------------------------------------------- */

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [--seed N] [--loss PPM] [--ack-loss PPM] [--requests N] [--depth N]\n"
            "\n"
            "Runs an NVMe-oF-like request/response ULP twice on sqdisc's software HCA, with the same seed and\n"
            "packet loss: once on raw verbs the 2017 way, once through sqdisc, and prints both side by side.\n"
            "\n"
            "  --seed N        seed of the simulated HCA and of the request sizes (default 1)\n"
            "  --loss PPM      request packets lost on the wire, per million (default %d)\n"
            "  --ack-loss PPM  ACKs and other response packets lost, per million (default %d)\n"
            "  --requests N    requests to run (default %d)\n"
            "  --depth N       requests in flight, 1..%d (default %d)\n"
            "  --help          this text\n"
            "\n"
            "Exit status: 0 when the sqdisc run is clean, 1 when it is not, 2 for a bad command line.\n"
            "The raw run is expected to fail. See docs/demo.md.\n",
            argv0, DEFAULT_LOSS, DEFAULT_ACK_LOSS, DEFAULT_REQUESTS, MAX_DEPTH, DEFAULT_DEPTH);
}

static bool parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (!s || !*s || *s == '-' || *s == '+')
        return false;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return false;
    *out = v;
    return true;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout, argv[0]);
            exit(0);
        }
        static const char *const names[] = {"--seed", "--loss", "--ack-loss", "--requests", "--depth"};
        int which = -1;
        const char *val = NULL;
        for (int k = 0; k < 5; k++) {
            size_t n = strlen(names[k]);
            if (!strncmp(a, names[k], n) && (a[n] == '\0' || a[n] == '=')) {
                which = k;
                val = a[n] == '=' ? a + n + 1 : (i + 1 < argc ? argv[++i] : NULL);
            }
        }
        uint64_t v = 0;
        static const uint64_t max[] = {UINT64_MAX, 1000000, 1000000, MAX_REQUESTS, MAX_DEPTH};
        if (which < 0) {
            fprintf(stderr, "%s: unknown argument '%s'\n", argv[0], a);
            return -1;
        }
        if (!parse_u64(val, max[which], &v) || (which >= 3 && v == 0)) {
            fprintf(stderr, "%s: bad value for %s: '%s'\n", argv[0], names[which], val ? val : "");
            return -1;
        }
        switch (which) {
        case 0: o->seed = v; break;
        case 1: o->loss_ppm = (uint32_t)v; break;
        case 2: o->ack_loss_ppm = (uint32_t)v; break;
        case 3: o->requests = v; break;
        default: o->depth = (uint32_t)v; break;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o = {.seed = 1, .loss_ppm = DEFAULT_LOSS, .ack_loss_ppm = DEFAULT_ACK_LOSS,
                     .requests = DEFAULT_REQUESTS, .depth = DEFAULT_DEPTH};
    if (parse_args(argc, argv, &o)) {
        usage(stderr, argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("sqdisc %s demo: an NVMe-oF-like ULP on the software HCA, the 2017 way and through sqdisc\n",
           sqd_version());
    printf("seed %llu, request loss %u ppm, ACK loss %u ppm, %llu requests, %u in flight "
           "(SQs: initiator %u, target %u slots)\n\n",
           (unsigned long long)o.seed, o.loss_ppm, o.ack_loss_ppm, (unsigned long long)o.requests, o.depth,
           2 * o.depth, (MAX_CHUNKS + 1) * o.depth);

    static struct run raw, managed;
    run_workload(&raw, false, &o);
    run_workload(&managed, true, &o);
    print_table(&raw.r, &managed.r);
    explain(&raw.r);

    printf("\nThe sqdisc run:\n");
    if (!clean(&o, &managed.r)) {
        uint64_t other = 0;
        for (unsigned s = 0; s < 32; s++)
            other += s != IBV_WC_RETRY_EXC_ERR ? managed.r.err_status[s] : 0;
        if (managed.r.err_status[IBV_WC_RETRY_EXC_ERR] && !other && !managed.r.sim.violations &&
            !managed.r.corrupted && !managed.r.bogus)
            printf("  the loss rate is beyond what RC retransmission recovers (retry_cnt 7): the transport gave up\n"
                   "  (IBV_WC_RETRY_EXC_ERR), not the send-queue discipline.\n");
        else
            printf("  the library or the sim broke its contract: please report the seed and flags above.\n");
        return 1;
    }
    printf("  clean: every request completed with correct data; no QP failure, ENOMEM, CQ overrun or violation.\n");
    return 0;
}
