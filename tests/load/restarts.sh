#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Worker deaths under load for `shardlm serve`: tests/load/restarts.sh SHARDLM_BINARY MODEL.shlm
#
# 1. --restarts 3, 16 greedy streams of 480 tokens: the worker is SIGKILLed, then its
#    replacement as soon as it runs, then the next one 20 ms after it runs (3 deaths, the
#    budget): the server lives on, every stream ends with [DONE] and the text of a run without
#    faults, /health answers 200; SIGTERM then ends it with 0. Once with one worker, once with
#    two (rank 0's killed).
# 2. --restarts 0, 16 running streams (one of them not read until the end) and 4 requests
#    waiting behind them: one SIGKILL. Every stream gets an error event and then [DONE], every
#    plain request a 500, /health answers 503 ("failed") from the first error on, a new request
#    503; the server exits 1 with one line naming the death. The unread stream's answer does not
#    fit in its socket (its client, in python3, has small buffers), so that the server waits for
#    it and is still there when /health and the new request are sent (it must be).
# Neither leaves a process or a file in its runtime directory. Steps are slowed to 5 ms
# (SHARDLM_FAULT=step_delay_ms=5) so that the streams run for seconds; the kills are timed by
# what the clients have received (tests/load/killclient.mjs), not by sleeps.
# Prints PASS/FAIL per check; exits 1 on any FAIL (a missing tool or model included).
# Environment: RESTARTS_KEEP=1 keeps the work folder.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/script_lib.sh
. "$HERE/../script_lib.sh"
script_args "$@"
for t in node python3 curl pgrep; do
    command -v "$t" >/dev/null ||
        { echo "FAIL: $t is not installed (deploy/bootstrap.sh installs it)"; exit 1; }
done
[ -f "$MODEL" ] || { echo "FAIL: $MODEL is missing (deploy/bootstrap.sh makes it)"; exit 1; }
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable"; exit 1; }

WORK=$(mktemp -d /tmp/shardlm-restarts.XXXXXX)
export SHARDLM_RUNTIME_DIR=/dev/shm/shardlm-restarts-$$
export SHARDLM_FAULT=step_delay_ms=5
TOKENS=480 # stories260K's context is 512: the longest prompt of killclient.mjs and 480 fit
SRV=""

