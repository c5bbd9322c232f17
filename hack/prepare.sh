#!/usr/bin/env bash
# Prepares everything `make test` needs, in three lanes at once, so a cold machine spends its
# downloads while it compiles:
#
#   compile  cluster/build.sh: the Go builds (Kubernetes, etcd, helm, CoreDNS, kube-router,
#            crane, the registry, LeaderWorkerSet, Kueue), CPU-bound, about 25 minutes from an
#            empty cache; then helm-docs (hack/helm-docs.sh). Not the oldest Kubernetes' control
#            plane: make test's part that uses it builds it (hack/test.py), beside the tests.
#   python   the project's venv, then vLLM's CPU build (mostly network-bound: torch twice)
#   system   Debian's packages (node, Prometheus, Node.js), the dashboard schema, the container
#            images for amd64 and arm64 (the machine's other architecture under qemu-user
#            emulation), then the previous release's (the upgrade tests'; its script runs in the
#            venv, which it waits for). Every apt-get of the project is in this lane, so none
#            waits on another's dpkg lock. The images no longer wait for the venv and vLLM
#            (eight minutes cold): with the images under way from the start, the compile lane
#            is the one that ends last.
#
# Each lane's progress goes to stderr as its scripts print it (each line names its script). When
# a lane fails, the others are left to finish (nothing half-written: every script writes its cache
# entry under a temporary name first), then this names the failed lanes and exits 1. Warm, the
# lanes find everything in the cache and this takes a few seconds.
#
#   PAYLOADRUN_CACHE   cache directory (default ~/.cache/payloadrun), as for every script here
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
log() { printf '[%s] prepare.sh: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

compile() {
  bash cluster/build.sh >/dev/null
  bash hack/helm-docs.sh --dry-run >/dev/null  # builds helm-docs (the chart README's test)
}

python_lane() {
  bash hack/venv.sh >/dev/null
  bash hack/vllm.sh >/dev/null
}

system() {
  bash cluster/node-packages.sh
  bash hack/prometheus.sh >/dev/null
  bash hack/dashboard-schema.sh >/dev/null
  if [ "$(id -u)" = 0 ]; then
    # both architectures the release publishes (hack/publish.sh images; the other one emulated)
    PAYLOADRUN_IMAGE_ARCH=amd64 bash hack/images.sh >/dev/null
    PAYLOADRUN_IMAGE_ARCH=arm64 bash hack/images.sh >/dev/null
    # the previous release's images, which the upgrade tests install (built in the node's
    # part, the suite's critical path, they cost it over two minutes cold: 0.1.0 debootstraps
    # a base image of its own). hack/venv.sh waits for the python lane's venv (its lock).
    "$(bash hack/venv.sh)/bin/python" -m payloadrun_devkit.previous >/dev/null
  else
    log "not root, so no images are built and pods will not start (make node says the same)"
  fi
}

started=$SECONDS
declare -A lanes=(
  [compile]="compile (cluster/build.sh, helm-docs)"
  [python_lane]="python (venv, vLLM)"
  [system]="system (packages, dashboard schema, images)"
)
declare -A pids=()
for lane in "${!lanes[@]}"; do
  "$lane" &
  pids[$lane]=$!
done
failed=()
for lane in "${!lanes[@]}"; do
  wait "${pids[$lane]}" || failed+=("${lanes[$lane]}")
done
if (( ${#failed[@]} )); then
  for lane in "${failed[@]}"; do log "FAILED: $lane; its output is above"; done
  exit 1
fi
log "ready in $((SECONDS - started)) s"
