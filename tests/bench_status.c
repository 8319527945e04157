/* bench_status.c - what a STATUS reply costs the router engine, in CPU
 * time per reply: an engine of 3 stages with PEERS peers joined and the
 * history of 3900 steps at STEPS_A_SECOND (a loss point a step, a speed
 * point a second, an evaluation every 100 steps, the 64 events it keeps),
 * asked for the whole document (swarm status --json, a
 * dashboard's first poll) and for what is new since a cursor one second
 * old (each later poll of swarm status --serve: about a second of steps).
 * scripts/bench-dashboard.sh runs it beside the router's own CPU use.
 * A benchmark: prints numbers, asserts nothing.
 *   bench_status [PEERS] [STEPS_A_SECOND]
 */
#include "engine_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static size_t s_reply_bytes;
static int64_t s_now = 100000;  // ms: the time of the next STATUS

static int s_send(void *ctx, const net_peer_t *to, net_msg_t **m)
{
    (void) ctx;
    (void) to;
    size_t len = 0;
    if (net_msg_head_const(*m)->type == NET_MSG_STATUS && net_msg_meta(*m, &len))
        s_reply_bytes = len;
    net_msg_destroy(m);
    return 0;
}

static void s_log(void *ctx, int to_stderr, const char *line)
{
    (void) ctx;
    (void) to_stderr;
    (void) line;
}

static double s_lr(void *ctx, long step)
{
    (void) ctx;
    (void) step;
    return 1e-3;
}

static float s_clip(void *ctx, double norm)
{
    (void) ctx;
    (void) norm;
    return 1.0f;
}

static double s_cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double) t.tv_sec + (double) t.tv_nsec * 1e-9;
}

static net_peer_t s_who(int i)
{
    net_peer_t who = {0};
    snprintf(who.key, sizeof who.key, "%040d", i);
    snprintf(who.conn, sizeof who.conn, "%040d/%016d", i, i);
    return who;
}

// CPU seconds a STATUS reply takes with since=`since`, over n replies.
static double s_time(swarm_engine_t *e, uint64_t since, int n)
{
    char meta[40];
    snprintf(meta, sizeof meta, "since=%llu", (unsigned long long) since);
    net_peer_t who = s_who(999999);
    double t0 = s_cpu_s();
    for (int i = 0; i < n; i++) {
        net_msg_t *m = net_msg_new(NET_MSG_STATUS);
        if (!m || net_msg_set_meta(m, meta) < 0)
            abort();
        s_now += 1000; // a second apart: within the router's STATUS budget
        swarm_engine_message(e, s_now, &who, m);
        net_msg_destroy(&m);
    }
    return (s_cpu_s() - t0) / n;
}

int main(int argc, char **argv)
{
    int peers = argc > 1 ? atoi(argv[1]) : 40, per_s = argc > 2 ? atoi(argv[2]) : 150;
    static const uint8_t bytes[4096] = {1, 2, 3};
    swarm_data_t *data = swarm_data_wrap(bytes, sizeof bytes, "bench bytes");
    enum { STAGES = 3, PER_STAGE = 100 };
    swarm_engine_config_t c = {
        .shape = {.V = 256, .T = 16, .C = 32, .L = STAGES, .H = 4}, .stages = STAGES,
        .nparams = PER_STAGE * STAGES, .params = calloc(PER_STAGE * STAGES, sizeof(float)),
        .batch = 8, .micro = 2, .iters = 100000, .seed = 1, .data = data, .min_nodes = 1 << 20,
        .window_mode = SWARM_WINDOW_ALL, .tensor_bound = 100, .wire = NET_DTYPE_F32,
        .grad_wire = NET_DTYPE_F32,
    };
    for (int s = 0; s < STAGES; s++) {
        c.stage_n[s] = PER_STAGE;
        c.stage_off[s] = (size_t) PER_STAGE * s;
        c.stage_cost[s] = 1.0;
    }
    swarm_engine_io_t io = {.send = s_send, .log = s_log, .lr_at = s_lr, .clip_scale = s_clip};
    swarm_engine_t *e = NULL;
    char err[256];
    if (swarm_engine_new(&c, &io, 1000, &e, err, sizeof err) != 0) {
        fprintf(stderr, "bench_status: %s\n", err);
        return 1;
    }
    for (int i = 1; i <= peers; i++) { // they join and wait (min_nodes is never reached)
        char meta[128];
        snprintf(meta, sizeof meta, "proto=1\nname=desk-%d\ndevice=cpu: 4 threads\ntok_s=1000\n", i);
        net_msg_t *m = net_msg_new(NET_MSG_HELLO);
        if (!m || net_msg_set_meta(m, meta) < 0)
            abort();
        net_peer_t who = s_who(i);
        swarm_engine_message(e, 1000 + i, &who, m);
        net_msg_destroy(&m);
    }
    // a long run's history: 3900 steps (room for a poll's more before the
    // loss series thins), the ring of events full
    for (long k = 1; k <= 3900; k++) {
        e->step = k;
        e->last_loss = 5.0f - (float) k * 1e-4f;
        e->now_ms = 1000 + k * 1000 / per_s;
        engine_history_step(e, 1.0 / per_s);
        if (k % 100 == 0)
            engine_history_eval(e, 3.1, 3.2);
        if (k % 50 == 0)
            engine_history_event(e, 1, "swarm router: peer 17 (desk-17): its connection is gone\n");
    }
    double full = s_time(e, 0, 200);
    size_t full_bytes = s_reply_bytes;
    // a poll a second later: what a second of steps added (their loss
    // points, about one speed point), since the cursor a second old
    uint64_t cursor = 0;
    for (long k = 3901; k <= 3900 + per_s; k++) {
        if (k == 3901) {
            json_t *h = engine_history_json(e, 0);
            cursor = (uint64_t) json_integer_value(json_object_get(h, "cursor"));
            json_decref(h);
        }
        e->step = k;
        e->now_ms = 1000 + k * 1000 / per_s;
        engine_history_step(e, 1.0 / per_s);
    }
    double poll = s_time(e, cursor, 2000);
    printf("bench_status: %d peers, a history of 3900 steps (the loss of each, 64 events)\n", peers);
    printf("  the whole document (since=0):          %8.1f us, %zu bytes\n", full * 1e6, full_bytes);
    printf("  a poll a second later (%d new steps): %8.1f us, %zu bytes\n", per_s, poll * 1e6,
           s_reply_bytes);
    printf("  at one poll a second: %.4f%% of one core\n", poll * 100);
    swarm_engine_destroy(&e);
    swarm_data_destroy(&data);
    return 0;
}
