/* coordinator/: Hugging Face model source - a directory with config.json, safetensors (one file
 * or shards behind model.safetensors.index.json) and tokenizer.json. Llama, Qwen2 and Gemma
 * (1) architectures; tensors F32, F16 and BF16.
 *
 * HF checkpoints rotate NeoX-style (rotate_half over the two halves of each head), so q/k are
 * used as they are with rope_neox = 1. HF Linear weights are (out, in): our (rows, cols). */
#include "source.h"

#include "safetensors.h"
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
    enum coord_hf_family family;
    uint32_t n_layers;
    bool tied;
};

/* ---- config.json ---- */

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
        return shardlm_fail(e, -EINVAL, "%s: field %s%s is %lld, expected %llu..%llu", what, obj, key,
                          (long long)i, (unsigned long long)lo, (unsigned long long)hi);
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
        return shardlm_fail(e, -EINVAL, "%s: field %s%s is %g, expected a number in (%g, %g)",
                          what, obj, key, d, lo, hi);
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
        return shardlm_fail(e, -EINVAL, "%s: field %s%s: expected true or false", what, obj,
                          key);
    *out = json_is_true(v);
    return 0;
}

/* bos_token_id / eos_token_id: an id, a list of ids (the first is taken), or absent (-1). */
static int cfg_token(const json_t *root, const char *key, int64_t *out, const char *what,
                     struct shardlm_err *e)
{
    const json_t *v = field(root, key);
    *out = -1;
    if (json_is_array(v))
        v = json_array_size(v) ? json_array_get(v, 0) : NULL;
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return shardlm_fail(e, -EINVAL, "%s: field %s: expected a token id (or a list of them)",
                          what, key);
    *out = json_integer_value(v);
    return 0;
}

static int cfg_act(const json_t *root, enum coord_hf_family fam, uint32_t *act, const char *what,
                   struct shardlm_err *e)
{
    /* Gemma: hidden_activation; when it is absent transformers uses gelu_pytorch_tanh whatever
     * hidden_act says. The others: hidden_act, silu by default. */
    const char *key = fam == COORD_HF_GEMMA ? "hidden_activation" : "hidden_act";
    const json_t *v = field(root, key);
    if (!v) {
        *act = fam == COORD_HF_GEMMA ? SHLM_ACT_GELU_TANH : SHLM_ACT_SILU;
        return 0;
    }
    const char *s = json_string_value(v);
    if (!s)
        return shardlm_fail(e, -EINVAL, "%s: field %s: expected a string", what, key);
    if (!strcmp(s, "silu") || !strcmp(s, "swish"))
        *act = SHLM_ACT_SILU;
    else if (!strcmp(s, "gelu_pytorch_tanh") || !strcmp(s, "gelu_new") ||
             (fam == COORD_HF_GEMMA && !strcmp(s, "gelu")))
        *act = SHLM_ACT_GELU_TANH;
    else
        return shardlm_fail(e, -EINVAL, "%s: field %s is \"%.64s\", expected silu or "
                          "gelu_pytorch_tanh", what, key, s);
    return 0;
}

/* rope_scaling: null, {"rope_type": "default"} or llama3 scaling. */
static int cfg_rope_scaling(const json_t *root, struct shlm_config *c, const char *what,
                            struct shardlm_err *e)
{
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
    if (strcmp(t, "llama3") != 0)
        return shardlm_fail(e, -EINVAL, "%s: field rope_scaling.rope_type is \"%.64s\": only "
                          "llama3 scaling is supported", what, t);
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
        return shardlm_fail(e, -EINVAL, "%s: field rope_scaling: expected factor 1..1024 and "
                          "low_freq_factor < high_freq_factor", what);
    c->rope_scaling = SHLM_ROPE_LLAMA3;
    return 0;
}

