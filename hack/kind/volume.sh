#!/usr/bin/env bash
# (Re)creates the static ReadWriteMany volume of hack/kind/volume.yaml for the e2e run's claim.
#
# A static volume serves one claim: once that claim is deleted the volume is Released, keeps the
# old claim's uid in its claimRef, and the next run's claim (same name, new uid) stays Pending.
# The volume's policy is Retain (a hostPath volume outside /tmp cannot be deleted by the
# controller), so this script deletes a Released or Failed volume object and applies it again;
# a volume still Bound to a live claim is left alone. kubectl from PATH, KUBECONFIG set.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
name=payloadrun-e2e
phase=$(kubectl get pv "$name" -o 'jsonpath={.status.phase}' 2>/dev/null || true)
case "$phase" in
  Released|Failed)
    echo "volume.sh: $name is $phase (its claim is gone); making it anew" >&2
    kubectl delete pv "$name" --wait=true >&2
    ;;
esac
kubectl apply -f "$here/volume.yaml" >&2
