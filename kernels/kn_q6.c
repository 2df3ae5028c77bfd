/* SPDX-License-Identifier: MIT */
/* kernels/kn_q6.c: KN_DT_Q6, the 6-bit embedding / LM head (layout in kn.h): element access,
 * the quantizer and the activations its products read, one definition for every table. No
 * intrinsics here. */
#include "kn.h"

#include <math.h>
#include <string.h>

#define Q6_BLOCK_BYTES (KN_Q6_BLOCK * 6 / 8) /* 192: two nibble vectors, one of high bits */
#define Q6_GROUPS (KN_Q6_BLOCK / KN_Q6_GROUP)

static const uint8_t *q6_block(const struct kn_mat *m, int r, int b)
{
    return (const uint8_t *)m->codes + (size_t)r * kn_row_bytes(KN_DT_Q6, m->cols) +
           (size_t)b * Q6_BLOCK_BYTES;
}

/* The code of element @e < KN_Q6_BLOCK of the block at @blk */
static int q6_at(const uint8_t *blk, int e)
{
    int p = kn_q6_pos(e), v = p / 64, b = p % 64;
    int lo = blk[64 * (v / 2) + b] >> (v % 2 ? 4 : 0) & 15;
    return lo | (blk[128 + b] >> (2 * v) & 3) << 4;
}

int kn_q6_code(const struct kn_mat *m, int r, int k)
{
    KN_ASSERT(m->dtype == KN_DT_Q6 && r >= 0 && r < m->rows && k >= 0 &&
              k < kn_q6_blocks(m->cols) * KN_Q6_BLOCK);
    return q6_at(q6_block(m, r, k / KN_Q6_BLOCK), k % KN_Q6_BLOCK);
}

void kn_q6_row(const struct kn_mat *m, int r, float *out)
{
    KN_ASSERT(m->dtype == KN_DT_Q6 && r >= 0 && r < m->rows);
    const uint16_t *sc =
        (const uint16_t *)m->scales + (size_t)r * (size_t)kn_q6_blocks(m->cols) * Q6_GROUPS;
    for (int b = 0; b < kn_q6_blocks(m->cols); b++) {
        const uint8_t *blk = q6_block(m, r, b);
        float s[Q6_GROUPS];
        for (int g = 0; g < Q6_GROUPS; g++)
            s[g] = kn_f16_to_f32(sc[b * Q6_GROUPS + g]);
        for (int e = 0; e < KN_Q6_BLOCK && b * KN_Q6_BLOCK + e < m->cols; e++)
            out[b * KN_Q6_BLOCK + e] = s[e / KN_Q6_GROUP] * (float)(q6_at(blk, e) - 32);
    }
}

uint16_t kn_q6_scale(const struct kn_mat *m, int r, int g)
{
    int spr = kn_q6_blocks(m->cols) * Q6_GROUPS;
    KN_ASSERT(m->dtype == KN_DT_Q6 && r >= 0 && r < m->rows && g >= 0 && g < spr);
    return ((const uint16_t *)m->scales)[(size_t)r * (size_t)spr + (size_t)g];
}

/* ---- the quantizer ---- */

/* Code of @w under scale @s (value = s * (code - 32)), clamped to 0..63 */
static int q6_code(float w, float s)
{
    if (s == 0.0f)
        return 32;
    long q = lrintf(w / s) + 32;
    return q < 0 ? 0 : q > 63 ? 63 : (int)q;
}

/* One group of @n <= KN_Q6_GROUP weights: the fp16-exact scale of least squared error among
 * max|w| / d for divisors d around 32, signed so that the largest magnitude gets code 0 (the
 * level a symmetric grid lacks). */
static float q6_group_scale(const float *w, int n)
{
    float big = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(w[i]) > fabsf(big))
            big = w[i];
    if (big == 0.0f)
        return 0.0f;
    static const float div[] = {32.5f, 32.0f, 31.75f, 31.5f, 31.0f, 30.5f, 30.0f, 29.0f};
    float best = 0.0f, best_err = INFINITY;
    for (size_t c = 0; c < sizeof(div) / sizeof(div[0]); c++) {
        float s = kn_f16_to_f32(kn_f32_to_f16(-big / div[c])), err = 0.0f;
        for (int i = 0; i < n; i++) {
            float d = w[i] - s * (float)(q6_code(w[i], s) - 32);
            err += d * d;
        }
        if (err < best_err) {
            best_err = err;
            best = s;
        }
    }
    return best;
}

