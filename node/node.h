/* node.h - the model, its stages, the optimizer, weight files, checkpoints,
 * and the subcommands of the one `swarm` binary.
 *
 * A stage owns a contiguous range of the model's parameters (layer-major, the
 * BGPT file order), with gradients and both AdamW moments each one buffer.
 * It runs forward and backward on its own: tensors in, tensors out. It knows
 * nothing of sockets; the swarm moves its inputs and outputs.
 */
#ifndef SWARM_NODE_H
#define SWARM_NODE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "blas.h"

#define NODE_VOCAB 256
#define NODE_MAX_LAYERS 256

// ---- model shape and parameter layout ----

typedef struct {
    int V;  // vocabulary: 256 byte values
    int T;  // context length (--block)
    int C;  // channels (--embd)
    int L;  // layers
    int H;  // heads
} node_config_t;

// 0 when the shape is usable, else -EINVAL with the flag to fix in err.
__attribute__((warn_unused_result))
int node_config_check(const node_config_t *cfg, char *err, size_t errlen);
// parameters in the whole model
size_t node_config_params(const node_config_t *cfg);
// FLOPs per trained token: 6 N + 12 L T C (as the reference counts)
double node_config_flops_per_token(const node_config_t *cfg);

// Tensors of the parameter file, in file order.
enum {
    NODE_T_WTE, NODE_T_WPE,
    NODE_T_LN1W, NODE_T_LN1B, NODE_T_QKVW, NODE_T_QKVB, NODE_T_PROJW, NODE_T_PROJB,
    NODE_T_LN2W, NODE_T_LN2B, NODE_T_FC1W, NODE_T_FC1B, NODE_T_FC2W, NODE_T_FC2B,
    NODE_T_LNFW, NODE_T_LNFB, NODE_T_HEAD,
    NODE_T_COUNT
};
#define NODE_LAYER_TENSORS 12

typedef struct {
    char name[32];        // e.g. "blocks.1.qkv.weight"
    size_t offset;        // floats from the start of the model's parameters
    size_t size;          // floats
    int dims;             // 1 or 2 (weight decay applies to dims >= 2)
    int rows, cols;       // shape (rows = 1 for vectors)
} node_tensor_t;

// Number of tensors in the file order: 2 + 12 L + 3.
int node_tensor_count(const node_config_t *cfg);
// Tensor i of the file order.
node_tensor_t node_tensor_at(const node_config_t *cfg, int i);

// ---- plan: L blocks cut into S contiguous stages ----

typedef struct {
    int stages;                       // S
    int first[NODE_MAX_LAYERS + 1];   // stage s holds blocks [first[s], first[s+1])
} node_plan_t;

// Balance estimated FLOPs per token across S stages (stage 0 adds the
// embeddings, stage S-1 the final LayerNorm, head and loss).
__attribute__((warn_unused_result))
int node_plan_make(const node_config_t *cfg, int S, node_plan_t *plan, char *err, size_t errlen);

// The plan a router's cut says: "F0,F1,...,FS", each stage's first block
// and the layers after the last (ASSIGN's cut=); F0 = 0, FS = cfg->L,
// each above the last, S in 1..L. -EINVAL with what is wrong in err.
__attribute__((warn_unused_result))
int node_plan_parse(const node_config_t *cfg, const char *text, node_plan_t *plan, char *err,
                    size_t errlen);
// The plan as node_plan_parse reads it, into buf[n] (at most 4 (S + 1) + 1
// bytes: NODE_PLAN_TEXT_MAX); what snprintf returned.
#define NODE_PLAN_TEXT_MAX (4 * (NODE_MAX_LAYERS + 1) + 1)
int node_plan_text(const node_plan_t *plan, char *buf, size_t n);

// Stage s's slice of the model's flat parameters (offset, count in floats).
void node_plan_stage_range(const node_config_t *cfg, const node_plan_t *plan, int s,
                           size_t *offset, size_t *count);
// Stage s's forward FLOPs per token (what the plan balances).
double node_plan_stage_cost(const node_config_t *cfg, const node_plan_t *plan, int s);

