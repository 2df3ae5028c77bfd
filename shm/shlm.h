/* SPDX-License-Identifier: MIT */
/* shm/shlm.h: the .shlm model file - header, tensor table, tokenizer, tensor data (4 KiB aligned)
 * in the canonical layouts of kernels/kn.h. The weights segment a worker maps is the same image,
 * so the coordinator and the workers read it through this one parser.
 *
 * File layout (all little-endian):
 *   0                       struct shlm_header (512 bytes)
 *   header.table_offset     struct shlm_tensor[n_tensors]
 *   header.tok_offset       tokenizer bytes (tok_kind says which format)
 *   header.data_offset      tensor data, each tensor at a multiple of SHLM_ALIGN
 */
#ifndef SHARDLM_SHLM_H
#define SHARDLM_SHLM_H

#include "common.h"
#include "kn.h"

#include <stddef.h>
#include <stdint.h>

#define SHLM_MAGIC "SHARDLM"
#define SHLM_VERSION 1
#define SHLM_ALIGN 4096
#define SHLM_NAME_MAX 48
/* tensors of a model: DeepSeek-V3's 61 layers of 256 experts' gate, up and down (46848) and the
 * rest fit */
#define SHLM_MAX_TENSORS 65536
#define SHLM_MAX_EXPERTS 512 /* experts of a MoE layer (DeepSeek-V3: 256) */

enum shlm_arch { SHLM_ARCH_LLAMA = 1 };
/* the gated FFN's activation: act(gate) * up; SWIGLU_OAI (gpt-oss): gate clamped above at 7,
 * up to [-7, 7], gate * sigmoid(1.702 gate) * (up + 1) */
enum shlm_act { SHLM_ACT_SILU = 0, SHLM_ACT_GELU_TANH = 1, SHLM_ACT_SWIGLU_OAI = 2 };
enum shlm_scheme {
    SHLM_SCHEME_F32 = 0,
    SHLM_SCHEME_BF16 = 1,
    SHLM_SCHEME_W4A16 = 2,
    SHLM_SCHEME_W4A8 = 3
};
enum shlm_tok_kind { SHLM_TOK_LLAMA2C = 1, SHLM_TOK_BLOB = 2 /* coord_tok_save() */ };
/* RoPE frequency scaling: llama3 (low/high frequency factors, shlm_config), YaRN (factor and
 * orig_ctx in shlm_config, the ramp and attention factor in shlm_config_ext), LongRoPE
 * (per-frequency short/long factors as the tensors SHLM_KIND_ROPE_FACTORS_SHORT/LONG, as GGUF's
 * rope_factors_short/long; orig_ctx in shlm_config, the attention factor in shlm_config_ext; the
 * long factors where the context seq_len exceeds orig_ctx, as llama.cpp picks them by its context
 * size), per-frequency divisors (the tensor SHLM_KIND_ROPE_FREQS: GGUF's rope_freqs, llama.cpp's
 * form of Llama 3.1's scaling), linear (factor in shlm_config: positions divided by it; on the
 * layers that take rope_theta, not on the windowed layers of rope_theta_local: Gemma 3's). */
enum shlm_rope_scaling {
    SHLM_ROPE_NONE = 0,
    SHLM_ROPE_LLAMA3 = 1,
    SHLM_ROPE_YARN = 2,
    SHLM_ROPE_LONGROPE = 3,
    SHLM_ROPE_FREQS = 4,
    SHLM_ROPE_LINEAR = 5
};
/* shlm_config.flags: optional tensors and forward features (0 in files made before them) */
enum shlm_cfg_flag {
    SHLM_CF_QK_NORM = 1u << 0,    /* per-head RMSNorm of q and k over head_dim before RoPE */
    SHLM_CF_POST_NORMS = 1u << 1, /* RMSNorm of the attention and FFN outputs before the residual
                                   * adds (Gemma 2/3) */
    SHLM_CF_ATTN_SINKS = 1u << 2, /* a learned logit per query head in attention's softmax
                                   * denominator (gpt-oss) */
    SHLM_CF_O_BIAS = 1u << 3,     /* attention output bias (gpt-oss) */
    SHLM_CF_MOE_BIAS = 1u << 4,   /* router and experts' gate, up and down biases (gpt-oss) */
    SHLM_CF_SEL_BIAS = 1u << 5,   /* a bias added to the router's scores to choose the experts,
                                   * not to weight them (DeepSeek-V3's e_score_correction_bias) */
};
/* The flags the runtime implements; a config with another is refused (shlm_config_check). */
#define SHLM_CF_IMPLEMENTED                                                                        \
    (SHLM_CF_QK_NORM | SHLM_CF_POST_NORMS | SHLM_CF_ATTN_SINKS | SHLM_CF_O_BIAS |                  \
     SHLM_CF_MOE_BIAS | SHLM_CF_SEL_BIAS)
