#!/usr/bin/env bash
# The release path: what .github/workflows/release.yml runs on a tag, what `make publish` runs, and
# what tests/integration/test_e2e.py runs against a registry on loopback. One version for all of it:
# pyproject.toml's [project] version (the wheel's), which is both images' tag and the chart's
# version and appVersion (charts/payloadrun/Chart.yaml carries the same; tests/packaging checks).
#
#   bash hack/publish.sh version                  # print the version
#   bash hack/publish.sh check-tag TAG            # fail unless TAG is v<version> (the workflow's tag)
#                                                 # and <version> is no development version
#   bash hack/publish.sh images PREFIX [--plain-http] [--arch ARCH]
#       both images from hack/images.sh for amd64 and arm64 (the machine's own natively, the
#       other under emulation: qemu-user and binfmt_misc, as root), each pushed with crane as
#       PREFIX/payloadrun:<version>-<arch> (the sidecars) and
#       PREFIX/payloadrun-operator:<version>-<arch>, then one multi-arch index an image,
#       PREFIX/payloadrun:<version> and
#       PREFIX/payloadrun-operator:<version> (a Docker manifest list: a node pulls its own).
#       --arch ARCH: that architecture's images only, and no index (the release workflow builds
#       each on a runner of its own architecture, then runs `index`)
#   bash hack/publish.sh index PREFIX [--plain-http]
#       the multi-arch index of each image, from the <version>-amd64 and <version>-arm64 already
#       pushed
#   bash hack/publish.sh chart PREFIX [--plain-http]
#       the chart packaged at <version> and pushed with helm as oci://PREFIX/charts/payloadrun
#   bash hack/publish.sh manifests DIR
#       the release's manifests, for `kubectl apply --server-side -f` (release assets, beside
#       the chart): DIR/payloadrun-crd.yaml, the PayloadRun CRD alone (a cluster admin's
#       install; then the chart with crds.install=false), and DIR/payloadrun.yaml, everything
#       in one (the namespace payloadrun-system, the CRD, RBAC, the operator at <version>),
#       the chart rendered with its defaults
#   bash hack/publish.sh dist DIR [--no-isolation]
#       the sdist and the wheel (python -m build) into DIR; PyPI gets them from the workflow
#       (trusted publishing needs the workflow's identity, so no upload happens here)
#
# PREFIX is a registry and a namespace: ghcr.io/payloadrun for a release, 127.0.0.1:PORT/payloadrun
# for the tests. --plain-http talks HTTP to it (a registry on loopback without TLS).
# With PUBLISH_USERNAME and PUBLISH_PASSWORD set, crane and helm log in to PREFIX's registry first
# (the workflow passes github.actor and GITHUB_TOKEN); otherwise whatever login they have is used.
#
# crane and helm are built from the Go module proxy at the versions of cluster/versions.env, once,
# into the cache (`cluster/build.sh --release-tools`). The images need root (hack/images.sh).
# Progress goes to stderr; stdout has one line per pushed artifact: `<reference>@<digest>` for an
# image (its index, or with --arch its architecture's image), `oci://...:<version>` for the
# chart, a file path for each distribution.
#
#   PYTHON   the Python that runs `build` (default: python3)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}

log() { printf '[publish %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() {
  sed -n '/^#   bash hack/,/^# PREFIX/p' "${BASH_SOURCE[0]}" | sed '$d; s/^#//' >&2
  exit 2
}

# pyproject.toml's [project] version: the one version source, in the form every artifact takes
# (MAJOR.MINOR.PATCH or MAJOR.MINOR.PATCH-(dev|alpha|beta|rc).N, as payloadrun/version.py says)
version() {
  "$python" - "$repo/pyproject.toml" <<'EOF'
import re, sys, tomllib
with open(sys.argv[1], "rb") as f:
    version = tomllib.load(f)["project"]["version"]
if not re.fullmatch(r"\d+\.\d+\.\d+(-(dev|alpha|beta|rc)\.\d+)?", version):
    sys.exit(f"pyproject.toml's version {version!r} is not MAJOR.MINOR.PATCH or "
             "MAJOR.MINOR.PATCH-(dev|alpha|beta|rc).N, the one form Python, Helm and OCI take")
print(version)
EOF
}

# PEP 440's normal form of a version, the wheel's and the sdist's (0.2.0-dev.0 is 0.2.0.dev0)
python_version() {
  local v=$1
  v=${v/-dev./.dev}
  v=${v/-alpha./a}
  v=${v/-beta./b}
  echo "${v/-rc./rc}"
}

