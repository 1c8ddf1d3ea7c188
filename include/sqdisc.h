#ifndef SQDISC_H
#define SQDISC_H

/* Generated from the library's sources by `make header`; do not edit by hand. */

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>

/** The version of the headers: compare with sqd_version() for the library actually loaded. */
#define SQD_VERSION "0.3.0"
#define SQD_VERSION_MAJOR 0
#define SQD_VERSION_MINOR 3
#define SQD_VERSION_PATCH 0

/**
 * The WR was retired by a later signaled completion, not a CQE of its own.
 */
#define SQD_COMPLETION_IMPLIED 1

/**
 * The WR was never executed: a send WR still in the backlog when the queue failed or drained, or a receive
 * `sqd_srq_release_all` took back (status `IBV_WC_WR_FLUSH_ERR`); or a send WR the provider's `post_send`
 * refused (with `SQD_COMPLETION_REFUSED`).
 */
#define SQD_COMPLETION_NEVER_POSTED 2

/**
 * The WR was a receive (posted with `sqd_post_recv`).
 */
#define SQD_COMPLETION_RECV 4

/**
 * A receive whose sender invalidated `invalidated_rkey` (SEND_WITH_INV): skip your own LocalInv of it.
 */
#define SQD_COMPLETION_REMOTE_INV 8

/**
 * Buffer verification (`SQD_QUEUE_VERIFY_BUFFERS`) found bytes of SGE `modified_sge` changed between the post
 * and the release: the ULP wrote into a buffer the HCA could still read.
 */
#define SQD_COMPLETION_BUFFER_MODIFIED 16

/**
 * The queue accepted the WR, but the provider's `post_send` refused it when the library posted it (from the
 * backlog, or a deferred LocalInv at its barrier): it never reached the HCA (`SQD_COMPLETION_NEVER_POSTED` is
 * set too), `status` is `IBV_WC_LOC_QP_OP_ERR` and `vendor_err` holds the provider's errno. The queue stays
 * open and the WRs behind it are posted; `sqd_queue_stats` counts it and `sqd_queue_last_refusal` describes it.
 */
#define SQD_COMPLETION_REFUSED 32

/**
 * `sqd_cq_out_of_order.flags`: `wr_id` is the WR's own, as the ULP gave it (its index on a queue with
 * `SQD_QUEUE_INDEXED`); without it, the WQE was the library's own (a marker or a LocalInv) or is no longer
 * known, and `wr_id` is the value the completion carried.
 */
#define SQD_OUT_OF_ORDER_ULP_WR 1

/**
 * `sqd_cq_out_of_order.flags`: `sqd_cq_poll` showed the completion, with the WR's own wr_id.
 */
#define SQD_OUT_OF_ORDER_SHOWN 2

/**
 * `sqd_cq_new_ex` flag: any thread may post to the CQ's queues (and free, defer, drain...) while one thread
 * polls. Every call on the CQ or on its queues then holds the CQ's lock; release callbacks run under it and may
 * call the API on the same CQ again (the lock is reentrant), but must not wait for another thread that uses
 * the CQ. Queues on a thread-safe CQ have their sends and receives on that one CQ.
 *
 * In event mode the poller may sleep on the channel while other threads post: a post made after
 * `sqd_cq_arm` and before the next `sqd_cq_poll` that leaves an unsignaled tail covers it at once with a
 * signaled marker, so its WRs still produce a completion that raises the event (see `sqd_cq_arm`).
 */
#define SQD_CQ_THREAD_SAFE 1

/**
 * `sqd_queue_attr.flags`: checksum every SGE a SEND or RDMA WRITE reads (not inline data) when the WR is
 * accepted and again at its release; a difference sets `SQD_COMPLETION_BUFFER_MODIFIED` and `modified_sge` in
 * the release and counts in `sqd_queue_stats.verify_mismatches`. The bytes must stay readable until the
 * release. Costs about a cycle per byte twice; for debug and canary builds.
 */
#define SQD_QUEUE_VERIFY_BUFFERS 1

/**
 * `sqd_queue_attr.flags`: `sqd_post_send` may leave the WRs it posted as it posted them instead of restoring
 * them before it returns. After a successful call their `wr_id` and `send_flags` are unspecified (the library's
 * token, and `IBV_SEND_SIGNALED` where the signal policy added it); after a failed one, the same holds for the
 * WRs before `*bad_wr`, while `*bad_wr` and the WRs after it are as you passed them. `next` is always as you
 * passed it. For ULPs that fill `wr_id` and `send_flags` of every WR before each post; it saves the walk that
 * restores the chain (about 10 instructions per WR). Releases and completions carry your wr_ids either way.
 */
#define SQD_QUEUE_NO_RESTORE 2

/**
 * `sqd_queue_attr.flags`: the queue names each send WR by its index instead of its wr_id. A WR's index is how
 * many send WRs the queue accepted before it: 0 for the first, and a call that accepts k WRs gives them the
 * next k (on failure, the WRs before `*bad_wr`); `sqd_invalidate` takes none. Each WR is released exactly once
 * and in post order, so the n-th send release of the queue is always the WR of index n. The queue neither
 * keeps nor restores your wr_ids: a release's `wr_id`, the `wr_id` of a send completion `sqd_cq_poll` returns
 * (a WR you signaled, or an error) and `sqd_release_batch.first` are indexes, and a batch's `wr_ids` is NULL.
 * For ULPs that keep their per-WR state in post order (a ring indexed by the index modulo its size, say): it
 * saves storing each wr_id and handing it back (about 6 instructions per WR with batched releases) and the
 * batch array (`sqd_queue_set_release_batch`). Implies `SQD_QUEUE_NO_RESTORE`, and more: after a call of
 * `sqd_post_send`, the `wr_id` of every WR it was handed is unspecified, the WRs not accepted included.
 */
#define SQD_QUEUE_INDEXED 4

/**
 * `sqd_invalidate` flag: post the LocalInv at once with `IBV_SEND_FENCE` (the Local Invalidate Fence), for
 * devices that honour it, instead of waiting for a completion that covers the earlier WRs.
 */
#define SQD_INVALIDATE_FENCE 1

/**
 * A managed completion queue: an `ibv_cq` taken under management by `sqd_cq_new` or `sqd_cq_new_ex`, freed
 * by `sqd_cq_free`.
 *
 * Threads: made without `SQD_CQ_THREAD_SAFE`, the CQ and the queues on it are used from one thread at a time
 * and nothing is locked; made with it, any thread may use them, each call holding the CQ's lock.
 */
struct sqd_cq;

/**
 * The managed send queue (and optionally receive queue) of one RC QP, made by `sqd_queue_new` and freed by
 * `sqd_queue_free`.
 *
 * Threads: as its CQs (`SQD_CQ_THREAD_SAFE`). It is freed only when nothing of it is outstanding
 * (`sqd_queue_free`), since WRs still outstanding would then complete as strays.
 */
struct sqd_queue;

/**
 * An `ibv_srq` under management, made by `sqd_srq_new` and freed by `sqd_srq_free`.
 *
 * Its receives are released (through its own release handler, flag `SQD_COMPLETION_RECV`) when their own
 * completion is reaped on any managed CQ where a queue attached to it completes receives. Threads: used by
 * the thread that polls the CQs of its queues, which are never `SQD_CQ_THREAD_SAFE` ones (`sqd_queue_new`
 * refuses an SRQ there).
 */
struct sqd_srq;

/**
 * Counters of a managed CQ (`struct sqd_cq_stats` in C).
 */
struct sqd_cq_stats {
    /**
     * CQEs the provider granted: `cq->cqe` at `sqd_cq_new`, re-read by `sqd_cq_update_capacity`.
     */
    uint64_t capacity;
    /**
     * CQEs reserved by the attached queues' worst cases.
     */
    uint64_t reserved;
    /**
     * Queues attached (a queue whose sends and receives both complete here counts once).
     */
    uint32_t queues;
    uint32_t _reserved0;
    /**
     * Calls to `sqd_cq_poll`.
     */
    uint64_t polls;
    /**
     * CQEs reaped from the provider.
     */
    uint64_t cqes;
    /**
     * Work completions handed to the ULP.
     */
    uint64_t visible;
    /**
     * CQEs the library added (moderation, markers) and did not show.
     */
    uint64_t hidden;
    /**
     * CQEs of QPs not managed on this CQ, returned unchanged.
     */
    uint64_t passthrough;
    /**
     * CQEs of a managed QP that match no outstanding WR: dropped and counted. A provider or ULP bug, or a
     * completion that arrived for a queue freed after an asynchronous event released its WRs.
     */
    uint64_t stray;
    /**
     * Idle-tail markers posted by `sqd_cq_poll`.
     */
    uint64_t tail_markers;
};

