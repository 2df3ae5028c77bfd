#!/bin/sh
# tools/ik_ref/make_refs.sh IK_TREE [SHARDLM] [DATA]: remakes the ik_llama.cpp references of the
# tiny architecture shapes (those of $SHAPES where it is set), DATA/golden/<shape>/ (DATA:
# tests/data), in the format of
# `shardlm eval --ref`: greedy.tsv and a float16 logits file per line. Needs IK_TREE/build with
# libllama built (cmake -B build && cmake --build build --target llama); the references of
# tests/data were made with ik_llama.cpp 8337e4cd3.
#
# tiny-mixtral's need llama-moe-residual.patch (here) applied to IK_TREE: ik_llama.cpp 8337e4cd3's
# llama graph with experts adds the normed input where the residual belongs.
#
# Per shape: `shardlm synth --shape S --type f32` (seed 1), then two sequences of 300 ids, each
# fed to ik at f32 (F32 weights and KV cache, no flash attention, context 512):
#   s1: BOS and 299 ids of a fixed pseudo-random sequence, as one batch;
#   s2: BOS and 15 such ids as one batch, then ik's greedy continuation one id at a time (its
#       decode path) up to 300.
# Every window of the shapes (32..64) is shorter than 300; LongRoPE (tiny-phi3) uses its long
# factors, as ik chooses them for a context (512) past the original one (256).
set -eu
ik=${1:?usage: make_refs.sh IK_TREE [SHARDLM] [DATA]}
shardlm=${2:-build/shardlm}
data=${3:-tests/data}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$here/build.sh" "$ik" "$tmp/ik_logits" >/dev/null
shapes=${SHAPES:-"tiny-qwen3 tiny-gemma2 tiny-gemma3 tiny-phi3 tiny-granite tiny-smollm3 tiny-mistral
  tiny-llama31 tiny-qwen3moe tiny-mixtral tiny-gptoss tiny-deepseek2 tiny-deepseek2-lite"}
total=300
vocab=512
bos=$((vocab - 2))

# n ids of the LCG x' = (1103515245 x + 12345) mod 2^31 from seed $2, each (x >> 8) mod (vocab - 2)
ids() {
    n=$1 x=$2 out=""
    while [ "$n" -gt 0 ]; do
        x=$(((1103515245 * x + 12345) % 2147483648))
        out="$out $(((x / 256) % (vocab - 2)))"
        n=$((n - 1))
    done
    echo "$out"
}

for shape in $shapes; do
    dir=$data/golden/$shape
    mkdir -p "$dir"
    rm -f "$dir"/greedy.tsv "$dir"/*.logits.*
    "$shardlm" synth --shape "$shape" --type f32 -o "$tmp/$shape.gguf" 2>/dev/null
    for s in 1 2; do
        if [ "$s" = 1 ]; then given="$bos$(ids $((total - 1)) 1)"; else given="$bos$(ids 15 2)"; fi
        # shellcheck disable=SC2086 # the ids are words
        fed=$("$tmp/ik_logits" "$tmp/$shape.gguf" "$dir/s$s.logits.f16" 2 $total $given \
            2>"$tmp/err") || { cat "$tmp/err" >&2; exit 1; }
        p1=$(sed -n 's/^mean top-1 probability \([0-9.]*\).*/\1/p' "$tmp/err")
        prompt=$(echo "$fed" | cut -d' ' -f1-16)
        rest=$(echo "$fed" | cut -d' ' -f17-)
        printf 's%s (synthetic ids)\t%s\t%s\t-\ts%s.logits.f16\n' "$s" "$prompt" "$rest" "$s" \
            >>"$dir/greedy.tsv"
        echo "$shape s$s: mean top-1 probability $p1"
    done
done
