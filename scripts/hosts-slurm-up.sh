#!/usr/bin/env bash
# Slurm across the test bed's hosts (scripts/hosts-up.sh): slurmctld on node1 (the login and
# control host), a slurmd on each of node2..N (NodeName = the host's name, NodeAddr = its
# address), a munged on every host, all with one munge key through the shared filesystem.
# The recipe of scripts/slurm-local-up.sh (Debian 12, Slurm 22.05, root, no systemd), spread
# over hosts: its own config in $HOSTS_DIR/slurm/etc, bound on /etc/slurm (and the key on
# /etc/munge) inside the hosts only, so the machine's own /etc/slurm and any one-node Slurm
# running here are left alone. Partition `debug` = node2..N; no accounting (squeue, not sacct).
# Idempotent: what is already up is only checked; a host whose daemons died (a killed host)
# gets them started again; a changed config restarts the daemons.
#   HOSTS_SLURM_CPUS=1           CPUs per compute node
#   HOSTS_SLURM_MEM_MB=3072      memory per compute node
#   HOSTS_SLURM_NODE_TIMEOUT=10  SlurmdTimeout: seconds until a silent node is DOWN (its jobs
#                                NODE_FAIL, and --requeue jobs requeued)
#   HOSTS_SLURM_CRED_EXPIRE=30   AuthInfo cred_expire: also how long a requeued job waits
#                                before it starts again (Slurm's default: 120)
#   HOSTS_SLURM_TIMEOUT=60       seconds to wait for the nodes to become idle
# Use it from node1: scripts/on-host.sh 1 sinfo   (or sbatch, squeue, the sweep's CLI)
# Stop it with scripts/hosts-slurm-down.sh (scripts/hosts-down.sh stops everything).
set -euo pipefail
. "$(dirname "$0")/hosts-lib.sh"
[ "$(id -u)" = 0 ] || die "must run as root"
[ -s "$RUN/settings" ] || die "the bed is not up (scripts/hosts-up.sh)"
[ "$N" -ge 2 ] || die "Slurm across hosts needs HOSTS_N >= 2 (node1 controls, node2.. compute)"
CPUS=${HOSTS_SLURM_CPUS:-1}; MEM=${HOSTS_SLURM_MEM_MB:-3072}
NODE_TIMEOUT=${HOSTS_SLURM_NODE_TIMEOUT:-10}; TIMEOUT=${HOSTS_SLURM_TIMEOUT:-60}
CRED_EXPIRE=${HOSTS_SLURM_CRED_EXPIRE:-30}
S=$DIR/slurm
START=$SECONDS

# 1. Packages, as scripts/slurm-local-up.sh installs them (no service started by their scripts).
# One package installation at a time on this machine (the one-node and the multi-host setups may
# start together, from two test workers): the second waits, then finds the packages installed.
exec 9>/tmp/.orchestrator-apt.lock
flock -w 900 9 || die "another package installation held /tmp/.orchestrator-apt.lock for 15 min"
missing=""
for p in munge slurmctld slurmd slurm-client; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "hosts-slurm: installing$missing" >&2
  policy=0
  [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
                                     chmod +x /usr/sbin/policy-rc.d; policy=1; }
  rc=0
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      -o DPkg::Lock::Timeout=300 --no-install-recommends $missing; } >/dev/null || rc=$?
  [ $policy = 0 ] || rm -f /usr/sbin/policy-rc.d
  [ $rc = 0 ] || die "apt-get install$missing failed (rc=$rc)"
fi
exec 9>&-

# running K NAME: a process called NAME runs on host K
running() { local p; for p in $(pids "$1"); do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ] && return 0; done; return 1; }
# stop_on K NAME...: stop those daemons of host K
stop_on() {
  local k=$1 p; shift
  local victims=()
  for p in $(pids "$k"); do
    local c; c=$(cat "/proc/$p/comm" 2>/dev/null) || continue
    for name in "$@"; do [ "$c" = "$name" ] && victims+=("$p"); done
  done
  stop_pids 15 "${victims[@]}"
}

# 2. Configuration on the shared filesystem.
mkdir -p "$S/etc" "$S/state" "$DIR/log"
install -d -o munge -g munge -m 700 "$S/munge"
if [ ! -s "$S/munge/munge.key" ]; then
  mungekey --create --keyfile="$S/munge/munge.key" 2>/dev/null ||
    dd if=/dev/urandom of="$S/munge/munge.key" bs=1024 count=1 status=none
