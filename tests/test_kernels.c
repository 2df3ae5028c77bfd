/* SPDX-License-Identifier: MIT */
/* tests: every ops table this machine runs against the reference kernels, on ragged shapes, the
 * quantizers, type traits and fp16/bf16 helpers against their definitions in kn.h, and the
 * software model of the AMX tile instructions (tests/amx_tile_model.c) with the AMX kernels on it.
 *
 * Matrix-product results are compared with a relative error normalised by the sum of the
 * absolute values of the terms the reference adds (its condition bound; for W4 that includes the
 * zero-point terms, see dot_mag), so that rows whose result cancels to near zero are held to the
 * accuracy float summation can give them and no more.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "amx_model.h"
#include "kn.h"
#include "arch/ref/kn_ref.h"
#include "testutil.h"

/* Tolerances. */
/* gemv/gemm, |y - y_ref| / sum|terms|: both sides round every product and partial sum to f32 but
 * add them in a different order (16 lanes then a tree, vs left to right); for K <= 300 the
 * worst case is about K * 2^-24 = 1.8e-5; the worst measured (avx512, all shapes) is 2.4e-7. */
#define TOL_DOT 1e-5
/* AMX-BF16 rounds W4A16 activations to bf16 (relative error <= 2^-9 each): error/sum|terms|. */
#define TOL_BF16_ACT 2.5e-3
/* ref W4 gemv vs dequantize-then-dot in double, same normalisation (brief: 1e-5 relative). */
#define TOL_REF_DEQ 1e-5
/* rmsnorm, |o - o_ref| / |o_ref|: one reordered sum of squares, then two products. */
#define TOL_NORM 1e-5
/* rope/softmax/silu_mul/attention: a table may only reorder sums; relative to max |out|. */
#define TOL_SMALL 1e-5
/* Quantizer error bounds, RMS error of a group over its range (max - min of the originals):
 * a uniform 4-bit quantizer without clipping has RMS step/sqrt(12): range/15/3.46 = 0.019
 * range asymmetric, about range/14/3.46 = 0.021 symmetric (step amax/7). Measured worst groups
 * (normal data, groups 32..128): 0.024 w4a16, 0.032 w4a8; the bounds leave room for quantizer
 * tuning. */
#define QERR_W4A16_RMS 0.035
#define QERR_W4A8_RMS 0.045
/* Max error of one element over its group's range: about a step (1/15) plus what the search
 * gives up on a clipped outlier; measured worst 0.125 (w4a8, group 128). */
#define QERR_MAX 0.2

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* the fixed-seed PRNG: testutil.h's rng_seed, rng_u64, rng_unit, rng_normal */

static void fill_normal(float *p, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        p[i] = scale * rng_normal();
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* ---- the tables under test: one slot per ISA, ops NULL when this machine lacks it ---- */

struct table_slot {
    const char *name;
    const char *needs;   /* what a machine without it lacks */
    const char *cpuinfo; /* the same as /proc/cpuinfo flags, for tu_skip_hardware */
    const struct kn_ops *ops;
};

#define SLOT_AMX_MODEL (KN_ISA_AMX + 1)
#define CPUINFO_AVX512 "avx512f,avx512bw,avx512vl,avx512_vnni,avx512_bf16"
static struct table_slot slot[SLOT_AMX_MODEL + 1] = {
    [KN_ISA_REF] = {"ref", "nothing", "", NULL},
    [KN_ISA_AVX2] = {"avx2", "AVX2, FMA and F16C, or the table in this build", "avx2,fma,f16c",
                     NULL},
    [KN_ISA_AVX512] = {"avx512",
                       "AVX-512 F/BW/VL/VNNI/BF16 with OS support, or SHARDLM_HAVE_AVX512 in "
                       "this build",
                       CPUINFO_AVX512, NULL},
    [KN_ISA_AMX] = {"amx", "AMX-TILE/INT8/BF16, or the table in this build",
                    "amx_tile,amx_int8,amx_bf16", NULL},
    [SLOT_AMX_MODEL] = {"amx-model", "the AVX-512 table its epilogue uses", CPUINFO_AVX512, NULL},
};

static const struct kn_ops *table_or_skip(void **state)
{
    const struct table_slot *s = *state;
    if (!s->ops)
        tu_skip_hardware(s->cpuinfo, "no %s table: this machine lacks %s", s->name, s->needs);
    return s->ops;
}

/* ---- weight matrices and activations ---- */

struct wmat {
    struct kn_mat m;
    void *buf; /* canonical layout, kn_mat_bytes() */
    float *w;  /* the f32 originals (rows, cols) */
};

/* Lays out @w (rows, cols) as @dt into a canonical buffer. */
static void quantize(enum kn_dtype dt, const float *w, int rows, int cols, int group, void *out)
{
    switch (dt) {
    case KN_DT_F32:
        memcpy(out, w, (size_t)rows * (size_t)cols * sizeof(float));
        break;
    case KN_DT_BF16:
        kn_quant_bf16(w, (size_t)rows * (size_t)cols, out);
        break;
    case KN_DT_Q8:
        kn_quant_q8(w, rows, cols, out);
        break;
    case KN_DT_W4A16:
        kn_quant_w4a16(w, rows, cols, group, out);
        break;
    case KN_DT_W4A8:
        kn_quant_w4a8(w, rows, cols, group, out);
        break;
    case KN_DT_Q6:
        kn_quant_q6(w, rows, cols, out, NULL);
        break;
    case KN_DT_W4A8_T: /* made by tile() from a canonical matrix */
    case KN_DT_W4A16_T:
        fail();
    }
}

static void wmat_init(struct wmat *a, enum kn_dtype dt, int rows, int cols, int group)
{
    a->w = xmalloc((size_t)rows * (size_t)cols * sizeof(float));
    fill_normal(a->w, (size_t)rows * (size_t)cols, 0.05f);
    a->buf = xmalloc(kn_mat_bytes(dt, rows, cols, group));
    quantize(dt, a->w, rows, cols, group, a->buf);
    kn_mat_view(&a->m, dt, rows, cols, group, a->buf);
}

static void wmat_free(struct wmat *a)
{
    free(a->buf);
    free(a->w);
}

static void act_init(struct kn_act *a, int k, int group, float scale)
{
    float *x = xmalloc((size_t)k * sizeof(float));
    fill_normal(x, (size_t)k, scale);
    assert_int_equal(kn_act_alloc(a, k, group), 0);
    kn_act_prepare_scalar(a, x);
    free(x);
}

static int w4_code(const struct kn_mat *w, int n, int k)
{
    const uint8_t *row = (const uint8_t *)w->codes + (size_t)n * kn_w4_row_bytes(w->cols);
    return k % 2 ? row[k / 2] >> 4 : row[k / 2] & 15;
}

/* Sum of the absolute values of the terms the reference adds for row @n: the scale of the
 * rounding error any summation order can make. */
static double dot_mag(const struct kn_mat *w, int n, const struct kn_act *x)
{
    int ng = kn_ngroups(w->cols, w->group);
    double mag = 0.0;
    if (w->dtype == KN_DT_W4A16 || w->dtype == KN_DT_W4A8) {
        const uint16_t *sc = (const uint16_t *)w->scales + (size_t)n * (size_t)ng;
        for (int g = 0; g < ng; g++) {
            int k1 = (g + 1) * w->group < w->cols ? (g + 1) * w->group : w->cols;
            double cx = 0.0, ax = 0.0;
            for (int k = g * w->group; k < k1; k++) {
                double xv = w->dtype == KN_DT_W4A16 ? x->x[k] : x->q[k];
                cx += w4_code(w, n, k) * fabs(xv);
                ax += fabs(xv);
            }
            double s = fabs(kn_f16_to_f32(sc[g])); /* a W4A8 scale may be negative */
            if (w->dtype == KN_DT_W4A16)
                mag += s * (cx + w->zeros[(size_t)n * (size_t)ng + (size_t)g] * ax);
            else
                mag += s * (cx + 8.0 * fabs((double)x->qgsum[g])) * x->qscale;
        }
        return mag;
    }
    float *row = xmalloc((size_t)w->cols * sizeof(float));
    kn_mat_row(w, n, row);
    for (int k = 0; k < w->cols; k++)
        mag += fabs((double)row[k] * x->x[k]);
    free(row);
    return mag;
}

#define SENTINEL 12345.0f

/* Checks y against y_ref on rows [n0, n1) and that rows outside were left alone; returns the
 * largest normalised error. */
static double check_rows(const char *what, const struct kn_mat *w, const struct kn_act *x,
                         const float *y, const float *yref, int n0, int n1, double tol)
{
    double worst = 0.0;
    for (int n = 0; n < w->rows; n++) {
        if (n < n0 || n >= n1) {
            if (y[n] != SENTINEL) {
                print_error("%s: row %d outside [%d, %d) was written\n", what, n, n0, n1);
                fail();
            }
            continue;
        }
        double mag = dot_mag(w, n, x), err = fabs((double)y[n] - yref[n]);
        double rel = err / (mag > 1e-30 ? mag : 1e-30);
        if (!(rel <= tol)) {
            print_error("%s: row %d: %.9g vs ref %.9g (error %.3g of %.3g, tolerance %.1g)\n", what,
                        n, y[n], yref[n], err, mag, tol);
            fail();
        }
        if (rel > worst)
            worst = rel;
    }
    return worst;
}

static const char *dt_name[] = {"f32", "bf16", "q8", "w4a16", "w4a8"};

static bool is_w4(enum kn_dtype dt) { return dt == KN_DT_W4A16 || dt == KN_DT_W4A8; }

/* ---- gemv and gemm against the reference ---- */

/* ops->gemm over a scratch of the size the table asks for this call (a caller sizes one per
 * thread once, for its largest matrix and M); callable from the tests' own threads. */
static void gemm_call(const struct kn_ops *ops, const struct kn_mat *w, const struct kn_act *x,
                      int m, float *y, int ldy, int n0, int n1)
{
    size_t bytes = kn_gemm_scratch_bytes(ops, w, m);
    struct kn_scratch s = {bytes ? aligned_alloc(64, (bytes + 63) / 64 * 64) : NULL, bytes};
    if (bytes && !s.buf)
        abort();
    ops->gemm(w, x, m, y, ldy, n0, n1, bytes ? &s : NULL);
    free(s.buf);
}

static const int gemv_rows[] = {1, 3, 17, 64};
static const int gemv_cols[] = {32, 64, 100, 172, 255, 256, 300};
/* 32/64/128 as in the models; 48 (24-byte groups) and 256 (KN_MAX_GROUP) for the edges */
static const int w4_groups[] = {32, 48, 64, 128, 256};
#define MAX_ROWS 64

/* The quantizers dominate the run time, so each (dtype, group, cols) matrix is quantized once
 * with MAX_ROWS rows, shared by every table, and smaller ones are its first rows. */
static struct wmat gemv_cache[KN_DT_W4A8 + 1][ARRAY_SIZE(w4_groups)][ARRAY_SIZE(gemv_cols)];

static const struct wmat *gemv_matrix(enum kn_dtype dt, size_t gi, size_t ci)
{
    struct wmat *a = &gemv_cache[dt][gi][ci];
    if (!a->buf) {
        uint64_t saved =
            *tu_rng_state(); /* the same draws for the caller whether or not this hits */
        rng_seed(1000 + 100 * (uint64_t)dt + 10 * gi + ci);
        wmat_init(a, dt, MAX_ROWS, gemv_cols[ci], is_w4(dt) ? w4_groups[gi] : 32);
        *tu_rng_state() = saved;
    }
    return a;
}

static void gemv_cache_free(void)
{
    for (size_t i = 0; i < sizeof(gemv_cache) / sizeof(struct wmat); i++) {
        struct wmat *a = &(&gemv_cache[0][0][0])[i];
        if (a->buf)
            wmat_free(a);
    }
}

/* @dst = the first @n rows of @src, in a canonical buffer of its own. */
static void wmat_first_rows(struct wmat *dst, const struct wmat *src, int n)
{
    const struct kn_mat *s = &src->m;
    size_t rows = (size_t)n, ng = (size_t)kn_ngroups(s->cols, s->group);
    dst->w = NULL;
    dst->buf = xmalloc(kn_mat_bytes(s->dtype, n, s->cols, s->group));
    kn_mat_view(&dst->m, s->dtype, n, s->cols, s->group, dst->buf);
    switch (s->dtype) {
    case KN_DT_F32:
        memcpy(dst->buf, s->codes, rows * (size_t)s->cols * 4);
        break;
    case KN_DT_BF16:
        memcpy(dst->buf, s->codes, rows * (size_t)s->cols * 2);
        break;
    case KN_DT_Q8:
        memcpy(dst->buf, s->codes, rows * (size_t)s->cols);
        memcpy((void *)dst->m.scales, s->scales, rows * sizeof(float));
        break;
    case KN_DT_W4A16:
    case KN_DT_W4A8:
        memcpy(dst->buf, s->codes, rows * kn_w4_row_bytes(s->cols));
        memcpy((void *)dst->m.scales, s->scales, rows * ng * 2);
        if (s->dtype == KN_DT_W4A16)
            memcpy((void *)dst->m.zeros, s->zeros, rows * ng);
        break;
    case KN_DT_W4A8_T:
    case KN_DT_W4A16_T:
    case KN_DT_Q6: /* test_q6's own */
        fail();
    }
}

static void test_gemv(void **state)
{
    const struct kn_ops *ops = table_or_skip(state);
    double worst[5] = {0};
    int cases = 0;
    rng_seed(1);
    for (int dt = KN_DT_F32; dt <= KN_DT_W4A8; dt++) {
        size_t ngr = is_w4(dt) ? ARRAY_SIZE(w4_groups) : 1;
        for (size_t gi = 0; gi < ngr; gi++) {
            int group = is_w4(dt) ? w4_groups[gi] : 32;
            for (size_t ci = 0; ci < ARRAY_SIZE(gemv_cols); ci++) {
                int K = gemv_cols[ci];
                /* group 256 only where a row has more than one group */
                if (group == 256 && K <= 256)
                    continue;
                const struct wmat *full = gemv_matrix(dt, gi, ci);
                for (size_t ri = 0; ri < ARRAY_SIZE(gemv_rows); ri++) {
                    int N = gemv_rows[ri];
                    char what[96];
                    snprintf(what, sizeof(what), "%s gemv %s N=%d K=%d group=%d", ops->name,
                             dt_name[dt], N, K, group);
                    struct wmat a;
                    struct kn_act x;
                    wmat_first_rows(&a, full, N);
                    act_init(&x, K, group, 1.0f);
                    float y[MAX_ROWS], yref[MAX_ROWS];
                    kn_gemv_ref(&a.m, &x, yref, 0, N);
                    /* the whole matrix, then a part in the middle */
                    int r[2][2] = {{0, N}, {N / 3, N - N / 4}};
                    for (int p = 0; p < 2; p++) {
                        for (int n = 0; n < N; n++)
                            y[n] = SENTINEL;
                        ops->gemv(&a.m, &x, y, r[p][0], r[p][1]);
                        double e = check_rows(what, &a.m, &x, y, yref, r[p][0], r[p][1], TOL_DOT);
                        worst[dt] = fmax(worst[dt], e);
                    }
                    kn_act_free(&x);
                    wmat_free(&a);
                    cases++;
                }
            }
        }
    }
    print_message("[          ] %s gemv: %d shapes, worst error/sum|terms|: f32 %.2g bf16 %.2g "
                  "q8 %.2g w4a16 %.2g w4a8 %.2g (tolerance %.1g)\n",
                  ops->name, cases, worst[0], worst[1], worst[2], worst[3], worst[4], TOL_DOT);
}

static const int gemm_m[] = {1, 2, 3, 4, 5, 16, 17};

static void test_gemm(void **state)
{
    const struct kn_ops *ops = table_or_skip(state);
    static const struct {
        int n, k, group;
    } shapes[] = {{17, 172, 64}, {64, 255, 32}, {3, 300, 128}, {5, 100, 48}};
    double worst = 0.0;
    rng_seed(2);
    for (int dt = KN_DT_F32; dt <= KN_DT_W4A8; dt++) {
        for (size_t si = 0; si < ARRAY_SIZE(shapes); si++) {
            int N = shapes[si].n, K = shapes[si].k, group = shapes[si].group;
            struct wmat a;
            wmat_init(&a, dt, N, K, group);
            for (size_t mi = 0; mi < ARRAY_SIZE(gemm_m); mi++) {
                int M = gemm_m[mi], ldy = N + 3; /* a gap after each output row */
                struct kn_act *x = xmalloc((size_t)M * sizeof(*x));
                for (int i = 0; i < M; i++)
                    act_init(&x[i], K, group, 0.5f + (float)i);
                float *y = xmalloc((size_t)M * (size_t)ldy * sizeof(float));
                float *yref = xmalloc((size_t)M * (size_t)ldy * sizeof(float));
                kn_gemm_ref(&a.m, x, M, yref, ldy, 0, N);
                int r[3][2] = {{0, N}, {1, N}, {N / 2, N / 2 + 1}};
                for (int p = 0; p < 3; p++) {
                    int n0 = r[p][0], n1 = r[p][1];
                    for (size_t i = 0; i < (size_t)M * (size_t)ldy; i++)
                        y[i] = SENTINEL;
                    gemm_call(ops, &a.m, x, M, y, ldy, n0, n1);
                    for (int i = 0; i < M; i++) {
                        char what[96];
                        snprintf(what, sizeof(what), "%s gemm %s M=%d (act %d) N=%d K=%d g=%d",
                                 ops->name, dt_name[dt], M, i, N, K, group);
                        const float *yi = y + (size_t)i * (size_t)ldy;
                        worst = fmax(worst,
                                     check_rows(what, &a.m, &x[i], yi,
                                                yref + (size_t)i * (size_t)ldy, n0, n1, TOL_DOT));
                        for (int n = N; n < ldy; n++)
                            assert_true(yi[n] == SENTINEL);
                        /* an int8 product over several tokens (a batched step's LM head) gives
                         * each token its one-token result, bit for bit */
                        if (dt == KN_DT_Q8) {
                            float one[80];
                            ops->gemv(&a.m, &x[i], one, n0, n1);
                            assert_memory_equal(one + n0, yi + n0,
                                                (size_t)(n1 - n0) * sizeof(float));
                        }
                    }
                }
                free(y);
                free(yref);
                for (int i = 0; i < M; i++)
                    kn_act_free(&x[i]);
                free(x);
            }
            wmat_free(&a);
        }
    }
    print_message("[          ] %s gemm: worst error/sum|terms| %.2g (tolerance %.1g)\n", ops->name,
                  worst, TOL_DOT);
}

/* A matrix whose codes end exactly where a PROT_NONE page begins: a kernel that reads one byte
 * past the last row faults. Each layout part is placed at the end of its own guarded mapping. */
struct guarded {
    uint8_t *base;
    size_t len;
};

/* Copies @bytes of @src to the end of a fresh mapping followed by a PROT_NONE page, as close to
 * it as alignment @align allows (the parts hold floats or fp16). */
static void *guarded_tail(struct guarded *g, const void *src, size_t bytes, size_t align)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), body = (bytes + page - 1) / page * page;
    g->len = body + page;
    g->base = mmap(NULL, g->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(g->base != MAP_FAILED);
    assert_int_equal(mprotect(g->base + body, page, PROT_NONE), 0);
    uint8_t *dst = g->base + ((body - bytes) & ~(align - 1));
    memcpy(dst, src, bytes);
    return dst;
}

