/* router.c - `swarm router`: the router engine (swarm/, swarm.h) in its
 * shell. The engine decides everything a swarm does: which node serves
 * which stage, where each micro-batch goes, what is checked, when the swarm
 * rolls back. This file gives it what it may not touch itself: the flags
 * and the model (the plan, the initial weights or a checkpoint, the
 * learning-rate schedule and the clip), the CurveZMQ socket, the clock,
 * the files (loss log, checkpoints on a thread of their own, the plot, the
 * trace) and the terminal.
 *
 * The protocol and its failure handling are docs/swarm.md; the threat
 * model is SECURITY.md. The router does no compute of its own.
 */
#include "router_int.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

// Peers the transport times for silence (a key each; the table grows as
// they come, 56 bytes a slot, at most half full: 7 MB when full), and how
// often it is looked through for the silent ones.
#define ROUTER_TRACKED 65536
#define REAP_MS 100

static volatile sig_atomic_t s_stop;
static volatile sig_atomic_t s_hup;     // SIGHUP: re-read the --allow file

static void s_on_signal(int sig)
{
    if (sig == SIGHUP)
        s_hup = 1;
    else
        s_stop = 1;
}

static double s_secs(void)
{
    return (double) net_clock_ms() / 1000.0;
}

// ---- what the engine does, done here (swarm_engine_io_t) --------------------

static int s_io_send(void *ctx, const net_peer_t *to, net_msg_t **m)
{
    router_t *r = ctx;
    return net_server_send(r->srv, to, m);
}

static void s_io_evaluated(void *ctx, long step, double train, double val)
{
    router_t *r = ctx;
    swarm_engine_summary_t sum;
    swarm_engine_summary(r->engine, &sum);
    if (router_tty())
        fprintf(stderr, "\r\033[K");
    printf("step %5ld | train %.4f | val %.4f | elapsed %.1f s | tok/s %.0f\n", step, train, val,
           s_secs() - r->t_start, sum.tok_s);
    fflush(stdout);
    node_evals_add(&r->evals, step, train, val);
}

static void s_ckpt_write(router_t *r)
{
    char err[512];
    node_ckpt_meta_t meta = {
        .cfg = r->hp.cfg, .step = r->ck_step, .seed = r->hp.seed, .iters = r->hp.iters,
        .warmup = r->hp.warmup, .batch = r->hp.batch, .lr = r->hp.lr, .min_lr = r->hp.min_lr,
        .weight_decay = r->hp.weight_decay, .grad_clip = r->hp.grad_clip,
    };
    if (node_ckpt_save(r->o.save, &meta, r->ck_params, r->ck_m, r->ck_v, err, sizeof err) != 0)
        fprintf(stderr, "swarm router: checkpoint not written: %s\n", err);
    else
        printf("swarm router: checkpoint of step %ld in %s\n", r->ck_step, r->o.save);
    fflush(stdout);
}

static void *s_ckpt_thread(void *arg)
{
    s_ckpt_write(arg);
    return NULL;
}

// The engine's checkpoint of `step` is whole: write it to --save DIR on a
// thread of its own (an atomic write with its fsyncs takes 30-50 ms, a
// stall of every stage if the router waited); signals stay with the main
// thread. Synchronously if no thread.
static void s_io_checkpoint(void *ctx, long step, const float *params, const float *m,
                            const float *v)
{
    router_t *r = ctx;
    r->ck_step = step;
    r->ck_params = params;
    r->ck_m = m;
    r->ck_v = v;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    r->ck_writing = pthread_create(&r->ck_writer, NULL, s_ckpt_thread, r) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!r->ck_writing)
        s_ckpt_write(r);
}

static void s_io_checkpoint_wait(void *ctx)
{
    router_t *r = ctx;
    if (r->ck_writing)
        pthread_join(r->ck_writer, NULL);
    r->ck_writing = 0;
}

// ---- the loop ---------------------------------------------------------------

static int s_allowed(void *ctx, const char *key)
{
    return net_allow_contains(ctx, key);
}

