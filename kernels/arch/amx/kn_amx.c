/* SPDX-License-Identifier: MIT */
/* kernels/arch/amx/kn_amx.c: the AMX table. Tile GEMMs of at least AMX_MIN_M tokens run on the tile
 * unit: W4A8 on TDPBSUD (signed int8 activations x unsigned 4-bit codes widened to bytes), W4A16
 * on TDPBF16PS (see mm_w4a16t_amx); everything else, decode's M = 1 included, is the AVX-512
 * table's (on Sapphire Rapids AMX has been measured to slow decode down).
 *
 * Per block of 16 weight rows and per group (group % 64 == 0), the group's octets are unpacked
 * once into B tiles: tile row r holds K quad r of the 64-element chunk, 4 bytes per output row
 * (octet j's low nibbles are quad 2j, its high nibbles quad 2j + 1). Activations are packed into
 * 16-token A tiles (int8, row = token). C = sum over the group's chunks of A x B, then each
 * token's row of C (16 outputs) is corrected by -8 * qgsum, converted and scaled by the 16
 * rows' fp16 scales into float accumulators, as in the AVX-512 tile kernel.
 *
 * Compiled twice: with -mamx-tile -mamx-int8 as kn_ops_amx (the real instructions, runtime-gated
 * by kn_probe.c on CPUID, XCR0 and ARCH_REQ_XCOMP_PERM), and with KN_AMX_MODEL defined, by
 * tests/amx_model.c, as kn_ops_amx_model, where each tile instruction is a call into the plain-C
 * model of tests/amx_tile_model.c (Intel SDM vol. 2 semantics, the configuration included: an
 * instruction without one, or on a shape it does not allow, is recorded as a fault), so the
 * tests run this code on any AVX-512 CPU. */
#include "../kn_gram.h"
#include "../avx512/kn_avx512.h"
#include "../ref/kn_ref.h"

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Below this many tokens the AVX-512 tile kernel runs instead: one A tile is 16 tokens. Not
 * measured on AMX hardware (none where this was written): a first guess to revisit. */
#define AMX_MIN_M 16

#define KN_AMX_TILE_ROWS 16
#define KN_AMX_TILE_BYTES 64

/* Palette 1: tile 0 = C (16 x 16 int32 or fp32), 1 = A (16 tokens x 64 bytes), 2 = B (16 K
 * quads or pairs x 64 bytes); the other tiles unused. Intel SDM vol. 2, LDTILECFG: 64 bytes. */
struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};
_Static_assert(sizeof(struct tile_config) == 64, "LDTILECFG reads 64 bytes");
static const struct tile_config amx_cfg = {
    .palette = 1,
    .colsb = {KN_AMX_TILE_BYTES, KN_AMX_TILE_BYTES, KN_AMX_TILE_BYTES},
    .rows = {KN_AMX_TILE_ROWS, KN_AMX_TILE_ROWS, KN_AMX_TILE_ROWS},
};

/* Every kernel loads this configuration on entry (TILE_CONFIG) and releases it on exit
 * (TILE_RELEASE): none relies on one another left behind (docs/DESIGN.md, Kernels). */
#ifdef KN_AMX_MODEL
/* The includer (tests/amx_model.c) declares the model's instructions (tests/amx_model.h). */
#define TILE_CONFIG() amx_model_loadconfig(&amx_cfg)
#define TILE_RELEASE() amx_model_release()
#define TILE_ZERO(t) amx_model_zero(t)
#define TILE_LOAD(t, p, s) amx_model_loadd(t, p, s)
#define TILE_STORE(t, p, s) amx_model_stored(t, p, s)
#define TILE_DPBSUD(c, a, b) amx_model_dpbsud(c, a, b)
#define TILE_DPBF16PS(c, a, b) amx_model_dpbf16ps(c, a, b)
#define KN_OPS_AMX kn_ops_amx_model
#define KN_AMX_NAME "amx-model"
#else
#define TILE_CONFIG() _tile_loadconfig(&amx_cfg)
#define TILE_RELEASE() _tile_release()
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_LOAD(t, p, s) _tile_loadd(t, p, (long)(s))
#define TILE_STORE(t, p, s) _tile_stored(t, p, (long)(s))
#define TILE_DPBSUD(c, a, b) _tile_dpbsud(c, a, b)
#define TILE_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#define KN_OPS_AMX kn_ops_amx
#define KN_AMX_NAME "amx"
#endif

/* Whether a GEMM over @w of @m tokens runs on the tile unit: the tile layouts from AMX_MIN_M
 * tokens, with a group the tiles divide. */
static bool amx_runs(const struct kn_mat *w, int m)
{
    return m >= AMX_MIN_M && ((w->dtype == KN_DT_W4A8_T && w->group % 64 == 0) ||
                              (w->dtype == KN_DT_W4A16_T && w->group % 32 == 0));
}

