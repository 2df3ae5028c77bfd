/* SPDX-License-Identifier: MIT */
/* kernels/arch/avx512/kn_avx512.c: the AVX-512 table (F, BW, VL, VNNI, BF16 with FMA and F16C).
 *
 * Every matrix product is one function per weight format that computes a (m, n1 - n0) block.
 * The tiled int4 formats (what the workers hold) run register-blocked micro tiles of tokens x 16
 * row blocks, and a GEMV with four accumulators for decode; the row formats (f32, bf16, q8 and
 * the canonical int4 layouts) run the same row dot over the m activations, so a weight row is
 * read from memory once and from L1 for the other m - 1. Results match kn_ref.c up to float
 * summation order; tests/test_kernels.c holds them to named tolerances.
 *
 * Bounds: a row of W4 codes is (cols + 1) / 2 bytes and the last row of a matrix may end at the
 * end of a mapping, so every row-format code load is masked to the bytes of the current group
 * (masked-off elements of a masked load do not fault: Intel SDM vol. 1, ch. 15, memory fault
 * suppression); tile blocks are whole, padded to 16 rows and to the group. Activation loads use
 * the same masks; the prepared activations are zero-padded to kpad anyway.
 *
 * No allocation and no CPU checks per call (kn_probe.c picks the table); the attention keeps
 * its 16-lane state in thread-local storage, off the stack.
 */
#include "../kn_gram.h"
#include "kn_avx512.h"
#include "../kn_prefetch.h"
#include "../kn_rows.h"
#include "../ref/kn_ref.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* Software prefetch distance for weight rows, in bytes, of the row formats and the prefill
 * tiles. On the VM they were tuned on, W4A8 rows over 134 MB went from 5.6 to 26 GB/s (one
 * thread) with 1024 bytes ahead; over the tile layout 4096 ahead reached 31-33 GB/s against 26 at
 * 1024 (`shardlm bench kernels`). Decode's GEMVs (W4A8 tiles, q8) time their prefetch on each
 * host instead (kernels/kn_prefetch.c): on another VM this one was their slowest choice. */
#define PF_AHEAD 4096

/* VPDPBUSD / VPDPWSSD with the accumulator updated in place. GCC 12 compiles the intrinsics'
 * accumulators in a loop into a copy before and after every instruction (two register moves per
 * multiply-add, and spills in the 16-accumulator tiles); the asm pins acc to one register. For 8
 * tokens from cache (`bench kernels`' M = 8 rows, weights in cache) the W4A8 tile went from 347-353
 * to 362-407 GOP/s, the q8 tile from 106-117 to 121-148. */
static inline __attribute__((always_inline)) __m512i dpbusd(__m512i acc, __m512i u8, __m512i s8)
{
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8));
    return acc;
}

static inline __attribute__((always_inline)) __m512i dpwssd(__m512i acc, __m512i a, __m512i b)
{
    __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

static inline float f16_scale(const uint16_t *sc, size_t i) { return _cvtsh_ss(sc[i]); }

/* ---- row dots: one weight row against one prepared activation ---- */

/* sum_k w[k] x[k] over @k floats; two accumulators to hide the FMA latency. */
static inline float dot_f32(const float *w, const float *x, int k)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= k; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
    }
    for (; i < k; i += 16) {
        __mmask16 m = mask16(k - i);
        a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_maskz_loadu_ps(m, x + i), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

/* bf16 lanes widened exactly to f32 (a bf16 is the top half of an f32). */
static inline __m512 load_bf16(__mmask16 m, const uint16_t *p)
{
    __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
}

/* sum_k w[k] x[k] with bf16 weights. f32 FMA on the widened weights, not VDPBF16PS: that one
 * would round the activations to bf16 too and drift from the reference. */
static inline float dot_bf16(const uint16_t *w, const float *x, int k)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= k; i += 32) {
        a0 = _mm512_fmadd_ps(load_bf16(0xffff, w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(load_bf16(0xffff, w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
    }
    for (; i < k; i += 16) {
        __mmask16 m = mask16(k - i);
        a0 = _mm512_fmadd_ps(load_bf16(m, w + i), _mm512_maskz_loadu_ps(m, x + i), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

/* ---- int8 rows (KN_DT_Q8) against int16 activations ----
 *
 * A tile of Q8_R rows x nt <= Q8_T tokens: per 32 columns each row's codes are widened to int16
 * once (VPMOVSXBW) and meet every token's 32 int16 activations in one VPDPWSSD (Intel SDM vol.
 * 2: pairs of int16 products added into 16 int32 lanes). The lanes of KN_Q8_CHUNK columns are
 * added into an int64 per (row, token): the sum is exact, so a row's result is the reference's
 * whatever rows and tokens share its tile - a batched LM head gives each token its one-token
 * logits bit for bit. With 4 x 4 accumulators a 32-column step is 4 loads (widening) + 4 loads
 * + 16 VPDPWSSD; the loop runs 64 columns unmasked and masks only the row's last ones. Tiles of 2
 * or 3 rows x 8 tokens widen half as often but were slower from memory (8 tokens of 2048 int16
 * fill L1): 122-154 against 130-174 GOP/s for 8 tokens, `bench kernels`, 3 interleaved rounds. */
#define Q8_R 4
#define Q8_T 4

static inline __attribute__((always_inline)) int64_t reduce_epi32_to_64(__m512i v)
{
    return _mm512_reduce_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(v))) +
           _mm512_reduce_add_epi64(_mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(v, 1)));
}

/* 32 columns from @i of rows @w[0 .. Q8_R) against tokens x[0 .. nt) into s; @m masks the
 * columns past the row (all ones inside it). */
static inline __attribute__((always_inline)) void q8_step(const int8_t *const *w, int i,
                                                          __mmask32 m, bool full,
                                                          const struct kn_act *x, int nt,
                                                          __m512i s[Q8_R][Q8_T])
{
    __m512i wv[Q8_R];
#pragma GCC unroll 4
    for (int r = 0; r < Q8_R; r++)
        wv[r] = _mm512_cvtepi8_epi16(full ? _mm256_loadu_si256((const void *)(w[r] + i))
                                          : _mm256_maskz_loadu_epi8(m, w[r] + i));
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        __m512i a =
            full ? _mm512_loadu_si512(x[t].q16 + i) : _mm512_maskz_loadu_epi16(m, x[t].q16 + i);
#pragma GCC unroll 4
        for (int r = 0; r < Q8_R; r++)
            s[r][t] = dpwssd(s[r][t], wv[r], a);
    }
}

/* Rows @w[0 .. Q8_R) (@k columns) against tokens x[0 .. nt): the exact integer sums into
 * acc[r][t]. Rows are prefetched 8 KiB ahead into L2. */
static inline __attribute__((always_inline)) void
q8_tile(const int8_t *const *w, int k, const struct kn_act *x, int nt, int64_t acc[Q8_R][Q8_T])
{
#pragma GCC unroll 4
    for (int r = 0; r < Q8_R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            acc[r][t] = 0;
    for (int c0 = 0; c0 < k; c0 += KN_Q8_CHUNK) {
        int c1 = k - c0 < KN_Q8_CHUNK ? k : c0 + KN_Q8_CHUNK, i = c0;
        __m512i s[Q8_R][Q8_T];
#pragma GCC unroll 4
        for (int r = 0; r < Q8_R; r++)
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++)
                s[r][t] = _mm512_setzero_si512();
        for (; i + 64 <= c1; i += 64) {
#pragma GCC unroll 4
            for (int r = 0; r < Q8_R; r++)
                pf_line(w[r] + i, KN_PF_L2);
            q8_step(w, i, 0, true, x, nt, s);
            q8_step(w, i + 32, 0, true, x, nt, s);
        }
        for (; i < c1; i += 32)
            q8_step(w, i, c1 - i >= 32 ? ~(__mmask32)0 : (__mmask32)((1u << (c1 - i)) - 1), false,
                    x, nt, s);
#pragma GCC unroll 4
        for (int r = 0; r < Q8_R; r++)
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++)
                acc[r][t] += reduce_epi32_to_64(s[r][t]);
    }
}

/* q8_tile for the run-time token count @nt (1..Q8_T), each case compiled with its count as a
 * constant so that the accumulators stay in registers. */
static void q8_tiles(const int8_t *const *w, int k, const struct kn_act *x, int nt,
                     int64_t acc[Q8_R][Q8_T])
{
    switch (nt) {
    case 1:
        q8_tile(w, k, x, 1, acc);
        break;
    case 2:
        q8_tile(w, k, x, 2, acc);
        break;
    case 3:
        q8_tile(w, k, x, 3, acc);
        break;
    default:
        q8_tile(w, k, x, 4, acc);
        break;
    }
}

/* Rows [n0, n1) x m tokens, Q8_R rows at a time (past n1 the last row again, not stored), the
 * tokens Q8_T at a time. */
static void mm_q8_tiles(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                        int n0, int n1)
{
    const int8_t *codes = w->codes;
    const float *sc = w->scales;
    for (int n = n0; n < n1; n += Q8_R) {
        const int8_t *rows[Q8_R];
        for (int r = 0; r < Q8_R; r++)
            rows[r] = codes + (size_t)(n + r < n1 ? n + r : n1 - 1) * (size_t)w->cols;
        for (int t0 = 0; t0 < m; t0 += Q8_T) {
            int64_t acc[Q8_R][Q8_T];
            int nt = m - t0 < Q8_T ? m - t0 : Q8_T;
            q8_tiles(rows, w->cols, x + t0, nt, acc);
            for (int r = 0; r < Q8_R && n + r < n1; r++)
                for (int t = 0; t < nt; t++)
                    y[(size_t)(t0 + t) * ldy + (size_t)(n + r)] =
                        sc[n + r] * (x[t0 + t].q16scale * (float)acc[r][t]);
        }
    }
}

/* Rows @w[0 .. Q8_STREAMS) against one token at once (as many weight streams: see GEMV_STREAMS),
 * each front to back, four accumulators over 128 columns: the same exact sums as q8_tile's. (The
 * 4-row tile, which reads 4 adjacent rows, was no faster in decode than one row at a time: perf
 * put the head at 35% of a token with it, 33-36% with one row.) */
#define Q8_STREAMS 4
static inline __attribute__((always_inline)) void
dot_q8_runs(const int8_t *const *w, const int16_t *q, int k, int pf, int64_t sum[Q8_STREAMS])
{
#pragma GCC unroll 4
    for (int r = 0; r < Q8_STREAMS; r++)
        sum[r] = 0;
    for (int c0 = 0; c0 < k; c0 += KN_Q8_CHUNK) {
        int c1 = k - c0 < KN_Q8_CHUNK ? k : c0 + KN_Q8_CHUNK, i = c0;
        __m512i s[Q8_STREAMS][4];
#pragma GCC unroll 4
        for (int r = 0; r < Q8_STREAMS; r++)
            s[r][0] = s[r][1] = s[r][2] = s[r][3] = _mm512_setzero_si512();
        for (; i + 128 <= c1; i += 128) {
            __m512i a[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                a[j] = _mm512_loadu_si512(q + i + 32 * j);
#pragma GCC unroll 4
            for (int r = 0; r < Q8_STREAMS; r++) {
                pf_line(w[r] + i, pf);
                pf_line(w[r] + i + 64, pf);
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++)
                    s[r][j] = dpwssd(s[r][j],
                                     _mm512_cvtepi8_epi16(
                                         _mm256_loadu_si256((const __m256i *)(w[r] + i + 32 * j))),
                                     a[j]);
            }
        }
        for (; i < c1; i += 32) {
            __mmask32 m = c1 - i >= 32 ? ~(__mmask32)0 : (__mmask32)((1u << (c1 - i)) - 1);
            __m512i a = _mm512_maskz_loadu_epi16(m, q + i);
#pragma GCC unroll 4
            for (int r = 0; r < Q8_STREAMS; r++)
                s[r][0] =
                    dpwssd(s[r][0], _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, w[r] + i)), a);
        }
#pragma GCC unroll 4
        for (int r = 0; r < Q8_STREAMS; r++)
            sum[r] += reduce_epi32_to_64(_mm512_add_epi32(_mm512_add_epi32(s[r][0], s[r][1]),
                                                          _mm512_add_epi32(s[r][2], s[r][3])));
    }
}