// SIGHUP: re-read --allow FILE. A peer whose key left it is told so and
// dropped (net refuses its messages from now on); a file that cannot be
// read keeps the old list.
static void s_allow_reload(router_t *r)
{
    char err[512];
    s_hup = 0;
    if (!r->allow) {
        fprintf(stderr, "swarm router: SIGHUP: an open swarm has no allow-list to reload\n");
        return;
    }
    if (net_allow_reload(r->allow, r->allow_path, err, sizeof err) != 0) {
        fprintf(stderr, "swarm router: SIGHUP: %s; keeping the allow-list in use (%zu keys)\n",
                err, net_allow_size(r->allow));
        return;
    }
    printf("swarm router: allow-list %s reloaded: %zu keys\n", r->allow_path,
           net_allow_size(r->allow));
    fflush(stdout);
    swarm_engine_drop_unless(r->engine, net_clock_ms(), s_allowed, r->allow);
}

// Messages, lost connections and time to the engine until the run is over
// (or a signal stops it).
static int s_loop(router_t *r)
{
    char err[512];
    while (!s_stop && !swarm_engine_finished(r->engine)) {
        net_peer_t who;
        net_msg_t *m = NULL;
        int rc = net_server_recv(r->srv, net_clock_ms() + 50, &who, &m, err, sizeof err);
        int64_t now = net_clock_ms(); // what follows happens at this time
        if (rc == 0) {
            swarm_engine_message(r->engine, now, &who, m);
            net_msg_destroy(&m);
        } else if (rc == -EPROTO) {
            swarm_engine_bad_message(r->engine, now, who.key, err);
        } else if (rc != -ETIMEDOUT && rc != -EINTR && rc != -EAGAIN) {
            fprintf(stderr, "swarm router: receive failed: %s\n", strerror(-rc));
            return rc;
        }
        if (s_hup)
            s_allow_reload(r);
        // the silent peers, every REAP_MS (a pass over the table, which
        // holds every peer; silence is judged in seconds)
        if (now - r->reaped_at >= REAP_MS || now < r->reaped_at) {
            net_peer_t dead[16];
            size_t n = 0;
            r->reaped_at = now;
            net_server_set_dead_ms(r->srv, swarm_engine_silence_ms(r->engine));
            net_server_reap(r->srv, now, dead, 16, &n);
            for (size_t k = 0; k < n; k++)
                swarm_engine_gone(r->engine, now, &dead[k]);
        }
        swarm_engine_tick(r->engine, now);
    }
    return s_stop ? -EINTR : 0;
}

// ---- set-up -----------------------------------------------------------------

