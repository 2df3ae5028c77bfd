#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Two hosts behind HAProxy: tests/deploy/test_multihost.sh SHARDLM_BINARY MODEL.shlm
#
# Three network namespaces of its own: h1 and h2 each run `shardlm serve` on MODEL (10.231.1.2
# and 10.231.1.6, port 8080), lb runs HAProxy with deploy/multihost/haproxy.cfg as it is (its
# environment variables point it at h1 and h2 and make the health checks fast), and curl asks
# from lb. Every address is inside these namespaces, so runs and the machine's own network
# cannot clash. It shows:
#   spread      requests without a conversation key go to both hosts (X-Served-By names the host)
#   failover    h1 SIGKILLed: once HAProxy marks it down every request succeeds on h2 (failures
#               before that are counted, and tolerated only then)
#   rejoin      h1 started again: HAProxy marks it up and it gets requests again
#   sticky      a conversation (X-Conversation-Id, or else the body's "user") stays on one host
#               across many requests, chat and completions alike, while conversations use both
#   drain       h1 upgraded: drained through HAProxy's runtime API, SIGTERMed, started again,
#               set ready: no request fails, and it gets its requests and conversations back
#   none-up     both hosts stopped: HAProxy's 503 is an OpenAI error object
#   stream      a stream's events pass HAProxy one by one (option http-no-delay), as they pass
#               from h1 straight (h1 alone, started again with slow steps)
# Prints PASS/FAIL per check; exits 1 on any FAIL. Needs root, `ip netns`, haproxy and curl:
# without them it fails, it does not skip. About 9 s. MULTIHOST_KEEP=1 keeps the work folder.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/script_lib.sh
. "$HERE/../script_lib.sh"
script_args "$@"
CFG=$HERE/../../deploy/multihost/haproxy.cfg

# what it needs is installed by deploy/bootstrap.sh: a missing tool fails the test, never skips it
for t in ip haproxy curl; do
    command -v "$t" >/dev/null ||
        { echo "FAIL: $t is not installed (deploy/bootstrap.sh installs it)"; exit 1; }
done
[ "$(id -u)" = 0 ] ||
    { echo "FAIL: needs root, to make network namespaces (ip netns add) and veth pairs"; exit 1; }
[ -f "$MODEL" ] || { echo "FAIL: $MODEL is missing (the serve_model test makes it)"; exit 1; }
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable"; exit 1; }
SHARDLM_HOST1=10.0.0.1:8080 SHARDLM_HOST2=10.0.0.2:8080 haproxy -c -q -f "$CFG" ||
    { echo "FAIL: haproxy -c rejects $CFG"; exit 1; }
haproxy -c -q -f "$CFG" 2>/dev/null &&
    { echo "FAIL: haproxy -c accepts $CFG with no SHARDLM_HOST1/2 (it must not route to a default)"; exit 1; }
