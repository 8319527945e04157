/* check_decode.c - the engine's message decoder (swarm/engine_decode.c):
 * every meta field the engine reads, valid values decoded exactly and each
 * kind of bad one (missing, not a number, NaN or infinite, out of range,
 * too long, a checksum one digit short or not hex, control codes) giving
 * the outcome its rule in engine_decode.c says. What the engine does with
 * an outcome is its handlers' (the sim and the process tests hold those).
 */
#include "engine_int.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define HEX64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// Decode a message of `type` with meta text `meta` (NULL: none) into *e;
// the message is gone after, so only e's fields may be read.
static void s_decode(int type, const char *meta, msg_in_t *e)
{
    net_msg_t *m = net_msg_new(type);
    ck_assert_ptr_nonnull(m);
    if (meta)
        ck_assert_int_eq(net_msg_set_meta(m, meta), 0);
    engine_msg_decode(m, e);
    net_msg_destroy(&m);
    e->msg = NULL;
    e->head = NULL;
}

// "key=" followed by n copies of c and then tail.
static char *s_long(char *buf, size_t cap, const char *key, size_t n, char c, const char *tail)
{
    size_t k = (size_t) snprintf(buf, cap, "%s=", key);
    ck_assert_uint_lt(k + n + strlen(tail), cap);
    memset(buf + k, c, n);
    snprintf(buf + k + n, cap - k - n, "%s", tail);
    return buf;
}

// ---- HELLO ----------------------------------------------------------------

START_TEST(test_decode_reads_a_nodes_hello_exactly)
{
    msg_in_t e;
    s_decode(NET_MSG_HELLO, "proto=1\nname=node1\ndevice=cpu: 1 thread, OpenBLAS\nthreads=1\n"
             "memory=16777216\ntok_s=18000.5", &e);
    ck_assert_int_eq(e.hello.proto_ok, 1);
    ck_assert_str_eq(e.hello.proto, "1");
    ck_assert_str_eq(e.hello.name, "node1");
    ck_assert_str_eq(e.hello.device, "cpu: 1 thread, OpenBLAS");
    ck_assert_int_eq(e.hello.has_tok_s, 1);
    ck_assert(e.hello.tok_s == 18000.5);
    s_decode(NET_MSG_HELLO, "proto=1\ntok_s=0x1p10\nname=first\nname=second", &e);
    ck_assert(e.hello.tok_s == 1024.0); // strtod's numbers; the first line of a key wins
    ck_assert_str_eq(e.hello.name, "first");
}
END_TEST

START_TEST(test_decode_refuses_a_hello_of_another_protocol)
{
    static const struct { const char *meta, *proto; } cases[] = {
        { "name=x", "" }, { "proto=", "" }, { "proto=0", "0" }, { "proto=2", "2" },
        { "proto= 1", " 1" }, { "proto=1x", "1x" }, { "proto=1111111111111111", "" },
        { "proto=\033[2J\033[31mred", "?[2J?[31mred" }, { "proto=\"1\"", "?1?" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        msg_in_t e;
        s_decode(NET_MSG_HELLO, cases[i].meta, &e);
        ck_assert_msg(!e.hello.proto_ok, "%s", cases[i].meta);
        ck_assert_str_eq(e.hello.proto, cases[i].proto);
    }
    msg_in_t e;
    s_decode(NET_MSG_HELLO, "proto=111111111111111", &e); // 15 chars: kept
    ck_assert_str_eq(e.hello.proto, "111111111111111");
}
END_TEST

START_TEST(test_decode_hello_name_and_device_fall_back_and_are_sanitized)
{
    msg_in_t e;
    s_decode(NET_MSG_HELLO, "proto=1", &e);
    ck_assert_str_eq(e.hello.name, "?");
    ck_assert_str_eq(e.hello.device, "?");
    s_decode(NET_MSG_HELLO, "name=\ndevice=", &e);
    ck_assert_str_eq(e.hello.name, "");
    ck_assert_str_eq(e.hello.device, "");
    s_decode(NET_MSG_HELLO, "name=a\033[31m\"b\\\a\ndevice=\xc3\xa9t\xe9", &e);
    ck_assert_str_eq(e.hello.name, "a?[31m?b??");
    ck_assert_str_eq(e.hello.device, "??t?");
    char meta[512], name[64];
    s_decode(NET_MSG_HELLO, s_long(meta, sizeof meta, "name", 63, 'n', ""), &e);
    memset(name, 'n', 63);
    name[63] = '\0';
    ck_assert_str_eq(e.hello.name, name);
    s_decode(NET_MSG_HELLO, s_long(meta, sizeof meta, "name", 64, 'n', ""), &e);
    ck_assert_str_eq(e.hello.name, "?");
    s_decode(NET_MSG_HELLO, s_long(meta, sizeof meta, "device", 127, 'd', ""), &e);
    ck_assert_uint_eq(strlen(e.hello.device), 127);
    s_decode(NET_MSG_HELLO, s_long(meta, sizeof meta, "device", 128, 'd', ""), &e);
    ck_assert_str_eq(e.hello.device, "?");
}
END_TEST

START_TEST(test_decode_hello_speed_must_be_a_number_in_range)
{
    static const char *bad[] = {
        "proto=1", "tok_s=", "tok_s=abc", "tok_s=1000abc", "tok_s=0", "tok_s=-5",
        "tok_s=nan", "tok_s=inf", "tok_s=1e12", "tok_s=1e400",
    };
    msg_in_t e;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        s_decode(NET_MSG_HELLO, bad[i], &e);
        ck_assert_msg(!e.hello.has_tok_s, "%s", bad[i]);
        ck_assert(e.hello.tok_s == 0.0);
    }
    s_decode(NET_MSG_HELLO, "tok_s= 999999999999", &e); // leading blanks, as strtod
    ck_assert(e.hello.has_tok_s && e.hello.tok_s == 999999999999.0);
    char meta[64];
    s_decode(NET_MSG_HELLO, s_long(meta, sizeof meta, "tok_s", 30, '0', "1"), &e);
    ck_assert(e.hello.has_tok_s && e.hello.tok_s == 1.0); // a number of 31 chars
    s_decode(NET_MSG_HELLO, s_long(meta, sizeof meta, "tok_s", 31, '0', "1"), &e);
    ck_assert(!e.hello.has_tok_s); // 32: absent
}
END_TEST

