#!/bin/sh
# test_cli.sh BUILD - the swarm binary as a user runs it: bad flags and bad
# files each give one clear error line and a non-zero exit; a run saved and
# resumed continues the same loss curve as a run straight through; sample
# works from a checkpoint. Ends with "N passed, N failed".
BUILD=${1:-build}
SWARM="$BUILD/swarm"
TMP=$(mktemp -d /tmp/swarm-cli.XXXXXX)
trap 'rm -rf "$TMP"' EXIT INT TERM
pass=0
fail=0

ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

# expect_error NAME PATTERN ARGS... : non-zero exit, exactly one stderr line
# matching PATTERN, nothing on stdout
expect_error() {
    name=$1 pattern=$2
    shift 2
    "$SWARM" "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    lines=$(wc -l <"$TMP/err")
    if [ $rc -ne 0 ] && [ "$lines" -eq 1 ] && grep -q -- "$pattern" "$TMP/err" && [ ! -s "$TMP/out" ]; then
        ok "$name: $(cat "$TMP/err")"
    else
        bad "$name: exit $rc, $lines stderr lines, wanted /$pattern/:"
        sed 's/^/     /' "$TMP/err" "$TMP/out"
    fi
}

TINY="--layers 2 --heads 4 --embd 32 --block 16 --batch 4 --warmup 2 --lr 1e-2 --threads 1 --eval-every 0 --quiet"
head -c 20000 "$BUILD/corpus.txt" >"$TMP/data.txt"

# ---- bad flags ----
expect_error "negative layers" "--layers -2" train --layers -2
expect_error "zero batch" "--batch 0" train --batch 0
expect_error "embd not divisible by heads" "not divisible by --heads 3" train --embd 32 --heads 3 --data "$TMP/data.txt"
expect_error "more stages than layers" "--stages 5" train --layers 4 --stages 5 --data "$TMP/data.txt"
expect_error "micro-batch not dividing batch" "--micro-batch 5 must divide --batch 12" train --micro-batch 5 --data "$TMP/data.txt"
expect_error "lr not a number" "--lr fast" train --lr fast
expect_error "unknown flag" "--bogus" train --bogus 3
expect_error "stray argument" "extra: unexpected argument" train extra
expect_error "unknown command" "unknown command 'trian'" trian
expect_error "unknown device" "--device tpu" train --device tpu $TINY --data "$TMP/data.txt" --iters 1
expect_error "sample without ckpt" "--ckpt is required" sample

# ---- bad files ----
expect_error "missing data file" "--data $TMP/nope.txt: No such file" train --data "$TMP/nope.txt"
: >"$TMP/empty.txt"
expect_error "empty data file" "empty" train $TINY --data "$TMP/empty.txt"
printf 'tiny' >"$TMP/small.txt"
expect_error "data too small for block" "too small for --block 16" train $TINY --data "$TMP/small.txt"
expect_error "missing init file" "$TMP/none.bgpt: No such file" train $TINY --data "$TMP/data.txt" --init "$TMP/none.bgpt"
printf 'this is not a weight file, just text that is long enough to have a header of 64 bytes....' >"$TMP/junk.bgpt"
expect_error "not a BGPT file" "not a BGPT weight file" train $TINY --data "$TMP/data.txt" --init "$TMP/junk.bgpt"
expect_error "resume from nothing" "$TMP/nockpt/checkpoint.bin" train --resume "$TMP/nockpt"

# ---- a run, saved, resumed, sampled ----
"$SWARM" train $TINY --data "$TMP/data.txt" --iters 12 --loss-log "$TMP/straight.txt" >/dev/null 2>&1 \
    && ok "train 12 steps straight" || bad "train 12 steps straight"
"$SWARM" train $TINY --data "$TMP/data.txt" --iters 12 --save "$TMP/ck" --save-every 6 \
    --loss-log "$TMP/first.txt" >/dev/null 2>&1 && ok "train with checkpoints" || bad "train with checkpoints"
