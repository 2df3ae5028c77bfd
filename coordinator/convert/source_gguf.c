/* SPDX-License-Identifier: MIT */
/* coordinator/convert/source_gguf.c: the GGUF model source - the architectures of shm/tensors.h's
 * table (llama, qwen2, gemma, spark, qwen3, gemma2, gemma3, phi3, granite, smollm3, qwen3moe,
 * gpt-oss); tensors F32, F16, BF16, Q8_0, Q4_0 and MXFP4 are dequantized as they are read. */
#include "source.h"

#include "gguf.h"
#include "tensors.h"
#include "tokenizer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gguf_source {
    struct gguf_file f;
    char arch[32];
};

/* "<arch>.<key>" */
static const char *akey(const struct gguf_source *g, const char *key)
{
    static char buf[128];
    snprintf(buf, sizeof(buf), "%s.%s", g->arch, key);
    return buf;
}

/* Latent attention's attn_k_b or attn_v_b (@kind) of @layer from ik_llama.cpp's attn_kv_b
 * (transformers' kv_b_proj: of each head, nope rows of W_UK then v_head_dim rows of W_UV, of
 * kv_lora_rank columns): head h's rows of attn_k_b are its W_UK transposed ((kv_lora_rank, nope)),
 * those of attn_v_b its W_UV. -ENOENT where the file has no attn_kv_b. */
static int kv_b_split(struct coord_source *s, struct gguf_source *g, enum shlm_kind kind,
                      uint32_t layer, float *out, struct shardlm_err *e)
{
    const struct shlm_config_ext *x = &s->cfgx;
    char gname[64];
    snprintf(gname, sizeof(gname), "blk.%u.attn_kv_b.weight", layer);
    const struct gguf_tensor *t = gguf_tensor(&g->f, gname);
    if (!t)
        return -ENOENT;
    uint64_t kvl = x->kv_lora_rank, rows = (uint64_t)coord_kv_b_rows(&s->cfg, x);
    if (t->dims[0] != kvl || gguf_tensor_rows(t) != rows)
        return shardlm_fail(e, -EINVAL,
                            "%s: tensor %s is %llux%llu (rows x cols), the config needs "
                            "%llux%llu",
                            s->path, gname, (unsigned long long)gguf_tensor_rows(t),
                            (unsigned long long)t->dims[0], (unsigned long long)rows,
                            (unsigned long long)kvl);
    float *kvb = malloc(rows * kvl * sizeof(float));
    if (!kvb)
        return shardlm_fail(e, -ENOMEM, "out of memory for %s", gname);
    int rc = gguf_read_rows(&g->f, t, 0, rows, kvb, e);
    if (!rc)
        rc = coord_source_check_kind(kind, kvb, (int)rows, (int)kvl, s->path, gname, e);
    if (!rc)
        coord_kv_b_split(&s->cfg, x, kind, kvb, out);
    free(kvb);
    return rc;
}