static void s_help(FILE *out)
{
    fprintf(out,
        "usage: swarm router [--stages S|auto] [--listen tcp://*:7070] [--key NAME] [--allow FILE | --open]\n"
        "                    [--min-nodes N] [--window all|auto|W] [--wire F] [--grad-wire F]\n"
        "                    [training flags of swarm train]\n"
        "Run a swarm: nodes join with the line this prints, each serves one stage.\n"
        "  --listen EP     where nodes connect (default tcp://*:7070; port 0 picks a free one)\n"
        "  --key NAME      router key pair NAME.key/NAME.pub (default ~/.config/swarm/router,\n"
        "                  under $XDG_CONFIG_HOME/swarm when that is set; created if missing)\n"
        "  --allow FILE    private swarm: only these public keys (one per line) may join\n"
        "  --open          open swarm: any key may join (the default)\n"
        "  --min-nodes N   wait for N ready nodes before training (default: one per stage;\n"
        "                  with --stages auto, the stages are chosen once N, at least 2, joined)\n"
        "  --window all|auto|W  micro-batches in flight (default all): all, every one\n"
        "                  of the step the nodes' activation caches hold; auto, as many\n"
        "                  as keep every stage busy across the measured round trips\n"
        "                  (Little's law), within the same bounds; W fixes it\n"
        "  --wire F        activations and their gradients between stages as fp32\n"
        "                  (exact), fp16 or int8 (blockwise) (default fp32)\n"
        "  --grad-wire F   replicas' gradient sums as fp32 or fp16 (default fp32)\n"
        "  --assign speed|even  stage for a joining node (default speed): speed, the one\n"
        "                  with the least throughput by the speed nodes report; even, the\n"
        "                  one with the fewest nodes (rebalancing then moves peers by the\n"
        "                  speeds they report)\n"
        "  --rebalance-every SECONDS  every so often, work out the best split of the peers\n"
        "                  over the stages and make the moves (one, a swap, several) when\n"
        "                  they lift the bound by more than 5%% and repay their state\n"
        "                  fetches, two checks in a row, at the speeds of both; in waves,\n"
        "                  a stage's only replica leaving once a newcomer is ready in its\n"
        "                  place; an open swarm of up to 12 peers weighs a split by the\n"
        "                  tok/s a step makes with its audits (default 5; 0 = never)\n"
        "  --router-bandwidth MBIT  what this machine's link carries each way: a\n"
        "                  request's deadline runs from when what the router sent\n"
        "                  before it is through, and a move weighs its state's time\n"
        "                  (default 100)\n"
        "  --tensor-bound K  a peer whose activation or gradient has an RMS above K times\n"
        "                  its stage's median RMS, or below it over K, is banned and\n"
        "                  its work redone (default 100; 0 = check finiteness only)\n"
        "  --verify F      run a fraction F of forwards again on a second replica and\n"
        "                  compare; a third decides a disagreement and the peer it\n"
        "                  contradicts is expelled (default 0.05; 0 = never)\n"
        "  --audit F       in a fraction F of the steps, drawn with a key no peer knows,\n"
        "                  have every replica's gradient sum (at stages with two\n"
        "                  replicas or more) recomputed, with its input gradients, by\n"
        "                  another replica; a third decides a disagreement and the liar\n"
        "                  is expelled (default 0.3 in an open swarm, 0 with --allow;\n"
        "                  0 = never)\n"
        "  --audit-proven F  the same for a replica whose sums passed 5 audits in a row\n"
        "                  since it joined (default: a tenth of --audit; 1 with --audit 1)\n"
        "  --trace FILE    write a line per request sent and answered and per step to\n"
        "                  FILE, for scripts/trace-steps.sh (where a step's time goes)\n"
        "training flags (as swarm train, but without --stages, or with --stages auto, the router\n"
        "cuts the model for the nodes that join, by their memory and speed; and without\n"
        "--micro-batch it chooses it from --batch, --block and the stages; its start-up lines\n"
        "say what it chose):\n");
    node_train_help(out);
}

// The router's key pair: --key NAME, or one kept in the user's config folder.
static int s_load_key(router_t *r, char *err, size_t n)
{
    char path[PATH_MAX];
    if (r->key_name)
        return net_key_load(r->key_name, &r->key, err, n);
    if (net_key_dir(path, sizeof path) != 0)
        snprintf(path, sizeof path, "./.config/swarm"); // neither XDG_CONFIG_HOME nor HOME
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", path);
    *strrchr(parent, '/') = '\0';
    mkdir(parent, 0700);
    mkdir(path, 0700);
    strncat(path, "/router", sizeof path - strlen(path) - 1);
    if (net_key_load(path, &r->key, err, n) == 0)
        return 0;
    int rc = net_key_generate(&r->key);
    if (rc == 0)
        rc = net_key_save(r->key, path, 0, err, n);
    if (rc == 0)
        printf("swarm router: created a key pair in %s.key / %s.pub\n", path, path);
    return rc;
}

// The rest of the start-up line when the router chose the micro-batch
// (s_micro_choose): why, and what the pipeline's fill and drain cost.
static void s_micro_why(const router_t *r, double idle)
{
    int S = r->plan.stages, G = r->hp.batch / r->hp.micro;
    if (S == 1 && G == 1)
        printf(" (chosen: the whole batch, as swarm train: one stage has no pipeline to fill; "
               "--micro-batch sets it)\n");
    else if (S == 1)
        printf(" (chosen: %d a step, so that each of the stage's replicas has its share; "
               "--micro-batch sets it)\n", G);
    else if (idle <= MICRO_IDLE)
        printf(" (chosen: %d a step over %d stages keeps the pipeline's fill and drain to ~%.0f%% "
               "of a step; --micro-batch sets it)\n", G, S, 100.0 * idle);
    else
        printf(" (chosen: %d a step over %d stages, the most of %d tokens or more; the pipeline's "
               "fill and drain take ~%.0f%% of a step, a larger --batch shrinks that: %d windows "
               "keep it to %.0f%%; --micro-batch sets it)\n", G, S, MICRO_MIN_TOKENS, 100.0 * idle,
               router_batch_for(r->hp.micro, S), 100.0 * MICRO_IDLE);
}

