#!/bin/sh
# test_dashboard.sh BUILD - swarm status --serve as people and Prometheus use
# it. A local swarm of 2 stages (five nodes, one of them a liar that --audit 1
# expels) trains while the dashboard polls its router; headless Chromium
# loads the page and the test reads the rendered DOM: every peer of the
# router's table is listed with its state, and the loss curve has as many
# points as steps done. A node is killed: within a few seconds the page
# shows it dead, with its reason (the screenshot is then saved as
# BUILD/dashboard.png). A real Prometheus scrapes /metrics (promtool checks
# the text); once every node is gone and the router holds still, its HTTP
# API gives the router's step and tokens/s, and /api/state equals `swarm
# status --json` but for the fields that are clocks. Bad input: a port in
# use, a router that never answers, one that answers garbage, and the
# router gone mid-run: one clear line each, and the page says "router
# unreachable since" instead of going blank. Ends with "N passed, N failed".
BUILD=${1:-build}
SWARM="$BUILD/swarm"
LIAR="$BUILD/swarm-misbehave"
. tests/lib.sh

for tool in chromium prometheus promtool curl jq; do
    command -v "$tool" >/dev/null 2>&1 || bad "$tool is missing: make deps installs it"
done
if [ $fail -gt 0 ]; then
    echo "$pass passed, $fail failed"
    exit 1
fi

head -c 30000 "$BUILD/corpus.txt" >"$TMP/data.txt"
TINY="--layers 2 --heads 4 --embd 32 --block 16 --batch 8 --micro-batch 2 --iters 100000 --warmup 2 --lr 1e-3 --eval-every 50 --eval-iters 2 --data $TMP/data.txt"
"$SWARM" keygen "$TMP/router" >/dev/null
SLOWDOWN=${SLOWDOWN:-40}

# page NAME: headless Chromium's DOM of the dashboard after its scripts ran
# (a few polls) in $TMP/NAME.html; with SHOT=FILE also a screenshot
page() {
    chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
        --user-data-dir="$TMP/chromium" --hide-scrollbars --window-size=1280,900 \
        --virtual-time-budget=2500 --dump-dom "$url" >"$TMP/$1.html" 2>"$TMP/$1.err"
    if [ -n "${SHOT:-}" ]; then
        chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
            --user-data-dir="$TMP/chromium" --hide-scrollbars --window-size=1280,900 \
            --virtual-time-budget=2500 --screenshot="$SHOT" "$url" >/dev/null 2>&1
    fi
}

# rows FILE: "ID STATE" of each peer row of a dumped page, sorted
rows() {
    grep -o '<tr class="peer" data-id="[0-9]*" data-state="[a-z]*"' "$1" \
        | sed 's/.*data-id="\([0-9]*\)" data-state="\([a-z]*\)"/\1 \2/' | sort
}

# state_cell FILE ID: the text of peer ID's state cell in a dumped page
state_cell() {
    sed -n "s/.*<tr class=\"peer\" data-id=\"$2\" data-state=\"[a-z]*\"[^>]*>\(.*\)/\1/p" "$1" \
        | sed 's|</tr>.*||; s|.*<td class="state">\([^<]*\)</td>.*|\1|' | head -n 1
}

# api: the dashboard's /api/state (the router's document)
api() {
    curl -s --max-time 5 "$url/api/state"
}

SWARM_PLAIN=1 "$SWARM" router $TINY --stages 2 --listen "tcp://127.0.0.1:0" --key "$TMP/router" \
    --assign even --rebalance-every 0 --log-every 1000 --audit 1 --verify 0 --min-nodes 5 \
    --save "$TMP/ck" --save-every 20 >"$TMP/router.log" 2>&1 &
router=$!
pids="$pids $router"
endpoint=$(wait_endpoint "$TMP/router.log")
log="$TMP/router.log"

"$SWARM" status "$endpoint" --router-key "$TMP/router.pub" --serve 127.0.0.1:0 --watch 0.5 \
    >"$TMP/dash.log" 2>&1 &
