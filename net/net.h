/* net.h - everything the swarm says goes through here: messages (a header
 * frame + payload frames), tensor codecs (fp32, fp16, blockwise int8), Curve
 * keys, and the ROUTER/DEALER transport with ZAP authentication.
 *
 * net knows tensors only as {dtype, dims, bytes} and nothing of the model.
 * Every function that can fail returns 0 or a negative errno; those that can
 * say why also write a reason into (err, errlen). docs/wire.md is the spec.
 */
#ifndef SWARM_NET_H
#define SWARM_NET_H

#include <stddef.h>
#include <stdint.h>

// ---- hard limits -----------------------------------------------------------

#define NET_WIRE_VERSION 1                 // protocol version on the wire
#define NET_TENSORS_MAX 4                  // tensors per message
#define NET_DIMS_MAX 4                     // dims per tensor
#define NET_META_MAX (1u << 20)            // bytes of meta text per message
#define NET_PAYLOAD_MAX (1ull << 31)       // bytes of tensor payload per message
#define NET_INT8_BLOCK 64                  // values per int8 block (one scale each)
#define NET_KEY_Z85_LEN 40                 // chars of a Z85 Curve key

// ---- message types (docs/wire.md lists who sends which) ----------------------

enum {
    NET_MSG_HELLO = 1,      // node -> router: name, device, memory, throughput (meta)
    NET_MSG_ASSIGN = 2,     // router -> node: your stage (and the plan, meta)
    NET_MSG_HEARTBEAT = 3,  // both ways: liveness, queue depth, tok/s, checksum (meta)
    NET_MSG_FWD = 4,        // router -> node: forward micro-batch mb of stage
    NET_MSG_BWD = 5,        // router -> node: backward (stage input + output grad)
    NET_MSG_RESULT = 6,     // node -> router: output of FWD/BWD (reply)
    NET_MSG_STEP = 7,       // router -> node: close step k, send your gradient
    NET_MSG_GRAD = 8,       // node -> router: summed gradient + sample count
    NET_MSG_UPDATE = 9,     // router -> node: averaged gradient to apply
    NET_MSG_STATE_GET = 10, // ask for a stage's parameters and moments
    NET_MSG_STATE = 11,     // a stage's parameters and moments
    NET_MSG_STATUS = 12,    // status client <-> router: the swarm table (meta)
    NET_MSG_ERROR = 13,     // reply: the request failed, reason in meta
    NET_MSG_BYE = 14,       // either side leaves cleanly
    NET_MSG_TYPE_MAX = 14,  // highest known type
};

enum {
    NET_FLAG_REPLY = 1,     // the message answers the request with the same id
    NET_FLAGS_KNOWN = 1,    // every flag bit this version defines
};

// Tensor encodings. f32/f16/i8 carry floats (net_msg_tensor decodes them);
// u8 and i32 carry raw little-endian integers (tokens, targets).
enum {
    NET_DTYPE_F32 = 1,      // IEEE binary32, exact
    NET_DTYPE_F16 = 2,      // IEEE binary16, round to nearest even
    NET_DTYPE_I8 = 3,       // blocks of NET_INT8_BLOCK: f32 scale + int8 values
    NET_DTYPE_U8 = 4,       // raw bytes
    NET_DTYPE_I32 = 5,      // raw int32
    NET_DTYPE_MAX = 5,      // highest known dtype
};

// What a receiver accepts, within the hard limits above (net_limits_check).
// max_tensors and max_meta may be 0 (control messages only).
typedef struct {
    uint32_t max_tensors;   // tensors per message, <= NET_TENSORS_MAX
    uint32_t max_dims;      // dims per tensor, <= NET_DIMS_MAX
    uint32_t max_dim;       // elements along any one dim
    uint64_t max_payload;   // bytes of all tensor payloads of one message, <= NET_PAYLOAD_MAX
    uint32_t max_meta;      // bytes of meta text, <= NET_META_MAX
} net_limits_t;

// 0 when every field is within the hard limits, else -EINVAL with a reason.
__attribute__((warn_unused_result))
int net_limits_check(const net_limits_t *limits, char *err, size_t errlen);

