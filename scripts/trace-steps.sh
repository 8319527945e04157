#!/bin/sh
# trace-steps.sh TRACE [FROM [TO]] - where the time of a swarm's steps goes,
# from a router run with --trace TRACE: over steps FROM..TO-1 (default: from
# step 5, skipping the start, to the last step traced)
#   - each peer's busy share: the time it held FWD/BWD work (sent and not yet
#     answered), as a fraction of the span, and how many requests it got;
#   - each stage's idle time at the step boundary: from the end of the step
#     before to its first FWD of the step (the pipeline filling), and from
#     its last FWD/BWD answer of the step to the step's end (draining, the
#     gradient exchange): the bottleneck stage's share of these is what a
#     run loses against the bound (docs/performance.md).
# Reads the file only; asserts nothing.
set -eu
[ $# -ge 1 ] || {
    echo "usage: trace-steps.sh TRACE [FROM [TO]]  (TRACE: from swarm router --trace TRACE)" >&2
    exit 2
}
[ -r "$1" ] || { echo "trace-steps.sh: cannot read $1 (write one with swarm router --trace FILE)" >&2; exit 2; }
awk -v from="${2:-5}" -v to="${3:--1}" '
$2 == "step" { end[$3] = $1; if ($3 > last) last = $3; next }
NF == 7 && ($4 == "FWD" || $4 == "BWD") {
    n++; t[n] = $1; ev[n] = $2; st[n] = $3; kind[n] = $4; mb[n] = $5; sg[n] = $6; pr[n] = $7
}
END {
    if (to < 0) to = last + 1
    if (!((from - 1) in end) || !((to - 1) in end) || to - from < 1) {
        printf "trace-steps.sh: the trace has no steps %d..%d (it ends at step %d)\n", from, to - 1, last
        exit 1
    }
    t0 = end[from - 1]; t1 = end[to - 1]; span = t1 - t0
    for (i = 1; i <= n; i++) {
        p = pr[i]; stage[p] = sg[i]
        if (ev[i] == "send") {
            if (held[p]++ == 0) since[p] = t[i]
            if (t[i] >= t0 && t[i] < t1) reqs[p]++
            if (kind[i] == "FWD" && st[i] >= from && st[i] < to && !((st[i], sg[i]) in first))
                first[st[i], sg[i]] = t[i]
        } else if (held[p] > 0) {
            if (--held[p] == 0) {
                a = since[p] > t0 ? since[p] : t0; b = t[i] < t1 ? t[i] : t1
                if (b > a) busy[p] += b - a
            }
            if (mb[i] >= 0 && st[i] >= from && st[i] < to) lastdone[st[i], sg[i]] = t[i]
        }
        if (sg[i] + 1 > stages) stages = sg[i] + 1
    }
    printf "steps %d..%d: %.2f s, %.0f ms a step\n", from, to - 1, span / 1000, span / (to - from)
    printf "%6s %6s %6s %9s\n", "peer", "stage", "busy", "requests"
    for (p in stage) printf "%6d %6d %6.2f %9d\n", p, stage[p], busy[p] / span, reqs[p] | "sort -n"
    close("sort -n")
    printf "%6s %22s %22s\n", "stage", "idle before 1st FWD", "idle after last answer"
    for (s = 0; s < stages; s++) {
        f = d = k = 0
        for (x = from; x < to; x++) {
            if (!((x, s) in first) || !((x, s) in lastdone)) continue
            f += first[x, s] - end[x - 1]; d += end[x] - lastdone[x, s]; k++
        }
        if (k > 0) printf "%6d %19.0f ms %19.0f ms\n", s, f / k, d / k
    }
}' "$1"