static int gguf_src_read(struct coord_source *s, enum shlm_kind kind, uint32_t layer,
                         uint32_t expert, int rows, int cols, float *out, struct shardlm_err *e)
{
    struct gguf_source *g = s->impl;
    char gname[128];
    if ((unsigned)kind >= SHLM_KIND_COUNT ||
        layer >= (shlm_kinds[kind].layer ? s->cfg.n_layers : 1) ||
        expert >= (shlm_kinds[kind].expert ? s->cfgx.n_experts : 1))
        return -ENOENT;
    /* a fused tensor (Phi-3's attn_qkv, ffn_up of gate and up rows) of its full size holds the
     * kind's rows from row0; else the kind's own tensor, llama.cpp's naming; an expert's rows
     * are its part of the layer's [n_experts][rows][cols] tensor */
    const struct gguf_tensor *t = NULL;
    int row0 = 0, total = rows;
    if (shlm_kinds[kind].expert) {
        row0 = (int)expert * rows;
        total = (int)s->cfgx.n_experts * rows;
        shlm_kind_gguf_name(&s->cfg, kind, layer, gname, sizeof(gname));
        t = gguf_tensor(&g->f, gname);
        /* an expert's vector (gpt-oss's biases): one row of a 2-D [n][experts] */
        uint32_t dims = shlm_kinds[kind].rows == SHLM_DIM_ONE ? 2 : 3;
        if (t && (t->n_dims != dims || t->dims[dims - 1] != s->cfgx.n_experts))
            return shardlm_fail(e, -EINVAL,
                                "%s: tensor %s is not %u-D of %u experts (ggml's [cols, %s"
                                "experts])",
                                s->path, gname, dims, s->cfgx.n_experts, dims == 3 ? "rows, " : "");
    } else if (shlm_kind_fused(&s->cfg, kind, layer, false, gname, sizeof(gname), &row0, &total)) {
        t = gguf_tensor(&g->f, gname);
        if (t && gguf_tensor_rows(t) != (uint64_t)total)
            t = NULL;
    }
    if (!t && !shlm_kinds[kind].expert) {
        row0 = 0;
        total = rows;
        shlm_kind_gguf_name(&s->cfg, kind, layer, gname, sizeof(gname));
        t = gguf_tensor(&g->f, gname);
    }
    /* llama.cpp's attn_k_b / attn_v_b are ours as they are ([heads][rows][cols]); else
     * ik_llama.cpp's attn_kv_b holds them */
    if (!t && (kind == SHLM_KIND_ATTN_K_B || kind == SHLM_KIND_ATTN_V_B))
        return kv_b_split(s, g, kind, layer, out, e);
    if (!t)
        return -ENOENT;
    /* GGUF dims[0] is the row length (our cols); 1-D tensors are one row */
    uint64_t trows = gguf_tensor_rows(t);
    if (t->dims[0] != (uint64_t)cols || trows != (uint64_t)total)
        return shardlm_fail(
            e, -EINVAL, "%s: tensor %s is %llux%llu (rows x cols), the config needs %dx%d", s->path,
            gname, (unsigned long long)trows, (unsigned long long)t->dims[0], total, cols);
    int rc = gguf_read_rows(&g->f, t, (uint64_t)row0, (uint64_t)(row0 + rows), out, e);
    if (rc)
        return rc;
    return coord_source_check_kind(kind, out, rows, cols, s->path, gname, e);
}

static void gguf_src_close(struct coord_source *s)
{
    struct gguf_source *g = s->impl;
    gguf_close(&g->f);
    free(g);
}

/* Setting @key (already prefixed) as a struct coord_val and its label "<path>: metadata <key>"
 * (@label, 512 bytes). */
static void setting(const struct gguf_source *g, const char *path, const char *key,
                    struct coord_val *v, char *label)
{
    gguf_get_val(&g->f, key, v);
    snprintf(label, 512, "%s: metadata %s", path, key);
}

/* Integer <arch>.<key> in [@lo, @hi]: required, or @def when absent. */
static int arch_uint(const struct gguf_source *g, const char *path, const char *key, uint32_t lo,
                     uint32_t hi, bool required, uint32_t def, uint32_t *out, struct shardlm_err *e)
{
    struct coord_val v;
    char label[512];
    setting(g, path, akey(g, key), &v, label);
    if (v.kind == COORD_VAL_ABSENT && !required) {
        *out = def;
        return 0;
    }
    return coord_val_uint(&v, label, lo, hi, out, e) ? -EINVAL : 0;
}

/* Number <arch>.<key> in (@lo, @hi), @def when absent. */
static int arch_real(const struct gguf_source *g, const char *path, const char *key, double lo,
                     double hi, float def, float *out, struct shardlm_err *e)
{
    struct coord_val v;
    char label[512];
    setting(g, path, akey(g, key), &v, label);
    if (v.kind == COORD_VAL_ABSENT) {
        *out = def;
        return 0;
    }
    return coord_val_real(&v, label, lo, hi, out, e);
}

/* Boolean <arch>.<key>, @def when absent. */
static int arch_bool(const struct gguf_source *g, const char *path, const char *key, bool def,
                     bool *out, struct shardlm_err *e)
{
    struct coord_val v;
    char label[512];
    setting(g, path, akey(g, key), &v, label);
    if (v.kind == COORD_VAL_ABSENT) {
        *out = def;
        return 0;
    }
    if (v.kind != COORD_VAL_BOOL)
        return shardlm_fail(e, -EINVAL, "%s is of type %s, expected a boolean", label, v.type);
    *out = v.b;
    return 0;
}

