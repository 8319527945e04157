/* fuzz.h - swarm's fuzz targets, one per decoder of untrusted bytes, and
 * the replay of their seed corpora as ordinary tests (STYLE.md: "built
 * without libFuzzer it replays its seed corpus").
 *
 * A target's entry returns 0 when the decoder accepted the input and a
 * negative errno when it refused it; it aborts when the decoder broke a
 * promise (a crash, a non-finite value let through, a result that does not
 * match the input). Built with -DSWARM_LIBFUZZER, each fuzz_*.c also
 * defines LLVMFuzzerTestOneInput for `make fuzz`.
 */
#ifndef SWARM_TESTS_FUZZ_H
#define SWARM_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *name;   // the corpus folder: tests/corpus/<name>
    int (*one)(const uint8_t *data, size_t size); // the target's entry
    // the i-th generated seed: its file name (ok-* must be accepted, bad-*
    // refused) and *len bytes in buf; 1, or 0 past the last seed
    int (*seed)(int i, char *name, size_t namecap, uint8_t *buf, size_t cap, size_t *len);
} fuzz_target_t;

int fuzz_files_one(const uint8_t *data, size_t size);   // BGPT files, checkpoints (node)
int fuzz_files_seed(int i, char *name, size_t namecap, uint8_t *buf, size_t cap, size_t *len);
int fuzz_status_one(const uint8_t *data, size_t size);  // swarm status's JSON (node)
int fuzz_status_seed(int i, char *name, size_t namecap, uint8_t *buf, size_t cap, size_t *len);
int fuzz_keys_one(const uint8_t *data, size_t size);    // Z85, key files, allow-lists (net)
int fuzz_keys_seed(int i, char *name, size_t namecap, uint8_t *buf, size_t cap, size_t *len);
int fuzz_meta_one(const uint8_t *data, size_t size);    // meta key=value lookups (net)
int fuzz_meta_seed(int i, char *name, size_t namecap, uint8_t *buf, size_t cap, size_t *len);

// The generated seeds against tests/corpus/<name> (SWARM_CORPUS_ROOT
// overrides tests/corpus): with write_it, (re)write them; else 0 when every
// one is there with the same bytes, -1 with the first difference in err.
int fuzz_corpus_check(const fuzz_target_t *t, int write_it, char *err, size_t errlen);
// Every file of the corpus through the target: 0 when ok-* files are
// accepted and bad-* refused (others, e.g. crash-*, need only return),
// -1 with the first that is not in err. *files gets the count.
int fuzz_corpus_replay(const fuzz_target_t *t, int *files, char *err, size_t errlen);

#endif