static void guarded_free(struct guarded *g) { munmap(g->base, g->len); }

/* ---- KN_DT_Q6, the 6-bit head ---- */

/* The layout (kn.h) read back, the quantizer's error, the padding; each table's product the
 * reference's bit for bit (GEMV over ragged rows and ranges, GEMM over 1..6 tokens = each token
 * alone), codes ending at a guard page; the reference against the dequantized weights times the
 * quantized activations (double), and against the f32 product within 6-bit rounding. */
static void test_q6(void **state)
{
    const struct kn_ops *ops = table_or_skip(state);
    static const int cols[] = {1, 31, 32, 100, 255, 256, 257, 300, 600, 2048};
    static const int rows[] = {1, 3, 5, 7, 17, 64};
    enum { N = 64, M = 6 };
    rng_seed(6);
    double worst_f32 = 0.0;
    for (size_t ci = 0; ci < ARRAY_SIZE(cols); ci++) {
        int K = cols[ci], nb = kn_q6_blocks(K);
        struct wmat a;
        wmat_init(&a, KN_DT_Q6, N, K, 32);
        float *deq = xmalloc((size_t)K * sizeof(float));
        for (int n = 0; n < N; n++) { /* codes, scales, padding */
            kn_mat_row(&a.m, n, deq);
            for (int k = 0; k < K; k++) {
                float s = fabsf(kn_f16_to_f32(kn_q6_scale(&a.m, n, k / 32)));
                assert_true(fabsf(deq[k] - a.w[(size_t)n * (size_t)K + (size_t)k]) <=
                            s * 1.0001f + 1e-12f);
            }
            for (int k = K; k < nb * KN_Q6_BLOCK; k++)
                assert_int_equal(kn_q6_code(&a.m, n, k), 32);
        }
        struct kn_act x[M];
        for (int i = 0; i < M; i++)
            act_init(&x[i], K, 32, 0.5f + (float)i);
        float yref[M][N], y[M][N];
        kn_gemm_ref(&a.m, x, M, &yref[0][0], N, 0, N);
        for (int i = 0; i < M; i++) {
            double e2 = 0.0, f2 = 0.0;
            for (int n = 0; n < N; n++) {
                kn_mat_row(&a.m, n, deq);
                double want = 0.0, mag = 0.0, f32 = 0.0;
                for (int k = 0; k < K; k++) {
                    int b = k / KN_Q6_BLOCK, p = kn_q6_pos(k % KN_Q6_BLOCK);
                    double q = x[i].q6[(size_t)b * KN_Q6_BLOCK + (size_t)p] *
                               (double)x[i].q6scale[b * 16 + p % 64 / 4];
                    want += (double)deq[k] * q;
                    mag += fabs((double)deq[k] * q);
                    f32 += (double)a.w[(size_t)n * (size_t)K + (size_t)k] * x[i].x[k];
                }
                if (!(fabs(yref[i][n] - want) <= 1e-5 * mag + 1e-30))
                    fail_msg("q6 ref K=%d row %d: %.9g, want %.9g", K, n, yref[i][n], want);
                e2 += (yref[i][n] - f32) * (yref[i][n] - f32);
                f2 += f32 * f32;
            }
            worst_f32 = fmax(worst_f32, sqrt(e2 / f2));
        }
        for (size_t ri = 0; ri < ARRAY_SIZE(rows); ri++) {
            int R = rows[ri];
            int r[3][2] = {{0, R}, {R / 3, R - R / 4}, {R - 1, R}};
            for (int p = 0; p < 3; p++) {
                for (int n = 0; n < N; n++)
                    y[0][n] = SENTINEL;
                ops->gemv(&a.m, &x[0], y[0], r[p][0], r[p][1]);
                for (int n = 0; n < N; n++)
                    if (n >= r[p][0] && n < r[p][1] ? memcmp(&y[0][n], &yref[0][n], 4)
                                                    : y[0][n] != SENTINEL)
                        fail_msg("%s q6 gemv K=%d rows [%d, %d): row %d %.9g, ref %.9g", ops->name,
                                 K, r[p][0], r[p][1], n, y[0][n], yref[0][n]);
            }
        }
        for (int m = 1; m <= M; m++)
            for (int p = 0; p < 2; p++) {
                int n0 = p ? N / 2 - 3 : 0, n1 = p ? N / 2 + 2 : N;
                for (int i = 0; i < M; i++)
                    for (int n = 0; n < N; n++)
                        y[i][n] = SENTINEL;
                gemm_call(ops, &a.m, x, m, &y[0][0], N, n0, n1);
                for (int i = 0; i < M; i++)
                    for (int n = 0; n < N; n++)
                        if (i < m && n >= n0 && n < n1 ? memcmp(&y[i][n], &yref[i][n], 4)
                                                       : y[i][n] != SENTINEL)
                            fail_msg("%s q6 gemm K=%d M=%d token %d row %d: %.9g, ref %.9g",
                                     ops->name, K, m, i, n, y[i][n], yref[i][n]);
            }
        /* the codes end at a guard page, the scales at another */
        struct guarded g1, g2;
        struct kn_mat m = a.m;
        m.codes = guarded_tail(&g1, a.m.codes, (size_t)N * kn_row_bytes(KN_DT_Q6, K), 64);
        m.scales = guarded_tail(&g2, a.m.scales, (size_t)N * (size_t)nb * 16, 2);
        ops->gemv(&m, &x[1], y[1], 0, N);
        assert_memory_equal(y[1], yref[1], sizeof(y[1]));
        guarded_free(&g1);
        guarded_free(&g2);
        for (int i = 0; i < M; i++)
            kn_act_free(&x[i]);
        free(deq);
        wmat_free(&a);
    }
    print_message("[          ] %s q6: rel. L2 distance to the f32 product %.3g (bound 0.03)\n",
                  ops->name, worst_f32);
    assert_true(worst_f32 <= 0.03);
}

static void test_guard_page(void **state)
{
    const struct kn_ops *ops = table_or_skip(state);
    static const struct {
        int n, k, group;
    } shapes[] = {{5, 255, 32}, {3, 172, 128}, {2, 33, 32}, {4, 100, 48}, {1, 1, 32}, {7, 31, 32}};
    rng_seed(3);
    for (int dt = KN_DT_F32; dt <= KN_DT_W4A8; dt++) {
        for (size_t si = 0; si < ARRAY_SIZE(shapes); si++) {
            int N = shapes[si].n, K = shapes[si].k, group = shapes[si].group;
            char what[96];
            snprintf(what, sizeof(what), "%s guard %s N=%d K=%d group=%d", ops->name, dt_name[dt],
                     N, K, group);
            struct wmat a;
            struct kn_act x[2];
            wmat_init(&a, dt, N, K, group);
            act_init(&x[0], K, group, 1.0f);
            act_init(&x[1], K, group, 2.0f);
            float yref[16], y[16];
            kn_gemv_ref(&a.m, &x[0], yref, 0, N);

            /* 1: the whole canonical buffer ends at the guard (W4A16's byte-sized zero points
             * last, so up to 1 byte before it: the fp16 scales need an even base) */
            size_t bytes = kn_mat_bytes(dt, N, K, group);
            size_t align = dt == KN_DT_F32 || dt == KN_DT_Q8 ? 4 : 2;
            struct guarded g0, g1, g2, g3;
            struct kn_mat m;
            kn_mat_view(&m, dt, N, K, group, guarded_tail(&g0, a.buf, bytes, align));
            for (int n = 0; n < N; n++)
                y[n] = SENTINEL;
            ops->gemv(&m, &x[0], y, 0, N);
            check_rows(what, &a.m, &x[0], y, yref, 0, N, TOL_DOT);

            /* 2: the codes (without the layout's 64-byte padding) end at one guard, scales and
             * zeros at others */
            size_t esize = dt == KN_DT_F32 ? 4 : dt == KN_DT_BF16 ? 2 : 1;
            size_t code_bytes = (size_t)N * (is_w4(dt) ? kn_w4_row_bytes(K) : (size_t)K * esize);
            m = a.m;
            m.codes = guarded_tail(&g1, a.m.codes, code_bytes, esize);
            size_t ng = (size_t)kn_ngroups(K, group);
            g2.base = g3.base = NULL;
            if (dt == KN_DT_Q8)
                m.scales = guarded_tail(&g2, a.m.scales, (size_t)N * sizeof(float), 4);
            if (is_w4(dt))
                m.scales = guarded_tail(&g2, a.m.scales, (size_t)N * ng * 2, 2);
            if (dt == KN_DT_W4A16)
                m.zeros = guarded_tail(&g3, a.m.zeros, (size_t)N * ng, 1);
            for (int n = 0; n < N; n++)
                y[n] = SENTINEL;
            ops->gemv(&m, &x[0], y, 0, N);
            check_rows(what, &a.m, &x[0], y, yref, 0, N, TOL_DOT);
            /* the last row alone, through gemm */
            float ym[2][16], ymref[2][16];
            kn_gemm_ref(&a.m, x, 2, &ymref[0][0], 16, 0, N);
            for (int i = 0; i < 2; i++)
                for (int n = 0; n < N; n++)
                    ym[i][n] = SENTINEL;
            gemm_call(ops, &m, x, 2, &ym[0][0], 16, N - 1, N);
            for (int i = 0; i < 2; i++)
                check_rows(what, &a.m, &x[i], ym[i], ymref[i], N - 1, N, TOL_DOT);

            guarded_free(&g0);
            guarded_free(&g1);
            if (g2.base)
                guarded_free(&g2);
            if (g3.base)
                guarded_free(&g3);
            kn_act_free(&x[0]);
            kn_act_free(&x[1]);
            wmat_free(&a);
        }
    }
}

/* ---- the tile layouts (KN_DT_W4A8_T, KN_DT_W4A16_T) ---- */

static const enum kn_dtype tile_src[] = {KN_DT_W4A8, KN_DT_W4A16};

static enum kn_dtype tiled(enum kn_dtype dt)
{
    return dt == KN_DT_W4A8 ? KN_DT_W4A8_T : KN_DT_W4A16_T;
}

/* The tiled image of canonical W4 @src in @buf (caller frees). */
static void tile(const struct kn_mat *src, struct kn_mat *out, void **buf)
{
    size_t bytes = kn_mat_bytes(tiled(src->dtype), src->rows, src->cols, src->group);
    *buf = xmalloc(bytes);
    memset(*buf, 0xa5, bytes); /* the repack must write every byte */
    int nblk = (src->rows + KN_TILE_ROWS - 1) / KN_TILE_ROWS;
    /* in two calls, as a streaming loader would */
    kn_repack_tiles(src, 0, nblk / 2, *buf);
    kn_repack_tiles(src, nblk / 2, nblk, *buf);
    kn_mat_view(out, tiled(src->dtype), src->rows, src->cols, src->group, *buf);
}

/* Repacking keeps every code, scale and zero point, and pads with code 0. (The reference reads
 * through the same accessors, so its sums over both layouts follow from this.) */
static void test_tiles_repack(void **state)
{
    (void)state;
    static const struct {
        int n, k, group;
    } shapes[] = {{1, 32, 32}, {17, 172, 64}, {40, 300, 128}, {33, 100, 48}, {16, 520, 256}};
    rng_seed(5);
    for (size_t c = 0; c < ARRAY_SIZE(tile_src) * ARRAY_SIZE(shapes); c++) {
        size_t di = c / ARRAY_SIZE(shapes), si = c % ARRAY_SIZE(shapes);
        int N = shapes[si].n, K = shapes[si].k, group = shapes[si].group;
        struct wmat a;
        struct kn_mat t;
        void *buf;
        wmat_init(&a, tile_src[di], N, K, group);
        tile(&a.m, &t, &buf);
        for (int n = 0; n < N; n++) {
            for (int k = 0; k < K; k++)
                assert_int_equal(kn_w4_code(&t, n, k), kn_w4_code(&a.m, n, k));
            for (int g = 0; g < kn_ngroups(K, group); g++) {
                assert_int_equal(kn_w4_scale(&t, n, g), kn_w4_scale(&a.m, n, g));
                assert_int_equal(kn_w4_zero(&t, n, g), kn_w4_zero(&a.m, n, g));
            }
        }
        /* padding rows and columns hold code 0 (their activations are 0 too) */
        const uint8_t *b = buf;
        size_t last = (size_t)(N - 1) / KN_TILE_ROWS * kn_tile_block_bytes(t.dtype, K, group);
        for (size_t o = 0; o < kn_tile_scales_offset(K, group); o += 64)
            for (int n = (N - 1) % KN_TILE_ROWS + 1; n < KN_TILE_ROWS; n++)
                assert_int_equal(b[last + o + (size_t)n * 4], 0);
        free(buf);
        wmat_free(&a);
    }
}

