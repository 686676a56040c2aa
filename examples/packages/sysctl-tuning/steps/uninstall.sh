#!/bin/sh
# uninstall: restore every value this package changed and remove its file.
set -eu
. "$NODEWRIGHT_STEPS_DIR/lib.sh"

if [ -f "$NW_BACKUP" ]; then
  for key in $(nw_keys "$NW_BACKUP"); do
    value=$(nw_value "$NW_BACKUP" "$key")
    echo "restoring $key to $value"
    printf '%s\n' "$value" > "$(nw_proc "$key")"
  done
  rm -f "$NW_BACKUP"
fi
rm -f "$NW_DEST"