# namespaces a killed run left (no trap runs on SIGKILL): those of pids that are gone
for ns in $(ip netns list 2>/dev/null | grep -o '^shardlm-mh-[0-9]*-[a-z0-9]*'); do
    pid=${ns#shardlm-mh-}
    pid=${pid%%-*}
    kill -0 "$pid" 2>/dev/null || ip netns del "$ns" 2>/dev/null || true
done
for d in /dev/shm/shardlm-mh-*; do
    pid=${d#/dev/shm/shardlm-mh-}
    pid=${pid%%-*}
    [ -d "$d" ] && ! kill -0 "$pid" 2>/dev/null && rm -rf "$d"
done

WORK=$(mktemp -d /tmp/shardlm-multihost.XXXXXX)
NS_LB=shardlm-mh-$$-lb
NS=("" "shardlm-mh-$$-h1" "shardlm-mh-$$-h2")
ADDR=("" 10.231.1.2 10.231.1.6)
RT=("" "/dev/shm/shardlm-mh-$$-h1" "/dev/shm/shardlm-mh-$$-h2")
SRV=("" "" "")
MADE=()

cleanup() {
    set +e
    local ns p
    # every process in the namespaces is this run's: the servers, their workers, HAProxy (in
    # braces, so that bash's "Killed" lines go with the rest)
    {
        for ns in "${MADE[@]}"; do
            for p in $(ip netns pids "$ns"); do kill -KILL "$p"; done
        done
        wait
    } 2>/dev/null
    for ns in "${MADE[@]}"; do ip netns del "$ns"; done # their veths go with them
    rm -rf "${RT[1]}" "${RT[2]}"
    if [ "${MULTIHOST_KEEP:-0}" = 1 ]; then echo "work folder: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM # cleanup runs on these too

lb() { ip netns exec "$NS_LB" "$@"; }
hacli() { # hacli COMMAND: HAProxy's runtime API, on a TCP socket in lb for this test
    lb bash -c 'exec 3<>/dev/tcp/127.0.0.1/9999 && printf "%s\n" "$1" >&3 && cat <&3' _ "$1" \
        2>/dev/null || true
}
state() { # state HOST: what HAProxy's check says of it in backend shardlm (UP, DOWN, DRAIN...)
    hacli "show stat" | awk -F, -v s="$1" '$1 == "shardlm" && $2 == s { print $18 }'
}
wait_state() { # wait_state HOST STATE SECONDS: 0 once HAProxy shows it
    local i
    for i in $(seq $(($3 * 20))); do
        [ "$(state "$1")" = "$2" ] && return 0
        sleep 0.05
    done
    return 1
}
ask() { # ask PATH BODY [curl options]: prints "STATUS HOST" (HOST "-" when none said)
    local path=$1 body=$2 out
    shift 2
    out=$(lb curl -s -o "$WORK/ask.out" -m 20 -w '%{http_code} %header{x-served-by}' \
        -H 'Content-Type: application/json' --data-binary "$body" "$@" \
        "http://127.0.0.1:8080$path" || true)
    read -r st host <<<"$out" || true
    echo "${st:-000} ${host:--}"
}
COMPLETION='{"prompt": "Once upon a time", "max_tokens": 4}'

# ---- the namespaces: lb <-> h1 on 10.231.1.0/30, lb <-> h2 on 10.231.1.4/30 ----
if ! err=$(ip netns add "$NS_LB" 2>&1); then
    echo "FAIL: ip netns add: $err (needs CAP_SYS_ADMIN and a kernel with network namespaces)"
    exit 1
fi
MADE+=("$NS_LB")
ip -n "$NS_LB" link set lo up
for h in 1 2; do
    ip netns add "${NS[h]}"
    MADE+=("${NS[h]}")
    ip -n "${NS[h]}" link set lo up
    ip -n "$NS_LB" link add "to-h$h" type veth peer name eth0 netns "${NS[h]}"
    ip -n "$NS_LB" addr add "10.231.1.$((h * 4 - 3))/30" dev "to-h$h"
    ip -n "$NS_LB" link set "to-h$h" up
    ip -n "${NS[h]}" addr add "${ADDR[h]}/30" dev eth0
    ip -n "${NS[h]}" link set eth0 up
done

# ---- the servers: one worker of one thread each, so two fit on two cores ----
printf '%s' "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}" \
    >"$WORK/chat.jinja"
start_host() { # start_host N: starts serve in hN, returns once it serves
    local h=$1 i
    [ -d "${RT[h]}" ] || mkdir -m 700 "${RT[h]}"
    ip netns exec "${NS[h]}" env SHARDLM_RUNTIME_DIR="${RT[h]}" "$BIN" serve -m "$MODEL" \
        --host "${ADDR[h]}" --port 8080 --workers 1 --threads 1 --drain-seconds 5 \
        --chat-template "$WORK/chat.jinja" >>"$WORK/h$h.log" 2>&1 &
    SRV[h]=$!
    for i in $(seq 300); do
        grep -q 'shardlm: serving' "$WORK/h$h.log" && return 0
        kill -0 "${SRV[h]}" 2>/dev/null || break
        sleep 0.1
    done
    echo "FAIL start: the server in ${NS[h]} did not start serving within 30 s:"
    cat "$WORK/h$h.log"
    exit 1
}
start_host 1
start_host 2

# ---- HAProxy in lb, checks every 200 ms, down after 2 failures, up after 2 passes ----
SHARDLM_BIND=127.0.0.1:8080 SHARDLM_STATS_BIND=127.0.0.1:8404 \
    SHARDLM_ADMIN_SOCKET=ipv4@127.0.0.1:9999 SHARDLM_LOG=stderr \
    SHARDLM_HOST1=${ADDR[1]}:8080 SHARDLM_HOST2=${ADDR[2]}:8080 \
    SHARDLM_CHECK_INTER=200ms SHARDLM_CHECK_FALL=2 SHARDLM_CHECK_RISE=2 \
    ip netns exec "$NS_LB" haproxy -db -f "$CFG" >"$WORK/haproxy.log" 2>&1 &
if ! wait_state h1 UP 10 || ! wait_state h2 UP 10; then
    echo "FAIL start: HAProxy does not show both hosts up within 10 s (h1 $(state h1), h2 $(state h2)):"
    tail -n 20 "$WORK/haproxy.log"
    exit 1
fi
echo "hosts ${ADDR[1]} and ${ADDR[2]} serving; HAProxy shows both UP"

spread() { # spread N: N requests without a key; prints "h1:A h2:B failed:C" (A, B: 200s)
    local i st host a=0 b=0 o=0
    for i in $(seq "$1"); do
        read -r st host <<<"$(ask /v1/completions "$COMPLETION")"
        case "$st $host" in
        "200 h1") a=$((a + 1)) ;;
        "200 h2") b=$((b + 1)) ;;
        *) o=$((o + 1)) ;;
        esac
    done
    echo "h1:$a h2:$b failed:$o"
}

