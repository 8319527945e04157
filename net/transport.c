/* transport.c - the router's ROUTER socket with its ZAP handler, the nodes'
 * DEALER, liveness, and the request helper. CurveZMQ always.
 *
 * A peer is its Curve public key as the ZAP handler saw it (User-Id); the
 * routing id it chose is only checked against it, never trusted. No call
 * blocks beyond the deadline it is given: LINGER 0, non-blocking sends,
 * polls bounded by deadlines. What a message means is the swarm's business.
 */
#include "wire.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_DOMAIN "swarm"
#define ZAP_PARTS 8                 // parts of a ZAP request we keep (7 in RFC 27)
#define CLIENT_BACKLOG 256          // messages kept while a request waits
#define HANDSHAKE_MS 10000          // a Curve handshake must finish within this

int64_t net_clock_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// ---- shared socket setup -----------------------------------------------------

static net_timing_t s_timing(const net_timing_t *given)
{
    net_timing_t t = *given;
    if (t.heartbeat_ms <= 0)
        t.heartbeat_ms = 1000;
    if (t.heartbeat_timeout_ms <= 0)
        t.heartbeat_timeout_ms = 3 * t.heartbeat_ms;
    if (t.dead_ms <= 0)
        t.dead_ms = 3000;
    if (t.hwm <= 0)
        t.hwm = 1000;
    return t;
}

// Options every socket gets: nothing lingers, frames are bounded by the
// limits, ZMTP heartbeats find dead links.
static int s_socket_setup(void *socket, const net_limits_t *limits, const net_timing_t *t)
{
    uint64_t part = limits->max_payload;
    if (part < limits->max_meta)
        part = limits->max_meta;
    if (part < NET_WIRE_HEAD_MAX)
        part = NET_WIRE_HEAD_MAX;
    int64_t maxmsg = (int64_t) part + NET_WIRE_CURVE_SLACK;
    int zero = 0, handshake = HANDSHAKE_MS;
    int ttl = t->heartbeat_timeout_ms;
    if (zmq_setsockopt(socket, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(socket, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) != 0 ||
        zmq_setsockopt(socket, ZMQ_HEARTBEAT_IVL, &t->heartbeat_ms, sizeof(int)) != 0 ||
        zmq_setsockopt(socket, ZMQ_HEARTBEAT_TIMEOUT, &t->heartbeat_timeout_ms, sizeof(int)) != 0 ||
        zmq_setsockopt(socket, ZMQ_HEARTBEAT_TTL, &ttl, sizeof ttl) != 0 ||
        zmq_setsockopt(socket, ZMQ_SNDHWM, &t->hwm, sizeof(int)) != 0 ||
        zmq_setsockopt(socket, ZMQ_RCVHWM, &t->hwm, sizeof(int)) != 0 ||
        zmq_setsockopt(socket, ZMQ_HANDSHAKE_IVL, &handshake, sizeof handshake) != 0)
        return -zmq_errno();
    return 0;
}

// Receive one message's frames, polling until deadline_ms.
// 0; -ETIMEDOUT; -EINTR; other -zmq_errno().
static int s_frames_wait(void *socket, int64_t deadline_ms, zmq_msg_t *parts, size_t cap,
                         size_t *total)
{
    for (;;) {
        int rc = net_frames_recv(socket, parts, cap, total);
        if (rc != -EAGAIN)
            return rc;
        int64_t wait = deadline_ms - net_clock_ms();
        if (wait <= 0)
            return -ETIMEDOUT;
        zmq_pollitem_t item = {socket, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, wait > INT_MAX ? INT_MAX : (long) wait) < 0)
            return -zmq_errno();
    }
}

static int s_fail(char *err, size_t errlen, int rc, const char *what)
{
    if (err && errlen)
        snprintf(err, errlen, "%s: %s", what, zmq_strerror(-rc));
    return rc;
}

// ---- liveness: the peers a server has heard from -----------------------------

typedef struct {
    char key[NET_KEY_Z85_LEN + 1];   // Z85 public key; "" = free slot
    int64_t last_ms;                 // net_clock_ms of the last message
} s_peer_t;

static size_t s_hash(const char *key)
{
    uint64_t h = 1469598103934665603ull; // FNV-1a
    for (int i = 0; i < NET_KEY_Z85_LEN; i++)
        h = (h ^ (uint8_t) key[i]) * 1099511628211ull;
    return (size_t) h;
}

