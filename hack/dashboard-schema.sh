#!/usr/bin/env bash
# Installs what the dashboard schema check needs (Grafana's @grafana/schema types and the
# TypeScript compiler, pinned by hack/dashboard-schema/package-lock.json) and prints the directory
# that holds its node_modules. The install lives in the cache outside the repository, keyed by the
# lockfile, so a warm run touches no network and takes milliseconds.
#
#   bash hack/dashboard-schema.sh              # install when missing (npm ci), print the directory
#   bash hack/dashboard-schema.sh --installed  # print it only when installed, else say why, exit 1
#
#   PAYLOADRUN_CACHE   cache directory (default ~/.cache/payloadrun)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
project=$repo/hack/dashboard-schema
cache=${PAYLOADRUN_CACHE:-$HOME/.cache/payloadrun}/dashboard-schema
key=$(cat "$project/package.json" "$project/package-lock.json" | sha256sum | cut -c1-16)
dir=$cache/$key

log() { printf '[dashboard-schema %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -f "$dir/.complete" ]; then
  echo "$dir"
  exit 0
fi
if [ "${1:-}" = --installed ]; then
  echo "the dashboard schema check is not installed ($dir): bash hack/dashboard-schema.sh installs it" >&2
  exit 1
fi

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "node and npm are needed for the dashboard schema check: install Node.js 18 or later with npm (Debian: apt-get install nodejs npm)" >&2
    exit 1
  fi
  log "installing Debian's nodejs and npm packages"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >&2
fi

# One installer at a time: a second caller waits, then finds the install complete.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ ! -f "$dir/.complete" ]; then
  log "installing $(cd "$project" && node -p 'Object.entries(require("./package.json").devDependencies).map(([n, v]) => n + "@" + v).join(" ")') into $dir"
  rm -rf "$dir" "$dir.partial"
  mkdir -p "$dir.partial"
  cp "$project/package.json" "$project/package-lock.json" "$dir.partial/"
  # exactly the lockfile's versions, checked against its integrity hashes; no install scripts
  (cd "$dir.partial" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
  touch "$dir.partial/.complete"
  mv "$dir.partial" "$dir"
  # keep the cache bounded: installs of other lockfiles go
  for old in "$cache"/*/; do
    [ "${old%/}" = "$dir" ] || { log "removing the stale install ${old%/}"; rm -rf "${old%/}"; }
  done
  log "ready"
fi
echo "$dir"
