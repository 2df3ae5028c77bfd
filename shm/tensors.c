/* SPDX-License-Identifier: MIT */
/* shm/tensors.c: the tables of tensor kinds and architectures (see tensors.h). */
#include "tensors.h"

#include "plan.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The kinds' presence (shlm_kind_traits.has): what a model of @c and @x has in layer @l. */
#define HAS(fn, expr)                                                                              \
    static bool fn(const struct shlm_config *c, const struct shlm_config_ext *x, uint32_t l)       \
    {                                                                                              \
        (void)c;                                                                                   \
        (void)x;                                                                                   \
        (void)l;                                                                                   \
        return expr;                                                                               \
    }
HAS(always, true)
HAS(untied, !c->tied_embd)
HAS(qkv_bias, c->qkv_bias)
HAS(qk_norm, c->flags &SHLM_CF_QK_NORM)
HAS(head_gate, c->head_gate)
HAS(post_norms, c->flags &SHLM_CF_POST_NORMS)
HAS(longrope, c->rope_scaling == SHLM_ROPE_LONGROPE)
HAS(rope_freqs, c->rope_scaling == SHLM_ROPE_FREQS)
HAS(dense_ffn, !shlm_layer_moe(x, l))
HAS(moe_ffn, shlm_layer_moe(x, l))
HAS(sinks, c->flags &SHLM_CF_ATTN_SINKS)
HAS(o_bias, c->flags &SHLM_CF_O_BIAS)
HAS(moe_bias, shlm_layer_moe(x, l) && (c->flags & SHLM_CF_MOE_BIAS))
HAS(attn_q, !x->q_lora_rank)
HAS(attn_kv, !x->kv_lora_rank)
HAS(kv_bias, c->qkv_bias && !x->kv_lora_rank)
HAS(q_lora, x->q_lora_rank != 0)
HAS(mla, x->kv_lora_rank != 0)
HAS(shared, shlm_layer_moe(x, l) && x->shared_ffn)
HAS(sel_bias, shlm_layer_moe(x, l) && (c->flags & SHLM_CF_SEL_BIAS))
#undef HAS

#define NONE SHLM_SITE_NONE
#define QKV SHLM_SITE_QKV
#define O SHLM_SITE_O
#define GU SHLM_SITE_GATE_UP
#define DOWN SHLM_SITE_DOWN
#define HEAD SHLM_SITE_HEAD
#define D(x) SHLM_DIM_##x
#define S(x) SHLM_SPLIT_##x
#define T(x) SHLM_DTC_##x
#define L2C(x) SHLM_L2C_##x
#define V(x) SHLM_VALUE_##x
#define EXP .expert = true

