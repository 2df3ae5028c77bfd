#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The two ways to run one model on one host, side by side (docs/deploy.md, "NUMA topologies"):
#   tp: one `shardlm serve`, one tensor-parallel worker per CPU set (--workers N --cpus A:B)
#   dp: N independent `shardlm serve` replicas, one per CPU set, behind HAProxy
#       (deploy/multihost/haproxy.cfg on loopback: least connections)
# Each round starts one topology, warms it, and runs tests/load/loadgen.mjs at 1 client
# (latency) and at CLIENTS clients (throughput), then the other, interleaved; prints every run
# and the medians. A benchmark, not a test: needs root (HAProxy's chroot), haproxy, node, curl.
#
#   tests/load/topology.sh SHARDLM MODEL.shlm [ROUNDS (3)]
#   environment: CPUSETS (default "0:1": one CPU set per worker or replica, ':'-separated),
#                CLIENTS (16), REQUESTS (64), MAX_TOKENS (64), THREADS (1 per worker)
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 SHARDLM MODEL.shlm [ROUNDS]" >&2; exit 2; }
BIN=$(realpath "$1") MODEL=$(realpath "$2") ROUNDS=${3:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
CFG=$HERE/../../deploy/multihost/haproxy.cfg
CPUSETS=${CPUSETS:-0:1} CLIENTS=${CLIENTS:-16} REQUESTS=${REQUESTS:-64} MAX_TOKENS=${MAX_TOKENS:-64}
THREADS=${THREADS:-1}
IFS=: read -r -a sets <<<"$CPUSETS"
n=${#sets[@]}
WORK=$(mktemp -d /tmp/shardlm-topology.XXXXXX)
export SHARDLM_RUNTIME_DIR=/dev/shm/shardlm-topology-$$
mkdir -m 700 "$SHARDLM_RUNTIME_DIR"
PIDS=()
stop_all() {
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    PIDS=()
}
trap 'stop_all; rm -rf "$WORK" "$SHARDLM_RUNTIME_DIR"' EXIT

wait_health() { # wait_health PORT
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
        sleep 0.1
    done
    echo "topology: port $1 did not come up" >&2
    exit 1
}
serve() { # serve PORT OPTIONS...: one server in the background
    local port=$1
    shift
    "$BIN" serve -m "$MODEL" --port "$port" --threads "$THREADS" "$@" 2>>"$WORK/serve.log" &
    PIDS+=($!)
}
start() { # start tp|dp: the front answers on port 18600
    if [ "$1" = tp ]; then
        serve 18600 --workers "$n" --cpus "$CPUSETS"
        wait_health 18600
    else
        local env=(SHARDLM_BIND=127.0.0.1:18600 SHARDLM_STATS_BIND=127.0.0.1:18699
                   SHARDLM_ADMIN_SOCKET="$WORK/haproxy.sock" SHARDLM_LOG=stderr
                   SHARDLM_CHECK_INTER=200ms)
        for i in $(seq "$n"); do
            serve $((18600 + i)) --workers 1 --cpus "${sets[i - 1]}"
            env+=("SHARDLM_HOST$i=127.0.0.1:$((18600 + i))")
        done
        for i in $(seq "$n"); do wait_health $((18600 + i)); done
        [ "$n" -le 2 ] || { echo "topology: the HAProxy file lists 2 hosts; add lines for $n" >&2; exit 1; }
        env "${env[@]}" haproxy -db -f "$CFG" >>"$WORK/haproxy.log" 2>&1 &
        PIDS+=($!)
        wait_health 18600
        sleep 1 # every host checked UP
    fi
}
load() { # load CLIENTS REQUESTS: one loadgen run, its JSON
    node "$HERE/loadgen.mjs" --url http://127.0.0.1:18600 --clients "$1" --requests "$2" \
        --max-tokens "$MAX_TOKENS" --temperature 0 --json --quiet
}

echo "model $(basename "$MODEL"), CPU sets $CPUSETS, $THREADS thread(s) each; $CLIENTS clients x $REQUESTS requests, max_tokens $MAX_TOKENS"
for r in $(seq "$ROUNDS"); do
    for t in tp dp; do
        start "$t"
        load 4 8 >/dev/null # warm: the weights' pages, the prefetch modes
        load 1 6 > "$WORK/$t-1-$r.json"
        load "$CLIENTS" "$REQUESTS" > "$WORK/$t-n-$r.json"
        stop_all
        node -e '
            const a = JSON.parse(require("fs").readFileSync(process.argv[1]));
            const b = JSON.parse(require("fs").readFileSync(process.argv[2]));
            console.log(`round ${process.argv[3]} ${process.argv[4]}: 1 client ${a.tokens_per_s} tok/s, ` +
                `ttft p50 ${a.ttft_ms_p50} ms, itl p50 ${a.itl_ms_p50} ms; ${process.argv[5]} clients ` +
                `${b.tokens_per_s} tok/s, ttft p50 ${b.ttft_ms_p50} ms, itl p50 ${b.itl_ms_p50} ms, errors ${a.errors + b.errors}`);
        ' "$WORK/$t-1-$r.json" "$WORK/$t-n-$r.json" "$r" "$t" "$CLIENTS"
    done
done
node -e '
    const fs = require("fs"), [dir, rounds] = [process.argv[1], +process.argv[2]];
    const med = (v) => { v.sort((x, y) => x - y); return v[(v.length - 1) >> 1]; };
    for (const t of ["tp", "dp"]) {
        const get = (k, f) => med(Array.from({ length: rounds }, (_, i) =>
            JSON.parse(fs.readFileSync(`${dir}/${t}-${k}-${i + 1}.json`))[f]));
        console.log(`median ${t}: 1 client ${get(1, "tokens_per_s")} tok/s, itl p50 ${get(1, "itl_ms_p50")} ms, ` +
            `ttft p50 ${get(1, "ttft_ms_p50")} ms; many clients ${get("n", "tokens_per_s")} tok/s, ` +
            `ttft p50 ${get("n", "ttft_ms_p50")} ms, itl p50 ${get("n", "itl_ms_p50")} ms`);
    }
' "$WORK" "$ROUNDS"
