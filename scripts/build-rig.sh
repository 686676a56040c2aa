#!/usr/bin/env bash
# Build the test rig's Go binaries (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kwok, helm) from the Go module proxy into a cache outside the repo.
#
# Idempotent: each component is keyed by the hash of its wrapper module's go.mod/go.sum
# and the Go version; a warm cache returns at once. Prints the bin directory on the
# last line of stdout. Binaries are never written inside the repository.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache_root=${NODEWRIGHT_RIG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewright-rig}
min_go=1.26
k8s_version=v1.36.3
k8s_minor=36

die() { echo "build-rig: error: $*" >&2; exit 1; }
log() { echo "build-rig: $*" >&2; }

command -v go >/dev/null 2>&1 || die "Go is not installed; install Go >= $min_go and re-run (https://go.dev/doc/install)."
go_version=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
[ -n "$go_version" ] || die "cannot read the Go version from 'go env GOVERSION'."
if [ "$(printf '%s\n%s\n' "$min_go" "$go_version" | sort -V | head -n1)" != "$min_go" ]; then
  die "Go $go_version is too old; the rig needs Go >= $min_go (k8s $k8s_version modules say 'go 1.26.0')."
fi

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

key_of() { # component dir -> short hash of its module files and the Go version
  cat "$here/tools/$1/go.mod" "$here/tools/$1/go.sum" | { cat; echo "go$go_version"; } | sha256sum | cut -c1-16
}

bin_dir="$cache_root/bin"
mkdir -p "$bin_dir"

build() { # name component outputs... ; the build cmd follows after '--'
  local comp=$1; shift
  local key; key=$(key_of "$comp")
  local stamp="$cache_root/stamps/$comp-$key"
  if [ -f "$stamp" ]; then
    local ok=1
    for b in "$@"; do [ -x "$bin_dir/$b" ] || ok=0; done
    if [ $ok = 1 ]; then log "$comp: cached ($key)"; return 0; fi
  fi
  log "$comp: building ($key) ..."
  local t0; t0=$(date +%s)
  local tmp; tmp=$(mktemp -d "$cache_root/tmp.XXXXXX")
  case $comp in
    etcd)
      (cd "$here/tools/etcd" && go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3) \
        || die "etcd build failed (module go.etcd.io/etcd/server/v3); see the go output above." ;;
    kwok)
      (cd "$here/tools/kwok" && go build -trimpath -ldflags "-s -w" -o "$tmp/kwok" sigs.k8s.io/kwok/cmd/kwok) \
        || die "kwok build failed (module sigs.k8s.io/kwok); see the go output above." ;;
    helm)
      (cd "$here/tools/helm" && go build -trimpath -ldflags "-s -w" -o "$tmp/helm" helm.sh/helm/v3/cmd/helm) \
        || die "helm build failed (module helm.sh/helm/v3); see the go output above." ;;
    k8s)
      local ld="-s -w"
      for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ld="$ld -X $p.gitVersion=$k8s_version -X $p.gitMajor=1 -X $p.gitMinor=$k8s_minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
      done
      (cd "$here/tools/k8s" && go build -trimpath -tags notest,grpcnotrace -ldflags "$ld" -o "$tmp/" \
          k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl) \
        || die "kubernetes build failed (module k8s.io/kubernetes $k8s_version); see the go output above." ;;
  esac
  for b in "$@"; do
    [ -x "$tmp/$b" ] || die "$comp build produced no $b"
    mv -f "$tmp/$b" "$bin_dir/$b"
  done
  rmdir "$tmp" 2>/dev/null || true
  mkdir -p "$cache_root/stamps"
  rm -f "$cache_root/stamps/$comp-"*
  touch "$stamp"
  log "$comp: built in $(( $(date +%s) - t0 ))s"
}

build etcd etcd
build kwok kwok
build helm helm
build k8s kube-apiserver kube-controller-manager kube-scheduler kubectl

echo "$bin_dir"
