/* key.c - Curve25519 key pairs and allow-lists: generate, read and write
 * Z85 key files (NAME.pub, and NAME.key with mode 0600), check them.
 *
 * Secret bytes and their Z85 text only ever sit in sodium_malloc memory
 * (guarded, wiped on free); files are read with read(2), not stdio, so no
 * library buffer keeps a copy. Nothing here touches a socket.
 */
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define KEY_FILE_MAX 4096   // bytes: a key file is one key and a comment
#define ALLOW_FILE_MAX (16 << 20) // bytes of an allow-list file (about 400,000 keys)

struct net_key_s {
    uint8_t pub[32];                     // Curve25519 public key
    uint8_t sec[32];                     // secret key, valid when has_secret
    char pub_z85[NET_KEY_Z85_LEN + 1];   // Z85 of pub, NUL-terminated
    int has_secret;                      // 1 when sec holds the secret key
};

// The Z85 alphabet (ZeroMQ RFC 32).
static const char s_z85_chars[] =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

// 1 when text is exactly NET_KEY_Z85_LEN Z85 characters that decode: each
// group of 5 is a base-85 number below 2^32 ("#####" is 85^5 - 1, too big).
static int s_z85_valid(const char *text, size_t len)
{
    if (len != NET_KEY_Z85_LEN)
        return 0;
    uint64_t group = 0;
    for (size_t i = 0; i < len; i++) {
        const char *digit = text[i] ? strchr(s_z85_chars, text[i]) : NULL;
        if (!digit)
            return 0;
        group = group * 85 + (uint64_t) (digit - s_z85_chars);
        if (i % 5 == 4) {
            if (group > UINT32_MAX)
                return 0;
            group = 0;
        }
    }
    return 1;
}

static net_key_t *s_key_alloc(void)
{
    if (sodium_init() < 0)
        return NULL;
    net_key_t *self = sodium_malloc(sizeof *self);
    if (self)
        sodium_memzero(self, sizeof *self);
    return self;
}

void net_key_destroy(net_key_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    sodium_free(*self_p); // wipes
    *self_p = NULL;
}

int net_key_generate(net_key_t **out)
{
    net_key_t *self = s_key_alloc();
    if (!self)
        return -ENOMEM;
    crypto_box_keypair(self->pub, self->sec);
    self->has_secret = 1;
    zmq_z85_encode(self->pub_z85, self->pub, sizeof self->pub);
    *out = self;
    return 0;
}

int net_key_from_z85(const char *z85, net_key_t **out)
{
    if (!z85 || !s_z85_valid(z85, strlen(z85)))
        return -EINVAL;
    net_key_t *self = s_key_alloc();
    if (!self)
        return -ENOMEM;
    if (!zmq_z85_decode(self->pub, z85)) {
        net_key_destroy(&self);
        return -EINVAL;
    }
    memcpy(self->pub_z85, z85, NET_KEY_Z85_LEN + 1);
    *out = self;
    return 0;
}

const char *net_key_public(const net_key_t *self)
{
    return self->pub_z85;
}

int net_key_has_secret(const net_key_t *self)
{
    return self->has_secret;
}

const uint8_t *net_key_public_raw(const net_key_t *self)
{
    return self->pub;
}

const uint8_t *net_key_secret_raw(const net_key_t *self)
{
    return self->has_secret ? self->sec : NULL;
}

// ---- key files -------------------------------------------------------------

int net_key_parse(char *text, const char *path, char *z85, char *err, size_t errlen)
{
    int keys = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        size_t len = strlen(line);
        while (len && (line[len - 1] == '\r' || line[len - 1] == ' ' || line[len - 1] == '\t'))
            line[--len] = '\0';
        if (len == 0 || line[0] == '#')
            continue;
        if (!s_z85_valid(line, len) || keys++ > 0) {
            snprintf(err, errlen, "%s: expected one line of %d Z85 characters (as `swarm keygen` "
                     "writes); regenerate the key", path, NET_KEY_Z85_LEN);
            return -EINVAL;
        }
        memcpy(z85, line, NET_KEY_Z85_LEN + 1);
    }
    if (keys == 0) {
        snprintf(err, errlen, "%s: no key in the file; regenerate it with `swarm keygen`", path);
        return -EINVAL;
    }
    return 0;
}

