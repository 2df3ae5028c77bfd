/* SPDX-License-Identifier: MIT */
/* kernels/arch/avx2/kn_avx2.c: the AVX2 table (AVX2, FMA, F16C) for x86 servers without AVX-512.
 *
 * W4A8 tiles: VPMADDUBSW multiplies the unsigned 4-bit codes by the signed int8 activations and
 * adds pairs into int16 (|low + high nibble sums| <= 4 * 15 * 128, no saturation), VPMADDWD
 * by ones adds pairs into the int32 lane of the weight row. A 32-byte load is half an octet: 8
 * rows x 8 inputs. A micro tile is TM tokens x 16 rows; int32 accumulators start at
 * -8 * qgsum per group and are scaled into float ones, as in the AVX-512 kernel.
 * W4A16 tiles: FMA over codes widened to float, 8 rows a vector. F32, BF16, Q8 and W4A16
 * rows: FMA row dots. Attention: 8 queries in the lanes, online softmax over blocks of 8 keys.
 * Activation preparation: the scalar one's results in 8 lanes. The canonical W4A8 layout (never
 * in a segment) and the small ops other than rmsnorm and attention are the reference's.
 *
 * Loads at the end of a row are masked (VPMASKMOV) or go through a zero-padded copy, so no
 * kernel reads past the matrix. */
#include "../kn_gram.h"
#include "../kn_prefetch.h"
#include "../kn_rows.h"
#include "../ref/kn_ref.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* Software prefetch distance, bytes ahead in the weight stream of the row formats and the
 * prefill tiles: 1024 held the W4A8 tile GEMV to 21 GB/s on one Zen 4 thread, 4096 gave 28-31
 * (`shardlm bench kernels --isa avx2`). Decode's GEMVs (W4A8 tiles, q8) time their prefetch on
 * each host instead (kernels/kn_prefetch.c). */
#define PF_AHEAD 4096

static inline float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lane mask of the first @n of 8 int32 lanes. */
static inline __m256i mask8(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Stores the 16 rows from @row0 held in @lo, @hi (8 each) into y[row0 ..], those in [n0, n1). */
static inline void store_rows(float *y, __m256 lo, __m256 hi, int row0, int n0, int n1)
{
    for (int h = 0; h < 2; h++) {
        int r = row0 + 8 * h;
        __m256i m = _mm256_andnot_si256(mask8(n0 - r), mask8(n1 - r));
        _mm256_maskstore_ps(y + r, m, h ? hi : lo);
    }
}

static float dot_f32(const float *w, const float *x, int k)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= k; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    for (; i < k; i += 8) {
        __m256i m = mask8(k - i);
        a0 = _mm256_fmadd_ps(_mm256_maskload_ps(w + i, m), _mm256_maskload_ps(x + i, m), a0);
    }
    return hsum256(_mm256_add_ps(a0, a1));
}

static float dot_bf16(const uint16_t *w, const float *x, int k)
{
    __m256 a0 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + i)));
        a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)), _mm256_loadu_ps(x + i),
                             a0);
    }
    float s = hsum256(a0);
    for (; i < k; i++)
        s += kn_bf16_to_f32(w[i]) * x[i];
    return s;
}

/* One int8 row against one token's int16 activations (KN_DT_Q8, see kn.h): per 16 columns the
 * codes widen to int16 (VPMOVSXBW) and VPMADDWD adds pairs of products into 8 int32 lanes, two
 * accumulators; every KN_Q8_CHUNK columns the lanes go into an int64, so the sum is the
 * reference's exactly. */
static inline __attribute__((always_inline)) int64_t dot_q8(const int8_t *w, const int16_t *q,
                                                            int k, int pf)
{
    int64_t sum = 0;
    for (int c0 = 0; c0 < k; c0 += KN_Q8_CHUNK) {
        int c1 = k - c0 < KN_Q8_CHUNK ? k : c0 + KN_Q8_CHUNK, i = c0;
        __m256i a0 = _mm256_setzero_si256(), a1 = a0;
        for (; i + 32 <= c1; i += 32) {
            if (!(i & 32))
                pf_line(w + i, pf); /* once per line */
            __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + i)));
            __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + i + 16)));
            a0 = _mm256_add_epi32(
                a0, _mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)(q + i))));
            a1 = _mm256_add_epi32(
                a1, _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(q + i + 16))));
        }
        int32_t lanes[8];
        _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi32(a0, a1));
        for (int l = 0; l < 8; l++)
            sum += lanes[l];
        for (; i < c1; i++)
            sum += (int32_t)w[i] * q[i];
    }
    return sum;
}

/* Rows [n0, n1) x m tokens of an int8 matrix: each row read once, from cache for the tokens
 * after the first; @pf the software prefetch of a one-token call. */
static inline __attribute__((always_inline)) void mm_q8_pf(const struct kn_mat *w,
                                                           const struct kn_act *x, int m, float *y,
                                                           size_t ldy, int n0, int n1, int pf)
{
    for (int n = n0; n < n1; n++) {
        const int8_t *row = (const int8_t *)w->codes + (size_t)n * (size_t)w->cols;
        float s = ((const float *)w->scales)[n];
        for (int i = 0; i < m; i++)
            y[(size_t)i * ldy + (size_t)n] =
                s * (x[i].q16scale * (float)dot_q8(row, x[i].q16, w->cols, pf));
    }
}

