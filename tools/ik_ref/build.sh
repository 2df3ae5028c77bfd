#!/bin/sh
# tools/ik_ref/build.sh IK_TREE [OUT]: builds ik_logits against ik_llama.cpp's libllama, which
# IK_TREE/build must hold already (cmake -B build && cmake --build build --target llama).
# Not part of shardlm's build or CI: make_refs.sh runs it when the references are remade.
set -eu
ik=${1:?usage: build.sh IK_TREE [OUT]}
out=${2:-$(dirname "$0")/ik_logits}
lib=$(find "$ik/build" -name 'libllama.so' | head -n 1)
ggml=$(find "$ik/build" -name 'libggml.so' | head -n 1)
[ -n "$lib" ] || { echo "build.sh: no libllama.so under $ik/build" >&2; exit 1; }
cc -O2 -Wall -o "$out" "$(dirname "$0")/ik_logits.c" -I"$ik/include" -I"$ik/ggml/include" \
    "$lib" ${ggml:+"$ggml"} -Wl,-rpath,"$(dirname "$lib")"${ggml:+",-rpath,$(dirname "$ggml")"} -lm
echo "$out"
