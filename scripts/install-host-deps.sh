#!/usr/bin/env bash
# Install the Debian packages the rig's real nodes and the image build use, if missing:
#   buildah debootstrap       images without a daemon, the Python base, the host root
#   runc                      the OCI runtime containerd starts containers with
#   containernetworking-plugins  bridge, host-local and loopback CNI plugins (/usr/lib/cni)
#   iproute2 iptables conntrack  the real node's namespaces, veth pair and kube-proxy's rules
#   chromium chromium-driver  headless Chromium and its WebDriver, for the test of the status
#                             service's web page (tests/e2e/test_web_page.py)
#   lua5.1 lua5.4             run the Argo CD health check (deploy/argocd) in the tests: 5.1 is
#                             the language Argo CD's interpreter (gopher-lua) implements
# Idempotent and quick when everything is there; needs root to install. Nothing else on the
# machine is configured: the rig creates and removes its own namespaces and links.
set -euo pipefail
packages="buildah debootstrap runc containernetworking-plugins iproute2 iptables conntrack chromium chromium-driver lua5.1 lua5.4"
missing=""
for p in $packages; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
[ "$(id -u)" = 0 ] || { echo "install-host-deps: error: missing Debian packages:$missing; run as root (or apt-get install them)" >&2; exit 1; }
echo "install-host-deps: installing$missing ..." >&2
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086
apt-get install -y -q --no-install-recommends $missing >&2 \
  || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends $missing >&2; } \
  || { echo "install-host-deps: error: apt-get could not install$missing (is Debian's package mirror reachable?)" >&2; exit 1; }
