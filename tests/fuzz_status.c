/* fuzz_status.c - libFuzzer target for `swarm status`'s reading of the
 * router's STATUS reply: jansson's parser under status.c's limits, the
 * reading of the fields (the history and counters too) and the tables it
 * prints (node/status.c), and the dashboard's path (node/dashboard.c): the
 * reply taken twice, the second as if it were what is new since the
 * first's cursor, then /api/state and /metrics rendered, on any bytes.
 *
 * Input: the reply's meta text, as it came off the wire. The parser must
 * accept or refuse it with a reason (-EPROTO), and an accepted reply must
 * print; the dashboard must serve JSON either way (the document, or why it
 * has none) and say in /metrics whether the router is up; anything else
 * aborts. The tables go to /dev/null.
 */
#include "fuzz.h"
#include "node.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fuzz_status_one(const uint8_t *data, size_t size)
{
    static FILE *out;
    if (!out && !(out = fopen("/dev/null", "w")))
        abort();
    char err[256] = "";
    int rc = node_status_show((const char *) data, size, "tcp://fuzz:7070", out, err, sizeof err);
    if (rc != 0 && (rc != -EPROTO || !err[0]))
        abort();
    const char *texts[] = { (const char *) data, (const char *) data };
    size_t lens[] = { size, size };
    char *state = NULL, *metrics = NULL;
    int taken = node_dashboard_feed(texts, lens, 2, &state, &metrics);
    json_t *doc = state ? json_loads(state, JSON_ALLOW_NUL, NULL) : NULL;
    if ((taken != 0 && taken != 2) || (taken && rc != 0) || !json_is_object(doc) || !metrics ||
        !strstr(metrics, taken ? "\nswarm_router_up 1\n" : "\nswarm_router_up 0\n") ||
        (!taken && !json_is_string(json_object_get(doc, "error"))))
        abort();
    json_decref(doc);
    free(state);
    free(metrics);
    return rc;
}

#ifdef SWARM_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void) fuzz_status_one(data, size);
    return 0;
}
#endif

// ---- seeds: the router's replies (docs/swarm.md) and broken ones -------------