/* general.architecture into g->arch: a supported row of the architecture table (*@arch). */
static int read_arch(struct gguf_source *g, const char *path, const struct shlm_arch_traits **arch,
                     struct shardlm_err *e)
{
    struct coord_val v;
    char label[512], shown[100], names[256];
    setting(g, path, "general.architecture", &v, label);
    if (v.kind == COORD_VAL_ABSENT)
        return shardlm_fail(e, -EINVAL, "%s is missing", label);
    if (v.kind != COORD_VAL_STR)
        return shardlm_fail(e, -EINVAL, "%s is of type %s, expected a string", label, v.type);
    const struct shlm_arch_traits *a = shlm_arch_gguf(v.str, v.len);
    if (a && a->refused)
        return shardlm_fail(e, -EINVAL, "%s is \"%s\": not supported (%s)", label, a->gguf,
                            a->refused);
    if (a) {
        snprintf(g->arch, sizeof(g->arch), "%s", a->gguf);
        *arch = a;
        return 0;
    }
    shlm_arch_list(false, names, sizeof(names));
    return shardlm_fail(e, -EINVAL, "%s is \"%s\" (%zu bytes): not a supported architecture (%s)",
                        label, coord_escape(shown, sizeof(shown), v.str, v.len), v.len, names);
}

/* The sizes in <arch>.* metadata (required ones refused when missing, the others defaulted),
 * each in any numeric type that holds its value exactly, in the ranges shlm_config_check()
 * allows. */
static int read_shape(struct gguf_source *g, struct shlm_config *c, const char *path,
                      struct shardlm_err *e)
{
    int rc;
    if ((rc = arch_uint(g, path, "embedding_length", 1, 65536, true, 0, &c->dim, e)) ||
        (rc = arch_uint(g, path, "feed_forward_length", 1, 1u << 20, true, 0, &c->hidden_dim, e)) ||
        (rc = arch_uint(g, path, "block_count", 1, 1024, true, 0, &c->n_layers, e)) ||
        (rc = arch_uint(g, path, "attention.head_count", 1, 1024, true, 0, &c->n_heads, e)) ||
        (rc = arch_uint(g, path, "context_length", 1, UINT32_MAX, true, 0, &c->seq_len, e)) ||
        (rc = arch_uint(g, path, "attention.head_count_kv", 1, 1024, false, c->n_heads,
                        &c->n_kv_heads, e)) ||
        (rc = arch_uint(g, path, "attention.key_length", 2, 1024, false, c->dim / c->n_heads,
                        &c->head_dim, e)) ||
        (rc = arch_real(g, path, "attention.layer_norm_rms_epsilon", 0.0, 1.0, 1e-5f, &c->norm_eps,
                        e)) ||
        (rc = arch_real(g, path, "rope.freq_base", 1.0, 1e30, 10000.0f, &c->rope_theta, e)))
        return rc;
    return 0;
}

/* rope.scaling.type "linear" (Gemma 3 4B..27B, as llama.cpp's converter writes it): its factor
 * (required, 1..1024), applied where ik_llama.cpp applies freq_scale (not on Gemma 3's local
 * layers); "yarn" (a Qwen2.5 converted with its YaRN config): factor, the original context (the
 * file's context when absent; the context raised to factor times it: coord_yarn_context), the
 * ramp's betas (32 and 1 when absent) and the attention factor that multiplies YaRN's own
 * magnitude, as llama.cpp reads them; the yarn_ext_factor / yarn_attn_factor overrides are refused
 * by name. Leaves a config without the key, or with another type (refused by
 * check_unsupported()), as it is. */
