/* wanproxy.c - a TCP relay that behaves like a slow, far, lossy link: each
 * direction is a link of a given rate (one ~1448-byte segment after the
 * other), then a one-way delay with jitter; a lost segment holds the stream
 * for a retransmission timeout. For kernels without the netem qdisc
 * (scripts/wan-swarm.sh uses netem when it can).
 *
 * It emulates what a lossy path does to ONE TCP stream (the application
 * sees in-order bytes arriving late), not packets: no reordering, no
 * congestion window. Test and benchmark tool; it knows nothing of swarm.
 *
 *   wanproxy --listen 127.0.0.1:7070 --connect 10.1.0.1:7070 \
 *            --delay 50ms --jitter 10ms --rate 50mbit --loss 0.1% [--rto MS] [--seed N]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SEGMENT 1448              // bytes: a TCP segment on a 1500-byte MTU path
#define PAIRS_MAX 64              // connections relayed at once
#define READ_MAX (64 * 1024)      // bytes read at a time

typedef struct {
    double due;                   // s (CLOCK_MONOTONIC): when it reaches the other side
    uint32_t len;                 // bytes left of it
} seg_t;

typedef struct {
    int from, to;                 // read from, write to
    uint8_t *buf;                 // queued bytes: [off, off + used)
    size_t off, used, cap;        // bytes
    seg_t *segs;                  // their segments, in order: [first, first + nsegs) of a ring
    size_t first, nsegs, segcap;  // ring of segcap entries
    double link_free;             // s: when the link finishes sending what it has
    double last_due;              // s: due of the last segment (the stream stays in order)
    int eof;                      // the sender closed its side
    int shut;                     // ... and we passed that on
    int blocked;                  // the receiver's socket is full: wait for POLLOUT
} dir_t;

typedef struct {
    int used;                     // slot in use
    dir_t d[2];                   // [0] client -> server, [1] server -> client
} pair_t;

typedef struct {
    double delay, jitter;         // s, one way
    double rate;                  // bytes per second, 0 = unlimited
    double loss;                  // probability per segment
    double rto;                   // s: a lost segment holds the stream this long
    size_t limit;                 // bytes queued per direction before we stop reading
    uint64_t rng;                 // xorshift64* state
    uint64_t bytes[2], lost[2];   // totals per direction
} link_t;

static volatile sig_atomic_t s_stop;

static void s_on_signal(int sig)
{
    (void) sig;
    s_stop = 1;
}

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Uniform in [0, 1).
static double s_uniform(link_t *l)
{
    l->rng ^= l->rng >> 12;
    l->rng ^= l->rng << 25;
    l->rng ^= l->rng >> 27;
    return (double) ((l->rng * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}

// ---- flags -----------------------------------------------------------------

// "50ms", "0.05s", "50" (ms) -> seconds; -1 when not a time.
static double s_parse_time(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0))
        return -1;
    if (!strcmp(end, "") || !strcmp(end, "ms"))
        return v / 1000.0;
    if (!strcmp(end, "s"))
        return v;
    if (!strcmp(end, "us"))
        return v / 1e6;
    return -1;
}

// "50mbit", "1gbit", "500kbit", "8000bit" (tc's units: bits/s) -> bytes/s; -1 otherwise.
static double s_parse_rate(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0))
        return -1;
    double unit = !strcmp(end, "bit") ? 1 : !strcmp(end, "kbit") ? 1e3
                : !strcmp(end, "mbit") || !strcmp(end, "") ? 1e6 : !strcmp(end, "gbit") ? 1e9 : -1;
    return unit < 0 ? -1 : v * unit / 8.0;
}

// "0.1%" or "0.1" (percent) -> probability; -1 otherwise.
static double s_parse_loss(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || (strcmp(end, "%") && strcmp(end, "")) || !(v >= 0 && v <= 100))
        return -1;
    return v / 100.0;
}

// "HOST:PORT" (numeric IPv4) -> addr; -1 otherwise.
static int s_parse_addr(const char *s, struct sockaddr_in *addr)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s || (size_t) (colon - s) >= sizeof host)
        return -1;
    memcpy(host, s, (size_t) (colon - s));
    host[colon - s] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    *addr = (struct sockaddr_in) { .sin_family = AF_INET, .sin_port = htons((uint16_t) port) };
    if (*end || port < 0 || port > 65535 || inet_pton(AF_INET, host, &addr->sin_addr) != 1)
        return -1;
    return 0;
}

static void s_usage(void)
{
    fprintf(stderr, "usage: wanproxy --listen HOST:PORT --connect HOST:PORT [--delay 50ms]\n"
                    "       [--jitter 10ms] [--rate 50mbit] [--loss 0.1%%] [--rto MS] [--seed N]\n"
                    "Each direction: a link of RATE, then DELAY +- JITTER (uniform); each\n"
                    "1448-byte segment is lost with probability LOSS, holding the stream for\n"
                    "RTO (default 200 ms + 2 x DELAY).\n");
}

typedef struct {
    struct sockaddr_in listen, connect;
    link_t link;
} opts_t;

static int s_flag(opts_t *o, const char *a, const char *v)
{
    if (!strcmp(a, "--listen"))
        return s_parse_addr(v, &o->listen);
    if (!strcmp(a, "--connect"))
        return s_parse_addr(v, &o->connect);
    if (!strcmp(a, "--delay"))
        return (o->link.delay = s_parse_time(v)) < 0 ? -1 : 0;
    if (!strcmp(a, "--jitter"))
        return (o->link.jitter = s_parse_time(v)) < 0 ? -1 : 0;
    if (!strcmp(a, "--rto"))
        return (o->link.rto = s_parse_time(v)) < 0 ? -1 : 0;
    if (!strcmp(a, "--rate"))
        return (o->link.rate = s_parse_rate(v)) < 0 ? -1 : 0;
    if (!strcmp(a, "--loss"))
        return (o->link.loss = s_parse_loss(v)) < 0 ? -1 : 0;
    if (!strcmp(a, "--seed"))
        return (o->link.rng = strtoull(v, NULL, 10) * 0x9E3779B97F4A7C15ull | 1), 0;
    return -1;
}

static int s_parse(int argc, char **argv, opts_t *o)
{
    *o = (opts_t) { .link = { .rto = -1, .rng = 0x9E3779B97F4A7C15ull } };
    int have = 0;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc || s_flag(o, argv[i], argv[i + 1]) != 0) {
            fprintf(stderr, "wanproxy: bad flag or value: %s %s\n", argv[i],
                    i + 1 < argc ? argv[i + 1] : "(missing)");
            return -1;
        }
        if (!strcmp(argv[i], "--listen"))
            have |= 1;
        if (!strcmp(argv[i], "--connect"))
            have |= 2;
        i++;
    }
    if (have != 3)
        return -1;
    link_t *l = &o->link;
    if (l->rto < 0)
        l->rto = 0.2 + 2.0 * l->delay; // Linux's minimum RTO plus a round trip
    // enough queued to keep the link full through a delay, jitter and a stall
    double window = l->rate > 0 ? 2.0 * l->rate * (l->delay + l->jitter + l->rto) : 4e6;
    l->limit = (size_t) window + READ_MAX;
    return 0;
}

// ---- one direction -----------------------------------------------------------

static int s_dir_init(dir_t *d, int from, int to, size_t limit)
{
    *d = (dir_t) { .from = from, .to = to, .cap = limit + READ_MAX };
    d->segcap = d->cap / SEGMENT + 4096; // small messages make short segments
    d->buf = malloc(d->cap);
    d->segs = malloc(d->segcap * sizeof *d->segs);
    return d->buf && d->segs ? 0 : -ENOMEM;
}

static void s_dir_free(dir_t *d)
{
    free(d->buf);
    free(d->segs);
    d->buf = NULL;
    d->segs = NULL;
}

// Queue n bytes just read, cut into segments that cross the link.
static void s_dir_queue(dir_t *d, link_t *l, int which, size_t n, double now)
{
    for (size_t done = 0; done < n;) {
        uint32_t len = (uint32_t) (n - done < SEGMENT ? n - done : SEGMENT);
        double start = now > d->link_free ? now : d->link_free;
        d->link_free = start + (l->rate > 0 ? len / l->rate : 0.0);
        double due = d->link_free + l->delay + (2.0 * s_uniform(l) - 1.0) * l->jitter;
        if (due < d->link_free)
            due = d->link_free;
        if (l->loss > 0 && s_uniform(l) < l->loss) {
            due += l->rto; // retransmitted after a timeout; what follows waits
            l->lost[which]++;
        }
        d->last_due = due > d->last_due ? due : d->last_due;
        d->segs[(d->first + d->nsegs++) % d->segcap] = (seg_t) { d->last_due, len };
        done += len;
    }
    l->bytes[which] += n;
}

// Room for another read: bytes below the limit, and segments for all of it.
static int s_dir_room(const dir_t *d, const link_t *l)
{
    return !d->eof && d->used < l->limit && d->nsegs + READ_MAX / SEGMENT + 1 < d->segcap;
}

// Read what the sender has, while there is room. -1 on an error.
static int s_dir_read(dir_t *d, link_t *l, int which, double now)
{
    while (s_dir_room(d, l)) {
        if (d->off + d->used + READ_MAX > d->cap) {
            memmove(d->buf, d->buf + d->off, d->used);
            d->off = 0;
        }
        ssize_t got = recv(d->from, d->buf + d->off + d->used, READ_MAX, 0);
        if (got > 0) {
            s_dir_queue(d, l, which, (size_t) got, now);
            d->used += (size_t) got;
        } else if (got == 0) {
            d->eof = 1;
        } else {
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
        }
    }
    return 0;
}

// Write every byte that is due. -1 on an error.
static int s_dir_write(dir_t *d, double now)
{
    while (d->nsegs > 0) {
        size_t due = 0;
        for (size_t i = 0; i < d->nsegs; i++) {
            const seg_t *s = &d->segs[(d->first + i) % d->segcap];
            if (s->due > now)
                break;
            due += s->len;
        }
        if (due == 0)
            return 0;
        ssize_t put = send(d->to, d->buf + d->off, due, MSG_NOSIGNAL);
        if (put < 0) {
            d->blocked = errno == EAGAIN || errno == EWOULDBLOCK;
            return d->blocked || errno == EINTR ? 0 : -1;
        }
        d->blocked = 0;
        d->off += (size_t) put;
        d->used -= (size_t) put;
        for (size_t left = (size_t) put; left > 0;) {
            seg_t *s = &d->segs[d->first];
            size_t take = left < s->len ? left : s->len;
            s->len -= (uint32_t) take;
            left -= take;
            if (s->len == 0) {
                d->first = (d->first + 1) % d->segcap;
                d->nsegs--;
            }
        }
        if (d->used == 0)
            d->off = 0;
    }
    return 0;
}

// ---- connections -------------------------------------------------------------

static void s_nonblock(int fd)
{
    int one = 1;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void s_pair_close(pair_t *p)
{
    close(p->d[0].from);
    close(p->d[0].to);
    s_dir_free(&p->d[0]);
    s_dir_free(&p->d[1]);
    p->used = 0;
}

// A new client: connect to the server (2 s at most) and relay both ways.
static void s_accept(int lfd, const opts_t *o, pair_t *pairs)
{
    int c = accept(lfd, NULL, NULL);
    if (c < 0)
        return;
    pair_t *p = NULL;
    for (int i = 0; i < PAIRS_MAX && !p; i++)
        p = pairs[i].used ? NULL : &pairs[i];
    int srv = p ? socket(AF_INET, SOCK_STREAM, 0) : -1;
    struct timeval two = { 2, 0 };
    if (srv >= 0)
        setsockopt(srv, SOL_SOCKET, SO_SNDTIMEO, &two, sizeof two);
    if (srv < 0 || connect(srv, (const struct sockaddr *) &o->connect, sizeof o->connect) != 0) {
        close(c); // the client sees the server refuse, as it would without us
        if (srv >= 0)
            close(srv);
        return;
    }
    s_nonblock(c);
    s_nonblock(srv);
    *p = (pair_t) { .used = 1 };
    if (s_dir_init(&p->d[0], c, srv, o->link.limit) != 0
        || s_dir_init(&p->d[1], srv, c, o->link.limit) != 0)
        s_pair_close(p);
}

// Relay what is ready on pair p; close it when both sides are done or on
// an error.
static void s_pair_step(pair_t *p, link_t *l, double now)
{
    int bad = 0;
    for (int k = 0; k < 2; k++) {
        dir_t *d = &p->d[k];
        bad |= s_dir_read(d, l, k, now) != 0 || s_dir_write(d, now) != 0;
        if (d->eof && d->used == 0 && !d->shut) {
            shutdown(d->to, SHUT_WR); // the other side reads its end of file
            d->shut = 1;
        }
    }
    if (bad || (p->d[0].eof && p->d[0].used == 0 && p->d[1].eof && p->d[1].used == 0))
        s_pair_close(p);
}

// ---- the loop ----------------------------------------------------------------

// Poll set for the listener and every pair; the ms until the next due segment.
static int s_poll_set(int lfd, pair_t *pairs, const link_t *l, struct pollfd *fds, double now,
                      int *timeout)
{
    int n = 0;
    double next = now + 1.0;
    fds[n++] = (struct pollfd) { .fd = lfd, .events = POLLIN };
    for (int i = 0; i < PAIRS_MAX; i++) {
        fds[n] = (struct pollfd) { .fd = -1 };
        fds[n + 1] = (struct pollfd) { .fd = -1 };
        for (int k = 0; pairs[i].used && k < 2; k++) {
            const dir_t *d = &pairs[i].d[k];
            if (s_dir_room(d, l))
                fds[n + k].fd = d->from, fds[n + k].events |= POLLIN;
            if (d->nsegs > 0 && d->blocked)
                fds[n + 1 - k].fd = d->to, fds[n + 1 - k].events |= POLLOUT;
            else if (d->nsegs > 0 && d->segs[d->first].due < next)
                next = d->segs[d->first].due;
        }
        n += 2;
    }
    double ms = ceil((next - now) * 1000.0);
    *timeout = ms < 0 ? 0 : (int) ms;
    return n;
}

static void s_loop(int lfd, const opts_t *o, link_t *l)
{
    static pair_t pairs[PAIRS_MAX];
    static struct pollfd fds[1 + 2 * PAIRS_MAX];
    while (!s_stop) {
        int timeout;
        int n = s_poll_set(lfd, pairs, l, fds, s_now(), &timeout);
        if (poll(fds, (nfds_t) n, timeout) < 0 && errno != EINTR)
            break;
        if (fds[0].revents & POLLIN)
            s_accept(lfd, o, pairs);
        double now = s_now();
        for (int i = 0; i < PAIRS_MAX; i++)
            if (pairs[i].used)
                s_pair_step(&pairs[i], l, now);
    }
    for (int i = 0; i < PAIRS_MAX; i++)
        if (pairs[i].used)
            s_pair_close(&pairs[i]);
}

int main(int argc, char **argv)
{
    opts_t o;
    if (s_parse(argc, argv, &o) != 0) {
        s_usage();
        return 2;
    }
    int one = 1, lfd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (lfd < 0 || bind(lfd, (const struct sockaddr *) &o.listen, sizeof o.listen) != 0
        || listen(lfd, 64) != 0) {
        fprintf(stderr, "wanproxy: cannot listen on %s:%d: %s\n", inet_ntoa(o.listen.sin_addr),
                ntohs(o.listen.sin_port), strerror(errno));
        return 1;
    }
    struct sigaction sa = { .sa_handler = s_on_signal };
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    link_t *l = &o.link;
    printf("wanproxy: relaying to %s:%d; each way: delay %.1f ms +- %.1f ms, rate %.3g Mbit/s, "
           "loss %.3g%% (a loss holds the stream %.0f ms)\n", inet_ntoa(o.connect.sin_addr),
           ntohs(o.connect.sin_port), 1e3 * l->delay, 1e3 * l->jitter, l->rate * 8 / 1e6,
           100 * l->loss, 1e3 * l->rto);
    fflush(stdout);
    s_loop(lfd, &o, l);
    printf("wanproxy: relayed %llu bytes up, %llu down; %llu and %llu segments lost\n",
           (unsigned long long) l->bytes[0], (unsigned long long) l->bytes[1],
           (unsigned long long) l->lost[0], (unsigned long long) l->lost[1]);
    close(lfd);
    return 0;
}
