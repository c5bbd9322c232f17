#!/usr/bin/env bash
# Makes sure the project's Python environment exists and prints its directory on stdout.
#
# The environment lives in a cache outside the repository, keyed by the declared dependencies
# (so a new clone, or CI, reuses it when they have not changed). The project itself is installed
# editable from this checkout each time the checkout changes place, which takes a second, and so
# are the two dev-only distributions beside it: the local cluster (cluster/, payloadrun_devcluster)
# and the development kit (devkit/, payloadrun_devkit), which no wheel or image carries.
#
#   PAYLOADRUN_CACHE   cache directory (default ~/.cache/payloadrun)
#   PAYLOADRUN_EXTRAS  extras to install (default operator,torch,dev,verifiers)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${PAYLOADRUN_CACHE:-$HOME/.cache/payloadrun}
extras=${PAYLOADRUN_EXTRAS:-operator,torch,dev,verifiers}
python=${PYTHON:-python3}

log() { printf '[venv %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

key=$("$python" - "$repo/pyproject.toml" "$extras" <<'PY'
import hashlib, json, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
wanted = {
    "python": sys.version.split()[0],
    "requires": project.get("dependencies", []),
    "extras": {e: project["optional-dependencies"].get(e, []) for e in sys.argv[2].split(",") if e},
}
print(hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:16])
PY
)
venv=$cache/venv/$key
# The editable installs record the checkout's place and its entry points: redo them (in a
# second) when either changes.
dev_distributions=("$repo/cluster" "$repo/devkit")
stamp="$repo $(cat "$repo/pyproject.toml" "${dev_distributions[@]/%//pyproject.toml}" | sha256sum | cut -c1-16)"

# One creator at a time: a second caller waits here instead of deleting a half-built venv.
mkdir -p "$cache/venv"
exec 9>"$cache/venv/.lock"
flock 9

if [ ! -f "$venv/.complete" ]; then
  log "creating $venv (extras: $extras); the first time this downloads torch and takes minutes"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --upgrade pip setuptools wheel >&2
  "$venv/bin/pip" install --disable-pip-version-check --progress-bar off -e "$repo[$extras]" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    "${dev_distributions[@]/#/-e}" >&2
  echo "$stamp" >"$venv/.source"
  touch "$venv/.complete"
  log "ready"
  # keep the cache bounded: environments of other dependency sets go (each is several GB)
  for old in "$cache"/venv/*/; do
    [ "${old%/}" = "$venv" ] || { log "removing the stale environment ${old%/}"; rm -rf "${old%/}"; }
  done
elif [ "$(cat "$venv/.source" 2>/dev/null)" != "$stamp" ]; then
  log "installing this checkout ($repo) into $venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    -e "$repo" "${dev_distributions[@]/#/-e}" >&2
  echo "$stamp" >"$venv/.source"
fi
echo "$venv"
