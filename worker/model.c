/* SPDX-License-Identifier: MIT */
/* worker/model.c: llama-family decoder forward, M tokens of one sequence at a time. */
#include "model.h"

#include "seg.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The view of the tensor of @kind (of @layer, of @expert) in @img, found through @ix
 * (shlm_name_index of @img: a model of tens of thousands of experts' tensors; NULL: a linear
 * search). shlm_parse() checked that every tensor the config has is present. */
static void view_in(const struct shlm_model *img, const int *ix, enum shlm_kind kind,
                    uint32_t layer, uint32_t expert, struct kn_mat *out)
{
    char name[SHLM_NAME_MAX];
    shlm_kind_name(kind, layer, expert, name, sizeof(name));
    const struct shlm_tensor *t = ix ? shlm_find_in(img, ix, name) : shlm_find(img, name);
    KN_ASSERT(t);
    shlm_view(img, t, out);
}

static const float *vec_in(const struct shlm_model *img, const int *ix, enum shlm_kind kind,
                           uint32_t layer, uint32_t expert)
{
    struct kn_mat v;
    view_in(img, ix, kind, layer, expert, &v);
    KN_ASSERT(v.dtype == KN_DT_F32);
    return v.codes;
}

static void view(const struct shlm_model *img, enum shlm_kind kind, uint32_t layer,
                 struct kn_mat *out)
{
    view_in(img, NULL, kind, layer, 0, out);
}

static const float *vec(const struct shlm_model *img, enum shlm_kind kind, uint32_t layer)
{
    return vec_in(img, NULL, kind, layer, 0);
}

/* A matrix product whose output rows are split over the pool's threads. */
struct gemm_job {
    const struct kn_ops *ops;
    const struct kn_mat *w;
    const struct kn_act *x;
    int m, ldy;
    float *y;
    int chunk_rows; /* rows a thread takes at a time (a multiple of GEMM_ROW_ALIGN) */
};

/* @n activations of width @k that act_prepare fills with @parts (KN_ACT_*) */
static int acts_alloc(struct kn_act **out, int n, int k, int group, unsigned parts)
{
    *out = calloc((size_t)n, sizeof(**out));
    if (!*out)
        return -ENOMEM;
    for (int i = 0; i < n; i++) {
        if (kn_act_alloc(&(*out)[i], k, group))
            return -ENOMEM;
        (*out)[i].parts = parts;
    }
    return 0;
}

/* The parts of an activation @w's product reads (none for an empty view: a kind the config
 * lacks) */
static unsigned act_parts(const struct kn_mat *w)
{
    return w->rows ? kn_type_traits[w->dtype].act_parts : 0;
}

static void acts_free(struct kn_act *a, int n)
{
    for (int i = 0; a && i < n; i++)
        kn_act_free(&a[i]);
    free(a);
}

/* Rows per split unit: whole cache lines of output, enough work per thread. */
#define GEMM_ROW_ALIGN 16
/* Weights a pool thread takes at a time in decode (gemm_set_run) */
#define GEMM_CHUNK_BYTES (256 << 10)
/* Below this many multiply-adds (a matrix's weights, or attention's keys x head size summed
 * over its queries) a stage runs on one thread: fanning out costs more than it saves
 * (DESIGN.md: a 2048x8 projection, 0.444 ms as a plain loop vs 1.155 ms as a pooled GEMM). */
#define PAR_MIN_WORK (1 << 16)

/* The tensors of layer @l of @img into @L: views of its matrices (a dense FFN's or the router
 * and every expert's, into @L's expert arrays) and norms, and of the optional kinds (q/k/v
 * biases, q/k norms, head gate, post-norms) the config has. Cannot fail: shlm_parse() checked
 * that every expected tensor is present. */
static void layer_views(const struct shlm_model *img, const int *ix, const struct shlm_config *c,
                        const struct shlm_config_ext *x, const struct seg_plan *plan, uint32_t l,
                        struct wrk_layer *L)
{
    for (int k = SHLM_KIND_FIRST_LAYER; k < SHLM_KIND_COUNT; k++) {
        if (!shlm_kind_present(c, x, (enum shlm_kind)k, l))
            continue;
        struct kn_mat *mat = NULL, *experts = NULL;
        const float **v = NULL, **vexperts = NULL;
        switch ((enum shlm_kind)k) {
        case SHLM_KIND_ATTN_Q:
            mat = &L->q;
            break;
        case SHLM_KIND_ATTN_K:
            mat = &L->k;
            break;
        case SHLM_KIND_ATTN_V:
            mat = &L->v;
            break;
        case SHLM_KIND_ATTN_O:
            mat = &L->o;
            break;
        case SHLM_KIND_FFN_GATE:
            mat = &L->gate;
            break;
        case SHLM_KIND_FFN_UP:
            mat = &L->up;
            break;
        case SHLM_KIND_FFN_DOWN:
            mat = &L->down;
            break;
        case SHLM_KIND_ATTN_NORM:
            v = &L->attn_norm;
            break;
        case SHLM_KIND_FFN_NORM:
            v = &L->ffn_norm;
            break;
        case SHLM_KIND_ATTN_Q_BIAS:
            v = &L->q_bias;
            break;
        case SHLM_KIND_ATTN_K_BIAS:
            v = &L->k_bias;
            break;
        case SHLM_KIND_ATTN_V_BIAS:
            v = &L->v_bias;
            break;
        case SHLM_KIND_ATTN_Q_NORM:
            v = &L->q_norm;
            break;
        case SHLM_KIND_ATTN_K_NORM:
            v = &L->k_norm;
            break;
        case SHLM_KIND_ATTN_GATE:
            v = &L->head_gate;
            break;
        case SHLM_KIND_ATTN_POST_NORM:
            v = &L->attn_post_norm;
            break;
        case SHLM_KIND_FFN_POST_NORM:
            v = &L->ffn_post_norm;
            break;
        case SHLM_KIND_FFN_ROUTER:
            mat = &L->router;
            break;
        case SHLM_KIND_FFN_GATE_EXP:
            experts = L->gate_exp;
            break;
        case SHLM_KIND_FFN_UP_EXP:
            experts = L->up_exp;
            break;
        case SHLM_KIND_FFN_DOWN_EXP:
            experts = L->down_exp;
            break;
        case SHLM_KIND_ATTN_O_BIAS:
            v = &L->o_bias;
            break;
        case SHLM_KIND_ATTN_SINKS:
            v = &L->sinks;
            break;
        case SHLM_KIND_FFN_ROUTER_BIAS:
            v = &L->router_bias;
            break;
        case SHLM_KIND_FFN_GATE_EXP_BIAS:
            vexperts = L->gate_exp_bias;
            break;
        case SHLM_KIND_FFN_UP_EXP_BIAS:
            vexperts = L->up_exp_bias;
            break;
        case SHLM_KIND_FFN_DOWN_EXP_BIAS:
            vexperts = L->down_exp_bias;
            break;
        case SHLM_KIND_ATTN_Q_A:
            mat = &L->q_a;
            break;
        case SHLM_KIND_ATTN_Q_A_NORM:
            v = &L->q_a_norm;
            break;
        case SHLM_KIND_ATTN_Q_B:
            mat = &L->q_b;
            break;
        case SHLM_KIND_ATTN_KV_A:
            mat = &L->kv_a;
            break;
        case SHLM_KIND_ATTN_KV_A_NORM:
            v = &L->kv_a_norm;
            break;
        case SHLM_KIND_ATTN_K_B:
            mat = &L->k_b;
            break;
        case SHLM_KIND_ATTN_V_B:
            mat = &L->v_b;
            break;
        case SHLM_KIND_FFN_GATE_SHEXP:
            mat = &L->gate_sh;
            break;
        case SHLM_KIND_FFN_UP_SHEXP:
            mat = &L->up_sh;
            break;
        case SHLM_KIND_FFN_DOWN_SHEXP:
            mat = &L->down_sh;
            break;
        case SHLM_KIND_FFN_SEL_BIAS:
            v = &L->sel_bias;
            break;
        default: /* shlm_config_check() refuses the flags of the kinds the forward lacks */
            KN_ASSERT(!"a tensor kind the forward does not read");
        }
        if (experts) /* the experts this rank holds; the others' views stay empty */
            for (uint32_t e = (uint32_t)plan->x0; e < (uint32_t)plan->x1; e++)
                view_in(img, ix, (enum shlm_kind)k, l, e, &experts[e]);
        else if (vexperts)
            for (uint32_t e = (uint32_t)plan->x0; e < (uint32_t)plan->x1; e++)
                vexperts[e] = vec_in(img, ix, (enum shlm_kind)k, l, e);
        else if (mat)
            view_in(img, ix, (enum shlm_kind)k, l, 0, mat);
        else
            *v = vec_in(img, ix, (enum shlm_kind)k, l, 0);
    }
}

/* Views into @img of the weights: the embedding, the LM head (this rank's rows of the embedding
 * when tied), the output norm and every layer's tensors. Returns 0 or -ENOMEM (the layer array,
 * the one allocation here). */
