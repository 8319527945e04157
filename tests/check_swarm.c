/* check_swarm.c - the swarm module's data (swarm/data.c): splitmix64 and the
 * window starts against values from the PyTorch reference (ref_gpt.py), the
 * batch order as a pure function of (seed, step, window), the train/val
 * split, the size check and loading files.
 *
 * One test reads ../shared/data/tinyshakespeare.txt ($SWARM_SHARED/data/...
 * when set) and skips with a message when it is absent; the others need no file.
 */
#include "swarm.h"

#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GAMMA 0x9E3779B97F4A7C15ull
#define SHAKESPEARE_SIZE 1115394 // bytes of tinyshakespeare.txt
#define SHAKESPEARE_TRAIN 1003854
#define SHAKESPEARE_VAL 111540

// ---- helpers ---------------------------------------------------------------

// n pseudo-random bytes (xorshift64, independent of the sampler under test)
static uint8_t *s_random_bytes(size_t n, uint64_t seed)
{
    uint8_t *p = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(p);
    uint64_t x = seed | 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t) (x >> 32);
    }
    return p;
}

// Window i of (x, y) must be split[s .. s+T) and split[s+1 .. s+T]. (One
// assertion per window: a passing ck_assert costs a write to Check's pipe.)
static void s_assert_window(const uint8_t *split, size_t s, int T, const int32_t *x,
                            const int32_t *y, const char *what, int i)
{
    int t = 0;
    while (t < T && x[t] == split[s + t] && y[t] == split[s + t + 1])
        t++;
    ck_assert_msg(t == T, "%s window %d (start %zu): x[%d] = %d, y[%d] = %d, want %d, %d",
                  what, i, s, t, x[t], t, y[t], split[s + t], split[s + t + 1]);
}

static int32_t *s_ints(size_t n)
{
    int32_t *p = calloc(n ? n : 1, sizeof(int32_t));
    ck_assert_ptr_nonnull(p);
    return p;
}

static const char *s_tmpdir(void)
{
    const char *d = getenv("TMPDIR");
    return d && *d ? d : "/tmp";
}

// ---- splitmix64 ------------------------------------------------------------

START_TEST(test_splitmix64_matches_reference_values_from_seed_1337)
{
    // from ref_gpt.py's SplitMix64(1337).next(), run with /usr/bin/python3
    static const uint64_t want[] = {
        0xb6a8a9b313caa00bull, 0xcb7f284b67d605c9ull, 0x3440fccf54082b5aull,
        0x77026dc1feefc262ull, 0x3aa879a5358b1c9cull,
    };
    uint64_t state = 1337;
    for (int i = 0; i < 5; i++) {
        uint64_t got = swarm_splitmix64(&state);
        ck_assert_msg(got == want[i], "draw %d: %016llx, want %016llx", i,
                      (unsigned long long) got, (unsigned long long) want[i]);
        ck_assert_msg(state == 1337 + (uint64_t) (i + 1) * GAMMA, "state after draw %d", i);
    }
}
END_TEST

START_TEST(test_splitmix64_state_wraps_modulo_2_to_the_64)
{
    // from ref_gpt.py's SplitMix64(seed).next() for seeds 2^64 - 1 and 0
    static const uint64_t want_max[] = { 0xe4d971771b652c20ull, 0xe99ff867dbf682c9ull,
                                         0x382ff84cb27281e9ull };
    static const uint64_t want_zero[] = { 0xe220a8397b1dcdafull, 0x6e789e6aa1b965f4ull,
                                          0x06c45d188009454full };
    uint64_t a = UINT64_MAX, b = 0;
    for (int i = 0; i < 3; i++) {
        uint64_t ga = swarm_splitmix64(&a), gb = swarm_splitmix64(&b);
        ck_assert_msg(ga == want_max[i], "seed 2^64-1 draw %d: %016llx", i, (unsigned long long) ga);
        ck_assert_msg(gb == want_zero[i], "seed 0 draw %d: %016llx", i, (unsigned long long) gb);
    }
}
END_TEST

// ---- train_batch -----------------------------------------------------------

START_TEST(test_train_batch_equals_one_sequential_stream)
{
    enum { N = 5000, T = 16 };
    uint8_t *bytes = s_random_bytes(N, 3);
    swarm_data_t *data = swarm_data_wrap(bytes, N, "random.bin");
    size_t ntrain;
    const uint8_t *split = swarm_data_split(data, 0, &ntrain);
    static const struct {
        uint64_t seed;
        long step;
        int B, first, count;
    } cases[] = {
        { 1337, 0, 1, 0, 1 },     { 1337, 0, 4, 0, 4 },     { 1337, 3, 4, 1, 2 },
        { 1337, 7, 12, 5, 7 },    { 42, 100, 3, 2, 1 },     { 0, 9999, 8, 0, 8 },
        { UINT64_MAX - 5, 2, 5, 3, 2 }, // the state wraps past 2^64
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int count = cases[c].count;
        int32_t *x = s_ints((size_t) count * T), *y = s_ints((size_t) count * T);
        swarm_data_train_batch(data, cases[c].seed, cases[c].step, cases[c].B, cases[c].first,
                               count, T, x, y);
        // the stream from seed, k*B + first draws in
        uint64_t state = cases[c].seed;
        long skip = cases[c].step * cases[c].B + cases[c].first;
        for (long d = 0; d < skip; d++)
            swarm_splitmix64(&state);
        char what[96];
        snprintf(what, sizeof what, "seed %llu step %ld B %d first %d",
                 (unsigned long long) cases[c].seed, cases[c].step, cases[c].B, cases[c].first);
        for (int i = 0; i < count; i++) {
            size_t s = (size_t) (swarm_splitmix64(&state) % (ntrain - T));
            s_assert_window(split, s, T, x + i * T, y + i * T, what, i);
        }
        free(x), free(y);
    }
    swarm_data_destroy(&data);
    free(bytes);
}
END_TEST

START_TEST(test_train_batch_pieces_make_up_the_whole_step)
{
    enum { N = 3000, T = 8, B = 6 };
    uint8_t *bytes = s_random_bytes(N, 4);
    swarm_data_t *data = swarm_data_wrap(bytes, N, "random.bin");
    int32_t whole_x[B * T], whole_y[B * T], x[B * T], y[B * T];
    swarm_data_train_batch(data, 7, 5, B, 0, B, T, whole_x, whole_y);
    for (int a = 0; a <= B; a++) {
        memset(x, 0xff, sizeof x);
        memset(y, 0xff, sizeof y);
        swarm_data_train_batch(data, 7, 5, B, 0, a, T, x, y);
        swarm_data_train_batch(data, 7, 5, B, a, B - a, T, x + a * T, y + a * T);
        ck_assert_msg(memcmp(x, whole_x, sizeof x) == 0 && memcmp(y, whole_y, sizeof y) == 0,
                      "windows [0,%d) + [%d,%d) differ from [0,%d)", a, a, B, B);
    }
    swarm_data_destroy(&data);
    free(bytes);
}
END_TEST

START_TEST(test_train_batch_y_is_x_shifted_by_one_byte)
{
    enum { N = 4000, T = 32, B = 8 };
    uint8_t *bytes = s_random_bytes(N, 5);
    swarm_data_t *data = swarm_data_wrap(bytes, N, "random.bin");
    size_t ntrain;
    const uint8_t *split = swarm_data_split(data, 0, &ntrain);
    int32_t x[B * T], y[B * T];
    for (long step = 0; step < 20; step++) {
        swarm_data_train_batch(data, 99, step, B, 0, B, T, x, y);
        for (int i = 0; i < B; i++) {
            const int32_t *xi = x + i * T, *yi = y + i * T;
            int t = 0;
            while (t + 1 < T && yi[t] == xi[t + 1])
                t++;
            ck_assert_msg(t + 1 == T, "step %ld window %d: y[%d] %d != x[%d] %d",
                          step, i, t, yi[t], t + 1, xi[t + 1]);
            // x followed by the last byte of y is T+1 contiguous train bytes
            uint8_t win[T + 1];
            for (int t = 0; t < T; t++)
                win[t] = (uint8_t) xi[t];
            win[T] = (uint8_t) yi[T - 1];
            ck_assert_msg(memmem(split, ntrain, win, sizeof win) != NULL,
                          "step %ld window %d is not T+1 contiguous train bytes", step, i);
        }
    }
    swarm_data_destroy(&data);
    free(bytes);
}
END_TEST

START_TEST(test_train_batch_starts_match_reference_for_seed_1337)
{
    // Window starts of steps 0, 1, 2 of seed 1337, B 4, T 16 on a split of
    // 1003854 bytes: from ref_gpt.py's SplitMix64 and get_batch
    // (rng.next() % (len(split) - T)), run with /usr/bin/python3. They depend
    // only on the split's length, so random bytes of that size will do.
    static const size_t want[] = { 563989, 986207, 501642, 780976, 758174, 799401,
                                   929631, 892999, 410700, 573765, 899093, 328272 };
    enum { T = 16, B = 4 };
    uint8_t *bytes = s_random_bytes(SHAKESPEARE_SIZE, 6);
    swarm_data_t *data = swarm_data_wrap(bytes, SHAKESPEARE_SIZE, "random.bin");
    size_t ntrain;
    const uint8_t *split = swarm_data_split(data, 0, &ntrain);
    int32_t x[B * T], y[B * T];
    for (long step = 0; step < 3; step++) {
        swarm_data_train_batch(data, 1337, step, B, 0, B, T, x, y);
        for (int i = 0; i < B; i++)
            s_assert_window(split, want[step * B + i], T, x + i * T, y + i * T, "seed 1337",
                            (int) step * B + i);
    }
    swarm_data_destroy(&data);
    free(bytes);
}
END_TEST

START_TEST(test_train_batch_windows_reach_both_ends_of_the_train_split_only)
{
    // train bytes < 128, val bytes >= 128; the last train byte is 127 and
    // appears nowhere else; the buffer is exactly N bytes (ASan sees overruns)
    enum { N = 200, T = 16, B = 7, STEPS = 1000 };
    uint8_t *bytes = s_random_bytes(N, 7);
    swarm_data_t *data = swarm_data_wrap(bytes, N, "small.bin");
    size_t ntrain;
    swarm_data_split(data, 0, &ntrain);
    for (size_t i = 0; i < N; i++)
        bytes[i] = i < ntrain ? bytes[i] % 100 : 128 + bytes[i] % 100;
    bytes[0] = 126; // first train byte, also unique
    bytes[ntrain - 1] = 127;
    int32_t x[B * T], y[B * T];
    int saw_first = 0, saw_last = 0;
    long outside = -1; // first step with a byte outside the train split
    for (long step = 0; step < STEPS; step++) {
        swarm_data_train_batch(data, 5, step, B, 0, B, T, x, y);
        for (int i = 0; i < B * T; i++) {
            if (outside < 0 && (x[i] >= 127 || y[i] >= 128 || y[i] == 126))
                outside = step;
            saw_first |= x[i] == 126;
            saw_last |= y[i] == 127;
        }
    }
    ck_assert_msg(outside < 0, "step %ld: a window leaves [0, n_train)", outside);
    ck_assert_msg(saw_first, "no window starts at the first train byte");
    ck_assert_msg(saw_last, "no window ends at the last train byte");
    swarm_data_destroy(&data);
    free(bytes);
}
END_TEST

// ---- draw ------------------------------------------------------------------

