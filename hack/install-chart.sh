#!/usr/bin/env bash
# Installs the chart the way a user would, with the operator as a pod with the chart's
# ServiceAccount and RBAC. Used by the end-to-end tests (the local node, and hack/kind-e2e.sh on
# kind) and by make demo. Two sources:
#
#   KUBECONFIG=... bash hack/install-chart.sh [TAG [HELM ARGS...]]   # TAG default e2e
#       the chart of this checkout, with the images built here by hack/images.sh and imported into
#       the node (never pulled: pullPolicy Never, names payloadrun-operator:TAG and payloadrun:TAG)
#
#   KUBECONFIG=... PAYLOADRUN_REGISTRY=PREFIX bash hack/install-chart.sh VERSION [HELM ARGS...]
#       what hack/publish.sh pushed to PREFIX (127.0.0.1:5000/payloadrun; ghcr.io/payloadrun is
#       the release's): the chart from oci://PREFIX/charts/payloadrun at VERSION, its images
#       PREFIX/payloadrun-operator and PREFIX/payloadrun at the chart's appVersion (the chart's
#       default tag), pulled by the node. PAYLOADRUN_PLAIN_HTTP=1 for a registry without TLS.
#
# helm and kubectl come from PATH. Progress and helm's output go to stderr.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tag=${1:-e2e}
shift || true
# a CRD already applied with kubectl (the tests' other modules do) goes to this release
bash "$repo/hack/adopt-crd.sh" payloadrun payloadrun-system
if [ -n "${PAYLOADRUN_REGISTRY:-}" ]; then
  prefix=${PAYLOADRUN_REGISTRY%/}
  plain=()
  [ "${PAYLOADRUN_PLAIN_HTTP:-0}" = 1 ] && plain=(--plain-http)
  helm upgrade --install payloadrun "oci://$prefix/charts/payloadrun" --version "$tag" "${plain[@]}" \
    --namespace payloadrun-system --create-namespace \
    --set image.repository="$prefix/payloadrun-operator" \
    --set sidecars.image.repository="$prefix/payloadrun" "$@" >&2
else
  helm upgrade --install payloadrun "$repo/charts/payloadrun" \
    --namespace payloadrun-system --create-namespace \
    --set image.repository=payloadrun-operator --set image.tag="$tag" --set image.pullPolicy=Never \
    --set sidecars.image.repository=payloadrun --set sidecars.image.tag="$tag" \
    --set sidecars.image.pullPolicy=Never "$@" >&2
fi
kubectl -n payloadrun-system rollout status deploy/payloadrun --timeout=180s >&2
