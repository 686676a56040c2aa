#!/bin/sh
# apply-check and config-check: the file on the host and every live value match the config.
set -eu
. "$NODEWRIGHT_STEPS_DIR/lib.sh"

desired=$(mktemp)
trap 'rm -f "$desired"' EXIT
nw_normalize "$NW_SRC" "$desired"
failed=0
[ -f "$NW_DEST" ] || { echo "FAIL: $NW_DEST is missing"; exit 1; }
if ! grep -v '^#' "$NW_DEST" | cmp -s - "$desired"; then
  echo "FAIL: $NW_DEST does not hold the configured settings"
  failed=1
fi
for key in $(nw_keys "$desired"); do
  want=$(nw_value "$desired" "$key")
  have=$(nw_live "$key")
  if [ "$have" = "$want" ]; then
    echo "ok: $key = $have"
  else
    echo "FAIL: $key is '$have', want '$want'"
    failed=1
  fi
done
exit "$failed"