/* Tiled GEMM against the canonical reference over ragged shapes and the token counts prefill
 * chunks have, with output ranges that start and end inside a block; a GEMV over a row of 130
 * groups, past the 128 whose sums a GEMV block keeps before it reads their scales; 10 blocks,
 * which the AVX-512 GEMV reads as 4 runs of 2 and 2 left over, over 35 groups (past the 32 a run
 * keeps) and over groups of an odd number of octets (40). */
static void test_tiles_gemm(void **state)
{
    const struct kn_ops *ops = table_or_skip(state);
    static const struct {
        int n, k, group;
    } shapes[] = {{17, 172, 64}, {64, 256, 32},  {40, 300, 128},  {33, 100, 48},
                  {1, 520, 256}, {20, 4160, 32}, {150, 1100, 32}, {150, 320, 40}};
    static const int ms[] = {1, 2, 3, 4, 5, 16, 17, 64, 512};
    double worst = 0.0, worst_bf16 = 0.0;
    int cases = 0;
    rng_seed(6);
    for (size_t c = 0; c < ARRAY_SIZE(tile_src) * ARRAY_SIZE(shapes); c++) {
        size_t di = c / ARRAY_SIZE(shapes), si = c % ARRAY_SIZE(shapes);
        int N = shapes[si].n, K = shapes[si].k, group = shapes[si].group, ldy = N + 3;
        struct wmat a;
        struct kn_mat t;
        void *buf;
        wmat_init(&a, tile_src[di], N, K, group);
        tile(&a.m, &t, &buf);
        for (size_t mi = 0; mi < ARRAY_SIZE(ms); mi++) {
            int M = ms[mi];
            if (M == 512 && N > 40) /* the reference is slow; one big-M shape is enough */
                continue;
            if (M > 1 && K > 1024) /* the long row is the GEMV's */
                continue;
            struct kn_act *x = xmalloc((size_t)M * sizeof(*x));
            for (int i = 0; i < M; i++)
                act_init(&x[i], K, group, 0.5f + (float)(i % 7));
            float *y = xmalloc((size_t)M * (size_t)ldy * sizeof(float));
            float *yref = xmalloc((size_t)M * (size_t)ldy * sizeof(float));
            kn_gemm_ref(&a.m, x, M, yref, ldy, 0, N);
            int r[4][2] = {{0, N}, {N > 16 ? 16 : 0, N}, {N / 2, N / 2 + 1}, {N / 5, N - N / 6}};
            for (int p = 0; p < 4; p++) {
                int n0 = r[p][0], n1 = r[p][1];
                for (size_t i = 0; i < (size_t)M * (size_t)ldy; i++)
                    y[i] = SENTINEL;
                if (M == 1)
                    ops->gemv(&t, x, y, n0, n1);
                else
                    gemm_call(ops, &t, x, M, y, ldy, n0, n1);
                for (int i = 0; i < M; i++) {
                    char what[96];
                    snprintf(what, sizeof(what), "%s %s tiles M=%d (act %d) N=%d K=%d g=%d [%d,%d)",
                             ops->name, dt_name[tile_src[di]], M, i, N, K, group, n0, n1);
                    const float *yi = y + (size_t)i * (size_t)ldy;
                    bool bf16 = ops->isa == KN_ISA_AMX && tile_src[di] == KN_DT_W4A16;
                    double e = check_rows(what, &a.m, &x[i], yi, yref + (size_t)i * (size_t)ldy, n0,
                                          n1, bf16 ? TOL_BF16_ACT : TOL_DOT);
                    if (bf16)
                        worst_bf16 = fmax(worst_bf16, e);
                    else
                        worst = fmax(worst, e);
                    for (int n = N; n < ldy && M > 1; n++)
                        assert_true(yi[n] == SENTINEL);
                    /* a W4A8 product over several tokens (batched decode, prefill) gives each
                     * token its one-token result, bit for bit: batched logits equal solo ones */
                    if (M > 1 && tile_src[di] == KN_DT_W4A8 && ops->isa != KN_ISA_AMX) {
                        float *one = xmalloc((size_t)N * sizeof(float));
                        ops->gemv(&t, &x[i], one, n0, n1);
                        assert_memory_equal(one + n0, yi + n0, (size_t)(n1 - n0) * sizeof(float));
                        free(one);
                    }
                }
                cases++;
            }
            free(y);
            free(yref);
            for (int i = 0; i < M; i++)
                kn_act_free(&x[i]);
            free(x);
        }
        free(buf);
        wmat_free(&a);
    }
    print_message("[          ] %s tiles: %d cases, worst error/sum|terms| %.2g (tolerance %.1g)\n",
                  ops->name, cases, worst, TOL_DOT);
    if (ops->isa == KN_ISA_AMX)
        print_message(
            "[          ] %s w4a16 tiles, bf16 activations: worst %.2g (tolerance %.1g)\n",
            ops->name, worst_bf16, TOL_BF16_ACT);
}

/* Ends the calling thread's first pass over the weights for the prefetch tuner, whose calls it
 * does not time: a call on @w, then on another matrix, so that the next call on @w is the
 * second pass's (neither call reads the weights). */
static void pf_first_pass(const struct kn_mat *w)
{
    static const uint8_t other;
    struct kn_mat o = *w;
    o.codes = &other;
    struct kn_pf_call c;
    kn_pf_begin(&c, w, w->rows);
    kn_pf_end(&c);
    kn_pf_begin(&c, &o, o.rows);
    kn_pf_end(&c);
}

/* Whether a call on this thread over @arg (a struct kn_mat) is timed by the tuner, not forced. */
static void *pf_tuned_here(void *arg)
{
    struct kn_pf_call c;
    pf_first_pass(arg);
    kn_pf_begin(&c, arg, 16);
    bool tuned = c.shape != NULL;
    kn_pf_end(&c);
    kn_pf_reset();
    return tuned ? arg : NULL;
}

/* The decode GEMVs that tune their software prefetch (kernels/kn_prefetch.c): every mode gives
 * the same results, bit for bit, over whole matrices and parts of one; a thread settles on one
 * mode per format and shape after its timed calls and forgets it on kn_pf_reset; a forced mode
 * holds for every call. */
static void test_prefetch_modes(void **state)
{
    const struct kn_ops *ops = table_or_skip(state);
    static const struct {
        enum kn_dtype dt;
        int n, k, group;
    } cases[] = {{KN_DT_W4A8, 40, 300, 128},
                 {KN_DT_W4A8, 33, 4160, 32},
                 {KN_DT_W4A8, 150, 4160, 32},
                 {KN_DT_Q8, 37, 1000, 32},
                 {KN_DT_Q8, 9, 8192, 32}};
    rng_seed(9);
    for (size_t c = 0; c < ARRAY_SIZE(cases); c++) {
        int N = cases[c].n, K = cases[c].k;
        struct wmat a;
        struct kn_mat t = {0};
        void *buf = NULL;
        wmat_init(&a, cases[c].dt, N, K, cases[c].group);
        if (cases[c].dt == KN_DT_W4A8)
            tile(&a.m, &t, &buf);
        const struct kn_mat *w = buf ? &t : &a.m;
        struct kn_act x;
        act_init(&x, K, cases[c].group, 1.0f);
        float y[160], want[160];
        int r[2][2] = {{0, N}, {N / 3, N - N / 4}};
        for (int p = 0; p < 2; p++) {
            int n0 = r[p][0], n1 = r[p][1];
            kn_pf_force(KN_PF_HW);
            for (int n = 0; n < N; n++)
                want[n] = SENTINEL;
            ops->gemv(w, &x, want, n0, n1);
            float yref[160];
            char what[96];
            snprintf(what, sizeof(what), "%s prefetch %s N=%d K=%d [%d,%d)", ops->name,
                     dt_name[cases[c].dt], N, K, n0, n1);
            kn_gemv_ref(&a.m, &x, yref, 0, N);
            check_rows(what, &a.m, &x, want, yref, n0, n1, TOL_DOT);
            for (int mode = KN_PF_L1; mode < KN_PF_COUNT; mode++) {
                kn_pf_force(mode);
                ops->gemv(w, &x, y, n0, n1);
                assert_memory_equal(y + n0, want + n0, (size_t)(n1 - n0) * sizeof(float));
            }
            kn_pf_force(-1);
            kn_pf_reset();
            pf_first_pass(w);
            int calls = 0; /* until the tuner decides, and as many again in its mode */
            for (int settled = 0; settled < 10; calls++) {
                assert_true(calls < 1000);
                ops->gemv(w, &x, y, n0, n1);
                assert_memory_equal(y + n0, want + n0, (size_t)(n1 - n0) * sizeof(float));
                settled += kn_pf_chosen(w, n1 - n0) >= 0;
            }
            int chosen = kn_pf_chosen(w, n1 - n0);
            assert_true(chosen >= 0 && chosen < KN_PF_COUNT && calls > KN_PF_COUNT);
            kn_pf_reset();
            assert_int_equal(kn_pf_chosen(w, n1 - n0), -1);
        }
        kn_act_free(&x);
        free(buf);
        wmat_free(&a);
    }
    /* the rule: the lowest median, L2 in a tie with it */
    static const struct {
        uint32_t med[KN_PF_COUNT];
        int want;
    } rule[] = {{{100, 100, 100}, KN_PF_L2},
                {{99, 99, 100}, KN_PF_HW},
                {{100, 99, 99}, KN_PF_L2},
                {{94, 80, 100}, KN_PF_L1},
                {{50, 60, 40}, KN_PF_L2},
                {{0, 1, 2}, KN_PF_HW},
                {{UINT32_MAX, 10, UINT32_MAX}, KN_PF_L1}};
    for (size_t i = 0; i < ARRAY_SIZE(rule); i++)
        assert_int_equal(kn_pf_decide(rule[i].med), rule[i].want);
    assert_int_equal(kn_pf_parse("auto"), -1);
    assert_int_equal(kn_pf_parse("hw"), KN_PF_HW);
    assert_int_equal(kn_pf_parse("l2"), KN_PF_L2);
    assert_int_equal(kn_pf_parse("L2"), -2);
    assert_string_equal(kn_pf_name(kn_pf_parse("l1")), "l1");
    /* a forced mode is the forcing thread's (the worker forces each pool member's): another
     * thread still tunes */
    struct kn_mat d = {.dtype = KN_DT_Q8, .rows = 16, .cols = 4096};
    struct kn_pf_call c;
    void *other = NULL;
    pthread_t th;
    kn_pf_force(KN_PF_L1);
    assert_int_equal(pthread_create(&th, NULL, pf_tuned_here, &d), 0);
    assert_int_equal(pthread_join(th, &other), 0);
    assert_ptr_equal(other, &d);
    assert_int_equal(kn_pf_begin(&c, &d, 16), KN_PF_L1);
    assert_null(c.shape);
    kn_pf_end(&c);
    kn_pf_force(-1);
    assert_ptr_equal(pf_tuned_here(&d), &d);
    /* a thread's first pass over the weights runs the default mode untimed (it faults their
     * pages in), over every shape, also over chunks of one matrix taken one after another: timing
     * starts when the thread's first matrix comes again after another */
    static const uint8_t mats[3];
    struct kn_mat e[3];
    for (int i = 0; i < 3; i++)
        e[i] =
            (struct kn_mat){.dtype = KN_DT_W4A8_T, .rows = 32 << i, .cols = 512, .codes = &mats[i]};
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < 3; i++)
            for (int chunk = 0; chunk < 2; chunk++) {
                int mode = kn_pf_begin(&c, &e[i], 16);
                assert_int_equal(mode, pass ? (2 * i + chunk) % KN_PF_COUNT : KN_PF_L2);
                assert_true((c.shape != NULL) == (pass > 0));
                kn_pf_end(&c);
            }
    assert_int_equal(kn_pf_chosen(&e[0], 16), -1);
    kn_pf_reset();
    /* a thread that only ever reads one matrix ends its first pass after enough calls */
    int calls = 0;
    for (c.shape = NULL; !c.shape && calls < (1 << 18); calls++) {
        kn_pf_begin(&c, &e[0], 16);
        kn_pf_end(&c);
    }
    assert_true(calls > 1000 && calls < (1 << 18));
    kn_pf_reset();
}

/* The GEMM scratch a caller sizes once (kn_gemm_scratch_bytes): the AMX tables' tile GEMMs of
 * 16 tokens and more need one, growing with M (the tokens' panel), and nothing else does; the
 * kernels allocate none (the AMX table grew its own per thread and fell back to AVX-512 without
 * a word when it could not). */
static void test_gemm_scratch(void **state)
{
    const struct kn_ops *ops = table_or_skip(state);
    static const enum kn_dtype dts[] = {KN_DT_W4A8, KN_DT_W4A16};
    for (size_t d = 0; d < ARRAY_SIZE(dts); d++) {
        struct wmat a;
        struct kn_mat t = {0};
        void *buf = NULL;
        wmat_init(&a, dts[d], 40, 300, 64);
        tile(&a.m, &t, &buf);
        assert_int_equal(kn_gemm_scratch_bytes(ops, &a.m, 64), 0);
        assert_int_equal(kn_gemm_scratch_bytes(ops, &t, 15), 0);
        size_t s16 = kn_gemm_scratch_bytes(ops, &t, 16), s17 = kn_gemm_scratch_bytes(ops, &t, 17);
        size_t elem = dts[d] == KN_DT_W4A16 ? 2 : 1, kpad = 320; /* 5 groups of 64 */
        if (ops->isa == KN_ISA_AMX) {
            assert_true(s16 >= (16 + KN_TILE_ROWS) * kpad * elem);
            assert_true(s17 >= (32 + KN_TILE_ROWS) * kpad * elem && s17 > s16);
        } else {
            assert_true(s16 == 0 && s17 == 0 && !ops->gemm_scratch);
        }
        free(buf);
        wmat_free(&a);
    }
}

/* The tiled image ends at a PROT_NONE page: no load past the last block. */
static void test_tiles_guard(void **state)
{
    const struct kn_ops *ops = table_or_skip(state);
    rng_seed(7);
    for (size_t di = 0; di < ARRAY_SIZE(tile_src); di++) {
        int N = 20, K = 100, group = 32;
        struct wmat a;
        struct kn_mat t;
        void *buf;
        wmat_init(&a, tile_src[di], N, K, group);
        tile(&a.m, &t, &buf);
        struct guarded g;
        struct kn_mat m = t;
        m.codes = guarded_tail(&g, buf, kn_mat_bytes(t.dtype, N, K, group), 64);
        struct kn_act x[3];
        float y[3][32], yref[3][32];
        for (int i = 0; i < 3; i++)
            act_init(&x[i], K, group, 1.0f);
        kn_gemm_ref(&a.m, x, 3, &yref[0][0], 32, 0, N);
        for (int i = 0; i < 3; i++)
            for (int n = 0; n < 32; n++)
                y[i][n] = SENTINEL;
        gemm_call(ops, &m, x, 3, &y[0][0], 32, 0, N);
        for (int i = 0; i < 3; i++)
            check_rows("tiles guard", &a.m, &x[i], y[i], yref[i], 0, N, TOL_DOT);
        for (int i = 0; i < 3; i++)
            kn_act_free(&x[i]);
        guarded_free(&g);
        free(buf);
        wmat_free(&a);
    }
}

/* ---- small ops against the reference ---- */

static double rel_err_vec(const float *a, const float *b, int n)
{
    double mx = 0.0, err = 0.0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d))
            return INFINITY;
        mx = fmax(mx, fabs((double)b[i]));
        err = fmax(err, d);
    }
    return err / (mx > 1e-30 ? mx : 1e-30);
}

