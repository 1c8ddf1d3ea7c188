/* The device seam from C (sqd_device_register / sqd_device_unregister / sqd_device_lookup): bad input gets a
 * negative errno and a message; a software device written in C is told, through hold and release, which of its
 * objects the library's handles use, and can make a handle's creation fail; with no device registered nothing is
 * called. Uses only <sqdisc.h>: the device is a context and a CQ made here. Prints "PASS <name>" per check; exits
 * non-zero on the first failure. */

#include <sqdisc.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "support/exit_checks.h"

#define CHECK_ERROR(call, err, text)                                                                       \
    do {                                                                                                   \
        CHECK_EQ((call), -(err));                                                                          \
        CHECK(strstr(sqd_last_error(), (text)) != NULL);                                                   \
    } while (0)

static void pass(void) { printf("PASS %s\n", current); }

/* ---- a software device: one context, one CQ that never completes anything ------------------------------------ */

static int poll_nothing(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    (void)cq;
    (void)n;
    (void)wc;
    return 0;
}

static struct {
    int holds, releases;
    void *last_held, *last_released;
    int refuse; /* the next hold fails with this errno */
} device;

static int hold(void *dev, void *object)
{
    CHECK(dev == &device);
    if (device.refuse) {
        int e = device.refuse;
        device.refuse = 0;
        return e;
    }
    device.holds++;
    device.last_held = object;
    return 0;
}

static void release(void *dev, void *object)
{
    CHECK(dev == &device);
    device.releases++;
    device.last_released = object;
}

static struct sqd_device_ops device_ops(void)
{
    struct sqd_device_ops ops;
    memset(&ops, 0, sizeof ops);
    ops.size = sizeof ops;
    ops.device = &device;
    ops.hold = hold;
    ops.release = release;
    return ops;
}

static void bad_input_is_refused_with_a_message(struct ibv_context *ctx)
{
    struct sqd_device_ops ops = device_ops(), out;
    current = "bad_input_is_refused_with_a_message";
    CHECK_ERROR(sqd_device_register(NULL, &ops), EINVAL, "ctx is NULL");
    CHECK_ERROR(sqd_device_register(ctx, NULL), EINVAL, "ops is NULL");
    ops.size = 8;
    CHECK_ERROR(sqd_device_register(ctx, &ops), EINVAL, "ops->size is 8");
    ops = device_ops();
    ops.release = NULL;
    CHECK_ERROR(sqd_device_register(ctx, &ops), EINVAL, "both set or both NULL");
    CHECK_ERROR(sqd_device_unregister(NULL), EINVAL, "ctx is NULL");
    CHECK_ERROR(sqd_device_unregister(ctx), ENOENT, "no device is registered");
    CHECK_ERROR(sqd_device_lookup(ctx, NULL), EINVAL, "ops is NULL");
    memset(&out, 0, sizeof out);
    CHECK_ERROR(sqd_device_lookup(ctx, &out), EINVAL, "ops->size is 0");
    out.size = sizeof out;
    CHECK_EQ(sqd_device_lookup(ctx, &out), 0); /* not registered: nothing written */
    CHECK(out.device == NULL && out.hold == NULL);
    pass();
}

static void an_unregistered_device_is_told_nothing(struct ibv_cq *cq)
{
    struct sqd_cq *m = NULL;
    current = "an_unregistered_device_is_told_nothing";
    CHECK_EQ(sqd_cq_new(cq, &m), 0);
    CHECK_EQ(sqd_cq_free(m), 0);
    CHECK(device.holds == 0 && device.releases == 0);
    pass();
}

static void a_registered_device_is_told_what_handles_hold(struct ibv_context *ctx, struct ibv_cq *cq)
{
    struct sqd_device_ops ops = device_ops(), out;
    struct sqd_cq *a = NULL, *b = NULL;
    current = "a_registered_device_is_told_what_handles_hold";
    CHECK_EQ(sqd_device_register(ctx, &ops), 0);
    CHECK_ERROR(sqd_device_register(ctx, &ops), EEXIST, "already registered");
    memset(&out, 0, sizeof out);
    out.size = sizeof out;
    CHECK_EQ(sqd_device_lookup(ctx, &out), 1);
    CHECK(out.device == &device && out.hold == hold && out.release == release && out.dereg_mr == NULL);

    CHECK_EQ(sqd_cq_new(cq, &a), 0);
    CHECK_EQ(sqd_cq_new(cq, &b), 0); /* two handles on one CQ: two holds */
    CHECK(device.holds == 2 && device.last_held == (void *)cq && device.releases == 0);
    CHECK_EQ(sqd_cq_free(a), 0);
    CHECK(device.releases == 1 && device.last_released == (void *)cq);

    /* The device refuses: the handle is not made, and nothing is released for it. */
    device.refuse = ENOMEM;
    struct sqd_cq *c = NULL;
    CHECK_ERROR(sqd_cq_new(cq, &c), ENOMEM, "refused to let a library handle hold it");
    CHECK(c == NULL && device.holds == 2 && device.releases == 1);

    /* Released after the device unregistered: still told, once. */
    CHECK_EQ(sqd_device_unregister(ctx), 0);
    CHECK_EQ(sqd_device_lookup(ctx, &out), 0);
    CHECK_EQ(sqd_cq_free(b), 0);
    CHECK(device.holds == 2 && device.releases == 2);
    pass();
}

int main(void)
{
    struct ibv_context *ctx = calloc(1, sizeof *ctx);
    struct ibv_cq *cq = calloc(1, sizeof *cq);
    CHECK(ctx && cq);
    ctx->ops.poll_cq = poll_nothing;
    cq->context = ctx;
    cq->cqe = 16;

    bad_input_is_refused_with_a_message(ctx);
    an_unregistered_device_is_told_nothing(cq);
    a_registered_device_is_told_what_handles_hold(ctx, cq);
    free(cq);
    free(ctx);
    return 0;
}
