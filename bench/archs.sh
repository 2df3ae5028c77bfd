#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 35's performance check (a benchmark, not a test): shardlm W4A8 against ik_llama.cpp on
# the architecture perf shapes (synth --shape qwen3-1.7b, gemma3-1b: real dimensions and
# vocabularies, random weights), side by side, in interleaved rounds (the two tools' order
# alternates round by round), medians over the rounds of each process's median over -R warm
# repetitions (both tools warm up first: llama-bench by default, shardlm bench always):
#   decode tg128, B = 1        shardlm bench -n    vs llama-bench Q4_0 -rtr 1   target >= 1.05x
#   prefill pp512              shardlm bench -p    vs llama-bench IQ4_XS        target >= 1.2x
#   batched decode, B = 8      shardlm bench --batch vs llama-batched-bench Q4_0 -rtr (S_TG)
#                                                                               target >= 1.5x
# each at every thread count of -t. Issue 36's MoE shapes (a name with "moe": qwen3moe-a3b-32e)
# go against Q4_0 -rtr with ik's fused MoE (-fmoe 1, its default) in all three, the targets
# decode >= 1.2x, prefill >= 1.5x, batched >= 1.5x. Run it on quiet CPUs (nothing else running: a shared
# machine gives figures that say nothing); a round of the full set takes minutes per shape.
#
#   bench/archs.sh [-s "SHAPES"] [-r ROUNDS] [-R REPS] [-p N] [-n N] [-t "T..."] [-b B] [-o DIR]
#                  [-H "BITS..."] [-T "TESTS..."]
#     -s  shapes (default "qwen3-1.7b gemma3-1b"; any synth --shape works, e.g. tiny-qwen3 for
#         a smoke run)
#     -r  rounds (default 5)      -p  prompt tokens (default 512)   -n  decode tokens (128)
#     -R  repetitions of tg and pp in each process, their median taken (default 3: a first
#         prefill of a process ran at 125 t/s where the next ran at 175, qwen3-1.7b, 1 thread)
#     -t  thread counts (default "1 2")                            -b  batch (default 8)
#     -H  shardlm's embedding/head bits, one file and one row of the table each (default "8",
#         the convert default; "8 6" adds `--head-bits 6`, the 6-bit head in the place of ik's
#         Q6_K head, as tool shardlm-h6)
#     -T  the tests to run (default "tg pp batch"; "tg" alone makes a round a minute or two,
#         for more rounds of decode on a noisy machine)
#     -o  work folder (default /tmp/shardlm-bench-archs): the models are made there once and
#         reused; results.tsv gets one line per measurement (round shape test threads tool
#         tok/s), summary.md the table for docs/benchmarks.md
#   SHARDLM (default build/shardlm) and IK_BIN (default /work/ik/build/bin: llama-bench,
#   llama-batched-bench, llama-quantize) name the binaries.
# The batched runs prefill min(-p, 128) tokens per sequence and decode -n, as docs/benchmarks.md's
# earlier batched tables (-npp 128 -ntg 128).
set -euo pipefail
shapes="qwen3-1.7b gemma3-1b"
rounds=5 reps=3 pp=512 tg=128 threads="1 2" batch=8 out=/tmp/shardlm-bench-archs heads=8
tests="tg pp batch"
while getopts "s:r:R:p:n:t:b:o:H:T:" opt; do
  case $opt in
  s) shapes=$OPTARG ;;
  r) rounds=$OPTARG ;;
  R) reps=$OPTARG ;;
  p) pp=$OPTARG ;;
  n) tg=$OPTARG ;;
  t) threads=$OPTARG ;;
  b) batch=$OPTARG ;;
  o) out=$OPTARG ;;
  H) heads=$OPTARG ;;
  T) tests=$OPTARG ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2
    exit 2
    ;;
  esac