static int model_views(struct wrk_model *m, const struct shlm_model *img)
{
    const struct shlm_config *c = &m->cfg;
    view(img, SHLM_KIND_TOK_EMBD, 0, &m->embd);
    if (c->tied_embd)
        kn_mat_rows(&m->embd, m->plan.v0, m->plan.v1, &m->head);
    else
        view(img, SHLM_KIND_OUTPUT, 0, &m->head);
    m->out_norm = vec(img, SHLM_KIND_OUTPUT_NORM, 0);
    m->layers = calloc(c->n_layers, sizeof(*m->layers));
    size_t ne = m->cfgx.n_experts;
    /* every MoE layer's experts: gate, up and down of each */
    if (ne && !(m->experts = calloc((size_t)c->n_layers * 3 * ne, sizeof(*m->experts))))
        return -ENOMEM;
    if (ne && (c->flags & SHLM_CF_MOE_BIAS) && /* and their biases (gpt-oss) */
        !(m->expert_biases = calloc((size_t)c->n_layers * 3 * ne, sizeof(*m->expert_biases))))
        return -ENOMEM;
    int *ix = shlm_name_index(img);
    if (!m->layers || !ix) {
        free(ix);
        return -ENOMEM;
    }
    for (uint32_t l = 0; l < c->n_layers; l++) {
        struct wrk_layer *L = &m->layers[l];
        if (shlm_layer_moe(&m->cfgx, l)) {
            L->gate_exp = m->experts + (size_t)l * 3 * ne;
            L->up_exp = L->gate_exp + ne;
            L->down_exp = L->up_exp + ne;
            if (c->flags & SHLM_CF_MOE_BIAS) {
                L->gate_exp_bias = m->expert_biases + (size_t)l * 3 * ne;
                L->up_exp_bias = L->gate_exp_bias + ne;
                L->down_exp_bias = L->up_exp_bias + ne;
            }
        }
        layer_views(img, ix, c, &m->cfgx, &m->plan, l, L);
    }
    free(ix);
    return 0;
}

/* This rank's widths from m->plan: its query heads times head_dim, its KV cache row, its FFN
 * units, and the inputs of O and down with the zero pads that put them at the rank's offset
 * (and the shared experts'). */
static void model_widths(struct wrk_model *m)
{
    const struct seg_plan *p = &m->plan;
    int hd = (int)m->cfg.head_dim;
    m->qd = (p->q1 - p->q0) * hd;
    m->kvd = p->kv_dim;
    m->od = (p->q1 - p->q0) * (int)shlm_v_dim(&m->cfg, &m->cfgx);
    m->ffn = p->f1 - p->f0;
    m->o_cols = p->o_pad + m->od;
    m->sffn = p->s1 - p->s0;
    m->sdown_cols = p->down_pad_sh + m->sffn;
    m->down_cols = p->down_pad + m->ffn;
    m->effn = p->e1 - p->e0;
    m->edown_cols = p->down_pad_exp + m->effn;
}

/* The GEMM scratch of each pool thread: the kernel table's need over every matrix for max_m
 * tokens (kn_gemm_scratch_bytes; the AMX table's tile panels), so that no product allocates.
 * Returns 0 or -ENOMEM. */
static int gemm_scratch_alloc(struct wrk_model *m)
{
    size_t need = kn_gemm_scratch_bytes(m->ops, &m->head, m->max_m);
    for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
        const struct wrk_layer *L = &m->layers[l];
        /* every expert of a layer has one shape: the first this rank holds stands for them (an
         * expert may take every token of a chunk) */
        struct kn_mat none = {0};
        bool moe = L->gate_exp;
        const struct kn_mat *mats[] = {&L->q,
                                       &L->k,
                                       &L->v,
                                       &L->o,
                                       &L->gate,
                                       &L->up,
                                       &L->down,
                                       moe ? &L->router : &none,
                                       moe ? &L->gate_exp[m->plan.x0] : &none,
                                       moe ? &L->up_exp[m->plan.x0] : &none,
                                       moe ? &L->down_exp[m->plan.x0] : &none,
                                       &L->q_a,
                                       &L->q_b,
                                       &L->kv_a,
                                       &L->k_b,
                                       &L->v_b,
                                       &L->gate_sh,
                                       &L->up_sh,
                                       &L->down_sh};
        for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++) {
            size_t b = kn_gemm_scratch_bytes(m->ops, mats[i], m->max_m);
            need = b > need ? b : need;
        }
    }
    m->gemm_scratch_bytes = (need + 63) / 64 * 64;
    if (!need)
        return 0;
    size_t threads = (size_t)(m->pool ? wrk_pool_size(m->pool) : 1);
    m->gemm_scratch = aligned_alloc(64, threads * m->gemm_scratch_bytes);
    return m->gemm_scratch ? 0 : -ENOMEM;
}

/* The width RoPE rotates in a head: rope_dim with latent attention, else head_dim. */
static int rope_width(const struct wrk_model *m)
{
    return (int)(m->cfgx.rope_dim ? m->cfgx.rope_dim : m->cfg.head_dim);
}

/* A RoPE frequency table into @out (rope_width / 2); returns the magnitude of cos and sin. @local:
 * the windowed layers' own base (Gemma 3's local layers at cfgx.rope_theta_local take plain RoPE:
 * transformers' rotary_emb_local, ik's freq_scale 1 there); else the config's base and scaling.
 * LongRoPE takes its long factors where the context (seq_len, as the file was converted or
 * capped) exceeds the original one, its short factors otherwise: llama.cpp picks them so by its
 * context size (transformers by each forward's length, which re-rotates no cached key: the two
 * agree wherever a context longer than the original is used as such). */
static float rope_table(const struct wrk_model *m, const struct shlm_model *img, bool local,
                        float *out)
{
    const struct shlm_config *c = &m->cfg;
    int rd = rope_width(m);
    if (local)
        return kn_rope_freqs(out, rd, m->cfgx.rope_theta_local, NULL);
    struct kn_rope_scale rs = {.factor = c->rope_factor,
                               .orig_ctx = (int)c->rope_orig_ctx,
                               .attn_factor = m->cfgx.rope_attn_factor};
    switch (c->rope_scaling) {
    case SHLM_ROPE_LLAMA3:
        rs.type = KN_ROPE_LLAMA3;
        rs.low = c->rope_low_freq_factor;
        rs.high = c->rope_high_freq_factor;
        break;
    case SHLM_ROPE_YARN:
        rs.type = KN_ROPE_YARN;
        rs.beta_fast = m->cfgx.yarn_beta_fast;
        rs.beta_slow = m->cfgx.yarn_beta_slow;
        rs.exact = m->cfgx.yarn_exact;
        break;
    case SHLM_ROPE_LONGROPE:
        rs.freq_factors = vec(img,
                              c->seq_len > c->rope_orig_ctx ? SHLM_KIND_ROPE_FACTORS_LONG
                                                            : SHLM_KIND_ROPE_FACTORS_SHORT,
                              0);
        break;
    case SHLM_ROPE_FREQS:
        rs.freq_factors = vec(img, SHLM_KIND_ROPE_FREQS, 0);
        break;
    case SHLM_ROPE_LINEAR:
        rs.type = KN_ROPE_LINEAR;
        break;
    default:
        break;
    }
    return kn_rope_freqs(out, rd, c->rope_theta, &rs);
}

/* Layer @l's RoPE table and magnitude (the local one for a windowed layer where there is one;
 * none on SmolLM3's every nope_interval-th layer) and attention options: the config's score
 * scale (Gemma's query_pre_attn_scalar, Granite's attention_multiplier) and soft-cap, its window
 * where the layer is windowed (shlm_layer_windowed: Gemma's pattern; every layer of Mistral and
 * Phi-3). */
static void layer_options(struct wrk_model *m, uint32_t l)
{
    struct wrk_layer *L = &m->layers[l];
    bool windowed = shlm_layer_windowed(&m->cfgx, l);
    bool local = windowed && m->rope_freqs_local;
    uint32_t nope = m->cfgx.nope_interval;
    L->rope_freqs = nope && (l + 1) % nope == 0 ? NULL
                    : local                     ? m->rope_freqs_local
                                                : m->rope_freqs;
    L->rope_mscale = local ? m->rope_mscale_local : m->rope_mscale;
    /* a window as long as the context reads every key: the plain kernels */
    uint32_t window = windowed && m->cfgx.window < m->cfg.seq_len ? m->cfgx.window : 0;
    L->att = (struct kn_att){
        .scale = m->cfgx.query_scale, .softcap = m->cfgx.attn_softcap, .window = (int)window};
    /* latent attention's kernel head is the cached row (kv_lora_rank + rope_dim); its scores
     * are scaled by head_dim's (nope + rope) */
    if (m->cfgx.kv_lora_rank && L->att.scale == 0.0f)
        L->att.scale = 1.0f / sqrtf((float)m->cfg.head_dim);
    L->att_plain = !L->att.scale && !L->att.softcap && !L->att.window && !L->sinks;
}

/* A MoE model's routing of the chunk being run and its experts' scratch: row i's choices are
 * (row, expert) pairs; the pairs are grouped by expert so that each expert's weights are read
 * once for all of the rows that chose it. */
struct wrk_moe {
    int k;                 /* experts each row takes (n_experts_used) */
    float *logits;         /* (M, n_experts) the router's */
    int *choice;           /* (M, k) row i's experts, best first */
    float *weight;         /* (M, k) their weights in the combine */
    int *first;            /* (n_experts + 1): expert e's pairs are [first[e], first[e + 1]) */
    int *row_pair;         /* (M, k) the pair of row i's j-th choice */
    int *pair_row;         /* (M k) the row of each pair */
    int *pair_exp;         /* (M k) and its expert */
    struct kn_act *a_in;   /* (M k) each pair's row of a_dim (shallow copies: gate's and up's
                            * inputs in the pairs' order) */
    struct kn_act *a_down; /* (M k) the inputs of down */
    float *gate;           /* (M k, edown_cols): down_pad_exp zeros, then act(gate) * up */
    float *up;             /* (M k, effn) */
    float *out;            /* (M k, dim) each pair's down output (this rank's partial sum) */
    /* the shared experts' (DeepSeek; else NULL): act(gate) * up behind sdown_cols' pad, up,
     * down's inputs and its output */
    float *sh_gate, *sh_up, *sh_out; /* (M, sdown_cols), (M, sffn), (M, dim) */
    struct kn_act *a_sh;             /* (M) */
    /* a set's jobs: gate and up of every expert (and of the shared ones), or down of every
     * expert (and of the shared ones) */
    struct gemm_job *jobs; /* (2 n_experts + 2) */
    int *jobs_first;       /* (2 n_experts + 3) */
};

/* The MoE scratch for chunks of max_m rows: prepared activations of width edown_cols with
 * @group and @parts_down (down's). Returns 0 or -ENOMEM, what was allocated left for
 * moe_free(). */