// An open swarm audits gradient sums (SECURITY.md): said at start, with
// what it costs, since a user's own machines in an open swarm pay it too.
static void s_audits_say(const router_t *r)
{
    if (r->allow || !(r->c.audit > 0.0))
        return;
    printf("swarm router: any key may join an open swarm, so in %.0f%% of the steps, drawn in "
           "secret, another replica recomputes each gradient sum of a stage of two or more "
           "replicas (--audit %g), and the step waits for it; for a replica whose sums passed %d "
           "audits in a row, in %.0f%% of them (--audit-proven %g); a swarm of your own "
           "machines: --allow FILE (private: no audits)\n", 100.0 * r->c.audit, r->c.audit,
           SWARM_AUDIT_PROVEN, 100.0 * r->c.audit_proven, r->c.audit_proven);
}

// The most a node's message may carry: the largest stage's state (its
// parameters and both moments, fp32: a STATE_GET's answer, the largest a
// node sends) or a micro-batch's activations, whichever is more. With
// --stages auto nothing is cut yet, and one stage may be the whole model
// at the whole batch. The transport drops a larger frame unread.
static uint64_t s_frame_cap(const router_t *r)
{
    size_t most = 0, micro = (size_t) (r->auto_stages ? r->hp.batch : r->hp.micro);
    for (int s = 0; s < r->c.stages; s++)
        most = r->c.stage_n[s] > most ? r->c.stage_n[s] : most;
    if (r->auto_stages)
        most = r->c.nparams;
    uint64_t state = 3 * (uint64_t) most * sizeof(float);
    uint64_t acts = (uint64_t) micro * (size_t) r->hp.cfg.T * (size_t) r->hp.cfg.C * sizeof(float);
    uint64_t cap = (state > acts ? state : acts) + 4096;
    return cap < NET_PAYLOAD_MAX ? cap : NET_PAYLOAD_MAX;
}

static int s_listen(router_t *r, char *err, size_t n)
{
    int rc = s_load_key(r, err, n);
    if (rc != 0)
        return rc;
    if (r->allow_path) {
        r->allow = net_allow_new();
        rc = net_allow_load(r->allow, r->allow_path, err, n);
        if (rc != 0)
            return rc;
    }
    net_server_config_t cfg = {
        .endpoint = r->listen, .key = r->key, .allow = r->allow,
        .limits = {
            .max_tensors = 3, .max_dims = 3, .max_dim = 1u << 30,
            .max_payload = s_frame_cap(r), .max_meta = 4096,
        },
        .timing = { .dead_ms = 10000 },
        .max_peers = ROUTER_TRACKED,
    };
    rc = net_server_new(&cfg, &r->srv, err, n);
    if (rc != 0)
        return rc;
    const char *ep = net_server_endpoint(r->srv);
    printf("swarm router: listening on %s\n", ep);
    printf("swarm router: public key %s\n", net_key_public(r->key));
    if (r->auto_stages) { // (the rest is said once the stages are chosen)
        printf("swarm router: %s swarm; L=%d H=%d C=%d T=%d, stages chosen for the nodes that "
               "join; batch %d\n", r->allow ? "private" : "open", r->hp.cfg.L, r->hp.cfg.H,
               r->hp.cfg.C, r->hp.cfg.T, r->hp.batch);
        s_audits_say(r);
        if (r->o.resume)
            printf("swarm router: resumed from %s at step %ld\n", r->o.resume, r->c.step);
        node_join_print(stdout, ep, net_key_public(r->key));
        fflush(stdout);
        return 0;
    }
    printf("swarm router: %s swarm; %d stages of L=%d H=%d C=%d T=%d; batch %d in micro-batches of %d",
           r->allow ? "private" : "open", r->plan.stages, r->hp.cfg.L, r->hp.cfg.H, r->hp.cfg.C,
           r->hp.cfg.T, r->hp.batch, r->hp.micro);
    int S = r->plan.stages, G = r->hp.batch / r->hp.micro;
    double idle = router_fill_idle(G, S);
    if (r->o.micro == 0)
        s_micro_why(r, idle);
    else
        printf("\n");
    if (idle > MICRO_IDLE && r->o.micro != 0)
        printf("swarm router: %d micro-batch%s a step over %d stages: filling and draining the "
               "pipeline leaves each stage idle about %.0f%% of every step; a larger --batch "
               "(%d windows keep it to %.0f%%) or a smaller --micro-batch shrinks that share\n",
               G, G == 1 ? "" : "es", S, 100.0 * idle, router_batch_for(r->hp.micro, S),
               100.0 * MICRO_IDLE);
    s_audits_say(r);
    router_needs_say(r);
    if (r->o.resume)
        printf("swarm router: resumed from %s at step %ld\n", r->o.resume, r->c.step);
    node_join_print(stdout, ep, net_key_public(r->key));
    fflush(stdout);
    return 0;
}

