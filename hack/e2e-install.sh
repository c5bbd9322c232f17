#!/usr/bin/env bash
# Installs the chart for the end-to-end tests, the way a user would, with the locally built
# images (never pulled): the operator as a pod with the chart's ServiceAccount and RBAC.
# Shared by hack/kind-e2e.sh (kind) and tests/integration/test_e2e.py (the local node).
#
#   KUBECONFIG=... bash hack/e2e-install.sh [TAG]    # helm and kubectl from PATH; TAG default e2e
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tag=${1:-e2e}
helm upgrade --install payloadrun "$repo/charts/payloadrun" \
  --namespace payloadrun-system --create-namespace \
  --set image.repository=payloadrun-operator --set image.tag="$tag" --set image.pullPolicy=Never \
  --set sidecars.image.repository=payloadrun --set sidecars.image.tag="$tag" \
  --set sidecars.image.pullPolicy=Never --set operator.readinessCheckSeconds=2 >&2
kubectl -n payloadrun-system rollout status deploy/payloadrun --timeout=180s >&2
