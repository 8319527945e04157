/* fuzz_keys.c - libFuzzer target for the key material swarm reads (net/
 * key.c): Z85 public keys (--router-key, ZAP User-Ids), key files and
 * allow-lists, from memory and through the files.
 *
 * Input: byte 0 picks (mod 4): 0 a Z85 key; 1 a key file's text; 2 an
 * allow-list's text; 3 a key pair's files: byte 1 = bytes of NAME.key, the
 * rest NAME.pub (written to a temporary folder, NAME.key mode 0600), read
 * by net_key_load, net_key_load_public, net_allow_load and _reload. An
 * accepted key must be the 40 Z85 characters it came from and round-trip;
 * the loaders must agree with each other: else abort.
 */
#include "fuzz.h"
#include "wire.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TEXT_MAX 8192 // bytes of a text input used

static char s_dir[64]; // the files' folder, made once

static void s_dir_remove(void)
{
    char path[128];
    const char *names[] = {"k.key", "k.pub", "k.key.tmp", "k.pub.tmp"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", s_dir, names[i]);
        unlink(path);
    }
    rmdir(s_dir);
}

// An accepted Z85 key: exactly its text, and its bytes round-trip.
static void s_key_holds(const char *z85)
{
    net_key_t *k = NULL;
    uint8_t raw[32];
    char again[NET_KEY_Z85_LEN + 1];
    if (strlen(z85) != NET_KEY_Z85_LEN || net_key_from_z85(z85, &k) != 0
        || strcmp(net_key_public(k), z85) != 0 || !zmq_z85_decode(raw, z85)
        || !zmq_z85_encode(again, raw, 32) || strcmp(again, z85) != 0)
        abort();
    net_key_destroy(&k);
}

static int s_z85(const uint8_t *data, size_t size)
{
    char text[NET_KEY_Z85_LEN + 8];
    size_t n = size < sizeof text - 1 ? size : sizeof text - 1;
    memcpy(text, data, n);
    text[n] = '\0';
    net_key_t *k = NULL;
    int rc = net_key_from_z85(text, &k);
    net_allow_t *allow = net_allow_new();
    int added = net_allow_add(allow, text);
    if ((rc == 0) != (added == 0) || (rc != 0 && (rc != -EINVAL || k)))
        abort(); // the two Z85 readers must agree
    if (rc == 0) {
        s_key_holds(text);
        if (!net_allow_contains(allow, text) || net_allow_size(allow) != 1)
            abort();
    }
    net_key_destroy(&k);
    net_allow_destroy(&allow);
    return rc;
}

static int s_key_text(const uint8_t *data, size_t size)
{
    static char text[TEXT_MAX + 1];
    size_t n = size < TEXT_MAX ? size : TEXT_MAX;
    if (memchr(data, '\0', n))
        return -EINVAL; // the file reader refuses a NUL before parsing
    memcpy(text, data, n);
    text[n] = '\0';
    char z85[NET_KEY_Z85_LEN + 1], err[256] = "";
    int rc = net_key_parse(text, "fuzz.key", z85, err, sizeof err);
    if (rc == 0)
        s_key_holds(z85);
    else if (rc != -EINVAL || !strstr(err, "fuzz.key"))
        abort();
    return rc;
}

static int s_allow_text(const uint8_t *data, size_t size)
{
    char err[256] = "";
    size_t n = size < TEXT_MAX ? size : TEXT_MAX, lines = 1;
    for (size_t i = 0; i < n; i++)
        lines += data[i] == '\n';
    net_allow_t *allow = net_allow_new();
    int rc = net_allow_parse(allow, (const char *) data, n, "fuzz.allow", err, sizeof err);
    if (rc != 0 && (rc != -EINVAL || !strstr(err, "fuzz.allow:")))
        abort();
    if (net_allow_size(allow) > lines)
        abort();
    net_allow_destroy(&allow);
    return rc;
}

static void s_write(const char *path, const uint8_t *data, size_t size, mode_t mode)
{
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0 || chmod(path, mode))
        abort();
}

static int s_files(const uint8_t *data, size_t size)
{
    if (!s_dir[0]) {
        const char *tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(s_dir, sizeof s_dir, "%s/swarm-fuzz-keys.XXXXXX", tmp);
        if (!mkdtemp(s_dir))
            abort();
        atexit(s_dir_remove);
    }
    if (size < 1)
        return -EINVAL;
    size_t klen = data[0] < size - 1 ? data[0] : size - 1;
    char name[128], key[160], pub[160], err[512];
    snprintf(name, sizeof name, "%s/k", s_dir);
    snprintf(key, sizeof key, "%s.key", name);
    snprintf(pub, sizeof pub, "%s.pub", name);
    s_write(key, data + 1, klen, 0600);
    s_write(pub, data + 1 + klen, size - 1 - klen, 0644);
    net_key_t *pair = NULL, *alone = NULL;
    int rc = net_key_load(name, &pair, err, sizeof err);
    int rc_pub = net_key_load_public(pub, &alone, err, sizeof err);
    if (rc == 0 && (rc_pub != 0 || !net_key_has_secret(pair)
                    || strcmp(net_key_public(pair), net_key_public(alone)) != 0))
        abort(); // a loaded pair has a public file that says the same
    if (rc_pub == 0)
        s_key_holds(net_key_public(alone));
    // the same .pub as an allow-list: load and reload agree
    net_allow_t *a = net_allow_new(), *b = net_allow_new();
    int la = net_allow_load(a, pub, err, sizeof err);
    int lb = net_allow_reload(b, pub, err, sizeof err);
    if (la != lb || net_allow_size(a) != net_allow_size(b) || (la != 0 && net_allow_size(a) != 0))
        abort();
    if (rc_pub == 0 && la == 0 && !net_allow_contains(a, net_key_public(alone)))
        abort();
    net_allow_destroy(&a);
    net_allow_destroy(&b);
    net_key_destroy(&pair);
    net_key_destroy(&alone);
    return rc;
}

