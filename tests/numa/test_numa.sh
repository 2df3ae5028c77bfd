#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ctest's test_numa_2nodes and test_numa_4nodes: test_numa in a QEMU guest with NODES NUMA nodes of
# one CPU each (tests/numa/guest.sh), on the f32 stories260K model, a f32 tiny-qwen3moe (its
# experts placed on the nodes) and a f32 tiny-deepseek2 (latent attention over the nodes) made
# here.
#
#   tests/numa/test_numa.sh NODES BUILD_DIR DATA_DIR
#
# DATA_DIR is the CMake cache's SHARDLM_TEST_DATA; SHARDLM_TEST_DATA in the environment wins over it.
# The guest gets no environment and sees the build tree read-only, so the model is converted into
# BUILD_DIR/numa beforehand and test_numa takes its paths as arguments. Exits with test_numa's
# status, or guest.sh's (124 timed out, 125 no guest: both failures, never a skip).
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 NODES BUILD_DIR DATA_DIR" >&2; exit 2; }
nodes=$1
build=$(realpath -e "$2")
data=$(realpath -e "${SHARDLM_TEST_DATA:-$3}")
src=$(realpath "$(dirname "$0")/../..")
for f in "$build/shardlm" "$build/shardlm-worker" "$build/tests/test_numa"; do
  [ -x "$f" ] || { echo "test_numa.sh: $f is not built" >&2; exit 2; }
done

# converted anew each time (cheap), under a private name and renamed: the 2- and 4-node tests
# may run at once and share the file
mkdir -p "$build/numa"
model=$build/numa/f32.shlm
"$build/shardlm" convert "$src/models/stories260K/stories260K.bin" \
  --tokenizer "$src/models/stories260K/tok512.bin" --scheme f32 -o "$model.$$.tmp" -q
mv -f "$model.$$.tmp" "$model"
moe=$build/numa/tiny-qwen3moe.shlm
"$build/shardlm" synth --shape tiny-qwen3moe --type f32 -o "$moe.$$.gguf" 2>/dev/null
"$build/shardlm" convert "$moe.$$.gguf" --scheme f32 -o "$moe.$$.tmp" -q
rm -f "$moe.$$.gguf"
mv -f "$moe.$$.tmp" "$moe"
mla=$build/numa/tiny-deepseek2.shlm
"$build/shardlm" synth --shape tiny-deepseek2 --type f32 -o "$mla.$$.gguf" 2>/dev/null
"$build/shardlm" convert "$mla.$$.gguf" --scheme f32 -o "$mla.$$.tmp" -q
rm -f "$mla.$$.gguf"
mv -f "$mla.$$.tmp" "$mla"

cd "$build"
exec "$src/tests/numa/guest.sh" --nodes "$nodes" --cpus-per-node 1 --timeout 840 \
  --share "$build" --share "$data" -- \
  "$build/tests/test_numa" "$build/shardlm" "$model" "$data" "$moe" "$mla"
