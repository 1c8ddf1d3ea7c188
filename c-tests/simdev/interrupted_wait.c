/* A signal ends a blocked wait for an event, as with libibverbs and librdmacm on a kernel device:
 * ibv_get_cq_event, ibv_get_async_event and rdma_get_cm_event return -1 with errno EINTR when a signal whose
 * handler was installed without SA_RESTART arrives. Programs count on it: qperf ends a test with SIGALRM while
 * it waits in ibv_get_cq_event for a completion that will not come, and hung for ever when the wait went on.
 * Run under `sqdisc-sim run` (scripts/simdev-tests.sh). */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, "interrupted_wait: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

static volatile sig_atomic_t alarms;

/* Every 100 ms while a wait is under way; a wait that outlives five of them did not end on the first. */
static void on_alarm(int sig)
{
    (void)sig;
    if (++alarms > 5) {
        static const char msg[] = "interrupted_wait: the wait went on after a signal interrupted it\n";
        (void)!write(2, msg, sizeof msg - 1);
        _exit(1);
    }
}

static void start_alarms(void)
{
    alarms = 0;
    struct itimerval t = { .it_interval = { 0, 100000 }, .it_value = { 0, 100000 } };
    setitimer(ITIMER_REAL, &t, NULL);
}

static void stop_alarms(void)
{
    struct itimerval t = { { 0, 0 }, { 0, 0 } };
    setitimer(ITIMER_REAL, &t, NULL);
}

static void expect_eintr(int rc, const char *what)
{
    int e = errno;
    stop_alarms();
    if (rc != -1 || e != EINTR)
        FAIL("%s returned %d (errno %d: %s), wanted -1 and EINTR", what, rc, e, strerror(e));
    if (alarms != 1)
        FAIL("%s returned after %d signals, wanted the first", what, (int)alarms);
}

int main(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a blocked read is interrupted */
    if (sigaction(SIGALRM, &sa, NULL))
        FAIL("sigaction: %s", strerror(errno));

    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n < 1)
        FAIL("no device (is the sim's preload library loaded?)");
    struct ibv_context *ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    struct ibv_comp_channel *ch = ctx ? ibv_create_comp_channel(ctx) : NULL;
    struct ibv_cq *cq = ch ? ibv_create_cq(ctx, 4, NULL, ch, 0) : NULL;
    if (!cq || ibv_req_notify_cq(cq, 0))
        FAIL("device, channel or CQ failed");

    /* An armed CQ that gets no completion. */
    struct ibv_cq *ev_cq = NULL;
    void *ev_ctx = NULL;
    start_alarms();
    expect_eintr(ibv_get_cq_event(ch, &ev_cq, &ev_ctx), "ibv_get_cq_event");

    /* A device with no asynchronous event. */
    struct ibv_async_event aev;
    start_alarms();
    expect_eintr(ibv_get_async_event(ctx, &aev), "ibv_get_async_event");

    /* A CM event channel with nothing on it. */
    struct rdma_event_channel *cm = rdma_create_event_channel();
    if (!cm)
        FAIL("rdma_create_event_channel: %s", strerror(errno));
    struct rdma_cm_event *cev = NULL;
    start_alarms();
    expect_eintr(rdma_get_cm_event(cm, &cev), "rdma_get_cm_event");

    /* The waits still work afterwards: nothing was lost or left half-read. */
    struct ibv_cq *cq2 = ibv_create_cq(ctx, 4, NULL, NULL, 0);
    if (!cq2)
        FAIL("a CQ after the interrupted waits failed");
    rdma_destroy_event_channel(cm);
    if (ibv_destroy_cq(cq2) || ibv_destroy_cq(cq) || ibv_destroy_comp_channel(ch) || ibv_close_device(ctx))
        FAIL("teardown failed");
    printf("interrupted_wait: ok (ibv_get_cq_event, ibv_get_async_event, rdma_get_cm_event)\n");
    return 0;
}
