#!/bin/sh
# uninstall-check: nothing of the package is left on the host.
set -eu
. "$NODEWRIGHT_STEPS_DIR/lib.sh"

if [ -e "$NW_DEST" ]; then echo "FAIL: $NW_DEST still exists"; exit 1; fi
if [ -e "$NW_BACKUP" ]; then echo "FAIL: $NW_BACKUP still exists (values not restored)"; exit 1; fi
echo "ok: $NW_DEST removed, original values restored"