done
shardlm=$(realpath "${SHARDLM:-build/shardlm}")
ik=$(realpath "${IK_BIN:-/work/ik/build/bin}")
for b in "$shardlm" "$ik/llama-bench" "$ik/llama-batched-bench" "$ik/llama-quantize"; do
  [ -x "$b" ] || { echo "archs.sh: $b: not an executable" >&2; exit 1; }
done
bpp=$((pp < 128 ? pp : 128))
mkdir -p "$out"
out=$(realpath "$out")
cd "$out" # llama-batched-bench writes llama.log where it runs
export SHARDLM_RUNTIME_DIR=$out/run
mkdir -p -m 700 "$SHARDLM_RUNTIME_DIR"
results=$out/results.tsv
: >"$results"

# the W4A8 file of SHAPE with head bits H, and its tool's name
shlm_file() { if [ "$2" = 8 ]; then echo "$out/$1/$1-w4a8.shlm"; else echo "$out/$1/$1-w4a8-h$2.shlm"; fi; }
shlm_tool() { if [ "$1" = 8 ]; then echo shardlm; else echo "shardlm-h$1"; fi; }

# prepare SHAPE: the F16 GGUF, shardlm's W4A8 files and ik's Q4_0 and IQ4_XS, each made once
prepare() {
  local s=$1 d=$out/$1 h f
  mkdir -p "$d"
  [ -s "$d/$s.gguf" ] || "$shardlm" synth --shape "$s" -o "$d/$s.gguf"
  for h in $heads; do
    f=$(shlm_file "$s" "$h")
    [ -s "$f" ] || "$shardlm" convert "$d/$s.gguf" --scheme w4a8 --head-bits "$h" -q -o "$f"
  done
  [ -s "$d/$s-q4_0.gguf" ] || "$ik/llama-quantize" "$d/$s.gguf" "$d/$s-q4_0.gguf" Q4_0 >"$d/quantize.log" 2>&1
  moe "$s" || [ -s "$d/$s-iq4_xs.gguf" ] ||
    "$ik/llama-quantize" "$d/$s.gguf" "$d/$s-iq4_xs.gguf" IQ4_XS >>"$d/quantize.log" 2>&1
}

# record ROUND SHAPE TEST THREADS TOOL TOKS
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" | tee -a "$results"; }

# the median of llama-bench's repetitions of its one test (samples_ts), from -o json on stdin
json_ts() {
  python3 -c 'import json,statistics,sys; print(statistics.median(json.load(sys.stdin)[0]["samples_ts"]))'
}

# want TEST: whether -T asks for it
want() { [[ " $tests " == *" $1 "* ]]; }

# moe SHAPE: whether it is a mixture of experts (issue 36's comparison)
moe() { [[ $1 == *moe* ]]; }

# run_ik ROUND SHAPE T: ik's three measurements
run_ik() {
  local r=$1 s=$2 t=$3 d=$out/$2
  want tg && record "$r" "$s" "tg$tg" "$t" ik-q4_0-rtr \
    "$("$ik/llama-bench" -m "$d/$s-q4_0.gguf" -p 0 -n "$tg" -t "$t" -r "$reps" -rtr 1 -fmoe 1 -o json 2>/dev/null | json_ts)"
  if ! want pp; then
    :
  elif moe "$s"; then
    record "$r" "$s" "pp$pp" "$t" ik-q4_0-rtr \
      "$("$ik/llama-bench" -m "$d/$s-q4_0.gguf" -p "$pp" -n 0 -t "$t" -r "$reps" -rtr 1 -fmoe 1 -o json 2>/dev/null | json_ts)"
  else
    record "$r" "$s" "pp$pp" "$t" ik-iq4_xs \
      "$("$ik/llama-bench" -m "$d/$s-iq4_xs.gguf" -p "$pp" -n 0 -t "$t" -r "$reps" -o json 2>/dev/null | json_ts)"
  fi
  want batch || return 0
  local ctx=$((batch * (bpp + tg) + 256))
  record "$r" "$s" "B${batch}_tg$tg" "$t" ik-q4_0-rtr "$("$ik/llama-batched-bench" \
    -m "$d/$s-q4_0.gguf" -c "$ctx" -b 2048 -ub 512 -npp "$bpp" -ntg "$tg" -npl "$batch" -t "$t" \
    -rtr 2>&1 | awk -F'|' -v b="$batch" '$4 + 0 == b && $2 ~ /[0-9]/ { gsub(/ /, "", $9); print $9 }')"
}