/**
 * Completions that came out of RC order (`struct sqd_cq_out_of_order` in C): each names a send WQE that the
 * completion of a later WQE of its QP had already retired, which no RC QP may do. `count` and `shown` count
 * them all; the other fields describe the first one.
 */
struct sqd_cq_out_of_order {
    /**
     * Such completions so far (0: none, and the other fields are 0).
     */
    uint64_t count;
    /**
     * Of those, the ones `sqd_cq_poll` showed: completions of WRs the ULP signaled, each shown once.
     */
    uint64_t shown;
    /**
     * The first one's WQE: its position among the WQEs its queue posted (0 for the first; the library's own
     * markers and LocalInvs count too).
     */
    uint64_t wqe;
    /**
     * The first one's wr_id: the WR's own with `SQD_OUT_OF_ORDER_ULP_WR`, else the value the completion
     * carried (the library's token).
     */
    uint64_t wr_id;
    /**
     * The first one's QP number.
     */
    uint32_t qp_num;
    /**
     * The first one's `enum ibv_wc_opcode`, as the completion carried it.
     */
    uint32_t opcode;
    /**
     * The first one's `enum ibv_wc_status`.
     */
    uint32_t status;
    /**
     * The first one's vendor error (0 for a success).
     */
    uint32_t vendor_err;
    /**
     * `SQD_OUT_OF_ORDER_*` bits, of the first one.
     */
    uint32_t flags;
    uint32_t _reserved0;
};

/**
 * The state of a CQ's backlog pool, where the queues whose sends complete on the CQ park WRs (`struct
 * sqd_backlog_pool_stats` in C).
 */
struct sqd_backlog_pool_stats {
    /**
     * The most WRs the queues whose sends complete on the CQ may park at once, all together, as set by
     * `sqd_cq_set_backlog_limit`; 0 (the default): no limit but each queue's own `backlog_depth`.
     */
    uint32_t limit;
    /**
     * WRs parked now, all queues together.
     */
    uint32_t parked;
    /**
     * Most WRs parked at once.
     */
    uint64_t peak;
    /**
     * WRs the pool has storage for now, all shapes together.
     */
    uint64_t capacity;
    /**
     * The sum of the `backlog_depth` of the queues whose sends complete on the CQ.
     */
    uint64_t demand;
    /**
     * Bytes of the pool's storage: per WR it has room for, a WR record, `max_send_sge` SGEs (at least one) and
     * `max_inline_data` bytes of the queues of its shape. The queue whose creation made the pool grow counts
     * the growth in its `sqd_queue_stats.bytes` too.
     */
    uint64_t bytes;
    /**
     * WRs refused with `-EAGAIN` because the limit was reached (their queue's own backlog had room).
     */
    uint64_t exhausted;
    /**
     * Distinct shapes (`max_send_sge`, `max_inline_data`) of the queues using the pool: each has its storage.
     */
    uint32_t shapes;
    uint32_t _reserved0;
};

/**
 * One queue of a plan for `sqd_cq_depth_for` and `sqd_cq_depth_for_srqs` (`struct sqd_queue_plan`).
 */
struct sqd_queue_plan {
    /**
     * The queue's sq_depth, if its sends complete on the CQ; else 0.
     */
    uint32_t sq_depth;
    /**
     * The queue's rq_depth, if its receives complete on the CQ; else 0 (also for a queue that receives
     * through an SRQ: `sqd_cq_depth_for_srqs` counts the SRQ).
     */
    uint32_t rq_depth;
};

/**
 * The release of one WR (`struct sqd_completion` in C).
 *
 * After its release, and not before, the ULP may reuse the WR's buffers, lkeys and MRs.
 */
struct sqd_completion {
    /**
     * The ULP's own wr_id; for a send WR of a queue made with `SQD_QUEUE_INDEXED`, its index (how many send WRs
     * the queue accepted before it).
     */
    uint64_t wr_id;
    /**
     * An `enum ibv_wc_status` value: `IBV_WC_SUCCESS`, the error of the WR's CQE, `IBV_WC_WR_FLUSH_ERR`, or
     * `IBV_WC_LOC_QP_OP_ERR` for a WR the provider refused (`SQD_COMPLETION_REFUSED`).
     */
    uint32_t status;
    /**
     * An `enum ibv_wc_opcode` value taken from the WR as posted (valid even on error); for receives, the CQE's
     * opcode on success and `IBV_WC_RECV` otherwise.
     */
    uint32_t opcode;
    /**
     * The vendor error of the WR's own error CQE; with `SQD_COMPLETION_REFUSED`, the provider's errno; else 0.
     */
    uint32_t vendor_err;
    /**
     * `SQD_COMPLETION_*` bits.
     */
    uint32_t flags;
    /**
     * With `SQD_COMPLETION_REMOTE_INV`: the rkey the sender's SEND_WITH_INV invalidated (no LocalInv of it is
     * needed any more).
     */
    uint32_t invalidated_rkey;
    /**
     * With `SQD_COMPLETION_BUFFER_MODIFIED`: the index of the first SGE whose bytes changed while in flight.
     */
    uint32_t modified_sge;
};

/**
 * A release callback: `c` is valid only during the call and is read-only (the library fills the same completion
 * again for the next release: copy what you keep). It runs on the thread that polls (or posts, defers or
 * drains) and may call the API again, including posting on the same queue.
 */
typedef void (*sqd_release_fn)(void *ctx, const struct sqd_completion *c);

/**
 * How to manage a QP (`struct sqd_queue_attr`). Depths are what the QP was actually granted: read the caps
 * back from `ibv_create_qp`'s `init_attr.cap`.
 */
struct sqd_queue_attr {
    /**
     * The QP's `max_send_wr`: the library never lets the provider hold more WQEs. 1..=1048576.
     */
    uint32_t sq_depth;
    /**
     * The QP's `max_send_sge`: WRs with more SGEs are refused (`-EINVAL`). At most 1024.
     */
    uint32_t max_send_sge;
    /**
     * The QP's `max_inline_data`: inline WRs carrying more are refused (`-EINVAL`). At most 65536.
     */
    uint32_t max_inline_data;
    /**
     * The QP's `max_recv_wr` when its receives complete on a managed CQ (`recv_cq`), else 0. At most 1048576.
     */
    uint32_t rq_depth;
    /**
     * At most `signal_interval - 1` unsignaled WRs in a row; 0 picks `max(1, sq_depth / 4)`, which is 1 (every
     * WR signaled, as with an explicit 1) below an `sq_depth` of 8. At most sq_depth.
     */
    uint32_t signal_interval;
    /**
     * How many WRs may wait in the software backlog when the SQ has no free slot; 0 makes such posts fail
     * with `-EAGAIN`. At most 1048576. The copies of the waiting WRs are kept in the send CQ's backlog pool,
     * shared by the queues whose sends complete on it (see `sqd_cq_set_backlog_limit`); this depth is the
     * queue's own cap.
     */
    uint32_t backlog_depth;
    /**
     * Called once per accepted WR (and receive), in post order, when its resources may be reused. May be NULL.
     */
    sqd_release_fn release;
    /**
     * Passed to `release`.
     */
    void *release_ctx;
    /**
     * `SQD_QUEUE_*` bits; unknown bits are refused (`-EINVAL`).
     */
    uint32_t flags;
    /**
     * The managed SRQ the QP receives from (`qp->srq`), or NULL. With an SRQ, `recv_cq` must be the QP's
     * receive CQ and `rq_depth` 0; receives are posted with `sqd_srq_post_recv`.
     */
    struct sqd_srq *srq;
};

/**
 * Send WRs released together (`struct sqd_release_batch`, see `sqd_queue_set_release_batch`): WRs the ULP
 * posted, retired one after the other with the same status and vendor error. After its release, and not before,
 * the ULP may reuse each WR's buffers, lkeys and MRs.
 */
struct sqd_release_batch {
    /**
     * The WRs' own wr_ids, oldest first (`count` of them), valid only during the call; NULL on a queue with
     * `SQD_QUEUE_INDEXED`, which names them by their indexes, `first` to `first + count - 1`.
     */
    const uint64_t *wr_ids;
    /**
     * How many WRs the batch releases: at least 1.
     */
    uint32_t count;
    /**
     * An `enum ibv_wc_status` value, the same for each WR: `IBV_WC_SUCCESS`, the error of a WR's own CQE, or
     * `IBV_WC_WR_FLUSH_ERR`.
     */
    uint32_t status;
    /**
     * The vendor error of the WRs' error CQE, else 0.
     */
    uint32_t vendor_err;
    /**
     * The index of the batch's first WR: how many send WRs the queue accepted before it (the others follow it
     * in order; see `SQD_QUEUE_INDEXED`).
     */
    uint64_t first;
};

