#!/bin/sh
# wan-swarm.sh -n NODES -s STAGES [--delay 50ms] [--jitter 10ms] [--rate 50mbit]
#              [--loss 0.1%] [local-swarm.sh flags] [router flags...]
# scripts/local-swarm.sh with every process in a network namespace of its
# own, joined by a bridge, and each node's link to the router shaped in
# both directions: one-way DELAY +- JITTER, RATE, LOSS (tc's units). A
# comma list gives node i the i-th value (the last one beyond the list):
# --delay 20ms,80ms. The router's own link is not shaped.
# With the kernel's netem qdisc the links are shaped by it; without it
# (or with EMULATOR=relay) by build/wanproxy, a TCP relay in each node's
# namespace (tests/wanproxy.c says what it models). It says which.
# Needs root. Everything it makes is named after its pid (namespaces
# ws<pid>r, ws<pid>n1, ...; their links live only inside them) and is
# removed on exit, also on failure, Ctrl-C or TERM.
# Environment: BUILD (default build), EMULATOR=auto|netem|relay, and
# local-swarm.sh's (TIMEOUT, KEEP, ...).

me=wan-swarm.sh
usage() {
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
}
die() {
    echo "$me: $*" >&2
    exit 1
}

# ---- flags: ours are taken out, the rest go to local-swarm.sh ----
nodes=""
delay=0ms
jitter=0ms
rate=""
loss=0%
build=${BUILD:-build}
left=$#
while [ "$left" -gt 0 ]; do
    a=$1
    shift
    left=$((left - 1))
    case $a in
    --delay | --jitter | --rate | --loss)
        [ "$left" -gt 0 ] || die "$a needs a value (see $me --help)"
        v=$1
        shift
        left=$((left - 1))
        case $a in
        --delay) delay=$v ;;
        --jitter) jitter=$v ;;
        --rate) rate=$v ;;
        --loss) loss=$v ;;
        esac
        ;;
    -n | --nodes | --build)
        [ "$left" -gt 0 ] || die "$a needs a value (see $me --help)"
        case $a in --build) build=$1 ;; *) nodes=$1 ;; esac
        set -- "$@" "$a" "$1"
        shift
        left=$((left - 1))
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    *) set -- "$@" "$a" ;;
    esac
done
case $nodes in '' | *[!0-9]*) die "-n NODES: expected a whole number >= 1, got '$nodes'" ;; esac
[ "$nodes" -ge 1 ] && [ "$nodes" -le 250 ] || die "-n $nodes: 1..250 nodes"
# of LIST: the value for node I
of() {
    echo "$1" | awk -F, -v i="$2" '{ print (i <= NF) ? $i : $NF }'
}
check_values() {  # FLAG LIST PATTERN (an extended regular expression)
    for v in $(echo "$2" | tr ',' ' '); do
        echo "$v" | grep -Eqx "$3" || die "$1 $2: '$v' is not a value like ${4:-$3}"
    done
}
check_values --delay "$delay" '[0-9.]+(us|ms|s)' 50ms
check_values --jitter "$jitter" '[0-9.]+(us|ms|s)' 10ms
[ -z "$rate" ] || check_values --rate "$rate" '[0-9.]+(bit|kbit|mbit|gbit)' 50mbit
check_values --loss "$loss" '[0-9.]+%' 0.1%

# ---- can we? ----
[ "$(id -u)" -eq 0 ] || die "needs root (it makes network namespaces and links); run it with sudo"
command -v ip >/dev/null || die "needs ip (iproute2): apt-get install iproute2"
P=ws$$
probe=${P}probe
ip netns add "$probe" 2>/dev/null || die "cannot make a network namespace (ip netns add failed): needs a kernel with network namespaces and CAP_SYS_ADMIN"
emulator=${EMULATOR:-auto}
if [ "$emulator" = auto ] || [ "$emulator" = netem ]; then
    ip netns exec "$probe" ip link set lo up
    if ip netns exec "$probe" tc qdisc add dev lo root netem delay 1ms 2>/dev/null; then
        emulator=netem
    elif [ "$emulator" = netem ]; then
        ip netns del "$probe"
        die "EMULATOR=netem, but the kernel has no netem qdisc"
    else
        emulator=relay
    fi
fi
ip netns del "$probe"
case $emulator in
netem) how="netem (kernel qdisc) on both ends of each node's link" ;;
relay)
    how="build/wanproxy, a TCP relay in each node's namespace (the kernel has no netem qdisc; loss is emulated as a stall of the stream, see tests/wanproxy.c)"
    [ "${EMULATOR:-auto}" = relay ] && how="build/wanproxy, a TCP relay in each node's namespace (EMULATOR=relay)"
    [ -x "$build/wanproxy" ] || die "$build/wanproxy is not built; run make"
    ;;
