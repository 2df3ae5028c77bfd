#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shardlm serve against llama.cpp's (or ik_llama.cpp's) llama-server under the same load:
# tests/load/loadgen.mjs with 1, 4 and 16 streaming clients, the same prompts and max_tokens,
# the servers alternating per round; one JSON line per (round, server, clients) on stdout.
#   SHLM=model.shlm GGUF=model.gguf LLAMA_SERVER=path/llama-server PROMPTS=prompts.txt \
#     tests/load/side_by_side.sh > runs.jsonl
# Environment: ROUNDS (3), CLIENTS ("1 4 16"), MAXT (64), THREADS (2), SHARDLM (build/shardlm),
# LLAMA_ARGS (extra llama-server arguments, default "-rtr", ik_llama.cpp's run-time repack).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${SHLM:?a .shlm model}" "${GGUF:?the same model as GGUF}" "${LLAMA_SERVER:?llama-server}"
: "${PROMPTS:?a file of prompts, one a line}"
SHARDLM=${SHARDLM:-build/shardlm}
THREADS=${THREADS:-2}
export SHARDLM_RUNTIME_DIR=/dev/shm/shardlm-sbs-$$
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$SHARDLM_RUNTIME_DIR"' EXIT

wait_health() { for _ in $(seq 1200); do curl -sf "$1/health" >/dev/null && return 0; sleep 0.5; done; return 1; }
for round in $(seq "${ROUNDS:-3}"); do
  order="shardlm llama"
  [ $((round % 2)) = 0 ] && order="llama shardlm"
  for tool in $order; do
    port=$(( 20000 + RANDOM % 20000 ))
    if [ "$tool" = llama ]; then
      # shellcheck disable=SC2086 # LLAMA_ARGS is a list of arguments
      "$LLAMA_SERVER" -m "$GGUF" -np 16 -c 16384 -t "$THREADS" ${LLAMA_ARGS--rtr} --port "$port" \
        >/dev/null 2>&1 &
    else
      "$SHARDLM" serve -m "$SHLM" --max-seqs 16 --threads "$THREADS" --port "$port" >/dev/null 2>&1 &
    fi
    pid=$!
    wait_health "http://127.0.0.1:$port" || { echo "$tool did not start" >&2; exit 1; }
    curl -s "http://127.0.0.1:$port/v1/completions" -d '{"prompt": "Hi", "max_tokens": 8}' >/dev/null
    for c in ${CLIENTS:-1 4 16}; do
      n=$(( c < 4 ? 8 : 2 * c ))
      # one connection per request: llama-server resets reused ones
      node tests/load/loadgen.mjs --url "http://127.0.0.1:$port" --clients "$c" --requests "$n" \
        --max-tokens "${MAXT:-64}" --temperature 0 --prompt-file "$PROMPTS" --no-keepalive \
        --pid "$pid" --json --quiet --timeout 900 |
        python3 -c "import json,sys; j=json.load(sys.stdin); j.update(tool='$tool', clients=$c, round=$round); print(json.dumps(j))"
    done
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    pid=""
  done
done
