/* fuzz_meta.c - libFuzzer target for the meta text of a message (the
 * "key=value" lines of HELLO, HEARTBEAT, RESULT, GRAD, ERROR, STATUS...):
 * any bytes as a received meta frame, through the frame decoder
 * (net_msg_from_frames), then net_msg_meta_get for every key the router
 * and the node read, with buffers of many sizes, and the router engine's
 * decoder of those fields (swarm/engine_decode.c).
 *
 * Input: the meta frame. Every lookup must give what a plain reading of
 * the lines gives (the first line "key=..." wins; -ENOBUFS when the value
 * does not fit, -ENOENT when absent), NUL-terminated within the buffer;
 * every field the engine's decoder hands on must keep its rule; anything
 * else aborts.
 */
#include "engine_int.h"
#include "fuzz.h"
#include "wire.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const net_limits_t s_limits = {0, 1, 1, 1, 1u << 16};

// The keys peers' meta is read for (docs/swarm.md), and two odd ones.
static const char *const s_keys[] = {
    "proto", "name", "device", "threads", "memory", "tok_s", "queue", "stage", "step",
    "loss", "checksum", "samples", "sumsq", "scale", "eval", "norm_only", "lr", "wd", "t",
    "reason", "fatal", "V", "T", "C", "L", "H", "S", "micro", "peer", "cut", "", "name=x",
};
static const size_t s_caps[] = {1, 2, 3, 8, 16, 17, 32, 64, 65, 128, 256, 4096};

// The plain reading: 0 and the value's place, or -ENOENT.
static int s_lookup(const char *text, size_t len, const char *key, size_t *at, size_t *vlen)
{
    size_t klen = strlen(key);
    for (size_t start = 0; start < len;) {
        size_t end = start;
        while (end < len && text[end] != '\n')
            end++;
        if (end - start > klen && !memcmp(text + start, key, klen) && text[start + klen] == '=') {
            *at = start + klen + 1;
            *vlen = end - *at;
            return 0;
        }
        start = end + 1;
    }
    return -ENOENT;
}

static void s_check(const net_msg_t *m, const char *text, size_t len, const char *key)
{
    static char out[4096 + 16];
    size_t at = 0, vlen = 0;
    int want = s_lookup(text, len, key, &at, &vlen);
    for (size_t c = 0; c < sizeof s_caps / sizeof s_caps[0]; c++) {
        size_t cap = s_caps[c];
        memset(out, 0x5a, cap + 16);
        int rc = net_msg_meta_get(m, key, out, cap);
        int expect = want == 0 && vlen + 1 > cap ? -ENOBUFS : want;
        if (rc != expect)
            abort();
        if (rc == 0 && (memcmp(out, text + at, vlen) != 0 || out[vlen] != '\0'))
            abort();
        if ((unsigned char) out[cap] != 0x5a) // wrote past the buffer
            abort();
    }
}

// NUL-terminated within cap, printable ASCII without quotes or backslashes
// (what engine_sanitize leaves).
static int s_clean(const char *text, size_t cap)
{
    size_t n = strnlen(text, cap);
    for (size_t i = 0; i < n; i++)
        if (text[i] < 0x20 || text[i] > 0x7e || text[i] == '"' || text[i] == '\\')
            return 0;
    return n < cap;
}

// The engine's decoder on m as a HELLO, a HEARTBEAT and a reply: whatever
// the text, each field it hands on is within its rule.
static void s_check_engine(net_msg_t *m)
{
    msg_in_t e;
    net_msg_head(m)->type = NET_MSG_HELLO;
    engine_msg_decode(m, &e);
    const msg_hello_t *he = &e.hello;
    if (!s_clean(he->proto, sizeof he->proto) || !s_clean(he->name, sizeof he->name)
        || !s_clean(he->device, sizeof he->device) || (he->proto_ok && strcmp(he->proto, "1"))
        || (he->has_tok_s && !(he->tok_s > 0 && he->tok_s < 1e12)))
        abort();
    net_msg_head(m)->type = NET_MSG_HEARTBEAT;
    engine_msg_decode(m, &e);
    const msg_heartbeat_t *hb = &e.heartbeat;
    if (hb->queue < 0 || hb->queue >= 1000000 || !(hb->tok_s >= 0 && hb->tok_s < 1e12)
        || hb->slots < -1)
        abort();
    net_msg_head(m)->type = NET_MSG_RESULT;
    engine_msg_decode(m, &e);
    const msg_reply_t *y = &e.reply;
    int hex = strlen(y->checksum) == 64 && strspn(y->checksum, "0123456789abcdef") == 64;
    if ((y->has_loss ? !(isfinite(y->loss) && y->loss >= 0) : !isnan(y->loss))
        || (y->has_checksum ? !hex : y->checksum[0] != '\0')
        || (y->has_sumsq && !(isfinite(y->sumsq) && y->sumsq >= 0))
        || (y->has_timing && !(y->held >= 0 && y->held < 1e6 && y->busy >= 0 && y->busy < 1e6))
        || !s_clean(y->reason, sizeof y->reason))
        abort();
}

