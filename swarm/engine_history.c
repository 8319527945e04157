/* engine_history.c - what the router remembers for people watching it
 * (swarm status --serve draws it): the loss of each step, the evaluations,
 * the speed of each step against the bound, and the last events (every
 * line the engine logs). Bounded: a series that fills keeps every other
 * point, and the events are a ring. Every point and event has a sequence
 * number, so a STATUS poll with since=CURSOR gets only what is newer; one
 * whose cursor predates a rewrite (a series thinned, or cut back by a
 * rollback) gets the whole history again. docs/swarm.md "Status".
 */
#include "engine_int.h"

#define HIST_POINTS 4096     // points a series holds before it keeps every other one
#define HIST_EVENTS 64       // events kept, the newest
#define HIST_EVENT_TEXT 200  // bytes of an event's text
#define HIST_SPEED_S 1.0     // s between speed points (at most one a step)

typedef struct {
    long key;                // the step the point is of (it orders and thins the series)
    double v[3];             // its values, as the document gives them
    uint64_t seq;            // sequence number
} hist_point_t;

typedef struct {
    hist_point_t pt[HIST_POINTS];
    int n;                   // points held
    int width;               // values a point has in the document
    int ints;                // of them the first few are integers (a step)
    int decimals;            // the rest are rounded to this many places
    long every;              // a point is kept when its key is a multiple of this
} hist_series_t;

typedef struct {
    double t;                // s, the engine's clock
    int warn;                // logged as a warning
    char text[HIST_EVENT_TEXT];
    uint64_t seq;
} hist_event_t;

struct engine_history {
    hist_series_t loss;      // [step, loss]
    hist_series_t evals;     // [step, train, val]
    hist_series_t speed;     // [t, tok/s of the steps since the last point, bound]
    hist_event_t events[HIST_EVENTS]; // a ring: the oldest at head
    int events_n, events_head;
    uint64_t seq;            // the last sequence number given
    uint64_t base;           // a cursor below this predates a rewrite: send everything
    double speed_t;          // s: when the last speed point was taken
    long speed_steps;        // steps since
    double speed_s;          // and the seconds they took
};

engine_history_t *engine_history_new(void)
{
    engine_history_t *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->loss = (hist_series_t) {.width = 2, .ints = 1, .decimals = 6, .every = 1};
    h->evals = (hist_series_t) {.width = 3, .ints = 1, .decimals = 6, .every = 1};
    h->speed = (hist_series_t) {.width = 3, .ints = 0, .decimals = 1, .every = 1};
    return h;
}

size_t engine_history_size(void)
{
    return sizeof(engine_history_t);
}

// The history was rewritten: every cursor given so far gets all of it.
static void s_rewritten(engine_history_t *h)
{
    h->base = ++h->seq;
}

// A point of step `key`: kept when the key is on the series' grid. A full
// series doubles its grid's spacing (keys are distinct steps, so doubling
// thins it) and keeps the points on it.
static void s_add(engine_history_t *h, hist_series_t *s, long key, double a, double b, double c)
{
    while (s->n == HIST_POINTS) {
        int kept = 0;
        s->every *= 2;
        for (int i = 0; i < s->n; i++)
            if (s->pt[i].key % s->every == 0)
                s->pt[kept++] = s->pt[i];
        s->n = kept;
        s_rewritten(h);
    }
    if (key % s->every == 0)
        s->pt[s->n++] = (hist_point_t) {.key = key, .v = {a, b, c}, .seq = ++h->seq};
}

// A step ended, after step_s seconds: its loss, and at most once a
// second the speed of the steps since the last point (one step's alone is
// noise when steps take milliseconds).
void engine_history_step(swarm_engine_t *r, double step_s)
{
    engine_history_t *h = r->hist;
    s_add(h, &h->loss, r->step, (double) r->step, r->last_loss, 0);
    h->speed_steps++;
    h->speed_s += step_s;
    if (engine_secs(r) - h->speed_t < HIST_SPEED_S && r->step > r->first + 1)
        return;
    double tokens = h->speed_steps * (double) r->hp.batch * r->hp.cfg.T;
    s_add(h, &h->speed, r->step, engine_secs(r), h->speed_s > 0 ? tokens / h->speed_s : NAN,
          engine_bound(r));
    h->speed_t = engine_secs(r);
    h->speed_steps = 0;
    h->speed_s = 0;
}