// ---- HEARTBEAT ------------------------------------------------------------

START_TEST(test_decode_reads_a_nodes_heartbeat_exactly)
{
    msg_in_t e;
    s_decode(NET_MSG_HEARTBEAT, "stage=1\nqueue=3\ntok_s=1234.5\nstep=17\nslots=8", &e);
    ck_assert_int_eq(e.heartbeat.has_queue, 1);
    ck_assert_int_eq(e.heartbeat.queue, 3);
    ck_assert_int_eq(e.heartbeat.has_tok_s, 1);
    ck_assert(e.heartbeat.tok_s == 1234.5);
    ck_assert_int_eq(e.heartbeat.has_slots, 1);
    ck_assert_int_eq(e.heartbeat.slots, 8);
    s_decode(NET_MSG_HEARTBEAT, "queue=999999\ntok_s=0\nslots=0", &e);
    ck_assert_int_eq(e.heartbeat.queue, 999999);
    ck_assert(e.heartbeat.tok_s == 0.0);
    ck_assert_int_eq(e.heartbeat.slots, 0);
}
END_TEST

START_TEST(test_decode_heartbeat_bad_fields_read_as_unknown_absent_ones_as_absent)
{
    msg_in_t e;
    s_decode(NET_MSG_HEARTBEAT, NULL, &e); // the router's own probe, echoed: nothing said
    ck_assert(!e.heartbeat.has_queue && !e.heartbeat.has_tok_s && !e.heartbeat.has_slots);
    static const char *values[] = {
        "", "abc", "5x", "-1", "1e3", "nan", "inf", "99999999999999999999",
    };
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        char meta[128];
        snprintf(meta, sizeof meta, "queue=%s\ntok_s=%s\nslots=%s", values[i], values[i], values[i]);
        s_decode(NET_MSG_HEARTBEAT, meta, &e);
        ck_assert_msg(e.heartbeat.has_queue && e.heartbeat.has_tok_s && e.heartbeat.has_slots,
                      "%s", meta);
        ck_assert_msg(e.heartbeat.queue == 0, "%s", meta);
        ck_assert_msg(e.heartbeat.slots == -1, "%s", meta);
        // 1e3 and 99999999999999999999 are speeds, in range or not
        double want = !strcmp(values[i], "1e3") ? 1000.0 : 0.0;
        ck_assert_msg(e.heartbeat.tok_s == want, "%s", meta);
    }
    s_decode(NET_MSG_HEARTBEAT, "queue=1000000\ntok_s=1e12\nslots=2147483648", &e);
    ck_assert(e.heartbeat.queue == 0 && e.heartbeat.tok_s == 0.0 && e.heartbeat.slots == -1);
    s_decode(NET_MSG_HEARTBEAT, "tok_s=-0.5\nslots=2147483647", &e);
    ck_assert(e.heartbeat.tok_s == 0.0 && e.heartbeat.slots == 2147483647);
    char meta[128];
    s_decode(NET_MSG_HEARTBEAT, s_long(meta, sizeof meta, "queue", 32, '0', ""), &e);
    ck_assert_int_eq(e.heartbeat.has_queue, 0); // longer than a number's 31 chars: absent
    s_decode(NET_MSG_HEARTBEAT, s_long(meta, sizeof meta, "slots", 30, '0', "7"), &e);
    ck_assert(e.heartbeat.has_slots && e.heartbeat.slots == 7);
}
END_TEST