static int moe_alloc(struct wrk_model *m, int group, unsigned parts_down, unsigned parts_sh)
{
    struct wrk_moe *e = m->moe = calloc(1, sizeof(*m->moe));
    if (!e)
        return -ENOMEM;
    size_t M = (size_t)m->max_m, k = m->cfgx.n_experts_used, ne = m->cfgx.n_experts;
    e->k = (int)k;
    e->logits = malloc(M * ne * sizeof(float));
    e->choice = malloc(M * k * sizeof(int));
    e->weight = malloc(M * k * sizeof(float));
    e->first = malloc((ne + 1) * sizeof(int));
    e->row_pair = malloc(M * k * sizeof(int));
    e->pair_row = malloc(M * k * sizeof(int));
    e->pair_exp = malloc(M * k * sizeof(int));
    e->a_in = calloc(M * k, sizeof(*e->a_in));
    e->gate = calloc(M * k * (size_t)m->edown_cols, sizeof(float)); /* pads stay zero */
    e->up = malloc(M * k * (size_t)m->effn * sizeof(float));
    e->out = malloc(M * k * m->cfg.dim * sizeof(float));
    e->jobs = calloc(2 * ne + 2, sizeof(*e->jobs));
    e->jobs_first = calloc(2 * ne + 3, sizeof(int));
    if (m->sffn &&
        (!(e->sh_gate = calloc(M * (size_t)m->sdown_cols, sizeof(float))) || /* pads stay 0 */
         !(e->sh_up = malloc(M * (size_t)m->sffn * sizeof(float))) ||
         !(e->sh_out = malloc(M * m->cfg.dim * sizeof(float))) ||
         acts_alloc(&e->a_sh, (int)M, m->sdown_cols, group, parts_sh)))
        return -ENOMEM;
    if (!e->logits || !e->choice || !e->weight || !e->first || !e->row_pair || !e->pair_row ||
        !e->pair_exp || !e->a_in || !e->gate || !e->up || !e->out || !e->jobs || !e->jobs_first ||
        acts_alloc(&e->a_down, (int)(M * k), m->edown_cols, group, parts_down))
        return -ENOMEM;
    return 0;
}

static void moe_free(struct wrk_model *m)
{
    struct wrk_moe *e = m->moe;
    if (!e)
        return;
    free(e->logits);
    free(e->choice);
    free(e->weight);
    free(e->first);
    free(e->row_pair);
    free(e->pair_row);
    free(e->pair_exp);
    free(e->a_in);
    acts_free(e->a_down, m->max_m * e->k);
    acts_free(e->a_sh, m->max_m);
    free(e->sh_gate);
    free(e->sh_up);
    free(e->sh_out);
    free(e->gate);
    free(e->up);
    free(e->out);
    free(e->jobs);
    free(e->jobs_first);
    free(e);
}

/* A latent-attention model's scratch for chunks of M = max_m rows: our nq heads' absorbed
 * queries and latent outputs, rows of lat = kv_lora_rank + rope_dim floats (a latent part, then
 * the RoPE part), and the prepared inputs of the per-head products, head h's row i at h M + i. */
struct wrk_mla {
    int nq, nope, rope, kvl, lat, vd;
    float *qa;            /* (M, q_lora_rank): q's bottleneck */
    struct kn_act *a_qa;  /* (M) its norm's, q_b's input */
    float *qlat, *olat;   /* (M, nq, lat): queries absorbed into the latent, attention outputs */
    struct kn_act *a_qn;  /* (nq M): each head's q_nope, its absorption's input */
    struct kn_act *a_ol;  /* (nq M): each head's latent output, its value matrix's input */
    struct kn_mat *heads; /* (n_layers, 2, nq): the per-head views (wrk_layer.k_b_head, v_b_head) */
    struct gemm_job *jobs; /* (nq) a set of a product per head */
    int *jobs_first;       /* (nq + 1) */
};

/* The latent-attention scratch and every layer's per-head views of attn_k_b and attn_v_b; W4
 * activations of @group. Returns 0 or -ENOMEM, what was allocated left for mla_free(). */
static int mla_alloc(struct wrk_model *m, int group)
{
    const struct shlm_config_ext *x = &m->cfgx;
    struct wrk_mla *a = m->mla = calloc(1, sizeof(*m->mla));
    if (!a)
        return -ENOMEM;
    size_t M = (size_t)m->max_m;
    a->nq = m->plan.q1 - m->plan.q0;
    a->rope = (int)x->rope_dim;
    a->nope = (int)m->cfg.head_dim - a->rope;
    a->kvl = (int)x->kv_lora_rank;
    a->lat = (int)shlm_latent_dim(x);
    a->vd = (int)shlm_v_dim(&m->cfg, x);
    size_t nq = (size_t)a->nq, rows = M * nq * (size_t)a->lat;
    unsigned parts_qa = 0, parts_qn = 0, parts_ol = 0;
    for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
        const struct wrk_layer *L = &m->layers[l];
        parts_qa |= x->q_lora_rank ? act_parts(&L->q_b) : 0;
        parts_qn |= act_parts(&L->k_b);
        parts_ol |= act_parts(&L->v_b);
    }
    a->qlat = malloc(rows * sizeof(float));
    a->olat = malloc(rows * sizeof(float));
    a->heads = calloc((size_t)m->cfg.n_layers * 2 * nq, sizeof(*a->heads));
    a->jobs = calloc(nq, sizeof(*a->jobs));
    a->jobs_first = calloc(nq + 1, sizeof(int));
    if (!a->qlat || !a->olat || !a->heads || !a->jobs || !a->jobs_first ||
        acts_alloc(&a->a_qn, (int)(nq * M), a->nope, group, parts_qn) ||
        acts_alloc(&a->a_ol, (int)(nq * M), a->kvl, group, parts_ol))
        return -ENOMEM;
    if (x->q_lora_rank && (!(a->qa = malloc(M * x->q_lora_rank * sizeof(float))) ||
                           acts_alloc(&a->a_qa, (int)M, (int)x->q_lora_rank, group, parts_qa)))
        return -ENOMEM;
    for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
        struct wrk_layer *L = &m->layers[l];
        L->k_b_head = a->heads + (size_t)l * 2 * nq;
        L->v_b_head = L->k_b_head + nq;
        for (int h = 0; h < a->nq; h++) {
            kn_mat_rows(&L->k_b, h * a->kvl, (h + 1) * a->kvl, &L->k_b_head[h]);
            kn_mat_rows(&L->v_b, h * a->vd, (h + 1) * a->vd, &L->v_b_head[h]);
        }
    }
    return 0;
}

static void mla_free(struct wrk_model *m)
{
    struct wrk_mla *a = m->mla;
    if (!a)
        return;
    int nm = a->nq * m->max_m;
    free(a->qa);
    acts_free(a->a_qa, m->max_m);
    free(a->qlat);
    free(a->olat);
    acts_free(a->a_qn, nm);
    acts_free(a->a_ol, nm);
    free(a->heads);
    free(a->jobs);
    free(a->jobs_first);
    free(a);
}

/* The scratch of a chunk of m->max_m tokens (rows of activations, the prepared inputs of the
 * matrix products with the W4 tensors' @group, the reference attention's scores, the GEMMs'
 * scratch) and the RoPE frequency table (rope_table). Returns 0 or -ENOMEM, with what was allocated
 * left for wrk_model_free(). */
static int model_buffers(struct wrk_model *m, const struct shlm_model *img, int group)
{
    const struct shlm_config *c = &m->cfg;
    int max_m = m->max_m;
    size_t M = (size_t)max_m, dim = c->dim;
    /* the activation group must match the W4 tensors' group; other formats ignore it */
    int agroup = group ? group : 32;
    m->x = malloc(M * dim * sizeof(float));
    m->xb = malloc(M * dim * sizeof(float));
    m->q = malloc(M * (size_t)m->qd * sizeof(float));
    m->k = malloc(M * (size_t)m->kvd * sizeof(float));
    /* latent attention's values are its cached keys: no v */
    m->v = malloc(M * (size_t)(m->cfgx.kv_lora_rank ? 1 : m->kvd) * sizeof(float));
    m->att = calloc(M * (size_t)m->o_cols, sizeof(float)); /* pads stay zero */
    /* the dense FFN's scratch (a model whose every layer is MoE has none: one float a row, as
     * a_down's width below) */
    bool dense = false;
    for (uint32_t l = 0; l < c->n_layers; l++)
        dense |= !shlm_layer_moe(&m->cfgx, l);
    int down_cols = dense ? m->down_cols : 1;
    m->hb = calloc(M * (size_t)down_cols, sizeof(float));
    m->hb2 = malloc(M * (size_t)(dense ? m->ffn : 1) * sizeof(float));
    /* the reference attention's scores, one row per pool thread */
    m->scores =
        malloc((size_t)c->seq_len * (size_t)(m->pool ? wrk_pool_size(m->pool) : 1) * sizeof(float));
    m->rope_freqs = malloc((size_t)rope_width(m) / 2 * sizeof(float));
    m->pieces = malloc(M * sizeof(*m->pieces));
    m->row_piece = malloc(M * sizeof(*m->row_piece));
    m->head_row = malloc(M * sizeof(*m->head_row));
    m->head_dst = malloc(M * sizeof(*m->head_dst));
    if (m->rope_freqs)
        m->rope_mscale = rope_table(m, img, false, m->rope_freqs);
    bool local = m->cfgx.window && m->cfgx.rope_theta_local > 0.0f;
    if (local && (m->rope_freqs_local = malloc((size_t)rope_width(m) / 2 * sizeof(float))))
        m->rope_mscale_local = rope_table(m, img, true, m->rope_freqs_local);
    for (uint32_t l = 0; l < c->n_layers; l++)
        layer_options(m, l);
    if (local && !m->rope_freqs_local)
        return -ENOMEM;
    unsigned parts_o = 0, parts_down = 0, parts_edown = 0, parts_sh = 0;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const struct wrk_layer *L = &m->layers[l];
        /* the views a config lacks are empty: they add no part */
        m->parts_dim |= act_parts(&L->q) | act_parts(&L->k) | act_parts(&L->v) |
                        act_parts(&L->q_a) | act_parts(&L->kv_a) | act_parts(&L->gate_sh) |
                        act_parts(&L->up_sh);
        parts_sh |= act_parts(&L->down_sh);
        parts_o |= act_parts(&L->o);
        if (L->gate_exp) {
            m->parts_dim |= act_parts(&L->router) | act_parts(&L->gate_exp[m->plan.x0]) |
                            act_parts(&L->up_exp[m->plan.x0]);
            parts_edown |= act_parts(&L->down_exp[m->plan.x0]);
        } else {
            m->parts_dim |= act_parts(&L->gate) | act_parts(&L->up);
            parts_down |= act_parts(&L->down);
        }
    }
    m->parts_head = act_parts(&m->head);
    if (!m->rope_freqs || !m->x || !m->xb || !m->q || !m->k || !m->v || !m->att || !m->hb ||
        !m->hb2 || !m->scores || !m->pieces || !m->row_piece || !m->head_row || !m->head_dst ||
        acts_alloc(&m->a_dim, max_m, (int)dim, agroup, m->parts_dim) ||
        acts_alloc(&m->a_o, max_m, m->o_cols, agroup, parts_o) ||
        acts_alloc(&m->a_down, max_m, down_cols, agroup, parts_down) || gemm_scratch_alloc(m))
        return -ENOMEM;
    if (m->cfgx.kv_lora_rank && mla_alloc(m, agroup))
        return -ENOMEM;
    return m->cfgx.n_experts ? moe_alloc(m, agroup, parts_edown, parts_sh) : 0;
}

