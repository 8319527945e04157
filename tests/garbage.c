/* garbage.c - a test-only flood of hostile input at a router's port, for
 * tests/test_garbage.sh. Never part of the swarm binary.
 *
 *   garbage ENDPOINT ROUTER_PUB_Z85 SECONDS [SEED]
 *
 * For SECONDS, in turns: (a) raw TCP connections that send random bytes,
 * partial or wrong ZMTP greetings and broken CURVE handshakes, closed at
 * once or left hanging; (b) CURVE-authenticated clients (an open swarm
 * admits any key) that send random well-formed headers (right magic and
 * version, random types, flags, shapes and payloads), truncated multipart
 * messages, frames over the router's size limit, and HELLOs of no valid
 * protocol. It never says a valid HELLO: it never joins. Prints what it
 * sent; exits 0 unless it could not start.
 */
#include "wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HANGING_MAX 32          // raw connections left open at once
#define OVERSIZE (4u << 20)     // bytes of a frame over any tiny router's limit

typedef struct {
    uint64_t rng;               // xorshift state
    struct sockaddr_in addr;    // the router's TCP address
    char router_pub[41];        // its Z85 key
    const char *endpoint;       // tcp://HOST:PORT
    int hanging[HANGING_MAX];   // raw sockets left open, -1 free
    // what was sent
    long tcp_connects, tcp_bytes, curve_clients, msgs, headers_ok, truncated, oversized,
        hellos, statuses, replies;
} garbage_t;

static uint32_t s_rand(garbage_t *g)
{
    g->rng ^= g->rng << 13;
    g->rng ^= g->rng >> 7;
    g->rng ^= g->rng << 17;
    return (uint32_t) (g->rng >> 16);
}

static void s_fill(garbage_t *g, uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t) s_rand(g);
}

static double s_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + 1e-9 * (double) t.tv_nsec;
}

// ---- (a) raw TCP -------------------------------------------------------------

// A ZMTP 3.0 greeting, cut at a random place or with a wrong field.
static size_t s_greeting(garbage_t *g, uint8_t *out)
{
    uint8_t gr[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0};
    memcpy(gr + 12, s_rand(g) % 2 ? "CURVE" : (s_rand(g) % 2 ? "NULL" : "PLAIN"), 5);
    switch (s_rand(g) % 4) {
    case 0: gr[10] = (uint8_t) s_rand(g); break;     // an unknown major version
    case 1: gr[9] = (uint8_t) s_rand(g); break;      // a broken signature
    case 2: gr[32] = 1; break;                       // claims to be a server too
    default: break;
    }
    size_t n = 64;
    if (s_rand(g) % 2) { // and a CURVE HELLO command of random bytes
        out[64] = 0x04;
        out[65] = (uint8_t) (s_rand(g) % 256);
        memcpy(out + 66, "\x05HELLO", 6);
        s_fill(g, out + 72, out[65] > 6 ? out[65] - 6u : 0u);
        n = 66 + out[65];
    }
    memcpy(out, gr, 64);
    return s_rand(g) % 3 ? n : s_rand(g) % n; // often cut short
}

static void s_tcp_once(garbage_t *g)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return;
    struct timeval tv = {0, 200000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *) &g->addr, sizeof g->addr) != 0) {
        close(fd);
        return;
    }
    g->tcp_connects++;
    uint8_t buf[2048];
    size_t n;
    if (s_rand(g) % 2) {
        n = s_greeting(g, buf);
    } else {
        n = s_rand(g) % sizeof buf;
        s_fill(g, buf, n);
    }
    ssize_t w = n ? send(fd, buf, n, MSG_NOSIGNAL) : 0;
    g->tcp_bytes += w > 0 ? w : 0;
    int slot = (int) (s_rand(g) % (HANGING_MAX * 4));
    if (slot < HANGING_MAX) { // left hanging (the router's handshake timer ends it)
        if (g->hanging[slot] >= 0)
            close(g->hanging[slot]);
        g->hanging[slot] = fd;
    } else {
        close(fd);
    }
}

// ---- (b) CURVE clients ---------------------------------------------------------

static void *s_curve_open(garbage_t *g, void *ctx)
{
    char pub[41], sec[41];
    if (zmq_curve_keypair(pub, sec) != 0)
        return NULL;
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0, hwm = 200;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, g->router_pub, 40);
    zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pub, 40);
    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, sec, 40);
    if (s_rand(g) % 8) // mostly the routing id the router expects (its key), so
        zmq_setsockopt(s, ZMQ_ROUTING_ID, pub, 40); // messages reach the decoder
    zmq_connect(s, g->endpoint);
    g->curve_clients++;
    return s;
}