// ---- server ----------------------------------------------------------------

struct net_server_s {
    void *ctx;                       // this server's own zmq context
    void *router;                    // the ROUTER socket
    void *zap;                       // ZAP REP socket, owned by zap_thread once started
    pthread_t zap_thread;            // answers ZAP requests until the context ends
    int zap_started;                 // 1 when zap_thread must be joined
    const net_allow_t *allow;        // borrowed; NULL = open mode
    uint8_t own[32];                 // our own public key: admitted with any allow-list
                                     // (whoever holds our key pair is the operator)
    char own_z85[NET_KEY_Z85_LEN + 1]; // the same, as a peer's key reads
    net_limits_t limits;             // what peers may send
    net_timing_t timing;             // heartbeats and dead_ms, defaults filled in
    char endpoint[256];              // the endpoint bound, with its port
    s_peer_t *peers;                 // (slots) open-addressing table of live peers
    size_t slots;                    // table size, a power of two, at most half used
    size_t npeers;                   // peers in the table
    size_t max_peers;                // peers tracked at most
    net_stats_t stats;               // counters (auth_denied: see zap_denied)
    atomic_uint_fast64_t zap_denied; // handshakes refused, written by zap_thread
};

// Twice the slots, the peers placed again: a table kept at most half full
// grows with the swarm (16 slots to start with, not max_peers' worth).
static int s_peers_grow(net_server_t *self)
{
    size_t slots = 2 * self->slots, mask = slots - 1;
    s_peer_t *peers = calloc(slots, sizeof *peers);
    if (!peers)
        return -ENOMEM;
    for (size_t i = 0; i < self->slots; i++) {
        if (!self->peers[i].key[0])
            continue;
        size_t k = s_hash(self->peers[i].key) & mask;
        while (peers[k].key[0])
            k = (k + 1) & mask;
        peers[k] = self->peers[i];
    }
    free(self->peers);
    self->peers = peers;
    self->slots = slots;
    return 0;
}

static s_peer_t *s_peer_find(net_server_t *self, const char *key, int add)
{
    if (add && 2 * (self->npeers + 1) > self->slots && self->npeers < self->max_peers
        && s_peers_grow(self) != 0)
        return NULL; // out of memory: untracked, as one over max_peers
    size_t mask = self->slots - 1;
    for (size_t i = s_hash(key) & mask;; i = (i + 1) & mask) {
        s_peer_t *p = &self->peers[i];
        if (strcmp(p->key, key) == 0)
            return p;
        if (p->key[0] == '\0') {
            if (!add || self->npeers >= self->max_peers)
                return NULL;
            memcpy(p->key, key, sizeof p->key);
            self->npeers++;
            return p;
        }
    }
}

// Remove a slot, shifting later members of its cluster back (no tombstones).
static void s_peer_remove(net_server_t *self, s_peer_t *p)
{
    size_t mask = self->slots - 1;
    size_t hole = (size_t) (p - self->peers);
    p->key[0] = '\0';
    self->npeers--;
    for (size_t i = (hole + 1) & mask; self->peers[i].key[0]; i = (i + 1) & mask) {
        size_t home = s_hash(self->peers[i].key) & mask;
        // move i into the hole unless its home lies cyclically in (hole, i]
        if (((i - home) & mask) >= ((i - hole) & mask)) {
            self->peers[hole] = self->peers[i];
            self->peers[i].key[0] = '\0';
            hole = i;
        }
    }
}

void net_server_set_dead_ms(net_server_t *self, int dead_ms)
{
    if (dead_ms > 0)
        self->timing.dead_ms = dead_ms;
}

void net_server_reap(net_server_t *self, int64_t now_ms, net_peer_t *dead, size_t cap,
                     size_t *n)
{
    *n = 0;
    for (size_t i = 0; i < self->slots && *n < cap;) {
        s_peer_t *p = &self->peers[i];
        if (p->key[0] && now_ms - p->last_ms > self->timing.dead_ms) {
            memset(&dead[*n], 0, sizeof dead[*n]);
            memcpy(dead[(*n)++].key, p->key, sizeof p->key);
            s_peer_remove(self, p); // may move another peer into slot i: look again
            continue;
        }
        i++;
    }
}

// ---- ZAP handler (RFC 27) ------------------------------------------------------