dash=$!
pids="$pids $dash"
wait_grep "$TMP/dash.log" "dashboard at http://" 10 || bad "the dashboard said nothing"
first=$(head -n 1 "$TMP/dash.log")
port=$(sed -n 's|^swarm status: dashboard at http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$TMP/dash.log")
url="http://127.0.0.1:$port"
if [ -n "$port" ]; then
    ok "its first line says where to point a browser: $first"
else
    bad "no address in the dashboard's first line: $first"
fi

# joins alternate between the stages: stage 0 gets h0, h2 and the liar (a
# third replica decides its audit), stage 1 h1 and h3
start_node "$log" h0 "$SWARM"
start_node "$log" h1 "$SWARM"
start_node "$log" h2 "$SWARM"
start_node "$log" h3 "$SWARM"
start_node "$log" liar "$LIAR" --misbehave grad@5

# Prometheus on loopback scrapes the dashboard every second
pport=$(awk 'BEGIN { srand(); print 20000 + int(rand() * 20000) }')
cat >"$TMP/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: swarm
    static_configs:
      - targets: ['127.0.0.1:$port']
EOF
prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/tsdb" \
    --web.listen-address="127.0.0.1:$pport" >"$TMP/prometheus.log" 2>&1 &
pids="$pids $!"

wait_grep "$log" "(liar) .*expelled for the run" 60 || bad "the liar was never expelled"
for _ in $(seq 1 100); do
    [ "$(api | jq '.step // 0')" -ge 30 ] 2>/dev/null && break
    sleep 0.2
done

# 1. the page lists every peer with its state, and one loss point a step
page run
doc_rows=$(api | jq -r '.peers[] | "\(.id) \(.state)"' | sort)
dom_rows=$(rows "$TMP/run.html")
points=$(sed -n 's/.*id="loss-chart"[^>]*data-points="\([0-9]*\)".*/\1/p' "$TMP/run.html" | head -n 1)
[ -n "$points" ] || points=$(sed -n 's/.*data-points="\([0-9]*\)"[^>]*id="loss-chart".*/\1/p' "$TMP/run.html" | head -n 1)
step=$(sed -n 's/.*<body[^>]*data-step="\([0-9]*\)".*/\1/p' "$TMP/run.html")
liar_id=$(api | jq -r '.peers[] | select(.name == "liar") | .id')
if [ -n "$dom_rows" ] && [ "$dom_rows" = "$doc_rows" ] && [ "$(echo "$dom_rows" | wc -l)" -eq 5 ]; then
    ok "the page lists the router's 5 peers with their states: $(echo "$dom_rows" | tr '\n' ' ')"
else
    bad "the page's peers '$dom_rows' are not the router's '$doc_rows'"
fi
liar_cell=$(state_cell "$TMP/run.html" "$liar_id")
case $liar_cell in
    "banned for the run ("*) ok "the liar's row: $liar_cell" ;;
    *) bad "the liar's row says '$liar_cell'" ;;
esac
if [ -n "$step" ] && [ "$step" -gt 0 ] && [ "$points" = "$step" ]; then
    ok "the loss curve has one point a step: $points points at step $step"
else
    bad "the loss curve has '$points' points at step '$step'"
fi

# 2. a node killed: the page shows it dead with its reason within seconds
h2_pid=$(pgrep -f -- "--name h2 " | head -n 1)
h2_id=$(api | jq -r '.peers[] | select(.name == "h2") | .id')
kill -9 "$h2_pid"
sleep 3
SHOT="$BUILD/dashboard.png" page kill
cell=$(state_cell "$TMP/kill.html" "$h2_id")
case $cell in
    "dead ("*")") ok "3 s after h2 was killed the page says: $cell (screenshot: $BUILD/dashboard.png)" ;;
    *) bad "3 s after h2 was killed its row says '$cell'" ;;
esac

# 3. the metrics: promtool passes them, names by Prometheus's conventions
curl -s --max-time 5 "$url/metrics" >"$TMP/metrics.txt"
if promtool check metrics <"$TMP/metrics.txt" >"$TMP/promtool.txt" 2>&1 \
    && grep -q '^swarm_stage_replicas{stage="0"} ' "$TMP/metrics.txt" \
    && grep -q '^swarm_peer_tokens_per_second{peer="[0-9]*",name="h0",stage="0"} ' "$TMP/metrics.txt" \
    && grep -q '^swarm_peers{state="ready"} 3$' "$TMP/metrics.txt" \
    && grep -q '^swarm_expelled_total 1$' "$TMP/metrics.txt" \
    && grep -q '^swarm_audited_steps_total [0-9]*$' "$TMP/metrics.txt" \
    && awk '$1 == "swarm_step_seconds_total" && $2 > 0 { f = 1 } END { exit !f }' "$TMP/metrics.txt"; then
    ok "promtool check metrics passes $(grep -c '^# TYPE' "$TMP/metrics.txt") families"