/* Rows [n0, n1) of one token: Q8_STREAMS runs of rows, a row of each at a time; the rows left
 * over in one more call, the last of them again in its unused streams (not stored). */
static inline __attribute__((always_inline)) void
mm_q8_one(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1, int pf)
{
    const float *sc = w->scales;
    int run = (n1 - n0) / Q8_STREAMS;
    for (int i = 0; i < run; i++) {
        const int8_t *rows[Q8_STREAMS];
        int64_t sum[Q8_STREAMS];
        for (int r = 0; r < Q8_STREAMS; r++)
            rows[r] = (const int8_t *)w->codes + (size_t)(n0 + i + r * run) * (size_t)w->cols;
        dot_q8_runs(rows, x->q16, w->cols, pf, sum);
        for (int r = 0; r < Q8_STREAMS; r++) {
            int n = n0 + i + r * run;
            y[n] = sc[n] * (x->q16scale * (float)sum[r]);
        }
    }
    int n = n0 + run * Q8_STREAMS;
    if (n < n1) {
        const int8_t *rows[Q8_STREAMS];
        int64_t sum[Q8_STREAMS];
        for (int r = 0; r < Q8_STREAMS; r++)
            rows[r] =
                (const int8_t *)w->codes + (size_t)(n + r < n1 ? n + r : n1 - 1) * (size_t)w->cols;
        dot_q8_runs(rows, x->q16, w->cols, pf, sum);
        for (int r = 0; n + r < n1; r++)
            y[n + r] = sc[n + r] * (x->q16scale * (float)sum[r]);
    }
}

/* Decode (one token) in runs of rows (mm_q8_one) with the prefetch the tuner picks; more tokens in
 * tiles that read
 * each row from memory once and from cache after, prefetched 8 KiB ahead into L2 (with the
 * hardware prefetcher alone a batch of 8 spent 27 ms a step in the 263 MB LM head of llama32-1b:
 * 9.5 GB/s, `bench kernels`' "pf hw" figure on this VM). */
static void mm_q8(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                  int n0, int n1)
{
    if (m > 1)
        mm_q8_tiles(w, x, m, y, ldy, n0, n1);
    else
        KN_PF_RUN(w, n1 - n0, mm_q8_one, w, x, y, n0, n1);
}

/* ---- 6-bit rows (KN_DT_Q6) against int8 activations per group ----
 *
 * A block's three 64-byte vectors give its four vectors of 64 codes: nibbles masked or shifted
 * down, the two high bits shifted to bits 4-5 and merged by one VPTERNLOGD. Each meets the
 * token's activations of the same order in one VPDPBUSD, so the 16 int32 lanes hold the block's
 * lane sums with no shuffle; less the zero point's sums, converted, they are scaled by weight
 * scale x activation scale into 16 float lanes (kn_gemv_q6_ref's order: every table's result is
 * the reference's bit for bit, whichever rows and tokens share a call). Q6_R rows (runs of rows:
 * one weight stream each, as the q8 GEMV) x up to Q6_T tokens: each block is unpacked once for
 * all the tokens. */
#define Q6_R 4
#define Q6_T 4

static inline __attribute__((always_inline)) void q6_unpack(const uint8_t *blk, __m512i u[4])
{
    const __m512i lo4 = _mm512_set1_epi8(15), hi2 = _mm512_set1_epi8(0x30);
    __m512i n0 = _mm512_loadu_si512(blk), n1 = _mm512_loadu_si512(blk + 64);
    __m512i h = _mm512_loadu_si512(blk + 128);
    /* (bits 4-5 of the first operand, the rest of the second): C ? A : B, C = 0x30 */
    u[0] = _mm512_ternarylogic_epi32(_mm512_slli_epi16(h, 4), _mm512_and_si512(n0, lo4), hi2, 0xE4);
    u[1] = _mm512_ternarylogic_epi32(_mm512_slli_epi16(h, 2),
                                     _mm512_and_si512(_mm512_srli_epi16(n0, 4), lo4), hi2, 0xE4);
    u[2] = _mm512_ternarylogic_epi32(h, _mm512_and_si512(n1, lo4), hi2, 0xE4);
    u[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(h, 2),
                                     _mm512_and_si512(_mm512_srli_epi16(n1, 4), lo4), hi2, 0xE4);
}

/* The lanes' sum in kn_gemv_q6_ref's order: halves, then quarters, pairs, the last two. */
static inline __attribute__((always_inline)) float q6_reduce(__m512 v)
{
    __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
}

/* Rows @w[0 .. Q6_R) (codes; @sc their scales) of @nb blocks against tokens x[0 .. nt): the
 * results into out[r][t]. */
static inline __attribute__((always_inline)) void q6_tile(const uint8_t *const *w,
                                                          const uint16_t *const *sc, int nb,
                                                          const struct kn_act *x, int nt, int pf,
                                                          float out[Q6_R][Q6_T])
{
    __m512 acc[Q6_R][Q6_T];
#pragma GCC unroll 4
    for (int r = 0; r < Q6_R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            acc[r][t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
#pragma GCC unroll 4
        for (int r = 0; r < Q6_R; r++) {
            const uint8_t *blk = w[r] + (size_t)b * 192;
            pf_line(blk, pf);
            pf_line(blk + 64, pf);
            pf_line(blk + 128, pf);
            __m512i u[4];
            q6_unpack(blk, u);
            __m512 sw = _mm512_cvtph_ps(
                _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(sc[r] + 8 * b))));
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const int8_t *a = x[t].q6 + (size_t)b * KN_Q6_BLOCK;
                __m512i d = dpbusd(_mm512_setzero_si512(), u[0], _mm512_loadu_si512(a));
                d = dpbusd(d, u[1], _mm512_loadu_si512(a + 64));
                d = dpbusd(d, u[2], _mm512_loadu_si512(a + 128));
                d = dpbusd(d, u[3], _mm512_loadu_si512(a + 192));
                d = _mm512_sub_epi32(d, _mm512_loadu_si512(x[t].q6sum + 16 * b));
                __m512 ts = _mm512_mul_ps(sw, _mm512_loadu_ps(x[t].q6scale + 16 * b));
                acc[r][t] = _mm512_fmadd_ps(ts, _mm512_cvtepi32_ps(d), acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < Q6_R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            out[r][t] = q6_reduce(acc[r][t]);
}

/* q6_tile for the run-time token count @nt (1..Q6_T), each compiled with its count a constant */
static void q6_tiles(const uint8_t *const *w, const uint16_t *const *sc, int nb,
                     const struct kn_act *x, int nt, int pf, float out[Q6_R][Q6_T])
{
    switch (nt) {
    case 1:
        if (pf == KN_PF_HW)
            q6_tile(w, sc, nb, x, 1, KN_PF_HW, out);
        else if (pf == KN_PF_L1)
            q6_tile(w, sc, nb, x, 1, KN_PF_L1, out);
        else
            q6_tile(w, sc, nb, x, 1, KN_PF_L2, out);
        break;
    case 2:
        q6_tile(w, sc, nb, x, 2, KN_PF_L2, out);
        break;
    case 3:
        q6_tile(w, sc, nb, x, 3, KN_PF_L2, out);
        break;
    default:
        q6_tile(w, sc, nb, x, 4, KN_PF_L2, out);
        break;
    }
}

/* Rows [n0, n1) x tokens x[0 .. m), with prefetch mode @pf for one token: Q6_R runs of rows,
 * a row of each at a time (the rows left over in one more call, the last of them again in
 * its unused runs, not stored); more tokens Q6_T at a time over each row tile, which stays in
 * cache between them. */
static void mm_q6_runs(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                       int n0, int n1, int pf)
{
    int nb = kn_q6_blocks(w->cols), spr = nb * 8;
    size_t rb = kn_row_bytes(KN_DT_Q6, w->cols);
    int run = (n1 - n0) / Q6_R, steps = run + ((n1 - n0) % Q6_R ? 1 : 0);
    for (int i = 0; i < steps; i++) {
        int rows[Q6_R];
        for (int r = 0; r < Q6_R; r++) {
            int n = i < run ? n0 + i + r * run : n0 + run * Q6_R + r;
            rows[r] = n < n1 ? n : n1 - 1;
        }
        const uint8_t *wr[Q6_R];
        const uint16_t *sr[Q6_R];
        for (int r = 0; r < Q6_R; r++) {
            wr[r] = (const uint8_t *)w->codes + (size_t)rows[r] * rb;
            sr[r] = (const uint16_t *)w->scales + (size_t)rows[r] * (size_t)spr;
        }
        for (int t0 = 0; t0 < m; t0 += Q6_T) {
            float out[Q6_R][Q6_T];
            int nt = m - t0 < Q6_T ? m - t0 : Q6_T;
            q6_tiles(wr, sr, nb, x + t0, nt, m > 1 ? KN_PF_L2 : pf, out);
            for (int r = 0; r < Q6_R; r++)
                if (i < run || n0 + run * Q6_R + r < n1)
                    for (int t = 0; t < nt; t++)
                        y[(size_t)(t0 + t) * ldy + (size_t)rows[r]] = out[r][t];
        }
    }
}

/* One token's rows [n0, n1) with the tuner's prefetch mode (kn_pf_begin's note in mm_q8). */
static void mm_q6(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                  int n0, int n1)
{
    if (m > 1) {
        mm_q6_runs(w, x, m, y, ldy, n0, n1, KN_PF_L2);
        return;
    }
    struct kn_pf_call pc;
    int pf = kn_pf_begin(&pc, w, n1 - n0);
    mm_q6_runs(w, x, 1, y, ldy, n0, n1, pf);
    kn_pf_end(&pc);
}

/* One W4A16 row: sum_g s_g * (sum_k code_k x_k - zero_g * gsum_g). Byte j of the row holds
 * elements 2j (low nibble) and 2j + 1 (high nibble), so 16 bytes meet 16 floats of x->xe and of
 * x->xo at the same index. The group sums stay in lanes, scaled by s_g, and are reduced once per
 * row; the zero-point term is a scalar per group. @sc and @zr point at this row's groups. */
static inline float dot_w4a16(const uint8_t *row, const uint16_t *sc, const uint8_t *zr,
                              const struct kn_act *x, int cols, int group)
{
    const __m512i lo4 = _mm512_set1_epi32(15);
    int ng = kn_ngroups(cols, group);
    __m512 acc = _mm512_setzero_ps();
    float corr = 0.0f;
    for (int g = 0; g < ng; g++) {
        int k0 = g * group, kn = cols - k0 < group ? cols - k0 : group;
        int b0 = k0 / 2, nb = (kn + 1) / 2; /* group is even: groups start on a byte */
        __m512 ag = _mm512_setzero_ps();
        _mm_prefetch((const char *)row + b0 + PF_AHEAD, _MM_HINT_T0);
        for (int j = 0; j < nb; j += 16) {
            __mmask16 m = mask16(nb - j);
            __m512i c = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, row + b0 + j));
            __m512 clo = _mm512_cvtepi32_ps(_mm512_and_si512(c, lo4));
            __m512 chi = _mm512_cvtepi32_ps(_mm512_srli_epi32(c, 4));
            ag = _mm512_fmadd_ps(clo, _mm512_maskz_loadu_ps(m, x->xe + b0 + j), ag);
            ag = _mm512_fmadd_ps(chi, _mm512_maskz_loadu_ps(m, x->xo + b0 + j), ag);
        }
        float s = f16_scale(sc, (size_t)g);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(s), ag, acc);
        corr += s * (float)zr[g] * x->gsum[g];
    }
    return _mm512_reduce_add_ps(acc) - corr;
}