// ---- replies --------------------------------------------------------------

START_TEST(test_decode_reads_a_results_fields_exactly)
{
    msg_in_t e;
    s_decode(NET_MSG_RESULT, "loss=4.60517025\nheld=0.250000\nbusy=0.125000", &e);
    ck_assert_int_eq(e.reply.has_loss, 1);
    ck_assert(e.reply.loss == strtof("4.60517025", NULL)); // fp32, as strtof reads it
    ck_assert_int_eq(e.reply.has_timing, 1);
    ck_assert(e.reply.held == 0.25 && e.reply.busy == 0.125);
    ck_assert(!e.reply.has_checksum && !e.reply.has_sumsq);
    s_decode(NET_MSG_GRAD, "samples=4\nsumsq=0x1.8p+3\nchecksum=" HEX64, &e);
    ck_assert(e.reply.has_sumsq && e.reply.sumsq == 12.0);
    ck_assert(e.reply.has_checksum);
    ck_assert_str_eq(e.reply.checksum, HEX64);
    ck_assert(!e.reply.has_loss && isnan(e.reply.loss));
    s_decode(NET_MSG_RESULT, "loss=0\nsumsq=-0", &e);
    ck_assert(e.reply.has_loss && e.reply.loss == 0.0f && e.reply.has_sumsq);
}
END_TEST

START_TEST(test_decode_refuses_a_loss_that_is_not_a_finite_number_ge_0)
{
    static const char *bad[] = {
        "held=1", "loss=", "loss=abc", "loss=1.5x", "loss=-0.1", "loss=nan", "loss=inf",
        "loss=-inf", "loss=1e39", // beyond fp32
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        msg_in_t e;
        s_decode(NET_MSG_RESULT, bad[i], &e);
        ck_assert_msg(!e.reply.has_loss, "%s", bad[i]);
        ck_assert_msg(isnan(e.reply.loss), "%s", bad[i]);
    }
    msg_in_t e;
    char meta[128];
    s_decode(NET_MSG_RESULT, s_long(meta, sizeof meta, "loss", 62, '0', "3"), &e);
    ck_assert(e.reply.has_loss && e.reply.loss == 3.0f); // 63 chars
    s_decode(NET_MSG_RESULT, s_long(meta, sizeof meta, "loss", 63, '0', "3"), &e);
    ck_assert(!e.reply.has_loss); // 64: absent
}
END_TEST

START_TEST(test_decode_checksum_is_64_lowercase_hex_digits)
{
    static const char *bad[] = {
        "loss=1", "checksum=", "checksum=" HEX64 "0", "checksum= " HEX64,
        "checksum=0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
        "checksum=0123456789abcdeg0123456789abcdef0123456789abcdef0123456789abcdef",
        "checksum=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde",
        "checksum=" HEX64 HEX64,
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        msg_in_t e;
        s_decode(NET_MSG_RESULT, bad[i], &e);
        ck_assert_msg(!e.reply.has_checksum, "%s", bad[i]);
        ck_assert_str_eq(e.reply.checksum, "");
    }
}
END_TEST

START_TEST(test_decode_sumsq_must_be_a_finite_number_ge_0)
{
    static const char *bad[] = {
        "checksum=" HEX64, "sumsq=", "sumsq=abc", "sumsq=0x1p3z", "sumsq=-1", "sumsq=nan",
        "sumsq=inf", "sumsq=1e400",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        msg_in_t e;
        s_decode(NET_MSG_GRAD, bad[i], &e);
        ck_assert_msg(!e.reply.has_sumsq, "%s", bad[i]);
    }
    msg_in_t e;
    char meta[256];
    s_decode(NET_MSG_GRAD, s_long(meta, sizeof meta, "sumsq", 126, '0', "5"), &e);
    ck_assert(e.reply.has_sumsq && e.reply.sumsq == 5.0); // 127 chars
    s_decode(NET_MSG_GRAD, s_long(meta, sizeof meta, "sumsq", 127, '0', "5"), &e);
    ck_assert(!e.reply.has_sumsq); // 128: absent
}
END_TEST

START_TEST(test_decode_samples_must_be_a_whole_number_ge_0)
{
    static const char *bad[] = {
        "sumsq=1", "samples=", "samples=abc", "samples=3x", "samples=-1", "samples=1.5",
        "samples=99999999999",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        msg_in_t e;
        s_decode(NET_MSG_GRAD, bad[i], &e);
        ck_assert_msg(!e.reply.has_samples && e.reply.samples == 0, "%s", bad[i]);
    }
    msg_in_t e;
    s_decode(NET_MSG_GRAD, "samples=0", &e);
    ck_assert(e.reply.has_samples && e.reply.samples == 0);
    s_decode(NET_MSG_GRAD, "sumsq=2\nsamples=12", &e);
    ck_assert(e.reply.has_samples && e.reply.samples == 12);
}
END_TEST