static int read_rope_type(struct gguf_source *g, struct coord_source *s, const char *path,
                          struct shardlm_err *e)
{
    struct shlm_config *c = &s->cfg;
    struct shlm_config_ext *x = &s->cfgx;
    struct coord_val v;
    char label[512];
    int rc;
    setting(g, path, akey(g, "rope.scaling.type"), &v, label);
    if (v.kind == COORD_VAL_STR && v.len == 6 && memcmp(v.str, "linear", 6) == 0) {
        setting(g, path, akey(g, "rope.scaling.factor"), &v, label);
        if (v.kind == COORD_VAL_ABSENT)
            return shardlm_fail(e, -EINVAL, "%s is missing (rope.scaling.type is linear)", label);
        if ((rc = coord_val_real(&v, label, 0.0, 1025.0, &c->rope_factor, e)))
            return rc;
        if (!(c->rope_factor >= 1.0f))
            return shardlm_fail(e, -EINVAL, "%s is %g, expected 1..1024", label,
                                (double)c->rope_factor);
        c->rope_scaling = SHLM_ROPE_LINEAR;
        return 0;
    }
    if (v.kind != COORD_VAL_STR || v.len != 4 || memcmp(v.str, "yarn", 4) != 0)
        return 0;
    static const char *const refused[] = {"rope.scaling.yarn_ext_factor",
                                          "rope.scaling.yarn_attn_factor"};
    for (size_t i = 0; i < 2; i++) {
        setting(g, path, akey(g, refused[i]), &v, label);
        if (v.kind != COORD_VAL_ABSENT)
            return shardlm_fail(e, -EINVAL,
                                "%s is set: not supported (YaRN's extrapolation mix and attention "
                                "factor overrides)",
                                label);
    }
    if ((rc = arch_real(g, path, "rope.scaling.factor", 0.0, 1025.0, 0.0f, &c->rope_factor, e)) ||
        (rc = arch_uint(g, path, "rope.scaling.original_context_length", 1, 1u << 24, false,
                        c->seq_len, &c->rope_orig_ctx, e)) ||
        (rc = arch_real(g, path, "rope.scaling.attn_factor", 0.0, 1e6, 0.0f, &x->rope_attn_factor,
                        e)) ||
        (rc = arch_real(g, path, "rope.scaling.yarn_beta_fast", 0.0, 1e6, 32.0f, &x->yarn_beta_fast,
                        e)) ||
        (rc = arch_real(g, path, "rope.scaling.yarn_beta_slow", 0.0, 1e6, 1.0f, &x->yarn_beta_slow,
                        e)))
        return rc;
    if (!(c->rope_factor >= 1.0f))
        return shardlm_fail(e, -EINVAL, "%s: metadata %s is %g, expected 1..1024", path,
                            akey(g, "rope.scaling.factor"), (double)c->rope_factor);
    c->rope_scaling = SHLM_ROPE_YARN; /* the context is raised after check_unsupported */
    return 0;
}

/* Refuses every <arch>.* setting of coord_unsupported_keys[] that is not neutral, but those
 * read_ext() has read for @c's family or RoPE scaling (coord_key_read_by). */
static int check_unsupported(const struct gguf_source *g, const struct shlm_config *c,
                             const char *path, struct shardlm_err *e)
{
    for (size_t i = 0; i < coord_n_unsupported_keys; i++) {
        const struct coord_key *k = &coord_unsupported_keys[i];
        struct coord_val v;
        char label[512];
        if (!k->gguf || coord_key_read_by(k, false, c))
            continue;
        setting(g, path, akey(g, k->gguf), &v, label);
        int rc = coord_key_check(k, &v, label, c, e);
        if (rc)
            return rc;
    }
    return 0;
}

static bool gguf_has(const void *f, const char *name) { return gguf_tensor(f, name) != NULL; }

/* What the architecture's row and the tensors present tell: RoPE style, activation, q/k norms,
 * embedding scale; tied output, biases, head gate; and the vocabulary (token_embd.weight's
 * rows). A fused tensor in an architecture whose row has none is refused (not split). */