/* One W4A8 row: qscale * sum_g s_g * (isum_g - 8 * qgsum_g), isum_g = sum_k code_k q_k.
 * VPDPBUSD (Intel SDM vol. 2) multiplies unsigned bytes by signed bytes and adds groups of four
 * into int32 lanes: the codes 0..15 are the unsigned side, the int8 activations the signed one;
 * products are at most 15 * 128, so the lanes never overflow. The lanes of a group are converted
 * exactly to float and scaled by s_g in place; one horizontal reduce per row. */
static inline float dot_w4a8(const uint8_t *row, const uint16_t *sc, const struct kn_act *x,
                             int cols, int group)
{
    const __m512i lo4 = _mm512_set1_epi8(15);
    int ng = kn_ngroups(cols, group);
    __m512 acc = _mm512_setzero_ps();
    float corr = 0.0f;
    for (int g = 0; g < ng; g++) {
        int k0 = g * group, kn = cols - k0 < group ? cols - k0 : group;
        int b0 = k0 / 2, nb = (kn + 1) / 2;
        __m512i ai = _mm512_setzero_si512();
        _mm_prefetch((const char *)row + b0 + PF_AHEAD, _MM_HINT_T0);
        for (int j = 0; j < nb; j += 64) {
            __mmask64 m = mask64(nb - j);
            __m512i b = _mm512_maskz_loadu_epi8(m, row + b0 + j);
            __m512i lo = _mm512_and_si512(b, lo4);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), lo4);
            ai = dpbusd(ai, lo, _mm512_maskz_loadu_epi8(m, x->qe + b0 + j));
            ai = dpbusd(ai, hi, _mm512_maskz_loadu_epi8(m, x->qo + b0 + j));
        }
        float s = f16_scale(sc, (size_t)g);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(s), _mm512_cvtepi32_ps(ai), acc);
        /* codes are value + 8; padding q is 0, so the group's qgsum is the right correction */
        corr += s * (float)(8 * x->qgsum[g]);
    }
    return x->qscale * (_mm512_reduce_add_ps(acc) - corr);
}

/* ---- blocks: rows [n0, n1) x m activations, y is (m, ldy) ---- */

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

static void mm_w4a8(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                    int n0, int n1)
{
    size_t rb = kn_w4_row_bytes(w->cols), ng = (size_t)kn_ngroups(w->cols, w->group);
    for (int n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)w->codes + (size_t)n * rb;
        const uint16_t *sc = (const uint16_t *)w->scales + (size_t)n * ng;
        for (int i = 0; i < m; i++)
            y[(size_t)i * ldy + (size_t)n] = dot_w4a8(row, sc, &x[i], w->cols, w->group);
    }
}

/* ---- W4A8 tiles (KN_DT_W4A8_T): register-blocked GEMM ----
 *
 * A micro tile is TM tokens x TN blocks of 16 rows. For each group: int32 accumulators start at
 * -8 * qgsum (the zero point of the codes), every 64-byte octet load gives 16 rows x 8 elements,
 * split into low and high nibbles and fed to VPDPBUSD against the token's four activation bytes
 * k..k+3 and k+4..k+7 broadcast to all lanes; at the end of the group the lanes are converted
 * and scaled by the 16 rows' fp16 scales into float accumulators. With TM = 4, TN = 2: 16 int32
 * accumulators (the low and the high nibbles' apart: 16 independent VPDPBUSD chains, where 8 of
 * two each held the loop to the instruction's latency; this Zen 5 VM, qwen3-1.7b pp512 at 1
 * thread, 4 alternating runs: 185-191 -> 190-198 t/s), 8 float ones (in memory: see the tile),
 * 4 nibble registers; every weight load feeds 8 VPDPBUSD. The weights are
 * prefetched 8 KiB ahead into L2 (kn_prefetch.c's default): against 4 KiB into L1, batched
 * decode of 4 and 8 sequences gained 3-4% on llama32-1b, prefill the same (3 interleaved rounds,
 * docs/benchmarks.md "Batched decode"). */
#define TM 4
#define TN 2
/* Tokens of w4a8t_tile's wider tile, one block: a batched decode of 5..8 tokens reads and
 * unpacks each block once for all of them (TM x TN: a block pair once per 4 tokens). llama32-1b,
 * 2 threads, 3 alternating rounds: B = 6 decode 117.7 / 131.0 / 124.6 -> 136.6 / 138.0 / 132.0
 * tok/s, B = 8 126.9 / 138.8 / 132.3 -> 136.2 / 145.6 / 132.8; two passes of 8 for 16 tokens
 * were slower than TM x TN (138 / 133 against 148 / 154), so 9 and more keep it. */
#define TM_WIDE 8

static inline __attribute__((always_inline)) int32_t load_i32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* Tokens x[0..mt) against blocks blk, blk + bb, .. (nt of them) whose first row is @row0; stores
 * rows [n0, n1) of the tile into y (mt, ldy). */