static void test_rmsnorm(void **state)
{
    const struct kn_ops *ops = table_or_skip(state);
    static const int ns[] = {1, 15, 16, 17, 100, 288};
    rng_seed(4);
    for (size_t t = 0; t < ARRAY_SIZE(ns); t++) {
        int n = ns[t];
        float x[288], w[288], o[289], oref[288];
        fill_normal(x, (size_t)n, 3.0f);
        fill_normal(w, (size_t)n, 1.0f);
        o[n] = SENTINEL;
        kn_rmsnorm_ref(oref, x, w, n, 1e-5f);
        ops->rmsnorm(o, x, w, n, 1e-5f);
        for (int i = 0; i < n; i++) {
            double rel = fabs((double)o[i] - oref[i]) / fmax(fabs((double)oref[i]), 1e-30);
            if (!(rel <= TOL_NORM)) {
                print_error("%s rmsnorm n=%d [%d]: %.9g vs %.9g\n", ops->name, n, i, o[i], oref[i]);
                fail();
            }
        }
        assert_true(o[n] == SENTINEL);
        /* in place (o == x) is how the worker calls it */
        ops->rmsnorm(x, x, w, n, 1e-5f);
        assert_true(rel_err_vec(x, oref, n) <= TOL_NORM);
    }
}

/* Each table's rope against the reference, at magnitude 1 and at a YaRN/LongRoPE-like 1.19;
 * the reference's magnitude scales a plain rotation's output by itself (up to one rounding). */
static void test_rope(void **state)
{
    const struct kn_ops *ops = table_or_skip(state);
    static const int hds[] = {8, 16, 64};
    static const float mscales[] = {1.0f, 1.19f};
    rng_seed(5);
    for (int neox = 0; neox <= 1; neox++) {
        for (size_t t = 0; t < ARRAY_SIZE(hds); t++) {
            for (int pos = 0; pos <= 40; pos += 5) {
                for (size_t mi = 0; mi < ARRAY_SIZE(mscales); mi++) {
                    int nh = 8, hd = hds[t], n = nh * hd;
                    float v[512], vref[512], vplain[512], mscale = mscales[mi];
                    fill_normal(v, (size_t)n, 1.0f);
                    memcpy(vref, v, (size_t)n * sizeof(float));
                    memcpy(vplain, v, (size_t)n * sizeof(float));
                    float freqs[32];
                    assert_true(kn_rope_freqs(freqs, hd, 10000.0f, NULL) == 1.0f);
                    kn_rope_ref(vref, nh, hd, pos, freqs, mscale, neox);
                    ops->rope(v, nh, hd, pos, freqs, mscale, neox);
                    double e = rel_err_vec(v, vref, n);
                    if (!(e <= TOL_SMALL)) {
                        print_error("%s rope neox=%d hd=%d pos=%d mscale=%g: error %.3g\n",
                                    ops->name, neox, hd, pos, mscale, e);
                        fail();
                    }
                    kn_rope_ref(vplain, nh, hd, pos, freqs, 1.0f, neox);
                    for (int i = 0; i < n; i++)
                        vplain[i] *= mscale;
                    assert_true(rel_err_vec(vref, vplain, n) <= TOL_SMALL);
                }
            }
        }
    }
}

static void test_softmax_silu(void **state)
{
    const struct kn_ops *ops = table_or_skip(state);
    static const int ns[] = {1, 7, 16, 33, 300};
    rng_seed(6);
    for (size_t t = 0; t < ARRAY_SIZE(ns); t++) {
        int n = ns[t];
        float a[300], b[300], aref[300];
        fill_normal(a, (size_t)n, 4.0f);
        memcpy(aref, a, (size_t)n * sizeof(float));
        kn_softmax_ref(aref, n);
        ops->softmax(a, n);
        double sum = 0.0;
        for (int i = 0; i < n; i++)
            sum += a[i];
        assert_true(fabs(sum - 1.0) < 1e-5);
        assert_true(rel_err_vec(a, aref, n) <= TOL_SMALL);

        /* the gated activations, gpt-oss's clamped SwiGLU with gate and up well past its
         * clamps (|x| > 7) */
        const struct {
            void (*ref)(float *, const float *, int), (*op)(float *, const float *, int);
            float std_a, std_b;
        } acts[] = {{kn_silu_mul_ref, ops->silu_mul, 4.0f, 1.0f},
                    {kn_gelu_mul_ref, ops->gelu_mul, 4.0f, 1.0f},
                    {kn_swiglu_oai_mul_ref, ops->swiglu_oai_mul, 6.0f, 6.0f}};
        for (size_t k = 0; k < ARRAY_SIZE(acts); k++) {
            fill_normal(a, (size_t)n, acts[k].std_a);
            fill_normal(b, (size_t)n, acts[k].std_b);
            memcpy(aref, a, (size_t)n * sizeof(float));
            acts[k].ref(aref, b, n);
            acts[k].op(a, b, n);
            assert_true(rel_err_vec(a, aref, n) <= TOL_SMALL);
        }
    }
}

/* The final logits' soft-cap against cap * tanh(x / cap) in double (the reference) and the
 * reference (each table), on ragged lengths, with logits well past the cap (where it bites) and
 * near 0 (where tanh(x) ~ x). */
static void test_softcap(void **state)
{
    const struct kn_ops *ops = table_or_skip(state);
    static const int ns[] = {1, 7, 16, 33, 1000};
    static const float caps[] = {30.0f, 5.0f};
    float x[1000], xref[1000], orig[1000];
    rng_seed(13);
    for (size_t t = 0; t < ARRAY_SIZE(ns); t++)
        for (size_t ci = 0; ci < ARRAY_SIZE(caps); ci++) {
            int n = ns[t];
            float cap = caps[ci];
            fill_normal(orig, (size_t)n, 20.0f);
            if (n == 1000) /* a sweep of -3 cap .. 3 cap, across the vector tanh's two ranges */
                for (int i = 0; i < n; i++)
                    orig[i] = (float)(i - 500) * cap * 0.006f;
            orig[0] = 1e-3f;
            memcpy(x, orig, (size_t)n * sizeof(float));
            memcpy(xref, orig, (size_t)n * sizeof(float));
            kn_softcap_ref(xref, n, cap);
            ops->softcap(x, n, cap);
            for (int i = 0; i < n; i++) {
                double want = cap * tanh((double)orig[i] / cap);
                /* tanh within 1e-6 of 1 (the vector one's bound: 6e-7 relative) */
                assert_true(fabs(xref[i] - want) <= 1e-6 * cap);
                if (!(fabs(x[i] - want) <= 1e-6 * cap)) {
                    print_error("%s softcap(%.9g) = %.9g, want %.9g (cap %g)\n", ops->name, orig[i],
                                x[i], want, cap);
                    fail();
                }
                assert_true(fabsf(x[i]) <= cap);
            }
            double e = rel_err_vec(x, xref, n);
            if (!(e <= TOL_SMALL)) {
                print_error("%s softcap n=%d cap=%g: error %.3g\n", ops->name, n, cap, e);
                fail();
            }
        }
}

/* Values checked by hand: GELU-tanh, and the llama3 RoPE rescaling (Llama 3.1: theta 500000,
 * factor 8, low 1, high 4 over 8192 positions): short wavelengths keep their frequency, long ones
 * are divided by the factor, the band between is blended. */
static void test_gelu_and_rope_freqs(void **state)
{
    float a[3] = {1.0f, -1.0f, 0.0f}, b[3] = {1.0f, 2.0f, 5.0f};
    kn_gelu_mul_ref(a, b, 3);
    assert_true(fabsf(a[0] - 0.841192f) < 1e-5f);
    assert_true(fabsf(a[1] - 2.0f * -0.158808f) < 1e-5f);
    assert_true(a[2] == 0.0f);
    /* gpt-oss's clamped SwiGLU: gate above 7 clamped, up clamped to [-7, 7] (values by hand:
     * g sigmoid(1.702 g) (u + 1)); every table takes the reference */
    float g[5] = {1.0f, -2.0f, 9.0f, 0.5f, 7.0f}, u[5] = {0.5f, 1.0f, 2.0f, -9.0f, 8.0f};
    kn_swiglu_oai_mul_ref(g, u, 5);
    assert_true(fabsf(g[0] - 1.5f * 0.845796f) < 1e-5f);
    assert_true(fabsf(g[1] - 2.0f * -2.0f * 0.032171f) < 1e-5f);
    assert_true(fabsf(g[2] - 3.0f * 7.0f * 0.999993f) < 1e-4f);
    assert_true(fabsf(g[3] - -6.0f * 0.5f * 0.700777f) < 1e-5f);
    assert_true(g[2] == g[4] * 3.0f / 8.0f);
    assert_true(kn_ops_ref.swiglu_oai_mul && kn_ops_avx2.swiglu_oai_mul &&
                kn_ops_avx512.swiglu_oai_mul && kn_ops_amx.swiglu_oai_mul);
    float f[64], plain[64];
    struct kn_rope_scale l3 = {
        .type = KN_ROPE_LLAMA3, .factor = 8.0f, .low = 1.0f, .high = 4.0f, .orig_ctx = 8192};
    assert_true(kn_rope_freqs(plain, 128, 500000.0f, NULL) == 1.0f);
    assert_true(kn_rope_freqs(f, 128, 500000.0f, &l3) == 1.0f);
    assert_true(f[0] == 1.0f && plain[0] == 1.0f);
    int kept = 0, divided = 0, blended = 0;
    for (int i = 0; i < 64; i++) {
        float wl = 2.0f * 3.14159265f / plain[i];
        if (wl < 8192.0f / 4.0f) {
            assert_true(f[i] == plain[i]);
            kept++;
        } else if (wl > 8192.0f) {
            assert_true(fabsf(f[i] - plain[i] / 8.0f) <= 1e-6f * plain[i]);
            divided++;
        } else {
            assert_true(f[i] < plain[i] && f[i] > plain[i] / 8.0f);
            blended++;
        }
    }
    assert_true(kept > 0 && divided > 0 && blended > 0);
    /* llama2.c's expression, exactly; all-zero options are plain */
    kn_rope_freqs(f, 8, 10000.0f, &(struct kn_rope_scale){0});
    assert_true(f[1] == 1.0f / powf(10000.0f, 2.0f / 8.0f));
}

/* @f (the @nf frequencies of head 2 nf at base 1e6, YaRN factor 4) against the formula in double
 * with the ramp from pair @lo to @hi */
static void yarn_check(const float *f, int nf, double lo, double hi)
{
    for (int i = 0; i < nf; i++) {
        double base = pow(1e6, -1.0 * i / nf),
               ext = 1.0 - fmin(1.0, fmax(0.0, (i - lo) / (hi - lo)));
        double want = base / 4.0 * (1.0 - ext) + base * ext;
        if (!(fabs(f[i] - want) <= 2e-6 * want)) {
            print_error("yarn inv_freq[%d] = %.9g, want %.9g (ramp %g..%g)\n", i, f[i], want, lo,
                        hi);
            fail();
        }
    }
}

/* YaRN, per-frequency factors and LongRoPE's attention factor against the formulas written out
 * in double (the YaRN paper's, as Hugging Face's _compute_yarn_parameters and ggml's rope_yarn
 * apply them), and on hand-computed values: Qwen2.5's config (theta 1e6, head_dim 128, factor 4
 * over 32768 positions, beta 32 and 1) ramps from pair floor(23.60) = 23 to ceil(39.65) = 40;
 * Phi-3.5's LongRoPE (131072 over 4096 positions: factor 32) has attention factor
 * sqrt(1 + ln 32 / ln 4096) = sqrt(17 / 12). */
static void test_rope_scaling(void **state)
{
    (void)state;
    enum { HD = 128, NF = HD / 2 };
    float f[NF], plain[NF], ff[NF];
    kn_rope_freqs(plain, HD, 1e6f, NULL);
    struct kn_rope_scale y = {.type = KN_ROPE_YARN, .factor = 4.0f, .orig_ctx = 32768};
    float ms = kn_rope_freqs(f, HD, 1e6f, &y);
    assert_float_equal(ms, 1.0 + 0.1 * log(4.0), 1e-6);
    double lo = floor(HD * log(32768 / (32 * 2 * M_PI)) / (2 * log(1e6)));
    double hi = ceil(HD * log(32768 / (1 * 2 * M_PI)) / (2 * log(1e6)));
    assert_true(lo == 23.0 && hi == 40.0);
    yarn_check(f, NF, lo, hi);
    assert_true(f[23] == plain[23] && fabsf(f[40] - plain[40] / 4.0f) <= 1e-6f * plain[40]);
    assert_true(fabsf(f[31] / plain[31] - 0.6470588f) < 1e-5f); /* 0.25 * 8/17 + 9/17 */
    /* beta given explicitly, and an attention factor multiplying YaRN's own */
    y.beta_fast = 32.0f;
    y.beta_slow = 1.0f;
    y.attn_factor = 0.5f;
    float f2[NF];
    assert_float_equal(kn_rope_freqs(f2, HD, 1e6f, &y), 0.5 * (1.0 + 0.1 * log(4.0)), 1e-6);
    assert_memory_equal(f, f2, sizeof(f));
    /* exact (transformers' truncate false, gpt-oss): the ramp from 23.60 to 39.65 unrounded */
    y.exact = true;
    kn_rope_freqs(f2, HD, 1e6f, &y);
    double xlo = HD * log(32768 / (32 * 2 * M_PI)) / (2 * log(1e6)),
           xhi = HD * log(32768 / (1 * 2 * M_PI)) / (2 * log(1e6));
    yarn_check(f2, NF, xlo, xhi);
    assert_true(f2[23] == plain[23] && f2[24] != f[24]); /* 23 < 23.60: kept; 24 ramps less */

    /* LongRoPE: each frequency divided by its factor (and nothing else), the magnitude given */
    for (int i = 0; i < NF; i++)
        ff[i] = 1.0f + 0.37f * (float)i;
    float att = kn_rope_longrope_attn(131072.0f / 4096.0f, 4096);
    assert_float_equal(att, sqrt(17.0 / 12.0), 1e-6);
    assert_true(kn_rope_longrope_attn(1.0f, 4096) == 1.0f);
    struct kn_rope_scale lr = {.freq_factors = ff, .attn_factor = att};
    assert_true(kn_rope_freqs(f, HD, 10000.0f, &lr) == att);
    kn_rope_freqs(plain, HD, 10000.0f, NULL);
    for (int i = 0; i < NF; i++)
        assert_true(f[i] == plain[i] / ff[i]);
    /* ik_llama.cpp's numbers: (cos, sin) times the magnitude of pair i, from its ggml_rope_ext
     * on pairs (1, 0) at position 100 (head 128, NORM mode), run once against its libggml: YaRN
     * with freq_scale 1/4, ext_factor 1, beta 32 and 1 over 32768; LongRoPE with the factors
     * above as its rope_freqs tensor and attn_factor sqrt(17/12). */
    static const struct {
        int i;
        float c, s;
    } ik_yarn[] = {{0, 9.81861651e-01f, -5.76562822e-01f}, {10, 5.97320974e-01f, -9.69373345e-01f},
                   {23, 8.72461617e-01f, 7.31633604e-01f}, {31, 1.13496077e+00f, 9.13290232e-02f},
                   {40, 1.13861811e+00f, 5.06197941e-03f}, {63, 1.13862944e+00f, 3.53241267e-05f}},
      ik_longrope[] = {
          {0, 1.02636468e+00f, -6.02695644e-01f}, {10, 3.89164597e-01f, -1.12481880e+00f},
          {23, 1.10356164e+00f, 4.45890278e-01f}, {31, 1.18513811e+00f, 1.10064417e-01f},
          {40, 1.18999958e+00f, 2.38203648e-02f}, {63, 1.19023788e+00f, 5.65392314e-04f}};
    float v[HD];
    for (int pass = 0; pass < 2; pass++) {
        float ms =
            pass ? kn_rope_freqs(f, HD, 10000.0f, &lr)
                 : kn_rope_freqs(f, HD, 1e6f,
                                 &(struct kn_rope_scale){
                                     .type = KN_ROPE_YARN, .factor = 4.0f, .orig_ctx = 32768});
        for (int i = 0; i < HD; i++)
            v[i] = i % 2 ? 0.0f : 1.0f;
        kn_rope_ref(v, 1, HD, 100, f, ms, false);
        for (int k = 0; k < 6; k++) {
            int i = pass ? ik_longrope[k].i : ik_yarn[k].i;
            float c = pass ? ik_longrope[k].c : ik_yarn[k].c,
                  sn = pass ? ik_longrope[k].s : ik_yarn[k].s;
            if (!(fabsf(v[2 * i] - c) <= 2e-5f && fabsf(v[2 * i + 1] - sn) <= 2e-5f)) {
                print_error("%s pair %d: (%.8g, %.8g), ik (%.8g, %.8g)\n",
                            pass ? "longrope" : "yarn", i, v[2 * i], v[2 * i + 1], c, sn);
                fail();
            }
        }
    }
    /* factors of 1 change nothing, bit for bit */
    for (int i = 0; i < NF; i++)
        ff[i] = 1.0f;
    kn_rope_freqs(f, HD, 10000.0f, &lr);
    assert_memory_equal(f, plain, sizeof(f));
}

