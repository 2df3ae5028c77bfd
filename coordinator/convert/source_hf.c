/* SPDX-License-Identifier: MIT */
/* coordinator/convert/source_hf.c: the Hugging Face model source - a directory with config.json
 * (format/hf_config.c), safetensors (one file or shards behind model.safetensors.index.json) and
 * tokenizer.json. The architectures of shm/tensors.h's table (Llama, Qwen2, Qwen3, Gemma 1/2/3,
 * Phi-3, Granite, SmolLM3, Mistral, Qwen3-MoE, Mixtral, gpt-oss);
 * tensors F32, F16 and BF16, and gpt-oss's experts' MXFP4 blocks (gptoss_read).
 *
 * HF checkpoints rotate NeoX-style (rotate_half over the two halves of each head), so q/k are
 * used as they are with rope_neox = 1. HF Linear weights are (out, in): our (rows, cols). */
#include "source.h"

#include "hf_config.h"
#include "safetensors.h"
#include "tensors.h"
#include "tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CONFIG_MAX_BYTES (16u << 20)
#define TOKENIZER_MAX_BYTES (256u << 20) /* tokenizer.json of a 256k vocabulary is ~35 MB */

struct hf_source {
    struct st_set set;
    struct shlm_config cfg;
    struct shlm_config_ext cfgx;
    enum shlm_norm norm; /* the architecture's */
    float rope_short[512], rope_long[512]; /* LongRoPE's factors from config.json */
};

/* The HF name of the tensor that holds the rows of kind @k of layer @l (of expert @x) in @out: its
 * own (the tensor table's; *@row0 0, *@total @rows), or a fused one where the checkpoint has it
 * (Phi-3's qkv_proj, gate_up_proj: rows [*@row0, *@row0 + @rows) of *@total). Returns 0 or
 * -ENOENT (no such tensor in an HF checkpoint of this config); *@norm says whether it is an
 * RMSNorm weight. */
static int hf_name(const struct hf_source *h, enum shlm_kind k, uint32_t l, uint32_t x, int rows,
                   char *out, size_t len, bool *norm, int *row0, int *total)
{
    *norm = false;
    *row0 = 0;
    *total = rows;
    if ((unsigned)k >= SHLM_KIND_COUNT || l >= (shlm_kinds[k].layer ? h->cfg.n_layers : 1) ||
        x >= (shlm_kinds[k].expert ? h->cfgx.n_experts : 1) ||
        !shlm_kind_present(&h->cfg, &h->cfgx, k, l))
        return -ENOENT;
    int file;
    if (shlm_kind_fused(&h->cfg, k, l, true, out, len, row0, total) &&
        st_set_find(&h->set, out, &file))
        return 0;
    *row0 = 0;
    *total = rows;
    if (!shlm_kind_hf_name(&h->cfg, k, l, x, out, len))
        return -ENOENT;
    *norm = shlm_kinds[k].norm;
    return 0;
}

/* config.json's LongRoPE factors for the kinds that hold them in a GGUF, or NULL. */
static const float *config_factors(const struct hf_source *h, enum shlm_kind k)
{
    if (h->cfg.rope_scaling != SHLM_ROPE_LONGROPE)
        return NULL;
    return k == SHLM_KIND_ROPE_FACTORS_SHORT  ? h->rope_short
           : k == SHLM_KIND_ROPE_FACTORS_LONG ? h->rope_long
                                              : NULL;
}

