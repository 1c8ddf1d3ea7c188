/* The device daemon dies under a program: what a kernel device's loss looks like, and nothing hangs.
 *
 *   daemon_gone DIR   makes a QP (connected to itself), a CQ with a completion channel and an SRQ-less RQ,
 *                     writes DIR/ready, then blocks in ibv_get_async_event while a second thread blocks in
 *                     ibv_get_cq_event. The test kills the daemon (SIGKILL). The program must then see
 *                     IBV_EVENT_DEVICE_FATAL from ibv_get_async_event, the thread's ibv_get_cq_event return -1,
 *                     ibv_post_send, ibv_post_recv and ibv_req_notify_cq fail, ibv_poll_cq return a negative
 *                     value, a second ibv_get_async_event fail, and every destroy and ibv_close_device return.
 */
#include "common.h"

#include <pthread.h>

static struct ibv_comp_channel *channel;
static volatile int cq_event_rc = 1;

static void *cq_waiter(void *arg)
{
    (void)arg;
    struct ibv_cq *cq;
    void *cq_ctx;
    cq_event_rc = ibv_get_cq_event(channel, &cq, &cq_ctx);
    return NULL;
}

int main(int argc, char **argv)
{
    prog_name = "daemon_gone";
    if (argc != 2)
        die("usage: daemon_gone DIR");
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct ibv_context *ctx = open_sim_device();
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    channel = ibv_create_comp_channel(ctx);
    struct ibv_cq *cq = channel ? ibv_create_cq(ctx, 64, NULL, channel, 0) : NULL;
    static char buf[4096];
    struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (!pd || !channel || !cq || !mr)
        die("setup: %s", strerror(errno));
    struct ibv_qp *qp = make_rc_qp(pd, cq, 16, 16);
    connect_qp(qp, qp->qp_num, 7);
    if (ibv_req_notify_cq(cq, 0))
        die("ibv_req_notify_cq: %s", strerror(errno));
    pthread_t waiter;
    if (pthread_create(&waiter, NULL, cq_waiter, NULL))
        die("pthread_create");

    char path[4096];
    snprintf(path, sizeof path, "%s/ready", argv[1]);
    write_file(path, "%d\n", (int)getpid());
    printf("daemon_gone: blocked in ibv_get_async_event\n");

    struct ibv_async_event ev;
    if (ibv_get_async_event(ctx, &ev))
        die("ibv_get_async_event returned an error (%s), not IBV_EVENT_DEVICE_FATAL", strerror(errno));
    if (ev.event_type != IBV_EVENT_DEVICE_FATAL)
        die("ibv_get_async_event gave %s, not IBV_EVENT_DEVICE_FATAL", ibv_event_type_str(ev.event_type));
    ibv_ack_async_event(&ev);
    printf("daemon_gone: ibv_get_async_event: %s\n", ibv_event_type_str(ev.event_type));

    /* The thread in ibv_get_cq_event returns too. */
    double end = now_s() + 5;
    while (cq_event_rc == 1 && now_s() < end)
        sleep_ms(5);
    if (cq_event_rc != -1)
        die("ibv_get_cq_event of the blocked thread %s", cq_event_rc == 1 ? "did not return within 5 s" : "returned 0");
    pthread_join(waiter, NULL);
    printf("daemon_gone: ibv_get_cq_event: -1\n");

    struct ibv_sge sge = { (uintptr_t)buf, 64, mr->lkey };
    struct ibv_send_wr swr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                               .send_flags = IBV_SEND_SIGNALED }, *sbad = NULL;
    int rc = ibv_post_send(qp, &swr, &sbad);
    if (rc == 0)
        die("ibv_post_send succeeded on a device that is gone");
    printf("daemon_gone: ibv_post_send: %d (%s)\n", rc, strerror(rc));
    struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 }, *rbad = NULL;
    rc = ibv_post_recv(qp, &rwr, &rbad);
    if (rc == 0)
        die("ibv_post_recv succeeded on a device that is gone");
    printf("daemon_gone: ibv_post_recv: %d (%s)\n", rc, strerror(rc));
    struct ibv_wc wc;
    rc = ibv_poll_cq(cq, 1, &wc);
    if (rc >= 0)
        die("ibv_poll_cq returned %d on a device that is gone", rc);
    printf("daemon_gone: ibv_poll_cq: %d\n", rc);
    rc = ibv_req_notify_cq(cq, 0);
    if (rc == 0)
        die("ibv_req_notify_cq succeeded on a device that is gone");
    printf("daemon_gone: ibv_req_notify_cq: %d\n", rc);
    if (ibv_get_async_event(ctx, &ev) == 0)
        die("a second ibv_get_async_event gave %s", ibv_event_type_str(ev.event_type));
    printf("daemon_gone: second ibv_get_async_event: -1 (%s)\n", strerror(errno));

    /* Teardown succeeds, as libibverbs reports a destroy on a disassociated (lost) device: the objects went
     * with the device, and the program frees what it holds. */
    int d_qp = ibv_destroy_qp(qp);
    int d_mr = ibv_dereg_mr(mr);
    int d_cq = ibv_destroy_cq(cq);
    int d_ch = ibv_destroy_comp_channel(channel);
    int d_pd = ibv_dealloc_pd(pd);
    int d_ctx = ibv_close_device(ctx);
    printf("daemon_gone: destroy qp %d, dereg mr %d, destroy cq %d, destroy channel %d, dealloc pd %d, close %d\n",
           d_qp, d_mr, d_cq, d_ch, d_pd, d_ctx);
    if (d_qp || d_mr || d_cq || d_ch || d_pd || d_ctx)
        die("a destroy failed after the device was lost");
    printf("daemon_gone: PASS\n");
    return 0;
}