# run_shardlm ROUND SHAPE T: shardlm's, each head's file
run_shardlm() {
  local r=$1 s=$2 t=$3 m j h n
  for h in $heads; do
    m=$(shlm_file "$s" "$h") n=$(shlm_tool "$h")
    if want tg || want pp; then
      j=$("$shardlm" bench -m "$m" -p "$(want pp && echo "$pp" || echo 0)" \
        -n "$(want tg && echo "$tg" || echo 0)" -t "$t" -r "$reps" --json 2>/dev/null | tail -n 1)
      want tg && record "$r" "$s" "tg$tg" "$t" "$n" "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["tg_ts"])' "$j")"
      want pp && record "$r" "$s" "pp$pp" "$t" "$n" "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["pp_ts"])' "$j")"
    fi
    want batch || continue
    j=$("$shardlm" bench -m "$m" --batch "$batch" -p "$bpp" -n "$tg" -t "$t" -r 1 --json 2>/dev/null |
      tail -n 1)
    record "$r" "$s" "B${batch}_tg$tg" "$t" "$n" "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["s_tg"])' "$j")"
  done
}

for s in $shapes; do prepare "$s"; done
for r in $(seq "$rounds"); do
  for s in $shapes; do
    for t in $threads; do
      if [ $((r % 2)) = 1 ]; then
        run_ik "$r" "$s" "$t"
        run_shardlm "$r" "$s" "$t"
      else
        run_shardlm "$r" "$s" "$t"
        run_ik "$r" "$s" "$t"
      fi
    done
  done
done

# medians per shape, test and thread count; the ratio against the issue's target
python3 - "$results" "$pp" "$tg" "$batch" >"$out/summary.md" <<'EOF'
import statistics, sys
from collections import defaultdict
path, pp, tg, b = sys.argv[1:5]
targets = {f"tg{tg}": 1.05, f"pp{pp}": 1.2, f"B{b}_tg{tg}": 1.5}
moe_targets = {f"tg{tg}": 1.2, f"pp{pp}": 1.5, f"B{b}_tg{tg}": 1.5}  # issue 36
v = defaultdict(list)
for line in open(path):
    r, shape, test, t, tool, ts = line.rstrip("\n").split("\t")
    if ts:
        v[(shape, test, t, "ik" if tool.startswith("ik") else "shardlm", tool)].append(float(ts))
print("| shape | test | threads | ik (tool) | shardlm (tool) | ratio | target | rounds |")
print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |")
keys = sorted({k[:3] for k in v})
for shape, test, t in keys:
    ik = [(k[4], x) for k, x in v.items() if k[:4] == (shape, test, t, "ik")]
    if not ik:
        continue
    tool, xs = ik[0]
    mi = statistics.median(xs)
    for k, sh in sorted(v.items()):
        if k[:4] != (shape, test, t, "shardlm"):
            continue
        ms = statistics.median(sh)
        ratio = ms / mi if mi else float("nan")
        goal = (moe_targets if "moe" in shape else targets).get(test)
        mark = "" if goal is None else (" ok" if ratio >= goal else " below")
        print(f"| {shape} | {test} | {t} | {mi:.2f} ({tool}) | {ms:.2f} ({k[4]}) | {ratio:.2f}{mark} | "
              f"{goal if goal else '-'} | {len(sh)} |")
EOF
cat "$out/summary.md"