START_TEST(test_decode_timing_needs_both_held_and_busy_in_range)
{
    static const char *bad[] = {
        "held=0.5", "busy=0.5", "held=0.5\nbusy=", "held=abc\nbusy=0.5", "held=-1\nbusy=0.5",
        "held=0.5\nbusy=1e6", "held=1e6\nbusy=0.5", "held=nan\nbusy=0.5", "held=0.5\nbusy=inf",
        "held=0.5\nbusy=0.25s",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        msg_in_t e;
        s_decode(NET_MSG_RESULT, bad[i], &e);
        ck_assert_msg(!e.reply.has_timing, "%s", bad[i]);
        ck_assert(e.reply.held == 0.0 && e.reply.busy == 0.0);
    }
    msg_in_t e;
    s_decode(NET_MSG_RESULT, "held=0\nbusy=999999.9", &e);
    ck_assert(e.reply.has_timing && e.reply.held == 0.0 && e.reply.busy == 999999.9);
}
END_TEST

START_TEST(test_decode_error_reason_is_sanitized_or_none_given)
{
    msg_in_t e;
    s_decode(NET_MSG_ERROR, "reason=step 3 is not this node's step 4\nfatal=1", &e);
    ck_assert_str_eq(e.reply.reason, "step 3 is not this node's step 4");
    s_decode(NET_MSG_ERROR, NULL, &e);
    ck_assert_str_eq(e.reply.reason, "no reason given");
    s_decode(NET_MSG_ERROR, "reason=\033[2J\"x\"", &e);
    ck_assert_str_eq(e.reply.reason, "?[2J?x?");
    char meta[256];
    s_decode(NET_MSG_ERROR, s_long(meta, sizeof meta, "reason", 127, 'r', ""), &e);
    ck_assert_uint_eq(strlen(e.reply.reason), 127);
    s_decode(NET_MSG_ERROR, s_long(meta, sizeof meta, "reason", 128, 'r', ""), &e);
    ck_assert_str_eq(e.reply.reason, "no reason given");
}
END_TEST

START_TEST(test_decode_keeps_the_message_for_its_header_and_tensors)
{
    net_msg_t *m = net_msg_new(NET_MSG_RESULT);
    net_head_t *h = net_msg_head(m);
    h->flags = NET_FLAG_REPLY;
    h->id = 77;
    h->step = 5;
    float x[3] = { 1, 2, 3 }, y[3];
    uint32_t dims[1] = { 3 };
    ck_assert_int_eq(net_msg_add_tensor(m, NET_DTYPE_F32, dims, 1, x), 0);
    ck_assert_int_eq(net_msg_set_meta(m, "loss=2"), 0);
    msg_in_t e;
    engine_msg_decode(m, &e);
    ck_assert_ptr_eq(e.msg, m);
    ck_assert(e.head->type == NET_MSG_RESULT && e.head->id == 77 && e.head->step == 5);
    ck_assert(e.head->flags & NET_FLAG_REPLY);
    ck_assert_int_eq(net_tensor_get(e.msg, 0, y, 3), 0);
    ck_assert(y[2] == 3.0f && e.reply.loss == 2.0f);
    net_msg_destroy(&m);
}
END_TEST

static Suite *s_suite(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("decode");
    tcase_add_test(tc, test_decode_reads_a_nodes_hello_exactly);
    tcase_add_test(tc, test_decode_refuses_a_hello_of_another_protocol);
    tcase_add_test(tc, test_decode_hello_name_and_device_fall_back_and_are_sanitized);
    tcase_add_test(tc, test_decode_hello_speed_must_be_a_number_in_range);
    tcase_add_test(tc, test_decode_reads_a_nodes_heartbeat_exactly);
    tcase_add_test(tc, test_decode_heartbeat_bad_fields_read_as_unknown_absent_ones_as_absent);
    tcase_add_test(tc, test_decode_reads_a_results_fields_exactly);
    tcase_add_test(tc, test_decode_refuses_a_loss_that_is_not_a_finite_number_ge_0);
    tcase_add_test(tc, test_decode_checksum_is_64_lowercase_hex_digits);
    tcase_add_test(tc, test_decode_sumsq_must_be_a_finite_number_ge_0);
    tcase_add_test(tc, test_decode_samples_must_be_a_whole_number_ge_0);
    tcase_add_test(tc, test_decode_timing_needs_both_held_and_busy_in_range);
    tcase_add_test(tc, test_decode_error_reason_is_sanitized_or_none_given);
    tcase_add_test(tc, test_decode_keeps_the_message_for_its_header_and_tensors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(s_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