static int read_features(struct gguf_source *g, const struct shlm_arch_traits *arch,
                         struct shlm_config *c, const char *path, struct shardlm_err *e)
{
    /* llama.cpp's converter already added 1 to gemma's RMSNorm weights: used as they are */
    shlm_arch_apply(arch, false, c);
    char name[64];
    shlm_kind_gguf_name(c, SHLM_KIND_OUTPUT, 0, name, sizeof(name));
    c->tied_embd = gguf_tensor(&g->f, name) == NULL;
    shlm_kind_gguf_name(c, SHLM_KIND_ATTN_Q_BIAS, 0, name, sizeof(name));
    /* gpt-oss's attention always has them (llama.cpp requires them): a file without is refused
     * by the missing tensor, not run without */
    c->qkv_bias = gguf_tensor(&g->f, name) != NULL || (arch->flags & SHLM_CF_O_BIAS);
    shlm_kind_gguf_name(c, SHLM_KIND_ATTN_GATE, 0, name, sizeof(name));
    c->head_gate = gguf_tensor(&g->f, name) != NULL;
    const char *parts;
    if (shlm_fused_stray(c, false, gguf_has, &g->f, name, sizeof(name), &parts))
        return shardlm_fail(e, -EINVAL,
                            "%s: tensor %s is %s fused: architecture %s has no fused tensors "
                            "(expected them apart)",
                            path, name, parts, arch->gguf);
    const struct gguf_tensor *emb = gguf_tensor(&g->f, "token_embd.weight");
    if (!emb || emb->n_dims != 2)
        return shardlm_fail(e, -EINVAL, "%s: tensor token_embd.weight is missing or not 2-D", path);
    c->vocab_size = emb->dims[1] > UINT32_MAX ? 0 : (uint32_t)emb->dims[1];
    return 0;
}

/* A MoE architecture's experts (<arch>.expert_count, required where the row says so; 0 or
 * absent: a dense model), the experts per token and each one's units (expert_feed_forward_length,
 * else feed_forward_length: Mixtral's); the routing ik_llama.cpp gives these families: softmax,
 * top k, renormalised. */
static int read_moe(struct gguf_source *g, const struct shlm_arch_traits *a, struct coord_source *s,
                    const char *path, struct shardlm_err *e)
{
    struct shlm_config_ext *x = &s->cfgx;
    int rc;
    if ((rc = arch_uint(g, path, "expert_count", a->moe == SHLM_MOE_REQUIRED ? 1 : 0,
                        SHLM_MAX_EXPERTS, a->moe == SHLM_MOE_REQUIRED, 0, &x->n_experts, e)) ||
        !x->n_experts)
        return rc;
    uint32_t most = x->n_experts < 64 ? x->n_experts : 64;
    if ((rc = arch_uint(g, path, "expert_used_count", 1, most, true, 0, &x->n_experts_used, e)) ||
        (rc = arch_uint(g, path, "expert_feed_forward_length", 1, 1u << 20, false,
                        s->cfg.hidden_dim, &x->expert_ffn, e)))
        return rc;
    x->moe_route = SHLM_ROUTE_SOFTMAX_NORM;
    if (!a->mla)
        return 0;
    /* DeepSeek's: dense first layers, shared experts, the routing's function (1 softmax, 2
     * sigmoid; softmax where absent: DeepSeek-V2's files, as ik_llama.cpp reads them), its
     * renormalisation, scale and groups, the selection bias (by its tensor) */
    uint32_t shared, gating, groups, groups_used, nextn;
    bool norm = false;
    if ((rc = arch_uint(g, path, "leading_dense_block_count", 0, s->cfg.n_layers, false, 0,
                        &x->moe_dense_first, e)) ||
        (rc = arch_uint(g, path, "expert_shared_count", 0, 64, false, 0, &shared, e)) ||
        (rc = arch_real(g, path, "expert_weights_scale", 0.0, 1e6, 0.0f, &x->route_scale, e)) ||
        (rc = arch_bool(g, path, "expert_weights_norm", false, &norm, e)) ||
        (rc = arch_uint(g, path, "expert_gating_func", 1, 2, false, 1, &gating, e)) ||
        (rc = arch_uint(g, path, "expert_group_count", 0, x->n_experts, false, 0, &groups, e)) ||
        (rc = arch_uint(g, path, "expert_group_used_count", 0, x->n_experts, false, 0, &groups_used,
                        e)) ||
        (rc = arch_uint(g, path, "nextn_predict_layers", 0, 1024, false, 0, &nextn, e)))
        return rc;
    if (nextn) /* its blocks then end in layers that are no decoder layers */
        return shardlm_fail(e, -EINVAL,
                            "%s: metadata %s is %u: not supported (multi-token prediction layers "
                            "among the blocks)",
                            path, akey(g, "nextn_predict_layers"), nextn);
    x->shared_ffn = shared * x->expert_ffn;
    x->moe_route = gating == 2 ? (norm ? SHLM_ROUTE_SIGMOID_NORM : SHLM_ROUTE_SIGMOID)
                               : (norm ? SHLM_ROUTE_SOFTMAX_NORM : SHLM_ROUTE_SOFTMAX);
    if (groups > 1) { /* one group (or none) is no grouping */
        x->n_groups = groups;
        x->topk_groups = groups_used;
    }
    char name[64];
    shlm_kind_gguf_name(&s->cfg, SHLM_KIND_FFN_SEL_BIAS, x->moe_dense_first, name, sizeof(name));
    if (gguf_tensor(&g->f, name))
        s->cfg.flags |= SHLM_CF_SEL_BIAS;
    return 0;
}

