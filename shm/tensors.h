/* SPDX-License-Identifier: MIT */
/* shm/tensors.h: the one table of tensor kinds and the one table of architectures.
 *
 * Every tensor of a model has a kind; its row in shlm_kinds[] says everything the code needs to
 * know about it: its names in .shlm files, GGUF files, Hugging Face checkpoints and llama2.c
 * checkpoints, its shape from the config, how tensor parallelism splits it, which input of the
 * forward it multiplies (calibration, AWQ folding), which formats it may take, and whether a
 * config has it. A tensor's kind is resolved once, where it is imported or laid out; the
 * converter, the loader, the worker and the quantizer then switch on the kind. (ggml's type
 * traits, llama.cpp's LLM_TENSOR_NAMES and LLM_TENSOR_INFOS.)
 *
 * shlm_archs[] holds one row per architecture: its names in GGUF and Hugging Face configs and
 * what it fixes (norm style, activation, RoPE style, biases, q/k norms, embedding scale, tied
 * default). Importers fill a config from the row; the forward reads only the config. */
#ifndef SHARDLM_SHLM_TENSORS_H
#define SHARDLM_SHLM_TENSORS_H

#include "shlm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The kinds, global ones first, then one layer's in the order a file holds them (the order
 * shlm_expected_tensors() lays them out; files made before this table have the same order). */
enum shlm_kind {
    SHLM_KIND_TOK_EMBD,
    SHLM_KIND_OUTPUT,
    SHLM_KIND_OUTPUT_NORM,
    SHLM_KIND_ROPE_FACTORS_SHORT, /* LongRoPE's per-frequency factors (Phi-3), as GGUF stores them
                                   */
    SHLM_KIND_ROPE_FACTORS_LONG,
    SHLM_KIND_ROPE_FREQS, /* per-frequency divisors of the base frequencies: GGUF's rope_freqs
                           * (llama.cpp's form of Llama 3.1's scaling) */
    SHLM_KIND_ATTN_NORM,  /* the first per-layer kind */
    SHLM_KIND_ATTN_Q,
    SHLM_KIND_ATTN_K,
    SHLM_KIND_ATTN_V,
    SHLM_KIND_ATTN_Q_BIAS,
    SHLM_KIND_ATTN_K_BIAS,
    SHLM_KIND_ATTN_V_BIAS,
    SHLM_KIND_ATTN_Q_NORM, /* per-head RMSNorm of q over head_dim (Qwen3, Gemma 3) */
    SHLM_KIND_ATTN_K_NORM,
    SHLM_KIND_ATTN_GATE,
    SHLM_KIND_ATTN_O,
    SHLM_KIND_ATTN_O_BIAS,    /* added to O's output summed over the ranks (gpt-oss) */
    SHLM_KIND_ATTN_SINKS,     /* a logit per query head in the softmax denominator (gpt-oss) */
    SHLM_KIND_ATTN_POST_NORM, /* RMSNorm of O's output before the residual add (Gemma 2/3) */
    SHLM_KIND_FFN_NORM,
    SHLM_KIND_FFN_GATE,
    SHLM_KIND_FFN_UP,
    SHLM_KIND_FFN_DOWN,
    SHLM_KIND_FFN_POST_NORM, /* RMSNorm of down's output before the residual add (Gemma 2/3) */
    /* a MoE layer's FFN (shlm_layer_moe) in place of gate, up and down: the router (one row
     * of logits per expert), then each expert's gate, up and down, one tensor per expert */
    SHLM_KIND_FFN_ROUTER,
    SHLM_KIND_FFN_GATE_EXP,
    SHLM_KIND_FFN_UP_EXP,
    SHLM_KIND_FFN_DOWN_EXP,
    /* gpt-oss's biases of the router's logits and of each expert's gate, up and down outputs
     * (SHLM_CF_MOE_BIAS) */
    SHLM_KIND_FFN_ROUTER_BIAS,
    SHLM_KIND_FFN_GATE_EXP_BIAS,
    SHLM_KIND_FFN_UP_EXP_BIAS,
    SHLM_KIND_FFN_DOWN_EXP_BIAS,
    /* multi-head latent attention (DeepSeek-V2/V3, shlm_config_ext.kv_lora_rank) in place of q
     * (with a q_lora_rank), k and v: q's bottleneck, its RMSNorm and its expansion to the heads;
     * the latent and the RoPE key (one row each, GGUF's attn_kv_a_mqa) and the latent's RMSNorm;
     * each head's absorption of its nope query into the latent ((kv_lora_rank, nope) a head, q_nope
     * . W_UK^T) and its value out of the latent ((v_head_dim, kv_lora_rank) a head). A GGUF
     * holds the last two as llama.cpp's attn_k_b / attn_v_b, or ik_llama.cpp's attn_kv_b, the
     * checkpoint's kv_b_proj that the importer splits (source_gguf.c) */
    SHLM_KIND_ATTN_Q_A,
    SHLM_KIND_ATTN_Q_A_NORM,
    SHLM_KIND_ATTN_Q_B,
    SHLM_KIND_ATTN_KV_A,
    SHLM_KIND_ATTN_KV_A_NORM,
    SHLM_KIND_ATTN_K_B,
    SHLM_KIND_ATTN_V_B,
    /* DeepSeek's shared experts (shlm_config_ext.shared_ffn units, one dense FFN) beside the
     * routed ones, and the bias of the router's scores that chooses the experts
     * (SHLM_CF_SEL_BIAS) */
    SHLM_KIND_FFN_GATE_SHEXP,
    SHLM_KIND_FFN_UP_SHEXP,
    SHLM_KIND_FFN_DOWN_SHEXP,
    SHLM_KIND_FFN_SEL_BIAS,
    SHLM_KIND_COUNT
};
#define SHLM_KIND_FIRST_LAYER SHLM_KIND_ATTN_NORM

