#!/usr/bin/env bash
# Tear down the test bed of scripts/hosts-up.sh: every process on its hosts (daemons, Ray,
# Slurm, jobs; SIGTERM, then SIGKILL after 5 s), the hosts' namespaces, the bridge and the
# namespace files. Works on a half-built or crashed bed, and when nothing is up (a no-op).
# Keeps $HOSTS_DIR/log and $HOSTS_DIR/shared; --purge removes $HOSTS_DIR as well.
set -uo pipefail
. "$(dirname "$0")/hosts-lib.sh"
[ "$(id -u)" = 0 ] || die "must run as root"
PURGE=0; [ "${1:-}" = --purge ] && PURGE=1

# Every namespace of this bed, recorded or not (a crash may have left more than N).
spaces=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$BED-(node[0-9]+|br)$" || true)
all=()
for ns in $spaces; do all+=($(ip netns pids "$ns" 2>/dev/null)); done
stop_pids 5 "${all[@]}"
for ns in $spaces; do
  left=$(ip netns pids "$ns" 2>/dev/null)
  [ -z "$left" ] || { kill -9 $left 2>/dev/null; sleep 0.5; }
  ip netns del "$ns" 2>/dev/null || echo "hosts($BED): could not delete namespace $ns" >&2
done
if [ -d "$RUN" ]; then
  for f in "$RUN"/*.uts "$RUN"/*.mnt; do
    [ -e "$f" ] || continue
    umount "$f" 2>/dev/null || umount -l "$f" 2>/dev/null
  done
  while mountpoint -q "$RUN"; do umount "$RUN" 2>/dev/null || umount -l "$RUN" || break; done
  rm -rf "$RUN"
fi
if [ -d "$DIR" ]; then
  if [ $PURGE = 1 ]; then rm -rf "$DIR"; else
    find "$DIR" -mindepth 1 -maxdepth 1 ! -name log ! -name shared -exec rm -rf {} +
  fi
fi
echo "hosts($BED): down"
