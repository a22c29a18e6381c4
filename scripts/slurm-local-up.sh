#!/usr/bin/env bash
# Install (if missing), configure and start a one-node Slurm on this machine for the tests:
# munged, slurmctld and slurmd on localhost, fake GPUs declared as gres, partition `debug`.
# Debian 12 / Slurm 22.05, run as root, no systemd needed. Idempotent: when everything is
# already up with the same config it only checks and prints the status line.
# No accounting database: the orchestrator reads job states from squeue (sacct where it exists).
#   SLURM_LOCAL_GPUS=4      fake GPUs (gres/gpu, files /run/slurm-fakegpu/gpuN -> /dev/null)
#   SLURM_LOCAL_TIMEOUT=60  seconds to wait for the node to become idle
# Stop it with scripts/slurm-local-down.sh.
set -euo pipefail

GPUS=${SLURM_LOCAL_GPUS:-4}
TIMEOUT=${SLURM_LOCAL_TIMEOUT:-60}
ETC=/etc/slurm
LOG=/var/log/slurm
MARK=/run/slurm-local          # records whether we started munged (down stops only that)
FAKEGPU=/run/slurm-fakegpu
START=$SECONDS

die() { echo "slurm-local-up: error: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root"

# alive PIDFILE NAME: the pidfile names a live process called NAME (not a reused PID)
alive() { [ -s "$1" ] && [ "$(cat "/proc/$(cat "$1")/comm" 2>/dev/null)" = "$2" ]; }
# retry SECONDS CMD...: run CMD every 0.2 s until it succeeds
retry() {
  local n=$(( $1 * 5 )); shift
  until "$@" >/dev/null 2>&1; do n=$((n - 1)); [ $n -gt 0 ] || return 1; sleep 0.2; done
}

# 1. Packages. A temporary policy-rc.d keeps the packages' scripts from starting services.
# One package installation at a time on this machine (the one-node and the multi-host setups may
# start together, from two test workers): the second waits, then finds the packages installed.
exec 9>/tmp/.orchestrator-apt.lock
flock -w 900 9 || die "another package installation held /tmp/.orchestrator-apt.lock for 15 min"
missing=""
for p in munge slurmctld slurmd slurm-client; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "slurm-local-up: installing$missing" >&2
  policy=0
  [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
                                     chmod +x /usr/sbin/policy-rc.d; policy=1; }
  rc=0
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends $missing; } >/dev/null || rc=$?
  [ $policy = 0 ] || rm -f /usr/sbin/policy-rc.d
  [ $rc = 0 ] || die "apt-get install$missing failed (rc=$rc)"
fi
exec 9>&-

