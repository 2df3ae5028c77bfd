/* SPDX-License-Identifier: MIT */
/* shm/plan.h: the tensor-parallel shard plan - which slice of every matrix a rank holds.
 *
 * Query heads are split into contiguous, nearly equal ranges; a rank holds the KV heads its query
 * heads read (so KV heads are replicated where ranks share one, e.g. 4 KV heads over 8 query heads
 * at R = 3: ranks hold KV 0-1, 1-2, 3). Gate/up are split by output rows (FFN units), O and down by
 * input columns (the matching heads and units), the LM head by vocabulary rows; norms and the
 * embedding are replicated. O and down then produce partial sums that an all-reduce adds up.
 * Latent attention (DeepSeek) splits its heads' matrices with the query heads and replicates its
 * bottlenecks and its cache (every rank holds the whole latent of each token).
 *
 * Int4 groups run along input columns, so a column slice that starts inside a group keeps the
 * group's scale: the shard gets `pad` zero columns in front so its groups line up with the
 * source's (the matching activations are zero there, which adds nothing to any sum).
 */
#ifndef SHARDLM_SEG_PLAN_H
#define SHARDLM_SEG_PLAN_H

#include "shlm.h"

/* How a MoE model's experts are spread over the ranks (shlm_header.experts_placement). */
enum seg_experts {
    SEG_EXPERTS_TP = 0, /* tensor-parallel: each rank the same slice of every expert's units
                         * (balanced at any batch; small products) */
    SEG_EXPERTS_EP = 1, /* expert-parallel: each rank whole experts [x0, x1), node-local (whole
                         * products; a step's ranks read what its tokens chose of theirs) */
};

struct seg_plan {
    int rank, n_ranks;
    int q0, q1;          /* query heads [q0, q1) */
    int kv0, kv1;        /* KV heads held [kv0, kv1) (latent attention: 0, 1, the latent) */
    int kv_dim;          /* floats of a token's keys (or values) in its KV cache, a layer */
    bool kv_keys_only;   /* the cache holds keys only (latent attention: seg_kv.keys_only) */
    int f0, f1;          /* FFN units [f0, f1) */
    int e0, e1;          /* units [e0, e1) of each of its experts' FFNs */
    int x0, x1;          /* the experts it holds [x0, x1) (tensor-parallel: all) */
    enum seg_experts experts;
    int v0, v1;          /* LM head rows [v0, v1); v0 a multiple of KN_TILE_ROWS */
    int o_pad, down_pad; /* zero input columns in front of the O and down shards */
    int down_pad_exp;    /* and in front of each expert's down shard */
    int s0, s1;          /* shared experts' units [s0, s1) (DeepSeek) */
    int down_pad_sh;     /* and the zero columns in front of their down shard */
};

/* The plan of @rank among @n_ranks for config @c and @x; @group is the int4 group of the matrices
 * (0 for formats without groups). Experts are tensor-parallel (seg_plan_place: or not): each
 * rank holds the same slice of every expert's units. Returns 0 or -EINVAL when n_ranks exceeds the
 * heads, FFN units, expert units or blocks of 16 vocabulary rows (a rank must have work in every
 * layer). */
int seg_plan_make(struct seg_plan *p, const struct shlm_config *c, const struct shlm_config_ext *x,
                  int group, int n_ranks, int rank);
/* The same with the experts placed by @placement: expert-parallel gives rank r the experts
 * [n_experts r / R, n_experts (r + 1) / R) whole (-EINVAL where there are fewer experts than
 * ranks); a dense model ignores it. */
int seg_plan_place(struct seg_plan *p, const struct shlm_config *c, const struct shlm_config_ext *x,
                   int group, int n_ranks, int rank, enum seg_experts placement);
/* The plan of the shard a weights segment's header @h describes (its rank, count and placement;
 * a file: the whole model). Returns 0 or -EINVAL. */
int seg_plan_of(struct seg_plan *p, const struct shlm_header *h);

#endif