/* How the int4 matrices of a weights segment are laid out (a file is always canonical). */
enum shlm_layout { SHLM_LAYOUT_CANONICAL = 0, SHLM_LAYOUT_TILES = 1 /* KN_DT_W4A8/16_T */ };

struct shlm_config {
    uint32_t arch; /* enum shlm_arch */
    uint32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim, vocab_size, seq_len;
    float norm_eps, rope_theta;
    uint32_t rope_neox; /* 0: interleaved pairs (llama2.c, GGUF llama), 1: NeoX halves */
    uint32_t act;       /* enum shlm_act */
    uint32_t tied_embd; /* output head shares tok_embd */
    uint32_t rope_scaling; /* enum shlm_rope_scaling */
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor; /* llama3 (factor: YaRN's,
                                                                     * linear's) */
    uint32_t rope_orig_ctx; /* llama3, YaRN, LongRoPE: original_max_position_embeddings */
    uint32_t qkv_bias;  /* attn_q/k/v have bias vectors (Qwen2) */
    uint32_t head_gate; /* attn_gate: sigmoid(gate . x) scales each head's output */
    float embd_scale;   /* embedding rows are multiplied by this (Gemma: sqrt(dim), Granite:
                         * embedding_multiplier); 0 means 1 */
    uint32_t flags;     /* enum shlm_cfg_flag (reserved, 0, in files made before it) */
    uint32_t family;    /* enum shlm_family (tensors.h): the architecture it was imported as, for
                         * messages; 0 in files made before it. The forward never reads it. */
};

/* What the newer architectures add to the config, in the header's formerly reserved bytes: zero
 * in files made before it, and every field's zero is the plain behaviour. Every field is
 * implemented, each in its range (shlm_config_ext_check); shlm_layer_windowed() says which layers
 * are windowed. */
struct shlm_config_ext {
    float attn_softcap;      /* scores = c * tanh(scores / c) (Gemma 2); 0: none */
    float final_softcap;     /* logits = c * tanh(logits / c) (Gemma 2); 0: none */
    float query_scale;       /* scores times this (Gemma query_pre_attn_scalar^-1/2, Granite
                              * attention_multiplier); 0: 1 / sqrt(head_dim) */
    uint32_t window;         /* windowed layers attend to the last @window positions; 0: none */
    uint32_t window_pattern; /* of every n layers the last is global, the others windowed
                              * (Gemma 2: 2, Gemma 3: 6); 0 with a window: every layer windowed */
    float rope_theta_local;  /* the RoPE base of windowed layers (Gemma 3); 0: rope_theta */
    float resid_mult;        /* each block's output times this before the add (Granite); 0: 1 */
    float logit_scale;       /* logits divided by this (Granite logits_scaling); 0: 1 */
    uint32_t nope_interval;  /* every n-th layer (n - 1, 2n - 1, ...) has no RoPE (SmolLM3); 0 */
    float yarn_beta_fast, yarn_beta_slow; /* YaRN ramp (rope_scaling SHLM_ROPE_YARN) */
    float rope_attn_factor; /* YaRN/LongRoPE magnitude scale of q.k; 0: the scaling's own */
    /* mixture of experts (0 experts: a dense model): each MoE layer's FFN is n_experts FFNs of
     * expert_ffn units, of which a router picks n_experts_used per token by moe_route's rule;
     * the first moe_dense_first layers keep a dense FFN of hidden_dim units */
    uint32_t n_experts, n_experts_used, expert_ffn;
    uint32_t moe_route; /* enum shlm_route */
    uint32_t moe_dense_first;
    /* 1: YaRN's ramp bounds unrounded (transformers' rope_scaling.truncate false: gpt-oss); 0:
     * floor and ceil, as ggml and truncate's default */
    uint32_t yarn_exact;
    /* multi-head latent attention (DeepSeek-V2/V3; kv_lora_rank 0: none): q from a rank
     * q_lora_rank bottleneck (attn_q_a, its RMSNorm, attn_q_b; 0: attn_q itself), every head's
     * key and value from one latent of kv_lora_rank (attn_kv_a's first rows, RMS-normed) and a
     * shared RoPE key of rope_dim (its last rows); a head is head_dim - rope_dim "nope" dims then
     * rope_dim roped ones, its value v_head_dim. The cache holds the latent and the RoPE key
     * only (kv_lora_rank + rope_dim a token and layer, one "KV head" every query head reads):
     * queries are absorbed into the latent (attn_k_b), outputs taken out of it (attn_v_b). */
    uint32_t q_lora_rank, kv_lora_rank, rope_dim, v_head_dim;
    /* shared experts' units (DeepSeek: n_shared_experts x moe_intermediate_size), a dense FFN
     * beside the routed experts of every MoE layer; 0: none */
    uint32_t shared_ffn;
    float route_scale; /* the routed experts' weights times this (routed_scaling_factor); 0: 1 */
    /* group-limited top-k (DeepSeek): experts in n_groups equal groups, the top k taken from the
     * topk_groups best groups only (a group's score: its best expert's under softmax routing,
     * its two best's sum under sigmoid routing); 0: one group */
    uint32_t n_groups, topk_groups;
    uint32_t reserved[6];
};
_Static_assert(sizeof(struct shlm_config_ext) == 128, "shlm_config_ext layout");