// ---- a stage ----

typedef struct node_stage_s node_stage_t;
typedef struct node_acts_s node_acts_t;

// A stage of a plan on a backend. Parameters start at zero; set them with
// node_stage_set_params. NULL on allocation failure (err says how much).
node_stage_t *node_stage_new(const node_config_t *cfg, const node_plan_t *plan, int s,
                             blas_backend_t *be, char *err, size_t errlen);
void node_stage_destroy(node_stage_t **self_p);

int node_stage_index(const node_stage_t *self);
void node_stage_config(const node_stage_t *self, node_config_t *cfg);
int node_stage_is_first(const node_stage_t *self);
int node_stage_is_last(const node_stage_t *self);
// the stage's slice of the model's flat parameter array
size_t node_stage_param_offset(const node_stage_t *self);
size_t node_stage_param_count(const node_stage_t *self);

// Host views of the stage's buffers (each n = param_count floats). params
// is the master copy the optimizer updates; call node_stage_params_changed
// after writing to it. grads is valid after node_stage_grads_fetch.
float *node_stage_params(node_stage_t *self);
float *node_stage_grads(node_stage_t *self);
float *node_stage_moment1(node_stage_t *self);
float *node_stage_moment2(node_stage_t *self);
__attribute__((warn_unused_result))
int node_stage_params_changed(node_stage_t *self);
__attribute__((warn_unused_result))
int node_stage_grads_fetch(node_stage_t *self);
void node_stage_grads_zero(node_stage_t *self);

// What a node holds for stage s of plan at micro-batches of `micro`
// windows (docs/swarm.md "Memory"): the one formula the router plans with
// and the node keeps to.
typedef struct {
    size_t state;             // parameters, gradients, both AdamW moments: 16 bytes each
    size_t acts;              // one cached micro-batch's activations (a slot)
    size_t buffers;           // a request's inputs and outputs
} node_memory_t;
node_memory_t node_plan_stage_memory(const node_config_t *cfg, const node_plan_t *plan, int s,
                                     int micro);
// What a node needs to take the stage: its state, one cached micro-batch,
// the buffers (the router plans with it; a node refuses a stage above it).
static inline size_t node_memory_need(node_memory_t m)
{
    return m.state + m.acts + m.buffers;
}
// The bytes of one micro-batch of B windows' activations of stage s (what
// node_acts_new allocates, and its host losses not included).
size_t node_plan_acts_bytes(const node_config_t *cfg, const node_plan_t *plan, int s, int B);

// Activations of one micro-batch of B windows (a node keeps one per
// micro-batch in flight). NULL on allocation failure.
node_acts_t *node_acts_new(node_stage_t *stage, int B, char *err, size_t errlen);
void node_acts_destroy(node_acts_t **self_p);
int node_acts_batch(const node_acts_t *self);
size_t node_acts_bytes(const node_acts_t *self);

// Forward. The first stage reads tokens (B,T); later stages read x (B,T,C).
// Writes y (B,T,C) for every stage but the last. For the last stage, with
// targets (B,T): *loss = mean cross-entropy; with want_backward the input
// gradient and parameter gradients of loss_scale * sum of losses follow
// at once (dx (B,T,C), or nothing for a one-stage model). All host memory.
typedef struct {
    const int32_t *tokens;   // (B,T) input of the first stage
    const float *x;          // (B,T,C) input of later stages
    const int32_t *targets;  // (B,T) last stage only
    float loss_scale;        // last stage: gradient of loss_scale * sum(losses)
    int want_backward;       // last stage: run backward in the same call
} node_stage_in_t;

__attribute__((warn_unused_result))
int node_stage_forward(node_stage_t *self, node_acts_t *acts, const node_stage_in_t *in,
                       float *y, float *loss, float *dx);
// Backward of the last forward run with `acts`: dy (B,T,C) in, parameter
// gradients accumulated, dx (B,T,C) out (not for the first stage).
__attribute__((warn_unused_result))
int node_stage_backward(node_stage_t *self, node_acts_t *acts, const float *dy, float *dx);
// Logits of the last position of window 0 after a forward of the last stage
// (for sampling): copies V floats.
__attribute__((warn_unused_result))
int node_stage_logits_at(node_stage_t *self, node_acts_t *acts, int t, float *out);