START_TEST(test_draw_eval_streams_match_reference_and_run_on)
{
    // Evaluation streams of seed 1337, T 16, on splits of 1003854 and 111540
    // bytes: state 1337 + 1000 on train, 1337 + 2000 on val; from ref_gpt.py's
    // SplitMix64 and get_batch, run with /usr/bin/python3.
    static const size_t want_train[] = { 503236, 89791, 717862, 995948, 159420, 39417 };
    static const size_t want_val[] = { 5500, 71390, 90823, 98528, 80905, 55151 };
    enum { T = 16 };
    uint8_t *bytes = s_random_bytes(SHAKESPEARE_SIZE, 8);
    swarm_data_t *data = swarm_data_wrap(bytes, SHAKESPEARE_SIZE, "random.bin");
    for (int val = 0; val < 2; val++) {
        size_t n;
        const uint8_t *split = swarm_data_split(data, val, &n);
        const size_t *want = val ? want_val : want_train;
        uint64_t state = 1337 + (val ? 2000 : 1000);
        int32_t x[6 * T], y[6 * T];
        // two draws, then four more from the same running state
        swarm_data_draw(data, val, &state, 2, T, x, y);
        swarm_data_draw(data, val, &state, 4, T, x + 2 * T, y + 2 * T);
        ck_assert_msg(state == 1337 + (val ? 2000 : 1000) + 6 * GAMMA, "state did not run on 6 draws");
        for (int i = 0; i < 6; i++)
            s_assert_window(split, want[i], T, x + i * T, y + i * T, val ? "val" : "train", i);
    }
    swarm_data_destroy(&data);
    free(bytes);
}
END_TEST

START_TEST(test_draw_val_windows_reach_both_ends_of_the_val_split_only)
{
    enum { N = 400, T = 16, COUNT = 5000 };
    uint8_t *bytes = s_random_bytes(N, 9);
    swarm_data_t *data = swarm_data_wrap(bytes, N, "small.bin");
    size_t ntrain, nval;
    swarm_data_split(data, 0, &ntrain);
    const uint8_t *val = swarm_data_split(data, 1, &nval);
    ck_assert_ptr_eq(val, bytes + ntrain);
    for (size_t i = 0; i < N; i++)
        bytes[i] = i < ntrain ? bytes[i] % 100 : 128 + bytes[i] % 100;
    bytes[ntrain] = 254; // first and last val bytes, unique
    bytes[N - 1] = 255;
    int32_t *x = s_ints((size_t) COUNT * T), *y = s_ints((size_t) COUNT * T);
    uint64_t state = 77;
    swarm_data_draw(data, 1, &state, COUNT, T, x, y);
    int saw_first = 0, saw_last = 0, outside = -1;
    for (int i = 0; i < COUNT * T; i++) {
        if (outside < 0 && (x[i] < 128 || y[i] < 128 || y[i] == 254 || x[i] == 255))
            outside = i / T;
        saw_first |= x[i] == 254;
        saw_last |= y[i] == 255;
    }
    ck_assert_msg(outside < 0, "draw %d leaves the val split", outside);
    ck_assert_msg(saw_first && saw_last, "val windows never reach an end (first %d, last %d)",
                  saw_first, saw_last);
    free(x), free(y);
    swarm_data_destroy(&data);
    free(bytes);
}
END_TEST

// ---- split -----------------------------------------------------------------

START_TEST(test_split_sizes_for_tinyshakespeare_length_are_1003854_and_111540)
{
    uint8_t *bytes = s_random_bytes(SHAKESPEARE_SIZE, 10);
    swarm_data_t *data = swarm_data_wrap(bytes, SHAKESPEARE_SIZE, "tinyshakespeare.txt");
    ck_assert_str_eq(swarm_data_name(data), "tinyshakespeare.txt");
    ck_assert_uint_eq(swarm_data_size(data), SHAKESPEARE_SIZE);
    size_t ntrain = 0, nval = 0;
    const uint8_t *train = swarm_data_split(data, 0, &ntrain);
    const uint8_t *val = swarm_data_split(data, 1, &nval);
    ck_assert_uint_eq(ntrain, SHAKESPEARE_TRAIN);
    ck_assert_uint_eq(nval, SHAKESPEARE_VAL);
    ck_assert_ptr_eq(train, bytes);
    ck_assert_ptr_eq(val, bytes + SHAKESPEARE_TRAIN);
    swarm_data_destroy(&data);
    ck_assert_ptr_null(data);
    free(bytes);
}
END_TEST

START_TEST(test_split_is_python_int_of_0_9_n)
{
    // int(0.9 * n) from /usr/bin/python3
    static const size_t n[] = { 1, 2, 9, 10, 11, 19, 20, 29, 30, 31, 99, 100, 101,
                                170, 171, 1000, 12345, 99999 };
    static const size_t want[] = { 0, 1, 8, 9, 9, 17, 18, 26, 27, 27, 89, 90, 90,
                                   153, 153, 900, 11110, 89999 };
    uint8_t *bytes = s_random_bytes(99999, 11);
    for (size_t i = 0; i < sizeof n / sizeof n[0]; i++) {
        swarm_data_t *data = swarm_data_wrap(bytes, n[i], "x");
        size_t ntrain, nval;
        swarm_data_split(data, 0, &ntrain);
        swarm_data_split(data, 1, &nval);
        ck_assert_msg(ntrain == want[i] && nval == n[i] - want[i], "n %zu: train %zu val %zu, want %zu",
                      n[i], ntrain, nval, want[i]);
        swarm_data_destroy(&data);
    }
    free(bytes);
}
END_TEST

// ---- check -----------------------------------------------------------------

START_TEST(test_check_rejects_empty_data_naming_it)
{
    static const uint8_t none[1] = { 0 };
    swarm_data_t *data = swarm_data_wrap(none, 0, "empty-corpus.txt");
    char err[512] = "";
    ck_assert_int_eq(swarm_data_check(data, 16, err, sizeof err), -EINVAL);
    ck_assert_msg(strstr(err, "empty-corpus.txt") != NULL, "message does not name the data: %s", err);
    swarm_data_destroy(&data);
}
END_TEST

START_TEST(test_check_rejects_data_too_small_for_the_block_naming_it)
{
    // n 160: train 144, val 16 < T+1; n 10: both too small
    static const size_t sizes[] = { 10, 100, 160 };
    uint8_t *bytes = s_random_bytes(160, 12);
    for (int i = 0; i < 3; i++) {
        swarm_data_t *data = swarm_data_wrap(bytes, sizes[i], "tiny-corpus.txt");
        char err[512] = "";
        ck_assert_int_eq(swarm_data_check(data, 16, err, sizeof err), -EINVAL);
        ck_assert_msg(strstr(err, "tiny-corpus.txt") != NULL, "n %zu: message does not name the data: %s",
                      sizes[i], err);
        ck_assert_msg(strstr(err, "16") != NULL, "n %zu: message does not name the block: %s",
                      sizes[i], err);
        swarm_data_destroy(&data);
    }
    free(bytes);
}
END_TEST

START_TEST(test_check_accepts_the_smallest_data_that_fits)
{
    // T 16: n 161 gives train 144 and val 17 = T+1 bytes, the least that works
    uint8_t *bytes = s_random_bytes(161, 13);
    swarm_data_t *data = swarm_data_wrap(bytes, 161, "just-enough.txt");
    char err[512] = "";
    ck_assert_msg(swarm_data_check(data, 16, err, sizeof err) == 0, "n 161 T 16 refused: %s", err);
    // and windows from it stay inside the buffer (ASan)
    int32_t x[4 * 16], y[4 * 16];
    swarm_data_train_batch(data, 1, 0, 4, 0, 4, 16, x, y);
    uint64_t state = 2;
    swarm_data_draw(data, 1, &state, 4, 16, x, y);
    for (int t = 0; t < 16; t++) // val has one window only: start 0
        ck_assert_msg(x[3 * 16 + t] == bytes[144 + t] && y[3 * 16 + t] == bytes[145 + t],
                      "the only val window differs at %d", t);
    swarm_data_destroy(&data);
    free(bytes);
}
END_TEST

// ---- load ------------------------------------------------------------------

START_TEST(test_load_missing_file_returns_enoent_naming_the_path)
{
    char dir[512], path[600], err[1024] = "";
    snprintf(dir, sizeof dir, "%s/check_swarm.XXXXXX", s_tmpdir());
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/no-such-file.txt", dir);
    swarm_data_t *data = NULL;
    int rc = swarm_data_load(path, &data, err, sizeof err);
    rmdir(dir);
    ck_assert_int_eq(rc, -ENOENT);
    ck_assert_ptr_null(data);
    ck_assert_msg(strstr(err, path) != NULL, "message does not name the path: %s", err);
}
END_TEST

START_TEST(test_load_directory_is_an_error_naming_the_path)
{
    char dir[512], err[1024] = "";
    snprintf(dir, sizeof dir, "%s/check_swarm.XXXXXX", s_tmpdir());
    ck_assert_ptr_nonnull(mkdtemp(dir));
    swarm_data_t *data = NULL;
    int rc = swarm_data_load(dir, &data, err, sizeof err);
    rmdir(dir);
    ck_assert_msg(rc < 0, "loading a directory returned %d", rc);
    ck_assert_ptr_null(data);
    ck_assert_msg(strstr(err, dir) != NULL, "message does not name the path: %s", err);
}
END_TEST

// A temporary file holding n bytes; returns its path in path.
static void s_write_temp(char *path, size_t len, const uint8_t *bytes, size_t n)
{
    snprintf(path, len, "%s/check_swarm.XXXXXX", s_tmpdir());
    int fd = mkstemp(path);
    ck_assert_msg(fd >= 0, "mkstemp %s: %s", path, strerror(errno));
    ck_assert_msg(n == 0 || write(fd, bytes, n) == (ssize_t) n, "write %s", path);
    close(fd);
}

START_TEST(test_load_reads_every_byte_of_a_file_exactly)
{
    enum { N = 70001 };
    uint8_t *bytes = s_random_bytes(N, 14);
    for (int i = 0; i < 256; i++) // every byte value, NUL included
        bytes[i] = (uint8_t) i;
    char path[600], err[1024] = "";
    s_write_temp(path, sizeof path, bytes, N);
    swarm_data_t *data = NULL;
    int rc = swarm_data_load(path, &data, err, sizeof err);
    unlink(path);
    ck_assert_msg(rc == 0, "load: %s", err);
    ck_assert_ptr_nonnull(data);
    ck_assert_uint_eq(swarm_data_size(data), N);
    ck_assert_str_eq(swarm_data_name(data), path);
    size_t ntrain, nval;
    const uint8_t *train = swarm_data_split(data, 0, &ntrain);
    const uint8_t *val = swarm_data_split(data, 1, &nval);
    ck_assert_uint_eq(ntrain, 63000); // int(0.9 * 70001)
    ck_assert_uint_eq(nval, N - 63000);
    ck_assert_msg(memcmp(train, bytes, ntrain) == 0, "train split differs from the file");
    ck_assert_msg(memcmp(val, bytes + ntrain, nval) == 0, "val split differs from the file");
    ck_assert_msg(swarm_data_check(data, 64, err, sizeof err) == 0, "check: %s", err);
    swarm_data_destroy(&data);
    ck_assert_ptr_null(data);
    free(bytes);
}
END_TEST

START_TEST(test_load_empty_file_succeeds_and_check_rejects_it)
{
    char path[600], err[1024] = "";
    s_write_temp(path, sizeof path, NULL, 0);
    swarm_data_t *data = NULL;
    int rc = swarm_data_load(path, &data, err, sizeof err);
    unlink(path);
    ck_assert_msg(rc == 0, "load: %s", err);
    ck_assert_uint_eq(swarm_data_size(data), 0);
    ck_assert_int_eq(swarm_data_check(data, 8, err, sizeof err), -EINVAL);
    ck_assert_msg(strstr(err, path) != NULL, "message does not name the file: %s", err);
    swarm_data_destroy(&data);
}
END_TEST

START_TEST(test_destroy_accepts_null)
{
    swarm_data_t *data = NULL;
    swarm_data_destroy(&data);
    swarm_data_destroy(NULL);
    ck_assert_ptr_null(data);
}
END_TEST

// ---- reference (needs ../shared) -------------------------------------------

