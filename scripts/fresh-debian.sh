#!/bin/sh
# fresh-debian.sh [GOAL...] - run make GOALs (default: demo test) as a person
# would on a fresh Debian machine: in a bare Debian chroot (debootstrap
# --variant=minbase, the release this machine runs) that has only make, git
# and what make deps installs. A green CI on a developer's machine hides a
# missing install step, or a test that depends on the order packages came
# in; this does not. Needs root and the Debian mirror (apt-get install
# debootstrap first). The chroot gets a clone of this checkout's HEAD, with
# ../shared beside it when there is one; each goal's output goes to
# DIR/GOAL.log (spaces and = as _), and the last lines of a failing one
# are shown.
# Environment: FRESH_DIR (default: a new folder under /tmp), KEEP=1 keeps it,
# SUITE (default: this machine's release codename).
# Exits with the first failing goal's status. Not part of make test.
set -eu
cd "$(dirname "$0")/.."
me=fresh-debian.sh
[ "$(id -u)" = 0 ] || { echo "$me: needs root (debootstrap and chroot): sudo sh scripts/$me" >&2; exit 2; }
command -v debootstrap >/dev/null 2>&1 \
    || { echo "$me: no debootstrap here: apt-get install debootstrap, then run it again" >&2; exit 2; }
suite=${SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-}")}
[ -n "$suite" ] || { echo "$me: cannot tell this machine's Debian release: set SUITE (e.g. bookworm)" >&2; exit 2; }
[ $# -gt 0 ] || set -- demo test
dir=${FRESH_DIR:-$(mktemp -d /tmp/fresh-debian.XXXXXX)}
mkdir -p "$dir"
root=$dir/root
# every mount under the chroot (the tests add /run/netns), deepest first
mounts_under() { awk -v r="$root" '$2 == r || index($2, r "/") == 1 { print $2 }' /proc/mounts | sort -r; }
cleanup() {
    for _ in 1 2 3; do # (a mount stacked on another shows once it is gone)
        [ -n "$(mounts_under)" ] || break
        for m in $(mounts_under); do umount -l "$m" 2>/dev/null || :; done
    done
    # never rm -rf through a mount that is still there (the host's /dev)
    if [ -n "$(mounts_under)" ]; then
        echo "$me: $root still has mounts (grep $root /proc/mounts); not removing $dir" >&2
    elif [ "${KEEP:-0}" = 1 ]; then
        echo "$me: kept $dir"
    else
        rm -rf "$dir"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "$me: a bare Debian $suite in $root (debootstrap, about a minute) ..."
debootstrap --variant=minbase "$suite" "$root" >"$dir/debootstrap.log" 2>&1 || {
    tail -n 20 "$dir/debootstrap.log" >&2
    echo "$me: debootstrap failed (its log: $dir/debootstrap.log): check the network and the mirror" >&2
    KEEP=1
    exit 1
}
# / a mount point of its own, as on a machine (ip netns exec remounts it),
# then the kernel's file systems
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
for m in sys dev; do
    mount --rbind "/$m" "$root/$m"
    mount --make-rslave "$root/$m"
done
cp /etc/resolv.conf "$root/etc/resolv.conf"
# the machine's own package sources (a mirror or snapshot it is allowed)
if [ -d /etc/apt/sources.list.d ]; then
    cp /etc/apt/sources.list.d/*.sources "$root/etc/apt/sources.list.d/" 2>/dev/null \
        && rm -f "$root/etc/apt/sources.list" || :
fi
echo "$me: make and git, as a person installs them to fetch and build swarm ..."
chroot "$root" sh -c 'apt-get update && apt-get install -y --no-install-recommends make git ca-certificates' \
    >"$dir/setup.log" 2>&1 || { tail -n 20 "$dir/setup.log" >&2; echo "$me: apt-get in the chroot failed (its log: $dir/setup.log)" >&2; KEEP=1; exit 1; }
mkdir -p "$root/home/swarm/work"
git clone -q "$PWD" "$root/home/swarm/work/main"
[ -d ../shared ] && cp -r ../shared "$root/home/swarm/work/shared"
rc=0
for goal in "$@"; do
    log="$dir/$(echo "$goal" | tr ' =/' '___').log"
    echo "$me: make $goal (its output: $log) ..."
    t0=$(date +%s)
    if chroot "$root" env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
        sh -c "cd /home/swarm/work/main && make $goal" >"$log" 2>&1; then
        summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -1 || :)
        echo "$me: make $goal passed in $(($(date +%s) - t0)) s${summary:+ (its last count: $summary)}"
    else
        rc=$?
        tail -n 30 "$log" | sed 's/^/    /'
        echo "$me: make $goal failed (exit $rc) in $(($(date +%s) - t0)) s; the whole output: $log" >&2
        KEEP=1
        break
    fi
done
exit $rc
