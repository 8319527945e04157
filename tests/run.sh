#!/bin/sh
# run.sh BUILD - run every test of swarm: the Check runners BUILD/check_*,
# then every tests/test_*.sh integration script (each ends with a line
# "N passed, N failed"). Prints one closing line "N passed, N failed" and
# exits non-zero when anything failed. SWARM_UNIT_ONLY=1 runs the Check
# runners only (the sanitizer build).
BUILD=${1:-build}
export SWARM_BIN="$BUILD/swarm"
pass=0
fail=0
for runner in "$BUILD"/check_*; do
    [ -x "$runner" ] || continue
    echo "== $runner"
    out=$("$runner" 2>&1)
    rc=$?
    echo "$out"
    line=$(echo "$out" | grep -E 'Checks: [0-9]+, Failures: [0-9]+, Errors: [0-9]+' | tail -1)
    if [ -z "$line" ]; then
        echo "run.sh: $runner printed no Check summary (exit $rc)"
        fail=$((fail + 1))
        continue
    fi
    n=$(echo "$line" | sed -E 's/.*Checks: ([0-9]+).*/\1/')
    f=$(echo "$line" | sed -E 's/.*Failures: ([0-9]+).*/\1/')
    e=$(echo "$line" | sed -E 's/.*Errors: ([0-9]+).*/\1/')
    pass=$((pass + n - f - e))
    fail=$((fail + f + e))
    if [ $rc -ne 0 ] && [ $((f + e)) -eq 0 ]; then
        echo "run.sh: $runner exited $rc"
        fail=$((fail + 1))
    fi
done
if [ -z "$SWARM_UNIT_ONLY" ]; then
    for script in tests/test_*.sh; do
        [ -f "$script" ] || continue
        echo "== $script"
        t0=$(date +%s)
        out=$(sh "$script" "$BUILD" 2>&1)
        rc=$?
        echo "$out"
        echo "($script took $(($(date +%s) - t0)) s)"
        line=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -1)
        if [ -z "$line" ]; then
            echo "run.sh: $script printed no summary (exit $rc)"
            fail=$((fail + 1))
            continue
        fi
        p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
        f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
        pass=$((pass + p))
        fail=$((fail + f))
        if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
            echo "run.sh: $script exited $rc"
            fail=$((fail + 1))
        fi
    done
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
