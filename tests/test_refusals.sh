#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A model whose architecture or a setting is not supported is refused, never run wrong (issue
# 35): `shardlm convert` of GGUF files and Hugging Face folders that synth wrote, each with one
# setting changed (tests/tools/model_edit.py), exits 1, leaves no output file and prints exactly
# one line naming the file, the field and its value. A neutral value of the same settings
# converts (the edited files are well formed).
#   test_refusals.sh SHARDLM_BINARY     (python: $PYTHON, default python3)
set -euo pipefail
. "$(dirname "$0")/script_lib.sh"
script_bin "$@"
script_tmp test_refusals
bin=$BIN tmp=$TMP
py=${PYTHON:-python3}
edit=$HERE/tools/model_edit.py
fail=0

# the sources: tiny-qwen3 (GGUF arch qwen3, HF Qwen3ForCausalLM), tiny-mistral's GGUF (arch
# llama), tiny-llama31's folder (LlamaForCausalLM with llama3 rope_scaling), tiny-phi3 (LongRoPE)
# and tiny-qwen3moe (experts)
for s in tiny-qwen3 tiny-mistral tiny-llama31 tiny-phi3 tiny-qwen3moe tiny-gptoss tiny-deepseek2; do
  "$bin" synth --shape $s --type f32 -o "$tmp/$s.gguf" 2>/dev/null
  "$bin" synth --shape $s --type f32 --hf "$tmp/$s.hf" 2>/dev/null
done

# convert_variant SOURCE: converts $tmp/v.gguf or the folder $tmp/v.hf; sets rc, its stderr in
# $tmp/err
convert_variant() {
  rm -f "$tmp/v.shlm"
  set +e
  "$bin" convert "$1" --scheme f32 -o "$tmp/v.shlm" -q >/dev/null 2>"$tmp/err"
  rc=$?
  set -e
}

# gguf BASE KEY TYPE VALUE WANT: BASE's GGUF with KEY set; WANT: an extended regex the one line
# matches after "FILE: ", or "ok" for a value that converts
gguf() {
  "$py" "$edit" gguf "$tmp/$1.gguf" "$tmp/v.gguf" "$2" "$3" "$4"
  try_convert "$1.gguf $2=$4" "$tmp/v.gguf" "$5"
}

# gguf_arch BASE ARCH KEY TYPE VALUE WANT: BASE's GGUF as architecture ARCH (its keys renamed),
# KEY set to VALUE of TYPE
gguf_arch() {
  "$py" "$edit" gguf-arch "$tmp/$1.gguf" "$tmp/a.gguf" "$2"
  "$py" "$edit" gguf "$tmp/a.gguf" "$tmp/v.gguf" "$3" "$4" "$5"
  try_convert "$1.gguf as $2, $3=$5" "$tmp/v.gguf" "$6"
}

# config BASE JSON WANT [FILE]: BASE's folder with the fields of JSON merged into config.json;
# FILE: the folder's file the line names (config.json when not given)
config() {
  rm -rf "$tmp/v.hf"
  cp -r "$tmp/$1.hf" "$tmp/v.hf"
  "$py" "$edit" config "$tmp/$1.hf/config.json" "$tmp/v.hf/config.json" "$2"
  try_convert "$1 config $2" "$tmp/v.hf" "$3" "${4:-config.json}"
}

# try_convert NAME PATH WANT [FILE]: converts PATH, expecting WANT (a line's regex, or ok); FILE:
# the file of a folder the line names
try_convert() {
  local name=$1 path=$2 want=$3
  convert_variant "$path"
  if [ "$want" = ok ]; then
    if [ $rc -ne 0 ]; then
      echo "FAIL: $name: expected to convert, exit $rc: $(head -c 300 "$tmp/err")"
      fail=1
    else
      echo "converts: $name"
    fi
    return
  fi
  local file=$path
  [ -d "$path" ] && file=$path/${4:-config.json}
  if [ $rc -ne 1 ] || [ -e "$tmp/v.shlm" ] || [ "$(wc -l <"$tmp/err")" -ne 1 ] ||
    ! grep -Eq "^shardlm convert: $file: $want" "$tmp/err"; then
    echo "FAIL: $name: expected exit 1, no output and one line '$file: $want'; exit $rc:"
    cat "$tmp/err"
    fail=1
  else
    echo "refused: $name: $(cat "$tmp/err")"
  fi
}