/* How a MoE layer's router turns its logits (one per expert) into the chosen experts' weights. */
enum shlm_route {
    SHLM_ROUTE_NONE = 0,         /* a dense model */
    SHLM_ROUTE_SOFTMAX_NORM = 1, /* softmax over every expert, the top k, their weights renormalised
                                  * to sum 1 (Mixtral, Qwen3-MoE's norm_topk_prob; the same as a
                                  * softmax over the top k's logits: gpt-oss) */
    SHLM_ROUTE_SOFTMAX = 2,      /* softmax over every expert, the top k with those weights
                                  * (Qwen2-MoE, Qwen3-MoE without norm_topk_prob, DeepSeek-V2) */
    SHLM_ROUTE_SIGMOID_NORM = 3, /* a sigmoid of each logit, the top k (by score plus the
                                  * selection bias where there is one), their scores renormalised
                                  * to sum 1 (DeepSeek-V3) */
    SHLM_ROUTE_SIGMOID = 4,      /* the same, not renormalised */
    SHLM_ROUTE_COUNT
};

/* Whether layer @l of a model of @x has experts (else a dense FFN). */
static inline bool shlm_layer_moe(const struct shlm_config_ext *x, uint32_t l)
{
    return x->n_experts && l >= x->moe_dense_first;
}

/* The value width of a head (v_head_dim, else head_dim) and the width of a token's cache row of
 * a latent-attention model (kv_lora_rank + rope_dim; 0 without latent attention). */
static inline uint32_t shlm_v_dim(const struct shlm_config *c, const struct shlm_config_ext *x)
{
    return x->v_head_dim ? x->v_head_dim : c->head_dim;
}
static inline uint32_t shlm_latent_dim(const struct shlm_config_ext *x)
{
    return x->kv_lora_rank ? x->kv_lora_rank + x->rope_dim : 0;
}

/* Whether layer @l of a model of @x attends within @x->window (and takes rope_theta_local):
 * every layer with a window and no pattern, else all but the last of every window_pattern. */
static inline bool shlm_layer_windowed(const struct shlm_config_ext *x, uint32_t l)
{
    return x->window && (!x->window_pattern || (l + 1) % x->window_pattern != 0);
}

/* The window every one of the @c->n_layers layers attends within, when all of them do and it is
 * shorter than the context (the worker's kernels then read no key before it); else 0: some layer
 * reads every position (Gemma 2/3's global layers), so every block stays needed. With a window,
 * a sequence's blocks wholly before its next position's window are read by no layer again
 * (seg_kv_dead_blocks). */