START_TEST(test_tinyshakespeare_first_batch_matches_ref_gpt)
{
    const char *env = getenv("SWARM_SHARED");
    char path[600], err[1024] = "";
    snprintf(path, sizeof path, "%s/data/tinyshakespeare.txt", env && *env ? env : "../shared");
    if (access(path, R_OK) != 0) {
        printf("SKIP: %s not found; the tinyshakespeare test needs ../shared (or SWARM_SHARED)\n",
               path);
        return;
    }
    // Printed by `ref_gpt.py --iters 1 --grad-dump /tmp/x.bgpt --layers 2
    // --heads 4 --embd 32 --block 16 --batch 4 --warmup 2 --lr 1e-2
    // --threads 1 --seed 1337 --eval-every 0` ("batch starts [...]"), and the
    // T+1 bytes at each start, read there with /usr/bin/python3.
    static const size_t starts[] = { 563989, 986207, 501642, 780976 };
    static const char *const text[] = { "Is partly to beho", "end thoughts and ",
                                        "Are you so hot? m", " him Autolycus.\n\n" };
    enum { T = 16, B = 4 };
    swarm_data_t *data = NULL;
    int rc = swarm_data_load(path, &data, err, sizeof err);
    ck_assert_msg(rc == 0, "load: %s", err);
    ck_assert_uint_eq(swarm_data_size(data), SHAKESPEARE_SIZE);
    size_t ntrain;
    const uint8_t *split = swarm_data_split(data, 0, &ntrain);
    ck_assert_uint_eq(ntrain, SHAKESPEARE_TRAIN);
    int32_t x[B * T], y[B * T];
    swarm_data_train_batch(data, 1337, 0, B, 0, B, T, x, y);
    for (int i = 0; i < B; i++) {
        s_assert_window(split, starts[i], T, x + i * T, y + i * T, "tinyshakespeare", i);
        for (int t = 0; t < T; t++)
            ck_assert_msg(x[i * T + t] == (uint8_t) text[i][t] && y[i * T + t] == (uint8_t) text[i][t + 1],
                          "window %d byte %d: x %d y %d, reference text \"%s\"", i, t,
                          x[i * T + t], y[i * T + t], text[i]);
    }
    swarm_data_destroy(&data);
}
END_TEST

// ---- runner ----------------------------------------------------------------

// ---- policy ----------------------------------------------------------------

static swarm_peer_view_t s_view(int stage, int ready, int inflight, double tok_s)
{
    return (swarm_peer_view_t) { .stage = stage, .ready = ready, .inflight = inflight,
                                 .tok_s = tok_s };
}

START_TEST(test_pick_prefers_earliest_projected_finish)
{
    swarm_peer_view_t p[4] = {
        s_view(0, 1, 0, 1000), s_view(0, 1, 0, 3000), s_view(1, 1, 0, 9000), s_view(0, 0, 0, 9000),
    };
    // the fastest ready peer of stage 0; the faster stage-1 and the
    // not-ready peers do not count
    ck_assert_int_eq(swarm_policy_pick(p, 4, 0, -1, 768), 1);
    // work it already holds: (1600 + 768) / 3000 = 0.789 s, later than
    // 768 / 1000 = 0.768 s on the slow one
    p[1].backlog = 1600;
    ck_assert_int_eq(swarm_policy_pick(p, 4, 0, -1, 768), 0);
    // a little less, (1500 + 768) / 3000 = 0.756 s, and the fast one is sooner
    p[1].backlog = 1500;
    ck_assert_int_eq(swarm_policy_pick(p, 4, 0, -1, 768), 1);
    // the count of requests in flight or queued is not what counts: their work is
    p[1].backlog = 0;
    p[1].inflight = 3;
    p[1].queue = 3;
    ck_assert_int_eq(swarm_policy_pick(p, 4, 0, -1, 768), 1);
    ck_assert_int_eq(swarm_policy_pick(p, 4, 2, -1, 768), -1);
}
END_TEST

START_TEST(test_pick_balances_finish_times_of_uneven_replicas)
{
    // a fast and an 8x slower replica share a stage: handing out forwards
    // (each bringing its backward, 768 tokens of work) one by one by
    // earliest finish, the slow one gets about its share and both finish
    // close together
    swarm_peer_view_t p[2] = { s_view(0, 1, 0, 8000), s_view(0, 1, 0, 1000) };
    int got[2] = { 0, 0 };
    for (int k = 0; k < 18; k++) {
        int i = swarm_policy_pick(p, 2, 0, -1, 768);
        ck_assert_int_ge(i, 0);
        got[i]++;
        p[i].backlog += 768;
    }
    ck_assert_int_eq(got[0], 16);
    ck_assert_int_eq(got[1], 2);
    double t0 = p[0].backlog / 8000, t1 = p[1].backlog / 1000;
    ck_assert_msg(fabs(t0 - t1) <= 768.0 / 1000, "finishes %.3f and %.3f s", t0, t1);
}
END_TEST

START_TEST(test_pick_keeps_backward_on_the_forward_peer_when_close)
{
    swarm_peer_view_t p[2] = { s_view(0, 1, 0, 1000), s_view(0, 1, 0, 1100) };
    // without a preference the faster one; the peer holding the activations
    // has the backward in its backlog already and wins unless another would
    // be through everything, recomputing the forward too, before it
    p[0].backlog = 512;
    ck_assert_int_eq(swarm_policy_pick(p, 2, 0, -1, 768), 1);
    ck_assert_int_eq(swarm_policy_pick(p, 2, 0, 0, 768), 0);
    // but not when it is far behind (a straggler at the end of a step)
    p[0].backlog = 5 * 768;
    ck_assert_int_eq(swarm_policy_pick(p, 2, 0, 0, 768), 1);
}
END_TEST

// The rows of one stage in the order swarm_rows_t asks: by max(tok_s, 1),
// the fastest first, ties by the lower index.
static const swarm_peer_view_t *g_rows;
static int s_cmp_speed(const void *a, const void *b)
{
    int i = *(const int *) a, j = *(const int *) b;
    double ri = g_rows[i].tok_s > 1.0 ? g_rows[i].tok_s : 1.0;
    double rj = g_rows[j].tok_s > 1.0 ? g_rows[j].tok_s : 1.0;
    return ri > rj ? -1 : ri < rj ? 1 : i - j;
}

// A pick over a stage's rows by speed that stops early (swarm_policy_pick_in,
// swarm_policy_pick_fit_in) answers what a read of every row answers: on
// thousands of random stages whose speeds tie often (a few classes, and
// some under 1 tok/s), with rows not ready, rows of another stage, backlogs
// of whole micro-batches, every replica dry or busy, and the sums as the
// caller keeps them (off by their stated errors, or nothing known).
START_TEST(test_pick_by_speed_answers_as_reading_every_row)
{
    uint64_t x = 7;
    double work = 768;
    for (int trial = 0; trial < 20000; trial++) {
        swarm_peer_view_t v[40];
        int order[40], n = 1 + (int) (swarm_splitmix64(&x) % 40);
        static const double speeds[] = { 0.5, 1.0, 25, 50, 100, 1000, 2000 };
        for (int i = 0; i < n; i++) {
            int stage = swarm_splitmix64(&x) % 8 ? 0 : 1, ready = swarm_splitmix64(&x) % 10 != 0;
            int inflight = (int) (swarm_splitmix64(&x) % 4);
            double tok_s = trial % 3 ? speeds[swarm_splitmix64(&x) % 7]
                                     : 1 + (double) (swarm_splitmix64(&x) % 5000);
            v[i] = s_view(stage, ready, inflight, tok_s);
            v[i].backlog = (double) (swarm_splitmix64(&x) % 6) * work / 3.0;
            v[i].ahead = (double) (swarm_splitmix64(&x) % 100) / 100.0;
            v[i].rtt = (double) (swarm_splitmix64(&x) % 60) / 100.0;
            order[i] = i;
        }
        g_rows = v;
        qsort(order, (size_t) n, sizeof order[0], s_cmp_speed);
        swarm_rows_t rows = { .view = v, .n = n, .order = order };
        swarm_policy_sums(v, n, 0, &rows.held, &rows.rate);
        if (trial % 4 == 1) { // kept by differences: a little off, and said to be
            rows.held_err = 1e-9 * rows.held;
            rows.held += 0.5e-9 * rows.held;
        } else if (trial % 4 == 2) {
            rows.rate = 0.0; // nothing kept: read every row
        }
        for (int left = 1; left <= 40; left += 13) {
            int whole = swarm_policy_pick_fit(v, n, 0, work, left);
            int got = swarm_policy_pick_fit_in(&rows, 0, work, left);
            ck_assert_msg(got == whole, "trial %d: a forward, %d left: %d, reading every row %d",
                          trial, left, got, whole);
        }
        for (int prefer = -1; prefer < n; prefer += 1 + n / 4) {
            int whole = swarm_policy_pick(v, n, 0, prefer, work);
            int got = swarm_policy_pick_in(&rows, 0, prefer, work);
            ck_assert_msg(got == whole, "trial %d: prefer %d: %d, reading every row %d", trial,
                          prefer, got, whole);
        }
    }
    // and it does stop: a row put after a far slower one (out of order,
    // as no caller puts it) is not read, though it would finish first
    swarm_peer_view_t v[3] = { s_view(0, 1, 0, 1000), s_view(0, 1, 0, 10), s_view(0, 1, 0, 500) };
    v[0].backlog = 1232; // done at 2 s; the slow row's work alone takes 76.8 s
    int wrong[3] = { 0, 1, 2 };
    swarm_rows_t rows = { .view = v, .n = 3, .order = wrong };
    ck_assert_int_eq(swarm_policy_pick(v, 3, 0, -1, work), 2);
    ck_assert_int_eq(swarm_policy_pick_in(&rows, 0, -1, work), 0);
}
END_TEST

START_TEST(test_assign_fills_the_weakest_stage)
{
    swarm_peer_view_t p[4] = {
        s_view(0, 1, 0, 1000), s_view(1, 1, 0, 1000), s_view(1, 0, 0, 500), s_view(-1, 0, 0, 0),
    };
    p[2].joining = 1;
    // stage 0 has 1000 tok/s, stage 1 has 1500 (one joining), stage 2 none
    ck_assert_int_eq(swarm_policy_assign(p, 4, 3, NULL, NULL), 2);
    ck_assert_int_eq(swarm_policy_assign(p, 4, 2, NULL, NULL), 0);
    // an empty swarm fills stage 0 first, then ties go to fewer replicas
    ck_assert_int_eq(swarm_policy_assign(p, 0, 2, NULL, NULL), 0);
    swarm_peer_view_t q[1] = { s_view(0, 1, 0, 0) };
    ck_assert_int_eq(swarm_policy_assign(q, 1, 2, NULL, NULL), 1);
}
END_TEST

START_TEST(test_assign_even_counts_peers_not_speeds)
{
    swarm_peer_view_t p[3] = {
        s_view(0, 1, 0, 100000), s_view(1, 1, 0, 10), s_view(1, 0, 0, 10),
    };
    p[2].joining = 1;
    // stage 0: one very fast peer; stage 1: two slow ones (one joining); stage 2: none
    ck_assert_int_eq(swarm_policy_assign_even(p, 3, 3, NULL, NULL), 2);
    ck_assert_int_eq(swarm_policy_assign_even(p, 3, 2, NULL, NULL), 0);
    ck_assert_int_eq(swarm_policy_assign(p, 3, 2, NULL, NULL), 1); // by speed, the slow stage
    // dead peers (neither ready nor joining) do not count; ties go to the first stage
    p[1].ready = 0;
    p[2].joining = 0;
    ck_assert_int_eq(swarm_policy_assign_even(p, 3, 2, NULL, NULL), 1);
    ck_assert_int_eq(swarm_policy_assign_even(p, 0, 4, NULL, NULL), 0);
}
END_TEST

