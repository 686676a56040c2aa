# Shared helpers of the sysctl-tuning steps; sourced, never run as a step.
# Runs on the host (the agent chroots into it) with POSIX sh and coreutils-level tools only.

NW_DEST=/etc/sysctl.d/90-nodewright-sysctl-tuning.conf
NW_SRC="${NODEWRIGHT_CONFIG_DIR:?not run by the NodeWright agent}/sysctl.conf"
# Values the host had before this package first changed them, restored on uninstall.
NW_BACKUP="${NODEWRIGHT_DATA_DIR:?not run by the NodeWright agent}/original-values.conf"

nw_fail() { echo "sysctl-tuning: $*" >&2; exit 1; }

# The /proc/sys file of a dotted key (net.core.somaxconn -> /proc/sys/net/core/somaxconn).
nw_proc() { printf '/proc/sys/%s' "$(printf '%s' "$1" | tr . /)"; }

# A value with runs of blanks collapsed (the kernel separates multi-value sysctls by tabs).
nw_squash() { printf '%s' "$1" | tr -s ' \t' '  ' | sed 's/^ //; s/ $//'; }

# The live value of a key, squashed.
nw_live() { nw_squash "$(cat "$(nw_proc "$1")")"; }

# nw_normalize SRC OUT: parse "key = value" lines (blank lines and #/; comments ignored)
# into OUT as "key = value", one per key, checking every key exists in /proc/sys.
nw_normalize() {
  : > "$2"
  while IFS= read -r line || [ -n "$line" ]; do
    case $line in '' | '#'* | ';'*) continue ;; esac
    case $line in *=*) ;; *) nw_fail "$1: not 'key = value': $line" ;; esac
    key=$(printf '%s' "${line%%=*}" | tr -d ' \t')
    value=$(nw_squash "${line#*=}")
    printf '%s' "$key" | grep -Eq '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$' \
      || nw_fail "$1: not a sysctl key: $key"
    [ -n "$value" ] || nw_fail "$1: empty value for $key"
    [ -f "$(nw_proc "$key")" ] || nw_fail "$1: unknown sysctl $key (no $(nw_proc "$key"))"
    if [ -n "$(nw_value "$2" "$key")" ]; then nw_fail "$1: $key is set twice"; fi
    printf '%s = %s\n' "$key" "$value" >> "$2"
  done < "$1"
}

# nw_value FILE KEY: the value of KEY in a normalized file (empty if absent).
nw_value() { sed -n "s/^$(printf '%s' "$2" | sed 's/\./\\./g') = //p" "$1" | head -n 1; }

# nw_keys FILE: the keys of a normalized file.
nw_keys() { sed -n 's/ = .*//p' "$1"; }
