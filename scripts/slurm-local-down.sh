#!/usr/bin/env bash
# Stop the one-node Slurm of scripts/slurm-local-up.sh: cancel every job, stop slurmctld and
# slurmd, and stop munged only if slurm-local-up.sh started it. Idempotent.
set -uo pipefail
MARK=/run/slurm-local
[ "$(id -u)" = 0 ] || { echo "slurm-local-down: error: must run as root" >&2; exit 1; }

alive() { [ -s "$1" ] && [ "$(cat "/proc/$(cat "$1")/comm" 2>/dev/null)" = "$2" ]; }
# stop PIDFILE NAME: SIGTERM, up to 15 s, then SIGKILL
stop() {
  alive "$1" "$2" || { rm -f "$1"; return 0; }
  local pid n=75; pid=$(cat "$1")
  kill "$pid" 2>/dev/null
  while [ $n -gt 0 ] && kill -0 "$pid" 2>/dev/null; do sleep 0.2; n=$((n - 1)); done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  rm -f "$1"
}

if alive /run/slurmctld.pid slurmctld && scontrol ping >/dev/null 2>&1; then
  jobs=$(squeue -h -o %A | sort -u)
  if [ -n "$jobs" ]; then
    scancel $jobs 2>/dev/null
    for _ in $(seq 100); do [ -z "$(squeue -h -o %A)" ] && break; sleep 0.2; done
  fi
  scontrol shutdown >/dev/null 2>&1   # stops slurmctld and slurmd, saving state
fi
stop /run/slurmctld.pid slurmctld
stop /run/slurmd.pid slurmd
if [ -e "$MARK/munged" ]; then stop /run/munge/munged.pid munged; rm -f "$MARK/munged"; fi
echo "slurm-local: down"
