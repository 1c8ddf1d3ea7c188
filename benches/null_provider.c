/* The null verbs provider of the benchmarks: see null_provider.h for what it does. */

#include "null_provider.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* What a WQE keeps until its CQE is polled. */
struct null_wqe {
    uint64_t wr_id;
    uint32_t opcode; /* enum ibv_wr_opcode */
};

/* A CQE names its QP and the sequence number of its WQE; the rest is read from the WQE when polled. */
struct null_cqe {
    struct null_qp *qp;
    uint32_t seq;
};

struct null_cq {
    struct ibv_cq cq; /* first: the ops cast the ibv_cq pointer back */
    struct null_device *dev;
    struct null_cqe *ring;
    uint32_t mask;
    uint32_t head, tail; /* free-running: entries [tail, head) are pending */
    int overrun;
};

/* A shared receive queue: wr_ids of posted receives; [tail, head) hold a slot, [next, head) wait for a SEND of
 * one of its QPs to complete them (echo) or for null_qp_deliver. */
struct null_srq {
    struct ibv_srq srq; /* first, as above */
    struct null_device *dev;
    uint64_t *ring;
    uint32_t mask, depth, head, next, tail;
};

struct null_qp {
    struct ibv_qp qp; /* first, as above */
    struct null_device *dev;
    struct null_cq *send_cq;
    struct null_wqe *ring; /* a power of two >= depth entries */
    uint32_t mask, depth;
    uint32_t head, tail; /* free-running: WQEs [tail, head) hold a slot */
    unsigned sig_all;
    /* Receives, kept only on a device with echo on (null_device_set_echo): wr_ids of posted receives;
     * [rtail, rhead) hold a slot, [rnext, rhead) wait for a SEND to complete them. */
    struct null_cq *recv_cq;
    uint64_t *rring;
    uint32_t rmask, rdepth, rhead, rnext, rtail;
    /* The QP's SRQ, if it has one: its receives come from there instead. */
    struct null_srq *srq;
};

struct null_device {
    /* libibverbs' layout of an extended context (verbs_get_ctx finds the verbs_context around the ibv_context);
     * every extended op is NULL with sz covering them all, so the inline extended verbs report EOPNOTSUPP. */
    struct verbs_context vctx;
    struct ibv_device ibdev;
    struct null_stats stats;
    unsigned objects;
    uint32_t next_qp_num;
    int echo; /* 0, or ECHO_RQ (null_device_set_echo) or ECHO_SRQ (null_device_set_echo_srq) */
};

enum { ECHO_RQ = 1, ECHO_SRQ = 2 };

static struct null_device *dev_of(struct ibv_context *ctx)
{
    return (struct null_device *)((char *)ctx - offsetof(struct null_device, vctx.context));
}

static int null_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
    struct null_qp *qp = (struct null_qp *)ibqp;
    struct null_cq *cq = qp->send_cq;
    /* Locals, so that the stores into the rings need not reload the QP's fields on every WR. */
    struct null_wqe *ring = qp->ring;
    const uint32_t mask = qp->mask, limit = qp->tail + qp->depth;
    const unsigned sig_all = qp->sig_all;
    uint32_t head = qp->head, start = head;
    int ret = 0;
    for (; wr; wr = wr->next) {
        if (head == limit) {
            ret = ENOMEM;
            break;
        }
        struct null_wqe *w = &ring[head & mask];
        w->wr_id = wr->wr_id;
        w->opcode = wr->opcode;
        if ((wr->send_flags & IBV_SEND_SIGNALED) | sig_all) {
            if (cq->head - cq->tail > cq->mask) {
                cq->overrun = 1;
            } else {
                cq->ring[cq->head++ & cq->mask] = (struct null_cqe){qp, head};
                qp->dev->stats.cqes++;
            }
        }
        head++;
    }
    qp->head = head;
    qp->dev->stats.wqes += head - start;
    if (head != start)
        qp->dev->stats.doorbells++;
    if (ret) {
        qp->dev->stats.refused++;
        *bad_wr = wr;
    }
    return ret;
}

static int null_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
    (void)qp;
    (void)wr;
    (void)bad_wr;
    return 0;
}

static enum ibv_wc_opcode wc_opcode(uint32_t wr_opcode)
{
    switch (wr_opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP: return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD: return IBV_WC_FETCH_ADD;
    case IBV_WR_LOCAL_INV: return IBV_WC_LOCAL_INV;
    case IBV_WR_BIND_MW: return IBV_WC_BIND_MW;
    default: return IBV_WC_SEND;
    }
}

