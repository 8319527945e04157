/* engine_decode.c - a message from a peer, decoded once at the edge into a
 * typed event (msg_in_t): every meta field the engine reads, parsed and
 * checked here, so no handler reads meta text. The rules, field by field,
 * are the table below. It decides nothing: a field that fails its check is
 * marked so, and what that costs the peer (nothing, a default, a failed
 * request) is its handler's. Tensors stay in the message, decoded where
 * they are used.
 */
#include "engine_int.h"

// Field    where       accepted                                  else
// proto    HELLO       "1" (at most 15 chars kept)               proto_ok 0
// name     HELLO       text of at most 63 chars                  "?"
// device   HELLO       text of at most 127 chars                 "?"
// tok_s    HELLO       a number in (0, 1e12)                     has_tok_s 0
// memory   HELLO       a number of bytes in [0, 1e18) (0: any)   0 (any stage)
// queue    HEARTBEAT   a whole number in 0..999999               0 (absent: has_queue 0)
// tok_s    HEARTBEAT   a number in [0, 1e12)                     0 (absent: has_tok_s 0)
// slots    HEARTBEAT   a whole number in 0..INT_MAX              -1 (absent: has_slots 0)
// memory_used, memory_heap, rss
//          HEARTBEAT   numbers of bytes in [0, 1e18)             0 (unknown)
// loss     replies     a finite fp32 number >= 0                 has_loss 0, NAN
// checksum replies     64 lowercase hex digits                   has_checksum 0, ""
// sumsq    replies     a finite number >= 0                      has_sumsq 0
// samples  replies     a whole number in 0..INT_MAX              has_samples 0
// held,    replies     both numbers in [0, 1e6)                  has_timing 0
//   busy
// reason   replies     text of at most 127 chars                 "no reason given"
//
// A number is what strtod (strtof for the loss, strtol for a whole one)
// reads to the end of the value: "1.5x", "" and "abc" are not numbers. A
// value longer than the field's text (the caps above; a number: 31 chars,
// a loss 63, a sumsq 127) counts as absent. Text is sanitized
// (engine_sanitize): it goes into logs and JSON.

// Text from a peer goes into logs and JSON: printable ASCII only, no quotes.
void engine_sanitize(char *text)
{
    for (char *c = text; *c; c++)
        if (*c < 0x20 || *c > 0x7e || *c == '"' || *c == '\\')
            *c = '?';
}

// The value of key into out (cap bytes, NUL-terminated): 1, or 0 when it
// is absent or does not fit (out untouched).
static int s_text(const net_msg_t *m, const char *key, char *out, size_t cap)
{
    return net_msg_meta_get(m, key, out, cap) == 0;
}

// key's value as a number (strtod, the whole value): 1 and *v, else 0.
static int s_number(const net_msg_t *m, const char *key, size_t cap, double *v)
{
    char text[128], *end = NULL;
    if (cap > sizeof text || !s_text(m, key, text, cap))
        return 0;
    *v = strtod(text, &end);
    return end != text && *end == '\0';
}

// key's value as a whole number (strtol, the whole value, within long):
// 1 and *v, else 0.
static int s_whole(const net_msg_t *m, const char *key, long *v)
{
    char text[32], *end = NULL;
    if (!s_text(m, key, text, sizeof text))
        return 0;
    errno = 0;
    *v = strtol(text, &end, 10);
    return end != text && *end == '\0' && errno == 0;
}

// Whether key is there at all (in a value of at most cap - 1 chars).
static int s_present(const net_msg_t *m, const char *key, size_t cap)
{
    char text[128];
    return cap <= sizeof text && s_text(m, key, text, cap);
}

static void s_hello(const net_msg_t *m, msg_hello_t *h)
{
    *h = (msg_hello_t) { .name = "?", .device = "?" };
    if (!s_text(m, "proto", h->proto, sizeof h->proto))
        h->proto[0] = '\0';
    h->proto_ok = strcmp(h->proto, "1") == 0;
    s_ignore(s_text(m, "name", h->name, sizeof h->name));      // else "?"
    s_ignore(s_text(m, "device", h->device, sizeof h->device)); // else "?"
    engine_sanitize(h->proto);
    engine_sanitize(h->name);
    engine_sanitize(h->device);
    double t = 0.0;
    h->has_tok_s = s_number(m, "tok_s", 32, &t) && isfinite(t) && t > 0 && t < 1e12;
    h->tok_s = h->has_tok_s ? t : 0.0;
    h->memory = s_number(m, "memory", 32, &t) && t >= 0 && t < 1e18 ? t : 0.0;
}