const struct shlm_kind_traits shlm_kinds[SHLM_KIND_COUNT] = {
    /* clang-format off */
    /* name, gguf, hf; llama2.c slot, layer, norm, rows, cols, split, dtype, site, feeds, has,
     * value (ANY when left out) */
    [SHLM_KIND_TOK_EMBD] = {"tok_embd", "token_embd.weight", "model.embed_tokens.weight",
        L2C(EMBD), false, false, D(VOCAB), D(MODEL), S(NONE), T(HEAD), NONE, NONE, always},
    [SHLM_KIND_OUTPUT] = {"output", "output.weight", "lm_head.weight",
        L2C(WCLS), false, false, D(VOCAB), D(MODEL), S(ROWS), T(HEAD), HEAD, NONE, untied},
    [SHLM_KIND_OUTPUT_NORM] = {"output_norm", "output_norm.weight", "model.norm.weight",
        L2C(RMS_FINAL), false, true, D(ONE), D(MODEL), S(NONE), T(F32), NONE, HEAD, always},
    /* config.json holds them as rope_scaling.short_factor / long_factor, not as tensors */
    [SHLM_KIND_ROPE_FACTORS_SHORT] = {"rope_factors_short", "rope_factors_short.weight", NULL,
        L2C(NONE), false, false, D(ONE), D(ROPE), S(NONE), T(F32), NONE, NONE, longrope,
        V(POSITIVE)},
    [SHLM_KIND_ROPE_FACTORS_LONG] = {"rope_factors_long", "rope_factors_long.weight", NULL,
        L2C(NONE), false, false, D(ONE), D(ROPE), S(NONE), T(F32), NONE, NONE, longrope,
        V(POSITIVE)},
    /* a Hugging Face config says rope_scaling llama3 instead (SHLM_ROPE_LLAMA3) */
    [SHLM_KIND_ROPE_FREQS] = {"rope_freqs", "rope_freqs.weight", NULL,
        L2C(NONE), false, false, D(ONE), D(ROPE), S(NONE), T(F32), NONE, NONE, rope_freqs,
        V(POSITIVE)},
    [SHLM_KIND_ATTN_NORM] = {"attn_norm", "attn_norm.weight", "input_layernorm.weight",
        L2C(RMS_ATT), true, true, D(ONE), D(MODEL), S(NONE), T(F32), NONE, QKV, always},
    [SHLM_KIND_ATTN_Q] = {"attn_q", "attn_q.weight", "self_attn.q_proj.weight",
        L2C(WQ), true, false, D(Q), D(MODEL), S(ROWS), T(MAT), QKV, NONE, attn_q},
    [SHLM_KIND_ATTN_K] = {"attn_k", "attn_k.weight", "self_attn.k_proj.weight",
        L2C(WK), true, false, D(KV), D(MODEL), S(ROWS), T(MAT), QKV, NONE, attn_kv},
    [SHLM_KIND_ATTN_V] = {"attn_v", "attn_v.weight", "self_attn.v_proj.weight",
        L2C(WV), true, false, D(KV), D(MODEL), S(ROWS), T(MAT), QKV, O, attn_kv},
    [SHLM_KIND_ATTN_Q_BIAS] = {"attn_q_bias", "attn_q.bias", "self_attn.q_proj.bias",
        L2C(NONE), true, false, D(ONE), D(Q), S(COLS), T(F32), NONE, NONE, qkv_bias},
    [SHLM_KIND_ATTN_K_BIAS] = {"attn_k_bias", "attn_k.bias", "self_attn.k_proj.bias",
        L2C(NONE), true, false, D(ONE), D(KV), S(COLS), T(F32), NONE, NONE, kv_bias},
    [SHLM_KIND_ATTN_V_BIAS] = {"attn_v_bias", "attn_v.bias", "self_attn.v_proj.bias",
        L2C(NONE), true, false, D(ONE), D(KV), S(COLS), T(F32), NONE, O, kv_bias},
    [SHLM_KIND_ATTN_Q_NORM] = {"attn_q_norm", "attn_q_norm.weight", "self_attn.q_norm.weight",
        L2C(NONE), true, true, D(ONE), D(HEAD), S(NONE), T(F32), NONE, NONE, qk_norm},
    [SHLM_KIND_ATTN_K_NORM] = {"attn_k_norm", "attn_k_norm.weight", "self_attn.k_norm.weight",
        L2C(NONE), true, true, D(ONE), D(HEAD), S(NONE), T(F32), NONE, NONE, qk_norm},
    /* tiny (heads x dim): f32, like the norms */
    [SHLM_KIND_ATTN_GATE] = {"attn_gate", "attn_gate.weight", NULL,
        L2C(NONE), true, false, D(HEADS), D(MODEL), S(ROWS), T(F32), QKV, NONE, head_gate},
    [SHLM_KIND_ATTN_O] = {"attn_o", "attn_output.weight", "self_attn.o_proj.weight",
        L2C(WO), true, false, D(MODEL), D(O), S(COLS_PADDED), T(MAT), O, NONE, always},
    /* replicated: every rank adds it to the sum of the ranks' O outputs */
    [SHLM_KIND_ATTN_O_BIAS] = {"attn_o_bias", "attn_output.bias", "self_attn.o_proj.bias",
        L2C(NONE), true, false, D(ONE), D(MODEL), S(NONE), T(F32), NONE, NONE, o_bias},
    /* a rank's: those of its query heads */
    [SHLM_KIND_ATTN_SINKS] = {"attn_sinks", "attn_sinks.weight", "self_attn.sinks",
        L2C(NONE), true, false, D(ONE), D(HEADS), S(COLS), T(F32), NONE, NONE, sinks},
    [SHLM_KIND_ATTN_POST_NORM] = {"attn_post_norm", "post_attention_norm.weight",
        "post_attention_layernorm.weight",
        L2C(NONE), true, true, D(ONE), D(MODEL), S(NONE), T(F32), NONE, NONE, post_norms},
    /* Gemma 2/3 call it pre_feedforward_layernorm (shlm_kind_hf_name) */
    [SHLM_KIND_FFN_NORM] = {"ffn_norm", "ffn_norm.weight", "post_attention_layernorm.weight",
        L2C(RMS_FFN), true, true, D(ONE), D(MODEL), S(NONE), T(F32), NONE, GU, always},
    [SHLM_KIND_FFN_GATE] = {"ffn_gate", "ffn_gate.weight", "mlp.gate_proj.weight",
        L2C(W1), true, false, D(FFN), D(MODEL), S(ROWS), T(MAT), GU, NONE, dense_ffn},
    [SHLM_KIND_FFN_UP] = {"ffn_up", "ffn_up.weight", "mlp.up_proj.weight",
        L2C(W3), true, false, D(FFN), D(MODEL), S(ROWS), T(MAT), GU, DOWN, dense_ffn},
    [SHLM_KIND_FFN_DOWN] = {"ffn_down", "ffn_down.weight", "mlp.down_proj.weight",
        L2C(W2), true, false, D(MODEL), D(FFN), S(COLS_PADDED), T(MAT), DOWN, NONE, dense_ffn},
    [SHLM_KIND_FFN_POST_NORM] = {"ffn_post_norm", "post_ffw_norm.weight",
        "post_feedforward_layernorm.weight",
        L2C(NONE), true, true, D(ONE), D(MODEL), S(NONE), T(F32), NONE, NONE, post_norms},
    /* the router: f32 like the head gate (llama.cpp keeps ffn_gate_inp unquantized), replicated:
     * every rank picks the same experts. Hugging Face names of the MoE kinds: Qwen's (Mixtral's:
     * shlm_kind_hf_name); an expert's "%u" is its index. Calibration does not see the experts
     * (SHLM_SITE_NONE: every convert --method rounds them to nearest). */
    [SHLM_KIND_FFN_ROUTER] = {"ffn_router", "ffn_gate_inp.weight", "mlp.gate.weight",
        L2C(NONE), true, false, D(EXPERTS), D(MODEL), S(NONE), T(F32), NONE, NONE, moe_ffn},
    [SHLM_KIND_FFN_GATE_EXP] = {"ffn_gate_exp", "ffn_gate_exps.weight",
        "mlp.experts.%u.gate_proj.weight",
        L2C(NONE), true, false, D(EXP_FFN), D(MODEL), S(ROWS), T(MAT), NONE, NONE, moe_ffn, EXP},
    [SHLM_KIND_FFN_UP_EXP] = {"ffn_up_exp", "ffn_up_exps.weight", "mlp.experts.%u.up_proj.weight",
        L2C(NONE), true, false, D(EXP_FFN), D(MODEL), S(ROWS), T(MAT), NONE, NONE, moe_ffn, EXP},
    [SHLM_KIND_FFN_DOWN_EXP] = {"ffn_down_exp", "ffn_down_exps.weight",
        "mlp.experts.%u.down_proj.weight",
        L2C(NONE), true, false, D(MODEL), D(EXP_FFN), S(COLS_PADDED), T(MAT), NONE, NONE, moe_ffn,
        EXP},
    /* gpt-oss's biases: GGUF holds each kind's as one [n_experts][n] tensor (the router's as
     * one vector); an expert's gate and up biases split as its units, its down bias whole
     * (added by one rank: worker/model.c) */
    [SHLM_KIND_FFN_ROUTER_BIAS] = {"ffn_router_bias", "ffn_gate_inp.bias", "mlp.router.bias",
        L2C(NONE), true, false, D(ONE), D(EXPERTS), S(NONE), T(F32), NONE, NONE, moe_bias},
    [SHLM_KIND_FFN_GATE_EXP_BIAS] = {"ffn_gate_exp_bias", "ffn_gate_exps.bias", NULL,
        L2C(NONE), true, false, D(ONE), D(EXP_FFN), S(COLS), T(F32), NONE, NONE, moe_bias, EXP},
    [SHLM_KIND_FFN_UP_EXP_BIAS] = {"ffn_up_exp_bias", "ffn_up_exps.bias", NULL,
        L2C(NONE), true, false, D(ONE), D(EXP_FFN), S(COLS), T(F32), NONE, NONE, moe_bias, EXP},
    [SHLM_KIND_FFN_DOWN_EXP_BIAS] = {"ffn_down_exp_bias", "ffn_down_exps.bias", NULL,
        L2C(NONE), true, false, D(ONE), D(MODEL), S(NONE), T(F32), NONE, NONE, moe_bias, EXP},
    /* latent attention: the bottlenecks read the attention norm's output and are replicated
     * (every rank needs all of q's rank and the whole latent); the heads' matrices split with
     * the heads. Calibration sees the first two (SHLM_SITE_QKV), not the others (their inputs
     * are no site: rounded to nearest, as the experts). The latent's and the heads' own
     * matrices take 8 bits in the int4 schemes (SHLM_DTC_Q8): every head reads the latent, and
     * an error in an absorbed query or a value matrix passes through the whole softmax (on
     * tiny-deepseek2, w4a8's KLD 0.17 with them in int4, 0.061 so; the three are ~11% of V3's
     * attention weights: ~6% of the bytes a decode step reads, 3% more than at int4) */
    [SHLM_KIND_ATTN_Q_A] = {"attn_q_a", "attn_q_a.weight", "self_attn.q_a_proj.weight",
        L2C(NONE), true, false, D(Q_LORA), D(MODEL), S(NONE), T(MAT), QKV, NONE, q_lora},
    [SHLM_KIND_ATTN_Q_A_NORM] = {"attn_q_a_norm", "attn_q_a_norm.weight",
        "self_attn.q_a_layernorm.weight",
        L2C(NONE), true, true, D(ONE), D(Q_LORA), S(NONE), T(F32), NONE, NONE, q_lora},
    [SHLM_KIND_ATTN_Q_B] = {"attn_q_b", "attn_q_b.weight", "self_attn.q_b_proj.weight",
        L2C(NONE), true, false, D(Q), D(Q_LORA), S(ROWS), T(MAT), NONE, NONE, q_lora},
    [SHLM_KIND_ATTN_KV_A] = {"attn_kv_a", "attn_kv_a_mqa.weight",
        "self_attn.kv_a_proj_with_mqa.weight",
        L2C(NONE), true, false, D(KV_A), D(MODEL), S(NONE), T(Q8), QKV, NONE, mla},
    [SHLM_KIND_ATTN_KV_A_NORM] = {"attn_kv_a_norm", "attn_kv_a_norm.weight",
        "self_attn.kv_a_layernorm.weight",
        L2C(NONE), true, true, D(ONE), D(KV_LORA), S(NONE), T(F32), NONE, NONE, mla},
    [SHLM_KIND_ATTN_K_B] = {"attn_k_b", "attn_k_b.weight", NULL,
        L2C(NONE), true, false, D(HEADS_LATENT), D(NOPE), S(ROWS), T(Q8), NONE, NONE, mla},
    [SHLM_KIND_ATTN_V_B] = {"attn_v_b", "attn_v_b.weight", NULL,
        L2C(NONE), true, false, D(O), D(KV_LORA), S(ROWS), T(Q8), NONE, O, mla},
    /* the shared experts: a dense FFN split by units as hidden_dim's; rounded to nearest as the
     * routed experts */
    [SHLM_KIND_FFN_GATE_SHEXP] = {"ffn_gate_shexp", "ffn_gate_shexp.weight",
        "mlp.shared_experts.gate_proj.weight",
        L2C(NONE), true, false, D(SH_FFN), D(MODEL), S(ROWS), T(MAT), NONE, NONE, shared},
    [SHLM_KIND_FFN_UP_SHEXP] = {"ffn_up_shexp", "ffn_up_shexp.weight",
        "mlp.shared_experts.up_proj.weight",
        L2C(NONE), true, false, D(SH_FFN), D(MODEL), S(ROWS), T(MAT), NONE, NONE, shared},
    [SHLM_KIND_FFN_DOWN_SHEXP] = {"ffn_down_shexp", "ffn_down_shexp.weight",
        "mlp.shared_experts.down_proj.weight",
        L2C(NONE), true, false, D(MODEL), D(SH_FFN), S(COLS_PADDED), T(MAT), NONE, NONE, shared},
    [SHLM_KIND_FFN_SEL_BIAS] = {"ffn_sel_bias", "exp_probs_b.bias",
        "mlp.gate.e_score_correction_bias",
        L2C(NONE), true, false, D(ONE), D(EXPERTS), S(NONE), T(F32), NONE, NONE, sel_bias},
    /* clang-format on */
};

