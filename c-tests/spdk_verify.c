/* libsqdisc_spdk's optional buffer verifier: with SQDISC_SPDK_VERIFY_BUFFERS=1 in the environment when the
 * process makes its first qpair, the source bytes of every send WR are checksummed when SPDK flushes it and
 * when it is released; a WR whose buffer was written in between (SPDK reused it while the HCA could still
 * read it) is reported through spdk_log, naming the WR and the SGE, and counted in sqd_spdk_qp_stats. Buffers
 * left alone report nothing. Prints "PASS <name>". */

#define _POSIX_C_SOURCE 200809L
#include <sqdisc_spdk.h>
#include <sqdisc_sim.h>

#include "support/spdk_standin.h"

#include "support/spdk_world.h"

#include <stdlib.h>

static void a_buffer_written_in_flight_is_reported_with_its_wr(void)
{
    struct world w;
    struct rdma_cm_id id;
    current = "a_buffer_written_in_flight_is_reported_with_its_wr";
    world_new(&w, NULL, 1024);
    struct spdk_rdma_provider_qp *q = qpair_new(&w, &id, 16, 8, NULL, NULL);
    CHECK(q != NULL);
    peer_connect(&w, q->qp, 64);
    struct ibv_send_wr wrs[2], *bad = NULL;
    struct ibv_sge sg[2];
    struct ibv_wc wc[8];

    /* Untouched buffers: nothing reported. */
    int errors = standin.errors;
    write_wr(&w, &wrs[0], &sg[0], 0x10, 0);
    send_wr(&w, &wrs[1], &sg[1], 0x11);
    link_wrs(wrs, 2);
    spdk_rdma_provider_qp_queue_send_wrs(q, wrs);
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), 0);
    CHECK_EQ(reap(&w, wc, 8, 1, 50), 1);
    CHECK_EQ(standin.errors, errors);
    CHECK_EQ(qstats(q).verify_mismatches, 0);

    /* The WRITE's source written after the flush, before its release. */
    write_wr(&w, &wrs[0], &sg[0], 0x20, 0);
    send_wr(&w, &wrs[1], &sg[1], 0x21);
    link_wrs(wrs, 2);
    spdk_rdma_provider_qp_queue_send_wrs(q, wrs);
    CHECK_EQ(spdk_rdma_provider_qp_flush_send_wrs(q, &bad), 0);
    ((char *)(uintptr_t)sg[0].addr)[5] ^= 0x5a;
    CHECK_EQ(reap(&w, wc, 8, 1, 50), 1);
    CHECK(wc[0].wr_id == 0x21 && wc[0].status == IBV_WC_SUCCESS);
    CHECK_EQ(standin.errors, errors + 1);
    CHECK(strstr(standin.last_log, "SGE 0 of WR 0x20") != NULL);
    CHECK(strstr(standin.last_log, "written while the HCA could still read it") != NULL);
    CHECK_EQ(qstats(q).verify_mismatches, 1);

    spdk_rdma_provider_qp_destroy(q);
    world_free(&w);
    printf("PASS %s\n", current);
}

int main(void)
{
    /* Read once, at the first qpair. */
    CHECK_EQ(setenv("SQDISC_SPDK_VERIFY_BUFFERS", "1", 1), 0);
    a_buffer_written_in_flight_is_reported_with_its_wr();
    return 0;
}