int wrk_model_init(struct wrk_model *m, const struct shlm_model *img, const struct kn_ops *ops,
                   int max_m, struct wrk_pool *pool, struct seg_ar_rank *ar)
{
    memset(m, 0, sizeof(*m));
    const struct shlm_header *h = img->hdr;
    const struct shlm_config *c = &h->cfg;
    int group = h->scheme >= SHLM_SCHEME_W4A16 ? (int)h->group : 0;
    m->cfg = *c;
    m->cfgx = h->cfgx;
    m->ops = ops;
    m->pool = pool;
    m->ar = ar && ar->n_ranks > 1 ? ar : NULL;
    m->max_m = max_m;
    m->par_min_work = PAR_MIN_WORK;
    m->chunk_bytes = GEMM_CHUNK_BYTES;
    /* shlm_parse() checked the image against this very plan */
    KN_ASSERT(seg_plan_of(&m->plan, h) == 0);
    int rc = model_views(m, img);
    if (!rc) {
        model_widths(m);
        rc = model_buffers(m, img, group);
    }
    if (rc)
        wrk_model_free(m);
    return rc;
}

void wrk_model_free(struct wrk_model *m)
{
    moe_free(m);
    mla_free(m);
    free(m->layers);
    free(m->experts);
    free(m->expert_biases);
    free(m->x);
    free(m->xb);
    free(m->q);
    free(m->k);
    free(m->v);
    free(m->att);
    free(m->hb);
    free(m->hb2);
    free(m->scores);
    free(m->gemm_scratch);
    free(m->rope_freqs);
    free(m->rope_freqs_local);
    free(m->pieces);
    free(m->row_piece);
    free(m->head_row);
    free(m->head_dst);
    acts_free(m->a_dim, m->max_m);
    acts_free(m->a_o, m->max_m);
    acts_free(m->a_down, m->max_m);
    memset(m, 0, sizeof(*m));
}

static void add_rows(float *x, const float *d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += d[i];
}

/* The token-by-token stages between the matrix products (norms, activation preparation, RoPE
 * and the KV append, the FFN's activation function): a prefill chunk's rows are split over the
 * pool, so the other threads do not wait while one works through them; one row (decode) runs
 * on the caller. */
struct row_job {
    const struct wrk_model *m;
    int n;
    void (*row)(const struct row_job *j, int i);
    const struct wrk_layer *L;
    const float *norm, *src; /* the stage's inputs: norm weights, rows of k floats */
    struct kn_act *a;        /* prepared activations out */
    int k;
    void *kv; /* the KV segment; row i's sequence and position: m->pieces[m->row_piece[i]] */
    uint32_t layer;
    int first; /* a MoE stage over pairs: its row i is pair first + i */
};

static void rows_part(void *arg, int t, int nt)
{
    const struct row_job *j = arg;
    for (int i = j->n * t / nt; i < j->n * (t + 1) / nt; i++)
        j->row(j, i);
}

static void rows_run(const struct wrk_model *m, struct row_job *j)
{
    if (m->pool && j->n > 1)
        wrk_pool_run(m->pool, rows_part, j);
    else
        rows_part(j, 0, 1);
}

/* xb = rmsnorm(x) and its activations (the inputs of q/k/v and of gate/up) */
static void row_norm_prepare(const struct row_job *j, int i)
{
    const struct wrk_model *m = j->m;
    size_t dim = m->cfg.dim;
    float *xb = m->xb + (size_t)i * dim;
    m->ops->rmsnorm(xb, m->x + (size_t)i * dim, j->norm, (int)dim, m->cfg.norm_eps);
    j->a[i].parts = m->parts_dim; /* the head may have had it */
    m->ops->act_prepare(&j->a[i], xb);
}

/* the activations of row i of src (the inputs of O) */
static void row_prepare(const struct row_job *j, int i)
{
    j->m->ops->act_prepare(&j->a[i], j->src + (size_t)i * (size_t)j->k);
}

_Static_assert(SEG_KV_BLOCK == KN_KV_BLOCK, "the cache pages as the kernels read it");

/* Floats of a token's row of one KV head: head_dim, or with latent attention the latent's and
 * the RoPE key's (the one "KV head" every query head reads). */
static inline int kv_row(const struct wrk_model *m)
{
    return m->plan.kv_dim / (m->plan.kv1 - m->plan.kv0);
}

/* Floats of one KV head's keys (or values) in a block of one layer: the keys of a layer in a
 * block are [our KV head][SEG_KV_BLOCK positions][kv_row], so attention reads one head's rows
 * as one run (rows a whole KV dimension apart fell into the same L1 sets, keys and values
 * alike: a batch of 8 spent 17% of its decode steps there). */
static inline size_t kv_head_rows(const struct wrk_model *m)
{
    return (size_t)SEG_KV_BLOCK * (size_t)kv_row(m);
}

/* Row i's position in its sequence (*@pos) and the offset of its row in the first KV head's keys
 * (or values) of a layer: its block's, then its place in the block (kv_row floats a row). */
static size_t kv_row_at(const struct row_job *j, int i, int *pos)
{
    const struct wrk_model *m = j->m;
    const struct wrk_piece *pc = &m->pieces[m->row_piece[i]];
    *pos = pc->r.pos + (i - pc->row0);
    return pc->r.blocks[*pos / SEG_KV_BLOCK] * seg_kv_block_floats(j->kv) +
           (size_t)(*pos % SEG_KV_BLOCK) * (size_t)kv_row(m);
}

/* biases, the per-head q/k norms, RoPE on q and k (but on a layer without it), k and v appended to
 * the KV cache of row i's sequence at its position */
static void row_rope_kv(const struct row_job *j, int i)
{
    const struct wrk_model *m = j->m;
    int pos;
    size_t at = kv_row_at(j, i, &pos);
    const struct shlm_config *c = &m->cfg;
    float *kc = seg_kv_keys(j->kv, j->layer) + at, *vc = seg_kv_values(j->kv, j->layer) + at;
    const struct wrk_layer *L = j->L;
    int hd = (int)c->head_dim, nq = m->plan.q1 - m->plan.q0, nkv = m->plan.kv1 - m->plan.kv0;
    size_t qd = (size_t)m->qd, kvd = (size_t)m->kvd;
    float *qi = m->q + (size_t)i * qd, *ki = m->k + (size_t)i * kvd, *vi = m->v + (size_t)i * kvd;
    if (L->q_bias) {
        add_rows(qi, L->q_bias, qd);
        add_rows(ki, L->k_bias, kvd);
        add_rows(vi, L->v_bias, kvd);
    }
    if (L->q_norm) { /* RMSNorm of each head's q and k over head_dim, before RoPE (Qwen3) */
        for (int h = 0; h < nq; h++)
            m->ops->rmsnorm(qi + (size_t)h * hd, qi + (size_t)h * hd, L->q_norm, hd, c->norm_eps);
        for (int h = 0; h < nkv; h++)
            m->ops->rmsnorm(ki + (size_t)h * hd, ki + (size_t)h * hd, L->k_norm, hd, c->norm_eps);
    }
    if (L->rope_freqs) { /* NULL: a layer without RoPE (SmolLM3) */
        m->ops->rope(qi, nq, hd, pos, L->rope_freqs, L->rope_mscale, c->rope_neox);
        m->ops->rope(ki, nkv, hd, pos, L->rope_freqs, L->rope_mscale, c->rope_neox);
    }
    /* a block holds each KV head's SEG_KV_BLOCK rows together (kv_head_rows) */
    for (int h = 0; h < nkv; h++) {
        memcpy(kc + (size_t)h * kv_head_rows(m), ki + (size_t)h * (size_t)hd, (size_t)hd * 4);
        memcpy(vc + (size_t)h * kv_head_rows(m), vi + (size_t)h * (size_t)hd, (size_t)hd * 4);
    }
}

/* q's bottleneck of row i through its RMSNorm, and its activations (q_b's input) */
static void row_qa_prepare(const struct row_job *j, int i)
{
    const struct wrk_model *m = j->m;
    const struct wrk_mla *a = m->mla;
    int r = (int)m->cfgx.q_lora_rank;
    float *qa = a->qa + (size_t)i * (size_t)r;
    m->ops->rmsnorm(qa, qa, j->L->q_a_norm, r, m->cfg.norm_eps);
    m->ops->act_prepare(&a->a_qa[i], qa);
}

