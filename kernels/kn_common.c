/* SPDX-License-Identifier: MIT */
/* kernels/kn_common.c: layout helpers over the type traits, the scalar activation preparation,
 * fp16/bf16 conversion. No intrinsics here. */
#include "kn.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kn_assert_fail(const char *what, const char *file, int line)
{
    fprintf(stderr, "shardlm: internal error: %s:%d: assertion '%s' failed\n", file, line, what);
    abort();
}

size_t kn_row_bytes(enum kn_dtype dt, int cols)
{
    const struct kn_type_traits *tt = &kn_type_traits[dt];
    KN_ASSERT(!tt->tile_rows); /* tiled rows interleave by block */
    size_t n = tt->row_block ? (size_t)(cols + tt->row_block - 1) / (size_t)tt->row_block *
                                   (size_t)tt->row_block
                             : (size_t)cols;
    return (n * (size_t)tt->bits + 7) / 8;
}

size_t kn_codes_bytes(enum kn_dtype dt, int rows, int cols)
{
    size_t n = (size_t)rows * kn_row_bytes(dt, cols);
    /* padded when scales follow, so that they start on a cache line */
    return kn_type_traits[dt].scale_bytes ? (n + 63) / 64 * 64 : n;
}

/* Scales (and zero points) per row: one, one per group, or a number per row block. */
static size_t scales_per_row(const struct kn_type_traits *tt, int cols, int group)
{
    if (tt->row_block)
        return (size_t)kn_ngroups(cols, tt->row_block) * (size_t)tt->block_scales;
    return tt->grouped ? (size_t)kn_ngroups(cols, group) : 1;
}

size_t kn_mat_bytes(enum kn_dtype dt, int rows, int cols, int group)
{
    const struct kn_type_traits *tt = &kn_type_traits[dt];
    size_t r = (size_t)rows;
    if (tt->tile_rows)
        return (r + KN_TILE_ROWS - 1) / KN_TILE_ROWS * kn_tile_block_bytes(dt, cols, group);
    size_t tail = (size_t)(tt->scale_bytes + (tt->zeros ? 1 : 0));
    return kn_codes_bytes(dt, rows, cols) + r * scales_per_row(tt, cols, group) * tail;
}

void kn_mat_view_rows(struct kn_mat *m, enum kn_dtype dt, int rows, int cols, int group, int r0,
                      int r1, const void *codes, const void *tail)
{
    const struct kn_type_traits *tt = &kn_type_traits[dt];
    KN_ASSERT(!tt->tile_rows && 0 <= r0 && r0 <= r1 && r1 <= rows);
    memset(m, 0, sizeof(*m));
    m->dtype = dt;
    m->rows = r1 - r0;
    m->cols = cols;
    m->group = group;
    m->codes = codes;
    if (!tt->scale_bytes)
        return;
    const uint8_t *t = tail;
    size_t per_row = scales_per_row(tt, cols, group), sb = (size_t)tt->scale_bytes;
    m->scales = t + (size_t)r0 * per_row * sb;
    if (tt->zeros) /* after the scales of all rows */
        m->zeros = t + (size_t)rows * per_row * sb + (size_t)r0 * per_row;
}

void kn_mat_view(struct kn_mat *m, enum kn_dtype dt, int rows, int cols, int group,
                 const void *base)
{
    if (kn_type_traits[dt].tile_rows) { /* scales and zeros live in each block */
        memset(m, 0, sizeof(*m));
        m->dtype = dt;
        m->rows = rows;
        m->cols = cols;
        m->group = group;
        m->codes = base;
        return;
    }
    kn_mat_view_rows(m, dt, rows, cols, group, 0, rows, base,
                     (const uint8_t *)base + kn_codes_bytes(dt, rows, cols));
}