// Read the one key line of a key file into z85 (NET_KEY_Z85_LEN + 1 bytes,
// the caller's sodium memory). With secret, the file must not be readable
// by group or others.
static int s_file_read(const char *path, int secret, char *z85, char *err, size_t errlen)
{
    int rc = 0;
    char *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: %s", path, strerror(-rc));
        return rc;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > KEY_FILE_MAX) {
        snprintf(err, errlen, "%s: not a key file (not a regular file of at most %d bytes)",
                 path, KEY_FILE_MAX);
        rc = -EINVAL;
        goto out_close_fd;
    }
    if (secret && (st.st_mode & 077)) {
        snprintf(err, errlen, "%s: mode %04o lets others read the secret key; run: chmod 600 %s",
                 path, (unsigned) (st.st_mode & 07777), path);
        rc = -EACCES;
        goto out_close_fd;
    }
    if (sodium_init() < 0) {
        snprintf(err, errlen, "%s: libsodium failed to initialise", path);
        rc = -EIO;
        goto out_close_fd;
    }
    buf = sodium_malloc(KEY_FILE_MAX + 1); // the secret's text never leaves sodium memory
    if (!buf) {
        rc = -ENOMEM;
        goto out_close_fd;
    }
    ssize_t got = read(fd, buf, KEY_FILE_MAX);
    if (got < 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: %s", path, strerror(-rc));
        goto out_free;
    }
    buf[got] = '\0';
    if (memchr(buf, '\0', (size_t) got)) {
        snprintf(err, errlen, "%s: a NUL byte: not a key file; regenerate it with `swarm keygen`",
                 path);
        rc = -EINVAL;
        goto out_free;
    }
    rc = net_key_parse(buf, path, z85, err, errlen);
out_free:
    sodium_free(buf);
out_close_fd:
    close(fd);
    return rc;
}

int net_key_load_public(const char *path, net_key_t **out, char *err, size_t errlen)
{
    char z85[NET_KEY_Z85_LEN + 1];
    int rc = s_file_read(path, 0, z85, err, errlen);
    if (rc < 0)
        return rc;
    rc = net_key_from_z85(z85, out);
    if (rc < 0)
        snprintf(err, errlen, "%s: not a Curve public key", path);
    return rc;
}

int net_key_dir(char *dir, size_t cap)
{
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    if (xdg && *xdg)
        snprintf(dir, cap, "%s/swarm", xdg);
    else if (home && *home)
        snprintf(dir, cap, "%s/.config/swarm", home);
    else
        return -ENOENT;
    return 0;
}

int net_key_load(const char *name, net_key_t **out, char *err, size_t errlen)
{
    char path[4096];
    net_key_t *pub = NULL;
    net_key_t *self = s_key_alloc();
    char *z85 = sodium_malloc(NET_KEY_Z85_LEN + 1);
    int rc = 0;
    if (!self || !z85) {
        rc = -ENOMEM;
        goto out_free;
    }
    snprintf(path, sizeof path, "%s.key", name);
    rc = s_file_read(path, 1, z85, err, errlen);
    if (rc < 0)
        goto out_free;
    if (!zmq_z85_decode(self->sec, z85)) {
        snprintf(err, errlen, "%s: not a Curve secret key", path);
        rc = -EINVAL;
        goto out_free;
    }
    crypto_scalarmult_base(self->pub, self->sec);
    self->has_secret = 1;
    zmq_z85_encode(self->pub_z85, self->pub, sizeof self->pub);
    snprintf(path, sizeof path, "%s.pub", name);
    rc = net_key_load_public(path, &pub, err, errlen);
    if (rc < 0)
        goto out_free;
    if (sodium_memcmp(pub->pub, self->pub, sizeof self->pub) != 0) {
        snprintf(err, errlen, "%s does not match %s.key; regenerate both with `swarm keygen`",
                 path, name);
        rc = -EINVAL;
        goto out_free;
    }
    *out = self;
    self = NULL;
out_free:
    net_key_destroy(&pub);
    net_key_destroy(&self);
    sodium_free(z85);
    return rc;
}

