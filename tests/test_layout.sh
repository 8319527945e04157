#!/bin/sh
# test_layout.sh [BUILD [ROOT]] - the code's layout (docs/architecture.md):
# no file in swarm/ or node/ over 800 lines; each directory includes only
# the layers below it (net/ and blas/ nothing of the others, swarm/ net/
# only, node/ any), every quoted include found in a directory it may use,
# and no cycle among the headers. ROOT (default .) is the tree to read.
# Ends with "N passed, N failed".
ROOT=${2:-.}
MAX_LINES=800
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

long=$(cd "$ROOT" && wc -l swarm/*.[ch] node/*.[ch] | awk -v max=$MAX_LINES '$2 != "total" && $1 > max { print $2 " (" $1 " lines)" }')
if [ -z "$long" ]; then
    ok "no file in swarm/ or node/ over $MAX_LINES lines (the longest: $(cd "$ROOT" && wc -l swarm/*.[ch] node/*.[ch] | grep -v total | sort -n | tail -1 | awk '{ print $2 ", " $1 }'))"
else
    bad "files over $MAX_LINES lines: $long"
fi

# allowed DIR: the directories DIR's quoted includes may come from
allowed() {
    case $1 in
        net) echo "net" ;;
        blas) echo "blas" ;;
        swarm) echo "swarm net" ;;
        node) echo "node swarm net blas" ;;
    esac
}
for dir in net blas swarm node; do
    wrong=""
    for f in "$ROOT/$dir"/*.[ch]; do
        [ -f "$f" ] || continue
        for inc in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f"); do
            found=""
            for from in $(allowed $dir); do
                [ -f "$ROOT/$from/$inc" ] && found=$from && break
            done
            [ -n "$found" ] || wrong="$wrong $(basename "$f"):$inc"
        done
    done
    if [ -z "$wrong" ]; then
        ok "$dir/ includes only what it may ($(allowed $dir | sed 's| |/, |g')/)"
    else
        bad "$dir/ includes what it may not (or what is not there):$wrong"
    fi
done

# the headers' include graph has no cycle: repeatedly drop the headers that
# include no header left; what cannot be dropped is in a cycle
edges=$(for f in "$ROOT"/net/*.h "$ROOT"/blas/*.h "$ROOT"/swarm/*.h "$ROOT"/node/*.h; do
    [ -f "$f" ] || continue
    for inc in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f"); do
        echo "$(basename "$f") $inc"
    done
done)
left=$(for f in "$ROOT"/net/*.h "$ROOT"/blas/*.h "$ROOT"/swarm/*.h "$ROOT"/node/*.h; do
    [ -f "$f" ] && basename "$f"; done | sort -u | tr '\n' ' ')
left=$(echo $left)
while :; do
    keep=""
    for h in $left; do
        needs=$(echo "$edges" | awk -v h="$h" '$1 == h { print $2 }')
        for n in $needs; do
            if echo " $left " | grep -q " $n "; then keep="$keep $h"; break; fi
        done
    done
    keep=$(echo $keep)
    [ "$keep" = "$left" ] && break
    left=$keep
done
if [ -z "$left" ]; then
    ok "the headers include each other without a cycle ($(echo "$edges" | grep -c .) includes)"
else
    bad "headers in an include cycle, or including one: $left"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