/* Latent attention's row i: the latent through its RMSNorm and RoPE on the RoPE key, the two
 * appended to the cache of row i's sequence at its position (one row of lat floats); RoPE on
 * each of our heads' roped part, which goes to the end of its absorbed query, and the
 * activations of its nope part (the input of its absorption) */
static void row_mla_kv(const struct row_job *j, int i)
{
    const struct wrk_model *m = j->m;
    const struct wrk_mla *a = m->mla;
    const struct wrk_layer *L = j->L;
    const struct shlm_config *c = &m->cfg;
    int pos, hd = (int)c->head_dim;
    size_t at = kv_row_at(j, i, &pos);
    float *kv = m->k + (size_t)i * (size_t)m->kvd;
    m->ops->rmsnorm(kv, kv, L->kv_a_norm, a->kvl, c->norm_eps);
    m->ops->rope(kv + a->kvl, 1, a->rope, pos, L->rope_freqs, L->rope_mscale, c->rope_neox);
    memcpy(seg_kv_keys(j->kv, j->layer) + at, kv, (size_t)a->lat * sizeof(float));
    for (int h = 0; h < a->nq; h++) {
        float *qh = m->q + (size_t)i * (size_t)m->qd + (size_t)h * (size_t)hd;
        float *ql = a->qlat + ((size_t)i * (size_t)a->nq + (size_t)h) * (size_t)a->lat;
        m->ops->rope(qh + a->nope, 1, a->rope, pos, L->rope_freqs, L->rope_mscale, c->rope_neox);
        memcpy(ql + a->kvl, qh + a->nope, (size_t)a->rope * sizeof(float));
        m->ops->act_prepare(&a->a_qn[(size_t)h * (size_t)m->max_m + (size_t)i], qh);
    }
}

/* @gate = act(@gate) * @up over @n units, by the config's activation */
static void act_mul(const struct wrk_model *m, float *gate, const float *up, int n)
{
    switch ((enum shlm_act)m->cfg.act) {
    case SHLM_ACT_GELU_TANH:
        m->ops->gelu_mul(gate, up, n);
        return;
    case SHLM_ACT_SWIGLU_OAI:
        m->ops->swiglu_oai_mul(gate, up, n);
        return;
    case SHLM_ACT_SILU:
        break;
    }
    m->ops->silu_mul(gate, up, n);
}

/* hb = act(gate) * up, and its activations (the inputs of down) */
static void row_act_prepare(const struct row_job *j, int i)
{
    const struct wrk_model *m = j->m;
    float *h = m->hb + (size_t)i * m->down_cols;
    act_mul(m, h + m->plan.down_pad, m->hb2 + (size_t)i * m->ffn, m->ffn);
    m->ops->act_prepare(&j->a[i], h);
}

/* Products of the same activations (q, k, v; gate, up) in one dispatch, so that a thread goes on
 * from its rows of one matrix to its rows of the next without waiting at a barrier for the
 * others (at 2 threads, decode spent 8% of its samples in the pool's waits with one dispatch
 * per matrix).
 *
 * The rows are split into chunks that the threads take from a shared counter as they finish
 * the last: a thread whose core is busier (another process, the hypervisor) takes fewer, so
 * the step no longer waits for the slowest thread's fixed share. A decode chunk is about
 * GEMM_CHUNK_BYTES of weights (wrk_model.chunk_bytes), a long enough stream for the prefetchers and
 * few enough atomics; its row count is a power of two times GEMM_ROW_ALIGN, so that the kernels'
 * per-shape prefetch tuning sees one shape per width. A prefill product (m > 1) reads each weight m
 * times, so its chunks stay one share per thread, as the kernels' blocking expects; one
 * thread takes the whole matrix at once. */
#define GEMM_MAX_SET 3
struct gemm_set {
    int count, cap;
    struct gemm_job *j; /* (cap): own, or a MoE layer's experts' (gemm_set_over) */
    int *first;         /* (cap + 1) chunk index of each job's first chunk; first[count]: total */
    struct gemm_job own[GEMM_MAX_SET];
    int own_first[GEMM_MAX_SET + 1];
    _Atomic int next;            /* the next chunk to take */
    uint8_t *scratch;            /* wrk_model.gemm_scratch: pool thread i's at i * scratch_bytes */
    size_t scratch_bytes;
};

/* Rows per chunk of @w's product over @m activations on @threads threads, a decode chunk about
 * @chunk_bytes of weights. */
static int gemm_chunk_rows(const struct kn_mat *w, int m, int threads, size_t chunk_bytes)
{
    int units = (w->rows + GEMM_ROW_ALIGN - 1) / GEMM_ROW_ALIGN;
    int share = (units + threads - 1) / threads * GEMM_ROW_ALIGN;
    if (m > 1 || threads == 1)
        return share;
    size_t unit_bytes = kn_mat_bytes(w->dtype, GEMM_ROW_ALIGN, w->cols, w->group);
    int rows = GEMM_ROW_ALIGN;
    while (rows < share && (size_t)(rows / GEMM_ROW_ALIGN) * unit_bytes < chunk_bytes)
        rows *= 2;
    return rows;
}

static void gemm_set_part(void *arg, int i, int n)
{
    (void)n;
    struct gemm_set *s = arg;
    struct kn_scratch sc = {s->scratch ? s->scratch + (size_t)i * s->scratch_bytes : NULL,
                            s->scratch_bytes};
    int u, k = 0;
    while ((u = atomic_fetch_add_explicit(&s->next, 1, memory_order_relaxed)) <
           s->first[s->count]) {
        while (u >= s->first[k + 1])
            k++;
        const struct gemm_job *j = &s->j[k];
        int r0 = (u - s->first[k]) * j->chunk_rows, r1 = r0 + j->chunk_rows;
        j->ops->gemm(j->w, j->x, j->m, j->y, j->ldy, r0, r1 < j->w->rows ? r1 : j->w->rows,
                     s->scratch ? &sc : NULL);
    }
}

static void gemm_set_run(const struct wrk_model *m, struct gemm_set *s)
{
    if (!s->count)
        return;
    s->first[0] = 0;
    long work = 0;
    for (int k = 0; k < s->count; k++)
        work += (long)s->j[k].w->rows * s->j[k].w->cols;
    bool pooled = m->pool && work >= m->par_min_work;
    int threads = pooled ? wrk_pool_size(m->pool) : 1;
    for (int k = 0; k < s->count; k++) {
        struct gemm_job *j = &s->j[k];
        j->chunk_rows = gemm_chunk_rows(j->w, j->m, threads, m->chunk_bytes);
        s->first[k + 1] = s->first[k] + (j->w->rows + j->chunk_rows - 1) / j->chunk_rows;
    }
    atomic_store_explicit(&s->next, 0, memory_order_relaxed);
    s->scratch = m->gemm_scratch;
    s->scratch_bytes = m->gemm_scratch_bytes;
    if (pooled)
        wrk_pool_run(m->pool, gemm_set_part, s);
    else
        gemm_set_part(s, 0, 1);
}

/* Adds y = @w x (rows of @x: @n, of y: @ldy) to @s. */
static void gemm_set_add(const struct wrk_model *m, struct gemm_set *s, const struct kn_mat *w,
                         const struct kn_act *x, int n, float *y, int ldy)
{
    if (!s->j) { /* a set of its own few jobs */
        s->j = s->own;
        s->first = s->own_first;
        s->cap = GEMM_MAX_SET;
    }
    KN_ASSERT(s->count < s->cap);
    s->j[s->count++] = (struct gemm_job){m->ops, w, x, n, ldy, y, 0};
}

/* An empty set @s of up to @cap jobs in @jobs, their chunk starts in @first (cap + 1). */
static void gemm_set_over(struct gemm_set *s, struct gemm_job *jobs, int *first, int cap)
{
    memset(s, 0, sizeof(*s));
    s->j = jobs;
    s->first = first;
    s->cap = cap;
}

static void gemm(const struct wrk_model *m, const struct kn_mat *w, const struct kn_act *x, int n,
                 float *y, int ldy)
{
    struct gemm_set s = {0};
    gemm_set_add(m, &s, w, x, n, y, ldy);
    gemm_set_run(m, &s);
}

/* Attention of a chunk's tokens, each over its own sequence's KV cache, split over the pool. A
 * unit is one kernel call: a tile of up to KN_ATT_TILE queries of one sequence, some tokens times
 * the local query heads that read one KV head; units go round-robin to the threads (later tokens
 * read more keys, so neighbours differ in cost). */
struct att_job {
    const struct wrk_model *m;
    void *kv;
    uint32_t layer;
    /* the queries of our heads and their outputs, @hd floats a head, rows @q_stride and
     * @out_stride apart; the query heads a KV head serves; whether the values are the keys'
     * rows (latent attention: a head's output is over the whole row, of which the caller
     * keeps the latent part) */
    const float *q;
    float *out;
    size_t q_stride, out_stride;
    int hd, kv_mul;
    bool v_is_k;
};