// A node is given only a stage it can hold: the weakest of those, and -1
// when it holds none; moves and refills never take a peer to a stage it
// cannot hold.
START_TEST(test_assign_and_moves_keep_to_each_peers_memory)
{
    double need[3] = { 100e6, 400e6, 200e6 }, cost[3] = { 1, 1, 1 };
    swarm_peer_view_t p[4] = {
        s_view(0, 1, 0, 1000), s_view(0, 1, 0, 1000), s_view(2, 1, 0, 3000), s_view(-1, 0, 0, 0),
    };
    p[0].memory = p[1].memory = 150e6; // holds stage 0 only
    p[2].memory = 0;                   // unknown: any
    swarm_peer_view_t me = p[3];
    me.memory = 250e6; // stage 1 (none yet: the weakest) is too big for it: stage 2 or 0
    ck_assert_int_eq(swarm_policy_assign(p, 3, 3, need, NULL), 1);
    ck_assert_int_eq(swarm_policy_assign(p, 3, 3, need, &me), 0); // 2000 of stage 0 < 3000 of 2
    ck_assert_int_eq(swarm_policy_assign_even(p, 3, 3, need, &me), 2);
    me.memory = 50e6;
    ck_assert_int_eq(swarm_policy_assign(p, 3, 3, need, &me), -1);
    ck_assert_int_eq(swarm_policy_assign_even(p, 3, 3, need, &me), -1);
    me.memory = 0; // unknown: as before
    ck_assert_int_eq(swarm_policy_assign(p, 3, 3, need, &me), 1);
    // stage 1 empty: a refill would take a stage-0 replica, but neither holds
    // it; the peer of unknown memory is the last of stage 2
    ck_assert_int_eq(swarm_policy_refill(p, 3, 3, cost, need, 1), -1);
    ck_assert_int_eq(swarm_policy_refill(p, 3, 3, cost, NULL, 1), 0);
    ck_assert(swarm_policy_holds(&p[0], need, 0) && !swarm_policy_holds(&p[0], need, 2));
    // rebalancing toward a slow stage 1: of stage 0's three replicas only
    // the one of unknown memory may go (the others cannot hold it)
    double need2[2] = { 100e6, 200e6 }, cost2[2] = { 1, 1 };
    swarm_peer_view_t q[4] = {
        s_view(0, 1, 0, 1000), s_view(0, 1, 0, 1000), s_view(0, 1, 0, 1000), s_view(1, 1, 0, 100),
    };
    for (int i = 0; i < 4; i++)
        q[i].moved_at = -1e30;
    q[0].memory = q[1].memory = 150e6;
    swarm_plan_t plan = { .stages = 2, .cost = cost2, .need = need2, .now = 100.0, .hold = 30.0,
                          .margin = 0.2, .horizon = 300.0 };
    int to[4];
    double low, high;
    ck_assert_int_eq(swarm_policy_plan(q, 4, &plan, to, &low, &high), 1);
    ck_assert(to[0] == 0 && to[1] == 0 && to[2] == 1 && to[3] == 1);
    q[2].memory = 150e6;
    ck_assert_int_eq(swarm_policy_plan(q, 4, &plan, to, &low, &high), 0);
    plan.need = NULL;
    ck_assert_int_ge(swarm_policy_plan(q, 4, &plan, to, &low, &high), 1);
}
END_TEST

// A plan for peers of these stages and speeds, never moved before.
static int s_plan(swarm_peer_view_t *p, int n, const swarm_plan_t *plan, int *to, double *low,
                  double *high)
{
    for (int i = 0; i < n; i++)
        if (p[i].moved_at == 0.0)
            p[i].moved_at = -1e30;
    return swarm_policy_plan(p, n, plan, to, low, high);
}

START_TEST(test_plan_moves_only_when_it_pays)
{
    const double cost[2] = { 1.0, 1.0 };
    swarm_peer_view_t p[3] = {
        s_view(0, 1, 0, 1500), s_view(0, 1, 0, 1500), s_view(1, 1, 0, 500),
    };
    swarm_plan_t plan = { .stages = 2, .cost = cost, .now = 100.0, .hold = 30.0, .margin = 0.2,
                          .horizon = 300.0 };
    int to[3];
    double low, high;
    // stage 0 has 3000 tok/s, stage 1 500: moving one raises the bound to 1500
    ck_assert_int_eq(s_plan(p, 3, &plan, to, &low, &high), 1);
    ck_assert(low == 500.0 && high == 1500.0);
    ck_assert_int_eq(to[2], 1);
    ck_assert((to[0] == 1) != (to[1] == 1));
    ck_assert(swarm_policy_bound(p, 3, &plan, to) == 1500.0);
    // a state that takes 100 s to fetch: 1000 tok/s more for 200 s does
    // not repay 500 tok/s lost for 100 s? it does (200,000 > 50,000); over
    // a horizon of 120 s it does not (20,000 < 50,000)
    double fetch[2] = { 100.0, 100.0 };
    plan.move_s = fetch;
    ck_assert_int_eq(s_plan(p, 3, &plan, to, &low, &high), 1);
    plan.horizon = 120.0;
    ck_assert_int_eq(s_plan(p, 3, &plan, to, &low, &high), 0);
    ck_assert(to[0] == 0 && to[1] == 0 && to[2] == 1);
    plan.move_s = NULL, plan.horizon = 300.0;
    // moved 10 s ago: held in place
    p[0].moved_at = p[1].moved_at = 90.0;
    ck_assert_int_eq(s_plan(p, 3, &plan, to, &low, &high), 0);
    // nearly balanced: nothing improves the bound by 20%
    p[0].moved_at = p[1].moved_at = -1e30;
    p[0].tok_s = 1000, p[1].tok_s = 900, p[2].tok_s = 1000;
    ck_assert_int_eq(s_plan(p, 3, &plan, to, &low, &high), 0);
    // a stage's only replica is never moved, even when it is the strongest
    swarm_peer_view_t q[2] = { s_view(0, 1, 0, 9000), s_view(1, 1, 0, 10) };
    ck_assert_int_eq(s_plan(q, 2, &plan, to, &low, &high), 0);
    // a stage with no replica is refill's: no plan
    swarm_peer_view_t e[3] = { s_view(0, 1, 0, 900), s_view(0, 1, 0, 900), s_view(1, 0, 0, 10) };
    ck_assert_int_eq(s_plan(e, 3, &plan, to, &low, &high), 0);
}
END_TEST

START_TEST(test_plan_counts_stage_cost)
{
    // stage 1 costs 4x stage 0 per token: a 2000 tok/s peer of stage 0
    // would do 500 there, taking stage 1 from 100 to 600
    const double cost[2] = { 1.0, 4.0 };
    swarm_peer_view_t p[3] = {
        s_view(0, 1, 0, 2000), s_view(0, 1, 0, 2000), s_view(1, 1, 0, 100),
    };
    swarm_plan_t plan = { .stages = 2, .cost = cost, .now = 0.0, .hold = 30.0, .margin = 0.2,
                          .horizon = 300.0 };
    int to[3];
    double low, high;
    ck_assert_int_eq(s_plan(p, 3, &plan, to, &low, &high), 1);
    ck_assert_int_eq(to[2], 1);
    ck_assert(low == 100.0 && high == 600.0);
    // stage 0 600, stage 1 480: a move leaves 300 and 555, a worse bound
    p[2].tok_s = 480;
    p[0].tok_s = p[1].tok_s = 300;
    ck_assert_int_eq(s_plan(p, 3, &plan, to, &low, &high), 0);
    ck_assert(high == 480.0);
}
END_TEST

// The traps of one-peer moves: no single move lifts these bounds, a swap
// or several moves at once do.
START_TEST(test_plan_swaps_and_moves_several_where_one_move_cannot)
{
    const double cost[3] = { 1.0, 1.0, 1.0 };
    // {6, 6} and {3, 4}: 7. Moving any one peer leaves 6 or less; swapping
    // a 6 for the 3 gives {6, 3} and {6, 4}: 9
    swarm_peer_view_t p[4] = { s_view(0, 1, 0, 6), s_view(0, 1, 0, 6), s_view(1, 1, 0, 3),
                               s_view(1, 1, 0, 4) };
    swarm_plan_t plan = { .stages = 2, .cost = cost, .now = 0.0, .hold = 30.0, .margin = 0.1,
                          .horizon = 300.0 };
    int to[16];
    double low, high;
    ck_assert_int_eq(s_plan(p, 4, &plan, to, &low, &high), 2);
    ck_assert(low == 7.0 && high == 9.0);
    ck_assert_int_eq(to[0] + to[1], 1); // one 6 each
    ck_assert_int_eq(to[2] + to[3], 1);
    // three stages, {4, 4, 4, 4}, {2}, {2}: two moves at once make 6, 6, 6
    swarm_peer_view_t q[6] = { s_view(0, 1, 0, 4), s_view(0, 1, 0, 4), s_view(0, 1, 0, 4),
                               s_view(0, 1, 0, 4), s_view(1, 1, 0, 2), s_view(2, 1, 0, 2) };
    plan.stages = 3;
    ck_assert_int_eq(s_plan(q, 6, &plan, to, &low, &high), 2);
    ck_assert(low == 2.0 && high == 6.0);
    int on[3] = { 0 };
    for (int i = 0; i < 6; i++)
        on[to[i]]++;
    ck_assert(on[0] == 2 && on[1] == 2 && on[2] == 2 && to[4] == 1 && to[5] == 2);
    // {1}, {10, 10}: a 10 into stage 0 makes 10 whether the 1 stays or
    // goes; of equal splits the fewer moves
    swarm_peer_view_t k[3] = { s_view(0, 1, 0, 1), s_view(1, 1, 0, 10), s_view(1, 1, 0, 10) };
    plan.stages = 2;
    ck_assert_int_eq(s_plan(k, 3, &plan, to, &low, &high), 1);
    ck_assert(to[0] == 0 && high == 10.0);
    ck_assert_int_eq(swarm_policy_wave(k, 3, &plan, to), 0);
    // {9, 1, 1} and {1}: moving both 1s makes {9} and {1, 1, 1}, 3; stage
    // 0 keeps the one the plan leaves it
    swarm_peer_view_t t[4] = { s_view(0, 1, 0, 9), s_view(0, 1, 0, 1), s_view(0, 1, 0, 1),
                               s_view(1, 1, 0, 1) };
    ck_assert_int_eq(s_plan(t, 4, &plan, to, &low, &high), 2);
    ck_assert(low == 1.0 && high == 3.0 && to[0] == 0 && to[1] == 1 && to[2] == 1 && to[3] == 1);
    ck_assert_int_eq(swarm_policy_wave(t, 4, &plan, to), 0); // both at once
    // two stages' only replicas traded: no wave can start either, so no
    // plan (a 1 on the stage costing 4, a 4 on the one costing 1)
    const double uneven[2] = { 4.0, 1.0 };
    swarm_peer_view_t x[2] = { s_view(0, 1, 0, 1), s_view(1, 1, 0, 4) };
    plan.cost = uneven;
    ck_assert_int_eq(s_plan(x, 2, &plan, to, &low, &high), 0);
    ck_assert(to[0] == 0 && to[1] == 1);
}
END_TEST