#undef NONE
#undef QKV
#undef O
#undef GU
#undef DOWN
#undef HEAD
#undef D
#undef S
#undef T
#undef L2C
#undef V
#undef EXP

bool shlm_kind_value_ok(enum shlm_kind kind, float x, const char **expect)
{
    switch (shlm_kinds[kind].value) {
    case SHLM_VALUE_POSITIVE:
        *expect = "> 0";
        return x > 0.0f;
    case SHLM_VALUE_ANY:
        break;
    }
    *expect = "";
    return true;
}

bool shlm_kind_present(const struct shlm_config *c, const struct shlm_config_ext *x,
                       enum shlm_kind kind, uint32_t layer)
{
    return shlm_kinds[kind].has(c, x, layer);
}

bool shlm_kind_any(const struct shlm_config *c, const struct shlm_config_ext *x,
                   enum shlm_kind kind)
{
    uint32_t layers = shlm_kinds[kind].layer ? c->n_layers : 1;
    for (uint32_t l = 0; l < layers; l++)
        if (shlm_kinds[kind].has(c, x, l))
            return true;
    return false;
}

void shlm_kind_name(enum shlm_kind kind, uint32_t layer, uint32_t expert, char *out, size_t len)
{
    const struct shlm_kind_traits *k = &shlm_kinds[kind];
    if (k->expert)
        snprintf(out, len, "blk.%u.%s.%u", layer, k->name, expert);
    else if (k->layer)
        snprintf(out, len, "blk.%u.%s", layer, k->name);
    else
        snprintf(out, len, "%s", k->name);
}