# GGUF: an unknown architecture, and settings the runtime lacks (by key and value)
gguf tiny-qwen3 general.architecture str mamba \
  'metadata general\.architecture is "mamba" .*not a supported architecture \(llama, .*\)'
# qwen3moe's experts are not optional, nor more per token than there are
gguf_arch tiny-qwen3 qwen3moe qwen3moe.expert_count u32 0 \
  'metadata qwen3moe\.expert_count is 0, expected 1\.\.512'
gguf tiny-qwen3moe qwen3moe.expert_used_count u32 17 \
  'metadata qwen3moe\.expert_used_count is 17, expected 1\.\.16'
gguf tiny-mistral llama.rope.scaling.type str linear \
  'metadata llama\.rope\.scaling\.factor is missing \(rope\.scaling\.type is linear\)'
gguf tiny-mistral llama.rope.scaling.type str dynamic \
  'metadata llama\.rope\.scaling\.type is "dynamic" \(RoPE scaling: not supported\)'
gguf tiny-mistral llama.rope.scaling.factor f32 4 'metadata llama\.rope\.scaling\.factor is 4 '
# a llama GGUF with experts is Mixtral, which needs its experts per token
gguf tiny-mistral llama.expert_count u32 8 'metadata llama\.expert_used_count is missing'
gguf tiny-qwen3 qwen3.expert_count u32 8 'metadata qwen3\.expert_count is 8 '
# DeepSeek: a multi-token-prediction layer among the blocks; groups without a count to take
gguf tiny-deepseek2 deepseek2.nextn_predict_layers u32 1 \
  'metadata deepseek2\.nextn_predict_layers is 1: not supported \(multi-token prediction'
gguf tiny-deepseek2 deepseek2.expert_group_count u32 4 'config fields n_groups/topk_groups are 4/0'
gguf tiny-mistral llama.attention.max_alibi_bias f32 8 \
  'metadata llama\.attention\.max_alibi_bias is 8 \(ALiBi'
gguf tiny-mistral llama.rope.dimension_count u32 8 \
  'metadata llama\.rope\.dimension_count is 8 \(partial rotary'
gguf tiny-qwen3 qwen3.attention.clamp_kqv f32 8 'metadata qwen3\.attention\.clamp_kqv is 8 '
# a sliding window on a llama GGUF (ik_llama.cpp's llama has none: a window is read for phi3,
# gemma2 and gemma3 only)
gguf tiny-mistral llama.attention.sliding_window u32 64 \
  'metadata llama\.attention\.sliding_window is 64 \(sliding-window attention: not supported\)'
# LongRoPE's attention factor divides by ln(original context): 1 is no context to scale from
gguf tiny-phi3 phi3.rope.scaling.original_context_length u32 1 \
  'metadata phi3\.rope\.scaling\.original_context_length is 1, expected 2\.\.16777216'
# fused q/k/v and gate/up where the architecture's row has none: refused naming the tensor, not
# split (tiny-phi3's tensors as a llama GGUF without a window, as a LlamaForCausalLM folder)
gguf_arch tiny-phi3 llama llama.attention.sliding_window u32 0 \
  'tensor blk\.0\.attn_qkv\.weight is q, k and v fused: architecture llama has no fused tensors'
# neutral values convert
gguf tiny-mistral llama.rope.scaling.type str none ok
gguf tiny-qwen3 qwen3.expert_count u32 0 ok

