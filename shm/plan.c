/* SPDX-License-Identifier: MIT */
/* shm/plan.c: the shard plan of a rank. */
#include "plan.h"

#include <errno.h>
#include <string.h>

/* [lo, hi) of part @i of @n split into @parts nearly equal contiguous ranges */
static void split(int n, int parts, int i, int *lo, int *hi)
{
    *lo = (int)((long)n * i / parts);
    *hi = (int)((long)n * (i + 1) / parts);
}

int seg_plan_make(struct seg_plan *p, const struct shlm_config *c, const struct shlm_config_ext *x,
                  int group, int n_ranks, int rank)
{
    return seg_plan_place(p, c, x, group, n_ranks, rank, SEG_EXPERTS_TP);
}

int seg_plan_of(struct seg_plan *p, const struct shlm_header *h)
{
    int group = h->scheme >= SHLM_SCHEME_W4A16 ? (int)h->group : 0;
    if (h->experts_placement > SEG_EXPERTS_EP || (!h->shard_count && h->experts_placement))
        return -EINVAL;
    return seg_plan_place(p, &h->cfg, &h->cfgx, group, h->shard_count ? (int)h->shard_count : 1,
                          (int)h->shard_rank, (enum seg_experts)h->experts_placement);
}

int seg_plan_place(struct seg_plan *p, const struct shlm_config *c, const struct shlm_config_ext *x,
                   int group, int n_ranks, int rank, enum seg_experts placement)
{
    memset(p, 0, sizeof(*p));
    int v_units = (int)((c->vocab_size + KN_TILE_ROWS - 1) / KN_TILE_ROWS);
    bool ep = x->n_experts && placement == SEG_EXPERTS_EP;
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks || (uint32_t)n_ranks > c->n_heads ||
        (uint32_t)n_ranks > c->hidden_dim || n_ranks > v_units ||
        (x->n_experts && (uint32_t)n_ranks > (ep ? x->n_experts : x->expert_ffn)) ||
        (x->shared_ffn && (uint32_t)n_ranks > x->shared_ffn))
        return -EINVAL;
    int hd = (int)c->head_dim, kv_mul = (int)(c->n_heads / c->n_kv_heads);
    p->rank = rank;
    p->n_ranks = n_ranks;
    split((int)c->n_heads, n_ranks, rank, &p->q0, &p->q1);
    p->kv0 = p->q0 / kv_mul;
    p->kv1 = (p->q1 - 1) / kv_mul + 1;
    p->kv_dim = (p->kv1 - p->kv0) * hd;
    if (x->kv_lora_rank) {
        p->kv0 = 0;
        p->kv1 = 1;
        p->kv_dim = (int)shlm_latent_dim(x);
        p->kv_keys_only = true;
    }
    split((int)c->hidden_dim, n_ranks, rank, &p->f0, &p->f1);
    split((int)x->shared_ffn, n_ranks, rank, &p->s0, &p->s1);
    if (ep) { /* whole experts: every unit, no pad */
        p->experts = SEG_EXPERTS_EP;
        p->e1 = (int)x->expert_ffn;
        split((int)x->n_experts, n_ranks, rank, &p->x0, &p->x1);
    } else {
        split((int)x->expert_ffn, n_ranks, rank, &p->e0, &p->e1);
        p->x1 = (int)x->n_experts;
    }
    /* whole tile blocks of the head: a tied, tiled embedding's rows are the head's view */
    split(v_units, n_ranks, rank, &p->v0, &p->v1);
    p->v0 *= KN_TILE_ROWS;
    p->v1 = p->v1 * KN_TILE_ROWS < (int)c->vocab_size ? p->v1 * KN_TILE_ROWS : (int)c->vocab_size;
    if (group) {
        p->o_pad = p->q0 * (int)shlm_v_dim(c, x) % group;
        p->down_pad_sh = p->s0 % group;
        p->down_pad = p->f0 % group;
        p->down_pad_exp = p->e0 % group;
    }
    return 0;
}
