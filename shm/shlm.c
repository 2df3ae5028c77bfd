/* SPDX-License-Identifier: MIT */
/* shm/shlm.c: the .shlm format - hashing, layout of the expected tensors, and a parser that trusts
 * nothing. */
#include "shlm.h"

#include "plan.h"
#include "tensors.h"

#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FNV_PRIME 0x100000001b3ull

static uint64_t hash_word(uint64_t h, uint64_t w)
{
    h = (h ^ w) * FNV_PRIME;
    return h ^ (h >> 29);
}

uint64_t shlm_fnv1a(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * FNV_PRIME;
    return h;
}

void shlm_hash_init(struct shlm_hasher *s)
{
    memset(s, 0, sizeof(*s));
    s->h = SHLM_FNV_OFFSET;
}

void shlm_hash_update(struct shlm_hasher *s, const void *p, size_t n)
{
    const uint8_t *b = p;
    s->n += n;
    /* complete the word a previous piece began (npart < 8 always: said for -O3's bounds check) */
    while (s->npart > 0 && s->npart < 8 && n) {
        s->part[s->npart++] = *b++;
        n--;
        if (s->npart == 8) {
            uint64_t w;
            memcpy(&w, s->part, 8);
            s->h = hash_word(s->h, w);
            s->npart = 0;
        }
    }
    uint64_t h = s->h;
    for (; n >= 8; b += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, b, 8);
        h = hash_word(h, w);
    }
    s->h = h;
    memcpy(s->part + s->npart, b, n);
    s->npart += (unsigned)n;
}

uint64_t shlm_hash_final(const struct shlm_hasher *s)
{
    return shlm_fnv1a(s->h, s->part, s->npart) ^ s->n; /* the tail bytes one by one */
}

uint64_t shlm_hash(const void *p, size_t n)
{
    struct shlm_hasher s;
    shlm_hash_init(&s);
    shlm_hash_update(&s, p, n);
    return shlm_hash_final(&s);
}

static const char *const scheme_names[] = {"f32", "bf16", "w4a16", "w4a8"};

const char *shlm_scheme_name(enum shlm_scheme s)
{
    return (unsigned)s < 4 ? scheme_names[s] : "?";
}

int shlm_scheme_parse(const char *name, enum shlm_scheme *out)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(name, scheme_names[i]) == 0) {
            *out = (enum shlm_scheme)i;
            return 0;
        }
    return -EINVAL;
}

