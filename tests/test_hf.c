/* SPDX-License-Identifier: MIT */
/* coordinator/format/{safetensors,hf_config}.c + coordinator/convert/source_hf.c: tiny Hugging
 * Face directories written here (llama in one file, llama in two shards with llama3 RoPE
 * scaling, qwen2 with biases, gemma with head_dim != hidden / heads, qwen3 with q/k norms, also
 * written as a GGUF), read back exactly through
 * coord_source_hf, then converted with `shardlm convert` and compared by `shardlm eval` (one and
 * two workers) with a reference forward written here the way transformers computes these
 * architectures; every corruption of the safetensors, the index, config.json and the tokenizer
 * files is refused with a message naming the file and the field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <sys/stat.h>

#include "gguf_write.h"
#include "hf_config.h"
#include "kn.h"
#include "safetensors.h"
#include "shlm.h"
#include "source.h"
#include "tensors.h"
#include "testutil.h"
#include "tokenizer.h"

static char dir[4096];

static int setup(void **state)
{
    tu_mkdtemp(dir, sizeof(dir), "hf");
    return 0;
}

static int teardown(void **state)
{
    tu_rmdir(dir);
    return 0;
}

/* ---- writing safetensors ---- */

struct wt {
    char name[96];
    const char *dtype; /* "F32", "F16", "BF16" */
    int n_dims;
    uint64_t shape[2];
    float *data; /* the values before rounding to dtype */
};

static size_t dtype_size(const char *dt) { return strcmp(dt, "F32") == 0 ? 4 : 2; }

static uint64_t wt_elems(const struct wt *t)
{
    return t->n_dims == 1 ? t->shape[0] : t->shape[0] * t->shape[1];
}

/* The value a reader must return for @v stored as @dt. */
static float rounded(const char *dt, float v)
{
    if (strcmp(dt, "F16") == 0)
        return kn_f16_to_f32(kn_f32_to_f16(v));
    if (strcmp(dt, "BF16") == 0)
        return kn_bf16_to_f32(kn_f32_to_bf16(v));
    return v;
}

/* Builds a safetensors image of @n tensors (data in order, header padded to 8 bytes). */
static uint8_t *st_image(const struct wt *t, int n, size_t *len)
{
    size_t cap = 256 + (size_t)n * 256, hl = 0;
    char *hdr = malloc(cap);
    hl += (size_t)snprintf(hdr + hl, cap - hl, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = wt_elems(&t[i]) * dtype_size(t[i].dtype);
        char shape[64];
        if (t[i].n_dims == 1)
            snprintf(shape, sizeof(shape), "%llu", (unsigned long long)t[i].shape[0]);
        else
            snprintf(shape, sizeof(shape), "%llu,%llu", (unsigned long long)t[i].shape[0],
                     (unsigned long long)t[i].shape[1]);
        hl += (size_t)snprintf(hdr + hl, cap - hl,
                               ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],"
                               "\"data_offsets\":[%llu,%llu]}",
                               t[i].name, t[i].dtype, shape, (unsigned long long)off,
                               (unsigned long long)(off + bytes));
        off += bytes;
    }
    hl += (size_t)snprintf(hdr + hl, cap - hl, "}");
    while (hl % 8)
        hdr[hl++] = ' ';
    *len = 8 + hl + off;
    uint8_t *b = malloc(*len), *p = b + 8 + hl;
    uint64_t n64 = hl;
    memcpy(b, &n64, 8);
    memcpy(b + 8, hdr, hl);
    free(hdr);
    for (int i = 0; i < n; i++)
        for (uint64_t j = 0; j < wt_elems(&t[i]); j++) {
            float v = t[i].data[j];
            if (strcmp(t[i].dtype, "F32") == 0) {
                memcpy(p, &v, 4);
                p += 4;
            } else {
                uint16_t h = strcmp(t[i].dtype, "F16") == 0 ? kn_f32_to_f16(v) : kn_f32_to_bf16(v);
                memcpy(p, &h, 2);
                p += 2;
            }
        }
    return b;
}

static void put_file(const char *name, const void *buf, size_t len)
{
    char p[4300];
    tu_path(p, sizeof(p), "%s/%s", dir, name);
    assert_int_equal(tu_write(p, buf, len), 0);
}

static void put_text(const char *name, const char *text) { put_file(name, text, strlen(text)); }

static void rm_file(const char *name)
{
    char p[4300];
    tu_path(p, sizeof(p), "%s/%s", dir, name);
    unlink(p);
}

/* ---- a tiny model ---- */

enum fam { LLAMA, QWEN2, GEMMA, QWEN3 };

struct tiny {
    enum fam fam;
    int dim, hidden, layers, heads, kv, head_dim, vocab;
    bool tied, head_dim_field;
    bool llama3; /* rope_scaling llama3: factor 8, low 1, high 4, 256 original positions */
    int shards; /* 1: model.safetensors; 2: two files and an index */
    struct wt t[64];
    int n;
};

static uint32_t hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

static void add(struct tiny *m, const char *name, int rows, int cols)
{
    static const char *const dts[] = {"F32", "F16", "BF16"};
    struct wt *t = &m->t[m->n];
    snprintf(t->name, sizeof(t->name), "%s", name);
    uint32_t h = hash(name);
    t->dtype = dts[(unsigned)m->n % 3];
    t->n_dims = rows ? 2 : 1;
    t->shape[0] = rows ? (uint64_t)rows : (uint64_t)cols;
    t->shape[1] = (uint64_t)cols;
    uint64_t n = wt_elems(t);
    t->data = malloc(n * sizeof(float));
    for (uint64_t i = 0; i < n; i++) {
        h = h * 1664525u + 1013904223u;
        t->data[i] = ((float)(h >> 8) / 16777216.0f - 0.5f) * 1.5f; /* logits far from uniform */
    }
    m->n++;
}

static void tiny_tensors(struct tiny *m)
{
    char nm[96];
    int q = m->heads * m->head_dim, kv = m->kv * m->head_dim;
    m->n = 0;
    add(m, "model.embed_tokens.weight", m->vocab, m->dim);
    if (!m->tied)
        add(m, "lm_head.weight", m->vocab, m->dim);
    add(m, "model.norm.weight", 0, m->dim);
    for (int l = 0; l < m->layers; l++) {
#define L(suffix, r, c)                                                                            \
    snprintf(nm, sizeof(nm), "model.layers.%d." suffix, l);                                        \
    add(m, nm, r, c)
        L("input_layernorm.weight", 0, m->dim);
        L("self_attn.q_proj.weight", q, m->dim);
        L("self_attn.k_proj.weight", kv, m->dim);
        L("self_attn.v_proj.weight", kv, m->dim);
        if (m->fam == QWEN2) {
            L("self_attn.q_proj.bias", 0, q);
            L("self_attn.k_proj.bias", 0, kv);
            L("self_attn.v_proj.bias", 0, kv);
        }
        if (m->fam == QWEN3) {
            L("self_attn.q_norm.weight", 0, m->head_dim);
            L("self_attn.k_norm.weight", 0, m->head_dim);
        }
        L("self_attn.o_proj.weight", m->dim, q);
        L("post_attention_layernorm.weight", 0, m->dim);
        L("mlp.gate_proj.weight", m->hidden, m->dim);
        L("mlp.up_proj.weight", m->hidden, m->dim);
        L("mlp.down_proj.weight", m->dim, m->hidden);
#undef L
    }
}

static void tiny_free(struct tiny *m)
{
    for (int i = 0; i < m->n; i++)
        free(m->t[i].data);
    m->n = 0;
}

/* A byte-level BPE of 9 tokens: "<s>", "</s>", a, b, c, space ("Ġ"), ab, Ġa, abc. */
static const char tokenizer_json[] =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":["
    "{\"id\":0,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true},"
    "{\"id\":1,\"content\":\"</s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true}],"
    "\"normalizer\":null,"
    "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,"
    "\"use_regex\":true},"
    "\"post_processor\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":false,"
    "\"use_regex\":true},"
    "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,"
    "\"use_regex\":true},"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,"
    "\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,\"fuse_unk\":false,"
    "\"byte_fallback\":false,\"ignore_merges\":false,"
    "\"vocab\":{\"<s>\":0,\"</s>\":1,\"a\":2,\"b\":3,\"c\":4,\"\\u0120\":5,\"ab\":6,"
    "\"\\u0120a\":7,\"abc\":8},"
    "\"merges\":[\"a b\",\"\\u0120 a\",\"ab c\"]}}";

static const char *arch_name(enum fam f)
{
    return f == QWEN2   ? "Qwen2ForCausalLM"
           : f == GEMMA ? "GemmaForCausalLM"
           : f == QWEN3 ? "Qwen3ForCausalLM"
                        : "LlamaForCausalLM";
}

static void write_config(const struct tiny *m, const char *extra)
{
    char cfg[4096], hd[256] = "";
    if (m->head_dim_field)
        snprintf(hd, sizeof(hd), "\"head_dim\": %d,", m->head_dim);
    if (m->llama3)
        snprintf(hd + strlen(hd), sizeof(hd) - strlen(hd),
                 " \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0,"
                 " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 256,"
                 " \"rope_type\": \"llama3\"},");
    snprintf(cfg, sizeof(cfg),
             "{\"architectures\": [\"%s\"], \"model_type\": \"x\", \"hidden_size\": %d,"
             " \"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d,"
             " \"num_key_value_heads\": %d, %s \"vocab_size\": %d,"
             " \"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-05,"
             " \"rope_theta\": 500000.0, \"tie_word_embeddings\": %s,"
             " \"bos_token_id\": 0, \"eos_token_id\": [1, 0], \"torch_dtype\": \"bfloat16\"%s}",
             arch_name(m->fam), m->dim, m->hidden, m->layers, m->heads, m->kv, hd, m->vocab,
             m->tied ? "true" : "false", extra ? extra : "");
    put_text("config.json", cfg);
}

/* Writes the directory: config.json, tokenizer.json, the safetensors (and index). */
static void write_tiny(struct tiny *m, const char *extra_config)
{
    tiny_tensors(m);
    rm_file("model.safetensors");
    rm_file("model.safetensors.index.json");
    rm_file("model-00001-of-00002.safetensors");
    rm_file("model-00002-of-00002.safetensors");
    write_config(m, extra_config);
    put_text("tokenizer.json", tokenizer_json);
    size_t len;
    if (m->shards == 1) {
        uint8_t *b = st_image(m->t, m->n, &len);
        put_file("model.safetensors", b, len);
        free(b);
        return;
    }
    int half = m->n / 2;
    uint8_t *b = st_image(m->t, half, &len);
    put_file("model-00001-of-00002.safetensors", b, len);
    free(b);
    b = st_image(m->t + half, m->n - half, &len);
    put_file("model-00002-of-00002.safetensors", b, len);
    free(b);
    char *idx = malloc(16384);
    size_t il = (size_t)snprintf(idx, 16384, "{\"metadata\": {\"total_size\": 1}, "
                                             "\"weight_map\": {");
    for (int i = 0; i < m->n; i++)
        il += (size_t)snprintf(idx + il, 16384 - il,
                               "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "",
                               m->t[i].name, i < half ? 1 : 2);
    snprintf(idx + il, 16384 - il, "}}");
    put_text("model.safetensors.index.json", idx);
    free(idx);
}

static const struct wt *find_wt(const struct tiny *m, const char *name)
{
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->t[i].name, name) == 0)
            return &m->t[i];
    return NULL;
}