// A random header: valid magic and version, random everything else; the
// shapes usually consistent (the payload's size is right), sometimes not.
static void s_random_head(garbage_t *g, net_head_t *h)
{
    memset(h, 0, sizeof *h);
    h->type = (uint16_t) (s_rand(g) % 5 ? 1 + s_rand(g) % NET_MSG_TYPE_MAX : s_rand(g));
    if (h->type == NET_MSG_HELLO)
        h->type = NET_MSG_HEARTBEAT; // HELLOs are made on purpose below
    h->flags = (uint8_t) (s_rand(g) % 4 ? s_rand(g) % 2 : s_rand(g));
    h->id = ((uint64_t) s_rand(g) << 32) | s_rand(g);
    h->step = s_rand(g) % 4 ? s_rand(g) % 100 : ((uint64_t) s_rand(g) << 32);
    h->stage = s_rand(g) % 4 ? s_rand(g) % 4 : s_rand(g);
    h->mb = s_rand(g) % 4 ? s_rand(g) % 8 : s_rand(g);
    h->ntensors = (uint8_t) (s_rand(g) % (NET_TENSORS_MAX + 1));
    for (unsigned t = 0; t < h->ntensors; t++) {
        net_shape_t *s = &h->tensors[t];
        s->dtype = (uint8_t) (s_rand(g) % 8 ? 1 + s_rand(g) % NET_DTYPE_MAX : s_rand(g));
        s->ndims = (uint8_t) (1 + s_rand(g) % NET_DIMS_MAX);
        uint64_t n = 1;
        for (int d = 0; d < s->ndims; d++) {
            s->dims[d] = s_rand(g) % 16 ? 1 + s_rand(g) % 32 : s_rand(g);
            n *= s->dims[d] < 4096 ? s->dims[d] : 1;
        }
        s->bytes = net_codec_bytes(s->dtype, n);
        if (s_rand(g) % 16 == 0)
            s->bytes = s_rand(g) % 8192;
    }
    h->meta_len = s_rand(g) % 3 ? 0 : s_rand(g) % 300;
}

static void s_send_frames(void *s, zmq_msg_t *frames, int n)
{
    for (int i = 0; i < n; i++)
        if (zmq_msg_send(&frames[i], s, ZMQ_DONTWAIT | (i + 1 < n ? ZMQ_SNDMORE : 0)) < 0)
            zmq_msg_close(&frames[i]);
}

static void s_frame(zmq_msg_t *f, const void *data, size_t n)
{
    zmq_msg_init_size(f, n);
    if (n)
        memcpy(zmq_msg_data(f), data, n);
}

// One message: a random header, its payloads and meta, maybe truncated.
static void s_message(garbage_t *g, void *s)
{
    net_head_t h;
    s_random_head(g, &h);
    uint8_t head[NET_WIRE_HEAD_MAX], payload[8192];
    zmq_msg_t frames[NET_WIRE_FRAMES_MAX + 2];
    int n = 0;
    size_t hlen = net_wire_head_encode(&h, head, sizeof head);
    if (s_rand(g) % 16 == 0) // a bad byte anywhere in the header
        head[s_rand(g) % hlen] ^= (uint8_t) (1 + s_rand(g) % 255);
    s_frame(&frames[n++], head, hlen);
    for (unsigned t = 0; t < h.ntensors; t++) {
        size_t bytes = h.tensors[t].bytes < sizeof payload ? h.tensors[t].bytes : sizeof payload;
        s_fill(g, payload, bytes);
        s_frame(&frames[n++], payload, bytes);
    }
    if (h.meta_len) {
        char meta[300];
        for (uint32_t i = 0; i < h.meta_len; i++) // text, mostly; a NUL now and then
            meta[i] = s_rand(g) % 50 ? (char) (32 + s_rand(g) % 95) : (char) (s_rand(g) % 16);
        s_frame(&frames[n++], meta, h.meta_len);
    }
    if (n > 1 && s_rand(g) % 6 == 0) { // truncated: the last frames never come
        int keep = 1 + (int) (s_rand(g) % (unsigned) (n - 1));
        for (int i = keep; i < n; i++)
            zmq_msg_close(&frames[i]);
        n = keep;
        g->truncated++;
    } else if (s_rand(g) % 10 == 0) { // or one frame too many
        s_frame(&frames[n++], "extra", 5);
    }
    s_send_frames(s, frames, n);
    g->msgs++;
    g->headers_ok++;
}

// A HELLO that no router may accept: no proto, a wrong one, or junk meta.
static void s_hello(garbage_t *g, void *s)
{
    static const char *metas[] = {
        "name=garbage", "proto=0\nname=old", "proto=2\nname=new", "proto=\n", "proto=1x",
        "proto=\033[2J\033[31mred", "proto=11111111111111111111111111111111",
        "name=a\nproto= 1",
    };
    net_head_t h = {.type = NET_MSG_HELLO, .id = s_rand(g)};
    const char *meta = metas[s_rand(g) % (sizeof metas / sizeof metas[0])];
    h.meta_len = (uint32_t) strlen(meta);
    uint8_t head[NET_WIRE_HEAD_MAX];
    zmq_msg_t frames[2];
    s_frame(&frames[0], head, net_wire_head_encode(&h, head, sizeof head));
    s_frame(&frames[1], meta, h.meta_len);
    s_send_frames(s, frames, 2);
    g->msgs++;
    g->hellos++;
}

