/* SPDX-License-Identifier: MIT */
/* coordinator/format/model_keys.c: settings read exactly or refused, and the table of settings
 * that change the computation and that the runtime lacks (see model_keys.h). */
#include "model_keys.h"

#include "tensors.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

const struct coord_key coord_unsupported_keys[] = {
    /* RoPE: GGUF's scaling keys (llama.cpp applies rope.scaling.factor and rope.scale_linear
     * whatever the type; YaRN's, linear's and LongRoPE's are read: read_keys below);
     * config.json's rope_scaling is read by hf_config.c (linear, llama3, yarn and longrope) */
    {"rope.scaling.type", NULL, COORD_KEY_NONE_STR, "RoPE scaling"},
    {"rope.scaling.factor", NULL, COORD_KEY_ZERO_OR_ONE, "RoPE scaling"},
    {"rope.scale_linear", NULL, COORD_KEY_ZERO_OR_ONE, "linear RoPE scaling"},
    {"rope.scaling.attn_factor", NULL, COORD_KEY_ZERO_OR_ONE, "YaRN attention scaling"},
    {"rope.dimension_count", NULL, COORD_KEY_HEAD_DIM, "partial rotary embeddings"},
    {NULL, "partial_rotary_factor", COORD_KEY_ZERO_OR_ONE, "partial rotary embeddings"},
    /* attention */
    {"attention.value_length", NULL, COORD_KEY_HEAD_DIM, "a value head size unlike the key's"},
    {"attention.sliding_window", NULL, COORD_KEY_WINDOW, "sliding-window attention"},
    {NULL, "use_sliding_window", COORD_KEY_FALSE, "sliding-window attention"},
    {"attn_logit_softcapping", "attn_logit_softcapping", COORD_KEY_ZERO,
     "attention logit soft-capping"},
    {"final_logit_softcapping", "final_logit_softcapping", COORD_KEY_ZERO,
     "final logit soft-capping"},
    {"attention.scale", "attention_multiplier", COORD_KEY_ATTN_SCALE, "an attention scale"},
    {NULL, "query_pre_attn_scalar", COORD_KEY_HEAD_DIM, "an attention scale"},
    {"attention.clamp_kqv", "clip_qkv", COORD_KEY_ZERO, "q/k/v clamping"},
    {"attention.causal", NULL, COORD_KEY_TRUE, "non-causal attention"},
    {"attention.max_alibi_bias", NULL, COORD_KEY_ZERO, "ALiBi position biases"},
    {"attention.layer_norm_epsilon", NULL, COORD_KEY_NEVER, "LayerNorm (not RMSNorm)"},
    {NULL, "attention_bias", COORD_KEY_FALSE, "biases on q/k/v/o_proj"},
    {NULL, "mlp_bias", COORD_KEY_FALSE, "biases on the MLP projections"},
    /* multipliers (Granite, Command-R): read for Granite (read_keys below) */
    {"embedding_scale", "embedding_multiplier", COORD_KEY_ZERO_OR_ONE, "an embedding multiplier"},
    {"residual_scale", "residual_multiplier", COORD_KEY_ZERO_OR_ONE, "a residual multiplier"},
    {"logit_scale", "logit_scale", COORD_KEY_ZERO_OR_ONE, "a logit multiplier"},
    {NULL, "logits_scaling", COORD_KEY_ZERO_OR_ONE, "a logit multiplier"},
    /* structure */
    {"use_parallel_residual", "use_parallel_residual", COORD_KEY_FALSE, "parallel residuals"},
    {"expert_count", "num_local_experts", COORD_KEY_ZERO, "mixture of experts"},
    {NULL, "num_experts", COORD_KEY_ZERO, "mixture of experts"},
};
const size_t coord_n_unsupported_keys =
    sizeof(coord_unsupported_keys) / sizeof(coord_unsupported_keys[0]);