/* Our name -> the HF one, as the test understands the mapping. */
static void hf_of(const char *ours, char *out, size_t len, bool *norm)
{
    static const char *const map[][2] = {
        {"attn_norm", "input_layernorm.weight"},    {"ffn_norm", "post_attention_layernorm.weight"},
        {"attn_q", "self_attn.q_proj.weight"},      {"attn_k", "self_attn.k_proj.weight"},
        {"attn_v", "self_attn.v_proj.weight"},      {"attn_q_bias", "self_attn.q_proj.bias"},
        {"attn_k_bias", "self_attn.k_proj.bias"},   {"attn_v_bias", "self_attn.v_proj.bias"},
        {"attn_q_norm", "self_attn.q_norm.weight"}, {"attn_k_norm", "self_attn.k_norm.weight"},
        {"attn_o", "self_attn.o_proj.weight"},      {"ffn_gate", "mlp.gate_proj.weight"},
        {"ffn_up", "mlp.up_proj.weight"},           {"ffn_down", "mlp.down_proj.weight"},
    };
    *norm = false;
    if (!strcmp(ours, "tok_embd")) {
        snprintf(out, len, "model.embed_tokens.weight");
        return;
    }
    if (!strcmp(ours, "output")) {
        snprintf(out, len, "lm_head.weight");
        return;
    }
    if (!strcmp(ours, "output_norm")) {
        snprintf(out, len, "model.norm.weight");
        *norm = true;
        return;
    }
    int l;
    char part[64];
    assert_int_equal(sscanf(ours, "blk.%d.%63s", &l, part), 2);
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (!strcmp(part, map[i][0])) {
            snprintf(out, len, "model.layers.%d.%s", l, map[i][1]);
            *norm = strstr(part, "norm") != NULL;
            return;
        }
    fail_msg("no HF name for %s", ours);
}

/* Opens the directory and checks the config and every tensor, value by value. */
static void check_tiny(const struct tiny *m)
{
    struct coord_source s;
    struct shardlm_err e = {""};
    int rc = coord_source_hf(&s, dir, NULL, &e);
    if (rc)
        fprintf(stderr, "coord_source_hf: %s\n", e.msg);
    assert_int_equal(rc, 0);
    const struct shlm_config *c = &s.cfg;
    assert_int_equal(c->arch, SHLM_ARCH_LLAMA);
    assert_int_equal(c->dim, m->dim);
    assert_int_equal(c->hidden_dim, m->hidden);
    assert_int_equal(c->n_layers, m->layers);
    assert_int_equal(c->n_heads, m->heads);
    assert_int_equal(c->n_kv_heads, m->kv);
    assert_int_equal(c->head_dim, m->head_dim);
    assert_int_equal(c->vocab_size, m->vocab);
    assert_int_equal(c->seq_len, 128);
    assert_true(c->norm_eps == 1e-5f);
    assert_true(c->rope_theta == 500000.0f);
    assert_int_equal(c->rope_neox, 1);
    assert_int_equal(c->tied_embd, m->tied);
    assert_int_equal(c->qkv_bias, m->fam == QWEN2);
    assert_int_equal(c->head_gate, 0);
    assert_int_equal(c->flags, m->fam == QWEN3 ? SHLM_CF_QK_NORM : 0);
    assert_int_equal(c->family, m->fam == QWEN2   ? SHLM_FAMILY_QWEN2
                                : m->fam == GEMMA ? SHLM_FAMILY_GEMMA
                                : m->fam == QWEN3 ? SHLM_FAMILY_QWEN3
                                                  : SHLM_FAMILY_LLAMA);
    assert_int_equal(c->act, m->fam == GEMMA ? SHLM_ACT_GELU_TANH : SHLM_ACT_SILU);
    assert_true(c->embd_scale == (m->fam == GEMMA ? sqrtf((float)m->dim) : 0.0f));
    assert_int_equal(s.bos_id, 0);
    assert_int_equal(s.eos_id, 1); /* the first of the list */
    assert_int_equal(s.tok_kind, SHLM_TOK_BLOB);
    struct coord_tok tok;
    rc = coord_tok_load(&tok, s.tok, s.tok_len, "blob", &e);
    if (rc)
        fprintf(stderr, "coord_tok_load: %s\n", e.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(tok.vocab_size, 9);
    int32_t ids[16];
    int n = coord_tok_encode_ex(&tok, "ab abc", 6, 0, ids, 16);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 6);
    assert_int_equal(ids[1], 5);
    assert_int_equal(ids[2], 8);
    coord_tok_free(&tok);

    struct shlm_tensor_spec *specs = calloc(SHLM_MAX_TENSORS, sizeof(*specs));
    int ns = shlm_expected_tensors(c, &(struct shlm_config_ext){0}, SHLM_SCHEME_F32, 0, 8, NULL,
                                   specs, SHLM_MAX_TENSORS);
    assert_true(ns > 0);
    assert_int_equal(ns, m->n); /* every HF tensor is used, none is left over */
    for (int i = 0; i < ns; i++) {
        char hf[128];
        bool norm;
        hf_of(specs[i].name, hf, sizeof(hf), &norm);
        const struct wt *w = find_wt(m, hf);
        assert_non_null(w);
        size_t cnt = (size_t)specs[i].rows * (size_t)specs[i].cols;
        assert_int_equal(cnt, wt_elems(w));
        float *out = malloc(cnt * sizeof(float));
        enum shlm_kind kind = (enum shlm_kind)specs[i].kind;
        rc = s.read(&s, kind, specs[i].layer, specs[i].expert, specs[i].rows, specs[i].cols, out,
                    &e);
        if (rc)
            fprintf(stderr, "read %s: %s\n", specs[i].name, e.msg);
        assert_int_equal(rc, 0);
        for (size_t j = 0; j < cnt; j++) {
            float want = rounded(w->dtype, w->data[j]) + (norm && m->fam == GEMMA ? 1.0f : 0.0f);
            if (out[j] != want)
                fail_msg("%s[%zu] (%s %s) is %g, want %g", specs[i].name, j, hf, w->dtype,
                         (double)out[j], (double)want);
        }
        /* a wrong shape is refused, naming the tensor */
        e.msg[0] = 0;
        rc = s.read(&s, kind, specs[i].layer, 0, specs[i].cols, specs[i].rows + 1, out, &e);
        assert_int_equal(rc, -EINVAL);
        assert_non_null(strstr(e.msg, hf));
        free(out);
    }
    float one;
    assert_int_equal(s.read(&s, SHLM_KIND_ATTN_Q, 99, 0, 1, 1, &one, &e), -ENOENT);
    assert_int_equal(s.read(&s, SHLM_KIND_ATTN_GATE, 0, 0, 1, 1, &one, &e), -ENOENT);
    assert_int_equal(s.read(&s, SHLM_KIND_COUNT, 0, 0, 1, 1, &one, &e), -ENOENT);
    assert_int_equal(s.read(&s, SHLM_KIND_OUTPUT_NORM, 1, 0, 1, m->dim, &one, &e), -ENOENT);
    if (m->tied)
        assert_int_equal(s.read(&s, SHLM_KIND_OUTPUT, 0, 0, m->vocab, m->dim, &one, &e), -ENOENT);
    if (m->fam != QWEN2)
        assert_int_equal(
            s.read(&s, SHLM_KIND_ATTN_Q_BIAS, 0, 0, 1, m->heads * m->head_dim, &one, &e), -ENOENT);
    if (m->fam != QWEN3)
        assert_int_equal(s.read(&s, SHLM_KIND_ATTN_Q_NORM, 0, 0, 1, m->head_dim, &one, &e),
                         -ENOENT);
    free(specs);
    coord_source_close(&s);
}

/* ---- end to end: shardlm convert + eval against a reference forward ---- */

/* The stored values of HF tensor @fmt (with layer @l) as the reader returns them, or NULL. */
static float *ref_w(const struct tiny *m, const char *fmt, int l)
{
    char name[96];
    snprintf(name, sizeof(name), fmt, l);
    const struct wt *w = find_wt(m, name);
    if (!w)
        return NULL;
    uint64_t n = wt_elems(w);
    float *out = malloc(n * sizeof(float));
    for (uint64_t i = 0; i < n; i++)
        out[i] = rounded(w->dtype, w->data[i]);
    return out;
}

static void ref_matvec(const float *w, const float *b, const float *x, float *y, int rows,
                       int cols)
{
    for (int r = 0; r < rows; r++) {
        double s = b ? b[r] : 0.0;
        for (int c = 0; c < cols; c++)
            s += (double)w[(size_t)r * cols + c] * x[c];
        y[r] = (float)s;
    }
}

/* transformers' LlamaRMSNorm, and GemmaRMSNorm with its (1 + w) */
static void ref_rmsnorm(float *o, const float *x, const float *w, int n, bool gemma)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + 1e-5));
    for (int i = 0; i < n; i++)
        o[i] = (gemma ? 1.0f + w[i] : w[i]) * (r * x[i]);
}

/* logits (n, vocab) of tokens 0..n-1 as transformers computes them for LlamaForCausalLM,
 * Qwen2ForCausalLM, GemmaForCausalLM and Qwen3ForCausalLM: NeoX-halves RoPE (llama3 frequency
 * scaling as in _compute_llama3_parameters), q/k/v biases (qwen2), sqrt(hidden) embedding
 * scale, (1 + w) norms and GELU-tanh (gemma), each head's q and k RMSNorm-ed over head_dim
 * before RoPE (qwen3's q_norm / k_norm). */