void kn_mm_check(const struct kn_mat *w, const struct kn_act *x, int m, int n0, int n1)
{
    KN_ASSERT((unsigned)w->dtype < KN_DT_COUNT && n0 >= 0 && n0 <= n1 && n1 <= w->rows);
    bool grouped = kn_type_traits[w->dtype].grouped;
    for (int i = 0; i < m; i++)
        KN_ASSERT(x[i].k == w->cols && (!grouped || x[i].group == w->group) &&
                  (x[i].parts & kn_type_traits[w->dtype].act_parts) ==
                      kn_type_traits[w->dtype].act_parts);
}

int kn_act_alloc(struct kn_act *a, int k, int group)
{
    memset(a, 0, sizeof(*a));
    KN_ASSERT(group >= 2 && group % 2 == 0 && group <= KN_MAX_GROUP);
    a->k = k;
    a->group = group;
    a->kpad = (k + group - 1) / group * group;
    a->parts = KN_ACT_ALL;
    size_t kp = (size_t)a->kpad, ng = kp / (size_t)group, nb6 = (size_t)kn_q6_blocks(k);
    /* One block, 64-byte aligned parts. */
    size_t sz = 0, off[11];
    size_t parts[11] = {kp * 4, kp / 2 * 4, kp / 2 * 4,        ng * 4,   kp,      kp,
                        ng * 4, kp * 2,     nb6 * KN_Q6_BLOCK, nb6 * 64, nb6 * 64};
    for (int i = 0; i < 11; i++) {
        off[i] = sz;
        sz += (parts[i] + 63) / 64 * 64;
    }
    uint8_t *p = aligned_alloc(64, sz);
    if (!p)
        return -ENOMEM;
    memset(p, 0, sz);
    a->x = (float *)(p + off[0]);
    a->xe = (float *)(p + off[1]);
    a->xo = (float *)(p + off[2]);
    a->gsum = (float *)(p + off[3]);
    a->q = (int8_t *)(p + off[4]);
    a->qe = (int8_t *)(p + off[5]);
    a->qo = a->qe + kp / 2;
    a->qgsum = (int32_t *)(p + off[6]);
    a->q16 = (int16_t *)(p + off[7]);
    a->q6 = (int8_t *)(p + off[8]);
    a->q6scale = (float *)(p + off[9]);
    a->q6sum = (int32_t *)(p + off[10]);
    return 0;
}

void kn_act_free(struct kn_act *a)
{
    free(a->x);
    memset(a, 0, sizeof(*a));
}

void kn_act_prepare_scalar(struct kn_act *a, const float *x)
{
    int k = a->k, kp = a->kpad, g = a->group;
    memcpy(a->x, x, (size_t)k * sizeof(float));
    memset(a->x + k, 0, (size_t)(kp - k) * sizeof(float));
    /* plain loops the compiler vectorizes: this runs for every row of a prefill chunk */
    float amax = 0.0f;
    for (int i = 0; i < k; i++) {
        float v = fabsf(x[i]);
        amax = v > amax ? v : amax;
    }
    a->qscale = amax / 127.0f;
    float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int i = 0; i < kp; i++) /* one cvtss2si each: -fno-math-errno */
        a->q[i] = (int8_t)lrintf(a->x[i] * inv);
    for (int i = 0; i < kp / 2; i++) {
        a->xe[i] = a->x[2 * i];
        a->xo[i] = a->x[2 * i + 1];
        a->qe[i] = a->q[2 * i];
        a->qo[i] = a->q[2 * i + 1];
    }
    for (int gi = 0; gi < kp / g; gi++) {
        float s = 0.0f;
        int32_t qs = 0;
        for (int i = gi * g; i < (gi + 1) * g; i++) {
            s += a->x[i];
            qs += a->q[i];
        }
        a->gsum[gi] = s;
        a->qgsum[gi] = qs;
    }
    kn_act_prepare_q16(a, amax);
    kn_act_prepare_q6(a, x);
}

