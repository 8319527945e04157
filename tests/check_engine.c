/* check_engine.c - the router engine (swarm/engine*.c) driven in-process:
 * no socket, no clock, no file. Messages and time go in through swarm.h's
 * calls, and what the engine sends and logs is caught by the callbacks
 * below, so each test is exact and repeatable: a crowd of peers joining
 * and leaving (the peer table grows past any fixed size and reuses the
 * entries of the dead), a peer gone with its entry kept for its ban, and
 * the STATUS document staying valid JSON for an expelled peer's endless ban.
 * One test looks inside (engine_int.h): each stage's ready peers, which a
 * routing pick sees instead of the whole table, held to the table itself.
 */
#include "engine_int.h"
#include "swarm.h"

#include <check.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- a world for the engine: what it sends and logs, kept -------------------

typedef struct {
    int sent[NET_MSG_TYPE_MAX + 1];   // messages sent, by type
    char last_to[NET_KEY_Z85_LEN + 1]; // the key of the last one's receiver
    char *status;                // the meta of the last STATUS reply
    int lines;                   // log lines
    char log[8192];              // the last of them
    swarm_data_t *data;          // the engine's training bytes
} world_t;

static int s_send(void *ctx, const net_peer_t *to, net_msg_t **m)
{
    world_t *w = ctx;
    const net_head_t *h = net_msg_head_const(*m);
    if (h->type <= NET_MSG_TYPE_MAX)
        w->sent[h->type]++;
    snprintf(w->last_to, sizeof w->last_to, "%s", to->key);
    if (h->type == NET_MSG_STATUS) {
        size_t len = 0;
        const char *meta = net_msg_meta(*m, &len);
        ck_assert_ptr_nonnull(meta);
        char *text = malloc(len + 1);
        ck_assert_ptr_nonnull(text);
        memcpy(text, meta, len);
        text[len] = '\0';
        free(w->status);
        w->status = text;
    }
    net_msg_destroy(m);
    return 0;
}