// ---- optimizer (AdamW on the CPU; bit-identical on every x86-64 build) ----

typedef struct {
    double lr;            // this step's learning rate
    float beta1, beta2;   // 0.9, 0.99
    float eps;            // 1e-8
    float weight_decay;   // applied to tensors of dims >= 2
    float grad_scale;     // multiply gradients first (global-norm clipping)
    long t;               // update number, 1-based (bias correction)
} node_adamw_t;

// Update the stage's params and moments from its fetched grads.
void node_stage_adamw(node_stage_t *self, const node_adamw_t *opt);
// Learning rate for update `it` (0-based): linear warmup, cosine decay.
double node_lr_at(long it, long iters, long warmup, double lr_max, double lr_min);
// Clipping factor for a global gradient norm, as torch.nn.utils.clip_grad_norm_.
float node_clip_scale(double norm, float max_norm);
// Sum of squares of n host floats, accumulated in double in index order (the
// global norm of gradients already fetched to the host: the same value
// whichever device computed them).
double node_sumsq(const float *x, size_t n);

// ---- BGPT weight files (ref_gpt.py's format) ----

typedef struct {
    node_config_t cfg;   // shape
    int kind;            // 0 weights, 1 gradients
    int step;            // optimizer updates done
    float loss;          // kind 1: loss of the batch
} node_bgpt_header_t;

// Read a whole BGPT file: *data gets malloc'ed floats (node_config_params).
// Every header field, the size and every value (finite) are checked;
// -EINVAL/-EIO/-ENOMEM with reason.
__attribute__((warn_unused_result))
int node_bgpt_read(const char *path, node_bgpt_header_t *hdr, float **data, char *err, size_t errlen);
// The same from size bytes in memory; name stands for the file in errors.
// *data is NULL on error.
__attribute__((warn_unused_result))
int node_bgpt_decode(const uint8_t *buf, size_t size, const char *name, node_bgpt_header_t *hdr,
                     float **data, char *err, size_t errlen);
// Write atomically (temporary file, fsync, rename).
__attribute__((warn_unused_result))
int node_bgpt_write(const char *path, const node_bgpt_header_t *hdr, const float *data,
                    char *err, size_t errlen);
// Write size bytes to path atomically (path.tmp, fsync, rename, fsync of the
// folder): 0, or -errno with the reason in err.
__attribute__((warn_unused_result))
int node_file_write(const char *path, const void *data, size_t size, char *err, size_t errlen);

// ---- checkpoints: DIR/checkpoint.bin (+ DIR/model.bgpt) ----

typedef struct {
    node_config_t cfg;      // model shape
    long step;              // optimizer updates done
    uint64_t seed;          // data and init seed
    long iters;             // schedule length
    long warmup;            // warmup updates
    int batch;              // windows per step
    double lr, min_lr;      // schedule
    double weight_decay;    // AdamW decay
    double grad_clip;       // global-norm clip (0 = off)
} node_ckpt_meta_t;

// Write params, both moments (each node_config_params floats) and meta to
// DIR/checkpoint.bin atomically with a BLAKE2b checksum, and the weights to
// DIR/model.bgpt. Creates DIR.
__attribute__((warn_unused_result))
int node_ckpt_save(const char *dir, const node_ckpt_meta_t *meta, const float *params,
                   const float *m, const float *v, char *err, size_t errlen);
// Read DIR/checkpoint.bin, verifying size and checksum, then every header
// field against the range its flag accepts and every value (finite; second
// moments >= 0). m and v may be NULL (sampling). Arrays are malloc'ed.
__attribute__((warn_unused_result))
int node_ckpt_load(const char *dir, node_ckpt_meta_t *meta, float **params, float **m,
                   float **v, char *err, size_t errlen);