void shlm_kind_gguf_name(const struct shlm_config *c, enum shlm_kind kind, uint32_t layer,
                         char *out, size_t len)
{
    const struct shlm_kind_traits *k = &shlm_kinds[kind];
    const char *g = k->gguf;
    if (c && kind == SHLM_KIND_FFN_NORM && shlm_arch_of(c)->gguf_ffn_norm)
        g = shlm_arch_of(c)->gguf_ffn_norm;
    if (k->layer)
        snprintf(out, len, "blk.%u.%s", layer, g);
    else
        snprintf(out, len, "%s", g);
}

/* Mixtral's and gpt-oss's names of the MoE kinds (shlm_arch_traits.hf_moe); gpt-oss's experts
 * are a layer's fused tensors (no "%u": every expert's rows in one) */
static const char *const moe_hf[][SHLM_KIND_COUNT] = {
    [SHLM_HF_MOE_MIXTRAL] =
        {
            [SHLM_KIND_FFN_ROUTER] = "block_sparse_moe.gate.weight",
            [SHLM_KIND_FFN_GATE_EXP] = "block_sparse_moe.experts.%u.w1.weight",
            [SHLM_KIND_FFN_UP_EXP] = "block_sparse_moe.experts.%u.w3.weight",
            [SHLM_KIND_FFN_DOWN_EXP] = "block_sparse_moe.experts.%u.w2.weight",
        },
    [SHLM_HF_MOE_GPTOSS] =
        {
            [SHLM_KIND_FFN_ROUTER] = "mlp.router.weight",
            [SHLM_KIND_FFN_GATE_EXP] = "mlp.experts.gate_up_proj",
            [SHLM_KIND_FFN_UP_EXP] = "mlp.experts.gate_up_proj",
            [SHLM_KIND_FFN_DOWN_EXP] = "mlp.experts.down_proj",
            [SHLM_KIND_FFN_GATE_EXP_BIAS] = "mlp.experts.gate_up_proj_bias",
            [SHLM_KIND_FFN_UP_EXP_BIAS] = "mlp.experts.gate_up_proj_bias",
            [SHLM_KIND_FFN_DOWN_EXP_BIAS] = "mlp.experts.down_proj_bias",
        },
};

