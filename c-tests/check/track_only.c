/* A program that tells the checker about a CQ and a QP of a device context it never attaches (through the C
 * API, with no device at all: the objects are plain structs), then exits. The checker watched no post or poll:
 * its report at exit still comes, with what tracking found (the QP's CQ is too small for it) and a line saying
 * that nothing was watched. scripts/check-checker.sh reads the report. */

#include <stdio.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <sqdisc_check.h>

int main(void)
{
    static struct ibv_context ctx;
    static struct ibv_cq cq;
    static struct ibv_qp qp;
    struct ibv_qp_init_attr attr;
    cq.context = &ctx;
    cq.cqe = 2;
    qp.context = &ctx;
    qp.send_cq = qp.recv_cq = &cq;
    qp.qp_num = 0x42;
    qp.qp_type = IBV_QPT_RC;
    memset(&attr, 0, sizeof attr);
    attr.send_cq = attr.recv_cq = &cq;
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = 8;
    attr.cap.max_recv_wr = 1;
    if (sqd_check_track_cq(&cq) != 0 || sqd_check_track_qp(&qp, &attr) != 0) {
        printf("tracking failed: %s\n", sqd_check_last_error());
        return 1;
    }
    printf("done\n");
    return 0;
}