// The split of scripts/bench-hetero.sh (six CPUs over three stages of
// unequal cost), as it joined: the fastest peer alone on the cheapest
// stage, where it does twice what the pipeline can use. The best split
// moves it, and slower peers take its place: stage 0's only replica
// leaves once one of them is ready there, and stage 2 keeps a replica
// until the fast peer has come, so the moves go in three waves.
START_TEST(test_plan_moves_a_stages_only_replica_in_waves)
{
    const double cost[3] = { 1.0, 2.5, 1.6 };
    const int from[6] = { 0, 1, 2, 1, 2, 2 };
    // speeds in tok/s on the stage each is on; weights (tok/s x cost)
    // 26000, 26000, 13000, 6500, 6500, 3250
    swarm_peer_view_t p[6] = {
        s_view(0, 1, 0, 26000), s_view(1, 1, 0, 10400), s_view(2, 1, 0, 8125),
        s_view(1, 1, 0, 2600), s_view(2, 1, 0, 4062.5), s_view(2, 1, 0, 2031.25),
    };
    swarm_plan_t plan = { .stages = 3, .cost = cost, .now = 100.0, .hold = 30.0, .margin = 0.05,
                          .horizon = 300.0 };
    int to[6];
    double low, high;
    int moves = s_plan(p, 6, &plan, to, &low, &high);
    // stage 1 holds 39000 of weight (15600), stage 2 the fast one (16250),
    // stage 0 the rest (16250): 15600, where brute force says no split
    // beats it; the fewest moves there are four
    ck_assert(low == 13000.0 && high == 15600.0);
    ck_assert_int_eq(moves, 4);
    ck_assert_int_eq(to[0], 2);
    ck_assert(swarm_policy_bound(p, 6, &plan, to) == high);
    ck_assert(swarm_policy_best(p, 6, &plan, NULL) == high);
    // the waves, as the router makes them: each check sends what may go
    // now; the peers it sent are ready where they went at the next
    int at[6], waves = 0;
    memcpy(at, from, sizeof at);
    for (;;) {
        int now[6];
        memcpy(now, to, sizeof now);
        for (int i = 0; i < 6; i++)
            p[i].stage = at[i];
        int waiting = swarm_policy_wave(p, 6, &plan, now);
        ck_assert_int_ge(waiting, 0);
        int started = 0, ready[3] = { 0 }, left[3] = { 0 };
        for (int i = 0; i < 6; i++) {
            ready[at[i]]++;
            if (now[i] != at[i])
                started++, left[at[i]]++, at[i] = now[i];
        }
        ck_assert_int_gt(started, 0);
        for (int s = 0; s < 3; s++) // every stage keeps a ready replica
            ck_assert_int_gt(ready[s] - left[s], 0);
        if (waves++ == 0)
            ck_assert_int_eq(at[0], 0); // the fast one waits for its stand-in
        if (waiting == 0)
            break;
    }
    ck_assert_int_eq(waves, 3);
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(at[i], to[i]);
    // each wave after the first waits a check's interval, priced as a
    // fetch (the whole bound for its time): two of 150 s eat the horizon
    for (int i = 0; i < 6; i++)
        p[i].stage = from[i];
    plan.wave_s = 150.0;
    int keep[6];
    ck_assert_int_eq(s_plan(p, 6, &plan, keep, &low, &high), 0);
    plan.wave_s = 5.0;
    ck_assert_int_eq(s_plan(p, 6, &plan, keep, &low, &high), 4);
    // held where it is, the fast one gives nothing to plan: the gain is in
    // moving a stage's only replica
    for (int i = 0; i < 6; i++)
        p[i].stage = from[i];
    p[0].moved_at = 95.0;
    ck_assert_int_eq(s_plan(p, 6, &plan, to, &low, &high), 0);
    ck_assert(high == 13000.0);
}
END_TEST

// A stage whose leavers must keep one of them until its stand-in comes
// keeps its heaviest meanwhile: the lightest go first. (It kept the one
// that came last by index: scripts/bench-hetero.sh's stage of four kept
// its slowest, a sixth of its speed, through two steps 3-5 times as long.)
START_TEST(test_plan_waves_keep_the_heaviest)
{
    const double cost[3] = { 1.0, 1.0, 1.0 };
    swarm_plan_t plan = { .stages = 3, .cost = cost, .now = 100.0, .hold = 30.0, .margin = 0.05,
                          .horizon = 300.0 };
    // the fast peer to stage 1, stage 1's to stage 2, stage 2's four to
    // stage 0: stage 2 keeps one of its own until stage 1's comes, which
    // waits for the fast one's stand-ins on stage 0
    for (int heavy = 2; heavy < 6; heavy++) {
        swarm_peer_view_t p[6] = {
            s_view(0, 1, 0, 20), s_view(1, 1, 0, 10), s_view(2, 1, 0, 2),
            s_view(2, 1, 0, 4), s_view(2, 1, 0, 3), s_view(2, 1, 0, 2),
        };
        p[heavy].tok_s = 8;
        for (int i = 0; i < 6; i++)
            p[i].moved_at = -1e30;
        int to[6] = { 1, 2, 0, 0, 0, 0 };
        ck_assert_int_eq(swarm_policy_wave(p, 6, &plan, to), 3);
        for (int i = 2; i < 6; i++) // the heaviest stays, the other three go now
            ck_assert_int_eq(to[i], i == heavy ? 2 : 0);
        ck_assert_int_eq(to[0], 0); // (the fast one and stage 1's wait their turns)
        ck_assert_int_eq(to[1], 1);
    }
}
END_TEST

// Whether the moves from where the peers are to `at` can be made in
// waves (swarm.h): a move starts while its stage keeps, ready without it,
// two of the peers ready there when they are three or more, else one, or
// all that `at` leaves it when that is fewer; a moved peer is ready where
// it went once its wave is through.
static int s_waves_reach(const swarm_peer_view_t *p, int n, int S, const int *at)
{
    int ready[4] = { 0 }, left[4] = { 0 }, keep[4], gone[10] = { 0 }, moves = 0;
    for (int i = 0; i < n; i++)
        ready[p[i].stage]++, left[at[i]]++, moves += at[i] != p[i].stage;
    for (int s = 0; s < S; s++) {
        keep[s] = ready[s] > 2 ? 2 : 1;
        keep[s] = left[s] < keep[s] ? left[s] : keep[s];
    }
    while (moves > 0) {
        int come[4] = { 0 }, went = 0;
        for (int i = 0; i < n; i++) {
            int f = p[i].stage;
            if (gone[i] || at[i] == f || ready[f] - 1 < keep[f])
                continue;
            ready[f]--, come[at[i]]++, gone[i] = 1, went++;
        }
        if (!went)
            return 0;
        for (int s = 0; s < S; s++)
            ready[s] += come[s];
        moves -= went;
    }
    return 1;
}

// Every assignment of n peers to S stages (each stage someone; each peer
// one it holds; with `keep`, held peers where they are and the moves
// made in waves, s_waves_reach): the best bound, by exhaustive search. Peer i goes to each stage in turn with the
// stage sums carried along; a branch is cut only when even every peer
// still to place added to a stage cannot lift that stage above the best
// bound found, so the answer is the enumeration's.
typedef struct {
    const swarm_peer_view_t *p;
    const swarm_plan_t *plan;
    int n, keep, count[4], at[10];
    double T[4], left[4][11], best; // left[s][i]: what peers i.. could add to s
} brute_t;

static void s_brute_at(brute_t *b, int i)
{
    int S = b->plan->stages;
    for (int s = 0; s < S; s++)
        if (b->T[s] + b->left[s][i] <= b->best)
            return;
    if (i == b->n) {
        double low = INFINITY, audit = 0.0;
        for (int s = 0; s < S; s++) {
            if (b->count[s] == 0)
                return;
            low = b->T[s] < low ? b->T[s] : low;
            double u[10];
            int k = 0;
            for (int j = 0; j < b->n; j++)
                if (b->at[j] == s)
                    u[k++] = b->p[j].tok_s * b->plan->cost[b->p[j].stage] / b->plan->cost[s];
            audit = fmax(audit, swarm_policy_audit_s(u, k));
        }
        // with audits, a step's mean time: a fraction `audit` of the steps
        // wait for the slowest stage's audit too
        if (b->plan->audit > 0.0)
            low = 1.0 / (1.0 / low + b->plan->audit * audit);
        if (low > b->best && (!b->keep || s_waves_reach(b->p, b->n, S, b->at)))
            b->best = low;
        return;
    }
    const swarm_peer_view_t *v = &b->p[i];
    double w = v->tok_s * b->plan->cost[v->stage];
    for (int s = 0; s < S; s++) {
        if (!swarm_policy_holds(v, b->plan->need, s))
            continue;
        if (b->keep && s != v->stage && b->plan->now - v->moved_at < b->plan->hold)
            continue;
        b->T[s] += w / b->plan->cost[s], b->count[s]++, b->at[i] = s;
        s_brute_at(b, i + 1);
        b->T[s] -= w / b->plan->cost[s], b->count[s]--;
    }
}

static double s_brute(const swarm_peer_view_t *p, int n, const swarm_plan_t *plan, int keep)
{
    brute_t b = { .p = p, .plan = plan, .n = n, .keep = keep, .best = 0.0 };
    for (int s = 0; s < plan->stages; s++) {
        b.left[s][n] = 0.0;
        for (int i = n - 1; i >= 0; i--)
            b.left[s][i] = b.left[s][i + 1]
                           + (swarm_policy_holds(&p[i], plan->need, s)
                                  ? p[i].tok_s * plan->cost[p[i].stage] / plan->cost[s]
                                  : 0.0);
    }
    s_brute_at(&b, 0);
    return b.best;
}

START_TEST(test_plan_equals_brute_force_up_to_10_peers_and_4_stages)
{
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    double cost[4], need[4];
    int cases = 0, planned = 0;
    for (int round = 0; round < 400; round++) {
        int S = 2 + (int) (swarm_splitmix64(&rng) % 3);
        int n = S + (int) (swarm_splitmix64(&rng) % (11 - S));
        swarm_peer_view_t p[10];
        for (int s = 0; s < S; s++) {
            cost[s] = 1.0 + (double) (swarm_splitmix64(&rng) % 3);
            need[s] = (double) (1 + swarm_splitmix64(&rng) % 4) * 100e6;
        }
        for (int i = 0; i < n; i++) {
            // a volunteer mix: CPUs of 1-4 units, one in five a GPU of 20-50
            int gpu = swarm_splitmix64(&rng) % 5 == 0;
            double speed = gpu ? 20 + (double) (swarm_splitmix64(&rng) % 31)
                               : 1 + (double) (swarm_splitmix64(&rng) % 4);
            int stage = i < S ? i : (int) (swarm_splitmix64(&rng) % S);
            p[i] = s_view(stage, 1, 0, speed / cost[stage]);
            p[i].moved_at = swarm_splitmix64(&rng) % 6 == 0 ? 95.0 : -1e30;
            // some can hold only the smaller stages (but their own)
            p[i].memory = swarm_splitmix64(&rng) % 3 == 0 ? need[stage] + 1.0 : 0.0;
        }
        // every other round an open swarm's: audits weighed
        swarm_plan_t plan = { .stages = S, .cost = cost, .need = need, .now = 100.0,
                              .hold = 30.0, .margin = 0.0, .horizon = 300.0,
                              .audit = round % 2 ? 0.3 : 0.0 };
        double best = swarm_policy_best(p, n, &plan, NULL), brute = s_brute(p, n, &plan, 0);
        ck_assert_msg(best >= 0.98 * brute && best <= brute * (1 + 1e-9),
                      "round %d: best %g, brute force %g", round, best, brute);
        int to[10];
        double low, high;
        int moves = swarm_policy_plan(p, n, &plan, to, &low, &high);
        double reach = s_brute(p, n, &plan, 1);
        ck_assert_msg(high >= 0.98 * reach && high <= reach * (1 + 1e-9),
                      "round %d: plan %g, brute force %g", round, high, reach);
        if (moves > 0) {
            ck_assert(swarm_policy_bound(p, n, &plan, to) == high);
            int wave[10];
            memcpy(wave, to, sizeof wave);
            ck_assert_int_ge(swarm_policy_wave(p, n, &plan, wave), 0);
            ck_assert(s_waves_reach(p, n, S, to));
            for (int i = 0; i < n; i++)
                ck_assert(to[i] == p[i].stage || (swarm_policy_holds(&p[i], need, to[i])
                                                  && !(100.0 - p[i].moved_at < 30.0)));
            planned++;
        } else {
            ck_assert(high <= low * (1 + 1e-9));
        }
        cases++;
    }
    ck_assert_int_eq(cases, 400);
    ck_assert_int_gt(planned, 100); // most random starts have a better split
}
END_TEST