// Write text to path atomically: a temporary file of this process's own
// in the same folder, fsync, then link (fails if path exists) or, with
// force, rename. Processes writing the same path at once never touch each
// other's temporary file: one links, the others get -EEXIST.
static int s_file_write(const char *path, const char *text, mode_t mode, int force,
                        char *err, size_t errlen)
{
    char tmp[4096 + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%08x", path, (long) getpid(),
             (unsigned) randombytes_random());
    int rc = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: %s", path, strerror(-rc));
        return rc;
    }
    size_t len = strlen(text);
    if (fchmod(fd, mode) != 0 || write(fd, text, len) != (ssize_t) len || fsync(fd) != 0)
        rc = errno ? -errno : -EIO;
    if (close(fd) != 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && (force ? rename(tmp, path) : link(tmp, path)) != 0)
        rc = -errno;
    if (rc < 0)
        snprintf(err, errlen, "%s: %s%s", path, strerror(-rc),
                 rc == -EEXIST ? " (use --force to overwrite)" : "");
    unlink(tmp);
    return rc;
}

int net_key_save(const net_key_t *self, const char *name, int force, char *err, size_t errlen)
{
    char key_path[4096], pub_path[4096];
    struct stat st;
    if (!self->has_secret) {
        snprintf(err, errlen, "%s: no secret key to save", name);
        return -EINVAL;
    }
    snprintf(key_path, sizeof key_path, "%s.key", name);
    snprintf(pub_path, sizeof pub_path, "%s.pub", name);
    if (!force && (lstat(key_path, &st) == 0 || lstat(pub_path, &st) == 0)) {
        snprintf(err, errlen, "%s: key files exist (use --force to overwrite)",
                 lstat(key_path, &st) == 0 ? key_path : pub_path);
        return -EEXIST;
    }
    // "# ...\n" + key + "\n": built in sodium memory, never in a stdio buffer
    static const char head[] = "# swarm Curve secret key (Z85); keep it private\n";
    size_t cap = sizeof head + NET_KEY_Z85_LEN + 2;
    char *text = sodium_malloc(cap);
    if (!text)
        return -ENOMEM;
    memcpy(text, head, sizeof head - 1);
    zmq_z85_encode(text + sizeof head - 1, self->sec, sizeof self->sec);
    memcpy(text + sizeof head - 1 + NET_KEY_Z85_LEN, "\n", 2);
    int rc = s_file_write(key_path, text, 0600, force, err, errlen);
    sodium_free(text);
    if (rc < 0)
        return rc;
    char pub_text[128];
    snprintf(pub_text, sizeof pub_text, "# swarm Curve public key (Z85)\n%s\n", self->pub_z85);
    return s_file_write(pub_path, pub_text, 0644, force, err, errlen);
}

// ---- allow-lists -----------------------------------------------------------

struct net_allow_s {
    pthread_mutex_t lock;                // guards keys and n (the ZAP thread reads)
    uint8_t (*keys)[32];                 // (cap, 32) public keys, sorted, no duplicates
    size_t n;                            // keys in use
    size_t cap;                          // keys allocated
};

net_allow_t *net_allow_new(void)
{
    net_allow_t *self = calloc(1, sizeof *self);
    if (self)
        pthread_mutex_init(&self->lock, NULL);
    return self;
}

void net_allow_destroy(net_allow_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    pthread_mutex_destroy(&(*self_p)->lock);
    free((*self_p)->keys);
    free(*self_p);
    *self_p = NULL;
}