static void mm_q8(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                  int n0, int n1)
{
    if (m > 1)
        mm_q8_pf(w, x, m, y, ldy, n0, n1, KN_PF_HW);
    else
        KN_PF_RUN(w, n1 - n0, mm_q8_pf, w, x, m, y, ldy, n0, n1);
}

/* ---- 6-bit rows (KN_DT_Q6): the AVX-512 table's method in two 8-lane halves ----
 * A 64-byte vector of a block is lanes 0-7 in its first 32 bytes, 8-15 in the others; codes meet
 * activations in VPMADDUBSW (two products per int16: at most 2 x 63 x 127, no saturation), then
 * VPMADDWD against ones gives the lane sums; the float steps are kn_gemv_q6_ref's, so the result
 * is its bit for bit. One row at a time, Q6_T tokens at a time. */
#define Q6_T 2

/* Half @h of vector v of the block at @blk, the 32 codes */
static inline __attribute__((always_inline)) __m256i q6_codes(const uint8_t *blk, int v, int h)
{
    const __m256i lo4 = _mm256_set1_epi8(15), hi2 = _mm256_set1_epi8(0x30);
    __m256i n = _mm256_loadu_si256((const __m256i *)(blk + 64 * (v / 2) + 32 * h));
    __m256i hb = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
    __m256i c = _mm256_and_si256(v % 2 ? _mm256_srli_epi16(n, 4) : n, lo4);
    hb = v == 0   ? _mm256_slli_epi16(hb, 4)
         : v == 1 ? _mm256_slli_epi16(hb, 2)
         : v == 3 ? _mm256_srli_epi16(hb, 2)
                  : hb;
    return _mm256_or_si256(c, _mm256_and_si256(hb, hi2));
}

static inline __attribute__((always_inline)) float q6_reduce(__m256 lo, __m256 hi)
{
    __m256 h8 = _mm256_add_ps(lo, hi);
    __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
}

/* Row @w (@nb blocks, scales @sc) against tokens x[0 .. nt) into out[t] */
static inline __attribute__((always_inline)) void q6_row(const uint8_t *w, const uint16_t *sc,
                                                         int nb, const struct kn_act *x, int nt,
                                                         int pf, float out[Q6_T])
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[Q6_T][2];
#pragma GCC unroll 2
    for (int t = 0; t < nt; t++)
        acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * 192;
        pf_line(blk, pf);
        pf_line(blk + 64, pf);
        pf_line(blk + 128, pf);
        __m256 sw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + 8 * b)));
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i u[4];
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
                u[v] = q6_codes(blk, v, h);
#pragma GCC unroll 2
            for (int t = 0; t < nt; t++) {
                const int8_t *a = x[t].q6 + (size_t)b * KN_Q6_BLOCK + 32 * h;
                __m256i p01 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(u[0], _mm256_loadu_si256((const __m256i *)a)),
                    _mm256_maddubs_epi16(u[1], _mm256_loadu_si256((const __m256i *)(a + 64))));
                __m256i p23 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(u[2], _mm256_loadu_si256((const __m256i *)(a + 128))),
                    _mm256_maddubs_epi16(u[3], _mm256_loadu_si256((const __m256i *)(a + 192))));
                __m256i d =
                    _mm256_add_epi32(_mm256_madd_epi16(p01, ones), _mm256_madd_epi16(p23, ones));
                d = _mm256_sub_epi32(
                    d, _mm256_loadu_si256((const __m256i *)(x[t].q6sum + 16 * b + 8 * h)));
                __m256 ts = _mm256_mul_ps(sw, _mm256_loadu_ps(x[t].q6scale + 16 * b + 8 * h));
                acc[t][h] = _mm256_fmadd_ps(ts, _mm256_cvtepi32_ps(d), acc[t][h]);
            }
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < nt; t++)
        out[t] = q6_reduce(acc[t][0], acc[t][1]);
}

static void mm_q6_pf(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                     int n0, int n1, int pf)
{
    int nb = kn_q6_blocks(w->cols), spr = nb * 8;
    size_t rb = kn_row_bytes(KN_DT_Q6, w->cols);
    for (int n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)w->codes + (size_t)n * rb;
        const uint16_t *sc = (const uint16_t *)w->scales + (size_t)n * (size_t)spr;
        for (int t0 = 0; t0 < m; t0 += Q6_T) {
            float out[Q6_T] = {0};
            if (m - t0 >= 2)
                q6_row(row, sc, nb, x + t0, 2, pf, out);
            else
                q6_row(row, sc, nb, x + t0, 1, pf, out);
            for (int t = 0; t < Q6_T && t0 + t < m; t++)
                y[(size_t)(t0 + t) * ldy + (size_t)n] = out[t];
        }
    }
}

static void mm_q6(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                  int n0, int n1)
{
    if (m > 1)
        mm_q6_pf(w, x, m, y, ldy, n0, n1, KN_PF_HW);
    else
        KN_PF_RUN(w, n1 - n0, mm_q6_pf, w, x, m, y, ldy, n0, n1);
}

/* One W4A16 row as kn_gemv_w4a16_ref: per group sum code * x over 8 bytes (16 elements) at a
 * time against x->xe / x->xo, minus zero * gsum. Whole 8-byte steps, then a scalar tail. */
