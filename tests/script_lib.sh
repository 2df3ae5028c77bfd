# SPDX-License-Identifier: MIT
# tests/script_lib.sh: what the script tests of a running server share (tests/load/faults.sh,
# tests/deploy/test_*.sh) and the script tests that take only the binary. Sourced after
# `set -euo pipefail`:
#   . "$(dirname "$0")/../script_lib.sh"; script_args "$@"
# gives BIN and MODEL (absolute), check NAME OK DETAIL counting FAILS, start_server LOG [options],
# kill_server PID and jget FILE EXPR.

# script_args SHARDLM_BINARY MODEL.shlm: the two arguments every such test takes
script_args() {
    if [ $# -ne 2 ]; then
        echo "usage: $0 SHARDLM_BINARY MODEL.shlm" >&2
        exit 2
    fi
    BIN=$(realpath -m "$1")
    MODEL=$(realpath -m "$2")
}

# script_bin "$@": the one argument of the script tests that take only the shardlm binary
# (tests/test_archs.sh, test_refusals.sh): BIN (absolute), HERE (tests/) and DATA (the test data:
# $SHARDLM_TEST_DATA, else ctest's $SHARDLM_TEST_DATA_DEFAULT, else tests/data)
script_bin() {
    if [ $# -ne 1 ]; then
        echo "usage: $0 SHARDLM_BINARY" >&2
        exit 2
    fi
    BIN=$(realpath -m "$1")
    HERE=$(cd "$(dirname "$0")" && pwd)
    DATA=${SHARDLM_TEST_DATA:-${SHARDLM_TEST_DATA_DEFAULT:-$HERE/data}}
}

# script_tmp NAME: TMP, a folder /dev/shm/NAME.XXXXXX removed on exit, with the private
# SHARDLM_RUNTIME_DIR of every command the test runs in it
script_tmp() {
    TMP=$(mktemp -d "/dev/shm/$1.XXXXXX")
    trap 'rm -rf "$TMP"' EXIT
    export SHARDLM_RUNTIME_DIR=$TMP/run
    mkdir -m 700 "$SHARDLM_RUNTIME_DIR" # shardlm wants it private
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

# start_server LOG [serve options]: `shardlm serve -m MODEL --port 0` in the background, its
# output in LOG; once it serves, SRV is its pid, PORT its port and URL its address (a server
# that does not serve within 30 s fails the test, its log printed)
start_server() {
    local log=$1
    shift
    "$BIN" serve -m "$MODEL" --port 0 "$@" >"$log" 2>&1 &
    SRV=$!
    for _ in $(seq 300); do
        grep -q 'shardlm: serving' "$log" && break
        kill -0 "$SRV" 2>/dev/null || break
        sleep 0.1
    done
    if ! grep -q 'shardlm: serving' "$log"; then
        echo "FAIL start: the server did not start serving within 30 s:"
        cat "$log"
        exit 1
    fi
    PORT=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | grep -o '[0-9]*$')
    URL=http://127.0.0.1:$PORT
}

# jget FILE EXPR: a field of the last JSON object in FILE, one per line ('j' in EXPR; node)
jget() {
    node -e 'const fs=require("fs");const j=JSON.parse(fs.readFileSync(process.argv[1],"utf8").trim().split("\n").pop());const v=eval(process.argv[2]);console.log(typeof v==="object"?JSON.stringify(v):v)' "$1" "$2"
}