// A stage's audit, worked by hand (seconds a token; the step itself takes
// 1 / the summed speed): two even replicas recompute each other's half in
// the step's own time; a fast replica beside a slow one waits for the
// slow one to redo its two thirds; beside two slow ones, they split it
// when that is 1.25 times sooner than the faster of them alone.
START_TEST(test_audit_time_is_the_largest_share_by_the_first_to_finish_it)
{
    double one[1] = { 5.0 }, two[2] = { 1.0, 1.0 }, uneven[2] = { 0.25, 0.5 };
    double three[3] = { 0.125, 0.25, 0.25 }, tail[3] = { 0.0625, 0.5, 0.125 };
    ck_assert(swarm_policy_audit_s(one, 1) == 0.0);  // none to audit it
    ck_assert(fabs(swarm_policy_audit_s(two, 2) - 0.5) < 1e-12);
    // 2/3 of the stage's token on the one of 0.25; 1/3 on the one of 0.5
    ck_assert(fabs(swarm_policy_audit_s(uneven, 2) - (2.0 / 3.0) / 0.25) < 1e-12);
    // shares 0.4, 0.4, 0.2: each 0.4 on the other 0.25 (1.6 s), then the
    // 0.125's own 0.2 after one of them (1.6 + 0.8)
    ck_assert(fabs(swarm_policy_audit_s(three, 3) - 2.4) < 1e-12);
    // shares 8/11, 2/11, 1/11 of 0.6875: the largest split between the
    // 0.125 and the 0.0625 (3.9 s; 5.8 s by the 0.125 alone); the 0.4s
    // above are not (1.1 s split is not 1.25 times sooner than the stage's
    // step, 1.6 s)
    ck_assert(fabs(swarm_policy_audit_s(tail, 3) - (0.5 / 0.6875) / (0.125 + 0.0625)) < 1e-12);
    // equal replicas' shares go round, each recomputing one: three take a
    // share's time, 1/3 (2/3 when the third share waited for one of the
    // first two), and five 1/5
    double equal[5] = { 1.0, 1.0, 1.0, 1.0, 1.0 };
    ck_assert(fabs(swarm_policy_audit_s(equal, 3) - 1.0 / 3.0) < 1e-12);
    ck_assert(fabs(swarm_policy_audit_s(equal, 5) - 1.0 / 5.0) < 1e-12);
    // shares 1, 1, 0.7 of 2.7: a 1's by the other 1 (0.370); the other's
    // by the 0.7 (0.529), sooner than by the first 1 before the 0.7's
    // share (0.370 + 0.259), which the first 1 then takes
    double slower[3] = { 1.0, 1.0, 0.7 };
    ck_assert(fabs(swarm_policy_audit_s(slower, 3) - (1.0 / 2.7) / 0.7) < 1e-12);
    // shares 1, 1, 0.2 of 2.2: the 0.2 would take 2.27 for a 1's share,
    // the first 1 0.545 for that and the 0.2's share: round as before
    double slow[3] = { 1.0, 1.0, 0.2 };
    ck_assert(fabs(swarm_policy_audit_s(slow, 3) - 1.2 / 2.2) < 1e-12);
}
END_TEST

// scripts/bench-hetero.sh's six nodes (speeds 1, 1, 1/2, 1/4, 1/4, 1/8 of
// a stage of cost 1; stages of costs 1, 2, 1). The best bound, 0.6875,
// leaves stage 2 of 1/2 and 1/4, and stage 1 the other fast one with
// 1/4 and 1/8: audited, a step waits 3.9 s a token for the slow ones to
// redo the fast one's share between them (5.8 s for the faster of them
// alone), and 0.3 of the steps make 0.382 tokens a second of it. With
// audits weighed, the plan leaves the fast one of stage 1 alone there and
// puts the four slower ones on stage 2: a bound of 0.5, but 3/7 audited
// (by hand: stage 2's 1/2, 1/4, 1/4, 1/8 redo the 1/2's share, 4/9 of a
// token, split among the other three in 0.711 s; the 1/2 redoes a 1/4's
// share in 0.444 s and the other's by 0.889 s, and the 1/8's in 1.111 s:
// 1 / (2 + 0.3 * 10 / 9)). Without audits it keeps the best bound.
START_TEST(test_plan_weighs_audits_in_an_open_swarm)
{
    double cost[3] = { 1.0, 2.0, 1.0 };
    // where the best bound puts them (tok_s on their own stage)
    swarm_peer_view_t p[6] = {
        s_view(0, 1, 0, 1.0), s_view(1, 1, 0, 0.5), s_view(2, 1, 0, 0.5),
        s_view(1, 1, 0, 0.125), s_view(2, 1, 0, 0.25), s_view(1, 1, 0, 0.0625),
    };
    for (int i = 0; i < 6; i++)
        p[i].moved_at = -1e30;
    swarm_plan_t plan = { .stages = 3, .cost = cost, .now = 100.0, .hold = 30.0, .margin = 0.05,
                          .horizon = 300.0 };
    int to[6];
    double low, high;
    ck_assert_int_eq(swarm_policy_plan(p, 6, &plan, to, &low, &high), 0);
    ck_assert(fabs(low - 0.6875) < 1e-12 && fabs(swarm_policy_best(p, 6, &plan, NULL) - 0.6875) < 1e-12);
    plan.audit = 0.3;
    double audited = 1.0 / (1.0 / 0.6875 + 0.3 * (0.5 / 0.6875) / (0.125 + 0.0625));
    ck_assert(fabs(swarm_policy_bound(p, 6, &plan, NULL) - audited) < 1e-12);
    int moves = swarm_policy_plan(p, 6, &plan, to, &low, &high);
    ck_assert_int_gt(moves, 0);
    ck_assert(fabs(low - audited) < 1e-12);
    ck_assert_msg(fabs(high - 3.0 / 7.0) < 1e-12, "high %g", high);
    ck_assert(swarm_policy_bound(p, 6, &plan, to) == high);
    // the fast ones alone on stages 0 and 1; the four slower ones together
    ck_assert_int_ne(to[0], to[1]);
    ck_assert_int_ne(to[0], to[2]);
    ck_assert_int_ne(to[1], to[2]);
    ck_assert_int_eq(to[2], to[3]);
    ck_assert_int_eq(to[3], to[4]);
    ck_assert_int_eq(to[4], to[5]);
    plan.audit = 0.0;
    ck_assert(fabs(swarm_policy_bound(p, 6, &plan, to) - 0.5) < 1e-12);
}
END_TEST

// Past the exact search (14 peers): a GPU of 100 tok/s and 13 CPUs of 10
// over two stages of one cost. The best bound, 110, leaves the GPU beside
// one CPU, which redoes its share (10/11 of a token) in 0.091 s, ten
// times the stage's step: 0.3 of the steps audited, a step's mean time
// makes 27.5 tokens a second. The repair moves CPUs beside the GPU until
// that is highest, within 2% of the best of the splits that keep two
// replicas a stage (a lone GPU would not be audited, which no plan
// chooses), and well above the bound's split.
START_TEST(test_plan_repairs_the_longest_audit_past_the_exact_search)
{
    enum { N = 14 };
    double cost[2] = { 1.0, 1.0 };
    swarm_peer_view_t p[N];
    for (int i = 0; i < N; i++) {
        p[i] = s_view(i == 0 || i == 1 ? 0 : 1, 1, 0, i == 0 ? 100.0 : 10.0);
        p[i].moved_at = -1e30;
    }
    swarm_plan_t plan = { .stages = 2, .cost = cost, .now = 100.0, .hold = 30.0, .margin = 0.05,
                          .horizon = 300.0 };
    int at[N];
    double bound = swarm_policy_best(p, N, &plan, NULL);
    ck_assert(fabs(bound - 110.0) < 1e-9);
    plan.audit = 0.3;
    double start = swarm_policy_bound(p, N, &plan, NULL);
    ck_assert_msg(fabs(start - 1.0 / (1.0 / 110.0 + 0.3 * (100.0 / 110.0) / 10.0)) < 1e-9,
                  "the GPU beside one CPU: %g", start);
    double repaired = swarm_policy_best(p, N, &plan, at);
    ck_assert(fabs(swarm_policy_bound(p, N, &plan, at) - repaired) < 1e-9);
    int beside = 0;
    for (int i = 1; i < N; i++)
        beside += at[i] == at[0];
    double brute = 0.0;
    for (int mask = 1; mask < (1 << N) - 1; mask++) { // every split of two replicas a stage or more
        int try[N], ones = 0;
        for (int i = 0; i < N; i++)
            ones += try[i] = mask >> i & 1;
        if (ones >= 2 && ones <= N - 2)
            brute = fmax(brute, swarm_policy_bound(p, N, &plan, try));
    }
    ck_assert_msg(repaired >= 0.98 * brute && repaired <= brute * (1.0 + 1e-9),
                  "repaired %g, the best of every split %g (%d CPUs beside the GPU)", repaired,
                  brute, beside);
    ck_assert_msg(beside >= 3 && repaired >= 1.5 * start, "%d CPUs beside the GPU, %g against %g",
                  beside, repaired, start);
}
END_TEST

// A large swarm (the local search, not the exact one): from the worst
// start, every GPU on stage 0, within 2% of the fractional bound (every
// stage exactly its share of the summed speed), which no split beats.
START_TEST(test_plan_near_the_fractional_bound_on_a_large_swarm)
{
    enum { N = 400, S = 8 };
    static swarm_peer_view_t p[N];
    double cost[S], all = 0.0, costs = 0.0;
    uint64_t rng = 7;
    for (int s = 0; s < S; s++)
        cost[s] = s == 3 ? 2.0 : 1.0, costs += cost[s];
    for (int i = 0; i < N; i++) {
        int gpu = i % 10 == 0;
        double speed = gpu ? 20000 + (double) (swarm_splitmix64(&rng) % 30000)
                           : 500 + (double) (swarm_splitmix64(&rng) % 1500);
        int stage = gpu ? 0 : 1 + i % (S - 1);
        p[i] = s_view(stage, 1, 0, speed / cost[stage]);
        all += speed;
    }
    swarm_plan_t plan = { .stages = S, .cost = cost, .now = 0.0, .hold = 30.0, .margin = 0.1,
                          .horizon = 300.0 };
    static int to[N];
    double low, high;
    int moves = s_plan(p, N, &plan, to, &low, &high);
    ck_assert_int_gt(moves, 0);
    ck_assert_msg(high >= 0.98 * all / costs, "plan %g against %g", high, all / costs);
    ck_assert(swarm_policy_bound(p, N, &plan, to) == high);
    double best = swarm_policy_best(p, N, &plan, NULL);
    ck_assert_msg(best >= 0.98 * all / costs, "best %g against %g", best, all / costs);
}
END_TEST

START_TEST(test_pick_fit_binds_forwards_late_and_keeps_a_slow_replica_off_the_tail)
{
    // stage 1: a fast replica (4000 tok/s) and a slow one (1000); a
    // forward and its backward are 128 tokens of work
    swarm_peer_view_t p[3] = { s_view(0, 1, 0, 9000), s_view(1, 1, 0, 4000), s_view(1, 1, 0, 1000) };
    // both idle, 24 to go: the fastest idle one
    ck_assert_int_eq(swarm_policy_pick_fit(p, 3, 1, 128.0, 24), 1);
    // the fast one holds 2 requests: the slow one, idle, is done (0.128 s)
    // long before the stage's end of step (0.666 s) - where the earliest
    // finish would wait for the fast one (0.096 s)
    p[1].backlog = 256.0, p[1].ahead = 0.064, p[1].inflight = 2;
    ck_assert_int_eq(swarm_policy_pick_fit(p, 3, 1, 128.0, 24), 2);
    ck_assert_int_eq(swarm_policy_pick(p, 3, 1, -1, 128.0), 1);
    // both hold 2 requests, both would be done in time: neither queues it
    // behind its work; it waits for the first to run dry
    p[1].backlog = 512.0, p[2].backlog = 128.0, p[2].ahead = 0.128, p[2].inflight = 2;
    ck_assert_int_eq(swarm_policy_pick_fit(p, 3, 1, 128.0, 24), SWARM_HOLD);
    // ... unless the fast one's link is slow against its work: its requests
    // in flight are 0.064 s of work, less than two round trips of 0.05 s
    p[1].rtt = 0.05;
    ck_assert_int_eq(swarm_policy_pick_fit(p, 3, 1, 128.0, 24), 1);
    p[1].rtt = 0.03;
    ck_assert_int_eq(swarm_policy_pick_fit(p, 3, 1, 128.0, 24), SWARM_HOLD);
    p[1].rtt = 0.0;
    // the fast one is down to its last request (and owes backwards): it
    // takes the forward before it runs dry
    p[1].backlog = 384.0, p[1].ahead = 0.032, p[1].inflight = 1, p[2].backlog = 256.0;
    ck_assert_int_eq(swarm_policy_pick_fit(p, 3, 1, 128.0, 24), 1);
    // both down to one: the fewest in flight first, then the fastest
    p[2].inflight = 0;
    ck_assert_int_eq(swarm_policy_pick_fit(p, 3, 1, 128.0, 24), 2);
    p[2].inflight = 1;
    ck_assert_int_eq(swarm_policy_pick_fit(p, 3, 1, 128.0, 24), 1);
    // the last forward of the step: the slow one, idle, would end the step
    // late (0.128 s against 0.051): the earliest finish, the fast one, once
    // it is about to run dry
    p[1].backlog = 128.0, p[1].ahead = 0.032, p[2].backlog = p[2].ahead = 0.0, p[2].inflight = 0;
    ck_assert_int_eq(swarm_policy_pick_fit(p, 3, 1, 128.0, 1), 1);
    p[1].inflight = 2;
    ck_assert_int_eq(swarm_policy_pick_fit(p, 3, 1, 128.0, 1), SWARM_HOLD);
    // a stage's only replica is fed as any replica is: a forward waits
    // while it holds two, so that a replica joining the stage meanwhile
    // can take its share (the first step of 10,000 peers once queued all
    // 1,250 of its forwards at the only replica ready on stage 0, which ran
    // them one after another for 1,620 s while a hundred more got ready)
    p[2].ready = 0;
    ck_assert_int_eq(swarm_policy_pick_fit(p, 3, 1, 128.0, 24), SWARM_HOLD);
    p[1].inflight = 1;
    ck_assert_int_eq(swarm_policy_pick_fit(p, 3, 1, 128.0, 24), 1);
    ck_assert_int_eq(swarm_policy_pick_fit(p, 3, 1, 128.0, 1), 1);
    // no ready replica on the stage
    ck_assert_int_eq(swarm_policy_pick_fit(p, 3, 2, 128.0, 4), -1);
    p[1].ready = p[2].ready = 0;
    ck_assert_int_eq(swarm_policy_pick_fit(p, 3, 1, 128.0, 4), -1);
}
END_TEST

