/* sim_churn.c - churn traces for swarm sim (swarm.h): when real preemptible
 * machines came and went, read from either format of ../shared/data/traces/
 * into one step function of how many were up. An event trace
 * ("time_ms,add|remove,NAME", Oobleck's) counts the names up after each
 * time; a count trace ("seconds,instances", Bamboo's, each change two rows
 * at one second) is one already. Every line is checked: a bad one is named
 * with its file and line number.
 *
 * A trace of a few dozen machines drives a swarm of any size by tiling:
 * copies of it run side by side, each a group of peers of its own, each
 * starting at its own phase (copy k at k/K of the trace), the trace
 * repeating when it ends, its times divided by --churn-scale and its
 * counts scaled so that the copies together hold about --peers at most.
 *
 * The live peers, which kills (of churn, --kill-every, --leave-rate) draw
 * from, are indexed as they come and go: the sim's table keeps every peer
 * that ever joined.
 */
#include "sim_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHURN_LINE_MAX 256

typedef struct {
    swarm_sim_churn_t *c;
    int cap;
    char **names;            // event traces: the names up now
    int nnames, capnames;
} reader_t;

// Machines up from t on: a later row at the same time replaces the earlier.
static int s_point(reader_t *r, int64_t t, int up)
{
    swarm_sim_churn_t *c = r->c;
    if (c->n > 0 && c->t_ms[c->n - 1] == t) {
        c->up[c->n - 1] = up;
    } else {
        if (c->n == r->cap) {
            r->cap = r->cap ? 2 * r->cap : 64;
            int64_t *t2 = realloc(c->t_ms, (size_t) r->cap * sizeof *t2);
            if (t2)
                c->t_ms = t2;
            int *u2 = realloc(c->up, (size_t) r->cap * sizeof *u2);
            if (u2)
                c->up = u2;
            if (!t2 || !u2)
                return -ENOMEM;
        }
        c->t_ms[c->n] = t;
        c->up[c->n++] = up;
    }
    c->most = up > c->most ? up : c->most;
    return 0;
}

static int s_name_at(const reader_t *r, const char *name)
{
    for (int i = 0; i < r->nnames; i++)
        if (!strcmp(r->names[i], name))
            return i;
    return -1;
}

// add or remove NAME: 0, or -EINVAL with the reason (no line number) in err.
static int s_event(reader_t *r, const char *what, const char *name, char *err, size_t n)
{
    int at = s_name_at(r, name);
    if (!strcmp(what, "add")) {
        if (at >= 0) {
            snprintf(err, n, "%s is added while it is up", name);
            return -EINVAL;
        }
        if (r->nnames == r->capnames) {
            r->capnames = r->capnames ? 2 * r->capnames : 64;
            char **n2 = realloc(r->names, (size_t) r->capnames * sizeof *n2);
            if (!n2)
                return -ENOMEM;
            r->names = n2;
        }
        if (!(r->names[r->nnames] = strdup(name)))
            return -ENOMEM;
        r->nnames++;
        return 0;
    }
    if (!strcmp(what, "remove")) {
        if (at < 0) {
            snprintf(err, n, "%s is removed while it is not up", name);
            return -EINVAL;
        }
        free(r->names[at]);
        r->names[at] = r->names[--r->nnames];
        return 0;
    }
    snprintf(err, n, "'%s': expected add or remove", what);
    return -EINVAL;
}

// One line of the trace (without its newline): 0, or -EINVAL with the
// reason (no file or line) in err.
static int s_line(reader_t *r, char *line, int *format, int64_t *last, char *err, size_t n)
{
    char *field[4] = { line, NULL, NULL, NULL };
    int nf = 1;
    for (char *p = line; *p && nf < 4; p++)
        if (*p == ',') {
            *p = '\0';
            field[nf++] = p + 1;
        }
    if (nf != 2 && nf != 3) {
        snprintf(err, n, "expected time_ms,add|remove,NAME or seconds,instances");
        return -EINVAL;
    }
    if (*format == 0)
        *format = nf;
    else if (*format != nf) {
        snprintf(err, n, "%d fields where the lines before have %d", nf, *format);
        return -EINVAL;
    }
    char *end;
    double time = strtod(field[0], &end);
    if (end == field[0] || *end || !(time >= 0 && time < 1e12)) {
        snprintf(err, n, "time '%s': expected a number of %s, 0 or more", field[0],
                 nf == 3 ? "milliseconds" : "seconds");
        return -EINVAL;
    }
    int64_t t = (int64_t) (nf == 3 ? time : time * 1000.0);
    if (t < *last) {
        snprintf(err, n, "time %s comes before the line above's", field[0]);
        return -EINVAL;
    }
    *last = t;
    if (nf == 3) {
        if (!field[2][0]) {
            snprintf(err, n, "no machine name after '%s,'", field[1]);
            return -EINVAL;
        }
        int rc = s_event(r, field[1], field[2], err, n);
        return rc != 0 ? rc : s_point(r, t, r->nnames);
    }
    long up = strtol(field[1], &end, 10);
    if (end == field[1] || *end || up < 0 || up > 1000000) {
        snprintf(err, n, "instances '%s': expected a whole number, 0..1000000", field[1]);
        return -EINVAL;
    }
    return s_point(r, t, (int) up);
}