tools() {  # the directory holding helm and crane (built once)
  bash "$repo/cluster/build.sh" --release-tools
}

registry_host() { echo "${1%%/*}"; }

login() {  # tool prefix plain
  local tool=$1 prefix=$2 plain=$3 host
  [ -n "${PUBLISH_USERNAME:-}" ] && [ -n "${PUBLISH_PASSWORD:-}" ] || return 0
  host=$(registry_host "$prefix")
  log "logging $(basename "$tool") in to $host as $PUBLISH_USERNAME"
  case $(basename "$tool") in
    crane) printf '%s' "$PUBLISH_PASSWORD" |
      "$tool" auth login "$host" -u "$PUBLISH_USERNAME" --password-stdin >&2 ;;
    helm) printf '%s' "$PUBLISH_PASSWORD" |
      "$tool" registry login "$host" -u "$PUBLISH_USERNAME" --password-stdin \
        ${plain:+--plain-http} >&2 ;;
  esac
}

parse_prefix() {  # PREFIX [--plain-http] [--arch ARCH] -> sets prefix, plain, arches
  prefix=${1:-}
  if [ -z "$prefix" ] || [[ $prefix == -* ]]; then usage; fi
  prefix=${prefix%/}
  [[ $prefix == */* ]] ||
    die "PREFIX '$prefix' names no namespace: give a registry and a path, e.g. ghcr.io/payloadrun or 127.0.0.1:5000/payloadrun"
  shift
  plain=""
  arches=("${ARCHES[@]}")
  while [ $# -gt 0 ]; do
    case "$1" in
      --plain-http) plain=1 ;;
      --arch)
        [ "$cmd" = images ] || die "--arch is for images only"
        [[ " ${ARCHES[*]} " == *" ${2:-} "* ]] ||
          die "--arch '${2:-}' is not one of the release's architectures: ${ARCHES[*]}"
        arches=("$2")
        shift
        ;;
      *) die "unknown flag '$1' (--plain-http$([ "$cmd" = images ] && echo ", --arch ARCH"))" ;;
    esac
    shift
  done
}

ARCHES=(amd64 arm64)  # the release's architectures: GPU nodes are x86-64 or (GH200, GB200) arm64
IMAGES=(payloadrun payloadrun-operator)  # hack/images.sh's, without their tag

push_images() {
  local v crane arch name tarball ref lines
  v=$(version)
  crane=$(tools)/crane
  login "$crane" "$prefix" "$plain"
  for arch in "${arches[@]}"; do
    log "building (or finding cached) both images for $arch: hack/images.sh"
    lines=$(PAYLOADRUN_IMAGE_ARCH=$arch bash "$repo/hack/images.sh")
    [ "$(wc -l <<<"$lines")" = 2 ] || die "hack/images.sh printed not two images: $lines"
    while read -r name tarball; do
      # images.sh names them payloadrun:e2e and payloadrun-operator:e2e: the repository is kept,
      # the tag is the version and the architecture
      ref=$prefix/${name%%:*}:$v-$arch
      log "pushing $(basename "$tarball") as $ref"
      # crane prints the pushed digest reference
      if [ "${#arches[@]}" = 1 ]; then
        "$crane" push ${plain:+--insecure} "$tarball" "$ref"
      else
        "$crane" push ${plain:+--insecure} "$tarball" "$ref" >&2
      fi
    done <<<"$lines"
  done
  [ "${#arches[@]}" = 1 ] || push_indexes
}

push_indexes() {  # one index an image, of the release's architectures (pushed before)
  local v crane image arch manifests
  v=$(version)
  crane=$(tools)/crane
  login "$crane" "$prefix" "$plain"
  for image in "${IMAGES[@]}"; do
    manifests=()
    for arch in "${ARCHES[@]}"; do
      manifests+=(-m "$prefix/$image:$v-$arch")
    done
    log "pushing the index $prefix/$image:$v (${ARCHES[*]})"
    # the platform of each comes from its image's config; Docker media types like the images'
    "$crane" index append ${plain:+--insecure} --docker-empty-base "${manifests[@]}" \
      -t "$prefix/$image:$v" >/dev/null ||
      die "crane could not make the index $prefix/$image:$v: are $v-amd64 and $v-arm64 pushed? (bash hack/publish.sh images $prefix --arch ARCH, for each)"
    echo "$prefix/$image:$v@$("$crane" digest ${plain:+--insecure} "$prefix/$image:$v")"
  done
}

push_chart() {
  local v helm out
  v=$(version)
  helm=$(tools)/helm
  login "$helm" "$prefix" "$plain"
  out=$(mktemp -d)
  trap 'rm -rf "$out"' RETURN
  log "packaging charts/payloadrun at version and appVersion $v"
  "$helm" package "$repo/charts/payloadrun" --version "$v" --app-version "$v" \
    --destination "$out" >&2
  log "pushing it to oci://$prefix/charts"
  "$helm" push "$out/payloadrun-$v.tgz" "oci://$prefix/charts" ${plain:+--plain-http} >&2
  echo "oci://$prefix/charts/payloadrun:$v"
}

render_manifests() {  # DIR
  local dest=${1:-} v helm
  [ -n "$dest" ] || usage
  v=$(version)
  helm=$(tools)/helm
  mkdir -p "$dest"
  dest=$(cd "$dest" && pwd)
  cp "$repo/crds/payloadrun.dev_payloadruns.yaml" "$dest/payloadrun-crd.yaml.tmp"
  {
    printf '# payloadrun %s: the CRD, RBAC and the operator in payloadrun-system.\n' "$v"
    printf '#   kubectl apply --server-side -f payloadrun.yaml  (docs/install.md)\n'
    printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: payloadrun-system\n'  # helm's output starts with ---
    "$helm" template payloadrun "$repo/charts/payloadrun" --namespace payloadrun-system \
      --version "$v"
  } >"$dest/payloadrun.yaml.tmp"
  mv "$dest/payloadrun-crd.yaml.tmp" "$dest/payloadrun-crd.yaml"
  mv "$dest/payloadrun.yaml.tmp" "$dest/payloadrun.yaml"
  log "rendered the manifests of payloadrun $v into $dest"
  echo "$dest/payloadrun-crd.yaml"
  echo "$dest/payloadrun.yaml"
}

build_dist() {  # DIR [--no-isolation]
  local dest=${1:-} v isolation=""
  [ -n "$dest" ] || usage
  case "${2:-}" in
    "") ;;
    --no-isolation) isolation=--no-isolation ;;
    *) die "unknown flag '$2' (only --no-isolation)" ;;
  esac
  v=$(python_version "$(version)")
  "$python" -m build --version >/dev/null 2>&1 ||
    die "$python has no 'build' module: pip install build (the dev extra has it)"
  mkdir -p "$dest"
  dest=$(cd "$dest" && pwd)
  log "building the sdist and the wheel of payloadrun $v into $dest"
  # a copy of the tracked files: what the release builds is what the tag holds, not the
  # checkout's untracked files or a stale build/ directory
  local src
  src=$(mktemp -d)
  trap 'rm -rf "$src"' RETURN
  git -C "$repo" ls-files -z | (cd "$repo" && xargs -0 cp --parents -t "$src")
  "$python" -m build --sdist --wheel $isolation --outdir "$dest" "$src" >&2
  local wheel="$dest/payloadrun-$v-py3-none-any.whl" sdist="$dest/payloadrun-$v.tar.gz"
  if [ ! -f "$wheel" ] || [ ! -f "$sdist" ]; then
    die "python -m build made no $wheel and $sdist: $(ls "$dest")"
  fi
  echo "$sdist"
  echo "$wheel"
}

cmd=${1:-}
shift || true
case "$cmd" in
  version) version ;;
  check-tag)
    tag=${1:-}
    [ -n "$tag" ] || usage
    v=$(version)
    [[ $v != *-dev.* ]] ||
      die "pyproject.toml's version is $v, a version under development, which no tag publishes (not '$tag'): to release it, bump [project] version (and Chart.yaml's version and appVersion) to ${v%%-*} (docs/releasing.md) and tag v${v%%-*}"
    [ "$tag" = "v$v" ] ||
      die "the tag '$tag' is not v$v, the version in pyproject.toml: bump [project] version (and Chart.yaml's version and appVersion) to the tag's, or tag v$v"
    log "tag $tag matches the version $v"
    ;;
  images) parse_prefix "$@"; push_images ;;
  index) parse_prefix "$@"; push_indexes ;;
  chart) parse_prefix "$@"; push_chart ;;
  manifests) render_manifests "$@" ;;
  dist) build_dist "$@" ;;
  *) usage ;;
esac
