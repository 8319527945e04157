/* cmd_keygen.c - `swarm keygen [--force] NAME`: a Curve key pair for a router,
 * node or status client, written as NAME.key (secret, mode 0600) and
 * NAME.pub (public), both Z85 text.
 *
 *   int cmd_keygen(int argc, char **argv);  // declared in node/node.h
 *
 * The secret never passes through the command line, the environment or
 * stdout: it lives in sodium memory until it is written (net_key_save).
 */
#include "net.h"

#include <stdio.h>
#include <string.h>

int cmd_keygen(int argc, char **argv);

static void s_usage(FILE *out)
{
    fprintf(out,
            "usage: swarm keygen [--force] NAME\n"
            "  writes NAME.key (secret key, mode 0600) and NAME.pub (public key)\n"
            "  --force   overwrite existing key files\n"
            "Nodes need the router's NAME.pub; a private swarm's router lists the\n"
            "public keys it admits, one per line, in its allow-list file.\n");
}

int cmd_keygen(int argc, char **argv)
{
    const char *name = NULL;
    int force = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--force") == 0 || strcmp(argv[i], "-f") == 0) {
            force = 1;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            s_usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' || name) {
            fprintf(stderr, "swarm keygen: unexpected argument '%s'\n", argv[i]);
            s_usage(stderr);
            return 2;
        } else {
            name = argv[i];
        }
    }
    if (!name || !*name) {
        fprintf(stderr, "swarm keygen: give the NAME of the key files\n");
        s_usage(stderr);
        return 2;
    }
    char err[512] = "";
    net_key_t *key = NULL;
    int rc = net_key_generate(&key);
    if (rc < 0) {
        fprintf(stderr, "swarm keygen: cannot generate a key pair (%s)\n", strerror(-rc));
        return 1;
    }
    rc = net_key_save(key, name, force, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "swarm keygen: %s\n", err);
    else
        printf("wrote %s.key (secret, mode 0600) and %s.pub\npublic key: %s\n", name, name,
               net_key_public(key));
    net_key_destroy(&key);
    return rc < 0 ? 1 : 0;
}