static int parse_config(struct coord_hf_config *hc, const json_t *root, const char *what,
                        struct shardlm_err *e)
{
    struct shlm_config *c = &hc->cfg;
    if (!json_is_object(root))
        return shardlm_fail(e, -EINVAL, "%s: expected a JSON object", what);
    const json_t *archs = field(root, "architectures");
    const char *arch = json_is_array(archs) ? json_string_value(json_array_get(archs, 0)) : NULL;
    if (!arch)
        return shardlm_fail(e, -EINVAL, "%s: field architectures: expected a list of names", what);
    if (!strcmp(arch, "LlamaForCausalLM"))
        hc->family = COORD_HF_LLAMA;
    else if (!strcmp(arch, "Qwen2ForCausalLM"))
        hc->family = COORD_HF_QWEN2;
    else if (!strcmp(arch, "GemmaForCausalLM"))
        hc->family = COORD_HF_GEMMA;
    else if (!strcmp(arch, "Gemma2ForCausalLM"))
        return shardlm_fail(e, -EINVAL, "%s: field architectures[0] is Gemma2ForCausalLM: not "
                          "supported (extra pre/post norms, logit soft-capping, sliding-window "
                          "layers)", what);
    else
        return shardlm_fail(e, -EINVAL, "%s: field architectures[0] is \"%.64s\", expected "
                          "LlamaForCausalLM, Qwen2ForCausalLM or GemmaForCausalLM", what, arch);
    bool gemma = hc->family == COORD_HF_GEMMA;

    c->arch = SHLM_ARCH_LLAMA;
    int rc;
    const json_t *r = root;
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
    if (c->n_heads % c->n_kv_heads)
        return shardlm_fail(e, -EINVAL, "%s: field num_key_value_heads %u does not divide "
                          "num_attention_heads %u", what, c->n_kv_heads, c->n_heads);
    if (!field(root, "head_dim") && c->dim % c->n_heads)
        return shardlm_fail(e, -EINVAL, "%s: field head_dim is missing and num_attention_heads %u "
                          "does not divide hidden_size %u", what, c->n_heads, c->dim);
    if ((rc = cfg_uint(r, "", "head_dim", 2, 1024, false, c->dim / c->n_heads, &c->head_dim,
                       what, e)))
        return rc;
    if (c->head_dim % 2)
        return shardlm_fail(e, -EINVAL, "%s: field head_dim is %u, expected an even number", what,
                          c->head_dim);
    bool tied = false, flag = false;
    if ((rc = cfg_bool(root, "", "tie_word_embeddings", gemma, &tied, what, e)))
        return rc;
    c->tied_embd = tied;
    /* features these families can switch on that the runtime does not have */
    static const struct { const char *key, *what; } unsupported[] = {
        {"attention_bias", "biases on q/k/v/o_proj"},
        {"mlp_bias", "biases on the MLP projections"},
        {"use_sliding_window", "sliding-window attention"},
    };
    for (size_t i = 0; i < sizeof(unsupported) / sizeof(unsupported[0]); i++) {
        if ((rc = cfg_bool(root, "", unsupported[i].key, false, &flag, what, e)))
            return rc;
        if (flag)
            return shardlm_fail(e, -EINVAL, "%s: field %s is true: %s are not supported", what,
                              unsupported[i].key, unsupported[i].what);
    }
    if ((rc = cfg_act(root, hc->family, &c->act, what, e)) ||
        (rc = cfg_rope_scaling(root, c, what, e)) ||
        (rc = cfg_token(root, "bos_token_id", &hc->bos_id, what, e)) ||
        (rc = cfg_token(root, "eos_token_id", &hc->eos_id, what, e)))
        return rc;
    if (hc->bos_id >= (int64_t)c->vocab_size || hc->eos_id >= (int64_t)c->vocab_size)
        return shardlm_fail(e, -EINVAL, "%s: field %s is %lld, outside vocab_size %u", what,
                          hc->bos_id >= (int64_t)c->vocab_size ? "bos_token_id" : "eos_token_id",
                          (long long)(hc->bos_id >= (int64_t)c->vocab_size ? hc->bos_id
                                                                             : hc->eos_id),
                          c->vocab_size);
    c->rope_neox = 1;
    c->qkv_bias = hc->family == COORD_HF_QWEN2;
    c->head_gate = 0;
    /* Gemma scales embeddings by sqrt(hidden_size) (transformers rounds it to the activation
     * dtype; the runtime multiplies in f32) */
    c->embd_scale = gemma ? sqrtf((float)c->dim) : 0.0f;
    struct shardlm_err cerr;
    if (shlm_config_check(c, &cerr))
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

/* ---- tensors ---- */

/* "blk.N.rest" -> N and rest; false for any other form. */
static bool split_layer(const char *name, unsigned *layer, const char **rest)
{
    if (strncmp(name, "blk.", 4) != 0)
        return false;
    const char *p = name + 4;
    unsigned l = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 5; p++, digits++)
        l = l * 10 + (unsigned)(*p - '0');
    if (digits == 0 || *p != '.' || (digits > 1 && name[4] == '0'))
        return false;
    *layer = l;
    *rest = p + 1;
    return true;
}