/**
 * A batch release callback (see `sqd_queue_set_release_batch`): `b` and its `wr_ids` are valid only during the
 * call and are read-only. It runs where a release callback would, and may call the API again as one may.
 */
typedef void (*sqd_release_batch_fn)(void *ctx, const struct sqd_release_batch *b);

/**
 * A deferred action (see `sqd_defer`).
 */
typedef void (*sqd_defer_fn)(void *ctx);

/**
 * Counters and state of a queue (`struct sqd_queue_stats` in C).
 */
struct sqd_queue_stats {
    /**
     * Send WRs accepted (posted or parked): the ULP's, and the LocalInv of each `sqd_invalidate` once it was
     * posted or parked (not the library's markers). A LocalInv's release goes to its `done` callback, not to
     * the queue's `release`; one cancelled before it was posted or parked (a drain, a failed queue, a
     * provider refusal) counts in neither counter.
     */
    uint64_t accepted;
    /**
     * Send WRs released, counted as `accepted` is.
     */
    uint64_t released;
    /**
     * WQEs handed to the provider, markers included.
     */
    uint64_t wqes;
    /**
     * Provider post_send calls.
     */
    uint64_t doorbells;
    /**
     * WQEs signaled because the ULP asked.
     */
    uint64_t signaled_by_ulp;
    /**
     * WQEs signaled by the moderation policy (interval or last free slot).
     */
    uint64_t signaled_by_policy;
    /**
     * Zero-length signaled markers posted to cover an idle unsignaled tail, a drain, or the unsignaled tail
     * of a post made while the send CQ is armed (`sqd_cq_arm`).
     */
    uint64_t markers;
    /**
     * Send CQEs reaped.
     */
    uint64_t send_cqes;
    /**
     * WRs that went through the backlog.
     */
    uint64_t parked;
    /**
     * WRs refused with EAGAIN (no credit, backlog full).
     */
    uint64_t refused;
    /**
     * Most WRs in the backlog at once.
     */
    uint64_t backlog_peak;
    /**
     * Receives posted.
     */
    uint64_t recv_posted;
    /**
     * Receive CQEs reaped.
     */
    uint64_t recv_cqes;
    /**
     * CQEs of this QP that matched no outstanding WR.
     */
    uint64_t stray_cqes;
    /**
     * CQEs that arrived after an async event made the queue release everything: swallowed.
     */
    uint64_t late_cqes;
    /**
     * WQEs the provider holds now (no CQE polled at or after them yet).
     */
    uint32_t in_provider;
    /**
     * Free SQ slots now.
     */
    uint32_t credits;
    /**
     * WRs in the backlog now.
     */
    uint32_t backlog;
    /**
     * Receives posted and not yet released.
     */
    uint32_t recv_outstanding;
    /**
     * Deferred actions waiting.
     */
    uint32_t deferred;
    /**
     * The signal interval in force.
     */
    uint32_t signal_interval;
    /**
     * The `ibv_wc_status` that failed the queue, else 0: that of the first error completion of its sends whose
     * status is not `IBV_WC_WR_FLUSH_ERR` (kept even if a device reaped flushes before it). It is
     * `IBV_WC_WR_FLUSH_ERR` only while no other error status has been reaped: the QP was moved to the error
     * state from outside, or an async event failed the queue (the completions reaped after that are
     * swallowed and change nothing). The failing WR may be one of the library's own (an idle-tail or drain
     * marker, or a deferred LocalInv), whose completion `sqd_cq_poll` never shows: the ULP's WRs before it
     * then release as successful (its completion proves they finished), those after it with
     * `IBV_WC_WR_FLUSH_ERR`, no completion the ULP sees carries the error, and this field and
     * `failed_vendor_err` are where the cause shows.
     */
    uint32_t failed_status;
    /**
     * 1 when the queue takes no more WRs (failed or draining).
     */
    uint32_t closed;
    /**
     * MRs tracked precisely now (`sqd_queue_track_mr`); one handed to `sqd_defer_dereg_mr` counts until its
     * deregistration has run.
     */
    uint32_t tracked_mrs;
    /**
     * The `vendor_err` of the completion whose status `failed_status` holds (0 when it had none, or when an
     * async event failed the queue). It sits in what was padding before it, so the struct's size and the
     * offsets of the other fields are those of earlier versions.
     */
    uint32_t failed_vendor_err;
    /**
     * Deferred deregistrations or deallocations that failed.
     */
    uint64_t teardown_failures;
    /**
     * Releases whose buffers verification found modified (`SQD_COMPLETION_BUFFER_MODIFIED`).
     */
    uint64_t verify_mismatches;
    /**
     * Bytes the queue allocated at creation: its own storage (fixed part, 16 bytes per slot rounded to a power
     * of two, verification storage) and what its creation added to its send CQ's backlog pool, where its WRs
     * park (room for `backlog_depth` WRs of its shape when the pool had none to spare; nothing when the pool
     * already had the room, as for a queue joining a CQ whose `sqd_cq_set_backlog_limit` storage exists). The
     * pool's storage as a whole is in `sqd_backlog_pool_stats.bytes`. Not counted: what grows later with use,
     * namely pending invalidations (`sqd_invalidate`), deferred actions and tracked MRs.
     */
    uint64_t bytes;
    /**
     * Accepted WRs the provider's `post_send` refused when the library posted them (from the backlog, or a
     * deferred LocalInv): each was released with `SQD_COMPLETION_REFUSED`.
     */
    uint64_t provider_refused;
    /**
     * The provider's errno of the newest such refusal, or of the newest refused marker, else 0
     * (`sqd_queue_last_refusal` describes it).
     */
    uint32_t provider_refused_errno;
    /**
     * The library's idle-tail markers the provider's `post_send` refused. The tail stays watched, and each
     * later poll cycle of the send CQ tries the marker again until one is taken (or the ULP posts a signaled
     * WR behind the tail).
     */
    uint32_t markers_refused;
};

/**
 * Called when the number of posted receives of an SRQ drops below its low watermark: post more.
 */
typedef void (*sqd_srq_low_fn)(void *ctx, uint32_t posted);

/**
 * How to manage an SRQ (`struct sqd_srq_attr`).
 */
struct sqd_srq_attr {
    /**
     * The SRQ's granted `max_wr` (read it back from `ibv_create_srq`'s `attr.max_wr`). 1..=1048576.
     */
    uint32_t depth;
    /**
     * `low` runs (from `sqd_cq_poll`) each time the posted receives drop below this; 0: never.
     */
    uint32_t low_watermark;
    /**
     * Called once per receive, when its completion has been reaped (or it is released without one, by
     * `sqd_srq_release_all`): its buffer may be reused. Receives complete in any order. May be NULL.
     */
    sqd_release_fn release;
    void *release_ctx;
    sqd_srq_low_fn low;
    void *low_ctx;
    /**
     * Reserved: must be 0.
     */
    uint32_t flags;
};

/**
 * Counters of a managed SRQ (`struct sqd_srq_stats` in C).
 */
struct sqd_srq_stats {
    /**
     * The SRQ's depth (its granted `max_wr`).
     */
    uint32_t depth;
    /**
     * Receives posted and not yet released.
     */
    uint32_t posted;
    /**
     * Receives ever posted.
     */
    uint64_t total_posted;
    /**
     * Receive CQEs reaped.
     */
    uint64_t cqes;
    /**
     * CQEs naming no posted receive (dropped and counted).
     */
    uint64_t stray_cqes;
    /**
     * Queues attached.
     */
    uint32_t queues;
    /**
     * Times the low-watermark callback ran.
     */
    uint32_t low_events;
};

/**
 * A software device's answers to the calls libibverbs would make through private driver ops, and its
 * interest in the objects the library holds. Every function pointer may be NULL; each gets `device` as its
 * first argument. Register it with `sqd_device_register`.
 */