int shlm_config_check(const struct shlm_config *c, struct shardlm_err *e)
{
#define CHECK(cond, field, expect)                                                                 \
    if (!(cond))                                                                                   \
    return shardlm_fail(e, -EINVAL, "config field %s: expected %s", field, expect)
    CHECK(c->arch == SHLM_ARCH_LLAMA, "arch", "1 (llama)");
    CHECK(c->dim >= 1 && c->dim <= 65536, "dim", "1..65536");
    CHECK(c->hidden_dim >= 1 && c->hidden_dim <= 1u << 20, "hidden_dim", "1..1048576");
    CHECK(c->n_layers >= 1 && c->n_layers <= 1024, "n_layers", "1..1024");
    CHECK(c->n_heads >= 1 && c->n_heads <= 1024, "n_heads", "1..1024");
    CHECK(c->n_kv_heads >= 1 && c->n_kv_heads <= c->n_heads && c->n_heads % c->n_kv_heads == 0,
          "n_kv_heads", "a divisor of n_heads");
    CHECK(c->head_dim >= 2 && c->head_dim <= 1024 && c->head_dim % 2 == 0, "head_dim",
          "an even number 2..1024");
    CHECK(c->vocab_size >= 1 && c->vocab_size <= 1u << 22, "vocab_size", "1..4194304");
    CHECK(c->seq_len >= 1 && c->seq_len <= 1u << 20, "seq_len", "1..1048576");
    CHECK(isfinite(c->norm_eps) && c->norm_eps > 0.0f && c->norm_eps < 1.0f, "norm_eps",
          "a number in (0, 1)");
    CHECK(isfinite(c->rope_theta) && c->rope_theta > 1.0f, "rope_theta", "a number above 1");
    CHECK(c->rope_neox <= 1, "rope_neox", "0 or 1");
    CHECK(c->act <= SHLM_ACT_SWIGLU_OAI, "act", "0 (silu), 1 (gelu-tanh) or 2 (swiglu-oai)");
    CHECK(c->tied_embd <= 1, "tied_embd", "0 or 1");
    CHECK(c->rope_scaling <= SHLM_ROPE_LINEAR, "rope_scaling",
          "0 (none), 1 (llama3), 2 (yarn), 3 (longrope), 4 (rope_freqs) or 5 (linear)");
    CHECK(c->rope_scaling != SHLM_ROPE_LLAMA3 ||
              (isfinite(c->rope_factor) && c->rope_factor >= 1.0f && c->rope_factor <= 1024.0f &&
               isfinite(c->rope_low_freq_factor) && c->rope_low_freq_factor > 0.0f &&
               isfinite(c->rope_high_freq_factor) &&
               c->rope_high_freq_factor > c->rope_low_freq_factor && c->rope_orig_ctx >= 1 &&
               c->rope_orig_ctx <= 1u << 24),
          "rope_factor/low/high/orig_ctx", "factor 1..1024, 0 < low < high, orig_ctx 1..2^24");
    CHECK(c->rope_scaling != SHLM_ROPE_YARN ||
              (isfinite(c->rope_factor) && c->rope_factor >= 1.0f && c->rope_factor <= 1024.0f &&
               c->rope_orig_ctx >= 1 && c->rope_orig_ctx <= 1u << 24),
          "rope_factor/orig_ctx", "YaRN factor 1..1024, orig_ctx 1..2^24");
    CHECK(c->rope_scaling != SHLM_ROPE_LINEAR ||
              (isfinite(c->rope_factor) && c->rope_factor >= 1.0f && c->rope_factor <= 1024.0f),
          "rope_factor", "linear factor 1..1024");
    /* LongRoPE's attention factor divides by ln(orig_ctx) */
    CHECK(c->rope_scaling != SHLM_ROPE_LONGROPE ||
              (c->rope_orig_ctx >= 2 && c->rope_orig_ctx <= 1u << 24),
          "rope_orig_ctx", "LongRoPE's original context 2..2^24");
    CHECK(c->qkv_bias <= 1, "qkv_bias", "0 or 1");
    CHECK(c->head_gate <= 1, "head_gate", "0 or 1");
    CHECK(c->embd_scale == 0.0f || (isfinite(c->embd_scale) && c->embd_scale > 0.0f &&
                                    c->embd_scale < 65536.0f),
          "embd_scale", "0 (none) or a positive number");
    CHECK(!(c->flags & ~(uint32_t)SHLM_CF_IMPLEMENTED), "flags",
          "a set of 1 (qk-norm), 2 (post-norms), 4 (attention sinks), 8 (output bias), 16 "
          "(MoE biases) and 32 (selection bias)");
    CHECK(c->family < SHLM_FAMILY_COUNT, "family", "an architecture of tensors.h");
#undef CHECK
    return 0;
}