static float dot_w4a16(const uint8_t *row, const uint16_t *sc, const uint8_t *zr,
                       const struct kn_act *x, int cols, int group)
{
    const __m256i lo4 = _mm256_set1_epi32(15);
    int ng = kn_ngroups(cols, group);
    float acc = 0.0f;
    for (int g = 0; g < ng; g++) {
        int k0 = g * group, kn = cols - k0 < group ? cols - k0 : group;
        int b0 = k0 / 2, nb = (kn + 1) / 2, j = 0;
        __m256 ag = _mm256_setzero_ps();
        for (; j + 8 <= nb; j += 8) {
            __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + b0 + j)));
            ag = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(c, lo4)),
                                 _mm256_loadu_ps(x->xe + b0 + j), ag);
            ag = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c, 4)),
                                 _mm256_loadu_ps(x->xo + b0 + j), ag);
        }
        float s = hsum256(ag);
        for (; j < nb; j++) /* the padding element past cols has x 0 */
            s += (float)(row[b0 + j] & 15) * x->xe[b0 + j] +
                 (float)(row[b0 + j] >> 4) * x->xo[b0 + j];
        float scale = _cvtsh_ss(sc[g]);
        acc += scale * (s - (float)zr[g] * x->gsum[g]);
    }
    return acc;
}

/* ---- W4A8 tiles ---- */
#define TM 2

static inline __attribute__((always_inline)) void w4a8t_tile(const uint8_t *blk,
                                                             const struct kn_act *x, int mt,
                                                             int cols, int group, float *y,
                                                             size_t ldy, int row0, int n0, int n1)
{
    const __m256i lo4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const int ng = kn_ngroups(cols, group), no = group / 8;
    const size_t so = kn_tile_scales_offset(cols, group);
    __m256 f[TM][2];
#pragma GCC unroll 2
    for (int i = 0; i < mt; i++)
        f[i][0] = f[i][1] = _mm256_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m256i s[TM][2];
#pragma GCC unroll 2
        for (int i = 0; i < mt; i++)
            s[i][0] = s[i][1] = _mm256_set1_epi32(-8 * x[i].qgsum[g]);
        const uint8_t *w = blk + (size_t)g * (size_t)group * 8;
        for (int o = 0; o < no; o++) {
            const uint8_t *p = w + (size_t)o * 64;
            _mm_prefetch((const char *)p + PF_AHEAD, _MM_HINT_T0);
            __m256i lo[2], hi[2];
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(p + 32 * h));
                lo[h] = _mm256_and_si256(v, lo4);
                hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
            }
#pragma GCC unroll 2
            for (int i = 0; i < mt; i++) {
                int32_t q0, q1;
                memcpy(&q0, x[i].q + (size_t)g * (size_t)group + 8 * o, 4);
                memcpy(&q1, x[i].q + (size_t)g * (size_t)group + 8 * o + 4, 4);
                __m256i a0 = _mm256_set1_epi32(q0), a1 = _mm256_set1_epi32(q1);
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], a0),
                                                   _mm256_maddubs_epi16(hi[h], a1));
                    s[i][h] = _mm256_add_epi32(s[i][h], _mm256_madd_epi16(p16, ones));
                }
            }
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 sc = _mm256_cvtph_ps(
                _mm_loadu_si128((const __m128i *)(blk + so + (size_t)g * 32 + 16 * h)));
#pragma GCC unroll 2
            for (int i = 0; i < mt; i++)
                f[i][h] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(s[i][h]), f[i][h]);
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < mt; i++) {
        __m256 qs = _mm256_set1_ps(x[i].qscale);
        store_rows(y + (size_t)i * ldy, _mm256_mul_ps(f[i][0], qs), _mm256_mul_ps(f[i][1], qs),
                   row0, n0, n1);
    }
}

/* W4A16 tiles as the AVX-512 kernel does them, in two halves of 8 rows: each element's nibble
 * widened to 8 float lanes meets the element's activation broadcast from each token. */
static inline __attribute__((always_inline)) void w4a16t_tile(const uint8_t *blk,
                                                              const struct kn_act *x, int mt,
                                                              int cols, int group, float *y,
                                                              size_t ldy, int row0, int n0, int n1)
{
    const __m256i lo4 = _mm256_set1_epi32(15);
    const int ng = kn_ngroups(cols, group), no = group / 8;
    const size_t so = kn_tile_scales_offset(cols, group), zo = kn_tile_zeros_offset(cols, group);
    __m256 f[TM][2];
#pragma GCC unroll 2
    for (int i = 0; i < mt; i++)
        f[i][0] = f[i][1] = _mm256_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m256 a[TM][2];
#pragma GCC unroll 2
        for (int i = 0; i < mt; i++)
            a[i][0] = a[i][1] = _mm256_setzero_ps();
        const uint8_t *w = blk + (size_t)g * (size_t)group * 8;
        for (int o = 0; o < no; o++) {
            const uint8_t *p = w + (size_t)o * 64;
            _mm_prefetch((const char *)p + PF_AHEAD, _MM_HINT_T0);
            __m256i v[2] = {_mm256_loadu_si256((const __m256i *)p),
                            _mm256_loadu_si256((const __m256i *)(p + 32))};
            size_t k = (size_t)g * (size_t)group + 8 * (size_t)o;
#pragma GCC unroll 8
            for (int e = 0; e < 8; e++) {
                const int shift = e < 4 ? 8 * e : 8 * (e - 4) + 4;
                __m256 c[2];
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++)
                    c[h] =
                        _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v[h], shift), lo4));