// The same from size bytes in memory; name stands for the file in errors.
// The arrays are NULL on error.
__attribute__((warn_unused_result))
int node_ckpt_decode(const uint8_t *buf, size_t size, const char *name, node_ckpt_meta_t *meta,
                     float **params, float **m, float **v, char *err, size_t errlen);

// ---- trainer: the whole model as S stages in one process ----

typedef struct swarm_data_s swarm_data_t;

typedef struct {
    node_config_t cfg;      // model shape
    int batch;              // windows per optimizer step (B)
    int micro;              // windows per micro-batch (divides batch)
    int stages;             // S
    long iters;             // schedule length
    long warmup;            // warmup steps
    double lr, min_lr;      // schedule
    double weight_decay;    // AdamW decay on matrices
    double grad_clip;       // global-norm clip, 0 = off
    uint64_t seed;          // data order
    int eval_iters;         // batches per evaluation
} node_hparams_t;

typedef struct node_trainer_s node_trainer_t;

// Stages, activations and buffers for hp on be, reading data (borrowed).
// NULL with a reason in err.
node_trainer_t *node_trainer_new(const node_hparams_t *hp, blas_backend_t *be,
                                 const swarm_data_t *data, char *err, size_t errlen);
void node_trainer_destroy(node_trainer_t **self_p);
// Set the whole model's parameters (and moments, NULL = zero) and the step.
__attribute__((warn_unused_result))
int node_trainer_load(node_trainer_t *self, const float *params, const float *m, const float *v,
                      long step);
// Gradients of the current step's batch, accumulated over its micro-batches
// (nothing is updated); *loss is the batch's mean loss.
__attribute__((warn_unused_result))
int node_trainer_forward_backward(node_trainer_t *self, float *loss);
// Clip, AdamW on every stage, step + 1. *lr gets the rate used.
__attribute__((warn_unused_result))
int node_trainer_update(node_trainer_t *self, double *lr);
// Mean loss over eval_iters batches of a split (fresh stream each time).
__attribute__((warn_unused_result))
int node_trainer_eval(node_trainer_t *self, int val, double *loss);
// Copy params (0), moment1 (1), moment2 (2) or grads (3) of every stage into
// one model-sized array.
void node_trainer_gather(node_trainer_t *self, int which, float *dst);
long node_trainer_step(const node_trainer_t *self);

// ---- training options (swarm train and swarm router share them) ----

typedef struct {
    node_config_t cfg;      // model shape
    int batch;              // windows per optimizer step (B)
    int micro;              // windows per micro-batch
    int stages;             // S
    long iters;             // optimizer steps in the schedule
    double lr, min_lr;      // schedule; min_lr < 0 means lr / 10
    long warmup;            // warmup steps
    double weight_decay;    // AdamW decay on matrices
    double grad_clip;       // global-norm clip, 0 = off
    uint64_t seed;          // data and init seed
    long eval_every;        // steps between evaluations, 0 = never
    int eval_iters;         // batches per evaluation
    const char *data;       // data file, NULL = built-in corpus
    const char *init;       // BGPT weights to start from
    const char *save;       // checkpoint folder
    long save_every;        // steps between checkpoints (and at the end)
    const char *resume;     // checkpoint folder to continue from
    int threads;            // CPU threads, 0 = all cores
    const char *loss_log;   // "step loss lr" per step
    const char *device;     // auto, cpu, cuda[:N]
    long log_every;         // steps between plain progress lines
    long steps;             // stop after this many steps in this run (0 = to the end)
    int quiet;              // no progress output
    unsigned given;         // bit per option set on the command line
} node_train_opts_t;

