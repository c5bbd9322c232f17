#!/usr/bin/env bash
# Installs what the local node takes from Debian's packages (the rest is built by build.sh):
#   containerd (1.6), runc, containernetworking-plugins (/usr/lib/cni), iptables, conntrack,
#   ipset (kube-router's network policies match pods through ip sets), iproute2, and libc6-dev for the static pause binary; GlusterFS (glusterfs-server,
#   glusterfs-client), the real network filesystem of the node's storage class and of the
#   shared-filesystem tests (payloadrun_devcluster/glusterfs.py).
# Only what is missing is installed (as root, with apt-get); prints nothing when all is there.
set -euo pipefail
log() { printf '[%s] node-packages.sh: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

declare -A provides=(
  [containerd]=/usr/bin/containerd
  [runc]=/usr/sbin/runc
  [containernetworking-plugins]=/usr/lib/cni/bridge
  [iptables]=/usr/sbin/iptables
  [conntrack]=/usr/sbin/conntrack
  [ipset]=/usr/sbin/ipset
  [iproute2]=/usr/sbin/ip
  [libc6-dev]=/usr/lib/x86_64-linux-gnu/libc.a
  [glusterfs-server]=/usr/sbin/glusterd
  [glusterfs-client]=/usr/sbin/glusterfs
)
missing=()
for pkg in "${!provides[@]}"; do
  [[ -e "${provides[$pkg]}" ]] || missing+=("$pkg")
done
(( ${#missing[@]} )) || exit 0
if [[ "$(id -u)" != 0 ]]; then
  # Not an error here: without them the node does not start, and the tests that need pods
  # say so (or fail, under PAYLOADRUN_REQUIRE_CLUSTER).
  log "missing ${missing[*]}; the node needs them and root: sudo apt-get install ${missing[*]}"
  exit 0
fi
log "installing ${missing[*]} (apt-get)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
log "installed"
