/* main.c - the one `swarm` binary: dispatches to its subcommands.
 *
 * Each subcommand parses its own flags and prints its own --help; this file
 * only picks one and says what exists.
 */
#include "node.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SWARM_VERSION "0.1.0"

static void s_usage(FILE *out)
{
    fprintf(out,
        "usage: swarm COMMAND [flags]   (swarm COMMAND --help for its flags)\n"
        "\n"
        "  train    train a byte-level GPT in one process (the reference for swarm runs)\n"
        "  sample   generate text from a checkpoint or a BGPT weight file\n"
        "  keygen   write a CurveZMQ key pair for a router or node\n"
        "  router   run a swarm: route micro-batches through the nodes' stages\n"
        "  sim      the router on a simulated swarm: many peers, churn, virtual time\n"
        "  node     join a swarm as a volunteer: swarm node --join tcp://HOST:PORT\n"
        "  status   show a running swarm: swarm status tcp://HOST:PORT\n"
        "  version  print the version\n");
}

int main(int argc, char **argv)
{
    blas_cpu_restart(argv);
    if (argc < 2) {
        s_usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "train"))
        return cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "sample"))
        return cmd_sample(argc - 1, argv + 1);
    if (!strcmp(cmd, "keygen"))
        return cmd_keygen(argc - 1, argv + 1);
    if (!strcmp(cmd, "router"))
        return cmd_router(argc - 1, argv + 1);
    if (!strcmp(cmd, "sim"))
        return cmd_sim(argc - 1, argv + 1);
    if (!strcmp(cmd, "node"))
        return cmd_node(argc - 1, argv + 1);
    if (!strcmp(cmd, "status"))
        return cmd_status(argc - 1, argv + 1);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("swarm %s\n", SWARM_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        s_usage(stdout);
        return 0;
    }
    fprintf(stderr, "swarm: unknown command '%s'; run 'swarm --help' for the list\n", cmd);
    return 2;
}