// Parse the training flags. 0; 1 when --help was asked; -EINVAL with err.
__attribute__((warn_unused_result))
int node_train_parse(int argc, char **argv, node_train_opts_t *o, char *err, size_t errlen);
void node_train_help(FILE *out);
// A whole number in lo..hi for flag --FLAG; -EINVAL naming the flag otherwise.
__attribute__((warn_unused_result))
int node_parse_long(const char *flag, const char *s, long lo, long hi, long *out, char *err, size_t errlen);
// A size: a number with an optional K, M, G or T (powers of 1024; "GiB",
// "GB" and "g" are the same), at least 1M. 0, or -EINVAL naming --flag.
__attribute__((warn_unused_result))
int node_parse_size(const char *flag, const char *s, size_t *out, char *err, size_t errlen);
// The starting state: from --resume (also fills the schedule from the
// checkpoint and *step), --init, or fresh weights from --seed. Arrays are
// malloc'ed; m and v stay NULL unless resuming.
__attribute__((warn_unused_result))
int node_train_weights(node_train_opts_t *o, float **params, float **m, float **v, long *step,
                       char *err, size_t errlen);
// The loss curve of a run: --loss-log FILE ("step loss lr", the reference's
// format) and DIR/loss.csv beside the checkpoint (--save DIR); appended to
// when resuming, flushed every step so that a killed run keeps its curve.
typedef struct {
    FILE *log;              // --loss-log, or NULL
    FILE *csv;              // DIR/loss.csv, or NULL
} node_curve_t;

__attribute__((warn_unused_result))
int node_curve_open(const node_train_opts_t *o, node_curve_t *curve, char *err, size_t errlen);
void node_curve_add(node_curve_t *curve, long step, float loss, double lr);
void node_curve_close(node_curve_t *curve);

// ---- the loss plot: DIR/loss.svg (node/plot.c) ----

typedef struct {
    long step;              // optimizer updates done when evaluated
    double train;           // mean loss of the train split's evaluation batches
    double val;             // the same of the val split
} node_eval_point_t;

typedef struct {
    node_eval_point_t *at;  // [n] in step order
    long n;                 // points
    long cap;               // allocated
} node_evals_t;

// Append a point; one at or after step is dropped first (a rollback replays
// steps). Aborts when out of memory (bookkeeping). node_evals_free accepts a
// zeroed node_evals_t and leaves one.
void node_evals_add(node_evals_t *evals, long step, double train, double val);
void node_evals_free(node_evals_t *evals);

typedef struct {
    const char *title;      // drawn at the top (escaped); NULL: "loss"
    const float *loss;      // [count]: the loss of steps first .. first + count - 1
    long first;             // the step of loss[0]
    long count;             // steps, 0 or more
    const node_eval_point_t *evals; // [nevals] in step order, or NULL
    long nevals;            // evaluation points, 0 or more
} node_plot_t;

// Write plot to path as a standalone SVG 1.1 line plot (step against loss,
// ticked axes, grid, legend), atomically (node_file_write). Non-finite values
// are skipped. 0; -EINVAL when no value is finite; a write's -errno; the
// reason in err. Borrows everything.
__attribute__((warn_unused_result))
int node_plot_write(const char *path, const node_plot_t *plot, char *err, size_t errlen);
// DIR/loss.svg of a run by `who` ("swarm router", "swarm train"): curve[k]
// is step k's loss, for steps first .. last - 1, with evals. Says where it
// went (unless quiet) or, on stderr, why not: the run goes on either way.
void node_plot_save(const char *dir, const char *who, const float *curve, long first,
                    long last, const node_evals_t *evals, int quiet);

// The trainer settings the options describe.
node_hparams_t node_train_hparams(const node_train_opts_t *o);

// ---- swarm status: the router's STATUS reply ----

// Read a STATUS reply's JSON (len bytes, not NUL-terminated, from the
// network) as `swarm status` does and, when out is not NULL, write the
// tables it shows for router addr. 0; -EPROTO with the reason in err;
// -ENOMEM. The fuzz target and the tests call it.
__attribute__((warn_unused_result))
int node_status_show(const char *text, size_t len, const char *addr, FILE *out, char *err,
                     size_t errlen);

typedef struct net_client_s net_client_t;
typedef struct net_msg_s net_msg_t;
typedef struct json_t json_t;

// One STATUS request to the router at addr (its history after cursor
// `since`, 0 all). 0 and *reply (type STATUS); -EINTR on Ctrl-C; else a
// negative errno and one line in err that says what to check.
__attribute__((warn_unused_result))
int node_status_ask(net_client_t *client, const char *addr, uint64_t since, net_msg_t **reply,
                    char *err, size_t errlen);