static void ref_forward(const struct tiny *m, const int32_t *tok, int n, float *logits)
{
    bool gemma = m->fam == GEMMA;
    int D = m->dim, hd = m->head_dim, Q = m->heads * hd, KV = m->kv * hd, F = m->hidden;
    double inv[64];
    for (int i = 0; i < hd / 2; i++) {
        double f = 1.0 / pow(500000.0, 2.0 * i / hd);
        if (m->llama3) {
            double wl = 2 * M_PI / f, lo_wl = 256.0 / 1.0, hi_wl = 256.0 / 4.0;
            if (wl > lo_wl) {
                f /= 8.0;
            } else if (wl >= hi_wl) {
                double sm = (256.0 / wl - 1.0) / (4.0 - 1.0);
                f = (1 - sm) * f / 8.0 + sm * f;
            }
        }
        inv[i] = f;
    }
    float *emb = ref_w(m, "model.embed_tokens.weight", 0);
    float *onorm = ref_w(m, "model.norm.weight", 0);
    float *head = m->tied ? emb : ref_w(m, "lm_head.weight", 0);
    float *kc = calloc((size_t)m->layers * n * KV, 4), *vc = calloc((size_t)m->layers * n * KV, 4);
    float x[64], xb[64], q[128], k[128], v[128], att[128], o[64], h1[64], h3[64], sc[64];
    assert_true(D <= 64 && Q <= 128 && F <= 64 && n <= 64);
    for (int p = 0; p < n; p++) {
        memcpy(x, emb + (size_t)tok[p] * D, (size_t)D * 4);
        if (gemma)
            for (int i = 0; i < D; i++)
                x[i] *= sqrtf((float)D);
        for (int l = 0; l < m->layers; l++) {
            float *an = ref_w(m, "model.layers.%d.input_layernorm.weight", l);
            float *wq = ref_w(m, "model.layers.%d.self_attn.q_proj.weight", l);
            float *wk = ref_w(m, "model.layers.%d.self_attn.k_proj.weight", l);
            float *wv = ref_w(m, "model.layers.%d.self_attn.v_proj.weight", l);
            float *bq = ref_w(m, "model.layers.%d.self_attn.q_proj.bias", l);
            float *bk = ref_w(m, "model.layers.%d.self_attn.k_proj.bias", l);
            float *bv = ref_w(m, "model.layers.%d.self_attn.v_proj.bias", l);
            float *qn = ref_w(m, "model.layers.%d.self_attn.q_norm.weight", l);
            float *kn = ref_w(m, "model.layers.%d.self_attn.k_norm.weight", l);
            float *wo = ref_w(m, "model.layers.%d.self_attn.o_proj.weight", l);
            float *fn = ref_w(m, "model.layers.%d.post_attention_layernorm.weight", l);
            float *wg = ref_w(m, "model.layers.%d.mlp.gate_proj.weight", l);
            float *wu = ref_w(m, "model.layers.%d.mlp.up_proj.weight", l);
            float *wd = ref_w(m, "model.layers.%d.mlp.down_proj.weight", l);
            ref_rmsnorm(xb, x, an, D, gemma);
            ref_matvec(wq, bq, xb, q, Q, D);
            ref_matvec(wk, bk, xb, k, KV, D);
            ref_matvec(wv, bv, xb, v, KV, D);
            for (int h = 0; qn && h < m->heads; h++)
                ref_rmsnorm(q + h * hd, q + h * hd, qn, hd, false);
            for (int h = 0; kn && h < m->kv; h++)
                ref_rmsnorm(k + h * hd, k + h * hd, kn, hd, false);
            /* rotate_half: element i pairs with i + hd/2 */
            for (int pass = 0; pass < 2; pass++) {
                float *vec = pass ? k : q;
                for (int h = 0; h < (pass ? m->kv : m->heads); h++)
                    for (int i = 0; i < hd / 2; i++) {
                        double a = p * inv[i];
                        float *v0 = &vec[h * hd + i], *v1 = &vec[h * hd + i + hd / 2];
                        float x0 = *v0, x1 = *v1;
                        *v0 = (float)(x0 * cos(a) - x1 * sin(a));
                        *v1 = (float)(x1 * cos(a) + x0 * sin(a));
                    }
            }
            memcpy(kc + ((size_t)l * n + p) * KV, k, (size_t)KV * 4);
            memcpy(vc + ((size_t)l * n + p) * KV, v, (size_t)KV * 4);
            for (int h = 0; h < m->heads; h++) {
                int kvh = h / (m->heads / m->kv);
                double mx = -INFINITY, sum = 0;
                for (int t = 0; t <= p; t++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++)
                        d += (double)q[h * hd + i] * kc[((size_t)l * n + t) * KV + kvh * hd + i];
                    sc[t] = (float)(d / sqrt((double)hd));
                    mx = sc[t] > mx ? sc[t] : mx;
                }
                for (int t = 0; t <= p; t++)
                    sum += sc[t] = (float)exp(sc[t] - mx);
                for (int i = 0; i < hd; i++) {
                    double a = 0;
                    for (int t = 0; t <= p; t++)
                        a += sc[t] / sum * vc[((size_t)l * n + t) * KV + kvh * hd + i];
                    att[h * hd + i] = (float)a;
                }
            }
            ref_matvec(wo, NULL, att, o, D, Q);
            for (int i = 0; i < D; i++)
                x[i] += o[i];
            ref_rmsnorm(xb, x, fn, D, gemma);
            ref_matvec(wg, NULL, xb, h1, F, D);
            ref_matvec(wu, NULL, xb, h3, F, D);
            for (int i = 0; i < F; i++) {
                double a = h1[i];
                a = gemma ? 0.5 * a * (1.0 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))
                          : a / (1.0 + exp(-a));
                h1[i] = (float)(a * h3[i]);
            }
            ref_matvec(wd, NULL, h1, o, D, F);
            for (int i = 0; i < D; i++)
                x[i] += o[i];
            free(an), free(wq), free(wk), free(wv), free(bq), free(bk), free(bv), free(wo);
            free(qn), free(kn);
            free(fn), free(wg), free(wu), free(wd);
        }
        ref_rmsnorm(xb, x, onorm, D, gemma);
        ref_matvec(head, NULL, xb, logits + (size_t)p * m->vocab, m->vocab, D);
    }
    if (head != emb)
        free(head);
    free(emb), free(onorm), free(kc), free(vc);
}

static int run(char *const argv[], struct tu_run *r)
{
    char env[4200];
    tu_path(env, sizeof(env), "SHARDLM_RUNTIME_DIR=%s/run", dir);
    char *envp[] = {env, NULL};
    tu_run_cmd(r, argv, envp, 300, NULL, NULL);
    if (r->status)
        fprintf(stderr, "%s failed (%d): %s\n", argv[1], r->status, r->err);
    return r->status;
}

/* Converts @src (the directory, or a GGUF of the same weights) with `shardlm convert` (f32) and
 * checks `shardlm eval` against ref_forward() at one and two workers (tensor parallel, R = 2).
 * Skipped where the binary is not built (by hand). */
static void eval_source(const struct tiny *m, const char *src)
{
    if (access(tu_bin(), X_OK) != 0) {
        fprintf(stderr, "end-to-end part skipped: %s is not there (run under ctest)\n", tu_bin());
        return;
    }
    struct tu_run *r = malloc(sizeof(*r));
    char shlm[4300], ref[4300], path[4400];
    tu_path(shlm, sizeof(shlm), "%s/m.shlm", dir);
    tu_path(ref, sizeof(ref), "%s/ref", dir);
    char *conv[] = {
        (char *)tu_bin(), "convert", (char *)src, "--scheme", "f32", "-o", shlm, "-q", NULL};
    assert_int_equal(run(conv, r), 0);

    enum { N = 40 };
    int32_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)((i * 37 + 11) % m->vocab);
    float *logits = malloc((size_t)N * m->vocab * sizeof(float));
    ref_forward(m, tok, N, logits);
    mkdir(ref, 0755);
    tu_path(path, sizeof(path), "%s/ref.logits.f32", ref);
    assert_int_equal(tu_write(path, logits, (size_t)N * m->vocab * sizeof(float)), 0);
    char line[1024] = "synthetic\t"; /* 5 "prompt" ids, then the rest as "generated" */
    for (int i = 0; i < N; i++)
        sprintf(line + strlen(line), "%s%d", i == 0 ? "" : i == 5 ? "\t" : " ", tok[i]);
    strcat(line, "\tnone.txt\tref.logits.f32\n");
    tu_path(path, sizeof(path), "%s/greedy.tsv", ref);
    assert_int_equal(tu_write(path, line, strlen(line)), 0);
    free(logits);

    char r1[4300];
    tu_path(r1, sizeof(r1), "%s/r1", dir);
    for (int workers = 1; workers <= 3; workers++) {
        /* 1 and 2 ranks against the reference, the first's logits kept; then 2 against 1 */
        char *ev[] = {(char *)tu_bin(),
                      "eval",
                      "-m",
                      shlm,
                      "--ref",
                      workers == 3 ? r1 : ref,
                      "--cpus",
                      workers == 1 ? "0" : "0:0",
                      workers == 1 ? "--save" : NULL,
                      r1,
                      "--overwrite",
                      NULL};
        assert_int_equal(run(ev, r), 0);
        double kld, top1, ppl;
        char *last = strstr(r->out, "overall ");
        assert_non_null(last);
        assert_int_equal(sscanf(last, "overall kld=%lf top1=%lf ppl=%lf", &kld, &top1, &ppl), 3);
        fprintf(stderr, "%s%s%s: %d worker(s): kld %.3g top1 %.4f against %s\n", arch_name(m->fam),
                m->llama3 ? " (llama3 rope)" : "", src == dir ? "" : " (GGUF)",
                workers < 3 ? workers : 2, kld, top1,
                workers < 3 ? "the reference forward" : "one worker's logits");
        assert_true(kld < (workers == 3 ? 1e-9 : 1e-6));
        assert_true(top1 == 1.0);
    }
    unlink(shlm);
    free(r);
}

static void eval_tiny(const struct tiny *m) { eval_source(m, dir); }

/* The GGUF name of HF tensor @hf, as llama.cpp's convert_hf_to_gguf.py names it. */
static void gguf_of(const char *hf, char *out, size_t len)
{
    static const char *const map[][2] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.q_norm.weight", "attn_q_norm.weight"},
        {"self_attn.k_norm.weight", "attn_k_norm.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    int l, at = 0;
    if (!strcmp(hf, "model.embed_tokens.weight"))
        snprintf(out, len, "token_embd.weight");
    else if (!strcmp(hf, "model.norm.weight"))
        snprintf(out, len, "output_norm.weight");
    else if (!strcmp(hf, "lm_head.weight"))
        snprintf(out, len, "output.weight");
    else {
        assert_int_equal(sscanf(hf, "model.layers.%d.%n", &l, &at), 1);
        for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
            if (!strcmp(hf + at, map[i][0])) {
                snprintf(out, len, "blk.%d.%s", l, map[i][1]);
                return;
            }
        fail_msg("no GGUF name for %s", hf);
    }
}

/* The tiny model's weights (as stored, rounded) as a GGUF of architecture @arch, with a
 * SentencePiece vocabulary of m->vocab tokens, into @path. */
static void write_gguf(const struct tiny *m, const char *arch, const char *path)
{
    struct gguf_writer *w;
    struct shardlm_err e;
    char k[96];
    assert_int_equal(gguf_writer_open(&w, path, &e), 0);
    gguf_w_str(w, "general.architecture", arch);
#define KEY(suffix) (snprintf(k, sizeof(k), "%s." suffix, arch), k)
    gguf_w_u32(w, KEY("context_length"), 128);
    gguf_w_u32(w, KEY("embedding_length"), (uint32_t)m->dim);
    gguf_w_u32(w, KEY("block_count"), (uint32_t)m->layers);
    gguf_w_u32(w, KEY("feed_forward_length"), (uint32_t)m->hidden);
    gguf_w_u32(w, KEY("attention.head_count"), (uint32_t)m->heads);
    gguf_w_u32(w, KEY("attention.head_count_kv"), (uint32_t)m->kv);
    gguf_w_u32(w, KEY("attention.key_length"), (uint32_t)m->head_dim);
    gguf_w_u32(w, KEY("attention.value_length"), (uint32_t)m->head_dim);
    gguf_w_f32(w, KEY("rope.freq_base"), 500000.0f);
    gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
#undef KEY
    char **tok = calloc((size_t)m->vocab, sizeof(char *));
    for (int i = 0; i < m->vocab; i++) {
        tok[i] = malloc(16);
        snprintf(tok[i], 16, i == 0 ? "<s>" : i == 1 ? "</s>" : "t%d", i);
    }
    gguf_w_str(w, "tokenizer.ggml.model", "llama");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, (uint64_t)m->vocab);
    gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 0);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 1);
    for (int i = 0; i < m->vocab; i++)
        free(tok[i]);
    free(tok);
    for (int i = 0; i < m->n; i++) {
        char name[96];
        gguf_of(m->t[i].name, name, sizeof(name));
        gguf_w_tensor(w, name, GGML_F32, m->t[i].shape[m->t[i].n_dims - 1],
                      m->t[i].n_dims == 1 ? 0 : m->t[i].shape[0]);
    }
    for (int i = 0; i < m->n; i++) {
        float *v = ref_w(m, m->t[i].name, 0);
        gguf_w_tensor_rows(w, v, m->t[i].n_dims == 1 ? 1 : m->t[i].shape[0]);
        free(v);
    }
    assert_int_equal(gguf_writer_close(w, &e), 0);
}

static struct tiny llama(void)
{
    return (struct tiny){.fam = LLAMA, .dim = 32, .hidden = 48, .layers = 2, .heads = 4, .kv = 2,
                         .head_dim = 8, .vocab = 40, .tied = false, .shards = 1};
}

