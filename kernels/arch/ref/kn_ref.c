/* SPDX-License-Identifier: MIT */
/* kernels/arch/ref/kn_ref.c: scalar reference for every operation. No intrinsics: this file defines
 * what each SIMD variant must compute, and the tests hold them to it. */
#include "../kn_gram.h"
#include "kn_ref.h"

#include <math.h>

static float dot_f32(const float *w, const float *x, int k)
{
    float s = 0.0f;
    for (int i = 0; i < k; i++)
        s += w[i] * x[i];
    return s;
}

void kn_gemv_f32_ref(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1)
{
    const float *p = w->codes;
    for (int n = n0; n < n1; n++)
        y[n] = dot_f32(p + (size_t)n * (size_t)w->cols, x->x, w->cols);
}

void kn_gemv_bf16_ref(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1)
{
    const uint16_t *p = w->codes;
    for (int n = n0; n < n1; n++) {
        const uint16_t *row = p + (size_t)n * (size_t)w->cols;
        float s = 0.0f;
        for (int k = 0; k < w->cols; k++)
            s += kn_bf16_to_f32(row[k]) * x->x[k];
        y[n] = s;
    }
}

void kn_gemv_q8_ref(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1)
{
    const int8_t *p = w->codes;
    const float *sc = w->scales;
    for (int n = n0; n < n1; n++) {
        const int8_t *row = p + (size_t)n * (size_t)w->cols;
        int64_t s = 0; /* exact: the SIMD tables add the same products in int32 and int64 */
        for (int k = 0; k < w->cols; k++)
            s += (int32_t)row[k] * x->q16[k];
        y[n] = sc[n] * (x->q16scale * (float)s);
    }
}

/* KN_DT_Q6 through kn_q6_code() / kn_q6_scale(), in the order every table follows so that each
 * gives this result bit for bit: per block and lane L (a half of group L % 8, kn.h) the exact
 * integer sum of its 16 code x activation products less the zero point's 32 x sum(q), scaled by
 * the group's weight scale times its activation scale into the lane's float accumulator (one
 * fused multiply-add); the 16 lanes then added as halves (L + 8, then + 4, + 2, + 1). */
void kn_gemv_q6_ref(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1)
{
    int nb = kn_q6_blocks(w->cols);
    for (int n = n0; n < n1; n++) {
        float acc[16] = {0};
        for (int b = 0; b < nb; b++) {
            int32_t d[16] = {0};
            for (int e = 0; e < KN_Q6_BLOCK; e++) {
                int p = kn_q6_pos(e);
                d[p % 64 / 4] += kn_q6_code(w, n, b * KN_Q6_BLOCK + e) *
                                 x->q6[(size_t)b * KN_Q6_BLOCK + (size_t)p];
            }
            for (int l = 0; l < 16; l++) {
                float t = kn_f16_to_f32(kn_q6_scale(w, n, b * 8 + l % 8)) * x->q6scale[b * 16 + l];
                acc[l] = fmaf(t, (float)(d[l] - x->q6sum[b * 16 + l]), acc[l]);
            }
        }
        for (int h = 8; h >= 1; h /= 2)
            for (int l = 0; l < h; l++)
                acc[l] += acc[l + h];
        y[n] = acc[0];
    }
}

/* The int4 references read every element through kn_w4_code() / kn_w4_scale() / kn_w4_zero(),
 * so one definition serves the canonical and the tiled layouts alike. */
void kn_gemv_w4a16_ref(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1)
{
    int ng = kn_ngroups(w->cols, w->group);
    for (int n = n0; n < n1; n++) {
        float acc = 0.0f;
        for (int g = 0; g < ng; g++) {
            int k0 = g * w->group, k1 = k0 + w->group < w->cols ? k0 + w->group : w->cols;
            float s = 0.0f;
            for (int k = k0; k < k1; k++)
                s += (float)kn_w4_code(w, n, k) * x->x[k];
            acc += kn_f16_to_f32(kn_w4_scale(w, n, g)) *
                   (s - (float)kn_w4_zero(w, n, g) * x->gsum[g]);
        }
        y[n] = acc;
    }
}