static inline uint32_t shlm_kv_window(const struct shlm_config *c, const struct shlm_config_ext *x)
{
    if (!x->window || x->window >= c->seq_len)
        return 0;
    for (uint32_t l = 0; l < c->n_layers; l++)
        if (!shlm_layer_windowed(x, l))
            return 0;
    return x->window;
}

struct shlm_header {
    char magic[8];
    uint32_t version;
    uint32_t header_bytes; /* sizeof(struct shlm_header) */
    uint64_t file_bytes;
    struct shlm_config cfg;
    uint32_t scheme, group, head_bits, n_tensors;
    uint64_t table_offset;
    uint64_t tok_offset, tok_bytes;
    uint32_t tok_kind, bos_id, eos_id, reserved0;
    uint64_t data_offset;
    uint32_t shard_rank, shard_count; /* a file: 0, 0; a weights segment: rank r of n (plan.h) */
    uint32_t layout;                  /* enum shlm_layout; a file: 0 */
    /* a weights segment of a MoE model: how its experts are spread (enum seg_experts, plan.h:
     * 0 every rank a slice of each, 1 each rank whole experts); 0 in a file */
    uint32_t experts_placement;
    uint64_t source_checksum; /* a weights segment: the header checksum of the file it came from */
    uint64_t tok_checksum;    /* shlm_hash of the tokenizer bytes; 0 in files made before it */
    struct shlm_config_ext cfgx; /* zero in files made before it */
    uint8_t reserved[160];
    uint64_t checksum; /* shlm_hash of the header (this field zero) and the tensor table */
};
_Static_assert(sizeof(struct shlm_config) == 96, "shlm_config layout");
_Static_assert(sizeof(struct shlm_header) == 512, "shlm_header layout");

struct shlm_tensor {
    char name[SHLM_NAME_MAX]; /* NUL-terminated */
    uint32_t dtype;           /* enum kn_dtype */
    uint32_t group;           /* W4 only, else 0 */
    uint32_t rows, cols;
    uint64_t offset;   /* from the start of the file, multiple of SHLM_ALIGN */
    uint64_t bytes;    /* kn_mat_bytes(dtype, rows, cols, group) */
    uint64_t checksum; /* shlm_hash of the data */
};
_Static_assert(sizeof(struct shlm_tensor) == 88, "shlm_tensor layout");

/* A parsed image: pointers into the caller's buffer (a file mapping or a segment). */
struct shlm_model {
    const uint8_t *base;
    size_t size;
    const struct shlm_header *hdr;
    const struct shlm_tensor *tensors; /* (hdr->n_tensors) */
};

/* 64-bit FNV-1a over 8-byte words (then the tail bytes): corruption detection, not security. */
uint64_t shlm_hash(const void *p, size_t n);
#define SHLM_FNV_OFFSET 0xcbf29ce484222325ull /* FNV-1a's 64-bit offset basis */
/* Plain 64-bit FNV-1a over the @n bytes at @p, from @h (SHLM_FNV_OFFSET to start): the step
 * shlm_hash() ends with, and the checksum that ends a tokenizer blob (coordinator/tok/blob.c;
 * .shlm files already made carry such blobs, so its bytes stay as they are). */
uint64_t shlm_fnv1a(uint64_t h, const void *p, size_t n);
/* The same hash over bytes that arrive in pieces of any size: init, update in order, final. */
struct shlm_hasher {
    uint64_t h, n;
    uint8_t part[8]; /* a word begun by the last piece */
    unsigned npart;
};
void shlm_hash_init(struct shlm_hasher *s);
void shlm_hash_update(struct shlm_hasher *s, const void *p, size_t n);
uint64_t shlm_hash_final(const struct shlm_hasher *s);

const char *shlm_scheme_name(enum shlm_scheme s);
/* Returns 0 and sets *out, or -EINVAL for a name that is not a scheme. */
int shlm_scheme_parse(const char *name, enum shlm_scheme *out);

/* Parses and validates the image @buf of @size bytes: magic, version, sizes against @size,
 * header checksum, every tensor's bounds, size and shape against the config, and that every
 * tensor the architecture needs is there exactly once. On error returns -EINVAL (or -EPROTO for
 * a wrong magic) and writes one line naming @what (a path) and the field into @e. Does not
 * read tensor data: see shlm_verify_data(). */