void kn_act_prepare_q16(struct kn_act *a, float amax)
{
    a->q16scale = amax / 32767.0f;
    float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
    for (int i = 0; i < a->kpad; i++)
        a->q16[i] = (int16_t)lrintf(a->x[i] * inv);
}

uint16_t kn_f32_to_f16(float f)
{
    union { float f; uint32_t u; } v = {.f = f};
    uint32_t u = v.u, sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (absu > 0x7f800000u ? 0x200u : 0));
    if (absu >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return (uint16_t)(sign | 0x7c00u);
    if (absu < 0x38800000u) { /* subnormal half (or zero) */
        union { uint32_t u; float f; } a = {.u = absu};
        float scaled = a.f * 16777216.0f; /* 2^24: half subnormal unit */
        return (uint16_t)(sign | (uint32_t)lrintf(scaled));
    }
    uint32_t mant = absu & 0x7fffffu;
    uint32_t exp = (absu >> 23) - 127 + 15;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

float kn_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    union { uint32_t u; float f; } v;
    if (exp == 0) {
        float f = (float)mant / 16777216.0f;
        return sign ? -f : f;
    }
    if (exp == 31)
        v.u = sign | 0x7f800000u | (mant << 13);
    else
        v.u = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    return v.f;
}

uint16_t kn_f32_to_bf16(float f)
{
    union { float f; uint32_t u; } v = {.f = f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((v.u >> 16) | 0x40u);
    uint32_t r = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + r) >> 16);
}

void kn_mat_row(const struct kn_mat *m, int r, float *out)
{
    kn_type_traits[m->dtype].to_float(m, r, out);
}

/* The block of a tiled matrix that holds row @r. */
static const uint8_t *tile_block(const struct kn_mat *m, int r)
{
    return (const uint8_t *)m->codes +
           (size_t)(r / KN_TILE_ROWS) * kn_tile_block_bytes(m->dtype, m->cols, m->group);
}

int kn_w4_code(const struct kn_mat *m, int r, int k)
{
    KN_ASSERT(kn_is_w4(m->dtype) && r >= 0 && r < m->rows && k >= 0 && k < m->cols);
    const uint8_t *p = m->codes;
    if (!kn_is_tiled(m->dtype)) {
        uint8_t b = p[(size_t)r * kn_w4_row_bytes(m->cols) + (size_t)k / 2];
        return k % 2 ? b >> 4 : b & 15;
    }
    int g = k / m->group, o = k % m->group / 8, j = k % 8;
    const uint8_t *blk =
        p + (size_t)(r / KN_TILE_ROWS) * kn_tile_block_bytes(m->dtype, m->cols, m->group);
    uint8_t b = blk[(size_t)g * (size_t)m->group * 8 + (size_t)o * 64 +
                    (size_t)(r % KN_TILE_ROWS) * 4 + (size_t)(j % 4)];
    return j < 4 ? b & 15 : b >> 4;
}

uint16_t kn_w4_scale(const struct kn_mat *m, int r, int g)
{
    KN_ASSERT(kn_is_w4(m->dtype) && r >= 0 && r < m->rows && g >= 0 &&
              g < kn_ngroups(m->cols, m->group));
    if (!kn_is_tiled(m->dtype))
        return ((const uint16_t *)
                    m->scales)[(size_t)r * (size_t)kn_ngroups(m->cols, m->group) + (size_t)g];
    return (
        (const uint16_t *)(tile_block(m, r) +
                           kn_tile_scales_offset(
                               m->cols,
                               m->group)))[(size_t)g * KN_TILE_ROWS + (size_t)(r % KN_TILE_ROWS)];
}

int kn_w4_zero(const struct kn_mat *m, int r, int g)
{
    KN_ASSERT(kn_is_w4(m->dtype) && r >= 0 && r < m->rows && g >= 0 &&
              g < kn_ngroups(m->cols, m->group));
    const struct kn_type_traits *tt = &kn_type_traits[m->dtype];
    if (!tt->zeros) /* symmetric */
        return 8;
    if (!tt->tile_rows)
        return m->zeros[(size_t)r * (size_t)kn_ngroups(m->cols, m->group) + (size_t)g];
    return tile_block(m, r)[kn_tile_zeros_offset(m->cols, m->group) + (size_t)g * KN_TILE_ROWS +
                            (size_t)(r % KN_TILE_ROWS)];
}

