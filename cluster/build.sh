#!/usr/bin/env bash
# Build the local Kubernetes cluster (control plane and node) from the Go module proxy.
#
# Builds (only what is missing) at the versions pinned in cluster/versions.env:
#   kube-apiserver, kube-controller-manager, kubectl,
#   kubelet, kube-scheduler, kube-proxy               (k8s.io/kubernetes, one go build)
#   etcd                                             (go.etcd.io/etcd/server/v3)
#   helm                                             (helm.sh/helm/v3)
#   coredns                                          (github.com/coredns/coredns/coremain, the
#                                                    plugins a cluster uses)
#   kube-router                                      (github.com/cloudnativelabs/kube-router/v2)
#   crane                                            (github.com/google/go-containerregistry)
#   registry                                         (github.com/distribution/distribution/v3)
#   LeaderWorkerSet's controller manager             (sigs.k8s.io/lws, cmd/), with its config/
#   Kueue's controller manager                       (sigs.k8s.io/kueue, cmd/kueue/), with its config/
# into a cache outside the repository, keyed by version:
#   ${PAYLOADRUN_CACHE:-$HOME/.cache/payloadrun}/bin/kubernetes-<v>/{kube-apiserver,...,kube-proxy}
#   .../bin/etcd-<v>/etcd
#   .../bin/helm-<v>/helm
#   .../bin/coredns-<v>/coredns
#   .../bin/kube-router-<v>/kube-router
#   .../bin/crane-<v>/crane, .../bin/registry-<v>/registry   (the release path: hack/publish.sh)
#   .../bin/lws-<v>/manager, .../bin/lws-<v>/config/   (the module's own kustomize tree, copied
#                                                     from the module zip; payloadrun_devcluster.lws)
#   .../bin/kueue-<v>/manager, .../bin/kueue-<v>/config/   (likewise; payloadrun_devcluster.kueue)
#   .../bin/cluster-k<v>-e<v>-h<v>-c<v>-r<v>/   symlinks to all of the above (printed on stdout at the end)
#
# `bash cluster/build.sh --release-tools` builds only helm and crane (what hack/publish.sh needs:
# a release job has no use for Kubernetes' 20 minutes, nor for the tests' registry) and prints
# .../bin/release-h<v>-c<v>/, a directory of symlinks to those two.
# `bash cluster/build.sh --oldest` builds only KUBERNETES_OLDEST_VERSION's kube-apiserver and
# kube-controller-manager (the oldest Kubernetes the project claims; another go build of about
# 340 CPU-seconds cold, 3.5 minutes alone on 2 cores) into .../bin/kubernetes-<oldest>/ and
# prints that directory. It is not part of the default build: `make test`'s part
# oldest-control-plane (hack/test.py), the one that uses it, runs it first, beside the other
# parts' tests, where the cores have room, rather than in `make prepare`, where the Go builds
# already keep both cores busy. It uses the etcd of the default build.
# containerd, runc, iptables and ipset come from Debian's packages: cluster/node-packages.sh.
# The Go module and build caches live under the same cache directory, so a bumped
# component rebuilds from cached modules and packages.
#
# Progress goes to stderr with timestamps; the only stdout line is the binary directory,
# so `BIN=$(bash cluster/build.sh)` works. When everything is built it does not start Go.
#
# Environment:
#   PAYLOADRUN_CACHE       cache root (default $HOME/.cache/payloadrun)
#   PAYLOADRUN_BUILD_JOBS  go build -p (default 2)
#
# Every go build is -trimpath, -ldflags "-s -w" (as Kubernetes' own release builds: no symbol
# table, no DWARF) and -gcflags=all=-dwarf=false: the linker drops the DWARF anyway, so the
# compiler need not make it (helm from an empty build cache: 148 -> 135 CPU-s, the same binary
# but its build id).
set -euo pipefail

# Everything runs inside main(), which bash parses whole before running it: editing this file
# while a build is running cannot change what that build executes.
main() {

TOOLS_ONLY=0 OLDEST_ONLY=0
case "${1:-}" in
  "") ;;
  --release-tools) TOOLS_ONLY=1 ;;
  --oldest) OLDEST_ONLY=1 ;;
  *) echo "build.sh: unknown argument '$1' (none builds everything but the oldest Kubernetes; --release-tools: helm and crane; --oldest: the oldest Kubernetes' control plane)" >&2; exit 2 ;;
