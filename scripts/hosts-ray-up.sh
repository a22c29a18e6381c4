#!/usr/bin/env bash
# A Ray cluster across the test bed's hosts (scripts/hosts-up.sh): the head on node1, a worker
# on each of node2..N, each `ray start --block` with --node-ip-address on its own address, and
# token authentication on (one token for the whole cluster, in $HOSTS_DIR/ray/env, mode 600).
# Idempotent: with the head up it only starts the workers that are missing (a host that was
# killed rejoins). Prints the address. Use it from a host:
#   . $HOSTS_DIR/ray/env && scripts/on-host.sh 1 python -m orchestrator sweep cluster=ray \
#       cluster.address=$(cat $HOSTS_DIR/ray/address) ...
# Settings: HOSTS_RAY_PORT=6379, HOSTS_RAY_CPUS=1 (per host), HOSTS_RAY_MEMORY_MB=2048 (per
# host), HOSTS_RAY_TIMEOUT=180 (seconds to wait for all nodes), HOSTS_RAY=ray (the ray command:
# the venv's; the hosts get the caller's environment, PATH and PYTHONPATH included),
# HOSTS_RAY_KEEPALIVE_MS (unset: Ray's defaults): Ray's gRPC client keepalive time and timeout,
# also written to the env file for the driver; kept for later runs of this script (a rejoining
# host), '' goes back to Ray's defaults (300 s + 120 s). A host cut off (link down, not killed) leaves its
# tasks' RPCs hanging until keepalive gives up: with the defaults a job on it fails over only
# after minutes (seen: not within 5); with 5000 in about 100 s.
# Stop it with scripts/hosts-ray-down.sh (scripts/hosts-down.sh stops everything).
set -euo pipefail
. "$(dirname "$0")/hosts-lib.sh"
[ "$(id -u)" = 0 ] || die "must run as root"
[ -s "$RUN/settings" ] || die "the bed is not up (scripts/hosts-up.sh)"
PORT=${HOSTS_RAY_PORT:-6379}; CPUS=${HOSTS_RAY_CPUS:-1}; MEM_MB=${HOSTS_RAY_MEMORY_MB:-2048}
TIMEOUT=${HOSTS_RAY_TIMEOUT:-180}; RAY=${HOSTS_RAY:-$(command -v ray || true)}
[ -n "$RAY" ] && [ -x "$RAY" ] || die "ray not found (put the venv's bin on PATH or set HOSTS_RAY)"
START=$SECONDS
HEAD=$(addr 1):$PORT
mkdir -p "$DIR/ray" "$DIR/log"; chmod 700 "$DIR/ray"
[ -s "$DIR/ray/token" ] || ( umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$DIR/ray/token" )
# Unset: what the cluster was started with (a host rejoining gets the same); empty: Ray's defaults.
KEEPALIVE=${HOSTS_RAY_KEEPALIVE_MS-$(sed -n 's/^export RAY_grpc_client_keepalive_time_ms=//p' "$DIR/ray/env" 2>/dev/null || true)}
[[ $KEEPALIVE =~ ^[0-9]*$ ]] || die "HOSTS_RAY_KEEPALIVE_MS=$KEEPALIVE: milliseconds"
( umask 077
  printf 'export RAY_AUTH_MODE=token\nexport RAY_AUTH_TOKEN=%s\n' "$(cat "$DIR/ray/token")"
  if [ -n "$KEEPALIVE" ]; then
    printf 'export RAY_grpc_client_keepalive_time_ms=%s\nexport RAY_grpc_client_keepalive_timeout_ms=%s\n' \
      "$KEEPALIVE" "$KEEPALIVE"
  fi ) > "$DIR/ray/env.new"
mv "$DIR/ray/env.new" "$DIR/ray/env"
. "$DIR/ray/env"
export RAY_USAGE_STATS_ENABLED=0
echo "$HEAD" > "$DIR/ray/address"
MEM=$((MEM_MB * 1024 * 1024))
ARGS=(--block --num-cpus="$CPUS" --num-gpus=0 --memory="$MEM" --object-store-memory=$((100 * 1024 * 1024))
      --disable-usage-stats)

# The node lines of `ray status`'s Active/Idle sections (its Recent failures name dead nodes too:
# counting those, a killed host would pass for rejoined); the same program as ALIVE_NODES_AWK in
# orchestrator/executors/slurm.py.
alive_nodes() { on 1 "$RAY" status --address="$HEAD" 2>/dev/null |
  awk '/^(Active|Idle):/ {on = 1; next} /^[^ ]/ {on = 0} on && $2 ~ /^node_/ {n += $1} END {print n + 0}'; }
has_raylet() { local p; for p in $(pids "$1"); do
  tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q "/raylet/raylet " && return 0; done; return 1; }
start_node() {  # start_node K ARGS...: a detached `ray start --block` on host K
  local k=$1; shift
  echo "=== $(date -Is) ray start on node$k" >> "$DIR/log/ray-node$k.log"
  on "$k" setsid "$RAY" start "$@" "${ARGS[@]}" --node-ip-address="$(addr "$k")" \
    --node-name="node$k" >> "$DIR/log/ray-node$k.log" 2>&1 < /dev/null &
}
wait_nodes() {  # wait_nodes -ge|-le COUNT: until Ray counts at least (at most) COUNT nodes up
  local deadline=$((SECONDS + TIMEOUT))
  until [ "$(alive_nodes)" "$1" "$2" ]; do
    [ $SECONDS -lt $deadline ] || die "Ray: not $1 $2 nodes up after ${TIMEOUT}s (see $DIR/log/ray-node*.log)"
    sleep 0.5
  done
}

if ! on 1 "$RAY" status --address="$HEAD" >/dev/null 2>&1; then
  bash "$SCRIPTS/hosts-ray-down.sh" >/dev/null 2>&1 || true   # a half-started cluster
  start_node 1 --head --port="$PORT" --include-dashboard=false
  wait_nodes -ge 1
fi
MISSING=(); for k in $(seq 2 "$N"); do has_raylet "$k" || MISSING+=("$k"); done
# A killed host's node stays up in Ray's view until its health checks fail (about 15 s): wait for
# that first, so that the count below is of the nodes that rejoin, not of one that is gone.
wait_nodes -le $((N - ${#MISSING[@]}))
for k in "${MISSING[@]}"; do start_node "$k" --address="$HEAD"; done
wait_nodes -ge "$N"
echo "ray($BED): up, head $HEAD (node1), $N nodes x $CPUS CPU, token in $DIR/ray/env" \
     "($((SECONDS - START)) s)"
