/* router.c - `swarm router`: owns the plan, the data and the step clock.
 * It assigns joining nodes to stages, hands them their stage's state, sends
 * every micro-batch through the stages (a window of them in flight), sums
 * each stage's gradients over its replicas, and has every replica apply the
 * same AdamW update; replicas' checksums are compared after every step.
 * Nothing a peer sends is used before it is checked; peers that fail,
 * stall, lie or die are banned, resynced or expelled and their work is
 * redone elsewhere, so every step averages exactly its micro-batches.
 *
 * The protocol and its failure handling are docs/swarm.md; the threat
 * model is SECURITY.md. The router does no compute of its own.
 */
#include "router_int.h"

static volatile sig_atomic_t s_stop;
static volatile sig_atomic_t s_hup;     // SIGHUP: re-read the --allow file

static void s_on_signal(int sig)
{
    if (sig == SIGHUP)
        s_hup = 1;
    else
        s_stop = 1;
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
    for (int p = 0; p < r->npeers; p++) {
        if (r->peers[p].state == P_DEAD || net_allow_contains(r->allow, r->peers[p].who.key))
            continue;
        net_msg_t *bye = net_msg_new(NET_MSG_ERROR);
        router_meta(bye, "reason=this node's key was removed from the swarm's allow-list\nfatal=1");
        s_ignore(router_emit(r, &r->peers[p].who, &bye));
        router_peer_dead(r, p, "was removed from the allow-list: dropped");
    }
}

static int s_loop(router_t *r)
{
    char err[512];
    while (!s_stop && !(r->done && r->phase == PH_WAIT && !r->want_eval && !r->want_ckpt)) {
        net_peer_t who;
        net_msg_t *m = NULL;
        int rc = net_server_recv(r->srv, net_clock_ms() + 50, &who, &m, err, sizeof err);
        r->now_ms = net_clock_ms(); // what follows happens at this time
        if (rc == 0) {
            r->bytes_in += router_payload(m);
            router_wire_count(m, r->wire_in);
            router_on_message(r, &who, m);
            net_msg_destroy(&m);
        } else if (rc == -EPROTO) {
            char note[64];
            if (router_loud(r, who.key, note, sizeof note))
                fprintf(stderr, "swarm router: bad message from %.8s...: %s%s\n", who.key, err, note);
        } else if (rc != -ETIMEDOUT && rc != -EINTR && rc != -EAGAIN) {
            fprintf(stderr, "swarm router: receive failed: %s\n", strerror(-rc));
            return rc;
        }
        if (s_hup)
            s_allow_reload(r);
        router_reap(r);
        // advance through every phase that is ready now, not on the next message
        int before;
        do {
            before = r->phase;
            router_turn(r);
        } while (r->phase != before && !(r->done && r->phase == PH_WAIT && !r->want_eval
                                          && !r->want_ckpt));
    }
    return s_stop ? -EINTR : 0;
}

static void s_help(FILE *out)
{
    fprintf(out,
        "usage: swarm router --stages S [--listen tcp://*:7070] [--key NAME] [--allow FILE | --open]\n"
        "                    [--min-nodes N] [--window all|auto|W] [--wire F] [--grad-wire F]\n"
        "                    [training flags of swarm train]\n"
        "Run a swarm: nodes join with the line this prints, each serves one stage.\n"
        "  --listen EP     where nodes connect (default tcp://*:7070; port 0 picks a free one)\n"
        "  --key NAME      router key pair NAME.key/NAME.pub (default ~/.config/swarm/router,\n"
        "                  under $XDG_CONFIG_HOME/swarm when that is set; created if missing)\n"
        "  --allow FILE    private swarm: only these public keys (one per line) may join\n"
        "  --open          open swarm: any key may join (the default)\n"
        "  --min-nodes N   wait for N ready nodes before training (default: one per stage)\n"
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
        "                  speed the router measures)\n"
        "  --rebalance-every SECONDS  every so often, move a peer from the strongest stage\n"
        "                  to the weakest when that lifts the bottleneck by more than 10%%\n"
        "                  two checks in a row (default 5; 0 = never)\n"
        "  --tensor-bound K  a peer whose activation or gradient has an RMS above K times\n"
        "                  its stage's running RMS is banned and its work redone\n"
        "                  (default 100; 0 = check finiteness only)\n"
        "  --verify F      run a fraction F of forwards again on a second replica and\n"
        "                  compare; a third decides a disagreement and the peer it\n"
        "                  contradicts is expelled (default 0.05; 0 = never)\n"
        "  --trace FILE    write a line per request sent and answered and per step to\n"
        "                  FILE, for scripts/trace-steps.sh (where a step's time goes)\n"
        "training flags (as swarm train, but without --micro-batch the router chooses it from\n"
        "--batch, --block and --stages, as its start-up line says):\n");
    node_train_help(out);
}