/* Our tensor @name -> the HF one in @out. Returns 0 or -ENOENT (no such tensor in an HF
 * checkpoint of this config); *@norm says whether it is an RMSNorm weight. */
static int hf_name(const struct hf_source *h, const char *name, char *out, size_t len,
                   bool *norm)
{
    static const struct { const char *ours, *theirs; bool norm; } layer_map[] = {
        {"attn_norm", "input_layernorm.weight", true},
        {"ffn_norm", "post_attention_layernorm.weight", true},
        {"attn_q", "self_attn.q_proj.weight", false},
        {"attn_k", "self_attn.k_proj.weight", false},
        {"attn_v", "self_attn.v_proj.weight", false},
        {"attn_q_bias", "self_attn.q_proj.bias", false},
        {"attn_k_bias", "self_attn.k_proj.bias", false},
        {"attn_v_bias", "self_attn.v_proj.bias", false},
        {"attn_o", "self_attn.o_proj.weight", false},
        {"ffn_gate", "mlp.gate_proj.weight", false},
        {"ffn_up", "mlp.up_proj.weight", false},
        {"ffn_down", "mlp.down_proj.weight", false},
    };
    *norm = false;
    if (!strcmp(name, "tok_embd")) {
        snprintf(out, len, "model.embed_tokens.weight");
        return 0;
    }
    if (!strcmp(name, "output")) {
        if (h->tied)
            return -ENOENT;
        snprintf(out, len, "lm_head.weight");
        return 0;
    }
    if (!strcmp(name, "output_norm")) {
        snprintf(out, len, "model.norm.weight");
        *norm = true;
        return 0;
    }
    unsigned l;
    const char *rest;
    if (!split_layer(name, &l, &rest) || l >= h->n_layers)
        return -ENOENT;
    for (size_t i = 0; i < sizeof(layer_map) / sizeof(layer_map[0]); i++)
        if (!strcmp(rest, layer_map[i].ours)) {
            snprintf(out, len, "model.layers.%u.%s", l, layer_map[i].theirs);
            *norm = layer_map[i].norm;
            return 0;
        }
    return -ENOENT;
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
        *rc = shardlm_fail(e, -EINVAL, "%s: tensor %s: dtype %s is not supported (expected F32, "
                         "F16 or BF16)", path, hf, st_dtype_name(t->dtype));
        return NULL;
    }
    uint64_t tr = st_tensor_rows(t), tc = t->shape[t->n_dims - 1];
    if (tr != (uint64_t)rows || tc != (uint64_t)cols) {
        char shape[96];
        int n = 0;
        for (int i = 0; i < t->n_dims && n < (int)sizeof(shape); i++)
            n += snprintf(shape + n, sizeof(shape) - (size_t)n, "%s%llu", i ? ", " : "",
                          (unsigned long long)t->shape[i]);
        *rc = shardlm_fail(e, -EINVAL, "%s: tensor %s: shape is [%s], the config needs %d x %d "
                         "(rows x cols)", path, hf, shape, rows, cols);
        return NULL;
    }
    *rc = 0;
    return t;
}

static int hf_read(struct coord_source *s, const char *name, int rows, int cols, float *out,
                   struct shardlm_err *e)
{
    struct hf_source *h = s->impl;
    char hf[SHLM_NAME_MAX + 64];
    bool norm;
    if (hf_name(h, name, hf, sizeof(hf), &norm))
        return -ENOENT;
    int file, rc;
    const struct st_tensor *t = find_checked(h, hf, rows, cols, &file, &rc, e);
    if (!t)
        return rc;
    if ((rc = st_read_rows(&h->set.files[file], t, 0, (uint64_t)rows, out, h->set.paths[file],
                           e)))
        return rc;
    /* Gemma's RMSNorm multiplies by (1 + w) */
    if (norm && h->family == COORD_HF_GEMMA)
        for (size_t i = 0; i < (size_t)rows * (size_t)cols; i++)
            out[i] += 1.0f;
    return 0;
}