/* Finds @hf and checks its dtype and that it is @rows x @cols (a 1-D [n] is 1 x n). */
static const struct st_tensor *find_checked(const struct hf_source *h, const char *hf, int rows,
                                            int cols, int *file, int *rc, struct shardlm_err *e)
{
    const struct st_tensor *t = st_set_find(&h->set, hf, file);
    if (!t) {
        *rc = -ENOENT;
        return NULL;
    }
    const char *path = h->set.paths[*file];
    if (!st_dtype_readable(t->dtype)) {
        *rc = shardlm_fail(e, -EINVAL,
                           "%s: tensor %s: dtype %s is not supported (expected F32, "
                           "F16 or BF16)",
                           path, hf, st_dtype_name(t->dtype));
        return NULL;
    }
    uint64_t tr = st_tensor_rows(t), tc = t->shape[t->n_dims - 1];
    if (tr != (uint64_t)rows || tc != (uint64_t)cols) {
        char shape[96];
        int n = 0;
        for (int i = 0; i < t->n_dims && n < (int)sizeof(shape); i++)
            n += snprintf(shape + n, sizeof(shape) - (size_t)n, "%s%llu", i ? ", " : "",
                          (unsigned long long)t->shape[i]);
        *rc = shardlm_fail(e, -EINVAL,
                           "%s: tensor %s: shape is [%s], the config needs %d x %d "
                           "(rows x cols)",
                           path, hf, shape, rows, cols);
        return NULL;
    }
    *rc = 0;
    return t;
}

/* gpt-oss's experts (SHLM_HF_MOE_GPTOSS), as its checkpoints hold them: a layer's gate and up of
 * every expert in one tensor, <base>_blocks [experts][2 units][cols / 32][16] (uint8) with
 * <base>_scales [experts][2 units][cols / 32] (uint8), gate's unit i the row 2i and up's 2i + 1;
 * down likewise ([experts][dim][units / 32][16]). Each row is blocks of 32 MXFP4 values in the
 * checkpoint's order: byte j holds element 2j in its low nibble and 2j + 1 in its high one (E2M1,
 * bit 3 the sign), times 2^(s - 127) for the block's scale byte s. Biases: gate_up_proj_bias
 * [experts][2 units] interleaved as the rows, down_proj_bias [experts][dim]. */
static bool gptoss_kind(const struct hf_source *h, enum shlm_kind k)
{
    return shlm_arch_of(&h->cfg)->hf_moe == SHLM_HF_MOE_GPTOSS &&
           (k == SHLM_KIND_FFN_GATE_EXP || k == SHLM_KIND_FFN_UP_EXP ||
            k == SHLM_KIND_FFN_DOWN_EXP || k == SHLM_KIND_FFN_GATE_EXP_BIAS ||
            k == SHLM_KIND_FFN_UP_EXP_BIAS || k == SHLM_KIND_FFN_DOWN_EXP_BIAS);
}

/* The tensor @name of @dtype (ST_DTYPE_COUNT: any st_read_rows() converts) and shape
 * [@shape[0], .. @shape[@nd - 1]] into *@t and *@file. Returns 0, or -EINVAL with @e set. */
static int gptoss_find(const struct hf_source *h, const char *name, enum st_dtype dtype, int nd,
                       const uint64_t *shape, const struct st_tensor **t, int *file,
                       struct shardlm_err *e)
{
    *t = st_set_find(&h->set, name, file);
    if (!*t)
        return shardlm_fail(e, -EINVAL, "tensor %s is missing from the safetensors", name);
    const char *path = h->set.paths[*file];
    if (dtype == ST_DTYPE_COUNT ? !st_dtype_readable((*t)->dtype) : (*t)->dtype != dtype)
        return shardlm_fail(e, -EINVAL, "%s: tensor %s: dtype %s, expected %s", path, name,
                            st_dtype_name((*t)->dtype),
                            dtype == ST_DTYPE_COUNT ? "F32, F16 or BF16" : st_dtype_name(dtype));
    bool same = (*t)->n_dims == nd;
    for (int i = 0; same && i < nd; i++)
        same = (*t)->shape[i] == shape[i];
    if (!same) {
        char want[96];
        int n = 0;
        for (int i = 0; i < nd && n < (int)sizeof(want); i++)
            n += snprintf(want + n, sizeof(want) - (size_t)n, "%s%llu", i ? ", " : "",
                          (unsigned long long)shape[i]);
        return shardlm_fail(e, -EINVAL, "%s: tensor %s: the config needs shape [%s] (gpt-oss's)",
                            path, name, want);
    }
    return 0;
}