void kn_gemv_w4a8_ref(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1)
{
    int ng = kn_ngroups(w->cols, w->group);
    for (int n = n0; n < n1; n++) {
        float acc = 0.0f;
        for (int g = 0; g < ng; g++) {
            int k0 = g * w->group, k1 = k0 + w->group < w->cols ? k0 + w->group : w->cols;
            int32_t s = 0;
            for (int k = k0; k < k1; k++)
                s += kn_w4_code(w, n, k) * x->q[k];
            /* codes are value + 8: subtract 8 * sum(q) over the group (padding q is 0) */
            acc += kn_f16_to_f32(kn_w4_scale(w, n, g)) * (float)(s - 8 * x->qgsum[g]);
        }
        y[n] = acc * x->qscale;
    }
}

/* The reference's matrix products: its GEMV of the format for each of the m activations. */
#define MM_EACH(name, gemv)                                                                        \
    static void name(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,  \
                     int n0, int n1)                                                               \
    {                                                                                              \
        for (int i = 0; i < m; i++)                                                                \
            gemv(w, &x[i], y + (size_t)i * ldy, n0, n1);                                           \
    }
MM_EACH(mm_f32, kn_gemv_f32_ref)
MM_EACH(mm_bf16, kn_gemv_bf16_ref)
MM_EACH(mm_q8, kn_gemv_q8_ref)
MM_EACH(mm_q6, kn_gemv_q6_ref)
MM_EACH(mm_w4a16, kn_gemv_w4a16_ref)
MM_EACH(mm_w4a8, kn_gemv_w4a8_ref)

void kn_gemv_ref(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1)
{
    kn_mm_check(w, x, 1, n0, n1);
    kn_ops_ref.mm[w->dtype](w, x, 1, y, 0, n0, n1);
}

void kn_gemm_ref(const struct kn_mat *w, const struct kn_act *x, int m, float *y, int ldy, int n0,
                 int n1)
{
    kn_mm_check(w, x, m, n0, n1);
    kn_ops_ref.mm[w->dtype](w, x, m, y, (size_t)ldy, n0, n1);
}

void kn_rmsnorm_ref(float *o, const float *x, const float *w, int n, float eps)
{
    float ss = 0.0f;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    ss = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++)
        o[i] = w[i] * (ss * x[i]);
}

void kn_rope_ref(float *v, int nheads, int hd, int pos, const float *inv_freq, float mscale,
                 bool neox)
{
    float fcr[KN_MAX_HEAD_DIM / 2], fci[KN_MAX_HEAD_DIM / 2]; /* the same for every head */
    KN_ASSERT(hd <= KN_MAX_HEAD_DIM);
    for (int i = 0; i < hd / 2; i++) {
        float val = (float)pos * inv_freq[i];
        fcr[i] = cosf(val) * mscale; /* exact when mscale is 1 */
        fci[i] = sinf(val) * mscale;
    }
    for (int h = 0; h < nheads; h++) {
        float *p = v + (size_t)h * (size_t)hd;
        for (int i = 0; i < hd; i += 2) {
            int a = neox ? i / 2 : i, b = neox ? i / 2 + hd / 2 : i + 1;
            float v0 = p[a], v1 = p[b];
            p[a] = v0 * fcr[i / 2] - v1 * fci[i / 2];
            p[b] = v0 * fci[i / 2] + v1 * fcr[i / 2];
        }
    }
}

/* Softmax of n values in place with a sink: a logit @sink in the denominator that takes no
 * share, p_i = e^(x_i - M) / (sum_i e^(x_i - M) + e^(sink - M)), M = max(max_i x_i, sink). */
static void softmax_sink(float *x, int n, float sink)
{
    float mx = sink;
    for (int i = 0; i < n; i++)
        mx = fmaxf(mx, x[i]);
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    sum += expf(sink - mx);
    for (int i = 0; i < n; i++)
        x[i] /= sum;
}

/* (no sink: -inf adds e^-inf = 0 to the sum and leaves the max to the values, the same bits) */
void kn_softmax_ref(float *x, int n) { softmax_sink(x, n, -INFINITY); }

void kn_silu_mul_ref(float *a, const float *b, int n)
{
    for (int i = 0; i < n; i++)
        a[i] = a[i] * (1.0f / (1.0f + expf(-a[i]))) * b[i];
}

