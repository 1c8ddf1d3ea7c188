/* A program that breaks the stable-resources rule across two processes: it reuses a SEND's source buffer
 * before the SEND's completion.
 *
 *   reuse_source receiver DIR   posts receives and takes 100 messages
 *   reuse_source sender DIR     posts 100 signaled SENDs, one at a time, each from the same 4 KiB buffer; after
 *                               each post it polls once (the device transmits the WQE) and then overwrites the
 *                               buffer for the next message, before the completion. Under loss a WQE is
 *                               retransmitted from the changed bytes: the daemon logs "source modified while
 *                               in flight" against this process, its QP and the WQE. Prints "sender: pid P qp Q"
 *                               for the test to compare with `sqdisc-sim report`. wr_id of WQE i is 0x1000 + i.
 */
#include "common.h"

enum { MSG = 4096, COUNT = 100 };

int main(int argc, char **argv)
{
    prog_name = "reuse_source";
    if (argc != 3 || (strcmp(argv[1], "sender") && strcmp(argv[1], "receiver")))
        die("usage: reuse_source sender|receiver DIR");
    int sender = strcmp(argv[1], "sender") == 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct ibv_context *ctx = open_sim_device();
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, 2 * COUNT, NULL, NULL, 0);
    static char buf[COUNT * MSG];
    struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (!pd || !cq || !mr)
        die("setup: %s", strerror(errno));
    struct ibv_qp *qp = make_rc_qp(pd, cq, COUNT, COUNT);
    if (!sender) {
        for (int i = 0; i < COUNT; i++) {
            struct ibv_sge sge = { (uintptr_t)(buf + i * MSG), MSG, mr->lkey };
            struct ibv_recv_wr wr = { .wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1 }, *bad;
            if (ibv_post_recv(qp, &wr, &bad))
                die("ibv_post_recv: %s", strerror(errno));
        }
    }
    exchange_and_connect(qp, argv[2], argv[1], sender ? "receiver" : "sender");
    printf("%s: pid %d qp %#x\n", argv[1], (int)getpid(), qp->qp_num);

    struct ibv_wc wc[8];
    int done = 0;
    double end = now_s() + 30;
    if (!sender) {
        while (done < COUNT && now_s() < end) {
            int n = ibv_poll_cq(cq, 8, wc);
            if (n < 0)
                die("ibv_poll_cq: %d", n);
            for (int i = 0; i < n; i++, done++)
                if (wc[i].status != IBV_WC_SUCCESS)
                    die("receive: %s", ibv_wc_status_str(wc[i].status));
        }
        if (done < COUNT)
            die("%d of %d messages within 30 s", done, COUNT);
        /* Stay until the sender has its completions: our QP's ACKs are its. */
        char path[4096];
        snprintf(path, sizeof path, "%s/sender.done", argv[2]);
        if (wait_file(path, 20, NULL))
            die("no %s within 20 s", path);
        printf("receiver: %d messages\n", done);
        return 0;
    }
    for (int i = 0; i < COUNT; i++) {
        memset(buf, 'a' + i % 26, MSG);
        struct ibv_sge sge = { (uintptr_t)buf, MSG, mr->lkey };
        struct ibv_send_wr wr = { .wr_id = 0x1000 + (uint64_t)i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                                  .send_flags = IBV_SEND_SIGNALED }, *bad;
        if (ibv_post_send(qp, &wr, &bad))
            die("ibv_post_send: %s", strerror(errno));
        /* Give the device time to transmit the WQE first: it does so at once while traffic moves, but a poll
         * of an empty CQ no longer reaches it (the CQ's shared counter answers), so it cannot be waited for. */
        usleep(5000);
        int n = ibv_poll_cq(cq, 8, wc);
        if (n < 0)
            die("ibv_poll_cq: %d", n);
        for (int k = 0; k < n; k++)
            if (wc[k].status != IBV_WC_SUCCESS)
                die("send %#lx: %s", (unsigned long)wc[k].wr_id, ibv_wc_status_str(wc[k].status));
        done += n;
        memset(buf, 'A' + i % 26, MSG); /* the violation: the source changes while the SEND is in flight */
    }
    while (done < COUNT && now_s() < end) {
        int n = ibv_poll_cq(cq, 8, wc);
        if (n < 0)
            die("ibv_poll_cq: %d", n);
        for (int i = 0; i < n; i++)
            if (wc[i].status != IBV_WC_SUCCESS)
                die("send %#lx: %s", (unsigned long)wc[i].wr_id, ibv_wc_status_str(wc[i].status));
        done += n;
    }
    if (done < COUNT)
        die("%d of %d completions within 30 s", done, COUNT);
    char path[4096];
    snprintf(path, sizeof path, "%s/sender.done", argv[2]);
    write_file(path, "1\n");
    printf("sender: %d SENDs completed\n", done);
    return 0;
}
