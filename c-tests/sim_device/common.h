/* What the device daemon's fault tests share: opening the sim's device through plain libibverbs, as any
 * program does, and connecting one RC QP to a QP of another process, their numbers exchanged through files
 * in a directory both can reach. */
#ifndef SIM_DEVICE_COMMON_H
#define SIM_DEVICE_COMMON_H

#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *prog_name = "sim_device";

static inline void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: FAIL: ", prog_name);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static inline double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static inline void sleep_ms(long ms)
{
    struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&t, NULL);
}

/* The sim's device, sqd_sim0, opened. */
static inline struct ibv_context *open_sim_device(void)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list)
        die("ibv_get_device_list: %s", strerror(errno));
    struct ibv_context *ctx = NULL;
    for (int i = 0; i < n; i++) {
        if (strcmp(ibv_get_device_name(list[i]), "sqd_sim0") == 0) {
            ctx = ibv_open_device(list[i]);
            if (!ctx)
                die("ibv_open_device: %s", strerror(errno));
        }
    }
    ibv_free_device_list(list);
    if (!ctx)
        die("no sqd_sim0 among %d device(s): not run under sqdisc-sim run?", n);
    return ctx;
}

/* Writes PATH (atomically: a temporary file renamed) with one line. */
static inline void write_file(const char *path, const char *fmt, ...)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        die("cannot write %s: %s", tmp, strerror(errno));
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
    if (rename(tmp, path) != 0)
        die("cannot rename %s: %s", tmp, strerror(errno));
}

/* Waits up to SECONDS for PATH to exist; reads one unsigned number from it if VALUE is set. */
static inline int wait_file(const char *path, double seconds, unsigned long *value)
{
    double end = now_s() + seconds;
    for (;;) {
        FILE *f = fopen(path, "r");
        if (f) {
            int ok = value ? fscanf(f, "%lu", value) == 1 : 1;
            fclose(f);
            if (ok)
                return 0;
        }
        if (now_s() > end)
            return -1;
        sleep_ms(5);
    }
}

/* Moves QP through INIT, RTR and RTS to the peer QP number REMOTE_QPN on the same port (LID). */
static inline void connect_qp(struct ibv_qp *qp, uint32_t remote_qpn, uint8_t retry_cnt)
{
    struct ibv_port_attr port;
    if (ibv_query_port(qp->context, 1, &port))
        die("ibv_query_port: %s", strerror(errno));
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        die("modify to INIT: %s", strerror(errno));
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = remote_qpn;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = port.lid;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        die("modify to RTR: %s", strerror(errno));
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = retry_cnt;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                  IBV_QP_MAX_QP_RD_ATOMIC))
        die("modify to RTS: %s", strerror(errno));
}

/* Publishes this QP's number as DIR/ROLE.qpn, waits for DIR/PEER.qpn and connects to it. */
static inline void exchange_and_connect(struct ibv_qp *qp, const char *dir, const char *role, const char *peer)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.qpn", dir, role);
    write_file(path, "%u\n", qp->qp_num);
    snprintf(path, sizeof path, "%s/%s.qpn", dir, peer);
    unsigned long remote = 0;
    if (wait_file(path, 20, &remote))
        die("no %s within 20 s", path);
    connect_qp(qp, (uint32_t)remote, 7);
}

static inline struct ibv_qp *make_rc_qp(struct ibv_pd *pd, struct ibv_cq *cq, uint32_t send, uint32_t recv)
{
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = send;
    ia.cap.max_recv_wr = recv;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    struct ibv_qp *qp = ibv_create_qp(pd, &ia);
    if (!qp)
        die("ibv_create_qp: %s", strerror(errno));
    return qp;
}

#endif