/* The cache of the attention tests: MAXB blocks of KN_KV_BLOCK rows, two KV heads per row and a
 * gap (the second head is the one read), stored in the block order of a permuted table. */
enum { ATT_MAXT = 40 + 16, ATT_HMAX = 128, ATT_QS = 16 * ATT_HMAX + 8 };
enum { ATT_MAXB = (ATT_MAXT + KN_KV_BLOCK - 1) / KN_KV_BLOCK + 1, ATT_KVS = 2 * ATT_HMAX + 4 };
_Static_assert(ATT_MAXB % 3 != 0, "perm below is a permutation");

/* One attention call of @ops over @kv against the reference's: each token's outputs within
 * TOL_SMALL of max |out|, nothing written past its heads, and alone in its call (decode's case)
 * the same bits as in its tile (batched steps and prefill chunks may group a sequence's tokens
 * differently). @out, @oref and @one hold 16 rows of ATT_QS floats. Returns the worst error. */
static double att_check(const struct kn_ops *ops, const struct kn_kv *kv, const float *q, int hd,
                        int nt, int nh, int pos0, const struct kn_att *opt, float *out, float *oref,
                        float *one, float *scratch)
{
    char what[128];
    snprintf(what, sizeof(what), "hd=%d nt=%d nh=%d pos0=%d scale=%g cap=%g window=%d sink0=%g", hd,
             nt, nh, pos0, opt ? opt->scale : 0.0, opt ? opt->softcap : 0.0, opt ? opt->window : 0,
             opt && opt->sinks ? opt->sinks[0] : NAN);
    for (size_t i = 0; i < 16 * ATT_QS; i++)
        out[i] = oref[i] = SENTINEL;
    kn_attention_ref(oref, ATT_QS, q, ATT_QS, nt, nh, pos0, kv, hd, scratch, opt);
    ops->attention(out, ATT_QS, q, ATT_QS, nt, nh, pos0, kv, hd, scratch, opt);
    double worst = 0.0;
    for (int i = 0; i < nt; i++) {
        double e = rel_err_vec(out + (size_t)i * ATT_QS, oref + (size_t)i * ATT_QS, nh * hd);
        worst = fmax(worst, e);
        if (!(e <= TOL_SMALL)) {
            print_error("%s attention %s token %d: error %.3g\n", ops->name, what, i, e);
            fail();
        }
        assert_true(out[(size_t)i * ATT_QS + (size_t)(nh * hd)] == SENTINEL);
        ops->attention(one, ATT_QS, q + (size_t)i * ATT_QS, ATT_QS, 1, nh, pos0 + i, kv, hd,
                       scratch, opt);
        if (memcmp(one, out + (size_t)i * ATT_QS, (size_t)(nh * hd) * sizeof(float))) {
            print_error("%s attention %s token %d: alone it differs from its tile\n", ops->name,
                        what, i);
            fail();
        }
    }
    return worst;
}

/* The attention tests' paged cache (position t in physical block perm[t / KN_KV_BLOCK]) and its
 * linear copy (block t / KN_KV_BLOCK), with fresh keys, values and queries: rows from @T on hold
 * NaN, and so do the physical blocks wholly before position @first (a window's start: a kernel
 * that reads them, or the rows past the last, returns NaN). */
struct att_cache {
    float *kc, *vc, *kl, *vl, *q, *out, *oref, *one;
    uint32_t perm[ATT_MAXB], ident[ATT_MAXB];
    struct kn_kv paged, linear;
};

static void att_cache_init(struct att_cache *c)
{
    size_t cells = ATT_MAXB * (size_t)KN_KV_BLOCK * ATT_KVS;
    c->kc = xmalloc(cells * sizeof(float));
    c->vc = xmalloc(cells * sizeof(float));
    c->kl = xmalloc(cells * sizeof(float));
    c->vl = xmalloc(cells * sizeof(float));
    c->q = xmalloc(16 * ATT_QS * sizeof(float));
    c->out = xmalloc(16 * ATT_QS * sizeof(float));
    c->oref = xmalloc(16 * ATT_QS * sizeof(float));
    c->one = xmalloc(16 * ATT_QS * sizeof(float));
    for (uint32_t b = 0; b < ATT_MAXB; b++) {
        c->ident[b] = b;
        c->perm[b] = (b * 3 + 1) % ATT_MAXB; /* ATT_MAXB is not a multiple of 3: a permutation */
    }
    size_t bstride = (size_t)KN_KV_BLOCK * ATT_KVS;
    c->paged = (struct kn_kv){c->kc + ATT_HMAX, c->vc + ATT_HMAX, c->perm, bstride, ATT_KVS};
    c->linear = (struct kn_kv){c->kl + ATT_HMAX, c->vl + ATT_HMAX, c->ident, bstride, ATT_KVS};
}

static void att_cache_fill(struct att_cache *c, int T, int first)
{
    size_t kvs = ATT_KVS, bstride = (size_t)KN_KV_BLOCK * kvs, cells = ATT_MAXB * bstride;
    fill_normal(c->kl, cells, 1.0f);
    fill_normal(c->vl, cells, 1.0f);
    for (size_t r = (size_t)T; r < ATT_MAXB * KN_KV_BLOCK; r++) /* past the last */
        for (size_t k = 0; k < kvs; k++)
            c->kl[r * kvs + k] = c->vl[r * kvs + k] = NAN;
    for (uint32_t b = 0; b < ATT_MAXB; b++) {
        memcpy(c->kc + c->perm[b] * bstride, c->kl + b * bstride, bstride * sizeof(float));
        memcpy(c->vc + c->perm[b] * bstride, c->vl + b * bstride, bstride * sizeof(float));
        if ((int)(b + 1) * KN_KV_BLOCK <= first)
            for (size_t i = 0; i < bstride; i++)
                c->kc[c->perm[b] * bstride + i] = c->vc[c->perm[b] * bstride + i] = NAN;
    }
    fill_normal(c->q, 16 * ATT_QS, 1.5f);
}

static void att_cache_free(struct att_cache *c)
{
    free(c->kc);
    free(c->vc);
    free(c->kl);
    free(c->vl);
    free(c->q);
    free(c->out);
    free(c->oref);
    free(c->one);
}

/* Each table's attention against the reference: decode, prefill tiles and GQA tiles over a
 * paged cache, with no options (then also: the reference reads through the block table, and
 * all-zero options are none, bit for bit) and with options: windows shorter than the context,
 * crossing cache blocks and SIMD key blocks, and longer than it (then the same bits as none);
 * soft-capping that bites; a custom scale. Blocks wholly before the earliest query's window
 * hold NaN: a table that read them would fail. */
static void test_attention(void **state)
{
    const struct kn_ops *ops = table_or_skip(state);
    static const int hds[] = {8, 64, 100, 128};
    static const int tiles[][2] = {{1, 1}, {1, 4}, {1, 8}, {4, 4}, {16, 1}, {3, 5}, {8, 2}, {2, 8}};
    static const int pos0s[] = {0, 5, 15, 16, 31, 40};
    static const int windows[] = {0, 1, 7, 16, 17, 30, 100};
    static const float caps[] = {0.0f, 2.5f}, scales[] = {0.0f, 0.3f};
    struct att_cache c;
    float scratch[ATT_MAXT];
    att_cache_init(&c);
    double worst = 0.0, worst_opt = 0.0;
    rng_seed(7);
    for (size_t hi = 0; hi < ARRAY_SIZE(hds); hi++)
        for (size_t ti = 0; ti < ARRAY_SIZE(tiles); ti++)
            for (size_t pi = 0; pi < ARRAY_SIZE(pos0s); pi++)
                for (size_t wi = 0; wi < ARRAY_SIZE(windows); wi++) {
                    int hd = hds[hi], nt = tiles[ti][0], nh = tiles[ti][1], pos0 = pos0s[pi];
                    int w = windows[wi], first = w && pos0 >= w ? pos0 - w + 1 : 0;
                    size_t n = (size_t)(nh * hd) * sizeof(float); /* a token's outputs */
                    att_cache_fill(&c, pos0 + nt, first);
                    for (size_t ci = 0; ci < ARRAY_SIZE(caps); ci++)
                        for (size_t si = 0; si < ARRAY_SIZE(scales); si++) {
                            struct kn_att o = {
                                .scale = scales[si], .softcap = caps[ci], .window = w};
                            bool none = !w && !caps[ci] && !scales[si];
                            double e = att_check(ops, &c.paged, c.q, hd, nt, nh, pos0,
                                                 none ? NULL : &o, c.out, c.oref, c.one, scratch);
                            if (none)
                                worst = fmax(worst, e);
                            else
                                worst_opt = fmax(worst_opt, e);
                        }
                    if (!w) {
                        /* the reference reads through the table: the same sums, same order */
                        kn_attention_ref(c.one, ATT_QS, c.q, ATT_QS, nt, nh, pos0, &c.linear, hd,
                                         scratch, NULL);
                        kn_attention_ref(c.out, ATT_QS, c.q, ATT_QS, nt, nh, pos0, &c.paged, hd,
                                         scratch, NULL);
                        for (int i = 0; i < nt; i++)
                            assert_memory_equal(c.out + i * ATT_QS, c.one + i * ATT_QS, n);
                    }
                    if (w && w < pos0 + nt)
                        continue;
                    /* all-zero options, and a window longer than the context, are none */
                    ops->attention(c.out, ATT_QS, c.q, ATT_QS, nt, nh, pos0, &c.paged, hd, scratch,
                                   &(struct kn_att){.window = w});
                    ops->attention(c.one, ATT_QS, c.q, ATT_QS, nt, nh, pos0, &c.paged, hd, scratch,
                                   NULL);
                    for (int i = 0; i < nt; i++)
                        assert_memory_equal(c.out + i * ATT_QS, c.one + i * ATT_QS, n);
                }
    /* position 0 attends to one key: the output is its value row */
    struct kn_kv first = {c.kc, c.vc, c.perm, c.paged.block_stride, ATT_KVS};
    ops->attention(c.out, ATT_QS, c.q, ATT_QS, 1, 4, 0, &first, 64, scratch, NULL);
    for (int j = 0; j < 4; j++)
        for (int d = 0; d < 64; d++)
            assert_float_equal(c.out[j * 64 + d],
                               c.vc[c.perm[0] * c.paged.block_stride + (size_t)d], 1e-6);
    print_message("[          ] %s attention: worst error %.2g, with options %.2g (tolerance "
                  "%.1g)\n",
                  ops->name, worst, worst_opt, TOL_SMALL);
    att_cache_free(&c);
}

/* Each table's attention sinks against the reference (att_check: decode and tiles, alone the
 * same bits as in its tile), with and without window and soft-cap: per-head sinks around the
 * scores (lane l of a tile is head l % nh), one far above every score (the outputs go to 0) and
 * one far below (the outputs are those without a sink, within TOL_SMALL). */
static void test_attention_sinks(void **state)
{
    const struct kn_ops *ops = table_or_skip(state);
    static const int hds[] = {8, 64, 100};
    static const int tiles[][2] = {{1, 1}, {1, 4}, {1, 8}, {4, 4}, {16, 1}, {3, 5}, {2, 8}};
    static const int pos0s[] = {0, 15, 31, 40};
    static const int windows[] = {0, 7, 17};
    static const float caps[] = {0.0f, 2.5f}, scales[] = {0.0f, 0.3f};
    enum { MIXED, HIGH, LOW, NSINKS };
    float sinks[NSINKS][KN_ATT_TILE];
    for (int j = 0; j < KN_ATT_TILE; j++) {
        sinks[MIXED][j] = -2.0f + 0.9f * (float)j; /* from below the scores to above them */
        sinks[HIGH][j] = 40.0f; /* scores here stay within +-25: under e^-15 of the outputs left */
        sinks[LOW][j] = -40.0f; /* under e^-15 of the denominator */
    }
    struct att_cache c;
    float scratch[ATT_MAXT];
    att_cache_init(&c);
    double worst = 0.0;
    rng_seed(9);
    for (size_t hi = 0; hi < ARRAY_SIZE(hds); hi++)
        for (size_t ti = 0; ti < ARRAY_SIZE(tiles); ti++)
            for (size_t pi = 0; pi < ARRAY_SIZE(pos0s); pi++)
                for (size_t wi = 0; wi < ARRAY_SIZE(windows); wi++) {
                    int hd = hds[hi], nt = tiles[ti][0], nh = tiles[ti][1], pos0 = pos0s[pi];
                    int w = windows[wi], first = w && pos0 >= w ? pos0 - w + 1 : 0, n = nh * hd;
                    att_cache_fill(&c, pos0 + nt, first);
                    for (size_t ci = 0; ci < ARRAY_SIZE(caps); ci++)
                        for (size_t si = 0; si < ARRAY_SIZE(scales); si++)
                            for (int k = 0; k < NSINKS; k++) {
                                struct kn_att o = {.scale = scales[si],
                                                   .softcap = caps[ci],
                                                   .window = w,
                                                   .sinks = sinks[k]};
                                worst = fmax(worst, att_check(ops, &c.paged, c.q, hd, nt, nh, pos0,
                                                              &o, c.out, c.oref, c.one, scratch));
                                if (k == MIXED)
                                    continue;
                                if (k == HIGH) {
                                    for (int i = 0; i < nt; i++)
                                        for (int e = 0; e < n; e++)
                                            assert_true(fabsf(c.out[i * ATT_QS + e]) < 1e-4f);
                                    continue;
                                }
                                o.sinks = NULL;
                                ops->attention(c.oref, ATT_QS, c.q, ATT_QS, nt, nh, pos0, &c.paged,
                                               hd, scratch, &o);
                                for (int i = 0; i < nt; i++)
                                    assert_true(rel_err_vec(c.out + i * ATT_QS, c.oref + i * ATT_QS,
                                                            n) <= TOL_SMALL);
                            }
                }
    print_message("[          ] %s attention with sinks: worst error %.2g (tolerance %.1g)\n",
                  ops->name, worst, TOL_SMALL);
    att_cache_free(&c);
}

/* The reference's options against the definition written out in double: softmax over the keys
 * t with pos - t < window of cap * tanh(scale * q.k / cap), with the head's sink (if any) as one
 * more term of its denominator, times the values. */