static inline __attribute__((always_inline)) void w4a8t_tile(const uint8_t *blk, size_t bb,
                                                             const struct kn_act *x, int mt, int nt,
                                                             int cols, int group, float *y,
                                                             size_t ldy, int row0, int n0, int n1)
{
    const __m512i lo4 = _mm512_set1_epi8(15);
    const int ng = kn_ngroups(cols, group), no = group / 8;
    const size_t so = kn_tile_scales_offset(cols, group);
    /* In memory, not registers: with 16 int + 8 float accumulators GCC spilled the int ones
     * inside the octet loop (213 against 340 GMAC/s); a load and store per group costs little. */
    volatile __m512 f[TM_WIDE][TN];
#pragma GCC unroll 8
    for (int i = 0; i < mt; i++)
#pragma GCC unroll 2
        for (int j = 0; j < nt; j++)
            f[i][j] = _mm512_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m512i s[TM_WIDE][TN], t[TM_WIDE][TN]; /* low nibbles' sums, high nibbles' */
#pragma GCC unroll 8
        for (int i = 0; i < mt; i++) {
            __m512i c = _mm512_set1_epi32(-8 * x[i].qgsum[g]);
#pragma GCC unroll 2
            for (int j = 0; j < nt; j++) {
                s[i][j] = c;
                t[i][j] = _mm512_setzero_si512();
            }
        }
        const uint8_t *w = blk + (size_t)g * (size_t)group * 8;
        const int8_t *q[TM_WIDE];
#pragma GCC unroll 8
        for (int i = 0; i < mt; i++)
            q[i] = x[i].q + (size_t)g * (size_t)group;
        for (int o = 0; o < no; o++) {
            __m512i lo[TN], hi[TN];
#pragma GCC unroll 2
            for (int j = 0; j < nt; j++) {
                const uint8_t *p = w + (size_t)j * bb + (size_t)o * 64;
                pf_line(p, KN_PF_L2);
                __m512i v = _mm512_loadu_si512(p);
                lo[j] = _mm512_and_si512(v, lo4);
                hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
            }
#pragma GCC unroll 8
            for (int i = 0; i < mt; i++) {
                __m512i a0 = _mm512_set1_epi32(load_i32(q[i] + 8 * o));
                __m512i a1 = _mm512_set1_epi32(load_i32(q[i] + 8 * o + 4));
#pragma GCC unroll 2
                for (int j = 0; j < nt; j++) {
                    s[i][j] = dpbusd(s[i][j], lo[j], a0);
                    t[i][j] = dpbusd(t[i][j], hi[j], a1);
                }
            }
        }
#pragma GCC unroll 2
        for (int j = 0; j < nt; j++) {
            const void *sp = blk + (size_t)j * bb + so + (size_t)g * 32;
            __m512 sc = _mm512_cvtph_ps(_mm256_loadu_si256(sp));
#pragma GCC unroll 8
            for (int i = 0; i < mt; i++)
                f[i][j] = _mm512_fmadd_ps(
                    sc, _mm512_cvtepi32_ps(_mm512_add_epi32(s[i][j], t[i][j])), f[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < mt; i++) {
        __m512 qs = _mm512_set1_ps(x[i].qscale);
#pragma GCC unroll 2
        for (int j = 0; j < nt; j++) {
            int r = row0 + 16 * j;
            _mm512_mask_storeu_ps(y + (size_t)i * ldy + (size_t)r, rows_in(r, n0, n1),
                                  _mm512_mul_ps(f[i][j], qs));
        }
    }
}

/* ---- W4A16 tiles (KN_DT_W4A16_T): FMA over codes widened to float ----
 *
 * Per octet load (16 rows x 8 elements) each element's nibble is shifted down and looked up as a
 * float (VPERMPS) in 16 lanes, which meet the element's activation broadcast from every
 * token of the micro tile. Per group the lanes hold sum code * x; the zero point comes off as
 * zero * gsum and the 16 rows' scales multiply the difference into the float accumulators. */
static inline __attribute__((always_inline)) void w4a16t_tile(const uint8_t *blk, size_t bb,
                                                              const struct kn_act *x, int mt,
                                                              int nt, int cols, int group, float *y,
                                                              size_t ldy, int row0, int n0, int n1)
{
    /* VPERMPS reads the low 4 bits of each index lane: the shifted word itself picks the code's
     * float from this table, no mask and no conversion */
    const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const int ng = kn_ngroups(cols, group), no = group / 8;
    const size_t so = kn_tile_scales_offset(cols, group), zo = kn_tile_zeros_offset(cols, group);
    __m512 f[TM][TN];
#pragma GCC unroll 4
    for (int i = 0; i < mt; i++)
#pragma GCC unroll 2
        for (int j = 0; j < nt; j++)
            f[i][j] = _mm512_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m512 a[TM][TN];
#pragma GCC unroll 4
        for (int i = 0; i < mt; i++)
#pragma GCC unroll 2
            for (int j = 0; j < nt; j++)
                a[i][j] = _mm512_setzero_ps();
        const uint8_t *w = blk + (size_t)g * (size_t)group * 8;
        for (int o = 0; o < no; o++) {
            __m512i v[TN];
#pragma GCC unroll 2
            for (int j = 0; j < nt; j++) {
                const uint8_t *p = w + (size_t)j * bb + (size_t)o * 64;
                _mm_prefetch((const char *)p + PF_AHEAD, _MM_HINT_T0);
                v[j] = _mm512_loadu_si512(p);
            }
            size_t k = (size_t)g * (size_t)group + 8 * (size_t)o;
#pragma GCC unroll 8
            for (int e = 0; e < 8; e++) {
                const int shift = e < 4 ? 8 * e : 8 * (e - 4) + 4;
                __m512 c[TN];
#pragma GCC unroll 2
                for (int j = 0; j < nt; j++)
                    c[j] =
                        _mm512_permutexvar_ps(shift ? _mm512_srli_epi32(v[j], shift) : v[j], codes);
#pragma GCC unroll 4
                for (int i = 0; i < mt; i++) {
                    __m512 xb = _mm512_set1_ps(x[i].x[k + (size_t)e]);
#pragma GCC unroll 2
                    for (int j = 0; j < nt; j++)
                        a[i][j] = _mm512_fmadd_ps(c[j], xb, a[i][j]);
                }
            }
        }
#pragma GCC unroll 2
        for (int j = 0; j < nt; j++) {
            const uint8_t *b = blk + (size_t)j * bb;
            __m512 sc =
                _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(b + so + (size_t)g * 32)));
            __m512 z = _mm512_cvtepi32_ps(
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)(b + zo + (size_t)g * 16))));
#pragma GCC unroll 4
            for (int i = 0; i < mt; i++)
                f[i][j] = _mm512_fmadd_ps(
                    sc, _mm512_fnmadd_ps(z, _mm512_set1_ps(x[i].gsum[g]), a[i][j]), f[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < mt; i++)
#pragma GCC unroll 2
        for (int j = 0; j < nt; j++) {
            int r = row0 + 16 * j;
            _mm512_mask_storeu_ps(y + (size_t)i * ldy + (size_t)r, rows_in(r, n0, n1), f[i][j]);
        }
}

/* A micro tile of @tile for the run-time (mt, nt): each case is the tile compiled with its
 * counts as constants, so the accumulators stay in registers. */
#define MICRO_TILES(name, tile)                                                                    \
    static void name(const uint8_t *blk, size_t bb, const struct kn_act *x, int mt, int nt,      \
                     int cols, int group, float *y, size_t ldy, int row0, int n0, int n1)        \
    {                                                                                              \
        switch ((mt - 1) * TN + nt - 1) {                                                          \
        case 0: tile(blk, bb, x, 1, 1, cols, group, y, ldy, row0, n0, n1); break;                  \
        case 1: tile(blk, bb, x, 1, 2, cols, group, y, ldy, row0, n0, n1); break;                  \
        case 2: tile(blk, bb, x, 2, 1, cols, group, y, ldy, row0, n0, n1); break;                  \
        case 3: tile(blk, bb, x, 2, 2, cols, group, y, ldy, row0, n0, n1); break;                  \
        case 4: tile(blk, bb, x, 3, 1, cols, group, y, ldy, row0, n0, n1); break;                  \
        case 5: tile(blk, bb, x, 3, 2, cols, group, y, ldy, row0, n0, n1); break;                  \
        case 6: tile(blk, bb, x, 4, 1, cols, group, y, ldy, row0, n0, n1); break;                  \
        case 7: tile(blk, bb, x, 4, 2, cols, group, y, ldy, row0, n0, n1); break;                  \
        }                                                                                          \
    }
MICRO_TILES(w4a8t_micro, w4a8t_tile)
MICRO_TILES(w4a16t_micro, w4a16t_tile)

typedef void micro_fn(const uint8_t *blk, size_t bb, const struct kn_act *x, int mt, int nt,
                      int cols, int group, float *y, size_t ldy, int row0, int n0, int n1);

/* Rows [n0, n1) x m tokens of a tiled matrix (blocks of @bb bytes): TN blocks at a time, TM
 * tokens per micro tile; each block pair is read from memory once and from cache after. */
static void mm_tiles(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                     int n0, int n1, size_t bb, micro_fn *micro)
{
    int b1 = (n1 + KN_TILE_ROWS - 1) / KN_TILE_ROWS;
    for (int b = n0 / KN_TILE_ROWS; b < b1; b += TN) {
        const uint8_t *blk = (const uint8_t *)w->codes + (size_t)b * bb;
        int nt = b1 - b < TN ? b1 - b : TN;
        for (int i = 0; i < m; i += TM)
            micro(blk, bb, x + i, m - i < TM ? m - i : TM, nt, w->cols, w->group,
                  y + (size_t)i * ldy, ldy, b * KN_TILE_ROWS, n0, n1);
    }
}

/* Weight streams a one-token GEMV reads at once: the rows split into GEMV_STREAMS runs of
 * blocks, one block of each run at a time, group by group. One core reads memory faster over
 * several streams than over one (a plain read loop on this Zen 5 VM: 20-28 GB/s over one, 30-35
 * over 2 or 4); qwen3-1.7b's layers in a harness over libshardlm_kn.a (every matrix of 28 layers
 * in shared memory, one token, the hardware prefetcher alone), 3 alternating runs: 26.3-27.1 GB/s
 * over one stream, 29.2-30.1 over 4 runs; 4 runs of adjacent blocks (short streams) 25.4-25.7,
 * 8 runs 19.2-21.8 (fewer accumulators each). In the engine (with mm_q8_one's runs of rows
 * for the head), qwen3-1.7b tg128, 4 alternating rounds: 22.5-25.5 -> 26.2-31.6 tok/s at 1
 * thread, 30.6-41.2 -> 34.4-49.6 at 2. The sums and their order are the one-stream loop's: the
 * results bit for bit. */
#define GEMV_STREAMS 4
/* Groups whose sums w4a8t_gemv_runs keeps per stream before it reads their scales. */
#define GEMV_RUN_SUMS 32

/* Group @g of the GEMV_STREAMS blocks at @blk + s * @stride: their int32 sums (16 rows x the
 * group) into sums[s], the zero point taken off (-8 * qgsum), the activations' broadcasts shared
 * by the blocks; four accumulators a block over pairs of octets so that consecutive VPDPBUSDs
 * do not wait on each other (one chain held a block to the instruction's latency). */
static inline __attribute__((always_inline)) void
w4a8t_gemv_sums_runs(const uint8_t *blk, size_t stride, const struct kn_act *x, int group, int g,
                     __m512i sums[GEMV_STREAMS], int pf)
{
    const __m512i lo4 = _mm512_set1_epi8(15);
    const int no = group / 8;
    const uint8_t *w = blk + (size_t)g * (size_t)group * 8;
    const int8_t *q = x->q + (size_t)g * (size_t)group;
    __m512i a[GEMV_STREAMS][4];
#pragma GCC unroll 4
    for (int s = 0; s < GEMV_STREAMS; s++) {
        a[s][0] = _mm512_set1_epi32(-8 * x->qgsum[g]);
        a[s][1] = a[s][2] = a[s][3] = _mm512_setzero_si512();
    }
    int o = 0;
    for (; o + 2 <= no; o += 2) {
        __m512i q0 = _mm512_set1_epi32(load_i32(q + 8 * o));
        __m512i q1 = _mm512_set1_epi32(load_i32(q + 8 * o + 4));
        __m512i q2 = _mm512_set1_epi32(load_i32(q + 8 * o + 8));
        __m512i q3 = _mm512_set1_epi32(load_i32(q + 8 * o + 12));
#pragma GCC unroll 4
        for (int s = 0; s < GEMV_STREAMS; s++) {
            const uint8_t *p = w + (size_t)s * stride + (size_t)o * 64;
            pf_line(p, pf);
            pf_line(p + 64, pf);
            __m512i v0 = _mm512_loadu_si512(p), v1 = _mm512_loadu_si512(p + 64);
            a[s][0] = dpbusd(a[s][0], _mm512_and_si512(v0, lo4), q0);
            a[s][1] = dpbusd(a[s][1], _mm512_and_si512(_mm512_srli_epi16(v0, 4), lo4), q1);
            a[s][2] = dpbusd(a[s][2], _mm512_and_si512(v1, lo4), q2);
            a[s][3] = dpbusd(a[s][3], _mm512_and_si512(_mm512_srli_epi16(v1, 4), lo4), q3);
        }
    }
    if (o < no) { /* an odd octet count (group 8, 24, 40 ..) */
        __m512i q0 = _mm512_set1_epi32(load_i32(q + 8 * o));
        __m512i q1 = _mm512_set1_epi32(load_i32(q + 8 * o + 4));
#pragma GCC unroll 4
        for (int s = 0; s < GEMV_STREAMS; s++) {
            __m512i v0 = _mm512_loadu_si512(w + (size_t)s * stride + (size_t)o * 64);
            a[s][0] = dpbusd(a[s][0], _mm512_and_si512(v0, lo4), q0);
            a[s][1] = dpbusd(a[s][1], _mm512_and_si512(_mm512_srli_epi16(v0, 4), lo4), q1);
        }
    }
#pragma GCC unroll 4
    for (int s = 0; s < GEMV_STREAMS; s++)
        sums[s] = _mm512_add_epi32(_mm512_add_epi32(a[s][0], a[s][1]),
                                   _mm512_add_epi32(a[s][2], a[s][3]));
}

