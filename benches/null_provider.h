/* A null verbs provider for the benchmarks: a device that costs a few instructions per WR, so that what a
 * benchmark measures on it is the poster's own work (the library, the ULP's loop), not the HCA's.
 *
 * It is built the way a provider outside the project would be: a `struct verbs_context` whose ops table holds
 * post_send, post_recv and poll_cq, reached by libibverbs' inline ibv_post_send()/ibv_poll_cq() through
 * `qp->context->ops` and `cq->context->ops`. Its objects are plain `struct ibv_qp`/`struct ibv_cq` with the
 * fields a consumer reads filled in (context, qp_num, qp_type, state, send_cq, recv_cq, cqe).
 *
 * Behaviour (one RC QP is an SQ ring of max_send_wr slots, one CQ a ring of cqe entries):
 *   post_send  per WR: refuses with ENOMEM when every SQ slot is taken (a WQE holds its slot until a CQE at or
 *              after it is polled, so a poster that never signals runs out: a moderation bug shows); else
 *              records the WQE (wr_id, opcode) in its slot and, when it is signaled (IBV_SEND_SIGNALED or
 *              sq_sig_all), appends a CQE to the send CQ at once. The WQE is complete when posted; nothing is
 *              transferred and the SGEs are not read (nor is num_sge checked against max_send_sge).
 *   post_recv  accepts and drops receives (no receive completions are ever made).
 *   post_srq_recv  keeps receives in the SRQ (ENOMEM past its max_wr); only echo completes them.
 * With echo on (null_device_set_echo, a host's loop), the device has ops of its own: post_recv keeps receives
 * (ENOMEM past max_recv_wr), and every SEND WQE a post_send accepts completes the oldest waiting receive of its
 * QP at once, with a receive CQE (IBV_WC_RECV, the receive's wr_id) on the QP's recv CQ, as the peer's response
 * would; poll_cq returns both kinds. The plain ops are untouched by it. With echo on for SRQs
 * (null_device_set_echo_srq, a target's loop), the same with every QP of the device made on an SRQ, whose
 * oldest waiting receive a SEND completes.
 *   poll_cq    pops up to n CQEs into ibv_wc (status IBV_WC_SUCCESS, the WQE's wr_id, opcode, qp_num); a CQE
 *              frees every SQ slot of its QP up to and including its WQE.
 * A CQ overrun (a signaled WQE with the CQ full) makes every later poll_cq return -1 (errno EOVERFLOW).
 * Not thread-safe: one thread per device. */

#ifndef SQD_BENCH_NULL_PROVIDER_H
#define SQD_BENCH_NULL_PROVIDER_H

#include <infiniband/verbs.h>
#include <stdint.h>

struct null_device;

/* Counters over the device's life (the bench subtracts two snapshots). */
struct null_stats {
    uint64_t wqes;      /* WQEs accepted by post_send */
    uint64_t cqes;      /* CQEs made (signaled WQEs) */
    uint64_t doorbells; /* post_send calls that accepted at least one WQE */
    uint64_t refused;   /* post_send calls refused (ENOMEM: no free SQ slot) */
};

/* NULL on allocation failure. */
struct null_device *null_device_new(void);
/* Frees the device; its CQs and QPs must be destroyed first (returns -1 otherwise, and frees nothing). */
int null_device_free(struct null_device *dev);

/* A CQ of `cqe` entries (>= 1), rounded up to a power of two as providers do; NULL on bad input or no memory. */
struct ibv_cq *null_create_cq(struct null_device *dev, int cqe);
int null_destroy_cq(struct ibv_cq *cq);

/* An RC QP in RTS (there is no connection to make). attr->send_cq must be a CQ of this device, attr->recv_cq
 * one of this device or NULL; attr->cap is granted as asked (max_send_wr >= 1). */
struct ibv_qp *null_create_qp(struct null_device *dev, struct ibv_qp_init_attr *attr);
int null_destroy_qp(struct ibv_qp *qp);

/* A shared receive queue of attr->attr.max_wr (>= 1) receives; NULL on bad input or no memory. A QP made with
 * it (attr->srq, and a recv_cq) takes its receives from it. */
struct ibv_srq *null_create_srq(struct null_device *dev, struct ibv_srq_init_attr *attr);
int null_destroy_srq(struct ibv_srq *srq);

/* With echo on: completes up to n of the QP's waiting receives (its SRQ's, if it has one) as if the peer had
 * sent n messages, as a target's first capsules arrive. How many it completed, or -1 (echo off, no receives). */
int null_qp_deliver(struct ibv_qp *qp, unsigned n);

void null_device_stats(const struct null_device *dev, struct null_stats *out);

/* Turns echo on (see above) for a device with no CQ or QP yet; with it, QPs are made without an SRQ. 0, or -1. */
int null_device_set_echo(struct null_device *dev);
/* Turns echo on for a device with no CQ or QP yet whose QPs are all made on an SRQ. 0, or -1. */
int null_device_set_echo_srq(struct null_device *dev);

#endif