static int null_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
    struct null_cq *cq = (struct null_cq *)ibcq;
    if (cq->overrun) {
        errno = EOVERFLOW;
        return -1;
    }
    int i = 0;
    for (uint32_t tail = cq->tail; i < n && tail != cq->head; i++, tail++) {
        struct null_cqe *c = &cq->ring[tail & cq->mask];
        struct null_qp *qp = c->qp;
        struct null_wqe *w = &qp->ring[c->seq & qp->mask];
        qp->tail = c->seq + 1; /* every WQE up to this one is complete: their slots are free */
        memset(&wc[i], 0, sizeof wc[i]);
        wc[i].wr_id = w->wr_id;
        wc[i].status = IBV_WC_SUCCESS;
        wc[i].opcode = wc_opcode(w->opcode);
        wc[i].qp_num = qp->qp.qp_num;
    }
    cq->tail += (uint32_t)i;
    return i;
}

static uint32_t pow2_at_least(uint32_t n)
{
    uint32_t p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

/* ---- echo (null_device_set_echo): the same ops, with receives completed by SENDs ---------------------------- */

/* A receive's CQE: the QP pointer tagged with its low bit (QPs are malloc'd: the bit is free), the receive's
 * sequence number. The plain ops never see one. */
#define RECV_TAG ((uintptr_t)1)

/* Puts a receive CQE for receive `seq` of `qp` (of its SRQ, for an SRQ's QP) on the QP's recv CQ. */
static inline void put_recv_cqe(struct null_qp *qp, uint32_t seq)
{
    struct null_cq *rcq = qp->recv_cq;
    if (rcq->head - rcq->tail > rcq->mask)
        rcq->overrun = 1;
    else
        rcq->ring[rcq->head++ & rcq->mask] = (struct null_cqe){(struct null_qp *)((uintptr_t)qp | RECV_TAG), seq};
}

/* post_send with echo on; `from_srq` as for poll_echo. */
static inline int post_send_echo(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr, int from_srq)
{
    struct null_qp *qp = (struct null_qp *)ibqp;
    uint32_t *next = from_srq ? &qp->srq->next : &qp->rnext;
    const uint32_t *head = from_srq ? &qp->srq->head : &qp->rhead;
    struct ibv_send_wr *w = wr;
    int ret = null_post_send(ibqp, wr, bad_wr);
    for (; w && (!ret || w != *bad_wr); w = w->next) {
        if (w->opcode != IBV_WR_SEND || *next == *head)
            continue;
        put_recv_cqe(qp, (*next)++);
    }
    return ret;
}

static int null_post_send_echo(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
    return post_send_echo(ibqp, wr, bad_wr, 0);
}

/* null_post_send_echo for a device whose QPs take their receives from an SRQ (null_device_set_echo_srq). */
static int null_post_send_echo_srq(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
    return post_send_echo(ibqp, wr, bad_wr, 1);
}

static int null_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
    struct null_srq *srq = (struct null_srq *)ibsrq;
    for (; wr; wr = wr->next) {
        if (srq->head - srq->tail >= srq->depth) {
            *bad_wr = wr;
            return ENOMEM;
        }
        srq->ring[srq->head++ & srq->mask] = wr->wr_id;
    }
    return 0;
}

static int null_post_recv_echo(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
    struct null_qp *qp = (struct null_qp *)ibqp;
    if (!qp->rring) {
        uint32_t size = pow2_at_least(qp->rdepth ? qp->rdepth : 1);
        qp->rring = calloc(size, sizeof *qp->rring);
        if (!qp->rring) {
            *bad_wr = wr;
            return ENOMEM;
        }
        qp->rmask = size - 1;
    }
    for (; wr; wr = wr->next) {
        if (qp->rhead - qp->rtail >= qp->rdepth) {
            *bad_wr = wr;
            return ENOMEM;
        }
        qp->rring[qp->rhead++ & qp->rmask] = wr->wr_id;
    }
    return 0;
}

/* poll_cq with echo on; `from_srq`: the receives' wr_ids are their SRQ's (a constant in each op below, so that
 * each compiles to its own loop). */
