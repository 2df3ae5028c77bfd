# SPDX-License-Identifier: MIT
# tests/script_lib.sh: what the script tests of a running server share (tests/load/faults.sh,
# tests/deploy/test_*.sh). Sourced after `set -euo pipefail`:
#   . "$(dirname "$0")/../script_lib.sh"; script_args "$@"
# gives BIN and MODEL (absolute), check NAME OK DETAIL counting FAILS, and kill_server PID.

# script_args SHARDLM_BINARY MODEL.shlm: the two arguments every such test takes
script_args() {
    if [ $# -ne 2 ]; then
        echo "usage: $0 SHARDLM_BINARY MODEL.shlm" >&2
        exit 2
    fi
    BIN=$(realpath -m "$1")
    MODEL=$(realpath -m "$2")
}

FAILS=0
# check NAME OK(0/1) DETAIL: prints PASS or FAIL; a FAIL counts in FAILS
check() {
    if [ "$2" = 1 ]; then
        echo "PASS $1: $3"
    else
        echo "FAIL $1: $3"
        FAILS=$((FAILS + 1))
    fi
}

# kill_server PID: SIGKILL a `shardlm serve` still running and its workers (a cleanup's last
# resort: the workers would follow their coordinator within a moment anyway)
kill_server() {
    [ -n "$1" ] && kill -0 "$1" 2>/dev/null || return 0
    local w
    for w in $(pgrep -P "$1"); do kill -KILL "$w" 2>/dev/null; done
    kill -KILL "$1" 2>/dev/null
}