*) die "EMULATOR=$emulator: expected auto, netem or relay" ;;
esac

# ---- what we make, undone on any exit ----
made=""        # namespaces, in the order made
relays=""      # wanproxy pids
child=""       # local-swarm.sh
TMP=$(mktemp -d "${TMPDIR:-/tmp}/wan-swarm.XXXXXX") || die "cannot create a temporary folder"
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    trap '' INT TERM
    if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
        kill -TERM "$child" 2>/dev/null
        wait "$child" 2>/dev/null
    fi
    for p in $relays; do kill -TERM "$p" 2>/dev/null; done
    for p in $relays; do wait "$p" 2>/dev/null; done
    [ -n "$relays" ] && cat "$TMP"/relay*.log 2>/dev/null | grep relayed | sed "s/^/$me: /" >&2
    for ns in $made; do
        # anything still inside (only what we started can be)
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null || echo "$me: could not remove namespace $ns" >&2
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'echo "$me: interrupted; removing the namespaces" >&2; exit 130' INT
trap 'exit 143' TERM

netns() {  # NAME
    ip netns add "$1" || die "ip netns add $1 failed"
    made="$made $1"
    ip -n "$1" link set lo up
}
# attach NS ADDRESS PORT: NS's eth0 on the bridge as ADDRESS/24; PORT is the
# bridge's end of the link (in the switch namespace)
attach() {
    ip link add eth0 netns "$1" type veth peer name "$3" netns "${P}sw" \
        || die "cannot make a veth pair for $1"
    ip -n "${P}sw" link set "$3" master br0 up
    ip -n "$1" addr add "$2/24" dev eth0
    ip -n "$1" link set eth0 up
}
# shape NS DEV I: netem on NS's DEV, node I's values
shape() {
    # shellcheck disable=SC2046 # the rate clause is two words or none
    ip netns exec "$1" tc qdisc add dev "$2" root netem delay "$(of "$delay" "$3")" \
        "$(of "$jitter" "$3")" loss "$(of "$loss" "$3")" \
        $([ -n "$rate" ] && echo rate "$(of "$rate" "$3")") limit 100000 \
        || die "tc netem on $1 $2 failed"
}

netns "${P}sw"
ip -n "${P}sw" link add br0 type bridge || die "cannot make a bridge"
ip -n "${P}sw" link set br0 up
netns "${P}r"
attach "${P}r" 10.200.0.1 r
i=1
while [ "$i" -le "$nodes" ]; do
    netns "${P}n$i"
    attach "${P}n$i" "10.200.0.$((i + 1))" "n$i"
    if [ "$emulator" = netem ]; then
        shape "${P}n$i" eth0 "$i"   # node -> router
        shape "${P}sw" "n$i" "$i"   # router -> node
    else
        ip netns exec "${P}n$i" "$build/wanproxy" --listen 127.0.0.1:7070 --connect 10.200.0.1:7070 \
            --delay "$(of "$delay" "$i")" --jitter "$(of "$jitter" "$i")" \
            ${rate:+--rate "$(of "$rate" "$i")"} --loss "$(of "$loss" "$i")" --seed "$i" \
            >"$TMP/relay$i.log" 2>&1 &
        relays="$relays $!"
    fi
    i=$((i + 1))
done
echo "$me: $nodes nodes, each in namespace ${P}nI, the router in ${P}r; links: delay $delay, jitter $jitter, rate ${rate:-unlimited}, loss $loss; shaped by $how" >&2

# every process of the swarm in its namespace (replacement nodes of
# --chaos take the namespace of node ((I-1) mod NODES) + 1)
cat >"$TMP/wrap" <<EOF
#!/bin/sh
case \$1 in
router) ns=${P}r ;;
node*) i=\${1#node}; ns=${P}n\$(( (i - 1) % $nodes + 1 )) ;;
*) exit 2 ;;
esac
shift
exec ip netns exec "\$ns" "\$@"
EOF
chmod +x "$TMP/wrap"
join=""
[ "$emulator" = relay ] && join=tcp://127.0.0.1:7070
WRAP="$TMP/wrap" LISTEN=tcp://10.200.0.1:7070 JOIN=$join \
    sh "$(dirname "$0")/local-swarm.sh" "$@" &
child=$!
wait "$child"
rc=$?
child=""
exit "$rc"