else
    bad "/metrics:"; cat "$TMP/promtool.txt"; head -40 "$TMP/metrics.txt"
fi

# an open swarm's table asked with a stranger's key: no peer's name or key,
# none of the log's events (they name peers), and a line saying how to see
# them; the dashboard, which found the router's own key pair beside its
# .pub, sees them all
"$SWARM" keygen "$TMP/stranger" >/dev/null
"$SWARM" status "$endpoint" --router-key "$TMP/router.pub" --key "$TMP/stranger" >"$TMP/stranger.txt" 2>&1
"$SWARM" status "$endpoint" --router-key "$TMP/router.pub" --key "$TMP/stranger" --json \
    >"$TMP/stranger.json" 2>&1
named=$(jq '[.peers[] | select(.name != null or .key != null)] | length' "$TMP/stranger.json")
events=$(jq '.history.events | length' "$TMP/stranger.json")
rows_seen=$(jq '.peers | length' "$TMP/stranger.json")
if [ "$named" = 0 ] && [ "$events" = 0 ] && [ "$rows_seen" -ge 4 ] \
    && [ "$(jq .names_hidden "$TMP/stranger.json")" = true ] \
    && grep -q "shows peers' names and keys only to its members" "$TMP/stranger.txt" \
    && ! grep -qE " (h0|h1|h3|liar) " "$TMP/stranger.txt" \
    && [ "$(api | jq '[.peers[] | select(.name == "h0" and (.key | length) == 40)] | length')" = 1 ] \
    && [ "$(api | jq '.history.events | length')" -gt 0 ]; then
    ok "a stranger's status shows $rows_seen peers with no name, key or event, and says why; the operator's all"
else
    bad "a stranger's status (named $named, events $events):"; head -20 "$TMP/stranger.txt"
fi

# every node gone: the stage rolls back to its checkpoint and the router holds still
for n in h0 h1 h3; do pkill -9 -f -- "--name $n " ; done
wait_grep "$log" "lost every replica at step .*: rolling back" 20 || bad "no rollback"
for _ in $(seq 1 50); do
    a=$(api | jq -c '[.step, .tok_s, .history.cursor]')
    sleep 0.6
    [ "$a" = "$(api | jq -c '[.step, .tok_s, .history.cursor]')" ] && break
done
"$SWARM" status "$endpoint" --router-key "$TMP/router.pub" --json >"$TMP/status.json" 2>&1
api >"$TMP/api.json"
rstep=$(jq .step "$TMP/status.json")
rtok=$(jq .tok_s "$TMP/status.json")

# 4. Prometheus's own API has the swarm's values
query() {
    curl -s --max-time 5 "http://127.0.0.1:$pport/api/v1/query?query=$1" | jq -r '.data.result[0].value[1] // empty'
}
for _ in $(seq 1 60); do
    [ "$(query swarm_step)" = "$rstep" ] && [ "$(query swarm_tokens_per_second)" = "$rtok" ] && break
    sleep 0.5
done
pstep=$(query swarm_step)
ptok=$(query swarm_tokens_per_second)
if [ -n "$rstep" ] && [ "$pstep" = "$rstep" ] && [ "$ptok" = "$rtok" ]; then
    ok "Prometheus scraped swarm_step $pstep and swarm_tokens_per_second $ptok: the router's"
else
    bad "Prometheus has swarm_step '$pstep', swarm_tokens_per_second '$ptok'; the router '$rstep', '$rtok'"
    tail -5 "$TMP/prometheus.log"
fi

# 5. /api/state is swarm status --json's document (less its clocks and the
# live readings a HEARTBEAT between the two reads may change: the expelled
# liar still sends them), valid JSON with peers ready, dead and banned for
# the run
clocks='del(.now_s, .eta_s)
    | .peers |= map(del(.heartbeat_age_s, .banned_s, .memory_used, .memory_heap, .rss, .rss_grown, .device_used))'