// Answer one request of n parts (parts[] holds the first ZAP_PARTS):
// 200 with the Z85 key as User-Id, or 400.
static void s_zap_answer(net_server_t *self, zmq_msg_t *parts, size_t n)
{
    char user[NET_KEY_Z85_LEN + 1] = "";
    const char *status = "400", *text = "malformed ZAP request";
    if (n == 7 && zmq_msg_size(&parts[0]) == 3 && memcmp(zmq_msg_data(&parts[0]), "1.0", 3) == 0 &&
        zmq_msg_size(&parts[5]) == 5 && memcmp(zmq_msg_data(&parts[5]), "CURVE", 5) == 0 &&
        zmq_msg_size(&parts[6]) == 32) {
        const uint8_t *key = zmq_msg_data(&parts[6]);
        zmq_z85_encode(user, key, 32);
        if (!self->allow || net_allow_contains_raw(self->allow, key)
            || !memcmp(key, self->own, sizeof self->own)) {
            status = "200";
            text = "OK";
        } else {
            text = "key not in the allow-list";
            user[0] = '\0';
        }
    }
    if (status[0] != '2')
        atomic_fetch_add(&self->zap_denied, 1);
    // a REP must answer before it can receive again, even a request this bad
    zmq_send(self->zap, "1.0", 3, ZMQ_SNDMORE);
    if (n >= 2)
        zmq_send(self->zap, zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]), ZMQ_SNDMORE);
    else
        zmq_send(self->zap, "", 0, ZMQ_SNDMORE);
    zmq_send(self->zap, status, 3, ZMQ_SNDMORE);
    zmq_send(self->zap, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(self->zap, user, strlen(user), ZMQ_SNDMORE);
    zmq_send(self->zap, "", 0, 0);
}

// Runs until the context is shut down (net_server_destroy).
static void *s_zap_run(void *arg)
{
    net_server_t *self = arg;
    for (;;) {
        zmq_msg_t parts[ZAP_PARTS];
        size_t total = 0;
        zmq_pollitem_t item = {self->zap, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, -1) < 0) {
            if (zmq_errno() == EINTR)
                continue;
            break; // ETERM: the server is going away
        }
        int rc = net_frames_recv(self->zap, parts, ZAP_PARTS, &total);
        if (rc == -EAGAIN || rc == -EINTR)
            continue;
        if (rc < 0)
            break;
        size_t kept = total < ZAP_PARTS ? total : ZAP_PARTS;
        s_zap_answer(self, parts, total);
        net_frames_close(parts, kept);
    }
    zmq_close(self->zap);
    return NULL;
}

// ---- server life ---------------------------------------------------------------

static int s_server_check(const net_server_config_t *c, char *err, size_t errlen)
{
    if (!c || !c->endpoint || !c->key || !net_key_secret_raw(c->key)) {
        snprintf(err, errlen, "router: needs an endpoint and its own key pair (secret key)");
        return -EINVAL;
    }
    if (!zmq_has("curve")) {
        snprintf(err, errlen, "libzmq %d.%d.%d was built without CURVE: swarm refuses to run "
                 "unencrypted; install a libzmq with libsodium (Debian: libzmq5)",
                 ZMQ_VERSION_MAJOR, ZMQ_VERSION_MINOR, ZMQ_VERSION_PATCH);
        return -ENOTSUP;
    }
    return net_limits_check(&c->limits, err, errlen);
}

// The ZAP handler first: were it missing, libzmq would let every Curve
// client in. Its bind failing is fatal.
static int s_server_zap_start(net_server_t *self, char *err, size_t errlen)
{
    int zero = 0;
    self->zap = zmq_socket(self->ctx, ZMQ_REP);
    if (!self->zap)
        return s_fail(err, errlen, -zmq_errno(), "router: ZAP socket");
    zmq_setsockopt(self->zap, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(self->zap, ZAP_ENDPOINT) != 0) {
        int rc = s_fail(err, errlen, -zmq_errno(), "router: ZAP handler bind " ZAP_ENDPOINT);
        zmq_close(self->zap);
        return rc;
    }
    if (pthread_create(&self->zap_thread, NULL, s_zap_run, self) != 0) {
        zmq_close(self->zap);
        return s_fail(err, errlen, -EAGAIN, "router: ZAP thread");
    }
    self->zap_started = 1;
    return 0;
}