// --wire, --grad-wire, --window: 1 when `a` is one of them (set from v),
// 0 when it is not, -EINVAL for a bad value.
static int s_wire_flag(router_t *r, const char *a, const char *v, char *err, size_t n)
{
    long x;
    if (!strcmp(a, "--wire") || !strcmp(a, "--grad-wire"))
        return net_dtype_parse(a + 2, v, !strcmp(a, "--wire") ? &r->wire : &r->grad_wire, err,
                               n) == 0 ? 1 : -EINVAL;
    if (strcmp(a, "--window") != 0)
        return 0;
    r->window_mode = !strcmp(v, "all") ? WIN_ALL : !strcmp(v, "auto") ? WIN_AUTO : WIN_FIXED;
    if (r->window_mode != WIN_FIXED)
        return 1;
    if (node_parse_long("window", v, 1, 1L << 20, &x, err, n) != 0) {
        snprintf(err, n, "--window %s: expected all, auto or a whole number of micro-batches >= 1",
                 v);
        return -EINVAL;
    }
    r->window = (int) x;
    return 1;
}

// Take the router's own flags out of argv; the rest are training flags.
static int s_router_flags(router_t *r, int *argc, char **argv, char *err, size_t n)
{
    int out = 1, rc;
    r->listen = "tcp://*:7070";
    r->rebalance_every = 5.0;
    r->tensor_bound = 100.0;
    r->verify = 0.05;
    r->wire = r->grad_wire = NET_DTYPE_F32;
    r->window_mode = WIN_ALL;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < *argc ? argv[i + 1] : NULL;
        int takes = !strcmp(a, "--listen") || !strcmp(a, "--key") || !strcmp(a, "--allow")
                 || !strcmp(a, "--min-nodes") || !strcmp(a, "--window")
                 || !strcmp(a, "--rebalance-every") || !strcmp(a, "--tensor-bound")
                 || !strcmp(a, "--verify") || !strcmp(a, "--assign")
                 || !strcmp(a, "--wire") || !strcmp(a, "--grad-wire") || !strcmp(a, "--trace");
        if (takes && !v) {
            snprintf(err, n, "%s needs a value; see 'swarm router --help'", a);
            return -EINVAL;
        }
        if (!strcmp(a, "--listen")) {
            r->listen = v;
        } else if (!strcmp(a, "--key")) {
            r->key_name = v;
        } else if (!strcmp(a, "--allow")) {
            r->allow_path = v;
        } else if (!strcmp(a, "--trace")) {
            r->trace_path = v;
        } else if ((rc = s_wire_flag(r, a, v, err, n)) != 0) {
            if (rc < 0)
                return rc;
        } else if (!strcmp(a, "--min-nodes")) {
            long x;
            if (node_parse_long(a + 2, v, 0, 1000000, &x, err, n) != 0)
                return -EINVAL;
            r->min_nodes = (int) x;
        } else if (!strcmp(a, "--rebalance-every") || !strcmp(a, "--tensor-bound")) {
            char *end;
            double x = strtod(v, &end);
            if (*v == '\0' || *end || !(x >= 0 && x <= 86400)) {
                snprintf(err, n, "%s %s: expected a number 0..86400 (0 = never)", a, v);
                return -EINVAL;
            }
            *(!strcmp(a, "--tensor-bound") ? &r->tensor_bound : &r->rebalance_every) = x;
        } else if (!strcmp(a, "--verify")) {
            char *end;
            r->verify = strtod(v, &end);
            if (*v == '\0' || *end || !(r->verify >= 0 && r->verify <= 1)) {
                snprintf(err, n, "--verify %s: expected a fraction 0..1 of forwards to check", v);
                return -EINVAL;
            }
        } else if (!strcmp(a, "--assign")) {
            if (strcmp(v, "speed") != 0 && strcmp(v, "even") != 0) {
                snprintf(err, n, "--assign %s: expected speed or even", v);
                return -EINVAL;
            }
            r->assign_even = !strcmp(v, "even");
        } else if (!strcmp(a, "--open")) {
            r->allow_path = NULL;
            continue;
        } else {
            argv[out++] = argv[i];
            continue;
        }
        i++;
    }
    *argc = out;
    return 0;
}