# 2. Configuration, rewritten only when it changes (a change restarts the daemons).
mkdir -p "$ETC" "$LOG" "$MARK" /var/lib/slurm/slurmctld /var/lib/slurm/slurmd
chown slurm:slurm "$LOG" /var/lib/slurm/slurmctld
HW=$(slurmd -C | head -1)
hw() { tr ' ' '\n' <<<"$HW" | sed -n "s/^$1=//p"; }
CPUS=$(hw CPUs); MEM=$(( $(hw RealMemory) * 95 / 100 ))
# cgroup v1 freezer kills everything a job leaves behind; linuxproc where it is not writable.
PROCTRACK=linuxproc
[ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" = tmpfs ] && [ -w /sys/fs/cgroup/freezer ] && PROCTRACK=cgroup
GRES=""
if [ "$GPUS" -gt 0 ]; then
  # slurmd drops gpus without device files; distinct symlinks to /dev/null stand in for them.
  mkdir -p "$FAKEGPU"
  for i in $(seq 0 $((GPUS - 1))); do ln -sfn /dev/null "$FAKEGPU/gpu$i"; done
  GRES="Gres=gpu:$GPUS"
fi

changed=0
# put FILE: stdin becomes FILE if it differs
put() {
  local tmp; tmp=$(mktemp)
  cat > "$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else install -m 644 "$tmp" "$1"; rm -f "$tmp"; changed=1; fi
}
put "$ETC/slurm.conf" <<CONF
# Written by scripts/slurm-local-up.sh: a one-node test cluster.
ClusterName=local
SlurmctldHost=localhost
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
MailProg=/bin/true
MpiDefault=none
ProctrackType=proctrack/$PROCTRACK
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$(( MEM / CPUS ))
# Start queued jobs at once (defaults: 3 s batch delay, 30 s backfill interval).
SchedulerParameters=bf_interval=1,batch_sched_delay=0
ReturnToService=2
KillWait=5
MinJobAge=300
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$CPUS Boards=$(hw Boards) SocketsPerBoard=$(hw SocketsPerBoard) CoresPerSocket=$(hw CoresPerSocket) ThreadsPerCore=$(hw ThreadsPerCore) RealMemory=$MEM $GRES State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
if [ "$GPUS" -gt 0 ]; then
  put "$ETC/gres.conf" <<<"NodeName=localhost Name=gpu File=$FAKEGPU/gpu[0-$((GPUS - 1))]"
elif [ -e "$ETC/gres.conf" ]; then
  rm -f "$ETC/gres.conf"; changed=1
fi
put "$ETC/cgroup.conf" <<CONF
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
CONF

# 3. munge (reused when one is already running).
if [ ! -s /etc/munge/munge.key ]; then
  mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null ||
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  chown munge:munge /etc/munge/munge.key; chmod 600 /etc/munge/munge.key
fi
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  mkdir -p /run/munge; chown munge:munge /run/munge
  runuser -u munge -- /usr/sbin/munged
  touch "$MARK/munged"
  retry 10 sh -c 'munge -n | unmunge' || die "munged did not start"
fi

# 4. slurmctld and slurmd; restarted when the config changed.
if [ $changed = 1 ] && { alive /run/slurmctld.pid slurmctld || alive /run/slurmd.pid slurmd; }; then
  echo "slurm-local-up: config changed, restarting slurmctld and slurmd" >&2
  scontrol shutdown >/dev/null 2>&1 || true
  retry 20 sh -c '! pgrep -x slurmctld && ! pgrep -x slurmd' || true
  for d in slurmctld slurmd; do if alive /run/$d.pid $d; then kill "$(cat /run/$d.pid)"; fi; done
  retry 10 sh -c '! pgrep -x slurmctld && ! pgrep -x slurmd' || die "old daemons did not stop"
fi
alive /run/slurmctld.pid slurmctld || (cd / && /usr/sbin/slurmctld)
retry 30 scontrol ping || die "slurmctld does not answer (see $LOG/slurmctld.log)"
# The node is called localhost whatever the hostname is.
alive /run/slurmd.pid slurmd || (cd / && /usr/sbin/slurmd -N localhost)

# 5. Wait until the node takes jobs (resume it once if an earlier config left it drained).
deadline=$((SECONDS + TIMEOUT)); resumed=0
while :; do
  state=$(sinfo -h -n localhost -o %T 2>/dev/null | head -1)
  case "$state" in
    idle|mixed|allocated|completing) break ;;
    *drain*|down*|inval*|fail*)
      if [ $resumed = 0 ] && alive /run/slurmd.pid slurmd; then
        sleep 1; scontrol update nodename=localhost state=resume 2>/dev/null || true; resumed=1
      fi ;;
  esac
  [ $SECONDS -lt $deadline ] || die "node not idle after ${TIMEOUT}s (state=$state; see $LOG/slurmd.log)"
  sleep 0.2
done
echo "slurm-local: up, slurm $(sinfo -V | awk '{print $2}'), node localhost $state, cpus=$CPUS" \
     "mem=${MEM}M gpus=$GPUS partition=debug proctrack=$PROCTRACK ($((SECONDS - START)) s)"