int swarm_sim_churn_load(const char *path, swarm_sim_churn_t *out, char *err, size_t n)
{
    *out = (swarm_sim_churn_t) { 0 };
    FILE *f = fopen(path, "r");
    if (!f) {
        int e = errno;
        snprintf(err, n, "--churn %s: %s (a trace: see ../shared/data/traces/README.md for the "
                 "two formats)", path, strerror(e));
        return -e;
    }
    reader_t r = { .c = out };
    char line[CHURN_LINE_MAX + 2], why[256] = "";
    int rc = 0, format = 0, lineno = 0;
    int64_t last = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        size_t len = strlen(line);
        if (len > CHURN_LINE_MAX && line[len - 1] != '\n') {
            snprintf(why, sizeof why, "longer than %d characters", CHURN_LINE_MAX);
            rc = -EINVAL;
            break;
        }
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '\0' || line[0] == '#')
            continue;
        rc = s_line(&r, line, &format, &last, why, sizeof why);
    }
    if (rc == 0 && ferror(f)) {
        snprintf(why, sizeof why, "cannot read: %s", strerror(errno));
        rc = -EIO;
    }
    fclose(f);
    for (int i = 0; i < r.nnames; i++)
        free(r.names[i]);
    free(r.names);
    if (rc == -ENOMEM)
        snprintf(err, n, "--churn %s: out of memory", path);
    else if (rc != 0 && lineno > 0)
        snprintf(err, n, "--churn %s line %d: %s", path, lineno, why);
    else if (rc != 0)
        snprintf(err, n, "--churn %s: %s", path, why);
    else if (rc == 0 && (out->n < 2 || out->t_ms[out->n - 1] == 0)) {
        snprintf(err, n, "--churn %s: %s", path, out->n == 0 ? "no trace in it (expected "
                 "time_ms,add|remove,NAME or seconds,instances lines)"
                 : "one time only: a trace needs changes over time");
        rc = -EINVAL;
    } else if (rc == 0 && out->most == 0) {
        snprintf(err, n, "--churn %s: no machine is ever up in it", path);
        rc = -EINVAL;
    }
    if (rc != 0) {
        swarm_sim_churn_free(out);
        return rc;
    }
    out->span_ms = out->t_ms[out->n - 1];
    return 0;
}

void swarm_sim_churn_free(swarm_sim_churn_t *churn)
{
    free(churn->t_ms);
    free(churn->up);
    *churn = (swarm_sim_churn_t) { 0 };
}

// ---- the live peers ------------------------------------------------------------

// Peer p's alive flag changed by d (+1, -1) in the Fenwick tree.
static void s_fenwick_add(sim_t *s, int p, int d)
{
    for (int i = p + 1; i <= s->cappeers; i += i & -i)
        s->fenwick[i - 1] += d;
}

// The tree made again for the table's new size (it doubles: O(1) a peer).
void sim_live_grown(sim_t *s)
{
    free(s->fenwick);
    if (!(s->fenwick = calloc((size_t) s->cappeers, sizeof *s->fenwick)))
        abort();
    for (int p = 0; p < s->npeers; p++)
        if (s->peers[p].alive)
            s_fenwick_add(s, p, 1);
}

