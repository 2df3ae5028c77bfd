/* SPDX-License-Identifier: MIT */
/* coordinator/convert/source_gguf.c: the GGUF model source - llama, qwen2, gemma and spark
 * architectures; tensors F32, F16, BF16, Q8_0 and Q4_0 are dequantized as they are read. */
#include "source.h"

#include "gguf.h"
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

/* Our tensor name -> the GGUF one (llama.cpp naming). */
static void gguf_name(const char *name, char *out, size_t len)
{
    static const struct { const char *ours, *theirs; } map[] = {
        {"tok_embd", "token_embd.weight"},      {"output", "output.weight"},
        {"output_norm", "output_norm.weight"},  {"attn_norm", "attn_norm.weight"},
        {"attn_q", "attn_q.weight"},            {"attn_k", "attn_k.weight"},
        {"attn_v", "attn_v.weight"},            {"attn_o", "attn_output.weight"},
        {"attn_q_bias", "attn_q.bias"},         {"attn_k_bias", "attn_k.bias"},
        {"attn_v_bias", "attn_v.bias"},         {"attn_gate", "attn_gate.weight"},
        {"ffn_norm", "ffn_norm.weight"},        {"ffn_gate", "ffn_gate.weight"},
        {"ffn_up", "ffn_up.weight"},            {"ffn_down", "ffn_down.weight"},
    };
    unsigned l;
    char part[64];
    const char *key = name;
    bool layer = sscanf(name, "blk.%u.%63s", &l, part) == 2;
    if (layer)
        key = part;
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (strcmp(map[i].ours, key) == 0) {
            if (layer)
                snprintf(out, len, "blk.%u.%s", l, map[i].theirs);
            else
                snprintf(out, len, "%s", map[i].theirs);
            return;
        }
    snprintf(out, len, "%s", name);
}

static int gguf_src_read(struct coord_source *s, const char *name, int rows, int cols, float *out,
                         struct shardlm_err *e)
{
    struct gguf_source *g = s->impl;
    char gname[128];
    gguf_name(name, gname, sizeof(gname));
    const struct gguf_tensor *t = gguf_tensor(&g->f, gname);
    if (!t)
        return -ENOENT;
    /* GGUF dims[0] is the row length (our cols); 1-D tensors are one row */
    uint64_t trows = gguf_tensor_rows(t);
    if (t->dims[0] != (uint64_t)cols || trows != (uint64_t)rows)
        return shardlm_fail(
            e, -EINVAL, "%s: tensor %s is %llux%llu (rows x cols), the config needs %dx%d", s->path,
            gname, (unsigned long long)trows, (unsigned long long)t->dims[0], rows, cols);
    int rc = gguf_read_rows(&g->f, t, 0, trows, out, e);
    return rc ? rc : coord_source_check_finite(out, rows, cols, s->path, gname, e);
}

static void gguf_src_close(struct coord_source *s)
{
    struct gguf_source *g = s->impl;
    gguf_close(&g->f);
    free(g);
}

/* The architectures this source reads, and what each fixes: llama.cpp permutes llama's Q/K for
 * interleaved pairs (qwen2, gemma and spark use NeoX halves); gemma and spark gate with
 * gelu-tanh; gemma scales the embedding by sqrt(dim). */
static const struct gguf_arch {
    const char *name;
    bool rope_neox, gelu, embd_scale;
} gguf_archs[] = {
    {"llama", false, false, false},
    {"qwen2", true, false, false},
    {"gemma", true, true, true},
    {"spark", true, true, false},
};

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

/* general.architecture into g->arch: one of gguf_archs[] (*@arch). */
static int read_arch(struct gguf_source *g, const char *path, const struct gguf_arch **arch,
                     struct shardlm_err *e)
{
    struct coord_val v;
    char label[512], shown[100];
    setting(g, path, "general.architecture", &v, label);
    if (v.kind == COORD_VAL_ABSENT)
        return shardlm_fail(e, -EINVAL, "%s is missing", label);
    if (v.kind != COORD_VAL_STR)
        return shardlm_fail(e, -EINVAL, "%s is of type %s, expected a string", label, v.type);
    struct gguf_str a = {v.str, v.len};
    for (size_t i = 0; i < sizeof(gguf_archs) / sizeof(gguf_archs[0]); i++)
        if (gguf_str_eq(a, gguf_archs[i].name)) {
            snprintf(g->arch, sizeof(g->arch), "%s", gguf_archs[i].name);
            *arch = &gguf_archs[i];
            return 0;
        }
    return shardlm_fail(e, -EINVAL,
                        "%s is \"%s\" (%zu bytes): not a supported architecture (llama, qwen2, "
                        "gemma, spark)",
                        label, coord_escape(shown, sizeof(shown), v.str, v.len), v.len);
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

/* Refuses every <arch>.* setting of coord_unsupported_keys[] that is not neutral. */
static int check_unsupported(const struct gguf_source *g, const struct shlm_config *c,
                             const char *path, struct shardlm_err *e)
{
    for (size_t i = 0; i < coord_n_unsupported_keys; i++) {
        const struct coord_key *k = &coord_unsupported_keys[i];
        struct coord_val v;
        char label[512];
        if (!k->gguf)
            continue;
        setting(g, path, akey(g, k->gguf), &v, label);
        int rc = coord_key_check(k, &v, label, c, e);
        if (rc)
            return rc;
    }
    return 0;
}

/* What the architecture and the tensors present tell: RoPE style, activation, tied output,
 * biases, head gate, embedding scale, and the vocabulary (token_embd.weight's rows). */
static int read_features(struct gguf_source *g, const struct gguf_arch *arch, struct shlm_config *c,
                         const char *path, struct shardlm_err *e)
{
    if (gguf_tensor(&g->f, "rope_freqs.weight"))
        return shardlm_fail(e, -EINVAL,
                            "%s: tensor rope_freqs.weight (per-frequency RoPE "
                            "factors, Llama 3.1 style) is not supported yet",
                            path);
    c->rope_neox = arch->rope_neox;
    c->act = arch->gelu ? SHLM_ACT_GELU_TANH : SHLM_ACT_SILU;
    c->tied_embd = gguf_tensor(&g->f, "output.weight") == NULL;
    c->qkv_bias = gguf_tensor(&g->f, "blk.0.attn_q.bias") != NULL;
    c->head_gate = gguf_tensor(&g->f, "blk.0.attn_gate.weight") != NULL;
    /* llama.cpp's converter already added 1 to gemma's RMSNorm weights: used as they are */
    c->embd_scale = arch->embd_scale ? sqrtf((float)c->dim) : 0.0f;
    const struct gguf_tensor *emb = gguf_tensor(&g->f, "token_embd.weight");
    if (!emb || emb->n_dims != 2)
        return shardlm_fail(e, -EINVAL, "%s: tensor token_embd.weight is missing or not 2-D", path);
    c->vocab_size = emb->dims[1] > UINT32_MAX ? 0 : (uint32_t)emb->dims[1];
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
    const struct gguf_arch *arch = NULL;
    if ((rc = read_arch(g, path, &arch, e)) || (rc = read_shape(g, &s->cfg, path, e)) ||
        (rc = check_unsupported(g, &s->cfg, path, e)) ||
        (rc = read_features(g, arch, &s->cfg, path, e)) ||
        (rc = read_tokenizer(s, g, path, tokenizer, e))) {
        coord_source_close(s);
        return rc;
    }
    return 0;
}