static void test_llama(void **state)
{
    struct tiny m = llama();
    write_tiny(&m, NULL);
    check_tiny(&m);
    eval_tiny(&m);
    tiny_free(&m);
}

static void test_llama_sharded(void **state)
{
    struct tiny m = llama();
    m.shards = 2;
    m.tied = true;
    m.head_dim_field = true;
    m.llama3 = true;
    write_tiny(&m, NULL);
    check_tiny(&m);
    struct coord_source s;
    struct shardlm_err e;
    assert_int_equal(coord_source_hf(&s, dir, NULL, &e), 0);
    assert_int_equal(s.cfg.rope_scaling, SHLM_ROPE_LLAMA3);
    assert_true(s.cfg.rope_factor == 8.0f);
    assert_true(s.cfg.rope_low_freq_factor == 1.0f);
    assert_true(s.cfg.rope_high_freq_factor == 4.0f);
    assert_int_equal(s.cfg.rope_orig_ctx, 256);
    coord_source_close(&s);
    eval_tiny(&m);
    tiny_free(&m);
}

static void test_qwen2(void **state)
{
    struct tiny m = llama();
    m.fam = QWEN2;
    m.tied = true;
    m.kv = 1;
    write_tiny(&m, ", \"use_sliding_window\": false, \"sliding_window\": 4096, "
                   "\"rope_scaling\": null, \"hidden_act\": \"silu\"");
    check_tiny(&m);
    eval_tiny(&m);
    tiny_free(&m);
}

static void test_gemma(void **state)
{
    struct tiny m = llama();
    m.fam = GEMMA;
    m.tied = true;
    m.kv = 1;
    m.head_dim = 16; /* heads x head_dim (64) != hidden_size (32), as in gemma-7b */
    m.head_dim_field = true;
    write_tiny(&m, ", \"hidden_act\": \"gelu\", \"hidden_activation\": \"gelu_pytorch_tanh\"");
    check_tiny(&m);
    eval_tiny(&m);
    tiny_free(&m);
}

/* Qwen3: each head's q and k RMSNorm-ed over head_dim before RoPE (q_norm / k_norm), no biases,
 * head_dim 16 with 4 heads over hidden 32; the same weights from the HF folder and from a GGUF
 * (architecture "qwen3"), at one and two ranks. */
static void test_qwen3(void **state)
{
    struct tiny m = llama();
    m.fam = QWEN3;
    m.tied = true;
    m.head_dim = 16;
    m.head_dim_field = true;
    write_tiny(&m, ", \"attention_bias\": false, \"use_sliding_window\": false,"
                   " \"sliding_window\": null, \"max_window_layers\": 28,"
                   " \"hidden_act\": \"silu\", \"rope_scaling\": null");
    check_tiny(&m);
    eval_tiny(&m);
    char gguf[4300];
    tu_path(gguf, sizeof(gguf), "%s/qwen3.gguf", dir);
    write_gguf(&m, "qwen3", gguf);
    struct coord_source s;
    struct shardlm_err e;
    int rc = coord_source_open(&s, gguf, NULL, 0, &e);
    if (rc)
        fail_msg("%s", e.msg);
    assert_int_equal(s.cfg.flags, SHLM_CF_QK_NORM);
    assert_int_equal(s.cfg.family, SHLM_FAMILY_QWEN3);
    assert_int_equal(s.cfg.rope_neox, 1);
    assert_int_equal(s.cfg.qkv_bias, 0);
    assert_int_equal(s.cfg.head_dim, 16);
    coord_source_close(&s);
    eval_source(&m, gguf);
    /* calibrated int4 (AWQ's scales fold into the norms around q/k/v, not into the q/k norms),
     * at two ranks, against the same reference */
    if (access(tu_bin(), X_OK) == 0) {
        struct tu_run *r = malloc(sizeof(*r));
        char q4[4300], ref[4300];
        tu_path(q4, sizeof(q4), "%s/q4.shlm", dir);
        tu_path(ref, sizeof(ref), "%s/ref", dir);
        char *conv[] = {(char *)tu_bin(), "convert", gguf,       "--scheme", "w4a16",
                        "--group",        "32",      "--method", "awq",      "--calib",
                        "self",           "-o",      q4,         "-q",       NULL};
        assert_int_equal(run(conv, r), 0);
        char *ev[] = {(char *)tu_bin(), "eval", "-m", q4, "--ref", ref, "--cpus", "0:0", NULL};
        assert_int_equal(run(ev, r), 0);
        double kld, top1, ppl;
        char *last = strstr(r->out, "overall ");
        assert_non_null(last);
        assert_int_equal(sscanf(last, "overall kld=%lf top1=%lf ppl=%lf", &kld, &top1, &ppl), 3);
        fprintf(stderr, "Qwen3 (GGUF) w4a16 g32 awq: 2 workers: kld %.3g top1 %.4f\n", kld, top1);
        assert_true(kld < 0.05);
        unlink(q4);
        free(r);
    }
    unlink(gguf);
    tiny_free(&m);
}

/* ---- hostile safetensors ---- */

/* Expects st_parse to refuse @buf (an exact-size copy, so overreads are caught), naming each of
 * the NULL-terminated needles. */
static void st_refused(const uint8_t *buf, size_t len, ...)
{
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, buf, len);
    struct st_file f;
    struct shardlm_err e = {""};
    int rc = st_parse(&f, copy, len, "x.safetensors", &e);
    if (rc == 0)
        st_close(&f);
    assert_int_equal(rc, -EINVAL);
    assert_non_null(strstr(e.msg, "x.safetensors"));
    va_list ap;
    va_start(ap, len);
    for (const char *n; (n = va_arg(ap, const char *));)
        if (!strstr(e.msg, n))
            fail_msg("message '%s' lacks '%s'", e.msg, n);
    va_end(ap);
    free(copy);
}

/* A file with header text @json and @data bytes of zeros. */
static uint8_t *raw_image(const char *json, size_t data, size_t *len)
{
    size_t hl = strlen(json);
    *len = 8 + hl + data;
    uint8_t *b = calloc(1, *len);
    uint64_t n = hl;
    memcpy(b, &n, 8);
    memcpy(b + 8, json, hl);
    return b;
}

static void test_safetensors_valid_and_truncated(void **state)
{
    float a[6] = {1, -2, 3.5f, 0.25f, -1e-3f, 65504};
    struct wt t[2] = {
        {.name = "a", .dtype = "F32", .n_dims = 2, .shape = {2, 3}, .data = a},
        {.name = "b.weight", .dtype = "BF16", .n_dims = 1, .shape = {6}, .data = a},
    };
    size_t len;
    uint8_t *b = st_image(t, 2, &len);
    struct st_file f;
    struct shardlm_err e;
    assert_int_equal(st_parse(&f, b, len, "x", &e), 0);
    assert_int_equal(f.n_tensors, 2);
    const struct st_tensor *ta = st_find(&f, "a"), *tb = st_find(&f, "b.weight");
    assert_non_null(ta);
    assert_non_null(tb);
    assert_null(st_find(&f, "c"));
    assert_int_equal(st_tensor_rows(ta), 2);
    assert_int_equal(st_tensor_rows(tb), 1);
    float out[6];
    assert_int_equal(st_read_rows(&f, ta, 1, 2, out, "x", &e), 0);
    assert_true(out[0] == 0.25f && out[1] == -1e-3f && out[2] == 65504.0f);
    assert_int_equal(st_read_rows(&f, ta, 1, 3, out, "x", &e), -EINVAL);
    assert_int_equal(st_read_rows(&f, tb, 0, 1, out, "x", &e), 0);
    for (int i = 0; i < 6; i++)
        assert_true(out[i] == rounded("BF16", a[i]));
    st_close(&f);
    /* every shorter prefix is refused cleanly */
    for (size_t l = 0; l < len; l++)
        st_refused(b, l, NULL);
    free(b);

    /* and through a file */
    b = st_image(t, 2, &len);
    put_file("t.safetensors", b, len - 1);
    char p[4300];
    tu_path(p, sizeof(p), "%s/t.safetensors", dir);
    assert_int_equal(st_open(&f, p, &e), -EINVAL);
    assert_non_null(strstr(e.msg, p));
    assert_non_null(strstr(e.msg, "data_offsets"));
    assert_non_null(strstr(e.msg, "truncated?"));
    put_file("t.safetensors", b, len);
    assert_int_equal(st_open(&f, p, &e), 0);
    assert_int_equal(f.n_tensors, 2);
    st_close(&f);
    free(b);
}

static void test_safetensors_hostile(void **state)
{
    size_t len;
    uint8_t *b;
    /* header length past the end, and past the cap */
    b = raw_image("{}", 0, &len);
    uint64_t n = 1000;
    memcpy(b, &n, 8);
    st_refused(b, len, "header length 1000 runs past the end", NULL);
    n = (uint64_t)1 << 62;
    memcpy(b, &n, 8);
    st_refused(b, len, "header length", NULL);
    free(b);
#define REFUSED(json, data, ...)                                                                   \
    do {                                                                                           \
        b = raw_image(json, data, &len);                                                           \
        st_refused(b, len, __VA_ARGS__, NULL);                                                     \
        free(b);                                                                                   \
    } while (0)
    REFUSED("{}", 0, "no tensors");
    REFUSED("[]", 0, "object");
    REFUSED("{\"a\":", 0, "header JSON");
    REFUSED("{\"__metadata__\":{}}", 0, "no tensors");
    REFUSED("{\"__metadata__\":3,\"a\":{}}", 0, "__metadata__");
    REFUSED("{\"a\":3}", 0, "tensor a");
    REFUSED("{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "tensor a",
            "dtype", "Q4");
    REFUSED("{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "tensor a", "dtype");
    REFUSED("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "tensor a", "dtype");
    /* shape: offsets, dims, counts */
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,10]}}", 16,
            "tensor a", "data_offsets", "need 16");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 8, "shape");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 8,
            "shape");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 8, "shape[0]");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 8, "shape[0]");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, "shape[0]");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}", 8, "shape");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
            "\"data_offsets\":[0,8]}}", 8, "overflows");
    REFUSED("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,536870912],"
            "\"data_offsets\":[0,8]}}", 8, "overflows");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[9223372036854775807,2],"
            "\"data_offsets\":[0,8]}}", 8, "overflows");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 8,
            "data_offsets", "past the 8 data bytes", "truncated?");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
            "data_offsets");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8,
            "data_offsets");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,16]}}", 16,
            "data_offsets");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 16,
            "data_offsets");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[18446744073709551615,"
            "7]}}", 16, "header JSON", "too big");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[9223372036854775807,"
            "7]}}", 16, "data_offsets");
    /* overlapping and duplicate tensors */
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
            "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 24, "overlap");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
            "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 24, "overlap");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
            "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "duplicate");
    REFUSED("{\"a\\nb\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
            "control");
    REFUSED("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "name");
#undef REFUSED
    /* known but unconverted dtypes parse, and are refused when read, by name */
    b = raw_image("{\"a\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[4,8]}}", 8, &len);
    struct st_file f;
    struct shardlm_err e;
    assert_int_equal(st_parse(&f, b, len, "x.safetensors", &e), 0);
    float out[4];
    assert_int_equal(st_read_rows(&f, st_find(&f, "a"), 0, 1, out, "x.safetensors", &e),
                     -EINVAL);
    assert_non_null(strstr(e.msg, "x.safetensors"));
    assert_non_null(strstr(e.msg, "tensor a"));
    assert_non_null(strstr(e.msg, "I8"));
    assert_int_equal(st_read_rows(&f, st_find(&f, "b"), 0, 1, out, "x.safetensors", &e), 0);
    assert_true(out[0] == 0.0f && out[1] == 0.0f);
    st_close(&f);
    free(b);
}

