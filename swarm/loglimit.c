/* loglimit.c - how much the router may log about what peers send: token
 * buckets per sender and in all, so a hostile peer's flood of bad messages
 * becomes a line a second and a count, never a full disk.
 *
 * Pure: no I/O, no clock (now is an argument). It limits lines, not the
 * work of refusing the messages, which the decoder bounds.
 */
#include "swarm.h"

#include <stdio.h>
#include <string.h>

#define SENDER_BURST 5.0     // lines a new sender may write at once (unless set)
#define SENDER_RATE 1.0      // lines a second per sender after that
#define ALL_BURST 20.0       // lines at once, every sender together
#define ALL_RATE 10.0        // lines a second, every sender together

// A rate the limiter was given, else its default.
static double s_or(double set, double fallback)
{
    return set > 0.0 ? set : fallback;
}

// Bring a bucket up to now_ms: rate tokens a second, at most burst.
static double s_refill(double tokens, int64_t last_ms, int64_t now_ms, double rate, double burst)
{
    double add = now_ms > last_ms ? (double) (now_ms - last_ms) / 1000.0 * rate : 0.0;
    return tokens + add < burst ? tokens + add : burst;
}

// The sender's entry: found, free, or the least recently seen one reused
// (its held-back count moves to the shared count).
static swarm_loglimit_sender_t *s_sender(swarm_loglimit_t *self, const char *key, int64_t now_ms)
{
    swarm_loglimit_sender_t *pick = NULL;
    char name[sizeof pick->key];
    snprintf(name, sizeof name, "%s", key ? key : "");
    for (int i = 0; i < SWARM_LOGLIMIT_SENDERS; i++) {
        swarm_loglimit_sender_t *e = &self->senders[i];
        if (e->key[0] && strcmp(e->key, name) == 0)
            return e;
        if (!pick || (pick->key[0] && (!e->key[0] || e->last_ms < pick->last_ms)))
            pick = e;
    }
    self->held += pick->held;
    *pick = (swarm_loglimit_sender_t) {.tokens = s_or(self->sender_burst, SENDER_BURST),
                                        .last_ms = now_ms};
    memcpy(pick->key, name, sizeof name);
    if (!pick->key[0])
        pick->key[0] = '?'; // an empty key is still a sender
    return pick;
}

int swarm_loglimit_pass(swarm_loglimit_t *self, const char *key, int64_t now_ms, char *note,
                        size_t cap)
{
    if (!self->started) {
        self->tokens = s_or(self->all_burst, ALL_BURST);
        self->last_ms = now_ms;
        self->started = 1;
    }
    swarm_loglimit_sender_t *e = s_sender(self, key, now_ms);
    e->tokens = s_refill(e->tokens, e->last_ms, now_ms, s_or(self->sender_rate, SENDER_RATE),
                         s_or(self->sender_burst, SENDER_BURST));
    e->last_ms = now_ms > e->last_ms ? now_ms : e->last_ms;
    self->tokens = s_refill(self->tokens, self->last_ms, now_ms, s_or(self->all_rate, ALL_RATE),
                            s_or(self->all_burst, ALL_BURST));
    self->last_ms = now_ms > self->last_ms ? now_ms : self->last_ms;
    if (e->tokens < 1.0 || self->tokens < 1.0) {
        e->held++;
        return 0;
    }
    e->tokens -= 1.0;
    self->tokens -= 1.0;
    uint64_t held = e->held + self->held;
    e->held = self->held = 0;
    if (cap)
        note[0] = '\0';
    if (held && cap)
        snprintf(note, cap, " (%llu similar lines not shown)", (unsigned long long) held);
    return 1;
}