# config.json: unknown architectures, RoPE scaling types, MoE fields, a quantized checkpoint...
config tiny-qwen3 '{"architectures": ["MambaForCausalLM"]}' \
  'field architectures\[0\] is "MambaForCausalLM", expected one of .*LlamaForCausalLM'
config tiny-qwen3 '{"architectures": ["Qwen3MoeForCausalLM"]}' 'field num_experts is missing'
# dense layers among the sparse ones (Qwen2/3-MoE's mlp_only_layers, decoder_sparse_step)
config tiny-qwen3moe '{"mlp_only_layers": [1]}' 'field mlp_only_layers is not an empty list'
config tiny-qwen3moe '{"decoder_sparse_step": 2}' 'field decoder_sparse_step is 2, expected 1\.\.1'
# gpt-oss: its clamp is the kernel's; MXFP4 is its experts' format, no other family's
config tiny-gptoss '{"swiglu_limit": 6.0}' 'field swiglu_limit is 6: not supported'
config tiny-qwen3moe '{"quantization_config": {"quant_method": "mxfp4"}}' \
  'field quantization_config.quant_method is "mxfp4": quantized checkpoints are not supported'
config tiny-qwen3 '{"architectures": ["DeepseekV32ForCausalLM"]}' \
  'field architectures\[0\] is "DeepseekV32ForCausalLM"'
# DeepSeek-V3's class without its latent attention's sizes; its FP8 checkpoint
config tiny-qwen3 '{"architectures": ["DeepseekV3ForCausalLM"]}' 'field kv_lora_rank is missing'
config tiny-deepseek2 '{"quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}}' \
  'field quantization_config.quant_method is "fp8": quantized checkpoints are not supported'
config tiny-qwen3 '{"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}' \
  'field rope_scaling\.rope_type is "dynamic": only linear, llama3, yarn and longrope scaling are supported'
config tiny-llama31 '{"rope_scaling": {"type": "linear", "factor": 0.5}}' \
  'field rope_scaling\.factor is 0\.5, expected 1\.\.1024'
config tiny-qwen3 '{"num_experts": 8, "num_experts_per_tok": 2}' \
  'field num_experts is 8 \(mixture of experts: not supported\)'
config tiny-llama31 '{"num_local_experts": 8}' 'field num_local_experts is 8 \(mixture of experts'
config tiny-qwen3 '{"use_sliding_window": true, "sliding_window": 64}' \
  'field use_sliding_window is true \(sliding-window attention: not supported\)'
config tiny-llama31 '{"partial_rotary_factor": 0.5}' 'field partial_rotary_factor is 0\.5 '
config tiny-llama31 '{"attention_bias": true}' 'field attention_bias is true \(biases'
config tiny-llama31 '{"hidden_act": "relu"}' 'field hidden_act is "relu", expected silu'
config tiny-llama31 '{"final_logit_softcapping": 30.0}' 'field final_logit_softcapping is 30 '
# Granite's multipliers are read for Granite only
config tiny-llama31 '{"logits_scaling": 4}' 'field logits_scaling is 4 \(a logit multiplier'
config tiny-qwen3 '{"quantization_config": {"quant_method": "gptq", "bits": 4}}' \
  'field quantization_config\.quant_method is "gptq": quantized checkpoints are not supported'
config tiny-phi3 '{"original_max_position_embeddings": 1}' \
  'field original_max_position_embeddings is 1, expected 2\.\.16777216'
config tiny-phi3 '{"architectures": ["LlamaForCausalLM"]}' \
  'tensor model\.layers\.0\.self_attn\.qkv_proj\.weight is q, k and v fused: architecture LlamaForCausalLM' \
  model.safetensors
# neutral values convert
config tiny-qwen3 '{"rope_scaling": {"rope_type": "default"}, "num_experts": 0}' ok
config tiny-llama31 '{"quantization_config": null, "attention_bias": false}' ok
config tiny-llama31 '{"rope_scaling": {"type": "linear", "factor": 2.0}}' ok
exit $fail