// The live peer with k live peers before it in index order.
static int s_fenwick_kth(const sim_t *s, int k)
{
    int at = 0, step = 1;
    while (2 * step <= s->cappeers)
        step *= 2;
    for (; step > 0; step /= 2) {
        if (at + step <= s->cappeers && s->fenwick[at + step - 1] <= k) {
            at += step;
            k -= s->fenwick[at - 1];
        }
    }
    return at; // (0-based: the prefix of `at` peers holds k live)
}

void sim_live_put(sim_t *s, int p)
{
    s->live++;
    s_fenwick_add(s, p, 1);
    int copy = s->peers[p].copy;
    if (copy < 0 || !s->copy_live)
        return;
    sim_live_t *l = &s->copy_live[copy];
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 8;
        if (!(l->p = realloc(l->p, (size_t) l->cap * sizeof *l->p)))
            abort();
    }
    l->p[l->n++] = p; // (the newest peer: the highest index)
}

void sim_live_drop(sim_t *s, int p)
{
    s->live--;
    s_fenwick_add(s, p, -1);
    int copy = s->peers[p].copy;
    if (copy < 0 || !s->copy_live)
        return;
    sim_live_t *l = &s->copy_live[copy];
    for (int k = 0; k < l->n; k++) {
        if (l->p[k] == p) {
            memmove(&l->p[k], &l->p[k + 1], (size_t) (l->n - k - 1) * sizeof *l->p);
            l->n--;
            return;
        }
    }
}

int sim_live_count(const sim_t *s, int copy)
{
    return copy < 0 ? s->live : s->copy_live[copy].n;
}

int sim_pick_live(sim_t *s, int copy)
{
    int live = sim_live_count(s, copy);
    if (live == 0)
        return -1;
    int k = (int) (sim_uniform(s) * live);
    k = k < live ? k : live - 1;
    return copy < 0 ? s_fenwick_kth(s, k) : s->copy_live[copy].p[k];
}

// ---- tiling the trace over the peers ------------------------------------------

struct churn_copy {
    int64_t offset;          // ms of trace time where this copy starts
    int idx;                 // its next change: point idx of the trace
    long cycle;              // times it went round the trace
};

// The virtual ms at which copy k reaches its next change.
static int64_t s_due(const sim_t *s, const struct churn_copy *k)
{
    const swarm_sim_churn_t *c = s->o->churn;
    double trace = (double) c->t_ms[k->idx] + (double) k->cycle * c->span_ms - (double) k->offset;
    return (int64_t) ceil(trace / s->o->churn_scale);
}

// Kill or add copy k's peers until it has `want` live.
static void s_match(sim_t *s, int k, int want)
{
    int live = sim_live_count(s, k);
    for (; live > want; live--)
        sim_kill(s, sim_pick_live(s, k));
    for (; live < want; live++)
        sim_peer_new(s, k);
}

void sim_churn_start(sim_t *s)
{
    const swarm_sim_churn_t *c = s->o->churn;
    int K = (s->o->peers + c->most / 2) / c->most;
    s->ncopies = K < 1 ? 1 : K;
    s->churn_f = (double) s->o->peers / ((double) s->ncopies * c->most);
    if (!(s->copies = calloc((size_t) s->ncopies, sizeof *s->copies))
        || !(s->copy_live = calloc((size_t) s->ncopies, sizeof *s->copy_live)))
        abort();
    for (int k = 0; k < s->ncopies; k++) {
        struct churn_copy *cp = &s->copies[k];
        cp->offset = c->span_ms / s->ncopies * k;
        // up at its phase: the last change at or before it (before the
        // trace's first change, what was up at its end: it repeats)
        int up = c->up[c->n - 1];
        cp->idx = c->n;
        for (int i = 0; i < c->n; i++) {
            if (c->t_ms[i] > cp->offset) {
                cp->idx = i;
                break;
            }
            up = c->up[i];
        }
        if (cp->idx == c->n) {
            cp->idx = 0;
            cp->cycle = 1;
        }
        s_match(s, k, (int) lround(up * s->churn_f));
        sim_push(s, s_due(s, cp), EV_CHURN, k, NULL);
    }
}

void sim_churn_event(sim_t *s, int k)
{
    const swarm_sim_churn_t *c = s->o->churn;
    struct churn_copy *cp = &s->copies[k];
    s_match(s, k, (int) lround(c->up[cp->idx] * s->churn_f));
    if (++cp->idx == c->n) {
        cp->idx = 0;
        cp->cycle++;
    }
    sim_push(s, s_due(s, cp), EV_CHURN, k, NULL);
}
