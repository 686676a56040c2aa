#!/usr/bin/env bash
# Build the test rig's Go binaries (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kubelet, kube-proxy, kwok, helm, containerd and its runc shim,
# ctr, CoreDNS, the pod sandbox "pause" program, crane, whose registry the chart tests push
# the chart to, the operator's tools the tests use: the nats CLI and krew, and toxiproxy, the
# reliability tests' fault proxy) from the Go
# module proxy into a cache outside the repo, unpacks Debian's containerd 1.6 package beside
# them (a runtime without image volumes, for one of the rig's real nodes) and promtool from
# Debian's prometheus package, and copies
# the Prometheus Operator's CRDs out of its module (the chart's ServiceMonitor/PodMonitor
# tests). Usage: build-rig.sh [component ...] (default: all).
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

key_of() { # component dir -> short hash of its files (go.mod, go.sum, any source) and the Go version
  (cd "$here/tools/$1" && find . -type f | LC_ALL=C sort | xargs cat) | { cat; echo "go$go_version"; } | sha256sum | cut -c1-16
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
    containerd)
      # containerd 2.x: 1.x has no image volumes, which package pods use.
      (cd "$here/tools/containerd" && go build -trimpath -tags no_btrfs,no_devmapper -ldflags "-s -w" -o "$tmp/" \
          github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
          github.com/containerd/containerd/v2/cmd/ctr) \
        || die "containerd build failed (module github.com/containerd/containerd/v2); see the go output above." ;;
    coredns)
      # Cluster DNS for the real nodes' pods (Service names, the NATS cluster's routes).
      (cd "$here/tools/coredns" && go build -trimpath -ldflags "-s -w" -o "$tmp/coredns" github.com/coredns/coredns) \
        || die "coredns build failed (module github.com/coredns/coredns); see the go output above." ;;
    pause)
      (cd "$here/tools/pause" && go build -trimpath -ldflags "-s -w" -o "$tmp/pause" .) \
        || die "pause build failed (tools/pause); see the go output above." ;;
    crane)
      # `crane registry serve`: an OCI registry on loopback for the chart's push/install test,
      # and the real nodes' registry on the rig's bridge (nodewright.rig.Rig.registry).
      (cd "$here/tools/crane" && go build -trimpath -ldflags "-s -w" -o "$tmp/crane" github.com/google/go-containerregistry/cmd/crane) \
        || die "crane build failed (module github.com/google/go-containerregistry); see the go output above." ;;
    helm)
      (cd "$here/tools/helm" && go build -trimpath -ldflags "-s -w" -o "$tmp/helm" helm.sh/helm/v3/cmd/helm) \
        || die "helm build failed (module helm.sh/helm/v3); see the go output above." ;;
    natscli)
      (cd "$here/tools/natscli" && go build -trimpath -ldflags "-s -w" -o "$tmp/nats" github.com/nats-io/natscli/nats) \
        || die "nats CLI build failed (module github.com/nats-io/natscli); see the go output above." ;;
    toxiproxy)
      # A TCP fault proxy on loopback (latency, cut connections) for the reliability tests.
      (cd "$here/tools/toxiproxy" && go build -trimpath -ldflags "-s -w" -o "$tmp/toxiproxy-server" github.com/Shopify/toxiproxy/v2/cmd/server) \
        || die "toxiproxy build failed (module github.com/Shopify/toxiproxy/v2); see the go output above." ;;
    krew)
      (cd "$here/tools/krew" && go build -trimpath -ldflags "-s -w" -o "$tmp/krew" sigs.k8s.io/krew/cmd/krew) \
        || die "krew build failed (module sigs.k8s.io/krew); see the go output above." ;;
    k8s)
      local ld="-s -w"
      for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ld="$ld -X $p.gitVersion=$k8s_version -X $p.gitMajor=1 -X $p.gitMinor=$k8s_minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
      done
      (cd "$here/tools/k8s" && go build -trimpath -tags notest,grpcnotrace -ldflags "$ld" -o "$tmp/" \
          k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
          k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy) \
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

# Debian's containerd 1.6 (no image volumes), unpacked from its package into the cache, never
# installed: the rig's "legacy runtime" real node, on which NodeWright must say what to set.
debian_containerd() {
  local version; version=$(apt-cache policy containerd 2>/dev/null | sed -n 's/^ *Candidate: //p')
  [ -n "$version" ] && [ "$version" != "(none)" ] || die "Debian's containerd package is not known to apt (apt-get update?)"
  local dest="$cache_root/containerd-1.6"
  if [ -x "$dest/usr/bin/containerd" ] && [ "$(cat "$dest/.version" 2>/dev/null)" = "$version" ]; then
    log "containerd-1.6: cached ($version)"; return 0
  fi
  log "containerd-1.6: unpacking Debian's containerd $version ..."
  local tmp; tmp=$(mktemp -d "$cache_root/tmp.XXXXXX")
  (cd "$tmp" && apt-get download "containerd=$version" >/dev/null 2>&1) \
    || { rm -rf "$tmp"; die "apt-get download containerd=$version failed"; }
  rm -rf "$dest"
  dpkg-deb -x "$tmp"/containerd_*.deb "$dest" || die "unpacking containerd $version failed"
  echo "$version" > "$dest/.version"
  rm -rf "$tmp"
}

