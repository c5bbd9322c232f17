#!/usr/bin/env bash
# Builds the project's container images without a Docker engine or a registry, and prints one
# line per image on stdout: `<image name> <docker-archive tarball>` (load it with
# `ctr -n k8s.io images import`, `docker load` or `kind load image-archive`).
#
#   1. base image  localhost/payloadrun-python:3.11-bookworm, standing in for the published
#                  python:3.11.14-slim-bookworm: a trimmed `debootstrap --variant=minbase` Debian
#                  root with Debian's Python 3.11 (cached, keyed by this script's recipe section)
#   2. wheelhouse  the project's dependencies with the operator extra (never torch), plus pip,
#                  setuptools and wheel, as cp311 manylinux wheels downloaded on the host, so the
#                  image builds need no network (cached, keyed by the requirement set)
#   3. images      payloadrun:e2e (sidecars/Dockerfile) and payloadrun-operator:e2e
#                  (operator/Dockerfile), built unchanged by Debian's buildah (daemonless, chroot
#                  isolation, vfs storage under the cache), the wheelhouse mounted at /wheels;
#                  each Dockerfile's `deps` stage (the dependencies' venv) is kept in the build
#                  storage, keyed by the dependency set, so a change of the code costs a build
#                  of the project alone (arm64's, emulated: about 25 s instead of 80)
#   4. checks      after a build: no torch, Kubernetes client or dev-only package (pytest,
#                  payloadrun_devcluster, payloadrun_devkit) in the venv, both entry points
#                  run as uid 65532, sizes on stderr
#
# Tarballs are keyed by the content of everything that goes into them (Dockerfile, the git-listed
# files the Dockerfile copies, the base and wheelhouse keys, this script's build section), so an
# unchanged checkout prints the cached ones in a second; older tarballs of an image are removed.
# Run as root (debootstrap and buildah need it); missing tools (debootstrap, buildah) are installed
# with apt-get. Nothing outside the cache is written: no /var/lib/containers, no daemon.
#
#   PAYLOADRUN_CACHE          cache directory (default ~/.cache/payloadrun); images under images/
#   PAYLOADRUN_IMAGE_TAG      tag of both images (default e2e)
#   PAYLOADRUN_IMAGE_ARCH     the images' architecture, amd64 or arm64 (default: this machine's).
#                             Another architecture than the machine's is built under emulation:
#                             Debian's qemu-user-static, registered with the kernel's binfmt_misc
#                             (mounted and registered here when missing; it needs root), runs the
#                             image's own binaries (debootstrap's second stage, pip, the checks).
#                             The tarballs' names carry the architecture.
#   PAYLOADRUN_IMAGE_REVISION the commit both images' org.opencontainers.image.revision label names
#                             (default unknown; the release workflow sets it; part of the key)
#   PAYLOADRUN_DEBIAN_MIRROR  Debian mirror for debootstrap (default: the one apt uses)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
self="$repo/hack/images.sh"
cache=${PAYLOADRUN_CACHE:-$HOME/.cache/payloadrun}
dir=$cache/images
tag=${PAYLOADRUN_IMAGE_TAG:-e2e}
suite=bookworm
sidecar_name=payloadrun:$tag
operator_name=payloadrun-operator:$tag
python=${PYTHON:-python3}

t0=$(date +%s.%N)
log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f s", b - a }'; }
sha() { sha256sum | cut -c1-16; }
# the text between `# >>> NAME` and `# <<< NAME` in this script
section() { sed -n "/^# >>> $1\$/,/^# <<< $1\$/p" "$self"; }
# run a noisy command with its output in a log file; show the log's end when it fails
logged() {
  local name=$1
  shift
  mkdir -p "$logs"
  if ! "$@" >"$logs/$name.log" 2>&1; then
    tail -n 40 "$logs/$name.log" >&2
    die "$name failed (full log: $logs/$name.log)"
  fi
}

mkdir -p "$dir"
exec 9>"$dir/.lock"
if ! flock -n 9; then
  log "another build holds $dir/.lock; waiting"
  flock 9
fi

# ---- keys: cheap, computed first so a warm run stops here ----------------------------------------
host_arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
arch=${PAYLOADRUN_IMAGE_ARCH:-$host_arch}
case $arch in
  amd64) wheel_arch=x86_64 qemu_arch=x86_64 ;;
  arm64) wheel_arch=aarch64 qemu_arch=aarch64 ;;
  *) die "PAYLOADRUN_IMAGE_ARCH=$arch is not an architecture the images are built for: amd64 or arm64" ;;