#pragma GCC unroll 2
                for (int i = 0; i < mt; i++) {
                    __m256 xb = _mm256_broadcast_ss(&x[i].x[k + (size_t)e]);
                    a[i][0] = _mm256_fmadd_ps(c[0], xb, a[i][0]);
                    a[i][1] = _mm256_fmadd_ps(c[1], xb, a[i][1]);
                }
            }
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 sc = _mm256_cvtph_ps(
                _mm_loadu_si128((const __m128i *)(blk + so + (size_t)g * 32 + 16 * h)));
            __m256 z = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                _mm_loadl_epi64((const __m128i *)(blk + zo + (size_t)g * 16 + 8 * h))));
#pragma GCC unroll 2
            for (int i = 0; i < mt; i++)
                f[i][h] = _mm256_fmadd_ps(
                    sc, _mm256_fnmadd_ps(z, _mm256_set1_ps(x[i].gsum[g]), a[i][h]), f[i][h]);
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < mt; i++) {
        store_rows(y + (size_t)i * ldy, f[i][0], f[i][1], row0, n0, n1);
    }
}


/* Groups whose int32 sums a GEMV block keeps before it reads their scales: 128 x 64 bytes of
 * stack, a whole block's up to 16384 columns at group 128. */
#define GEMV_SUMS 128

/* The int32 sums of groups [g0, g1) of one block into @sums (two halves of 8 rows a group), the
 * zero point taken off: the int16 pair sums of up to 4 octets add up before one VPMADDWD widens
 * them (4 * 2 * 2 * 15 * 127 = 30480 < 32767), and the two halves keep separate chains. */
static inline __attribute__((always_inline)) void w4a8t_gemv_sums(const uint8_t *blk,
                                                                  const struct kn_act *x, int group,
                                                                  int g0, int g1,
                                                                  __m256i (*sums)[2], int pf)
{
    const __m256i lo4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const int no = group / 8;
    for (int g = g0; g < g1; g++) {
        const uint8_t *w = blk + (size_t)g * (size_t)group * 8;
        const int8_t *q = x->q + (size_t)g * (size_t)group;
        __m256i s0 = _mm256_set1_epi32(-8 * x->qgsum[g]), s1 = s0;
        for (int o0 = 0; o0 < no; o0 += 4) {
            __m256i p0 = _mm256_setzero_si256(), p1 = _mm256_setzero_si256();
            int o1 = o0 + 4 < no ? o0 + 4 : no;
            for (int o = o0; o < o1; o++) {
                const uint8_t *p = w + (size_t)o * 64;
                pf_line(p, pf);
                int32_t qa, qb;
                memcpy(&qa, q + 8 * o, 4);
                memcpy(&qb, q + 8 * o + 4, 4);
                __m256i a0 = _mm256_set1_epi32(qa), a1 = _mm256_set1_epi32(qb);
                __m256i v0 = _mm256_loadu_si256((const __m256i *)p);
                __m256i v1 = _mm256_loadu_si256((const __m256i *)(p + 32));
                p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(_mm256_and_si256(v0, lo4), a0));
                p0 = _mm256_add_epi16(
                    p0, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v0, 4), lo4), a1));
                p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(_mm256_and_si256(v1, lo4), a0));
                p1 = _mm256_add_epi16(
                    p1, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v1, 4), lo4), a1));
            }
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(p0, ones));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(p1, ones));
        }
        sums[g - g0][0] = s0;
        sums[g - g0][1] = s1;
    }
}

/* Decode's case, one token, one block of 16 rows: the codes of (up to GEMV_SUMS) groups first,
 * then their scales, which follow them in the block (kn_avx512.c's w4a8t_gemv_block says what
 * the two passes are worth). The float sums run in group order: the results of the one-pass
 * loop, bit for bit. */
static inline __attribute__((always_inline)) void w4a8t_gemv_block(const uint8_t *blk,
                                                                   const struct kn_act *x, int cols,
                                                                   int group, float *y, int row0,
                                                                   int n0, int n1, int pf)
{
    const int ng = kn_ngroups(cols, group);
    const size_t so = kn_tile_scales_offset(cols, group);
    __m256i sums[GEMV_SUMS][2];
    __m256 f0 = _mm256_setzero_ps(), f1 = _mm256_setzero_ps();
    for (int g0 = 0; g0 < ng; g0 += GEMV_SUMS) {
        int g1 = ng - g0 < GEMV_SUMS ? ng : g0 + GEMV_SUMS;
        w4a8t_gemv_sums(blk, x, group, g0, g1, sums, pf);
        for (int g = g0; g < g1; g++) {
            const uint8_t *sp = blk + so + (size_t)g * 32;
            f0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sp)),
                                 _mm256_cvtepi32_ps(sums[g - g0][0]), f0);
            f1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sp + 16))),
                                 _mm256_cvtepi32_ps(sums[g - g0][1]), f1);
        }
    }
    __m256 qs = _mm256_set1_ps(x->qscale);
    store_rows(y, _mm256_mul_ps(f0, qs), _mm256_mul_ps(f1, qs), row0, n0, n1);
}