// The engine, with this shell doing what it decides.
static void s_io_checksum(void *ctx, const float *params, size_t n, char hex[65])
{
    (void) ctx;
    node_params_checksum(params, n, hex);
}

static int s_engine(router_t *r, char *err, size_t n)
{
    swarm_engine_io_t io = {
        .ctx = r, .send = s_io_send, .log = router_io_log, .trace = r->trace ? router_io_trace : NULL,
        .lr_at = router_io_lr_at, .clip_scale = router_io_clip_scale, .stepped = router_io_stepped,
        .evaluated = s_io_evaluated, .checkpoint = s_io_checkpoint,
        .checkpoint_wait = s_io_checkpoint_wait, .checksum = s_io_checksum,
        .cut = r->auto_stages ? router_io_cut : NULL,
    };
    r->curve = calloc((size_t) r->hp.iters + 1, sizeof(float));
    if (!r->curve) {
        snprintf(err, n, "out of memory for the loss curve (%ld steps)", r->hp.iters);
        return -ENOMEM;
    }
    // the key of the spot checks' and audits' draws: this run's own, from
    // libsodium's generator, never sent (a peer cannot tell what is checked)
    if (sodium_init() < 0) {
        snprintf(err, n, "libsodium cannot start: no random numbers for the checks' key");
        return -EIO;
    }
    randombytes_buf(&r->c.secret, sizeof r->c.secret);
    // who sees peers' names in STATUS: in an open swarm its members and
    // whoever holds the router's own key pair (swarm status finds it)
    r->c.open_swarm = r->allow_path == NULL;
    snprintf(r->c.operator_key, sizeof r->c.operator_key, "%s", net_key_public(r->key));
    int rc = swarm_engine_new(&r->c, &io, net_clock_ms(), &r->engine, err, n);
    if (rc == 0)
        r->c.params = r->c.m = r->c.v = NULL; // the engine's now
    return rc;
}

static void s_wire_summary(const router_t *r, const swarm_engine_summary_t *sum)
{
    long steps = sum->step - sum->first;
    double k = steps > 0 ? 1e6 * steps : 1e6;
    const char *window = r->c.window_mode == SWARM_WINDOW_ALL    ? "all"
                       : r->c.window_mode == SWARM_WINDOW_AUTO ? "auto"
                                                             : "fixed";
    printf("wire | activations %s: %.3f MB/step in, %.3f out | gradient sums %s: %.3f in, "
           "%.3f out | state: %.3f in, %.3f out | window %s, mean %.1f of %d\n",
           net_dtype_name(r->c.wire), sum->wire_in[0] / k, sum->wire_out[0] / k,
           net_dtype_name(r->c.grad_wire), sum->wire_in[1] / k, sum->wire_out[1] / k,
           sum->wire_in[2] / k, sum->wire_out[2] / k, window, sum->window_mean,
           sum->micro_batches);
}