// Where key is, or would go, in the sorted keys; *found says which.
static size_t s_allow_slot(const net_allow_t *self, const uint8_t *key, int *found)
{
    size_t lo = 0, hi = self->n;
    while (lo < hi) { // every message asks: O(log n), whatever the list
        size_t mid = lo + (hi - lo) / 2;
        int c = memcmp(self->keys[mid], key, 32);
        if (c == 0) {
            *found = 1;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = 0;
    return lo;
}

static int s_allow_find(const net_allow_t *self, const uint8_t *key)
{
    int found;
    (void) s_allow_slot(self, key, &found);
    return found;
}

// Room for more keys in all. 0 or -ENOMEM. The caller holds the lock.
static int s_allow_grow(net_allow_t *self, size_t more)
{
    if (self->n + more <= self->cap)
        return 0;
    size_t cap = self->cap ? self->cap : 16;
    while (cap < self->n + more)
        cap *= 2;
    void *keys = realloc(self->keys, cap * 32);
    if (!keys)
        return -ENOMEM;
    self->keys = keys;
    self->cap = cap;
    return 0;
}

static int s_key_cmp(const void *a, const void *b)
{
    return memcmp(a, b, 32);
}

// Sort and drop duplicates after keys were appended. The caller holds the lock.
static void s_allow_sort(net_allow_t *self)
{
    if (self->n < 2)
        return;
    qsort(self->keys, self->n, 32, s_key_cmp);
    size_t out = 1;
    for (size_t i = 1; i < self->n; i++)
        if (memcmp(self->keys[i], self->keys[out - 1], 32) != 0)
            memmove(self->keys[out++], self->keys[i], 32);
    self->n = out;
}

int net_allow_add(net_allow_t *self, const char *z85)
{
    uint8_t key[32];
    if (!z85 || !s_z85_valid(z85, strlen(z85)) || !zmq_z85_decode(key, z85))
        return -EINVAL;
    pthread_mutex_lock(&self->lock);
    int found;
    size_t at = s_allow_slot(self, key, &found);
    int rc = found ? 0 : s_allow_grow(self, 1);
    if (!found && rc == 0) {
        memmove(self->keys[at + 1], self->keys[at], (self->n - at) * 32);
        memcpy(self->keys[at], key, 32);
        self->n++;
    }
    pthread_mutex_unlock(&self->lock);
    return rc;
}

int net_allow_contains_raw(const net_allow_t *self, const uint8_t *key)
{
    net_allow_t *mut = (net_allow_t *) self; // the lock is not part of the value
    pthread_mutex_lock(&mut->lock);
    int found = s_allow_find(self, key);
    pthread_mutex_unlock(&mut->lock);
    return found;
}

int net_allow_contains(const net_allow_t *self, const char *z85)
{
    uint8_t key[32];
    if (!z85 || !s_z85_valid(z85, strlen(z85)) || !zmq_z85_decode(key, z85))
        return 0;
    return net_allow_contains_raw(self, key);
}

size_t net_allow_size(const net_allow_t *self)
{
    net_allow_t *mut = (net_allow_t *) self;
    pthread_mutex_lock(&mut->lock);
    size_t n = self->n;
    pthread_mutex_unlock(&mut->lock);
    return n;
}

// Parse one line of an allow-list: "" for a blank or comment line, else the
// key's Z85 text (trimmed, NUL-terminated in place).
static char *s_allow_line(char *line, size_t len)
{
    while (len && (line[len - 1] == ' ' || line[len - 1] == '\t' || line[len - 1] == '\r'))
        line[--len] = '\0';
    char *start = line + strspn(line, " \t");
    return *start == '#' ? start + strlen(start) : start;
}

// Append a Z85 key unsorted (s_allow_sort follows). 0, -EINVAL, -ENOMEM.
static int s_allow_append(net_allow_t *self, const char *z85)
{
    uint8_t key[32];
    if (!s_z85_valid(z85, strlen(z85)) || !zmq_z85_decode(key, z85))
        return -EINVAL;
    pthread_mutex_lock(&self->lock);
    int rc = s_allow_grow(self, 1);
    if (rc == 0)
        memcpy(self->keys[self->n++], key, 32);
    pthread_mutex_unlock(&self->lock);
    return rc;
}

int net_allow_parse(net_allow_t *self, const char *text, size_t len, const char *path,
                    char *err, size_t errlen)
{
    char line[NET_KEY_Z85_LEN + 64]; // longer lines cannot hold a key
    int lineno = 0, rc = 0;
    for (size_t at = 0; at < len;) {
        const char *eol = memchr(text + at, '\n', len - at);
        size_t n = eol ? (size_t) (eol - (text + at)) : len - at;
        lineno++;
        rc = -EINVAL;
        if (n < sizeof line && !memchr(text + at, '\0', n)) {
            memcpy(line, text + at, n);
            line[n] = '\0';
            char *key = s_allow_line(line, n);
            rc = *key ? s_allow_append(self, key) : 0;
        }
        if (rc == -EINVAL)
            snprintf(err, errlen, "%s:%d: not a Z85 public key (%d characters) nor a # comment",
                     path, lineno, NET_KEY_Z85_LEN);
        else if (rc < 0)
            snprintf(err, errlen, "%s:%d: %s", path, lineno, strerror(-rc));
        if (rc < 0)
            break;
        at += n + 1;
    }
    pthread_mutex_lock(&self->lock);
    s_allow_sort(self); // what was appended, bad line or not
    pthread_mutex_unlock(&self->lock);
    return rc;
}

// Read a whole text file of at most max bytes into malloc'ed *text.
static int s_text_read(const char *path, size_t max, char **text, size_t *len, char *err,
                       size_t errlen)
{
    *text = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        int rc = -errno;
        snprintf(err, errlen, "%s: %s", path, strerror(-rc));
        return rc;
    }
    int rc = 0;
    struct stat st;
    size_t got = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t) st.st_size > max) {
        rc = -EINVAL;
        snprintf(err, errlen, "%s: not an allow-list (not a regular file of at most %zu bytes)",
                 path, max);
    } else if (!(*text = malloc((size_t) st.st_size + 1))) {
        rc = -ENOMEM;
        snprintf(err, errlen, "%s: out of memory", path);
    }
    // one byte more than fstat said: a file that grew since is refused
    while (rc == 0 && got <= (size_t) st.st_size) {
        ssize_t r = read(fd, *text + got, (size_t) st.st_size + 1 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            snprintf(err, errlen, "%s: %s", path, strerror(-rc));
        }
        if (r <= 0)
            break;
        got += (size_t) r;
    }
    if (rc == 0 && got > (size_t) st.st_size) {
        rc = -EAGAIN;
        snprintf(err, errlen, "%s: the file changed while it was read; try again", path);
    }
    close(fd);
    if (rc < 0) {
        free(*text);
        *text = NULL;
    }
    *len = got;
    return rc;
}