# ---- spread: least connections over both hosts ----
r=$(spread 20)
check spread "$([[ $r =~ ^h1:([1-9][0-9]*)\ h2:([1-9][0-9]*)\ failed:0$ ]] && echo 1)" \
    "20 requests without a key: $r (expected both hosts, no failure)"
s=$(lb curl -s -m 5 http://127.0.0.1:8404/metrics | grep -c '^haproxy_server_check_status' || true)
check metrics "$([ "$s" -gt 0 ] && echo 1)" \
    "the stats port's /metrics has $s haproxy_server_check_status series (Prometheus)"
m=$(lb curl -s -o /dev/null -w '%{http_code}' -m 5 http://127.0.0.1:8080/metrics || true)
check metrics-private "$([ "$m" = 404 ] && echo 1)" \
    "GET /metrics through the public address: $m (expected 404: Prometheus scrapes the hosts)"

# ---- failover: SIGKILL h1's server, ask until HAProxy has marked it down and 12 more ----
# (every other request names a conversation, chat-1 to chat-6: those on h1 must move too)
{ kill -KILL "${SRV[1]}" && wait "${SRV[1]}"; } 2>/dev/null || true
T0=$(date +%s%N)
n=0 before=0 before_bad=0 after=0 after_bad=0 down_ms=""
while [ "$after" -lt 12 ] && [ $(($(date +%s%N) - T0)) -lt 10000000000 ]; do
    n=$((n + 1))
    key=()
    [ $((n % 2)) = 0 ] && key=(-H "X-Conversation-Id: chat-$((n / 2 % 6 + 1))")
    down=$([ "$(state h1)" = DOWN ] && echo 1 || echo 0) # read before the request leaves
    read -r st host <<<"$(ask /v1/completions "$COMPLETION" "${key[@]}")"
    if [ "$down" = 1 ]; then
        [ -n "$down_ms" ] || down_ms=$((($(date +%s%N) - T0) / 1000000))
        after=$((after + 1))
        [ "$st $host" = "200 h2" ] || { after_bad=$((after_bad + 1)); echo "  after: $st $host"; }
    else
        before=$((before + 1))
        [ "$st" = 200 ] || before_bad=$((before_bad + 1))
    fi
done
check failover "$([ "$after" = 12 ] && [ "$after_bad" = 0 ] && echo 1)" \
    "h1 SIGKILLed; marked DOWN within ${down_ms:-?} ms; $before request(s) before that ($before_bad failed, tolerated), $after after ($after_bad not a 200 from h2)"

# ---- rejoin: start h1 again (its weights are still in its runtime dir) ----
T0=$(date +%s%N)
start_host 1
if wait_state h1 UP 10; then
    check rejoin-up 1 "h1 started again, UP in $((($(date +%s%N) - T0) / 1000000)) ms"
else
    check rejoin-up 0 "h1 started again, HAProxy says '$(state h1)' after 10 s"
fi
r=$(spread 20)
check rejoin-spread "$([[ $r =~ ^h1:([1-9][0-9]*)\ h2:([1-9][0-9]*)\ failed:0$ ]] && echo 1)" \
    "20 requests without a key after the rejoin: $r (expected both hosts)"

# ---- sticky: 6 conversations x 8 requests, by header, then by the body's "user" ----
declare -A HOME_OF
sticky() { # sticky KIND: KIND header or user; checks and fills HOME_OF[KIND-i]
    local kind=$1 i j st host hosts used="" bad=0 path body opt
    for i in 1 2 3 4 5 6; do
        hosts=""
        for j in $(seq 8); do
            path=/v1/completions body=$COMPLETION opt=()
            if [ "$kind" = header ]; then
                opt=(-H "X-Conversation-Id: chat-$i")
            elif [ $((j % 2)) = 0 ]; then # one conversation over both endpoints
                path=/v1/chat/completions
                body='{"messages": [{"role": "user", "content": "Once upon"}], "max_tokens": 4, "user": "user-'$i'"}'
            else
                body='{"prompt": "Once upon a time", "max_tokens": 4, "user": "user-'$i'"}'
            fi
            read -r st host <<<"$(ask "$path" "$body" "${opt[@]}")"
            [ "$st" = 200 ] || bad=$((bad + 1))
            [[ " $hosts " == *" $host "* ]] || hosts="$hosts $host"
        done
        hosts=${hosts# }
        HOME_OF[$kind-$i]=$hosts
        used="$used $kind-$i:$hosts"
    done
    local one=1 h1=0 h2=0
    for i in 1 2 3 4 5 6; do
        case "${HOME_OF[$kind-$i]}" in
        h1) h1=$((h1 + 1)) ;;
        h2) h2=$((h2 + 1)) ;;
        *) one=0 ;;
        esac
    done
    check "sticky-$kind" "$([ "$one" = 1 ] && [ "$h1" -gt 0 ] && [ "$h2" -gt 0 ] && [ "$bad" = 0 ] && echo 1)" \
        "6 conversations x 8 requests by $kind, the host(s) each went to:$used ($bad not 200; expected one host each, both hosts used)"
}
sticky header
sticky user

