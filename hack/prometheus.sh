#!/usr/bin/env bash
# Makes sure a Prometheus server binary is available (the dashboard tests evaluate every panel's
# query through a real one) and prints its path. Debian ships one; this installs it when missing.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1; then
  command -v prometheus
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "prometheus is not installed: install Prometheus (Debian: apt-get install prometheus)" >&2
  exit 1
fi
echo "[prometheus] installing Debian's prometheus package" >&2
apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >&2
command -v prometheus