/* ---- hostile directories ---- */

/* coord_source_hf must fail, with every NULL-terminated needle in its message. */
static void dir_refused(int want_rc, ...)
{
    struct coord_source s;
    struct shardlm_err e = {""};
    int rc = coord_source_hf(&s, dir, NULL, &e);
    if (rc == 0)
        coord_source_close(&s);
    if (rc != want_rc)
        fail_msg("rc %d (want %d): %s", rc, want_rc, e.msg);
    if (getenv("TEST_HF_VERBOSE"))
        fprintf(stderr, "refused: %s\n", e.msg);
    va_list ap;
    va_start(ap, want_rc);
    for (const char *n; (n = va_arg(ap, const char *));)
        if (!strstr(e.msg, n))
            fail_msg("message '%s' lacks '%s'", e.msg, n);
    va_end(ap);
}

static void test_dir_hostile(void **state)
{
    struct tiny m = llama();
    m.shards = 2;
    write_tiny(&m, NULL);
    char ip[4300];
    tu_path(ip, sizeof(ip), "%s/model.safetensors.index.json", dir);
    char *idx = tu_slurp(ip, NULL);
    assert_non_null(idx);

    /* the index names a path outside the directory */
    put_text("model.safetensors.index.json",
             "{\"weight_map\": {\"model.embed_tokens.weight\": \"../x.safetensors\"}}");
    dir_refused(-EINVAL, "model.safetensors.index.json", "weight_map.model.embed_tokens.weight",
                "plain file name", NULL);
    put_text("model.safetensors.index.json",
             "{\"weight_map\": {\"model.embed_tokens.weight\": \"a/b.safetensors\"}}");
    dir_refused(-EINVAL, "model.safetensors.index.json", "plain file name", NULL);
    put_text("model.safetensors.index.json",
             "{\"weight_map\": {\"model.embed_tokens.weight\": \"..\"}}");
    dir_refused(-EINVAL, "model.safetensors.index.json", "plain file name", NULL);
    put_text("model.safetensors.index.json", "{\"weight_map\": {}}");
    dir_refused(-EINVAL, "model.safetensors.index.json", "weight_map", NULL);
    put_text("model.safetensors.index.json", "{\"weight_map\": [1]");
    dir_refused(-EINVAL, "model.safetensors.index.json", "line 1", NULL);
    put_text("model.safetensors.index.json",
             "{\"weight_map\": {\"model.embed_tokens.weight\": \"missing.safetensors\"}}");
    dir_refused(-ENOENT, "missing.safetensors", NULL);
    /* an entry in the wrong file */
    put_text("model.safetensors.index.json",
             "{\"weight_map\": {\"model.embed_tokens.weight\": "
             "\"model-00002-of-00002.safetensors\", \"lm_head.weight\": "
             "\"model-00001-of-00002.safetensors\"}}");
    dir_refused(-EINVAL, "weight_map.model.embed_tokens.weight", "model-00001-of-00002", NULL);
    put_text("model.safetensors.index.json", idx);

    /* the same tensor in both shards */
    size_t len;
    uint8_t *b = st_image(m.t, m.n / 2 + 1, &len);
    put_file("model-00001-of-00002.safetensors", b, len);
    free(b);
    dir_refused(-EINVAL, m.t[m.n / 2].name, "in both", NULL);

    /* a tensor missing, of another shape, of another dtype */
    struct tiny one = llama(); /* untied, one file */
    write_tiny(&one, NULL);
    b = st_image(one.t, one.n - 1, &len);
    put_file("model.safetensors", b, len);
    free(b);
    dir_refused(-EINVAL, "model.layers.1.mlp.down_proj.weight", "missing", NULL);
    b = st_image(one.t + 1, one.n - 1, &len);
    put_file("model.safetensors", b, len);
    free(b);
    dir_refused(-EINVAL, "model.embed_tokens.weight", "missing", NULL);
    /* untied without lm_head */
    struct wt *noh = malloc(sizeof(*noh) * (size_t)one.n);
    int k = 0;
    for (int i = 0; i < one.n; i++)
        if (strcmp(one.t[i].name, "lm_head.weight") != 0)
            noh[k++] = one.t[i];
    b = st_image(noh, k, &len);
    put_file("model.safetensors", b, len);
    free(b);
    dir_refused(-EINVAL, "lm_head.weight", "tie_word_embeddings", NULL);
    /* tied from here on: the same tensors open */
    one.tied = true;
    write_config(&one, NULL);
    struct coord_source s;
    struct shardlm_err e;
    assert_int_equal(coord_source_hf(&s, dir, NULL, &e), 0);
    coord_source_close(&s);
    /* k_proj transposed */
    struct wt *kp = NULL;
    for (int i = 0; i < k; i++)
        if (strcmp(noh[i].name, "model.layers.1.self_attn.k_proj.weight") == 0)
            kp = &noh[i];
    assert_non_null(kp);
    kp->shape[0] = (uint64_t)one.dim;
    kp->shape[1] = (uint64_t)(one.kv * one.head_dim);
    b = st_image(noh, k, &len);
    put_file("model.safetensors", b, len);
    free(b);
    dir_refused(-EINVAL, "model.safetensors", "model.layers.1.self_attn.k_proj.weight",
                "shape is [32, 16]", "16 x 32", NULL);
    kp->shape[0] = (uint64_t)(one.kv * one.head_dim);
    kp->shape[1] = (uint64_t)one.dim;
    /* a dtype the reader does not convert */
    const char *dt = kp->dtype;
    kp->dtype = "U16";
    b = st_image(noh, k, &len);
    put_file("model.safetensors", b, len);
    free(b);
    dir_refused(-EINVAL, "model.safetensors", "model.layers.1.self_attn.k_proj.weight", "U16",
                "not supported", NULL);
    kp->dtype = dt;
    /* a tokenizer is needed, and a sound one */
    b = st_image(noh, k, &len);
    put_file("model.safetensors", b, len);
    rm_file("tokenizer.json");
    dir_refused(-ENOENT, "tokenizer.json", NULL);
    put_text("tokenizer.json", "{\"model\": 3}");
    dir_refused(-EINVAL, "tokenizer.json", NULL);
    put_text("tokenizer.json", tokenizer_json);
    put_text("tokenizer_config.json", "{\"add_bos_token\": 1}");
    dir_refused(-EINVAL, "tokenizer_config.json", "add_bos_token", NULL);
    put_text("tokenizer_config.json", "{\"add_bos_token\": true, \"add_eos_token\": false, "
                                      "\"chat_template\": \"{{ messages }}\"}");
    assert_int_equal(coord_source_hf(&s, dir, NULL, &e), 0);
    struct coord_tok tok;
    assert_int_equal(coord_tok_load(&tok, s.tok, s.tok_len, "blob", &e), 0);
    assert_true(tok.flags & COORD_TOKF_ADD_BOS);
    assert_false(tok.flags & COORD_TOKF_ADD_EOS);
    assert_string_equal(tok.chat_template, "{{ messages }}"); /* it travels in the blob */
    coord_tok_free(&tok);
    coord_source_close(&s);
    /* chat templates: a list of named ones (the default is taken), chat_template.jinja first */
    put_text("tokenizer_config.json", "{\"chat_template\": [{\"name\": \"tool_use\", "
                                      "\"template\": \"T\"}, {\"name\": \"default\", "
                                      "\"template\": \"D\"}]}");
    assert_int_equal(coord_source_hf(&s, dir, NULL, &e), 0);
    assert_int_equal(coord_tok_load(&tok, s.tok, s.tok_len, "blob", &e), 0);
    assert_string_equal(tok.chat_template, "D");
    coord_tok_free(&tok);
    coord_source_close(&s);
    put_text("chat_template.jinja", "J");
    assert_int_equal(coord_source_hf(&s, dir, NULL, &e), 0);
    assert_int_equal(coord_tok_load(&tok, s.tok, s.tok_len, "blob", &e), 0);
    assert_string_equal(tok.chat_template, "J");
    coord_tok_free(&tok);
    coord_source_close(&s);
    rm_file("chat_template.jinja");
    put_text("tokenizer_config.json", "{\"chat_template\": 5}");
    dir_refused(-EINVAL, "tokenizer_config.json", "chat_template", NULL);
    rm_file("tokenizer_config.json");
    put_file("chat_template.jinja", "{{ \xff }}", 6);
    dir_refused(-EINVAL, "chat_template.jinja", "chat template is not UTF-8 text", NULL);
    rm_file("chat_template.jinja");
    /* truncations of the model file, a few lengths */
    for (size_t l = 0; l < len; l += len / 7 + 1) {
        put_file("model.safetensors", b, l);
        dir_refused(-EINVAL, "model.safetensors", NULL);
    }
    free(b);
    rm_file("model.safetensors");
    dir_refused(-ENOENT, "no model.safetensors", NULL);
    /* config and tensors disagree on the vocabulary */
    one.vocab = 30;
    write_config(&one, NULL);
    b = st_image(noh, k, &len);
    put_file("model.safetensors", b, len);
    free(b);
    dir_refused(-EINVAL, "model.embed_tokens.weight", "shape is [40, 32]", NULL);
    /* more tokens than the model has rows */
    struct tiny small = llama();
    small.vocab = 8;
    small.tied = true;
    write_tiny(&small, NULL);
    dir_refused(-EINVAL, "tokenizer.json", "9 tokens", "vocab_size 8", NULL);
    tiny_free(&small);

    free(noh);
    free(idx);
    tiny_free(&one);
    tiny_free(&m);
}

/* Non-finite or overflowing weights are refused where they are read, naming the tensor and the
 * first bad element; a special token id the tokenizer lacks is refused with its size. */
static void test_dir_weights(void **state)
{
    static const struct {
        const char *tensor;
        enum shlm_kind kind;
        uint32_t layer;
        int rows, at;
        float v;
        const char *shown;
    } cases[] = {
        {"model.norm.weight", SHLM_KIND_OUTPUT_NORM, 0, 0, 3, NAN, "nan"},
        {"model.embed_tokens.weight", SHLM_KIND_TOK_EMBD, 0, 40, 7, INFINITY, "inf"},
        {"model.layers.1.input_layernorm.weight", SHLM_KIND_ATTN_NORM, 1, 0, 0, 3e38f, "e+38"},
    };
    float *row = malloc(40 * 32 * sizeof(float));
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct tiny m = llama();
        write_tiny(&m, NULL);
        struct wt *t = (struct wt *)find_wt(&m, cases[i].tensor);
        assert_non_null(t);
        t->dtype = "F32"; /* 3e38 stays itself */
        t->data[cases[i].at] = cases[i].v;
        size_t len;
        uint8_t *b = st_image(m.t, m.n, &len);
        put_file("model.safetensors", b, len);
        free(b);
        struct coord_source s;
        struct shardlm_err e = {""};
        assert_int_equal(coord_source_hf(&s, dir, NULL, &e), 0);
        int rows = cases[i].rows ? cases[i].rows : 1;
        assert_int_equal(s.read(&s, cases[i].kind, cases[i].layer, 0, rows, 32, row, &e), -EINVAL);
        char at[64];
        snprintf(at, sizeof(at), "element %d ", cases[i].at);
        if (!strstr(e.msg, cases[i].tensor) || !strstr(e.msg, at) ||
            !strstr(e.msg, cases[i].shown))
            fail_msg("%s: %s", cases[i].tensor, e.msg);
        coord_source_close(&s);
        tiny_free(&m);
    }
    free(row);
    /* config.json's eos_token_id inside vocab_size (40) but not among the tokenizer's 9 */
    struct tiny m = llama();
    write_tiny(&m, NULL);
    char cp[4300];
    tu_path(cp, sizeof(cp), "%s/config.json", dir);
    char *cfg = tu_slurp(cp, NULL);
    char *at = strstr(cfg, "\"eos_token_id\": [1, 0]");
    assert_non_null(at);
    memcpy(at, "\"eos_token_id\": 20    ", 22);
    put_text("config.json", cfg);
    free(cfg);
    dir_refused(-EINVAL, "eos_token_id is 20", "9 tokens", NULL);
    /* no EOS at all (token 0 stood in for it, silently) */
    cfg = tu_slurp(cp, NULL);
    at = strstr(cfg, "\"eos_token_id\": 20    ");
    assert_non_null(at);
    memcpy(at, "\"eos_token_id\": null  ", 22);
    put_text("config.json", cfg);
    free(cfg);
    char tp[4300];
    tu_path(tp, sizeof(tp), "%s/tokenizer.json", dir);
    char *tj = tu_slurp(tp, NULL), *q;
    assert_non_null(tj);
    while ((q = strstr(tj, "</s>"))) /* nor one the tokenizer knows by its text */
        memcpy(q, "<q/>", 4);
    put_text("tokenizer.json", tj);
    free(tj);
    dir_refused(-EINVAL, "no end-of-sequence token", NULL);
    tiny_free(&m);
}

