#!/usr/bin/env bash
# Makes sure a Prometheus server binary and promtool are available (the dashboard tests evaluate
# every panel's query through a real server; the alert tests run `promtool test rules`) and prints
# the server's path. Debian's prometheus package ships both; this installs it when either is missing.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
  command -v prometheus
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "prometheus or promtool is not installed: install Prometheus (Debian: apt-get install prometheus)" >&2
  exit 1
fi
echo "[prometheus] installing Debian's prometheus package" >&2
apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >&2
command -v prometheus