static void s_heartbeat(const net_msg_t *m, msg_heartbeat_t *hb)
{
    *hb = (msg_heartbeat_t) { 0 };
    long n = 0;
    double t = 0.0;
    if ((hb->has_queue = s_present(m, "queue", 32)))
        hb->queue = s_whole(m, "queue", &n) && n >= 0 && n < 1000000 ? (int) n : 0;
    if ((hb->has_tok_s = s_present(m, "tok_s", 32)))
        hb->tok_s = s_number(m, "tok_s", 32, &t) && isfinite(t) && t >= 0 && t < 1e12 ? t : 0.0;
    if ((hb->has_slots = s_present(m, "slots", 32)))
        hb->slots = s_whole(m, "slots", &n) && n >= 0 && n <= INT_MAX ? (int) n : -1;
    hb->memory_used = s_number(m, "memory_used", 32, &t) && t >= 0 && t < 1e18 ? t : 0.0;
    hb->rss = s_number(m, "rss", 32, &t) && t >= 0 && t < 1e18 ? t : 0.0;
    hb->memory_heap = s_number(m, "memory_heap", 32, &t) && t >= 0 && t < 1e18 ? t : 0.0;
    hb->rss_grown = s_number(m, "rss_grown", 32, &t) && t >= 0 && t < 1e18 ? t : 0.0;
    hb->device_used = s_number(m, "device_used", 32, &t) && t >= 0 && t < 1e18 ? t : 0.0;
}

// 64 lowercase hex digits into out[65]: 1, else 0 and "".
static int s_checksum(const net_msg_t *m, char out[65])
{
    char text[80];
    int ok = s_text(m, "checksum", text, sizeof text) && strlen(text) == 64
             && strspn(text, "0123456789abcdef") == 64;
    snprintf(out, 65, "%s", ok ? text : "");
    return ok;
}

static void s_reply(const net_msg_t *m, msg_reply_t *y)
{
    *y = (msg_reply_t) { .loss = NAN };
    char text[64], *end = NULL;
    if (s_text(m, "loss", text, sizeof text)) {
        float loss = strtof(text, &end);
        y->has_loss = end != text && *end == '\0' && isfinite(loss) && loss >= 0;
        y->loss = y->has_loss ? loss : NAN;
    }
    y->has_checksum = s_checksum(m, y->checksum);
    double v = 0.0;
    y->has_sumsq = s_number(m, "sumsq", 128, &v) && isfinite(v) && v >= 0;
    y->sumsq = y->has_sumsq ? v : 0.0;
    long k = 0;
    y->has_samples = s_whole(m, "samples", &k) && k >= 0 && k <= INT_MAX;
    y->samples = y->has_samples ? k : 0;
    double held = 0.0, busy = 0.0;
    y->has_timing = s_number(m, "held", 32, &held) && s_number(m, "busy", 32, &busy)
                    && held >= 0 && held < 1e6 && busy >= 0 && busy < 1e6;
    y->held = y->has_timing ? held : 0.0;
    y->busy = y->has_timing ? busy : 0.0;
    if (!s_text(m, "reason", y->reason, sizeof y->reason))
        snprintf(y->reason, sizeof y->reason, "no reason given");
    engine_sanitize(y->reason);
}

void engine_msg_decode(const net_msg_t *m, msg_in_t *out)
{
    const net_head_t *h = net_msg_head_const(m);
    out->msg = m;
    out->head = h;
    if (h->type == NET_MSG_HELLO)
        s_hello(m, &out->hello);
    else if (h->type == NET_MSG_HEARTBEAT)
        s_heartbeat(m, &out->heartbeat);
    else
        s_reply(m, &out->reply);
}