static const struct {
    const char *name;
    const char *text;
} s_seeds[] = {
    {"ok-training",
     "{\"step\": 12, \"iters\": 2000, \"loss\": 2.41, \"loss_avg\": 2.47, \"tok_s\": 5120.0,\n"
     " \"eta_s\": 300.5, \"state\": \"training\",\n"
     " \"stages\": [{\"stage\": 0, \"replicas\": 2, \"tok_s\": 2600.0, \"queue\": 1},\n"
     "            {\"stage\": 1, \"replicas\": 1, \"tok_s\": 2520.0, \"queue\": 0}],\n"
     " \"peers\": [{\"id\": 3, \"name\": \"desk-1\", \"key\": \"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7\",\n"
     "            \"device\": \"cpu: 1 thread\", \"stage\": 0, \"tok_s\": 1300.0, \"inflight\": 1,\n"
     "            \"heartbeat_age_s\": 0.4, \"state\": \"ready\"}]}"},
    {"ok-waiting-nulls",
     "{\"step\": 0, \"iters\": 20, \"loss\": null, \"loss_avg\": null, \"tok_s\": 0, \"eta_s\": null,"
     " \"state\": \"waiting\", \"stages\": null, \"peers\": []}"},
    {"ok-empty-object", "{}"},
    {"ok-unknown-fields-skipped",
     "{\"new\": {\"a\": [1, 2, {\"b\": true}], \"c\": false}, \"step\": 1e3, \"x\": \"\\u00e9\\n\","
     " \"peers\": [{\"name\": \"a\\\"b\\\\c\\u0007\", \"extra\": [null]}]}"},
    {"ok-expelled-peer",
     "{\"step\": 40, \"loss\": null, \"state\": \"training\", \"peers\": [{\"id\": 5, \"name\": \"drift\",\n"
     " \"state\": \"banned\", \"failures\": 1, \"banned_s\": null, \"expelled\": true,\n"
     " \"why\": \"diverged from its replicas a second time: expelled\"}], \"peers_omitted\": 0}"},
    {"ok-nul-and-utf8-in-strings", "{\"state\": \"a\\u0000b\", \"peers\": [{\"name\": \"\\u00e9t\\u00e9\"}]}"},
    {"ok-number-long-mantissa",
     "{\"step\": 1.00000000000000000000000000000000000000000000000000000000000000000001}"},
    {"ok-long-strings",
     "{\"state\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\","
     " \"peers\": [{\"device\": \"yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy\"}]}"},
    {"ok-huge-numbers", "{\"step\": 1e308, \"eta_s\": 1e300, \"tok_s\": -1e308, \"peers\": [{\"id\": -0.0}]}"},
    {"ok-history",
     "{\"step\": 3, \"state\": \"training\", \"now_s\": 12.5,\n"
     " \"counters\": {\"rollbacks\": 0, \"bans\": 1, \"wire_in\": {\"activations\": 1024}},\n"
     " \"history\": {\"cursor\": 9, \"since\": 4, \"loss_every\": 1, \"events_kept\": 64,\n"
     "  \"loss\": [[2, 5.1], [3, 5.0]], \"evals\": [[3, 5.0, null]], \"speed\": [[12.5, 900.0, null]],\n"
     "  \"events\": [[11.0, \"warn\", \"peer 2 (b): its connection is gone\"]]}}"},
    {"bad-history-not-an-object", "{\"history\": [1]}"},
    {"bad-history-point-of-strings", "{\"history\": {\"loss\": [[\"1\", \"5.0\"]]}}"},
    {"bad-history-point-too-long", "{\"history\": {\"speed\": [[1, 2, 3, 4]]}}"},
    {"bad-history-event-shape", "{\"history\": {\"events\": [[1.0, 2, \"text\"]]}}"},
    {"bad-history-cursor-string", "{\"history\": {\"cursor\": \"9\"}}"},
    {"bad-counters-string", "{\"counters\": {\"bans\": \"one\"}}"},
    {"bad-counters-nested-twice", "{\"counters\": {\"wire_in\": {\"a\": {\"b\": 1}}}}"},
    {"bad-empty", ""},
    {"bad-not-an-object", "[1, 2, 3]"},
    {"bad-text-after", "{\"step\": 1} {\"step\": 2}"},
    {"bad-unclosed-object", "{\"step\": 1,"},
    {"bad-unclosed-string", "{\"state\": \"traini"},
    {"bad-control-character", "{\"state\": \"a\tb\"}"},
    {"bad-escape", "{\"state\": \"\\x41\"}"},
    {"bad-short-unicode-escape", "{\"state\": \"\\u12\"}"},
    {"bad-number-overflow", "{\"step\": 1e999}"},
    {"bad-number-hex", "{\"step\": 0x10}"},
    {"bad-string-as-number", "{\"step\": \"12\"}"},
    {"bad-number-as-string", "{\"state\": 12}"},
    {"bad-stages-not-objects", "{\"stages\": [1, 2]}"},
    {"bad-missing-colon", "{\"step\" 1}"},
    {"bad-trailing-comma", "{\"step\": 1,}"},
    {"bad-too-deep",
     "{\"x\": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}"},
    {"bad-diverged-loss", "{\"loss\": nan, \"loss_avg\": -inf, \"state\": \"training\"}"},
    {"bad-banned-inf", "{\"peers\": [{\"id\": 5, \"state\": \"banned\", \"banned_s\": inf, \"why\": \"\"}]}"},
    {"bad-invalid-utf8", "{\"state\": \"\xff\xfe\"}"},
    {"bad-expelled-not-boolean", "{\"peers\": [{\"expelled\": 1}]}"},
    {"bad-peers-not-an-array", "{\"peers\": {\"id\": 1}}"},
};

int fuzz_status_seed(int i, char *name, size_t namecap, uint8_t *buf, size_t cap, size_t *len)
{
    if (i < 0 || (size_t) i >= sizeof s_seeds / sizeof s_seeds[0])
        return 0;
    *len = strlen(s_seeds[i].text);
    if (*len > cap)
        abort(); // our own seed
    snprintf(name, namecap, "%s", s_seeds[i].name);
    memcpy(buf, s_seeds[i].text, *len);
    return 1;
}