/* The scratch of a GEMM over @w for @m tokens (kn_ops.gemm_scratch; 0 when the AVX-512 table
 * runs it): the A panel of all tokens (16-token tiles, kpad elements a row: int8 for W4A8, bf16
 * for W4A16), one block's B tiles and one C tile, each part a multiple of 64 bytes. */
static size_t amx_scratch_bytes(const struct kn_mat *w, int m)
{
    if (!amx_runs(w, m))
        return 0;
    size_t kpad = (size_t)kn_ngroups(w->cols, w->group) * (size_t)w->group;
    size_t mpad = (size_t)(m + KN_AMX_TILE_ROWS - 1) / KN_AMX_TILE_ROWS * KN_AMX_TILE_ROWS;
    size_t elem = w->dtype == KN_DT_W4A16_T ? 2 : 1; /* bf16 or int8 */
    return mpad * kpad * elem + kpad * KN_TILE_ROWS * elem + sizeof(int32_t) * 256;
}

/* Unpacks block @blk's codes (kpad / 8 octets) into B tiles at @bt, 64 inputs (1 KiB) each. */
static void unpack_block(const uint8_t *blk, int kpad, uint8_t *bt)
{
    const __m512i lo4 = _mm512_set1_epi8(15);
    for (int o = 0; o < kpad / 8; o++) {
        __m512i v = _mm512_loadu_si512(blk + (size_t)o * 64);
        uint8_t *row = bt + (size_t)(o / 8) * 1024 + (size_t)(2 * (o % 8)) * 64;
        _mm512_store_si512(row, _mm512_and_si512(v, lo4));
        _mm512_store_si512(row + 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4));
    }
}

/* Over @s (amx_scratch_bytes). Loads the tile configuration on entry and releases it before
 * returning. */
static void mm_w4a8t_amx(const struct kn_mat *w, const struct kn_act *x, int m, float *y,
                         size_t ldy, int n0, int n1, uint8_t *s)
{
    const int group = w->group, ng = kn_ngroups(w->cols, group), kpad = ng * group;
    const size_t bb = kn_tile_block_bytes(KN_DT_W4A8_T, w->cols, group),
                 so = kn_tile_scales_offset(w->cols, group);
    const int mpad = (m + KN_AMX_TILE_ROWS - 1) / KN_AMX_TILE_ROWS * KN_AMX_TILE_ROWS;
    const size_t panel = (size_t)mpad * (size_t)kpad, btiles = (size_t)kpad * KN_TILE_ROWS;
    int8_t *a_panel = (int8_t *)s;
    uint8_t *bt = s + panel;
    int32_t *c_tile = (int32_t *)(bt + btiles);
    for (int i = 0; i < mpad; i++) /* missing tokens of the last tile are zero */
        if (i < m)
            memcpy(a_panel + (size_t)i * (size_t)kpad, x[i].q, (size_t)kpad);
        else
            memset(a_panel + (size_t)i * (size_t)kpad, 0, (size_t)kpad);
    TILE_CONFIG();
    for (int b = n0 / KN_TILE_ROWS; b * KN_TILE_ROWS < n1; b++) {
        const uint8_t *blk = (const uint8_t *)w->codes + (size_t)b * bb;
        int row0 = b * KN_TILE_ROWS;
        __mmask16 keep = rows_in(row0, n0, n1);
        unpack_block(blk, kpad, bt);
        for (int i0 = 0; i0 < m; i0 += KN_AMX_TILE_ROWS) {
            int mt = m - i0 < KN_AMX_TILE_ROWS ? m - i0 : KN_AMX_TILE_ROWS;
            const int8_t *ap = a_panel + (size_t)i0 * (size_t)kpad;
            __m512 f[KN_AMX_TILE_ROWS];
            for (int i = 0; i < KN_AMX_TILE_ROWS; i++)
                f[i] = _mm512_setzero_ps();
            for (int g = 0; g < ng; g++) {
                TILE_ZERO(0);
                for (int c = 0; c < group / 64; c++) {
                    int k0 = g * group + c * 64;
                    TILE_LOAD(1, ap + k0, kpad);
                    TILE_LOAD(2, bt + (size_t)k0 * KN_TILE_ROWS, 64);
                    TILE_DPBSUD(0, 1, 2);
                }
                TILE_STORE(0, c_tile, 64);
                __m512 sc =
                    _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(blk + so + (size_t)g * 32)));
                for (int i = 0; i < mt; i++) {
                    __m512i v = _mm512_sub_epi32(_mm512_load_si512(c_tile + 16 * i),
                                                 _mm512_set1_epi32(8 * x[i0 + i].qgsum[g]));
                    f[i] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(v), f[i]);
                }
            }
            for (int i = 0; i < mt; i++)
                _mm512_mask_storeu_ps(y + (size_t)(i0 + i) * ldy + (size_t)row0, keep,
                                      _mm512_mul_ps(f[i], _mm512_set1_ps(x[i0 + i].qscale)));
        }
    }
    TILE_RELEASE();
}

