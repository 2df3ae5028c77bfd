#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Faults under load for `shardlm serve`: tests/load/faults.sh SHARDLM_BINARY MODEL.shlm
#
# Starts a server on a free port and runs tests/load/loadgen.mjs against it (64 streaming
# clients); while the load runs: a worker is killed with SIGKILL (twice), and misbehaving
# clients come (malformed JSON, invalid UTF-8, 10 MiB bodies, a header trickled a byte a second,
# a client that never reads its answers). Then, under a second load, SIGTERM: new requests are
# refused, running streams finish, the server exits 0 within --drain-seconds.
# Prints PASS/FAIL per check; exits 1 on any FAIL (a missing tool or model included).
#
# Environment: LOAD_SECONDS (40) the first load's length, TRICKLE_CAP_S (40) how long the
# trickled header may stay open, DRAIN_SECONDS (10; 30 for a sanitized build), FAULTS_KEEP=1
# keeps the work folder.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/script_lib.sh
. "$HERE/../script_lib.sh"
script_args "$@"
LOAD_SECONDS=${LOAD_SECONDS:-40}
TRICKLE_CAP_S=${TRICKLE_CAP_S:-40}
# what it needs is installed by deploy/bootstrap.sh: a missing tool fails the test, never skips it
for t in node curl ss pgrep; do
    command -v "$t" >/dev/null ||
        { echo "FAIL: $t is not installed (deploy/bootstrap.sh installs it)"; exit 1; }
done
[ -f "$MODEL" ] || { echo "FAIL: $MODEL is missing (deploy/bootstrap.sh makes it)"; exit 1; }
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable"; exit 1; }

# an ASan build (tests run under .ci/run's build-asan too) keeps freed memory in quarantine
# (grep -c, not -q: -q leaves at the first match, and nm, still writing, dies of SIGPIPE, which
# pipefail makes the pipeline's status - a large binary read as not sanitized)
SANITIZED=0
if ldd "$BIN" 2>/dev/null | grep -c 'libasan\|libtsan' >/dev/null ||
    nm "$BIN" 2>/dev/null | grep -c __asan_init >/dev/null; then
    SANITIZED=1
fi
# the drain must finish every open stream (up to 64 of 400 tokens): under ASan, whose steps are
# several times slower, 10 s ran out for 3 of 56 once in a fresh-clone CI
DRAIN_SECONDS=${DRAIN_SECONDS:-$([ "$SANITIZED" = 1 ] && echo 30 || echo 10)}

WORK=$(mktemp -d /tmp/shardlm-faults.XXXXXX)
export SHARDLM_RUNTIME_DIR=/dev/shm/shardlm-faults-$$
SRV=""
BG=()

