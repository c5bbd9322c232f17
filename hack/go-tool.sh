#!/usr/bin/env bash
# Builds one Go command from the Go module proxy, once, into the cache outside the repository,
# keyed by its version, and prints the binary's path on stdout (what hack/actionlint.sh and
# hack/helm-docs.sh run):
#
#   bash hack/go-tool.sh NAME PACKAGE VERSION
#   bash hack/go-tool.sh helm-docs github.com/norwoodj/helm-docs/cmd/helm-docs v1.14.2
#       -> ${PAYLOADRUN_CACHE:-$HOME/.cache/payloadrun}/bin/helm-docs-v1.14.2/helm-docs
#
# cluster/build.sh's settings: the cache's Go module and build caches (go/mod, go/build), the
# installed toolchain, no cgo, a stripped binary; `go install PACKAGE@VERSION` builds it as
# released (its go.mod has no replace directives). Warm, it starts no Go and touches no network.
# Progress goes to stderr; the full build log to the cache's logs/.
#
#   PAYLOADRUN_CACHE       cache root (default $HOME/.cache/payloadrun)
#   PAYLOADRUN_BUILD_JOBS  go build -p (default 2)
set -euo pipefail

if (($# != 3)); then
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
name=$1 package=$2 version=$3
cache=${PAYLOADRUN_CACHE:-$HOME/.cache/payloadrun}
dir=$cache/bin/$name-$version
binary=$dir/$name

log() { printf '[%s %s] %s\n' "$name" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

build() {
  command -v go >/dev/null ||
    die "$name $version is not built ($binary) and the Go toolchain is not on PATH: install Go (the README's Go 1.26 builds it) and rerun"
  mkdir -p "$cache/bin" "$cache/logs" "$cache/go"
  # One builder at a time: a second caller waits here, then finds the binary.
  exec 9>"$cache/.$name.lock"
  flock 9
  [ -x "$binary" ] && return
  local work=$cache/wrappers/$name-$version out started=$SECONDS
  out=$cache/logs/$name-$(date +%Y%m%dT%H%M%S).log
  log "building $package@$version with $(go env GOVERSION), once (full output: $out)"
  rm -rf "$work"
  mkdir -p "$work"
  # `go install pkg@version` refuses -mod=mod
  if ! (
    cd "$work"
    export GOMODCACHE=$cache/go/mod GOCACHE=$cache/go/build GOPATH=$cache/go/path GOBIN=$work
    export GOTOOLCHAIN=local GOFLAGS="-modcacherw -buildvcs=false" CGO_ENABLED=0
    go install -v -p "${PAYLOADRUN_BUILD_JOBS:-2}" -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w" \
      "$package@$version"
  ) >"$out" 2>&1; then
    tail -n 40 "$out" | sed 's/^/    /' >&2
    die "building $name $version failed (the last lines of $out are above); fix the cause and rerun"
  fi
  [ -x "$work/$name" ] || die "go install made no $work/$name (see $out)"
  mkdir -p "$dir"
  mv -f "$work/$name" "$binary"
  log "built in $((SECONDS - started)) s: $binary"
}

[ -x "$binary" ] || build
echo "$binary"
