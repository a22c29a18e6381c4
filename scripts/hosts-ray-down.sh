#!/usr/bin/env bash
# Stop the Ray of scripts/hosts-ray-up.sh on every host of the bed: SIGTERM to each
# `ray start --block` (its processes stop with it), then SIGKILL to any Ray process left after
# 10 s. Never `ray stop`: it would stop every Ray of the user on the machine. Idempotent.
set -uo pipefail
. "$(dirname "$0")/hosts-lib.sh"
[ "$(id -u)" = 0 ] || die "must run as root"
ray_pids() {  # ray_pids PATTERN: processes on the bed's hosts whose command line matches
  local k p
  for k in $(seq 1 "$N"); do for p in $(pids "$k"); do
    tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -qE "$1" && echo "$p"
  done; done
}
starts=($(ray_pids ' start .*--block'))
[ ${#starts[@]} = 0 ] || kill "${starts[@]}" 2>/dev/null
for _ in $(seq 50); do [ -z "$(ray_pids '(^|/)(ray|raylet|gcs_server)( |$)|ray::|/site-packages/ray/')" ] && break; sleep 0.2; done
left=($(ray_pids '(^|/)(ray|raylet|gcs_server)( |$)|ray::|/site-packages/ray/'))
[ ${#left[@]} = 0 ] || kill -9 "${left[@]}" 2>/dev/null
echo "ray($BED): down"