static void att_part(void *arg, int ti, int tn)
{
    const struct att_job *j = arg;
    const struct wrk_model *m = j->m;
    const struct seg_plan *p = &m->plan;
    const struct wrk_layer *L = &m->layers[j->layer];
    const struct kn_att *opt = L->att_plain ? NULL : &L->att;
    struct kn_att with_sinks = L->att; /* a call's: the sinks of its first head on */
    int hd = j->hd, kv_mul = j->kv_mul, u = 0;
    float *scratch = m->scores + (size_t)ti * m->cfg.seq_len;
    for (int pi = 0; pi < m->n_pieces; pi++) {
        const struct wrk_piece *pc = &m->pieces[pi];
        const float *kc = seg_kv_keys(j->kv, j->layer), *vc = seg_kv_values(j->kv, j->layer);
        size_t bstride = seg_kv_block_floats(j->kv);
        for (int kv = p->kv0; kv < p->kv1; kv++) {
            /* our query heads [h0, h1) read KV head kv */
            int h0 = kv * kv_mul > p->q0 ? kv * kv_mul : p->q0;
            int h1 = (kv + 1) * kv_mul < p->q1 ? (kv + 1) * kv_mul : p->q1;
            size_t koff = (size_t)(kv - p->kv0) * kv_head_rows(m);
            struct kn_kv view = {kc + koff, (j->v_is_k ? kc : vc) + koff, pc->r.blocks, bstride,
                                 (size_t)hd};
            for (int h = h0; h < h1; h += KN_ATT_TILE) {
                int nh = h1 - h < KN_ATT_TILE ? h1 - h : KN_ATT_TILE, nt = KN_ATT_TILE / nh;
                size_t qoff = (size_t)(h - p->q0) * (size_t)hd;
                for (int t = 0; t < pc->r.n; t += nt, u++) {
                    if (u % tn != ti)
                        continue;
                    int mt = pc->r.n - t < nt ? pc->r.n - t : nt;
                    size_t r = (size_t)(pc->row0 + t);
                    if (L->sinks) {
                        with_sinks.sinks = L->sinks + (h - p->q0);
                        opt = &with_sinks;
                    }
                    m->ops->attention(j->out + r * j->out_stride + qoff, j->out_stride,
                                      j->q + r * j->q_stride + qoff, j->q_stride, mt, nh,
                                      pc->r.pos + t, &view, hd, scratch, opt);
                }
            }
        }
    }
}

static void observe(const struct wrk_model *m, uint32_t layer, enum wrk_site site, const float *x,
                    int n, int ld, int cols)
{
    if (m->observe)
        m->observe(m->observe_ctx, layer, site, x, n, ld, cols);
}

static int allreduce(struct wrk_model *m, float *buf, size_t n)
{
    return m->ar ? seg_ar_allreduce(m->ar, buf, n) : 0;
}

/* x = the embeddings of the chunk's tokens, times the config's scale where it has one. */
static void embed(struct wrk_model *m)
{
    const struct shlm_config *c = &m->cfg;
    int dim = (int)c->dim;
    for (int pi = 0; pi < m->n_pieces; pi++) {
        const struct wrk_piece *pc = &m->pieces[pi];
        for (int i = 0; i < pc->r.n; i++) {
            float *xi = m->x + (size_t)(pc->row0 + i) * dim;
            kn_mat_row(&m->embd, pc->r.tokens[i], xi);
            if (c->embd_scale > 0.0f)
                for (int j = 0; j < dim; j++)
                    xi[j] *= c->embd_scale;
        }
    }
}

/* Attention of the chunk's queries over their sequences' KV caches into att (latent attention:
 * of the absorbed queries into the latent outputs), on the pool or, below par_min_work, on the
 * caller. */
static void attend(const struct wrk_model *m, const struct row_job *rj)
{
    const struct wrk_mla *a = m->mla;
    int nq = m->plan.q1 - m->plan.q0;
    struct att_job aj;
    if (a)
        aj = (struct att_job){m,
                              rj->kv,
                              rj->layer,
                              a->qlat,
                              a->olat,
                              (size_t)(nq * a->lat),
                              (size_t)(nq * a->lat),
                              a->lat,
                              (int)m->cfg.n_heads,
                              true};
    else
        aj = (struct att_job){m,
                              rj->kv,
                              rj->layer,
                              m->q,
                              m->att + m->plan.o_pad,
                              (size_t)m->qd,
                              (size_t)m->o_cols,
                              (int)m->cfg.head_dim,
                              (int)(m->cfg.n_heads / m->cfg.n_kv_heads),
                              false};
    int hd = aj.hd;
    /* keys read by the chunk's queries times the head size, summed over our heads: below
     * the threshold (decode at a short context) one thread does it */
    long att_work = 0;
    for (int pi = 0; pi < m->n_pieces; pi++)
        att_work += (long)m->pieces[pi].r.n * (m->pieces[pi].r.pos + m->pieces[pi].r.n) * nq * hd;
    if (m->pool && att_work >= m->par_min_work)
        wrk_pool_run(m->pool, att_part, &aj);
    else
        att_part(&aj, 0, 1);
}

/* Each of our heads' attention output times sigmoid(its gate row . xb): a (heads x dim)
 * projection, one plain loop, no fan-out. */
static void head_gate(const struct wrk_model *m, const struct wrk_layer *L, int n)
{
    const struct seg_plan *p = &m->plan;
    int dim = (int)m->cfg.dim, hd = (int)m->cfg.head_dim, nq = p->q1 - p->q0;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < nq; h++) {
            const float *gw = L->head_gate + (size_t)h * dim, *xi = m->xb + (size_t)i * dim;
            float gs = 0.0f;
            for (int j = 0; j < dim; j++)
                gs += gw[j] * xi[j];
            gs = 1.0f / (1.0f + expf(-gs));
            float *oh = m->att + (size_t)i * m->o_cols + p->o_pad + (size_t)h * hd;
            for (int j = 0; j < hd; j++)
                oh[j] *= gs;
        }
}

static int reduce_add(struct wrk_model *m, int n, const float *bias, const float *post_norm);

/* x += @w times the prepared rows @a, summed over the ranks (through xb), plus @bias where the
 * layer has one (gpt-oss's O), RMS-normed with @post_norm where the layer has one (Gemma 2/3: on
 * the whole sum, so every rank norms the same rows), times the config's residual multiplier
 * (Granite): a block's output projection (O or down) added to the residual stream. Returns 0 or the
 * all-reduce's error. */
static int residual_add(struct wrk_model *m, const struct kn_mat *w, const struct kn_act *a, int n,
                        const float *bias, const float *post_norm)
{
    gemm(m, w, a, n, m->xb, (int)m->cfg.dim);
    return reduce_add(m, n, bias, post_norm);
}

/* The tail of residual_add() for the @n rows of partial sums in xb. */
static int reduce_add(struct wrk_model *m, int n, const float *bias, const float *post_norm)
{
    int dim = (int)m->cfg.dim, rc;
    if ((rc = allreduce(m, m->xb, (size_t)n * dim)))
        return rc;
    if (bias) /* replicated: each rank adds it to the same sum */
        for (int i = 0; i < n; i++)
            add_rows(m->xb + (size_t)i * dim, bias, (size_t)dim);
    if (post_norm)
        for (int i = 0; i < n; i++)
            m->ops->rmsnorm(m->xb + (size_t)i * dim, m->xb + (size_t)i * dim, post_norm, dim,
                            m->cfg.norm_eps);
    if (m->cfgx.resid_mult != 0.0f) /* Granite's residual_multiplier */
        for (size_t i = 0; i < (size_t)n * dim; i++)
            m->xb[i] *= m->cfgx.resid_mult;
    add_rows(m->x, m->xb, (size_t)n * dim);
    return 0;
}

/* xb = rmsnorm(x) of the chunk of @rj with layer rj->L's attention norm, and its activations:
 * the input of the attention block's products */
static void attention_in(struct wrk_model *m, struct row_job *rj)
{
    rj->row = row_norm_prepare;
    rj->norm = rj->L->attn_norm;
    rj->a = m->a_dim;
    rows_run(m, rj);
    observe(m, rj->layer, WRK_SITE_QKV, m->xb, rj->n, (int)m->cfg.dim, (int)m->cfg.dim);
}

/* x += O(att) of the chunk of @rj: the tail of an attention block. Returns 0 or the
 * all-reduce's error. */
static int attention_out(struct wrk_model *m, struct row_job *rj)
{
    const struct wrk_layer *L = rj->L;
    int n = rj->n;
    observe(m, rj->layer, WRK_SITE_O, m->att + m->plan.o_pad, n, m->o_cols, m->od);
    rj->row = row_prepare;
    rj->src = m->att;
    rj->k = m->o_cols;
    rj->a = m->a_o;
    rows_run(m, rj);
    return residual_add(m, &L->o, m->a_o, n, L->o_bias, L->attn_post_norm);
}

/* The attention block of layer rj->L over the chunk of @rj: xb = rmsnorm(x), q/k/v, RoPE and the
 * KV append, attention (times the head gates where the layer has them), then x += O(att).
 * Returns 0 or the all-reduce's error. */
static int attention_block(struct wrk_model *m, struct row_job *rj)
{
    const struct wrk_layer *L = rj->L;
    int n = rj->n;
    attention_in(m, rj);
    struct gemm_set qkv = {0};
    gemm_set_add(m, &qkv, &L->q, m->a_dim, n, m->q, m->qd);
    gemm_set_add(m, &qkv, &L->k, m->a_dim, n, m->k, m->kvd);
    gemm_set_add(m, &qkv, &L->v, m->a_dim, n, m->v, m->kvd);
    gemm_set_run(m, &qkv);
    rj->row = row_rope_kv;
    rows_run(m, rj);
    attend(m, rj);
    if (L->head_gate)
        head_gate(m, L, n);
    return attention_out(m, rj);
}

/* the activations of row i's latent outputs of our heads (the inputs of their value matrices) */
static void row_latent_prepare(const struct row_job *j, int i)
{
    const struct wrk_model *m = j->m;
    const struct wrk_mla *a = m->mla;
    for (int h = 0; h < a->nq; h++)
        m->ops->act_prepare(&a->a_ol[(size_t)h * (size_t)m->max_m + (size_t)i],
                            a->olat + ((size_t)i * (size_t)a->nq + (size_t)h) * (size_t)a->lat);
}

/* One product per head of our heads in one dispatch: head h's matrix @w[h] times its @n
 * prepared rows @x + h max_m into @y + h @y_head (rows @ldy apart). */
static void heads_gemm(const struct wrk_model *m, const struct kn_mat *w, const struct kn_act *x,
                       int n, float *y, size_t y_head, int ldy)
{
    struct wrk_mla *a = m->mla;
    struct gemm_set s;
    gemm_set_over(&s, a->jobs, a->jobs_first, a->nq);
    for (int h = 0; h < a->nq; h++)
        gemm_set_add(m, &s, &w[h], x + (size_t)h * (size_t)m->max_m, n, y + (size_t)h * y_head,
                     ldy);
    gemm_set_run(m, &s);
}