static void test_attention_ref_formula(void **state)
{
    (void)state;
    static const float sk_mid[] = {0.7f, -1.3f}, sk_far[] = {30.0f, -30.0f};
    static const struct kn_att opts[] = {
        {0},
        {.window = 5},
        {.softcap = 2.0f},
        {.scale = 0.5f, .softcap = 3.0f, .window = 20},
        {.sinks = sk_mid},
        {.sinks = sk_far},
        {.window = 5, .sinks = sk_mid},
        {.scale = 0.5f, .softcap = 3.0f, .window = 20, .sinks = sk_mid},
        {.softcap = 2.0f, .sinks = sk_far}};
    enum { HD = 32 };
    struct att_cache c;
    float scratch[ATT_MAXT];
    att_cache_init(&c);
    rng_seed(12);
    att_cache_fill(&c, 40, 0);
    for (size_t oi = 0; oi < ARRAY_SIZE(opts); oi++) {
        const struct kn_att *o = &opts[oi];
        int pos = 39, nh = 2;
        kn_attention_ref(c.out, ATT_QS, c.q, ATT_QS, 1, nh, pos, &c.linear, HD, scratch, o);
        for (int j = 0; j < nh; j++) {
            const float *qh = c.q + j * HD;
            double sc[40], mx = -1e300, sum = 0.0, want[HD] = {0};
            int t0 = o->window ? pos - o->window + 1 : 0;
            for (int t = t0; t <= pos; t++) {
                const float *kt = c.linear.k + kn_kv_off(&c.linear, t);
                double d = 0.0;
                for (int e = 0; e < HD; e++)
                    d += (double)qh[e] * kt[e];
                d *= o->scale ? o->scale : 1.0 / sqrt(HD);
                sc[t] = o->softcap ? o->softcap * tanh(d / o->softcap) : d;
                mx = fmax(mx, sc[t]);
            }
            if (o->sinks)
                mx = fmax(mx, o->sinks[j]);
            for (int t = t0; t <= pos; t++)
                sum += (sc[t] = exp(sc[t] - mx));
            if (o->sinks)
                sum += exp(o->sinks[j] - mx);
            double amax = 0.0, emax = 0.0;
            for (int t = t0; t <= pos; t++)
                for (int e = 0; e < HD; e++)
                    want[e] += sc[t] / sum * c.linear.v[kn_kv_off(&c.linear, t) + (size_t)e];
            for (int e = 0; e < HD; e++) {
                amax = fmax(amax, fabs(want[e]));
                emax = fmax(emax, fabs(want[e] - c.out[j * HD + e]));
            }
            if (!(emax <= TOL_SMALL * amax)) {
                print_error("ref attention option %zu head %d: error %.3g\n", oi, j, emax / amax);
                fail();
            }
        }
    }
    att_cache_free(&c);
}

/* ---- quantizers and conversions (table-independent) ---- */

struct qstats {
    double rms_worst, max_worst, sq_sum;
    size_t n;
};

/* Dequantizes @m and accumulates the error against @w per group, over its range. */
static void quant_error(const struct kn_mat *m, const float *w, struct qstats *st)
{
    float *row = xmalloc((size_t)m->cols * sizeof(float));
    for (int r = 0; r < m->rows; r++) {
        kn_mat_row(m, r, row);
        const float *src = w + (size_t)r * (size_t)m->cols;
        for (int k0 = 0; k0 < m->cols; k0 += m->group) {
            int k1 = k0 + m->group < m->cols ? k0 + m->group : m->cols;
            float mn = src[k0], mx = src[k0];
            double sq = 0.0, emax = 0.0;
            for (int k = k0; k < k1; k++) {
                mn = fminf(mn, src[k]);
                mx = fmaxf(mx, src[k]);
                double e = (double)row[k] - src[k];
                sq += e * e;
                emax = fmax(emax, fabs(e));
            }
            double range = (double)mx - mn;
            st->rms_worst = fmax(st->rms_worst, sqrt(sq / (k1 - k0)) / range);
            st->max_worst = fmax(st->max_worst, emax / range);
            st->sq_sum += sq;
            st->n += (size_t)(k1 - k0);
        }
    }
    free(row);
}

/* (a) random normal weights dequantize within bounds of each group's range, and the asymmetric
 * scheme is more accurate than the symmetric one. */
static void test_quant_error(void **state)
{
    (void)state;
    static const int groups[] = {32, 64, 128};
    enum { R = 32, C = 300 };
    float *w = xmalloc((size_t)R * C * sizeof(float));
    rng_seed(8);
    fill_normal(w, (size_t)R * C, 0.02f);
    for (size_t gi = 0; gi < ARRAY_SIZE(groups); gi++) {
        int g = groups[gi];
        struct qstats st[2];
        memset(st, 0, sizeof(st));
        for (int s = 0; s < 2; s++) {
            enum kn_dtype dt = s ? KN_DT_W4A8 : KN_DT_W4A16;
            void *buf = xmalloc(kn_mat_bytes(dt, R, C, g));
            struct kn_mat m;
            quantize(dt, w, R, C, g, buf);
            kn_mat_view(&m, dt, R, C, g, buf);
            quant_error(&m, w, &st[s]);
            free(buf);
        }
        double mse16 = st[0].sq_sum / (double)st[0].n, mse8 = st[1].sq_sum / (double)st[1].n;
        print_message("[          ] group %3d: rms/range w4a16 %.4f w4a8 %.4f, max/range %.3f %.3f,"
                      " mse w4a16/w4a8 %.3f\n",
                      g, st[0].rms_worst, st[1].rms_worst, st[0].max_worst, st[1].max_worst,
                      mse16 / mse8);
        assert_true(st[0].rms_worst <= QERR_W4A16_RMS);
        assert_true(st[1].rms_worst <= QERR_W4A8_RMS);
        assert_true(st[0].max_worst <= QERR_MAX);
        assert_true(st[1].max_worst <= QERR_MAX);
        assert_true(mse16 < mse8);
    }
    free(w);
}

/* (b) the short last group of a row (cols 172, group 128: 44 elements) has its own scale: make
 * those 100x larger than the rest and both parts must still dequantize accurately. */
static void test_quant_short_group(void **state)
{
    (void)state;
    enum { R = 3, C = 172, G = 128 };
    float w[R * C], row[C];
    rng_seed(9);
    for (int r = 0; r < R; r++)
        for (int k = 0; k < C; k++)
            w[r * C + k] = rng_normal() * (k < G ? 0.01f : 1.0f);
    for (int s = 0; s < 2; s++) {
        enum kn_dtype dt = s ? KN_DT_W4A8 : KN_DT_W4A16;
        _Alignas(64) uint8_t buf[R * C * 2];
        assert_true(kn_mat_bytes(dt, R, C, G) <= sizeof(buf));
        struct kn_mat m;
        quantize(dt, w, R, C, G, buf);
        kn_mat_view(&m, dt, R, C, G, buf);
        for (int r = 0; r < R; r++) {
            kn_mat_row(&m, r, row);
            for (int part = 0; part < 2; part++) {
                int k0 = part ? G : 0, k1 = part ? C : G;
                float mn = INFINITY, mx = -INFINITY;
                double emax = 0.0;
                for (int k = k0; k < k1; k++) {
                    mn = fminf(mn, w[r * C + k]);
                    mx = fmaxf(mx, w[r * C + k]);
                    emax = fmax(emax, fabs((double)row[k] - w[r * C + k]));
                }
                if (!(emax <= QERR_MAX * (mx - mn))) {
                    print_error("%s row %d part %d: max error %.4g of range %.4g\n", dt_name[dt], r,
                                part, emax, (double)(mx - mn));
                    fail();
                }
            }
            const uint16_t *sc = (const uint16_t *)m.scales + r * 2;
            double ratio = fabs(kn_f16_to_f32(sc[1]) / kn_f16_to_f32(sc[0])); /* either sign */
            assert_true(ratio > 30.0 && ratio < 300.0);
        }
    }
}

/* (c) fp16: every finite half round-trips exactly; rounding is to nearest even, checked at every
 * midpoint between neighbouring halves and on hand-picked values; bf16 on a few values. */
static void test_f16(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00u) == 0x7c00u)
            continue; /* inf, nan */
        uint16_t back = kn_f32_to_f16(kn_f16_to_f32((uint16_t)h));
        if (back != h) {
            print_error("f16 0x%04x -> %.9g -> 0x%04x\n", h, kn_f16_to_f32((uint16_t)h), back);
            fail();
        }
    }
    /* midpoints: (lo + hi) / 2 needs 12 significant bits, so it is exact in f32 */
    for (uint32_t h = 0; h < 0x7c00u; h++) {
        for (uint32_t sign = 0; sign <= 0x8000u; sign += 0x8000u) {
            float lo = kn_f16_to_f32((uint16_t)h);
            float hi = h + 1 == 0x7c00u ? 65536.0f : kn_f16_to_f32((uint16_t)(h + 1));
            float mid = (lo + hi) / 2;
            float s = sign ? -1.0f : 1.0f;
            uint16_t even = (uint16_t)(sign | (h % 2 ? h + 1 : h));
            assert_int_equal(kn_f32_to_f16(s * mid), even);
            assert_int_equal(kn_f32_to_f16(s * nextafterf(mid, INFINITY)), sign | (h + 1));
            assert_int_equal(kn_f32_to_f16(s * nextafterf(mid, 0.0f)), sign | h);
        }
    }
    static const struct {
        float f;
        uint16_t h;
    } cases[] = {
        {1.0f, 0x3c00},
        {1.0f + 0x1p-11f, 0x3c00},            /* tie, 0x3c00 even */
        {1.0f + 3 * 0x1p-11f, 0x3c02},        /* tie, 0x3c01 odd: up */
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01}, /* just above the tie */
        {2.0f - 0x1p-11f, 0x4000},            /* tie that carries into the exponent */
        {-1.5f, 0xbe00},
        {65504.0f, 0x7bff},
        {65519.0f, 0x7bff},
        {65520.0f, 0x7c00}, /* tie between 65504 and 2^16: even is inf */
        {1e10f, 0x7c00},
        {-1e10f, 0xfc00},
        {0x1p-24f, 0x0001},            /* smallest subnormal */
        {0x1p-25f, 0x0000},            /* tie with zero: even */
        {3 * 0x1p-25f, 0x0002},        /* tie between 1 and 2 units */
        {0x1p-14f - 0x1p-25f, 0x0400}, /* tie between the largest subnormal and 2^-14 */
        {1e-10f, 0x0000},
        {-0.0f, 0x8000},
        {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},
    };
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        uint16_t got = kn_f32_to_f16(cases[i].f);
        if (got != cases[i].h) {
            print_error("kn_f32_to_f16(%a) = 0x%04x, want 0x%04x\n", (double)cases[i].f, got,
                        cases[i].h);
            fail();
        }
    }
    uint16_t nan = kn_f32_to_f16(NAN);
    assert_true((nan & 0x7c00u) == 0x7c00u && (nan & 0x3ffu) != 0);
    assert_true(isnan(kn_f16_to_f32(nan)));
#ifdef __FLT16_MAX__
    /* the compiler's own conversion (round to nearest even) on random floats of every size */
    rng_seed(10);
    for (int i = 0; i < 1000000; i++) {
        union {
            uint32_t u;
            float f;
        } v = {.u = (uint32_t)rng_u64()};
        if (isnan(v.f))
            continue;
        _Float16 c = (_Float16)v.f;
        uint16_t want;
        memcpy(&want, &c, 2);
        if (kn_f32_to_f16(v.f) != want) {
            print_error("kn_f32_to_f16(%a) = 0x%04x, compiler 0x%04x\n", (double)v.f,
                        kn_f32_to_f16(v.f), want);
            fail();
        }
    }
