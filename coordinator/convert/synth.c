/* SPDX-License-Identifier: MIT */
/* coordinator/convert/synth.c: the synthetic model maker of `shardlm synth` - models at real
 * sizes, seeded random weights (normal, std 0.02; norms 1.0), GGUF F16, with a valid byte-level
 * BPE vocabulary, so benchmarks need no download. The llama-compatible shapes load in llama.cpp
 * unchanged. */
#include "synth.h"

#include "gguf_write.h"
#include "synth_tok.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct coord_synth_shape shapes[] = {
    /* a small llama for tests: ragged FFN, GQA, tied */
    {"tiny", "llama", 64, 2, 4, 16, 2, 172, 512, 512, 10000.0f, false, false},
    /* spark's features small, for tests: head_dim != dim / heads, GELU-tanh, head gate */
    {"tiny-spark", "spark", 64, 2, 4, 32, 2, 172, 512, 512, 10000.0f, true, true},
    {"llama32-1b", "llama", 2048, 16, 32, 64, 8, 8192, 128256, 131072, 500000.0f, false, false},
    {"spark-1.7b", "spark", 2048, 28, 8, 256, 2, 6656, 131072, 32768, 1000000.0f, true, true},
    {"spark-1.7b-llama", "llama", 2048, 28, 8, 256, 2, 6656, 131072, 32768, 1000000.0f, false,
     false},
};

const struct coord_synth_shape *coord_synth_shapes(size_t *n)
{
    *n = sizeof(shapes) / sizeof(shapes[0]);
    return shapes;
}

/* xorshift64* and Box-Muller: deterministic for a seed (the state is the caller's: two models
 * made at once do not interleave their draws) */
static float uniform(uint64_t *rng)
{
    *rng ^= *rng >> 12;
    *rng ^= *rng << 25;
    *rng ^= *rng >> 27;
    return ((float)((*rng * 0x2545F4914F6CDD1Dull) >> 40) + 0.5f) / 16777216.0f;
}

static void fill_normal(uint64_t *rng, float *x, size_t n, float std)
{
    for (size_t i = 0; i + 1 < n; i += 2) {
        float r = sqrtf(-2.0f * logf(uniform(rng))), t = 6.28318531f * uniform(rng);
        x[i] = std * r * cosf(t);
        x[i + 1] = std * r * sinf(t);
    }
    if (n % 2)
        x[n - 1] = std * sqrtf(-2.0f * logf(uniform(rng))) * cosf(6.28318531f * uniform(rng));
}

/* GPT-2's byte -> printable code point map, as UTF-8. */
static void byte_symbol(int b, char *out)
{
    int cp = b;
    if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) {
        int n = 0; /* the k-th byte outside those ranges maps to 256 + k */
        for (int i = 0; i < b; i++)
            if (!((i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE && i <= 0xFF)))
                n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* Vocabulary: the 256 byte symbols, then pairs of them, then pairs + a symbol, each with its
 * merge, then BOS and EOS (control tokens). */
static int write_vocab(struct gguf_writer *w, uint32_t vocab)
{
    uint32_t n_plain = vocab - 2, n_merges = n_plain - 256;
    char **tok = calloc(vocab, sizeof(char *)), **merges = calloc(n_merges, sizeof(char *));
    int32_t *type = calloc(vocab, sizeof(int32_t));
    char sym[256][3];
    if (!tok || !merges || !type)
        goto oom;
    for (int b = 0; b < 256; b++)
        byte_symbol(b, sym[b]);
    for (uint32_t k = 0; k < n_plain; k++) {
        char t[16], m[16];
        if (k < 256) {
            snprintf(t, sizeof(t), "%.2s", sym[k]);
            m[0] = 0;
        } else if (k < 256 + 65536) {
            uint32_t i = (k - 256) / 256, j = (k - 256) % 256;
            snprintf(t, sizeof(t), "%.2s%.2s", sym[i], sym[j]);
            snprintf(m, sizeof(m), "%.2s %.2s", sym[i], sym[j]);
        } else {
            uint32_t p = (k - 256 - 65536) / 256, j = (k - 256 - 65536) % 256;
            uint32_t i = p / 256, i2 = p % 256;
            snprintf(t, sizeof(t), "%.2s%.2s%.2s", sym[i], sym[i2], sym[j]);
            snprintf(m, sizeof(m), "%.2s%.2s %.2s", sym[i], sym[i2], sym[j]);
        }
        tok[k] = strdup(t);
        if (k >= 256)
            merges[k - 256] = strdup(m);
        type[k] = 1; /* normal */
        if (!tok[k] || (k >= 256 && !merges[k - 256]))
            goto oom;
    }
    tok[n_plain] = strdup("<|begin_of_text|>");
    tok[n_plain + 1] = strdup("<|end_of_text|>");
    type[n_plain] = type[n_plain + 1] = 3; /* control */
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_str(w, "tokenizer.ggml.pre", "default");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, vocab);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", type, vocab);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, n_merges);
    gguf_w_u32(w, "tokenizer.ggml.bos_token_id", n_plain);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", n_plain + 1);
    gguf_w_bool(w, "tokenizer.ggml.add_bos_token", true);
    /* a chat template, so that a synthetic model serves chat requests as an instruct model does */
    gguf_w_str(w, "tokenizer.chat_template",
               "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content | trim }}\n"
               "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}");
    for (uint32_t k = 0; k < vocab; k++)
        free(tok[k]);
    for (uint32_t k = 0; k < n_merges; k++)
        free(merges[k]);
    free(tok);
    free(merges);
    free(type);
    return 0;
oom:
    for (uint32_t k = 0; tok && k < vocab; k++)
        free(tok[k]);
    for (uint32_t k = 0; merges && k < n_merges; k++)
        free(merges[k]);
    free(tok);
    free(merges);
    free(type);
    return -ENOMEM;
}