/* The GEMV_STREAMS blocks at @blk + s * @stride, whose first rows are @row0 + s * @rstride, into
 * rows [n0, n1) of y (a stride of 0: one block). Per block the codes of up to GEMV_RUN_SUMS groups
 * first, then their scales, which follow the codes in the block: each block is read front to
 * back. Scaling each group's sum right after its codes held the one-block GEMV to 10.6-13.6 GB/s
 * on a 2-core Zen 4 VM against 17.7-23.8 in two passes, with the scale loads or without them (a
 * harness of both loops; docs/benchmarks.md): the loop's shape, not the scales' place, cost. The
 * float sums run in group order: the results of a one-pass loop, bit for bit. */
static inline __attribute__((always_inline)) void
w4a8t_gemv_runs(const uint8_t *blk, size_t stride, const struct kn_act *x, int cols, int group,
                float *y, int row0, int rstride, int n0, int n1, int pf)
{
    const int ng = kn_ngroups(cols, group);
    const size_t so = kn_tile_scales_offset(cols, group);
    __m512i sums[GEMV_RUN_SUMS][GEMV_STREAMS];
    __m512 f[GEMV_STREAMS];
#pragma GCC unroll 4
    for (int s = 0; s < GEMV_STREAMS; s++)
        f[s] = _mm512_setzero_ps();
    for (int g0 = 0; g0 < ng; g0 += GEMV_RUN_SUMS) {
        int g1 = ng - g0 < GEMV_RUN_SUMS ? ng : g0 + GEMV_RUN_SUMS;
        for (int g = g0; g < g1; g++)
            w4a8t_gemv_sums_runs(blk, stride, x, group, g, sums[g - g0], pf);
#pragma GCC unroll 4
        for (int s = 0; s < GEMV_STREAMS; s++) {
            const uint8_t *sp = blk + (size_t)s * stride + so;
            for (int g = g0; g < g1; g++) {
                __m512 sc =
                    _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(sp + (size_t)g * 32)));
                f[s] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(sums[g - g0][s]), f[s]);
            }
        }
    }
#pragma GCC unroll 4
    for (int s = 0; s < GEMV_STREAMS; s++) {
        int r = row0 + s * rstride;
        _mm512_mask_storeu_ps(y + r, rows_in(r, n0, n1),
                              _mm512_mul_ps(f[s], _mm512_set1_ps(x->qscale)));
    }
}

/* Rows [n0, n1) of one token: GEMV_STREAMS runs of whole blocks, a block of each at a time; each
 * block left over as all the streams of one call (its loads from cache after the first); with
 * the software prefetch @pf (a constant in each of KN_PF_RUN's calls). */
static inline __attribute__((always_inline)) void w4a8t_gemv(const struct kn_mat *w,
                                                             const struct kn_act *x, float *y,
                                                             int n0, int n1, size_t bb, int pf)
{
    int b = n0 / KN_TILE_ROWS, b1 = (n1 + KN_TILE_ROWS - 1) / KN_TILE_ROWS;
    int run = (b1 - b) / GEMV_STREAMS;
    for (int i = 0; i < run; i++)
        w4a8t_gemv_runs((const uint8_t *)w->codes + (size_t)(b + i) * bb, (size_t)run * bb, x,
                        w->cols, w->group, y, (b + i) * KN_TILE_ROWS, run * KN_TILE_ROWS, n0, n1,
                        pf);
    for (b += run * GEMV_STREAMS; b < b1; b++)
        w4a8t_gemv_runs((const uint8_t *)w->codes + (size_t)b * bb, 0, x, w->cols, w->group, y,
                        b * KN_TILE_ROWS, 0, n0, n1, pf);
}

/* w4a8t_tile over one block for the run-time token count @mt (1..TM_WIDE), each case compiled
 * with its count as a constant. */
static void w4a8t_wide(const uint8_t *blk, const struct kn_act *x, int mt, int cols, int group,
                       float *y, size_t ldy, int row0, int n0, int n1)
{
    switch (mt) {
    case 1:
        w4a8t_tile(blk, 0, x, 1, 1, cols, group, y, ldy, row0, n0, n1);
        break;
    case 2:
        w4a8t_tile(blk, 0, x, 2, 1, cols, group, y, ldy, row0, n0, n1);
        break;
    case 3:
        w4a8t_tile(blk, 0, x, 3, 1, cols, group, y, ldy, row0, n0, n1);
        break;
    case 4:
        w4a8t_tile(blk, 0, x, 4, 1, cols, group, y, ldy, row0, n0, n1);
        break;
    case 5:
        w4a8t_tile(blk, 0, x, 5, 1, cols, group, y, ldy, row0, n0, n1);
        break;
    case 6:
        w4a8t_tile(blk, 0, x, 6, 1, cols, group, y, ldy, row0, n0, n1);
        break;
    case 7:
        w4a8t_tile(blk, 0, x, 7, 1, cols, group, y, ldy, row0, n0, n1);
        break;
    default:
        w4a8t_tile(blk, 0, x, 8, 1, cols, group, y, ldy, row0, n0, n1);
        break;
    }
}

/* Rows [n0, n1) x m tokens (batched decode), block by block, TM_WIDE tokens per pass. The same
 * sums in the same order as mm_tiles' and the GEMV's: the same results bit for bit
 * (test_kernels checks every token against the GEMV). */
static void mm_tiles_wide(const struct kn_mat *w, const struct kn_act *x, int m, float *y,
                          size_t ldy, int n0, int n1, size_t bb)
{
    for (int b = n0 / KN_TILE_ROWS; b * KN_TILE_ROWS < n1; b++) {
        const uint8_t *blk = (const uint8_t *)w->codes + (size_t)b * bb;
        for (int i = 0; i < m; i += TM_WIDE)
            w4a8t_wide(blk, x + i, m - i < TM_WIDE ? m - i : TM_WIDE, w->cols, w->group,
                       y + (size_t)i * ldy, ldy, b * KN_TILE_ROWS, n0, n1);
    }
}

static void mm_w4a8t(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                     int n0, int n1)
{
    KN_ASSERT(w->group % 8 == 0);
    size_t bb = kn_tile_block_bytes(KN_DT_W4A8_T, w->cols, w->group);
    if (m == 1) {
        KN_PF_RUN(w, n1 - n0, w4a8t_gemv, w, x, y, n0, n1, bb);
        return;
    }
    if (m > TM && m <= TM_WIDE) {
        mm_tiles_wide(w, x, m, y, ldy, n0, n1, bb);
        return;
    }
    mm_tiles(w, x, m, y, ldy, n0, n1, bb, w4a8t_micro);
}

static void mm_w4a16t(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                      int n0, int n1)
{
    KN_ASSERT(w->group % 8 == 0);
    mm_tiles(w, x, m, y, ldy, n0, n1, kn_tile_block_bytes(KN_DT_W4A16_T, w->cols, w->group),
             w4a16t_micro);
}

/* y[n] = W[n,:] . x for n in [n0, n1). */
static void kn_gemv_avx512(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1)
{
    kn_mm_check(w, x, 1, n0, n1);
    kn_ops_avx512.mm[w->dtype](w, x, 1, y, 0, n0, n1);
}

/* y[i][n] = W[n,:] . x[i] for i < m, n in [n0, n1); y is (m, ldy). */
static void kn_gemm_avx512(const struct kn_mat *w, const struct kn_act *x, int m, float *y, int ldy,
                           int n0, int n1, const struct kn_scratch *scratch)
{
    kn_mm_check(w, x, m, n0, n1);
    kn_ops_avx512.mm[w->dtype](w, x, m, y, (size_t)ldy, n0, n1);
}

/* o = x * w / sqrt(mean(x^2) + eps), as kn_rmsnorm_ref up to summation order. */
static void kn_rmsnorm_avx512(float *o, const float *x, const float *w, int n, float eps)
{
    __m512 ss = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __m512 v = _mm512_maskz_loadu_ps(mask16(n - i), x + i);
        ss = _mm512_fmadd_ps(v, v, ss);
    }
    float inv = 1.0f / sqrtf(_mm512_reduce_add_ps(ss) / (float)n + eps);
    __m512 vi = _mm512_set1_ps(inv);
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = mask16(n - i);
        __m512 v = _mm512_mul_ps(vi, _mm512_maskz_loadu_ps(m, x + i));
        _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i), v));
    }
}

/* The sum of @v's 16 lanes, wrapping as the hardware's adds do: _mm512_reduce_add_epi32 adds
 * its last two lanes as C ints, undefined on overflow, which a NaN activation reaches (its code
 * is INT_MIN; UBSan stopped eval of a model whose logits went NaN). */