struct sqd_device_ops {
    /**
     * `sizeof(struct sqd_device_ops)` as the registering program was compiled: later versions of the library
     * may add members at the end and read only the first `size` bytes.
     */
    size_t size;
    /**
     * Passed back, unchanged, as the first argument of every function below.
     */
    void *device;
    /**
     * Deregisters `mr`, an MR of the device, when the library runs a deferred deregistration
     * (`sqd_defer_dereg_mr`); 0 or a positive errno, as `ibv_dereg_mr` returns. NULL: such deregistrations
     * fail with `EOPNOTSUPP`.
     */
    int (*dereg_mr)(void *device, struct ibv_mr *mr);
    /**
     * Creates an SRQ on `pd`, a PD of the device, as `ibv_create_srq` does (the granted attributes written back
     * to `attr`): stores it in `*srq` and returns 0, or returns a positive errno. Called where the library makes
     * an SRQ itself (the SPDK provider does, for SPDK). NULL: such creations fail with `EOPNOTSUPP`.
     */
    int (*create_srq)(void *device, struct ibv_pd *pd, struct ibv_srq_init_attr *attr, struct ibv_srq **srq);
    /**
     * Destroys `srq`, made by `create_srq`; 0 or a positive errno. NULL: `EOPNOTSUPP`.
     */
    int (*destroy_srq)(void *device, struct ibv_srq *srq);
    /**
     * A library handle (`sqd_cq`, `sqd_queue`, `sqd_srq`) now holds `object`, a `struct ibv_cq`, `ibv_qp` or
     * `ibv_srq` of the device; the same object may be held by several handles at once, each announced. 0, or a
     * positive errno that makes the handle's creation fail with it. Set together with `release`, or neither.
     */
    int (*hold)(void *device, void *object);
    /**
     * A handle that `hold` announced for `object` is gone; called once per successful `hold`, also after the
     * device was unregistered.
     */
    void (*release)(void *device, void *object);
};

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * Takes `cq` under management and stores the new handle in `*out`: `sqd_cq_new_ex` with no flags.
 */
int32_t sqd_cq_new(struct ibv_cq *cq, struct sqd_cq **out);

/**
 * Takes `cq` under management and stores the new handle in `*out`.
 *
 * The capacity is `cq->cqe`, the depth the provider granted. Queues attached to the CQ reserve their worst
 * case on it (see `sqd_queue_new`); CQEs of QPs that are not managed on it are passed through unchanged.
 *
 * Ownership: `cq` stays the caller's and must outlive the handle; free the handle with `sqd_cq_free` before
 * destroying `cq`. Thread safety: by default a `struct sqd_cq` and the queues on it are used from one thread
 * at a time (the poll-group model) and nothing is locked; with `SQD_CQ_THREAD_SAFE` any thread may use them.
 *
 * Returns 0, or `-EINVAL` (NULL argument, unknown flags, a CQ without a provider context or `poll_cq` op,
 * `cqe <= 0`), `-ENOMEM` (the handle could not be allocated; `sqd_last_error()` names the bytes).
 */
int32_t sqd_cq_new_ex(struct ibv_cq *cq, uint32_t flags, struct sqd_cq **out);

/**
 * Frees a handle made by `sqd_cq_new` (not the `ibv_cq` under it). NULL is a no-op (returns 0).
 *
 * Returns 0, or `-EBUSY` (with a message in `sqd_last_error()`) while queues are attached (free them first,
 * in any order) or when called from a callback run by this CQ's poll; the handle then stays valid. Free it
 * before destroying its `ibv_cq`: the library's own devices (`sqd_scripted_destroy_cq`, `sqd_sim_destroy_cq`)
 * refuse with `-EBUSY` until then, a real provider cannot tell.
 */
int32_t sqd_cq_free(struct sqd_cq *cq);

/**
 * Polls up to `max` work completions into `wc` and returns how many it stored (0 when there are none).
 *
 * They are exactly the completions raw verbs would have given the ULP for the WRs it posted through its
 * queues: receive completions, send completions of WRs posted with `IBV_SEND_SIGNALED`, and every error or
 * flush completion, each with the ULP's own `wr_id` (a send's index on a queue made with `SQD_QUEUE_INDEXED`;
 * on error completions only `wr_id`, `status`, `qp_num` and `vendor_err` are valid, as in verbs). Completions
 * the library added for moderation are not shown.
 *
 * Meanwhile it runs the release callbacks and deferred actions the reaped CQEs make due (in post order per
 * queue), posts backlogged WRs as credits return, and covers idle unsignaled tails: a queue that has an
 * unsignaled tail and receives no post during one whole poll cycle gets a signaled zero-length RDMA WRITE.
 * So every WR is covered by a signaled WQE, without further posts, no later than the end of the second
 * `sqd_cq_poll` after it reached the SQ (in the post call, or in the poll that moved it from the backlog), or
 * at once by `sqd_cq_arm` or, while the CQ is armed, by its post call, and is released when that WQE's CQE is
 * polled.
 *
 * A provider that completes a QP's send WQEs out of RC order breaks what the library builds on: the CQE of a
 * WQE retires every earlier WQE of its QP, and those WRs are released then. When a CQE then arrives for such
 * an earlier WQE (its own completion came after a later one's), the library shows it with the WR's `wr_id` if
 * you signaled that WR and its completion was not shown before, since that is the completion you wait for;
 * otherwise it drops it (counted in `sqd_cq_stats.stray` and `sqd_queue_stats.stray_cqes`). An error status
 * fails the queue, as any error completion does. It counts every such completion and keeps the first one's
 * QP number, WQE, `wr_id`, opcode and status in `sqd_cq_out_of_order`, described once in
 * `sqd_cq_out_of_order_message`. The WR was already released when the later completion came: on such a
 * provider a release does not prove the HCA is done with the WR's buffers.
 *
 * Callbacks may post, defer and poll other CQs; calling `sqd_cq_poll` on this same CQ from one of them
 * returns `-EBUSY`. One call reaps at most a full CQ (its capacity) of CQEs beyond `max`, so callbacks that
 * keep posting cannot hold it forever: it may then return fewer than `max` while CQEs remain (poll again).
 * Every CQE present when the call began is reaped, so `sqd_cq_arm` returning 0 still means nothing was missed.
 *
 * Returns the count (>= 0), or `-EINVAL` (NULL `cq`, `max < 0`, NULL `wc` with `max > 0`), `-EBUSY`
 * (re-entered), `-EIO` (the provider's poll failed: the CQ is in error).
 */
int32_t sqd_cq_poll(struct sqd_cq *cq,
                    int32_t max,
                    struct ibv_wc *wc);

/**
 * Call after `ibv_resize_cq` on a managed CQ: the library re-reads the capacity the provider now reports
 * (`cq->cqe`) and checks queues attached from now on against it.
 *
 * Returns 0, or `-EINVAL` (NULL `cq`), `-ENOSPC` when the CQ was shrunk below what its attached queues
 * reserve (the new capacity is in force: a flush of them all could overrun it; `sqd_last_error()` names the
 * numbers).
 */
int32_t sqd_cq_update_capacity(const struct sqd_cq *cq);

/**
 * Copies the CQ's counters into `*out`. Returns 0 or `-EINVAL` (NULL argument).
 */
int32_t sqd_cq_stats(const struct sqd_cq *cq, struct sqd_cq_stats *out);

/**
 * Copies into `*out` how many completions of the CQ's queues came out of RC order (see `sqd_cq_poll`) and
 * what the first one was: its QP number, WQE, `wr_id`, opcode, status and `SQD_OUT_OF_ORDER_*` flags. All
 * zero while none did. Returns 0 or `-EINVAL` (NULL argument).
 */
int32_t sqd_cq_out_of_order(const struct sqd_cq *cq, struct sqd_cq_out_of_order *out);

/**
 * Copies the description of the CQ's first completion out of RC order (see `sqd_cq_poll`: which QP and WQE,
 * and what the library did with it) into `buf`, as a NUL-terminated string cut to `len - 1` bytes; nothing is
 * written when `len` is 0. The description stays that of the first one; `sqd_cq_out_of_order` counts them.
 *
 * Returns the length of the whole description (without the NUL; 0 and an empty string while none came out of
 * order), or `-EINVAL` (NULL `cq`, NULL `buf` with `len` > 0).
 */
int32_t sqd_cq_out_of_order_message(const struct sqd_cq *cq, char *buf, size_t len);