/* Which architectures read a key: by the facts of their row (shm/tensors.h). */
static bool windowed(const struct shlm_arch_traits *a) { return a->attn != SHLM_ATTN_GLOBAL; }
static bool patterned(const struct shlm_arch_traits *a)
{
    return a->attn == SHLM_ATTN_WINDOW_PATTERN;
}
static bool multiplied(const struct shlm_arch_traits *a) { return a->multipliers; }
/* GGUF says by expert_count whether a llama is Mixtral; config.json by its class */
static bool experts(const struct shlm_arch_traits *a) { return a->moe != SHLM_MOE_NONE; }
static bool experts_always(const struct shlm_arch_traits *a) { return a->moe == SHLM_MOE_REQUIRED; }
/* gpt-oss's attention has q/k/v and output biases (its row's flags) */
static bool biased(const struct shlm_arch_traits *a) { return (a->flags & SHLM_CF_O_BIAS) != 0; }
/* DeepSeek's latent attention: RoPE on a part of each head, values unlike the keys */
static bool latent(const struct shlm_arch_traits *a) { return a->mla; }

/* The keys of coord_unsupported_keys[] the importers read (by their GGUF and config.json names;
 * NULL: not read in that format), and where: the architectures whose row @by accepts, or any
 * config whose RoPE scaling is one of @ropes (set before the check: GGUF's rope.scaling.* of YaRN
 * and LongRoPE). */
static const struct {
    const char *gguf, *hf;
    bool (*by)(const struct shlm_arch_traits *a); /* NULL: none */
    uint32_t ropes;                               /* 1 << enum shlm_rope_scaling */
} read_keys[] = {
#define ROPE(x) (1u << SHLM_ROPE_##x)
    /* the window (cfg_windows, read_ext); Gemma 2/3's soft-caps and query scalar */
    {"attention.sliding_window", NULL, windowed, 0},
    {"attn_logit_softcapping", "attn_logit_softcapping", patterned, 0},
    {"final_logit_softcapping", "final_logit_softcapping", patterned, 0},
    {NULL, "query_pre_attn_scalar", patterned, 0},
    /* Granite's multipliers (cfg_ext, read_ext) */
    {"embedding_scale", "embedding_multiplier", multiplied, 0},
    {"residual_scale", "residual_multiplier", multiplied, 0},
    {"attention.scale", "attention_multiplier", multiplied, 0},
    {"logit_scale", "logits_scaling", multiplied, 0},
    /* experts (read_ext, cfg_moe) */
    {"expert_count", NULL, experts, 0},
    {NULL, "num_local_experts", experts_always, 0},
    {NULL, "num_experts", experts_always, 0},
    {NULL, "attention_bias", biased, 0},
    /* latent attention's sizes (read_mla) */
    {"rope.dimension_count", NULL, latent, 0},
    {"attention.value_length", NULL, latent, 0},
    /* YaRN's, linear's and LongRoPE's GGUF keys (read_rope_type, read_ext) */
    {"rope.scaling.type", NULL, NULL, ROPE(YARN) | ROPE(LINEAR)},
    {"rope.scaling.factor", NULL, NULL, ROPE(YARN) | ROPE(LINEAR)},
    {"rope.scaling.attn_factor", NULL, NULL, ROPE(YARN) | ROPE(LONGROPE)},
#undef ROPE
};

bool coord_key_read_by(const struct coord_key *k, bool hf, const struct shlm_config *c)
{
    const char *name = hf ? k->hf : k->gguf;
    const struct shlm_arch_traits *a = shlm_arch_of(c);
    for (size_t i = 0; name && i < sizeof(read_keys) / sizeof(read_keys[0]); i++) {
        const char *r = hf ? read_keys[i].hf : read_keys[i].gguf;
        if (r && !strcmp(name, r) &&
            ((read_keys[i].by && read_keys[i].by(a)) ||
             (c->rope_scaling < 32 && (read_keys[i].ropes >> c->rope_scaling & 1u))))
            return true;
    }
    return false;
}

void coord_yarn_context(struct shlm_config *c)
{
    double ext = (double)c->rope_orig_ctx * c->rope_factor;
    ext = ext < (double)(1u << 20) ? floor(ext) : (double)(1u << 20);
    if (ext > (double)c->seq_len)
        c->seq_len = (uint32_t)ext;
}

/* The wrong-type message of @v for a setting that takes @expected. */
static int wrong_type(const struct coord_val *v, const char *label, const char *expected,
                      struct shardlm_err *e)
{
    return shardlm_fail(e, -EINVAL, "%s is of type %s, expected %s", label, v->type, expected);
}

