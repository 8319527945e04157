/* join.c - the join line: what `swarm router` prints for volunteers, and
 * what `swarm node --join` reads. A join token, swarm://HOST:PORT/KEY with
 * the router's public key in 64 hex digits, carries the address and the
 * key in one word that every shell (sh, bash, zsh, fish) passes as it is;
 * the Z85 form of a key holds < > ( ) { } ! $ ? and is printed in single
 * quotes, which Z85 never contains. It resolves no name and opens no
 * socket: the router's addresses come from getifaddrs.
 */
#include "net.h"
#include "node.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define JOIN_ADDRS_MAX 8 // interface addresses printed at most

// HOST:PORT (HOST may be [v6]) of text up to end: 0 with host and port, or
// -EINVAL naming what is wrong in why.
static int s_host_port(const char *text, size_t len, char *host, size_t host_cap, long *port,
                       const char **why)
{
    const char *colon = NULL;
    for (size_t i = len; i-- > 0;)
        if (text[i] == ':') {
            colon = text + i;
            break;
        }
    *why = "no :PORT";
    if (!colon || colon == text)
        return -EINVAL;
    size_t hlen = (size_t) (colon - text);
    *why = "a host name or address is too long";
    if (hlen >= host_cap)
        return -EINVAL;
    memcpy(host, text, hlen);
    host[hlen] = '\0';
    *why = "the host has a space or a control character";
    for (size_t i = 0; i < hlen; i++)
        if ((unsigned char) host[i] <= ' ' || host[i] == 0x7f || host[i] == '/')
            return -EINVAL;
    char digits[8] = "";
    size_t plen = len - hlen - 1;
    *why = "the port is not a number 1..65535";
    if (plen == 0 || plen >= sizeof digits)
        return -EINVAL;
    memcpy(digits, colon + 1, plen);
    digits[plen] = '\0';
    char *end;
    *port = strtol(digits, &end, 10);
    if (*end || *port < 1 || *port > 65535 || digits[0] < '0' || digits[0] > '9')
        return -EINVAL;
    *why = "0.0.0.0 and * are where a router listens, not an address to connect to: give the "
           "router machine's address";
    if (!strcmp(host, "*") || !strcmp(host, "0.0.0.0") || !strcmp(host, "[::]"))
        return -EINVAL;
    return 0;
}

static int s_hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

int node_join_parse(const char *arg, node_join_t *out, char *err, size_t n)
{
    static const char hint[] = "expected swarm://HOST:PORT/KEY (the line `swarm router` "
                               "prints) or tcp://HOST:PORT with --router-key";
    memset(out, 0, sizeof *out);
    char host[256];
    long port = 0;
    const char *why = "";
    if (!strncmp(arg, "tcp://", 6)) {
        if (s_host_port(arg + 6, strlen(arg + 6), host, sizeof host, &port, &why) != 0)
            goto bad;
    } else if (!strncmp(arg, "swarm://", 8)) {
        const char *slash = strchr(arg + 8, '/');
        why = "no /KEY after HOST:PORT";
        if (!slash)
            goto bad;
        if (s_host_port(arg + 8, (size_t) (slash - arg - 8), host, sizeof host, &port, &why) != 0)
            goto bad;
        const char *hex = slash + 1;
        uint8_t raw[32];
        why = "the KEY is not 64 hex digits (copy the whole token)";
        if (strlen(hex) != 64)
            goto bad;
        for (int i = 0; i < 32; i++) {
            int hi = s_hex_digit(hex[2 * i]), lo = s_hex_digit(hex[2 * i + 1]);
            if (hi < 0 || lo < 0)
                goto bad;
            raw[i] = (uint8_t) (hi << 4 | lo);
        }
        zmq_z85_encode(out->router_key, raw, sizeof raw);
    } else {
        snprintf(err, n, "%s: %s", arg, hint);
        return -EINVAL;
    }
    snprintf(out->endpoint, sizeof out->endpoint, "tcp://%s:%ld", host, port);
    return 0;
bad:
    snprintf(err, n, "%s: %s; %s", arg, why, hint);
    return -EINVAL;
}

// ---- the router's side ------------------------------------------------------

// The addresses a volunteer can reach a router bound to host at: the host
// itself, or for 0.0.0.0 each up, non-loopback IPv4 interface address.
static int s_addrs(const char *host, char addrs[][64], int cap)
{
    if (strcmp(host, "0.0.0.0") && strcmp(host, "*")) {
        snprintf(addrs[0], 64, "%s", host);
        return 1;
    }
    struct ifaddrs *all = NULL;
    int n = 0;
    if (getifaddrs(&all) != 0)
        return 0;
    for (struct ifaddrs *a = all; a && n < cap; a = a->ifa_next) {
        if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP)
            || (a->ifa_flags & IFF_LOOPBACK))
            continue;
        const struct sockaddr_in *in = (const struct sockaddr_in *) a->ifa_addr;
        if (inet_ntop(AF_INET, &in->sin_addr, addrs[n], 64))
            n++;
    }
    freeifaddrs(all);
    return n;
}

static int s_loopback(const char *host)
{
    return !strncmp(host, "127.", 4) || !strcmp(host, "localhost") || !strcmp(host, "[::1]");
}

void node_join_print(FILE *out, const char *bound, const char *z85)
{
    char host[256] = "", addrs[JOIN_ADDRS_MAX + 1][64];
    long port = 0;
    const char *why;
    const char *text = strncmp(bound, "tcp://", 6) ? bound : bound + 6;
    uint8_t raw[32];
    char hex[65];
    if (!zmq_z85_decode(raw, z85))
        return;
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    // ZMQ_LAST_ENDPOINT gives 0.0.0.0 for *, which s_host_port refuses
    int wild = !strncmp(text, "0.0.0.0:", 8) || !strncmp(text, "*:", 2);
    if (wild) {
        snprintf(host, sizeof host, "0.0.0.0");
        port = strtol(strchr(text, ':') + 1, NULL, 10);
    } else if (s_host_port(text, strlen(text), host, sizeof host, &port, &why) != 0) {
        return;
    }
    int n = s_addrs(host, addrs, JOIN_ADDRS_MAX);
    // each line is the command alone, so that the whole line pastes (a
    // note after it once broke the shell's syntax): what it is for goes
    // on the line above
    if (!wild && s_loopback(host))
        fprintf(out, "join with (from this machine only: the router listens on loopback; the "
                "line pastes as it is into any shell):\n");
    else if (n > 0)
        fprintf(out, "join with (on each volunteer's machine; the line pastes as it is into any "
                "shell):\n");
    for (int i = 0; i < n; i++)
        fprintf(out, "  swarm node --join swarm://%s:%ld/%s\n", addrs[i], port, hex);
    if (wild) { // a node on the router's own machine
        fprintf(out, n > 0 ? "or from this machine:\n"
                           : "join with (from this machine only: no network interface but "
                             "loopback is up; the line pastes as it is into any shell):\n");
        fprintf(out, "  swarm node --join swarm://127.0.0.1:%ld/%s\n", port, hex);
    }
    fprintf(out, "or with the key apart:\n  swarm node --join tcp://%s:%ld --router-key '%s'\n",
            n > 0 ? addrs[0] : "127.0.0.1", port, z85);
}
