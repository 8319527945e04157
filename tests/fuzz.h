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

// In a Check runner with a `static const fuzz_target_t s_fuzz_targets[]`:
// the two loop tests over it (register them with tcase_add_loop_test over
// 0..N_FUZZ_TARGETS): the seeds are current, and the corpus replays.
#define N_FUZZ_TARGETS ((int) (sizeof s_fuzz_targets / sizeof s_fuzz_targets[0]))
#define FUZZ_CORPUS_TESTS                                                                      \
    START_TEST(test_fuzz_target_seeds_are_current)                                             \
    {                                                                                          \
        char err[512] = "";                                                                    \
        int rc = fuzz_corpus_check(&s_fuzz_targets[_i], getenv("SWARM_WRITE_CORPUS") != NULL, \
                                   err, sizeof err);                                           \
        ck_assert_msg(rc == 0, "%s", err);                                                     \
    }                                                                                          \
    END_TEST                                                                                   \
    START_TEST(test_fuzz_target_corpus_replays)                                                \
    {                                                                                          \
        char err[512] = "";                                                                    \
        int files = 0;                                                                         \
        int rc = fuzz_corpus_replay(&s_fuzz_targets[_i], &files, err, sizeof err);             \
        ck_assert_msg(rc == 0, "%s", err);                                                     \
        ck_assert_int_ge(files, 10);                                                           \
    }                                                                                          \
    END_TEST

#endif