// node_status_show's checks, and the checked document in *doc (the
// caller's: json_decref): 0, -EPROTO with the reason in err, -ENOMEM.
__attribute__((warn_unused_result))
int node_status_load(const char *text, size_t len, json_t **doc, char *err, size_t errlen);

// ---- swarm status --serve: the dashboard (node/dashboard.c) ----

// Serve the page, /api/state and /metrics at `serve` ([HOST:]PORT),
// asking the router at addr every poll_s through client, until *stop.
// The exit status: 0 after Ctrl-C, 1 when it cannot listen.
int node_dashboard_run(net_client_t *client, const char *addr, const char *serve, double poll_s,
                       volatile sig_atomic_t *stop);
// The dashboard's path without sockets (the tests and the fuzz target): n
// answers' status texts (from the network) taken in order as its polls
// take them; *state and *metrics (malloc'd, NULL out of memory) are what
// /api/state and /metrics would serve after the last. The answers taken.
int node_dashboard_feed(const char *const *texts, const size_t *lens, int n, char **state,
                        char **metrics);

// mkdir -p DIR with mode (0755, 0700): 0, or -errno with err naming the
// folder that could not be made.
__attribute__((warn_unused_result))
int node_mkdirs(const char *dir, unsigned mode, char *err, size_t errlen);

// ---- a node's identity (node/identity.c) ----

typedef struct net_key_s net_key_t;

// The key pair a `swarm node` process runs with, claimed (an flock on
// NAME.lock) until node_identity_close or the process's end.
typedef struct {
    net_key_t *key;           // the pair (owned)
    char name[4096];          // its files: NAME.key, NAME.pub
    int made;                 // 1 when the pair was created now
    int lock_fd;              // NAME.lock, held; -1 when none could be made
    int index;                // N of the default name node-N (node: 1); 0 for --key
    char note[128];           // why not the first default name, or ""
} node_identity_t;

// key NULL: the first of $XDG_CONFIG_HOME/swarm/node, node-2, ... (or
// ~/.config/swarm/...) that no other process holds, created when new;
// else NAME: claimed, or -EBUSY when another process holds it. 0, or
// -errno with err naming the file and the fix.
__attribute__((warn_unused_result))
int node_identity_open(const char *key, node_identity_t *id, char *err, size_t errlen);
void node_identity_close(node_identity_t *id);

// ---- the join line (node/join.c) ----

// What --join names: the router's endpoint, and its key when the argument
// was a join token (swarm://HOST:PORT/KEY, the key in 64 hex digits).
typedef struct {
    char endpoint[300];       // tcp://HOST:PORT
    char router_key[41];      // Z85, from a token; "" for tcp://HOST:PORT
} node_join_t;

// Parse --join's argument (or swarm status's address). 0, or -EINVAL with
// err: "ARG: what is wrong; the forms it may take" (the caller names its flag).
__attribute__((warn_unused_result))
int node_join_parse(const char *arg, node_join_t *out, char *err, size_t errlen);
// The lines a router bound at `bound` (ZMQ_LAST_ENDPOINT) with public key
// z85 prints for volunteers: a token for each address one can reach it at
// (each non-loopback interface for 0.0.0.0), and the Z85 key quoted.
void node_join_print(FILE *out, const char *bound, const char *z85);

// ---- subcommands ----
int cmd_train(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_keygen(int argc, char **argv);
int cmd_router(int argc, char **argv);
int cmd_sim(int argc, char **argv);
int cmd_node(int argc, char **argv);
int cmd_status(int argc, char **argv);

// BLAKE2b-256 of the stage's parameters (little-endian float32) in hex:
// what replicas compare after every step (docs/swarm.md).
void node_stage_checksum(node_stage_t *self, char hex[65]);
// The same of n parameters anywhere (the router checks a state it is sent).
void node_params_checksum(const float *params, size_t n, char hex[65]);

// The corpus built into the binary (swarm's own docs and sources).
const uint8_t *node_corpus(size_t *n);

#endif