#endif
    /* bf16: ties to even, carry, overflow */
    assert_int_equal(kn_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(kn_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);     /* tie, even */
    assert_int_equal(kn_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82); /* tie, odd: up */
    assert_int_equal(kn_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    assert_int_equal(kn_f32_to_bf16(-2.0f), 0xc000);
    assert_int_equal(kn_f32_to_bf16(3.4e38f), 0x7f80); /* rounds past the largest bf16 */
    assert_true(isnan(kn_bf16_to_f32(kn_f32_to_bf16(NAN))));
}

/* (d) the reference W4 kernels compute what the layout says: dequantize (kn_mat_row), then dot
 * with the activation W4A16 runs on (x), or with the int8 one W4A8 runs on (q * qscale). */
static void test_ref_w4_semantics(void **state)
{
    (void)state;
    static const struct {
        int n, k, group;
    } shapes[] = {{9, 172, 128}, {9, 255, 64}, {4, 300, 32}, {3, 33, 32}, {2, 512, 256}};
    double worst[3] = {0, 0, 0};
    rng_seed(11);
    for (int s = 0; s < 3; s++) {
        enum kn_dtype dt = s == 2 ? KN_DT_Q8 : s ? KN_DT_W4A8 : KN_DT_W4A16;
        for (size_t si = 0; si < ARRAY_SIZE(shapes); si++) {
            int N = shapes[si].n, K = shapes[si].k, group = shapes[si].group;
            struct wmat a;
            struct kn_act x;
            wmat_init(&a, dt, N, K, group);
            act_init(&x, K, group, 1.0f);
            float y[16], *row = xmalloc((size_t)K * sizeof(float));
            kn_gemv_ref(&a.m, &x, y, 0, N);
            for (int n = 0; n < N; n++) {
                kn_mat_row(&a.m, n, row);
                double dot = 0.0, mag = 0.0;
                for (int k = 0; k < K; k++) {
                    /* the activations each format multiplies: int8 for W4A8, int16 for Q8 (each
                     * within half a step of x) */
                    double xv = dt == KN_DT_W4A8 ? (double)((float)x.q[k] * x.qscale)
                                : dt == KN_DT_Q8 ? (double)((float)x.q16[k] * x.q16scale)
                                                 : x.x[k];
                    if (dt == KN_DT_Q8)
                        assert_true(fabs(xv - x.x[k]) <= 0.51 * x.q16scale); /* + roundings */
                    dot += row[k] * xv;
                    mag += fabs(row[k] * xv);
                }
                double rel = fabs(y[n] - dot) / fmax(mag, 1e-30);
                if (!(rel <= TOL_REF_DEQ)) {
                    print_error("ref %s N=%d K=%d g=%d row %d: %.9g vs dequantized %.9g\n",
                                dt_name[dt], N, K, group, n, y[n], dot);
                    fail();
                }
                worst[s] = fmax(worst[s], rel);
            }
            free(row);
            kn_act_free(&x);
            wmat_free(&a);
        }
    }
    print_message("[          ] ref vs dequantize-then-dot: worst error/sum|terms| w4a16 %.2g "
                  "w4a8 %.2g q8 %.2g (tolerance %.1g)\n",
                  worst[0], worst[1], worst[2], TOL_REF_DEQ);
}

/* The activation preparation of each ISA (its table's act_prepare entry). */
static void (*const act_prepare_of[])(struct kn_act *, const float *) = {
    [KN_ISA_REF] = kn_act_prepare_scalar,
    [KN_ISA_AVX2] = kn_act_prepare_avx2,
#ifdef SHARDLM_HAVE_AVX512
    [KN_ISA_AVX512] = kn_act_prepare_avx512,
    [KN_ISA_AMX] = kn_act_prepare_avx512,
#endif
};

/* Each table prepares activations with its own ISA's implementation (so a forced avx2 runs no
 * AVX-512 instruction there either), and that equals the scalar one bit for bit (group sums:
 * up to order), on ragged lengths and groups that fall back to the scalar one. */
static void test_act_prepare_table(void **state)
{
    const struct kn_ops *ops = table_or_skip(state);
    assert_non_null(act_prepare_of[ops->isa]);
    assert_ptr_equal(ops->act_prepare, act_prepare_of[ops->isa]);
    static const int kg[][2] = {{172, 64}, {100, 48}, {300, 128}, {255, 32}, {520, 256},
                                {1, 32},   {31, 16},  {64, 2},    {9, 8},    {44, 12}};
    rng_seed(13);
    for (size_t c = 0; c < ARRAY_SIZE(kg); c++) {
        int k = kg[c][0], group = kg[c][1];
        struct kn_act a, b;
        float *x = xmalloc((size_t)k * sizeof(float));
        fill_normal(x, (size_t)k, 3.0f);
        assert_int_equal(kn_act_alloc(&a, k, group), 0);
        assert_int_equal(kn_act_alloc(&b, k, group), 0);
        ops->act_prepare(&a, x);
        kn_act_prepare_scalar(&b, x);
        size_t kp = (size_t)a.kpad, ng = kp / (size_t)group;
        assert_memory_equal(a.x, b.x, kp * sizeof(float));
        assert_memory_equal(a.q, b.q, kp);
        assert_memory_equal(a.qe, b.qe, kp / 2);
        assert_memory_equal(a.qo, b.qo, kp / 2);
        assert_memory_equal(a.xe, b.xe, kp / 2 * sizeof(float));
        assert_memory_equal(a.xo, b.xo, kp / 2 * sizeof(float));
        assert_memory_equal(a.qgsum, b.qgsum, ng * sizeof(int32_t));
        assert_true(a.qscale == b.qscale);
        for (size_t g = 0; g < ng; g++)
            assert_true(fabsf(a.gsum[g] - b.gsum[g]) <= 1e-5f * (float)group * 3.0f);
        kn_act_free(&a);
        kn_act_free(&b);
        free(x);
    }
}

/* kn_ops_select: the table asked for (SHARDLM_ISA=avx2 gets the AVX2 activation preparation),
 * the fastest for none, ref and the reason for one this machine cannot run or no build has. It
 * reads no environment: SHARDLM_ISA is its callers'. */
static void test_ops_select(void **state)
{
    (void)state;
    const struct kn_ops *all[8];
    int n = kn_ops_available(all, 8);
    char err[256];
    assert_int_equal(setenv("SHARDLM_ISA", "ref", 1), 0); /* not for the kernels to read */
    assert_ptr_equal(kn_ops_select(NULL, err, sizeof(err)), all[n - 1]);
    assert_string_equal(err, "");
    assert_ptr_equal(kn_ops_select("", NULL, 0), all[n - 1]);
    unsetenv("SHARDLM_ISA");
    for (int i = 0; i < n; i++) {
        const struct kn_ops *o = kn_ops_select(all[i]->name, err, sizeof(err));
        assert_ptr_equal(o, all[i]);
        assert_string_equal(err, "");
        assert_ptr_equal(o->act_prepare, act_prepare_of[o->isa]);
    }
    if (slot[KN_ISA_AVX2].ops)
        assert_ptr_equal(kn_ops_select("avx2", err, sizeof(err))->act_prepare,
                         kn_act_prepare_avx2);
    assert_ptr_equal(kn_ops_select("sse9", err, sizeof(err)), &kn_ops_ref);
    assert_non_null(strstr(err, "unknown kernel table 'sse9'"));
    for (int isa = KN_ISA_AVX2; isa <= KN_ISA_AMX; isa++)
        if (!slot[isa].ops) {
            assert_ptr_equal(kn_ops_select(slot[isa].name, err, sizeof(err)), &kn_ops_ref);
            assert_non_null(strstr(err, "cannot run here"));
        }
}

/* ---- the type traits ---- */

/* Every format's traits: the names `inspect` prints (distinct), the block shapes, and the
 * sizes the layouts in kn.h document, restated here, on ragged shapes. */
static void test_type_traits(void **state)
{
    (void)state;
    static const char *const names[KN_DT_COUNT] = {"f32",  "bf16",  "q8",     "w4a16",
                                                   "w4a8", "w4a8t", "w4a16t", "q6"};
    static const int shapes[][3] = {{1, 32, 32}, {17, 172, 64}, {40, 301, 128}, {33, 100, 48}};
    for (int d = 0; d < KN_DT_COUNT; d++) {
        enum kn_dtype dt = (enum kn_dtype)d;
        const struct kn_type_traits *tt = &kn_type_traits[dt];
        assert_non_null(tt->name);
        assert_string_equal(tt->name, names[d]);
        for (int o = 0; o < d; o++)
            assert_string_not_equal(tt->name, kn_type_traits[o].name);
        assert_int_equal(tt->tile_rows ? KN_TILE_ROWS : 0, kn_is_tiled(dt) ? KN_TILE_ROWS : 0);
        assert_int_equal(tt->grouped, kn_is_w4(dt));
        assert_true(kn_is_tiled(dt) ? !tt->from_float : tt->from_float != NULL);
        assert_non_null(tt->to_float);
        const struct kn_type_traits *c = &kn_type_traits[tt->canon];
        assert_int_equal(c->canon, tt->canon); /* a file layout */
        assert_true(!c->tile_rows && c->zeros == tt->zeros && c->bits == tt->bits);
        for (size_t i = 0; i < ARRAY_SIZE(shapes); i++) {
            int R = shapes[i][0], C = shapes[i][1], G = shapes[i][2];
            size_t r = (size_t)R, cb, ng = (size_t)kn_ngroups(C, G), want;
            switch (dt) {
            case KN_DT_F32:
                want = r * (size_t)C * 4;
                break;
            case KN_DT_BF16:
                want = r * (size_t)C * 2;
                break;
            case KN_DT_Q8:
                want = (r * (size_t)C + 63) / 64 * 64 + r * 4;
                break;
            case KN_DT_W4A16:
            case KN_DT_W4A8:
                cb = (r * (size_t)((C + 1) / 2) + 63) / 64 * 64;
                want = cb + r * ng * (dt == KN_DT_W4A16 ? 3 : 2);
                assert_int_equal(kn_row_bytes(dt, C), (size_t)(C + 1) / 2);
                break;
            case KN_DT_Q6: /* rows in blocks of 256: 192 bytes and 8 fp16 scales each */
                cb = (r * (size_t)kn_q6_blocks(C) * 192 + 63) / 64 * 64;
                want = cb + r * (size_t)kn_q6_blocks(C) * 8 * 2;
                assert_int_equal(kn_row_bytes(dt, C), (size_t)kn_q6_blocks(C) * 192);
                break;
            default:
                want = (r + 15) / 16 * kn_tile_block_bytes(dt, C, G);
            }
            assert_int_equal(kn_mat_bytes(dt, R, C, G), want);
        }
    }
}

/* kn_mat_view_rows, a loader's view of code rows read apart from the scales, is the same view
 * as kn_mat_rows() of the whole matrix. */
static void test_mat_view_rows(void **state)
{
    (void)state;
    const int R = 37, C = 101, G = 32;
    for (int d = KN_DT_F32; d <= KN_DT_W4A8; d++) {
        enum kn_dtype dt = (enum kn_dtype)d;
        uint8_t *buf = xmalloc(kn_mat_bytes(dt, R, C, G));
        struct kn_mat whole, want, got;
        kn_mat_view(&whole, dt, R, C, G, buf);
        const uint8_t *tail = buf + kn_codes_bytes(dt, R, C);
        static const int ranges[][2] = {{0, 37}, {0, 1}, {5, 21}, {36, 37}, {37, 37}};
        for (size_t i = 0; i < ARRAY_SIZE(ranges); i++) {
            int r0 = ranges[i][0], r1 = ranges[i][1];
            kn_mat_rows(&whole, r0, r1, &want);
            kn_mat_view_rows(&got, dt, R, C, G, r0, r1, buf + (size_t)r0 * kn_row_bytes(dt, C),
                             tail);
            assert_int_equal(got.dtype, want.dtype);
            assert_int_equal(got.rows, want.rows);
            assert_int_equal(got.cols, want.cols);
            assert_int_equal(got.group, want.group);
            assert_ptr_equal(got.codes, want.codes);
            assert_ptr_equal(got.scales, want.scales);
            assert_ptr_equal(got.zeros, want.zeros);
        }
        free(buf);
    }
}

/* ---- the software model of the AMX tile instructions ---- */

/* A palette-1 configuration of tiles 0..@n-1, 16 rows x 64 bytes, tile 2 of @b_rows rows. */
static void amx_cfg(uint8_t cfg[64], int n, int b_rows)
{
    memset(cfg, 0, 64);
    cfg[0] = 1;
    for (int t = 0; t < n; t++) {
        uint16_t colsb = 64;
        memcpy(cfg + 16 + 2 * t, &colsb, 2);
        cfg[48 + t] = (uint8_t)(t == 2 ? b_rows : 16);
    }
}

/* The model recorded exactly one fault since it was last cleared, its message holding @what. */
static void expect_model_fault(const char *what)
{
    char msg[256];
    int n = amx_model_faults(msg, sizeof(msg));
    if (n != 1 || !strstr(msg, what))
        fail_msg("tile model: %d faults (first: '%s'), expected one with '%s'", n, msg, what);
    amx_model_faults_clear();
}

static void expect_no_model_fault(void)
{
    char msg[256];
    if (amx_model_faults(msg, sizeof(msg)))
        fail_msg("tile model fault: %s", msg);
}

static void *model_zero_thread(void *arg)
{
    *(bool *)arg = amx_model_configured();
    amx_model_zero(0);
    return NULL;
}

/* The model refuses what the hardware does: a tile instruction without a configuration, after
 * TILERELEASE, on another thread than the one that loaded it, on a tile the configuration
 * leaves unused or on shapes that do not multiply, and a configuration palette 1 does not
 * allow; on configured tiles TDPBSUD and TDPBF16PS compute their definitions. Plain C: this
 * runs on any CPU. */
static void test_amx_model_config(void **state)
{
    (void)state;
    uint8_t cfg[64], a[16][64], b[16][64], c[16][64];
    amx_model_faults_clear();
    amx_model_release();
    amx_model_zero(0);
    expect_model_fault("TILEZERO tmm0 without a tile configuration");

    amx_cfg(cfg, 3, 16);
    amx_model_loadconfig(cfg);
    assert_true(amx_model_configured());
    rng_seed(21);
    for (int m = 0; m < 16; m++)
        for (int j = 0; j < 64; j++) {
            a[m][j] = (uint8_t)(rng_u64() >> 56);
            b[m][j] = (uint8_t)(rng_u64() >> 60);
        }
    amx_model_zero(0);
    amx_model_loadd(1, a, 64);
    amx_model_loadd(2, b, 64);
    amx_model_dpbsud(0, 1, 2);
    amx_model_dpbsud(0, 1, 2); /* accumulates */
    amx_model_stored(0, c, 64);
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            int32_t want = 0, got;
            for (int k = 0; k < 16; k++)
                for (int j = 0; j < 4; j++)
                    want += 2 * (int8_t)a[m][4 * k + j] * b[k][4 * n + j];
            memcpy(&got, &c[m][4 * n], 4);
            assert_int_equal(got, want);
        }
    uint16_t ab[16][32], bb[16][32]; /* small integers: exact in bf16 and in the sums */
    for (int m = 0; m < 16; m++)
        for (int j = 0; j < 32; j++) {
            ab[m][j] = kn_f32_to_bf16((float)((int)(rng_u64() % 9) - 4));
            bb[m][j] = kn_f32_to_bf16((float)((int)(rng_u64() % 9) - 4));
        }
    amx_model_zero(0);
    amx_model_loadd(1, ab, 64);
    amx_model_loadd(2, bb, 64);
    amx_model_dpbf16ps(0, 1, 2);
    amx_model_stored(0, c, 64);
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float want = 0.0f, got;
            for (int k = 0; k < 16; k++)
                for (int j = 0; j < 2; j++)
                    want += kn_bf16_to_f32(ab[m][2 * k + j]) * kn_bf16_to_f32(bb[k][2 * n + j]);
            memcpy(&got, &c[m][4 * n], 4);
            assert_true(got == want);
        }
    expect_no_model_fault();

    amx_model_zero(3);
    expect_model_fault("TILEZERO tmm3: a tile the loaded configuration leaves unused");
    amx_model_dpbsud(0, 1, 1);
    expect_model_fault("must differ");
    bool there = true;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, model_zero_thread, &there), 0);
    pthread_join(th, NULL);
    assert_false(there);
    expect_model_fault("without a tile configuration");

    amx_cfg(cfg, 3, 8); /* B of 8 rows: K = 16 quads of A do not meet it */
    amx_model_loadconfig(cfg);
    amx_model_dpbsud(0, 1, 2);
    expect_model_fault("do not make C += A . B");
    amx_cfg(cfg, 3, 17);
    amx_model_loadconfig(cfg);
    expect_model_fault("LDTILECFG: tile 2 of 17 rows");
    assert_false(amx_model_configured());
    amx_cfg(cfg, 3, 16);
    cfg[0] = 2;
    amx_model_loadconfig(cfg);
    expect_model_fault("palette 2");

    amx_cfg(cfg, 3, 16);
    amx_model_loadconfig(cfg);
    amx_model_release();
    assert_false(amx_model_configured());
    amx_model_loadd(1, a, 64);
    expect_model_fault("TILELOADD tmm1 without a tile configuration");
}

/* ---- AMX kernels over the model: each loads its own configuration and releases it ---- */

struct amx_run {
    const struct kn_ops *ops;
    const struct kn_mat *w;
    const struct kn_act *x;
    int m;
    float *y[3];     /* (m, w->rows) per scenario */
    int faults[3];   /* the model's faults during the call */
    char msg[3][256];
    bool left_configured[3];
};

/* On a thread that never ran an AMX kernel: the first call; then after a different
 * configuration was left behind (as by a kernel that does not release its own); then after
 * TILERELEASE. */
static void *amx_run_thread(void *arg)
{
    struct amx_run *r = arg;
    for (int s = 0; s < 3; s++) {
        uint8_t cfg[64];
        if (s == 1) {
            amx_cfg(cfg, 3, 8);
            amx_model_loadconfig(cfg);
        }
        if (s == 2)
            amx_model_release();
        amx_model_faults_clear();
        gemm_call(r->ops, r->w, r->x, r->m, r->y[s], r->w->rows, 0, r->w->rows);
        r->faults[s] = amx_model_faults(r->msg[s], sizeof(r->msg[s]));
        r->left_configured[s] = amx_model_configured();
    }
    return NULL;
}

/* The AMX GEMMs through the tile model (docs/DESIGN.md: every AMX kernel loads its own
 * tile configuration on entry and releases it on exit): on a fresh thread, after another
 * configuration was left loaded and after a release, every call is right, executes no tile
 * instruction the model refuses and leaves no configuration loaded. The model tests that ran
 * before this one must not have faulted either. */
static void test_amx_model_kernels(void **state)
{
    const struct kn_ops *ops = table_or_skip(state);
    expect_no_model_fault();
    const int N = 40, K = 256, group = 64, M = 17; /* M >= AMX_MIN_M: on the tile unit */
    rng_seed(22);
    for (size_t di = 0; di < ARRAY_SIZE(tile_src); di++) {
        struct wmat a;
        struct kn_mat t;
        void *buf;
        wmat_init(&a, tile_src[di], N, K, group);
        tile(&a.m, &t, &buf);
        struct kn_act x[17];
        for (int i = 0; i < M; i++)
            act_init(&x[i], K, group, 1.0f + (float)(i % 5));
        float *yref = xmalloc((size_t)M * (size_t)N * sizeof(float));
        kn_gemm_ref(&a.m, x, M, yref, N, 0, N);
        struct amx_run r = {ops, &t, x, M, {NULL}, {0}, {{0}}, {false}};
        for (int s = 0; s < 3; s++)
            r.y[s] = xmalloc((size_t)M * (size_t)N * sizeof(float));
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, amx_run_thread, &r), 0);
        pthread_join(th, NULL);
        static const char *const when[] = {"on a fresh thread", "after another configuration",
                                           "after a release"};
        for (int s = 0; s < 3; s++) {
            if (r.faults[s])
                fail_msg("%s %s tiles %s: %d tile faults, first: %s", ops->name,
                         dt_name[tile_src[di]], when[s], r.faults[s], r.msg[s]);
            if (r.left_configured[s])
                fail_msg("%s %s tiles %s: returned with its tile configuration loaded", ops->name,
                         dt_name[tile_src[di]], when[s]);
            for (int i = 0; i < M; i++) {
                char what[96];
                snprintf(what, sizeof(what), "%s %s tiles %s, token %d", ops->name,
                         dt_name[tile_src[di]], when[s], i);
                check_rows(what, &a.m, &x[i], r.y[s] + (size_t)i * (size_t)N,
                           yref + (size_t)i * (size_t)N, 0, N,
                           tile_src[di] == KN_DT_W4A16 ? TOL_BF16_ACT : TOL_DOT);
            }
            free(r.y[s]);
        }
        free(yref);
        for (int i = 0; i < M; i++)
            kn_act_free(&x[i]);
        free(buf);
        wmat_free(&a);
    }
    amx_model_faults_clear();
}