/* The micro tile of @tile for 1 or 2 tokens, each compiled with its count as a constant. */
#define MICRO_TILES(name, tile)                                                                    \
    static void name(const uint8_t *blk, const struct kn_act *x, int mt, int cols, int group,    \
                     float *y, size_t ldy, int row0, int n0, int n1)                               \
    {                                                                                              \
        if (mt == 2)                                                                               \
            tile(blk, x, 2, cols, group, y, ldy, row0, n0, n1);                                    \
        else                                                                                       \
            tile(blk, x, 1, cols, group, y, ldy, row0, n0, n1);                                    \
    }
MICRO_TILES(w4a8t_micro, w4a8t_tile)
MICRO_TILES(w4a16t_micro, w4a16t_tile)

/* Rows [n0, n1) x m tokens of a tiled matrix with blocks of @bb bytes, TM tokens at a time. */
static void mm_tiles(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                     int n0, int n1, size_t bb,
                     void (*micro)(const uint8_t *, const struct kn_act *, int, int, int, float *,
                                   size_t, int, int, int))
{
    KN_ASSERT(w->group % 8 == 0);
    for (int b = n0 / KN_TILE_ROWS; b * KN_TILE_ROWS < n1; b++) {
        const uint8_t *blk = (const uint8_t *)w->codes + (size_t)b * bb;
        for (int i = 0; i < m; i += TM)
            micro(blk, x + i, m - i < TM ? m - i : TM, w->cols, w->group, y + (size_t)i * ldy, ldy,
                  b * KN_TILE_ROWS, n0, n1);
    }
}

/* Rows [n0, n1) of one token, block by block, with the software prefetch @pf (a constant in
 * each of KN_PF_RUN's calls). */
static inline __attribute__((always_inline)) void w4a8t_gemv(const struct kn_mat *w,
                                                             const struct kn_act *x, float *y,
                                                             int n0, int n1, size_t bb, int pf)
{
    for (int b = n0 / KN_TILE_ROWS; b * KN_TILE_ROWS < n1; b++)
        w4a8t_gemv_block((const uint8_t *)w->codes + (size_t)b * bb, x, w->cols, w->group, y,
                         b * KN_TILE_ROWS, n0, n1, pf);
}

static void mm_w4a8t(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                     int n0, int n1)
{
    size_t bb = kn_tile_block_bytes(KN_DT_W4A8_T, w->cols, w->group);
    if (m == 1) {
        KN_ASSERT(w->group % 8 == 0);
        KN_PF_RUN(w, n1 - n0, w4a8t_gemv, w, x, y, n0, n1, bb);
        return;
    }
    mm_tiles(w, x, m, y, ldy, n0, n1, bb, w4a8t_micro);
}

static void mm_w4a16t(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                      int n0, int n1)
{
    mm_tiles(w, x, m, y, ldy, n0, n1, kn_tile_block_bytes(KN_DT_W4A16_T, w->cols, w->group),
             w4a16t_micro);
}

/* ---- row formats: each weight row against the m activations ---- */

KN_MM_ROWS(mm_f32, float, dot_f32, false)
KN_MM_ROWS(mm_bf16, uint16_t, dot_bf16, false)

static void mm_w4a16(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                     int n0, int n1)
{
    size_t rb = kn_w4_row_bytes(w->cols), ng = (size_t)kn_ngroups(w->cols, w->group);
    for (int n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)w->codes + (size_t)n * rb;
        const uint16_t *sc = (const uint16_t *)w->scales + (size_t)n * ng;
        const uint8_t *zr = w->zeros + (size_t)n * ng;
        for (int i = 0; i < m; i++)
            y[(size_t)i * ldy + (size_t)n] = dot_w4a16(row, sc, zr, &x[i], w->cols, w->group);
    }
}

/* The canonical W4A8 layout is never in a segment (they hold tiles): the reference's. */
static void mm_ref(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                   int n0, int n1)
{
    kn_ops_ref.mm[w->dtype](w, x, m, y, ldy, n0, n1);
}

static void kn_gemm_avx2(const struct kn_mat *w, const struct kn_act *x, int m, float *y, int ldy,
                         int n0, int n1, const struct kn_scratch *scratch)
{
    kn_mm_check(w, x, m, n0, n1);
    kn_ops_avx2.mm[w->dtype](w, x, m, y, (size_t)ldy, n0, n1);
}

static void kn_gemv_avx2(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1)
{
    kn_mm_check(w, x, 1, n0, n1);
    kn_ops_avx2.mm[w->dtype](w, x, 1, y, 0, n0, n1);
}

/* ---- activation preparation ---- */