cleanup() {
    set +e
    kill_server "$SRV"
    wait 2>/dev/null
    rm -rf "$SHARDLM_RUNTIME_DIR"
    if [ "${RESTARTS_KEEP:-0}" = 1 ]; then echo "work folder: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT


wait_exit() { # wait_exit SECONDS: the server's exit status into RC (empty: still running)
    RC=""
    for _ in $(seq $(($1 * 10))); do
        kill -0 "$SRV" 2>/dev/null || break
        sleep 0.1
    done
    if ! kill -0 "$SRV" 2>/dev/null; then
        RC=0
        wait "$SRV" || RC=$?
        SRV=""
    fi
}

nothing_left() { # nothing_left NAME: no worker of ours runs, the runtime directory is empty
    local left files
    left=$(pgrep -f "shardlm-worker.*$SHARDLM_RUNTIME_DIR" || true)
    files=$(ls -A "$SHARDLM_RUNTIME_DIR" 2>/dev/null || true)
    check "$1" "$([ -z "$left" ] && [ -z "$files" ] && echo 1)" \
        "workers left: ${left:-none}; files left in the runtime directory: ${files:-none}"
}

# ---- 1. the worker and its replacements killed, within --restarts 3 ----
restart_case() { # restart_case NAME [server options]: the checks of case 1 under NAME-...
    local n=$1 log=$WORK/$1.log J=$WORK/$1.json D
    shift
    start_server "$log" --no-persist --restarts 3 "$@"
    echo "server $SRV on $URL (--restarts 3 $*)"
    node "$HERE/killclient.mjs" restart --url "$URL" --pid "$SRV" --clients 16 --max-tokens $TOKENS \
        --kill-after 50 --delays-ms 0,20 >"$J" 2>"$WORK/$n.err" || true
    if [ ! -s "$J" ] || [ "$(jget "$J" 'j.failed || ""')" != "" ]; then
        check "$n-clients" 0 "killclient: $(cat "$J" "$WORK/$n.err" 2>/dev/null)"
    else
        check "$n-reference" "$(jget "$J" "j.reference.every((c) => c.status === 200 && c.done && c.tokens === $TOKENS) ? 1 : 0")" \
            "a run without faults: 16 streams of $TOKENS tokens"
        check "$n-kills" "$(jget "$J" 'j.kills.length === 3 && j.kills.every((k) => k.killed !== false) && j.kills[0].open_streams === 16 ? 1 : 0')" \
            "$(jget "$J" 'j.kills.map((k) => `${k.what} ${k.pid} (${k.open_streams} streams open)`).join(", ")')"
        check "$n-streams-complete" "$(jget "$J" "j.clients.every((c) => c.status === 200 && c.done && !c.error_event && !c.fault && c.finish === 'length' && c.tokens === $TOKENS) ? 1 : 0")" \
            "$(jget "$J" "j.clients.filter((c) => c.status === 200 && c.done && !c.error_event && !c.fault && c.tokens === $TOKENS).length") of 16 streams ended with [DONE] after $TOKENS tokens; $(jget "$J" 'JSON.stringify(j.clients.find((c) => !(c.done && !c.error_event && !c.fault)) || null)')"
        check "$n-streams-same-text" "$(jget "$J" 'j.clients.every((c) => c.same_text) ? 1 : 0')" \
            "$(jget "$J" 'j.clients.filter((c) => c.same_text).length') of 16 texts equal to the run without faults"
        check "$n-server-lives" "$(jget "$J" 'j.health_after.status === 200 ? 1 : 0')" \
            "/health $(jget "$J" 'j.health_after.status') after the kills, workers $(jget "$J" 'j.workers_after.join(", ")')"
    fi
    D=$(grep -c 'was killed by signal 9.* during step' "$log" || true)
    check "$n-log" "$([ "$D" = 3 ] && grep -q 'restarted in' "$log" && echo 1)" \
        "$D death(s) during a step logged (expected 3, the last restart holding): $(grep -o 'during step.*' "$log" | cut -c1-150 | tr '\n' '|')"
    kill -TERM "$SRV" 2>/dev/null || true
    wait_exit 30
    check "$n-sigterm-exit" "$([ "$RC" = 0 ] && echo 1)" "exit status ${RC:-none: still running 30 s after SIGTERM}"
    nothing_left "$n-nothing-left"
}
restart_case restart
# the same with two workers: the survivor gives the step up and rejoins after each failed restart
restart_case restart-2w --workers 2 --threads 1

# ---- 2. --restarts 0: the engine is lost; every client hears of it ----
LOG2=$WORK/lost.log
start_server "$LOG2" --no-persist --restarts 0
echo "server $SRV on $URL (--restarts 0)"
node "$HERE/killclient.mjs" lost --url "$URL" --pid "$SRV" --clients 16 --waiting 4 \
    --max-tokens $TOKENS --kill-after 50 >"$WORK/lost.json" 2>"$WORK/lost.err" || true
wait_exit 20
J=$WORK/lost.json
WHY='killed by signal 9'
if [ ! -s "$J" ] || [ "$(jget "$J" 'j.failed || ""')" != "" ]; then
    check lost-clients 0 "killclient: $(cat "$J" "$WORK/lost.err" 2>/dev/null)"
else
    check lost-queue "$(jget "$J" 'j.running === 16 && j.waiting === 4 ? 1 : 0')" \
        "at the kill: $(jget "$J" 'j.running') running, $(jget "$J" 'j.waiting') waiting (expected 16 and 4)"
    ENDED="(c) => (c.status === 200 && c.error_event && c.error_event.includes('$WHY') && c.done && c.finish === 'error' && !c.fault && !c.after_done) || (c.status === 500 && c.body.includes('$WHY'))"
    check lost-every-client-told "$(jget "$J" "[j.unread, ...j.clients, ...j.queued].every($ENDED) ? 1 : 0")" \
        "$(jget "$J" "[j.unread, ...j.clients, ...j.queued].filter($ENDED).length") of 20 got an error event then [DONE], or a 500 ($(jget "$J" "[j.unread, ...j.clients, ...j.queued].filter((c) => c.status === 500).length") plain ones); $(jget "$J" "JSON.stringify([j.unread, ...j.clients, ...j.queued].find((c) => !($ENDED)(c)) || null)")"
    H=$(jget "$J" 'j.health.status')
    check lost-health "$(jget "$J" "j.health_200_after_error === 0 && j.health_503_after_error && j.health.status === 503 && JSON.parse(j.health.body).status === 'failed' && j.health.body.includes('$WHY') ? 1 : 0")" \
        "/health sent after a client had its error: $H $(jget "$J" 'j.health.body') ($(jget "$J" 'j.health_200_after_error') answers of 200 after a client had its error; expected 503 failed naming the death, 0: the server was gone)"
    check lost-new-request "$(jget "$J" "j.new_request.status === 503 && j.new_request.body.includes('the engine is lost') ? 1 : 0")" \
        "a completion sent after /health said 503: $(jget "$J" 'JSON.stringify(j.new_request)') (expected 503, the engine is lost)"
    check lost-server-waits "$(jget "$J" 'j.health_before_unread.status === 503 ? 1 : 0')" \
        "/health just before the unread stream was read (its socket held $(jget "$J" 'j.unread_held_bytes') bytes at the kill): $(jget "$J" 'j.health_before_unread.status') (expected 503: the server waits for it)"
fi
LAST=$(tail -n 1 "$LOG2")
check lost-exit "$([ -n "$RC" ] && [ "$RC" != 0 ] && [[ $LAST == "shardlm serve: worker rank 0 (pid "*"$WHY"*"no restarts left"* ]] && echo 1)" \
    "exit status ${RC:-none: still running 20 s after the kill}, last line: $LAST"
nothing_left lost-nothing-left

# ---- 3. a worker killed while the server is idle: restarted at once, or with --restarts 0
#         the engine lost at once (not at the next request, /health saying ok until then) ----
LOG3=$WORK/idle.log
start_server "$LOG3" --no-persist --restarts 1
W=$(pgrep -P "$SRV" | head -n 1)
kill -KILL "$W"
for _ in $(seq 100); do grep -q 'between steps; restarted in' "$LOG3" && break; sleep 0.1; done
H=$(curl -s -m 5 "$URL/health" || true)
T=$(curl -s -m 30 "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 8}' || true)
check idle-restarted "$(grep -q 'between steps; restarted in' "$LOG3" && [ "$H" = '{"status":"ok"}' ] &&
    [[ $T == *'"finish_reason":"length"'* ]] && echo 1)"     "log: $(grep 'worker rank' "$LOG3" | head -n 1); /health: $H; a completion: ${T:0:120}"
kill -TERM "$SRV"
wait_exit 30
check idle-restarted-exit "$([ "$RC" = 0 ] && echo 1)" "exit status ${RC:-none}"
start_server "$LOG3" --no-persist --restarts 0
W=$(pgrep -P "$SRV" | head -n 1)
kill -KILL "$W"
wait_exit 10
LAST=$(tail -n 1 "$LOG3")
check idle-lost-exit "$([ -n "$RC" ] && [ "$RC" != 0 ] && [[ $LAST == *"$WHY"*"no restarts left (0 between steps)" ]] && echo 1)" \
    "with --restarts 0, a worker killed while idle: exit status ${RC:-none: still running 10 s later}, last line: $LAST"
nothing_left idle-nothing-left

if [ "$FAILS" -gt 0 ]; then
    echo "restarts: $FAILS check(s) failed; server logs:"
    tail -n 12 "$WORK"/*.log
    exit 1
fi
echo "restarts: all checks passed"
