/* The library's symbol versions, as a binary loading it sees them (src/capi/sqdisc.map): the functions of
 * 0.1.0 under SQDISC_0, those added in 0.2.0 under SQDISC_0.2 only, and sqd_queue_stats in both. 0.2.0's
 * struct sqd_queue_stats is 16 bytes longer than 0.1.0's; a binary built against 0.1.0 binds to
 * sqd_queue_stats@SQDISC_0, which must fill the 0.1.0 struct and not write a byte past it. */

#define _GNU_SOURCE
#include "support/harness.h"

#include <dlfcn.h>
#include <stddef.h>

typedef int32_t (*stats_fn)(const struct sqd_queue *q, void *out);

/* 0.1.0's struct ended with `bytes`. */
#define STATS_0_1_SIZE offsetof(struct sqd_queue_stats, provider_refused)
_Static_assert(STATS_0_1_SIZE == 184, "0.1.0's struct sqd_queue_stats is 184 bytes");

static stats_fn stats_version(const char *version)
{
    void *p = dlvsym(RTLD_DEFAULT, "sqd_queue_stats", version);
    stats_fn f;
    memcpy(&f, &p, sizeof f); /* ISO C has no cast from an object pointer to a function pointer */
    return f;
}

/* Whether libsqdisc is a shared library here (the static runs link the archive, which has no versions). */
static int linked_dynamically(void)
{
    Dl_info info;
    void (*probe)(void) = (void (*)(void))sqd_version;
    void *p;
    memcpy(&p, &probe, sizeof p);
    return dladdr(p, &info) && info.dli_fname && strstr(info.dli_fname, "libsqdisc.so");
}

static void each_function_has_its_release_node(void)
{
    CHECK(dlvsym(RTLD_DEFAULT, "sqd_queue_new", "SQDISC_0") != NULL);
    CHECK(dlvsym(RTLD_DEFAULT, "sqd_cq_poll", "SQDISC_0") != NULL);
    CHECK(dlvsym(RTLD_DEFAULT, "sqd_version", "SQDISC_0") != NULL);
    /* Added in 0.2.0: not offered to binaries that ask for 0.1.0's set. */
    CHECK(dlvsym(RTLD_DEFAULT, "sqd_cq_depth_for_srqs", "SQDISC_0.2") != NULL);
    CHECK(dlvsym(RTLD_DEFAULT, "sqd_cq_depth_for_srqs", "SQDISC_0") == NULL);
    CHECK(dlvsym(RTLD_DEFAULT, "sqd_queue_last_refusal", "SQDISC_0.2") != NULL);
    CHECK(dlvsym(RTLD_DEFAULT, "sqd_queue_last_refusal", "SQDISC_0") == NULL);
    /* Added in 0.3.0. */
    CHECK(dlvsym(RTLD_DEFAULT, "sqd_cq_out_of_order", "SQDISC_0.3") != NULL);
    CHECK(dlvsym(RTLD_DEFAULT, "sqd_cq_out_of_order", "SQDISC_0.2") == NULL);
    CHECK(dlvsym(RTLD_DEFAULT, "sqd_cq_out_of_order_message", "SQDISC_0.3") != NULL);
    CHECK(dlvsym(RTLD_DEFAULT, "sqd_queue_set_release_failures", "SQDISC_0.3") != NULL);
    CHECK(dlvsym(RTLD_DEFAULT, "sqd_queue_set_release_failures", "SQDISC_0.2") == NULL);
}

static void stats_keeps_its_0_1_version(void)
{
    stats_fn old = stats_version("SQDISC_0");
    stats_fn now = stats_version("SQDISC_0.2");
    CHECK(old != NULL);
    CHECK(now != NULL);
    CHECK(old != now);
    /* What this binary, built against the current header, is bound to. */
    CHECK(dlsym(RTLD_DEFAULT, "sqd_queue_stats") == dlvsym(RTLD_DEFAULT, "sqd_queue_stats", "SQDISC_0.2"));

    struct mq *m = rig1((struct qcfg){.sq_depth = 8, .signal_interval = 4}, 64);
    unsigned char full[sizeof(struct sqd_queue_stats)];
    unsigned char small[sizeof(struct sqd_queue_stats)];
    memset(full, 0, sizeof full);
    memset(small, 0xa5, sizeof small);
    CHECK_EQ(now(m->q, full), 0);
    CHECK_EQ(old(m->q, small), 0);
    CHECK(memcmp(small, full, STATS_0_1_SIZE) == 0);
    for (size_t i = STATS_0_1_SIZE; i < sizeof small; i++)
        if (small[i] != 0xa5)
            fail_now("sqd_queue_stats@SQDISC_0 wrote byte %zu, past the 0.1.0 struct's %zu\n", i,
                     (size_t)STATS_0_1_SIZE);
    struct sqd_queue_stats s;
    memcpy(&s, full, sizeof s);
    CHECK_EQ(s.credits, 8); /* the copy holds the queue's numbers, not zeros */

    EXPECT_ERR(old(m->q, NULL), EINVAL, "out");
    EXPECT_ERR(old(NULL, small), EINVAL, "q");
}

int main(void)
{
    if (!linked_dynamically()) {
        printf("SKIP symbol_versions: libsqdisc is linked from its archive, which has no symbol versions\n");
        return harness_finish("symbol_versions");
    }
    run("each_function_has_its_release_node", each_function_has_its_release_node);
    run("stats_keeps_its_0_1_version", stats_keeps_its_0_1_version);
    return harness_finish("symbol_versions");
}