/* A size of the config a tensor's rows or columns are. */
enum shlm_dim {
    SHLM_DIM_ONE,          /* 1: the single row of a vector */
    SHLM_DIM_MODEL,        /* dim */
    SHLM_DIM_Q,            /* n_heads * head_dim */
    SHLM_DIM_KV,           /* n_kv_heads * head_dim */
    SHLM_DIM_HEADS,        /* n_heads */
    SHLM_DIM_HEAD,         /* head_dim */
    SHLM_DIM_ROPE,         /* head_dim / 2: RoPE's frequencies */
    SHLM_DIM_FFN,          /* hidden_dim */
    SHLM_DIM_VOCAB,        /* vocab_size */
    SHLM_DIM_EXPERTS,      /* n_experts */
    SHLM_DIM_EXP_FFN,      /* expert_ffn: one expert's FFN units */
    SHLM_DIM_O,            /* n_heads * the value width (shlm_v_dim): O's input */
    SHLM_DIM_Q_LORA,       /* q_lora_rank */
    SHLM_DIM_KV_A,         /* kv_lora_rank + rope_dim: the latent and the RoPE key */
    SHLM_DIM_KV_LORA,      /* kv_lora_rank */
    SHLM_DIM_HEADS_LATENT, /* n_heads * kv_lora_rank */
    SHLM_DIM_NOPE,         /* head_dim - rope_dim: a query's part without RoPE */
    SHLM_DIM_SH_FFN,       /* shared_ffn: the shared experts' units */
};

/* How tensor parallelism splits a tensor (plan.h): a rank holds the part of the split size that
 * its plan gives it (its query heads, KV heads, FFN units or vocabulary rows). */
enum shlm_split {
    SHLM_SPLIT_NONE,        /* replicated: the embedding, norms */
    SHLM_SPLIT_ROWS,        /* the rows: output units (q/k/v, gate/up, the LM head) */
    SHLM_SPLIT_COLS,        /* the columns of a (1, n) vector (q/k/v biases) */
    SHLM_SPLIT_COLS_PADDED, /* input columns behind the plan's zero pad (O: o_pad, down:
                             * down_pad): partial sums the all-reduce adds */
};

/* The formats a tensor may take in a scheme. */
enum shlm_dtc {
    SHLM_DTC_MAT,  /* the scheme's matrix format (f32, bf16, w4a16, w4a8) */
    SHLM_DTC_HEAD, /* the embedding / LM head: the scheme's, or q8 / q6 with --head-bits 8 / 6 */
    SHLM_DTC_F32,  /* always f32: norms, biases, the head gate, RoPE factors */
    SHLM_DTC_Q8,   /* q8 in the int4 schemes, else the scheme's: latent attention's latent and
                    * per-head matrices */
};

/* The inputs of the forward's matrix products (worker/model.h's wrk_site uses these values). */
enum shlm_site {
    SHLM_SITE_NONE = -1,
    SHLM_SITE_QKV,     /* attention norm output: the input of q, k, v (and the head gate) */
    SHLM_SITE_O,       /* attention output: the input of O */
    SHLM_SITE_GATE_UP, /* FFN norm output: the input of gate and up */
    SHLM_SITE_DOWN,    /* act(gate) * up: the input of down */
    SHLM_SITE_HEAD,    /* output norm output: the input of the LM head */
    SHLM_SITES
};