int coord_val_uint(const struct coord_val *v, const char *label, uint64_t lo, uint64_t hi,
                   uint32_t *out, struct shardlm_err *e)
{
    if (v->kind == COORD_VAL_ABSENT)
        return shardlm_fail(e, -ENOENT, "%s is missing", label);
    if (v->kind != COORD_VAL_NUM)
        return wrong_type(v, label, "an integer", e);
    if (!isfinite(v->num) || v->num != floor(v->num))
        return shardlm_fail(e, -EINVAL, "%s is %.9g, expected an integer", label, v->num);
    if (v->num < (double)lo || v->num > (double)hi)
        return shardlm_fail(e, -EINVAL, "%s is %.17g, expected %llu..%llu", label, v->num,
                            (unsigned long long)lo, (unsigned long long)hi);
    *out = (uint32_t)v->num;
    return 0;
}

int coord_val_real(const struct coord_val *v, const char *label, double lo, double hi, float *out,
                   struct shardlm_err *e)
{
    if (v->kind == COORD_VAL_ABSENT)
        return shardlm_fail(e, -ENOENT, "%s is missing", label);
    if (v->kind != COORD_VAL_NUM)
        return wrong_type(v, label, "a number", e);
    if (!isfinite(v->num) || !(v->num > lo && v->num < hi))
        return shardlm_fail(e, -EINVAL, "%s is %.9g, expected a number in (%g, %g)", label, v->num,
                            lo, hi);
    *out = (float)v->num;
    return 0;
}

/* Whether number @x is neutral for @k in config @c. */
static bool num_neutral(enum coord_key_neutral n, double x, const struct shlm_config *c)
{
    switch (n) {
    case COORD_KEY_ZERO:
    case COORD_KEY_FALSE:
        return x == 0.0;
    case COORD_KEY_ZERO_OR_ONE:
        return x == 0.0 || x == 1.0;
    case COORD_KEY_TRUE:
        return x == 1.0;
    case COORD_KEY_HEAD_DIM:
        return x == (double)c->head_dim;
    case COORD_KEY_ATTN_SCALE: {
        double s = 1.0 / sqrt((double)c->head_dim);
        return x == 0.0 || fabs(x - s) <= 1e-6 * s;
    }
    case COORD_KEY_WINDOW:
        return x == 0.0 || x >= (double)c->seq_len;
    default:
        return false;
    }
}

int coord_key_check(const struct coord_key *k, const struct coord_val *v, const char *label,
                    const struct shlm_config *c, struct shardlm_err *e)
{
    char val[160];
    bool neutral;
    switch (v->kind) {
    case COORD_VAL_ABSENT:
        return 0;
    case COORD_VAL_NUM:
        if (k->neutral == COORD_KEY_NONE_STR)
            return wrong_type(v, label, "a string", e);
        neutral = num_neutral(k->neutral, v->num, c);
        snprintf(val, sizeof(val), "%.9g", v->num);
        break;
    case COORD_VAL_BOOL:
        if (k->neutral != COORD_KEY_ZERO && k->neutral != COORD_KEY_FALSE &&
            k->neutral != COORD_KEY_TRUE && k->neutral != COORD_KEY_NEVER)
            return wrong_type(v, label, "a number", e);
        neutral = k->neutral == COORD_KEY_TRUE ? v->b : k->neutral != COORD_KEY_NEVER && !v->b;
        snprintf(val, sizeof(val), "%s", v->b ? "true" : "false");
        break;
    case COORD_VAL_STR:
        if (k->neutral != COORD_KEY_NONE_STR && k->neutral != COORD_KEY_NEVER)
            return wrong_type(v, label, "a number", e);
        neutral = k->neutral == COORD_KEY_NONE_STR && v->len == 4 && !memcmp(v->str, "none", 4);
        val[0] = '"';
        coord_escape(val + 1, sizeof(val) - 2, v->str, v->len > 64 ? 64 : v->len);
        strcat(val, "\"");
        break;
    default:
        if (k->neutral != COORD_KEY_NEVER)
            return wrong_type(v, label, k->neutral == COORD_KEY_NONE_STR ? "a string" : "a number",
                              e);
        neutral = false;
        snprintf(val, sizeof(val), "an %s", v->type);
    }
    if (neutral)
        return 0;
    return shardlm_fail(e, -EINVAL, "%s is %s (%s: not supported)", label, val, k->what);
}