struct q6_job {
    const float *w;
    int rows, cols;
    uint8_t *codes;
    uint16_t *scales;
};

/* Member @t of @nt: rows [rows * t / nt, rows * (t + 1) / nt). */
static void q6_rows(void *arg, int t, int nt)
{
    const struct q6_job *j = arg;
    int nb = kn_q6_blocks(j->cols), spr = nb * Q6_GROUPS;
    size_t rb = kn_row_bytes(KN_DT_Q6, j->cols);
    int r0 = (int)((long)j->rows * t / nt), r1 = (int)((long)j->rows * (t + 1) / nt);
    for (int r = r0; r < r1; r++) {
        const float *row = j->w + (size_t)r * (size_t)j->cols;
        uint8_t *blk = j->codes + (size_t)r * rb;
        uint16_t *sc = j->scales + (size_t)r * (size_t)spr;
        memset(blk, 0, rb);
        for (int g = 0; g < spr; g++) {
            int k0 = g * KN_Q6_GROUP, n = j->cols - k0;
            n = n < 0 ? 0 : n > KN_Q6_GROUP ? KN_Q6_GROUP : n;
            float s = q6_group_scale(n ? row + k0 : row, n); /* no pointer past the row */
            sc[g] = kn_f32_to_f16(s);
            for (int i = 0; i < KN_Q6_GROUP; i++) {
                int k = k0 + i, q = i < n ? q6_code(row[k], s) : 32;
                int p = kn_q6_pos(k % KN_Q6_BLOCK), v = p / 64, b = p % 64;
                uint8_t *bp = blk + (size_t)(k / KN_Q6_BLOCK) * Q6_BLOCK_BYTES;
                bp[64 * (v / 2) + b] |= (uint8_t)((q & 15) << (v % 2 ? 4 : 0));
                bp[128 + b] |= (uint8_t)((q >> 4) << (2 * v));
            }
        }
    }
}

void kn_quant_q6(const float *w, int rows, int cols, void *out, const struct kn_par *par)
{
    struct q6_job j = {w, rows, cols, out, NULL};
    j.scales = (uint16_t *)((uint8_t *)out + kn_codes_bytes(KN_DT_Q6, rows, cols));
    memset(out, 0, kn_codes_bytes(KN_DT_Q6, rows, cols)); /* the region's padding */
    if (par && (long)rows * cols >= KN_QUANT_PAR_MIN)
        par->run(par->pool, q6_rows, &j);
    else
        q6_rows(&j, 0, 1);
}

/* ---- the activations ---- */

void kn_act_prepare_q6(struct kn_act *a, const float *x)
{
    int nb = kn_q6_blocks(a->k);
    memset(a->q6sum, 0, (size_t)nb * 16 * sizeof(int32_t));
    for (int b = 0; b < nb; b++) {
        int8_t *q = a->q6 + (size_t)b * KN_Q6_BLOCK;
        for (int g = 0; g < Q6_GROUPS; g++) {
            int k0 = b * KN_Q6_BLOCK + g * KN_Q6_GROUP;
            float amax = 0.0f;
            for (int i = 0; i < KN_Q6_GROUP; i++)
                if (k0 + i < a->k)
                    amax = fmaxf(amax, fabsf(x[k0 + i]));
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            for (int i = 0; i < KN_Q6_GROUP; i++) {
                int e = g * KN_Q6_GROUP + i, p = kn_q6_pos(e);
                int8_t v = k0 + i < a->k ? (int8_t)lrintf(x[k0 + i] * inv) : 0;
                q[p] = v;
                a->q6sum[b * 16 + p % 64 / 4] += 32 * v;
            }
            /* lanes g and g + 8 hold the group's two halves */
            a->q6scale[b * 16 + g] = a->q6scale[b * 16 + g + 8] = amax / 127.0f;
        }
    }
}