void kn_swiglu_oai_mul_ref(float *a, const float *b, int n)
{
    const float alpha = 1.702f, limit = 7.0f;
    for (int i = 0; i < n; i++) {
        float g = a[i] < limit ? a[i] : limit;
        float u = b[i] < -limit ? -limit : b[i] > limit ? limit : b[i];
        a[i] = g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
    }
}

void kn_gelu_mul_ref(float *a, const float *b, int n)
{
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int i = 0; i < n; i++) {
        float x = a[i];
        a[i] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) * b[i];
    }
}

void kn_softcap_ref(float *x, int n, float cap)
{
    for (int i = 0; i < n; i++)
        x[i] = cap * tanhf(x[i] / cap);
}

void kn_attention_ref(float *out, size_t out_stride, const float *q, size_t q_stride, int nt,
                      int nh, int pos0, const struct kn_kv *kv, int hd, float *scratch,
                      const struct kn_att *opt)
{
    KN_ASSERT(nt >= 1 && nh >= 1 && nt * nh <= KN_ATT_TILE && pos0 >= 0 && hd <= KN_MAX_HEAD_DIM);
    static const struct kn_att plain;
    if (!opt)
        opt = &plain;
    KN_ASSERT(opt->window >= 0 && opt->softcap >= 0.0f);
    float div = sqrtf((float)hd);
    for (int i = 0; i < nt; i++)
        for (int j = 0; j < nh; j++) {
            const float *qh = q + (size_t)i * q_stride + (size_t)j * (size_t)hd;
            float *oh = out + (size_t)i * out_stride + (size_t)j * (size_t)hd;
            int pos = pos0 + i, t0 = opt->window && pos >= opt->window ? pos - opt->window + 1 : 0;
            float *s = scratch + t0; /* s[t] for t0 <= t <= pos */
            for (int t = t0; t <= pos; t++) {
                float d = dot_f32(qh, kv->k + kn_kv_off(kv, t), hd);
                /* the division by sqrt(hd), as before the options existed */
                s[t - t0] = opt->scale != 0.0f ? d * opt->scale : d / div;
                if (opt->softcap > 0.0f)
                    s[t - t0] = opt->softcap * tanhf(s[t - t0] / opt->softcap);
            }
            if (opt->sinks)
                softmax_sink(s, pos - t0 + 1, opt->sinks[j]);
            else
                kn_softmax_ref(s, pos - t0 + 1);
            for (int d = 0; d < hd; d++)
                oh[d] = 0.0f;
            for (int t = t0; t <= pos; t++) {
                const float *vt = kv->v + kn_kv_off(kv, t);
                for (int d = 0; d < hd; d++)
                    oh[d] += s[t - t0] * vt[d];
            }
        }
}

/* kn_gemm_ref as a table entry: no scratch */
static void gemm_ref(const struct kn_mat *w, const struct kn_act *x, int m, float *y, int ldy,
                     int n0, int n1, const struct kn_scratch *scratch)
{
    kn_gemm_ref(w, x, m, y, ldy, n0, n1);
}

KN_GRAM_TILE(gram_tile)

const struct kn_ops kn_ops_ref = {
    .name = "ref",
    .isa = KN_ISA_REF,
    /* the int4 references read elements through kn_w4_code(): one for both layouts */
    .mm = {[KN_DT_F32] = mm_f32,
           [KN_DT_BF16] = mm_bf16,
           [KN_DT_Q8] = mm_q8,
           [KN_DT_W4A16] = mm_w4a16,
           [KN_DT_W4A8] = mm_w4a8,
           [KN_DT_W4A8_T] = mm_w4a8,
           [KN_DT_W4A16_T] = mm_w4a16,
           [KN_DT_Q6] = mm_q6},
    .act_prepare = kn_act_prepare_scalar,
    .gemv = kn_gemv_ref,
    .gemm = gemm_ref,
    .rmsnorm = kn_rmsnorm_ref,
    .rope = kn_rope_ref,
    .softmax = kn_softmax_ref,
    .silu_mul = kn_silu_mul_ref,
    .gelu_mul = kn_gelu_mul_ref,
    .swiglu_oai_mul = kn_swiglu_oai_mul_ref,
    .softcap = kn_softcap_ref,
    .attention = kn_attention_ref,
    .gram_tile = gram_tile,
};
