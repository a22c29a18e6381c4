#!/usr/bin/env bash
# Bring up a local multi-host test bed: N hosts node1..nodeN (default 3) on this machine, each
# with its own network namespace (eth0 at $HOSTS_NET.K/24 on a private bridge), hostname and
# mounts (private /tmp, /run, /dev/shm and /etc/hosts naming node1..N; a checkout under /tmp stays
# visible at its path); the filesystem is otherwise shared. No default route anywhere and no
# interface of the root namespace on the bridge: nothing reaches or leaves the real network. Root only. Idempotent: a bed that is
# already up as asked is only checked; anything else (a half-built bed after a crash, other
# settings) is torn down first (scripts/hosts-down.sh) and built again.
# Settings: HOSTS_BED, HOSTS_N, HOSTS_NET, HOSTS_DIR (see scripts/hosts-lib.sh).
# Run a command on a host: scripts/on-host.sh K CMD...; stop everything: scripts/hosts-down.sh.
set -euo pipefail
# The requested settings win over the recorded ones: compare, and rebuild on a difference.
WANT_N=${HOSTS_N:-3}; WANT_NET=${HOSTS_NET:-198.18.0}; WANT_DIR=${HOSTS_DIR:-/var/tmp/hosts-${HOSTS_BED:-mn}}
. "$(dirname "$0")/hosts-lib.sh"
START=$SECONDS
[ "$(id -u)" = 0 ] || die "must run as root (namespaces, bridges and mounts)"
[[ $WANT_N =~ ^[0-9]+$ ]] && [ "$WANT_N" -ge 1 ] && [ "$WANT_N" -le 250 ] || die "HOSTS_N=$WANT_N: 1..250"
[[ $WANT_NET =~ ^198\.(18|19)\.[0-9]{1,3}$ ]] && [ "${WANT_NET##*.}" -le 255 ] ||
  die "HOSTS_NET=$WANT_NET: the first three octets of a /24 inside 198.18.0.0/15 (e.g. 198.18.0)"
[[ $WANT_DIR = /* ]] || die "HOSTS_DIR=$WANT_DIR: an absolute path"
if ! command -v ip >/dev/null; then  # iproute2, as scripts/slurm-local-up.sh installs Slurm
  exec 9>/tmp/.orchestrator-apt.lock   # one package installation at a time (see slurm-local-up.sh)
  flock -w 900 9 || die "another package installation held /tmp/.orchestrator-apt.lock for 15 min"
  if ! command -v ip >/dev/null; then
    echo "hosts($BED): installing iproute2" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends iproute2; } >/dev/null || die "apt-get install iproute2 failed"
  fi
  exec 9>&-
fi
for tool in ip nsenter unshare setsid mountpoint; do command -v $tool >/dev/null || die "$tool not found (iproute2, util-linux)"; done

# A checkout under /tmp would be hidden on the hosts by their private /tmp: it is bound at the
# same path inside each host's /tmp (in the host's own mount namespace: nothing leaks out).
WANT_PROJECT=$(cd "$SCRIPTS/.." && pwd -P)
healthy() {
  [ -s "$RUN/settings" ] && [ "$N" = "$WANT_N" ] && [ "$NET" = "$WANT_NET" ] && [ "$DIR" = "$WANT_DIR" ] &&
    [ "${PROJECT:-}" = "$WANT_PROJECT" ] || return 1
  [ -e "/run/netns/$BED-br" ] || return 1
  local k; for k in $(seq 1 "$N"); do host_up "$k" || return 1; done
  [ ! -e "/run/netns/$(netns $((N + 1)))" ]
}
status() {
  echo "hosts($BED): up, $N hosts node1..node$N at $NET.1..$NET.$N/24, files $DIR" \
       "($((SECONDS - START)) s); run on a host: scripts/on-host.sh K CMD"
}
if healthy; then status; exit 0; fi
if [ -e "$RUN" ] || ip netns list | grep -q "^$BED-"; then
  echo "hosts($BED): rebuilding (not up as asked, or left half-built)" >&2
  bash "$SCRIPTS/hosts-down.sh" >/dev/null
fi
N=$WANT_N; NET=$WANT_NET; DIR=$WANT_DIR; PROJECT=$WANT_PROJECT
case "$PROJECT" in /tmp/*) UNDER_TMP=${PROJECT#/tmp/} ;; *) UNDER_TMP= ;; esac

# On any failure from here on, leave nothing half-built.
trap 'rc=$?; [ $rc = 0 ] || { echo "hosts($BED): up failed; tearing down" >&2; bash "$SCRIPTS/hosts-down.sh" >/dev/null 2>&1; }; exit $rc' EXIT

# Namespace files: a bind mount of a mount namespace must sit on a private mount.
mkdir -p "$RUN"
mountpoint -q "$RUN" || mount --bind "$RUN" "$RUN"
mount --make-private "$RUN"
printf 'N=%s\nNET=%s\nDIR=%q\nPROJECT=%q\n' "$N" "$NET" "$DIR" "$PROJECT" > "$RUN/settings"

mkdir -p "$DIR/shared" "$DIR/log"
chmod 755 "$DIR"
{ echo "127.0.0.1 localhost"; echo "::1 localhost ip6-localhost ip6-loopback"
  for k in $(seq 1 "$N"); do echo "$(addr "$k") node$k"; done; } > "$DIR/hosts"
chmod 644 "$DIR/hosts"

# The bridge, in a namespace of its own (the root namespace has no port on it).
ip netns add "$BED-br"
ip -n "$BED-br" link set lo up
ip -n "$BED-br" link add br0 type bridge
ip -n "$BED-br" link set br0 up

for k in $(seq 1 "$N"); do
  ns=$(netns "$k")
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$BED-br" link add "h$k" type veth peer name eth0 netns "$ns"
  ip -n "$BED-br" link set "h$k" master br0 up
  ip -n "$ns" addr add "$(addr "$k")/24" dev eth0   # on-link route only: no default route
  ip -n "$ns" link set eth0 up
  mkdir -p "$DIR/node$k/tmp"; chmod 1777 "$DIR/node$k/tmp"
  touch "$RUN/node$k.uts" "$RUN/node$k.mnt"
  # A UTS and a mount namespace entered from the host's network namespace, kept by bind mounts.
  nsenter --net="/run/netns/$ns" unshare --uts="$RUN/node$k.uts" --mount="$RUN/node$k.mnt" \
    --propagation private sh -ec '
      hostname "node$1"
      if [ -n "$4" ]; then mkdir -p "$2/node$1/tmp/$4"; mount --bind "$3" "$2/node$1/tmp/$4"; fi
      mount --rbind "$2/node$1/tmp" /tmp
      mount -t tmpfs -o mode=755 "run-node$1" /run
      mkdir -p /run/lock && chmod 1777 /run/lock
      mount -t tmpfs -o mode=1777 "shm-node$1" /dev/shm
      mount --bind "$2/hosts" /etc/hosts' sh "$k" "$DIR" "$PROJECT" "$UNDER_TMP"
done
for k in $(seq 1 "$N"); do host_up "$k" || die "host node$k did not come up"; done
for k in $(seq 1 "$N"); do
  [ -z "$(ip -n "$(netns "$k")" route show default)" ] || die "node$k has a default route"
done
trap - EXIT
status