/**
 * Limits the WRs that the queues whose sends complete on `cq` may park at once, all together, to `max_parked`
 * (0, the default: no limit but each queue's own `backlog_depth`).
 *
 * WRs a queue accepts while its SQ has no credit wait in its backlog (`sqd_queue_attr.backlog_depth`), but
 * their copies (WR, SGE list, inline data) are kept in a pool shared by the queues of their send CQ. Without a
 * limit the pool holds room for every queue's whole backlog: a queue's creation adds the room the pool lacks
 * for `backlog_depth` more WRs of its shape (`max_send_sge`, `max_inline_data`), counted in its
 * `sqd_queue_stats.bytes`. With a limit,
 * the pool holds room for at most `max_parked` WRs of each shape of its queues, so queues with deep backlogs
 * cost little memory each (the first queue of a shape makes the pool grow, later ones do not), and a WR
 * that would park while `max_parked` WRs are parked on the CQ is refused with `-EAGAIN` and a message in
 * `sqd_last_error()` (as when its own backlog is full: `*bad_wr` at it, it and the WRs after it not accepted);
 * it can be posted again once releases have moved parked WRs to their SQs. Each queue's `backlog_depth`
 * stays its own cap. The pool's state is in `sqd_cq_backlog_pool_stats`.
 *
 * May be called at any time. Room for a higher limit is allocated in this call; room is kept when the limit is
 * lowered (for later queues), and freed when the last queue of its shape is freed; a limit below the WRs
 * parked now refuses new ones until enough are released. Parking a WR and posting parked WRs never allocate.
 *
 * Returns 0, or `-EINVAL` (NULL `cq`), `-ENOMEM` (the room could not be allocated; the previous limit stays,
 * and `sqd_last_error()` names the bytes).
 */
int32_t sqd_cq_set_backlog_limit(struct sqd_cq *cq,
                                 uint32_t max_parked);

/**
 * Copies the state of the CQ's backlog pool (where the queues whose sends complete on it park WRs) into
 * `*out`. Returns 0 or `-EINVAL` (NULL argument).
 */
int32_t sqd_cq_backlog_pool_stats(const struct sqd_cq *cq, struct sqd_backlog_pool_stats *out);

/**
 * Arms the CQ for its completion channel (`ibv_req_notify_cq(cq, solicited_only)`), then polls it once more so
 * that a completion that arrived between your last empty `sqd_cq_poll` and the arming is not missed: up to
 * `max` completions are stored in `wc`, exactly as `sqd_cq_poll` would (releases run too).
 *
 * Returns 0 when the CQ is armed and was empty: sleep on the channel (`ibv_get_cq_event`, or epoll on its
 * fd), then `ibv_ack_cq_events` and poll. A positive count: handle them, then poll again (and re-arm) before
 * sleeping.
 *
 * Unsignaled WRs produce no completion, and a sleeping poller no poll to cover them. So every unsignaled tail
 * of the CQ's queues gets its signaled marker in this call, and from this call until the next `sqd_cq_poll`
 * of the CQ (the one inside a later `sqd_cq_arm` included), every post to a queue whose sends complete on it
 * (`sqd_post_send`, from any thread on a `SQD_CQ_THREAD_SAFE` CQ, or from the poller itself before it
 * sleeps) that leaves an unsignaled tail posts the marker at once: one more WQE and CQE per such post
 * (counted in `sqd_queue_stats.markers`), whose completion raises the event when the CQ is armed for every
 * completion (`solicited_only` 0; armed for solicited completions only, a successful send completion raises
 * none, as in verbs). Negative: `-EINVAL` (NULL `cq`, `max <= 0`, NULL `wc`), `-EOPNOTSUPP` (the provider cannot
 * notify), `-EBUSY` (called from a callback of this CQ), `-EIO`, or the provider's negated errno.
 */
int32_t sqd_cq_arm(struct sqd_cq *cq,
                   int32_t solicited_only,
                   int32_t max,
                   struct ibv_wc *wc);

/**
 * Tells the library about an asynchronous event of the CQ (`type` is an `enum ibv_event_type` value, as read
 * by `ibv_get_async_event`). `IBV_EVENT_CQ_ERR`: the CQ will deliver no more completions, so every queue
 * attached to it fails and releases at once, in post order, every posted WR and receive with
 * `IBV_WC_WR_FLUSH_ERR` and every backlogged WR as never posted; completions that still arrive for them are
 * swallowed. Release callbacks run inside this call.
 *
 * Returns 0, or `-EINVAL` (NULL `cq`, an event that is not a CQ's).
 */
int32_t sqd_cq_async_event(struct sqd_cq *cq, uint32_t type);

/**
 * The CQ depth (`cqe` to ask `ibv_create_cq` for) that lets every queue of `plans` attach: the sum of what each
 * reserves (`sq_depth + 1` for its sends, `rq_depth` for its receives; one less for a queue whose interval in
 * force is 1, `signal_interval` 1 or 0 below an `sq_depth` of 8, so the sum is then one more than it needs). Compare with the device's `max_cqe`: a CQ the device clamps
 * below it would refuse some queues with `-ENOSPC`. It counts no SRQ: when queues receive through managed SRQs
 * on the CQ, use `sqd_cq_depth_for_srqs`.
 *
 * Returns 0 and stores the depth in `*out`, or `-EINVAL` (NULL `out`, NULL `plans` with `n > 0`),
 * `-EOVERFLOW` (the depth does not fit in 64 bits).
 */
int32_t sqd_cq_depth_for(const struct sqd_queue_plan *plans,
                         size_t n,
                         uint64_t *out);

/**
 * The CQ depth (`cqe` to ask `ibv_create_cq` for) that lets every queue of `plans` attach when some of them
 * receive through managed SRQs (`sqd_srq_new`): what `sqd_cq_depth_for` returns for `plans`, plus each of the
 * `n_srqs` depths of `srq_depths` once. List there, once each, the `depth` (of its `struct sqd_srq_attr`) of
 * every SRQ that a queue on this CQ receives through with the CQ as its receive CQ: `sqd_queue_new` reserves
 * that depth on the CQ once, for the first of its queues there, however many follow. Plan each such queue
 * with `rq_depth` 0, as its `struct sqd_queue_attr` has, and its `sq_depth` if its sends complete on the CQ.
 * The plans are the same `struct sqd_queue_plan` array that `sqd_cq_depth_for` takes.
 *
 * Returns 0 and stores the depth in `*out`, or `-EINVAL` (NULL `out`, NULL `plans` with `n > 0`, NULL
 * `srq_depths` with `n_srqs > 0`), `-EOVERFLOW` (the depth does not fit in 64 bits).
 */
int32_t sqd_cq_depth_for_srqs(const struct sqd_queue_plan *plans,
                              size_t n,
                              const uint32_t *srq_depths,
                              size_t n_srqs,
                              uint64_t *out);

/**
 * The message of the calling thread's most recent failed `sqd_*` call, as a NUL-terminated string.
 *
 * Never NULL: an empty string before any failure. The pointer stays valid until the next failing `sqd_*` call
 * on the same thread; copy it to keep it. Successful calls do not clear it.
 */
const char *sqd_last_error(void);

/**
 * The library version, "MAJOR.MINOR.PATCH", as a static NUL-terminated string.
 */
const char *sqd_version(void);

/**
 * Puts the RC QP `qp` under management and stores the new queue in `*out`.
 *
 * Its sends must complete on `send_cq` (`qp->send_cq`). Its receives are managed when `recv_cq` is non-NULL
 * (it must be `qp->recv_cq`, which may be the same handle as `send_cq`; `attr->rq_depth` > 0); pass NULL and
 * `rq_depth` 0 to post receives yourself on a CQ the library does not manage.
 *
 * The queue reserves its worst case on each CQ: `sq_depth + 1` on the send CQ (every outstanding WR flushes
 * with its own CQE on QP error, plus a drain marker; `sq_depth` alone when the interval in force is 1, which
 * signals every WR and so never needs a marker: `signal_interval` 1, or 0 with `sq_depth` below 8) and
 * `rq_depth` on the receive CQ. If that does not fit in what the CQ
 * has left, it fails with `-ENOSPC` and `sqd_last_error()` names the numbers.
 *
 * Its storage is allocated here, once (`sqd_queue_stats.bytes`): a slot record per SQ (and RQ) slot, and with
 * `SQD_QUEUE_VERIFY_BUFFERS` a checksum per SGE of every WR that may be in flight or parked. Parked WRs are
 * kept in the send CQ's backlog pool: when the pool lacks room for `backlog_depth` more WRs of this queue's
 * shape (room for `max_send_sge` SGEs and `max_inline_data` bytes each) and no limit set by
 * `sqd_cq_set_backlog_limit` stops it, the pool grows here by what it lacks, and the queue's `bytes` count
 * that growth. Large depths and limits together can ask for gigabytes: when an allocation fails it returns
 * `-ENOMEM`, and `sqd_last_error()` names the bytes that could not be allocated.
 *
 * Ownership: `qp` stays the caller's and must outlive the queue. `attr` is copied. Thread safety: one thread at
 * a time, the one that uses the queue's CQs.
 *
 * Returns 0, or `-EINVAL` (NULL argument, a depth of 0 or too large, `signal_interval > sq_depth`, unknown
 * `flags` bits, a QP that is not RC, a CQ that is not the QP's, receives through an SRQ, an `attr->srq` with a
 * thread-safe send or receive CQ: SRQs are managed on single-threaded CQs only), `-EBUSY` (the QP is
 * already managed on that CQ), `-ENOSPC` (CQ budget), `-ENOMEM` (see above), `-EIO` (`attr->srq` had its
 * receives released by `sqd_srq_release_all`).
 */