static inline float hmax256(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int32_t hsum256_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* As kn_act_prepare_scalar, bit for bit but for the order of the float group sums: VCVTPS2DQ
 * rounds to nearest even as lrintf does, the low byte of each lane is the (int8_t) cast, max
 * |x| ignores NaNs as the scalar comparison does (MAXPS returns its second operand then), and
 * the int8 sums are taken over the stored bytes. Then q16 and the even/odd split (floats by
 * shuffles, bytes by one PSHUFB), where a->parts asks for them; x, q and the sums always. */
void kn_act_prepare_avx2(struct kn_act *a, const float *x)
{
    int k = a->k, kp = a->kpad, g = a->group;
    if (g % 8) {
        kn_act_prepare_scalar(a, x);
        return;
    }
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < k; i += 8)
        mx = _mm256_max_ps(_mm256_and_ps(_mm256_maskload_ps(x + i, mask8(k - i)), abs_mask), mx);
    float amax = hmax256(mx);
    a->qscale = amax / 127.0f;
    __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    /* byte 0 of each int32 lane, lanes 0-3 then 4-7 (the two halves joined by the permute) */
    const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                               -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,
                                               -1, -1, -1, -1);
    const __m256i join = _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1);
    for (int gi = 0; gi < kp / g; gi++) {
        __m256 s = _mm256_setzero_ps();
        __m256i qs = _mm256_setzero_si256();
        for (int i = gi * g; i < (gi + 1) * g; i += 8) {
            __m256 v = _mm256_maskload_ps(x + i, mask8(k - i)); /* zeros past k */
            __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(v, inv));
            q = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(q, low_bytes), join);
            __m128i q8 = _mm256_castsi256_si128(q);
            _mm256_storeu_ps(a->x + i, v);
            _mm_storel_epi64((__m128i *)(a->q + i), q8);
            s = _mm256_add_ps(s, v);
            qs = _mm256_add_epi32(qs, _mm256_cvtepi8_epi32(q8));
        }
        a->gsum[gi] = hsum256(s);
        a->qgsum[gi] = hsum256_epi32(qs);
    }
    if (a->parts & KN_ACT_Q16)
        kn_act_prepare_q16(a, amax);
    if (a->parts & KN_ACT_Q6)
        kn_act_prepare_q6(a, x);
    if (!(a->parts & (KN_ACT_EO | KN_ACT_QEO)))
        return;
    const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    int h = kp / 2, i = 0;
    for (; i + 8 <= h; i += 8) {
        __m256 lo = _mm256_loadu_ps(a->x + 2 * i), hi = _mm256_loadu_ps(a->x + 2 * i + 8);
        /* per 128-bit half: lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6; then the pairs in order */
        __m256 e = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));
        __m256 o = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
        e = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
        o = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
        _mm256_storeu_ps(a->xe + i, e);
        _mm256_storeu_ps(a->xo + i, o);
        __m128i b = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(a->q + 2 * i)), split);
        _mm_storel_epi64((__m128i *)(a->qe + i), b);
        _mm_storel_epi64((__m128i *)(a->qo + i), _mm_srli_si128(b, 8));
    }
    for (; i < h; i++) {
        a->xe[i] = a->x[2 * i];
        a->xo[i] = a->x[2 * i + 1];
        a->qe[i] = a->q[2 * i];
        a->qo[i] = a->q[2 * i + 1];
    }
}

static void kn_rmsnorm_avx2(float *o, const float *x, const float *w, int n, float eps)
{
    __m256 ss = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        ss = _mm256_fmadd_ps(v, v, ss);
    }
    float s = hsum256(ss);
    for (; i < n; i++)
        s += x[i] * x[i];
    float inv = 1.0f / sqrtf(s / (float)n + eps);
    for (i = 0; i < n; i++)
        o[i] = w[i] * (inv * x[i]);
}

/* ---- attention: as the AVX-512 kernel, 8 queries in the lanes, blocks of 8 keys ---- */
_Static_assert(KN_KV_BLOCK % 8 == 0, "a block of 8 keys lies in one KV cache block");

/* e^x for x <= 0 (arguments below -87 give e^-87; callers mask those): Cody-Waite reduction,
 * Taylor polynomial to r^6, 2^n built in the exponent field. */
static inline __m256 exp_neg(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* tanh(x) as the AVX-512 table's: the odd Taylor polynomial to x^9 below |x| = 1/4, (1 - e) /
 * (1 + e) with e = e^-2|x| above, the sign of x put back. */
static inline __m256 tanh_ps(__m256 x)
{
    __m256 sign = _mm256_set1_ps(-0.0f), a = _mm256_andnot_ps(sign, x), x2 = _mm256_mul_ps(x, x);
    __m256 p = _mm256_set1_ps(62.0f / 2835);
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-17.0f / 315));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(2.0f / 15));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-1.0f / 3));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, x2), x, x);
    __m256 e = exp_neg(_mm256_mul_ps(a, _mm256_set1_ps(-2.0f)));
    __m256 t = _mm256_div_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), e),
                             _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    t = _mm256_or_ps(t, _mm256_and_ps(sign, x));
    return _mm256_blendv_ps(t, p, _mm256_cmp_ps(a, _mm256_set1_ps(0.25f), _CMP_LT_OQ));
}

/* As the AVX-512 table's: 8 lanes, lmin the lane's first key (its window's start), cap the
 * soft-cap (0: none) and its inverse. */
struct att_state {
    _Alignas(32) float qt[KN_MAX_HEAD_DIM][8];
    _Alignas(32) float ot[KN_MAX_HEAD_DIM][8];
    __m256 m, sum;
    __m256i lpos, lmin;
    float cap, inv_cap;
};

/* Keys t0 .. t0 + 7, rows k / v + u * stride (u < 8, all readable). */
static void att_block(struct att_state *st, const float *k, const float *v, size_t stride, int t0,
                      int hd)
{
    __m256 s[8], valid[8];
#pragma GCC unroll 8
    for (int u = 0; u < 8; u++)
        s[u] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d++) {
        __m256 qd = _mm256_load_ps(st->qt[d]);
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++)
            s[u] =
                _mm256_fmadd_ps(qd, _mm256_broadcast_ss(&k[(size_t)u * stride + (size_t)d]), s[u]);
    }
    if (st->cap > 0.0f) {
        __m256 cap = _mm256_set1_ps(st->cap), inv = _mm256_set1_ps(st->inv_cap);
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++)
            s[u] = _mm256_mul_ps(cap, tanh_ps(_mm256_mul_ps(s[u], inv)));
    }
    __m256 mb = st->m;
