/* bench_net.c - net's benchmark: round-trip latency and throughput of 1 KiB
 * and 4 MiB messages over loopback TCP with CurveZMQ (an echo router in a
 * thread, one DEALER client), and each tensor codec's MB/s.
 *
 * A benchmark, never a test: it prints numbers and fails only when the
 * transport does (a reply missing for 10 s). scripts/bench-net.sh runs it.
 */
#include "net.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WAIT_MS 10000       // a reply later than this is a failure

typedef struct {
    net_server_t *server;            // used by the echo thread only
    atomic_int stop;                 // set by main when done
    int failed;                      // the echo thread saw an error
} echo_t;

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

static void *s_echo_run(void *arg)
{
    echo_t *e = arg;
    char err[256];
    while (!atomic_load(&e->stop)) {
        net_peer_t peer;
        net_msg_t *in = NULL;
        int rc = net_server_recv(e->server, net_clock_ms() + 50, &peer, &in, err, sizeof err);
        if (rc == -ETIMEDOUT)
            continue;
        // a full queue (-EAGAIN) cannot happen: the client keeps a window
        if (rc != 0 || net_server_send(e->server, &peer, &in) != 0) {
            fprintf(stderr, "bench_net: echo: %s\n", rc ? err : "send failed");
            e->failed = 1;
            return NULL;
        }
    }
    return NULL;
}

static net_msg_t *s_message(size_t bytes, const float *x)
{
    net_msg_t *m = net_msg_new(NET_MSG_FWD);
    uint32_t dims[1] = {(uint32_t) (bytes / 4)};
    if (!m || net_msg_add_tensor(m, NET_DTYPE_F32, dims, 1, x) != 0) {
        fprintf(stderr, "bench_net: cannot build a %zu-byte message\n", bytes);
        exit(1);
    }
    return m;
}

static void s_recv_one(net_client_t *client)
{
    net_msg_t *in = NULL;
    char err[256];
    int rc = net_client_recv(client, net_clock_ms() + WAIT_MS, &in, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "bench_net: no echo: %s\n", rc == -ETIMEDOUT ? "timed out" : err);
        exit(1);
    }
    net_msg_destroy(&in);
}

static void s_send_one(net_client_t *client, const net_msg_t *proto)
{
    net_msg_t *m = net_msg_dup(proto);
    if (!m || net_client_send(client, &m) != 0) {
        fprintf(stderr, "bench_net: send failed\n");
        exit(1);
    }
}

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

// Round trips one at a time (latency), then with `window` in flight.
static void s_bench_size(net_client_t *client, size_t bytes, int trips, int stream, int window)
{
    float *x = calloc(bytes / 4, sizeof *x);
    double *lat = calloc((size_t) trips, sizeof *lat);
    if (!x || !lat)
        exit(1);
    for (size_t i = 0; i < bytes / 4; i++)
        x[i] = (float) sin((double) i);
    net_msg_t *proto = s_message(bytes, x);
    for (int i = 0; i < trips; i++) {
        double t0 = s_now();
        s_send_one(client, proto);
        s_recv_one(client);
        lat[i] = s_now() - t0;
    }
    qsort(lat, (size_t) trips, sizeof *lat, s_cmp);
    double t0 = s_now();
    int sent = 0, got = 0;
    while (got < stream) {
        while (sent < stream && sent - got < window) {
            s_send_one(client, proto);
            sent++;
        }
        s_recv_one(client);
        got++;
    }
    double secs = s_now() - t0;
    printf("  %-8s round trip: median %8.1f us, p99 %8.1f us (%d trips)\n",
           bytes >= (1u << 20) ? "4 MiB" : "1 KiB", 1e6 * lat[trips / 2],
           1e6 * lat[(trips * 99) / 100], trips);
    printf("  %-8s throughput: %8.0f msgs/s, %8.1f MB/s each way (window %d, %d msgs)\n", "",
           stream / secs, (double) stream * (double) bytes / secs / 1e6, window, stream);
    net_msg_destroy(&proto);
    free(lat);
    free(x);
}