static inline int32_t reduce_add_epi32_wrap(__m512i v)
{
    __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    q = _mm_add_epi32(q, _mm_shuffle_epi32(q, _MM_SHUFFLE(1, 0, 3, 2)));
    q = _mm_add_epi32(q, _mm_shuffle_epi32(q, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(q);
}

/* ---- activation preparation (the table's act_prepare) ---- */

/* The groups of kn_act_prepare_avx512 with its parts as flags (constants in the W4A8-only case):
 * @fx x, @fsum gsum, @fq q, @fqs qgsum, @f16 q16. */
static inline __attribute__((always_inline)) void act_groups(struct kn_act *a, const float *x,
                                                             __m512 inv, __m512 inv16, bool fx,
                                                             bool fsum, bool fq, bool fqs, bool f16)
{
    int k = a->k, kp = a->kpad, g = a->group;
    for (int gi = 0; gi < kp / g; gi++) {
        __m512 s = _mm512_setzero_ps();
        __m512i qs = _mm512_setzero_si512();
        for (int i = gi * g; i < (gi + 1) * g; i += 16) {
            __m512 v = _mm512_maskz_loadu_ps(mask16(k - i), x + i); /* zeros past k */
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v, inv));
            if (fx)
                _mm512_storeu_ps(a->x + i, v);
            if (fq)
                _mm_storeu_si128((__m128i *)(a->q + i), _mm512_cvtepi32_epi8(q));
            if (f16)
                _mm256_storeu_si256(
                    (__m256i *)(a->q16 + i),
                    _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(v, inv16))));
            s = _mm512_add_ps(s, v);
            qs = _mm512_add_epi32(qs, q);
        }
        if (fsum)
            a->gsum[gi] = _mm512_reduce_add_ps(s);
        if (fqs)
            a->qgsum[gi] = reduce_add_epi32_wrap(qs);
    }
}

/* As kn_act_prepare_scalar, for the parts a->parts names: VCVTPS2DQ rounds to nearest even as
 * lrintf does, so q and q16 are the same bit for bit; the group sums add in another order. Two
 * passes: max |x|, then per group x, q and the sums; then the even/odd split through a two-source
 * permute (from x, which it then writes whatever the parts). */
void kn_act_prepare_avx512(struct kn_act *a, const float *x)
{
    int k = a->k, kp = a->kpad, g = a->group;
    if (g % 16) {
        kn_act_prepare_scalar(a, x);
        return;
    }
    unsigned p = a->parts;
    bool eo = p & (KN_ACT_EO | KN_ACT_QEO);
    __m512 mx = _mm512_setzero_ps();
    for (int i = 0; i < k; i += 16)
        mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_maskz_loadu_ps(mask16(k - i), x + i)));
    float amax = _mm512_reduce_max_ps(mx);
    a->qscale = amax / 127.0f;
    a->q16scale = amax / 32767.0f;
    float inv_s = amax > 0.0f ? 127.0f / amax : 0.0f;
    __m512 inv = _mm512_set1_ps(inv_s);
    __m512 inv16 = _mm512_set1_ps(amax > 0.0f ? 32767.0f / amax : 0.0f);
    if (p == KN_ACT_Q) /* a W4A8 product's: q and qgsum only */
        act_groups(a, x, inv, inv16, false, false, true, true, false);
    else
        act_groups(a, x, inv, inv16, p & KN_ACT_F32 || eo, p & KN_ACT_F32, p & KN_ACT_Q,
                   p & (KN_ACT_Q | KN_ACT_QEO), p & KN_ACT_Q16);
    if (p & KN_ACT_Q6)
        kn_act_prepare_q6(a, x);
    if (!eo)
        return;
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    for (int i = 0; i < kp / 2; i += 16) { /* kp is a multiple of 16: i + 16 <= kp / 2 or half */
        __mmask16 m = mask16(kp / 2 - i);
        __m512 lo = _mm512_maskz_loadu_ps(mask16(kp - 2 * i), a->x + 2 * i);
        __m512 hi = _mm512_maskz_loadu_ps(mask16(kp - 2 * i - 16), a->x + 2 * i + 16);
        __m512 e = _mm512_permutex2var_ps(lo, ev, hi), o = _mm512_permutex2var_ps(lo, od, hi);
        _mm512_mask_storeu_ps(a->xe + i, m, e);
        _mm512_mask_storeu_ps(a->xo + i, m, o);
        _mm_mask_storeu_epi8(a->qe + i, m,
                             _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(e, inv))));
        _mm_mask_storeu_epi8(a->qo + i, m,
                             _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(o, inv))));
    }
}

/* ---- attention: 16 queries in the lanes, online softmax over blocks of 16 keys ---- */
_Static_assert(KN_KV_BLOCK % 16 == 0, "a block of 16 keys lies in one KV cache block");

/* e^x for x <= 0: x = n ln2 + r (Cody-Waite), e^r by its Taylor polynomial to r^6 (|r| <= ln2/2:
 * relative error below 2e-7), times 2^n. Arguments below -87 give e^-87 (callers mask those). */
static inline __m512 exp_neg(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* tanh(x): below |x| = 1/4 its odd Taylor polynomial to x^9 (relative error < 1e-8), above
 * (1 - e) / (1 + e) with e = e^-2|x| (relative error < 6e-7: exp_neg's 2e-7 over 1 - e >= 0.39),
 * the sign of x put back. The soft-cap's: with tanhf per score a capped call took 2.5x (decode)
 * to 7x (prefill tile) the uncapped one's time, with this 1.08x and 1.18x (hd 64, 1500 keys). */
static inline __m512 tanh_ps(__m512 x)
{
    __m512 a = _mm512_abs_ps(x), x2 = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(62.0f / 2835);
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-17.0f / 315));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.0f / 15));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1.0f / 3));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, x2), x, x);
    __m512 e = exp_neg(_mm512_mul_ps(a, _mm512_set1_ps(-2.0f)));
    __m512 t = _mm512_div_ps(_mm512_sub_ps(_mm512_set1_ps(1.0f), e),
                             _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    t = _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_castps_si512(t),
        _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u))));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(0.25f), _CMP_LT_OQ), t, p);
}

/* Scores soft-capped: cap * tanh(s / cap), @inv = 1 / cap. */
static inline __m512 softcap_ps(__m512 s, float cap, float inv)
{
    return _mm512_mul_ps(_mm512_set1_ps(cap), tanh_ps(_mm512_mul_ps(s, _mm512_set1_ps(inv))));
}

/* The running state of 16 queries: qt[d][l] is element d of lane l's query (scaled by the
 * score scale), ot[d][l] its unnormalised output; m the running max and sum the running
 * denominator per lane; lpos the lane's position (-1: unused lane), lmin its first key (the
 * window's start; 0 without one); cap the soft-cap (0: none) and its inverse. */
struct att_state {
    _Alignas(64) float qt[KN_MAX_HEAD_DIM][KN_ATT_TILE];
    _Alignas(64) float ot[KN_MAX_HEAD_DIM][KN_ATT_TILE];
    __m512 m, sum;
    __m512i lpos, lmin;
    float cap, inv_cap;
};

/* Keys t0 .. t0 + 15, rows k / v + u * stride (u < 16, all readable). */
static inline void att_block(struct att_state *st, const float *k, const float *v, size_t stride,
                             int t0, int hd)
{
    __m512 s[16];
    __mmask16 valid[16];
#pragma GCC unroll 16
    for (int u = 0; u < 16; u++)
        s[u] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        __m512 qd = _mm512_load_ps(st->qt[d]);
#pragma GCC unroll 16
        for (int u = 0; u < 16; u++)
            s[u] = _mm512_fmadd_ps(qd, _mm512_set1_ps(k[(size_t)u * stride + (size_t)d]), s[u]);
    }
    if (st->cap > 0.0f)
#pragma GCC unroll 16
        for (int u = 0; u < 16; u++)
            s[u] = softcap_ps(s[u], st->cap, st->inv_cap);
    __m512 mb = st->m;
#pragma GCC unroll 16
    for (int u = 0; u < 16; u++) {
        __m512i t = _mm512_set1_epi32(t0 + u);
        valid[u] = _mm512_mask_cmp_epi32_mask(_mm512_cmp_epi32_mask(t, st->lpos, _MM_CMPINT_LE), t,
                                              st->lmin, _MM_CMPINT_NLT);
        mb = _mm512_mask_max_ps(mb, valid[u], mb, s[u]);
    }
    __m512 corr = exp_neg(_mm512_sub_ps(st->m, mb)), sum = st->sum;
#pragma GCC unroll 16
    for (int u = 0; u < 16; u++) {
        s[u] = _mm512_maskz_mov_ps(valid[u], exp_neg(_mm512_sub_ps(s[u], mb)));
        /* the rescale fused with the first key's term, explicitly: GCC may fuse a multiply
         * and an add of intrinsics on its own, and att_one must round as this does */
        sum = u ? _mm512_add_ps(sum, s[u]) : _mm512_fmadd_ps(sum, corr, s[0]);
    }
    st->m = mb;
    st->sum = sum;
    int d = 0;
    for (; d + 8 <= hd; d += 8) {
        __m512 acc[8];
#pragma GCC unroll 8
        for (int e = 0; e < 8; e++)
            acc[e] = _mm512_mul_ps(_mm512_load_ps(st->ot[d + e]), corr);
#pragma GCC unroll 16
        for (int u = 0; u < 16; u++) {
            const float *vr = v + (size_t)u * stride + (size_t)d;
#pragma GCC unroll 8
            for (int e = 0; e < 8; e++)
                acc[e] = _mm512_fmadd_ps(s[u], _mm512_set1_ps(vr[e]), acc[e]);
        }
#pragma GCC unroll 8
        for (int e = 0; e < 8; e++)
            _mm512_store_ps(st->ot[d + e], acc[e]);
    }
    for (; d < hd; d++) {
        __m512 acc = _mm512_mul_ps(_mm512_load_ps(st->ot[d]), corr);
        for (int u = 0; u < 16; u++)
            acc = _mm512_fmadd_ps(s[u], _mm512_set1_ps(v[(size_t)u * stride + (size_t)d]), acc);
        _mm512_store_ps(st->ot[d], acc);
    }
}

/* One token's nh <= ATT_ONE_HEADS queries of one KV head (decode): keys in the lanes instead of
 * queries, so that all 16 lanes work (the tile kernel used nh of 16: a batch of 8 at position
 * ~150 spent 16% of its decode steps in attention). Per block of 16 keys, each 16 x 16 square
 * of the keys is transposed in registers, so that element d of the 16 keys is one vector that
 * meets each query's element in one FMA (a gather per d was slower than the tile kernel on Zen
 * 4); the values meet each query's 16 probabilities row by row, hd / 16 FMAs per query and key.
 * Every sum runs in the order of att_block's (a score is one FMA chain over d from 0, the
 * denominator adds the keys in order after the rescale, an output element adds its keys'
 * products in order after the rescale), the exponentials are exp_neg's: the outputs are
 * att_block's bit for bit, so a token's attention does not depend on the tokens that share its
 * call (test_kernels checks it). Rows past the last key are never read. */