static void hf_close(struct coord_source *s)
{
    struct hf_source *h = s->impl;
    st_set_close(&h->set);
    free(h);
}

/* Checks up front that every tensor the config needs is there, readable and of its shape. */
static int check_tensors(struct hf_source *h, const struct shlm_config *c, const char *dir,
                         struct shardlm_err *e)
{
    struct shlm_tensor_spec *specs = calloc(SHLM_MAX_TENSORS, sizeof(*specs));
    if (!specs)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    int n = shlm_expected_tensors(c, SHLM_SCHEME_F32, 0, 8, NULL, specs, SHLM_MAX_TENSORS);
    int rc = n < 0 ? shardlm_fail(e, -EINVAL, "%s: too many layers for the tensor table", dir) : 0;
    for (int i = 0; i < n && !rc; i++) {
        char hf[SHLM_NAME_MAX + 64];
        bool norm;
        int file;
        if (hf_name(h, specs[i].name, hf, sizeof(hf), &norm)) {
            rc = shardlm_fail(e, -EINVAL, "%s: tensor %s has no Hugging Face counterpart", dir,
                            specs[i].name);
            break;
        }
        if (!find_checked(h, hf, specs[i].rows, specs[i].cols, &file, &rc, e) &&
            rc == -ENOENT)
            rc = shardlm_fail(e, -EINVAL, "%s: tensor %s is missing from the safetensors%s", dir,
                            hf, strcmp(specs[i].name, "output") == 0
                                    ? " (config.json field tie_word_embeddings is false)"
                                    : "");
    }
    free(specs);
    return rc;
}

/* add_bos_token / add_eos_token of tokenizer_config.json, when it is there, override what
 * tokenizer.json implies. */
static int apply_tokenizer_config(struct coord_tok *t, const char *dir, struct shardlm_err *e)
{
    char path[4096];
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
        const json_t *v = json_is_object(root) ? field(root, keys[i].key) : NULL;
        if (!v)
            continue;
        if (!json_is_boolean(v))
            rc = shardlm_fail(e, -EINVAL, "%s: field %s: expected true or false", path, keys[i].key);
        else if (json_is_true(v))
            t->flags |= keys[i].flag;
        else
            t->flags &= ~keys[i].flag;
    }
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
        return shardlm_fail(e, -EINVAL, "%s: --tokenizer is for sources without one; this "
                          "directory has tokenizer.json", dir);
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
        rc = shardlm_fail(e, -EINVAL, "%s: the tokenizer has %d tokens, more than config.json "
                        "vocab_size %u", path, t.vocab_size, hc->cfg.vocab_size);
        goto out_free;
    }
    if (has_own && (rc = apply_tokenizer_config(&t, dir, e)))
        goto out_free;
    /* config.json's ids first (the model was trained with them), else the tokenizer's */
    int64_t bos = hc->bos_id >= 0 ? hc->bos_id : t.bos_id;
    int64_t eos = hc->eos_id >= 0 ? hc->eos_id : t.eos_id;
    if (t.bos_id < 0 && bos >= 0 && bos < t.vocab_size)
        t.bos_id = (int)bos;
    if (t.eos_id < 0 && eos >= 0 && eos < t.vocab_size)
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
    h->family = hc.family;
    h->n_layers = hc.cfg.n_layers;
    h->tied = hc.cfg.tied_embd;
    if ((rc = st_set_open(&h->set, dir, e))) {
        free(h);
        return rc;
    }
    s->impl = h;
    s->read = hf_read;
    s->close = hf_close;
    s->cfg = hc.cfg;
    if ((rc = check_tensors(h, &hc.cfg, dir, e)) ||
        (rc = load_tokenizer(s, &hc, dir, tokenizer, e)))
        goto out_close;
    return 0;
out_close:
    coord_source_close(s);
    return rc;
}