/* The slots of a llama2.c checkpoint, in the order the file stores them. */
enum shlm_l2c {
    SHLM_L2C_NONE,
    SHLM_L2C_EMBD,
    SHLM_L2C_RMS_ATT,
    SHLM_L2C_WQ,
    SHLM_L2C_WK,
    SHLM_L2C_WV,
    SHLM_L2C_WO,
    SHLM_L2C_RMS_FFN,
    SHLM_L2C_W1,
    SHLM_L2C_W2,
    SHLM_L2C_W3,
    SHLM_L2C_RMS_FINAL,
    SHLM_L2C_WCLS,
    SHLM_L2C_COUNT
};

/* What a tensor's values must be beyond finite (every importer checks each element it reads). */
enum shlm_value {
    SHLM_VALUE_ANY,      /* any finite weight */
    SHLM_VALUE_POSITIVE, /* > 0: RoPE's per-frequency factors divide the frequencies (0 makes one
                          * infinite, a negative one turns the rotation around) */
};

struct shlm_kind_traits {
    const char *name; /* in .shlm files; a layer's kind under "blk.%u." */
    const char *gguf; /* llama.cpp's name; a layer's under "blk.%u." */
    const char *hf;   /* transformers' name; a layer's under "model.layers.%u."; NULL: none */
    enum shlm_l2c l2c;
    bool layer; /* one per layer */
    bool norm;  /* an RMSNorm weight: (1 + w) in architectures whose norms are so */
    enum shlm_dim rows, cols;
    enum shlm_split split;
    enum shlm_dtc dtc;
    /* the input whose columns it multiplies (calibration statistics where it is quantized, i.e.
     * not SHLM_DTC_F32; AWQ scales its columns by that input's scale, the head gate's too);
     * SHLM_SITE_NONE for the embedding lookup and the (1, n) vectors */
    enum shlm_site site;
    /* the input its output rows are (AWQ divides them by that input's scale: a norm's output is
     * QKV's or GATE_UP's input, v's (through attention) O's, up's down's); SHLM_SITE_NONE */
    enum shlm_site feeds;
    /* whether layer @l (0 for a global kind) of a model of @c and @x has it */
    bool (*has)(const struct shlm_config *c, const struct shlm_config_ext *x, uint32_t l);
    enum shlm_value value;                    /* SHLM_VALUE_ANY where the row leaves it out */
    bool expert; /* one per expert of a MoE layer: "blk.L.<name>.E" (false where left out) */
};

extern const struct shlm_kind_traits shlm_kinds[SHLM_KIND_COUNT];

/* Whether @x is a value tensors of @kind may hold (its row's value constraint; finiteness is
 * checked apart); @expect says what is expected ("> 0") where it is not. */
bool shlm_kind_value_ok(enum shlm_kind kind, float x, const char **expect);
/* Whether layer @layer (0 for a global kind) of a model of config @c and @x has tensors of
 * @kind. */
bool shlm_kind_present(const struct shlm_config *c, const struct shlm_config_ext *x,
                       enum shlm_kind kind, uint32_t layer);
/* Whether some layer of a model of @c and @x has tensors of @kind. */
bool shlm_kind_any(const struct shlm_config *c, const struct shlm_config_ext *x,
                   enum shlm_kind kind);
/* The .shlm name of @kind (of @layer for a per-layer kind, of @expert for an expert's) into
 * @out. */
void shlm_kind_name(enum shlm_kind kind, uint32_t layer, uint32_t expert, char *out, size_t len);
/* The GGUF name ("blk.3.attn_q.weight"; in a model of config @c where its architecture names
 * it its own way, NULL: the table's), or the Hugging Face one in a model of config @c
 * ("model.layers.3.self_attn.q_proj.weight"; false where the kind has none) into @out. */
void shlm_kind_gguf_name(const struct shlm_config *c, enum shlm_kind kind, uint32_t layer,
                         char *out, size_t len);
bool shlm_kind_hf_name(const struct shlm_config *c, enum shlm_kind kind, uint32_t layer,
                       uint32_t expert, char *out, size_t len);
/* Where a checkpoint that fuses several kinds into one tensor (Phi-3's attn_qkv / qkv_proj: q, k
 * and v rows stacked; ffn_up / gate_up_proj: gate, then up) keeps the rows of @kind: the fused
 * tensor's GGUF name (or Hugging Face name with @hf) of @layer into @out, the fused tensor's
 * rows in *@total and those of @kind from *@row0. False for a kind no fused tensor holds, and in
 * a model whose architecture's row has no fused tensors. */
bool shlm_kind_fused(const struct shlm_config *c, enum shlm_kind kind, uint32_t layer, bool hf,
                     char *out, size_t len, int *row0, int *total);