static void s_bench_transport(void)
{
    net_key_t *server_key = NULL, *client_key = NULL;
    if (net_key_generate(&server_key) != 0 || net_key_generate(&client_key) != 0)
        exit(1);
    net_limits_t limits = {4, 4, 1u << 24, 8u << 20, 4096};
    net_server_config_t sc = {.endpoint = "tcp://127.0.0.1:*", .key = server_key,
                              .limits = limits};
    echo_t echo = {0};
    char err[256];
    if (net_server_new(&sc, &echo.server, err, sizeof err) != 0) {
        fprintf(stderr, "bench_net: %s\n", err);
        exit(1);
    }
    net_client_config_t cc = {.endpoint = net_server_endpoint(echo.server),
                              .server = server_key, .key = client_key, .limits = limits};
    net_client_t *client = NULL;
    if (net_client_new(&cc, &client, err, sizeof err) != 0) {
        fprintf(stderr, "bench_net: %s\n", err);
        exit(1);
    }
    pthread_t thread;
    pthread_create(&thread, NULL, s_echo_run, &echo);
    printf("transport: loopback TCP, CurveZMQ, ROUTER echo <-> DEALER, f32 tensor payload\n");
    s_bench_size(client, 1024, 2000, 20000, 64);
    s_bench_size(client, 4u << 20, 50, 100, 4);
    atomic_store(&echo.stop, 1);
    pthread_join(thread, NULL);
    net_client_destroy(&client);
    net_server_destroy(&echo.server);
    net_key_destroy(&server_key);
    net_key_destroy(&client_key);
    if (echo.failed)
        exit(1);
}

static void s_bench_codecs(void)
{
    enum { N = 1 << 24 }; // 16 Mi floats = 64 MiB
    static const int dtypes[3] = {NET_DTYPE_F32, NET_DTYPE_F16, NET_DTYPE_I8};
    static const char *names[3] = {"fp32", "fp16", "int8"};
    float *x = malloc((size_t) N * sizeof *x), *y = malloc((size_t) N * sizeof *y);
    uint8_t *buf = malloc((size_t) N * 4);
    if (!x || !y || !buf)
        exit(1);
    uint64_t state = 42;
    for (size_t i = 0; i < N; i++) { // activations-like: roughly N(0, 1)
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float) (((double) (state >> 11) / 9007199254740992.0 - 0.5) * 3.4);
    }
    printf("codecs: %d floats (%.0f MB of fp32), one thread, best of 3\n", N, N * 4 / 1e6);
    for (int d = 0; d < 3; d++) {
        size_t bytes = net_codec_bytes(dtypes[d], N);
        double enc = 1e9, dec = 1e9;
        for (int r = 0; r < 3; r++) {
            double t0 = s_now();
            if (net_codec_encode(dtypes[d], x, N, buf, bytes) != 0)
                exit(1);
            double t1 = s_now();
            if (net_codec_decode(dtypes[d], buf, bytes, y, N) != 0)
                exit(1);
            double t2 = s_now();
            enc = fmin(enc, t1 - t0);
            dec = fmin(dec, t2 - t1);
        }
        double worst = 0;
        for (size_t i = 0; i < N; i++)
            worst = fmax(worst, fabs((double) x[i] - y[i]));
        printf("  %s: %.3f bytes/value, encode %7.0f MB/s, decode %7.0f MB/s (of fp32), "
               "max |x - x'| %.2e\n", names[d], (double) bytes / N, N * 4 / enc / 1e6,
               N * 4 / dec / 1e6, worst);
    }
    free(x);
    free(y);
    free(buf);
}

int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : "";
    if (strcmp(only, "codecs") != 0)
        s_bench_transport();
    if (strcmp(only, "transport") != 0)
        s_bench_codecs();
    return 0;
}