bool shlm_kind_hf_name(const struct shlm_config *c, enum shlm_kind kind, uint32_t layer,
                       uint32_t expert, char *out, size_t len)
{
    const struct shlm_kind_traits *k = &shlm_kinds[kind];
    /* with post-norms post_attention_layernorm is the attention's post-norm (tensors.h) */
    const char *hf = kind == SHLM_KIND_FFN_NORM && (c->flags & SHLM_CF_POST_NORMS)
                         ? "pre_feedforward_layernorm.weight"
                         : k->hf;
    enum shlm_hf_moe hm = shlm_arch_of(c)->hf_moe;
    if (hm != SHLM_HF_MOE_QWEN && moe_hf[hm][kind])
        hf = moe_hf[hm][kind];
    if (!hf)
        return false;
    if (k->expert) {
        char part[SHLM_NAME_MAX + 16];
        snprintf(part, sizeof(part), hf, expert);
        snprintf(out, len, "model.layers.%u.%s", layer, part);
    } else if (k->layer) {
        snprintf(out, len, "model.layers.%u.%s", layer, hf);
    } else {
        snprintf(out, len, "%s", hf);
    }
    return true;
}

/* The fused tensors: the kinds they stack, in row order. */
static const struct {
    const char *gguf, *hf, *what;
    enum shlm_kind parts[3];
    int n;
} fused[] = {
    {"attn_qkv.weight",
     "self_attn.qkv_proj.weight",
     "q, k and v",
     {SHLM_KIND_ATTN_Q, SHLM_KIND_ATTN_K, SHLM_KIND_ATTN_V},
     3},
    {"ffn_up.weight",
     "mlp.gate_up_proj.weight",
     "gate and up",
     {SHLM_KIND_FFN_GATE, SHLM_KIND_FFN_UP},
     2},
};

static void fused_name(size_t f, uint32_t layer, bool hf, char *out, size_t len)
{
    snprintf(out, len, hf ? "model.layers.%u.%s" : "blk.%u.%s", layer,
             hf ? fused[f].hf : fused[f].gguf);
}

bool shlm_kind_fused(const struct shlm_config *c, enum shlm_kind kind, uint32_t layer, bool hf,
                     char *out, size_t len, int *row0, int *total)
{
    if (!shlm_arch_of(c)->fused)
        return false;
    for (size_t f = 0; f < sizeof(fused) / sizeof(fused[0]); f++) {
        int at = -1, rows = 0;
        for (int i = 0; i < fused[f].n; i++) {
            if (fused[f].parts[i] == kind)
                at = rows;
            rows += shlm_dim_size(c, NULL, shlm_kinds[fused[f].parts[i]].rows); /* no MoE dims */
        }
        if (at < 0)
            continue;
        fused_name(f, layer, hf, out, len);
        *row0 = at;
        *total = rows;
        return true;
    }
    return false;
}

bool shlm_fused_stray(const struct shlm_config *c, bool hf,
                      bool (*exists)(const void *ctx, const char *name), const void *ctx, char *out,
                      size_t len, const char **parts)
{
    if (shlm_arch_of(c)->fused)
        return false;
    for (size_t f = 0; f < sizeof(fused) / sizeof(fused[0]); f++) {
        const char *nm = hf ? fused[f].hf : fused[f].gguf;
        bool own = false;
        for (int k = 0; k < SHLM_KIND_COUNT && !own; k++)
            own = strcmp(nm,
                         hf ? (shlm_kinds[k].hf ? shlm_kinds[k].hf : "") : shlm_kinds[k].gguf) == 0;
        for (uint32_t l = 0; !own && l < c->n_layers; l++) {
            fused_name(f, l, hf, out, len);
            if (exists(ctx, out)) {
                *parts = fused[f].what;
                return true;
            }
        }
    }
    return false;
}

/* A decimal number below @limit at *@p without a leading zero, then @end: true with *@p past
 * @end and the number in *@v. */
static bool parse_index(const char **p, uint32_t limit, char end, uint32_t *v)
{
    const char *s = *p;
    uint32_t n = 0;
    int digits = 0;
    for (; *s >= '0' && *s <= '9' && digits < 5; s++, digits++)
        n = n * 10 + (uint32_t)(*s - '0');
    if (digits == 0 || *s != end || (digits > 1 && **p == '0') || n >= limit)
        return false;
    *p = end ? s + 1 : s;
    *v = n;
    return true;
}

