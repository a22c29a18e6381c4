#!/usr/bin/env bash
# Install munge and Slurm's daemons (Debian 12: Slurm 22.05) where they are missing, for
# scripts/slurm-local-up.sh and scripts/hosts-slurm-up.sh. A temporary policy-rc.d keeps the
# packages' scripts from starting services: the up scripts start the daemons themselves.
# One installation at a time on this machine (the one-node and the multi-host setups may start
# together, from two test workers): the second waits, then finds the packages installed.
set -euo pipefail
die() { echo "slurm-packages: error: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root"

exec 9>/tmp/.orchestrator-apt.lock
flock -w 900 9 || die "another package installation held /tmp/.orchestrator-apt.lock for 15 min"
missing=""
for p in munge slurmctld slurmd slurm-client; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -n "$missing" ] || exit 0
echo "slurm-packages: installing$missing" >&2
policy=0
[ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
                                   chmod +x /usr/sbin/policy-rc.d; policy=1; }
rc=0
{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    -o DPkg::Lock::Timeout=300 --no-install-recommends $missing; } >/dev/null || rc=$?
[ $policy = 0 ] || rm -f /usr/sbin/policy-rc.d
[ $rc = 0 ] || die "apt-get install$missing failed (rc=$rc)"