void engine_history_eval(swarm_engine_t *r, double train, double val)
{
    engine_history_t *h = r->hist;
    s_add(h, &h->evals, r->step, (double) r->step, train, val);
}

// A rollback to `step`: the points after it are of steps that run again.
void engine_history_rollback(swarm_engine_t *r, long step)
{
    engine_history_t *h = r->hist;
    hist_series_t *all[] = {&h->loss, &h->evals, &h->speed};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        while (all[k]->n > 0 && all[k]->pt[all[k]->n - 1].key > step)
            all[k]->n--;
    h->speed_steps = 0; // (the steps since the last speed point are undone)
    h->speed_s = 0;
    s_rewritten(h);
}

// A line the engine logs, as an event: without the "swarm router: " it
// begins with and the newline it ends with. The history is reached through
// a pointer, so that a const engine can log.
void engine_history_event(const swarm_engine_t *r, int warn, const char *line)
{
    engine_history_t *h = r->hist;
    static const char prefix[] = "swarm router: ";
    if (!h)
        return;
    if (!strncmp(line, prefix, sizeof prefix - 1))
        line += sizeof prefix - 1;
    hist_event_t *e;
    if (h->events_n < HIST_EVENTS) {
        e = &h->events[(h->events_head + h->events_n++) % HIST_EVENTS];
    } else {
        e = &h->events[h->events_head];
        h->events_head = (h->events_head + 1) % HIST_EVENTS;
    }
    snprintf(e->text, sizeof e->text, "%s", line);
    e->text[strcspn(e->text, "\n")] = '\0';
    for (char *c = e->text; *c; c++) // printable ASCII: valid UTF-8 for the JSON
        *c = *c < 0x20 || *c > 0x7e ? '?' : *c;
    e->t = engine_secs(r);
    e->warn = warn;
    e->seq = ++h->seq;
}

static int s_series_json(const hist_series_t *s, uint64_t since, json_t *out)
{
    int rc = 0;
    for (int i = 0; rc == 0 && i < s->n; i++) {
        if (s->pt[i].seq <= since)
            continue;
        json_t *p = json_array();
        rc = p ? 0 : -1;
        for (int k = 0; rc == 0 && k < s->width; k++)
            rc = json_array_append_new(p, k < s->ints ? json_integer((json_int_t) s->pt[i].v[k])
                                                      : engine_json_num(s->pt[i].v[k], s->decimals));
        rc = rc == 0 ? json_array_append_new(out, p) : (json_decref(p), -1);
    }
    return rc;
}

json_t *engine_history_json(const swarm_engine_t *r, uint64_t since)
{
    const engine_history_t *h = r->hist;
    if (since < h->base || since > h->seq)
        since = 0; // predates a rewrite (or is not ours): all of it
    json_t *doc = json_pack("{s:I, s:I, s:I, s:i, s:[], s:[], s:[], s:[]}",
                            "cursor", (json_int_t) h->seq, "since", (json_int_t) since,
                            "loss_every", (json_int_t) h->loss.every, "events_kept", HIST_EVENTS,
                            "loss", "evals", "speed", "events");
    if (!doc)
        return NULL;
    int rc = s_series_json(&h->loss, since, json_object_get(doc, "loss"));
    rc = rc == 0 ? s_series_json(&h->evals, since, json_object_get(doc, "evals")) : rc;
    rc = rc == 0 ? s_series_json(&h->speed, since, json_object_get(doc, "speed")) : rc;
    json_t *events = json_object_get(doc, "events");
    for (int i = 0; rc == 0 && i < h->events_n; i++) {
        const hist_event_t *e = &h->events[(h->events_head + i) % HIST_EVENTS];
        if (e->seq > since)
            rc = json_array_append_new(events, json_pack("[f, s, s]", round(e->t * 10) / 10,
                                                         e->warn ? "warn" : "info", e->text));
    }
    if (rc != 0) {
        json_decref(doc);
        return NULL;
    }
    return doc;
}