/* ---- W4A16 tiles on AMX-BF16 ----
 *
 * B tiles hold code - zero as bf16 (integers of -15..15: exact), two inputs per 32-bit column
 * entry, 32 inputs a tile; A tiles hold the activations rounded to bf16 (VCVTNEPS2BF16, nearest
 * even): the one rounding this path adds over the FMA kernels. C (fp32) per group, times the
 * 16 rows' scales, into float accumulators. */

/* Block @blk's codes, minus each row's zero point of the group, as B tiles at @bt (32 inputs,
 * 1 KiB each): entry (pair p, row n) = bf16(k = 2p) | bf16(k = 2p + 1) << 16. */
static void unpack_block_bf16(const uint8_t *blk, int cols, int group, int kpad, uint8_t *bt)
{
    const __m512i lo4 = _mm512_set1_epi32(15), hi16 = _mm512_set1_epi32((int)0xffff0000u);
    const size_t zo = kn_tile_zeros_offset(cols, group);
    for (int o = 0; o < kpad / 8; o++) {
        int g = o * 8 / group;
        __m512i v = _mm512_loadu_si512(blk + (size_t)o * 64);
        __m512i z =
            _mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)(blk + zo + (size_t)g * 16)));
        uint8_t *rows = bt + (size_t)(o / 4) * 1024 + (size_t)(o % 4) * 4 * 64;
        for (int e = 0; e < 8; e += 2) {
            int s0 = e < 4 ? 8 * e : 8 * (e - 4) + 4,
                s1 = e + 1 < 4 ? 8 * (e + 1) : 8 * (e - 3) + 4;
            __m512 a = _mm512_cvtepi32_ps(
                _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(v, s0), lo4), z));
            __m512 b = _mm512_cvtepi32_ps(
                _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(v, s1), lo4), z));
            __m512i pair = _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(a), 16),
                                           _mm512_and_si512(_mm512_castps_si512(b), hi16));
            _mm512_store_si512(rows + (size_t)(e / 2) * 64, pair);
        }
    }
}

static void mm_w4a16t_amx(const struct kn_mat *w, const struct kn_act *x, int m, float *y,
                          size_t ldy, int n0, int n1, uint8_t *s)
{
    const int group = w->group, ng = kn_ngroups(w->cols, group), kpad = ng * group;
    const size_t bb = kn_tile_block_bytes(KN_DT_W4A16_T, w->cols, group);
    const size_t so = kn_tile_scales_offset(w->cols, group);
    const int mpad = (m + KN_AMX_TILE_ROWS - 1) / KN_AMX_TILE_ROWS * KN_AMX_TILE_ROWS;
    const size_t panel = (size_t)mpad * (size_t)kpad * 2, btiles = (size_t)kpad * KN_TILE_ROWS * 2;
    uint16_t *a_panel = (uint16_t *)s;
    uint8_t *bt = s + panel;
    float *c_tile = (float *)(bt + btiles);
    for (int i = 0; i < mpad; i++) { /* activations to bf16; missing tokens are zero */
        uint16_t *row = a_panel + (size_t)i * (size_t)kpad;
        for (int k = 0; k < kpad; k += 16) {
            __m512 v = i < m ? _mm512_loadu_ps(x[i].x + k) : _mm512_setzero_ps();
            _mm256_storeu_si256((__m256i *)(row + k), (__m256i)_mm512_cvtneps_pbh(v));
        }
    }
    TILE_CONFIG();
    for (int b = n0 / KN_TILE_ROWS; b * KN_TILE_ROWS < n1; b++) {
        const uint8_t *blk = (const uint8_t *)w->codes + (size_t)b * bb;
        int row0 = b * KN_TILE_ROWS;
        __mmask16 keep = rows_in(row0, n0, n1);
        unpack_block_bf16(blk, w->cols, group, kpad, bt);
        for (int i0 = 0; i0 < m; i0 += KN_AMX_TILE_ROWS) {
            int mt = m - i0 < KN_AMX_TILE_ROWS ? m - i0 : KN_AMX_TILE_ROWS;
            const uint16_t *ap = a_panel + (size_t)i0 * (size_t)kpad;
            __m512 f[KN_AMX_TILE_ROWS];
            for (int i = 0; i < KN_AMX_TILE_ROWS; i++)
                f[i] = _mm512_setzero_ps();
            for (int g = 0; g < ng; g++) {
                TILE_ZERO(0);
                for (int c = 0; c < group / 32; c++) {
                    int k0 = g * group + c * 32;
                    TILE_LOAD(1, ap + k0, (size_t)kpad * 2);
                    TILE_LOAD(2, bt + (size_t)(k0 / 32) * 1024, 64);
                    TILE_DPBF16PS(0, 1, 2);
                }
                TILE_STORE(0, c_tile, 64);
                __m512 sc =
                    _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(blk + so + (size_t)g * 32)));
                for (int i = 0; i < mt; i++)
                    f[i] = _mm512_fmadd_ps(sc, _mm512_load_ps(c_tile + 16 * i), f[i]);
            }
            for (int i = 0; i < mt; i++)
                _mm512_mask_storeu_ps(y + (size_t)(i0 + i) * ldy + (size_t)row0, keep, f[i]);
        }
    }
    TILE_RELEASE();
}