// One tensor as the wire sees it.
typedef struct {
    uint8_t dtype;                   // NET_DTYPE_*
    uint8_t ndims;                   // 1..NET_DIMS_MAX
    uint32_t dims[NET_DIMS_MAX];     // elements per dim; entries >= ndims are 0
    uint64_t bytes;                  // payload bytes on the wire
} net_shape_t;

// The header frame, decoded. The caller sets type, flags, id, step, stage,
// mb; the add/set functions below keep meta_len, ntensors and tensors.
typedef struct {
    uint16_t type;                   // NET_MSG_*
    uint8_t flags;                   // NET_FLAG_* bits
    uint64_t id;                     // request id; a reply carries its request's
    uint64_t step;                   // optimizer step
    uint32_t stage;                  // pipeline stage
    uint32_t mb;                     // micro-batch within the step
    uint32_t meta_len;               // bytes of the meta frame, 0 = no meta frame
    uint8_t ntensors;                // tensor frames, 0..NET_TENSORS_MAX
    net_shape_t tensors[NET_TENSORS_MAX]; // descriptors, ntensors used
} net_head_t;

// "HELLO", "FWD", ... or "?" for an unknown type.
const char *net_msg_type_name(int type);

// ---- tensor codecs ---------------------------------------------------------

// Bytes that n values take in dtype; 0 when dtype is unknown, n is 0 or the
// size overflows.
uint64_t net_codec_bytes(int dtype, uint64_t n);

// Encode n floats into dst (cap bytes). 0; -EINVAL dtype not f32/f16/i8;
// -ENOBUFS cap too small; -EDOM a value is NaN or infinite; -ERANGE a value
// overflows fp16 (|x| >= 65520). dst is undefined on error.
__attribute__((warn_unused_result))
int net_codec_encode(int dtype, const float *src, size_t n, void *dst, size_t cap);

// Decode `bytes` of dtype into n floats. 0; -EINVAL dtype not f32/f16/i8;
// -EPROTO bytes != net_codec_bytes(dtype, n), or content that no encoder
// writes (a non-finite value or scale, a negative scale, int8 -128).
__attribute__((warn_unused_result))
int net_codec_decode(int dtype, const void *src, size_t bytes, float *dst, size_t n);

// ---- messages --------------------------------------------------------------

typedef struct net_msg_s net_msg_t;

// A new empty message of `type` (flags, ids 0). NULL when out of memory.
net_msg_t *net_msg_new(int type);
// A reply to req: same id, step, stage, mb; NET_FLAG_REPLY set.
net_msg_t *net_msg_reply(const net_msg_t *req, int type);
// A copy that shares the payload frames (reference counted). NULL on OOM.
net_msg_t *net_msg_dup(const net_msg_t *self);
// Bytes a message takes besides its frames' (for memory accounts).
size_t net_msg_overhead(void);
void net_msg_destroy(net_msg_t **self_p);

// The header: set type, flags, id, step, stage, mb through it; the rest is
// the message's own bookkeeping (read only).
net_head_t *net_msg_head(net_msg_t *self);
const net_head_t *net_msg_head_const(const net_msg_t *self);

// Append a tensor of floats encoded as dtype (f32, f16 or i8).
// 0; -EINVAL bad dtype/dims or NET_TENSORS_MAX reached; -EDOM/-ERANGE as
// net_codec_encode; -ENOMEM.
__attribute__((warn_unused_result))
int net_msg_add_tensor(net_msg_t *self, int dtype, const uint32_t *dims, int ndims,
                       const float *src);
// Append a tensor given as its wire bytes (any dtype; `bytes` must equal
// net_codec_bytes(dtype, prod dims)). Copies. Same errors, plus -EINVAL on
// a length mismatch.
__attribute__((warn_unused_result))
int net_msg_add_raw(net_msg_t *self, int dtype, const uint32_t *dims, int ndims,
                    const void *data, size_t bytes);
// Append tensor i of src, of its dtype, as dims (its bytes must be what
// dims make): the frame is shared (reference counted), not copied. Same
// errors as net_msg_add_raw, and -EINVAL when src has no tensor i.
__attribute__((warn_unused_result))
int net_msg_add_shared(net_msg_t *self, const net_msg_t *src, int i, const uint32_t *dims,
                       int ndims);
// Set the meta text (no NUL inside; "key=value" lines by convention).
// Replaces any earlier one. 0, -EINVAL (too long), -ENOMEM.
__attribute__((warn_unused_result))
int net_msg_set_meta(net_msg_t *self, const char *text);