cleanup() {
    set +e
    for p in "${BG[@]}"; do kill "$p" 2>/dev/null; done
    kill_server "$SRV"
    wait 2>/dev/null
    rm -rf "$SHARDLM_RUNTIME_DIR"
    if [ "${FAULTS_KEEP:-0}" = 1 ]; then echo "work folder: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

nfds() { ls "/proc/$SRV/fd" 2>/dev/null | wc -l; }
metric() { curl -s -m 5 "$URL/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
post() { # post BODY_FILE [curl options]: prints the status (000: no answer)
    local f=$1
    shift
    curl -s -o "$WORK/post.out" -w '%{http_code}' -m 10 -H 'Content-Type: application/json' \
        --data-binary @"$f" "$@" "$URL/v1/completions" || true
}

# ---- 1. faults under load ----
start_server "$WORK/server.log" --max-waiting 40 --drain-seconds "$DRAIN_SECONDS"
FD0=$(nfds)
echo "server $SRV on $URL, $FD0 fds; load for ${LOAD_SECONDS} s"
node "$HERE/loadgen.mjs" --url "$URL" --clients 64 --requests 1000000 --duration "$LOAD_SECONDS" \
    --max-tokens 32 --pid "$SRV" --json --timeout 60 >"$WORK/load1.json" 2>"$WORK/load1.err" &
LG=$!
BG+=("$LG")
sleep 2

# the misbehaving clients
node "$HERE/badclient.mjs" trickle --port "$PORT" --interval-ms 1000 --cap-s "$TRICKLE_CAP_S" \
    >"$WORK/trickle.json" 2>&1 &
TR=$!
BG+=("$TR")
node "$HERE/badclient.mjs" noread --port "$PORT" --hold-s 15 --max-tokens 480 --logprobs 20 \
    --pipeline 4 >"$WORK/noread.json" 2>&1 &
NR=$!
BG+=("$NR")

printf '{"prompt": "Once upon", "max_tokens": 8' >"$WORK/malformed.json"
s=$(post "$WORK/malformed.json")
check malformed-json "$([ "$s" = 400 ] && echo 1)" "status $s (expected 400)"
printf '{"prompt": "Once \xff\xfe upon", "max_tokens": 8}' >"$WORK/utf8.json"
s=$(post "$WORK/utf8.json")
check invalid-utf8 "$([ "$s" = 400 ] && echo 1)" "status $s (expected 400)"
printf '{"prompt": "Once \xc0\xaf upon \xed\xa0\x80", "max_tokens": 8}' >"$WORK/utf8b.json"
s=$(post "$WORK/utf8b.json")
check invalid-utf8-overlong-surrogate "$([ "$s" = 400 ] && echo 1)" "status $s (expected 400)"
printf '{"prompt": "Once \\ud800 upon", "max_tokens": 8}' >"$WORK/surrogate.json"
s=$(post "$WORK/surrogate.json")
check lone-surrogate-escape "$([ "$s" = 400 ] && echo 1)" "status $s (expected 400)"
{ printf '{"prompt": "'; head -c $((10 * 1024 * 1024)) /dev/zero | tr '\0' a; printf '"}'; } \
    >"$WORK/big.json"
s=$(post "$WORK/big.json" -H 'Expect:')
check body-10mb "$([ "$s" = 413 ] && echo 1)" "status $s (expected 413)"
node "$HERE/badclient.mjs" bigbody --port "$PORT" --mb 10 --chunked >"$WORK/bigchunked.json"
s=$(jget "$WORK/bigchunked.json" j.status)
check body-10mb-chunked "$([ "$s" = 413 ] && echo 1)" "status $s (expected 413)"

# SIGKILL a worker, twice: the engine starts it again and re-runs the step
kill_worker() { # kill_worker N: under load (a dead worker is found at the next step)
    local w n
    if ! kill -0 "$LG" 2>/dev/null; then
        check "worker-kill-$1" 0 "the load ended before the kill (LOAD_SECONDS=$LOAD_SECONDS too short)"
        return
    fi
    w=$(pgrep -P "$SRV" -x shardlm-worker | head -n1 || true)
    if [ -z "$w" ]; then
        check "worker-kill-$1" 0 "no shardlm-worker child of $SRV"
        return
    fi
    kill -KILL "$w"
    n=""
    for _ in $(seq 100); do
        n=$(pgrep -P "$SRV" -x shardlm-worker | grep -vx "$w" | head -n1 || true)
        [ -n "$n" ] && break
        sleep 0.1
    done
    if [ -n "$n" ]; then
        check "worker-kill-$1" 1 "worker $w killed, restarted as $n"
    else
        check "worker-kill-$1" 0 "worker $w killed, not restarted within 10 s"
        ps -o pid,ppid,stat,etimes,comm --ppid "$SRV" || true
    fi
}
sleep 2
kill_worker 1

# served while the trickler and the non-reader hold their connections
sleep 6
s=000
for _ in $(seq 50); do # the load keeps the queue nearly full: a 429 is tried again
    s=$(curl -s -o "$WORK/probe.json" -w '%{http_code}' -m 5 "$URL/v1/completions" \
        -d '{"prompt": "Once upon a time", "max_tokens": 8}' || true)
    [ "$s" = 200 ] && break
    sleep 0.1
done
check served-during-bad-clients "$([ "$s" = 200 ] && grep -q '"text"' "$WORK/probe.json" && echo 1)" \
    "a completion got status $s (trickler and non-reader connected; 429s tried again for up to 5 s)"
# server sockets with over 100 kB unsent: the non-reader's, once its stream has filled its
# receive window (under load its request may wait its turn or retry a 429 first: look for up to
# 8 s of its 15 s hold, not once)
sendq() { ss -tnH state established "( sport = :$PORT )" | awk '$2 + 0 > 100000 { n++ } END { print n + 0 }'; }
for _ in $(seq 40); do
    SENDQ=$(sendq)
    [ "$SENDQ" -ge 1 ] && break
    sleep 0.2
done
kill_worker 2

wait "$NR" || true
for _ in $(seq 100); do # its socket released: polled for up to 10 s, not read once after a sleep
    SENDQ2=$(sendq)
    [ "$SENDQ2" = 0 ] && break
    sleep 0.1
done
NRS=$(jget "$WORK/noread.json" j.status)
check noread-released "$([ "$NRS" = 200 ] && [ "$SENDQ" -ge 1 ] && [ "$SENDQ2" = 0 ] && echo 1)" \
    "non-reader: status $NRS, $SENDQ server socket(s) with over 100 kB unsent while it held, $SENDQ2 after it closed (expected 200, at least 1, 0)"

wait "$LG" || true
if [ ! -s "$WORK/load1.json" ]; then
    check load 0 "the load generator printed nothing: $(cat "$WORK/load1.err")"
else
    L=$WORK/load1.json
    check load-no-errors "$([ "$(jget "$L" j.errors)" = 0 ] && echo 1)" \
        "$(jget "$L" '`${j.requests} requests: ok ${j.ok}, 429 ${j.status_429}, errors ${j.errors} (sent again after a kept-alive socket closed under them: ${j.stale_socket_retries}); ${j.tokens_per_s} tokens/s; TTFT p50/p99 ${j.ttft_ms_p50}/${j.ttft_ms_p99} ms; ITL p50/p99 ${j.itl_ms_p50}/${j.itl_ms_p99} ms`')"
    if [ "$(jget "$L" j.errors)" != 0 ]; then jget "$L" 'j.error_list.join("\n")' | head -n 10; fi
    check load-429s "$([ "$(jget "$L" j.status_429)" -gt 0 ] && echo 1)" \
        "$(jget "$L" j.status_429) requests refused with 429 (64 clients over --max-seqs 16 + --max-waiting 40)"
    check load-no-stall "$(jget "$L" '(j.max_stall_s !== null && j.max_stall_s < 5) ? 1 : 0')" \
        "longest time without a request ending well: $(jget "$L" j.max_stall_s) s (under 5 s)"
    rss="$(jget "$L" '`RSS start ${j.mem.rss_kb_start} kB, warm ${j.mem.rss_kb_warm} kB, end ${j.mem.rss_kb_end} kB, max ${j.mem.rss_kb_max} kB`')"
    if [ "$SANITIZED" = 1 ]; then # ASan's quarantine holds freed memory: RSS says nothing
        echo "info load-rss: $rss (a sanitizer build: not checked)"
    else
        check load-rss-flat "$(jget "$L" '(j.mem.rss_kb_end <= j.mem.rss_kb_warm * 1.25 + 4096) ? 1 : 0')" "$rss"
    fi
fi
wait "$TR" || true
T=$WORK/trickle.json
check trickled-header "$(jget "$T" '(j.closed && (j.status === 0 || (j.status >= 400 && j.status < 500))) ? 1 : 0')" \
    "$(jget "$T" '`${j.closed ? "closed" : "still open"} after ${j.after_s} s, ${j.bytes_sent} bytes sent, answer ${JSON.stringify(j.answer)} (${j.why})`') (expected a 4xx or a close within ${TRICKLE_CAP_S} s)"
# the server closes what the clients left as it notices: polled for up to 10 s (a slow host takes
# longer, a leak never comes back), not read once after a sleep
for _ in $(seq 100); do
    FD1=$(nfds)
    [ "$FD1" -le "$FD0" ] && break
    sleep 0.1
done
check fds-returned "$([ "$FD1" -le "$FD0" ] && echo 1)" \
    "server fds $FD1 after every client left (at start $FD0)"
for _ in $(seq 100); do
    RUN=$(metric shardlm_requests_running)
    WAIT=$(metric shardlm_requests_waiting)
    [ "$RUN" = 0 ] && [ "$WAIT" = 0 ] && break
    sleep 0.1
done
check idle-after-load "$([ "$RUN" = 0 ] && [ "$WAIT" = 0 ] && echo 1)" "running $RUN, waiting $WAIT"
R=$(grep -c 'restarted in' "$WORK/server.log" || true)
echo "info: server log has $R worker restart line(s)"

# ---- 2. SIGTERM under load: stop accepting, finish the streams, exit 0 ----
node "$HERE/loadgen.mjs" --url "$URL" --clients 64 --requests 1000000 --duration 60 \
    --max-tokens 400 --drain-ok --json --timeout 60 >"$WORK/load2.json" 2>"$WORK/load2.err" &
LG=$!
BG+=("$LG")
sleep 3
RUN=$(metric shardlm_requests_running)
WAIT=$(metric shardlm_requests_waiting)
OPEN=$((${RUN:-0} + ${WAIT:-0}))
T0=$(date +%s.%N)
kill -TERM "$SRV"
for _ in $(seq 50); do # until the server has seen the signal (up to 5 s; not once after 200 ms)
    h=$(curl -s -o /dev/null -w '%{http_code}' -m 5 "$URL/health" || true)
    [ "$h" != 200 ] && break
    sleep 0.1
done
p=$(curl -s -o /dev/null -w '%{http_code}' -m 5 "$URL/v1/completions" \
    -d '{"prompt": "Once", "max_tokens": 4}' || true)
check sigterm-refuses-new "$([[ $h =~ ^(503|000)$ && $p =~ ^(503|000)$ ]] && echo 1)" \
    "after SIGTERM with $OPEN requests open: /health $h, a completion $p (expected 503, or 000: refused)"
rc=0
for _ in $(seq $(((DRAIN_SECONDS + 10) * 10))); do
    kill -0 "$SRV" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$SRV" 2>/dev/null; then
    check sigterm-exit 0 "still running $((DRAIN_SECONDS + 10)) s after SIGTERM"
else
    wait "$SRV" || rc=$?
    DT=$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    check sigterm-exit "$([ "$rc" = 0 ] && echo 1)" "exit status $rc after ${DT} s (--drain-seconds $DRAIN_SECONDS)"
    SRV=""
fi
wait "$LG" || true
L=$WORK/load2.json
if [ ! -s "$L" ]; then
    check sigterm-streams 0 "the load generator printed nothing: $(cat "$WORK/load2.err")"
else
    check sigterm-streams-finish "$(jget "$L" '(j.errors === 0 && j.drained > 0) ? 1 : 0')" \
        "$(jget "$L" '`${j.requests} requests: ok ${j.ok} (each to [DONE]), refused while stopping ${j.drained}, errors ${j.errors}`')"
    if [ "$(jget "$L" j.errors)" != 0 ]; then jget "$L" 'j.error_list.join("\n")' | head -n 10; fi
fi
LEFT=$(pgrep -f "shardlm-worker.*$SHARDLM_RUNTIME_DIR" || true)
check no-processes-left "$([ -z "$LEFT" ] && echo 1)" "${LEFT:+workers left: $LEFT}${LEFT:-no worker left}"

if [ "$FAILS" -gt 0 ]; then
    echo "faults: $FAILS check(s) failed; server log:"
    tail -n 20 "$WORK/server.log"
    exit 1
fi
echo "faults: all checks passed"