#pragma GCC unroll 8
    for (int u = 0; u < 8; u++) {
        /* lmin <= t <= lpos: t > lmin - 1 and lpos + 1 > t */
        __m256i t = _mm256_set1_epi32(t0 + u);
        valid[u] = _mm256_castsi256_ps(_mm256_andnot_si256(
            _mm256_cmpgt_epi32(st->lmin, t),
            _mm256_cmpgt_epi32(_mm256_add_epi32(st->lpos, _mm256_set1_epi32(1)), t)));
        mb = _mm256_blendv_ps(mb, _mm256_max_ps(mb, s[u]), valid[u]);
    }
    __m256 corr = exp_neg(_mm256_sub_ps(st->m, mb)), sum = _mm256_mul_ps(st->sum, corr);
#pragma GCC unroll 8
    for (int u = 0; u < 8; u++) {
        s[u] = _mm256_and_ps(valid[u], exp_neg(_mm256_sub_ps(s[u], mb)));
        sum = _mm256_add_ps(sum, s[u]);
    }
    st->m = mb;
    st->sum = sum;
    int d = 0;
    for (; d + 4 <= hd; d += 4) {
        __m256 acc[4];
#pragma GCC unroll 4
        for (int e = 0; e < 4; e++)
            acc[e] = _mm256_mul_ps(_mm256_load_ps(st->ot[d + e]), corr);
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++) {
            const float *vr = v + (size_t)u * stride + (size_t)d;
#pragma GCC unroll 4
            for (int e = 0; e < 4; e++)
                acc[e] = _mm256_fmadd_ps(s[u], _mm256_broadcast_ss(&vr[e]), acc[e]);
        }
#pragma GCC unroll 4
        for (int e = 0; e < 4; e++)
            _mm256_store_ps(st->ot[d + e], acc[e]);
    }
    for (; d < hd; d++) {
        __m256 acc = _mm256_mul_ps(_mm256_load_ps(st->ot[d]), corr);
        for (int u = 0; u < 8; u++)
            acc =
                _mm256_fmadd_ps(s[u], _mm256_broadcast_ss(&v[(size_t)u * stride + (size_t)d]), acc);
        _mm256_store_ps(st->ot[d], acc);
    }
}

/* a[i] = silu(a[i]) * b[i] = a b / (1 + e^-a), 8 lanes at a time, a scalar tail. */
static void kn_silu_mul_avx2(float *a, const float *b, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(a + i), y = _mm256_loadu_ps(b + i);
        __m256 e = exp_neg(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), x), _mm256_set1_ps(88.0f)));
        _mm256_storeu_ps(a + i, _mm256_div_ps(_mm256_mul_ps(x, y), _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
    }
    kn_silu_mul_ref(a + i, b + i, n - i);
}

/* a[i] = gelu_tanh(a[i]) * b[i] = a b / (1 + e^-2u), u = sqrt(2/pi) (a + 0.044715 a^3), as the
 * AVX-512 table, 8 lanes at a time, a scalar tail. */
static void kn_gelu_mul_avx2(float *a, const float *b, int n)
{
    const __m256 c = _mm256_set1_ps(-2.0f * 0.7978845608028654f), k = _mm256_set1_ps(0.044715f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(a + i), y = _mm256_loadu_ps(b + i);
        __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        __m256 z = _mm256_mul_ps(c, _mm256_fmadd_ps(k, x3, x));
        __m256 e = exp_neg(_mm256_min_ps(z, _mm256_set1_ps(88.0f)));
        _mm256_storeu_ps(
            a + i, _mm256_div_ps(_mm256_mul_ps(x, y), _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
    }
    kn_gelu_mul_ref(a + i, b + i, n - i);
}

/* The first key a query at @pos reads: the window's start, 0 without one. */
static int att_first(const struct kn_att *opt, int pos)
{
    return opt->window && pos >= opt->window ? pos - opt->window + 1 : 0;
}

/* x[i] = cap * tanh(x[i] / cap), 8 lanes at a time (tanh_ps), a scalar tail. */
static void kn_softcap_avx2(float *x, int n, float cap)
{
    __m256 c = _mm256_set1_ps(cap), inv = _mm256_set1_ps(1.0f / cap);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i,
                         _mm256_mul_ps(c, tanh_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv))));
    kn_softcap_ref(x + i, n - i, cap);
}