/* The latent-attention block of layer rj->L (DeepSeek) over the chunk of @rj: xb = rmsnorm(x);
 * q (through its bottleneck and norm where there is one), the latent and RoPE key; the latent
 * normed, RoPE on the keys' and the queries' roped parts, the cache append (row_mla_kv); each
 * head's nope query absorbed into the latent (q_nope . W_UK^T: attn_k_b); attention of every
 * head over the one cached row a token (scores q_lat . c + q_rope . k_rope, values the latent
 * c); each head's latent output through its value matrix (attn_v_b) into att; then x += O(att).
 * Returns 0 or the all-reduce's error. */
static int mla_attention_block(struct wrk_model *m, struct row_job *rj)
{
    const struct wrk_layer *L = rj->L;
    struct wrk_mla *a = m->mla;
    int n = rj->n;
    attention_in(m, rj);
    struct gemm_set qkv = {0};
    bool bottleneck = m->cfgx.q_lora_rank != 0;
    if (bottleneck)
        gemm_set_add(m, &qkv, &L->q_a, m->a_dim, n, a->qa, (int)m->cfgx.q_lora_rank);
    else
        gemm_set_add(m, &qkv, &L->q, m->a_dim, n, m->q, m->qd);
    gemm_set_add(m, &qkv, &L->kv_a, m->a_dim, n, m->k, m->kvd);
    gemm_set_run(m, &qkv);
    if (bottleneck) {
        rj->row = row_qa_prepare;
        rows_run(m, rj);
        gemm(m, &L->q_b, a->a_qa, n, m->q, m->qd);
    }
    rj->row = row_mla_kv;
    rows_run(m, rj);
    heads_gemm(m, L->k_b_head, a->a_qn, n, a->qlat, (size_t)a->lat, a->nq * a->lat);
    attend(m, rj);
    rj->row = row_latent_prepare;
    rows_run(m, rj);
    heads_gemm(m, L->v_b_head, a->a_ol, n, m->att + m->plan.o_pad, (size_t)a->vd, m->o_cols);
    return attention_out(m, rj);
}

/* The FFN block of layer rj->L over the chunk of @rj: xb = rmsnorm(x), gate and up,
 * hb = act(gate) * up, then x += down(hb). Returns 0 or the all-reduce's error. */
static int ffn_block(struct wrk_model *m, struct row_job *rj)
{
    const struct wrk_layer *L = rj->L;
    int n = rj->n;
    rj->row = row_norm_prepare;
    rj->norm = L->ffn_norm;
    rj->a = m->a_dim;
    rows_run(m, rj);
    observe(m, rj->layer, WRK_SITE_GATE_UP, m->xb, n, (int)m->cfg.dim, (int)m->cfg.dim);
    struct gemm_set gate_up = {0};
    gemm_set_add(m, &gate_up, &L->gate, m->a_dim, n, m->hb + m->plan.down_pad, m->down_cols);
    gemm_set_add(m, &gate_up, &L->up, m->a_dim, n, m->hb2, m->ffn);
    gemm_set_run(m, &gate_up);
    rj->row = row_act_prepare;
    rj->a = m->a_down;
    rows_run(m, rj);
    observe(m, rj->layer, WRK_SITE_DOWN, m->hb + m->plan.down_pad, n, m->down_cols, m->ffn);
    return residual_add(m, &L->down, m->a_down, n, NULL, L->ffn_post_norm);
}

/* (model.h) */
void wrk_route(const struct shlm_config_ext *x, const float *lg, const float *sel, int *choice,
               float *weight)
{
    int ne = (int)x->n_experts, k = (int)x->n_experts_used;
    float p[SHLM_MAX_EXPERTS], s[SHLM_MAX_EXPERTS];
    bool taken[SHLM_MAX_EXPERTS] = {false};
    bool sigmoid = x->moe_route == SHLM_ROUTE_SIGMOID || x->moe_route == SHLM_ROUTE_SIGMOID_NORM;
    if (sigmoid) {
        for (int e = 0; e < ne; e++)
            p[e] = 1.0f / (1.0f + expf(-lg[e]));
    } else {
        float mx = lg[0], sum = 0.0f;
        for (int e = 1; e < ne; e++)
            mx = lg[e] > mx ? lg[e] : mx;
        for (int e = 0; e < ne; e++) {
            p[e] = expf(lg[e] - mx);
            sum += p[e];
        }
        float inv = 1.0f / sum;
        for (int e = 0; e < ne; e++)
            p[e] *= inv;
    }
    for (int e = 0; e < ne; e++)
        s[e] = sel ? p[e] + sel[e] : p[e];
    if (x->n_groups) { /* the experts of the groups not among the best are out */
        int ng = (int)x->n_groups, per = ne / ng;
        float gs[SHLM_MAX_EXPERTS];
        bool gtaken[SHLM_MAX_EXPERTS] = {false};
        for (int g = 0; g < ng; g++) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++)
                if (s[e] >= b1) {
                    b2 = b1;
                    b1 = s[e];
                } else if (s[e] > b2)
                    b2 = s[e];
            gs[g] = sigmoid ? b1 + b2 : b1;
        }
        for (int j = 0; j < (int)x->topk_groups; j++) {
            int best = -1;
            for (int g = 0; g < ng; g++)
                if (!gtaken[g] && (best < 0 || gs[g] >= gs[best]))
                    best = g;
            gtaken[best] = true;
        }
        for (int e = 0; e < ne; e++)
            taken[e] = !gtaken[e / per];
    }
    float chosen = 0.0f;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < ne; e++)
            if (!taken[e] && (best < 0 || s[e] >= s[best]))
                best = e;
        taken[best] = true;
        choice[j] = best;
        weight[j] = p[best];
        chosen += p[best];
    }
    if (x->moe_route == SHLM_ROUTE_SOFTMAX_NORM || x->moe_route == SHLM_ROUTE_SIGMOID_NORM)
        for (int j = 0; j < k; j++)
            weight[j] /= chosen;
    if (x->route_scale != 0.0f)
        for (int j = 0; j < k; j++)
            weight[j] *= x->route_scale;
}

/* xb = rmsnorm(x) and its activations (row_norm_prepare), then the router's logits of row i and
 * its experts (route) */
static void row_norm_route(const struct row_job *j, int i)
{
    const struct wrk_model *m = j->m;
    const struct wrk_moe *e = m->moe;
    int ne = (int)m->cfgx.n_experts;
    row_norm_prepare(j, i);
    float *lg = e->logits + (size_t)i * ne;
    m->ops->gemm(&j->L->router, &j->a[i], 1, lg, ne, 0, ne, NULL);
    if (j->L->router_bias)
        add_rows(lg, j->L->router_bias, (size_t)ne);
    wrk_route(&m->cfgx, lg, j->L->sel_bias, e->choice + (size_t)i * e->k,
              e->weight + (size_t)i * e->k);
}

/* pair j->first + i's act(gate + its bias) * (up + its bias) (biases: gpt-oss's), and its
 * activations (the inputs of its expert's down) */
static void pair_act_prepare(const struct row_job *j, int i)
{
    const struct wrk_model *m = j->m;
    i += j->first;
    const struct wrk_moe *e = m->moe;
    float *h = e->gate + (size_t)i * m->edown_cols, *up = e->up + (size_t)i * m->effn;
    if (j->L->gate_exp_bias) {
        int x = e->pair_exp[i];
        add_rows(h + m->plan.down_pad_exp, j->L->gate_exp_bias[x], (size_t)m->effn);
        add_rows(up, j->L->up_exp_bias[x], (size_t)m->effn);
    }
    act_mul(m, h + m->plan.down_pad_exp, up, m->effn);
    m->ops->act_prepare(&e->a_down[i], h);
}

/* xb's row i = the weighted sum of its experts' down outputs (plus their down biases:
 * gpt-oss's), in the order of its choices, plus the shared experts' output (DeepSeek): of those
 * this rank holds (all but with expert-parallel experts, whose other ranks add theirs in the
 * all-reduce). A bias is whole on every rank that holds its expert: with tensor-parallel experts
 * rank 0 adds it. */
static void row_combine(const struct row_job *j, int i)
{
    const struct wrk_model *m = j->m;
    const struct wrk_moe *e = m->moe;
    int dim = (int)m->cfg.dim, k = e->k;
    bool biases = j->L->down_exp_bias && (m->plan.experts == SEG_EXPERTS_EP || m->plan.rank == 0);
    float *y = m->xb + (size_t)i * dim;
    memset(y, 0, (size_t)dim * sizeof(float));
    for (int c = 0; c < k; c++) {
        int x = e->choice[i * k + c];
        if (x < m->plan.x0 || x >= m->plan.x1)
            continue;
        const float *o = e->out + (size_t)e->row_pair[i * k + c] * dim;
        const float *b = biases ? j->L->down_exp_bias[x] : NULL;
        float w = e->weight[i * k + c];
        for (int d = 0; d < dim; d++)
            y[d] += w * (b ? o[d] + b[d] : o[d]);
    }
    if (j->L->down_sh.rows) /* the shared experts' (this rank's units' partial sum) */
        add_rows(y, e->sh_out + (size_t)i * dim, (size_t)dim);
}

/* the shared experts' hb = act(gate) * up of row i, and its activations (the input of their
 * down) */
static void row_shared_prepare(const struct row_job *j, int i)
{
    const struct wrk_model *m = j->m;
    const struct wrk_moe *e = m->moe;
    float *h = e->sh_gate + (size_t)i * m->sdown_cols;
    act_mul(m, h + m->plan.down_pad_sh, e->sh_up + (size_t)i * m->sffn, m->sffn);
    m->ops->act_prepare(&e->a_sh[i], h);
}

/* The chunk's @n rows' choices as pairs grouped by expert (a counting sort: within an expert,
 * the rows in order), each pair's input the row's prepared activations. */