/* Expert @x's @rows x @cols of kind @k of layer @l (a vector: 1 x cols) from gpt-oss's tensors
 * into @out, or with @out NULL only their names, dtypes and shapes checked. */
static int gptoss_read(const struct hf_source *h, enum shlm_kind k, uint32_t l, uint32_t x,
                       int rows, int cols, float *out, struct shardlm_err *e)
{
    /* E2M1's values doubled (times 2^(s - 128): ggml's form of the same numbers) */
    static const int8_t e2m1[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    char base[SHLM_NAME_MAX + 64], name[SHLM_NAME_MAX + 80];
    uint64_t ne = h->cfgx.n_experts;
    bool up = k == SHLM_KIND_FFN_UP_EXP || k == SHLM_KIND_FFN_UP_EXP_BIAS;
    bool fused = k != SHLM_KIND_FFN_DOWN_EXP && k != SHLM_KIND_FFN_DOWN_EXP_BIAS;
    bool bias = k == SHLM_KIND_FFN_GATE_EXP_BIAS || k == SHLM_KIND_FFN_UP_EXP_BIAS ||
                k == SHLM_KIND_FFN_DOWN_EXP_BIAS;
    const struct st_tensor *t, *ts;
    int file, fs, rc;
    shlm_kind_hf_name(&h->cfg, k, l, x, base, sizeof(base));
    if (bias) { /* row x of [experts][n] */
        uint64_t n = (fused ? 2u : 1u) * (uint64_t)cols, shape[2] = {ne, n};
        if ((rc = gptoss_find(h, base, ST_DTYPE_COUNT, 2, shape, &t, &file, e)) || !out)
            return rc;
        float *row = malloc(n * sizeof(float));
        if (!row)
            return shardlm_fail(e, -ENOMEM, "out of memory");
        rc = st_read_rows(&h->set.files[file], t, x, x + 1, row, h->set.paths[file], e);
        for (int i = 0; !rc && i < cols; i++)
            out[i] = fused ? row[2 * i + up] : row[i];
        free(row);
        return rc ? rc : coord_source_check_kind(k, out, 1, cols, h->set.paths[file], base, e);
    }
    if (cols % 32)
        return shardlm_fail(e, -EINVAL, "%s: rows of %d values: not whole MXFP4 blocks of 32", base,
                            cols);
    uint64_t nr = (fused ? 2u : 1u) * (uint64_t)rows, nb = (uint64_t)cols / 32;
    uint64_t bshape[4] = {ne, nr, nb, 16}, sshape[3] = {ne, nr, nb};
    snprintf(name, sizeof(name), "%s_blocks", base);
    if (!st_set_find(&h->set, name, &file) && st_set_find(&h->set, base, &file))
        return shardlm_fail(e, -EINVAL,
                            "%s: tensor %s: gpt-oss's experts dequantized (a dense [experts, "
                            "hidden, units] tensor) are not read: convert the MXFP4 checkpoint "
                            "(%s_blocks and _scales) or its GGUF",
                            h->set.paths[file], base, base);
    if ((rc = gptoss_find(h, name, ST_U8, 4, bshape, &t, &file, e)))
        return rc;
    snprintf(name, sizeof(name), "%s_scales", base);
    if ((rc = gptoss_find(h, name, ST_U8, 3, sshape, &ts, &fs, e)) || !out)
        return rc;
    for (int r = 0; r < rows; r++) {
        uint64_t hr = (uint64_t)x * nr + (fused ? 2u * (uint64_t)r + up : (uint64_t)r);
        const uint8_t *bp = h->set.files[file].base + t->offset + hr * nb * 16;
        const uint8_t *sp = h->set.files[fs].base + ts->offset + hr * nb;
        for (uint64_t b = 0; b < nb; b++) {
            float d = ldexpf(1.0f, (int)sp[b] - 128);
            float *o = out + (size_t)r * (size_t)cols + b * 32;
            for (int j = 0; j < 16; j++) {
                o[2 * j] = d * (float)e2m1[bp[b * 16 + (uint64_t)j] & 15];
                o[2 * j + 1] = d * (float)e2m1[bp[b * 16 + (uint64_t)j] >> 4];
            }
        }
    }
    return coord_source_check_kind(k, out, rows, cols, h->set.paths[file], base, e);
}

/* Whether @k is latent attention's attn_k_b or attn_v_b: DeepSeek's checkpoints hold both in
 * self_attn.kv_b_proj (coord_kv_b_split). */
static bool kv_b_kind(enum shlm_kind k)
{
    return k == SHLM_KIND_ATTN_K_B || k == SHLM_KIND_ATTN_V_B;
}

/* Kind @k (kv_b_kind) of layer @l from kv_b_proj (its name into @hf) into @out, or with @out NULL
 * only its presence and shape checked: 0, -ENOENT (missing, no message) or an error. */
static int kv_b_read(const struct hf_source *h, enum shlm_kind k, uint32_t l, float *out, char *hf,
                     size_t len, struct shardlm_err *e)
{
    snprintf(hf, len, "model.layers.%u.self_attn.kv_b_proj.weight", l);
    int rows = coord_kv_b_rows(&h->cfg, &h->cfgx), cols = (int)h->cfgx.kv_lora_rank, file, rc;
    const struct st_tensor *t = find_checked(h, hf, rows, cols, &file, &rc, e);
    if (!t)
        return rc;
    if (!out)
        return 0;
    float *kvb = malloc((size_t)rows * (size_t)cols * sizeof(float));
    if (!kvb)
        return shardlm_fail(e, -ENOMEM, "out of memory for %s", hf);
    if (!(rc = st_read_rows(&h->set.files[file], t, 0, (uint64_t)rows, kvb, h->set.paths[file],
                            e)) &&
        !(rc = coord_source_check_kind(k, kvb, rows, cols, h->set.paths[file], hf, e)))
        coord_kv_b_split(&h->cfg, &h->cfgx, k, kvb, out);
    free(kvb);
    return rc;
}

static int hf_read(struct coord_source *s, enum shlm_kind kind, uint32_t layer, uint32_t expert,
                   int rows, int cols, float *out, struct shardlm_err *e)
{
    struct hf_source *h = s->impl;
    char hf[SHLM_NAME_MAX + 64];
    bool norm;
    int row0, total;
    const float *f = (unsigned)kind < SHLM_KIND_COUNT ? config_factors(h, kind) : NULL;
    if (f) {
        if (rows != 1 || cols != (int)h->cfg.head_dim / 2) /* the layout asks the table's shape */
            return shardlm_fail(e, -EINVAL, "%s: RoPE factors asked as %dx%d, the config has 1x%u",
                                s->path, rows, cols, h->cfg.head_dim / 2);
        memcpy(out, f, (size_t)cols * sizeof(float));
        return 0;
    }
    if ((unsigned)kind < SHLM_KIND_COUNT && kv_b_kind(kind) && layer < h->cfg.n_layers &&
        shlm_kind_present(&h->cfg, &h->cfgx, kind, layer))
        return kv_b_read(h, kind, layer, out, hf, sizeof(hf), e);
    if (hf_name(h, kind, layer, expert, rows, hf, sizeof(hf), &norm, &row0, &total))
        return -ENOENT;
    if (gptoss_kind(h, kind))
        return gptoss_read(h, kind, layer, expert, rows, cols, out, e);
    int file, rc;
    const struct st_tensor *t = find_checked(h, hf, total, cols, &file, &rc, e);
    if (!t)
        return rc;
    if ((rc = st_read_rows(&h->set.files[file], t, (uint64_t)row0, (uint64_t)(row0 + rows), out,
                           h->set.paths[file], e)))
        return rc;
    /* Gemma's RMSNorm multiplies by (1 + w) */
    if (norm && h->norm == SHLM_NORM_ONE_PLUS)
        for (size_t i = 0; i < (size_t)rows * (size_t)cols; i++)
            out[i] += 1.0f;
    return coord_source_check_kind(kind, out, rows, cols, h->set.paths[file], hf, e);
}

static void hf_close(struct coord_source *s)
{
    struct hf_source *h = s->impl;
    st_set_close(&h->set);
    free(h);
}

static bool st_has(const void *set, const char *name)
{
    int file;
    return st_set_find(set, name, &file) != NULL;
}

/* Checks up front that every tensor the config needs is there, readable and of its shape, and
 * that no fused tensor is where the architecture's row has none (it is refused, not split). */
static int check_tensors(struct hf_source *h, const struct shlm_config *c,
                         const struct shlm_config_ext *x, const char *dir, const char *arch,
                         struct shardlm_err *e)
{
    char stray[SHLM_NAME_MAX + 64];
    const char *parts;
    int file;
    if (shlm_fused_stray(c, true, st_has, &h->set, stray, sizeof(stray), &parts) &&
        st_set_find(&h->set, stray, &file))
        return shardlm_fail(e, -EINVAL,
                            "%s: tensor %s is %s fused: architecture %s has no fused tensors "
                            "(expected them apart)",
                            h->set.paths[file], stray, parts, arch);
    struct shlm_tensor_spec *specs = calloc(SHLM_MAX_TENSORS, sizeof(*specs));
    if (!specs)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    int n = shlm_expected_tensors(c, x, SHLM_SCHEME_F32, 0, 8, NULL, specs, SHLM_MAX_TENSORS);
    int rc = n < 0 ? shardlm_fail(e, -EINVAL,
                                  "%s: the model needs more than %d tensors (layers x experts)",
                                  dir, SHLM_MAX_TENSORS)
                   : 0;
    for (int i = 0; i < n && !rc; i++) {
        char hf[SHLM_NAME_MAX + 64];
        bool norm;
        int file, row0, total;
        if (config_factors(h, (enum shlm_kind)specs[i].kind))
            continue; /* from config.json */
        if (kv_b_kind((enum shlm_kind)specs[i].kind)) {
            char kvb[SHLM_NAME_MAX + 64];
            if ((rc = kv_b_read(h, (enum shlm_kind)specs[i].kind, specs[i].layer, NULL, kvb,
                                sizeof(kvb), e)) == -ENOENT)
                rc = shardlm_fail(e, -EINVAL, "%s: tensor %s is missing from the safetensors", dir,
                                  kvb);
            continue;
        }
        if (gptoss_kind(h, (enum shlm_kind)specs[i].kind)) {
            const struct shlm_tensor_spec *sp = &specs[i];
            rc = gptoss_read(h, (enum shlm_kind)sp->kind, sp->layer, sp->expert, sp->rows, sp->cols,
                             NULL, e);
            continue;
        }
        if (hf_name(h, (enum shlm_kind)specs[i].kind, specs[i].layer, specs[i].expert,
                    specs[i].rows, hf, sizeof(hf), &norm, &row0, &total)) {
            rc = shardlm_fail(e, -EINVAL, "%s: tensor %s has no Hugging Face counterpart", dir,
                              specs[i].name);
            break;
        }
        if (!find_checked(h, hf, total, specs[i].cols, &file, &rc, e) && rc == -ENOENT)
            rc =
                shardlm_fail(e, -EINVAL, "%s: tensor %s is missing from the safetensors%s", dir, hf,
                             specs[i].kind == SHLM_KIND_OUTPUT
                                 ? " (config.json field tie_word_embeddings is false)"
                                 : "");
    }
    free(specs);
    return rc;
}

/* The chat template of tokenizer_config.json's @v: a string, or a list of {"name", "template"}
 * (the one named "default", else the first). */
static int config_chat_template(struct coord_tok *t, const json_t *v, const char *path,
                                struct shardlm_err *e)
{
    if (json_is_array(v)) {
        const json_t *pick = NULL, *it;
        size_t i;
        json_array_foreach(v, i, it)
        {
            const json_t *name = json_object_get(it, "name");
            if (!pick || (json_is_string(name) && !strcmp(json_string_value(name), "default")))
                pick = it;
        }
        v = pick ? json_object_get(pick, "template") : NULL;
    }
    if (!json_is_string(v))
        return shardlm_fail(e, -EINVAL,
                            "%s: field chat_template: expected a string or a list of "
                            "{\"name\", \"template\"}",
                            path);
    return coord_tok_set_chat_template(t, json_string_value(v), json_string_length(v), path, e);
}

/* add_bos_token / add_eos_token of tokenizer_config.json, when it is there, override what
 * tokenizer.json implies; its chat_template, or chat_template.jinja beside it (as transformers
 * saves it now), is the model's chat template. */
static int apply_tokenizer_config(struct coord_tok *t, const char *dir, struct shardlm_err *e)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/chat_template.jinja", dir);
    if (access(path, F_OK) == 0) {
        uint8_t *buf;
        size_t len;
        int rc = coord_read_file(path, COORD_TOK_MAX_TEMPLATE, &buf, &len, e);
        if (rc)
            return rc;
        rc = coord_tok_set_chat_template(t, (const char *)buf, len, path, e);
        free(buf);
        if (rc)
            return rc;
    }
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    if (access(path, F_OK) != 0)
        return 0;
    uint8_t *buf;
    size_t len;
    int rc = coord_read_file(path, TOKENIZER_MAX_BYTES, &buf, &len, e);
    if (rc)
        return rc;
    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf, len, 0, &jerr);
    free(buf);
    if (!root)
        return shardlm_fail(e, -EINVAL, "%s: line %d column %d: %s", path, jerr.line, jerr.column,
                            jerr.text);
    static const struct { const char *key; unsigned flag; } keys[] = {
        {"add_bos_token", COORD_TOKF_ADD_BOS}, {"add_eos_token", COORD_TOKF_ADD_EOS}};
    for (size_t i = 0; i < 2 && !rc; i++) {
        const json_t *v = json_is_object(root) ? json_object_get(root, keys[i].key) : NULL;
        if (!v || json_is_null(v)) /* absent or null: what tokenizer.json implies */
            continue;
        if (!json_is_boolean(v))
            rc =
                shardlm_fail(e, -EINVAL, "%s: field %s: expected true or false", path, keys[i].key);
        else if (json_is_true(v))
            t->flags |= keys[i].flag;
        else
            t->flags &= ~keys[i].flag;
    }
    const json_t *ct = json_is_object(root) ? json_object_get(root, "chat_template") : NULL;
    if (!rc && ct && !json_is_null(ct) && !t->chat_template)
        rc = config_chat_template(t, ct, path, e);
    json_decref(root);
    return rc;
}