static void s_oversized(garbage_t *g, void *s)
{
    static uint8_t *big;
    if (!big && !(big = calloc(1, OVERSIZE)))
        return;
    zmq_msg_t f;
    s_frame(&f, big, OVERSIZE); // over MAXMSGSIZE: the router drops the link
    s_send_frames(s, &f, 1);
    g->msgs++;
    g->oversized++;
}

static void s_status(garbage_t *g, void *s)
{
    net_head_t h = {.type = NET_MSG_STATUS, .id = s_rand(g)};
    uint8_t head[NET_WIRE_HEAD_MAX];
    zmq_msg_t f;
    s_frame(&f, head, net_wire_head_encode(&h, head, sizeof head));
    s_send_frames(s, &f, 1);
    g->msgs++;
    g->statuses++;
}

// Read (and drop) whatever the router answered.
static void s_drain(garbage_t *g, void *s)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    while (zmq_msg_recv(&m, s, ZMQ_DONTWAIT) >= 0)
        g->replies += !zmq_msg_more(&m);
    zmq_msg_close(&m);
}

// ---- the run ---------------------------------------------------------------------

static int s_parse(garbage_t *g, int argc, char **argv, double *seconds)
{
    unsigned port = 0;
    char host[64] = "";
    if (argc < 4 || argc > 5 || sscanf(argv[1], "tcp://%63[^:]:%u", host, &port) != 2
        || strlen(argv[2]) != 40) {
        fprintf(stderr, "usage: garbage tcp://HOST:PORT ROUTER_PUB_Z85 SECONDS [SEED]\n");
        return -1;
    }
    g->endpoint = argv[1];
    memcpy(g->router_pub, argv[2], 41);
    *seconds = atof(argv[3]);
    g->rng = argc == 5 ? strtoull(argv[4], NULL, 10) | 1 : 0x9E3779B97F4A7C15ull;
    g->addr.sin_family = AF_INET;
    g->addr.sin_port = htons((uint16_t) port);
    if (inet_pton(AF_INET, host, &g->addr.sin_addr) != 1) {
        fprintf(stderr, "garbage: %s: give an IPv4 address\n", host);
        return -1;
    }
    for (int i = 0; i < HANGING_MAX; i++)
        g->hanging[i] = -1;
    return 0;
}

int main(int argc, char **argv)
{
    static garbage_t g;
    double seconds;
    if (s_parse(&g, argc, argv, &seconds) != 0)
        return 2;
    void *ctx = zmq_ctx_new();
    void *clients[4] = {0};
    double end = s_now() + seconds;
    for (long turn = 0; s_now() < end; turn++) {
        for (int i = 0; i < 4; i++) // (a) a few raw connections a turn
            s_tcp_once(&g);
        int c = (int) (s_rand(&g) % 4); // (b) one of 4 Curve clients, renewed now and then
        if (!clients[c] || s_rand(&g) % 50 == 0) {
            if (clients[c])
                zmq_close(clients[c]);
            clients[c] = s_curve_open(&g, ctx);
        }
        for (int i = 0; clients[c] && i < 20; i++) {
            unsigned r = s_rand(&g) % 1000;
            if (r < 20)
                s_hello(&g, clients[c]);
            else if (r < 30)
                s_status(&g, clients[c]);
            else if (r < 31)
                s_oversized(&g, clients[c]);
            else
                s_message(&g, clients[c]);
        }
        for (int i = 0; i < 4; i++)
            if (clients[i])
                s_drain(&g, clients[i]);
        usleep(5000); // a flood, but one that leaves the machine to the swarm too
    }
    for (int i = 0; i < 4; i++)
        if (clients[i])
            zmq_close(clients[i]);
    for (int i = 0; i < HANGING_MAX; i++)
        if (g.hanging[i] >= 0)
            close(g.hanging[i]);
    zmq_ctx_term(ctx);
    printf("garbage: %.0f s: %ld raw TCP connections (%ld bytes); %ld Curve clients sent %ld "
           "messages (%ld random headers, %ld truncated, %ld oversized, %ld bad HELLOs, "
           "%ld STATUS), got %ld replies\n", seconds, g.tcp_connects, g.tcp_bytes,
           g.curve_clients, g.msgs, g.headers_ok, g.truncated, g.oversized, g.hellos,
           g.statuses, g.replies);
    return 0;
}