static void mm_avx512(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                      int n0, int n1)
{
    kn_ops_avx512.mm[w->dtype](w, x, m, y, ldy, n0, n1);
}

/* The tile layouts on the tile unit from AMX_MIN_M tokens (and a group the tiles divide), over
 * the caller's scratch; everything else is the AVX-512 table's (KN_OPS_AMX.mm: those entries
 * take no scratch). */
static void kn_gemm_amx(const struct kn_mat *w, const struct kn_act *x, int m, float *y, int ldy,
                        int n0, int n1, const struct kn_scratch *scratch)
{
    kn_mm_check(w, x, m, n0, n1);
    if (!amx_runs(w, m)) {
        KN_OPS_AMX.mm[w->dtype](w, x, m, y, (size_t)ldy, n0, n1);
        return;
    }
    KN_ASSERT(scratch && scratch->bytes >= amx_scratch_bytes(w, m));
    if (w->dtype == KN_DT_W4A8_T)
        mm_w4a8t_amx(w, x, m, y, (size_t)ldy, n0, n1, scratch->buf);
    else
        mm_w4a16t_amx(w, x, m, y, (size_t)ldy, n0, n1, scratch->buf);
}

static void kn_gemv_amx(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1)
{
    kn_ops_avx512.gemv(w, x, y, n0, n1); /* M = 1 stays on VNNI */
}

static void kn_rmsnorm_amx(float *o, const float *x, const float *w, int n, float eps)
{
    kn_ops_avx512.rmsnorm(o, x, w, n, eps);
}

static void kn_softmax_amx(float *x, int n) { kn_ops_avx512.softmax(x, n); }

static void kn_attention_amx(float *out, size_t out_stride, const float *q, size_t q_stride, int nt,
                             int nh, int pos0, const struct kn_kv *kv, int hd, float *scratch,
                             const struct kn_att *opt)
{
    kn_ops_avx512.attention(out, out_stride, q, q_stride, nt, nh, pos0, kv, hd, scratch, opt);
}

/* the elementwise activations of the AVX-512 table (the reference's were left here before) */
static void kn_silu_mul_amx(float *a, const float *b, int n) { kn_ops_avx512.silu_mul(a, b, n); }

static void kn_gelu_mul_amx(float *a, const float *b, int n) { kn_ops_avx512.gelu_mul(a, b, n); }
static void kn_swiglu_oai_mul_amx(float *a, const float *b, int n)
{
    kn_ops_avx512.swiglu_oai_mul(a, b, n);
}

static void kn_softcap_amx(float *x, int n, float cap) { kn_ops_avx512.softcap(x, n, cap); }

KN_GRAM_TILE(gram_tile)

const struct kn_ops KN_OPS_AMX = {
    .name = KN_AMX_NAME,
    .isa = KN_ISA_AMX,
    .mm = {[KN_DT_F32] = mm_avx512,
           [KN_DT_BF16] = mm_avx512,
           [KN_DT_Q8] = mm_avx512,
           [KN_DT_W4A16] = mm_avx512,
           [KN_DT_W4A8] = mm_avx512,
           [KN_DT_W4A8_T] = mm_avx512,
           [KN_DT_W4A16_T] = mm_avx512,
           [KN_DT_Q6] = mm_avx512},
    .act_prepare = kn_act_prepare_avx512,
    .gemv = kn_gemv_amx,
    .gemm = kn_gemm_amx,
    .gemm_scratch = amx_scratch_bytes,
    .rmsnorm = kn_rmsnorm_amx,
    .rope = kn_rope_ref,
    .softmax = kn_softmax_amx,
    .silu_mul = kn_silu_mul_amx,
    .gelu_mul = kn_gelu_mul_amx,
    .swiglu_oai_mul = kn_swiglu_oai_mul_amx,
    .softcap = kn_softcap_amx,
    .attention = kn_attention_amx,
    .gram_tile = gram_tile,
};
