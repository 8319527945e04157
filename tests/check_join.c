/* check_join.c - what a volunteer meets first: the join line the router
 * prints and `swarm node --join` reads (node/join.c), and a node's identity
 * (node/identity.c): each process on a machine its own key, claimed while
 * it runs, made atomically when many start at once.
 *
 * Everything runs in a temporary folder given as XDG_CONFIG_HOME; the
 * identity tests fork real processes, since a claim is per process.
 */
#include "net.h"
#include "node.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

// ---- the join line ---------------------------------------------------------

// The lines node_join_print writes for a router bound at `bound`.
static char *s_print(const char *bound, const char *z85)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_ptr_nonnull(f);
    node_join_print(f, bound, z85);
    fclose(f);
    return text;
}

// The first "swarm node --join ARG" of text: ARG, owned.
static char *s_first_join(const char *text, const char *scheme)
{
    char pattern[64];
    snprintf(pattern, sizeof pattern, "--join %s", scheme);
    const char *at = strstr(text, pattern);
    ck_assert_msg(at, "no '%s' in:\n%s", pattern, text);
    at += strlen("--join ");
    size_t len = strcspn(at, " \n");
    char *arg = strndup(at, len);
    ck_assert_ptr_nonnull(arg);
    return arg;
}

START_TEST(test_join_token_carries_address_and_key)
{
    char pub[41], sec[41];
    ck_assert_int_eq(zmq_curve_keypair(pub, sec), 0);
    char *text = s_print("tcp://127.0.0.1:7070", pub);
    char *token = s_first_join(text, "swarm://");
    // only characters no shell treats specially: it pastes as it is
    ck_assert_uint_eq(strspn(token, "swarm:/.0123456789abcdef"), strlen(token));
    node_join_t j;
    char err[512] = "";
    ck_assert_msg(node_join_parse(token, &j, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(j.endpoint, "tcp://127.0.0.1:7070");
    ck_assert_str_eq(j.router_key, pub);
    // the key apart is single-quoted, and Z85 has no single quote
    char quoted[64];
    snprintf(quoted, sizeof quoted, "--router-key '%s'\n", pub);
    ck_assert_msg(strstr(text, quoted), "%s", text);
    ck_assert_ptr_null(strchr(pub, '\''));
    free(token);
    free(text);
}
END_TEST

// Every join line of text is the command alone, so that the whole line
// pastes: a note after the token ("   (this machine only)") once made bash
// fail on the parenthesis.
static void s_lines_are_commands(const char *text)
{
    for (const char *l = strstr(text, "--join swarm://"); l; l = strstr(l + 1, "--join swarm://")) {
        size_t line = strcspn(l, "\n");
        ck_assert_msg(strcspn(l + strlen("--join "), " \n") + strlen("--join ") == line,
                      "more than the command on its line:\n%s", text);
    }
}

START_TEST(test_join_line_names_reachable_addresses)
{
    char pub[41], sec[41];
    ck_assert_int_eq(zmq_curve_keypair(pub, sec), 0);
    // bound to loopback: loopback only, marked as such
    char *text = s_print("tcp://127.0.0.1:40123", pub);
    ck_assert_msg(strstr(text, "swarm://127.0.0.1:40123/"), "%s", text);
    ck_assert_msg(strstr(text, "from this machine only: the router listens on loopback"), "%s", text);
    ck_assert_ptr_null(strstr(text, "0.0.0.0"));
    s_lines_are_commands(text);
    free(text);
    // bound to every interface: never 0.0.0.0, which nobody can connect to
    text = s_print("tcp://0.0.0.0:7070", pub);
    ck_assert_msg(!strstr(text, "0.0.0.0"), "%s", text);
    ck_assert_msg(strstr(text, "swarm://127.0.0.1:7070/"), "%s", text);
    char *tcp = s_first_join(text, "tcp://");
    ck_assert_str_ne(tcp, "tcp://0.0.0.0:7070");
    s_lines_are_commands(text);
    free(tcp);
    free(text);
    // a named host as it is
    text = s_print("tcp://10.1.2.3:7070", pub);
    ck_assert_msg(strstr(text, "swarm://10.1.2.3:7070/"), "%s", text);
    ck_assert_ptr_null(strstr(text, "this machine"));
    free(text);
}
END_TEST

START_TEST(test_join_parse_takes_tcp_and_refuses_garbage)
{
    node_join_t j;
    char err[512] = "";
    ck_assert_int_eq(node_join_parse("tcp://host.example:7070", &j, err, sizeof err), 0);
    ck_assert_str_eq(j.endpoint, "tcp://host.example:7070");
    ck_assert_str_eq(j.router_key, "");
    static const struct {
        const char *arg, *why; // what the line must name besides the value
    } bad[] = {
        { "host:7070", "expected swarm://HOST:PORT/KEY" },
        { "tcp://host", "no :PORT" },
        { "tcp://:7070", "no :PORT" },
        { "tcp://host:0", "port" },
        { "tcp://host:70x", "port" },
        { "tcp://host:123456", "port" },
        { "tcp://0.0.0.0:7070", "router machine's address" },
        { "tcp://*:7070", "router machine's address" },
        { "swarm://host:7070", "no /KEY" },
        { "swarm://host:7070/abc", "64 hex digits" },
        { "swarm://host:7070/zz00000000000000000000000000000000000000000000000000000000000000",
          "64 hex digits" },
        { "tcp://ho st:7070", "space" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        ck_assert_int_eq(node_join_parse(bad[i].arg, &j, err, sizeof err), -EINVAL);
        ck_assert_msg(strstr(err, bad[i].arg) && strstr(err, bad[i].why) && !strchr(err, '\n'),
                      "%s: %s", bad[i].arg, err);
    }
}
END_TEST

// ---- identities --------------------------------------------------------------

static char s_dir[256];

static void s_dir_setup(void)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/check_join.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(s_dir));
    setenv("XDG_CONFIG_HOME", s_dir, 1);
}

static void s_dir_teardown(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    ck_assert_int_eq(system(cmd), 0);
}

// In n child processes started together (released by one pipe), each
// claims an identity and writes "NAME KEY" to its own pipe; each holds
// its claim until the parent closes `hold`. Returns the children's lines.
enum { CLAIMS = 6 };

static void s_claim_child(int go, int out, int hold)
{
    char c;
    if (read(go, &c, 1) != 0) // EOF: everyone starts at once
        _exit(2);
    node_identity_t id;
    char err[512] = "", line[5000];
    int rc = node_identity_open(NULL, &id, err, sizeof err);
    int len = rc == 0 ? snprintf(line, sizeof line, "%s %s\n", id.name, net_key_public(id.key))
                      : snprintf(line, sizeof line, "ERROR %s\n", err);
    if (write(out, line, (size_t) len) != len)
        _exit(3);
    close(out);
    while (read(hold, &c, 1) > 0) {
    }
    node_identity_close(&id);
    _exit(rc == 0 ? 0 : 1);
}

START_TEST(test_identity_each_process_its_own_key)
{
    int go[2], hold[2], out[CLAIMS][2];
    pid_t pid[CLAIMS];
    ck_assert_int_eq(pipe(go), 0);
    ck_assert_int_eq(pipe(hold), 0);
    for (int i = 0; i < CLAIMS; i++) {
        ck_assert_int_eq(pipe(out[i]), 0);
        pid[i] = fork();
        ck_assert_int_ge(pid[i], 0);
        if (pid[i] == 0) {
            close(go[1]);
            close(hold[1]);
            s_claim_child(go[0], out[i][1], hold[0]);
        }
        close(out[i][1]);
    }
    close(go[0]);
    close(hold[0]);
    close(go[1]); // go: every child opens its identity at the same moment
    char names[CLAIMS][4096], keys[CLAIMS][41];
    for (int i = 0; i < CLAIMS; i++) {
        char line[5000] = "";
        ssize_t got = 0, n;
        while ((n = read(out[i][0], line + got, sizeof line - 1 - (size_t) got)) > 0)
            got += n;
        line[got] = '\0';
        close(out[i][0]);
        ck_assert_msg(sscanf(line, "%4095s %40s", names[i], keys[i]) == 2 && strcmp(names[i], "ERROR"),
                      "child %d: %s", i, line);
    }
    for (int i = 0; i < CLAIMS; i++)
        for (int j = 0; j < i; j++) {
            ck_assert_str_ne(names[i], names[j]);
            ck_assert_str_ne(keys[i], keys[j]);
        }
    close(hold[1]);
    for (int i = 0; i < CLAIMS; i++) {
        int status = 0;
        ck_assert_int_eq(waitpid(pid[i], &status, 0), pid[i]);
        ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    // no temporary file left behind, every pair whole and private
    char cmd[400];
    snprintf(cmd, sizeof cmd, "ls '%s/swarm' | grep -q tmp", s_dir);
    ck_assert_int_ne(system(cmd), 0);
    for (int i = 0; i < CLAIMS; i++) {
        char path[4200];
        struct stat st;
        snprintf(path, sizeof path, "%s.key", names[i]);
        ck_assert_int_eq(stat(path, &st), 0);
        ck_assert_uint_eq(st.st_mode & 077, 0);
    }
    // claims end with their processes: the first name is free again, and
    // the same key comes back (a node restarted keeps its identity)
    node_identity_t id;
    char err[512] = "";
    ck_assert_msg(node_identity_open(NULL, &id, err, sizeof err) == 0, "%s", err);
    int first = -1;
    for (int i = 0; i < CLAIMS; i++)
        if (!strcmp(names[i], id.name))
            first = i;
    ck_assert_int_ge(first, 0);
    ck_assert_str_eq(net_key_public(id.key), keys[first]);
    ck_assert_ptr_nonnull(strstr(id.name, "/swarm/node"));
    ck_assert_int_eq(id.index, 1); // node, the first name, free again
    ck_assert_int_eq(id.made, 0);
    node_identity_close(&id);
}
END_TEST

START_TEST(test_identity_given_key_in_use_is_refused)
{
    char name[300];
    snprintf(name, sizeof name, "%s/mine", s_dir);
    node_identity_t a, b;
    char err[1024] = "";
    ck_assert_msg(node_identity_open(name, &a, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(a.made, 1);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) { // another process: the claim is held
        err[0] = '\0';
        int rc = node_identity_open(name, &b, err, sizeof err);
        char pid[32];
        snprintf(pid, sizeof pid, "pid %ld", (long) getppid());
        _exit(rc == -EBUSY && strstr(err, name) && strstr(err, "in use") && strstr(err, pid)
              && strstr(err, "leave out --key") ? 0 : 1);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(child, &status, 0), child);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the second claim was not refused");
    node_identity_close(&a);
    ck_assert_msg(node_identity_open(name, &b, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(b.made, 0);
    node_identity_close(&b);
}
END_TEST

// A node that has just taken node.lock has not yet written its pid there;
// the file may still hold a pid from a node that ended. A claim at that
// moment names the live holder, never the stale pid (nor pid 0).
START_TEST(test_identity_names_the_live_holder_of_a_fresh_claim)
{
    char dir[300], lock[320];
    snprintf(dir, sizeof dir, "%s/swarm", s_dir);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    snprintf(lock, sizeof lock, "%s/node.lock", dir);
    pid_t gone = fork(); // a pid that was a node once and is no more
    ck_assert_int_ge(gone, 0);
    if (gone == 0)
        _exit(0);
    ck_assert_int_eq(waitpid(gone, NULL, 0), gone);
    FILE *f = fopen(lock, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%ld\n", (long) gone);
    fclose(f);
    int locked[2];
    ck_assert_int_eq(pipe(locked), 0);
    pid_t holder = fork();
    ck_assert_int_ge(holder, 0);
    if (holder == 0) { // takes the lock, says so, writes its pid 50 ms later
        int fd = open(lock, O_RDWR);
        if (fd < 0 || flock(fd, LOCK_EX) != 0 || write(locked[1], "x", 1) != 1)
            _exit(1);
        usleep(50000);
        char text[32];
        int len = snprintf(text, sizeof text, "%ld\n", (long) getpid());
        if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t) len, 0) != len)
            _exit(1);
        pause();
        _exit(0);
    }
    close(locked[1]);
    char c;
    ck_assert_int_eq(read(locked[0], &c, 1), 1);
    close(locked[0]);
    node_identity_t id;
    char err[512] = "", want[64];
    ck_assert_msg(node_identity_open(NULL, &id, err, sizeof err) == 0, "%s", err);
    snprintf(want, sizeof want, "node.key is in use by node pid %ld on this machine", (long) holder);
    ck_assert_int_eq(id.index, 2);
    ck_assert_msg(!strcmp(id.note, want), "the note: '%s', not '%s' (the stale pid was %ld)",
                  id.note, want, (long) gone);
    node_identity_close(&id);
    kill(holder, SIGKILL);
    ck_assert_int_eq(waitpid(holder, NULL, 0), holder);
}
END_TEST

START_TEST(test_identity_bad_key_file_is_named)
{
    char name[300], path[320];
    snprintf(name, sizeof name, "%s/bad", s_dir);
    snprintf(path, sizeof path, "%s.key", name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("this is not a key\n", f);
    fclose(f);
    ck_assert_int_eq(chmod(path, 0600), 0);
    snprintf(path, sizeof path, "%s.pub", name);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("nor this\n", f);
    fclose(f);
    node_identity_t id;
    char err[1024] = "";
    ck_assert_int_eq(node_identity_open(name, &id, err, sizeof err), -EINVAL);
    ck_assert_msg(strstr(err, name) && strstr(err, "Z85") && strstr(err, "regenerate")
                  && !strchr(err, '\n'), "%s", err);
    node_identity_close(&id);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("join");
    TCase *tc = tcase_create("join line");
    tcase_add_test(tc, test_join_token_carries_address_and_key);
    tcase_add_test(tc, test_join_line_names_reachable_addresses);
    tcase_add_test(tc, test_join_parse_takes_tcp_and_refuses_garbage);
    suite_add_tcase(s, tc);
    tc = tcase_create("identity");
    tcase_add_checked_fixture(tc, s_dir_setup, s_dir_teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_identity_each_process_its_own_key);
    tcase_add_test(tc, test_identity_given_key_in_use_is_refused);
    tcase_add_test(tc, test_identity_names_the_live_holder_of_a_fresh_claim);
    tcase_add_test(tc, test_identity_bad_key_file_is_named);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