/* YaRN's ramp bound: the pair index whose wavelength turns @rot times in @orig_ctx positions,
 * head_dim * ln(orig_ctx / (2 pi rot)) / (2 ln theta) (the YaRN paper's eq. 19; ggml's
 * ggml_rope_yarn_corr_dim) */
static float yarn_corr_dim(int head_dim, int orig_ctx, float rot, float theta)
{
    return (float)head_dim * logf((float)orig_ctx / (rot * 2.0f * 3.14159265358979f)) /
           (2.0f * logf(theta));
}

float kn_rope_freqs(float *inv_freq, int head_dim, float theta, const struct kn_rope_scale *s)
{
    static const struct kn_rope_scale plain;
    if (!s)
        s = &plain;
    float mscale = s->attn_factor > 0.0f ? s->attn_factor : 1.0f;
    float ylo = 0.0f, yhi = 0.0f;
    if (s->type == KN_ROPE_YARN) {
        float fast = s->beta_fast > 0.0f ? s->beta_fast : 32.0f;
        float slow = s->beta_slow > 0.0f ? s->beta_slow : 1.0f;
        ylo = yarn_corr_dim(head_dim, s->orig_ctx, fast, theta);
        yhi = yarn_corr_dim(head_dim, s->orig_ctx, slow, theta);
        if (!s->exact) {
            ylo = floorf(ylo);
            yhi = ceilf(yhi);
        }
        ylo = fmaxf(0.0f, ylo);
        yhi = fminf((float)(head_dim - 1), yhi);
        mscale *= 1.0f + 0.1f * logf(s->factor);
    }
    for (int i = 0; i < head_dim; i += 2) {
        /* the expression of llama2.c's run.c, so f32 logits stay bit-identical to it */
        float f = 1.0f / powf(theta, (float)i / (float)head_dim);
        if (s->freq_factors)
            f /= s->freq_factors[i / 2];
        if (s->type == KN_ROPE_LLAMA3) {
            /* long wavelengths slowed by factor, short ones kept, a blend between */
            float wavelen = 2.0f * 3.14159265358979f / f;
            float lo_wl = (float)s->orig_ctx / s->low, hi_wl = (float)s->orig_ctx / s->high;
            if (wavelen > lo_wl) {
                f /= s->factor;
            } else if (wavelen >= hi_wl) {
                float smooth = ((float)s->orig_ctx / wavelen - s->low) / (s->high - s->low);
                f = (1.0f - smooth) * f / s->factor + smooth * f;
            }
        } else if (s->type == KN_ROPE_YARN) {
            /* extrapolated (as trained) below pair ylo, interpolated (divided by factor) past
             * yhi, a linear mix between */
            float y = ((float)(i / 2) - ylo) / fmaxf(0.001f, yhi - ylo);
            float ext = 1.0f - fminf(1.0f, fmaxf(0.0f, y));
            f = f / s->factor * (1.0f - ext) + f * ext;
        } else if (s->type == KN_ROPE_LINEAR) {
            f /= s->factor;
        }
        inv_freq[i / 2] = f;
    }
    return mscale;
}

float kn_rope_longrope_attn(float factor, int orig_ctx)
{
    if (factor <= 1.0f || orig_ctx < 2) /* ln(1) = 0: no original context to scale from */
        return 1.0f;
    return sqrtf(1.0f + logf(factor) / logf((float)orig_ctx));
}

size_t kn_gemm_scratch_bytes(const struct kn_ops *o, const struct kn_mat *w, int m)
{
    return o->gemm_scratch ? o->gemm_scratch(w, m) : 0;
}
