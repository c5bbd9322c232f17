#!/usr/bin/env bash
# Hands an existing PayloadRun CRD to a Helm release, so `helm install`/`upgrade` of the chart
# (which installs the CRD from a template) can take it over instead of failing with "invalid
# ownership metadata": for a CRD applied with kubectl (crds/), or installed by an older chart
# from its crds/ folder, or by another release. Nothing happens when there is no such CRD.
#
#   KUBECONFIG=... bash hack/adopt-crd.sh [RELEASE [NAMESPACE]]   # default payloadrun payloadrun-system
#
# kubectl comes from PATH. What it does is what Helm's ownership check reads: one label, two
# annotations (https://helm.sh/docs/faq/changes_since_helm2/, "adopting existing resources").
set -euo pipefail
release=${1:-payloadrun}
namespace=${2:-payloadrun-system}
crd=payloadruns.payloadrun.dev
if ! kubectl get crd "$crd" >/dev/null 2>&1; then
  exit 0
fi
echo "adopt-crd: handing CustomResourceDefinition $crd to Helm release $namespace/$release" >&2
kubectl label crd "$crd" app.kubernetes.io/managed-by=Helm --overwrite >&2
kubectl annotate crd "$crd" meta.helm.sh/release-name="$release" \
  meta.helm.sh/release-namespace="$namespace" --overwrite >&2