static inline int poll_echo(struct ibv_cq *ibcq, int n, struct ibv_wc *wc, int from_srq)
{
    struct null_cq *cq = (struct null_cq *)ibcq;
    if (cq->overrun) {
        errno = EOVERFLOW;
        return -1;
    }
    int i = 0;
    for (uint32_t tail = cq->tail; i < n && tail != cq->head; i++, tail++) {
        struct null_cqe *c = &cq->ring[tail & cq->mask];
        struct null_qp *qp = (struct null_qp *)((uintptr_t)c->qp & ~RECV_TAG);
        memset(&wc[i], 0, sizeof wc[i]);
        if ((uintptr_t)c->qp & RECV_TAG && from_srq) {
            struct null_srq *srq = qp->srq;
            wc[i].wr_id = srq->ring[c->seq & srq->mask];
            srq->tail = c->seq + 1; /* completed in the order they were posted (the SRQ's receives wait in a FIFO) */
            wc[i].opcode = IBV_WC_RECV;
        } else if ((uintptr_t)c->qp & RECV_TAG) {
            wc[i].wr_id = qp->rring[c->seq & qp->rmask];
            qp->rtail = c->seq + 1;
            wc[i].opcode = IBV_WC_RECV;
        } else {
            struct null_wqe *w = &qp->ring[c->seq & qp->mask];
            qp->tail = c->seq + 1;
            wc[i].wr_id = w->wr_id;
            wc[i].opcode = wc_opcode(w->opcode);
        }
        wc[i].status = IBV_WC_SUCCESS;
        wc[i].qp_num = qp->qp.qp_num;
    }
    cq->tail += (uint32_t)i;
    return i;
}

static int null_poll_cq_echo(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
    return poll_echo(ibcq, n, wc, 0);
}

/* null_poll_cq_echo for a device whose QPs take their receives from an SRQ (null_device_set_echo_srq). */
static int null_poll_cq_echo_srq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
    return poll_echo(ibcq, n, wc, 1);
}

struct null_device *null_device_new(void)
{
    struct null_device *dev = calloc(1, sizeof *dev);
    if (!dev)
        return NULL;
    strcpy(dev->ibdev.name, "sqd_null0");
    strcpy(dev->ibdev.dev_name, "sqd_null0");
    dev->ibdev.node_type = IBV_NODE_CA;
    dev->ibdev.transport_type = IBV_TRANSPORT_IB;
    struct ibv_context *ctx = &dev->vctx.context;
    ctx->device = &dev->ibdev;
    ctx->cmd_fd = -1;
    ctx->async_fd = -1;
    ctx->num_comp_vectors = 1;
    ctx->ops.post_send = null_post_send;
    ctx->ops.post_recv = null_post_recv;
    ctx->ops.poll_cq = null_poll_cq;
    ctx->ops.post_srq_recv = null_post_srq_recv;
    ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
    dev->vctx.sz = sizeof dev->vctx;
    dev->next_qp_num = 0x100;
    return dev;
}

int null_device_free(struct null_device *dev)
{
    if (!dev)
        return 0;
    if (dev->objects)
        return -1;
    free(dev);
    return 0;
}

struct ibv_cq *null_create_cq(struct null_device *dev, int cqe)
{
    if (!dev || cqe < 1 || cqe > (1 << 30))
        return NULL;
    struct null_cq *cq = calloc(1, sizeof *cq);
    uint32_t size = pow2_at_least((uint32_t)cqe);
    struct null_cqe *ring = calloc(size, sizeof *ring);
    if (!cq || !ring) {
        free(cq);
        free(ring);
        return NULL;
    }
    cq->cq.context = &dev->vctx.context;
    cq->cq.cqe = (int)size;
    cq->dev = dev;
    cq->ring = ring;
    cq->mask = size - 1;
    dev->objects++;
    return &cq->cq;
}

int null_destroy_cq(struct ibv_cq *ibcq)
{
    struct null_cq *cq = (struct null_cq *)ibcq;
    dev_of(ibcq->context)->objects--;
    free(cq->ring);
    free(cq);
    return 0;
}

