#!/bin/sh
# test_quickstart.sh BUILD - README's "Quick start" as a new user walks it:
# in a HOME with no keys, the code block's commands run literally through
# sh (in a scratch folder whose build/ is BUILD), the join line the router
# prints pasted into `sh -c` and `bash -c` for two nodes started at the
# same moment without --key: both join with identities of their own,
# README's `swarm status` line (with the printed token) shows both, the run
# finishes, and both nodes say so. Meanwhile, a node given a key a live node
# holds: refused at start on this machine; a copy of that key: refused by
# the router, and both sides told. Every printed join line is also checked
# to reach a program unchanged through sh, bash, zsh and fish (those here).
# Ends with "N passed, N failed".
BUILD=${1:-build}
. tests/lib.sh
ABS_BUILD=$(cd "$BUILD" && pwd)
README=README.md
export HOME="$TMP/home"
unset XDG_CONFIG_HOME
mkdir -p "$HOME" "$TMP/work"
ln -s "$ABS_BUILD" "$TMP/work/build"

# the first ```sh block after "## Quick start", and its `swarm status` line
block=$(awk '/^## Quick start/ { on = 1 } on && /^```sh/ { n++; next } on && /^```/ { if (n == 1) exit; next }
             on && n == 1 { print }' "$README")
status_line=$(awk '/^## Quick start/ { on = 1 } on && /^swarm status / { print; exit }' "$README" | sed 's/ *#.*//')
if echo "$block" | grep -q "^swarm router " && [ -n "$status_line" ]; then
    ok "README's quick start: $(echo "$block" | tr '\n' ';')"
else
    bad "no quick start block with a swarm router line in $README"; lib_done; exit 1
fi

(cd "$TMP/work" && exec sh -c "$block") >"$TMP/router.log" 2>&1 &
shell=$!
pids="$shell"
if wait_grep "$TMP/router.log" "^  swarm node --join swarm://127.0.0.1:" 20; then
    ok "the router prints a join line for this machine"
else
    bad "no join line within 20 s:"; cat "$TMP/router.log"; lib_done; exit 1
fi
router=$(pgrep -P "$shell" | head -1)
[ -n "$router" ] || router=$shell
pids="$pids $router"
# the whole printed line, as a person pastes it (a note once followed the
# token on it, and bash failed on its parenthesis)
line=$(sed -n 's/^  \(swarm node --join swarm:\/\/127\.0\.0\.1:.*\)$/\1/p' "$TMP/router.log" | head -1)
token=${line#swarm node --join }

# every printed form reaches the program as it was printed, in every shell here
key=$(sed -n 's/^swarm router: public key //p' "$TMP/router.log")
for sh in sh bash zsh fish; do
    command -v "$sh" >/dev/null 2>&1 || continue
    for l in "$line" "$(grep -e "--router-key '" "$TMP/router.log" | sed 's/^ *//')"; do
        got=$("$sh" -c "printf '[%s]' ${l#swarm node }" 2>&1)
        want=$(echo "${l#swarm node }" | sed "s/'//g" | awk '{ for (i = 1; i <= NF; i++) printf "[%s]", $i }')
        if [ "$got" = "$want" ]; then
            ok "$sh passes '${l#swarm node }' unchanged"
        else
            bad "$sh changes the join line: got $got, want $want"
        fi
    done
done
echo "$want" | grep -qF "[$key]" && ok "the quoted form carries the router's Z85 key" \
    || bad "the quoted form lacks the key $key: $want"

# two nodes at the same moment, no --key, the line as pasted
(cd "$TMP/work" && PATH="$ABS_BUILD:$PATH" exec sh -c "$line") >"$TMP/node1.log" 2>&1 &
n1=$!
(cd "$TMP/work" && PATH="$ABS_BUILD:$PATH" exec bash -c "$line") >"$TMP/node2.log" 2>&1 &
n2=$!
pids="$pids $n1 $n2"
if wait_grep "$TMP/router.log" "every stage has a peer; training" 30; then
    ok "both nodes joined and training started"
else
    bad "training did not start:"; cat "$TMP/router.log" "$TMP/node1.log" "$TMP/node2.log"
    lib_done; exit 1
fi
pids="$pids $(pgrep -xf "swarm node --join $token")" # the nodes, also where sh forked them
k1=$(sed -n '1s/.*node key \([^ ]*\.key\).*/\1/p' "$TMP/node1.log")
k2=$(sed -n '1s/.*node key \([^ ]*\.key\).*/\1/p' "$TMP/node2.log")
if [ -n "$k1" ] && [ -n "$k2" ] && [ "$k1" != "$k2" ] && [ -f "$k1" ] && [ -f "$k2" ]; then
    ok "each node says its own key in its first line: $(basename "$k1"), $(basename "$k2")"
else
    bad "the nodes' keys: '$k1' '$k2'"; head -2 "$TMP/node1.log" "$TMP/node2.log"
fi

# the node that took node-2.key names the live node holding node.key (they
# started together: the holder may not have written its pid yet)
first=$(head -qn1 "$TMP/node1.log" "$TMP/node2.log" | grep "node\.key is in use")
said=$(echo "$first" | sed -n 's/.*node\.key is in use by node pid \([0-9]*\) .*/\1/p')
if [ -n "$said" ] && ps -o args= -p "$said" | grep -q "swarm node --join"; then
    ok "the second node names the first: $(echo "$first" | sed 's/.*(new; \(.*\)).*/\1/')"
else
    bad "the second node's note names pid '$said', not a live node:"; head -1 "$TMP/node1.log" "$TMP/node2.log"
fi

# README's status line, with the token printed, once (--json, not --watch)
st=$(echo "$status_line" | sed "s|swarm://[^ ]*|$token|; s|--watch|--json|")
PATH="$ABS_BUILD:$PATH" sh -c "$st" >"$TMP/status.json" 2>&1
ready=$(grep -o '"state": "ready"' "$TMP/status.json" | wc -l)
keys=$(grep -o '"key": "[^"]*"' "$TMP/status.json" | sort -u | wc -l)
if [ "$ready" -eq 2 ] && [ "$keys" -eq 2 ]; then
    ok "'$st' shows two ready peers with two keys"
else
    bad "status ($st): $ready ready, $keys keys:"; cat "$TMP/status.json"
fi

# README's dashboard line, with the token printed: the page it names, in a
# browser (headless Chromium), lists both peers ready (port 8080 taken by
# another program on this machine: the same line on a free port)
serve_line=$(awk '/^## Quick start/ { on = 1 } on && /^swarm status .*--serve/ { print; exit }' "$README" \
    | sed 's/ *#.*//')
sv=$(echo "$serve_line" | sed "s|swarm://[^ ]*|$token|")
for try in literal free; do
    PATH="$ABS_BUILD:$PATH" sh -c "exec $sv" >"$TMP/dash.log" 2>&1 &
    dash=$!
    pids="$pids $dash"
    wait_grep "$TMP/dash.log" "dashboard at http://\|cannot listen" 10
    grep -q "Address already in use" "$TMP/dash.log" || break
    echo "note: port 8080 is taken here; the dashboard line on a free port"
    sv=$(echo "$sv" | sed 's/--serve [0-9]*/--serve 0/')
done
url=$(sed -n 's|^swarm status: dashboard at \(http://[0-9.:]*/\).*|\1|p' "$TMP/dash.log")
if command -v chromium >/dev/null 2>&1 && [ -n "$url" ]; then
    sleep 1.5
    chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
        --user-data-dir="$TMP/chromium" --virtual-time-budget=2500 --dump-dom "$url" \
        >"$TMP/page.html" 2>/dev/null
fi
ready=$(grep -o '<tr class="peer" data-id="[0-9]*" data-state="ready"' "$TMP/page.html" 2>/dev/null | wc -l)
if [ "$ready" -eq 2 ]; then
    ok "'$serve_line': $url in a browser lists the two peers ready"
else
    bad "'$sv' ($url): $ready ready peers on the page:"; cat "$TMP/dash.log"
fi
kill "$dash" 2>/dev/null

# a key a live node holds, given with --key: refused at start, on this machine
holder=$k1
if "$ABS_BUILD/swarm" node --join "$token" --key "${holder%.key}" >"$TMP/dup1.log" 2>&1; then
    bad "a node with a key in use started"; cat "$TMP/dup1.log"
elif grep -q "in use by node pid [1-9][0-9]* on this machine" "$TMP/dup1.log"; then
    ok "a key in use here is refused at start: $(tail -1 "$TMP/dup1.log")"
else
    bad "the refusal of a key in use:"; cat "$TMP/dup1.log"
fi

# a copy of that key (another machine's, say): the router refuses it, both told
cp "${holder%.key}.key" "$TMP/copy.key"
cp "${holder%.key}.pub" "$TMP/copy.pub"
chmod 600 "$TMP/copy.key"
"$ABS_BUILD/swarm" node --join "$token" --key "$TMP/copy" >"$TMP/dup2.log" 2>&1 &
dup=$!
pids="$pids $dup"
if wait_exit "$dup" 20 && grep -q "the router refused us: this node's key .* is in use by peer" "$TMP/dup2.log"; then
    ok "a copy of a live node's key is refused by the router: $(grep refused "$TMP/dup2.log" | cut -c1-110)..."
else
    bad "the copy was not refused:"; cat "$TMP/dup2.log"
fi
live_log=$TMP/node1.log
if grep -q "refused a second node with the key" "$TMP/router.log" \
    && wait_grep "$live_log" "the router says: another node with this node's key tried to join" 5; then
    ok "the router says so in one line, and the live node is told and goes on"
else
    bad "the refusal lines:"; grep -e refused "$TMP/router.log"; cat "$live_log"
fi

# the run finishes, and both nodes say so once
if wait_exit "$router" 120; then
    wait "$shell" 2>/dev/null
    rc=$?
else
    rc=124
fi
if [ "$rc" -eq 0 ] && grep -q "^summary | iters 200 " "$TMP/router.log" && [ -s "$TMP/work/runs/first/loss.svg" ]; then
    ok "the run finished: $(grep '^summary' "$TMP/router.log" | cut -d'|' -f2-4), runs/first written"
else
    bad "the run (exit $rc):"; tail -20 "$TMP/router.log"
fi
for n in 1 2; do
    if wait_grep "$TMP/node$n.log" "the run is over (step 200 of 200, the router says); waiting" 10 \
        && [ "$(grep -c "the run is over" "$TMP/node$n.log")" -eq 1 ]; then
        ok "node $n says once that the run is over"
    else
        bad "node $n at the end:"; tail -5 "$TMP/node$n.log"
    fi
done
sleep 12 # a node waiting for the next run stays quiet: no line every 10 s
for n in 1 2; do
    last=$(tail -1 "$TMP/node$n.log")
    case "$last" in
    *"the run is over"*) ok "node $n waits quietly for the next run" ;;
    *) bad "node $n kept talking after the run: $last" ;;
    esac
done
# Ctrl-C, to the nodes themselves (the shells that started them in the
# background ignore SIGINT, as every non-interactive shell does)
nodes=$(pgrep -xf "swarm node --join $token")
[ "$(echo "$nodes" | wc -w)" -eq 2 ] || bad "not two node processes: $nodes"
# shellcheck disable=SC2086
kill -INT $nodes 2>/dev/null
left=1
for p in $nodes; do wait_exit "$p" 10 || left=0; done
if [ $left -eq 1 ] && grep -q "left the swarm" "$TMP/node1.log" && grep -q "left the swarm" "$TMP/node2.log"; then
    ok "Ctrl-C: both nodes leave"
else
    bad "the nodes did not leave on SIGINT"; tail -2 "$TMP/node1.log" "$TMP/node2.log"
fi
lib_done
