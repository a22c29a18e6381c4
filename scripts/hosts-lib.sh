# Shared by the scripts/hosts-*.sh test-bed scripts (sourced, not run). See docs-draft/multinode.md.
#
# A "bed" is N hosts node1..nodeN on this one machine. Each host is three namespaces kept by
# bind mounts: a network namespace (its own eth0 and address), a UTS namespace (its own
# hostname) and a mount namespace (private /tmp, /run and /dev/shm, and its own /etc/hosts,
# /etc/slurm and /etc/munge where the Slurm script binds them). Every other path is shared: the
# project, the venv and the stores, as on a cluster with a shared filesystem. The hosts are
# joined by a bridge in a namespace of its own; nothing is routed to or from the real network.
#
# Settings (environment; the up script records them and the other scripts read them back):
#   HOSTS_BED=mn          the bed's name: namespaces <bed>-node1..N and <bed>-br
#   HOSTS_N=3             number of hosts
#   HOSTS_NET=198.18.0    the hosts' /24: nodeK is $HOSTS_NET.K (inside 198.18.0.0/15)
#   HOSTS_DIR=/var/tmp/hosts-<bed>   the bed's files on the shared filesystem
#       hosts              the hosts' /etc/hosts
#       shared/            scratch space every host sees (put stores here)
#       nodeK/tmp          host K's private /tmp
#       log/               daemons' logs (kept by the down script)

BED=${HOSTS_BED:-mn}
[[ $BED =~ ^[a-z][a-z0-9]{0,7}$ ]] || { echo "hosts: HOSTS_BED=$BED: 1-8 lower-case letters/digits" >&2; exit 2; }
RUN=/run/hosts-$BED                    # namespace files (a private mount) and the recorded settings
if [ -s "$RUN/settings" ]; then
  # shellcheck disable=SC1091
  . "$RUN/settings"                    # N, NET, DIR as the bed was brought up
else
  N=${HOSTS_N:-3}; NET=${HOSTS_NET:-198.18.0}; DIR=${HOSTS_DIR:-/var/tmp/hosts-$BED}
fi
SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() { echo "hosts($BED): error: $*" >&2; exit 1; }
netns() { echo "$BED-node$1"; }       # host K's network namespace
addr() { echo "$NET.$1"; }            # host K's address
# on K CMD...: run CMD on host K (its network, hostname and mounts), in the caller's directory
# when that path exists there, else in /.
on() {
  local k=$1; shift
  nsenter --net="/run/netns/$(netns "$k")" --uts="$RUN/node$k.uts" --mount="$RUN/node$k.mnt" \
    -- sh -c 'cd "$1" 2>/dev/null || cd /; shift; exec "$@"' sh "$PWD" "$@"
}
# pids K: every process of host K (those in its network namespace)
pids() { ip netns pids "$(netns "$1")" 2>/dev/null; }
host_up() {  # host K exists with its hostname and address
  local k=$1
  [ -e "/run/netns/$(netns "$k")" ] && [ "$(stat -fc %T "$RUN/node$k.uts" 2>/dev/null)" = nsfs ] &&
    [ "$(stat -fc %T "$RUN/node$k.mnt" 2>/dev/null)" = nsfs ] &&
    [ "$(on "$k" hostname 2>/dev/null)" = "node$k" ] &&
    on "$k" ip -4 -o addr show dev eth0 2>/dev/null | grep -q " $(addr "$k")/24 "
}
# retry SECONDS CMD...: run CMD every 0.2 s until it succeeds
retry() {
  local n=$(( $1 * 5 )); shift
  until "$@" >/dev/null 2>&1; do n=$((n - 1)); [ $n -gt 0 ] || return 1; sleep 0.2; done
}
# stop_pids SIGNAL_GRACE_S PID...: SIGTERM, then SIGKILL what is left after the grace
stop_pids() {
  local grace=$1; shift
  [ $# -gt 0 ] || return 0
  kill "$@" 2>/dev/null
  local n=$(( grace * 5 ))
  while [ $n -gt 0 ]; do
    local left=0 p
    for p in "$@"; do kill -0 "$p" 2>/dev/null && left=1; done
    [ $left = 0 ] && return 0
    sleep 0.2; n=$((n - 1))
  done
  kill -9 "$@" 2>/dev/null
  return 0
}