/* The tokenizer: @dir/tokenizer.json, or @tokenizer (a tokenizer.json) when the directory has
 * none. Sets s->tok (a coord_tok_save() blob) and the BOS/EOS ids. */
static int load_tokenizer(struct coord_source *s, const struct coord_hf_config *hc,
                          const char *dir, const char *tokenizer, struct shardlm_err *e)
{
    char own[4096];
    snprintf(own, sizeof(own), "%s/tokenizer.json", dir);
    bool has_own = access(own, F_OK) == 0;
    if (has_own && tokenizer)
        return shardlm_fail(e, -EINVAL,
                            "%s: --tokenizer is for sources without one; this "
                            "directory has tokenizer.json",
                            dir);
    if (!has_own && !tokenizer)
        return shardlm_fail(e, -ENOENT, "%s: no tokenizer.json (give one with --tokenizer)", dir);
    const char *path = has_own ? own : tokenizer;
    uint8_t *buf;
    size_t len;
    int rc = coord_read_file(path, TOKENIZER_MAX_BYTES, &buf, &len, e);
    if (rc)
        return rc;
    struct coord_tok t;
    rc = coord_tok_from_hf_json(&t, buf, len, path, e);
    free(buf);
    if (rc)
        return rc;
    if (t.vocab_size > (int)hc->cfg.vocab_size) {
        rc = shardlm_fail(e, -EINVAL,
                          "%s: the tokenizer has %d tokens, more than config.json "
                          "vocab_size %u",
                          path, t.vocab_size, hc->cfg.vocab_size);
        goto out_free;
    }
    if (has_own && (rc = apply_tokenizer_config(&t, dir, e)))
        goto out_free;
    /* config.json's ids first (the model was trained with them), else the tokenizer's; an id
     * the tokenizer does not have (config.json's vocab_size may be padded past it) is refused */
    int64_t bos = hc->bos_id >= 0 ? hc->bos_id : t.bos_id;
    int64_t eos = hc->eos_id >= 0 ? hc->eos_id : t.eos_id;
    static const char *const names[] = {"bos_token_id", "eos_token_id"};
    int64_t ids[] = {bos, eos};
    for (int i = 0; i < 2; i++)
        if (ids[i] >= t.vocab_size) {
            rc = shardlm_fail(e, -EINVAL,
                              "%s/config.json: field %s is %lld, outside the %d tokens of %s", dir,
                              names[i], (long long)ids[i], t.vocab_size, path);
            goto out_free;
        }
    if (eos < 0) { /* token 0 in its place would end texts at <unk> or <pad>, or never */
        rc = shardlm_fail(e, -EINVAL,
                          "%s: no end-of-sequence token (eos_token_id in config.json, or the "
                          "tokenizer's)",
                          dir);
        goto out_free;
    }
    if (t.bos_id < 0 && bos >= 0)
        t.bos_id = (int)bos;
    if (t.eos_id < 0 && eos >= 0)
        t.eos_id = (int)eos;
    s->bos_id = bos >= 0 ? (uint32_t)bos : 0;
    s->eos_id = eos >= 0 ? (uint32_t)eos : 0;
    if ((rc = coord_tok_save(&t, &s->tok, &s->tok_len)))
        shardlm_fail(e, rc, "%s: cannot serialize the tokenizer", path);
    s->tok_kind = SHLM_TOK_BLOB;
out_free:
    coord_tok_free(&t);
    return rc;
}