/* ---- config.json ---- */

static const char base_cfg[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 172,"
    " \"num_hidden_layers\": 5, \"num_attention_heads\": 8, \"num_key_value_heads\": 4,"
    " \"vocab_size\": 512, \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-05%s}";

/* Drops field "@key": from @json. */
static void drop_field(char *json, const char *key)
{
    char k[80];
    snprintf(k, sizeof(k), "\"%s\":", key);
    char *p = strstr(json, k);
    if (!p)
        return;
    char *end = strpbrk(p + strlen(k), ",}");
    if (*end == ',') {
        end++;
    } else { /* the last field: drop the comma before it */
        while (p > json && *(p - 1) != ',')
            p--;
        if (p > json)
            p--;
    }
    memmove(p, end, strlen(end) + 1);
}

/* base_cfg and @extra: "-key" drops a field; ", \"key\": v" replaces or adds one; "=text"
 * appends text as it is. */
static int cfg_parse(struct coord_hf_config *hc, const char *extra, struct shardlm_err *e)
{
    char json[4096];
    snprintf(json, sizeof(json), base_cfg, extra[0] == '=' ? extra + 1 : "");
    if (extra[0] == '-') {
        drop_field(json, extra + 1);
    } else if (extra[0] == ',') {
        char key[64];
        assert_int_equal(sscanf(extra, ", \"%63[^\"]\"", key), 1);
        drop_field(json, key);
        size_t l = strlen(json);
        json[l - 1] = 0; /* the closing brace */
        snprintf(json + l - 1, sizeof(json) - l + 1, "%s}", extra);
    }
    return coord_hf_config_parse(hc, json, strlen(json), "d/config.json", e);
}

static void cfg_refused(const char *extra, ...)
{
    struct coord_hf_config hc;
    struct shardlm_err e = {""};
    int rc = cfg_parse(&hc, extra, &e);
    if (rc != -EINVAL)
        fail_msg("config with '%s': rc %d, %s", extra, rc, e.msg);
    assert_non_null(strstr(e.msg, "d/config.json"));
    assert_null(strchr(e.msg, '\n'));
    assert_null(strchr(e.msg, '\x1b'));
    va_list ap;
    va_start(ap, extra);
    for (const char *n; (n = va_arg(ap, const char *));)
        if (!strstr(e.msg, n))
            fail_msg("config with '%s': message '%s' lacks '%s'", extra, e.msg, n);
    va_end(ap);
}

static void test_config(void **state)
{
    struct coord_hf_config hc;
    struct shardlm_err e;
    assert_int_equal(cfg_parse(&hc, "", &e), 0);
    assert_int_equal(hc.cfg.family, SHLM_FAMILY_LLAMA);
    assert_int_equal(hc.cfg.head_dim, 8);
    assert_true(hc.cfg.rope_theta == 10000.0f);
    assert_int_equal(hc.cfg.tied_embd, 0);
    assert_int_equal(hc.cfg.act, SHLM_ACT_SILU);
    assert_int_equal(hc.cfg.rope_scaling, SHLM_ROPE_NONE);
    assert_int_equal(hc.bos_id, -1);
    assert_int_equal(hc.eos_id, -1);
    assert_int_equal(cfg_parse(&hc, "-num_key_value_heads", &e), 0);
    assert_int_equal(hc.cfg.n_kv_heads, 8);
    assert_int_equal(cfg_parse(&hc, ", \"eos_token_id\": [7, 8], \"bos_token_id\": null, "
                               "\"rope_scaling\": {\"rope_type\": \"default\"}, "
                               "\"tie_word_embeddings\": true", &e), 0);
    assert_int_equal(hc.eos_id, 7);
    assert_int_equal(hc.bos_id, -1);
    assert_int_equal(hc.cfg.tied_embd, 1);
    assert_int_equal(hc.cfg.rope_scaling, SHLM_ROPE_NONE);
    assert_int_equal(cfg_parse(&hc, ", \"rope_scaling\": {\"type\": \"llama3\", \"factor\": 32,"
                               " \"low_freq_factor\": 1, \"high_freq_factor\": 4,"
                               " \"original_max_position_embeddings\": 8192}", &e), 0);
    assert_int_equal(hc.cfg.rope_scaling, SHLM_ROPE_LLAMA3);
    assert_true(hc.cfg.rope_factor == 32.0f);
    assert_int_equal(hc.cfg.rope_orig_ctx, 8192);
    assert_int_equal(hc.cfg.seq_len, 512); /* llama3: max_position_embeddings */
    /* linear (Gemma 3's): the factor; the context stays max_position_embeddings */
    assert_int_equal(
        cfg_parse(&hc, ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8}", &e), 0);
    assert_int_equal(hc.cfg.rope_scaling, SHLM_ROPE_LINEAR);
    assert_true(hc.cfg.rope_factor == 8.0f);
    assert_int_equal(hc.cfg.seq_len, 512);
    /* YaRN: the context is factor times the original one where that is longer than
     * max_position_embeddings (512): 4 x 256, 4 x 512 (the original's default), not 4 x 64 */
    assert_int_equal(cfg_parse(&hc,
                               ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4,"
                               " \"original_max_position_embeddings\": 256}",
                               &e),
                     0);
    assert_int_equal(hc.cfg.rope_scaling, SHLM_ROPE_YARN);
    assert_int_equal(hc.cfg.seq_len, 1024);
    assert_int_equal(
        cfg_parse(&hc, ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}", &e), 0);
    assert_int_equal(hc.cfg.rope_orig_ctx, 512);
    assert_int_equal(hc.cfg.seq_len, 2048);
    assert_int_equal(hc.cfgx.yarn_exact, 0); /* truncate's default: rounded ramp bounds */
    assert_int_equal(cfg_parse(&hc,
                               ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4,"
                               " \"truncate\": false}",
                               &e),
                     0);
    assert_int_equal(hc.cfgx.yarn_exact, 1); /* gpt-oss's */
    assert_int_equal(cfg_parse(&hc,
                               ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4,"
                               " \"original_max_position_embeddings\": 64}",
                               &e),
                     0);
    assert_int_equal(hc.cfg.seq_len, 512);
    /* past seq_len's bound (2^20): the bound */
    assert_int_equal(cfg_parse(&hc,
                               ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 1024,"
                               " \"original_max_position_embeddings\": 65536}",
                               &e),
                     0);
    assert_int_equal(hc.cfg.seq_len, 1u << 20);

    /* missing fields, wrong types, out of range */
    static const char *const required[] = {"hidden_size", "intermediate_size", "num_hidden_layers",
                                           "num_attention_heads", "vocab_size",
                                           "max_position_embeddings", "rms_norm_eps",
                                           "architectures"};
    for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
        char k[64];
        snprintf(k, sizeof(k), "-%s", required[i]);
        cfg_refused(k, required[i], NULL);
    }
    cfg_refused(", \"hidden_size\": \"64\"", "hidden_size", "expected an integer", NULL);
    cfg_refused(", \"hidden_size\": 64.0", "hidden_size", "expected an integer", NULL);
    cfg_refused(", \"hidden_size\": 1000000000000", "hidden_size", "1..65536", NULL);
    cfg_refused(", \"hidden_size\": -64", "hidden_size", NULL);
    cfg_refused(", \"hidden_size\": 0", "hidden_size", NULL);
    cfg_refused(", \"vocab_size\": 99999999999999999999999", "line 1", NULL); /* jansson */
    cfg_refused(", \"num_hidden_layers\": 4096", "num_hidden_layers", NULL);
    cfg_refused(", \"max_position_embeddings\": 4294967296", "max_position_embeddings", NULL);
    cfg_refused(", \"rms_norm_eps\": \"1e-5\"", "rms_norm_eps", "number", NULL);
    cfg_refused(", \"rms_norm_eps\": 0", "rms_norm_eps", NULL);
    cfg_refused(", \"rms_norm_eps\": 1e300", "rms_norm_eps", NULL);
    cfg_refused(", \"rope_theta\": 0.5", "rope_theta", NULL);
    cfg_refused(", \"rope_theta\": 1e300", "rope_theta", NULL);
    cfg_refused(", \"num_key_value_heads\": 3", "num_key_value_heads", NULL);
    cfg_refused(", \"num_key_value_heads\": 0", "num_key_value_heads", NULL);
    cfg_refused(", \"hidden_size\": 60", "head_dim", "does not divide", NULL);
    cfg_refused(", \"head_dim\": 7", "head_dim", "even", NULL);
    cfg_refused(", \"head_dim\": 4096", "head_dim", NULL);
    cfg_refused(", \"tie_word_embeddings\": 1", "tie_word_embeddings", NULL);
    cfg_refused(", \"attention_bias\": true", "attention_bias", NULL);
    cfg_refused(", \"mlp_bias\": true", "mlp_bias", NULL);
    cfg_refused(", \"hidden_act\": \"relu\"", "hidden_act", "relu", NULL);
    cfg_refused(", \"hidden_act\": \"gelu\"", "hidden_act", NULL); /* exact gelu: gemma only */
    cfg_refused(", \"hidden_act\": 1", "hidden_act", NULL);
    cfg_refused(", \"eos_token_id\": \"2\"", "eos_token_id", NULL);
    cfg_refused(", \"eos_token_id\": 512", "eos_token_id", "vocab_size", NULL);
    cfg_refused(", \"bos_token_id\": -1", "bos_token_id", NULL);
    cfg_refused(", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4, \"mscale\": 1}",
                "rope_scaling.mscale", "not supported", NULL);
    cfg_refused(", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 0.5}", "rope_scaling.factor",
                NULL);
    cfg_refused(", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4, \"truncate\": 0}",
                "rope_scaling.truncate: expected true or false", NULL);
    cfg_refused(", \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1, 1]}",
                "rope_scaling.short_factor", "list of 4 numbers", NULL);
    cfg_refused(", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 0.5}",
                "rope_scaling.factor", "1..1024", NULL);
    cfg_refused(", \"rope_scaling\": {\"type\": \"linear\"}", "rope_scaling.factor", "missing",
                NULL);
    cfg_refused(", \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 4}",
                "\"dynamic\": only linear, llama3, yarn and longrope", NULL);
    cfg_refused(", \"rope_scaling\": {\"factor\": 4}", "rope_scaling.rope_type", NULL);
    cfg_refused(", \"rope_scaling\": 4", "rope_scaling", NULL);
    cfg_refused(", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8,"
                " \"low_freq_factor\": 1, \"high_freq_factor\": 4}",
                "rope_scaling.original_max_position_embeddings", "missing", NULL);
    cfg_refused(", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8,"
                " \"low_freq_factor\": 4, \"high_freq_factor\": 1,"
                " \"original_max_position_embeddings\": 8192}", "rope_scaling", NULL);
    cfg_refused(", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": \"8\","
                " \"low_freq_factor\": 1, \"high_freq_factor\": 4,"
                " \"original_max_position_embeddings\": 8192}", "rope_scaling.factor", NULL);
    cfg_refused("=, \"hidden_size\": 32", "duplicate", NULL);
    /* settings that change the computation and that the runtime lacks: refused by name and
     * value (as GGUF's are, from the same table), their neutral values taken */
    cfg_refused(", \"final_logit_softcapping\": 30.0", "final_logit_softcapping", "30",
                "not supported", NULL);
    cfg_refused(", \"attn_logit_softcapping\": 50", "attn_logit_softcapping", "50", NULL);
    cfg_refused(", \"attn_logit_softcapping\": \"50\"", "attn_logit_softcapping", "string",
                NULL);
    cfg_refused(", \"attention_multiplier\": 0.5", "attention_multiplier", "0.5", NULL);
    cfg_refused(", \"embedding_multiplier\": 12", "embedding_multiplier", "12", NULL);
    cfg_refused(", \"residual_multiplier\": 0.22", "residual_multiplier", "0.22", NULL);
    cfg_refused(", \"logits_scaling\": 8", "logits_scaling", "8", NULL);
    cfg_refused(", \"partial_rotary_factor\": 0.5", "partial_rotary_factor", "0.5", NULL);
    cfg_refused(", \"query_pre_attn_scalar\": 256", "query_pre_attn_scalar", "256", NULL);
    cfg_refused(", \"num_local_experts\": 8", "num_local_experts", "mixture of experts", NULL);
    /* a quantized checkpoint, by its method (not by the first packed tensor found missing) */
    cfg_refused(", \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4}",
                "quantization_config.quant_method is \"gptq\"", "not supported", NULL);
    cfg_refused(", \"quantization_config\": {\"bits\": 4}", "quantization_config", NULL);
    cfg_refused(", \"quantization_config\": \"fp8\"", "quantization_config", NULL);
    assert_int_equal(cfg_parse(&hc, ", \"quantization_config\": null", &e), 0);
    static const char *const neutral[] = {
        ", \"final_logit_softcapping\": null", ", \"partial_rotary_factor\": 1.0",
        ", \"query_pre_attn_scalar\": 8", ", \"attention_multiplier\": 0.35355339059327373",
        ", \"use_sliding_window\": false, \"sliding_window\": 4096"};
    for (size_t i = 0; i < sizeof(neutral) / sizeof(neutral[0]); i++)
        if (cfg_parse(&hc, neutral[i], &e))
            fail_msg("'%s': %s", neutral[i], e.msg);
    /* token ids: out of the vocabulary (either end, any list element), with its size */
    cfg_refused(", \"eos_token_id\": -1", "eos_token_id", "-1", "vocab_size 512", NULL);
    cfg_refused(", \"eos_token_id\": 100000", "eos_token_id", "100000", "vocab_size 512", NULL);
    cfg_refused(", \"eos_token_id\": [7, 600]", "eos_token_id", "600", NULL);
    cfg_refused(", \"bos_token_id\": 100000", "bos_token_id", "100000", "vocab_size 512", NULL);
    /* a file's strings in a message are escaped: no forged line, no terminal control */
    cfg_refused(", \"architectures\": [\"\\u001b[31mEVIL\\nshardlm convert: wrote x\"]",
                "\"\\x1b[31mEVIL\\nshardlm convert: wrote x\"", NULL);
    cfg_refused(", \"hidden_act\": \"\\u009b2J\"", "\\xc2\\x9b2J", NULL);
    /* architectures */
    struct shardlm_err e2 = {""};
    static const char *const archs[][2] = {
        {"{\"architectures\": [\"FalconForCausalLM\"]}", "FalconForCausalLM"},
        {"{\"architectures\": [\"DeepseekV32ForCausalLM\"]}", "DeepseekV32ForCausalLM"},
        {"{\"architectures\": []}", "architectures"},
        {"{\"architectures\": \"LlamaForCausalLM\"}", "architectures"},
        {"{\"architectures\": [3]}", "architectures"},
        {"[]", "object"},
        {"", "line"},
        {"{\"a\": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "line"},
    };
    for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++) {
        int rc = coord_hf_config_parse(&hc, archs[i][0], strlen(archs[i][0]), "c.json", &e2);
        assert_int_equal(rc, -EINVAL);
        if (!strstr(e2.msg, archs[i][1]) || !strstr(e2.msg, "c.json"))
            fail_msg("'%s': %s", archs[i][0], e2.msg);
    }
    /* qwen2 and gemma defaults */
    const char *q = "{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 64,"
                    " \"intermediate_size\": 100, \"num_hidden_layers\": 2,"
                    " \"num_attention_heads\": 4, \"vocab_size\": 100,"
                    " \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-6,"
                    " \"use_sliding_window\": true}";
    assert_int_equal(coord_hf_config_parse(&hc, q, strlen(q), "q", &e2), -EINVAL);
    assert_non_null(strstr(e2.msg, "use_sliding_window"));
    const char *g = "{\"architectures\": [\"GemmaForCausalLM\"], \"hidden_size\": 64,"
                    " \"intermediate_size\": 100, \"num_hidden_layers\": 2,"
                    " \"num_attention_heads\": 4, \"vocab_size\": 100, \"head_dim\": 32,"
                    " \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-6,"
                    " \"hidden_act\": \"gelu\"}";
    assert_int_equal(coord_hf_config_parse(&hc, g, strlen(g), "g", &e2), 0);
    assert_int_equal(hc.cfg.family, SHLM_FAMILY_GEMMA);
    assert_int_equal(hc.cfg.tied_embd, 1);
    assert_int_equal(hc.cfg.head_dim, 32);
    assert_int_equal(hc.cfg.act, SHLM_ACT_GELU_TANH);
    assert_true(hc.cfg.embd_scale == 8.0f);
    assert_int_equal(hc.cfg.qkv_bias, 0);

    /* through the directory: the message names the file */
    struct tiny m = llama();
    write_tiny(&m, ", \"hidden_act\": \"relu\"");
    dir_refused(-EINVAL, "config.json", "hidden_act", NULL);
    put_text("config.json", "{\"architectures\": [\"FalconForCausalLM\"]}");
    dir_refused(-EINVAL, "config.json", "FalconForCausalLM", NULL);
    rm_file("config.json");
    dir_refused(-ENOENT, "config.json", NULL);
    tiny_free(&m);
}

/* A config of @arch (@layers layers, 4 heads, head_dim 16 unless @extra says) with @extra fields
 * (", \"key\": value ..."). */
static int layers_parse(struct coord_hf_config *hc, const char *arch, int layers, const char *extra,
                        struct shardlm_err *e)
{
    char json[4096];
    snprintf(json, sizeof(json),
             "{\"architectures\": [\"%s\"], \"hidden_size\": 64, \"intermediate_size\": 100,"
             " \"num_hidden_layers\": %d, \"num_attention_heads\": 4, \"vocab_size\": 100,"
             " \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6%s}",
             arch, layers, extra);
    return coord_hf_config_parse(hc, json, strlen(json), "a/config.json", e);
}

/* A config of @arch with 4 layers and @extra fields. */
static int arch_parse(struct coord_hf_config *hc, const char *arch, const char *extra,
                      struct shardlm_err *e)
{
    return layers_parse(hc, arch, 4, extra, e);
}

/* What the newer architectures' configs add, read into cfgx (and refused where the runtime
 * lacks the value): Granite's multipliers, Mistral's and Phi-3's windows, SmolLM3's layers
 * without RoPE, LongRoPE's factors and attention factor, YaRN. */
static void test_config_ext(void **state)
{
    struct coord_hf_config hc;
    struct shardlm_err e = {""};
    assert_int_equal(arch_parse(&hc, "GraniteForCausalLM",
                                ", \"embedding_multiplier\": 12, \"residual_multiplier\": 0.25,"
                                " \"attention_multiplier\": 0.1, \"logits_scaling\": 4",
                                &e),
                     0);
    assert_int_equal(hc.cfg.family, SHLM_FAMILY_GRANITE);
    assert_true(hc.cfg.embd_scale == 12.0f && hc.cfgx.resid_mult == 0.25f &&
                hc.cfgx.query_scale == 0.1f && hc.cfgx.logit_scale == 4.0f);
    /* another family's multiplier is still refused by name */
    assert_int_equal(arch_parse(&hc, "MistralForCausalLM", ", \"logits_scaling\": 4", &e), -EINVAL);
    assert_non_null(strstr(e.msg, "logits_scaling is 4"));
    assert_int_equal(arch_parse(&hc, "MistralForCausalLM", ", \"sliding_window\": 64", &e), 0);
    assert_int_equal(hc.cfgx.window, 64);
    assert_int_equal(arch_parse(&hc, "MistralForCausalLM", ", \"sliding_window\": null", &e), 0);
    assert_int_equal(hc.cfgx.window, 0);
    assert_int_equal(
        arch_parse(&hc, "SmolLM3ForCausalLM", ", \"no_rope_layers\": [1, 1, 1, 0]", &e), 0);
    assert_int_equal(hc.cfgx.nope_interval, 4);
    assert_int_equal(arch_parse(&hc, "SmolLM3ForCausalLM",
                                ", \"no_rope_layers\": [1, 0, 1, 1], \"no_rope_layer_interval\": 2",
                                &e),
                     -EINVAL);
    assert_non_null(strstr(e.msg, "no_rope_layers[3]"));
    /* Phi-3.5's LongRoPE: 256 of 4096 positions, attention factor sqrt(1 + ln 16 / ln 256) */
    assert_int_equal(
        arch_parse(&hc, "Phi3ForCausalLM",
                   ", \"sliding_window\": 64, \"original_max_position_embeddings\": 256,"
                   " \"rope_scaling\": {\"type\": \"longrope\","
                   " \"short_factor\": [1, 1, 1, 1, 1, 1, 1, 1.5],"
                   " \"long_factor\": [1, 2, 3, 4, 5, 6, 7, 8]}",
                   &e),
        0);
    assert_int_equal(hc.cfg.rope_scaling, SHLM_ROPE_LONGROPE);
    assert_int_equal(hc.cfg.rope_orig_ctx, 256);
    assert_int_equal(hc.cfgx.window, 64);
    assert_true(hc.rope_short[7] == 1.5f && hc.rope_long[7] == 8.0f);
    assert_true(fabsf(hc.cfgx.rope_attn_factor - sqrtf(1.5f)) < 1e-6f);
    /* Qwen2.5's YaRN: beta 32 and 1 by default; an explicit attention factor a is a / the
     * kernel's own 0.1 ln(factor) + 1 */
    const char *yarn = ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0,"
                       " \"original_max_position_embeddings\": 32768}";
    assert_int_equal(arch_parse(&hc, "Qwen2ForCausalLM", yarn, &e), 0);
    assert_int_equal(hc.cfg.rope_scaling, SHLM_ROPE_YARN);
    assert_true(hc.cfg.rope_factor == 4.0f && hc.cfg.rope_orig_ctx == 32768);
    assert_true(hc.cfgx.yarn_beta_fast == 32.0f && hc.cfgx.yarn_beta_slow == 1.0f);
    assert_true(hc.cfgx.rope_attn_factor == 0.0f);
    assert_int_equal(arch_parse(&hc, "Qwen2ForCausalLM",
                                ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0,"
                                " \"beta_fast\": 16, \"attention_factor\": 1.5}",
                                &e),
                     0);
    assert_int_equal(hc.cfg.rope_orig_ctx, 4096); /* max_position_embeddings */
    assert_true(hc.cfgx.yarn_beta_fast == 16.0f);
    assert_true(fabsf(hc.cfgx.rope_attn_factor * (0.1f * logf(4.0f) + 1.0f) - 1.5f) < 1e-6f);
}

/* A DeepSeek-V3 config.json (4 heads of 32 + 16, latent 64, 16 experts of 32 units, 4 used,
 * V3's routing) with @extra fields appended (a later field of the same name is refused by the
 * parser as a duplicate: @extra adds fields this one lacks). */
static int deepseek_parse(struct coord_hf_config *hc, const char *extra, struct shardlm_err *e)
{
    char x[2048];
    snprintf(x, sizeof(x),
             ", \"kv_lora_rank\": 64, \"qk_nope_head_dim\": 32,"
             " \"qk_rope_head_dim\": 16, \"v_head_dim\": 32, \"n_routed_experts\": 16,"
             " \"num_experts_per_tok\": 4, \"moe_intermediate_size\": 32%s",
             extra);
    return arch_parse(hc, "DeepseekV3ForCausalLM", x, e);
}

/* DeepSeek-V3's config: latent attention's sizes (a head is nope + RoPE whatever head_dim says),
 * the routing (V3's sigmoid, noaux_tc with groups and its selection bias; V2's softmax with
 * group_limited_greedy), YaRN's mscale in the score scale and the RoPE magnitude; what the
 * runtime lacks refused by name. */
static void test_deepseek_config(void **state)
{
    struct coord_hf_config hc;
    struct shardlm_err e = {""};
    assert_int_equal(
        deepseek_parse(&hc,
                       ", \"q_lora_rank\": 32, \"head_dim\": 16, \"n_shared_experts\": 1,"
                       " \"first_k_dense_replace\": 1, \"routed_scaling_factor\": 2.5,"
                       " \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\","
                       " \"topk_method\": \"noaux_tc\", \"n_group\": 4, \"topk_group\": 2,"
                       " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40,"
                       " \"original_max_position_embeddings\": 4096, \"mscale\": 1.0,"
                       " \"mscale_all_dim\": 1.0}",
                       &e),
        0);
    assert_int_equal(hc.cfg.family, SHLM_FAMILY_DEEPSEEK2);
    assert_int_equal(hc.cfg.head_dim, 48);
    assert_int_equal(hc.cfg.rope_neox, 0); /* rope_interleave's default */
    assert_true(hc.cfgx.q_lora_rank == 32 && hc.cfgx.kv_lora_rank == 64 && hc.cfgx.rope_dim == 16 &&
                hc.cfgx.v_head_dim == 32);
    assert_true(hc.cfgx.shared_ffn == 32 && hc.cfgx.moe_dense_first == 1);
    assert_true(hc.cfgx.route_scale == 2.5f && hc.cfgx.moe_route == SHLM_ROUTE_SIGMOID_NORM);
    assert_true(hc.cfgx.n_groups == 4 && hc.cfgx.topk_groups == 2);
    assert_true(hc.cfg.flags & SHLM_CF_SEL_BIAS);
    /* mscale / mscale_all_dim: RoPE at magnitude 1 (the kernel's own divided out), the scores
     * times (0.1 ln 40 + 1)^2 / sqrt(48) */
    double m = 0.1 * log(40.0) + 1.0;
    assert_true(fabs(hc.cfgx.rope_attn_factor * m - 1.0) < 1e-6);
    assert_true(fabs(hc.cfgx.query_scale - m * m / sqrt(48.0)) < 1e-6);
    /* V2's: softmax, groups by their best, no bias; q itself (no q_lora_rank); greedy: no
     * groups */
    assert_int_equal(deepseek_parse(&hc,
                                    ", \"q_lora_rank\": null, \"topk_method\":"
                                    " \"group_limited_greedy\", \"n_group\": 4,"
                                    " \"topk_group\": 1",
                                    &e),
                     0);
    assert_true(hc.cfgx.q_lora_rank == 0 && hc.cfgx.moe_route == SHLM_ROUTE_SOFTMAX &&
                hc.cfgx.n_groups == 4 && hc.cfgx.topk_groups == 1 &&
                !(hc.cfg.flags & SHLM_CF_SEL_BIAS) && hc.cfgx.query_scale == 0.0f);
    assert_int_equal(deepseek_parse(&hc, ", \"n_group\": 4, \"topk_group\": 1", &e), 0);
    assert_int_equal(hc.cfgx.n_groups, 0);
    assert_int_equal(deepseek_parse(&hc, ", \"rope_interleave\": false", &e), 0);
    assert_int_equal(hc.cfg.rope_neox, 1);
    /* refused by name */
    static const struct {
        const char *extra, *needle;
    } bad[] = {
        {", \"scoring_func\": \"sqrtsoftplus\"", "scoring_func"},
        {", \"scoring_func\": \"sigmoid\", \"topk_method\": \"group_limited_greedy\"",
         "topk_method"},
        {", \"moe_layer_freq\": 2", "moe_layer_freq is 2"},
        {", \"num_key_value_heads\": 2", "a key per head"},
        {", \"first_k_dense_replace\": 9", "first_k_dense_replace is 9"},
        {", \"kv_lora_rank\": 8", "kv_lora_rank"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = deepseek_parse(&hc, bad[i].extra, &e);
        if (rc != -EINVAL || !strstr(e.msg, bad[i].needle))
            fprintf(stderr, "%s: rc %d '%s', wanted '%s'\n", bad[i].extra, rc, e.msg,
                    bad[i].needle);
        assert_int_equal(rc, -EINVAL);
        assert_non_null(strstr(e.msg, bad[i].needle));
    }
}

/* A Gemma 2/3 config.json (@arch, 12 layers, head_dim 32) with @extra fields appended. */
static int gemma_cfg(struct coord_hf_config *hc, const char *arch, const char *extra,
                     struct shardlm_err *e)
{
    char x[2048];
    snprintf(x, sizeof(x), ", \"num_key_value_heads\": 2, \"head_dim\": 32%s", extra);
    return layers_parse(hc, arch, 12, x, e);
}

/* Gemma 2/3's windows, soft-caps, query scale and local RoPE base read into cfgx; what does not
 * match the architecture's layer pattern, and Gemma 3's linear RoPE scaling, refused by name. */
static void test_gemma_config(void **state)
{
    struct coord_hf_config hc;
    struct shardlm_err e = {""};
    const char *g2 = "Gemma2ForCausalLM", *g3 = "Gemma3ForCausalLM";
    assert_int_equal(gemma_cfg(&hc, g2,
                               ", \"sliding_window\": 4096, \"attn_logit_softcapping\": 50.0,"
                               " \"final_logit_softcapping\": 30.0, \"query_pre_attn_scalar\": 256",
                               &e),
                     0);
    assert_int_equal(hc.cfg.family, SHLM_FAMILY_GEMMA2);
    assert_int_equal(hc.cfg.flags, SHLM_CF_POST_NORMS);
    assert_int_equal(hc.cfgx.window, 4096);
    assert_int_equal(hc.cfgx.window_pattern, 2);
    assert_true(hc.cfgx.attn_softcap == 50.0f && hc.cfgx.final_softcap == 30.0f);
    assert_true(hc.cfgx.query_scale == 0.0625f); /* 256^-1/2 */
    assert_true(hc.cfgx.rope_theta_local == 0.0f);
    /* defaults: transformers' window 4096, no caps, head_dim's scale (0: the kernels' own) */
    assert_int_equal(
        gemma_cfg(&hc, g2, ", \"attn_logit_softcapping\": null, \"query_pre_attn_scalar\": 32", &e),
        0);
    assert_int_equal(hc.cfgx.window, 4096);
    assert_true(hc.cfgx.attn_softcap == 0.0f && hc.cfgx.query_scale == 0.0f);
    assert_int_equal(gemma_cfg(&hc, g3, ", \"sliding_window\": 512", &e), 0);
    assert_int_equal(hc.cfg.flags, SHLM_CF_POST_NORMS | SHLM_CF_QK_NORM);
    assert_int_equal(hc.cfgx.window_pattern, 6);
    assert_true(hc.cfgx.rope_theta_local == 10000.0f);
    assert_int_equal(
        gemma_cfg(&hc, g3,
                  ", \"rope_local_base_freq\": 20000, \"sliding_window_pattern\": 6,"
                  " \"layer_types\": [\"sliding_attention\", \"sliding_attention\","
                  " \"sliding_attention\", \"sliding_attention\", \"sliding_attention\","
                  " \"full_attention\", \"sliding_attention\", \"sliding_attention\","
                  " \"sliding_attention\", \"sliding_attention\", \"sliding_attention\","
                  " \"full_attention\"]",
                  &e),
        0);
    assert_true(hc.cfgx.rope_theta_local == 20000.0f);
    static const struct {
        const char *arch, *extra, *needle[3];
    } bad[] = {
        {"Gemma3ForCausalLM",
         ", \"sliding_window_pattern\": 4",
         {"sliding_window_pattern is 4", "expected 6"}},
        {"Gemma2ForCausalLM",
         ", \"layer_types\": [\"full_attention\", \"full_attention\", \"full_attention\","
         " \"full_attention\", \"full_attention\", \"full_attention\", \"full_attention\","
         " \"full_attention\", \"full_attention\", \"full_attention\", \"full_attention\","
         " \"full_attention\"]",
         {"layer_types[0] is \"full_attention\"", "sliding_attention"}},
        {"Gemma2ForCausalLM",
         ", \"layer_types\": [\"sliding_attention\"]",
         {"layer_types", "12 names"}},
        {"Gemma2ForCausalLM", ", \"attn_logit_softcapping\": -50", {"attn_logit_softcapping"}},
        {"Gemma2ForCausalLM", ", \"final_logit_softcapping\": \"30\"", {"final_logit_softcapping"}},
        {"Gemma2ForCausalLM", ", \"query_pre_attn_scalar\": 0", {"query_pre_attn_scalar"}},
        {"Gemma2ForCausalLM", ", \"sliding_window\": 0", {"sliding_window is 0"}},
        /* Gemma 3 4B's linear scaling of the global layers: a factor below 1 refused */
        {"Gemma3ForCausalLM",
         ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 0.5}",
         {"rope_scaling.factor is 0.5"}},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(gemma_cfg(&hc, bad[i].arch, bad[i].extra, &e), -EINVAL);
        assert_non_null(strstr(e.msg, "a/config.json"));
        for (int k = 0; k < 3 && bad[i].needle[k]; k++)
            if (!strstr(e.msg, bad[i].needle[k]))
                fail_msg("'%s': '%s' lacks '%s'", bad[i].extra, e.msg, bad[i].needle[k]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_llama_sharded),
        cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_gemma),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_safetensors_valid_and_truncated),
        cmocka_unit_test(test_safetensors_hostile),
        cmocka_unit_test(test_dir_hostile),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_config_ext),
        cmocka_unit_test(test_deepseek_config),
        cmocka_unit_test(test_gemma_config),
        cmocka_unit_test(test_dir_weights),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