int32_t sqd_queue_new(struct sqd_cq *send_cq,
                      struct sqd_cq *recv_cq,
                      struct ibv_qp *qp,
                      const struct sqd_queue_attr *attr,
                      struct sqd_queue **out);

/**
 * Frees a queue (not its QP). NULL is a no-op (returns 0), and so is the NULL a failed `sqd_queue_new` stores.
 *
 * Returns 0, or `-EBUSY` (with a message in `sqd_last_error()`; the queue then stays valid) while WRs or
 * receives are outstanding (not yet released: poll, or drain, first) or the provider still holds a WQE of the
 * queue (a marker of the library's whose completion is not polled yet), while a QP on an SRQ may still
 * consume its receives (see `sqd_queue_async_event`), or when called from one of the queue's own callbacks
 * (release, deferred action, invalidation `done`). From a callback of another queue, even one of the same
 * CQ during its poll, an idle queue is freed normally. Free it before destroying its QP: the library's own
 * devices (`sqd_scripted_destroy_qp`, `sqd_sim_destroy_qp`) refuse with `-EBUSY` until then.
 */
int32_t sqd_queue_free(struct sqd_queue *q);

/**
 * Hands the queue's common releases to `fn` in batches from now on, for ULPs that finish their WRs in bulk:
 * the WRs the ULP posted that are released one after the other with the same status and vendor error (the
 * successes a signaled CQE retires, mostly) go to one call of `fn(ctx, batch)`, oldest first, instead of one
 * call each of the queue's `release`.
 *
 * Every other release still goes to `release`, one per WR: receives, WRs released as never posted or refused
 * (`SQD_COMPLETION_NEVER_POSTED`, `SQD_COMPLETION_REFUSED`), every release of a queue that verifies buffers
 * (`SQD_QUEUE_VERIFY_BUFFERS`), and a common release too wherever the library finds that simpler. Handle any
 * release in `release` as well: between them, each WR is released exactly once and in post order, and a
 * deferred action (`sqd_defer`, `sqd_defer_mr`) still runs right after the last release it waits for. A batch
 * carries no opcode and does not say which WR's own CQE retired it; a ULP that needs those keeps to
 * `release` alone. Inside `fn`, `sqd_queue_stats` counts the whole batch as released.
 *
 * Set it at most once, outside the queue's own callbacks; it stays for the queue's life. The queue must have
 * a `release` callback (it gets the releases a batch cannot carry). Costs 8 bytes per SQ slot (counted in
 * `sqd_queue_stats.bytes`), none on a queue with `SQD_QUEUE_INDEXED`.
 *
 * Returns 0, or `-EINVAL` (NULL `q` or `fn`; the queue has no `release`), `-EBUSY` (already set; called from
 * one of the queue's own callbacks), `-ENOMEM`.
 */
int32_t sqd_queue_set_release_batch(struct sqd_queue *q, sqd_release_batch_fn fn, void *ctx);

/**
 * `sqd_queue_set_release_batch` for ULPs that have nothing to do when their WRs succeed (they learn of the
 * successes from the completions they signaled, say): a batch of successes is released without a call, and
 * `fn(ctx, batch)` gets the batches of failures only (a WR's own error, then the flushes behind it), each with
 * one status and vendor error, oldest first. A success is still counted in `sqd_queue_stats.released` and
 * still lets a deferred action that waits for it run in its place. A success's buffers may be reused once it
 * is released: by the time `sqd_cq_poll` returns the completion of a WR you signaled (when not called from
 * one of the queue's own callbacks), that WR and every WR posted before it on the queue are.
 *
 * Everything else is as with `sqd_queue_set_release_batch`: every release a batch cannot carry still goes to
 * `release` (successes among them, wherever the library releases them one by one), between them each WR that
 * gets a call gets exactly one and in post order, and the queue must have a `release` callback. Set at most
 * one of the two, at most once, outside the queue's own callbacks. Saves gathering the batch's wr_ids and the
 * call for each completion that retires only successes.
 *
 * Returns 0, or `-EINVAL` (NULL `q` or `fn`; the queue has no `release`), `-EBUSY` (a batch callback is
 * already set; called from one of the queue's own callbacks), `-ENOMEM`.
 */
int32_t sqd_queue_set_release_failures(struct sqd_queue *q,
                                       sqd_release_batch_fn fn,
                                       void *ctx);

/**
 * Hands a chain of send WRs to the queue instead of `ibv_post_send`.
 *
 * Each WR in turn is checked, then either posted (the WRs posted by one call go to the provider in runs of up
 * to 64 per doorbell) or, when the SQ has no free slot, copied into the backlog (WR, SGE list and inline data: you may
 * reuse the structs and inline buffers at once) to be posted in order as completions free slots. Either way
 * it is accepted: it will get exactly one release. The library owns the wr_id and may add
 * `IBV_SEND_SIGNALED`; your chain is restored exactly before the call returns (on a queue with
 * `SQD_QUEUE_NO_RESTORE`, only its links and the WRs not accepted are).
 *
 * Until its release, a WR's data buffers, lkeys and MRs must stay valid and unchanged: the HCA may read them
 * again for a retransmission.
 *
 * On failure `*bad_wr` is the first WR not accepted: the WRs before it were accepted, it and all after it
 * were not, as with `ibv_post_send`. Returns 0 (and `*bad_wr = NULL`), or `-EINVAL` (NULL argument; an
 * opcode not valid on RC; unknown `send_flags` bits; `num_sge` above `max_send_sge` or negative; NULL
 * `sg_list`; inline data above `max_inline_data` or with an opcode that cannot carry it; an atomic whose SGEs
 * do not total exactly 8 bytes or whose `remote_addr` is not 8-byte aligned; a BIND_MW with a NULL
 * `bind_mw.mw`), `-EAGAIN` (no SQ slot, and the backlog is full or disabled, or the send CQ's backlog pool is
 * at its limit, `sqd_cq_set_backlog_limit`), `-EIO` (the queue failed or is
 * draining), or the provider's negated errno when its `post_send` refused a WR this call posted (that WR
 * is `*bad_wr`; the WRs before it stay posted and will be released, even unsignaled ones, without more posts).
 *
 * A backlogged WR is posted later, as completions free slots (within `sqd_cq_poll`, or any call that hands out
 * releases); if the provider's `post_send` refuses it then (a WR these checks accept but the provider does not
 * support), it is not retried: it is released, after the WRs
 * posted before it, with `IBV_WC_LOC_QP_OP_ERR`, `SQD_COMPLETION_REFUSED | SQD_COMPLETION_NEVER_POSTED` and
 * the provider's errno in `vendor_err`; `sqd_queue_stats` counts it (`provider_refused`,
 * `provider_refused_errno`) and `sqd_queue_last_refusal` describes it. It is not shown by `sqd_cq_poll`. The
 * queue stays open and the WRs behind it are posted in order.
 */
int32_t sqd_post_send(struct sqd_queue *q,
                      struct ibv_send_wr *wr,
                      struct ibv_send_wr **bad_wr);

/**
 * Posts a chain of receives on a queue that manages them (`rq_depth` > 0), instead of `ibv_post_recv`.
 *
 * Each receive gets exactly one release (flag `SQD_COMPLETION_RECV`), in post order, and its completion is
 * returned by `sqd_cq_poll` with your wr_id. On failure `*bad_wr` is the first receive not posted. Returns 0,
 * or `-EINVAL` (NULL argument, queue without managed receives, bad `num_sge`/`sg_list`), `-EAGAIN` (more
 * receives than `rq_depth` outstanding), `-EIO` (an asynchronous event released the queue), or the provider's
 * negated errno.
 */
int32_t sqd_post_recv(struct sqd_queue *q, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);