int fuzz_keys_one(const uint8_t *data, size_t size)
{
    if (size < 1)
        return -EINVAL;
    switch (data[0] % 4) {
    case 0: return s_z85(data + 1, size - 1);
    case 1: return s_key_text(data + 1, size - 1);
    case 2: return s_allow_text(data + 1, size - 1);
    default: return s_files(data + 1, size - 1);
    }
}

#ifdef SWARM_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void) fuzz_keys_one(data, size);
    return 0;
}
#endif

// ---- seeds -------------------------------------------------------------------

// A fixed key pair (secret bytes 1..32) in Z85.
static void s_pair(char sec[NET_KEY_Z85_LEN + 1], char pub[NET_KEY_Z85_LEN + 1])
{
    uint8_t s[32], p[32];
    for (int i = 0; i < 32; i++)
        s[i] = (uint8_t) (i + 1);
    if (sodium_init() < 0)
        abort();
    crypto_scalarmult_base(p, s);
    zmq_z85_encode(sec, s, 32);
    zmq_z85_encode(pub, p, 32);
}

int fuzz_keys_seed(int i, char *name, size_t namecap, uint8_t *buf, size_t cap, size_t *len)
{
    char sec[NET_KEY_Z85_LEN + 1], pub[NET_KEY_Z85_LEN + 1], text[1024];
    s_pair(sec, pub);
    const char *other = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";
    struct { const char *name; int mode; int split; } seeds[] = {
        {"ok-z85", 0, 0}, {"bad-z85-short", 0, 0}, {"bad-z85-not-an-alphabet-char", 0, 0},
        {"bad-z85-41-chars", 0, 0}, {"bad-z85-empty", 0, 0},
        {"ok-keyfile", 1, 0}, {"ok-keyfile-crlf-spaces", 1, 0}, {"bad-keyfile-two-keys", 1, 0},
        {"bad-keyfile-comment-only", 1, 0}, {"bad-keyfile-empty", 1, 0}, {"bad-keyfile-indented", 1, 0},
        {"ok-allow", 2, 0}, {"ok-allow-empty", 2, 0}, {"bad-allow-line-3", 2, 0},
        {"bad-allow-nul", 2, 0}, {"bad-allow-long-line", 2, 0},
        {"ok-files", 3, 0}, {"bad-files-mismatch", 3, 0}, {"bad-files-secret-garbage", 3, 0},
        {"bad-files-no-pub", 3, 0},
    };
    if (i < 0 || (size_t) i >= sizeof seeds / sizeof seeds[0])
        return 0;
    int n = 0;
    switch (i) {
    case 0: n = snprintf(text, sizeof text, "%s", pub); break;
    case 1: n = snprintf(text, sizeof text, "%.39s", pub); break;
    case 2: n = snprintf(text, sizeof text, "%.39s\"", pub); break;
    case 3: n = snprintf(text, sizeof text, "%s0", pub); break;
    case 4: n = 0; break;
    case 5: n = snprintf(text, sizeof text, "# swarm Curve public key (Z85)\n%s\n", pub); break;
    case 6: n = snprintf(text, sizeof text, "\r\n# a comment\r\n%s \t\r\n\r\n", pub); break;
    case 7: n = snprintf(text, sizeof text, "%s\n%s\n", pub, other); break;
    case 8: n = snprintf(text, sizeof text, "# only this\n"); break;
    case 9: n = 0; break;
    case 10: n = snprintf(text, sizeof text, "  %s\n", pub); break;
    case 11: n = snprintf(text, sizeof text, "# the nodes\n\n  %s  \n%s\r\n# end\n%s", pub, other, pub); break;
    case 12: n = snprintf(text, sizeof text, "# nobody yet\n\n"); break;
    case 13: n = snprintf(text, sizeof text, "%s\n# ok\nnot a key\n", pub); break;
    case 14: n = snprintf(text, sizeof text, "%s\n", pub); text[5] = '\0'; break;
    case 15: n = snprintf(text, sizeof text, "%0200d%s\n", 0, pub); break;
    case 16: n = snprintf(text, sizeof text, "# swarm Curve secret key (Z85); keep it private\n%s\n"
                          "# swarm Curve public key (Z85)\n%s\n", sec, pub); break;
    case 17: n = snprintf(text, sizeof text, "%s\n%s\n", sec, other); break;
    case 18: n = snprintf(text, sizeof text, "%.20s\n%s\n", "garbage garbage garbage", pub); break;
    case 19: n = snprintf(text, sizeof text, "%s\n", sec); break;
    }
    size_t at = 0;
    buf[at++] = (uint8_t) seeds[i].mode;
    if (seeds[i].mode == 3) { // byte 1: bytes of NAME.key = up to and with the second line
        const char *nl = strchr(text, '\n');
        nl = nl && i == 16 ? strchr(nl + 1, '\n') : nl;
        size_t k = nl ? (size_t) (nl - text) + 1 : (size_t) n;
        buf[at++] = (uint8_t) k;
    }
    if (at + (size_t) n > cap)
        abort();
    memcpy(buf + at, text, (size_t) n);
    *len = at + (size_t) n;
    snprintf(name, namecap, "%s", seeds[i].name);
    return 1;
}
