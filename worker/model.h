/* SPDX-License-Identifier: MIT */
/* worker/model.h: the decoder forward over the weights image a worker has mapped. */
#ifndef SHARDLM_WRK_MODEL_H
#define SHARDLM_WRK_MODEL_H

#include "allreduce.h"
#include "kn.h"
#include "plan.h"
#include "pool.h"
#include "shlm.h"
#include "tensors.h"

#include <stdbool.h>

struct wrk_layer {
    const float *attn_norm, *ffn_norm;  /* (dim) */
    const float *q_bias, *k_bias, *v_bias; /* (qd), (kvd), (kvd) or NULL */
    const float *head_gate;             /* (our heads, dim) or NULL */
    const float *q_norm, *k_norm;       /* (head_dim) or NULL: per-head RMSNorm of q and k */
    const float *attn_post_norm, *ffn_post_norm; /* (dim) or NULL: RMSNorm of O's and down's
                                                  * all-reduced outputs before the adds */
    /* (head_dim / 2): wrk_model's rope_freqs or rope_freqs_local, NULL: no RoPE (SmolLM3); the
     * magnitude of its cos and sin */
    const float *rope_freqs;
    float rope_mscale;
    struct kn_att att; /* the layer's score scale, soft-cap and window */
    bool att_plain;    /* att all zero: the kernels' defaults (NULL options) */
    struct kn_mat q, k, v, o, gate, up, down; /* gate, up, down: a dense FFN's */
    /* a MoE FFN's (shlm_layer_moe; else NULL): the router (n_experts, dim), replicated, and
     * this rank's units of every expert's gate, up (n_experts each) and down */
    struct kn_mat router;
    struct kn_mat *gate_exp, *up_exp, *down_exp;
    /* gpt-oss's: the output bias (dim), the sinks of this rank's heads, the router's bias
     * (n_experts) and each expert's gate and up biases (its units here) and down bias (dim);
     * else NULL */
    const float *o_bias, *sinks, *router_bias;
    const float **gate_exp_bias, **up_exp_bias, **down_exp_bias; /* (n_experts) */
    /* latent attention's (DeepSeek; else empty): q's bottleneck (q_lora_rank, replicated), its
     * norm and q's expansion to our heads (q itself where there is no bottleneck); the latent
     * and the RoPE key (replicated) and the latent's norm; our heads' absorption and value
     * matrices, and each head's rows of them (k_b_head[h]: (kv_lora_rank, nope) of our h-th
     * head, v_b_head[h]: (v_head_dim, kv_lora_rank)) */
    struct kn_mat q_a, q_b, kv_a, k_b, v_b;
    const float *q_a_norm, *kv_a_norm;
    struct kn_mat *k_b_head, *v_b_head;
    /* the shared experts' gate and up (our units) and down, and the router's selection bias
     * (DeepSeek; else empty, NULL) */
    struct kn_mat gate_sh, up_sh, down_sh;
    const float *sel_bias;
};

/* The inputs of a layer's matrix products, as wrk_model.observe sees them: the sites of the
 * tensor table (shlm_kinds[].site), whose values they are. */
enum wrk_site {
    WRK_SITE_QKV = SHLM_SITE_QKV,         /* attention norm output: the input of q, k and v */
    WRK_SITE_O = SHLM_SITE_O,             /* attention output: the input of O */
    WRK_SITE_GATE_UP = SHLM_SITE_GATE_UP, /* FFN norm output: the input of gate and up */
    WRK_SITE_DOWN = SHLM_SITE_DOWN,       /* act(gate) * up: the input of down */
    WRK_SITE_HEAD = SHLM_SITE_HEAD,       /* output norm output: the input of the LM head (layer:
                                           * n_layers) */
    WRK_SITES = SHLM_SITES
};