static void s_log(void *ctx, int to_stderr, const char *line)
{
    world_t *w = ctx;
    (void) to_stderr;
    w->lines++;
    size_t n = strlen(w->log);
    if (n + strlen(line) + 1 > sizeof w->log)
        n = 0; // keep the latest lines
    snprintf(w->log + n, sizeof w->log - n, "%s", line);
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

static const uint8_t s_bytes[4096] = { 1, 2, 3 };

// An engine of `stages` stages of 100 parameters each, `batch` windows a
// step in micro-batches of 2, waiting for min_nodes.
static swarm_engine_t *s_engine_of(world_t *w, int min_nodes, int stages, int batch)
{
    w->data = swarm_data_wrap(s_bytes, sizeof s_bytes, "test bytes");
    swarm_engine_config_t c = {
        .shape = { .V = 256, .T = 16, .C = 32, .L = stages, .H = 4 }, .stages = stages,
        .nparams = 100 * (size_t) stages, .params = calloc(100 * (size_t) stages, sizeof(float)),
        .batch = batch, .micro = 2, .iters = 10, .seed = 1337, .data = w->data,
        .min_nodes = min_nodes, .window_mode = SWARM_WINDOW_ALL, .tensor_bound = 100,
        .verify = 0, .wire = NET_DTYPE_F32, .grad_wire = NET_DTYPE_F32,
    };
    for (int s = 0; s < stages; s++) {
        c.stage_n[s] = 100;
        c.stage_off[s] = 100 * (size_t) s;
        c.stage_cost[s] = 1.0 + 0.5 * s;
    }
    swarm_engine_io_t io = { .ctx = w, .send = s_send, .log = s_log, .lr_at = s_lr,
                             .clip_scale = s_clip };
    swarm_engine_t *e = NULL;
    char err[256];
    ck_assert_msg(swarm_engine_new(&c, &io, 1000, &e, err, sizeof err) == 0, "%s", err);
    return e;
}

static swarm_engine_t *s_engine(world_t *w, int min_nodes)
{
    return s_engine_of(w, min_nodes, 2, 4);
}

// Peer i's identity: a key and a connection of its own.
static net_peer_t s_who(int i)
{
    net_peer_t who = { 0 };
    snprintf(who.key, sizeof who.key, "%040d", i);
    snprintf(who.conn, sizeof who.conn, "%040d/%016d", i, i);
    return who;
}

static void s_close(world_t *w, swarm_engine_t **e)
{
    swarm_engine_destroy(e);
    swarm_data_destroy(&w->data);
    free(w->status);
}

static void s_hello(swarm_engine_t *e, int64_t now, int i)
{
    char meta[128];
    snprintf(meta, sizeof meta, "proto=1\nname=crowd%d\ndevice=cpu\ntok_s=1000\n", i);
    net_msg_t *m = net_msg_new(NET_MSG_HELLO);
    ck_assert_int_eq(net_msg_set_meta(m, meta), 0);
    net_peer_t who = s_who(i);
    swarm_engine_message(e, now, &who, m);
    net_msg_destroy(&m);
}

// The STATUS document, parsed; its peers array in *peers.
static json_t *s_status(swarm_engine_t *e, world_t *w, int64_t now, json_t **peers)
{
    net_msg_t *m = net_msg_new(NET_MSG_STATUS);
    net_peer_t who = s_who(99999);
    swarm_engine_message(e, now, &who, m);
    net_msg_destroy(&m);
    ck_assert_ptr_nonnull(w->status);
    json_error_t jerr;
    json_t *doc = json_loads(w->status, JSON_REJECT_DUPLICATES, &jerr);
    ck_assert_msg(doc != NULL, "STATUS is not JSON: %s at %d", jerr.text, jerr.position);
    *peers = json_object_get(doc, "peers");
    ck_assert(json_is_array(*peers));
    return doc;
}

// ---- tests ------------------------------------------------------------------

START_TEST(test_engine_assigns_a_crowd_of_1000_with_no_fixed_table)
{
    world_t w = { 0 };
    swarm_engine_t *e = s_engine(&w, 2000); // waits: nobody is ever ready
    for (int i = 1; i <= 1000; i++)
        s_hello(e, 1000 + i, i);
    ck_assert_int_eq(w.sent[NET_MSG_ASSIGN], 1000); // the router's 256 entries once ignored
                                                     // the 257th live peer
    json_t *peers, *doc = s_status(e, &w, 3000, &peers);
    ck_assert_int_eq((int) json_array_size(peers), 1000);
    ck_assert_int_eq((int) json_integer_value(json_object_get(doc, "peers_omitted")), 0);
    json_decref(doc);
    s_close(&w, &e);
}
END_TEST

START_TEST(test_engine_reuses_the_entries_of_the_dead_and_keeps_64)
{
    world_t w = { 0 };
    swarm_engine_t *e = s_engine(&w, 2000);
    // 300 peers come and go, one after another: each is gone (silent, not
    // banned) before the next says HELLO
    for (int i = 1; i <= 300; i++) {
        s_hello(e, 1000 + 10 * i, i);
        net_peer_t who = s_who(i);
        swarm_engine_gone(e, 1001 + 10 * i, &who);
    }
    ck_assert_int_eq(w.sent[NET_MSG_ASSIGN], 300);
    json_t *peers, *doc = s_status(e, &w, 5000, &peers);
    // the table holds the 64 dead it keeps for their bans and back-off, and
    // the entry reused for each newcomer after them
    ck_assert_msg(json_array_size(peers) <= 65, "%zu entries", json_array_size(peers));
    ck_assert_msg(json_array_size(peers) >= 64, "%zu entries", json_array_size(peers));
    size_t k;
    json_t *pe;
    json_array_foreach(peers, k, pe)
        ck_assert_str_eq(json_string_value(json_object_get(pe, "state")), "dead");
    json_decref(doc);
    // a dead peer that comes back is the same entry, not a new one
    s_hello(e, 6000, 300);
    ck_assert_int_eq(w.sent[NET_MSG_ASSIGN], 301);
    doc = s_status(e, &w, 6001, &peers);
    ck_assert_msg(json_array_size(peers) <= 65, "%zu entries", json_array_size(peers));
    json_decref(doc);
    s_close(&w, &e);
}
END_TEST

START_TEST(test_engine_status_is_json_for_every_peer_state)
{
    world_t w = { 0 };
    swarm_engine_t *e = s_engine(&w, 2000);
    s_hello(e, 1000, 1);
    s_hello(e, 1001, 2);
    net_peer_t who = s_who(2);
    swarm_engine_gone(e, 1002, &who);
    json_t *peers, *doc = s_status(e, &w, 1003, &peers);
    ck_assert_int_eq((int) json_array_size(peers), 2);
    const char *st0 = json_string_value(json_object_get(json_array_get(peers, 0), "state"));
    const char *st1 = json_string_value(json_object_get(json_array_get(peers, 1), "state"));
    ck_assert_str_eq(st0, "joining");
    ck_assert_str_eq(st1, "dead");
    ck_assert_str_eq(json_string_value(json_object_get(doc, "state")), "waiting");
    ck_assert(json_is_null(json_object_get(doc, "loss"))); // nothing trained yet: null, not nan
    json_decref(doc);
    ck_assert_msg(strstr(w.log, "(crowd2) is silent: dead"), "%s", w.log);
    s_close(&w, &e);
}
END_TEST

// Each stage's ready peers are exactly the table's P_READY peers of that
// stage, in ascending index, and engine_ready_count agrees.
static void s_check_ready_lists(const swarm_engine_t *r)
{
    int all = 0;
    for (int s = 0; s < r->stages; s++) {
        int k = 0;
        for (int p = 0; p < r->npeers; p++) {
            if (r->peers[p].state != P_READY || r->peers[p].stage != s)
                continue;
            ck_assert_msg(k < r->ready[s].n && r->ready[s].peer[k] == p,
                          "stage %d: ready peer %d is not its %dth of %d", s, p, k, r->ready[s].n);
            k++;
        }
        ck_assert_int_eq(k, r->ready[s].n);
        ck_assert_int_eq(engine_ready_count(r, s), k);
        all += k;
    }
    ck_assert_int_eq(engine_ready_count(r, -1), all);
}

static int s_views_equal(const swarm_peer_view_t *a, const swarm_peer_view_t *b)
{
    return a->stage == b->stage && a->ready == b->ready && a->joining == b->joining
           && a->inflight == b->inflight && a->queue == b->queue && a->backlog == b->backlog
           && a->ahead == b->ahead && a->rtt == b->rtt && a->tok_s == b->tok_s
           && a->moved_at == b->moved_at;
}

// A pick over stage s's ready peers (engine_pick_but, and the views
// s_pick_fit gives swarm_policy_pick_fit) chooses the peer a pick over the
// whole table would: the same views, and the same peer on every tie.
static void s_check_picks(swarm_engine_t *r, int s, int prefer, const int *not, int nnot)
{
    double work = (double) r->hp.micro * r->hp.cfg.T;
    swarm_peer_view_t *all = malloc((size_t) r->npeers * sizeof *all);
    ck_assert_ptr_nonnull(all);
    engine_views(r, all);
    int n = engine_views_stage(r, s, r->views);
    for (int k = 0; k < n; k++)
        ck_assert_msg(s_views_equal(&r->views[k], &all[r->ready[s].peer[k]]),
                      "stage %d: peer %d's view differs", s, r->ready[s].peer[k]);
    for (int left = 1; left <= 3; left++) {
        int whole = swarm_policy_pick_fit(all, r->npeers, s, work, left);
        int k = swarm_policy_pick_fit(r->views, n, s, work, left);
        ck_assert_int_eq(k < 0 ? k : r->ready[s].peer[k], whole);
    }
    for (int k = 0; k < nnot; k++)
        if (not[k] >= 0)
            all[not[k]].ready = 0;
    int whole = swarm_policy_pick(all, r->npeers, s, prefer, work);
    ck_assert_int_eq(engine_pick_but(r, s, prefer, 1.0, not, nnot), whole < 0 ? -EAGAIN : whole);
    free(all);
}

START_TEST(test_engine_picks_among_a_stages_ready_peers_as_over_the_whole_table)
{
    world_t w = { 0 };
    swarm_engine_t *e = s_engine_of(&w, 100000, 3, 16); // never starts: the test moves it
    uint64_t rng = 42;
    int64_t now = 1000;
    int next = 1;
    for (; next <= 60; next++)
        s_hello(e, now++, next);
    for (int event = 0; event < 3000; event++) {
        int p = (int) (swarm_splitmix64(&rng) % (uint64_t) e->npeers);
        int act = (int) (swarm_splitmix64(&rng) % 8);
        peer_t *pe = &e->peers[p];
        if (act == 0 && pe->state == P_JOINING)
            engine_peer_state(e, p, P_READY); // its state arrived
        else if (act == 1 && pe->state != P_DEAD)
            engine_peer_dead(e, p, "is killed by the test");
        else if (act == 2 && pe->state != P_DEAD) // a move (rebalancing, a refill)
            s_ignore(engine_send_assign(e, p, (int) (swarm_splitmix64(&rng) % 3), NULL));
        else if (act == 3 && pe->state == P_DEAD)
            s_hello(e, now++, atoi(pe->who.key)); // back: joins again
        else if (act == 4 && next < 400)
            s_hello(e, now++, next++); // a newcomer: the table grows, or reuses the dead
        // what a pick weighs: speeds (some unmeasured: as fast as the stage's
        // fastest), work held, a failed send, and backwards owed for forwards
        // it ran, at stages it may have left since
        pe = &e->peers[p]; // (a newcomer may have moved the table)
        pe->tok_s = (double) (swarm_splitmix64(&rng) % 4) * 500.0;
        pe->samples = (int) (swarm_splitmix64(&rng) % 2);
        pe->held_thirds = (int) (swarm_splitmix64(&rng) % 4);
        pe->held_kind[0] = pe->inflight = (int) (swarm_splitmix64(&rng) % 3);
        pe->busy[0] = 0.01 * (double) (swarm_splitmix64(&rng) % 3);
        pe->rtt = 0.005 * (double) (swarm_splitmix64(&rng) % 3);
        pe->failed = swarm_splitmix64(&rng) % 16 == 0;
        mb_t *b = &e->mbs[swarm_splitmix64(&rng) % (uint64_t) e->G];
        b->stage = (int) (swarm_splitmix64(&rng) % 4) - 1;
        b->backward = (int) (swarm_splitmix64(&rng) % 2);
        b->fwd_peer[swarm_splitmix64(&rng) % 3] = p;
        s_check_ready_lists(e);
        int not[2] = { (int) (swarm_splitmix64(&rng) % (uint64_t) e->npeers), -1 };
        int prefer = (int) (swarm_splitmix64(&rng) % (uint64_t) (e->npeers + 1)) - 1;
        for (int s = 0; s < 3; s++)
            s_check_picks(e, s, prefer, not, 2);
    }
    ck_assert_int_gt(engine_ready_count(e, -1), 24); // lists that outgrew their first 8
    s_close(&w, &e);
}
END_TEST

START_TEST(test_engine_refuses_a_bad_config_by_name)
{
    world_t w = { 0 };
    swarm_engine_config_t c = { .stages = 2, .batch = 4, .micro = 3 };
    swarm_engine_io_t io = { .ctx = &w, .send = s_send, .log = s_log, .lr_at = s_lr,
                             .clip_scale = s_clip };
    swarm_engine_t *e = NULL;
    char err[256];
    ck_assert_int_eq(swarm_engine_new(&c, &io, 0, &e, err, sizeof err), -EINVAL);
    ck_assert_ptr_null(e);
    ck_assert_msg(strstr(err, "micro-batch 3 of batch 4"), "%s", err);
}
END_TEST

static Suite *s_suite(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("peers");
    tcase_add_test(tc, test_engine_assigns_a_crowd_of_1000_with_no_fixed_table);
    tcase_add_test(tc, test_engine_reuses_the_entries_of_the_dead_and_keeps_64);
    tcase_add_test(tc, test_engine_status_is_json_for_every_peer_state);
    tcase_add_test(tc, test_engine_refuses_a_bad_config_by_name);
    suite_add_tcase(s, tc);
    tc = tcase_create("routing");
    tcase_add_test(tc, test_engine_picks_among_a_stages_ready_peers_as_over_the_whole_table);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(s_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