/* In a model of config @c whose architecture's row has no fused tensors: the first fused
 * tensor's name (GGUF's, or Hugging Face's with @hf) of layers 0..n_layers-1 that @exists finds
 * in the checkpoint, into @out, and what it stacks into *@parts ("q, k and v"); true where there
 * is one (the importer refuses the file naming it: its rows are no kind's). A fused name that is
 * also a kind's own (GGUF's ffn_up) is left to the shape check. False otherwise. */
bool shlm_fused_stray(const struct shlm_config *c, bool hf,
                      bool (*exists)(const void *ctx, const char *name), const void *ctx, char *out,
                      size_t len, const char **parts);
/* The kind and layer of the .shlm name @name in a model of @n_layers layers: true, or false for
 * a name that is no tensor of a model. A file keeps its tensors' names; the loader resolves them
 * here, once per tensor. */
bool shlm_kind_parse(const char *name, uint32_t n_layers, uint32_t n_experts, enum shlm_kind *kind,
                     uint32_t *layer, uint32_t *expert);
/* The size @d in config @c. */
int shlm_dim_size(const struct shlm_config *c, const struct shlm_config_ext *x, enum shlm_dim d);
/* The part [*lo, *hi) of size @d that a rank of plan @p holds (the whole size where @d is not
 * split), and the zero columns in front of it where its split is padded (o_pad for the query
 * width, down_pad for the FFN width; 0 otherwise). */
struct seg_plan;
void shlm_dim_part(const struct shlm_config *c, const struct shlm_config_ext *x,
                   const struct seg_plan *p, enum shlm_dim d, int *lo, int *hi, int *pad);

/* ---- architectures ---- */

enum shlm_family {
    SHLM_FAMILY_UNKNOWN, /* a file made before this table */
    SHLM_FAMILY_LLAMA2C,
    SHLM_FAMILY_LLAMA,
    SHLM_FAMILY_QWEN2,
    SHLM_FAMILY_GEMMA,
    SHLM_FAMILY_SPARK,
    SHLM_FAMILY_QWEN3,
    SHLM_FAMILY_GEMMA2,
    SHLM_FAMILY_GEMMA3,
    SHLM_FAMILY_PHI3,
    SHLM_FAMILY_GRANITE,
    SHLM_FAMILY_SMOLLM3,
    SHLM_FAMILY_MISTRAL,
    SHLM_FAMILY_QWEN3MOE,
    SHLM_FAMILY_MIXTRAL,
    SHLM_FAMILY_GPTOSS,
    SHLM_FAMILY_DEEPSEEK2,
    SHLM_FAMILY_COUNT
};

/* How an architecture's RMSNorm weights multiply. */
enum shlm_norm {
    SHLM_NORM_W,        /* x * w */
    SHLM_NORM_ONE_PLUS, /* x * (1 + w): Hugging Face stores w, 1 is added at import; llama.cpp's
                         * converter has already added it in a GGUF */
};

/* Which layers attend within a sliding window (shlm_config_ext.window). */
enum shlm_attn {
    SHLM_ATTN_GLOBAL,         /* every layer attends to every position */
    SHLM_ATTN_WINDOW_CONFIG,  /* every layer windowed where the config has a window (Mistral) */
    SHLM_ATTN_WINDOW_PATTERN, /* of every window_pattern layers the last is global (Gemma 2/3) */
};

/* How a Hugging Face checkpoint names and holds a MoE layer (shlm_kind_hf_name) and which
 * config.json keys size it. */
enum shlm_hf_moe {
    SHLM_HF_MOE_QWEN,    /* mlp.gate, mlp.experts.E.*_proj; num_experts, moe_intermediate_size */
    SHLM_HF_MOE_MIXTRAL, /* block_sparse_moe.gate, .experts.E.w1/w3/w2; num_local_experts,
                          * intermediate_size */
    SHLM_HF_MOE_GPTOSS,  /* mlp.router (with a bias); every expert's gate and up in one tensor,
                          * their rows interleaved, as MXFP4 blocks (mlp.experts.gate_up_proj_
                          * blocks / _scales / _bias; down_proj_*: source_hf.c reads them); keys
                          * as Mixtral's */
};

/* Whether an architecture's FFNs are experts. */
enum shlm_moe {
    SHLM_MOE_NONE,     /* dense: its expert keys (config.json, GGUF) are refused where set */
    SHLM_MOE_OPTIONAL, /* experts where the file says so (GGUF "llama": Mixtral) */
    SHLM_MOE_REQUIRED, /* always experts (Qwen3-MoE, Mixtral's config.json) */
};