static int s_server_bind(net_server_t *self, const net_server_config_t *c, char *err,
                         size_t errlen)
{
    int one = 1;
    self->router = zmq_socket(self->ctx, ZMQ_ROUTER);
    if (!self->router)
        return s_fail(err, errlen, -zmq_errno(), "router: socket");
    int rc = s_socket_setup(self->router, &self->limits, &self->timing);
    if (rc == 0 &&
        (zmq_setsockopt(self->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one) != 0 ||
         zmq_setsockopt(self->router, ZMQ_ROUTER_HANDOVER, &one, sizeof one) != 0 ||
         zmq_setsockopt(self->router, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
         zmq_setsockopt(self->router, ZMQ_CURVE_SECRETKEY, net_key_secret_raw(c->key), 32) != 0 ||
         zmq_setsockopt(self->router, ZMQ_ZAP_DOMAIN, ZAP_DOMAIN, strlen(ZAP_DOMAIN)) != 0))
        rc = -zmq_errno();
    if (rc < 0)
        return s_fail(err, errlen, rc, "router: socket options");
    if (zmq_bind(self->router, c->endpoint) != 0) {
        rc = -zmq_errno();
        snprintf(err, errlen, "router: bind %s: %s", c->endpoint, zmq_strerror(-rc));
        return rc;
    }
    size_t len = sizeof self->endpoint;
    if (zmq_getsockopt(self->router, ZMQ_LAST_ENDPOINT, self->endpoint, &len) != 0)
        return s_fail(err, errlen, -zmq_errno(), "router: endpoint");
    return 0;
}

int net_server_new(const net_server_config_t *config, net_server_t **out, char *err,
                   size_t errlen)
{
    *out = NULL;
    int rc = s_server_check(config, err, errlen);
    if (rc < 0)
        return rc;
    net_server_t *self = calloc(1, sizeof *self);
    if (!self)
        return -ENOMEM;
    self->allow = config->allow;
    memcpy(self->own, net_key_public_raw(config->key), sizeof self->own);
    snprintf(self->own_z85, sizeof self->own_z85, "%s", net_key_public(config->key));
    self->limits = config->limits;
    self->timing = s_timing(&config->timing);
    self->max_peers = config->max_peers > 0 ? (size_t) config->max_peers : 4096;
    self->slots = 16;
    self->peers = calloc(self->slots, sizeof *self->peers);
    self->ctx = zmq_ctx_new();
    if (!self->peers || !self->ctx) {
        rc = -ENOMEM;
        goto out_destroy;
    }
    // two I/O threads: CurveZMQ encrypts and decrypts in them, and a server
    // moves every peer's traffic (between steps, a stage-sized gradient
    // each way for each replica): peers' connections are spread over both
    zmq_ctx_set(self->ctx, ZMQ_IO_THREADS, 2);
    rc = s_server_zap_start(self, err, errlen);
    if (rc == 0)
        rc = s_server_bind(self, config, err, errlen);
    if (rc < 0)
        goto out_destroy;
    *out = self;
    return 0;
out_destroy:
    net_server_destroy(&self);
    return rc;
}

void net_server_destroy(net_server_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    net_server_t *self = *self_p;
    if (self->router)
        zmq_close(self->router);
    if (self->ctx) {
        zmq_ctx_shutdown(self->ctx); // the ZAP thread's poll returns ETERM
        if (self->zap_started)
            pthread_join(self->zap_thread, NULL);
        zmq_ctx_term(self->ctx);
    }
    free(self->peers);
    free(self);
    *self_p = NULL;
}

const char *net_server_endpoint(const net_server_t *self)
{
    return self->endpoint;
}

void net_server_stats(const net_server_t *self, net_stats_t *out)
{
    *out = self->stats;
    out->auth_denied = atomic_load(&((net_server_t *) self)->zap_denied);
}

// ---- server traffic --------------------------------------------------------------

// Who sent parts[]: the ZAP User-Id, which must begin the routing id the
// peer chose (net_client sets KEY/INSTANCE). 0 or -EPROTO.
static int s_server_sender(zmq_msg_t *parts, size_t kept, net_peer_t *peer, char *err,
                           size_t errlen)
{
    memset(peer, 0, sizeof *peer);
    const char *user = kept >= 2 ? zmq_msg_gets(&parts[1], "User-Id") : NULL;
    if (!user || strlen(user) != NET_KEY_Z85_LEN) {
        snprintf(err, errlen, "message without a Curve User-Id (ZAP did not run?)");
        return -EPROTO;
    }
    memcpy(peer->key, user, sizeof peer->key);
    const char *rid = zmq_msg_data(&parts[0]);
    size_t len = zmq_msg_size(&parts[0]);
    int ok = len >= NET_KEY_Z85_LEN && len <= NET_CONN_MAX
             && memcmp(rid, user, NET_KEY_Z85_LEN) == 0
             && (len == NET_KEY_Z85_LEN || (len > NET_KEY_Z85_LEN + 1 && rid[NET_KEY_Z85_LEN] == '/'));
    for (size_t i = NET_KEY_Z85_LEN + 1; ok && i < len; i++)
        ok = (rid[i] >= '0' && rid[i] <= '9') || (rid[i] >= 'a' && rid[i] <= 'f');
    if (!ok) {
        snprintf(err, errlen, "peer %.8s: routing id is not its key (forged or foreign client)",
                 user);
        return -EPROTO;
    }
    memcpy(peer->conn, rid, len);
    return 0;
}

int net_server_recv(net_server_t *self, int64_t deadline_ms, net_peer_t *peer,
                    net_msg_t **out, char *err, size_t errlen)
{
    zmq_msg_t parts[1 + NET_WIRE_FRAMES_MAX];
    size_t total = 0;
    *out = NULL;
    int rc = s_frames_wait(self->router, deadline_ms, parts, 1 + NET_WIRE_FRAMES_MAX, &total);
    if (rc < 0)
        return rc;
    size_t kept = total < 1 + NET_WIRE_FRAMES_MAX ? total : 1 + NET_WIRE_FRAMES_MAX;
    rc = s_server_sender(parts, kept, peer, err, errlen);
    if (rc < 0) {
        net_frames_close(parts, kept);
        self->stats.bad++;
        return rc;
    }
    // ZAP checked the key at the handshake; the list may have changed since
    if (self->allow && !net_allow_contains(self->allow, peer->key)
        && strcmp(peer->key, self->own_z85) != 0) {
        net_frames_close(parts, kept);
        self->stats.revoked++;
        snprintf(err, errlen, "peer %.8s: key no longer on the allow-list: message dropped",
                 peer->key);
        return -EPROTO;
    }
    s_peer_t *live = s_peer_find(self, peer->key, 1);
    if (live)
        live->last_ms = net_clock_ms();
    char reason[200];
    rc = net_msg_from_frames(parts + 1, kept - 1, total - 1, &self->limits, out, reason,
                             sizeof reason);
    zmq_msg_close(&parts[0]); // the routing id: from_frames closed the rest
    if (rc == -EPROTO) {
        self->stats.bad++;
        snprintf(err, errlen, "peer %.8s: %s", peer->key, reason);
    } else if (rc == 0) {
        self->stats.msgs_in++;
    }
    return rc;
}

int net_server_send(net_server_t *self, const net_peer_t *peer, net_msg_t **msg)
{
    // a peer known by its key alone (never heard from) has no connection
    const char *to = peer->conn[0] ? peer->conn : peer->key;
    int rc = net_msg_send_frames(self->router, *msg, to, strnlen(to, NET_CONN_MAX));
    if (rc == 0)
        self->stats.msgs_out++;
    net_msg_destroy(msg);
    return rc;
}

// ---- client ----------------------------------------------------------------

struct net_client_s {
    void *ctx;                       // this client's own zmq context
    void *dealer;                    // the DEALER socket
    char endpoint[256];              // the router's endpoint, as connected
    net_limits_t limits;             // what the router may send
    uint64_t next_id;                // next request id (random start: ids of a
                                     // restarted node do not collide)
    int64_t last_recv_ms;            // net_clock_ms of the last message received
    net_msg_t *backlog[CLIENT_BACKLOG]; // ring of messages kept during a request
    size_t backlog_first;            // index of the oldest in the ring
    size_t backlog_n;                // messages in the ring
    net_stats_t stats;               // counters
};

static int s_client_socket(net_client_t *self, const net_client_config_t *c,
                           const net_timing_t *timing, char *err, size_t errlen)
{
    int reconnect = 100, reconnect_max = 2000;
    // routing id KEY/INSTANCE: this process's own; a reconnect of this
    // socket keeps it (ROUTER_HANDOVER hands the router's side over), a
    // second process with our key gets another (net_peer_t)
    char id[NET_CONN_MAX + 1];
    snprintf(id, sizeof id, "%s/%08" PRIx32 "%08" PRIx32, net_key_public(c->key),
             randombytes_random(), randombytes_random());
    self->dealer = zmq_socket(self->ctx, ZMQ_DEALER);
    if (!self->dealer)
        return s_fail(err, errlen, -zmq_errno(), "client: socket");
    void *d = self->dealer;
    int rc = s_socket_setup(d, &self->limits, timing);
    if (rc == 0 &&
        (zmq_setsockopt(d, ZMQ_CURVE_SERVERKEY, net_key_public_raw(c->server), 32) != 0 ||
         zmq_setsockopt(d, ZMQ_CURVE_PUBLICKEY, net_key_public_raw(c->key), 32) != 0 ||
         zmq_setsockopt(d, ZMQ_CURVE_SECRETKEY, net_key_secret_raw(c->key), 32) != 0 ||
         zmq_setsockopt(d, ZMQ_ROUTING_ID, id, strlen(id)) != 0 ||
         zmq_setsockopt(d, ZMQ_RECONNECT_IVL, &reconnect, sizeof reconnect) != 0 ||
         zmq_setsockopt(d, ZMQ_RECONNECT_IVL_MAX, &reconnect_max, sizeof reconnect_max) != 0))
        rc = -zmq_errno();
    if (rc < 0)
        return s_fail(err, errlen, rc, "client: socket options");
    if (strlen(c->endpoint) >= sizeof self->endpoint) {
        snprintf(err, errlen, "client: endpoint %.64s...: too long", c->endpoint);
        return -EINVAL;
    }
    snprintf(self->endpoint, sizeof self->endpoint, "%s", c->endpoint);
    if (zmq_connect(self->dealer, c->endpoint) != 0) {
        rc = -zmq_errno();
        snprintf(err, errlen, "client: connect %s: %s", c->endpoint, zmq_strerror(-rc));
    }
    return rc;
}

int net_client_reconnect(net_client_t *self)
{
    // after a refused handshake the link is gone already: ENOENT is fine
    (void) zmq_disconnect(self->dealer, self->endpoint);
    return zmq_connect(self->dealer, self->endpoint) == 0 ? 0 : -zmq_errno();
}

int net_client_new(const net_client_config_t *config, net_client_t **out, char *err,
                   size_t errlen)
{
    *out = NULL;
    const net_client_config_t *c = config;
    if (!c || !c->endpoint || !c->server || !c->key || !net_key_secret_raw(c->key)) {
        snprintf(err, errlen, "client: needs an endpoint, the router's key and our key pair");
        return -EINVAL;
    }
    if (!zmq_has("curve")) {
        snprintf(err, errlen, "libzmq was built without CURVE: swarm refuses to run unencrypted");
        return -ENOTSUP;
    }
    int rc = net_limits_check(&c->limits, err, errlen);
    if (rc < 0)
        return rc;
    net_client_t *self = calloc(1, sizeof *self);
    if (!self)
        return -ENOMEM;
    self->limits = c->limits;
    self->next_id = ((uint64_t) randombytes_random() << 32) | 1;
    self->last_recv_ms = net_clock_ms();
    net_timing_t timing = s_timing(&c->timing);
    self->ctx = zmq_ctx_new();
    rc = self->ctx ? s_client_socket(self, c, &timing, err, errlen) : -ENOMEM;
    if (rc < 0) {
        net_client_destroy(&self);
        return rc;
    }
    *out = self;
    return 0;
}

void net_client_destroy(net_client_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    net_client_t *self = *self_p;
    while (self->backlog_n) {
        net_msg_destroy(&self->backlog[self->backlog_first]);
        self->backlog_first = (self->backlog_first + 1) % CLIENT_BACKLOG;
        self->backlog_n--;
    }
    if (self->dealer)
        zmq_close(self->dealer);
    if (self->ctx)
        zmq_ctx_term(self->ctx);
    free(self);
    *self_p = NULL;
}

int net_client_send(net_client_t *self, net_msg_t **msg)
{
    int rc = net_send(self->dealer, msg);
    if (rc == 0)
        self->stats.msgs_out++;
    return rc;
}

// One message from the socket (not the backlog).
static int s_client_wait(net_client_t *self, int64_t deadline_ms, net_msg_t **out, char *err,
                         size_t errlen)
{
    zmq_msg_t parts[NET_WIRE_FRAMES_MAX];
    size_t total = 0;
    int rc = s_frames_wait(self->dealer, deadline_ms, parts, NET_WIRE_FRAMES_MAX, &total);
    if (rc < 0)
        return rc;
    self->last_recv_ms = net_clock_ms();
    size_t kept = total < NET_WIRE_FRAMES_MAX ? total : NET_WIRE_FRAMES_MAX;
    rc = net_msg_from_frames(parts, kept, total, &self->limits, out, err, errlen);
    if (rc == -EPROTO)
        self->stats.bad++;
    else if (rc == 0)
        self->stats.msgs_in++;
    return rc;
}

int net_client_recv(net_client_t *self, int64_t deadline_ms, net_msg_t **out, char *err,
                    size_t errlen)
{
    *out = NULL;
    if (self->backlog_n) {
        *out = self->backlog[self->backlog_first];
        self->backlog[self->backlog_first] = NULL;
        self->backlog_first = (self->backlog_first + 1) % CLIENT_BACKLOG;
        self->backlog_n--;
        return 0;
    }
    return s_client_wait(self, deadline_ms, out, err, errlen);
}

int64_t net_client_silence_ms(const net_client_t *self, int64_t now_ms)
{
    return now_ms - self->last_recv_ms;
}

void net_client_stats(const net_client_t *self, net_stats_t *out)
{
    *out = self->stats;
}

// Keep a message that arrived during a request for net_client_recv.
static void s_backlog_push(net_client_t *self, net_msg_t **msg)
{
    if (self->backlog_n == CLIENT_BACKLOG) {
        self->stats.bad++; // the caller is not reading: drop the newest
        net_msg_destroy(msg);
        return;
    }
    self->backlog[(self->backlog_first + self->backlog_n++) % CLIENT_BACKLOG] = *msg;
    *msg = NULL;
}

// Wait until deadline_ms for the reply to id; keep or drop the rest.
static int s_request_wait(net_client_t *self, uint64_t id, int64_t deadline_ms,
                          net_msg_t **reply, char *err, size_t errlen)
{
    // the deadline holds even while other messages keep arriving
    while (net_clock_ms() < deadline_ms) {
        net_msg_t *in = NULL;
        int rc = s_client_wait(self, deadline_ms, &in, err, errlen);
        if (rc == -EPROTO)
            continue;
        if (rc < 0)
            return rc;
        const net_head_t *head = net_msg_head_const(in);
        if ((head->flags & NET_FLAG_REPLY) && head->id == id) {
            *reply = in;
            return 0;
        }
        if (head->flags & NET_FLAG_REPLY) {
            self->stats.stale++; // an answer to a try we gave up on
            net_msg_destroy(&in);
        } else {
            s_backlog_push(self, &in);
        }
    }
    return -ETIMEDOUT;
}

int net_client_request(net_client_t *self, net_msg_t **req, const net_retry_t *retry,
                       net_msg_t **reply, char *err, size_t errlen)
{
    net_msg_t *msg = *req;
    *req = NULL;
    *reply = NULL;
    if (retry->tries < 1 || retry->timeout_ms < 1) {
        net_msg_destroy(&msg);
        return -EINVAL;
    }
    net_head_t *head = net_msg_head(msg);
    head->id = self->next_id++;
    head->flags &= (uint8_t) ~NET_FLAG_REPLY;
    int rc = -ETIMEDOUT;
    for (int attempt = 0; attempt < retry->tries && rc == -ETIMEDOUT; attempt++) {
        rc = net_msg_send_frames(self->dealer, msg, NULL, 0);
        if (rc == 0)
            self->stats.msgs_out++;
        else if (rc != -EAGAIN) // a full queue is a lost try: wait and resend
            break;
        rc = s_request_wait(self, head->id, net_clock_ms() + retry->timeout_ms, reply, err,
                            errlen);
    }
    if (rc == -ETIMEDOUT)
        snprintf(err, errlen, "%s request %" PRIu64 ": no reply after %d tries of %d ms",
                 net_msg_type_name(head->type), head->id, retry->tries, retry->timeout_ms);
    net_msg_destroy(&msg);
    return rc;
}
