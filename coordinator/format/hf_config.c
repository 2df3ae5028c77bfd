/* SPDX-License-Identifier: MIT */
/* coordinator/format/hf_config.c: the config.json parser of Hugging Face checkpoints (the
 * architectures of shm/tensors.h's table): every field type-checked and range-checked, features the
 * runtime lacks refused by name. */
#include "hf_config.h"

#include "model_keys.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

/* Optional fields may be absent or null; every other type mismatch is an error. */
static const json_t *field(const json_t *root, const char *key)
{
    const json_t *v = json_object_get(root, key);
    return json_is_null(v) ? NULL : v;
}

/* An integer field in [lo, hi]; @def when absent unless @required. */
static int cfg_uint(const json_t *root, const char *obj, const char *key, uint64_t lo,
                    uint64_t hi, bool required, uint32_t def, uint32_t *out, const char *what,
                    struct shardlm_err *e)
{
    const json_t *v = field(root, key);
    if (!v) {
        if (required)
            return shardlm_fail(e, -EINVAL, "%s: field %s%s is missing", what, obj, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return shardlm_fail(e, -EINVAL, "%s: field %s%s: expected an integer", what, obj, key);
    json_int_t i = json_integer_value(v);
    if (i < 0 || (uint64_t)i < lo || (uint64_t)i > hi)
        return shardlm_fail(e, -EINVAL, "%s: field %s%s is %lld, expected %llu..%llu", what, obj,
                            key, (long long)i, (unsigned long long)lo, (unsigned long long)hi);
    *out = (uint32_t)i;
    return 0;
}

/* A number field (integer or real) in the open interval (lo, hi); @def when absent unless
 * @required. */
static int cfg_num(const json_t *root, const char *obj, const char *key, double lo, double hi,
                   bool required, float def, float *out, const char *what, struct shardlm_err *e)
{
    const json_t *v = field(root, key);
    if (!v) {
        if (required)
            return shardlm_fail(e, -EINVAL, "%s: field %s%s is missing", what, obj, key);
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return shardlm_fail(e, -EINVAL, "%s: field %s%s: expected a number", what, obj, key);
    double d = json_number_value(v);
    if (!isfinite(d) || !(d > lo && d < hi))
        return shardlm_fail(e, -EINVAL, "%s: field %s%s is %g, expected a number in (%g, %g)", what,
                            obj, key, d, lo, hi);
    *out = (float)d;
    return 0;
}

static int cfg_bool(const json_t *root, const char *obj, const char *key, bool def, bool *out,
                    const char *what, struct shardlm_err *e)
{
    const json_t *v = field(root, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return shardlm_fail(e, -EINVAL, "%s: field %s%s: expected true or false", what, obj, key);
    *out = json_is_true(v);
    return 0;
}

/* bos_token_id / eos_token_id: an id, a list of ids (the first is taken, every one must be an
 * id), or absent (-1); each inside the vocabulary of @vocab tokens. */
static int cfg_token(const json_t *root, const char *key, uint32_t vocab, int64_t *out,
                     const char *what, struct shardlm_err *e)
{
    const json_t *v = field(root, key), *it;
    *out = -1;
    if (!v)
        return 0;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        it = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(it))
            return shardlm_fail(e, -EINVAL, "%s: field %s: expected a token id (or a list of them)",
                                what, key);
        json_int_t id = json_integer_value(it);
        if (id < 0 || id >= (json_int_t)vocab)
            return shardlm_fail(e, -EINVAL, "%s: field %s is %lld, outside vocab_size %u", what,
                                key, (long long)id, vocab);
        if (i == 0)
            *out = id;
    }
    return 0;
}

static int cfg_act(const json_t *root, const struct shlm_arch_traits *a, uint32_t *act,
                   const char *what, struct shardlm_err *e)
{
    /* The row's key and default: Gemma's hidden_activation (when it is absent transformers uses
     * gelu_pytorch_tanh whatever hidden_act says), the others' hidden_act, silu by default. */
    const char *key = a->hf_act_key;
    const json_t *v = key ? field(root, key) : NULL; /* NULL: the row's (gpt-oss's) */
    if (!v) {
        *act = a->act;
        return 0;
    }
    const char *s = json_string_value(v);
    if (!s)
        return shardlm_fail(e, -EINVAL, "%s: field %s: expected a string", what, key);
    if (!strcmp(s, "silu") || !strcmp(s, "swish"))
        *act = SHLM_ACT_SILU;
    else if (!strcmp(s, "gelu_pytorch_tanh") || !strcmp(s, "gelu_new") ||
             (a->act == SHLM_ACT_GELU_TANH && !strcmp(s, "gelu")))
        *act = SHLM_ACT_GELU_TANH;
    else {
        char shown[100];
        return shardlm_fail(e, -EINVAL,
                            "%s: field %s is \"%s\", expected silu or "
                            "gelu_pytorch_tanh",
                            what, key, coord_escape_str(shown, sizeof(shown), s));
    }
    return 0;
}

/* rope_scaling.@key: a list of @n numbers into @out. */
static int cfg_factors(const json_t *rs, const char *key, uint32_t n, float *out, const char *what,
                       struct shardlm_err *e)
{
    const json_t *a = field(rs, key);
    if (!json_is_array(a) || json_array_size(a) != n)
        return shardlm_fail(e, -EINVAL, "%s: field rope_scaling.%s: expected a list of %u numbers",
                            what, key, n);
    for (uint32_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        double d = json_number_value(v);
        if (!json_is_number(v) || !isfinite(d) || !(d > 0.0 && d < 1e30))
            return shardlm_fail(e, -EINVAL,
                                "%s: field rope_scaling.%s[%u]: expected a positive number", what,
                                key, i);
        out[i] = (float)d;
    }
    return 0;
}

/* LongRoPE (Phi-3.5): short_factor and long_factor, original_max_position_embeddings (top level,
 * as Phi3Config has it, or in rope_scaling), the attention factor (rope_scaling's, else
 * transformers' sqrt(1 + ln(s) / ln(orig)) of s = max_position_embeddings / orig). */
static int cfg_longrope(const json_t *root, const json_t *rs, struct coord_hf_config *hc,
                        const char *what, struct shardlm_err *e)
{
    struct shlm_config *c = &hc->cfg;
    uint32_t half = c->head_dim / 2;
    int rc;
    if (half > sizeof(hc->rope_short) / sizeof(hc->rope_short[0]))
        return shardlm_fail(e, -EINVAL, "%s: field head_dim is %u: LongRoPE takes at most 1024",
                            what, c->head_dim);
    if ((rc = cfg_factors(rs, "short_factor", half, hc->rope_short, what, e)) ||
        (rc = cfg_factors(rs, "long_factor", half, hc->rope_long, what, e)))
        return rc;
    const json_t *in = field(rs, "original_max_position_embeddings") ? rs : root;
    if ((rc = cfg_uint(in, in == rs ? "rope_scaling." : "", "original_max_position_embeddings", 2,
                       1u << 24, true, 0, &c->rope_orig_ctx, what, e)))
        return rc;
    float def =
        kn_rope_longrope_attn((float)c->seq_len / (float)c->rope_orig_ctx, (int)c->rope_orig_ctx);
    if ((rc = cfg_num(rs, "rope_scaling.", "attention_factor", 0.0, 1e6, false, def,
                      &hc->cfgx.rope_attn_factor, what, e)))
        return rc;
    c->rope_scaling = SHLM_ROPE_LONGROPE;
    return 0;
}

/* YaRN (Qwen2.5): factor and original_max_position_embeddings (vLLM's and llama.cpp's reading:
 * the interpolation by factor past the original context), beta_fast and beta_slow (32 and 1
 * when absent), attention_factor (0.1 ln(factor) + 1 when absent), truncate (false: the ramp's
 * bounds unrounded, gpt-oss's; a GGUF's are rounded, as ggml's). DeepSeek's mscale and
 * mscale_all_dim are refused by name. */
/* YaRN's magnitude in transformers' terms: 0.1 m ln(factor) + 1 (yarn_get_mscale), 1 at a factor
 * of 1 or below */
static double yarn_mscale(double factor, double m)
{
    return factor <= 1.0 ? 1.0 : 0.1 * m * log(factor) + 1.0;
}

/* DeepSeek's YaRN (rope_scaling.mscale and mscale_all_dim, transformers' deepseek_v3): cos and sin
 * times attention_factor, else mscale(mscale) / mscale(mscale_all_dim) where both are set, else
 * YaRN's own; the scores times mscale(mscale_all_dim)^2 where it is set (softmax_scale). */
static int cfg_yarn_mscale(const json_t *rs, struct coord_hf_config *hc, float attn,
                           const char *what, struct shardlm_err *e)
{
    struct shlm_config *c = &hc->cfg;
    struct shlm_config_ext *x = &hc->cfgx;
    float ms = 0.0f, all = 0.0f;
    int rc;
    if ((rc = cfg_num(rs, "rope_scaling.", "mscale", -1e6, 1e6, false, 0.0f, &ms, what, e)) ||
        (rc =
             cfg_num(rs, "rope_scaling.", "mscale_all_dim", -1e6, 1e6, false, 0.0f, &all, what, e)))
        return rc;
    double f = c->rope_factor, own = 0.1 * log(f) + 1.0;
    if (attn <= 0.0f && ms != 0.0f && all != 0.0f)
        x->rope_attn_factor = (float)(yarn_mscale(f, ms) / yarn_mscale(f, all) / own);
    if (all != 0.0f) {
        double m = yarn_mscale(f, all);
        x->query_scale = (float)(m * m / sqrt((double)c->head_dim));
    }
    if (!(x->query_scale >= 0.0f && x->query_scale < 1e6f && x->rope_attn_factor >= 0.0f &&
          x->rope_attn_factor < 1e6f))
        return shardlm_fail(e, -EINVAL,
                            "%s: fields rope_scaling.mscale / mscale_all_dim are %g / %g: the "
                            "magnitudes they make are not positive",
                            what, (double)ms, (double)all);
    return 0;
}

static int cfg_yarn(const json_t *rs, struct coord_hf_config *hc, const char *what,
                    struct shardlm_err *e)
{
    struct shlm_config *c = &hc->cfg;
    struct shlm_config_ext *x = &hc->cfgx;
    const char *o = "rope_scaling.";
    static const char *const refused[] = {"mscale", "mscale_all_dim"};
    for (size_t i = 0; i < 2 && !hc->arch->mla; i++) /* DeepSeek's: below */
        if (field(rs, refused[i]))
            return shardlm_fail(e, -EINVAL,
                                "%s: field rope_scaling.%s: not supported (YaRN "
                                "with DeepSeek's magnitude scaling)",
                                what, refused[i]);
    /* truncate false (gpt-oss): the ramp's bounds unrounded */
    bool truncate = true;
    int rc;
    if ((rc = cfg_bool(rs, o, "truncate", true, &truncate, what, e)))
        return rc;
    x->yarn_exact = !truncate;
    float attn = 0.0f;
    if ((rc = cfg_num(rs, o, "factor", 0.0, 1e30, true, 0, &c->rope_factor, what, e)) ||
        (rc = cfg_uint(rs, o, "original_max_position_embeddings", 1, 1u << 24, false, c->seq_len,
                       &c->rope_orig_ctx, what, e)) ||
        (rc = cfg_num(rs, o, "beta_fast", 0.0, 1e6, false, 32.0f, &x->yarn_beta_fast, what, e)) ||
        (rc = cfg_num(rs, o, "beta_slow", 0.0, 1e6, false, 1.0f, &x->yarn_beta_slow, what, e)) ||
        (rc = cfg_num(rs, o, "attention_factor", 0.0, 1e6, false, 0.0f, &attn, what, e)))
        return rc;
    if (c->rope_factor < 1.0f || c->rope_factor > 1024.0f)
        return shardlm_fail(e, -EINVAL, "%s: field rope_scaling.factor is %g, expected 1..1024",
                            what, (double)c->rope_factor);
    coord_yarn_context(c);
    /* the kernel multiplies its own 0.1 ln(factor) + 1 by this (kn.h) */
    x->rope_attn_factor = attn > 0.0f ? attn / (0.1f * logf(c->rope_factor) + 1.0f) : 0.0f;
    c->rope_scaling = SHLM_ROPE_YARN;
    return hc->arch->mla ? cfg_yarn_mscale(rs, hc, attn, what, e) : 0;
}

/* linear (position interpolation; Gemma 3 4B..27B: factor 8 on the global layers, as
 * transformers' rotary_emb, the local ones plain): factor 1..1024. */
static int cfg_linear(const json_t *rs, struct shlm_config *c, const char *what,
                      struct shardlm_err *e)
{
    int rc = cfg_num(rs, "rope_scaling.", "factor", 0.0, 1e30, true, 0, &c->rope_factor, what, e);
    if (rc)
        return rc;
    if (c->rope_factor < 1.0f || c->rope_factor > 1024.0f)
        return shardlm_fail(e, -EINVAL, "%s: field rope_scaling.factor is %g, expected 1..1024",
                            what, (double)c->rope_factor);
    c->rope_scaling = SHLM_ROPE_LINEAR;
    return 0;
}

/* rope_scaling: null, {"rope_type": "default"}, linear, llama3, yarn or longrope scaling. */
static int cfg_rope_scaling(const json_t *root, struct coord_hf_config *hc, const char *what,
                            struct shardlm_err *e)
{
    struct shlm_config *c = &hc->cfg;
    const json_t *rs = field(root, "rope_scaling");
    c->rope_scaling = SHLM_ROPE_NONE;
    if (!rs)
        return 0;
    if (!json_is_object(rs))
        return shardlm_fail(e, -EINVAL, "%s: field rope_scaling: expected an object or null", what);
    const json_t *ty = field(rs, "rope_type");
    if (!ty)
        ty = field(rs, "type");
    const char *t = json_string_value(ty);
    if (!t)
        return shardlm_fail(e, -EINVAL, "%s: field rope_scaling.rope_type: expected a string",
                            what);
    if (!strcmp(t, "default"))
        return 0;
    if (!strcmp(t, "longrope"))
        return cfg_longrope(root, rs, hc, what, e);
    if (!strcmp(t, "yarn"))
        return cfg_yarn(rs, hc, what, e);
    if (!strcmp(t, "linear"))
        return cfg_linear(rs, c, what, e);
    if (strcmp(t, "llama3") != 0) {
        char shown[100];
        return shardlm_fail(e, -EINVAL,
                            "%s: field rope_scaling.rope_type is \"%s\": only "
                            "linear, llama3, yarn and longrope scaling are supported",
                            what, coord_escape_str(shown, sizeof(shown), t));
    }
    const char *o = "rope_scaling.";
    int rc;
    if ((rc = cfg_num(rs, o, "factor", 0.0, 1e30, true, 0, &c->rope_factor, what, e)) ||
        (rc = cfg_num(rs, o, "low_freq_factor", 0.0, 1e30, true, 0, &c->rope_low_freq_factor,
                      what, e)) ||
        (rc = cfg_num(rs, o, "high_freq_factor", 0.0, 1e30, true, 0, &c->rope_high_freq_factor,
                      what, e)) ||
        (rc = cfg_uint(rs, o, "original_max_position_embeddings", 1, 1u << 24, true, 0,
                       &c->rope_orig_ctx, what, e)))
        return rc;
    if (c->rope_factor < 1.0f || c->rope_factor > 1024.0f ||
        !(c->rope_high_freq_factor > c->rope_low_freq_factor))
        return shardlm_fail(e, -EINVAL,
                            "%s: field rope_scaling: expected factor 1..1024 and "
                            "low_freq_factor < high_freq_factor",
                            what);
    c->rope_scaling = SHLM_ROPE_LLAMA3;
    return 0;
}

/* What the newer architectures add (shlm_config_ext): Granite's embedding, residual, attention
 * and logit multipliers; SmolLM3's layers without RoPE
 * (no_rope_layers: 1 where a layer has RoPE, which must be every layer but each
 * no_rope_layer_interval-th, as transformers' default makes it). */
/* DeepSeek's latent attention: q_lora_rank (null or absent: q_proj itself, V2-Lite's),
 * kv_lora_rank, qk_nope_head_dim + qk_rope_head_dim (a head; head_dim, where transformers sets
 * it, is the RoPE part's), v_head_dim; a key per head; RoPE on interleaved pairs unless
 * rope_interleave is false (transformers de-interleaves the stored pairs, as GGUF's rotation
 * reads them). */
static int cfg_mla(const json_t *root, struct coord_hf_config *hc, const char *what,
                   struct shardlm_err *e)
{
    struct shlm_config *c = &hc->cfg;
    struct shlm_config_ext *x = &hc->cfgx;
    uint32_t nope, rope;
    bool interleave = true;
    int rc;
    if ((rc = cfg_uint(root, "", "q_lora_rank", 0, 65536, false, 0, &x->q_lora_rank, what, e)) ||
        (rc = cfg_uint(root, "", "kv_lora_rank", 16, 4096, true, 0, &x->kv_lora_rank, what, e)) ||
        (rc = cfg_uint(root, "", "qk_nope_head_dim", 1, 1024, true, 0, &nope, what, e)) ||
        (rc = cfg_uint(root, "", "qk_rope_head_dim", 2, 1024, true, 0, &rope, what, e)) ||
        (rc = cfg_uint(root, "", "v_head_dim", 16, 1024, true, 0, &x->v_head_dim, what, e)) ||
        (rc = cfg_bool(root, "", "rope_interleave", true, &interleave, what, e)))
        return rc;
    if (nope + rope > 1024)
        return shardlm_fail(e, -EINVAL,
                            "%s: fields qk_nope_head_dim + qk_rope_head_dim are %u + %u, expected "
                            "at most 1024",
                            what, nope, rope);
    if (c->n_kv_heads != c->n_heads)
        return shardlm_fail(e, -EINVAL,
                            "%s: field num_key_value_heads is %u: latent attention has a key per "
                            "head (%u)",
                            what, c->n_kv_heads, c->n_heads);
    c->head_dim = nope + rope;
    x->rope_dim = rope;
    c->rope_neox = !interleave;
    return 0;
}

/* DeepSeek's experts: n_routed_experts of moe_intermediate_size units, num_experts_per_tok of
 * them, n_shared_experts beside them, the first first_k_dense_replace layers dense
 * (intermediate_size), every later one sparse (moe_layer_freq 1); scoring_func softmax or
 * sigmoid, topk_method greedy, group_limited_greedy (softmax's: groups by their best) or
 * noaux_tc (sigmoid's: groups by their two best's sum, the selection bias
 * e_score_correction_bias), n_group / topk_group, norm_topk_prob, routed_scaling_factor. */
static int cfg_mla_moe(const json_t *root, struct coord_hf_config *hc, const char *what,
                       struct shardlm_err *e)
{
    struct shlm_config *c = &hc->cfg;
    struct shlm_config_ext *x = &hc->cfgx;
    uint32_t shared, freq, groups, topk_groups;
    bool norm = false;
    int rc;
    if ((rc = cfg_uint(root, "", "n_routed_experts", 1, SHLM_MAX_EXPERTS, true, 0, &x->n_experts,
                       what, e)))
        return rc;
    uint32_t most = x->n_experts < 64 ? x->n_experts : 64;
    if ((rc = cfg_uint(root, "", "num_experts_per_tok", 1, most, true, 0, &x->n_experts_used, what,
                       e)) ||
        (rc = cfg_uint(root, "", "moe_intermediate_size", 1, 1u << 20, true, 0, &x->expert_ffn,
                       what, e)) ||
        (rc = cfg_uint(root, "", "n_shared_experts", 0, 64, false, 0, &shared, what, e)) ||
        (rc = cfg_uint(root, "", "first_k_dense_replace", 0, c->n_layers, false, 0,
                       &x->moe_dense_first, what, e)) ||
        (rc = cfg_uint(root, "", "moe_layer_freq", 1, 1, false, 1, &freq, what, e)) ||
        (rc = cfg_num(root, "", "routed_scaling_factor", 0.0, 1e6, false, 0.0f, &x->route_scale,
                      what, e)) ||
        (rc = cfg_bool(root, "", "norm_topk_prob", false, &norm, what, e)) ||
        (rc = cfg_uint(root, "", "n_group", 1, x->n_experts, false, 1, &groups, what, e)) ||
        (rc = cfg_uint(root, "", "topk_group", 1, groups, false, groups, &topk_groups, what, e)))
        return rc;
    const json_t *sf = field(root, "scoring_func"), *tm = field(root, "topk_method");
    const char *scoring = sf ? json_string_value(sf) : "softmax";
    const char *method = tm ? json_string_value(tm) : "greedy";
    bool sigmoid = scoring && !strcmp(scoring, "sigmoid");
    if (!scoring || (!sigmoid && strcmp(scoring, "softmax")))
        return shardlm_fail(e, -EINVAL,
                            "%s: field scoring_func: expected \"softmax\" or \"sigmoid\"", what);
    bool greedy = method && !strcmp(method, "greedy");
    if (!method || (!greedy && strcmp(method, sigmoid ? "noaux_tc" : "group_limited_greedy")))
        return shardlm_fail(e, -EINVAL,
                            "%s: field topk_method: expected \"greedy\" or, with scoring_func "
                            "%s, \"%s\"",
                            what, sigmoid ? "sigmoid" : "softmax",
                            sigmoid ? "noaux_tc" : "group_limited_greedy");
    x->shared_ffn = shared * x->expert_ffn;
    x->moe_route = sigmoid ? (norm ? SHLM_ROUTE_SIGMOID_NORM : SHLM_ROUTE_SIGMOID)
                           : (norm ? SHLM_ROUTE_SOFTMAX_NORM : SHLM_ROUTE_SOFTMAX);
    if (!greedy && groups > 1 && topk_groups < groups) { /* all groups: no limit */
        x->n_groups = groups;
        x->topk_groups = topk_groups;
    }
    if (sigmoid && !greedy) /* noaux_tc's e_score_correction_bias */
        c->flags |= SHLM_CF_SEL_BIAS;
    /* DeepSeek-V2's own code scales the weights only where it does not renormalise them (V3's
     * always) */
    const char *cls = json_string_value(json_array_get(field(root, "architectures"), 0));
    if (norm && cls && !strcmp(cls, "DeepseekV2ForCausalLM"))
        x->route_scale = 0.0f;
    return 0;
}

static int cfg_ext(const json_t *root, const struct shlm_arch_traits *a, struct coord_hf_config *hc,
                   const char *what, struct shardlm_err *e)
{
    struct shlm_config *c = &hc->cfg;
    struct shlm_config_ext *x = &hc->cfgx;
    int rc;
    if (a->mla && (rc = cfg_mla(root, hc, what, e)))
        return rc;
    if (a->multipliers && ((rc = cfg_num(root, "", "embedding_multiplier", 0.0, 65536.0, false,
                                         0.0f, &c->embd_scale, what, e)) ||
                           (rc = cfg_num(root, "", "residual_multiplier", 0.0, 1e6, false, 0.0f,
                                         &x->resid_mult, what, e)) ||
                           (rc = cfg_num(root, "", "attention_multiplier", 0.0, 1e6, false, 0.0f,
                                         &x->query_scale, what, e)) ||
                           (rc = cfg_num(root, "", "logits_scaling", 0.0, 1e6, false, 0.0f,
                                         &x->logit_scale, what, e))))
        return rc;
    if (a->gguf_nope_interval) {
        uint32_t n;
        if ((rc = cfg_uint(root, "", "no_rope_layer_interval", 1, 1024, false,
                           a->gguf_nope_interval, &n, what, e)))
            return rc;
        const json_t *l = field(root, "no_rope_layers");
        if (l && (!json_is_array(l) || json_array_size(l) != c->n_layers))
            return shardlm_fail(e, -EINVAL,
                                "%s: field no_rope_layers: expected a list of %u 0s and 1s", what,
                                c->n_layers);
        for (uint32_t i = 0; l && i < c->n_layers; i++) {
            const json_t *v = json_array_get(l, i);
            json_int_t want = (i + 1) % n != 0;
            if (!json_is_integer(v) || json_integer_value(v) != want)
                return shardlm_fail(e, -EINVAL,
                                    "%s: field no_rope_layers[%u]: expected %d (no RoPE on every "
                                    "%u-th layer: other patterns are not supported)",
                                    what, i, (int)want, n);
        }
        x->nope_interval = n;
    }
    return 0;
}

/* architectures[0]: a supported row of the architecture table, or an error naming what is not
 * supported. */
static int cfg_family(const json_t *root, const struct shlm_arch_traits **out, const char *what,
                      struct shardlm_err *e)
{
    const json_t *archs = field(root, "architectures");
    const char *arch = json_is_array(archs) ? json_string_value(json_array_get(archs, 0)) : NULL;
    if (!arch)
        return shardlm_fail(e, -EINVAL, "%s: field architectures: expected a list of names", what);
    const struct shlm_arch_traits *a = shlm_arch_hf(arch);
    if (a && a->refused)
        return shardlm_fail(e, -EINVAL, "%s: field architectures[0] is %s: not supported (%s)",
                            what, a->hf, a->refused);
    if (!a) {
        char shown[100], names[512];
        shlm_arch_list(true, names, sizeof(names));
        return shardlm_fail(e, -EINVAL, "%s: field architectures[0] is \"%s\", expected one of %s",
                            what, coord_escape_str(shown, sizeof(shown), arch), names);
    }
    *out = a;
    return 0;
}

/* The model's shape: sizes, layer and head counts, context, norm epsilon, rope theta. */
static int cfg_shape(const json_t *r, struct shlm_config *c, const char *what,
                     struct shardlm_err *e)
{
    int rc;
    if ((rc = cfg_uint(r, "", "hidden_size", 1, 65536, true, 0, &c->dim, what, e)) ||
        (rc = cfg_uint(r, "", "intermediate_size", 1, 1u << 20, true, 0, &c->hidden_dim, what,
                       e)) ||
        (rc = cfg_uint(r, "", "num_hidden_layers", 1, 1024, true, 0, &c->n_layers, what, e)) ||
        (rc = cfg_uint(r, "", "num_attention_heads", 1, 1024, true, 0, &c->n_heads, what, e)) ||
        (rc = cfg_uint(r, "", "num_key_value_heads", 1, 1024, false, c->n_heads, &c->n_kv_heads,
                       what, e)) ||
        (rc = cfg_uint(r, "", "vocab_size", 1, 1u << 22, true, 0, &c->vocab_size, what, e)) ||
        (rc = cfg_uint(r, "", "max_position_embeddings", 1, 1u << 20, true, 0, &c->seq_len,
                       what, e)) ||
        (rc = cfg_num(r, "", "rms_norm_eps", 0.0, 1.0, true, 0, &c->norm_eps, what, e)) ||
        (rc = cfg_num(r, "", "rope_theta", 1.0, 1e30, false, 10000.0f, &c->rope_theta, what, e)))
        return rc;
    return 0;
}

/* Heads: num_key_value_heads divides num_attention_heads; head_dim even, hidden_size /
 * num_attention_heads when absent (which must then divide). */
static int cfg_heads(const json_t *root, struct shlm_config *c, const char *what,
                     struct shardlm_err *e)
{
    if (c->n_heads % c->n_kv_heads)
        return shardlm_fail(e, -EINVAL,
                            "%s: field num_key_value_heads %u does not divide "
                            "num_attention_heads %u",
                            what, c->n_kv_heads, c->n_heads);
    if (!field(root, "head_dim") && c->dim % c->n_heads)
        return shardlm_fail(e, -EINVAL,
                            "%s: field head_dim is missing and num_attention_heads %u "
                            "does not divide hidden_size %u",
                            what, c->n_heads, c->dim);
    int rc = cfg_uint(root, "", "head_dim", 2, 1024, false, c->dim / c->n_heads, &c->head_dim,
                      what, e);
    if (rc)
        return rc;
    if (c->head_dim % 2)
        return shardlm_fail(e, -EINVAL, "%s: field head_dim is %u, expected an even number", what,
                            c->head_dim);
    return 0;
}

/* JSON value @j (NULL: absent or null) as a setting (model_keys.h). */
static void json_val(const json_t *j, struct coord_val *v)
{
    memset(v, 0, sizeof(*v));
    v->kind = COORD_VAL_OTHER;
    if (!j) {
        v->kind = COORD_VAL_ABSENT;
    } else if (json_is_number(j)) {
        v->kind = COORD_VAL_NUM;
        v->num = json_number_value(j);
        v->type = json_is_integer(j) ? "integer" : "real";
    } else if (json_is_boolean(j)) {
        v->kind = COORD_VAL_BOOL;
        v->b = json_is_true(j);
        v->type = "boolean";
    } else if (json_is_string(j)) {
        v->kind = COORD_VAL_STR;
        v->str = json_string_value(j);
        v->len = json_string_length(j);
        v->type = "string";
    } else {
        v->type = json_is_array(j) ? "array" : "object";
    }
}

/* tie_word_embeddings (the row's default: true for Gemma), and the features these families can
 * switch on that the runtime does not have (but those the family reads: coord_key_read_by),
 * refused by name. */
static int cfg_features(const json_t *root, bool tied_default, struct shlm_config *c,
                        const char *what, struct shardlm_err *e)
{
    bool tied = false;
    int rc;
    if ((rc = cfg_bool(root, "", "tie_word_embeddings", tied_default, &tied, what, e)))
        return rc;
    c->tied_embd = tied;
    /* the settings of coord_unsupported_keys[] config.json can carry: absent or neutral */
    for (size_t i = 0; i < coord_n_unsupported_keys; i++) {
        const struct coord_key *k = &coord_unsupported_keys[i];
        if (!k->hf || coord_key_read_by(k, true, c))
            continue;
        struct coord_val v;
        char label[512];
        json_val(field(root, k->hf), &v);
        snprintf(label, sizeof(label), "%s: field %s", what, k->hf);
        if ((rc = coord_key_check(k, &v, label, c, e)))
            return rc;
    }
    return 0;
}

/* quantization_config: a quantized checkpoint (GPTQ, AWQ, bitsandbytes, FP8...) stores packed
 * weights under other names, or scales beside them; refused by its method, rather than by the
 * first tensor found missing or by a dtype. gpt-oss's mxfp4 (its experts' MXFP4 blocks) is
 * read. */
static int cfg_quantized(const json_t *root, const struct shlm_arch_traits *a, const char *what,
                         struct shardlm_err *e)
{
    const json_t *q = field(root, "quantization_config");
    if (!q)
        return 0;
    const char *m = json_string_value(json_object_get(q, "quant_method"));
    /* gpt-oss's experts as MXFP4 blocks, the rest unquantized: source_hf.c reads them */
    if (m && a->hf_moe == SHLM_HF_MOE_GPTOSS && !strcmp(m, "mxfp4"))
        return 0;
    if (!m)
        return shardlm_fail(e, -EINVAL,
                            "%s: field quantization_config is present, without a quant_method "
                            "string: quantized checkpoints are not supported",
                            what);
    char shown[100];
    return shardlm_fail(e, -EINVAL,
                        "%s: field quantization_config.quant_method is \"%s\": quantized "
                        "checkpoints are not supported (convert the unquantized one)",
                        what, coord_escape_str(shown, sizeof(shown), m));
}

/* The window of the architectures windowed where the config has one (Phi-3, Mistral:
 * sliding_window on every layer, null for none), and what a windowed-pattern architecture's config
 * adds (Gemma 2/3; @a's row gives the pattern and the local RoPE base's default) into @x:
 * sliding_window (the row's default: transformers' 4096),
 * layer_types and sliding_window_pattern (when present, the row's pattern: a layer is windowed
 * unless it is the last of each window_pattern), rope_local_base_freq, attn_logit_softcapping
 * and final_logit_softcapping (null: none), query_pre_attn_scalar (scores times its -1/2 power;
 * head_dim when absent). */
static int cfg_windows(const json_t *root, const struct shlm_arch_traits *a,
                       const struct shlm_config *c, struct shlm_config_ext *x, const char *what,
                       struct shardlm_err *e)
{
    shlm_arch_apply_ext(a, x);
    if (a->attn == SHLM_ATTN_WINDOW_CONFIG)
        return cfg_uint(root, "", "sliding_window", 1, UINT32_MAX, false, a->window_default,
                        &x->window, what, e);
    if (a->attn != SHLM_ATTN_WINDOW_PATTERN)
        return 0;
    float qs = 0.0f, theta_local = a->rope_theta_local;
    uint32_t pattern = a->window_pattern;
    int rc;
    if ((rc = cfg_uint(root, "", "sliding_window", 1, UINT32_MAX, false, a->window_default,
                       &x->window, what, e)) ||
        (rc = cfg_uint(root, "", "sliding_window_pattern", 1, 1024, false, a->window_pattern,
                       &pattern, what, e)) ||
        (rc = cfg_num(root, "", "attn_logit_softcapping", 0.0, 1e30, false, 0.0f, &x->attn_softcap,
                      what, e)) ||
        (rc = cfg_num(root, "", "final_logit_softcapping", 0.0, 1e30, false, 0.0f,
                      &x->final_softcap, what, e)) ||
        (rc = cfg_num(root, "", "query_pre_attn_scalar", 0.0, 1e30, false, (float)c->head_dim, &qs,
                      what, e)))
        return rc;
    if (theta_local > 0.0f && (rc = cfg_num(root, "", "rope_local_base_freq", 1.0, 1e30, false,
                                            theta_local, &x->rope_theta_local, what, e)))
        return rc;
    if (pattern != a->window_pattern)
        return shardlm_fail(e, -EINVAL, "%s: field sliding_window_pattern is %u, expected %u", what,
                            pattern, a->window_pattern);
    if (qs != (float)c->head_dim) /* head_dim's is the default scale, bit for bit */
        x->query_scale = 1.0f / sqrtf(qs);
    const json_t *lt = field(root, "layer_types");
    if (lt && (!json_is_array(lt) || json_array_size(lt) != c->n_layers))
        return shardlm_fail(e, -EINVAL, "%s: field layer_types: expected a list of %u names", what,
                            c->n_layers);
    for (uint32_t l = 0; lt && l < c->n_layers; l++) {
        const char *t = json_string_value(json_array_get(lt, l));
        const char *want = shlm_layer_windowed(x, l) ? "sliding_attention" : "full_attention";
        if (!t || strcmp(t, want) != 0) {
            char shown[100];
            return shardlm_fail(e, -EINVAL,
                                "%s: field layer_types[%u] is \"%s\", expected \"%s\" (every "
                                "%u-th layer global)",
                                what, l, t ? coord_escape_str(shown, sizeof(shown), t) : "?", want,
                                a->window_pattern);
        }
    }
    return 0;
}

/* bos_token_id and eos_token_id, each absent (-1) or inside the vocabulary. */
static int cfg_special_tokens(const json_t *root, struct coord_hf_config *hc, const char *what,
                              struct shardlm_err *e)
{
    uint32_t vocab = hc->cfg.vocab_size;
    int rc;
    if ((rc = cfg_token(root, "bos_token_id", vocab, &hc->bos_id, what, e)) ||
        (rc = cfg_token(root, "eos_token_id", vocab, &hc->eos_id, what, e)))
        return rc;
    return 0;
}

/* A MoE family's experts: num_experts (Mixtral: num_local_experts), num_experts_per_tok, each
 * expert's units (moe_intermediate_size; Mixtral: intermediate_size) and the routing (Mixtral
 * renormalises the top k's weights, Qwen3-MoE where norm_topk_prob says so); every layer sparse
 * (decoder_sparse_step 1, mlp_only_layers empty: others are refused). */
static int cfg_moe(const json_t *root, const struct shlm_arch_traits *a, struct coord_hf_config *hc,
                   const char *what, struct shardlm_err *e)
{
    struct shlm_config_ext *x = &hc->cfgx;
    int rc;
    bool norm = true;
    uint32_t step = 1;
    bool qwen = a->hf_moe == SHLM_HF_MOE_QWEN;
    if ((rc = cfg_uint(root, "", qwen ? "num_experts" : "num_local_experts", 1, SHLM_MAX_EXPERTS,
                       true, 0, &x->n_experts, what, e)))
        return rc;
    uint32_t most = x->n_experts < 64 ? x->n_experts : 64;
    if ((rc = cfg_uint(root, "", "num_experts_per_tok", 1, most, true, 0, &x->n_experts_used, what,
                       e)) ||
        (rc = cfg_uint(root, "", qwen ? "moe_intermediate_size" : "intermediate_size", 1, 1u << 20,
                       true, 0, &x->expert_ffn, what, e)) ||
        (qwen && (rc = cfg_bool(root, "", "norm_topk_prob", false, &norm, what, e))) ||
        (rc = cfg_uint(root, "", "decoder_sparse_step", 1, 1, false, 1, &step, what, e)))
        return rc;
    const json_t *dense = field(root, "mlp_only_layers");
    if (dense && !(json_is_array(dense) && json_array_size(dense) == 0))
        return shardlm_fail(e, -EINVAL,
                            "%s: field mlp_only_layers is not an empty list: dense layers among "
                            "the MoE ones are not supported",
                            what);
    x->moe_route = norm ? SHLM_ROUTE_SOFTMAX_NORM : SHLM_ROUTE_SOFTMAX;
    if (a->hf_moe == SHLM_HF_MOE_GPTOSS) { /* its activation's clamp is the kernel's 7 */
        float limit = 7.0f;
        if ((rc = cfg_num(root, "", "swiglu_limit", 0.0, 1e30, false, 7.0f, &limit, what, e)))
            return rc;
        if (limit != 7.0f)
            return shardlm_fail(e, -EINVAL,
                                "%s: field swiglu_limit is %g: not supported (gpt-oss's 7 is)",
                                what, (double)limit);
    }
    return 0;
}

/* The whole config in the order its checks report: family, shape, heads, (what the family's row
 * fixes), the newer architectures' multipliers and layers without RoPE, features, quantization,
 * activation, rope scaling, special tokens, windows; then the runtime's own checks. */
static int parse_config(struct coord_hf_config *hc, const json_t *root, const char *what,
                        struct shardlm_err *e)
{
    struct shlm_config *c = &hc->cfg;
    if (!json_is_object(root))
        return shardlm_fail(e, -EINVAL, "%s: expected a JSON object", what);
    int rc;
    if ((rc = cfg_family(root, &hc->arch, what, e)))
        return rc;
    const struct shlm_arch_traits *a = hc->arch;
    c->arch = SHLM_ARCH_LLAMA;
    if ((rc = cfg_shape(root, c, what, e)) || (rc = cfg_heads(root, c, what, e)))
        return rc;
    /* NeoX RoPE, biases, q/k norms; Gemma scales embeddings by sqrt(hidden_size) (transformers
     * rounds it to the activation dtype; the runtime multiplies in f32) */
    shlm_arch_apply(a, true, c);
    if ((rc = cfg_ext(root, a, hc, what, e)) ||
        (rc = cfg_features(root, a->hf_tied_default, c, what, e)) ||
        (rc = cfg_quantized(root, a, what, e)) || (rc = cfg_act(root, a, &c->act, what, e)) ||
        (rc = cfg_rope_scaling(root, hc, what, e)) ||
        (rc = cfg_special_tokens(root, hc, what, e)) ||
        (rc = cfg_windows(root, a, c, &hc->cfgx, what, e)) ||
        (a->moe == SHLM_MOE_REQUIRED &&
         (rc = a->mla ? cfg_mla_moe(root, hc, what, e) : cfg_moe(root, a, hc, what, e))))
        return rc;
    struct shardlm_err cerr;
    if (shlm_config_check(c, &cerr) || shlm_config_ext_check(c, &hc->cfgx, &cerr))
        return shardlm_fail(e, -EINVAL, "%s: %s", what, cerr.msg);
    return 0;
}

int coord_hf_config_parse(struct coord_hf_config *hc, const char *json, size_t len,
                          const char *what, struct shardlm_err *e)
{
    memset(hc, 0, sizeof(*hc));
    hc->bos_id = hc->eos_id = -1;
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return shardlm_fail(e, -EINVAL, "%s: line %d column %d: %s", what, jerr.line, jerr.column,
                            jerr.text);
    int rc = parse_config(hc, root, what, e);
    json_decref(root);
    return rc;
}
