/* Allocation failure is an error, never an abort: sqd_queue_new for a configuration inside every documented
 * range (sq_depth 32768, backlog_depth 1048576, 32 SGEs, 1 KiB inline, buffer verification on: several GiB of
 * storage) in a process whose address space is limited (RLIMIT_AS) must return -ENOMEM with a message naming
 * the bytes asked for, leave the CQ as it was, and let a smaller queue be made afterwards.
 *
 * The limit is set in a forked child, so that a crash shows as the child's signal. AddressSanitizer reserves
 * terabytes of shadow memory and aborts on a failed allocation by default, and valgrind manages the address
 * space itself: under either the RLIMIT_AS check cannot run, and the test says so ("SKIP ...") instead of
 * passing it. */

#define _POSIX_C_SOURCE 200809L /* fork, waitpid, setrlimit */

#include "support/harness.h"

#include <sqdisc_sim.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static int under_valgrind(void)
{
    const char *p = getenv("LD_PRELOAD");
    return p && strstr(p, "vgpreload") != NULL;
}

/* The process's address-space size in bytes (/proc/self/statm, first field, in pages). */
static unsigned long long address_space_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0;
    if (!f)
        return 0;
    if (fscanf(f, "%llu", &pages) != 1)
        pages = 0;
    fclose(f);
    return pages * (unsigned long long)sysconf(_SC_PAGESIZE);
}

/* The largest number in `msg` directly followed by " bytes" (0 if none). */
static unsigned long long largest_byte_count(const char *msg)
{
    unsigned long long best = 0;
    for (const char *p = msg; *p; p++) {
        if (*p < '0' || *p > '9' || (p > msg && p[-1] >= '0' && p[-1] <= '9'))
            continue;
        char *end = NULL;
        unsigned long long v = strtoull(p, &end, 10);
        if (end && strncmp(end, " bytes", 6) == 0 && v > best)
            best = v;
    }
    return best;
}

#define GIB (1ull << 30)

/* The child: everything below runs under the address-space limit. Returns its exit status. */
static int child(void)
{
    struct sqd_sim *sim = NULL;
    struct ibv_cq *cq = NULL;
    struct ibv_qp *qp = NULL;
    struct sqd_cq *scq = NULL;
    struct sqd_queue *q = NULL;
    struct sqd_sim_config cfg;
    sqd_sim_config_default(&cfg);
    if (sqd_sim_new(&cfg, &sim) != 0 || sqd_sim_create_cq(sim, 40000, &cq) != 0)
        return 11;
    struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 32768, .max_recv_wr = 1, .max_send_sge = 32,
                                          .max_recv_sge = 1, .max_inline_data = 1024}};
    if (sqd_sim_create_qp(sim, &qa, &qp) != 0 || sqd_cq_new(cq, &scq) != 0)
        return 12;
    if (qa.cap.max_send_wr != 32768 || qa.cap.max_send_sge != 32 || qa.cap.max_inline_data != 1024) {
        printf("FAIL %s: the sim granted %u WRs, %u SGEs, %u inline bytes\n", current, qa.cap.max_send_wr,
               qa.cap.max_send_sge, qa.cap.max_inline_data);
        return 13;
    }
    struct sqd_queue_attr attr = {.sq_depth = 32768, .max_send_sge = 32, .max_inline_data = 1024,
                                  .backlog_depth = 1048576, .flags = SQD_QUEUE_VERIFY_BUFFERS};

    /* Room for what the process has now and 256 MiB more: the queue's storage needs several GiB. */
    struct rlimit old, lim;
    if (getrlimit(RLIMIT_AS, &old) != 0)
        return 14;
    unsigned long long now = address_space_bytes();
    if (now == 0)
        return 15;
    lim.rlim_cur = (rlim_t)(now + 256ull * 1024 * 1024);
    lim.rlim_max = old.rlim_max;
    if (setrlimit(RLIMIT_AS, &lim) != 0)
        return 16;
    int rc = sqd_queue_new(scq, NULL, qp, &attr, &q);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", sqd_last_error());
    if (setrlimit(RLIMIT_AS, &old) != 0)
        return 17;
    if (rc != -ENOMEM || q != NULL) {
        printf("FAIL %s: sqd_queue_new under RLIMIT_AS returned %d (expected -ENOMEM = %d), queue %p: \"%s\"\n",
               current, rc, -ENOMEM, (void *)q, msg);
        return 20;
    }
    unsigned long long named = largest_byte_count(msg);
    if (named < GIB) {
        printf("FAIL %s: the message does not name the bytes asked for (at least 1 GiB): \"%s\"\n", current, msg);
        return 21;
    }
    printf("    sqd_queue_new: -ENOMEM, \"%s\"\n", msg);
    /* Nothing of the failed queue stays: the CQ reserves nothing, and the QP can be managed now. */
    struct sqd_cq_stats cs;
    if (sqd_cq_stats(scq, &cs) != 0 || cs.reserved != 0 || cs.queues != 0) {
        printf("FAIL %s: after the failure the CQ reserves %llu for %u queue(s)\n", current,
               (unsigned long long)cs.reserved, cs.queues);
        return 22;
    }
    attr.backlog_depth = 16;
    attr.flags = 0;
    if (sqd_queue_new(scq, NULL, qp, &attr, &q) != 0 || sqd_queue_free(q) != 0) {
        printf("FAIL %s: a small queue on the same QP afterwards: %s\n", current, sqd_last_error());
        return 23;
    }
    if (sqd_cq_free(scq) != 0 || sqd_sim_free(sim) != 0)
        return 24;
    return 0;
}

static void queue_new_under_an_address_space_limit(void)
{
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int status = child();
        fflush(stdout);
        _exit(status);
    }
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status))
        fail_now("the child died by signal %d%s: an allocation failure aborted instead of returning -ENOMEM",
                 WTERMSIG(status), WTERMSIG(status) == SIGABRT ? " (SIGABRT)" : "");
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
}

int main(void)
{
    if (UNDER_ASAN)
        printf("SKIP sqd_queue_new under RLIMIT_AS: AddressSanitizer reserves terabytes of shadow memory and "
               "aborts on a failed allocation (the dynamic and static builds run this check)\n");
    else if (under_valgrind())
        printf("SKIP sqd_queue_new under RLIMIT_AS: valgrind manages the address space itself (the dynamic and "
               "static builds run this check)\n");
    else
        run("sqd_queue_new under RLIMIT_AS returns -ENOMEM naming the bytes", queue_new_under_an_address_space_limit);
    return harness_finish("alloc_failure");
}
