/* fuzz.c - replaying a fuzz target's seed corpus as an ordinary test, and
 * keeping the generated seeds in step with the code that writes them
 * (check_net, check_node). No libFuzzer here.
 */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEED_MAX (1 << 20) // bytes of one corpus file read back

static void s_dir(const fuzz_target_t *t, char *out, size_t cap)
{
    const char *root = getenv("SWARM_CORPUS_ROOT");
    snprintf(out, cap, "%s/%s", root ? root : "tests/corpus", t->name);
}

// Read path into buf (cap bytes): the length, or -1.
static long s_read(const char *path, uint8_t *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    size_t got = fread(buf, 1, cap, f);
    fclose(f);
    return (long) got;
}

int fuzz_corpus_check(const fuzz_target_t *t, int write_it, char *err, size_t errlen)
{
    char dir[256], path[512], name[128];
    uint8_t *seed = malloc(SEED_MAX), *file = malloc(SEED_MAX);
    int rc = seed && file ? 0 : -1;
    s_dir(t, dir, sizeof dir);
    size_t len = 0;
    for (int i = 0; rc == 0 && t->seed(i, name, sizeof name, seed, SEED_MAX, &len); i++) {
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (write_it) {
            FILE *f = fopen(path, "wb");
            if (!f || fwrite(seed, 1, len, f) != len) {
                snprintf(err, errlen, "%s: %s", path, strerror(errno));
                rc = -1;
            }
            if (f)
                fclose(f);
            continue;
        }
        long got = s_read(path, file, SEED_MAX);
        if (got < 0) {
            snprintf(err, errlen, "%s missing: run from the repository root, or write the seeds "
                     "with SWARM_WRITE_CORPUS=1", path);
            rc = -1;
        } else if ((size_t) got != len || memcmp(file, seed, len) != 0) {
            snprintf(err, errlen, "%s differs from what the code writes today: after a "
                     "deliberate format change, rewrite it with SWARM_WRITE_CORPUS=1", path);
            rc = -1;
        }
    }
    free(seed);
    free(file);
    return rc;
}

int fuzz_corpus_replay(const fuzz_target_t *t, int *files, char *err, size_t errlen)
{
    char dir[256], path[512];
    s_dir(t, dir, sizeof dir);
    *files = 0;
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(err, errlen, "%s: %s (run from the repository root)", dir, strerror(errno));
        return -1;
    }
    uint8_t *buf = malloc(SEED_MAX);
    int rc = buf ? 0 : -1;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        long len = s_read(path, buf, SEED_MAX);
        if (len < 0) {
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            rc = -1;
            break;
        }
        int got = t->one(buf, (size_t) len); // aborts on a broken promise
        (*files)++;
        if (!strncmp(e->d_name, "ok-", 3) && got != 0) {
            snprintf(err, errlen, "%s refused (%d), expected accepted", path, got);
            rc = -1;
        } else if (!strncmp(e->d_name, "bad-", 4) && got == 0) {
            snprintf(err, errlen, "%s accepted, expected refused", path);
            rc = -1;
        }
    }
    closedir(d);
    free(buf);
    return rc;
}
