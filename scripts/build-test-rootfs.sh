#!/usr/bin/env bash
# Build the root filesystem the agent tests chroot into, into a cache outside the repo.
#
# Kinds (NODEWRIGHT_TEST_ROOTFS_KIND):
#   auto         (default) debootstrap; if that fails, say so loudly and build busybox
#   debootstrap  Debian bookworm --variant=minbase from the Debian mirror (~1.5 min cold)
#   busybox      busybox-static plus a chosen set of applets (seconds; no network beyond apt)
# Idempotent: each kind is cached under a key that names its recipe version; a warm cache
# returns at once. Needs root (debootstrap and chroot do); installs debootstrap or
# busybox-static with apt-get when missing. Prints the rootfs directory on the last line of
# stdout; everything else goes to stderr.
#
# Safety: the tests run commands as root chrooted into this tree, and chroot does not
# isolate the kernel -- a real `reboot` in it would reboot this machine. The tree therefore
# must not contain reboot/halt/poweroff/shutdown/systemctl/init; this script removes them
# and checks, and the test fixture installs recording stand-ins under those names.
set -euo pipefail

debootstrap_recipe=v1   # bump when that recipe below changes
busybox_recipe=v2
suite=bookworm
mirror=${NODEWRIGHT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
kind=${NODEWRIGHT_TEST_ROOTFS_KIND:-auto}
cache_root=${NODEWRIGHT_TEST_ROOTFS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewright-test-rootfs}
dangerous="reboot halt poweroff shutdown systemctl init telinit"
applets="sh ash cat cp mv rm mkdir rmdir ls ln echo printf test [ grep egrep sed awk sort uniq
head tail wc tr cut date sleep touch chmod chown env true false id stat readlink realpath
basename dirname find xargs tee mktemp sha256sum md5sum expr seq cmp diff od hexdump uname
hostname pwd which"

die() { echo "build-test-rootfs: error: $*" >&2; exit 1; }
log() { echo "build-test-rootfs: $*" >&2; }

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap and chroot need it)"

apt_install() { # package
  log "installing $1 with apt-get ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "$1" >&2 || { apt-get update -q >&2 && apt-get install -y -q "$1" >&2; } \
    || die "cannot install $1 with apt-get (is Debian's package mirror reachable?)"
}

need() { # command package
  command -v "$1" >/dev/null 2>&1 && return 0
  apt_install "$2"
  command -v "$1" >/dev/null 2>&1 || die "$2 was installed but $1 is still not on PATH"
}

defuse() { # rootfs: remove anything that could reboot or re-init this machine
  local root=$1 d c
  for d in bin sbin usr/bin usr/sbin usr/local/bin usr/local/sbin; do
    for c in $dangerous; do
      if [ -e "$root/$d/$c" ] || [ -L "$root/$d/$c" ]; then rm -f "$root/$d/$c"; fi
    done
  done
  for d in bin sbin usr/bin usr/sbin usr/local/bin usr/local/sbin; do
    for c in $dangerous; do
      { [ -e "$root/$d/$c" ] || [ -L "$root/$d/$c" ]; } && die "$root/$d/$c survived removal"
    done
  done
  return 0
}

finish() { # tmpdir key: seal a built tree and move it into the cache atomically
  local tmp=$1 key=$2
  defuse "$tmp/root"
  mkdir -p "$tmp/root/usr/local/bin" "$tmp/root/usr/local/sbin" "$tmp/root/var/tmp" "$tmp/root/tmp"
  chmod 1777 "$tmp/root/tmp" "$tmp/root/var/tmp"
  echo "$key" > "$tmp/root/.nodewright-test-rootfs"
  rm -rf "${cache_root:?}/$key"
  mv "$tmp" "$cache_root/$key"
}

build_debootstrap() {
  local key="debootstrap-$suite-minbase-$debootstrap_recipe" tmp
  [ -f "$cache_root/$key/root/.nodewright-test-rootfs" ] && { log "debootstrap: cached ($key)"; echo "$cache_root/$key/root"; return 0; }
  need debootstrap debootstrap
  log "debootstrap: building $suite minbase from $mirror (takes a minute or two) ..."
  tmp=$(mktemp -d "$cache_root/tmp.XXXXXX")
  local t0; t0=$(date +%s)
  if ! debootstrap --variant=minbase "$suite" "$tmp/root" "$mirror" >"$tmp/debootstrap.log" 2>&1; then
    tail -n 20 "$tmp/debootstrap.log" >&2
    rm -rf "$tmp"
    return 1
  fi
  # Smaller, and nothing in it depends on docs, locales or apt's lists.
  rm -rf "$tmp/root/usr/share/doc" "$tmp/root/usr/share/man" "$tmp/root/usr/share/locale" \
    "$tmp/root/var/cache/apt/"* "$tmp/root/var/lib/apt/lists/"* "$tmp/debootstrap.log"
  finish "$tmp" "$key"
  log "debootstrap: built in $(( $(date +%s) - t0 ))s"
  echo "$cache_root/$key/root"
}

build_busybox() {
  local key="busybox-$busybox_recipe" tmp bb
  [ -f "$cache_root/$key/root/.nodewright-test-rootfs" ] && { log "busybox: cached ($key)"; echo "$cache_root/$key/root"; return 0; }
  dpkg -s busybox-static >/dev/null 2>&1 || apt_install busybox-static
  bb=$(dpkg -L busybox-static 2>/dev/null | grep -E '/bin/busybox$' | head -n1)
  [ -n "$bb" ] && [ -x "$bb" ] || die "busybox-static is not installed (apt-get install busybox-static)"
  tmp=$(mktemp -d "$cache_root/tmp.XXXXXX")
  mkdir -p "$tmp/root"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,root,var/lib,var/log,run}
  cp "$bb" "$tmp/root/bin/busybox"
  for a in $applets; do ln -s busybox "$tmp/root/bin/$a"; done
  echo "root:x:0:0:root:/root:/bin/sh" > "$tmp/root/etc/passwd"
  echo "root:x:0:" > "$tmp/root/etc/group"
  # Shells redirect background jobs to /dev/null; scripts read /dev/urandom.
  mknod -m 666 "$tmp/root/dev/null" c 1 3
  mknod -m 666 "$tmp/root/dev/zero" c 1 5
  mknod -m 666 "$tmp/root/dev/urandom" c 1 9
  finish "$tmp" "$key"
  log "busybox: built"
  echo "$cache_root/$key/root"
}

mkdir -p "$cache_root"
# Leftovers of an interrupted build.
find "$cache_root" -maxdepth 1 -name 'tmp.*' -mmin +60 -exec rm -rf {} + 2>/dev/null || true

case $kind in
  debootstrap) build_debootstrap || die "debootstrap failed (see above); NODEWRIGHT_TEST_ROOTFS_KIND=busybox builds without the Debian mirror" ;;
  busybox) build_busybox ;;
  auto)
    if ! build_debootstrap; then
      log "WARNING: debootstrap failed; falling back to a busybox root filesystem"
      build_busybox
    fi ;;
  *) die "NODEWRIGHT_TEST_ROOTFS_KIND=$kind is not one of auto, debootstrap, busybox" ;;
esac