esac
logs=$dir/logs/$arch
# one base image an architecture, in the one build storage
base_name=localhost/payloadrun-python:3.11-bookworm-$arch
base_key=$({ section base; echo "$suite $arch"; } | sha)

# The wheelhouse's requirement set: the core dependencies and the operator extra (never torch),
# the build backend, and pip itself. Unpinned like pyproject.toml: resolved once per set.
requirements=$("$python" - "$repo/pyproject.toml" <<'PY'
import sys, tomllib
data = tomllib.load(open(sys.argv[1], "rb"))
project = data["project"]
reqs = list(project.get("dependencies", [])) + list(project["optional-dependencies"]["operator"])
reqs += data["build-system"]["requires"] + ["pip", "setuptools", "wheel"]
assert not any(r.split(">")[0].split("=")[0].split("[")[0].strip() == "torch" for r in reqs)
print("\n".join(sorted(set(reqs))))
PY
)
# every manylinux tag up to bookworm's glibc 2.36 (pip before 24 does not widen --platform itself)
wheel_platforms=()
for minor in $(seq 36 -1 5); do
  wheel_platforms+=(--platform "manylinux_2_${minor}_$wheel_arch")
done
wheel_platforms+=(--platform "manylinux2014_$wheel_arch" --platform "manylinux2010_$wheel_arch"
  --platform "manylinux1_$wheel_arch")
wheel_key=$(printf '%s\ncp311 %s\n' "$requirements" "${wheel_platforms[*]}" | sha)
wheels=$dir/wheels-$arch-$wheel_key