#define ATT_ONE_HEADS 8

struct att_one_state {
    _Alignas(64) float q[ATT_ONE_HEADS][KN_MAX_HEAD_DIM]; /* scaled by the score scale */
    _Alignas(64) float o[ATT_ONE_HEADS][KN_MAX_HEAD_DIM];
    _Alignas(64) float p[ATT_ONE_HEADS][16];
    _Alignas(64) float kt[16][16]; /* a transposed square of keys: kt[j][u] */
    float m[ATT_ONE_HEADS], sum[ATT_ONE_HEADS];
    float cap, inv_cap; /* the soft-cap (0: none) and its inverse */
};

static inline __m512 unpacklo_pd(__m512 a, __m512 b)
{
    return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}

static inline __m512 unpackhi_pd(__m512 a, __m512 b)
{
    return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}

/* out[j][u] = r[u][j] for 16 x 16 floats: interleave pairs of rows, then pairs of pairs (each
 * 128-bit lane k of u[4i + j] holds column 4k + j of rows 4i .. 4i + 3), then gather the lanes
 * of the four row quads with two rounds of 128-bit shuffles. */
static inline void transpose16(const __m512 r[16], float out[16][16])
{
    __m512 t[16], u[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        u[4 * i] = unpacklo_pd(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = unpackhi_pd(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = unpacklo_pd(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = unpackhi_pd(t[4 * i + 1], t[4 * i + 3]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512 v0 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88);
        __m512 v1 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xdd);
        __m512 w0 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88);
        __m512 w1 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xdd);
        _mm512_store_ps(out[j], _mm512_shuffle_f32x4(v0, w0, 0x88));
        _mm512_store_ps(out[4 + j], _mm512_shuffle_f32x4(v1, w1, 0x88));
        _mm512_store_ps(out[8 + j], _mm512_shuffle_f32x4(v0, w0, 0xdd));
        _mm512_store_ps(out[12 + j], _mm512_shuffle_f32x4(v1, w1, 0xdd));
    }
}

/* Keys t0 + u0 .. t0 + nk - 1 (u0 < nk <= 16) at rows k / v + u * stride of one cache block
 * (rows before u0, before the window, are read but masked off), soft-capped if @cap; @nh and
 * @cap are constants in each of att_one's calls, so that the accumulators stay in registers
 * (a run-time test of the cap made decode 4% slower at hd 64). */
static inline __attribute__((always_inline)) void
att_one_block(struct att_one_state *st, int nh, bool cap, const float *k, const float *v,
              size_t stride, int u0, int nk, int hd, const float *kn, const float *vn)
{
    __mmask16 valid = (__mmask16)(mask16(nk) & ~mask16(u0));
    __m512 s[ATT_ONE_HEADS];
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++)
        s[h] = _mm512_setzero_ps();
    for (int d0 = 0; d0 < hd; d0 += 16) {
        __mmask16 dm = mask16(hd - d0);
        __m512 r[16];
#pragma GCC unroll 16
        for (int u = 0; u < 16; u++) { /* a row past the last key: a load of no lanes */
            r[u] = _mm512_maskz_loadu_ps(u < nk ? dm : 0, k + (size_t)u * stride + (size_t)d0);
            _mm_prefetch((const char *)(kn + (size_t)u * stride + (size_t)d0), _MM_HINT_T0);
        }
        transpose16(r, st->kt);
        int nj = hd - d0 < 16 ? hd - d0 : 16;
        for (int j = 0; j < nj; j++) {
            __m512 kd = _mm512_load_ps(st->kt[j]);
#pragma GCC unroll 8
            for (int h = 0; h < nh; h++)
                s[h] = _mm512_fmadd_ps(_mm512_set1_ps(st->q[h][d0 + j]), kd, s[h]);
        }
    }
    if (cap)
#pragma GCC unroll 8
        for (int h = 0; h < nh; h++)
            s[h] = softcap_ps(s[h], st->cap, st->inv_cap);
    float corr[ATT_ONE_HEADS];
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++) {
        float mb = fmaxf(st->m[h], _mm512_mask_reduce_max_ps(valid, s[h]));
        /* exp_neg of the same arguments as att_block's lanes, lane by lane */
        corr[h] = _mm512_cvtss_f32(exp_neg(_mm512_set1_ps(st->m[h] - mb)));
        _mm512_store_ps(
            st->p[h], _mm512_maskz_mov_ps(valid, exp_neg(_mm512_sub_ps(s[h], _mm512_set1_ps(mb)))));
        float sum = fmaf(st->sum[h], corr[h], st->p[h][0]); /* as att_block rounds it */
        for (int u = 1; u < nk; u++)
            sum += st->p[h][u];
        st->m[h] = mb;
        st->sum[h] = sum;
    }
    for (int d = 0; d < hd; d += 16) {
        __mmask16 dm = mask16(hd - d);
        __m512 acc[ATT_ONE_HEADS];
#pragma GCC unroll 8
        for (int h = 0; h < nh; h++)
            acc[h] = _mm512_mul_ps(_mm512_load_ps(st->o[h] + d), _mm512_set1_ps(corr[h]));
        for (int u = 0; u < nk; u++) {
            __m512 vr = _mm512_maskz_loadu_ps(dm, v + (size_t)u * stride + (size_t)d);
            _mm_prefetch((const char *)(vn + (size_t)u * stride + (size_t)d), _MM_HINT_T0);
#pragma GCC unroll 8
            for (int h = 0; h < nh; h++)
                acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(st->p[h][u]), vr, acc[h]);
        }
#pragma GCC unroll 8
        for (int h = 0; h < nh; h++)
            _mm512_store_ps(st->o[h] + d, acc[h]);
    }
}

/* Blocks a decode call fetches into L2 at its start, before it reads the first. A head's keys
 * and values of one block are two 4 KiB runs in different places, too short for the hardware
 * prefetcher: one thread read a cold cache of 8 sequences x 8 heads x 144 positions at 4.7 GB/s
 * (15.9 us a call, against 4.7 us warm); with the next block's lines fetched line by line as
 * this one's are read, 13.5 us; with the first 8 blocks fetched at the start too, 11.6-11.9
 * (4 blocks: 11.6, 32: 13.1; a harness over kn_attention_avx512, hd 64, 4 query heads). */
#define ATT_PF_BLOCKS 8

/* Keys t0 .. t0 + nk - 1's rows and values into L2. */
static inline void att_prefetch(const struct kn_kv *kv, int t0, int nk, int hd)
{
    size_t off = kn_kv_off(kv, t0);
    for (int u = 0; u < nk; u++)
        for (int b = 0; b < hd * 4; b += 64) {
            size_t e = off + (size_t)u * kv->row_stride + (size_t)b / 4;
            _mm_prefetch((const char *)(kv->k + e), _MM_HINT_T1);
            _mm_prefetch((const char *)(kv->v + e), _MM_HINT_T1);
        }
}

/* The score scale @opt gives (its default as before the options: 1 / sqrt(hd)). */
static float att_scale(const struct kn_att *opt, int hd)
{
    return opt->scale != 0.0f ? opt->scale : 1.0f / sqrtf((float)hd);
}

/* The first key a query at @pos reads: the window's start, 0 without one. */
static int att_first(const struct kn_att *opt, int pos)
{
    return opt->window && pos >= opt->window ? pos - opt->window + 1 : 0;
}

/* The factor that turns unnormalised outputs into a sink's (struct kn_att), per lane: with the
 * running max m and sum, m2 = max(m, sink) and c = e^(m - m2), c / (sum c + e^(sink - m2))
 * (without a sink: 1 / sum). att_one calls it with broadcasts: lane by lane the same bits. */
static inline __m512 att_sink_inv(__m512 m, __m512 sum, __m512 sink)
{
    __m512 m2 = _mm512_max_ps(m, sink), c = exp_neg(_mm512_sub_ps(m, m2));
    return _mm512_div_ps(c, _mm512_fmadd_ps(sum, c, exp_neg(_mm512_sub_ps(sink, m2))));
}

static void att_one(float *out, const float *q, int nh, int pos0, const struct kn_kv *kv, int hd,
                    const struct kn_att *opt)
{
    static _Thread_local struct att_one_state st; /* 64 KiB: off the stack */
    float scale = att_scale(opt, hd);
    st.cap = opt->softcap;
    st.inv_cap = opt->softcap > 0.0f ? 1.0f / opt->softcap : 0.0f;
    for (int h = 0; h < nh; h++) {
        for (int d = 0; d < hd; d++)
            st.q[h][d] = q[(size_t)(h * hd + d)] * scale;
        memset(st.o[h], 0, (size_t)(hd + 15) / 16 * 64);
        st.m[h] = -3.0e38f;
        st.sum[h] = 0.0f;
    }
    /* blocks wholly before the window are skipped (never read: they may be gone) */
    int T = pos0 + 1, first = att_first(opt, pos0), tb = first & ~15;
    for (int t = tb; t < T && t < tb + 16 * ATT_PF_BLOCKS; t += 16)
        att_prefetch(kv, t, T - t < 16 ? T - t : 16, hd);
    /* a block of 16 keys never straddles two cache blocks (KN_KV_BLOCK is a multiple of 16) */
    for (int t0 = tb; t0 < T; t0 += 16) {
        size_t off = kn_kv_off(kv, t0);
        /* the next block's rows, one line per line read here (the last block: its own) */
        size_t next = t0 + 16 < T ? kn_kv_off(kv, t0 + 16) : off;
        int nk = T - t0 < 16 ? T - t0 : 16, u0 = first > t0 ? first - t0 : 0;
        const float *k = kv->k + off, *v = kv->v + off, *kn = kv->k + next, *vn = kv->v + next;
        switch (nh) {
#define ATT_ONE_CASE(n)                                                                            \
    case n:                                                                                        \
        if (st.cap > 0.0f)                                                                         \
            att_one_block(&st, n, true, k, v, kv->row_stride, u0, nk, hd, kn, vn);                 \
        else                                                                                       \
            att_one_block(&st, n, false, k, v, kv->row_stride, u0, nk, hd, kn, vn);                \
        break;
            ATT_ONE_CASE(1)
            ATT_ONE_CASE(2)
            ATT_ONE_CASE(3)
            ATT_ONE_CASE(4)
            ATT_ONE_CASE(5)
            ATT_ONE_CASE(6)
            ATT_ONE_CASE(7)
            ATT_ONE_CASE(8)
#undef ATT_ONE_CASE
        }
    }
    for (int h = 0; h < nh; h++) {
        float inv = 1.0f / st.sum[h];
        if (opt->sinks)
            inv = _mm512_cvtss_f32(att_sink_inv(_mm512_set1_ps(st.m[h]), _mm512_set1_ps(st.sum[h]),
                                                _mm512_set1_ps(opt->sinks[h])));
        for (int d = 0; d < hd; d++)
            out[(size_t)(h * hd + d)] = st.o[h][d] * inv;
    }
}