/* A model size by which ik_llama.cpp picks a default where a GGUF lacks the key (files made
 * before llama.cpp's converter wrote it): one of @layers (0: unused) and, unless 0, the context
 * @ctx. */
struct shlm_arch_size {
    uint32_t layers[2];
    uint32_t ctx;
};

struct shlm_arch_traits {
    const char *name; /* for messages and inspect */
    const char *gguf; /* general.architecture; NULL: not read from GGUF */
    const char *hf;   /* config.json architectures[0]; NULL: not read from Hugging Face */
    const char *hf_alt; /* another class of the same architecture (DeepSeek-V2's); NULL */
    /* NULL: supported; else what the runtime lacks, for the one-line refusal */
    const char *refused;
    enum shlm_norm norm;
    enum shlm_act act;
    const char *hf_act_key; /* the config.json field naming the activation */
    bool gguf_rope_neox;    /* GGUF q/k rotate NeoX halves (llama.cpp permutes llama's for
                             * interleaved pairs); Hugging Face checkpoints are NeoX in every one */
    bool qkv_bias;          /* q/k/v biases (Hugging Face; a GGUF says by its tensors) */
    uint32_t flags;         /* SHLM_CF_*: the optional tensors and features it always has */
    bool embd_sqrt_dim;     /* embeddings scaled by sqrt(dim) */
    bool hf_tied_default;   /* tie_word_embeddings when config.json leaves it out */
    enum shlm_attn attn;
    unsigned window_pattern; /* SHLM_ATTN_WINDOW_PATTERN's period */
    /* the window where the config has no key (Gemma 2/3: 4096, transformers' and ik_llama.cpp's
     * default); 0: none */
    uint32_t window_default;
    /* and where a GGUF of this size has none (Phi-3's 4k models: 2047, ik_llama.cpp's) */
    struct shlm_arch_size gguf_window_size;
    uint32_t gguf_window_sized;
    /* the sizes whose GGUF scales queries by (dim / heads)^-1/2 where that is not head_dim's
     * (GGUF stores no query_pre_attn_scalar: ik_llama.cpp takes it from Gemma 2's and Gemma 3's
     * 27B layer counts, 46 and 62); others by head_dim^-1/2 */
    struct shlm_arch_size gguf_query_dim_heads;
    /* every n-th layer has no RoPE where the format has no key for it (SmolLM3's GGUF: llama.cpp
     * fixes 4); 0: RoPE on every layer */
    unsigned gguf_nope_interval;
    bool fused;       /* q/k/v and gate/up may be fused tensors (Phi-3: shlm_kind_fused) */
    bool multipliers; /* Granite's embedding, residual, attention and logit multipliers */
    enum shlm_hf_moe hf_moe; /* how its Hugging Face checkpoints name and hold the experts */
    enum shlm_moe moe;      /* whether its FFNs may or must be experts */
    const char *gguf_ffn_norm; /* the FFN norm's GGUF name where not ffn_norm.weight */
    float rope_theta_local; /* the windowed layers' RoPE base (Gemma 3: 10000, which GGUF files
                             * do not store; config.json's rope_local_base_freq default); 0 */
    bool mla; /* multi-head latent attention, shared experts, dense first layers (DeepSeek) */
};

extern const struct shlm_arch_traits shlm_archs[SHLM_FAMILY_COUNT];

/* The row of a GGUF general.architecture (@len bytes, not NUL-terminated) or of a config.json
 * architectures[0], or NULL (unknown: refused by the importer with the names it knows). */
const struct shlm_arch_traits *shlm_arch_gguf(const char *name, size_t len);
const struct shlm_arch_traits *shlm_arch_hf(const char *name);
/* The supported names of one format ("llama, qwen2, ...") into @out, for messages. */
void shlm_arch_list(bool hf, char *out, size_t len);
/* Whether config @c is of size @z (at least one layer count given and matched). */
bool shlm_arch_size_is(const struct shlm_arch_size *z, const struct shlm_config *c);
/* The row of config @c's family. */
const struct shlm_arch_traits *shlm_arch_of(const struct shlm_config *c);
/* Fills what @a fixes into @c: family, RoPE style (@hf: a Hugging Face checkpoint), activation,
 * biases, flags, embedding scale (from c->dim, which is set before). */
void shlm_arch_apply(const struct shlm_arch_traits *a, bool hf, struct shlm_config *c);
/* Fills what @a fixes of the extension into @x: the window pattern and the local RoPE base (the
 * window itself, soft-caps and query scale are the file's). */
void shlm_arch_apply_ext(const struct shlm_arch_traits *a, struct shlm_config_ext *x);

#endif