/* Up to 8 queries (lanes l0 .. l0 + 7 of the tile) over all their keys. */
static void att_lanes(float *out, size_t out_stride, const float *q, size_t q_stride, int nl,
                      int nh, int l0, int pos0, const struct kn_kv *kv, int hd,
                      const struct kn_att *opt)
{
    static _Thread_local struct att_state st; /* 64 KiB: off the stack */
    static _Thread_local _Alignas(32) float tail[2][8 * KN_MAX_HEAD_DIM];
    int n = nl - l0 < 8 ? nl - l0 : 8, T = pos0 + (l0 + n - 1) / nh + 1;
    /* the default: the division of before the options, bit for bit */
    float scale = opt->scale != 0.0f ? opt->scale : 1.0f / sqrtf((float)hd);
    int32_t lpos[8], lmin[8];
    for (int l = 0; l < 8; l++) {
        lpos[l] = l < n ? pos0 + (l0 + l) / nh : -1;
        lmin[l] = l < n ? att_first(opt, pos0 + (l0 + l) / nh) : 0;
    }
    for (int d = 0; d < hd; d++) {
        for (int l = 0; l < 8; l++) {
            int ql = l0 + l;
            st.qt[d][l] =
                l < n ? q[(size_t)(ql / nh) * q_stride + (size_t)(ql % nh * hd + d)] * scale : 0.0f;
        }
        _mm256_store_ps(st.ot[d], _mm256_setzero_ps());
    }
    st.lpos = _mm256_loadu_si256((const __m256i *)lpos);
    st.lmin = _mm256_loadu_si256((const __m256i *)lmin);
    st.cap = opt->softcap;
    st.inv_cap = opt->softcap > 0.0f ? 1.0f / opt->softcap : 0.0f;
    st.m = _mm256_set1_ps(-3.0e38f);
    st.sum = _mm256_setzero_ps();
    /* from the block of the first lane's window start: blocks before are never read */
    int t0 = lmin[0] & ~7;
    /* a block of 8 keys never straddles two cache blocks (KN_KV_BLOCK is a multiple of 8) */
    for (; t0 + 8 <= T; t0 += 8) {
        size_t off = kn_kv_off(kv, t0);
        att_block(&st, kv->k + off, kv->v + off, kv->row_stride, t0, hd);
    }
    if (t0 < T) {
        memset(tail, 0, sizeof(float) * 2 * 8 * (size_t)hd);
        for (int t = t0; t < T; t++) {
            size_t off = kn_kv_off(kv, t);
            memcpy(tail[0] + (size_t)(t - t0) * hd, kv->k + off, (size_t)hd * 4);
            memcpy(tail[1] + (size_t)(t - t0) * hd, kv->v + off, (size_t)hd * 4);
        }
        att_block(&st, tail[0], tail[1], (size_t)hd, t0, hd);
    }
    float inv[8], sum[8];
    _mm256_storeu_ps(sum, st.sum);
    for (int l = 0; l < 8; l++)
        inv[l] = 1.0f / sum[l];
    if (opt->sinks) { /* as the AVX-512 table's att_sink_inv: c / (sum c + e^(sink - m2)) */
        float sink[8];
        for (int l = 0; l < 8; l++) /* lane l: query head (l0 + l) % nh; unused: any finite */
            sink[l] = l < n ? opt->sinks[(l0 + l) % nh] : 0.0f;
        __m256 sk = _mm256_loadu_ps(sink), m2 = _mm256_max_ps(st.m, sk);
        __m256 c = exp_neg(_mm256_sub_ps(st.m, m2));
        _mm256_storeu_ps(
            inv, _mm256_div_ps(c, _mm256_fmadd_ps(st.sum, c, exp_neg(_mm256_sub_ps(sk, m2)))));
    }
    for (int l = 0; l < n; l++) {
        int ql = l0 + l;
        float *o = out + (size_t)(ql / nh) * out_stride + (size_t)(ql % nh * hd);
        for (int d = 0; d < hd; d++)
            o[d] = st.ot[d][l] * inv[l];
    }
}

static void kn_attention_avx2(float *out, size_t out_stride, const float *q, size_t q_stride,
                              int nt, int nh, int pos0, const struct kn_kv *kv, int hd,
                              float *scratch, const struct kn_att *opt)
{
    static const struct kn_att plain;
    if (!opt)
        opt = &plain;
    KN_ASSERT(nt >= 1 && nh >= 1 && nt * nh <= KN_ATT_TILE && pos0 >= 0 && hd >= 1 &&
              hd <= KN_MAX_HEAD_DIM && opt->window >= 0 && opt->softcap >= 0.0f);
    (void)scratch;
    for (int l0 = 0; l0 < nt * nh; l0 += 8)
        att_lanes(out, out_stride, q, q_stride, nt * nh, nh, l0, pos0, kv, hd, opt);
}

KN_GRAM_TILE(gram_tile)

const struct kn_ops kn_ops_avx2 = {
    .name = "avx2",
    .isa = KN_ISA_AVX2,
    .mm = {[KN_DT_F32] = mm_f32,
           [KN_DT_BF16] = mm_bf16,
           [KN_DT_Q8] = mm_q8,
           [KN_DT_W4A16] = mm_w4a16,
           [KN_DT_W4A8] = mm_ref,
           [KN_DT_W4A8_T] = mm_w4a8t,
           [KN_DT_W4A16_T] = mm_w4a16t,
           [KN_DT_Q6] = mm_q6},
    .act_prepare = kn_act_prepare_avx2,
    .gemv = kn_gemv_avx2,
    .gemm = kn_gemm_avx2,
    .rmsnorm = kn_rmsnorm_avx2,
    .rope = kn_rope_ref,
    .softmax = kn_softmax_ref,
    .silu_mul = kn_silu_mul_avx2,
    .gelu_mul = kn_gelu_mul_avx2,
    .swiglu_oai_mul = kn_swiglu_oai_mul_ref,
    .softcap = kn_softcap_avx2,
    .attention = kn_attention_avx2,
    .gram_tile = gram_tile,
};
