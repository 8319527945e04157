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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define IDENTITY_NAMES_MAX 64 // node, node-2, ... node-64 under the config folder

// Claim NAME: an exclusive flock on NAME.lock, which holds our pid. 0 and
// *fd; -EBUSY another process holds it (*holder its pid, 0 unknown); other
// -errno when the lock file cannot be opened.
static int s_claim(const char *name, int *fd, long *holder)
{
    char path[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s.lock", name);
    *holder = 0;
    int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, 0600);
    if (f < 0)
        return -errno;
    if (flock(f, LOCK_EX | LOCK_NB) != 0) {
        int rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
        char text[32] = "";
        ssize_t got = pread(f, text, sizeof text - 1, 0);
        if (got > 0) {
            text[got] = '\0';
            *holder = strtol(text, NULL, 10);
        }
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
    char why[512] = "";
    long holder = 0;
    snprintf(id->name, sizeof id->name, "%s", name);
    int rc = s_claim(name, &id->lock_fd, &holder);
    if (rc == -EBUSY) {
        snprintf(err, n, "--key %s: %s.key is in use by another swarm node on this machine "
                 "(pid %ld); each node needs a key of its own: leave out --key and swarm picks "
                 "a free one, or make one with `swarm keygen NAME`", name, name, holder);
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
    char why[512] = "";
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
        long holder = 0;
        rc = s_claim(id->name, &id->lock_fd, &holder);
        if (rc == -EBUSY) {
            first_holder = i == 1 ? holder : first_holder;
            continue;
        }
        if (rc != 0) {
            snprintf(err, n, "cannot create %s.lock: %s; give a key with --key NAME", id->name,
                     strerror(-rc));
            return rc;
        }
        id->index = i;
        if (i > 1)
            snprintf(id->note, sizeof id->note, "node.key is in use by node pid %ld on this "
                     "machine", first_holder);
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