int shlm_config_ext_check(const struct shlm_config *c, const struct shlm_config_ext *x,
                          struct shardlm_err *e)
{
    /* every field is implemented: 0 is the plain behaviour, a real otherwise finite in its range
     * (lo exclusive), an integer any value (window_pattern checked below) */
    static const struct {
        const char *name;
        size_t off;
        float lo, hi;
    } reals[] = {
#define REAL(f, lo, hi) {#f, offsetof(struct shlm_config_ext, f), lo, hi}
        REAL(attn_softcap, 0.0f, 1e30f),    REAL(final_softcap, 0.0f, 1e30f),
        REAL(query_scale, 0.0f, 1e6f),      REAL(rope_theta_local, 0.0f, 1e30f),
        REAL(resid_mult, -1e6f, 1e6f),      REAL(logit_scale, 0.0f, 1e6f),
        REAL(yarn_beta_fast, 0.0f, 1e6f),   REAL(yarn_beta_slow, 0.0f, 1e6f),
        REAL(rope_attn_factor, 0.0f, 1e6f), REAL(route_scale, 0.0f, 1e6f),
#undef REAL
    };
    for (size_t i = 0; i < sizeof(reals) / sizeof(reals[0]); i++) {
        float f;
        memcpy(&f, (const uint8_t *)x + reals[i].off, 4);
        if (f != 0.0f && !(isfinite(f) && f > reals[i].lo && f <= reals[i].hi))
            return shardlm_fail(e, -EINVAL,
                                "config field %s is %g: expected 0 or a number in (%g, %g]",
                                reals[i].name, (double)f, (double)reals[i].lo, (double)reals[i].hi);
    }
    if (x->yarn_exact > 1)
        return shardlm_fail(e, -EINVAL, "config field yarn_exact is %u, expected 0 or 1",
                            x->yarn_exact);
    if (x->window_pattern == 1 || (x->window_pattern && !x->window))
        return shardlm_fail(e, -EINVAL,
                            "config field window_pattern is %u, expected 0 or 2.. with a window",
                            x->window_pattern);
    if (x->n_experts > SHLM_MAX_EXPERTS || x->moe_route >= SHLM_ROUTE_COUNT ||
        (x->n_experts &&
         (x->n_experts_used < 1 || x->n_experts_used > x->n_experts || x->n_experts_used > 64 ||
          x->expert_ffn < 1 || x->expert_ffn > (1u << 20) || !x->moe_route)) ||
        (!x->n_experts &&
         (x->n_experts_used || x->expert_ffn || x->moe_route || x->moe_dense_first)))
        return shardlm_fail(e, -EINVAL,
                            "config fields n_experts/n_experts_used/expert_ffn/moe_route/"
                            "moe_dense_first are %u/%u/%u/%u/%u: expected 0 (dense, all five) or "
                            "1..%d experts, 1..64 of them used (at most all), 1..2^20 units each "
                            "and a routing rule 1..%d",
                            x->n_experts, x->n_experts_used, x->expert_ffn, x->moe_route,
                            x->moe_dense_first, SHLM_MAX_EXPERTS, SHLM_ROUTE_COUNT - 1);
    if ((c->flags & SHLM_CF_SEL_BIAS) && !x->n_experts)
        return shardlm_fail(e, -EINVAL,
                            "config field flags: a selection bias without experts (expected "
                            "none on a dense model)");
    if (x->shared_ffn > (1u << 20) || (x->shared_ffn && !x->n_experts) ||
        (x->route_scale != 0.0f && !x->n_experts))
        return shardlm_fail(e, -EINVAL,
                            "config fields shared_ffn/route_scale are %u/%g: expected 0 without "
                            "experts, shared_ffn at most 2^20",
                            x->shared_ffn, (double)x->route_scale);
    if (x->n_groups || x->topk_groups) {
        if (!x->n_experts || x->n_groups < 2 || x->n_experts % x->n_groups || x->topk_groups < 1 ||
            x->topk_groups > x->n_groups ||
            x->topk_groups * (x->n_experts / x->n_groups) < x->n_experts_used)
            return shardlm_fail(e, -EINVAL,
                                "config fields n_groups/topk_groups are %u/%u: expected 0/0 or "
                                "2.. groups dividing the %u experts, 1..n_groups of them holding "
                                "at least the %u used",
                                x->n_groups, x->topk_groups, x->n_experts, x->n_experts_used);
    }
    if (x->kv_lora_rank || x->q_lora_rank || x->rope_dim || x->v_head_dim) {
        /* the latent's and a value's rows whole tile blocks (per-head views of attn_k_b and
         * attn_v_b in the tiled layout) */
        uint32_t hd = c->head_dim;
        if (x->kv_lora_rank < 16 || x->kv_lora_rank > 4096 || x->kv_lora_rank % 16 ||
            x->rope_dim < 2 || x->rope_dim >= hd || x->rope_dim % 2 ||
            x->kv_lora_rank + x->rope_dim > KN_MAX_HEAD_DIM || x->v_head_dim < 16 ||
            x->v_head_dim > 1024 || x->v_head_dim % 16 || x->q_lora_rank > 65536 ||
            c->n_kv_heads != c->n_heads)
            return shardlm_fail(e, -EINVAL,
                                "config fields q_lora_rank/kv_lora_rank/rope_dim/v_head_dim are "
                                "%u/%u/%u/%u with head_dim %u and %u of %u heads for keys: "
                                "expected a latent rank 16..4096 and a value size 16..1024 "
                                "(multiples of 16), an even RoPE part below head_dim, latent and "
                                "RoPE part at most %d, q_lora_rank 0..65536, a key per head",
                                x->q_lora_rank, x->kv_lora_rank, x->rope_dim, x->v_head_dim, hd,
                                c->n_kv_heads, c->n_heads, KN_MAX_HEAD_DIM);
        /* what latent attention's block does not do: q/k biases and norms, head gates, sinks,
         * layers without RoPE, LongRoPE's factors (of head_dim / 2) */
        uint32_t other = SHLM_CF_QK_NORM | SHLM_CF_ATTN_SINKS;
        if (c->qkv_bias || c->head_gate || (c->flags & other) || x->nope_interval ||
            c->rope_scaling == SHLM_ROPE_LONGROPE)
            return shardlm_fail(e, -EINVAL,
                                "config fields: latent attention (kv_lora_rank %u) with q/k/v "
                                "biases, head gates, q/k norms, sinks, layers without RoPE or "
                                "LongRoPE (expected none of them)",
                                x->kv_lora_rank);
    }
    if (x->n_groups &&
        (x->moe_route == SHLM_ROUTE_SIGMOID || x->moe_route == SHLM_ROUTE_SIGMOID_NORM) &&
        x->n_experts / x->n_groups < 2)
        return shardlm_fail(e, -EINVAL,
                            "config fields n_groups/topk_groups are %u/%u: sigmoid routing scores "
                            "a group by its two best experts, these groups hold %u",
                            x->n_groups, x->topk_groups, x->n_experts / x->n_groups);
    for (size_t i = 0; i < sizeof(x->reserved) / sizeof(x->reserved[0]); i++)
        if (x->reserved[i])
            return shardlm_fail(e, -EINVAL,
                                "config field reserved[%zu] is %u: made by a newer shardlm "
                                "(expected 0)",
                                i, x->reserved[i]);
    return 0;
}

