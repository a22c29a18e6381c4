#!/usr/bin/env bash
# Stop the Slurm of scripts/hosts-slurm-up.sh: cancel every job, stop slurmctld, the slurmds and
# the munged of every host, and unbind /etc/slurm and /etc/munge inside the hosts. Idempotent.
# Keeps the config, key and state in $HOSTS_DIR/slurm (scripts/hosts-down.sh removes them).
set -uo pipefail
. "$(dirname "$0")/hosts-lib.sh"
[ "$(id -u)" = 0 ] || die "must run as root"
[ -s "$RUN/settings" ] || { echo "slurm($BED): down (no bed)"; exit 0; }
by_name() {  # by_name NAME...: pids of those daemons on the bed's hosts
  local k p
  for k in $(seq 1 "$N"); do for p in $(pids "$k"); do
    local c; c=$(cat "/proc/$p/comm" 2>/dev/null) || continue
    for name in "$@"; do [ "$c" = "$name" ] && echo "$p"; done
  done; done
}
if [ -n "$(by_name slurmctld)" ] && on 1 scontrol ping >/dev/null 2>&1; then
  jobs=$(on 1 squeue -h -o %A | sort -u)
  if [ -n "$jobs" ]; then
    on 1 scancel $jobs 2>/dev/null
    for _ in $(seq 100); do [ -z "$(on 1 squeue -h -o %A)" ] && break; sleep 0.2; done
  fi
fi
stop_pids 15 $(by_name slurmctld slurmd slurmstepd)
stop_pids 5 $(by_name munged)
for k in $(seq 1 "$N"); do
  on "$k" sh -c 'for d in /etc/slurm /etc/munge; do
    [ "$(findmnt -n -o TARGET --target $d)" = $d ] && umount $d; done; true' 2>/dev/null
done
echo "slurm($BED): down"
