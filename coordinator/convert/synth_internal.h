/* SPDX-License-Identifier: MIT */
/* coordinator/convert/synth_internal.h: what synth.c (the shapes, the GGUF) and synth_hf.c (the
 * Hugging Face folder) share: one list of tensors per model, drawn in list order from the seed,
 * so both files hold the same values. */
#ifndef SHARDLM_COORD_SYNTH_INTERNAL_H
#define SHARDLM_COORD_SYNTH_INTERNAL_H

#include "synth.h"

/* One tensor: its names, shape and how its values are made. */
struct synth_tensor {
    char gguf[48], hf[80]; /* hf[0] == 0: none in the HF folder (a GGUF-only RoPE table) */
    uint64_t cols, rows;   /* rows 0: 1-D of @cols */
    float mean, std;       /* values: mean + std * N(0, 1); std 0: the constant mean */
    const float *fixed;    /* instead, these @cols values (RoPE factors) */
    bool matrix;           /* takes the file's matrix type (F16 or F32); else always F32 */
    float gguf_add;        /* GGUF value = the HF value + this (Gemma's (1 + w) norms) */
    uint32_t permute;      /* q/k: GGUF rows interleave each of these many heads' halves */
    /* low rank (the model's basis, synth_model): each row in the basis' span, drawn as rank
     * N(0, std) coordinates (a tensor that reads the residual stream, the embeddings, the head);
     * or, with @writes, each column in it (a tensor that writes the stream: attention output, FFN
     * down), its coordinates N(0, std * sqrt(dim / rank)) so that its entries keep @std */
    const float *basis;
    uint32_t rank;
    bool writes;
    int layer;             /* the layer it belongs to, -1: none */
    /* an expert's matrix: expert @expert of @experts (0: none). The GGUF holds a layer's
     * experts of one kind as one 3-D tensor (they are consecutive in the list), the HF folder
     * each as its own */
    uint32_t expert, experts;
    bool mxfp4; /* its values on MXFP4's grid (rows of 32-value blocks), stored so */
    int kind;   /* its enum shlm_kind (an expert's: the HF writer gathers gpt-oss's) */
};

struct synth_model {
    const struct coord_synth_shape *s;
    struct synth_tensor *t; /* (n) in draw order, room for cap */
    size_t n, cap;
    bool f32;
    uint64_t seed;
    const struct coord_synth_tok *tok;     /* a real tokenizer, or NULL (struct coord_synth_opts) */
    float rope_long[256], rope_short[256]; /* LongRoPE factors, Llama 3.1 factors in rope_long */
    float *basis; /* (dim x rank) orthonormal columns: the stream's subspace; NULL: full rank */
};

/* The vocabulary both files carry: the 256 byte symbols, pairs, triples, each with its merge,
 * then BOS and EOS. */
struct synth_vocab {
    char **tok, **merges; /* (vocab), (vocab - 258) */
    uint32_t n, n_merges, bos, eos;
};
int synth_vocab_init(struct synth_vocab *v, uint32_t vocab);
void synth_vocab_free(struct synth_vocab *v);

/* Draws @rows rows of tensor @t (its HF values) into @buf from @rng, which continues from the
 * previous rows; a tensor drawn in several calls holds what one call gives. */
void synth_draw(const struct synth_tensor *t, uint64_t *rng, float *buf, uint64_t rows);

/* Rounds the @n values at @x (whole blocks of 32) to MXFP4's grid (struct synth_tensor.mxfp4). */
void synth_round_mxfp4(float *x, uint64_t n);
/* Rows per synth_draw() call for tensor @t (both writers use it, so both draw the same values). */
uint64_t synth_block_rows(const struct synth_tensor *t);

/* The chat template both files carry, so that a synthetic model serves chat requests as an
 * instruct model does. */
#define COORD_SYNTH_CHAT_TEMPLATE                                                                  \
    "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content | trim }}\n"                 \
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"

/* Writes @text (@len bytes) to @dir/@name atomically (synth_hf.c). Returns 0 or -errno with @e
 * set. */
int synth_write_text(const char *dir, const char *name, const char *text, size_t len,
                     struct shardlm_err *e);

/* The HF folder writer (synth_hf.c). Returns 0 or -errno with @e set. */
int synth_write_hf(const struct synth_model *m, const char *dir,
                   void (*progress)(void *ctx, int done, int total), void *ctx,
                   struct shardlm_err *e);

#endif