int fuzz_meta_one(const uint8_t *data, size_t size)
{
    net_head_t head = {.type = NET_MSG_HELLO, .meta_len = (uint32_t) size};
    if (size > s_limits.max_meta)
        return -EPROTO;
    uint8_t hbuf[NET_WIRE_HEAD_MAX];
    size_t hlen = net_wire_head_encode(&head, hbuf, sizeof hbuf);
    zmq_msg_t frames[2];
    size_t n = size ? 2 : 1;
    if (zmq_msg_init_size(&frames[0], hlen) != 0 || zmq_msg_init_size(&frames[1], size) != 0)
        abort();
    memcpy(zmq_msg_data(&frames[0]), hbuf, hlen);
    if (size)
        memcpy(zmq_msg_data(&frames[1]), data, size);
    else
        zmq_msg_close(&frames[1]);
    net_msg_t *m = NULL;
    char err[256] = "";
    int rc = net_msg_from_frames(frames, n, n, &s_limits, &m, err, sizeof err);
    if (rc != 0) {
        if (rc != -EPROTO || m || !memchr(data, '\0', size))
            abort(); // only a NUL byte may make this meta malformed
        return rc;
    }
    size_t len = 0;
    const char *text = net_msg_meta(m, &len);
    if (len != size || (size && (!text || memcmp(text, data, size) != 0)))
        abort();
    for (size_t k = 0; k < sizeof s_keys / sizeof s_keys[0]; k++)
        s_check(m, (const char *) data, size, s_keys[k]);
    // a key taken from the text itself: the first line's name
    char key[40];
    size_t klen = 0;
    while (klen < size && klen < sizeof key - 1 && data[klen] != '=' && data[klen] != '\n')
        klen++;
    memcpy(key, data, klen);
    key[klen] = '\0';
    s_check(m, (const char *) data, size, key);
    s_check_engine(m);
    net_msg_destroy(&m);
    return 0;
}

#ifdef SWARM_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void) fuzz_meta_one(data, size);
    return 0;
}
#endif

// ---- seeds: what swarm's processes write, and odd texts ---------------------

static const struct {
    const char *name;
    const char *text;
    size_t len;          // 0: strlen(text)
} s_seeds[] = {
    {"ok-hello", "proto=1\nname=node1\ndevice=cpu: 1 thread, OpenBLAS\nthreads=1\nmemory=16777216\ntok_s=18000.0", 0},
    {"ok-heartbeat", "stage=1\nqueue=0\ntok_s=1234.5\nstep=17", 0},
    {"ok-assign", "V=256\nT=16\nC=32\nL=2\nH=4\nS=2\nstage=1\nmicro=2\npeer=3\n", 0},
    {"ok-update", "lr=0x1.47ae147ae147bp-7\nscale=0x1p+0\nwd=0x1.999999999999ap-4\nt=8", 0},
    {"ok-error-fatal", "reason=this node's key was removed from the swarm's allow-list\nfatal=1", 0},
    {"ok-empty", "", 0},
    {"ok-duplicate-keys", "name=first\nname=second\nname", 0},
    {"ok-no-newline-no-equals", "proto", 0},
    {"ok-crlf-and-blank-lines", "\n\nproto=1\r\nname=\r\n\n", 0},
    {"ok-equals-in-value", "reason=a=b=c\n=empty key\n==", 0},
    {"ok-long-value", "name=xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", 0},
    {"ok-control-codes", "name=\033[2J\033[31mred\a\nproto=1", 0},
    {"ok-result", "loss=4.60517025\nheld=0.250000\nbusy=0.125000", 0},
    {"ok-grad-applied", "samples=4\nsumsq=0x1.8p+3\nchecksum="
                        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", 0},
    {"ok-heartbeat-slots", "stage=1\nqueue=3\ntok_s=1234.5\nstep=17\nslots=8", 0},
    {"ok-bad-numbers", "loss=nan\nsumsq=-1\nheld=1e6\nbusy=abc\nqueue=-1\nslots=x\ntok_s=inf\n"
                       "checksum=ABC\nproto=1x", 0},
    {"bad-nul-inside", "proto=1\0name=x", 14},
};

int fuzz_meta_seed(int i, char *name, size_t namecap, uint8_t *buf, size_t cap, size_t *len)
{
    if (i < 0 || (size_t) i >= sizeof s_seeds / sizeof s_seeds[0])
        return 0;
    *len = s_seeds[i].len ? s_seeds[i].len : strlen(s_seeds[i].text);
    if (*len > cap)
        abort();
    memcpy(buf, s_seeds[i].text, *len);
    snprintf(name, namecap, "%s", s_seeds[i].name);
    return 1;
}