bool shlm_kind_parse(const char *name, uint32_t n_layers, uint32_t n_experts, enum shlm_kind *kind,
                     uint32_t *layer, uint32_t *expert)
{
    const char *rest = name;
    uint32_t l = 0, x = 0;
    bool in_layer = strncmp(name, "blk.", 4) == 0;
    if (in_layer) {
        rest = name + 4;
        if (!parse_index(&rest, n_layers, '.', &l))
            return false;
    }
    for (int i = 0; i < SHLM_KIND_COUNT; i++) {
        const struct shlm_kind_traits *k = &shlm_kinds[i];
        size_t n = strlen(k->name);
        if (k->layer != in_layer || strncmp(k->name, rest, n) != 0)
            continue;
        const char *tail = rest + n;
        if (k->expert ? *tail != '.' || (++tail, !parse_index(&tail, n_experts, 0, &x))
                      : *tail != 0)
            continue;
        *kind = (enum shlm_kind)i;
        *layer = l;
        *expert = x;
        return true;
    }
    return false;
}

int shlm_dim_size(const struct shlm_config *c, const struct shlm_config_ext *x, enum shlm_dim d)
{
    switch (d) {
    case SHLM_DIM_EXPERTS:
        return (int)x->n_experts;
    case SHLM_DIM_EXP_FFN:
        return (int)x->expert_ffn;
    case SHLM_DIM_ONE:
        return 1;
    case SHLM_DIM_MODEL:
        return (int)c->dim;
    case SHLM_DIM_Q:
        return (int)(c->n_heads * c->head_dim);
    case SHLM_DIM_KV:
        return (int)(c->n_kv_heads * c->head_dim);
    case SHLM_DIM_HEADS:
        return (int)c->n_heads;
    case SHLM_DIM_HEAD:
        return (int)c->head_dim;
    case SHLM_DIM_ROPE:
        return (int)(x && x->rope_dim ? x->rope_dim : c->head_dim) / 2;
    case SHLM_DIM_O:
        return (int)(c->n_heads * (x ? shlm_v_dim(c, x) : c->head_dim));
    case SHLM_DIM_Q_LORA:
        return (int)x->q_lora_rank;
    case SHLM_DIM_KV_A:
        return (int)shlm_latent_dim(x);
    case SHLM_DIM_KV_LORA:
        return (int)x->kv_lora_rank;
    case SHLM_DIM_HEADS_LATENT:
        return (int)(c->n_heads * x->kv_lora_rank);
    case SHLM_DIM_NOPE:
        return (int)(c->head_dim - x->rope_dim);
    case SHLM_DIM_SH_FFN:
        return (int)x->shared_ffn;
    case SHLM_DIM_FFN:
        return (int)c->hidden_dim;
    case SHLM_DIM_VOCAB:
        return (int)c->vocab_size;
    }
    return 0;
}

void shlm_dim_part(const struct shlm_config *c, const struct shlm_config_ext *x,
                   const struct seg_plan *p, enum shlm_dim d, int *lo, int *hi, int *pad)
{
    int hd = (int)c->head_dim;
    *pad = 0;
    switch (d) {
    case SHLM_DIM_Q:
        *lo = p->q0 * hd;
        *hi = p->q1 * hd;
        *pad = p->o_pad;
        return;
    case SHLM_DIM_KV:
        *lo = p->kv0 * hd;
        *hi = p->kv1 * hd;
        return;
    case SHLM_DIM_HEADS:
        *lo = p->q0;
        *hi = p->q1;
        return;
    case SHLM_DIM_O: {
        int vd = (int)shlm_v_dim(c, x);
        *lo = p->q0 * vd;
        *hi = p->q1 * vd;
        *pad = p->o_pad;
        return;
    }
    case SHLM_DIM_HEADS_LATENT:
        *lo = p->q0 * (int)x->kv_lora_rank;
        *hi = p->q1 * (int)x->kv_lora_rank;
        return;
    case SHLM_DIM_SH_FFN:
        *lo = p->s0;
        *hi = p->s1;
        *pad = p->down_pad_sh;
        return;
    case SHLM_DIM_FFN:
        *lo = p->f0;
        *hi = p->f1;
        *pad = p->down_pad;
        return;
    case SHLM_DIM_EXP_FFN:
        *lo = p->e0;
        *hi = p->e1;
        *pad = p->down_pad_exp;
        return;
    case SHLM_DIM_VOCAB:
        *lo = p->v0;
        *hi = p->v1;
        return;
    default:
        *lo = 0;
        *hi = shlm_dim_size(c, x, d);
    }
}

/* ---- architectures ---- */