/* kn_act_prepare_scalar: padding is zero, the even/odd split and group sums match x and q. */
static void test_act_prepare(void **state)
{
    (void)state;
    struct kn_act a;
    rng_seed(12);
    act_init(&a, 172, 64, 2.0f);
    assert_int_equal(a.kpad, 192);
    float amax = 0.0f;
    for (int i = 0; i < a.k; i++)
        amax = fmaxf(amax, fabsf(a.x[i]));
    assert_float_equal(a.qscale, amax / 127.0f, 0.0f);
    for (int i = a.k; i < a.kpad; i++)
        assert_true(a.x[i] == 0.0f && a.q[i] == 0);
    for (int i = 0; i < a.kpad; i++) {
        assert_true((i % 2 ? a.xo : a.xe)[i / 2] == a.x[i]);
        assert_int_equal((i % 2 ? a.qo : a.qe)[i / 2], a.q[i]);
        assert_true(abs(a.q[i]) <= 127);
        assert_true(fabs(a.q[i] * a.qscale - a.x[i]) <= 0.5001 * a.qscale);
    }
    for (int g = 0; g < a.kpad / a.group; g++) {
        double s = 0.0;
        int32_t qs = 0;
        for (int i = g * a.group; i < (g + 1) * a.group; i++) {
            s += a.x[i];
            qs += a.q[i];
        }
        assert_true(fabs(a.gsum[g] - s) <= 1e-4);
        assert_int_equal(a.qgsum[g], qs);
    }
    kn_act_free(&a);
}

/* Every part of @p garbage: NaN floats, -1 integers. */
static void act_poison(struct kn_act *p)
{
    size_t kp = (size_t)p->kpad, ng = kp / (size_t)p->group;
    memset(p->x, 0xff, kp * 4);
    memset(p->xe, 0xff, kp * 2);
    memset(p->xo, 0xff, kp * 2);
    memset(p->gsum, 0xff, ng * 4);
    memset(p->qgsum, 0xff, ng * 4);
    memset(p->q, 0xff, kp);
    memset(p->qe, 0xff, kp); /* qe and qo */
    memset(p->q16, 0xff, kp * 2);
    size_t nb = (size_t)kn_q6_blocks(p->k);
    memset(p->q6, 0xff, nb * KN_Q6_BLOCK);
    memset(p->q6scale, 0xff, nb * 64);
    memset(p->q6sum, 0xff, nb * 64);
    p->qscale = p->q16scale = NAN;
}

/* Every format's products read only the parts of the activations its traits name
 * (kn_type_traits[].act_parts, which the workers ask act_prepare for): prepared with just those,
 * over buffers whose other parts hold garbage (NaN floats, -1 integers), a product is the one of
 * a fully prepared activation bit for bit; and act_prepare wrote what was asked for. */
static void test_act_parts(void **state)
{
    const struct kn_ops *ops = table_or_skip(state);
    enum { N = 40, K = 320, G = 64 };
    static const int ms[] = {1, 5, 9};
    float *x = xmalloc((size_t)9 * K * sizeof(float));
    float *y_all = xmalloc((size_t)9 * N * sizeof(float)), *y_parts = xmalloc((size_t)9 * N * 4);
    struct kn_act full[9], part[9];
    rng_seed(31);
    fill_normal(x, (size_t)9 * K, 1.5f);
    for (int i = 0; i < 9; i++) {
        assert_int_equal(kn_act_alloc(&full[i], K, G), 0);
        assert_int_equal(full[i].parts, KN_ACT_ALL);
        ops->act_prepare(&full[i], x + (size_t)i * K);
        assert_int_equal(kn_act_alloc(&part[i], K, G), 0);
    }
    for (int dt = 0; dt < KN_DT_COUNT; dt++) {
        enum kn_dtype canon = kn_type_traits[dt].canon;
        struct wmat a;
        struct kn_mat t, *w = &a.m;
        void *buf = NULL;
        wmat_init(&a, canon, N, K, kn_type_traits[dt].grouped ? G : 0);
        if ((enum kn_dtype)dt != canon) {
            tile(&a.m, &t, &buf);
            w = &t;
        }
        unsigned need = kn_type_traits[dt].act_parts;
        assert_true(need && !(need & ~(unsigned)KN_ACT_ALL));
        for (int i = 0; i < 9; i++) { /* garbage everywhere, then only the parts asked for */
            struct kn_act *p = &part[i];
            act_poison(p);
            p->parts = need;
            ops->act_prepare(p, x + (size_t)i * K);
        }
        for (size_t mi = 0; mi < ARRAY_SIZE(ms); mi++) {
            int m = ms[mi];
            gemm_call(ops, w, full, m, y_all, N, 0, N);
            gemm_call(ops, w, part, m, y_parts, N, 0, N);
            if (memcmp(y_all, y_parts, (size_t)m * N * sizeof(float)))
                fail_msg("%s %s M=%d: the product of activations with parts 0x%x differs",
                         ops->name, kn_type_traits[dt].name, m, need);
        }
        free(buf);
        wmat_free(&a);
    }
    /* each part, asked for alone, is written as a full preparation writes it */
    for (unsigned bit = 1; bit & KN_ACT_ALL; bit <<= 1) {
        struct kn_act *p = &part[0], *f = &full[0];
        act_poison(p); /* nothing left from the bit before */
        p->parts = bit;
        ops->act_prepare(p, x);
        size_t kp = (size_t)p->kpad, ng = kp / G;
        if (bit == KN_ACT_F32)
            assert_true(!memcmp(p->x, f->x, kp * 4) && !memcmp(p->gsum, f->gsum, ng * 4));
        if (bit == KN_ACT_EO)
            assert_true(!memcmp(p->xe, f->xe, kp * 2) && !memcmp(p->xo, f->xo, kp * 2));
        if (bit == KN_ACT_Q || bit == KN_ACT_QEO)
            assert_true(!memcmp(p->qgsum, f->qgsum, ng * 4) && p->qscale == f->qscale);
        if (bit == KN_ACT_Q)
            assert_true(!memcmp(p->q, f->q, kp));
        if (bit == KN_ACT_QEO)
            assert_true(!memcmp(p->qe, f->qe, kp / 2) && !memcmp(p->qo, f->qo, kp / 2));
        if (bit == KN_ACT_Q16)
            assert_true(!memcmp(p->q16, f->q16, kp * 2) && p->q16scale == f->q16scale);
        if (bit == KN_ACT_Q6) {
            size_t nb = (size_t)kn_q6_blocks(p->k);
            assert_true(!memcmp(p->q6, f->q6, nb * KN_Q6_BLOCK) &&
                        !memcmp(p->q6scale, f->q6scale, nb * 64) &&
                        !memcmp(p->q6sum, f->q6sum, nb * 64));
        }
    }
    for (int i = 0; i < 9; i++) {
        kn_act_free(&full[i]);
        kn_act_free(&part[i]);
    }
    free(x);
    free(y_all);
    free(y_parts);
}

#define PER_TABLE(fn, isa, label)                                                                  \
    {                                                                                              \
        label, fn, NULL, NULL, &slot[isa]                                                          \
    }

int main(void)
{
    const struct kn_ops *all[8];
    int n = kn_ops_available(all, 8);
    assert_true(n >= 1 && all[0] == &kn_ops_ref);
    for (int i = 0; i < n; i++)
        slot[all[i]->isa].ops = all[i];
#ifdef SHARDLM_HAVE_AVX512
    if (slot[KN_ISA_AVX512].ops) /* the AMX code over the software tile model */
        slot[SLOT_AMX_MODEL].ops = &kn_ops_amx_model;
#endif
    printf("kernel tables on this machine:");
    for (int i = 0; i < n; i++)
        printf(" %s", all[i]->name);
    printf("\n");

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_act_prepare),
        cmocka_unit_test(test_type_traits),
        cmocka_unit_test(test_mat_view_rows),
        cmocka_unit_test(test_ops_select),
        cmocka_unit_test(test_amx_model_config),
        PER_TABLE(test_act_prepare_table, KN_ISA_REF, "act_prepare_ref"),
        PER_TABLE(test_act_prepare_table, KN_ISA_AVX2, "act_prepare_avx2"),
        PER_TABLE(test_act_prepare_table, KN_ISA_AVX512, "act_prepare_avx512"),
        PER_TABLE(test_act_prepare_table, KN_ISA_AMX, "act_prepare_amx"),
        PER_TABLE(test_act_prepare_table, SLOT_AMX_MODEL, "act_prepare_amx_model"),
        PER_TABLE(test_act_parts, KN_ISA_REF, "act_parts_ref"),
        PER_TABLE(test_act_parts, KN_ISA_AVX2, "act_parts_avx2"),
        PER_TABLE(test_act_parts, KN_ISA_AVX512, "act_parts_avx512"),
        PER_TABLE(test_act_parts, KN_ISA_AMX, "act_parts_amx"),
        PER_TABLE(test_act_parts, SLOT_AMX_MODEL, "act_parts_amx_model"),
        cmocka_unit_test(test_quant_error),
        cmocka_unit_test(test_quant_short_group),
        cmocka_unit_test(test_ref_w4_semantics),
        PER_TABLE(test_q6, KN_ISA_REF, "q6_ref"),
        PER_TABLE(test_q6, KN_ISA_AVX2, "q6_avx2"),
        PER_TABLE(test_q6, KN_ISA_AVX512, "q6_avx512"),
        PER_TABLE(test_q6, KN_ISA_AMX, "q6_amx"),
        PER_TABLE(test_q6, SLOT_AMX_MODEL, "q6_amx_model"),
        PER_TABLE(test_gemv, KN_ISA_REF, "gemv_ref"),
        PER_TABLE(test_gemm, KN_ISA_REF, "gemm_ref"),
        PER_TABLE(test_guard_page, KN_ISA_REF, "guard_page_ref"),
        cmocka_unit_test(test_tiles_repack),
        PER_TABLE(test_tiles_gemm, KN_ISA_REF, "tiles_gemm_ref"),
        PER_TABLE(test_gemm_scratch, KN_ISA_REF, "gemm_scratch_ref"),
        PER_TABLE(test_tiles_guard, KN_ISA_REF, "tiles_guard_ref"),
        PER_TABLE(test_rmsnorm, KN_ISA_REF, "rmsnorm_ref"),
        PER_TABLE(test_rope, KN_ISA_REF, "rope_ref"),
        PER_TABLE(test_softmax_silu, KN_ISA_REF, "softmax_silu_ref"),
        PER_TABLE(test_softcap, KN_ISA_REF, "softcap_ref"),
        cmocka_unit_test(test_gelu_and_rope_freqs),
        cmocka_unit_test(test_rope_scaling),
        cmocka_unit_test(test_attention_ref_formula),
        PER_TABLE(test_attention, KN_ISA_REF, "attention_ref"),
        PER_TABLE(test_attention_sinks, KN_ISA_REF, "attention_sinks_ref"),
        PER_TABLE(test_gemv, KN_ISA_AVX2, "gemv_avx2"),
        PER_TABLE(test_gemm, KN_ISA_AVX2, "gemm_avx2"),
        PER_TABLE(test_guard_page, KN_ISA_AVX2, "guard_page_avx2"),
        PER_TABLE(test_tiles_gemm, KN_ISA_AVX2, "tiles_gemm_avx2"),
        PER_TABLE(test_prefetch_modes, KN_ISA_AVX2, "prefetch_modes_avx2"),
        PER_TABLE(test_tiles_guard, KN_ISA_AVX2, "tiles_guard_avx2"),
        PER_TABLE(test_rmsnorm, KN_ISA_AVX2, "rmsnorm_avx2"),
        PER_TABLE(test_rope, KN_ISA_AVX2, "rope_avx2"),
        PER_TABLE(test_softmax_silu, KN_ISA_AVX2, "softmax_silu_avx2"),
        PER_TABLE(test_softcap, KN_ISA_AVX2, "softcap_avx2"),
        PER_TABLE(test_attention, KN_ISA_AVX2, "attention_avx2"),
        PER_TABLE(test_attention_sinks, KN_ISA_AVX2, "attention_sinks_avx2"),
        PER_TABLE(test_gemv, KN_ISA_AVX512, "gemv_avx512"),
        PER_TABLE(test_gemm, KN_ISA_AVX512, "gemm_avx512"),
        PER_TABLE(test_guard_page, KN_ISA_AVX512, "guard_page_avx512"),
        PER_TABLE(test_tiles_gemm, KN_ISA_AVX512, "tiles_gemm_avx512"),
        PER_TABLE(test_gemm_scratch, KN_ISA_AVX512, "gemm_scratch_avx512"),
        PER_TABLE(test_prefetch_modes, KN_ISA_AVX512, "prefetch_modes_avx512"),
        PER_TABLE(test_tiles_guard, KN_ISA_AVX512, "tiles_guard_avx512"),
        PER_TABLE(test_rmsnorm, KN_ISA_AVX512, "rmsnorm_avx512"),
        PER_TABLE(test_rope, KN_ISA_AVX512, "rope_avx512"),
        PER_TABLE(test_softmax_silu, KN_ISA_AVX512, "softmax_silu_avx512"),
        PER_TABLE(test_softcap, KN_ISA_AVX512, "softcap_avx512"),
        PER_TABLE(test_attention, KN_ISA_AVX512, "attention_avx512"),
        PER_TABLE(test_attention_sinks, KN_ISA_AVX512, "attention_sinks_avx512"),
        PER_TABLE(test_gemm, KN_ISA_AMX, "gemm_amx"),
        PER_TABLE(test_attention, KN_ISA_AMX, "attention_amx"),
        PER_TABLE(test_attention_sinks, KN_ISA_AMX, "attention_sinks_amx"),
        PER_TABLE(test_softcap, KN_ISA_AMX, "softcap_amx"),
        PER_TABLE(test_tiles_gemm, KN_ISA_AMX, "tiles_gemm_amx"),
        PER_TABLE(test_gemm_scratch, KN_ISA_AMX, "gemm_scratch_amx"),
        PER_TABLE(test_prefetch_modes, KN_ISA_AMX, "prefetch_modes_amx"),
        PER_TABLE(test_tiles_guard, KN_ISA_AMX, "tiles_guard_amx"),
        PER_TABLE(test_gemm, SLOT_AMX_MODEL, "gemm_amx_model"),
        PER_TABLE(test_attention, SLOT_AMX_MODEL, "attention_amx_model"),
        PER_TABLE(test_attention_sinks, SLOT_AMX_MODEL, "attention_sinks_amx_model"),
        PER_TABLE(test_softcap, SLOT_AMX_MODEL, "softcap_amx_model"),
        PER_TABLE(test_tiles_gemm, SLOT_AMX_MODEL, "tiles_gemm_amx_model"),
        PER_TABLE(test_gemm_scratch, SLOT_AMX_MODEL, "gemm_scratch_amx_model"),
        PER_TABLE(test_prefetch_modes, SLOT_AMX_MODEL, "prefetch_modes_amx_model"),
        PER_TABLE(test_tiles_guard, SLOT_AMX_MODEL, "tiles_guard_amx_model"),
        PER_TABLE(test_amx_model_kernels, SLOT_AMX_MODEL, "amx_model_kernels"),
    };
    int failed = cmocka_run_group_tests_name("kernels", tests, NULL, NULL);
    gemv_cache_free();
    return failed;
}