struct wrk_model {
    struct shlm_config cfg;
    struct shlm_config_ext cfgx; /* the newer architectures' fields (shlm_config_ext_check) */
    struct seg_plan plan;     /* this rank's slice of every matrix */
    const struct kn_ops *ops;
    struct wrk_pool *pool;    /* splits matrix rows; not owned */
    struct seg_ar_rank *ar;   /* all-reduce of partial sums; NULL with one rank */
    struct kn_mat embd;       /* (vocab, dim), replicated */
    struct kn_mat head;       /* (v1 - v0, dim): this rank's rows of the LM head */
    const float *out_norm;    /* (dim) */
    struct wrk_layer *layers; /* (n_layers) */
    struct kn_mat *experts;   /* (n_layers, 3, n_experts): the MoE layers' expert views */
    const float **expert_biases; /* (n_layers, 3, n_experts): and their biases' (gpt-oss) */
    int max_m;                /* tokens per forward chunk */
    /* When set, called on the forward's thread with each product's input rows before the
     * product: @n rows of @cols floats, @ld apart (calibration statistics; NULL in a worker) */
    void (*observe)(void *ctx, uint32_t layer, enum wrk_site site, const float *x, int n, int ld,
                    int cols);
    void *observe_ctx;
    /* When set, called on the forward's thread with each MoE layer's routing of a chunk: @n rows
     * of @k experts (best first), with observe_ctx (routing statistics; NULL in a worker) */
    void (*route_observe)(void *ctx, uint32_t layer, const int *experts, int n, int k);
    long par_min_work;        /* multiply-adds below which a matrix or attention runs on one thread
                               * (tests may lower it) */
    size_t chunk_bytes;       /* of weights a pool thread takes at a time in decode (tests may
                               * lower it: 0 takes GEMM_ROW_ALIGN rows at a time) */
    /* this rank's widths: q heads x head_dim, a token's KV cache row (plan.kv_dim), FFN units,
     * O/down input with their pads; an expert's units and its down's input with its pad */
    int qd, kvd, ffn, o_cols, down_cols, effn, edown_cols;
    /* our heads' attention output width (heads x value width: O's input) and the shared
     * experts' units and down input */
    int od, sffn, sdown_cols;
    /* scratch, M = max_m rows each */
    float *x, *xb;    /* (M, dim) residual stream; normed input or partial sum */
    float *q, *k, *v; /* (M, qd), (M, kvd), (M, kvd) */
    float *att;       /* (M, o_cols): o_pad zeros, then the attention output of our heads */
    float *hb;        /* (M, down_cols): down_pad zeros, then silu(gate) * up of our units */
    float *hb2;       /* (M, ffn) up */
    struct wrk_moe *moe; /* a MoE model's routing and expert scratch (model.c), else NULL */
    struct wrk_mla *mla; /* a latent-attention model's scratch (model.c), else NULL */
    uint64_t expert_bytes; /* of expert weights the last wrk_forward_batch() read (each chosen
                            * expert this rank holds, once per chunk and layer) */
    float *scores;    /* (pool threads, seq_len): the reference attention's scratch */
    /* (pool threads, gemm_scratch_bytes), 64-byte aligned: each thread's GEMM scratch, sized at
     * init by the table's need over every matrix at max_m (NULL when it needs none) */
    uint8_t *gemm_scratch;
    size_t gemm_scratch_bytes;
    float *rope_freqs; /* (RoPE's width / 2: head_dim, or latent attention's rope_dim) */
    float rope_mscale; /* cos and sin times this (LongRoPE's and YaRN's attention factor; 1) */
    /* (the same): the windowed layers' at cfgx.rope_theta_local, or NULL; its magnitude */
    float *rope_freqs_local;
    float rope_mscale_local;
    struct kn_act *a_dim, *a_o, *a_down; /* (M) prepared inputs of q/k/v/gate/up, O, down */
    /* the parts of them the products read (KN_ACT_*, every layer's): a_dim's for the layers and
     * for the head, which takes it over at the end of a step */
    unsigned parts_dim, parts_head;
    /* the chunk being run: its pieces (a sequence's consecutive tokens each), the piece of each
     * row, and the rows whose logits the head computes with where they go */
    struct wrk_piece *pieces; /* (M) */
    int n_pieces;
    int *row_piece;   /* (M) */
    int *head_row;    /* (M) */
    float **head_dst; /* (M) */
};

/* A sequence's part of a step: @n tokens at positions @pos.. of sequence @seq (a label), whose KV
 * lives in the cache blocks @blocks[0 .. (pos + n - 1) / SEG_KV_BLOCK] (its block table). Logits:
 * this rank's columns [v0, v1) of every token's row (n rows of vocab) into @logits if
 * @all_logits, else of the last token's (one row). */
struct wrk_run {
    uint32_t seq;
    const int32_t *tokens;
    int n, pos;
    const uint32_t *blocks;
    float *logits;
    bool all_logits;
};

/* A run's tokens inside one chunk: @r, a part of the run (its logits NULL where the part
 * computes none), at rows [row0, row0 + r.n) of the chunk. */
struct wrk_piece {
    struct wrk_run r;
    int row0;
};

/* Builds the model view over the parsed image @img (a whole model or one rank's shard; it stays
 * mapped while the model lives) with kernel table @ops, chunks of at most @max_m tokens, matrix
 * rows split over @pool (NULL: the caller's thread only) and partial sums added over @ar (NULL
 * for one rank). Returns 0 or -ENOMEM. Release with wrk_model_free(). */
int wrk_model_init(struct wrk_model *m, const struct shlm_model *img, const struct kn_ops *ops,
                   int max_m, struct wrk_pool *pool, struct seg_ar_rank *ar);
void wrk_model_free(struct wrk_model *m);

/* Runs a step's @n_runs sequences through the model at once, reading and appending keys/values
 * in the blocks of the KV segment @kv (seg_kv layout) their tables name: their tokens are packed
 * into chunks of up to max_m rows in order (a long run spans chunks), each chunk reads every weight
 * matrix once for all of its rows, and attention runs per sequence over its own cache. No two runs
 * write one block (they may share the blocks they only read). The caller has validated tokens,
 * positions and tables. Returns 0 or the all-reduce's error
 * (-ECONNABORTED, -ETIMEDOUT). */
int wrk_forward_batch(struct wrk_model *m, void *kv, const struct wrk_run *runs, int n_runs);

/* A token's experts and weights from its router logits @lg (n_experts) by @x's rule: a score per
 * expert (softmax over every expert, or a sigmoid of each logit); the n_experts_used best by
 * score plus the selection bias @sel where there is one (NULL: none; DeepSeek-V3's), among the
 * experts of the topk_groups best groups where the experts are grouped (a group scored by its
 * best expert under softmax routing, by its two best's sum under sigmoid routing: DeepSeek-V2's
 * group_limited_greedy and V3's noaux_tc); ties go to the higher index, as ik_llama.cpp's
 * argsort orders (score, index) pairs, groups' too. Each chosen expert weighs its score (not
 * biased), renormalised to sum 1 where the rule says so, times route_scale where set. Into
 * @choice and @weight (n_experts_used each, best first). */
void wrk_route(const struct shlm_config_ext *x, const float *lg, const float *sel, int *choice,
               float *weight);

/* wrk_forward_batch() of one run. */
int wrk_forward(struct wrk_model *m, void *kv, const uint32_t *blocks, const int32_t *tokens, int n,
                int pos, float *logits, bool all_logits);

#endif