/* DeepSeek's latent attention (the row's mla): q's rank (attention.q_lora_rank; absent: attn_q
 * itself, DeepSeek-V2-Lite's), the latent's (attention.kv_lora_rank), the roped part of a head
 * (rope.dimension_count) and the value size (attention.value_length); a file of llama.cpp's
 * newer form (one KV head of the latent's width) gives a head's sizes as key_length_mla and
 * value_length_mla. */
static int read_mla(struct gguf_source *g, struct coord_source *s, const char *path,
                    struct shardlm_err *e)
{
    struct shlm_config *c = &s->cfg;
    struct shlm_config_ext *x = &s->cfgx;
    uint32_t kmla;
    int rc;
    if ((rc = arch_uint(g, path, "attention.key_length_mla", 4, 1024, false, 0, &kmla, e)))
        return rc;
    if (kmla) {
        c->head_dim = kmla;
        c->n_kv_heads = c->n_heads;
    }
    if ((rc = arch_uint(g, path, kmla ? "attention.value_length_mla" : "attention.value_length", 16,
                        1024, !!kmla, c->head_dim, &x->v_head_dim, e)) ||
        (rc =
             arch_uint(g, path, "attention.q_lora_rank", 0, 65536, false, 0, &x->q_lora_rank, e)) ||
        (rc = arch_uint(g, path, "attention.kv_lora_rank", 16, 4096, true, 0, &x->kv_lora_rank,
                        e)) ||
        (rc = arch_uint(g, path, "rope.dimension_count", 2, c->head_dim - 1, true, 0, &x->rope_dim,
                        e)))
        return rc;
    return 0;
}

/* DeepSeek's YaRN: RoPE at magnitude 1 (ik_llama.cpp divides ggml's YaRN magnitude out), the
 * scores scaled by mscale^2 / sqrt(head_dim), mscale = attn_factor (1 + yarn_log_multiplier
 * ln(factor)) (transformers' softmax_scale with mscale_all_dim, whose tenth the multiplier is). */
static int read_mla_yarn(struct gguf_source *g, struct coord_source *s, const char *path,
                         struct shardlm_err *e)
{
    struct shlm_config *c = &s->cfg;
    struct shlm_config_ext *x = &s->cfgx;
    float mul;
    int rc = arch_real(g, path, "rope.scaling.yarn_log_multiplier", -1e6, 1e6, 0.0f, &mul, e);
    if (rc || c->rope_scaling != SHLM_ROPE_YARN)
        return rc;
    double f = c->rope_factor, att = x->rope_attn_factor > 0.0f ? x->rope_attn_factor : 1.0;
    double ms = att * (1.0 + mul * log(f));
    x->query_scale = (float)(ms * ms / sqrt((double)c->head_dim));
    x->rope_attn_factor = (float)(1.0 / (1.0 + 0.1 * log(f)));
    if (!(x->query_scale > 0.0f && x->query_scale < 1e6f))
        return shardlm_fail(e, -EINVAL,
                            "%s: metadata %s is %g: the attention scale it makes (%g) is not "
                            "positive",
                            path, akey(g, "rope.scaling.yarn_log_multiplier"), (double)mul,
                            (double)x->query_scale);
    return 0;
}

