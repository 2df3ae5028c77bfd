#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The quantizer's methods on stories260K (int8 head) against the golden logits, over the four
# golden sequences: the issue's targets for GPTQ (w4a8 g128 mean KLD <= 0.060, w4a16 g64 <= 0.050),
# calibrated on the model's own text (--calib self: never the golden sequences); every method's
# file parses and runs through eval; a text file as calibration; GPTQ on a calibration short for
# the model's width no worse than rounding; --method auto's choice, its line and its file; the bad
# inputs a user may give.
# Prints one line per conversion (the table of docs/fidelity.md comes from these lines).
#   test_quant_fidelity.sh SHARDLM_BINARY     (source: $SHARDLM_SRC, default this file's ..)
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 SHARDLM_BINARY" >&2
  exit 2
fi
bin=$1
src=${SHARDLM_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
model=$src/models/stories260K
tmp=$(mktemp -d /dev/shm/test_quant_fidelity.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export SHARDLM_RUNTIME_DIR=$tmp/run
mkdir -m 700 "$SHARDLM_RUNTIME_DIR"
fail=0

# row NAME ARGS...: converts with ARGS, evaluates, prints "NAME: <overall line>"
row() {
  local name=$1
  shift
  if ! "$bin" convert "$model/stories260K.bin" --tokenizer "$model/tok512.bin" -q \
    -o "$tmp/x.shlm" "$@" 2>"$tmp/convert.err"; then
    echo "FAIL: $name: convert $*: $(cat "$tmp/convert.err")"
    fail=1
    return
  fi
  local line
  line=$("$bin" eval -m "$tmp/x.shlm" --ref "$src/tests/data/golden/stories260K" --no-persist 2>/dev/null |
    tail -n 1)
  echo "$name: $line"
  last=$line
}
# kld_at_most MAX: whether the last row's mean KLD is at most MAX
kld_at_most() {
  awk -v hi="$1" '{ sub(/^kld=/, "", $2); exit !($2 + 0 <= hi) }' <<<"$last"
}

for scheme in "w4a8 --group 128" "w4a16 --group 64"; do
  s=${scheme%% *}
  last=
  row "$s rtn" --scheme $scheme
  for m in imatrix awq; do
    last=
    row "$s $m" --scheme $scheme --method $m
    # every method runs through eval: a sane KLD, not a broken file
    [ -n "$last" ] && kld_at_most 0.2 || { echo "FAIL: $s $m: kld above 0.2"; fail=1; }
  done
  last=
  row "$s gptq" --scheme $scheme --method gptq
  # the targets (measured 0.054 and 0.043 at 4096 tokens of --calib self)
  target=$([ "$s" = w4a8 ] && echo 0.060 || echo 0.050)
  [ -n "$last" ] && kld_at_most $target || { echo "FAIL: $s gptq above $target"; fail=1; }
  last=
  row "$s gptq --calib stories.txt" --scheme $scheme --calib "$src/tests/data/calib/stories.txt"
  [ -n "$last" ] && kld_at_most 0.2 || { echo "FAIL: $s gptq on a text: kld above 0.2"; fail=1; }
done

# GPTQ on 256 tokens, few for FFN down's 172 columns: its dampening grows with columns / tokens,
# so the error feedback does not fit the noise of the Hessian (at the fixed 0.01: 0.0773 at w4a16
# g64, above rtn's 0.0706; now 0.0507)
last=
row "w4a16 rtn" --scheme w4a16 --group 64
rtn_kld=$(awk '{ sub(/^kld=/, "", $2); print $2 }' <<<"$last")
last=
row "w4a16 gptq --calib-tokens 256" --scheme w4a16 --group 64 --method gptq --calib-tokens 256
[ -n "$last" ] && kld_at_most "$rtn_kld" ||
  { echo "FAIL: w4a16 gptq on 256 tokens: kld above rtn's $rtn_kld"; fail=1; }

# --method auto on 1024 tokens of a text: the last 128 held out, so its file is the chosen
# method's on the 896 before them (--calib-tokens 896: the same sequences of 512 and 384); its
# line names every candidate's held-out KLD and chooses the lowest, rtn's or below
story=$src/tests/data/calib/stories.txt
if "$bin" convert "$model/stories260K.bin" --tokenizer "$model/tok512.bin" -q -o "$tmp/auto.shlm" \
  --scheme w4a16 --group 64 --method auto --calib "$story" --calib-tokens 1024 2>"$tmp/auto.err"; then
  line=$(cat "$tmp/auto.err")
  echo "auto: $line"
  re='^shardlm convert: method auto chose ([a-z]+) \(held-out kld: rtn ([0-9.e-]+) imatrix ([0-9.e-]+) gptq ([0-9.e-]+) awq ([0-9.e-]+); 129 held-out tokens\)$'
  if [ "$(wc -l <"$tmp/auto.err")" -ne 1 ] || ! [[ $line =~ $re ]]; then
    echo "FAIL: auto's line: $line"
    fail=1
  else
    chosen=${BASH_REMATCH[1]}
    best=$(printf '%s\n' "rtn ${BASH_REMATCH[2]}" "imatrix ${BASH_REMATCH[3]}" \
      "gptq ${BASH_REMATCH[4]}" "awq ${BASH_REMATCH[5]}" | sort -s -g -k2,2 | head -n 1)
    [ "${best%% *}" = "$chosen" ] || { echo "FAIL: auto chose $chosen, the lowest is $best"; fail=1; }
    awk -v c="${best#* }" -v r="${BASH_REMATCH[2]}" 'BEGIN { exit !(c <= r) }' ||
      { echo "FAIL: auto's choice above rtn"; fail=1; }
    if ! "$bin" convert "$model/stories260K.bin" --tokenizer "$model/tok512.bin" -q \
      -o "$tmp/one.shlm" --scheme w4a16 --group 64 --method "$chosen" --calib "$story" \
      --calib-tokens 896 2>"$tmp/one.err" || ! cmp -s "$tmp/auto.shlm" "$tmp/one.shlm"; then
      echo "FAIL: auto's file is not --method $chosen's on the 896 tokens before the held-out ones"
      fail=1
    fi
    last=$("$bin" eval -m "$tmp/auto.shlm" --ref "$src/tests/data/golden/stories260K" --no-persist \
      2>/dev/null | tail -n 1)
    echo "w4a16 auto ($chosen): $last"
    kld_at_most 0.2 || { echo "FAIL: auto's file: kld above 0.2"; fail=1; }
  fi
else
  echo "FAIL: convert --method auto: $(cat "$tmp/auto.err")"
  fail=1
fi

# bad inputs: exit 1 or 2, one line on stderr naming the problem, no output file
printf '' >"$tmp/empty.txt"
printf 'caf\xe9\n' >"$tmp/latin1.txt"
truncate -s 70M "$tmp/big.txt"
printf 'Once upon a time there was a cat. It sat in the sun all day.\n%.0s' 1 2 3 4 >"$tmp/short.txt"
# refused CODE PATTERN ARGS...: convert ARGS fails with exit CODE and a line matching PATTERN
refused() {
  local code=$1 pattern=$2
  shift 2
  set +e
  "$bin" convert "$model/stories260K.bin" --tokenizer "$model/tok512.bin" -q \
    -o "$tmp/bad.shlm" "$@" >/dev/null 2>"$tmp/err"
  local rc=$?
  set -e
  if [ $rc -ne "$code" ] || ! head -n 1 "$tmp/err" | grep -q -- "$pattern" || [ -e "$tmp/bad.shlm" ]; then
    echo "FAIL: convert $*: exit $rc (expected $code), stderr: $(head -c 300 "$tmp/err")"
    fail=1
  elif [ -n "${one_line:-}" ] && [ "$code" = 1 ] && [ "$(wc -l <"$tmp/err")" -ne 1 ]; then
    echo "FAIL: convert $*: more than one line: $(head -c 300 "$tmp/err")"
    fail=1
  else
    echo "refused as expected: $* -> $(head -n 1 "$tmp/err")"
  fi
}
refused 1 "empty" --scheme w4a8 --calib "$tmp/empty.txt"
refused 1 "not UTF-8 text (byte 3)" --scheme w4a8 --calib "$tmp/latin1.txt"
refused 1 "more than the 64 MiB" --scheme w4a8 --calib "$tmp/big.txt"
refused 1 "not a regular file" --scheme w4a8 --calib "$tmp"
refused 1 "No such file" --scheme w4a8 --calib "$tmp/missing.txt"
refused 1 "f32 uses no calibration" --scheme f32 --calib self
refused 1 "rtn uses no calibration" --scheme w4a8 --method rtn --calib self
refused 1 "no int4 matrices" --scheme bf16 --method gptq
refused 2 "expected rtn, imatrix, gptq, awq or auto" --scheme w4a8 --method best
refused 2 "expected a number above 0" --scheme w4a8 --method gptq --damp 0
refused 2 "apply to --method gptq only" --scheme w4a8 --method imatrix --no-act-order
refused 2 "calib-tokens" --scheme w4a8 --method gptq --calib-tokens 3
# --method auto's refusals, one line each (a usage error's line is followed by the usage)
one_line=1
refused 1 "--method auto: f32 has no int4 matrices" --scheme f32 --method auto
refused 1 "too few to hold 16 of them out" --scheme w4a16 --method auto --calib-tokens 100
refused 1 "too few to hold 16 of them out" --scheme w4a16 --method auto --calib "$tmp/short.txt"
refused 2 "apply to --method gptq only" --scheme w4a16 --method auto --damp 0.1
refused 1 "rtn uses no calibration" --scheme w4a8 --method rtn --calib self
one_line=
exit $fail