// Decode tensor i (f32, f16 or i8) into n floats.
// 0; -EINVAL no tensor i, raw dtype, or n != its element count; -EPROTO bad
// content (see net_codec_decode).
__attribute__((warn_unused_result))
int net_msg_tensor(const net_msg_t *self, int i, float *dst, size_t n);
// Tensor i's wire bytes (borrowed, unaligned), NULL if there is none.
const void *net_msg_raw(const net_msg_t *self, int i, size_t *bytes);
// The meta text (borrowed, NOT NUL-terminated) and its length; NULL if none.
const char *net_msg_meta(const net_msg_t *self, size_t *len);
// Copy the value of "key=value" from the meta text into out (NUL-terminated).
// 0; -ENOENT no such key; -ENOBUFS value longer than cap - 1.
__attribute__((warn_unused_result))
int net_msg_meta_get(const net_msg_t *self, const char *key, char *out, size_t cap);

// Send on a zmq socket without blocking; always takes *msg (nulled, sent or
// freed). 0; -EAGAIN not sendable now (HWM, no peer); -EINVAL a malformed
// message; other -zmq_errno().
__attribute__((warn_unused_result))
int net_send(void *socket, net_msg_t **msg);
// Receive one message without blocking and check it against limits.
// 0 and *out; -EAGAIN nothing waiting; -EPROTO malformed (reason in err,
// message dropped); other -zmq_errno().
__attribute__((warn_unused_result))
int net_recv(void *socket, const net_limits_t *limits, net_msg_t **out,
             char *err, size_t errlen);

// ---- float tensors between router and nodes (net/tensors.c) ----

// A wire format's name ("fp32", "fp16", "int8") as its NET_DTYPE_*; -EINVAL
// naming --FLAG otherwise.
__attribute__((warn_unused_result))
int net_dtype_parse(const char *flag, const char *name, int *dtype, char *err, size_t errlen);
// The name of NET_DTYPE_F32/F16/I8, "?" for anything else.
const char *net_dtype_name(int dtype);
// Append src (dims) to msg as dtype. An fp16 tensor is first multiplied by
// 2^k, k chosen so that its largest magnitude lies in [2^14, 2^15), and k is
// written to *pow2 (0 for other formats and all-zero tensors): the sender
// puts "pow2_I=k" in the meta for tensor I. Errors of net_msg_add_tensor,
// -ENOMEM.
__attribute__((warn_unused_result))
int net_tensor_add(net_msg_t *msg, int dtype, const uint32_t *dims, int ndims, const float *src,
                  int *pow2);
// Meta "pow2_I" of msg (0 when absent); -EPROTO when it is not a whole
// number in -100..100.
__attribute__((warn_unused_result))
int net_tensor_pow2(const net_msg_t *msg, int i, int *pow2);
// Decode float tensor i of msg (any of the three formats) into n floats and
// undo its pow2_I scale: at 0, every value is finite. Errors of
// net_msg_tensor (-EPROTO for a non-finite value); -EPROTO for a bad scale
// or a value it would make infinite.
__attribute__((warn_unused_result))
int net_tensor_get(const net_msg_t *msg, int i, float *dst, size_t n);

// ---- keys ------------------------------------------------------------------

// A Curve25519 key pair (or a public key alone) in sodium_malloc memory,
// wiped when destroyed.
typedef struct net_key_s net_key_t;

// A fresh key pair. 0, -ENOMEM.
__attribute__((warn_unused_result))
int net_key_generate(net_key_t **out);
// From a Z85 public key (40 chars). 0, -EINVAL.
__attribute__((warn_unused_result))
int net_key_from_z85(const char *z85, net_key_t **out);
// Write NAME.pub (0644) and NAME.key (0600) for a key pair. Refuses to
// overwrite unless force. 0; -EEXIST; -EINVAL no secret; other -errno.
__attribute__((warn_unused_result))
int net_key_save(const net_key_t *self, const char *name, int force, char *err, size_t errlen);
// Read a key pair from NAME.key (must not be readable by group or others)
// and NAME.pub, and check that they match. 0; -EACCES bad mode; -EINVAL bad
// contents; other -errno. err names the file and the fix.
__attribute__((warn_unused_result))
int net_key_load(const char *name, net_key_t **out, char *err, size_t errlen);
// The folder swarm keeps its key pairs in when none is named:
// $XDG_CONFIG_HOME/swarm, else ~/.config/swarm. 0, or -ENOENT when neither
// variable is set.
int net_key_dir(char *dir, size_t cap);
// Read a public key file (PATH as given, e.g. "router.pub").
__attribute__((warn_unused_result))
int net_key_load_public(const char *path, net_key_t **out, char *err, size_t errlen);
// The Z85 public key (borrowed, NUL-terminated).
const char *net_key_public(const net_key_t *self);
int net_key_has_secret(const net_key_t *self);
void net_key_destroy(net_key_t **self_p);