/* Streams @rows x @cols normal (or constant @fill when std is 0) values, a block at a time. */
static int write_tensor_data(struct gguf_writer *w, uint64_t *rng, uint64_t rows, uint64_t cols,
                             float std, float fill)
{
    uint64_t block = cols ? (1u << 20) / cols + 1 : 1;
    float *buf = malloc(block * cols * sizeof(float));
    if (!buf)
        return -ENOMEM;
    for (uint64_t r = 0; r < rows; r += block) {
        uint64_t n = rows - r < block ? rows - r : block;
        if (std > 0.0f)
            fill_normal(rng, buf, n * cols, std);
        else
            for (uint64_t i = 0; i < n * cols; i++)
                buf[i] = fill;
        gguf_w_tensor_rows(w, buf, n);
    }
    free(buf);
    return 0;
}

/* The architecture's key/values (general.*, <arch>.*). */
static void write_metadata(struct gguf_writer *w, const struct coord_synth_shape *s)
{
    char k[96];
#define KEY(suffix) (snprintf(k, sizeof(k), "%s." suffix, s->arch), k)
    gguf_w_str(w, "general.architecture", s->arch);
    gguf_w_str(w, "general.name", s->name);
    gguf_w_u32(w, "general.file_type", 1); /* mostly F16 */
    gguf_w_u32(w, KEY("context_length"), s->ctx);
    gguf_w_u32(w, KEY("embedding_length"), s->dim);
    gguf_w_u32(w, KEY("block_count"), s->layers);
    gguf_w_u32(w, KEY("feed_forward_length"), s->ffn);
    gguf_w_u32(w, KEY("attention.head_count"), s->heads);
    gguf_w_u32(w, KEY("attention.head_count_kv"), s->kv_heads);
    gguf_w_u32(w, KEY("attention.key_length"), s->head_dim);
    gguf_w_u32(w, KEY("attention.value_length"), s->head_dim);
    gguf_w_u32(w, KEY("rope.dimension_count"), s->head_dim);
    gguf_w_f32(w, KEY("rope.freq_base"), s->theta);
    gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    gguf_w_u32(w, KEY("vocab_size"), s->vocab);
#undef KEY
}

/* The tensor infos, in the order llama.cpp writes them (write_tensors() follows it). */
static void declare_tensors(struct gguf_writer *w, const struct coord_synth_shape *s)
{
    uint64_t q = (uint64_t)s->heads * s->head_dim, kv = (uint64_t)s->kv_heads * s->head_dim;
    gguf_w_tensor(w, "token_embd.weight", GGML_F16, s->dim, s->vocab);
    gguf_w_tensor(w, "output_norm.weight", GGML_F32, s->dim, 0);
    for (uint32_t l = 0; l < s->layers; l++) {
        char n[64];
#define T(name, type, c, r)                                                                        \
    (snprintf(n, sizeof(n), "blk.%u." name, l), gguf_w_tensor(w, n, type, c, r))
        T("attn_norm.weight", GGML_F32, s->dim, 0);
        T("attn_q.weight", GGML_F16, s->dim, q);
        T("attn_k.weight", GGML_F16, s->dim, kv);
        T("attn_v.weight", GGML_F16, s->dim, kv);
        if (s->head_gate)
            T("attn_gate.weight", GGML_F32, s->dim, s->heads);
        T("attn_output.weight", GGML_F16, q, s->dim);
        T("ffn_norm.weight", GGML_F32, s->dim, 0);
        T("ffn_gate.weight", GGML_F16, s->dim, s->ffn);
        T("ffn_up.weight", GGML_F16, s->dim, s->ffn);
        T("ffn_down.weight", GGML_F16, s->ffn, s->dim);
#undef T
    }
}