# a truncated copy of the final checkpoint is refused by name
mkdir -p "$TMP/cut" && head -c 5000 "$TMP/ck/checkpoint.bin" >"$TMP/cut/checkpoint.bin"
expect_error "truncated checkpoint" "checksum mismatch" train --resume "$TMP/cut" --data "$TMP/data.txt"
# wrong model shape against an existing checkpoint
expect_error "shape flag against checkpoint" "--layers 3 does not match" train --resume "$TMP/ck" --layers 3 --data "$TMP/data.txt"
# the OpenBLAS kernels: a CPU whose OS gives it AVX runs AVX kernels, also
# where the library is older than the CPU and would fall back to Prescott
# (SSE3: 3.5x slower on an Emerald Rapids Xeon); a core the user names stands
core_of() { # ENV...: the core swarm train reports
    env "$@" "$SWARM" train $TINY --data "$TMP/data.txt" --iters 1 2>&1 |
        sed -n 's/.*OpenBLAS core \([A-Za-z0-9]*\).*/\1/p' | head -n 1
}
core=$(core_of)
case "$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | grep -cw avx) $core" in
    "1 Prescott" | "1 Core2" | "1 Penryn" | "1 Dunnington" | "1 Nehalem" | "1 Atom" | *" ")
        bad "this CPU has AVX and runs OpenBLAS core '$core'" ;;
    *) ok "OpenBLAS core $core on this CPU" ;;
esac
core=$(core_of OPENBLAS_CORETYPE=Prescott)
[ "$core" = Prescott ] && ok "OPENBLAS_CORETYPE=Prescott stands" \
    || bad "OPENBLAS_CORETYPE=Prescott gave core '$core'"
# stop after 6 steps of the 12-step schedule, then resume to the end
# (its progress, which --quiet hides, counts to step 6, where this run ends)
if SWARM_PLAIN=1 "$SWARM" train ${TINY% --quiet} --data "$TMP/data.txt" --iters 12 --steps 6 --save "$TMP/six" \
    --log-every 3 >/dev/null 2>"$TMP/six.err" \
    && grep -q "^step 3/12 |.*| ETA [0-9]* s to step 6$" "$TMP/six.err" \
    && grep -q "^step 6/12 |.*| ETA 0 s to step 6$" "$TMP/six.err"; then
    ok "train 6 of 12 steps (--steps): $(grep '^step 6/' "$TMP/six.err")"
else
    bad "train --steps 6:"; cat "$TMP/six.err"
fi
"$SWARM" train --resume "$TMP/six" --data "$TMP/data.txt" --quiet --eval-every 0 --threads 1 \
    --loss-log "$TMP/resumed.txt" >/dev/null 2>&1 && ok "resume to the end" || bad "resume to the end"
if tail -n 6 "$TMP/straight.txt" | cmp -s - "$TMP/resumed.txt"; then
    ok "the resumed run continues the same loss curve (steps 6-11 identical)"
else
    bad "resumed curve differs:"; tail -n 6 "$TMP/straight.txt"; cat "$TMP/resumed.txt"
fi
if "$SWARM" train --resume "$TMP/ck" --data "$TMP/data.txt" --quiet --eval-every 0 >"$TMP/r.out" 2>&1 \
    && grep -q "resumed from $TMP/ck at step 12" "$TMP/r.out"; then
    ok "resume at the end does nothing and says where it is"
else
    bad "resume at the end"; cat "$TMP/r.out"
fi
if cmp -s "$TMP/straight.txt" "$TMP/first.txt"; then
    ok "checkpointing does not change the loss curve"
else
    bad "checkpointing changed the loss curve"
fi
"$SWARM" sample --ckpt "$TMP/ck" --tokens 40 --prompt "int " --seed 3 >"$TMP/s1" 2>&1
"$SWARM" sample --ckpt "$TMP/ck/model.bgpt" --tokens 40 --prompt "int " --seed 3 >"$TMP/s2" 2>&1
if [ "$(wc -c <"$TMP/s1")" -ge 44 ] && cmp -s "$TMP/s1" "$TMP/s2"; then
    ok "sample from a checkpoint folder and its model.bgpt agree"
else
    bad "sample"; cat "$TMP/s1" "$TMP/s2"
fi
expect_error "sample bad temperature" "--temperature -1" sample --ckpt "$TMP/ck" --temperature -1