START_TEST(test_refill_fills_each_empty_stage_from_stages_that_can_spare)
{
    const double cost[3] = { 1.0, 1.0, 2.0 };
    // three on stage 0 (one fast), the rest gone: stages 1 and 2 are empty
    swarm_peer_view_t p[4] = {
        s_view(0, 1, 0, 3000), s_view(0, 1, 0, 1000), s_view(0, 1, 0, 800), s_view(1, 0, 0, 0),
    };
    for (int i = 0; i < 4; i++)
        p[i].moved_at = 99.0; // moved a moment ago: a refill does not wait
    // stage 1 first: the fast peer leaves min(1800, 3000), the 1000 one
    // min(3800, 1000); the other empty stage does not count
    ck_assert_int_eq(swarm_policy_refill(p, 4, 3, cost, NULL, 1), 0);
    p[0].stage = 1, p[0].ready = 0; // on its way (joining): not a donor
    // stage 2 costs twice as much: 1000 there is 500 (leaving 800), 800 is
    // 400 (leaving 1000)
    ck_assert_int_eq(swarm_policy_refill(p, 4, 3, cost, NULL, 2), 1);
    p[1].stage = 2, p[1].ready = 0;
    // stage 0 has one replica left: nobody can spare one
    p[0].ready = 1;
    ck_assert_int_eq(swarm_policy_refill(p, 4, 3, cost, NULL, 2), -1);
    // bad arguments
    ck_assert_int_eq(swarm_policy_refill(p, 4, 3, cost, NULL, 3), -1);
    ck_assert_int_eq(swarm_policy_refill(p, 4, 3, cost, NULL, -1), -1);
    ck_assert_int_eq(swarm_policy_refill(p, 4, 1, cost, NULL, 0), -1);
}
END_TEST

// Some assignment of k replicas of every stage of need[S] to nodes of
// mem[n] (0: any), one stage a node, by trying every one (n <= 6);
// placed[] counts each stage's replicas so far.
static int s_cut_brute(const double *need, int S, int k, const double *mem, int n, int *used,
                       int *placed)
{
    int s = 0;
    while (s < S && placed[s] == k)
        s++;
    if (s == S)
        return 1;
    for (int i = 0; i < n; i++) {
        if (used[i] || (mem[i] > 0.0 && mem[i] < need[s]))
            continue;
        used[i] = 1, placed[s]++;
        int ok = s_cut_brute(need, S, k, mem, n, used, placed);
        used[i] = 0, placed[s]--;
        if (ok)
            return 1;
    }
    return 0;
}

// The needs and costs of a cut into S stages of a model of 8 units of
// state and a unit of work a token: S equal stages, the first a unit of
// state more (its embedding). Its layers are *ctx (NULL: 4).
static int s_cut_need(void *ctx, int S, double *need, double *cost)
{
    if (S > (ctx ? *(const int *) ctx : 4))
        return -1;
    for (int s = 0; s < S; s++) {
        need[s] = 8.0 / S + (s == 0);
        cost[s] = 1.0 / S;
    }
    return 0;
}

START_TEST(test_cut_fits_exactly_when_some_assignment_does)
{
    // 37 and 36 MiB stages on 40, 40, 24, 24: the two large nodes
    double need[2] = { 36.6, 36.9 }, mem[4] = { 24, 40, 24, 40 };
    int to[6], used[6] = { 0 };
    ck_assert_int_eq(swarm_policy_cut_fits(need, 2, 1, mem, 4, to), 1);
    ck_assert_int_eq(to[0], -1);
    ck_assert_int_eq(to[2], -1);
    ck_assert_int_eq(to[1] + to[3], 1); // one each
    // one large node: no cut into 2; into 3 (35.4, 20.6, 20.3) it fits
    mem[3] = 24;
    ck_assert_int_eq(swarm_policy_cut_fits(need, 2, 1, mem, 4, to), 0);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(to[i], -1);
    double three[3] = { 20.3, 35.4, 20.6 };
    ck_assert_int_eq(swarm_policy_cut_fits(three, 3, 1, mem, 4, to), 1);
    ck_assert_int_eq(to[1], 1);
    // a node of unknown budget holds any stage; more stages than nodes never fit
    double any[2] = { 0, 40 };
    ck_assert_int_eq(swarm_policy_cut_fits(need, 2, 1, any, 2, to), 1);
    ck_assert_int_eq(to[0], 1);
    ck_assert_int_eq(swarm_policy_cut_fits(three, 3, 1, any, 2, to), 0);
    ck_assert_int_eq(swarm_policy_cut_fits(three, 0, 1, any, 2, to), 0);
    // against every assignment: 2000 random cuts of up to 5 stages on up to
    // 6 nodes, one replica a stage or two
    uint64_t rng = 7;
    int fits = 0, placed[5] = { 0 };
    for (int c = 0; c < 2000; c++) {
        int S = 1 + (int) (swarm_splitmix64(&rng) % 5), n = 1 + (int) (swarm_splitmix64(&rng) % 6);
        int k = 1 + (int) (swarm_splitmix64(&rng) % 2);
        double ns[5], ms[6];
        for (int s = 0; s < S; s++)
            ns[s] = (double) (1 + swarm_splitmix64(&rng) % 8);
        for (int i = 0; i < n; i++)
            ms[i] = (double) (swarm_splitmix64(&rng) % 9); // 0: any
        int got = swarm_policy_cut_fits(ns, S, k, ms, n, to);
        int want = s_cut_brute(ns, S, k, ms, n, used, placed);
        ck_assert_msg(got == want, "case %d: %d stages x %d on %d nodes: %d, every assignment "
                      "says %d", c, S, k, n, got, want);
        fits += got;
        for (int s = 0; got && s < S; s++) { // each stage on one node that holds it
            int on = 0;
            for (int i = 0; i < n; i++)
                if (to[i] == s) {
                    ck_assert(ms[i] == 0.0 || ms[i] >= ns[s]);
                    on++;
                }
            ck_assert_int_eq(on, k);
        }
    }
    ck_assert(fits > 200 && fits < 1800); // both answers are tested
}
END_TEST

START_TEST(test_cut_choice_weighs_bounds_then_spares_then_fewer_stages)
{
    // a model of 8 (stages of 9, 5+4, 3.7+2.7+2.7, 3+2+2+2) on nodes of
    // equal speed: a node of 10 holds it whole (bound 1), but with three of
    // 5 the swarm takes 2 stages of two replicas each (bound 4), not 4 of
    // one each (bound 4 too)
    double mem[5] = { 10, 5, 5, 5, 5 }, one[5] = { 1, 1, 1, 1, 1 };
    int to[5], replicas;
    ck_assert_int_eq(swarm_policy_cut_choose(4, mem, one, 4, s_cut_need, NULL, &replicas, to, NULL), 2);
    ck_assert_int_eq(replicas, 2);
    ck_assert_int_eq(to[0] + to[1] + to[2] + to[3], 2); // two on each
    // three nodes: no cut holds two of each; 3 stages of one (bound 3) over
    // 2 (bound 2) or the whole model on the node of 10 (1)
    double b[SWARM_MAX_STAGES];
    ck_assert_int_eq(swarm_policy_cut_choose(4, mem, one, 3, s_cut_need, NULL, &replicas, to, b), 3);
    ck_assert_int_eq(replicas, 1);
    ck_assert(fabs(b[0] - 1) < 1e-9 && fabs(b[1] - 2) < 1e-9 && fabs(b[2] - 3) < 1e-9);
    ck_assert(b[3] == -1 && b[SWARM_MAX_STAGES - 1] == -1); // (more stages than nodes)
    ck_assert_int_eq(to[0], 0); // the largest stage on the largest node
    // ... unless the node of 10 is 8 times as fast: whole on it (bound 8),
    // for a split of 2 stages reaches 4 and of 3 reaches 3
    double fast[3] = { 8, 1, 1 };
    ck_assert_int_eq(swarm_policy_cut_choose(4, mem, fast, 3, s_cut_need, NULL, &replicas, to, NULL), 1);
    ck_assert_int_eq(replicas, 1);
    ck_assert_int_eq(to[0], 0);
    ck_assert_int_eq(to[1] + to[2], -2); // the other two hold no stage of it
    // five equal nodes of 5, a model of 8 layers: 5 stages of one (bound 5)
    // over 2 of two replicas (4: 20% less) ...
    int eight = 8;
    double five[5] = { 5, 5, 5, 5, 5 }, tilt[5] = { 1, 1, 1, 1, 1.3 };
    ck_assert_int_eq(swarm_policy_cut_choose(8, five, one, 5, s_cut_need, &eight, &replicas, to, NULL), 5);
    ck_assert_int_eq(replicas, 1);
    // ... but with one 1.3 times as fast, 2 of two replicas (4.6) are within
    // 10% of 5 stages of one (5): the spare wins
    ck_assert_int_eq(swarm_policy_cut_choose(8, five, tilt, 5, s_cut_need, &eight, &replicas, to, b),
                     2);
    ck_assert(b[0] == -1 && fabs(b[1] - 4.6) < 1e-9 && fabs(b[4] - 5) < 1e-9);
    ck_assert_int_eq(replicas, 2);
    // four of 3: 4 stages of one each (2 of two needs 5 a node)
    double small[4] = { 3, 3, 3, 3 };
    ck_assert_int_eq(swarm_policy_cut_choose(4, small, one, 4, s_cut_need, NULL, &replicas, to, NULL), 4);
    ck_assert_int_eq(replicas, 1);
    // two of 3: nothing fits; the cut of more stages than the model has is never asked
    ck_assert_int_eq(swarm_policy_cut_choose(8, small, one, 2, s_cut_need, NULL, &replicas, to, NULL), -1);
    ck_assert_int_eq(replicas, 0);
    ck_assert_int_eq(swarm_policy_cut_choose(8, small, one, 4, s_cut_need, NULL, &replicas, to, NULL), 4);
    // speeds unknown (0) count alike
    double unknown[4] = { 0, 0, 0, 0 };
    ck_assert_int_eq(swarm_policy_cut_choose(4, mem, unknown, 4, s_cut_need, NULL, &replicas, to, NULL),
                     2);
    ck_assert_int_eq(replicas, 2);
}
END_TEST

// ---- log limits ----

