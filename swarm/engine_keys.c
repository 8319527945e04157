/* engine_keys.c - the peers by key: open addressing, slots hold index + 1
 * (0 empty, -1 a removed entry), at most half full, so that finding the
 * sender of each message is O(1) at any size of the table.
 */
#include "engine_int.h"

// Eight characters a multiply (a key is 40: byte by byte, its hash was a
// twentieth of a 10,000-peer sim), then the high bits folded down.
static uint64_t s_key_hash(const char *key)
{
    size_t n = strlen(key);
    uint64_t h = 1469598103934665603ull ^ n, w;
    for (; n >= 8; n -= 8, key += 8) {
        memcpy(&w, key, 8);
        h = (h ^ w) * 0x9e3779b97f4a7c15ull;
        h ^= h >> 29;
    }
    for (; n > 0; n--, key++)
        h = (h ^ (unsigned char) *key) * 1099511628211ull;
    h ^= h >> 32;
    return h * 0xbf58476d1ce4e5b9ull ^ (h >> 31);
}

// The slot of key in the index, or of where it would go (-1: no index).
static int s_key_slot(const swarm_engine_t *r, const char *key, int *found)
{
    *found = 0;
    if (r->key_cap == 0)
        return -1;
    int mask = r->key_cap - 1, free_at = -1;
    for (int i = (int) (s_key_hash(key) & (uint64_t) mask);; i = (i + 1) & mask) {
        int v = r->key_index[i];
        if (v == 0)
            return free_at >= 0 ? free_at : i;
        if (v < 0 && free_at < 0)
            free_at = i;
        if (v > 0 && !strcmp(r->peers[v - 1].who.key, key)) {
            *found = 1;
            return i;
        }
    }
}

// Index peer p by its key (its entry holds the key). 0 or -ENOMEM.
int engine_key_put(swarm_engine_t *r, int p)
{
    int found;
    if (2 * (r->key_used + 1) > r->key_cap) { // rebuild, larger if the peers need it,
        int cap = 64;                         // without the removed entries
        while (4 * (r->npeers + 1) > cap)
            cap *= 2;
        int *old = r->key_index, old_cap = r->key_cap;
        if (!(r->key_index = calloc((size_t) cap, sizeof *r->key_index))) {
            r->key_index = old;
            return -ENOMEM;
        }
        r->key_cap = cap;
        r->key_used = 0;
        for (int i = 0; i < old_cap; i++) {
            if (old[i] > 0) {
                r->key_index[s_key_slot(r, r->peers[old[i] - 1].who.key, &found)] = old[i];
                r->key_used++;
            }
        }
        free(old);
    }
    int i = s_key_slot(r, r->peers[p].who.key, &found);
    r->key_used += r->key_index[i] == 0;
    r->key_index[i] = p + 1;
    return 0;
}

void engine_key_del(swarm_engine_t *r, int p)
{
    int found, i = s_key_slot(r, r->peers[p].who.key, &found);
    if (found)
        r->key_index[i] = -1;
}

int engine_peer_find(swarm_engine_t *r, const net_peer_t *who)
{
    int found, i = s_key_slot(r, who->key, &found);
    return found ? r->key_index[i] - 1 : -1;
}