/**
 * A completion barrier: runs `fn(ctx)` once every send WR accepted on the queue so far is released — right
 * after the last of those releases, before any later one. If they all are already, it runs before this call
 * returns. Deferred MR deregistration or invalidation and "buffer may be reused" hooks are built on it.
 *
 * Returns 0, or `-EINVAL` (NULL `q` or `fn`), `-ENOMEM` (no room for the action could be allocated; `fn`
 * will not be called).
 */
int32_t sqd_defer(struct sqd_queue *q, sqd_defer_fn fn, void *ctx);

/**
 * Brings the queue to "everything released", as the kernel's drain does.
 *
 * Move the QP to the error state first (so outstanding WRs flush) or not (they complete normally). From
 * this call on the queue takes no new WRs (`-EIO`); an unsignaled tail is covered at once by a signaled
 * marker so a CQE proves every posted WR finished; WRs still in the backlog are released as never posted
 * (`SQD_COMPLETION_NEVER_POSTED`, `IBV_WC_WR_FLUSH_ERR`) after the posted ones. Receives are released as their
 * (flush) completions arrive. Invalidations `sqd_invalidate` still holds back (waiting for a covering
 * completion) are cancelled: their `done` callback gets `IBV_WC_WR_FLUSH_ERR` with
 * `SQD_COMPLETION_NEVER_POSTED`, and their rkey was never invalidated, so it stays valid. The call never
 * blocks.
 *
 * Returns 0 when every WR and receive is released and the provider holds none of the queue's WQEs (the
 * library's markers included: the queue may then be freed), `-EINPROGRESS` while completions are still to be
 * polled (poll the CQ, then call again; the message says what is left), `-EINVAL` (NULL), or `-EIO` (the
 * marker could not be posted).
 */
int32_t sqd_queue_drain(struct sqd_queue *q);

/**
 * Copies the description of the newest WR the provider refused after the queue had accepted it (see
 * `sqd_post_send` and `SQD_COMPLETION_REFUSED`: which WR, the errno, what became of it) into `buf`, as a
 * NUL-terminated string cut to `len - 1` bytes; nothing is written when `len` is 0.
 *
 * Returns the length of the whole description (without the NUL; 0 and an empty string when the provider
 * refused nothing so far), or `-EINVAL` (NULL `q`, NULL `buf` with `len` > 0).
 */
int32_t sqd_queue_last_refusal(const struct sqd_queue *q, char *buf, size_t len);

/**
 * Copies the queue's counters and state into `*out`. Returns 0 or `-EINVAL` (NULL argument).
 */
int32_t sqd_queue_stats(const struct sqd_queue *q, struct sqd_queue_stats *out);

/**
 * Invalidates `rkey` (an MR or memory window the ULP exposed to its peer) at the first moment it is safe, and
 * reports when the invalidation itself has completed.
 *
 * Without flags the `IBV_WR_LOCAL_INV` is posted only once a completion covers every WR accepted on the queue
 * before this call: a LocalInv is not ordered behind earlier WRs (IBA Table 79, 'L'), so posting it at once
 * could invalidate keys an earlier, not yet acknowledged WR still needs for a retransmission. With
 * `SQD_INVALIDATE_FENCE` it is posted now with `IBV_SEND_FENCE` (the Local Invalidate Fence), for devices
 * that honour it; when no SQ slot is free, or WRs accepted earlier wait in the backlog (it never overtakes
 * them), it is parked behind them and posted, fenced, in post order. Either way it is signaled and its
 * completion is not shown by `sqd_cq_poll`; `done` (may be NULL) then receives `wr_id`, opcode `IBV_WC_LOCAL_INV` and the status (`IBV_WC_WR_FLUSH_ERR` with
 * `SQD_COMPLETION_NEVER_POSTED` if the queue failed or drained first; `IBV_WC_LOC_QP_OP_ERR` with
 * `SQD_COMPLETION_REFUSED | SQD_COMPLETION_NEVER_POSTED` and the errno in `vendor_err` if the provider's
 * `post_send` refused the LocalInv). Once `done` reports success, no
 * remote access with `rkey` can succeed. A `sqd_defer` registered after this call does not wait for the
 * LocalInv unless it had been posted by then: use `done`.
 *
 * If the peer already invalidated the rkey with SEND_WITH_INV, the receive's release says so
 * (`SQD_COMPLETION_REMOTE_INV`, `invalidated_rkey`) and no LocalInv is needed.
 *
 * Unfenced invalidations wait in the queue, not in the SQ or the backlog, so any number may be pending
 * however full those are: each takes a small record (a few dozen bytes) from the heap until its `done` ran,
 * and that memory is not counted in `sqd_queue_stats.bytes`. The records are kept for reuse, so a steady
 * state allocates nothing.
 *
 * Returns 0, or `-EINVAL` (NULL `q`, unknown flags), `-EIO` (the queue failed or is draining), `-EAGAIN`
 * (fenced, it cannot be posted now, since no SQ slot is free or WRs wait in the backlog, and cannot be
 * parked: the queue's backlog is full, or the send CQ's backlog pool is at its limit; nothing is recorded and
 * `done` is not called), `-ENOMEM` (no room to record it could be allocated:
 * nothing is posted and `done` is not called).
 */
int32_t sqd_invalidate(struct sqd_queue *q,
                       uint32_t rkey,
                       uint64_t wr_id,
                       uint32_t flags,
                       sqd_release_fn done,
                       void *done_ctx);

/**
 * Tracks the uses of `mr` on this queue precisely: from now on the queue remembers the newest WR whose SGEs
 * name `mr->lkey`, so `sqd_defer_mr` and `sqd_defer_dereg_mr` on it wait only for the WRs that use it instead
 * of every WR accepted so far. The WRs accepted before this call were not looked at: until each of them is
 * released it counts as a use, so tracking an MR that WRs in flight read never lets it go early. Costs a scan
 * of the tracked MRs for each SGE posted: track the few MRs you tear down while traffic continues, not every
 * MR. An MR stays tracked until `sqd_queue_untrack_mr`, or until the deregistration of `sqd_defer_dereg_mr`
 * on this queue has run.
 *
 * Returns 0, or `-EINVAL` (NULL argument), `-EEXIST` (already tracked), `-ENOMEM`.
 */
int32_t sqd_queue_track_mr(struct sqd_queue *q, const struct ibv_mr *mr);

/**
 * Stops tracking `mr`. Returns 0, or `-EINVAL` (NULL argument), `-ENOENT` (not tracked).
 */
int32_t sqd_queue_untrack_mr(struct sqd_queue *q, const struct ibv_mr *mr);

/**
 * Runs `fn(ctx)` once no in-flight WR of the queue can reference `mr`: when `mr` is tracked
 * (`sqd_queue_track_mr`), right after the release of the newest WR whose SGEs use it or of the last WR
 * accepted before it was tracked, whichever was accepted later; else after every WR accepted so far; at once
 * if that is already so. "Buffer may be reused" hooks for one MR build on it.
 *
 * Returns 0, or `-EINVAL` (NULL `q`, `mr` or `fn`), `-ENOMEM` (as for `sqd_defer`).
 */
int32_t sqd_defer_mr(struct sqd_queue *q, const struct ibv_mr *mr, sqd_defer_fn fn, void *ctx);

/**
 * Deregisters `mr` (`ibv_dereg_mr`, or the software HCA's equivalent for its MRs) once no in-flight WR of the
 * queue can reference it, as `sqd_defer_mr` would run an action. Ownership of `mr` passes to the queue: do not
 * use or deregister it yourself afterwards. If `mr` is tracked on this queue (`sqd_queue_track_mr`), the queue
 * untracks it when the deregistration has run (`sqd_queue_stats.tracked_mrs` drops; a later MR with the same
 * lkey may be tracked); untrack it yourself, before this call, on any other queue that tracks it. A failed
 * deregistration counts in `sqd_queue_stats.teardown_failures` (the MR is untracked all the same).
 *
 * Returns 0, or `-EINVAL` (NULL argument), `-ENOMEM` (no room for the deregistration could be allocated:
 * `mr` stays yours).
 */
int32_t sqd_defer_dereg_mr(struct sqd_queue *q,
                           struct ibv_mr *mr);

/**
 * Deallocates the memory window `mw` (`ibv_dealloc_mw`, through its context's ops) once every WR accepted on
 * the queue so far is released. Ownership of `mw` passes to the queue. A failure counts in
 * `sqd_queue_stats.teardown_failures`.
 *
 * Returns 0, or `-EINVAL` (NULL argument), `-ENOMEM` (no room for the deallocation could be allocated:
 * `mw` stays yours).
 */