// The router's key pair: --key NAME, or one kept in the user's config folder.
static int s_load_key(router_t *r, char *err, size_t n)
{
    char path[PATH_MAX];
    if (r->key_name)
        return net_key_load(r->key_name, &r->key, err, n);
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    snprintf(path, sizeof path, "%s%s/swarm", xdg ? xdg : home ? home : ".", xdg ? "" : "/.config");
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

// Exact steps fill and drain the pipeline once a step: over S equal stages
// each waits about (S - 1) / (G + S - 1) of it for G micro-batches.
#define MICRO_IDLE 0.10      // the share of a step the router accepts for it
#define MICRO_MIN_TOKENS 64

static double s_fill_idle(int G, int S)
{
    return (double) (S - 1) / (G + S - 1);
}

// Without --micro-batch the router picks it: the largest divisor of the
// batch that keeps the fill and drain within MICRO_IDLE; but none of fewer
// than MICRO_MIN_TOKENS tokens (windows x T), under which each request's
// fixed costs (the router's hop, waking the node, decoding) eat what the
// pipeline gains (docs/performance.md). When no divisor does both, the
// smallest with enough tokens; one stage (no pipeline), the whole batch.
static int s_micro_choose(int batch, int T, int S)
{
    int best = batch;
    for (int m = batch; m >= 1 && (long) m * T >= MICRO_MIN_TOKENS; m--) {
        if (batch % m != 0)
            continue;
        best = m;
        if (s_fill_idle(batch / m, S) <= MICRO_IDLE)
            break;
    }
    return best;
}

static int s_setup(router_t *r, int argc, char **argv, char *err, size_t n)
{
    int rc = s_router_flags(r, &argc, argv, err, n);
    if (rc == 0)
        rc = node_train_parse(argc, argv, &r->o, err, n);
    if (rc != 0)
        return rc;
    if (r->trace_path) {
        if (!(r->trace = fopen(r->trace_path, "w"))) {
            snprintf(err, n, "--trace %s: %s", r->trace_path, strerror(errno));
            return -EINVAL;
        }
        setvbuf(r->trace, NULL, _IOLBF, 0); // whole lines, also if the router is killed
    }
    if (r->o.data) {
        rc = swarm_data_load(r->o.data, &r->data, err, n);
    } else {
        size_t len;
        const uint8_t *bytes = node_corpus(&len);
        r->data = swarm_data_wrap(bytes, len, "(built-in corpus)");
    }
    if (rc == 0)
        rc = node_train_weights(&r->o, &r->params, &r->m, &r->v, &r->step, err, n);
    if (rc != 0)
        return rc;
    r->first = r->step;
    r->ckpt_step = r->step;
    r->hp = node_train_hparams(&r->o);
    if (r->o.micro == 0 && r->hp.batch >= 1) // no --micro-batch given
        r->hp.micro = s_micro_choose(r->hp.batch, r->hp.cfg.T, r->o.stages);
    r->want_eval = r->o.eval_every > 0 && r->step == 0;
    if (r->hp.micro < 1 || r->hp.batch % r->hp.micro != 0) {
        snprintf(err, n, "--micro-batch %d must divide --batch %d", r->hp.micro, r->hp.batch);
        return -EINVAL;
    }
    rc = node_config_check(&r->hp.cfg, err, n);
    if (rc == 0)
        rc = node_plan_make(&r->hp.cfg, r->o.stages, &r->plan, err, n);
    if (rc == 0)
        rc = swarm_data_check(r->data, r->hp.cfg.T, err, n);
    return rc;
}

// Parameters per stage, and the state arrays every stage's slice lives in.
static int s_layout(router_t *r, char *err, size_t n)
{
    size_t total = node_config_params(&r->hp.cfg);
    for (int s = 0; s < r->plan.stages; s++)
        node_plan_stage_range(&r->hp.cfg, &r->plan, s, &r->stage_off[s], &r->stage_n[s]);
    for (int s = 0; s < r->plan.stages; s++)
        r->max_stage_n = r->stage_n[s] > r->max_stage_n ? r->stage_n[s] : r->max_stage_n;
    if (!r->m)
        r->m = calloc(total, sizeof(float));
    if (!r->v)
        r->v = calloc(total, sizeof(float));
    r->grad_sum = calloc(total, sizeof(float));
    r->G = r->hp.batch / r->hp.micro;
    r->mbs = calloc((size_t) r->G, sizeof(mb_t));
    r->curve = calloc((size_t) r->hp.iters + 1, sizeof(float));
    if (!r->m || !r->v || !r->grad_sum || !r->mbs || !r->curve) {
        snprintf(err, n, "out of memory for the model's state (%zu parameters)", total);
        return -ENOMEM;
    }
    for (int i = 0; i < r->G; i++)
        router_mb_clear(r, &r->mbs[i]);
    if (r->window <= 0 || r->window > r->G)
        r->window = r->G; // and with --window auto, until the peers are measured
    r->tok_bytes = (size_t) r->hp.micro * r->hp.cfg.T * sizeof(int32_t);
    if (!(r->scratch = malloc(router_acts_count(r) * sizeof(float)))) {
        snprintf(err, n, "out of memory for a (%d, %d, %d) activation", r->hp.micro, r->hp.cfg.T,
                 r->hp.cfg.C);
        return -ENOMEM;
    }
    return 0;
}

// The rest of the start-up line when the router chose the micro-batch
// (s_micro_choose): why, and what the pipeline's fill and drain cost.
static void s_micro_why(const router_t *r, double idle)
{
    int S = r->plan.stages;
    if (S == 1)
        printf(" (chosen: the whole batch, as swarm train: one stage has no pipeline to fill; "
               "--micro-batch sets it)\n");
    else if (idle <= MICRO_IDLE)
        printf(" (chosen: %d a step over %d stages keeps the pipeline's fill and drain to ~%.0f%% "
               "of a step; --micro-batch sets it)\n", r->G, S, 100.0 * idle);
    else
        printf(" (chosen: %d a step over %d stages, the most of %d tokens or more; the pipeline's "
               "fill and drain take ~%.0f%% of a step, a larger --batch shrinks that; "
               "--micro-batch sets it)\n", r->G, S, MICRO_MIN_TOKENS, 100.0 * idle);
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
    size_t state_bytes = 3 * node_config_params(&r->hp.cfg) * sizeof(float);
    net_server_config_t cfg = {
        .endpoint = r->listen, .key = r->key, .allow = r->allow,
        .limits = {
            .max_tensors = 3, .max_dims = 3, .max_dim = 1u << 30,
            .max_payload = state_bytes + 4096 < NET_PAYLOAD_MAX ? state_bytes + 4096 : NET_PAYLOAD_MAX,
            .max_meta = 4096,
        },
        .timing = { .dead_ms = 10000 },
    };
    rc = net_server_new(&cfg, &r->srv, err, n);
    if (rc != 0)
        return rc;
    const char *ep = net_server_endpoint(r->srv);
    printf("swarm router: listening on %s\n", ep);
    printf("swarm router: public key %s\n", net_key_public(r->key));
    printf("swarm router: %s swarm; %d stages of L=%d H=%d C=%d T=%d; batch %d in micro-batches of %d",
           r->allow ? "private" : "open", r->plan.stages, r->hp.cfg.L, r->hp.cfg.H, r->hp.cfg.C,
           r->hp.cfg.T, r->hp.batch, r->hp.micro);
    int S = r->plan.stages;
    double idle = s_fill_idle(r->G, S);
    if (r->o.micro == 0)
        s_micro_why(r, idle);
    else
        printf("\n");
    if (idle > MICRO_IDLE && r->o.micro != 0)
        printf("swarm router: %d micro-batch%s a step over %d stages: filling and draining the "
               "pipeline leaves each stage idle about %.0f%% of every step; a larger --batch "
               "(or a smaller --micro-batch) shrinks that share\n",
               r->G, r->G == 1 ? "" : "es", S, 100.0 * idle);
    if (r->o.resume)
        printf("swarm router: resumed from %s at step %ld\n", r->o.resume, r->step);
    node_join_print(stdout, ep, net_key_public(r->key));
    fflush(stdout);
    return 0;
}

// Bytes on the wire per step by what they carry and in which format, and
// the window.
static void s_wire_summary(const router_t *r, long steps)
{
    double k = steps > 0 ? 1e6 * steps : 1e6;
    const char *window = r->window_mode == WIN_ALL    ? "all"
                       : r->window_mode == WIN_AUTO ? "auto"
                                                    : "fixed";
    printf("wire | activations %s: %.3f MB/step in, %.3f out | gradient sums %s: %.3f in, "
           "%.3f out | state: %.3f in, %.3f out | window %s, mean %.1f of %d\n",
           net_dtype_name(r->wire), r->wire_in[W_ACTS] / k, r->wire_out[W_ACTS] / k,
           net_dtype_name(r->grad_wire), r->wire_in[W_GRADS] / k, r->wire_out[W_GRADS] / k,
           r->wire_in[W_STATE] / k, r->wire_out[W_STATE] / k, window,
           r->window_n > 0 ? r->window_sum / r->window_n : (double) r->window, r->G);
}

// The loss curve of this run and its evaluations as an SVG plot in DIR/loss.svg.
static void s_plot(router_t *r)
{
    if (r->o.save && r->curve && r->step > r->first)
        node_plot_save(r->o.save, "swarm router", r->curve, r->first, r->step, &r->evals, 0);
}

static void s_teardown(router_t *r)
{
    // tell the nodes the run is over
    for (int p = 0; r->srv && p < r->npeers; p++) {
        if (r->peers[p].state == P_DEAD)
            continue;
        net_msg_t *bye = net_msg_new(NET_MSG_BYE);
        router_meta(bye, "done=%d\nstep=%ld\nsteps=%ld", r->done, r->step, (long) r->hp.iters);
        s_ignore(router_emit(r, &r->peers[p].who, &bye));
    }
    for (int p = 0; p < r->npeers; p++)
        free(r->peers[p].grad);
    free(r->peers);
    for (int k = 0; k < (r->req_slots + REQ_BLOCK - 1) / REQ_BLOCK; k++)
        free(r->req_blocks[k]);
    free(r->req_blocks);
    free(r->req_free);
    free(r->views);
    free(r->backlog);
    free(r->ahead);
    for (int i = 0; r->mbs && i < r->G; i++)
        router_mb_clear(r, &r->mbs[i]);
    free(r->mbs);
    free(r->params);
    free(r->ck_state);
    free(r->m);
    free(r->v);
    free(r->grad_sum);
    free(r->scratch);
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
    r->self_peer = -1;
    r->now_ms = net_clock_ms();
    int rc = s_setup(r, argc, argv, err, sizeof err);
    if (rc == 1) {
        s_help(stdout);
        free(r);
        return 0;
    }
    if (rc == 0)
        rc = s_layout(r, err, sizeof err);
    if (rc == 0)
        rc = node_curve_open(&r->o, &r->logs, err, sizeof err);
    if (rc == 0)
        rc = s_listen(r, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "swarm router: %s\n", err);
        s_teardown(r);
        free(r);
        return 1;
    }
    struct sigaction sa = { .sa_handler = s_on_signal };
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    r->now_ms = net_clock_ms();
    r->t_start = router_secs(r);
    rc = s_loop(r);
    router_ckpt_wait(r);
    r->now_ms = net_clock_ms();
    if (isatty(STDERR_FILENO))
        fprintf(stderr, "\n");
    long steps = r->step - r->first;
    double tps = r->train_time > 0 ? steps * (double) r->hp.batch * r->hp.cfg.T / r->train_time : 0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    printf("summary | iters %ld | wall %.2f s (train %.2f s) | tok/s %.0f | peers %d | "
           "checksum mismatches %d (resynced %d, expelled %d)\n", steps, router_secs(r) - r->t_start,
           r->train_time, tps, router_ready_count(r, -1), r->checksum_mismatches, r->resyncs, r->expelled);
    printf("checks | forwards verified %d, undecided %d | steps started over %d\n", r->spot_checks,
           r->spot_undecided, r->restarts);
    printf("router | cpu %.2f s | max rss %.1f MiB | wire %.2f MB/step in, %.2f MB/step out\n", cpu,
           ru.ru_maxrss / 1024.0, steps ? r->bytes_in / 1e6 / steps : 0.0,
           steps ? r->bytes_out / 1e6 / steps : 0.0);
    s_wire_summary(r, steps);
    s_plot(r);
    s_teardown(r);
    free(r);
    if (rc == -EINTR)
        fprintf(stderr, "swarm router: stopped\n");
    return rc == 0 ? 0 : 1; // a replica that diverged was resynced or expelled
}
