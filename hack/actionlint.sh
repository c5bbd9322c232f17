#!/usr/bin/env bash
# Lints the GitHub Actions workflows (.github/workflows/) with actionlint, which also checks every
# `run:` block with shellcheck when that is on PATH. `make lint` runs it after ruff.
#
# actionlint is a Go module: hack/go-tool.sh builds it from the Go module proxy (`go install
# github.com/rhysd/actionlint/cmd/actionlint@<version>`, the version pinned below) once, into the
# cache outside the repository, keyed by version (bin/actionlint-<version>/actionlint). Warm, it
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

log() { printf '[actionlint %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

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

actionlint=$(bash "$repo/hack/go-tool.sh" actionlint \
  github.com/rhysd/actionlint/cmd/actionlint "$ACTIONLINT_VERSION")
shellcheck_present
# Without arguments actionlint lints every workflow of the project it is run in (.yaml and .yml);
# with some, they mean what they mean in the caller's directory.
(($#)) || cd "$repo"
exec "$actionlint" "$@"
