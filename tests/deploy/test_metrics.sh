#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# /metrics against Prometheus' own checker: tests/deploy/test_metrics.sh SHARDLM MODEL.shlm PROMTOOL
#
# Starts `shardlm serve`, sends a plain, a streamed, a chat and a refused request, and while a
# stream runs and after it, runs `promtool check metrics` on GET /metrics (any lint fails); every
# metric deploy/prometheus/shardlm.rules.yml reads must be served. Then the guide's scrape
# configuration and rules: `promtool check config` and `promtool test rules`. promtool comes from
# Debian's prometheus package, unpacked by deploy/bootstrap.sh (installing the package would start
# a Prometheus server). A missing tool fails the test, never skips it.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 SHARDLM MODEL.shlm PROMTOOL" >&2; exit 2; }
BIN=$(realpath -m "$1") MODEL=$(realpath -m "$2") PROMTOOL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
PROM=$HERE/../../deploy/prometheus
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$PROMTOOL" ] || fail "$PROMTOOL missing (deploy/bootstrap.sh unpacks promtool from Debian's prometheus)"
command -v curl >/dev/null || fail "curl is not installed (deploy/bootstrap.sh installs it)"
[ -f "$MODEL" ] || fail "$MODEL is missing"

WORK=$(mktemp -d /tmp/shardlm-metrics.XXXXXX)
export SHARDLM_RUNTIME_DIR=/dev/shm/shardlm-metrics-$$
mkdir -m 700 "$SHARDLM_RUNTIME_DIR"
SRV=""
cleanup() {
    set +e
    [ -n "$SRV" ] && kill -KILL "$SRV" 2>/dev/null && wait "$SRV" 2>/dev/null
    rm -rf "$SHARDLM_RUNTIME_DIR" "$WORK"
}
trap cleanup EXIT

"$BIN" serve -m "$MODEL" --port 0 --no-persist 2> "$WORK/serve.log" &
SRV=$!
port=""
for _ in $(seq 100); do
    port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$WORK/serve.log")
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 0.1
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || fail "the server did not come up: $(tail -2 "$WORK/serve.log")"
url=http://127.0.0.1:$port

lint() { # lint WHEN: promtool on one scrape
    curl -sf "$url/metrics" > "$WORK/metrics.txt" || fail "GET /metrics ($1)"
    if ! "$PROMTOOL" check metrics < "$WORK/metrics.txt" > "$WORK/lint.txt" 2>&1; then
        cat "$WORK/lint.txt"
        fail "promtool check metrics ($1)"
    fi
    echo "PASS promtool check metrics ($1): $(grep -c '^# TYPE' "$WORK/metrics.txt") metrics"
}
lint "before any request"
curl -sf "$url/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":16}' >/dev/null
curl -sf "$url/v1/chat/completions" -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":8}' \
    >/dev/null || true # stories260K's template may refuse a chat: a refusal is counted too
curl -s "$url/v1/completions" -d '{"prompt":"x","max_tokens":100000}' >/dev/null
curl -sN "$url/v1/completions" -d '{"prompt":"Once","max_tokens":200,"stream":true,"ignore_eos":true}' \
    > /dev/null &
stream=$!
sleep 0.2
lint "while a stream runs"
wait "$stream"
lint "after the requests"

# every metric the rules read is one the server serves
for m in $(grep -oP '(?<![:a-z_])shardlm_[a-z_]+(?![:a-z_])' "$PROM/shardlm.rules.yml" | sort -u); do
    base=${m%_bucket}
    grep -q "^# TYPE $base " "$WORK/metrics.txt" || fail "shardlm.rules.yml reads $m, which /metrics does not serve"
done
echo "PASS every metric deploy/prometheus/shardlm.rules.yml reads is served"
grep -q '^shardlm_build_info{version="[0-9.]*",commit="[^"]*"} 1$' "$WORK/metrics.txt" ||
    fail "no shardlm_build_info line"
(cd "$PROM" && "$PROMTOOL" check config prometheus.yml && "$PROMTOOL" test rules shardlm.rules.test.yml) \
    > "$WORK/rules.txt" 2>&1 || { cat "$WORK/rules.txt"; fail "promtool on deploy/prometheus"; }
echo "PASS promtool check config and test rules on deploy/prometheus"