// The keys of an allow-list file in a new list (nothing on error).
static int s_allow_read(const char *path, net_allow_t **out, char *err, size_t errlen)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = s_text_read(path, ALLOW_FILE_MAX, &text, &len, err, errlen);
    net_allow_t *fresh = rc == 0 ? net_allow_new() : NULL;
    if (rc == 0 && !fresh) {
        rc = -ENOMEM;
        snprintf(err, errlen, "%s: out of memory", path);
    }
    if (rc == 0)
        rc = net_allow_parse(fresh, text, len, path, err, errlen);
    free(text);
    if (rc == 0)
        *out = fresh;
    else
        net_allow_destroy(&fresh);
    return rc;
}

int net_allow_load(net_allow_t *self, const char *path, char *err, size_t errlen)
{
    net_allow_t *fresh = NULL;
    int rc = s_allow_read(path, &fresh, err, errlen);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&self->lock);
    rc = s_allow_grow(self, fresh->n);
    if (rc == 0 && fresh->n) { // an empty file: both arrays may still be NULL
        memcpy(self->keys[self->n], fresh->keys, fresh->n * 32);
        self->n += fresh->n;
        s_allow_sort(self);
    } else {
        snprintf(err, errlen, "%s: out of memory", path);
    }
    pthread_mutex_unlock(&self->lock);
    net_allow_destroy(&fresh);
    return rc;
}

int net_allow_reload(net_allow_t *self, const char *path, char *err, size_t errlen)
{
    net_allow_t *fresh = NULL;
    int rc = s_allow_read(path, &fresh, err, errlen);
    if (rc < 0)
        return rc;
    // swap the arrays: a reader holding the lock sees all of one list
    pthread_mutex_lock(&self->lock);
    uint8_t (*keys)[32] = self->keys;
    size_t cap = self->cap;
    self->keys = fresh->keys;
    self->n = fresh->n;
    self->cap = fresh->cap;
    pthread_mutex_unlock(&self->lock);
    fresh->keys = keys;
    fresh->cap = cap;
    net_allow_destroy(&fresh);
    return 0;
}