// The run's last lines: what it did, what it cost, what went over the wire.
static void s_summary(router_t *r)
{
    swarm_engine_summary_t sum;
    swarm_engine_summary(r->engine, &sum);
    long steps = sum.step - sum.first;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    printf("summary | iters %ld | wall %.2f s (train %.2f s) | tok/s %.0f | peers %d | "
           "checksum mismatches %d (resynced %d, expelled %d)\n", steps, s_secs() - r->t_start,
           sum.train_time, sum.tok_s, sum.ready, sum.checksum_mismatches, sum.resyncs,
           sum.expelled);
    printf("checks | forwards verified %d, undecided %d | gradient sums audited %d in %d "
           "steps, liars caught %d, undecided %d, given up %d, shares split %d | steps started "
           "over %d\n", sum.spot_checks, sum.spot_undecided, sum.audits, sum.audit_steps,
           sum.audit_caught, sum.audit_undecided, sum.audit_lost, sum.audit_splits, sum.restarts);
    if (r->c.audit > 0.0) { // what they cost this run (with --audit 0 none is made)
        char cost[256];
        swarm_audit_cost_text(sum.timed_steps, sum.train_time, sum.audited_steps, sum.audited_time,
                              cost, sizeof cost);
        printf("audits | %s\n", cost);
    }
    printf("router | cpu %.2f s | max rss %.1f MiB | wire %.2f MB/step in, %.2f MB/step out\n", cpu,
           ru.ru_maxrss / 1024.0, steps ? sum.bytes_in / 1e6 / steps : 0.0,
           steps ? sum.bytes_out / 1e6 / steps : 0.0);
    s_wire_summary(r, &sum);
    if (r->o.save && r->curve && sum.step > sum.first)
        node_plot_save(r->o.save, "swarm router", r->curve, sum.first, sum.step, &r->evals, 0);
}

static void s_teardown(router_t *r)
{
    if (r->engine && r->srv)
        swarm_engine_bye(r->engine); // tell the nodes the run is over
    s_io_checkpoint_wait(r);
    swarm_engine_destroy(&r->engine);
    free(r->c.params);
    free(r->c.m);
    free(r->c.v);
    free(r->curve);
    node_evals_free(&r->evals);
    node_curve_close(&r->logs);
    if (r->trace)
        fclose(r->trace);
    net_server_destroy(&r->srv);
    net_allow_destroy(&r->allow);
    net_key_destroy(&r->key);
    swarm_data_destroy(&r->data);
}

int cmd_router(int argc, char **argv)
{
    router_t *r = calloc(1, sizeof *r);
    char err[1024] = "";
    if (!r)
        abort();
    int rc = router_setup(r, argc, argv, err, sizeof err);
    if (rc == 1) {
        s_help(stdout);
        s_teardown(r);
        free(r);
        return 0;
    }
    if (rc == 0) {
        router_config(r);
        rc = node_curve_open(&r->o, &r->logs, err, sizeof err);
    }
    if (rc == 0)
        rc = s_listen(r, err, sizeof err);
    struct sigaction sa = { .sa_handler = s_on_signal };
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    if (rc == 0 && r->auto_stages)
        rc = router_gather(r, &s_stop, err, sizeof err);
    if (rc == 0)
        rc = s_engine(r, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "swarm router: %s\n", err);
        s_teardown(r);
        free(r);
        return 1;
    }
    if (r->gathered)
        router_gathered_replay(r);
    r->t_start = s_secs();
    rc = s_loop(r);
    s_io_checkpoint_wait(r);
    if (isatty(STDERR_FILENO))
        fprintf(stderr, "\n");
    s_summary(r);
    s_teardown(r);
    free(r);
    if (rc == -EINTR)
        fprintf(stderr, "swarm router: stopped\n");
    return rc == 0 ? 0 : 1; // a replica that diverged was resynced or expelled
}