#define F(x) SHLM_FAMILY_##x
const struct shlm_arch_traits shlm_archs[SHLM_FAMILY_COUNT] = {
    [F(UNKNOWN)] = {.name = "llama-family", .refused = "no architecture"},
    [F(LLAMA2C)] = {.name = "llama2.c", .act = SHLM_ACT_SILU},
    /* a GGUF "llama" with expert_count is Mixtral */
    [F(LLAMA)] = {.name = "llama",
                  .gguf = "llama",
                  .hf = "LlamaForCausalLM",
                  .act = SHLM_ACT_SILU,
                  .hf_act_key = "hidden_act",
                  .moe = SHLM_MOE_OPTIONAL},
    [F(QWEN2)] = {.name = "qwen2",
                  .gguf = "qwen2",
                  .hf = "Qwen2ForCausalLM",
                  .act = SHLM_ACT_SILU,
                  .hf_act_key = "hidden_act",
                  .gguf_rope_neox = true,
                  .qkv_bias = true},
    [F(GEMMA)] = {.name = "gemma",
                  .gguf = "gemma",
                  .hf = "GemmaForCausalLM",
                  .norm = SHLM_NORM_ONE_PLUS,
                  .act = SHLM_ACT_GELU_TANH,
                  .hf_act_key = "hidden_activation",
                  .gguf_rope_neox = true,
                  .embd_sqrt_dim = true,
                  .hf_tied_default = true},
    /* ours: head_dim != dim / heads, GELU-tanh, per-head output gate (a GGUF says by its
     * tensors) */
    [F(SPARK)] = {.name = "spark",
                  .gguf = "spark",
                  .act = SHLM_ACT_GELU_TANH,
                  .gguf_rope_neox = true},
    [F(QWEN3)] = {.name = "qwen3",
                  .gguf = "qwen3",
                  .hf = "Qwen3ForCausalLM",
                  .act = SHLM_ACT_SILU,
                  .hf_act_key = "hidden_act",
                  .gguf_rope_neox = true,
                  .flags = SHLM_CF_QK_NORM},
    /* pre- and post-norms, soft-caps, even layers windowed */
    [F(GEMMA2)] = {.name = "gemma2",
                   .gguf = "gemma2",
                   .hf = "Gemma2ForCausalLM",
                   .norm = SHLM_NORM_ONE_PLUS,
                   .act = SHLM_ACT_GELU_TANH,
                   .hf_act_key = "hidden_activation",
                   .gguf_rope_neox = true,
                   .flags = SHLM_CF_POST_NORMS,
                   .embd_sqrt_dim = true,
                   .hf_tied_default = true,
                   .attn = SHLM_ATTN_WINDOW_PATTERN,
                   .window_pattern = 2,
                   .window_default = 4096,
                   .gguf_query_dim_heads = {{46}}},
    /* and q/k norms, 5 local : 1 global layers, the local ones at RoPE base 10000 */
    [F(GEMMA3)] = {.name = "gemma3",
                   .gguf = "gemma3",
                   .hf = "Gemma3ForCausalLM",
                   .norm = SHLM_NORM_ONE_PLUS,
                   .act = SHLM_ACT_GELU_TANH,
                   .hf_act_key = "hidden_activation",
                   .gguf_rope_neox = true,
                   .flags = SHLM_CF_POST_NORMS | SHLM_CF_QK_NORM,
                   .embd_sqrt_dim = true,
                   .hf_tied_default = true,
                   .attn = SHLM_ATTN_WINDOW_PATTERN,
                   .window_pattern = 6,
                   .window_default = 4096,
                   .gguf_query_dim_heads = {{62}},
                   .rope_theta_local = 10000.0f},
    /* Phi-3/3.5: fused qkv and gate_up (split at import: shlm_kind_fused), LongRoPE, the
     * config's window on every layer */
    [F(PHI3)] = {.name = "phi3",
                 .gguf = "phi3",
                 .hf = "Phi3ForCausalLM",
                 .act = SHLM_ACT_SILU,
                 .hf_act_key = "hidden_act",
                 .gguf_rope_neox = true,
                 .fused = true,
                 .attn = SHLM_ATTN_WINDOW_CONFIG,
                 /* Phi-3 mini / medium 4k (llama.cpp PR 8931) */
                 .gguf_window_size = {{32, 40}, 4096},
                 .gguf_window_sized = 2047},
    /* Granite 3.x: embedding, residual, attention and logit multipliers (shlm_config_ext) */
    [F(GRANITE)] = {.name = "granite",
                    .gguf = "granite",
                    .hf = "GraniteForCausalLM",
                    .act = SHLM_ACT_SILU,
                    .hf_act_key = "hidden_act",
                    .multipliers = true},
    /* SmolLM3: no RoPE on every fourth layer (shlm_config_ext.nope_interval) */
    [F(SMOLLM3)] = {.name = "smollm3",
                    .gguf = "smollm3",
                    .hf = "SmolLM3ForCausalLM",
                    .act = SHLM_ACT_SILU,
                    .hf_act_key = "hidden_act",
                    .gguf_nope_interval = 4},
    /* Mistral / Ministral: the config's window on every layer where it has one */
    [F(MISTRAL)] = {.name = "mistral",
                    .hf = "MistralForCausalLM",
                    .act = SHLM_ACT_SILU,
                    .hf_act_key = "hidden_act",
                    .attn = SHLM_ATTN_WINDOW_CONFIG},
    /* Qwen3's attention, a MoE FFN in every layer (but Hugging Face's mlp_only_layers) */
    [F(QWEN3MOE)] = {.name = "qwen3moe",
                     .gguf = "qwen3moe",
                     .hf = "Qwen3MoeForCausalLM",
                     .act = SHLM_ACT_SILU,
                     .hf_act_key = "hidden_act",
                     .gguf_rope_neox = true,
                     .flags = SHLM_CF_QK_NORM,
                     .moe = SHLM_MOE_REQUIRED},
    /* Mixtral: Mistral's attention and experts (a GGUF is "llama" with expert_count) */
    [F(MIXTRAL)] = {.name = "mixtral",
                    .hf = "MixtralForCausalLM",
                    .act = SHLM_ACT_SILU,
                    .hf_act_key = "hidden_act",
                    .attn = SHLM_ATTN_WINDOW_CONFIG,
                    .hf_moe = SHLM_HF_MOE_MIXTRAL,
                    .moe = SHLM_MOE_REQUIRED},
    /* gpt-oss: attention sinks and biases, even layers windowed, MoE FFNs with biases and the
     * clamped SwiGLU; the FFN norm is GGUF's post_attention_norm */
    [F(GPTOSS)] = {.name = "gpt-oss",
                   .gguf = "gpt-oss",
                   .hf = "GptOssForCausalLM",
                   .hf_moe = SHLM_HF_MOE_GPTOSS,
                   .act = SHLM_ACT_SWIGLU_OAI,
                   .gguf_rope_neox = true,
                   .qkv_bias = true,
                   .flags = SHLM_CF_ATTN_SINKS | SHLM_CF_O_BIAS | SHLM_CF_MOE_BIAS,
                   .attn = SHLM_ATTN_WINDOW_PATTERN,
                   .window_pattern = 2,
                   .window_default = 128,
                   .gguf_ffn_norm = "post_attention_norm.weight",
                   .moe = SHLM_MOE_REQUIRED},
    /* DeepSeek-V2/V3: multi-head latent attention (RoPE on a part of each head, YaRN's
     * attention factor in the score scale), dense first layers, shared experts beside the
     * routed ones (softmax or sigmoid routing, a selection bias, a weight scale) */
    [F(DEEPSEEK2)] = {.name = "deepseek2",
                      .gguf = "deepseek2",
                      .hf = "DeepseekV3ForCausalLM",
                      .hf_alt = "DeepseekV2ForCausalLM",
                      .hf_act_key = "hidden_act",
                      .act = SHLM_ACT_SILU,
                      .moe = SHLM_MOE_REQUIRED,
                      .mla = true},
};
#undef F

