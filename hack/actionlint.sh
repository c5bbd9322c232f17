#!/usr/bin/env bash
# Lints the GitHub Actions workflows (.github/workflows/) with actionlint, which also checks every
# `run:` block with shellcheck when that is on PATH. `make lint` runs it after ruff.
#
# actionlint is a Go module: it is built from the Go module proxy (`go install
# github.com/rhysd/actionlint/cmd/actionlint@<version>`, the version pinned below) once, into the
# cache outside the repository, keyed by version, as cluster/build.sh builds helm and CoreDNS:
#
#   ${PAYLOADRUN_CACHE:-$HOME/.cache/payloadrun}/bin/actionlint-<version>/actionlint
#
# with build.sh's Go module and build caches (go/mod, go/build) and its logs/ directory. Warm, it
# starts no Go and touches no network. Progress goes to stderr; actionlint's findings to stdout.
#
# The shellcheck used is Debian's package (0.9.0 on bookworm, the version GitHub's Ubuntu 24.04
# runner has installed). When it is missing it is installed with apt-get if this runs as root (as
# `make test` does); otherwise the `run:` blocks go unchecked, and this says so.
#
#   bash hack/actionlint.sh            # every workflow in .github/workflows
#   bash hack/actionlint.sh FILE...    # those files; actionlint's flags pass through too
#
#   PAYLOADRUN_CACHE       cache root (default $HOME/.cache/payloadrun)
#   PAYLOADRUN_BUILD_JOBS  go build -p (default 2)
set -euo pipefail

# github.com/rhysd/actionlint, from the Go module proxy. Bumping it builds the new version once.
ACTIONLINT_VERSION=v1.7.12

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${PAYLOADRUN_CACHE:-$HOME/.cache/payloadrun}
dir=$cache/bin/actionlint-$ACTIONLINT_VERSION
actionlint=$dir/actionlint

log() { printf '[actionlint %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

build() {
  command -v go >/dev/null ||
    die "actionlint $ACTIONLINT_VERSION is not built ($actionlint) and the Go toolchain is not on PATH: install Go (the README's Go 1.26 builds it) and rerun"
  mkdir -p "$cache/bin" "$cache/logs" "$cache/go"
  # One builder at a time: a second caller waits here, then finds the binary.
  exec 9>"$cache/.actionlint.lock"
  flock 9
  [ -x "$actionlint" ] && return
  local work=$cache/wrappers/actionlint-$ACTIONLINT_VERSION
  local out
  out=$cache/logs/actionlint-$(date +%Y%m%dT%H%M%S).log
  local started=$SECONDS
  log "building github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION with $(go env GOVERSION), once (full output: $out)"
  rm -rf "$work"
  mkdir -p "$work"
  # build.sh's settings: the cache's module and build caches, the installed toolchain, no cgo, a
  # reproducible stripped binary; `go install pkg@version` builds it as released (its go.mod has
  # no replace directives) and refuses -mod=mod.
  if ! (
    cd "$work"
    export GOMODCACHE=$cache/go/mod GOCACHE=$cache/go/build GOPATH=$cache/go/path GOBIN=$work
    export GOTOOLCHAIN=local GOFLAGS="-modcacherw -buildvcs=false" CGO_ENABLED=0
    go install -v -p "${PAYLOADRUN_BUILD_JOBS:-2}" -trimpath -ldflags "-s -w" \
      "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION"
  ) >"$out" 2>&1; then
    tail -n 40 "$out" | sed 's/^/    /' >&2
    die "building actionlint $ACTIONLINT_VERSION failed (the last lines of $out are above); fix the cause and rerun: bash hack/actionlint.sh"
  fi
  "$work/actionlint" -version >>"$out" 2>&1 || die "the built actionlint does not run (see $out)"
  mkdir -p "$dir"
  mv -f "$work/actionlint" "$actionlint"
  log "built in $((SECONDS - started)) s: $actionlint"
}

shellcheck_present() {
  command -v shellcheck >/dev/null && return
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing Debian's shellcheck (actionlint runs it on every run: block)"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends shellcheck >&2
  else
    log "shellcheck is not installed, so the run: blocks go unchecked (as root this script installs it; or: sudo apt-get install shellcheck)"
  fi
}

[ -x "$actionlint" ] || build
shellcheck_present
# Without arguments actionlint lints every workflow of the project it is run in (.yaml and .yml);
# with some, they mean what they mean in the caller's directory.
(($#)) || cd "$repo"
exec "$actionlint" "$@"