esac

RERUN="bash cluster/build.sh${1:+ $1}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"
: "${KUBERNETES_VERSION:?missing in versions.env}" "${ETCD_VERSION:?missing in versions.env}" "${HELM_VERSION:?missing in versions.env}" "${COREDNS_VERSION:?missing in versions.env}" "${KUBE_ROUTER_VERSION:?missing in versions.env}"
: "${KUBERNETES_OLDEST_VERSION:?missing in versions.env}" "${CRANE_VERSION:?missing in versions.env}" "${REGISTRY_VERSION:?missing in versions.env}" "${LWS_VERSION:?missing in versions.env}" "${KUEUE_VERSION:?missing in versions.env}"

CACHE="${PAYLOADRUN_CACHE:-$HOME/.cache/payloadrun}"
JOBS="${PAYLOADRUN_BUILD_JOBS:-2}"
BIN_ROOT="$CACHE/bin"
K8S_DIR="$BIN_ROOT/kubernetes-$KUBERNETES_VERSION"
ETCD_DIR="$BIN_ROOT/etcd-$ETCD_VERSION"
HELM_DIR="$BIN_ROOT/helm-$HELM_VERSION"
COREDNS_DIR="$BIN_ROOT/coredns-$COREDNS_VERSION"
KUBE_ROUTER_DIR="$BIN_ROOT/kube-router-$KUBE_ROUTER_VERSION"
CRANE_DIR="$BIN_ROOT/crane-$CRANE_VERSION"
REGISTRY_DIR="$BIN_ROOT/registry-$REGISTRY_VERSION"
LWS_DIR="$BIN_ROOT/lws-$LWS_VERSION"
KUEUE_DIR="$BIN_ROOT/kueue-$KUEUE_VERSION"
TOOLS_DIR="$BIN_ROOT/release-h$HELM_VERSION-c$CRANE_VERSION"
SET_DIR="$BIN_ROOT/cluster-k$KUBERNETES_VERSION-e$ETCD_VERSION-h$HELM_VERSION-c$COREDNS_VERSION-r$KUBE_ROUTER_VERSION"
K8S_BINS=(kube-apiserver kube-controller-manager kubectl kubelet kube-scheduler kube-proxy)
# the oldest Kubernetes tested: a control plane only (tests/integration's compatibility part)
K8S_OLDEST_DIR="$BIN_ROOT/kubernetes-$KUBERNETES_OLDEST_VERSION"
K8S_OLDEST_BINS=(kube-apiserver kube-controller-manager)

