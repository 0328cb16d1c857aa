# Sourced by the device scripts before anything else: committed GPU evidence comes from
# preregistered protocols. `exploratory_flag "$1"` sets EXPLORATORY=1 when the script's first
# argument is --exploratory (the script then shifts it away); `require_frozen PROTOCOL...`
# returns 0 when every protocol has its freeze record (PROTOCOL.freeze.json, written by
# `kerneltrial protocol freeze`; `run` itself refuses a protocol changed since), or when
# EXPLORATORY=1; else it names the first protocol that is not frozen, says how to go on, and
# returns 2 before the script has installed or run anything.
exploratory_flag() { EXPLORATORY=0; [ "$1" = --exploratory ] && EXPLORATORY=1; return 0; }
require_frozen() {
  [ "$EXPLORATORY" = 1 ] && return 0
  for protocol in "$@"; do
    if [ ! -f "$protocol.freeze.json" ]; then
      echo "refusing $protocol: it is not frozen, so its evidence would not be preregistered;" \
        "freeze it first (kerneltrial protocol freeze $protocol) or pass --exploratory as the first argument" >&2
      return 2
    fi
  done
}