# What each Dockerfile copies: pyproject.toml, README.md, LICENSE, sidecars/, operator/ (tracked
# files and untracked ones git does not ignore; .dockerignore drops caches and egg-info).
context_key=$(
  cd "$repo"
  git ls-files -z --cached --others --exclude-standard -- \
    .dockerignore pyproject.toml README.md LICENSE sidecars operator | sort -zu |
    while IFS= read -r -d '' f; do
      [ -f "$f" ] || continue  # deleted in the work tree
      printf '%s %s %s\n' "$(sha256sum <"$f" | cut -c1-64)" "$([ -x "$f" ] && echo x || echo -)" "$f"
    done | sha
)
build_key=$(section build | sha)
# the labels' values (the version is pyproject.toml's, so it is in the context key already)
version=$("$python" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$repo/pyproject.toml")
revision=${PAYLOADRUN_IMAGE_REVISION:-unknown}
image_key() {  # name dockerfile
  printf '%s\n' "$1" "$(sha256sum <"$repo/$2")" "$context_key" "$base_key" "$wheel_key" "$build_key" \
    "$revision" | sha
}
tarball() { echo "$dir/${1//[:\/]/_}-$arch-$2.tar"; }  # name key
sidecar_tar=$(tarball "$sidecar_name" "$(image_key "$sidecar_name" sidecars/Dockerfile)")
operator_tar=$(tarball "$operator_name" "$(image_key "$operator_name" operator/Dockerfile)")

if [ -f "$sidecar_tar" ] && [ -f "$operator_tar" ]; then
  log "cached (unchanged inputs): $(basename "$sidecar_tar") $(basename "$operator_tar")"
  echo "$sidecar_name $sidecar_tar"
  echo "$operator_name $operator_tar"
  exit 0
fi

# ---- tools ---------------------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || die "run as root: debootstrap and buildah (chroot isolation) need it"
apt_updated=
need() {  # command package
  command -v "$1" >/dev/null 2>&1 && return
  command -v apt-get >/dev/null 2>&1 || die "$1 is missing and there is no apt-get: install $2"
  if [ -z "$apt_updated" ]; then
    log "apt-get update"
    logged apt-update apt-get update
    apt_updated=1
  fi
  log "installing Debian's $2"
  logged "apt-install-$2" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "$2"
}
need debootstrap debootstrap
need buildah buildah

# Another architecture's binaries run under qemu-user, through the kernel's binfmt_misc. Debian's
# package ships the handler's registration line (binfmt.d); without systemd nothing registers it,
# so this does. Flag F (in Debian's line) opens the interpreter now: it runs inside chroots too.
emulate() {  # qemu architecture
  local handler=/proc/sys/fs/binfmt_misc/qemu-$1 conf=/usr/lib/binfmt.d/qemu-$1.conf
  [ -f "$handler" ] && grep -q '^enabled' "$handler" && return
  [ -f "$conf" ] || need qemu-$1-static qemu-user-static
  [ -f "$conf" ] || die "qemu-user-static installed no $conf"
  if [ ! -f /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null ||
      die "cannot mount binfmt_misc to run $arch binaries on this $host_arch machine (a container needs CAP_SYS_ADMIN): build the $arch images on an $arch machine"
  fi
  log "registering qemu-$1 with binfmt_misc ($arch binaries run emulated)"
  grep -v '^#' "$conf" >/proc/sys/fs/binfmt_misc/register ||
    die "binfmt_misc refused $conf's registration"
  grep -q '^enabled' "$handler" || die "binfmt_misc has no enabled $handler after registering it"
}
if [ "$arch" != "$host_arch" ]; then
  emulate "$qemu_arch"
fi
if ! "$python" -m pip --version >/dev/null 2>&1; then
  need pip3 python3-pip
fi

# buildah with its own storage under the cache (vfs: no kernel overlay or fuse needed). The run
# root holds only locks and mount state: this script holds the lock, so a stale one is wiped.
# Debian's buildah 1.28 keeps its blob-info cache in /var/lib/containers/cache whatever --root
# says, so each call runs in a private mount namespace where the cache's var-lib is /var/lib.
rm -rf "$dir/buildah/run"
mkdir -p "$dir/buildah/var-lib"
bah() {
  # shellcheck disable=SC2016  # $0 and $@ belong to the inner sh
  unshare --mount --propagation private -- sh -c 'mount --bind "$0" /var/lib && exec "$@"' \
    "$dir/buildah/var-lib" buildah --root "$dir/buildah/storage" --runroot "$dir/buildah/run" \
    --storage-driver vfs "$@"
}
cleanup_containers() {
  # a failed debootstrap may leave its /proc or /sys mounted in the root: unmount before removing
  awk -v d="$dir/buildah/storage/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r |
    xargs -r umount -l 2>/dev/null || true
  bah rm --all >/dev/null 2>&1 || true
}
trap cleanup_containers EXIT

# ---- 1. base image -------------------------------------------------------------------------------
debian_mirror() {
  if [ -n "${PAYLOADRUN_DEBIAN_MIRROR:-}" ]; then
    echo "$PAYLOADRUN_DEBIAN_MIRROR"
    return
  fi
  local m=""
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    # deb822: the first stanza whose Suites list the suite itself (not -security or -updates)
    m=$(awk -v s="$suite" 'BEGIN { RS = ""; FS = "\n" }
      { uris = ""; ok = 0
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^URIs:/) { split($i, a, " "); uris = a[2] }
          if ($i ~ /^Suites:/) { n = split($i, b, " "); for (j = 2; j <= n; j++) if (b[j] == s) ok = 1 }
        }
        if (ok && uris != "") { print uris; exit } }' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$m" ] && [ -f /etc/apt/sources.list ]; then
    m=$(awk -v s="$suite" '$1 == "deb" && $3 == s { print $2; exit }' /etc/apt/sources.list)
  fi
  echo "${m:-http://deb.debian.org/debian}"
}

# >>> base
# The stand-in for python:3.11.14-slim-bookworm. Everything between the markers is the recipe:
# changing it changes the base key, and with it every image.
make_base() {  # rootfs
  local root=$1 mirror
  mirror=$(debian_mirror)
  log "debootstrap $suite from $mirror (minbase + python3, python3-venv, ca-certificates)"
  local t
  t=$(date +%s.%N)
  logged debootstrap debootstrap --variant=minbase --arch="$arch" \
    --include=python3,python3-venv,ca-certificates "$suite" "$root" "$mirror"
  log "debootstrap done in $(elapsed "$t")"
  # trim like Debian's slim images: apt caches and lists, docs (copyright files stay), man pages,
  # translations, logs; later apt-get installs in derived images skip the same paths
  rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/log/* \
    "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/lintian \
    "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old
  find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
  cat >"$root/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
EOF
  # the host's name and resolver do not belong in an image; the runtime provides both
  : >"$root/etc/hostname"
  : >"$root/etc/resolv.conf"
  : >"$root/etc/machine-id"
  # `python` as in the published image (the Dockerfiles run `python -m venv`); Debian has python3
  ln -sf /usr/bin/python3 "$root/usr/local/bin/python"
}
base_config=(--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  --env LANG=C.UTF-8 --cmd '["python3"]' --os linux --arch "$arch")

base_tar=$dir/${base_name//[:\/]/_}-$base_key.tar  # its name has the architecture already
have_base() {
  [ "$(bah inspect --type image \
    --format '{{index .OCIv1.Config.Labels "org.payloadrun.base-recipe"}}' "$base_name" \
    2>/dev/null)" = "$base_key" ]
}
if have_base; then
  log "base image $base_name ($base_key) is in the build storage"
elif [ -f "$base_tar" ]; then
  log "loading the base image from $(basename "$base_tar")"
  bah rmi -f "$base_name" >/dev/null 2>&1 || true
  logged base-load bah pull --quiet "docker-archive:$base_tar"
else
  t=$(date +%s.%N)
  bah rmi -f "$base_name" >/dev/null 2>&1 || true
  ctr=$(bah from --name "payloadrun-base-$$" scratch)
  # with vfs a working container's root is a plain directory: debootstrap straight into it
  root=$(bah mount "$ctr")
  make_base "$root"
  bah umount "$ctr" >/dev/null
  bah config "${base_config[@]}" --label "org.payloadrun.base-recipe=$base_key" "$ctr"
  logged base-commit bah commit --format docker --rm "$ctr" "$base_name"
  rm -f "$dir"/"${base_name//[:\/]/_}"-*.tar "$base_tar.tmp"
  logged base-push bah push "$base_name" "docker-archive:$base_tar.tmp:$base_name"
  mv "$base_tar.tmp" "$base_tar"
  log "base image built in $(elapsed "$t"): $(du -m "$base_tar" | cut -f1) MB ($(basename "$base_tar"))"
fi
have_base || die "the base image $base_name is not in the build storage after loading it"
# <<< base

# ---- 2. wheelhouse -------------------------------------------------------------------------------
if [ ! -f "$wheels/.complete" ]; then
  t=$(date +%s.%N)
  log "downloading the wheelhouse (cp311, manylinux <= glibc 2.36): $(echo "$requirements" | tr '\n' ' ')"
  rm -rf "$wheels"
  mkdir -p "$wheels"
  echo "$requirements" >"$wheels/requirements.txt"
  logged wheelhouse "$python" -m pip download --disable-pip-version-check --progress-bar off \
    --dest "$wheels" --only-binary=:all: "${wheel_platforms[@]}" --python-version 3.11 \
    --implementation cp --abi cp311 -r "$wheels/requirements.txt"
  if compgen -G "$wheels/torch-*" >/dev/null; then die "torch got into the wheelhouse"; fi
  touch "$wheels/.complete"
  for old in "$dir"/wheels-"$arch"-*/; do
    [ "${old%/}" = "$wheels" ] || rm -rf "${old%/}"
  done
  log "wheelhouse: $(find "$wheels" -name '*.whl' | wc -l) wheels, $(du -sm "$wheels" | cut -f1) MB, in $(elapsed "$t")"
fi

# >>> build
# ---- 3. images, 4. checks ------------------------------------------------------------------------
bud() {  # log-name dockerfile buildah-bud-args...
  local name=$1 dockerfile=$2
  shift 2
  logged "$name" bah bud --isolation chroot --pull=never --format docker \
    --platform "linux/$arch" --layers=false -f "$repo/$dockerfile" \
    --build-arg "PYTHON_IMAGE=$base_name" \
    --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/wheels \
    -v "$wheels:/wheels:ro" "$@" "$repo"
}
# The Dockerfile's `deps` stage (the venv with the dependencies alone), built once per dependency
# set and kept in the build storage under a tag of its key, then handed to every build as the
# named context that replaces the stage: a change of the code reinstalls the project alone. Its
# key: the Dockerfile's lines up to the build stage, pyproject.toml (the dependencies), the base
# image and the wheelhouse.
deps_image() {  # name dockerfile; sets deps_ref
  local name=$1 dockerfile=$2 key repo_name t old
  key=$({ sed -n '1,/^FROM .* AS build$/p' "$repo/$dockerfile"; cat "$repo/pyproject.toml"
    echo "$base_key $wheel_key $arch"; } | sha)
  repo_name=localhost/${name%%:*}-deps
  deps_ref=$repo_name:$arch-$key
  if bah inspect --type image "$deps_ref" >/dev/null 2>&1; then
    log "the dependencies of $name for $arch ($key) are in the build storage"
    return
  fi
  t=$(date +%s.%N)
  log "building the dependencies of $name for $arch ($key)"
  bud "deps-${name//[:\/]/_}" "$dockerfile" --target deps -t "$deps_ref"
  log "built the dependencies of $name in $(elapsed "$t")"
  # one kept per image and architecture
  for old in $(bah images --format '{{.Name}}:{{.Tag}}' |
    awk -v prefix="$repo_name:$arch-" -v kept="$deps_ref" 'index($0, prefix) == 1 && $0 != kept'); do
    bah rmi -f "$old" >/dev/null 2>&1 || true
  done
}
build_image() {  # name dockerfile tarball
  local name=$1 dockerfile=$2 out=$3 t ctr mnt site size
  # the name a pod's `image: payloadrun:e2e` means; buildah would call a short name localhost/...
  # and the tarball would carry both names
  local ref=docker.io/library/$name
  deps_image "$name" "$dockerfile"
  t=$(date +%s.%N)
  log "building $name for $arch from $dockerfile"
  bah rmi -f "$ref" >/dev/null 2>&1 || true
  bud "build-${name//[:\/]/_}" "$dockerfile" -t "$ref" \
    --build-context "deps=container-image://$deps_ref" \
    --build-arg "VERSION=$version" --build-arg "REVISION=$revision"
  log "built $name in $(elapsed "$t")"

  ctr=$(bah from --pull=never --platform "linux/$arch" --name "payloadrun-check-$$" "$ref")
  mnt=$(bah mount "$ctr")
  site=$(echo "$mnt"/opt/payloadrun/lib/python3*/site-packages)
  [ -d "$site" ] || die "$name: no venv site-packages under /opt/payloadrun"
  # no torch, no Kubernetes client, nothing dev-only (tests/packaging checks every module)
  for forbidden in torch kubernetes pytest payloadrun_devcluster payloadrun_devkit; do
    if compgen -G "$site/$forbidden" >/dev/null || compgen -G "$site/$forbidden-*" >/dev/null; then
      die "$name contains $forbidden ($site)"
    fi
  done
  size=$(du -s --apparent-size --block-size=1M "$mnt" | cut -f1)
  bah umount "$ctr" >/dev/null
  local entry
  entry=$(bah inspect --type image --format '{{range .OCIv1.Config.Entrypoint}}{{.}} {{end}}' "$ref")
  [ -n "$entry" ] || die "$name has no entry point"
  # shellcheck disable=SC2086  # the entry point's words
  logged "run-${name//[:\/]/_}" bah run --isolation chroot --user 65532:65532 "$ctr" -- \
    $entry --help
  grep -q '^usage:' "$logs/run-${name//[:\/]/_}.log" || die "\`$entry --help\` printed no usage"
  entry=${entry% }
  bah rm "$ctr" >/dev/null
  log "$name ($arch): $size MB uncompressed, no torch, \`$entry --help\` runs as uid 65532"

  rm -f "$out.tmp"
  logged "push-${name//[:\/]/_}" bah push "$ref" "docker-archive:$out.tmp:$name"
  # keep the cache bounded: older tarballs of this image go
  rm -f "$dir"/"${name//[:\/]/_}"-"$arch"-*.tar
  mv "$out.tmp" "$out"
  # the tarball is the product; the build storage keeps only the base image
  bah rmi -f "$ref" >/dev/null
  log "exported $name: $(du -m "$out" | cut -f1) MB tarball ($(basename "$out"))"
}
# <<< build

# (not `[ -f ... ] || build_image`: bash ignores set -e inside a function run as part of ||)
if [ ! -f "$sidecar_tar" ]; then
  build_image "$sidecar_name" sidecars/Dockerfile "$sidecar_tar"
fi
if [ ! -f "$operator_tar" ]; then
  build_image "$operator_name" operator/Dockerfile "$operator_tar"
fi
bah rmi --prune >/dev/null 2>&1 || true
log "done in $(elapsed "$t0")"
echo "$sidecar_name $sidecar_tar"
echo "$operator_name $operator_tar"
