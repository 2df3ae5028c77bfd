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
    return gguf_read_rows(&g->f, t, 0, trows, out, e);
}

static void gguf_src_close(struct coord_source *s)
{
    struct gguf_source *g = s->impl;
    gguf_close(&g->f);
    free(g);
}

/* Required u32 <arch>.<key>. */
static int need_u32(struct gguf_source *g, const char *path, const char *key, uint32_t *out,
                    struct shardlm_err *e)
{
    const char *k = akey(g, key);
    int rc = gguf_get_u32(&g->f, k, out);
    if (rc)
        return shardlm_fail(e, -EINVAL, "%s: metadata %s is %s", path, k,
                            rc == -ENOENT ? "missing" : "not an unsigned 32-bit integer");
    return 0;
}

/* general.architecture into g->arch: one of llama, qwen2, gemma and spark. */
static int read_arch(struct gguf_source *g, const char *path, struct shardlm_err *e)
{
    struct gguf_str a;
    if (gguf_get_str(&g->f, "general.architecture", &a) || a.len == 0 || a.len >= sizeof(g->arch))
        return shardlm_fail(e, -EINVAL, "%s: metadata general.architecture is missing", path);
    memcpy(g->arch, a.p, a.len);
    if (strcmp(g->arch, "llama") && strcmp(g->arch, "qwen2") && strcmp(g->arch, "gemma") &&
        strcmp(g->arch, "spark"))
        return shardlm_fail(e, -EINVAL,
                            "%s: architecture '%s' is not supported (llama, qwen2, gemma, spark)",
                            path, g->arch);
    return 0;
}

/* The sizes in <arch>.* metadata (required ones refused when missing, the others defaulted). */
static int read_shape(struct gguf_source *g, struct shlm_config *c, const char *path,
                      struct shardlm_err *e)
{
    int rc;
    if ((rc = need_u32(g, path, "embedding_length", &c->dim, e)) ||
        (rc = need_u32(g, path, "feed_forward_length", &c->hidden_dim, e)) ||
        (rc = need_u32(g, path, "block_count", &c->n_layers, e)) ||
        (rc = need_u32(g, path, "attention.head_count", &c->n_heads, e)) ||
        (rc = need_u32(g, path, "context_length", &c->seq_len, e)))
        return rc;
    if (gguf_get_u32(&g->f, akey(g, "attention.head_count_kv"), &c->n_kv_heads))
        c->n_kv_heads = c->n_heads;
    if (gguf_get_u32(&g->f, akey(g, "attention.key_length"), &c->head_dim))
        c->head_dim = c->n_heads ? c->dim / c->n_heads : 0;
    if (gguf_get_f32(&g->f, akey(g, "attention.layer_norm_rms_epsilon"), &c->norm_eps))
        c->norm_eps = 1e-5f;
    if (gguf_get_f32(&g->f, akey(g, "rope.freq_base"), &c->rope_theta))
        c->rope_theta = 10000.0f;
    return 0;
}

/* What the architecture and the tensors present tell: RoPE style, activation, tied output,
 * biases, head gate, embedding scale, and the vocabulary (token_embd.weight's rows). */
static int read_features(struct gguf_source *g, struct shlm_config *c, const char *path,
                         struct shardlm_err *e)
{
    bool llama = !strcmp(g->arch, "llama"), gemma = !strcmp(g->arch, "gemma");
    bool spark = !strcmp(g->arch, "spark");
    if (gguf_tensor(&g->f, "rope_freqs.weight"))
        return shardlm_fail(e, -EINVAL,
                            "%s: tensor rope_freqs.weight (per-frequency RoPE "
                            "factors, Llama 3.1 style) is not supported yet",
                            path);
    /* llama.cpp permutes llama's Q/K for interleaved pairs; qwen2 and gemma use NeoX halves */
    c->rope_neox = !llama;
    c->act = gemma || spark ? SHLM_ACT_GELU_TANH : SHLM_ACT_SILU;
    c->tied_embd = gguf_tensor(&g->f, "output.weight") == NULL;
    c->qkv_bias = gguf_tensor(&g->f, "blk.0.attn_q.bias") != NULL;
    c->head_gate = gguf_tensor(&g->f, "blk.0.attn_gate.weight") != NULL;
    /* gemma scales the embedding by sqrt(dim); llama.cpp's converter already added 1 to its
     * RMSNorm weights, so they are used as they are */
    c->embd_scale = gemma ? sqrtf((float)c->dim) : 0.0f;
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
    if ((rc = read_arch(g, path, e)) || (rc = read_shape(g, &s->cfg, path, e)) ||
        (rc = read_features(g, &s->cfg, path, e)) ||
        (rc = read_tokenizer(s, g, path, tokenizer, e))) {
        coord_source_close(s);
        return rc;
    }
    return 0;
}
