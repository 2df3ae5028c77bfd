#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `shardlm template` against the reference, tests/tools/jinja_render.py (Python's Jinja2 set up as
# Hugging Face transformers sets it up), for every chat template in data/chat-templates (and the
# feature templates of data/jinja) and every request in data/chat: both render the same bytes, or both fail; where the template called
# raise_exception(MESSAGE), shardlm's one stderr line must be `shardlm template: MESSAGE`.
# Prints each difference, then one summary line; exits 1 if any rendering differed.
#   test_chat_templates.sh SHARDLM_BINARY     (data: $SHARDLM_TEST_DATA, else ctest's
#                                              $SHARDLM_TEST_DATA_DEFAULT, else tests/data;
#                                              python: $PYTHON, default python3 with jinja2)
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 SHARDLM_BINARY" >&2
  exit 2
fi
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
data=${SHARDLM_TEST_DATA:-${SHARDLM_TEST_DATA_DEFAULT:-$here/data}}
ref=$here/tools/jinja_render.py
bos='<s>'
eos='</s>'

# the reference needs Python 3 with jinja2 (Debian's python3-jinja2); no skip: CI installs it
py=
for p in ${PYTHON:+"$PYTHON"} python3 /usr/bin/python3; do
  if "$p" -c 'import jinja2' 2>/dev/null; then
    py=$p
    break
  fi
done
if [ -z "$py" ]; then
  echo "test_chat_templates: the reference renderer needs python3 with the jinja2 module;" \
    "install it with 'apt-get install python3-jinja2' (or run deploy/bootstrap.sh)" >&2
  exit 1
fi
if [ ! -x "$bin" ]; then
  echo "test_chat_templates: $bin: not an executable" >&2
  exit 1
fi

shopt -s nullglob
templates=("$data"/chat-templates/*.jinja "$data"/jinja/*.jinja)
requests=("$data"/chat/*.json)
if [ ${#templates[@]} -eq 0 ] || [ ${#requests[@]} -eq 0 ]; then
  echo "test_chat_templates: no chat-templates/*.jinja or chat/*.json under $data" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# show NAME FILE OFFSET: up to 96 bytes of FILE from 32 before byte OFFSET (1-based), as od -c
show() {
  local from=$(($3 > 32 ? $3 - 32 : 1))
  echo "  $1 (from byte $from of $(wc -c <"$2")):"
  tail -c +"$from" "$2" | head -c 96 | od -An -c | sed 's/^/    /'
}

# differ WHY: report the current pair and both sides
differ() {
  echo "DIFFER: ${t##*/} x ${c##*/}: $1"
  if [ "$rrc" -eq 0 ] && [ "$src" -eq 0 ]; then
    local how at
    how=$(cmp "$tmp/ref.out" "$tmp/got.out" 2>&1 || true)
    at=$(grep -o 'byte [0-9]*' <<<"$how" | head -1 | tr -dc 0-9 || true)
    echo "  ${how//$tmp\//}"
    show reference "$tmp/ref.out" "${at:-1}"
    show shardlm "$tmp/got.out" "${at:-1}"
  else
    echo "  reference: exit $rrc, $(wc -c <"$tmp/ref.out") bytes out; stderr: $(head -c 300 "$tmp/ref.err")"
    echo "  shardlm:   exit $src, $(wc -c <"$tmp/got.out") bytes out; stderr: $(head -c 300 "$tmp/got.err")"
  fi
}

# the reference renders every pair in one Python process (one start per pair took 0.6 s each, 137 s
# of CI's run); N.out, N.err and N.rc are the Nth pair's, in the loop's order below
mkdir "$tmp/ref"
for t in "${templates[@]}"; do
  for c in "${requests[@]}"; do
    printf '%s\0%s\0' "$t" "$c" # NUL-terminated: a tab or newline in the checkout's path is fine
  done
done >"$tmp/pairs"
"$py" "$ref" --batch "$tmp/pairs" "$tmp/ref" "$bos" "$eos"

total=0
same=0
raised=0
for t in "${templates[@]}"; do
  for c in "${requests[@]}"; do
    total=$((total + 1))
    cp "$tmp/ref/$total.out" "$tmp/ref.out"
    cp "$tmp/ref/$total.err" "$tmp/ref.err"
    rrc=$(cat "$tmp/ref/$total.rc")
    src=0
    "$bin" template --chat-template "$t" --bos-token "$bos" --eos-token "$eos" <"$c" \
      >"$tmp/got.out" 2>"$tmp/got.err" || src=$?

    if [ "$rrc" -eq 0 ] && [ "$src" -eq 0 ]; then
      if cmp -s "$tmp/ref.out" "$tmp/got.out"; then
        same=$((same + 1))
      else
        differ "different bytes"
      fi
    elif [ "$rrc" -eq 0 ] || [ "$src" -eq 0 ]; then
      differ "one side failed"
    elif [ "$src" -ne 1 ] || [ "$(wc -l <"$tmp/got.err")" -ne 1 ] ||
      ! grep -q '^shardlm template: ' "$tmp/got.err"; then
      differ "shardlm must fail with exit 1 and one line 'shardlm template: MESSAGE'"
    elif [ "$rrc" -eq 1 ] && [ "$(sed 's/^jinja_render\.py: //' "$tmp/ref.err")" != \
      "$(sed 's/^shardlm template: //' "$tmp/got.err")" ]; then
      # exit 1: raise_exception(MESSAGE); other errors (exit 2) are worded by each side its own way
      differ "different raise_exception messages"
    else
      same=$((same + 1))
      raised=$((raised + 1))
    fi
  done
done
echo "chat templates: $same of $total renderings identical ($raised raise in both)"
[ "$same" -eq "$total" ]