int shlm_expected_tensors(const struct shlm_config *c, const struct shlm_config_ext *x,
                          enum shlm_scheme s, int group, int head_bits, const struct seg_plan *plan,
                          struct shlm_tensor_spec *out, int max)
{
    enum kn_dtype dt[4]; /* by enum shlm_dtc: matrices, embedding/head, f32, q8 */
    switch (s) {
    case SHLM_SCHEME_F32:
        dt[SHLM_DTC_MAT] = dt[SHLM_DTC_HEAD] = KN_DT_F32;
        break;
    case SHLM_SCHEME_BF16:
        dt[SHLM_DTC_MAT] = dt[SHLM_DTC_HEAD] = KN_DT_BF16;
        break;
    case SHLM_SCHEME_W4A16:
    case SHLM_SCHEME_W4A8:
        dt[SHLM_DTC_MAT] = s == SHLM_SCHEME_W4A16 ? KN_DT_W4A16 : KN_DT_W4A8;
        if (group < 32 || group > KN_MAX_GROUP || group % 32)
            return -EINVAL;
        if (head_bits != 8 && head_bits != 6 && head_bits != 4)
            return -EINVAL;
        dt[SHLM_DTC_HEAD] = head_bits == 8   ? KN_DT_Q8
                            : head_bits == 6 ? KN_DT_Q6
                                             : dt[SHLM_DTC_MAT];
        break;
    default:
        return -EINVAL;
    }
    dt[SHLM_DTC_F32] = KN_DT_F32;
    dt[SHLM_DTC_Q8] = kn_is_w4(dt[SHLM_DTC_MAT]) ? KN_DT_Q8 : dt[SHLM_DTC_MAT];
    /* the whole model is the plan of one rank */
    struct seg_plan whole;
    if (!plan) {
        if (seg_plan_make(&whole, c, x, 0, 1, 0))
            return -EINVAL;
        plan = &whole;
    }
    int n = 0;
    /* the global kinds, then each layer's (pass 0: globals; pass l + 1: layer l), an expert's
     * kind once per expert */
    for (uint32_t pass = 0; pass <= c->n_layers; pass++)
        for (int k = 0; k < SHLM_KIND_COUNT; k++) {
            const struct shlm_kind_traits *t = &shlm_kinds[k];
            uint32_t l = pass ? pass - 1 : 0;
            if (t->layer != (pass > 0) || !t->has(c, x, l))
                continue;
            uint32_t x0 = t->expert ? (uint32_t)plan->x0 : 0,
                     x1 = t->expert ? (uint32_t)plan->x1 : 1;
            for (uint32_t ex = x0; ex < x1; ex++) {
                if (n == max)
                    return -E2BIG;
                struct shlm_tensor_spec *o = &out[n++];
                shlm_kind_name((enum shlm_kind)k, l, ex, o->name, sizeof(o->name));
                o->kind = k;
                o->layer = l;
                o->expert = ex;
                o->dtype = dt[t->dtc];
                o->group = kn_is_w4(o->dtype) ? group : 0;
                o->rows = shlm_dim_size(c, x, t->rows);
                o->cols = shlm_dim_size(c, x, t->cols);
                /* a rank's part of the split size, behind its pad */
                int lo, hi, pad;
                if (t->split == SHLM_SPLIT_ROWS) {
                    shlm_dim_part(c, x, plan, t->rows, &lo, &hi, &pad);
                    o->rows = hi - lo;
                } else if (t->split != SHLM_SPLIT_NONE) {
                    shlm_dim_part(c, x, plan, t->cols, &lo, &hi, &pad);
                    o->cols = (t->split == SHLM_SPLIT_COLS_PADDED ? pad : 0) + hi - lo;
                }
            }
        }
    return n;
}