int coord_source_hf(struct coord_source *s, const char *dir, const char *tokenizer,
                    struct shardlm_err *e)
{
    memset(s, 0, sizeof(*s));
    s->path = dir;
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    uint8_t *buf;
    size_t len;
    int rc = coord_read_file(path, CONFIG_MAX_BYTES, &buf, &len, e);
    if (rc)
        return rc;
    struct coord_hf_config hc;
    rc = coord_hf_config_parse(&hc, (const char *)buf, len, path, e);
    free(buf);
    if (rc)
        return rc;
    struct hf_source *h = calloc(1, sizeof(*h));
    if (!h)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    h->cfg = hc.cfg;
    h->cfgx = hc.cfgx;
    h->norm = hc.arch->norm;
    memcpy(h->rope_short, hc.rope_short, sizeof(h->rope_short));
    memcpy(h->rope_long, hc.rope_long, sizeof(h->rope_long));
    if ((rc = st_set_open(&h->set, dir, e))) {
        free(h);
        return rc;
    }
    s->impl = h;
    s->read = hf_read;
    s->close = hf_close;
    s->cfg = hc.cfg;
    s->cfgx = hc.cfgx;
    if ((rc = check_tensors(h, &hc.cfg, &hc.cfgx, dir, hc.arch->hf, e)) ||
        (rc = load_tokenizer(s, &hc, dir, tokenizer, e)))
        goto out_close;
    return 0;
out_close:
    coord_source_close(s);
    return rc;
}