// An allow-list of public keys, safe to share with the server's ZAP thread
// and to extend while the server runs.
typedef struct net_allow_s net_allow_t;
net_allow_t *net_allow_new(void);
void net_allow_destroy(net_allow_t **self_p);
// Add a Z85 public key. 0, -EINVAL (not a key), -ENOMEM.
__attribute__((warn_unused_result))
int net_allow_add(net_allow_t *self, const char *z85);
// Add every key of a file: one Z85 key per line, '#' comments, blank lines.
// All or nothing: on error no key of the file was added.
// 0; -EINVAL with the line number; other -errno.
__attribute__((warn_unused_result))
int net_allow_load(net_allow_t *self, const char *path, char *err, size_t errlen);
// Replace the list with the keys of a file, in one swap under the list's
// lock: the ZAP thread and net_server_recv see the old list or the new one,
// never a mix. A file that cannot be read or has a bad line leaves the list
// as it was. Errors as net_allow_load.
__attribute__((warn_unused_result))
int net_allow_reload(net_allow_t *self, const char *path, char *err, size_t errlen);
int net_allow_contains(const net_allow_t *self, const char *z85);
size_t net_allow_size(const net_allow_t *self);

// ---- transport -------------------------------------------------------------

// Milliseconds on CLOCK_MONOTONIC: deadlines are in this clock.
int64_t net_clock_ms(void);

// Link and liveness timing. Zero fields take the defaults in brackets.
typedef struct {
    int heartbeat_ms;        // ZMTP PING interval, ms [1000]
    int heartbeat_timeout_ms;// ZMTP: close a link silent this long, ms [3 x heartbeat_ms]
    int dead_ms;             // application: a peer silent this long is dead, ms [3000]
    int hwm;                 // queued messages per peer and direction [1000]
} net_timing_t;

// A peer's identity: its Curve public key as the ZAP handler saw it (the
// User-Id), never the routing id it chose. Each net_client process picks
// a routing id of its own, KEY/INSTANCE (INSTANCE: 16 random hex digits),
// so two processes with one key are two connections the caller can tell
// apart and answer one by one; conn is that routing id (a client that
// sets its key alone as its routing id is accepted too).
#define NET_CONN_MAX (NET_KEY_Z85_LEN + 1 + 32)
typedef struct {
    char key[NET_KEY_Z85_LEN + 1];   // Z85 public key, NUL-terminated
    char conn[NET_CONN_MAX + 1];     // the connection's routing id, NUL-terminated
} net_peer_t;

typedef struct {
    uint64_t msgs_in;        // messages received and accepted
    uint64_t msgs_out;       // messages sent
    uint64_t bad;            // messages dropped as malformed or forged
    uint64_t stale;          // replies dropped as stale (client)
    uint64_t auth_denied;    // handshakes the ZAP handler refused (server)
    uint64_t revoked;        // messages dropped: the sender's key left the allow-list (server)
} net_stats_t;

typedef struct net_server_s net_server_t;

typedef struct {
    const char *endpoint;    // bind address, e.g. "tcp://*:7070" or "tcp://127.0.0.1:*"
    const net_key_t *key;    // the router's key pair (copied into zmq)
    const net_allow_t *allow;// allow-list (borrowed, must outlive the server), NULL = open;
                             // checked at every handshake and every message, so a key
                             // removed by net_allow_reload is refused from then on
    net_limits_t limits;     // what peers may send us
    net_timing_t timing;     // heartbeats and liveness
    int max_peers;           // peers tracked for liveness [4096]
} net_server_config_t;