/* What the newer architectures add (shlm_config_ext) from the row, <arch>.* metadata and the
 * tensors present: Granite's multipliers, the config's window (Phi-3: every layer), layers without
 * RoPE, LongRoPE (its factors' tensors), YaRN and linear (read_rope_type), per-frequency RoPE
 * divisors (rope_freqs: llama.cpp's form of Llama 3.1's scaling); the window
 * (attention.sliding_window, the row's default by size when absent, as ik_llama.cpp's), Gemma 2/3's
 * soft-caps (attn_logit_softcapping, final_logit_softcapping), window pattern and local RoPE base
 * (the row's: GGUF stores neither), and the query scale ik_llama.cpp takes from the layer count
 * (the row's gguf_query_dim_heads). */
static int read_ext(struct gguf_source *g, const struct shlm_arch_traits *a, struct coord_source *s,
                    const char *path, struct shardlm_err *e)
{
    struct shlm_config *c = &s->cfg;
    struct shlm_config_ext *x = &s->cfgx;
    int rc;
    if (a->multipliers &&
        ((rc = arch_real(g, path, "embedding_scale", 0.0, 65536.0, 0.0f, &c->embd_scale, e)) ||
         (rc = arch_real(g, path, "residual_scale", 0.0, 1e6, 0.0f, &x->resid_mult, e)) ||
         (rc = arch_real(g, path, "attention.scale", 0.0, 1e6, 0.0f, &x->query_scale, e)) ||
         (rc = arch_real(g, path, "logit_scale", 0.0, 1e6, 0.0f, &x->logit_scale, e))))
        return rc;
    x->nope_interval = a->gguf_nope_interval;
    shlm_arch_apply_ext(a, x);
    if (a->mla && (rc = read_mla(g, s, path, e)))
        return rc;
    if (a->moe != SHLM_MOE_NONE && (rc = read_moe(g, a, s, path, e)))
        return rc;
    if (a->attn != SHLM_ATTN_GLOBAL) {
        /* a windowed pattern needs a window; a config's may be 0 (none) */
        uint32_t def =
            shlm_arch_size_is(&a->gguf_window_size, c) ? a->gguf_window_sized : a->window_default;
        if ((rc =
                 arch_uint(g, path, "attention.sliding_window", a->attn == SHLM_ATTN_WINDOW_PATTERN,
                           UINT32_MAX, false, def, &x->window, e)))
            return rc;
    }
    if (a->attn == SHLM_ATTN_WINDOW_PATTERN &&
        ((rc =
              arch_real(g, path, "attn_logit_softcapping", 0.0, 1e30, 0.0f, &x->attn_softcap, e)) ||
         (rc = arch_real(g, path, "final_logit_softcapping", 0.0, 1e30, 0.0f, &x->final_softcap,
                         e))))
        return rc;
    if (shlm_arch_size_is(&a->gguf_query_dim_heads, c) && c->dim / c->n_heads != c->head_dim)
        x->query_scale = 1.0f / sqrtf((float)(c->dim / c->n_heads));
    char name[64], name2[64];
    /* either factor tensor makes it LongRoPE, which then needs both (the expected tensors) */
    shlm_kind_gguf_name(c, SHLM_KIND_ROPE_FACTORS_LONG, 0, name, sizeof(name));
    shlm_kind_gguf_name(c, SHLM_KIND_ROPE_FACTORS_SHORT, 0, name2, sizeof(name2));
    if (gguf_tensor(&g->f, name) || gguf_tensor(&g->f, name2)) {
        c->rope_scaling = SHLM_ROPE_LONGROPE;
        if ((rc = arch_uint(g, path, "rope.scaling.original_context_length", 2, 1u << 24, true, 0,
                            &c->rope_orig_ctx, e)))
            return rc;
        /* as llama.cpp's converter computes it where the key is absent */
        float def = kn_rope_longrope_attn((float)c->seq_len / (float)c->rope_orig_ctx,
                                          (int)c->rope_orig_ctx);
        if ((rc = arch_real(g, path, "rope.scaling.attn_factor", 0.0, 1e6, def,
                            &x->rope_attn_factor, e)))
            return rc;
    }
    if (c->rope_scaling == SHLM_ROPE_NONE && (rc = read_rope_type(g, s, path, e)))
        return rc;
    if (a->mla && (rc = read_mla_yarn(g, s, path, e)))
        return rc;
    shlm_kind_gguf_name(c, SHLM_KIND_ROPE_FREQS, 0, name, sizeof(name));
    if (gguf_tensor(&g->f, name)) {
        if (c->rope_scaling != SHLM_ROPE_NONE)
            return shardlm_fail(e, -EINVAL,
                                "%s: tensor %s with another RoPE scaling (LongRoPE's factors, "
                                "YaRN or linear): expected one",
                                path, name);
        c->rope_scaling = SHLM_ROPE_FREQS;
    }
    return 0;
}