struct ibv_qp *null_create_qp(struct null_device *dev, struct ibv_qp_init_attr *attr)
{
    if (!dev || !attr || !attr->send_cq || attr->send_cq->context != &dev->vctx.context ||
        (attr->recv_cq && attr->recv_cq->context != &dev->vctx.context) || attr->qp_type != IBV_QPT_RC ||
        attr->cap.max_send_wr < 1 || attr->cap.max_send_wr > (1u << 30) ||
        (attr->srq && (attr->srq->context != &dev->vctx.context || !attr->recv_cq)) ||
        (dev->echo && !attr->srq != (dev->echo == ECHO_RQ)))
        return NULL;
    struct null_qp *qp = calloc(1, sizeof *qp);
    uint32_t size = pow2_at_least(attr->cap.max_send_wr);
    struct null_wqe *ring = calloc(size, sizeof *ring);
    if (!qp || !ring) {
        free(qp);
        free(ring);
        return NULL;
    }
    qp->qp.context = &dev->vctx.context;
    qp->qp.send_cq = attr->send_cq;
    qp->qp.recv_cq = attr->recv_cq;
    qp->qp.qp_num = dev->next_qp_num++;
    qp->qp.qp_type = IBV_QPT_RC;
    qp->qp.state = IBV_QPS_RTS;
    qp->qp.qp_context = attr->qp_context;
    qp->dev = dev;
    qp->send_cq = (struct null_cq *)attr->send_cq;
    qp->ring = ring;
    qp->mask = size - 1;
    qp->depth = attr->cap.max_send_wr;
    qp->sig_all = attr->sq_sig_all ? IBV_SEND_SIGNALED : 0;
    qp->recv_cq = (struct null_cq *)attr->recv_cq;
    qp->rdepth = attr->cap.max_recv_wr;
    qp->srq = (struct null_srq *)attr->srq;
    qp->qp.srq = attr->srq;
    dev->objects++;
    return &qp->qp;
}

struct ibv_srq *null_create_srq(struct null_device *dev, struct ibv_srq_init_attr *attr)
{
    if (!dev || !attr || attr->attr.max_wr < 1 || attr->attr.max_wr > (1u << 30))
        return NULL;
    struct null_srq *srq = calloc(1, sizeof *srq);
    uint32_t size = pow2_at_least(attr->attr.max_wr);
    uint64_t *ring = calloc(size, sizeof *ring);
    if (!srq || !ring) {
        free(srq);
        free(ring);
        return NULL;
    }
    srq->srq.context = &dev->vctx.context;
    srq->srq.srq_context = attr->srq_context;
    srq->dev = dev;
    srq->ring = ring;
    srq->mask = size - 1;
    srq->depth = attr->attr.max_wr;
    dev->objects++;
    return &srq->srq;
}

int null_destroy_srq(struct ibv_srq *ibsrq)
{
    struct null_srq *srq = (struct null_srq *)ibsrq;
    srq->dev->objects--;
    free(srq->ring);
    free(srq);
    return 0;
}

int null_qp_deliver(struct ibv_qp *ibqp, unsigned n)
{
    struct null_qp *qp = (struct null_qp *)ibqp;
    if (!qp->recv_cq || !qp->dev->echo || (!qp->srq && !qp->rring))
        return -1;
    unsigned k = 0;
    for (; k < n; k++) {
        if (qp->srq && qp->srq->next != qp->srq->head)
            put_recv_cqe(qp, qp->srq->next++);
        else if (!qp->srq && qp->rnext != qp->rhead)
            put_recv_cqe(qp, qp->rnext++);
        else
            break;
    }
    return (int)k;
}

int null_destroy_qp(struct ibv_qp *ibqp)
{
    struct null_qp *qp = (struct null_qp *)ibqp;
    qp->dev->objects--;
    free(qp->rring);
    free(qp->ring);
    free(qp);
    return 0;
}

void null_device_stats(const struct null_device *dev, struct null_stats *out)
{
    *out = dev->stats;
}

int null_device_set_echo(struct null_device *dev)
{
    if (!dev || dev->objects)
        return -1;
    struct ibv_context *ctx = &dev->vctx.context;
    ctx->ops.post_send = null_post_send_echo;
    ctx->ops.post_recv = null_post_recv_echo;
    ctx->ops.poll_cq = null_poll_cq_echo;
    dev->echo = ECHO_RQ;
    return 0;
}

int null_device_set_echo_srq(struct null_device *dev)
{
    if (!dev || dev->objects)
        return -1;
    struct ibv_context *ctx = &dev->vctx.context;
    ctx->ops.post_send = null_post_send_echo_srq;
    ctx->ops.poll_cq = null_poll_cq_echo_srq;
    dev->echo = ECHO_SRQ;
    return 0;
}