# Prometheus' linter, promtool, from Debian's prometheus package (unpacked, never installed:
# no daemon is set up). Built from the Go module proxy it took 807 s of a cold build, more
# than a third of the rig's.
debian_promtool() {
  local version; version=$(apt-cache policy prometheus 2>/dev/null | sed -n 's/^ *Candidate: //p')
  [ -n "$version" ] && [ "$version" != "(none)" ] || die "Debian's prometheus package is not known to apt (apt-get update?)"
  local stamp="$cache_root/stamps/promtool-deb-$version"
  if [ -f "$stamp" ] && [ -x "$bin_dir/promtool" ]; then
    log "promtool: cached (Debian prometheus $version)"; return 0
  fi
  log "promtool: unpacking Debian's prometheus $version ..."
  local tmp; tmp=$(mktemp -d "$cache_root/tmp.XXXXXX")
  (cd "$tmp" && apt-get download "prometheus=$version" >/dev/null 2>&1) \
    || { rm -rf "$tmp"; die "apt-get download prometheus=$version failed"; }
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x" || die "unpacking prometheus $version failed"
  [ -x "$tmp/x/usr/bin/promtool" ] || die "Debian's prometheus $version has no usr/bin/promtool"
  mv -f "$tmp/x/usr/bin/promtool" "$bin_dir/promtool"
  rm -rf "$tmp"
  mkdir -p "$cache_root/stamps"
  rm -f "$cache_root/stamps/promtool-"*
  touch "$stamp"
}

# The Prometheus Operator's ServiceMonitor and PodMonitor CRDs, as its release ships them
# (example/prometheus-operator-crd in its Go module, pinned and checksummed by
# tools/prometheus-operator/go.sum), copied into the cache: the chart's tests install them to
# check its ServiceMonitor and PodMonitor on the API server. Nothing is built.
prometheus_crds() {
  local key; key=$(key_of prometheus-operator)
  local dest="$cache_root/crds/prometheus-operator"
  if [ -f "$dest/.key" ] && [ "$(cat "$dest/.key")" = "$key" ]; then
    log "prometheus-crds: cached ($key)"; return 0
  fi
  local mod=github.com/prometheus-operator/prometheus-operator
  local version; version=$(sed -n "s|^require $mod \\(v[^ ]*\\)$|\\1|p" "$here/tools/prometheus-operator/go.mod")
  local sum; sum=$(sed -n "s|^$mod $version \\(h1:[^ ]*\\)$|\\1|p" "$here/tools/prometheus-operator/go.sum")
  [ -n "$version" ] && [ -n "$sum" ] || die "tools/prometheus-operator: go.mod/go.sum name no version and hash of $mod"
  log "prometheus-crds: fetching $mod@$version ($key) ..."
  # Outside any module (only this one is downloaded, not its dependencies); the go command checks
  # the zip against the checksum database, and its hash must be the one in go.sum.
  local tmp; tmp=$(mktemp -d "$cache_root/tmp.XXXXXX")
  local json; json=$(cd "$tmp" && GOFLAGS= go mod download -json "$mod@$version") \
    || { rm -rf "$tmp"; die "go mod download $mod@$version failed: $json"; }
  rmdir "$tmp"
  local dir; dir=$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  local got; got=$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Sum": "\(.*\)",$/\1/p')
  [ "$got" = "$sum" ] || die "$mod@$version has hash '$got', tools/prometheus-operator/go.sum says $sum"
  rm -rf "$dest"; mkdir -p "$dest"
  for kind in servicemonitors podmonitors; do
    cp "$dir/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$dest/" \
      || die "$mod@$version has no example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml"
  done
  chmod 0644 "$dest"/*.yaml
  echo "$version" > "$dest/.version"
  echo "$key" > "$dest/.key"
}

want=${*:-etcd kwok helm k8s pause containerd containerd-1.6 coredns crane prometheus-crds natscli promtool krew toxiproxy}
for comp in $want; do
  case $comp in
    etcd) build etcd etcd ;;
    kwok) build kwok kwok ;;
    helm) build helm helm ;;
    k8s) build k8s kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy ;;
    pause) build pause pause ;;
    containerd) build containerd containerd containerd-shim-runc-v2 ctr ;;
    containerd-1.6) debian_containerd ;;
    coredns) build coredns coredns ;;
    crane) build crane crane ;;
    prometheus-crds) prometheus_crds ;;
    natscli) build natscli nats ;;
    promtool) debian_promtool ;;
    krew) build krew krew ;;
    toxiproxy) build toxiproxy toxiproxy-server ;;
    *) die "unknown component '$comp' (etcd kwok helm k8s pause containerd containerd-1.6 coredns crane prometheus-crds natscli promtool krew toxiproxy)" ;;
  esac
done

echo "$bin_dir"