int shlm_parse(struct shlm_model *m, const void *buf, size_t size, const char *what,
               struct shardlm_err *e);
/* The same checks for a file of @size bytes of which only the first @avail (at least up to
 * data_offset: header, table, tokenizer) are at @head, as a streaming loader reads it. The
 * model's base is @head: tensor data is not there (shlm_view() must not be used). */
int shlm_parse_head(struct shlm_model *m, const void *head, size_t avail, size_t size,
                    const char *what, struct shardlm_err *e);
/* Checks every tensor's checksum. Returns 0 or -EIO with a line naming the tensor in @e. */
int shlm_verify_data(const struct shlm_model *m, const char *what, struct shardlm_err *e);
/* The tensor called @name, or NULL (a linear search: shlm_name_index() for many lookups). */
const struct shlm_tensor *shlm_find(const struct shlm_model *m, const char *name);
/* The indices of @m's tensors sorted by name (malloc'd, hdr->n_tensors of them; NULL: out of
 * memory), for shlm_find_in(). */
int *shlm_name_index(const struct shlm_model *m);
/* The tensor called @name through @index (shlm_name_index of @m), or NULL. */
const struct shlm_tensor *shlm_find_in(const struct shlm_model *m, const int *index,
                                       const char *name);
/* The tensor of kind @kind (enum shlm_kind) of @layer (0 for a global kind) and @expert (0 for
 * a kind not of an expert), or NULL. */
const struct shlm_tensor *shlm_find_kind(const struct shlm_model *m, int kind, uint32_t layer,
                                         uint32_t expert);
/* Fills @v with the view of tensor @t. */
void shlm_view(const struct shlm_model *m, const struct shlm_tensor *t, struct kn_mat *v);

/* The tensors an architecture needs: name, dtype, shape. Used by the converter to lay the file
 * out and by shlm_parse() to check it. Returns the count (<= max) or -EINVAL. */
struct shlm_tensor_spec {
    char name[SHLM_NAME_MAX];
    enum kn_dtype dtype;
    int rows, cols, group;
    int kind;       /* enum shlm_kind (tensors.h) */
    uint32_t layer; /* of a per-layer kind, else 0 */
    uint32_t expert; /* of an expert's kind, else 0 */
};
struct seg_plan;
/* With @plan (not NULL) the shapes are those of that rank's shard (see plan.h). -E2BIG where
 * they are more than @max. */
int shlm_expected_tensors(const struct shlm_config *c, const struct shlm_config_ext *x,
                          enum shlm_scheme s, int group, int head_bits, const struct seg_plan *plan,
                          struct shlm_tensor_spec *out, int max);
/* The dtype a tensor of dtype @dt has in an image of @layout. */
enum kn_dtype shlm_layout_dtype(enum kn_dtype dt, enum shlm_layout layout);
/* Lays out a file or segment image: fills @h's layout fields (magic, version, offsets, sizes),
 * and @table from @specs (names, formats, shapes, offsets; checksums left 0). The caller sets
 * config, scheme, tokenizer fields, then the checksums and shlm_seal(). */
void shlm_layout(struct shlm_header *h, struct shlm_tensor *table,
                 const struct shlm_tensor_spec *specs, int n, uint64_t tok_bytes);
/* Computes the header checksum over the header and @table. */
void shlm_seal(struct shlm_header *h, const struct shlm_tensor *table);
/* Checks the config for sizes that are zero, inconsistent or absurd, and flags the runtime does
 * not implement. 0 or -EINVAL + @e. */
int shlm_config_check(const struct shlm_config *c, struct shardlm_err *e);
/* Checks @x of a model of @c (checked before): the implemented fields in their ranges (soft-caps,
 * query scale and local RoPE base 0 or positive and finite, a window pattern only with a window,
 * latent attention's sizes against the heads'), the others 0. Returns 0 or -EINVAL + @e naming
 * the field and its value. */
int shlm_config_ext_check(const struct shlm_config *c, const struct shlm_config_ext *x,
                          struct shardlm_err *e);

#endif