/* The tokenizer stored in the file (one given with --tokenizer is refused), its size equal to
 * the vocabulary, serialized into s->tok with its bos and eos ids. */
static int read_tokenizer(struct coord_source *s, struct gguf_source *g, const char *path,
                          const char *tokenizer, struct shardlm_err *e)
{
    struct coord_tok tok;
    if (tokenizer)
        return shardlm_fail(e, -EINVAL,
                            "%s: --tokenizer is for llama2.c checkpoints; this GGUF "
                            "carries its own",
                            path);
    int rc = coord_tok_from_gguf(&tok, &g->f, path, e);
    if (rc)
        return rc;
    if (tok.vocab_size != (int)s->cfg.vocab_size) {
        rc = shardlm_fail(e, -EINVAL,
                          "%s: the tokenizer has %d tokens, token_embd.weight %u "
                          "rows",
                          path, tok.vocab_size, s->cfg.vocab_size);
        goto out_free_tok;
    }
    if (tok.eos_id < 0) { /* token 0 in its place would end texts at <unk> or <pad>, or never */
        rc = shardlm_fail(e, -EINVAL,
                          "%s: no end-of-sequence token (tokenizer.ggml.eos_token_id is not set)",
                          path);
        goto out_free_tok;
    }
    s->bos_id = tok.bos_id >= 0 ? (uint32_t)tok.bos_id : 0;
    s->eos_id = tok.eos_id >= 0 ? (uint32_t)tok.eos_id : 0;
    rc = coord_tok_save(&tok, &s->tok, &s->tok_len);
    if (rc) {
        shardlm_fail(e, rc, "%s: cannot serialize the tokenizer", path);
        goto out_free_tok;
    }
    s->tok_kind = SHLM_TOK_BLOB;
out_free_tok:
    coord_tok_free(&tok);
    return rc;
}

int coord_source_gguf(struct coord_source *s, const char *path, const char *tokenizer,
                      struct shardlm_err *e)
{
    struct gguf_source *g = calloc(1, sizeof(*g));
    if (!g)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    int rc = gguf_open(&g->f, path, e);
    if (rc) {
        free(g);
        return rc;
    }
    s->impl = g;
    s->read = gguf_src_read;
    s->close = gguf_src_close;
    s->cfg.arch = SHLM_ARCH_LLAMA;
    const struct shlm_arch_traits *arch = NULL;
    if ((rc = read_arch(g, path, &arch, e)) || (rc = read_shape(g, &s->cfg, path, e)) ||
        (rc = read_features(g, arch, &s->cfg, path, e)) || (rc = read_ext(g, arch, s, path, e)) ||
        (rc = check_unsupported(g, &s->cfg, path, e)) ||
        (rc = read_tokenizer(s, g, path, tokenizer, e))) {
        coord_source_close(s);
        return rc;
    }
    /* after the checks, which judge a window against the file's own context */
    if (s->cfg.rope_scaling == SHLM_ROPE_YARN)
        coord_yarn_context(&s->cfg);
    return 0;
}