enum kn_dtype shlm_layout_dtype(enum kn_dtype dt, enum shlm_layout layout)
{
    if (layout != SHLM_LAYOUT_TILES)
        return dt;
    return dt == KN_DT_W4A8 ? KN_DT_W4A8_T : dt == KN_DT_W4A16 ? KN_DT_W4A16_T : dt;
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

void shlm_layout(struct shlm_header *h, struct shlm_tensor *table,
                 const struct shlm_tensor_spec *specs, int n, uint64_t tok_bytes)
{
    memcpy(h->magic, SHLM_MAGIC, sizeof(SHLM_MAGIC));
    h->version = SHLM_VERSION;
    h->header_bytes = sizeof(*h);
    h->n_tensors = (uint32_t)n;
    h->table_offset = sizeof(*h);
    h->tok_offset = h->table_offset + (uint64_t)n * sizeof(struct shlm_tensor);
    h->tok_bytes = tok_bytes;
    h->data_offset = align_up(h->tok_offset + tok_bytes, SHLM_ALIGN);
    uint64_t off = h->data_offset;
    for (int i = 0; i < n; i++) {
        struct shlm_tensor *t = &table[i];
        memset(t, 0, sizeof(*t));
        snprintf(t->name, sizeof(t->name), "%s", specs[i].name);
        t->dtype = (uint32_t)specs[i].dtype;
        t->group = (uint32_t)specs[i].group;
        t->rows = (uint32_t)specs[i].rows;
        t->cols = (uint32_t)specs[i].cols;
        t->bytes = kn_mat_bytes(specs[i].dtype, specs[i].rows, specs[i].cols, specs[i].group);
        t->offset = off;
        off = align_up(off + t->bytes, SHLM_ALIGN);
    }
    h->file_bytes = off;
}

void shlm_seal(struct shlm_header *h, const struct shlm_tensor *table)
{
    h->checksum = 0;
    h->checksum = shlm_hash(h, sizeof(*h)) ^ shlm_hash(table, h->n_tensors * sizeof(*table));
}

const struct shlm_tensor *shlm_find(const struct shlm_model *m, const char *name)
{
    for (uint32_t i = 0; i < m->hdr->n_tensors; i++)
        if (strncmp(m->tensors[i].name, name, SHLM_NAME_MAX) == 0)
            return &m->tensors[i];
    return NULL;
}

static int by_name(const void *a, const void *b, void *arg)
{
    const struct shlm_tensor *t = arg;
    return strncmp(t[*(const int *)a].name, t[*(const int *)b].name, SHLM_NAME_MAX);
}

int *shlm_name_index(const struct shlm_model *m)
{
    int *ix = malloc((m->hdr->n_tensors ? m->hdr->n_tensors : 1) * sizeof(int));
    if (!ix)
        return NULL;
    for (uint32_t i = 0; i < m->hdr->n_tensors; i++)
        ix[i] = (int)i;
    qsort_r(ix, m->hdr->n_tensors, sizeof(int), by_name, (void *)m->tensors);
    return ix;
}

const struct shlm_tensor *shlm_find_in(const struct shlm_model *m, const int *index,
                                       const char *name)
{
    size_t lo = 0, hi = m->hdr->n_tensors;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strncmp(m->tensors[index[mid]].name, name, SHLM_NAME_MAX);
        if (c == 0)
            return &m->tensors[index[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int by_offset(const void *a, const void *b, void *arg)
{
    const struct shlm_tensor *t = arg;
    uint64_t x = t[*(const int *)a].offset, y = t[*(const int *)b].offset;
    return x < y ? -1 : x > y;
}

const struct shlm_tensor *shlm_find_kind(const struct shlm_model *m, int kind, uint32_t layer,
                                         uint32_t expert)
{
    char name[SHLM_NAME_MAX];
    shlm_kind_name((enum shlm_kind)kind, layer, expert, name, sizeof(name));
    return shlm_find(m, name);
}

void shlm_view(const struct shlm_model *m, const struct shlm_tensor *t, struct kn_mat *v)
{
    kn_mat_view(v, (enum kn_dtype)t->dtype, (int)t->rows, (int)t->cols, (int)t->group,
                m->base + t->offset);
}

static int check_tensors(struct shlm_model *m, const uint8_t *b, size_t size,
                         const struct shlm_header *h, struct shlm_tensor_spec *want,
                         const char *what, struct shardlm_err *e);

/* Parses an image of @size bytes of which the first @avail are at @buf. */
static int parse(struct shlm_model *m, const void *buf, size_t avail, size_t size, const char *what,
                 struct shardlm_err *e)
{
    const uint8_t *b = buf;
    memset(m, 0, sizeof(*m));
    if (size < sizeof(struct shlm_header) || avail < sizeof(struct shlm_header))
        return shardlm_fail(e, -EINVAL, "%s: file is %zu bytes, shorter than the %zu-byte header",
                            what, size, sizeof(struct shlm_header));
    const struct shlm_header *h = buf;
    if (memcmp(h->magic, SHLM_MAGIC, sizeof(SHLM_MAGIC)) != 0)
        return shardlm_fail(e, -EPROTO, "%s: not a .shlm file (magic is not \"%s\")", what,
                            SHLM_MAGIC);
    if (h->version != SHLM_VERSION)
        return shardlm_fail(e, -EINVAL, "%s: header field version is %u, expected %d", what,
                            h->version, SHLM_VERSION);
    if (h->header_bytes != sizeof(*h))
        return shardlm_fail(e, -EINVAL, "%s: header field header_bytes is %u, expected %zu", what,
                            h->header_bytes, sizeof(*h));
    if (h->file_bytes != size)
        return shardlm_fail(
            e, -EINVAL,
            "%s: header field file_bytes is %llu but the file has %zu bytes (truncated?)", what,
            (unsigned long long)h->file_bytes, size);
    if (h->n_tensors == 0 || h->n_tensors > SHLM_MAX_TENSORS)
        return shardlm_fail(e, -EINVAL, "%s: header field n_tensors is %u, expected 1..%d", what,
                            h->n_tensors, SHLM_MAX_TENSORS);
    uint64_t table_bytes = (uint64_t)h->n_tensors * sizeof(struct shlm_tensor);
    if (h->table_offset < sizeof(*h) || h->table_offset % 8 || h->table_offset > size ||
        table_bytes > size - h->table_offset)
        return shardlm_fail(e, -EINVAL, "%s: header field table_offset %llu is out of the file",
                            what, (unsigned long long)h->table_offset);
    if (h->tok_offset > size || h->tok_bytes > size - h->tok_offset || h->tok_bytes == 0)
        return shardlm_fail(e, -EINVAL,
                            "%s: header fields tok_offset/tok_bytes are out of the file", what);
    /* regions in order, none overlapping: header, table, tokenizer, data */
    if (h->tok_offset < h->table_offset + table_bytes)
        return shardlm_fail(e, -EINVAL,
                            "%s: header field tok_offset %llu overlaps the tensor "
                            "table",
                            what, (unsigned long long)h->tok_offset);
    if (h->data_offset % SHLM_ALIGN || h->data_offset < h->tok_offset + h->tok_bytes ||
        h->data_offset > size)
        return shardlm_fail(e, -EINVAL,
                            "%s: header field data_offset %llu is not a 4 KiB "
                            "boundary after the tokenizer within the file",
                            what, (unsigned long long)h->data_offset);
    if (h->data_offset > avail)
        return shardlm_fail(e, -EINVAL,
                            "%s: only %zu of the %llu bytes before the data were "
                            "read",
                            what, avail, (unsigned long long)h->data_offset);
    if (h->tok_kind != SHLM_TOK_LLAMA2C && h->tok_kind != SHLM_TOK_BLOB)
        return shardlm_fail(e, -EINVAL, "%s: header field tok_kind is %u, expected 1 or 2", what,
                            h->tok_kind);
    /* header checksum covers the header with its checksum field zeroed, then the table */
    struct shlm_header copy = *h;
    copy.checksum = 0;
    uint64_t sum = shlm_hash(&copy, sizeof(copy)) ^ shlm_hash(b + h->table_offset, table_bytes);
    if (sum != h->checksum)
        return shardlm_fail(e, -EINVAL, "%s: header checksum mismatch (corrupt header or table)",
                            what);
    struct shardlm_err cerr;
    if (shlm_config_check(&h->cfg, &cerr) || shlm_config_ext_check(&h->cfg, &h->cfgx, &cerr))
        return shardlm_fail(e, -EINVAL, "%s: %s", what, cerr.msg);
    if (h->scheme > SHLM_SCHEME_W4A8)
        return shardlm_fail(e, -EINVAL, "%s: header field scheme is %u, expected 0..3", what,
                            h->scheme);
    if (h->bos_id >= h->cfg.vocab_size || h->eos_id >= h->cfg.vocab_size)
        return shardlm_fail(e, -EINVAL,
                            "%s: header fields bos_id/eos_id are outside the vocabulary", what);

    struct shlm_tensor_spec *want = calloc(SHLM_MAX_TENSORS, sizeof(*want));
    if (!want)
        return shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
    int rc = check_tensors(m, b, size, h, want, what, e);
    free(want);
    return rc;
}

int shlm_parse(struct shlm_model *m, const void *buf, size_t size, const char *what,
               struct shardlm_err *e)
{
    return parse(m, buf, size, size, what, e);
}

int shlm_parse_head(struct shlm_model *m, const void *head, size_t avail, size_t size,
                    const char *what, struct shardlm_err *e)
{
    return parse(m, head, avail, size, what, e);
}

static int check_tensor(const struct shlm_tensor *t, const struct shlm_tensor_spec *want,
                        const char *what, struct shardlm_err *e);

static int check_tensors(struct shlm_model *m, const uint8_t *b, size_t size,
                         const struct shlm_header *h, struct shlm_tensor_spec *want,
                         const char *what, struct shardlm_err *e)
{
    /* shard_count 0: a whole model (a file); n >= 1: the shard of rank shard_rank of n */
    struct seg_plan plan;
    bool shard = h->shard_count > 0;
    if ((!shard && h->shard_rank != 0) || seg_plan_of(&plan, h))
        return shardlm_fail(e, -EINVAL,
                            "%s: header fields shard_rank/shard_count/experts_placement (%u of "
                            "%u, %u) do not fit the model",
                            what, h->shard_rank, h->shard_count, h->experts_placement);
    int n = shlm_expected_tensors(&h->cfg, &h->cfgx, (enum shlm_scheme)h->scheme, (int)h->group,
                                  (int)h->head_bits, shard ? &plan : NULL, want, SHLM_MAX_TENSORS);
    if (n == -E2BIG)
        return shardlm_fail(e, -EINVAL, "%s: the config needs more than %d tensors", what,
                            SHLM_MAX_TENSORS);
    if (n < 0)
        return shardlm_fail(e, -EINVAL,
                            "%s: header fields scheme/group/head_bits (%s, %u, %u) "
                            "are not a valid combination",
                            what, shlm_scheme_name(h->scheme), h->group, h->head_bits);
    if (h->layout > SHLM_LAYOUT_TILES || (!shard && h->layout != SHLM_LAYOUT_CANONICAL))
        return shardlm_fail(e, -EINVAL, "%s: header field layout is %u, expected 0%s", what,
                            h->layout, shard ? " or 1" : " in a model file");
    for (int i = 0; i < n; i++)
        want[i].dtype = shlm_layout_dtype(want[i].dtype, (enum shlm_layout)h->layout);
    if ((uint32_t)n != h->n_tensors)
        return shardlm_fail(e, -EINVAL, "%s: header field n_tensors is %u, the config needs %d",
                            what, h->n_tensors, n);
    m->base = b;
    m->size = size;
    m->hdr = h;
    m->tensors = (const struct shlm_tensor *)(b + h->table_offset);
    for (uint32_t i = 0; i < h->n_tensors; i++) {
        const struct shlm_tensor *t = &m->tensors[i];
        if (memchr(t->name, 0, SHLM_NAME_MAX) == NULL)
            return shardlm_fail(e, -EINVAL, "%s: tensor %u: name is not terminated", what, i);
        if (t->dtype >= KN_DT_COUNT)
            return shardlm_fail(e, -EINVAL, "%s: tensor %s: unknown dtype %u", what, t->name,
                                t->dtype);
        if (t->offset % SHLM_ALIGN || t->offset < h->data_offset || t->offset > size ||
            t->bytes > size - t->offset)
            return shardlm_fail(e, -EINVAL,
                                "%s: tensor %s: offset %llu + %llu bytes is outside "
                                "the data region",
                                what, t->name, (unsigned long long)t->offset,
                                (unsigned long long)t->bytes);
    }
    /* names and offsets sorted: a name twice is two neighbours, and so is an overlap (tens of
     * thousands of experts' tensors: no pairwise loops) */
    int *ix = shlm_name_index(m);
    if (!ix)
        return shardlm_fail(e, -ENOMEM, "%s: out of memory for %u tensors", what, h->n_tensors);
    int rc = 0;
    for (uint32_t i = 1; i < h->n_tensors && !rc; i++)
        if (!strncmp(m->tensors[ix[i - 1]].name, m->tensors[ix[i]].name, SHLM_NAME_MAX))
            rc = shardlm_fail(e, -EINVAL, "%s: tensor %s appears twice", what,
                              m->tensors[ix[i]].name);
    for (int i = 0; i < n && !rc; i++) {
        const struct shlm_tensor *t = shlm_find_in(m, ix, want[i].name);
        if (!t)
            rc = shardlm_fail(e, -EINVAL, "%s: tensor %s is missing", what, want[i].name);
        else
            rc = check_tensor(t, &want[i], what, e);
    }
    if (!rc) {
        for (uint32_t i = 0; i < h->n_tensors; i++)
            ix[i] = (int)i;
        qsort_r(ix, h->n_tensors, sizeof(int), by_offset, (void *)m->tensors);
        for (uint32_t i = 1; i < h->n_tensors && !rc; i++) {
            const struct shlm_tensor *a = &m->tensors[ix[i - 1]], *c = &m->tensors[ix[i]];
            if (a->offset + a->bytes > c->offset)
                rc = shardlm_fail(e, -EINVAL, "%s: tensors %s and %s overlap", what, a->name,
                                  c->name);
        }
    }
    free(ix);
    return rc;
}

/* Tensor @t of an image against @want's format, shape and bytes. Returns 0 or -EINVAL + @e. */
static int check_tensor(const struct shlm_tensor *t, const struct shlm_tensor_spec *want,
                        const char *what, struct shardlm_err *e)
{
    if (t->dtype != (uint32_t)want->dtype || t->rows != (uint32_t)want->rows ||
        t->cols != (uint32_t)want->cols || t->group != (uint32_t)want->group)
        return shardlm_fail(e, -EINVAL,
                            "%s: tensor %s: dtype/shape/group %u/%ux%u/%u, "
                            "expected %d/%dx%d/%d",
                            what, t->name, t->dtype, t->rows, t->cols, t->group, want->dtype,
                            want->rows, want->cols, want->group);
    size_t bytes = kn_mat_bytes(want->dtype, want->rows, want->cols, want->group);
    if (t->bytes != bytes)
        return shardlm_fail(e, -EINVAL, "%s: tensor %s: %llu bytes, expected %zu", what, t->name,
                            (unsigned long long)t->bytes, bytes);
    return 0;
}

int shlm_verify_data(const struct shlm_model *m, const char *what, struct shardlm_err *e)
{
    for (uint32_t i = 0; i < m->hdr->n_tensors; i++) {
        const struct shlm_tensor *t = &m->tensors[i];
        if (shlm_hash(m->base + t->offset, t->bytes) != t->checksum)
            return shardlm_fail(e, -EIO, "%s: tensor %s: checksum mismatch (corrupt data)", what,
                                t->name);
    }
    return 0;
}