const struct shlm_arch_traits *shlm_arch_gguf(const char *name, size_t len)
{
    for (int i = 0; i < SHLM_FAMILY_COUNT; i++) {
        const char *g = shlm_archs[i].gguf;
        if (g && strlen(g) == len && memcmp(g, name, len) == 0)
            return &shlm_archs[i];
    }
    return NULL;
}

const struct shlm_arch_traits *shlm_arch_hf(const char *name)
{
    for (int i = 0; i < SHLM_FAMILY_COUNT; i++)
        if ((shlm_archs[i].hf && strcmp(shlm_archs[i].hf, name) == 0) ||
            (shlm_archs[i].hf_alt && strcmp(shlm_archs[i].hf_alt, name) == 0))
            return &shlm_archs[i];
    return NULL;
}

void shlm_arch_list(bool hf, char *out, size_t len)
{
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < SHLM_FAMILY_COUNT && n < len; i++) {
        const char *nm = hf ? shlm_archs[i].hf : shlm_archs[i].gguf;
        if (nm && !shlm_archs[i].refused)
            n += (size_t)snprintf(out + n, len - n, "%s%s", n ? ", " : "", nm);
        if (hf && shlm_archs[i].hf_alt && n < len)
            n += (size_t)snprintf(out + n, len - n, ", %s", shlm_archs[i].hf_alt);
    }
}

bool shlm_arch_size_is(const struct shlm_arch_size *z, const struct shlm_config *c)
{
    if (z->ctx && z->ctx != c->seq_len)
        return false;
    for (size_t i = 0; i < sizeof(z->layers) / sizeof(z->layers[0]); i++)
        if (z->layers[i] && z->layers[i] == c->n_layers)
            return true;
    return false;
}

const struct shlm_arch_traits *shlm_arch_of(const struct shlm_config *c)
{
    return &shlm_archs[c->family < SHLM_FAMILY_COUNT ? c->family : SHLM_FAMILY_UNKNOWN];
}

void shlm_arch_apply(const struct shlm_arch_traits *a, bool hf, struct shlm_config *c)
{
    c->family = (uint32_t)(a - shlm_archs);
    c->rope_neox = hf || a->gguf_rope_neox;
    c->act = a->act;
    c->qkv_bias = a->qkv_bias;
    c->flags = a->flags;
    c->embd_scale = a->embd_sqrt_dim ? sqrtf((float)c->dim) : 0.0f;
}

void shlm_arch_apply_ext(const struct shlm_arch_traits *a, struct shlm_config_ext *x)
{
    x->window_pattern = a->attn == SHLM_ATTN_WINDOW_PATTERN ? a->window_pattern : 0;
    x->rope_theta_local = a->rope_theta_local;
}
