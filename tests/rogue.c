/* rogue.c - a test-only peer that misbehaves towards a router, for
 * tests/test_swarm.sh. Never part of the swarm binary.
 *
 *   rogue garbage ENDPOINT ROUTER_PUB   CURVE-authenticated, then frames that
 *                                       are no swarm message at all
 *   rogue oldproto ENDPOINT ROUTER_PUB  a well-formed HELLO of protocol 0;
 *                                       prints the router's ERROR reason
 */
#include "net.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

static int s_garbage(const char *endpoint, const char *router_pub)
{
    char pub[41], sec[41];
    if (zmq_curve_keypair(pub, sec) != 0)
        return 2;
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, router_pub, 40);
    zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pub, 40);
    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, sec, 40);
    zmq_connect(s, endpoint);
    unsigned char junk[300];
    srand(7);
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char) rand();
    // random bytes; a short frame; "SWRM" with nonsense after it; many parts
    zmq_send(s, junk, sizeof junk, 0);
    zmq_send(s, junk, 3, 0);
    memcpy(junk, "SWRM", 4);
    zmq_send(s, junk, 64, 0);
    zmq_send(s, junk, 40, ZMQ_SNDMORE);
    zmq_send(s, junk + 40, 100, ZMQ_SNDMORE);
    zmq_send(s, junk + 140, 100, 0);
    zmq_sleep(1);
    zmq_close(s);
    zmq_ctx_term(ctx);
    printf("rogue: sent 4 garbage messages\n");
    return 0;
}

static int s_oldproto(const char *endpoint, const char *router_pub)
{
    char err[256];
    net_key_t *key = NULL, *server = NULL;
    net_client_t *c = NULL;
    int rc = net_key_generate(&key);
    if (rc == 0)
        rc = net_key_from_z85(router_pub, &server);
    net_client_config_t cfg = {
        .endpoint = endpoint, .server = server, .key = key,
        .limits = { .max_tensors = 0, .max_dims = 1, .max_dim = 1, .max_payload = 1, .max_meta = 4096 },
    };
    if (rc == 0)
        rc = net_client_new(&cfg, &c, err, sizeof err);
    net_msg_t *hello = net_msg_new(NET_MSG_HELLO), *reply = NULL;
    if (rc == 0)
        rc = net_msg_set_meta(hello, "proto=0\nname=old\ndevice=cpu\ntok_s=1000\n");
    net_retry_t retry = { 2000, 2 };
    if (rc == 0)
        rc = net_client_request(c, &hello, &retry, &reply, err, sizeof err);
    else
        net_msg_destroy(&hello);
    char reason[256] = "";
    if (rc == 0 && net_msg_head_const(reply)->type == NET_MSG_ERROR
        && net_msg_meta_get(reply, "reason", reason, sizeof reason) == 0)
        printf("rogue: refused: %s\n", reason);
    else
        printf("rogue: no refusal (rc %d)\n", rc);
    net_msg_destroy(&reply);
    net_client_destroy(&c);
    net_key_destroy(&key);
    net_key_destroy(&server);
    return reason[0] ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: rogue garbage|oldproto ENDPOINT ROUTER_PUB_Z85\n");
        return 2;
    }
    if (!strcmp(argv[1], "garbage"))
        return s_garbage(argv[2], argv[3]);
    if (!strcmp(argv[1], "oldproto"))
        return s_oldproto(argv[2], argv[3]);
    fprintf(stderr, "rogue: unknown mode %s\n", argv[1]);
    return 2;
}