// Start a ROUTER with a ZAP handler bound first in its own context.
// 0; -ENOTSUP libzmq lacks CURVE; -EADDRINUSE ZAP or endpoint taken;
// -EINVAL bad config; other -errno. err says which.
__attribute__((warn_unused_result))
int net_server_new(const net_server_config_t *config, net_server_t **out,
                   char *err, size_t errlen);
void net_server_destroy(net_server_t **self_p);
// The endpoint actually bound, with its port (e.g. "tcp://127.0.0.1:40123").
const char *net_server_endpoint(const net_server_t *self);
// Wait until deadline_ms (net_clock_ms) for one message. 0 with *peer and
// *out; -ETIMEDOUT; -EPROTO a bad message from *peer, or one whose key is
// no longer on the allow-list (dropped, counted, reason in err); -EINTR;
// other -errno.
__attribute__((warn_unused_result))
int net_server_recv(net_server_t *self, int64_t deadline_ms, net_peer_t *peer,
                    net_msg_t **out, char *err, size_t errlen);
// Send to a peer without blocking; always takes *msg. 0; -EHOSTUNREACH not
// connected; -EAGAIN its queue is full; -EINVAL malformed message.
__attribute__((warn_unused_result))
int net_server_send(net_server_t *self, const net_peer_t *peer, net_msg_t **msg);
// Peers silent for longer than timing.dead_ms at now_ms: up to cap of them
// are written to dead[], forgotten, and counted in *n.
void net_server_reap(net_server_t *self, int64_t now_ms, net_peer_t *dead, size_t cap,
                     size_t *n);
// A new timing.dead_ms (> 0) from now on: a big swarm's nodes beat less often.
void net_server_set_dead_ms(net_server_t *self, int dead_ms);
void net_server_stats(const net_server_t *self, net_stats_t *out);

typedef struct net_client_s net_client_t;

typedef struct {
    const char *endpoint;    // the router, e.g. "tcp://10.0.0.1:7070"
    const net_key_t *server; // the router's public key
    const net_key_t *key;    // our key pair (copied into zmq)
    net_limits_t limits;     // what the router may send us
    net_timing_t timing;     // ZMTP heartbeats, hwm (the caller judges the router's
                             // silence with net_client_silence_ms)
} net_client_config_t;

// A DEALER connecting to the router (connects in the background).
// 0; -ENOTSUP no CURVE; -EINVAL bad config; other -errno.
__attribute__((warn_unused_result))
int net_client_new(const net_client_config_t *config, net_client_t **out,
                   char *err, size_t errlen);
void net_client_destroy(net_client_t **self_p);
// Send without blocking; always takes *msg. 0; -EAGAIN; -EINVAL.
__attribute__((warn_unused_result))
int net_client_send(net_client_t *self, net_msg_t **msg);
// Wait until deadline_ms for one message. 0; -ETIMEDOUT; -EPROTO (dropped,
// reason in err); -EINTR.
__attribute__((warn_unused_result))
int net_client_recv(net_client_t *self, int64_t deadline_ms, net_msg_t **out,
                    char *err, size_t errlen);
// ms since the router was last heard from (any message), at now_ms.
int64_t net_client_silence_ms(const net_client_t *self, int64_t now_ms);
// Drop the link to the router and connect again (a fresh Curve handshake);
// messages queued for it are dropped. libzmq reconnects by itself after a
// lost connection, but never after the router refused our key: a node
// that waits to be put on a private swarm's allow-list calls this now and
// then. 0 or -zmq_errno().
__attribute__((warn_unused_result))
int net_client_reconnect(net_client_t *self);
void net_client_stats(const net_client_t *self, net_stats_t *out);

// The request helper: give *req a fresh id, send it, wait timeout_ms for
// the reply (REPLY flag, same id), resend up to tries times in all. Stale
// replies (earlier ids) are dropped and counted; other messages that arrive
// meanwhile are kept for net_client_recv (up to 256, then dropped).
// Always takes *req. 0 and *reply; -ETIMEDOUT after the last try; other
// errors as net_client_send.
typedef struct {
    int timeout_ms;          // per try, ms
    int tries;               // sends in all, >= 1
} net_retry_t;

__attribute__((warn_unused_result))
int net_client_request(net_client_t *self, net_msg_t **req, const net_retry_t *retry,
                       net_msg_t **reply, char *err, size_t errlen);

#endif
