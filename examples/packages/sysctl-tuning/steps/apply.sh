#!/bin/sh
# apply and config: write the configMap's sysctl.conf to /etc/sysctl.d (so it survives a
# reboot) and set the values live. Keys this package set before but the new config dropped
# go back to the value the host had before the package first touched them.
set -eu
. "$NODEWRIGHT_STEPS_DIR/lib.sh"

[ -f "$NW_SRC" ] || nw_fail "missing $NW_SRC (configMap key sysctl.conf)"
desired=$(mktemp)
trap 'rm -f "$desired" "$desired.backup"' EXIT
nw_normalize "$NW_SRC" "$desired"

mkdir -p "$(dirname "$NW_BACKUP")"
touch "$NW_BACKUP"
# Remember originals once, before the first change of each key.
for key in $(nw_keys "$desired"); do
  if [ -z "$(nw_value "$NW_BACKUP" "$key")" ]; then
    printf '%s = %s\n' "$key" "$(nw_live "$key")" >> "$NW_BACKUP"
  fi
done
# Restore keys that are no longer managed, and forget their originals.
: > "$desired.backup"
for key in $(nw_keys "$NW_BACKUP"); do
  if [ -z "$(nw_value "$desired" "$key")" ]; then
    echo "restoring $key to $(nw_value "$NW_BACKUP" "$key")"
    printf '%s\n' "$(nw_value "$NW_BACKUP" "$key")" > "$(nw_proc "$key")"
  else
    printf '%s = %s\n' "$key" "$(nw_value "$NW_BACKUP" "$key")" >> "$desired.backup"
  fi
done
cat "$desired.backup" > "$NW_BACKUP"

mkdir -p "$(dirname "$NW_DEST")"
{ echo "# Managed by NodeWright package sysctl-tuning $NODEWRIGHT_PACKAGE_VERSION; do not edit."
  cat "$desired"; } > "$NW_DEST.tmp"
mv "$NW_DEST.tmp" "$NW_DEST"
for key in $(nw_keys "$desired"); do
  value=$(nw_value "$desired" "$key")
  echo "setting $key = $value"
  printf '%s\n' "$value" > "$(nw_proc "$key")"
done
