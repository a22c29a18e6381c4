#!/usr/bin/env bash
# Run a command on host K of the test bed (scripts/hosts-up.sh): its network, hostname and
# mounts, in the caller's directory where that path exists on the host (else /), with the
# caller's environment. Example: scripts/on-host.sh 2 hostname    ->  node2
# Root only. HOSTS_BED selects the bed (default mn).
set -euo pipefail
. "$(dirname "$0")/hosts-lib.sh"
[ $# -ge 2 ] && [[ $1 =~ ^[0-9]+$ ]] || { echo "usage: $0 K COMMAND [ARG...]" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "must run as root"
[ -e "$RUN/node$1.mnt" ] || die "no host node$1 (is the bed up? scripts/hosts-up.sh)"
on "$@"
