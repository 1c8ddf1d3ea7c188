/* The connection manager of the sim device reports a REQ's and a REP's initiator depth and responder resources
 * from the receiver's side, as the IB CM does: the sender's initiator_depth is the receiver's
 * responder_resources and the other way round. SPDK's NVMe host connects with responder_resources = 16 and
 * initiator_depth = 0, and its target rejects a CONNECT_REQUEST whose initiator_depth is 0: every host was
 * rejected while the daemon passed the values through unswapped. Both sides in this process, through the
 * daemon; run under `sqdisc-sim run` (scripts/simdev-tests.sh). */
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...) do { fprintf(stderr, "cm_depths: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type)
{
    struct rdma_cm_event *ev = NULL;
    if (rdma_get_cm_event(ch, &ev))
        FAIL("rdma_get_cm_event failed waiting for %s", rdma_event_str(type));
    if (ev->event != type)
        FAIL("got %s (status %d), wanted %s", rdma_event_str(ev->event), ev->status, rdma_event_str(type));
    return ev;
}

static struct ibv_qp *make_qp(struct rdma_cm_id *id)
{
    struct ibv_cq *cq = ibv_create_cq(id->verbs, 16, NULL, NULL, 0);
    struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                   .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
    if (!cq || rdma_create_qp(id, NULL, &qa))
        FAIL("CQ or QP failed");
    return id->qp;
}

int main(void)
{
    struct rdma_event_channel *sch = rdma_create_event_channel(), *cch = rdma_create_event_channel();
    struct rdma_cm_id *listen = NULL, *client = NULL;
    if (!sch || !cch || rdma_create_id(sch, &listen, NULL, RDMA_PS_TCP) || rdma_create_id(cch, &client, NULL, RDMA_PS_TCP))
        FAIL("event channels or identifiers failed (is the sim's preload library loaded?)");
    struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons(24420) };
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (rdma_bind_addr(listen, (struct sockaddr *)&addr) || rdma_listen(listen, 4))
        FAIL("bind or listen failed");
    if (rdma_resolve_addr(client, NULL, (struct sockaddr *)&addr, 1000))
        FAIL("rdma_resolve_addr failed");
    rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
    if (rdma_resolve_route(client, 1000))
        FAIL("rdma_resolve_route failed");
    rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
    make_qp(client);

    /* As SPDK's host: it serves RDMA READs (responder resources) and issues none (initiator depth 0). */
    struct rdma_conn_param cp = { .responder_resources = 16, .initiator_depth = 0, .retry_count = 7, .rnr_retry_count = 7 };
    if (rdma_connect(client, &cp))
        FAIL("rdma_connect failed");
    struct rdma_cm_event *req = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
    if (req->param.conn.initiator_depth != 16 || req->param.conn.responder_resources != 0)
        FAIL("CONNECT_REQUEST shows initiator_depth %u, responder_resources %u; the receiver's view is 16 and 0",
             req->param.conn.initiator_depth, req->param.conn.responder_resources);
    struct rdma_cm_id *server = req->id;
    rdma_ack_cm_event(req);
    make_qp(server);

    /* As SPDK's target: it issues RDMA READs (initiator depth) and serves none. */
    struct rdma_conn_param ap = { .responder_resources = 0, .initiator_depth = 16, .rnr_retry_count = 7 };
    if (rdma_accept(server, &ap))
        FAIL("rdma_accept failed");
    struct rdma_cm_event *est = expect(cch, RDMA_CM_EVENT_ESTABLISHED);
    if (est->param.conn.responder_resources != 16 || est->param.conn.initiator_depth != 0)
        FAIL("ESTABLISHED shows responder_resources %u, initiator_depth %u; the receiver's view is 16 and 0",
             est->param.conn.responder_resources, est->param.conn.initiator_depth);
    rdma_ack_cm_event(est);
    rdma_ack_cm_event(expect(sch, RDMA_CM_EVENT_ESTABLISHED));

    rdma_disconnect(client);
    printf("cm_depths: ok\n");
    return 0;
}