states=$(jq -r '[.peers[].state] | unique | join(" ")' "$TMP/api.json")
if jq -S "$clocks" "$TMP/status.json" >"$TMP/a.json" && jq -S "$clocks" "$TMP/api.json" >"$TMP/b.json" \
    && cmp -s "$TMP/a.json" "$TMP/b.json" && [ "$(jq '.history.loss | length' "$TMP/api.json")" -gt 0 ] \
    && jq -e '.peers[] | select(.expelled and .banned_s == null)' "$TMP/api.json" >/dev/null; then
    ok "/api/state is swarm status --json's document (states: $states; $(wc -c <"$TMP/api.json") bytes)"
else
    bad "/api/state and swarm status --json differ:"; diff "$TMP/a.json" "$TMP/b.json" | head -20
fi

# 6. bad input: --serve on a port in use, or no address at all
"$SWARM" status "$endpoint" --router-key "$TMP/router.pub" --serve "127.0.0.1:$port" \
    >"$TMP/busy.out" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ "$(wc -l <"$TMP/busy.out")" -eq 1 ] \
    && grep -q "cannot listen on 127.0.0.1:$port (Address already in use)" "$TMP/busy.out"; then
    ok "a port in use: $(cat "$TMP/busy.out")"
else
    bad "--serve on a port in use (exit $rc):"; cat "$TMP/busy.out"
fi
"$SWARM" status "$endpoint" --router-key "$TMP/router.pub" --serve "nowhere:x" >"$TMP/addr.out" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "give \[HOST:\]PORT" "$TMP/addr.out"; then
    ok "a bad --serve address: $(cat "$TMP/addr.out")"
else
    bad "--serve nowhere:x (exit $rc):"; cat "$TMP/addr.out"
fi

# the router gone: the page keeps the swarm and says since when
kill -9 "$router"
sleep 5.5
page gone
banner=$(sed -n 's/.*<[a-z]* id="unreachable"[^>]*>\([^<]*\)<.*/\1/p' "$TMP/gone.html" | head -n 1)
if echo "$banner" | grep -q "^router unreachable since " && [ -n "$(rows "$TMP/gone.html")" ] \
    && ! grep -q 'id="unreachable" hidden' "$TMP/gone.html" \
    && grep -q "no answer from $endpoint within 4 s" "$TMP/dash.log"; then
    ok "the router killed: the page keeps its peers and says '$banner'"
else
    bad "the router killed: banner '$banner'"; tail -3 "$TMP/dash.log"
fi
[ "$(grep -c "no answer from" "$TMP/dash.log")" -eq 1 ] && ok "the dashboard's log says it once" \
    || bad "the dashboard logged the outage $(grep -c "no answer from" "$TMP/dash.log") times"

# a router that never answers; one that answers garbage
# (each serves its page at once and says why it has nothing to show)
"$SWARM" keygen "$TMP/rogue" >/dev/null
"$BUILD/rogue" badrouter "$TMP/rogue" >"$TMP/rogue.log" 2>&1 &
pids="$pids $!"
wait_grep "$TMP/rogue.log" "listening on" 10
rogue_ep=$(sed -n 's/^rogue: listening on //p' "$TMP/rogue.log")
for kind in silent garbage; do
    if [ $kind = silent ]; then target=tcp://127.0.0.1:9; else target=$rogue_ep; fi
    key=$TMP/router.pub
    [ $kind = garbage ] && key=$TMP/rogue.pub
    "$SWARM" status "$target" --router-key "$key" --serve 127.0.0.1:0 >"$TMP/$kind.log" 2>&1 &
    kpid=$!
    pids="$pids $kpid"
    wait_grep "$TMP/$kind.log" "the page says so" 10
    url="http://127.0.0.1:$(sed -n 's|^swarm status: dashboard at http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$TMP/$kind.log")"
    page "$kind"
    banner=$(sed -n 's/.*<[a-z]* id="unreachable"[^>]*>\([^<]*\)<.*/\1/p' "$TMP/$kind.html" | head -n 1)
    line=$(sed -n '2p' "$TMP/$kind.log")
    want="no answer from tcp://127.0.0.1:9 within 4 s"
    [ $kind = garbage ] && want="sent a malformed status: .*step"
    if echo "$banner" | grep -q "^router unreachable since " && echo "$line" | grep -q "$want"; then
        ok "a router that is $kind: the page says '$banner'"
    else
        bad "a router that is $kind: banner '$banner', log:"; cat "$TMP/$kind.log"
    fi
    kill "$kpid"
done

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