START_TEST(test_loglimit_one_sender_gets_a_burst_then_a_line_a_second_and_a_count)
{
    swarm_loglimit_t l = {0};
    char note[96];
    int64_t t = 5000;
    int passed = 0;
    for (int i = 0; i < 1000; i++) // a flood within one millisecond
        passed += swarm_loglimit_pass(&l, "keyA", t, note, sizeof note);
    ck_assert_int_eq(passed, 5);
    ck_assert_int_eq(swarm_loglimit_pass(&l, "keyA", t + 999, note, sizeof note), 0);
    ck_assert_int_eq(swarm_loglimit_pass(&l, "keyA", t + 1000, note, sizeof note), 1);
    ck_assert_str_eq(note, " (996 similar lines not shown)");
    // one line a second over a minute of flood
    passed = 0;
    for (int64_t ms = t + 1001; ms < t + 61000; ms += 1)
        passed += swarm_loglimit_pass(&l, "keyA", ms, note, sizeof note);
    ck_assert_int_ge(passed, 59);
    ck_assert_int_le(passed, 61);
    // a quiet sender gets its burst back, with nothing held
    ck_assert_int_eq(swarm_loglimit_pass(&l, "keyA", t + 200000, note, sizeof note), 1);
    ck_assert_int_eq(swarm_loglimit_pass(&l, "keyA", t + 200000, note, sizeof note), 1);
    ck_assert_str_eq(note, "");
}
END_TEST

START_TEST(test_loglimit_many_senders_share_ten_lines_a_second)
{
    swarm_loglimit_t l = {0};
    char note[96], key[16];
    int passed = 0;
    for (int i = 0; i < 1000; i++) { // 1000 fresh keys at once (an open swarm's strangers)
        snprintf(key, sizeof key, "k%d", i);
        passed += swarm_loglimit_pass(&l, key, 1000, note, sizeof note);
    }
    ck_assert_int_eq(passed, 20);
    passed = 0;
    for (int64_t ms = 1000; ms < 11000; ms += 10) { // 10 s of a flood from 1000 keys
        snprintf(key, sizeof key, "k%d", (int) (ms % 1000));
        passed += swarm_loglimit_pass(&l, key, ms, note, sizeof note);
    }
    ck_assert_int_le(passed, 101);
    // the forgotten senders' lines are still counted in a later note
    ck_assert_int_eq(swarm_loglimit_pass(&l, "late", 100000, note, sizeof note), 1);
    ck_assert_msg(strstr(note, "similar lines not shown"), "%s", note);
    // time that goes backwards and an empty key change nothing
    ck_assert_int_eq(swarm_loglimit_pass(&l, "", 50, note, sizeof note), 1);
    ck_assert_int_eq(swarm_loglimit_pass(&l, NULL, 50, NULL, 0), 1);
}
END_TEST

static swarm_window_in_t s_window_in(int stages, int G, double rtt, double work)
{
    swarm_window_in_t in = { .stages = stages, .micro_batches = G, .rtt = rtt };
    for (int s = 0; s < stages; s++)
        in.work[s] = work, in.replicas[s] = 1;
    return in;
}

START_TEST(test_window_is_the_whole_step_until_every_stage_is_measured)
{
    swarm_window_in_t in = s_window_in(2, 6, 0.001, 0.010);
    in.work[1] = 0.0;
    ck_assert_int_eq(swarm_policy_window(&in), 6);
    in.work[1] = 0.010;
    in.replicas[1] = 0;
    ck_assert_int_eq(swarm_policy_window(&in), 6);
}
END_TEST

START_TEST(test_window_covers_the_round_trips_at_the_bottleneck_pace)
{
    // loopback: 2 stages of 10 ms, 1 ms round trips: a micro-batch takes
    // 20 + 3 x 1 = 23 ms, one finishes every 10 ms: 3 in flight, 1 spare
    swarm_window_in_t in = s_window_in(2, 6, 0.001, 0.010);
    ck_assert_int_eq(swarm_policy_window(&in), 4);
    // 100 ms round trips: 20 + 300 ms a micro-batch: 32 + 1, within G = 48
    in = s_window_in(2, 48, 0.100, 0.010);
    ck_assert_int_eq(swarm_policy_window(&in), 33);
    // but never more than the step has
    in.micro_batches = 6;
    ck_assert_int_eq(swarm_policy_window(&in), 6);
    // a second replica of the slow stage halves its beat: twice as many
    in = s_window_in(2, 100, 0.100, 0.010);
    in.work[0] = 0.020;
    in.replicas[0] = 2;
    ck_assert_int_eq(swarm_policy_window(&in), 34); // beat max(10, 10) ms, cycle 330 ms
    in.replicas[0] = 1;
    ck_assert_int_eq(swarm_policy_window(&in), 18); // beat 20 ms: ceil(16.5) + 1
    // uneven replicas of 5 and 40 ms (mean 22.5) finish one every
    // 1 / (1/5 + 1/40) = 4.44 ms together, not 22.5 / 2: the 10 ms stage
    // is the bottleneck and the window is that of one 10 ms beat
    in.work[0] = 0.0225;
    in.replicas[0] = 2;
    in.pace[0] = 1.0 / (1.0 / 0.005 + 1.0 / 0.040);
    ck_assert_int_eq(swarm_policy_window(&in), 35); // ceil((22.5 + 10 + 300) / 10) + 1
    // unknown pace: the mean over the replicas, 22.5 / 2 = 11.25 ms the beat
    in.pace[0] = 0.0;
    ck_assert_int_eq(swarm_policy_window(&in), 31); // ceil(332.5 / 11.25) + 1
}
END_TEST

START_TEST(test_window_all_is_the_whole_step_within_the_caches)
{
    // measured stages whose Little's-law window is 4 of 48 (2 stages of
    // 10 ms, 1 ms round trips): --window all keeps every micro-batch out
    swarm_window_in_t in = s_window_in(2, 48, 0.001, 0.010);
    ck_assert_int_eq(swarm_policy_window(&in), 4);
    in.all = 1;
    ck_assert_int_eq(swarm_policy_window(&in), 48);
    // unmeasured or measured, only the caches of stages 0..S-2 bound it
    in.work[1] = 0.0;
    ck_assert_int_eq(swarm_policy_window(&in), 48);
    in.slots[0] = 20;
    ck_assert_int_eq(swarm_policy_window(&in), 20);
    in.slots[1] = 5; // the last stage caches nothing
    ck_assert_int_eq(swarm_policy_window(&in), 20);
}
END_TEST

START_TEST(test_window_is_bounded_by_the_activation_caches_but_not_below_one)
{
    swarm_window_in_t in = s_window_in(3, 48, 0.100, 0.010);
    ck_assert_int_eq(swarm_policy_window(&in), 48); // 30 + 500 ms / 10 ms + 1 = 54
    in.slots[1] = 12;
    ck_assert_int_eq(swarm_policy_window(&in), 12);
    in.slots[0] = 7;
    ck_assert_int_eq(swarm_policy_window(&in), 7);
    // the last stage runs its backward at once and caches nothing
    in.slots[0] = in.slots[1] = 0;
    in.slots[2] = 1;
    ck_assert_int_eq(swarm_policy_window(&in), 48);
    in.slots[0] = 1;
    ck_assert_int_eq(swarm_policy_window(&in), 1);
    in.micro_batches = 0;
    ck_assert_int_eq(swarm_policy_window(&in), 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("swarm");
    TCase *tc = tcase_create("splitmix64");
    tcase_add_test(tc, test_splitmix64_matches_reference_values_from_seed_1337);
    tcase_add_test(tc, test_splitmix64_state_wraps_modulo_2_to_the_64);
    suite_add_tcase(s, tc);
    tc = tcase_create("train_batch");
    tcase_add_test(tc, test_train_batch_equals_one_sequential_stream);
    tcase_add_test(tc, test_train_batch_pieces_make_up_the_whole_step);
    tcase_add_test(tc, test_train_batch_y_is_x_shifted_by_one_byte);
    tcase_add_test(tc, test_train_batch_starts_match_reference_for_seed_1337);
    tcase_add_test(tc, test_train_batch_windows_reach_both_ends_of_the_train_split_only);
    suite_add_tcase(s, tc);
    tc = tcase_create("draw");
    tcase_add_test(tc, test_draw_eval_streams_match_reference_and_run_on);
    tcase_add_test(tc, test_draw_val_windows_reach_both_ends_of_the_val_split_only);
    suite_add_tcase(s, tc);
    tc = tcase_create("split");
    tcase_add_test(tc, test_split_sizes_for_tinyshakespeare_length_are_1003854_and_111540);
    tcase_add_test(tc, test_split_is_python_int_of_0_9_n);
    suite_add_tcase(s, tc);
    tc = tcase_create("check");
    tcase_add_test(tc, test_check_rejects_empty_data_naming_it);
    tcase_add_test(tc, test_check_rejects_data_too_small_for_the_block_naming_it);
    tcase_add_test(tc, test_check_accepts_the_smallest_data_that_fits);
    suite_add_tcase(s, tc);
    tc = tcase_create("load");
    tcase_add_test(tc, test_load_missing_file_returns_enoent_naming_the_path);
    tcase_add_test(tc, test_load_directory_is_an_error_naming_the_path);
    tcase_add_test(tc, test_load_reads_every_byte_of_a_file_exactly);
    tcase_add_test(tc, test_load_empty_file_succeeds_and_check_rejects_it);
    tcase_add_test(tc, test_destroy_accepts_null);
    suite_add_tcase(s, tc);
    tc = tcase_create("policy");
    tcase_add_test(tc, test_pick_prefers_earliest_projected_finish);
    tcase_add_test(tc, test_pick_balances_finish_times_of_uneven_replicas);
    tcase_add_test(tc, test_pick_keeps_backward_on_the_forward_peer_when_close);
    tcase_add_test(tc, test_pick_by_speed_answers_as_reading_every_row);
    tcase_add_test(tc, test_assign_fills_the_weakest_stage);
    tcase_add_test(tc, test_assign_even_counts_peers_not_speeds);
    tcase_add_test(tc, test_assign_and_moves_keep_to_each_peers_memory);
    tcase_add_test(tc, test_plan_moves_only_when_it_pays);
    tcase_add_test(tc, test_plan_counts_stage_cost);
    tcase_add_test(tc, test_plan_swaps_and_moves_several_where_one_move_cannot);
    tcase_add_test(tc, test_plan_moves_a_stages_only_replica_in_waves);
    tcase_add_test(tc, test_plan_waves_keep_the_heaviest);
    tcase_add_test(tc, test_plan_equals_brute_force_up_to_10_peers_and_4_stages);
    tcase_add_test(tc, test_plan_near_the_fractional_bound_on_a_large_swarm);
    tcase_add_test(tc, test_audit_time_is_the_largest_share_by_the_first_to_finish_it);
    tcase_add_test(tc, test_plan_weighs_audits_in_an_open_swarm);
    tcase_add_test(tc, test_plan_repairs_the_longest_audit_past_the_exact_search);
    tcase_add_test(tc, test_refill_fills_each_empty_stage_from_stages_that_can_spare);
    tcase_add_test(tc, test_cut_fits_exactly_when_some_assignment_does);
    tcase_add_test(tc, test_cut_choice_weighs_bounds_then_spares_then_fewer_stages);
    tcase_add_test(tc, test_pick_fit_binds_forwards_late_and_keeps_a_slow_replica_off_the_tail);
    suite_add_tcase(s, tc);
    tc = tcase_create("loglimit");
    tcase_add_test(tc, test_loglimit_one_sender_gets_a_burst_then_a_line_a_second_and_a_count);
    tcase_add_test(tc, test_loglimit_many_senders_share_ten_lines_a_second);
    suite_add_tcase(s, tc);
    tc = tcase_create("window");
    tcase_add_test(tc, test_window_is_the_whole_step_until_every_stage_is_measured);
    tcase_add_test(tc, test_window_covers_the_round_trips_at_the_bottleneck_pace);
    tcase_add_test(tc, test_window_all_is_the_whole_step_within_the_caches);
    tcase_add_test(tc, test_window_is_bounded_by_the_activation_caches_but_not_below_one);
    suite_add_tcase(s, tc);
    tc = tcase_create("reference");
    tcase_add_test(tc, test_tinyshakespeare_first_batch_matches_ref_gpt);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