# ---- keys ----
if "$SWARM" keygen "$TMP/k1" >"$TMP/kout" 2>&1 && [ "$(stat -c %a "$TMP/k1.key")" = 600 ] \
    && key=$(sed -n 's/^public key: //p' "$TMP/kout") && [ ${#key} -eq 40 ] \
    && grep -qF -- "$key" "$TMP/k1.pub"; then
    ok "keygen writes NAME.key (0600) and NAME.pub and prints the public key"
else
    bad "keygen"; cat "$TMP/kout"; ls -la "$TMP"
fi
expect_error "keygen refuses to overwrite" "key files exist (use --force" keygen "$TMP/k1"
if ! "$SWARM" keygen >/dev/null 2>"$TMP/err" && head -1 "$TMP/err" | grep -q "give the NAME"; then
    ok "keygen without a name: $(head -1 "$TMP/err")"
else
    bad "keygen without a name"; cat "$TMP/err"
fi

# ---- status and node flags ----
expect_error "status without router key" "--router-key is required" status tcp://127.0.0.1:9
expect_error "status bad address" "tcp://HOST:PORT" status localhost:9 --router-key "$TMP/k1.pub"
expect_error "status with no router" "no answer from tcp://127.0.0.1:9 within 4 s.*--router-key" \
    status tcp://127.0.0.1:9 --router-key "$TMP/k1.pub"
expect_error "node without --join" "--join" node --router-key "$TMP/k1.pub"
expect_error "node with a bad router key" "$TMP/nokey.pub" node --join tcp://127.0.0.1:9 --router-key "$TMP/nokey.pub"
# what a user pastes wrong: an address, a key the shell changed, a key file of text
expect_error "node with a --join that is no address" "--join 127.0.0.1:7070: expected swarm://HOST:PORT/KEY" \
    node --join 127.0.0.1:7070 --router-key "$TMP/k1.pub"
expect_error "node with a --join on the listening address" "0.0.0.0 and \* are where a router listens" \
    node --join tcp://0.0.0.0:7070 --router-key "$TMP/k1.pub"
expect_error "node with a token cut short" "the KEY is not 64 hex digits (copy the whole token)" \
    node --join swarm://127.0.0.1:7070/0123abcd
expect_error "node with a router key the shell cut" "--router-key e40j: no such file, and not a key: a key is 40 Z85 characters, this is 4; .*single quotes" \
    node --join tcp://127.0.0.1:9 --router-key e40j
printf 'not a key at all\n' >"$TMP/text.pub"
expect_error "node with a router key file that is not a key" "$TMP/text.pub: not a public key file.*copy the router's .pub again" \
    node --join tcp://127.0.0.1:9 --router-key "$TMP/text.pub"
printf 'garbage\n' >"$TMP/bad.key"
chmod 600 "$TMP/bad.key"
cp "$TMP/k1.pub" "$TMP/bad.pub"
expect_error "node with a key file that is not a key" "--key $TMP/bad: $TMP/bad.key: expected one line of 40 Z85 characters.*regenerate" \
    node --join tcp://127.0.0.1:9 --router-key "$TMP/k1.pub" --key "$TMP/bad"
expect_error "status with a join token cut short" "no /KEY" status swarm://127.0.0.1:9
expect_error "status --serve with no address" "--serve needs \[HOST:\]PORT" \
    status tcp://127.0.0.1:9 --router-key "$TMP/k1.pub" --serve
expect_error "status --serve and --json" "--serve and --json" \
    status tcp://127.0.0.1:9 --router-key "$TMP/k1.pub" --serve 0 --json
expect_error "router with stages > layers" "--stages 9" router --stages 9 --layers 2 --listen tcp://127.0.0.1:0 --key "$TMP/k1"
expect_error "router with an unknown wire format" "--wire bf16: expected fp32, fp16 or int8" \
    router --wire bf16 --listen tcp://127.0.0.1:0 --key "$TMP/k1"
expect_error "router with a bad window" "--window 0: expected all, auto or a whole number" \
    router --window 0 --listen tcp://127.0.0.1:0 --key "$TMP/k1"
expect_error "router link of no bandwidth" "--router-bandwidth 0: expected the Mbit/s" \
    router --router-bandwidth 0 --listen tcp://127.0.0.1:0 --key "$TMP/k1"
expect_error "proven replicas audited more than new ones" "--audit-proven 0.5: expected at most --audit's 0.3" \
    router --audit-proven 0.5 --listen tcp://127.0.0.1:0 --key "$TMP/k1"
expect_error "router with an unwritable trace" "--trace $TMP/no/such/dir/t: No such file" \
    router --trace "$TMP/no/such/dir/t" --listen tcp://127.0.0.1:0 --key "$TMP/k1"
if sh scripts/wan-swarm.sh -n 2 -s 2 --delay 50 >"$TMP/out" 2>&1; then
    bad "wan-swarm.sh took --delay 50"
elif grep -q "^wan-swarm.sh: --delay 50: '50' is not a value like 50ms$" "$TMP/out"; then
    ok "wan-swarm.sh with a delay without unit: $(cat "$TMP/out")"
else
    bad "wan-swarm.sh --delay 50:"; cat "$TMP/out"
fi

# ---- --help and README.md agree ----
# One convention in both. A help entry is a line "  --flag ..." (two spaces;
# its continuation lines indented deeper) and states a default as "(default X"
# or "(default: X", X ending at ")", ";", "," or ": ". README.md's tables
# "| router flag |" and "| node flag |" state it the same way in the flag's
# row; its "| training flag | default |" table in the default column, one
# comma-separated value for each flag of the row. Backticks do not count.
# Every flag a --help mentions must have a row, with the same default or none.
cat >"$TMP/flags.awk" <<'EOF'
# help: "--flag<TAB>default" per entry of a --help on stdin;
# readme: the same per flag of the README tables whose first header cell is
# in the comma-separated `tables`
function dflt(t,   s) {
    gsub(/`/, "", t)
    gsub(/  +/, " ", t)
    if (!match(t, /[(]default:? /))
        return ""
    s = substr(t, RSTART + RLENGTH)
    if (match(s, /[);,]|: /))
        s = substr(s, 1, RSTART - 1)
    sub(/ +$/, "", s)
    return s
}
function flush() {
    if (flag != "")
        print flag "\t" dflt(text)
    flag = ""
}
mode == "help" && /^  --[a-z]/ { flush(); flag = $1; text = $0; next }
mode == "help" && /^   / && flag != "" { text = text " " $0; next }
mode == "help" { flush(); next }
mode == "readme" && !intab && /^\| / {
    h = $0
    sub(/^\| */, "", h)
    sub(/ *\|.*$/, "", h)
    if (index("," tables ",", "," h ",")) {
        intab = 1
        cols = split($0, c, "|") - 2
    }
    next
}
mode == "readme" && intab && !/^\|/ { intab = 0; next }
mode == "readme" && intab && !/^\|-/ {
    row = $0
    gsub(/\\\|/, "/", row)
    split(row, c, "|")
    s = c[2]
    k = 0
    while (match(s, /--[a-z][a-z0-9-]*/)) {
        f[++k] = substr(s, RSTART, RLENGTH)
        s = substr(s, RSTART + RLENGTH)
    }
    m = cols == 3 ? split(c[3], d, ",") : 0
    for (i = 1; i <= k; i++) {
        v = cols == 3 ? (i <= m ? d[i] : "") : dflt(c[3])
        gsub(/`/, "", v)
        gsub(/^ +| +$/, "", v)
        print f[i] "\t" v
    }
}
END { if (mode == "help") flush() }
EOF
# help_drift HELP TABLES: each way --help (in file HELP) and README.md's
# TABLES disagree, a line each
help_drift() {
    awk -v mode=help -f "$TMP/flags.awk" "$1" >"$TMP/help.tsv"
    awk -v mode=readme -v tables="$2" -f "$TMP/flags.awk" "${SWARM_README:-README.md}" >"$TMP/readme.tsv"
    grep -o -- '--[a-z][a-z0-9-]*' "$1" | sort -u >"$TMP/mentioned"
    [ -s "$TMP/help.tsv" ] || echo "no '  --flag' entries in the help"
    [ -s "$TMP/readme.tsv" ] || echo "no table '| $2 |' in README.md"
    awk -F'\t' 'FILENAME == ARGV[1] { row[$1] = 1; d[$1] = $2; next }
        FILENAME == ARGV[2] { if (!($1 in row)) print $1 ": in --help, in no README.md table"; next }
        ($1 in row) && d[$1] != $2 {
            print $1 ": --help says default \"" ($2 == "" ? "(none)" : $2) "\", README.md says \"" \
                  (d[$1] == "" ? "(none)" : d[$1]) "\""
        }' "$TMP/readme.tsv" "$TMP/mentioned" "$TMP/help.tsv"
}
for cmd in "router:router flag,training flag" "train:training flag" "node:node flag"; do
    "$SWARM" "${cmd%%:*}" --help >"$TMP/help" 2>&1
    help_drift "$TMP/help" "${cmd#*:}" >"$TMP/drift"
    if [ -s "$TMP/drift" ]; then
        bad "swarm ${cmd%%:*} --help and README.md's '${cmd#*:}' tables disagree:"
        sed 's/^/     /' "$TMP/drift"
    else
        ok "swarm ${cmd%%:*} --help: its $(wc -l <"$TMP/mentioned") flags are in README.md's '${cmd#*:}' tables, $(awk -F'\t' '$2 != ""' "$TMP/help.tsv" | wc -l) defaults the same"
    fi
done

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