# the header wins over the body's user; a body past the default 16 kB buffer keeps its user
other=h1
[ "${HOME_OF[user-1]}" = h1 ] && other=h2
for i in 1 2 3 4 5 6; do
    [ "${HOME_OF[header-$i]}" = "$other" ] && break
done
read -r st host <<<"$(ask /v1/completions '{"prompt": "Once", "max_tokens": 4, "user": "user-1"}' \
    -H "X-Conversation-Id: chat-$i")"
check sticky-header-first "$([ "$host" = "${HOME_OF[header-$i]}" ] && [ "$host" != "${HOME_OF[user-1]}" ] && echo 1)" \
    "header chat-$i (on ${HOME_OF[header-$i]}) with user user-1 (on ${HOME_OF[user-1]}): went to $host"
pad=$(head -c 40000 /dev/zero | tr '\0' a)
big="{\"prompt\": \"Once\", \"max_tokens\": 4, \"metadata\": {\"pad\": \"$pad\"}, \"user\": \"user-1\"}"
r=""
for i in 1 2 3 4; do
    read -r st host <<<"$(ask /v1/completions "$big")"
    r="$r $st:$host"
done
check sticky-user-40kb "$([ "$r" = "$(printf " 200:%s" "${HOME_OF[user-1]}"{,,,})" ] && echo 1)" \
    "4 bodies of 40 kB with user user-1 last:$r (expected each 200 from ${HOME_OF[user-1]})"

# ---- drain: an upgrade of h1, as an operator does it through HAProxy's runtime API ----
hacli "set server shardlm/h1 state drain" >/dev/null
for i in 1 2 3 4 5 6; do
    [ "${HOME_OF[header-$i]}" = h1 ] && break
done
r=$(spread 10)
read -r st host <<<"$(ask /v1/completions "$COMPLETION" -H "X-Conversation-Id: chat-$i")"
check drain-admin "$([ "$r" = "h1:0 h2:10 failed:0" ] && [ "$st $host" = "200 h2" ] && echo 1)" \
    "h1 set to drain: 10 requests without a key $r; conversation chat-$i (on h1) now $st from $host"
kill -TERM "${SRV[1]}"
rc=0
wait "${SRV[1]}" || rc=$?
wait_state h1 DOWN 5 || true
s1=$(state h1)
r=$(spread 5)
check drain-sigterm "$([ "$rc" = 0 ] && [ "$r" = "h1:0 h2:5 failed:0" ] && echo 1)" \
    "h1 SIGTERMed: exit status $rc, HAProxy says $s1; 5 more requests $r"
start_host 1
wait_state h1 DRAIN 10 || true
s1=$(state h1)
r=$(spread 4)
hacli "set server shardlm/h1 state ready" >/dev/null
r2=$(spread 10)
read -r st host <<<"$(ask /v1/completions "$COMPLETION" -H "X-Conversation-Id: chat-$i")"
check drain-ready "$([ "$s1" = DRAIN ] && [ "$r" = "h1:0 h2:4 failed:0" ] && [[ $r2 =~ ^h1:[1-9][0-9]*\ h2:[1-9][0-9]*\ failed:0$ ]] && [ "$st $host" = "200 h1" ] && echo 1)" \
    "h1 started again: HAProxy says $s1, 4 requests $r; set ready: 10 requests $r2, chat-$i $st from $host"