fi
chown munge:munge "$S/munge/munge.key"; chmod 600 "$S/munge/munge.key"
changed=0
put() {  # put FILE: stdin becomes FILE if it differs
  local tmp; tmp=$(mktemp)
  cat > "$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else install -m 644 "$tmp" "$1"; rm -f "$tmp"; changed=1; fi
}
{
cat <<CONF
# Written by scripts/hosts-slurm-up.sh: Slurm across the hosts of test bed $BED.
ClusterName=$BED
SlurmctldHost=node1($(addr 1))
SlurmUser=root
AuthType=auth/munge
AuthInfo=cred_expire=$CRED_EXPIRE
StateSaveLocation=$S/state
SlurmdSpoolDir=/tmp/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
MailProg=/bin/true
MpiDefault=none
# Not cgroup: the freezer hierarchy is the machine's, shared with any other Slurm running here.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$(( MEM / CPUS ))
SchedulerParameters=bf_interval=1,batch_sched_delay=0
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=$NODE_TIMEOUT
KillWait=5
MinJobAge=300
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
CONF
for k in $(seq 2 "$N"); do
  echo "NodeName=node$k NodeAddr=$(addr "$k") CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"
done
echo "PartitionName=debug Nodes=node[2-$N] Default=YES MaxTime=INFINITE State=UP"
} > "$S/etc/slurm.conf.new"
put "$S/etc/slurm.conf" < "$S/etc/slurm.conf.new"; rm -f "$S/etc/slurm.conf.new"

# 3. On every host: /etc/slurm and /etc/munge are the bed's; munged with the shared key.
for k in $(seq 1 "$N"); do
  on "$k" sh -ec '
    for pair in "$1/etc:/etc/slurm" "$1/munge:/etc/munge"; do
      src=${pair%%:*}; dst=${pair#*:}
      mkdir -p "$dst"
      [ "$(findmnt -n -o TARGET --target "$dst")" = "$dst" ] || mount --bind "$src" "$dst"
    done
    mkdir -p /run/munge; chown munge:munge /run/munge; chmod 755 /run/munge' sh "$S"
  if ! running "$k" munged; then
    on "$k" runuser -u munge -- /usr/sbin/munged --seed-file=/run/munge/munged.seed \
      --log-file="/tmp/munged.log"
  fi
  retry 10 on "$k" sh -c 'munge -n | unmunge' || die "munged on node$k does not answer"
done

# 4. slurmctld on node1, slurmd on node2..N; restarted when the config changed.
if [ $changed = 1 ]; then
  for k in $(seq 1 "$N"); do stop_on "$k" slurmctld slurmd; done
fi
running 1 slurmctld || on 1 /usr/sbin/slurmctld
retry 30 on 1 scontrol ping || die "slurmctld does not answer (see $DIR/log/slurmctld.log)"
for k in $(seq 2 "$N"); do running "$k" slurmd || on "$k" /usr/sbin/slurmd; done

# 5. Every node takes jobs (a node drained or down from an earlier life is resumed once).
deadline=$((SECONDS + TIMEOUT)); resumed=""
while :; do
  states=$(on 1 sinfo -h -N -o '%N %T' 2>/dev/null | sort -u)
  bad=$(awk '$2 !~ /^(idle|mixed|allocated|completing)/' <<<"$states")
  [ -n "$states" ] && [ -z "$bad" ] && break
  while read -r node state; do
    [ -n "$node" ] || continue
    case "$state" in *drain*|down*|fail*|inval*)
      if [[ " $resumed " != *" $node "* ]] && running "${node#node}" slurmd; then
        sleep 1; on 1 scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
        resumed="$resumed $node"
      fi ;;
    esac
  done <<<"$bad"
  [ $SECONDS -lt $deadline ] || die "nodes not idle after ${TIMEOUT}s: $(echo $bad) (see $DIR/log/slurmd-*.log)"
  sleep 0.3
done
echo "slurm($BED): up, slurm $(on 1 sinfo -V | awk '{print $2}'), slurmctld on node1, partition" \
     "debug = node[2-$N] ($CPUS CPU, ${MEM}M each) ($((SECONDS - START)) s); from node1:" \
     "scripts/on-host.sh 1 sinfo"
