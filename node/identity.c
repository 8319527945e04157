/* identity.c - a node's identity: the key pair a `swarm node` process runs
 * with, claimed for the life of the process. Without --key a node takes the
 * first of ~/.config/swarm/node, node-2, node-3, ... that no other node
 * process on this machine holds, so two nodes on one desktop never share a
 * key; a claim is an flock on NAME.lock, which the kernel lets go when the
 * process ends, however it ends. It reads and writes key files only through
 * net/ (atomic, mode 0600) and knows nothing of the router.
 */
#include "net.h"
#include "node.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define IDENTITY_NAMES_MAX 64 // node, node-2, ... node-64 under the config folder

// The pid in a held lock file. A holder writes it just after its flock, so
// a claim made at the same moment can find the file empty, or holding the
// pid of a node that ended long ago: wait (at most a fifth of a second) for
// a pid that is alive. 0 when none comes.
static long s_holder(int f)
{
    for (int tries = 0; tries < 40; tries++) {
        char text[32] = "";
        ssize_t got = pread(f, text, sizeof text - 1, 0);
        long pid = got > 0 ? strtol(text, NULL, 10) : 0;
        if (pid > 0 && pid != (long) getpid() && (kill((pid_t) pid, 0) == 0 || errno == EPERM))
            return pid;
        usleep(5000);
    }
    return 0;
}

static void s_holder_name(long pid, char *out, size_t n)
{
    if (pid > 0)
        snprintf(out, n, "node pid %ld", pid);
    else
        snprintf(out, n, "another swarm node");
}

// Claim NAME: an exclusive flock on NAME.lock, which holds our pid. 0 and
// *fd; -EBUSY another process holds it (*holder, when asked for, its pid:
// 0 unknown); other -errno when the lock file cannot be opened.
static int s_claim(const char *name, int *fd, long *holder)
{
    char path[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s.lock", name);
    int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, 0600);
    if (f < 0)
        return -errno;
    if (flock(f, LOCK_EX | LOCK_NB) != 0) {
        int rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
        if (rc == -EBUSY && holder)
            *holder = s_holder(f);
        close(f);
        return rc;
    }
    char text[32];
    int len = snprintf(text, sizeof text, "%ld\n", (long) getpid());
    // the pid is for messages only: the claim holds without it
    int wrote = ftruncate(f, 0) == 0 && pwrite(f, text, (size_t) len, 0) == len;
    (void) wrote;
    *fd = f;
    return 0;
}

// Load the pair NAME.key/NAME.pub, or make and save one when neither file
// exists (*made = 1). A half pair is an error: it is someone's identity.
static int s_key_open(const char *name, net_key_t **out, int *made, char *err, size_t n)
{
    char key[PATH_MAX + 8], pub[PATH_MAX + 8];
    snprintf(key, sizeof key, "%s.key", name);
    snprintf(pub, sizeof pub, "%s.pub", name);
    *made = access(key, F_OK) != 0 && access(pub, F_OK) != 0;
    if (!*made)
        return net_key_load(name, out, err, n);
    int rc = net_key_generate(out);
    if (rc != 0)
        snprintf(err, n, "cannot generate a key pair: %s", strerror(-rc));
    else
        rc = net_key_save(*out, name, 0, err, n);
    return rc;
}

// --key NAME: claimed when its lock file can be made (a key in a folder we
// cannot write is still usable; the router refuses a second live copy).
static int s_open_given(const char *name, node_identity_t *id, char *err, size_t n)
{
    char why[512] = "", by[48];
    long holder = 0;
    snprintf(id->name, sizeof id->name, "%s", name);
    int rc = s_claim(name, &id->lock_fd, &holder);
    if (rc == -EBUSY) {
        s_holder_name(holder, by, sizeof by);
        snprintf(err, n, "--key %s: %s.key is in use by %s on this machine; each node needs "
                 "a key of its own: leave out --key and swarm picks a free one, or make one "
                 "with `swarm keygen NAME`", name, name, by);
        return rc;
    }
    rc = s_key_open(name, &id->key, &id->made, why, sizeof why);
    if (rc != 0)
        snprintf(err, n, "--key %s: %s", name, why);
    return rc;
}

// No --key: the first free name of the config folder.
static int s_open_default(const char *dir, node_identity_t *id, char *err, size_t n)
{
    char why[512] = "", by[48];
    long first_holder = 0;
    int rc = node_mkdirs(dir, 0700, why, sizeof why);
    if (rc != 0) {
        snprintf(err, n, "%s; give a key with --key NAME", why);
        return rc;
    }
    for (int i = 1; i <= IDENTITY_NAMES_MAX; i++) {
        if (i == 1)
            snprintf(id->name, sizeof id->name, "%s/node", dir);
        else
            snprintf(id->name, sizeof id->name, "%s/node-%d", dir, i);
        rc = s_claim(id->name, &id->lock_fd, i == 1 ? &first_holder : NULL);
        if (rc == -EBUSY)
            continue;
        if (rc != 0) {
            snprintf(err, n, "cannot create %s.lock: %s; give a key with --key NAME", id->name,
                     strerror(-rc));
            return rc;
        }
        id->index = i;
        if (i > 1) {
            s_holder_name(first_holder, by, sizeof by);
            snprintf(id->note, sizeof id->note, "node.key is in use by %s on this machine", by);
        }
        rc = s_key_open(id->name, &id->key, &id->made, why, sizeof why);
        if (rc != 0)
            snprintf(err, n, "%s (or give a key with --key NAME)", why);
        return rc;
    }
    snprintf(err, n, "all %d node keys of %s are in use by nodes on this machine; give a key "
             "with --key NAME", IDENTITY_NAMES_MAX, dir);
    return -EBUSY;
}

int node_identity_open(const char *key, node_identity_t *id, char *err, size_t n)
{
    memset(id, 0, sizeof *id);
    id->lock_fd = -1;
    err[0] = '\0';
    if (key)
        return s_open_given(key, id, err, n);
    char dir[PATH_MAX];
    if (net_key_dir(dir, sizeof dir) != 0) {
        snprintf(err, n, "neither XDG_CONFIG_HOME nor HOME is set: give a key with --key NAME");
        return -ENOENT;
    }
    return s_open_default(dir, id, err, n);
}

void node_identity_close(node_identity_t *id)
{
    net_key_destroy(&id->key);
    if (id->lock_fd >= 0)
        close(id->lock_fd); // and with it the claim
    id->lock_fd = -1;
}
