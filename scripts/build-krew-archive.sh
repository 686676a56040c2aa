#!/usr/bin/env bash
# Build the archive deploy/krew/nodewright.yaml names: dist/kubectl-nodewright-<version>.tar.gz
# holding the launcher (deploy/krew/kubectl-nodewright) and LICENSE. Reproducible (fixed
# order, owner, mode and time; gzip without a name or time), so its sha256 is the manifest's:
# the last line of stdout is "<sha256>  <archive>". Usage: build-krew-archive.sh [OUT_DIR]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=$(sed -n 's/^version=//p' "$here/deploy/krew/kubectl-nodewright")
out=${1:-$here/dist}
mkdir -p "$out"
archive="$out/kubectl-nodewright-$version.tar.gz"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
install -m 0755 "$here/deploy/krew/kubectl-nodewright" "$stage/kubectl-nodewright"
install -m 0644 "$here/LICENSE" "$stage/LICENSE"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=1970-01-01T00:00:00Z \
  --format=gnu -C "$stage" -cf - LICENSE kubectl-nodewright | gzip -n -9 > "$archive"
sha256sum "$archive"