/* As kn_attention_ref up to rounding: the queries of the tile sit in the 16 lanes, so scores of
 * one key for all of them are 16-lane FMAs over the key's elements, and the softmax runs online
 * (flash-style): per block of 16 keys, the new running max rescales the partial outputs once. */
static void kn_attention_avx512(float *out, size_t out_stride, const float *q, size_t q_stride,
                                int nt, int nh, int pos0, const struct kn_kv *kv, int hd,
                                float *scratch, const struct kn_att *opt)
{
    static const struct kn_att plain;
    if (!opt)
        opt = &plain;
    KN_ASSERT(nt >= 1 && nh >= 1 && nt * nh <= KN_ATT_TILE && pos0 >= 0 && hd >= 1 &&
              hd <= KN_MAX_HEAD_DIM && opt->window >= 0 && opt->softcap >= 0.0f);
    (void)scratch;
    if (nt == 1 && nh <= ATT_ONE_HEADS) {
        att_one(out, q, nh, pos0, kv, hd, opt);
        return;
    }
    static _Thread_local struct att_state st; /* 128 KiB: off the stack */
    static _Thread_local _Alignas(64) float tail[2][16 * KN_MAX_HEAD_DIM];
    int nl = nt * nh, T = pos0 + nt;
    float scale = att_scale(opt, hd);
    int32_t lpos[KN_ATT_TILE], lmin[KN_ATT_TILE];
    for (int l = 0; l < KN_ATT_TILE; l++) {
        lpos[l] = l < nl ? pos0 + l / nh : -1;
        lmin[l] = l < nl ? att_first(opt, pos0 + l / nh) : 0;
    }
    for (int d = 0; d < hd; d++) {
        for (int l = 0; l < KN_ATT_TILE; l++)
            st.qt[d][l] =
                l < nl ? q[(size_t)(l / nh) * q_stride + (size_t)(l % nh * hd + d)] * scale : 0.0f;
        _mm512_store_ps(st.ot[d], _mm512_setzero_ps());
    }
    st.lpos = _mm512_loadu_si512(lpos);
    st.lmin = _mm512_loadu_si512(lmin);
    st.cap = opt->softcap;
    st.inv_cap = opt->softcap > 0.0f ? 1.0f / opt->softcap : 0.0f;
    st.m = _mm512_set1_ps(-3.0e38f);
    st.sum = _mm512_setzero_ps();
    /* from the block of the first lane's window start: blocks before are never read */
    int t0 = att_first(opt, pos0) & ~15;
    /* a block of 16 keys never straddles two cache blocks (KN_KV_BLOCK is a multiple of 16) */
    for (; t0 + 16 <= T; t0 += 16) {
        size_t off = kn_kv_off(kv, t0);
        att_block(&st, kv->k + off, kv->v + off, kv->row_stride, t0, hd);
    }
    if (t0 < T) { /* the last keys, copied into 16 rows (zeros after T: masked off) */
        memset(tail, 0, sizeof(float) * 2 * 16 * (size_t)hd);
        for (int t = t0; t < T; t++) {
            size_t off = kn_kv_off(kv, t);
            memcpy(tail[0] + (size_t)(t - t0) * hd, kv->k + off, (size_t)hd * 4);
            memcpy(tail[1] + (size_t)(t - t0) * hd, kv->v + off, (size_t)hd * 4);
        }
        att_block(&st, tail[0], tail[1], (size_t)hd, t0, hd);
    }
    float inv[KN_ATT_TILE];
    _mm512_storeu_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), st.sum));
    if (opt->sinks) { /* lane l: query head l % nh (unused lanes: any finite sink) */
        float sink[KN_ATT_TILE];
        for (int l = 0; l < KN_ATT_TILE; l++)
            sink[l] = l < nl ? opt->sinks[l % nh] : 0.0f;
        _mm512_storeu_ps(inv, att_sink_inv(st.m, st.sum, _mm512_loadu_ps(sink)));
    }
    for (int l = 0; l < nl; l++) {
        float *o = out + (size_t)(l / nh) * out_stride + (size_t)(l % nh * hd);
        for (int d = 0; d < hd; d++)
            o[d] = st.ot[d][l] * inv[l];
    }
}

/* e^x over the whole float range: the same reduction as exp_neg, arguments clamped to
 * [-87, 88] (below: e^-87, above: e^88; silu's quotient goes to 0 or x either way). */
static inline __m512 exp_any(__m512 x) { return exp_neg(_mm512_min_ps(x, _mm512_set1_ps(88.0f))); }

/* a[i] = silu(a[i]) * b[i] = a b / (1 + e^-a): one exp and one division per 16 lanes (the
 * reference's scalar expf was 9% of a prefill at 1 thread). */
static void kn_silu_mul_avx512(float *a, const float *b, int n)
{
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = mask16(n - i);
        __m512 x = _mm512_maskz_loadu_ps(m, a + i), y = _mm512_maskz_loadu_ps(m, b + i);
        __m512 d =
            _mm512_add_ps(_mm512_set1_ps(1.0f), exp_any(_mm512_sub_ps(_mm512_setzero_ps(), x)));
        _mm512_mask_storeu_ps(a + i, m, _mm512_div_ps(_mm512_mul_ps(x, y), d));
    }
}

/* gpt-oss's clamped SwiGLU (kn.h): g / (1 + e^(-1.702 g)) (u + 1), g = min(a, 7) (7 for a NaN,
 * as the reference), u = b clamped to [-7, 7] (a NaN kept): silu's one exp per 16 lanes, 10x
 * the reference on a token's 4 x 2880 units (38 -> 3.7 us, best of 7 x 200 calls). */
static void kn_swiglu_oai_mul_avx512(float *a, const float *b, int n)
{
    const __m512 lim = _mm512_set1_ps(7.0f), nlim = _mm512_set1_ps(-7.0f);
    const __m512 alpha = _mm512_set1_ps(-1.702f), one = _mm512_set1_ps(1.0f);
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = mask16(n - i);
        __m512 g = _mm512_min_ps(_mm512_maskz_loadu_ps(m, a + i), lim);
        __m512 u = _mm512_max_ps(nlim, _mm512_min_ps(lim, _mm512_maskz_loadu_ps(m, b + i)));
        __m512 d = _mm512_add_ps(one, exp_any(_mm512_mul_ps(alpha, g)));
        _mm512_mask_storeu_ps(a + i, m, _mm512_div_ps(_mm512_mul_ps(g, _mm512_add_ps(u, one)), d));
    }
}

/* a[i] = gelu_tanh(a[i]) * b[i]. 0.5 x (1 + tanh(u)) is x / (1 + e^-2u), u = sqrt(2/pi) (x +
 * 0.044715 x^3): silu's form, one exp per 16 lanes (the reference's tanhf was 8% of a spark
 * prefill step, the same share of its decode). */
static void kn_gelu_mul_avx512(float *a, const float *b, int n)
{
    const __m512 c = _mm512_set1_ps(-2.0f * 0.7978845608028654f), k = _mm512_set1_ps(0.044715f);
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = mask16(n - i);
        __m512 x = _mm512_maskz_loadu_ps(m, a + i), y = _mm512_maskz_loadu_ps(m, b + i);
        __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
        __m512 e = exp_any(_mm512_mul_ps(c, _mm512_fmadd_ps(k, x3, x)));
        __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), e);
        _mm512_mask_storeu_ps(a + i, m, _mm512_div_ps(_mm512_mul_ps(x, y), d));
    }
}

/* x[i] = cap * tanh(x[i] / cap), 16 lanes at a time (tanh_ps). */
static void kn_softcap_avx512(float *x, int n, float cap)
{
    float inv = 1.0f / cap;
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = mask16(n - i);
        _mm512_mask_storeu_ps(x + i, m, softcap_ps(_mm512_maskz_loadu_ps(m, x + i), cap, inv));
    }
}

/* Softmax of n values in place: the max in 16 lanes, e^(x - max) by exp_neg summed in 16 lanes,
 * then one scale. The sampler's over a 128k vocabulary (per sequence and step) was 1 ms with
 * the reference's expf. */
static void kn_softmax_avx512(float *x, int n)
{
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, x + i));
    }
    __m512 vmax = _mm512_set1_ps(_mm512_reduce_max_ps(mx)), sum = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 e = exp_neg(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vmax));
        e = _mm512_maskz_mov_ps(m, e);
        _mm512_mask_storeu_ps(x + i, m, e);
        sum = _mm512_add_ps(sum, e);
    }
    __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
    }
}

/* rope is the reference one: it needs sin/cos with the reference's accuracy and is a small part
 * of a token's time next to the matrix products. */
KN_GRAM_TILE(gram_tile)

const struct kn_ops kn_ops_avx512 = {
    .name = "avx512",
    .isa = KN_ISA_AVX512,
    .mm = {[KN_DT_F32] = mm_f32,
           [KN_DT_BF16] = mm_bf16,
           [KN_DT_Q8] = mm_q8,
           [KN_DT_W4A16] = mm_w4a16,
           [KN_DT_W4A8] = mm_w4a8,
           [KN_DT_W4A8_T] = mm_w4a8t,
           [KN_DT_W4A16_T] = mm_w4a16t,
           [KN_DT_Q6] = mm_q6},
    .act_prepare = kn_act_prepare_avx512,
    .gemv = kn_gemv_avx512,
    .gemm = kn_gemm_avx512,
    .rmsnorm = kn_rmsnorm_avx512,
    .rope = kn_rope_ref,
    .softmax = kn_softmax_avx512,
    .silu_mul = kn_silu_mul_avx512,
    .gelu_mul = kn_gelu_mul_avx512,
    .swiglu_oai_mul = kn_swiglu_oai_mul_avx512,
    .softcap = kn_softcap_avx512,
    .attention = kn_attention_avx512,
    .gram_tile = gram_tile,
};