int32_t sqd_defer_dealloc_mw(struct sqd_queue *q, struct ibv_mw *mw);

/**
 * Tells the queue about an asynchronous event of its QP (`type` is an `enum ibv_event_type` value, as read by
 * `ibv_get_async_event`).
 *
 * `IBV_EVENT_QP_FATAL`, `IBV_EVENT_QP_REQ_ERR`, `IBV_EVENT_QP_ACCESS_ERR`: the QP is in the error state, the
 * HCA no longer executes its WRs, and its CQ may deliver no flush completion at all: the queue fails and
 * releases at once, in post order, every posted WR and receive with `IBV_WC_WR_FLUSH_ERR` and every
 * backlogged WR as never posted; completions that still arrive for them are swallowed (counted in
 * `late_cqes`), also after `sqd_queue_free`, however many queues were freed this way: each CQ remembers, per
 * freed queue, the WQEs and receives the provider held at the event and no completion has covered since, and
 * drops their completions as strays (`sqd_cq_stats.stray`) instead of passing them through to the ULP. It
 * forgets the queue once the completion of the last of them arrived, or when a new queue on the CQ takes its
 * QP number (a device reuses a number only for a new QP, and destroying a QP removes its completions from its
 * CQs), so what it keeps is bounded by what can still arrive. Release callbacks run inside this call.
 * `IBV_EVENT_COMM_EST`, `IBV_EVENT_SQ_DRAINED`, `IBV_EVENT_PATH_MIG`, `IBV_EVENT_QP_LAST_WQE_REACHED`:
 * nothing to do.
 *
 * Returns 0, or `-EINVAL` (NULL `q`, an event that is not a QP's).
 */
int32_t sqd_queue_async_event(struct sqd_queue *q, uint32_t type);

/**
 * Takes the SRQ `srq` under management and stores the handle in `*out`. Queues whose QPs receive from it are
 * made with `sqd_queue_new` and `attr->srq` set; its receives are posted with `sqd_srq_post_recv`, and their
 * completions are returned by `sqd_cq_poll` (with your wr_id and the consuming QP's `qp_num`) on the CQ of the
 * QP that consumed them. The SRQ's depth is reserved once on each CQ where its queues complete receives.
 *
 * `srq` must hold no receives the handle does not know of: a new SRQ, or one whose receives were all consumed
 * (not one whose receives `sqd_srq_release_all` gave back, which the device still holds).
 *
 * Ownership: `srq` stays the caller's and must outlive the handle. Thread safety: used by the thread that polls
 * the CQs of its queues (not for thread-safe CQs).
 *
 * Returns 0, or `-EINVAL` (NULL argument, depth 0 or too large, low watermark above depth, nonzero flags, an
 * SRQ without a provider context or `post_srq_recv` op), `-ENOSPC` (too many managed SRQs: 4096), `-ENOMEM`
 * (its storage could not be allocated; `sqd_last_error()` names the bytes).
 */
int32_t sqd_srq_new(struct ibv_srq *srq,
                    const struct sqd_srq_attr *attr,
                    struct sqd_srq **out);

/**
 * Frees a handle made by `sqd_srq_new` (not the `ibv_srq`). NULL is a no-op (returns 0).
 *
 * Returns 0, or `-EBUSY` (with a message in `sqd_last_error()`; the handle then stays valid) while queues are
 * attached (free them first), while receives are posted (release them first with `sqd_srq_release_all` once
 * no QP can consume them), or when called from the SRQ's own release callback. Free it before destroying
 * the `ibv_srq`: `sqd_sim_destroy_srq` refuses with `-EBUSY` until then.
 */
int32_t sqd_srq_free(struct sqd_srq *srq);

/**
 * Posts a chain of receives to the SRQ instead of `ibv_post_srq_recv`. On failure `*bad_wr` is the first
 * receive not posted. Returns 0, or `-EINVAL` (NULL argument, bad `num_sge`/`sg_list`), `-EAGAIN` (the SRQ
 * holds `depth` receives already), `-EIO` (`sqd_srq_release_all` released receives: see there), or the
 * provider's negated errno.
 */
int32_t sqd_srq_post_recv(struct sqd_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);

/**
 * Releases every receive still posted to the SRQ (`IBV_WC_WR_FLUSH_ERR`, `SQD_COMPLETION_NEVER_POSTED`),
 * when no QP can consume them any more: before destroying the SRQ, or after `IBV_EVENT_SRQ_ERR`. The device
 * still holds those receives, so once this released any the SRQ takes no more receives and no more queues
 * (`-EIO` from `sqd_srq_post_recv` and `sqd_queue_new`): a QP attached later could consume them into buffers
 * you have reused. Free it, and destroy the `ibv_srq`. Returns 0, or `-EINVAL` (NULL), `-EBUSY` (queues are
 * still attached).
 */
int32_t sqd_srq_release_all(struct sqd_srq *srq);

/**
 * Copies the SRQ's counters into `*out`. Returns 0 or `-EINVAL` (NULL argument).
 */
int32_t sqd_srq_stats(const struct sqd_srq *srq, struct sqd_srq_stats *out);

/**
 * Registers a software device: a device whose provider only fills in the public ops table of its
 * `struct ibv_context` (`post_send`, `poll_cq`, ...) and so cannot be reached by libibverbs calls that go
 * through private driver ops. Hardware providers loaded by libibverbs never need this.
 *
 * From then on, for objects whose `context` is `ctx`, the library calls `ops->dereg_mr` instead of
 * `ibv_dereg_mr` (deferred deregistration: `sqd_defer_dereg_mr`), `ops->create_srq` / `ops->destroy_srq` instead
 * of `ibv_create_srq` / `ibv_destroy_srq` where it makes an SRQ itself (the SPDK provider, libsqdisc_spdk, does
 * for SPDK), and, when set, `ops->hold` / `ops->release` as each
 * `sqd_cq`, `sqd_queue` and `sqd_srq` starts and stops using one of the device's CQs, QPs and SRQs, so the device
 * can refuse to destroy an object a handle still uses. `*ops` is copied; `ops->size` must be
 * `sizeof(struct sqd_device_ops)`.
 *
 * One registry serves the whole process: every copy of the library loaded into the global scope (libsqdisc, and
 * the copy libsqdisc_spdk carries) uses the first `sqd_device_register` / `sqd_device_lookup` the dynamic linker
 * finds there, from its first use of the registry on. A copy opened with `dlopen(RTLD_LOCAL)` or linked
 * statically into a program that does not export it (no `-rdynamic`) cannot be found, and keeps a registry of its
 * own that devices registered elsewhere do not reach.
 *
 * The functions of `ops` may be called from any thread, with `ops->device` as their first argument, until
 * `sqd_device_unregister(ctx)` returns (`release`: until every successful `hold` is released, which may be
 * later).
 *
 * Returns 0; `-EINVAL` (NULL `ctx` or `ops`, `ops->size` too small, `hold` without `release` or the reverse),
 * `-EEXIST` (a device is registered for `ctx` already), `-ENOMEM`.
 */
int sqd_device_register(struct ibv_context *ctx,
                        const struct sqd_device_ops *ops);

/**
 * Ends `sqd_device_register(ctx, ...)`: objects of `ctx` go to libibverbs' own calls again. A device calls it
 * when it closes, after the library has stopped using its objects.
 *
 * Returns 0; `-EINVAL` (NULL `ctx`), `-ENOENT` (no device is registered for `ctx`).
 */
int sqd_device_unregister(struct ibv_context *ctx);

/**
 * Whether a device is registered for `ctx`: 1, with its ops copied into `*ops` (at most `ops->size` bytes, which
 * the caller sets to `sizeof(struct sqd_device_ops)` first); 0 if none is (`*ops` untouched); `-EINVAL` for a
 * NULL `ops` or an `ops->size` below the first version's.
 */
int sqd_device_lookup(struct ibv_context *ctx,
                      struct sqd_device_ops *ops);

/**
 * Leaves `message` (copied) as the calling thread's `sqd_last_error()`, for a device implemented in another
 * library whose own C functions fail: its callers read the message where they read the library's. A device
 * library carrying its own copy of sqdisc's core (libsqdisc_sim) calls the first `sqd_device_set_error` in
 * global scope, like `sqd_device_lookup`.
 *
 * Returns 0; `-EINVAL` for a NULL `message` (then "message is NULL" is the last error).
 */
int sqd_device_set_error(const char *message);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* SQDISC_H */
