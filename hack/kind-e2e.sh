#!/usr/bin/env bash
# End-to-end on kind (needs a Docker engine, kind, kubectl and helm on PATH).
#
#   bash hack/kind-e2e.sh up     # cluster, images built and loaded, RWX volume, chart installed
#   bash hack/kind-e2e.sh test   # up, then the e2e tests against it
#   bash hack/kind-e2e.sh down   # delete the cluster
#
# kind's default storage class cannot provision ReadWriteMany claims, so the run's claim is served
# by a static hostPath PersistentVolume on the (single) kind node, bound to it by claimRef and made
# anew by hack/kind/volume.sh on every `up` (a released one cannot bind the next run's claim).
# The same test bodies run on the local node (make test) with the same chart install.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cluster=${KIND_CLUSTER:-payloadrun-e2e}
tag=${E2E_TAG:-e2e}
kubeconfig=${KIND_KUBECONFIG:-$HOME/.cache/payloadrun/kind-$cluster.kubeconfig}
export KUBECONFIG=$kubeconfig

log() { printf '[kind-e2e %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
need() { command -v "$1" >/dev/null || { log "$1 is not on PATH: $2"; exit 2; }; }

up() {
  need docker "install Docker Engine"
  need kind "go install sigs.k8s.io/kind@latest"
  need kubectl "install kubectl"
  need helm "install helm 3"
  docker info >/dev/null 2>&1 || { log "no Docker engine answers (docker info failed)"; exit 2; }
  mkdir -p "$(dirname "$kubeconfig")"
  if ! kind get clusters | grep -qx "$cluster"; then
    log "creating kind cluster $cluster"
    kind create cluster --name "$cluster" --config "$repo/hack/kind/cluster.yaml" --wait 180s
  fi
  kind get kubeconfig --name "$cluster" >"$kubeconfig"
  log "building images payloadrun:$tag and payloadrun-operator:$tag"
  docker build -q -f "$repo/sidecars/Dockerfile" -t "payloadrun:$tag" "$repo"
  docker build -q -f "$repo/operator/Dockerfile" -t "payloadrun-operator:$tag" "$repo"
  kind load docker-image --name "$cluster" "payloadrun:$tag" "payloadrun-operator:$tag"
  # the hostPath directory must be writable by the sidecars' non-root user
  docker exec "$cluster-control-plane" sh -c 'mkdir -p /var/payloadrun && chmod 0777 /var/payloadrun'
  bash "$repo/hack/kind/volume.sh"
  log "installing the chart"
  bash "$repo/hack/install-chart.sh" "$tag"
  log "ready; export KUBECONFIG=$kubeconfig"
}

case "${1:-}" in
  up) up ;;
  test)
    up
    PAYLOADRUN_KIND_KUBECONFIG=$kubeconfig PAYLOADRUN_E2E_IMAGE="payloadrun:$tag" \
      python -m pytest "$repo/tests/integration/test_e2e.py" -k kind -v -rs
    ;;
  down) kind delete cluster --name "$cluster" ;;
  *) echo "usage: $0 up|test|down" >&2; exit 2 ;;
esac