START_S=$SECONDS
log() { printf '[%s +%4ds] build.sh: %s\n' "$(date +%H:%M:%S)" "$((SECONDS - START_S))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

have_tools() {
  [[ -x "$HELM_DIR/helm" && -x "$CRANE_DIR/crane" ]]
}

link_tools() {
  local tmp="$TOOLS_DIR.tmp.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  ln -s "$HELM_DIR/helm" "$tmp/helm"
  ln -s "$CRANE_DIR/crane" "$tmp/crane"
  rm -rf "$TOOLS_DIR"; mv "$tmp" "$TOOLS_DIR"
}

have_manager() {  # an add-on's controller manager and its config/ (kustomize), in directory $1
  [[ -x "$1/manager" && -f "$1/config/default/kustomization.yaml" ]]
}

have_all() {
  local b
  have_tools && [[ -x "$REGISTRY_DIR/registry" ]] || return 1
  have_manager "$LWS_DIR" && have_manager "$KUEUE_DIR" || return 1
  for b in "${K8S_BINS[@]}"; do [[ -x "$K8S_DIR/$b" ]] || return 1; done
  [[ -x "$ETCD_DIR/etcd" && -x "$HELM_DIR/helm" && -x "$COREDNS_DIR/coredns" && -x "$KUBE_ROUTER_DIR/kube-router" ]]
}

have_oldest() {
  local b
  for b in "${K8S_OLDEST_BINS[@]}"; do [[ -x "$K8S_OLDEST_DIR/$b" ]] || return 1; done
}

link_set() {
  # Idempotent: one directory with every binary of this version set.
  local tmp="$SET_DIR.tmp.$$" b
  rm -rf "$tmp"; mkdir -p "$tmp"
  for b in "${K8S_BINS[@]}"; do ln -s "$K8S_DIR/$b" "$tmp/$b"; done
  ln -s "$ETCD_DIR/etcd" "$tmp/etcd"
  ln -s "$HELM_DIR/helm" "$tmp/helm"
  ln -s "$COREDNS_DIR/coredns" "$tmp/coredns"
  ln -s "$KUBE_ROUTER_DIR/kube-router" "$tmp/kube-router"
  ln -s "$CRANE_DIR/crane" "$tmp/crane"
  ln -s "$REGISTRY_DIR/registry" "$tmp/registry"
  ln -s "$LWS_DIR/manager" "$tmp/lws-manager"
  ln -s "$KUEUE_DIR/manager" "$tmp/kueue-manager"
  rm -rf "$SET_DIR"; mv "$tmp" "$SET_DIR"
}

# What this call wants built, and what it prints once it is.
wanted() {
  if (( TOOLS_ONLY )); then have_tools; elif (( OLDEST_ONLY )); then have_oldest; else have_all; fi
}
finish() {
  if (( TOOLS_ONLY )); then link_tools; echo "$TOOLS_DIR"
  elif (( OLDEST_ONLY )); then echo "$K8S_OLDEST_DIR"
  else link_set; echo "$SET_DIR"; fi
}

# ---- warm path: no Go, no network ---------------------------------------------------------
if (( TOOLS_ONLY )) && have_tools; then
  [[ -L "$TOOLS_DIR/helm" && -L "$TOOLS_DIR/crane" ]] || link_tools
  log "release tools present (helm $HELM_VERSION, crane $CRANE_VERSION)"
  echo "$TOOLS_DIR"
  exit 0
fi
if (( OLDEST_ONLY )) && have_oldest; then
  log "the oldest Kubernetes' control plane is present (kubernetes $KUBERNETES_OLDEST_VERSION: ${K8S_OLDEST_BINS[*]})"
  echo "$K8S_OLDEST_DIR"
  exit 0
fi
if (( ! TOOLS_ONLY && ! OLDEST_ONLY )) && have_all; then
  [[ -L "$SET_DIR/kubectl" && -L "$SET_DIR/helm" && -L "$SET_DIR/etcd" && -L "$SET_DIR/coredns" && -L "$SET_DIR/kube-router" && -L "$SET_DIR/crane" && -L "$SET_DIR/registry" && -L "$SET_DIR/lws-manager" && -L "$SET_DIR/kueue-manager" ]] || link_set
  log "all binaries present (kubernetes $KUBERNETES_VERSION, etcd $ETCD_VERSION, helm $HELM_VERSION, coredns $COREDNS_VERSION, kube-router $KUBE_ROUTER_VERSION, lws $LWS_VERSION, kueue $KUEUE_VERSION)"
  echo "$SET_DIR"
  exit 0
fi

# ---- cold path --------------------------------------------------------------------------
command -v go >/dev/null || die "the Go toolchain is not on PATH; Kubernetes $KUBERNETES_VERSION needs Go >= ${GO_MIN_VERSION#go}"
GOV="$(go env GOVERSION)"
if [[ -n "${GO_MIN_VERSION:-}" && "$(printf '%s\n%s\n' "${GO_MIN_VERSION#go}" "${GOV#go}" | sort -V | head -n1)" != "${GO_MIN_VERSION#go}" ]]; then
  die "$GOV is too old: Kubernetes $KUBERNETES_VERSION needs Go >= ${GO_MIN_VERSION#go} (GO_MIN_VERSION in cluster/versions.env)"
fi
log "using $GOV ($(command -v go)); cache $CACHE; go build -p $JOBS"
# what every go build and install below is given (see the header)
GO_BUILD=(-v -p "$JOBS" -trimpath -gcflags=all=-dwarf=false)

mkdir -p "$BIN_ROOT" "$CACHE/logs" "$CACHE/go"
exec 9>"$CACHE/.build.lock"
if ! flock -n 9; then
  log "another build holds $CACHE/.build.lock; waiting for it"
  flock 9
  if wanted; then log "built by the other process"; finish; exit 0; fi
fi

export GOMODCACHE="$CACHE/go/mod"
export GOCACHE="$CACHE/go/build"
export GOPATH="$CACHE/go/path"
export GOTOOLCHAIN=local
export GOFLAGS="-mod=mod -modcacherw -buildvcs=false"
export CGO_ENABLED=0
export GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"

LOG="$CACHE/logs/build-$(date +%Y%m%dT%H%M%S).log"
log "full go output: $LOG"

# Run a go command with its output in $LOG; print a progress line every 100 compiled
# packages (go -v names each package it compiles) and show the log tail on failure.
run_go() {
  local what="$1"; shift
  local n=0 line rc
  echo "### $what: go $*" >>"$LOG"
  set +e
  { go "$@" 2>&1; echo "__RC__=$?"; } | while IFS= read -r line; do
    printf '%s\n' "$line" >>"$LOG"
    case "$line" in
      __RC__=*) exit "${line#__RC__=}" ;;
      go:\ downloading*) ;;
      [a-z]*/*|[a-z]*) if [[ "$line" != *" "* ]]; then n=$((n + 1)); (( n % 100 == 0 )) && log "$what: $n packages compiled (last: $line)"; fi ;;
    esac
  done
  rc=$?
  set -e
  if (( rc != 0 )); then
    log "$what failed (exit $rc); last lines of $LOG:"
    tail -n 40 "$LOG" | sed 's/^/    /' >&2
    die "$what failed; fix the cause above and rerun: $RERUN"
  fi
}

# -- kubernetes + etcd ------------------------------------------------------------------------
# kube-apiserver, kube-controller-manager and kubectl are built in one wrapper module, one go
# build, so shared packages compile once. etcd joins that build when ETCD_VERSION is the etcd
# version k8s.io/kubernetes itself requires (then the build list is exactly upstream's);
# any other etcd version gets its own wrapper module, so it never shifts the dependency
# versions Kubernetes is built with.
wrapper_etcd_main() {
  mkdir -p "$1/cmd/etcd"
  cat >"$1/cmd/etcd/main.go" <<'EOF_MAIN'
// Command etcd is the etcd server (go.etcd.io/etcd/server/v3/etcdmain), built by cluster/build.sh.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF_MAIN
}

# Kubernetes VERSION's commands BINS into DIR, in one wrapper module (kubernetes-VERSION under
# the wrappers): each k8s.io/* staging module k8s.io/kubernetes requires as v0.0.0 replaced with
# its published v0.X.Y. With WITH_ETCD=1, etcd (ETCD_VERSION) joins the build when it is the etcd
# that version requires, and is left in $OUT; else ETCD_IN_OUT stays 0 and $K8S_ETCD says which
# etcd Kubernetes requires.
ETCD_IN_OUT=0
K8S_ETCD=""
kubernetes_build() {  # VERSION DIR WITH_ETCD BINS...
  local version=$1 dir=$2 with_etcd=$3
  shift 3
  local bins=("$@") pkgs=() b m
  for b in "${bins[@]}"; do
    [[ -x "$dir/$b" ]] || pkgs+=("k8s.io/kubernetes/cmd/$b")
  done
  (( ${#pkgs[@]} || with_etcd )) || return 0
  local kminor="${version#v1.}"; kminor="${kminor%%.*}"
  local staging_version="v0.${version#v1.}"
  local wrap="$CACHE/wrappers/kubernetes-$version"
  rm -rf "$wrap"; mkdir -p "$wrap"

  # The staging modules k8s.io/kubernetes requires as v0.0.0 (its own go.mod replaces them
  # with ./staging/...; replace directives of a dependency do not apply, so we repeat them
  # with the published v0.X.Y).
  local kmod="$wrap/kubernetes.mod" gomod_path
  log "fetching k8s.io/kubernetes@$version go.mod"
  (cd "$wrap" && go mod download -json "k8s.io/kubernetes@$version" >"$wrap/download.json" 2>>"$LOG") \
    || die "could not download k8s.io/kubernetes@$version from $GOPROXY (see $LOG); check the Kubernetes versions in cluster/versions.env"
  gomod_path="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p' "$wrap/download.json")"
  [[ -f "$gomod_path" ]] || die "go mod download gave no go.mod path for k8s.io/kubernetes@$version (see $wrap/download.json)"
  cp "$gomod_path" "$kmod"
  local staging required_v0
  mapfile -t staging < <(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$kmod" | sort -u)
  mapfile -t required_v0 < <(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$kmod" | sort -u)
  (( ${#staging[@]} > 10 )) || die "found only ${#staging[@]} staging replaces in k8s.io/kubernetes@$version go.mod; the wrapper recipe needs updating"
  K8S_ETCD="$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2}' "$kmod")"

  local etcd_with_k8s=0
  if (( with_etcd )) && [[ "$ETCD_VERSION" == "$K8S_ETCD" ]]; then etcd_with_k8s=1; fi
  local build_pkgs=("${pkgs[@]}")
  (( etcd_with_k8s )) && build_pkgs+=("./cmd/etcd")
  (( ${#build_pkgs[@]} )) || return 0

  log "kubernetes $version$( (( etcd_with_k8s )) && echo " + etcd $ETCD_VERSION"): wrapper module $wrap"
  {
    echo "// Generated by cluster/build.sh: builds Kubernetes $version components."
    echo "module payloadrun.local/kubernetes"
    echo
    echo "go ${GOV#go}"
    echo
    echo "require k8s.io/kubernetes $version"
    echo
    echo "tool ("
    for b in "${bins[@]}"; do echo "	k8s.io/kubernetes/cmd/$b"; done
    echo ")"
    echo
    echo "replace ("
    for m in "${staging[@]}"; do
      # Only modules the build graph reaches (required as v0.0.0); sample-* modules are not published.
      if printf '%s\n' "${required_v0[@]}" | grep -qxF "$m"; then
        echo "	$m => $m $staging_version"
      fi
    done
    echo ")"
  } >"$wrap/go.mod"
  (( etcd_with_k8s )) && wrapper_etcd_main "$wrap"
  log "wrapper go.mod: $(grep -c ' => ' "$wrap/go.mod") staging replaces to $staging_version"
  log "resolving modules (a cold cache downloads about 1 GB from the module proxy)"
  # The tool directives make tidy resolve the k8s commands' dependencies.
  run_go "go mod tidy ($version)" -C "$wrap" mod tidy

  local ldflags="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$kminor -X $pkg.gitTreeState=clean"
  done
  OUT="$wrap/out"; mkdir -p "$OUT"
  log "compiling ${build_pkgs[*]}$( (( ${#pkgs[@]} )) && echo " (from an empty cache: 15-25 min on 2 cores for every command, about 7 for a control plane alone)")"
  # providerless: Kubernetes' own build tag that leaves out the in-tree cloud providers (through
  # 1.30: Azure's, vSphere's and GCE's SDKs, 195 of 1.29.15's 2,383 packages and among its slowest
  # to compile); a local control plane has no cloud. 1.31 and later have no such code left.
  run_go "kubernetes $version build" -C "$wrap" build "${GO_BUILD[@]}" -tags providerless -ldflags "$ldflags" -o "$OUT/" "${build_pkgs[@]}"
  ETCD_IN_OUT=$etcd_with_k8s
  if (( ${#pkgs[@]} )); then
    mkdir -p "$dir"
    for b in "${bins[@]}"; do
      [[ -x "$OUT/$b" ]] && mv -f "$OUT/$b" "$dir/$b"
    done
    "$dir/${bins[0]}" --version >>"$LOG" 2>&1 || die "built ${bins[0]} $version does not run (see $LOG)"
    log "kubernetes $version done: $dir"
  fi
}

if (( OLDEST_ONLY )); then
  # the oldest Kubernetes the project claims: its control plane only, with the default build's etcd
  kubernetes_build "$KUBERNETES_OLDEST_VERSION" "$K8S_OLDEST_DIR" 0 "${K8S_OLDEST_BINS[@]}"
  wanted || die "build finished but $KUBERNETES_OLDEST_VERSION's control plane is missing; see $LOG"
  log "done in $((SECONDS - START_S))s"
  finish
  exit 0
fi
if (( ! TOOLS_ONLY )); then
  need_etcd=0
  [[ -x "$ETCD_DIR/etcd" ]] || need_etcd=1
  kubernetes_build "$KUBERNETES_VERSION" "$K8S_DIR" "$need_etcd" "${K8S_BINS[@]}"
  if (( need_etcd )); then
    if (( ! ETCD_IN_OUT )); then
      EWRAP="$CACHE/wrappers/etcd-$ETCD_VERSION"
      log "etcd $ETCD_VERSION differs from the $K8S_ETCD that Kubernetes $KUBERNETES_VERSION requires: own wrapper module $EWRAP"
      rm -rf "$EWRAP"; mkdir -p "$EWRAP"
      printf '// Generated by cluster/build.sh: builds etcd %s.\nmodule payloadrun.local/etcd\n\ngo %s\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
        "$ETCD_VERSION" "${GOV#go}" "$ETCD_VERSION" >"$EWRAP/go.mod"
      wrapper_etcd_main "$EWRAP"
      run_go "go mod tidy (etcd)" -C "$EWRAP" mod tidy
      mkdir -p "$EWRAP/out"
      run_go "etcd build" -C "$EWRAP" build "${GO_BUILD[@]}" -ldflags "-s -w" -o "$EWRAP/out/" ./cmd/etcd
      OUT="$EWRAP/out"
    fi
    mkdir -p "$ETCD_DIR"; mv -f "$OUT/etcd" "$ETCD_DIR/etcd"
    "$ETCD_DIR/etcd" --version >>"$LOG" 2>&1 || die "built etcd does not run (see $LOG)"
    log "etcd done: $ETCD_DIR"
  fi
fi

# -- helm: its go.mod has no replace directives, so `go install pkg@version` builds it as released
if [[ ! -x "$HELM_DIR/helm" ]]; then
  log "helm $HELM_VERSION: compiling helm.sh/helm/v3/cmd/helm"
  HTMP="$CACHE/wrappers/helm-$HELM_VERSION"; rm -rf "$HTMP"; mkdir -p "$HTMP"
  HELM_LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  KM="${KUBERNETES_VERSION#v1.}"; KM="${KM%%.*}"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/chart/common; do
    HELM_LDFLAGS+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$KM"
  done
  (
    export GOBIN="$HTMP" GOFLAGS="-modcacherw -buildvcs=false"  # go install pkg@version refuses -mod=mod
    run_go "helm build" -C "$HTMP" install "${GO_BUILD[@]}" -ldflags "$HELM_LDFLAGS" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  )
  mkdir -p "$HELM_DIR"; mv -f "$HTMP/helm" "$HELM_DIR/helm"
  "$HELM_DIR/helm" version >>"$LOG" 2>&1 || die "built helm does not run (see $LOG)"
  log "helm done"
fi

# -- CoreDNS: the node's cluster DNS (kubernetes.default.svc for in-cluster clients such as kopf).
# A main package of our own that imports coremain and only the plugins a cluster's Corefile uses
# (kubeadm's default Corefile's, and the node's: node.py's corefile), in a wrapper module that
# requires CoreDNS v<version> (-mod=mod fills go.sum, as for the add-ons' wrapper modules below).
# CoreDNS's own main compiles every plugin, the cloud DNS providers' SDKs among them: about a
# third more CPU.
COREDNS_PLUGINS=(bind cache errors forward health kubernetes loadbalance log loop metrics ready reload)
if (( ! TOOLS_ONLY )) && [[ ! -x "$COREDNS_DIR/coredns" ]]; then
  CTMP="$CACHE/wrappers/coredns-$COREDNS_VERSION"; rm -rf "$CTMP"; mkdir -p "$CTMP"
  log "coredns $COREDNS_VERSION: compiling coremain with the plugins ${COREDNS_PLUGINS[*]} (wrapper module $CTMP)"
  printf '// Generated by cluster/build.sh: builds CoreDNS %s with the plugins a cluster uses.\nmodule payloadrun.local/coredns\n\ngo %s\n\nrequire github.com/coredns/coredns %s\n' \
    "$COREDNS_VERSION" "${GOV#go}" "$COREDNS_VERSION" >"$CTMP/go.mod"
  {
    echo "// Command coredns is CoreDNS $COREDNS_VERSION with the plugins a cluster's Corefile uses."
    echo "package main"
    echo
    echo "import ("
    for plugin in "${COREDNS_PLUGINS[@]}"; do echo "	_ \"github.com/coredns/coredns/plugin/$plugin\""; done
    echo
    echo "	\"github.com/coredns/coredns/coremain\""
    echo ")"
    echo
    echo "func main() { coremain.Run() }"
  } >"$CTMP/main.go"
  run_go "coredns build" -C "$CTMP" build "${GO_BUILD[@]}" -ldflags "-s -w" -o "$CTMP/coredns" .
  mkdir -p "$COREDNS_DIR"; mv -f "$CTMP/coredns" "$COREDNS_DIR/coredns"
  "$COREDNS_DIR/coredns" -version >>"$LOG" 2>&1 || die "built coredns does not run (see $LOG)"
  log "coredns done"
fi

# -- kube-router: only its network policy controller runs on the node (node.py). Its go.mod has no
# replace directives either; it builds with CGO_ENABLED=0 (about 90 s from an empty cache).
if (( ! TOOLS_ONLY )) && [[ ! -x "$KUBE_ROUTER_DIR/kube-router" ]]; then
  log "kube-router $KUBE_ROUTER_VERSION: compiling github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
  RTMP="$CACHE/wrappers/kube-router-$KUBE_ROUTER_VERSION"; rm -rf "$RTMP"; mkdir -p "$RTMP"
  KR_LDFLAGS="-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION"
  (
    export GOBIN="$RTMP" GOFLAGS="-modcacherw -buildvcs=false"
    run_go "kube-router build" -C "$RTMP" install "${GO_BUILD[@]}" -ldflags "$KR_LDFLAGS" \
      "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION"
  )
  mkdir -p "$KUBE_ROUTER_DIR"; mv -f "$RTMP/kube-router" "$KUBE_ROUTER_DIR/kube-router"
  "$KUBE_ROUTER_DIR/kube-router" --version >>"$LOG" 2>&1 || die "built kube-router does not run (see $LOG)"
  log "kube-router done"
fi

# -- crane and registry: the release path (hack/publish.sh pushes with crane; the tests start the
# registry on loopback). Neither go.mod has replace directives: `go install pkg@version`.
go_install() {  # name version package ldflags dest-dir version-argument
  local what=$1 version=$2 pkg=$3 ldflags=$4 dest=$5 check=$6 tmp
  log "$what $version: compiling $pkg"
  tmp="$CACHE/wrappers/$what-$version"; rm -rf "$tmp"; mkdir -p "$tmp"
  (
    export GOBIN="$tmp" GOFLAGS="-modcacherw -buildvcs=false"
    run_go "$what build" -C "$tmp" install "${GO_BUILD[@]}" -ldflags "$ldflags" "$pkg@$version"
  )
  mkdir -p "$dest"; mv -f "$tmp/$what" "$dest/$what"
  "$dest/$what" "$check" >>"$LOG" 2>&1 || die "built $what does not run (see $LOG)"
  log "$what done"
}
if [[ ! -x "$CRANE_DIR/crane" ]]; then
  go_install crane "$CRANE_VERSION" github.com/google/go-containerregistry/cmd/crane \
    "-s -w -X github.com/google/go-containerregistry/cmd/crane/cmd.Version=$CRANE_VERSION" \
    "$CRANE_DIR" version
fi
if (( ! TOOLS_ONLY )) && [[ ! -x "$REGISTRY_DIR/registry" ]]; then
  go_install registry "$REGISTRY_VERSION" github.com/distribution/distribution/v3/cmd/registry \
    "-s -w -X github.com/distribution/distribution/v3/version.version=$REGISTRY_VERSION" \
    "$REGISTRY_DIR" --version
fi

# -- Kubernetes add-ons' controller managers (LeaderWorkerSet, Kueue), for the node's tests
# (payloadrun_devcluster/lws.py and kueue.py run each as a pod, installed from the module's own
# config/ kustomize tree). Neither go.mod has replace directives. Not `go install pkg@version`:
# that reads the module's version list (@v/list, for a deprecation notice), which the proxy
# refuses for sigs.k8s.io/lws (403) while it serves v0.9.0's .info, .mod and .zip. So a wrapper
# module requires exactly the pinned version and builds its main package (-mod=mod fills go.sum;
# the versions are the module's own, by minimal version selection). The module's config/ is
# copied from the module cache next to the binary, read-only as shipped.
build_manager() {  # name version module main-package ldflags build-tags dest-dir, then the smoke test's arguments
  local what=$1 version=$2 module=$3 pkg=$4 ldflags=$5 tags=$6 dest=$7 tmp src
  shift 7
  log "$what $version: compiling $pkg (the controller manager)"
  tmp="$CACHE/wrappers/$what-$version"; rm -rf "$tmp"; mkdir -p "$tmp/out"
  printf '// Generated by cluster/build.sh: builds %s %s.\nmodule payloadrun.local/%s\n\ngo %s\n\nrequire %s %s\n' \
    "$module" "$version" "$what" "${GOV#go}" "$module" "$version" >"$tmp/go.mod"
  (
    export GOFLAGS="-modcacherw -buildvcs=false -mod=mod"
    run_go "$what build" -C "$tmp" build "${GO_BUILD[@]}" -tags "$tags" -ldflags "$ldflags" -o "$tmp/out/manager" "$pkg"
  )
  src="$(go -C "$tmp" list -mod=mod -modcacherw -m -f '{{.Dir}}' "$module")"
  [[ -f "$src/config/default/kustomization.yaml" ]] || die "no config/default/kustomization.yaml in the module $module@$version ($src)"
  rm -rf "$dest"; mkdir -p "$dest"
  cp -R "$src/config" "$dest/config"; chmod -R u+w,a+rX "$dest/config"
  mv -f "$tmp/out/manager" "$dest/manager"
  "$dest/manager" "$@" >>"$LOG" 2>&1 || die "built $what manager does not run (see $LOG)"
  log "$what done"
}

# LeaderWorkerSet (sigs.k8s.io/lws): the controller manager multi-node replicas run on. Its main
# package is sigs.k8s.io/lws/cmd (upstream's Makefile builds cmd/main.go as bin/manager).
if (( ! TOOLS_ONLY )) && ! have_manager "$LWS_DIR"; then
  build_manager lws "$LWS_VERSION" sigs.k8s.io/lws sigs.k8s.io/lws/cmd \
    "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION" "" "$LWS_DIR" --version
fi

# Kueue (sigs.k8s.io/kueue): the quota and admission controller runs are queued by (issue 37). Its
# main package is sigs.k8s.io/kueue/cmd/kueue (upstream's Makefile builds cmd/kueue/main.go as
# bin/manager, CGO_ENABLED=0 as here). It links every integration (Ray, Kubeflow, JobSet, ...):
# no build tag leaves any out. The one tag Kueue's source offers, exclude_scheduler_library
# (pkg/cache/scheduler/was), compiles out the kube-scheduler library behind the alpha
# SchedulerLibraryIntegration gate (off by default, off here): fewer packages to compile, a
# smaller binary. It has no --version flag: --help (exit 0) is the smoke test.
if (( ! TOOLS_ONLY )) && ! have_manager "$KUEUE_DIR"; then
  build_manager kueue "$KUEUE_VERSION" sigs.k8s.io/kueue sigs.k8s.io/kueue/cmd/kueue \
    "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" exclude_scheduler_library \
    "$KUEUE_DIR" --help
fi

wanted || die "build finished but binaries are missing; see $LOG"
log "done in $((SECONDS - START_S))s; cache size $(du -sh "$CACHE" 2>/dev/null | cut -f1)"
finish
}

main "$@"