# ---- none-up: both stopped; HAProxy answers 503 itself, in OpenAI's error format ----
kill -TERM "${SRV[1]}" "${SRV[2]}"
rc=0
wait "${SRV[1]}" || rc=$?
wait "${SRV[2]}" || rc=$((rc + $?))
{ wait_state h1 DOWN 5 && wait_state h2 DOWN 5; } || true
st=$(lb curl -s -o "$WORK/ask.out" -D "$WORK/ask.hdr" -m 20 -w '%{http_code}' \
    --data-binary "$COMPLETION" http://127.0.0.1:8080/v1/completions || true)
body=$(cat "$WORK/ask.out")
ra=$(tr -d '\r' <"$WORK/ask.hdr" | awk -F': ' 'tolower($1) == "retry-after" { print $2 }')
check none-up "$([ "$rc" = 0 ] && [ "$st" = 503 ] && [ "$ra" = 5 ] && [[ $body == *'"type":"unavailable_error"'* ]] && echo 1)" \
    "both hosts SIGTERMed (exit status $rc): status $st, Retry-After ${ra:-none}, body $body"

# ---- stream: server-sent events pass HAProxy as they come, not held back or gathered ----
# h1 alone, started again with every step slowed to 25 ms (the worker's SHARDLM_FAULT hook), so
# that its events leave at least 25 ms apart however fast the host is. One stream through HAProxy
# and one straight to h1 run together, in the same steps, read by one loop that notes when each
# read came: the straight one is the yardstick of what this host's reader can tell apart.
# Without `option http-no-delay` HAProxy sends with MSG_MORE and the kernel holds events up to
# 200 ms: they come in bursts of about 8, in a quarter of the straight stream's reads or fewer;
# a proxy that buffers the response brings every event at the end, at once.
STEP_MS=25 NTOK=40
SHARDLM_FAULT=step_delay_ms=$STEP_MS start_host 1
wait_state h1 UP 10 || true
out=$(lb python3 -c '
import json, selectors, socket, sys, time
ntok = int(sys.argv[1])
body = json.dumps({"prompt": "Once upon a time", "max_tokens": ntok, "ignore_eos": True,
                   "stream": True}).encode()
req = (b"POST /v1/completions HTTP/1.1\r\nHost: lb\r\nContent-Type: application/json\r\n"
       b"Content-Length: %d\r\n\r\n" % len(body) + body)
sel = selectors.DefaultSelector()
got = {}
for name, addr in (("haproxy", ("127.0.0.1", 8080)), ("direct", (sys.argv[2], 8080))):
    s = socket.create_connection(addr, timeout=20)
    s.sendall(req)
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ, name)
    got[name] = [b"", []]  # the bytes, and (time, events) of each read that brought events
end = time.monotonic() + 30
while sel.get_map() and time.monotonic() < end:
    for key, _ in sel.select(1):
        d = key.fileobj.recv(65536)
        g = got[key.data]
        if d:
            g[0] += d
            if d.count(b"data: {"):
                g[1].append((time.monotonic(), d.count(b"data: {")))
        if not d or b"[DONE]" in g[0]:
            sel.unregister(key.fileobj)
            key.fileobj.close()
for name in ("haproxy", "direct"):
    b, r = got[name]
    span = int((r[-1][0] - r[0][0]) * 1000) if r else -1
    print(name, b.count(b"data: {"), len(r), max((n for _, n in r), default=0), span)
' "$NTOK" "${ADDR[1]}" || true)
read -r _ hev hreads hburst hspan _ dev dreads _ _ <<<"${out//$'\n'/ }"
# events: the tokens and the finish; span: from the first event's read to the last one's (the
# steps alone take NTOK x STEP_MS = 1000 ms); reads: at least half the straight stream's
check stream "$([ "${hev:-0}" -gt "$NTOK" ] && [ "${dev:-0}" = "$hev" ] &&
    [ "${hspan:--1}" -ge $((NTOK * STEP_MS / 2)) ] && [ $((2 * ${hreads:-0})) -ge "${dreads:-1}" ] && echo 1)" \
    "a $NTOK-token stream of ${STEP_MS} ms steps through HAProxy: ${hev:-?} events in ${hreads:-?} reads (at most ${hburst:-?} in one), the first ${hspan:-?} ms before the last; straight to h1 at the same time: ${dev:-?} events in ${dreads:-?} reads (expected >= half as many reads through HAProxy, and >= $((NTOK * STEP_MS / 2)) ms from first to last)"

{ kill -TERM "${SRV[1]}" && wait "${SRV[1]}"; } 2>/dev/null || true

if [ "$FAILS" -gt 0 ]; then
    echo "multihost: $FAILS check(s) failed; HAProxy's log:"
    tail -n 30 "$WORK/haproxy.log"
    exit 1
fi
echo "multihost: all checks passed"