static void moe_group(struct wrk_model *m, int n)
{
    struct wrk_moe *e = m->moe;
    int ne = (int)m->cfgx.n_experts, k = e->k;
    memset(e->first, 0, (size_t)(ne + 1) * sizeof(int));
    for (int i = 0; i < n * k; i++)
        e->first[e->choice[i] + 1]++;
    for (int x = 0; x < ne; x++)
        e->first[x + 1] += e->first[x];
    for (int i = 0; i < n; i++)
        for (int j = 0; j < k; j++) {
            int x = e->choice[i * k + j], pair = e->first[x]++;
            e->row_pair[i * k + j] = pair;
            e->pair_row[pair] = i;
            e->pair_exp[pair] = x;
            e->a_in[pair] = m->a_dim[i];
        }
    for (int x = ne; x > 0; x--) /* first[x] went to first[x + 1]: back one */
        e->first[x] = e->first[x - 1];
    e->first[0] = 0;
}

/* The MoE FFN block of layer rj->L over the chunk of @rj: xb = rmsnorm(x), the router and each
 * row's experts, gate and up of every chosen expert over the rows that chose it in one set of
 * products (each expert's weights read once; the shared experts' over every row with them),
 * act(gate) * up of every pair, down likewise, then x += the pairs' down outputs weighted by the
 * router (plus the shared experts' output), summed over the ranks. Only the chosen
 * experts' weights are read. Returns 0 or the all-reduce's error. */
static int moe_block(struct wrk_model *m, struct row_job *rj)
{
    const struct wrk_layer *L = rj->L;
    struct wrk_moe *e = m->moe;
    int n = rj->n, ne = (int)m->cfgx.n_experts, dim = (int)m->cfg.dim;
    rj->row = row_norm_route;
    rj->norm = L->ffn_norm;
    rj->a = m->a_dim;
    rows_run(m, rj);
    if (m->route_observe)
        m->route_observe(m->observe_ctx, rj->layer, e->choice, n, e->k);
    moe_group(m, n);
    /* the experts this rank holds (expert-parallel: its own; their pairs are consecutive) */
    int x0 = m->plan.x0, x1 = m->plan.x1, pairs = e->first[x1] - e->first[x0];
    struct gemm_set s;
    bool shared = L->down_sh.rows != 0;
    gemm_set_over(&s, e->jobs, e->jobs_first, 2 * ne + 2);
    if (shared) { /* every row's, in the same dispatch */
        gemm_set_add(m, &s, &L->gate_sh, m->a_dim, n, e->sh_gate + m->plan.down_pad_sh,
                     m->sdown_cols);
        gemm_set_add(m, &s, &L->up_sh, m->a_dim, n, e->sh_up, m->sffn);
    }
    for (int x = x0; x < x1; x++) {
        int p0 = e->first[x], cnt = e->first[x + 1] - p0;
        if (!cnt)
            continue;
        gemm_set_add(m, &s, &L->gate_exp[x], e->a_in + p0, cnt,
                     e->gate + (size_t)p0 * m->edown_cols + m->plan.down_pad_exp, m->edown_cols);
        gemm_set_add(m, &s, &L->up_exp[x], e->a_in + p0, cnt, e->up + (size_t)p0 * m->effn,
                     m->effn);
        const struct kn_mat *w[] = {&L->gate_exp[x], &L->up_exp[x], &L->down_exp[x]};
        for (int i = 0; i < 3; i++)
            m->expert_bytes += kn_mat_bytes(w[i]->dtype, w[i]->rows, w[i]->cols, w[i]->group);
    }
    gemm_set_run(m, &s);
    /* a decode step's few pairs on this thread: a fan-out costs more than they do */
    struct row_job pj = {
        .m = m, .n = pairs, .row = pair_act_prepare, .L = L, .first = e->first[x0]};
    if (m->pool && (long)pairs * m->effn >= m->par_min_work)
        wrk_pool_run(m->pool, rows_part, &pj);
    else
        rows_part(&pj, 0, 1);
    if (shared) {
        rj->row = row_shared_prepare;
        rows_run(m, rj);
    }
    gemm_set_over(&s, e->jobs, e->jobs_first, 2 * ne + 2);
    if (shared)
        gemm_set_add(m, &s, &L->down_sh, e->a_sh, n, e->sh_out, dim);
    for (int x = x0; x < x1; x++) {
        int p0 = e->first[x], cnt = e->first[x + 1] - p0;
        if (cnt)
            gemm_set_add(m, &s, &L->down_exp[x], e->a_down + p0, cnt, e->out + (size_t)p0 * dim,
                         dim);
    }
    gemm_set_run(m, &s);
    rj->row = row_combine;
    rows_run(m, rj);
    return reduce_add(m, n, NULL, L->ffn_post_norm);
}

/* Rows [r0, r0 + k) of the head's wanted rows (m->head_row) through the output norm and the LM
 * head in one product: their logits rows are vocab apart from m->head_dst[r0]. */
static void head_rows(struct wrk_model *m, int r0, int k)
{
    const struct shlm_config *c = &m->cfg;
    size_t dim = c->dim;
    for (int j = 0; j < k; j++) {
        float *xb = m->xb + (size_t)j * dim;
        m->ops->rmsnorm(xb, m->x + (size_t)m->head_row[r0 + j] * dim, m->out_norm, (int)dim,
                        c->norm_eps);
        m->a_dim[j].parts = m->parts_head;
        m->ops->act_prepare(&m->a_dim[j], xb);
    }
    observe(m, c->n_layers, WRK_SITE_HEAD, m->xb, k, (int)dim, (int)dim);
    gemm(m, &m->head, m->a_dim, k, m->head_dst[r0] + m->plan.v0, (int)c->vocab_size);
    if (m->cfgx.logit_scale != 0.0f) /* Granite's logits_scaling divides them */
        for (int j = 0; j < k; j++) {
            float *y = m->head_dst[r0] + (size_t)j * c->vocab_size;
            for (int v = m->plan.v0; v < m->plan.v1; v++)
                y[v] /= m->cfgx.logit_scale;
        }
    if (m->cfgx.final_softcap > 0.0f) /* elementwise: each rank caps its own columns */
        for (int j = 0; j < k; j++)
            m->ops->softcap(m->head_dst[r0] + (size_t)j * c->vocab_size + m->plan.v0,
                            m->plan.v1 - m->plan.v0, m->cfgx.final_softcap);
}

/* This rank's columns [v0, v1) of the logits the chunk's pieces ask for (a piece's last token
 * where it ends its sequence's part of the step, every token of an all-logits piece), one row
 * of vocab each: the LM head reads its weights once for every run of rows whose logits are
 * consecutive rows (a step's decodes, an all-logits piece). */
static void head_logits(struct wrk_model *m)
{
    size_t vocab = m->cfg.vocab_size;
    int k = 0;
    for (int pi = 0; pi < m->n_pieces; pi++) {
        const struct wrk_piece *pc = &m->pieces[pi];
        if (!pc->r.logits)
            continue;
        for (int i = pc->r.all_logits ? 0 : pc->r.n - 1; i < pc->r.n; i++, k++) {
            m->head_row[k] = pc->row0 + i;
            m->head_dst[k] = pc->r.logits + (size_t)(pc->r.all_logits ? i : 0) * vocab;
        }
    }
    for (int r0 = 0, j = 1; r0 < k; j++)
        if (j == k || m->head_dst[j] != m->head_dst[r0] + (size_t)(j - r0) * vocab) {
            head_rows(m, r0, j - r0);
            r0 = j;
        }
}

/* One chunk: the pieces m->pieces[0 .. n_pieces) hold its @n <= max_m tokens; the embeddings,
 * each layer's attention and FFN blocks over all of them (every weight read once), then the
 * head for the rows that want logits. Returns 0 or the all-reduce's error. */
static int forward_chunk(struct wrk_model *m, void *kv, int n)
{
    int rc;
    for (int pi = 0; pi < m->n_pieces; pi++)
        for (int i = 0; i < m->pieces[pi].r.n; i++)
            m->row_piece[m->pieces[pi].row0 + i] = pi;
    embed(m);
    for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
        struct row_job rj = {.m = m, .n = n, .L = &m->layers[l], .kv = kv, .layer = l};
        if ((rc = m->mla ? mla_attention_block(m, &rj) : attention_block(m, &rj)) ||
            (rc = m->layers[l].gate_exp ? moe_block(m, &rj) : ffn_block(m, &rj)))
            return rc;
    }
    head_logits(m);
    return 0;
}

int wrk_forward_batch(struct wrk_model *m, void *kv, const struct wrk_run *runs, int n_runs)
{
    size_t vocab = m->cfg.vocab_size;
    int rows = 0, rc;
    m->expert_bytes = 0;
    m->n_pieces = 0;
    for (int r = 0; r < n_runs; r++) {
        const struct wrk_run *q = &runs[r];
        for (int done = 0; done < q->n;) {
            if (rows == m->max_m) {
                if ((rc = forward_chunk(m, kv, rows)))
                    return rc;
                rows = m->n_pieces = 0;
            }
            int take = q->n - done < m->max_m - rows ? q->n - done : m->max_m - rows;
            struct wrk_piece *pc = &m->pieces[m->n_pieces++];
            /* a part of the run: logits only from its final part unless all rows are wanted */
            *pc = (struct wrk_piece){
                {q->seq, q->tokens + done, take, q->pos + done, q->blocks, NULL, q->all_logits},
                rows};
            if (q->all_logits)
                pc->r.logits = q->logits + (size_t)done * vocab;
            else if (done + take == q->n)
                pc->r.logits = q->logits;
            rows += take;
            done += take;
        }
    }
    return rows ? forward_chunk(m, kv, rows) : 0;
}

int wrk_forward(struct wrk_model *m, void *kv, const uint32_t *blocks, const int32_t *tokens, int n,
                int pos, float *logits, bool all_logits)
{
    struct wrk_run r = {0, tokens, n, pos, blocks, logits, all_logits};
    return wrk_forward_batch(m, kv, &r, 1);
}
