#!/usr/bin/env bash
# Installs the chart the way a user would, with the images built here by hack/images.sh (never
# pulled): the operator as a pod with the chart's ServiceAccount and RBAC. Used by the end-to-end
# tests (the local node, and hack/kind-e2e.sh on kind) and by make demo.
#
#   KUBECONFIG=... bash hack/install-chart.sh [TAG [HELM ARGS...]]   # TAG default e2e
#
# helm and kubectl come from PATH. Progress and helm's output go to stderr.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tag=${1:-e2e}
shift || true
# a CRD already applied with kubectl (the tests' other modules do) goes to this release
bash "$repo/hack/adopt-crd.sh" payloadrun payloadrun-system
helm upgrade --install payloadrun "$repo/charts/payloadrun" \
  --namespace payloadrun-system --create-namespace \
  --set image.repository=payloadrun-operator --set image.tag="$tag" --set image.pullPolicy=Never \
  --set sidecars.image.repository=payloadrun --set sidecars.image.tag="$tag" \
  --set sidecars.image.pullPolicy=Never "$@" >&2
kubectl -n payloadrun-system rollout status deploy/payloadrun --timeout=180s >&2
