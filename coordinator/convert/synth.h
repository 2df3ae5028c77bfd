/* SPDX-License-Identifier: MIT */
/* coordinator/convert/synth.h: synthetic models for benchmarks and tests (`shardlm synth`, whose
 * options are cli/cmd_synth.c's), as a GGUF file or a Hugging Face folder. */
#ifndef SHARDLM_COORD_SYNTH_H
#define SHARDLM_COORD_SYNTH_H

#include "util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* RoPE frequency scaling of a shape */
enum coord_synth_rope {
    COORD_SYNTH_ROPE_PLAIN,    /* theta ** (-2i / head_dim) */
    COORD_SYNTH_ROPE_LLAMA3,   /* Llama 3.1: low/high frequency factors (GGUF rope_freqs) */
    COORD_SYNTH_ROPE_LONGROPE, /* Phi-3.5: short/long factors, an attention factor */
    COORD_SYNTH_ROPE_YARN,     /* gpt-oss: YaRN (GGUF only here), factor ctx / rope_orig_ctx */
};

/* A model shape: the architecture name GGUF stores, the sizes, and (zero for the llama and spark
 * shapes, whose files stay as they were) the architecture's features and the Hugging Face
 * names. One row per shape; the writers read only this row. */
struct coord_synth_shape {
    const char *name, *arch;
    uint32_t dim, layers, heads, head_dim, kv_heads, ffn, vocab, ctx;
    float theta;
    bool gelu, head_gate; /* GELU-tanh instead of SiLU; a per-head output gate */

    const char *hf_class, *hf_type; /* config.json's architectures[0], model_type; NULL: no HF */
    float eps;                      /* RMSNorm epsilon (0: 1e-5) */
    bool untied;                    /* an output head of its own (else tied to the embeddings) */
    bool qk_norm;                   /* per-head RMSNorm of q and k (Qwen3, Gemma 3) */
    bool gemma;      /* (1 + w) norms, embeddings x sqrt(dim), pre/post norms (Gemma 2, 3) */
    bool fused;      /* attn_qkv and ffn_up holding gate + up (Phi-3) */
    bool llama_rope; /* GGUF q/k rows permuted for interleaved RoPE (llama.cpp's converter) */
    uint32_t window; /* sliding window in tokens, 0: none */
    uint32_t window_pattern; /* window on every layer (0), on even layers (2: Gemma 2), on layers
                                l with (l + 1) % 6 != 0 (6: Gemma 3) */
    uint32_t no_rope_every;  /* SmolLM3: layers l with (l + 1) % n == 0 have no RoPE; 0: none */
    float theta_local;       /* Gemma 3: the local layers' RoPE base */
    float attn_softcap, final_softcap; /* Gemma 2: tanh caps, 0: none */
    float query_scalar;                /* Gemma: query_pre_attn_scalar (scores x its -1/2) */
    float emb_mult, res_mult, attn_mult, logit_scale; /* Granite; 0: none */
    enum coord_synth_rope rope;
    float rope_factor, rope_low, rope_high; /* Llama 3.1: factor, low/high_freq_factor */
    uint32_t rope_orig_ctx;                 /* Llama 3.1, LongRoPE: the original context */
    /* weights: matrices N(0, w_std), q and k N(0, qk_std), embeddings N(0, emb_std), norms
     * N(1, norm_std) and the final norm N(out_norm, norm_std * out_norm) - larger than 0.02 and 1
     * on the tiny shapes so that attention is not uniform and the outputs are peaked (with a
     * rank, the coordinates in the subspace are drawn so: see below) */
    float w_std, qk_std, emb_std, norm_std, out_norm;
    /* the rank of the tiny shapes' weights (0: full; even, at most dim and 64): every matrix,
     * the embeddings and the head lie in one seeded rank-dimensional subspace of the residual
     * stream (on the side that reads or writes it), as trained models' weights and activations
     * concentrate in few directions. int4 rounding's error, spread over all dim directions,
     * reaches what the next layer and the head read in part only; and the embedding's share of
     * the stream is smaller, so that a tied head's peaked outputs come from the layers, not from
     * the input token's own embedding (at full rank, 98% of tiny-qwen3's top-1s were the input
     * token). With the trained-model scales of w_std and qk_std, w4a8/w4a16 then cost what they
     * cost on a trained model (tests/test_archs.sh) */
    uint32_t rank;
    /* mixture of experts (0: a dense FFN of @ffn units): every layer's FFN is @experts experts
     * of @expert_ffn units, @experts_used of them per token, softmax-then-top-k routing with the
     * weights renormalised (Qwen3-MoE's norm_topk_prob, Mixtral); the router's rows drawn with
     * @router_std (so that tokens prefer a few experts clearly: near ties would flip with
     * rounding) */
    uint32_t experts, experts_used, expert_ffn;
    float router_std;
    /* gpt-oss: q/k/v/O and expert biases N(0, bias_std), the router's N(0, router_std),
     * attention sinks N(sink_mean, 1); experts' matrices on MXFP4's grid
     * (coord_rows_mxfp4_block), stored as MXFP4 (F32 with --f32: the same values) */
    float bias_std, sink_mean;
    bool mxfp4;
    /* DeepSeek-V2/V3 (kv_lora 0: none): multi-head latent attention - q through a rank q_lora
     * bottleneck, keys and values from a latent of rank kv_lora and a shared RoPE key of rope_dim
     * (the last rope_dim of head_dim roped), values of v_dim; the first dense_first layers a dense
     * FFN of @ffn units, the others @shared shared experts beside the routed ones; V3's routing
     * (@sigmoid: sigmoid scores, a selection bias N(0, sel_std), the weights renormalised) or
     * V2's (softmax, not renormalised), times route_scale; YaRN's attention factor with
     * yarn_log_multiplier 0.1 */
    uint32_t q_lora, kv_lora, rope_dim, v_dim, shared, dense_first;
    float sel_std, route_scale;
    bool sigmoid;
};

/* The shapes coord_synth() makes, *@n of them (static). */
const struct coord_synth_shape *coord_synth_shapes(size_t *n);

/* The shape named @name, or NULL. */
const struct coord_synth_shape *coord_synth_shape(const char *name);

struct coord_synth_tok;

/* How coord_synth() writes. */
struct coord_synth_opts {
    const char *shape; /* a coord_synth_shapes() name */
    const char *out;   /* the GGUF file, or the folder with @hf */
    bool hf;           /* a Hugging Face folder (config.json, model.safetensors, tokenizer) */
    bool f32;          /* matrices in F32 (else F16; norms are F32 either way) */
    uint64_t seed;     /* 0 picks a fixed one */
    /* a real tokenizer (synth_tok.h: its vocabulary, sizing the embedding and output rows,
     * special tokens and chat template), or NULL: the byte-level vocabulary made up here */
    const struct coord_synth_tok *tok;
    /* called with (0, layers) before the tensor data, then (l, layers) after layer l's */
    void (*progress)(void *ctx, int done, int total);
    void *progress_ctx;
};

/* Writes the model @o describes atomically (a folder: each file), its weights drawn from the
 * seed: the GGUF and the HF folder of one shape and seed hold the same model. Nothing is
 * printed here. Returns 0 or -errno with @e set (-EINVAL: an unknown shape, or one without HF
 * names asked for a folder). */
int coord_synth_write(const struct coord_synth_opts *o, struct shardlm_err *e);

/* coord_synth_write() of a GGUF F16 file. */
int coord_synth(const char *shape, const char *out, uint64_t seed,
                void (*progress)(void *ctx, int done, int total), void *ctx, struct shardlm_err *e);

#endif
