/* rogue.c - a test-only peer that misbehaves towards a router, for
 * tests/test_swarm.sh. Never part of the swarm binary.
 *
 *   rogue garbage ENDPOINT ROUTER_PUB   CURVE-authenticated, then frames that
 *                                       are no swarm message at all
 *   rogue oldproto ENDPOINT ROUTER_PUB  a well-formed HELLO of protocol 0;
 *                                       prints the router's ERROR reason
 *   rogue crowd N ENDPOINT ROUTER_PUB   N peers with keys of their own connect
 *                                       and say HELLO, all at once; it counts
 *                                       the ASSIGNs, then all leave without a
 *                                       word: a crowd that comes and goes
 *   rogue badrouter KEYNAME             a router with the key pair KEYNAME that
 *                                       answers every message with a STATUS
 *                                       no router sends (a string for the
 *                                       step); prints its endpoint, runs
 *                                       until killed
 *   rogue escrouter KEYNAME             the same, but its answer is an ERROR
 *                                       whose reason holds terminal escapes
 *                                       (it clears the screen, retitles it)
 *   rogue bigrouter KEYNAME MIB         the same, but its answer is an ERROR
 *                                       fatal=1 carrying a tensor of MIB MiB;
 *                                       prints "rogue: big answer N" each time
 *   rogue beatrouter KEYNAME            the same, but its answer is a HEARTBEAT
 *                                       whose beat_ms is no interval (20 ms,
 *                                       and a terminal escape)
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

// One peer of the crowd: HELLO as peer `i`; 1 when the router answered ASSIGN.
static int s_crowd_one(net_client_t *c, int i)
{
    char meta[128], err[256];
    snprintf(meta, sizeof meta, "proto=1\nname=crowd%d\ndevice=cpu\ntok_s=1000\n", i);
    net_msg_t *hello = net_msg_new(NET_MSG_HELLO), *reply = NULL;
    if (net_msg_set_meta(hello, meta) != 0) {
        net_msg_destroy(&hello);
        return 0;
    }
    net_retry_t retry = { 3000, 2 };
    int rc = net_client_request(c, &hello, &retry, &reply, err, sizeof err);
    int assigned = rc == 0 && net_msg_head_const(reply)->type == NET_MSG_ASSIGN;
    if (!assigned && i == 1)
        fprintf(stderr, "rogue: crowd1: %s\n", rc != 0 ? err : net_msg_type_name(net_msg_head_const(reply)->type));
    net_msg_destroy(&reply);
    return assigned;
}

static int s_crowd(int n, const char *endpoint, const char *router_pub)
{
    net_key_t *server = NULL;
    net_client_t **c = calloc((size_t) n, sizeof *c);
    net_key_t **key = calloc((size_t) n, sizeof *key);
    if (!c || !key || net_key_from_z85(router_pub, &server) != 0)
        return 2;
    int assigned = 0;
    for (int k = 0; k < n; k++) { // all of them connected at once
        char err[256];
        net_client_config_t cfg = {
            .endpoint = endpoint, .server = server,
            .limits = { .max_tensors = NET_TENSORS_MAX, .max_dims = 4, .max_dim = 1u << 24,
                        .max_payload = 1u << 26, .max_meta = 4096 },
        };
        if (net_key_generate(&key[k]) != 0)
            break;
        cfg.key = key[k];
        if (net_client_new(&cfg, &c[k], err, sizeof err) != 0) {
            fprintf(stderr, "rogue: crowd%d: %s\n", k + 1, err);
            break;
        }
        assigned += s_crowd_one(c[k], k + 1);
    }
    for (int k = 0; k < n; k++) { // then gone, without a BYE
        net_client_destroy(&c[k]);
        net_key_destroy(&key[k]);
    }
    free(c);
    free(key);
    net_key_destroy(&server);
    printf("rogue: %d of %d peers assigned a stage\n", assigned, n);
    return assigned == n ? 0 : 1;
}

enum { BAD_STATUS, BAD_ESCAPES, BAD_BEAT };

static int s_badrouter(const char *keyname, int kind, uint32_t mib)
{
    char err[256];
    net_key_t *key = NULL;
    net_server_t *srv = NULL;
    net_server_config_t cfg = {
        .endpoint = "tcp://127.0.0.1:*",
        .limits = { .max_tensors = 0, .max_dims = 1, .max_dim = 1, .max_payload = 1, .max_meta = 4096 },
    };
    uint32_t floats = mib * (1u << 18);
    float *big = mib ? calloc(floats, sizeof *big) : NULL;
    if (mib && !big)
        return 2;
    if (net_key_load(keyname, &key, err, sizeof err) < 0 ||
        (cfg.key = key, net_server_new(&cfg, &srv, err, sizeof err)) < 0) {
        fprintf(stderr, "rogue: %s\n", err);
        net_key_destroy(&key);
        return 2;
    }
    printf("rogue: listening on %s\n", net_server_endpoint(srv));
    fflush(stdout);
    for (;;) {
        net_peer_t who;
        net_msg_t *m = NULL;
        if (net_server_recv(srv, net_clock_ms() + 1000, &who, &m, err, sizeof err) < 0)
            continue;
        int type = kind == BAD_BEAT ? NET_MSG_HEARTBEAT
                 : kind == BAD_ESCAPES || big ? NET_MSG_ERROR : NET_MSG_STATUS;
        net_msg_t *reply = net_msg_reply(m, type);
        net_msg_destroy(&m);
        const char *meta = big ? "reason=this router is done with you\nfatal=1"
                         : kind == BAD_ESCAPES ? "reason=\033[2J\033]0;owned\007you are \033[31mbanned\033[0m\nfatal=1"
                         : kind == BAD_BEAT ? "beat_ms=20\033[2J"
                                            : "{\"step\": \"twelve\", \"state\": \"training\"}";
        if (reply && big && net_msg_add_tensor(reply, NET_DTYPE_F32, &floats, 1, big) != 0)
            net_msg_destroy(&reply);
        if (reply && net_msg_set_meta(reply, meta) == 0) {
            if (net_server_send(srv, &who, &reply) < 0)
                fprintf(stderr, "rogue: a reply was not sent\n");
            else if (big)
                printf("rogue: big answer %u MiB\n", mib);
            fflush(stdout);
        }
        net_msg_destroy(&reply);
    }
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "badrouter"))
        return s_badrouter(argv[2], BAD_STATUS, 0);
    if (argc == 3 && !strcmp(argv[1], "escrouter"))
        return s_badrouter(argv[2], BAD_ESCAPES, 0);
    if (argc == 3 && !strcmp(argv[1], "beatrouter"))
        return s_badrouter(argv[2], BAD_BEAT, 0);
    if (argc == 4 && !strcmp(argv[1], "bigrouter"))
        return s_badrouter(argv[2], BAD_STATUS, (uint32_t) atoi(argv[3]));
    if (argc == 5 && !strcmp(argv[1], "crowd"))
        return s_crowd(atoi(argv[2]), argv[3], argv[4]);
    if (argc != 4) {
        fprintf(stderr, "usage: rogue garbage|oldproto ENDPOINT ROUTER_PUB_Z85\n"
                        "       rogue crowd N ENDPOINT ROUTER_PUB_Z85\n"
                        "       rogue badrouter|escrouter|beatrouter KEYNAME\n"
                        "       rogue bigrouter KEYNAME MIB\n");
        return 2;
    }
    if (!strcmp(argv[1], "garbage"))
        return s_garbage(argv[2], argv[3]);
    if (!strcmp(argv[1], "oldproto"))
        return s_oldproto(argv[2], argv[3]);
    fprintf(stderr, "rogue: unknown mode %s\n", argv[1]);
    return 2;
}