/* The tensor data in declare_tensors()' order, reporting each layer to @progress. Returns 0 or
 * -ENOMEM. */
static int write_tensors(struct gguf_writer *w, const struct coord_synth_shape *s, uint64_t *rng,
                         void (*progress)(void *ctx, int done, int total), void *ctx)
{
    uint64_t q = (uint64_t)s->heads * s->head_dim, kv = (uint64_t)s->kv_heads * s->head_dim;
    int rc = write_tensor_data(w, rng, s->vocab, s->dim, 0.02f, 0);
    rc = rc ? rc : write_tensor_data(w, rng, 1, s->dim, 0, 1.0f);
    for (uint32_t l = 0; l < s->layers && !rc; l++) {
        rc = write_tensor_data(w, rng, 1, s->dim, 0, 1.0f);
        rc = rc ? rc : write_tensor_data(w, rng, q, s->dim, 0.02f, 0);
        rc = rc ? rc : write_tensor_data(w, rng, kv, s->dim, 0.02f, 0);
        rc = rc ? rc : write_tensor_data(w, rng, kv, s->dim, 0.02f, 0);
        if (s->head_gate)
            rc = rc ? rc : write_tensor_data(w, rng, s->heads, s->dim, 0.02f, 0);
        rc = rc ? rc : write_tensor_data(w, rng, s->dim, q, 0.02f, 0);
        rc = rc ? rc : write_tensor_data(w, rng, 1, s->dim, 0, 1.0f);
        rc = rc ? rc : write_tensor_data(w, rng, s->ffn, s->dim, 0.02f, 0);
        rc = rc ? rc : write_tensor_data(w, rng, s->ffn, s->dim, 0.02f, 0);
        rc = rc ? rc : write_tensor_data(w, rng, s->dim, s->ffn, 0.02f, 0);
        if (progress)
            progress(ctx, (int)l + 1, (int)s->layers);
    }
    return rc;
}

int coord_synth(const char *shape, const char *out, uint64_t seed,
                void (*progress)(void *ctx, int done, int total), void *ctx,
                struct shardlm_err *e)
{
    return coord_synth_with_tok(shape, out, seed, NULL, progress, ctx, e);
}

int coord_synth_with_tok(const char *shape, const char *out, uint64_t seed,
                         const struct coord_synth_tok *tok,
                         void (*progress)(void *ctx, int done, int total), void *ctx,
                         struct shardlm_err *e)
{
    const struct coord_synth_shape *s = NULL;
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]) && !s; i++)
        if (strcmp(shapes[i].name, shape) == 0)
            s = &shapes[i];
    if (!s)
        return shardlm_fail(e, -EINVAL, "unknown shape '%s'", shape);
    struct coord_synth_shape sized; /* a real tokenizer's vocabulary sizes the rows */
    if (tok) {
        sized = *s;
        sized.vocab = tok->vocab;
        s = &sized;
    }
    struct gguf_writer *w;
    int rc = gguf_writer_open(&w, out, e);
    if (rc)
        return rc;
    uint64_t rng = seed ? seed : 0x9e3779b97f4a7c15ull;
    write_metadata(w, s);
    if ((rc = tok ? coord_synth_tok_gguf(w, tok) : write_vocab(w, s->vocab))) {
        shardlm_fail(e, rc, "out of memory");
        goto out_abort;
    }
    if (progress)
        progress(ctx, 0, (int)s->layers);
    declare_tensors(w, s);
    if ((rc = write_tensors(w, s, &rng, progress, ctx))) {
        shardlm_fail(e, rc, "out of memory");
        goto out_abort;
    }
    return gguf_writer_close(w, e);
out_abort:
    gguf_writer_abort(w);
    return rc;
}
