/* SPDX-License-Identifier: MIT */
/* tests: the W4 quantizers of kernels/kn_quant.c against their definitions in kn.h.
 *
 * kn_quant_group must find the scale (and zero point) of least weighted squared error among all
 * it can store; the reference here tries every finite fp16 scale of either sign (and every zero
 * point) on groups of many shapes, with and without importance weights. Then the matrix
 * quantizer against the group one, kn_w4_pack against dequantization, and pools of any size.
 * (How fast the search is: `shardlm bench quant`.)
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kn.h"
#include "pool.h"
#include "testutil.h"

/* The search evaluates each scale's error as a - 2 u b + u^2 c in double from exact terms, the
 * reference sums the squared differences: they agree to rounding, relative to the error, or to
 * the group's energy a when the error is 0 (a group the scale fits exactly). The search's lower
 * bounds are summed in float, so a scale whose error is within about 1e-7 of the best found may
 * be passed over. Measured: equal errors on every group here (and on 23000 more). */
#define TOL_REL 1e-6
#define TOL_ABS 1e-12

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* the fixed-seed PRNG: testutil.h's rng_seed, rng_u64, rng_unit, rng_normal */

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

static float f16_round(float x) { return kn_f16_to_f32(kn_f32_to_f16(x)); }

/* ---- the definition ---- */

/* The code of @x, as kn.h defines it and the quantizers write it. */
static int code_of(float x, float s, int z)
{
    float inv = s != 0.0f ? 1.0f / s : 0.0f;
    long q = lrintf(x * inv) + z;
    return q < 0 ? 0 : q > 15 ? 15 : (int)q;
}

/* sum imp[i] (w[i] - s (q_i - z))^2, imp NULL: 1; stops once it exceeds @limit. */
static double group_err(const float *w, const float *imp, int n, float s, int z, double limit)
{
    double e = 0.0;
    for (int i = 0; i < n && e <= limit; i++) {
        double d = (double)w[i] - (double)s * (code_of(w[i], s, z) - z);
        e += (imp ? imp[i] : 1.0) * d * d;
    }
    return e;
}

/* The least error of every (s, z) the layout stores: s = 0, and each finite fp16 magnitude up
 * to 2 max|w| (above it every code is z: the error of s = 0) with either sign and z = 8
 * (symmetric), or z = 0..15 (asymmetric; a negative s is the same as another z). */
static double exhaustive(const float *w, const float *imp, int n, bool asym)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++)
        amax = fmaxf(amax, fabsf(w[i]));
    double best = group_err(w, imp, n, 0.0f, 8, INFINITY);
    for (uint16_t h = 1; h < 0x7c00u; h++) {
        float u = kn_f16_to_f32(h);
        if (u > 2.0f * amax)
            break;
        for (int z = asym ? 0 : 8; z <= (asym ? 15 : 8); z++)
            for (int sign = 0; sign <= !asym; sign++) {
                double e = group_err(w, imp, n, sign ? -u : u, z, best);
                best = e < best ? e : best;
            }
    }
    return best;
}

/* ---- groups ---- */

enum kind {
    KIND_NORMAL,
    KIND_HEAVY,    /* normal / (|normal| + 0.1): tails like a few outliers per group */
    KIND_EQUAL,    /* one value, either sign */
    KIND_ZERO,     /* all zero */
    KIND_OUTLIER,  /* normal and one value 50x larger */
    KIND_SPARSE,   /* three non-zero values */
    KIND_GRID,     /* already on a grid: d (k - 8) for an fp16 d (re-quantized Q4_0) */
    KIND_TINY,     /* normal at 1e-5: the scale is a subnormal half */
    KIND_POSITIVE, /* exp(normal): all one sign */
    KIND_COUNT,
};
static const char *const kind_name[KIND_COUNT] = {"normal", "heavy", "equal", "zero",    "outlier",
                                                  "sparse", "grid",  "tiny",  "positive"};

static void make_group(float *w, int n, enum kind kind)
{
    float d = f16_round(0.001f + 0.01f * (float)rng_unit());
    for (int i = 0; i < n; i++) {
        float x = 0.02f * rng_normal();
        switch (kind) {
        case KIND_HEAVY:
            x = 0.002f * rng_normal() / (fabsf(rng_normal()) + 0.1f);
            break;
        case KIND_EQUAL:
            x = 0.03f;
            break;
        case KIND_ZERO:
            x = 0.0f;
            break;
        case KIND_SPARSE:
            x = 0.0f;
            break;
        case KIND_GRID:
            x = d * (float)((int)(rng_u64() % 16) - 8);
            break;
        case KIND_TINY:
            x = 1e-5f * rng_normal();
            break;
        case KIND_POSITIVE:
            x = 0.01f * expf(rng_normal());
            break;
        default:
            break;
        }
        w[i] = x;
    }
    if (kind == KIND_EQUAL && rng_u64() % 2)
        for (int i = 0; i < n; i++)
            w[i] = -w[i];
    if (kind == KIND_OUTLIER)
        w[rng_u64() % (uint64_t)n] = 1.0f * (rng_u64() % 2 ? 1.0f : -1.0f);
    if (kind == KIND_SPARSE)
        for (int j = 0; j < 3; j++)
            w[rng_u64() % (uint64_t)n] = 0.05f * rng_normal();
}

/* Importances like an imatrix's: log-normal, a fifth of them 0. */
static void make_imp(float *imp, int n)
{
    for (int i = 0; i < n; i++)
        imp[i] = rng_u64() % 5 == 0 ? 0.0f : expf(2.0f * rng_normal());
}

/* kn_quant_group's (s, z) on @w: stored as it is (fp16-exact, z in range) and its error. */
static double fast_err(const float *w, const float *imp, int n, bool asym, float *s)
{
    int z;
    kn_quant_group(w, n, asym, imp, s, &z);
    assert_true(f16_round(*s) == *s);
    if (asym)
        assert_true(z >= 0 && z <= 15);
    else
        assert_int_equal(z, 8);
    return group_err(w, imp, n, *s, z, INFINITY);
}

/* (a) the search against the exhaustive one: groups of every kind and size, imp NULL and
 * random, both schemes. */
static void test_group_exhaustive(void **state)
{
    (void)state;
    static const int sizes[] = {32, 44, 64, 100, 128, 256};
    float w[256], imp[256];
    double worst = 0.0, gain = 0.0;
    int groups = 0, better = 0;
    rng_seed(11);
    for (int asym = 0; asym < 2; asym++)
        for (int kind = 0; kind < KIND_COUNT; kind++)
            for (size_t si = 0; si < ARRAY_SIZE(sizes); si++)
                for (int weighted = 0; weighted < 2; weighted++) {
                    int n = sizes[si];
                    if (asym && n > 128 && kind != KIND_NORMAL)
                        continue; /* 16 zero points of 256 elements: the slowest references */
                    make_group(w, n, (enum kind)kind);
                    if (weighted)
                        make_imp(imp, n);
                    const float *ip = weighted ? imp : NULL;
                    float s;
                    double e = fast_err(w, ip, n, asym, &s), ref = exhaustive(w, ip, n, asym);
                    double a = group_err(w, ip, n, 0.0f, 8, INFINITY);
                    if (kind == KIND_ZERO)
                        assert_true(s == 0.0f);
                    if (!(e <= ref * (1.0 + TOL_REL) + TOL_ABS * a)) {
                        print_error("%s %s n=%d imp %s: error %.12g, exhaustive %.12g (scale %a)\n",
                                    asym ? "asym" : "sym", kind_name[kind], n,
                                    weighted ? "random" : "NULL", e, ref, (double)s);
                        fail();
                    }
                    if (ref > 0.0) {
                        worst = fmax(worst, e / ref - 1.0);
                        gain = fmax(gain, 1.0 - e / ref);
                    }
                    better += e < ref;
                    groups++;
                }
    print_message("[          ] %d groups: worst error/exhaustive - 1 = %.3g; %d lower than it (by "
                  "up to %.3g, rounding)\n",
                  groups, worst, better, gain);
}

/* (b) the same on many normal groups of the default sizes, the symmetric scheme (the cheap
 * reference), to catch a rare miss of a bound. */
static void test_group_exhaustive_many(void **state)
{
    (void)state;
    float w[128], imp[128];
    rng_seed(12);
    for (int t = 0; t < 300; t++) {
        int n = t % 3 == 0 ? 128 : t % 3 == 1 ? 64 : 32;
        make_group(w, n, t % 4 == 3 ? KIND_HEAVY : KIND_NORMAL);
        make_imp(imp, n);
        const float *ip = t % 2 ? imp : NULL;
        float s;
        double e = fast_err(w, ip, n, false, &s), ref = exhaustive(w, ip, n, false);
        if (!(e <= ref * (1.0 + TOL_REL))) {
            print_error("group %d n=%d: error %.12g, exhaustive %.12g\n", t, n, e, ref);
            fail();
        }
    }
}

/* (c) importance: the weighted search minimises the weighted error, so it is never worse on it
 * than the unweighted search's result, and far better where the weight sits on small values. */
static void test_group_importance(void **state)
{
    (void)state;
    float w[128], imp[128];
    rng_seed(13);
    for (int t = 0; t < 200; t++) {
        int n = 128;
        bool asym = t % 2;
        make_group(w, n, t % 3 ? KIND_NORMAL : KIND_HEAVY);
        for (int i = 0; i < n; i++)
            imp[i] = 1e-3f;
        for (int j = 0; j < 4; j++) /* a few columns carry the weight */
            imp[rng_u64() % (uint64_t)n] = 1.0f;
        float sw, su;
        int zw, zu;
        kn_quant_group(w, n, asym, imp, &sw, &zw);
        kn_quant_group(w, n, asym, NULL, &su, &zu);
        double ew = group_err(w, imp, n, sw, zw, INFINITY);
        double eu = group_err(w, imp, n, su, zu, INFINITY);
        assert_true(ew <= eu * (1.0 + TOL_REL));
    }
    /* one large value nobody reads and small ones that matter: the unweighted scale rounds
     * the small ones to zero */
    float big[64], m[64];
    for (int i = 0; i < 64; i++) {
        big[i] = 0.01f * rng_normal();
        m[i] = 1.0f;
    }
    big[5] = 1.0f;
    m[5] = 0.0f;
    for (int asym = 0; asym < 2; asym++) {
        float sw, su;
        int zw, zu;
        kn_quant_group(big, 64, asym, m, &sw, &zw);
        kn_quant_group(big, 64, asym, NULL, &su, &zu);
        double ew = group_err(big, m, 64, sw, zw, INFINITY);
        double eu = group_err(big, m, 64, su, zu, INFINITY);
        print_message("[          ] %s: weighted error %.3g with importance, %.3g without\n",
                      asym ? "asym" : "sym", ew, eu);
        assert_true(ew < 0.1 * eu);
    }
    /* no weight on any non-zero element: as unweighted */
    float zero[64] = {0}, s0, s1;
    int z0, z1;
    kn_quant_group(big, 64, false, zero, &s0, &z0);
    kn_quant_group(big, 64, false, NULL, &s1, &z1);
    assert_true(s0 == s1 && z0 == z1);
}

/* A random matrix with a ragged last group and some structure: rows of different scales, a
 * zero row, an outlier. */
static void make_matrix(float *w, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        float sc = 0.005f * (float)(1 + r % 7);
        for (int k = 0; k < cols; k++)
            w[(size_t)r * cols + k] = r == 3 ? 0.0f : sc * rng_normal();
    }
    w[5 * (size_t)cols + 7] = 0.5f;
}

/* (d) the matrix quantizer is the group search, column importance per group, and the codes
 * of kn.h, packed by kn_w4_pack: the same bytes. */
static void test_matrix_is_groups(void **state)
{
    (void)state;
    enum { R = 9, C = 300, G = 64, NG = (C + G - 1) / G };
    float *w = xmalloc(sizeof(float) * R * C), imp[C], scales[R * NG];
    uint8_t codes[R * C], zeros[R * NG];
    rng_seed(14);
    make_matrix(w, R, C);
    for (int k = 0; k < C; k++)
        imp[k] = expf(rng_normal());
    for (int asym = 0; asym < 2; asym++)
        for (int weighted = 0; weighted < 2; weighted++) {
            enum kn_dtype dt = asym ? KN_DT_W4A16 : KN_DT_W4A8;
            size_t bytes = kn_mat_bytes(dt, R, C, G);
            uint8_t *a = xmalloc(bytes), *b = xmalloc(bytes);
            memset(a, 0xa5, bytes);
            memset(b, 0x5a, bytes);
            const float *ip = weighted ? imp : NULL;
            kn_quant_w4(w, R, C, G, asym, ip, a, NULL);
            for (int r = 0; r < R; r++)
                for (int g = 0; g < NG; g++) {
                    int k0 = g * G, n = C - k0 < G ? C - k0 : G, z;
                    float s;
                    kn_quant_group(w + r * C + k0, n, asym, ip ? ip + k0 : NULL, &s, &z);
                    scales[r * NG + g] = s;
                    zeros[r * NG + g] = (uint8_t)z;
                    for (int k = k0; k < k0 + n; k++)
                        codes[r * C + k] = (uint8_t)code_of(w[r * C + k], s, z);
                }
            kn_w4_pack(codes, scales, zeros, R, C, G, asym, b);
            /* the codes region's padding is the layout's too: compare every byte */
            assert_memory_equal(a, b, bytes);
            free(a);
            free(b);
        }
    free(w);
}

/* (e) kn_w4_pack round trip: dequantizing row r gives scale * (code - zero) for every element
 * (odd widths, a short last group, negative symmetric scales). */
static void test_pack_roundtrip(void **state)
{
    (void)state;
    static const struct {
        int rows, cols, group;
    } shapes[] = {{5, 172, 64}, {3, 33, 32}, {4, 256, 256}, {2, 129, 128}};
    rng_seed(15);
    for (size_t si = 0; si < ARRAY_SIZE(shapes); si++)
        for (int asym = 0; asym < 2; asym++) {
            int R = shapes[si].rows, C = shapes[si].cols, G = shapes[si].group;
            int ng = kn_ngroups(C, G);
            enum kn_dtype dt = asym ? KN_DT_W4A16 : KN_DT_W4A8;
            uint8_t *codes = xmalloc((size_t)R * C), *zeros = xmalloc((size_t)R * ng);
            float *scales = xmalloc(sizeof(float) * (size_t)R * ng),
                  *row = xmalloc(sizeof(float) * C);
            void *buf = xmalloc(kn_mat_bytes(dt, R, C, G));
            for (int i = 0; i < R * C; i++)
                codes[i] = (uint8_t)(rng_u64() % 16);
            for (int i = 0; i < R * ng; i++) {
                float s = f16_round(0.001f + 0.1f * (float)rng_unit());
                scales[i] = asym || rng_u64() % 2 ? s : -s;
                zeros[i] = (uint8_t)(rng_u64() % 16);
            }
            kn_w4_pack(codes, scales, zeros, R, C, G, asym, buf);
            struct kn_mat m;
            kn_mat_view(&m, dt, R, C, G, buf);
            for (int r = 0; r < R; r++) {
                kn_mat_row(&m, r, row);
                for (int k = 0; k < C; k++) {
                    int g = k / G, z = asym ? zeros[r * ng + g] : 8;
                    float want = scales[r * ng + g] * (float)(codes[r * C + k] - z);
                    if (row[k] != want) {
                        print_error("%s %dx%d g%d: row %d col %d: %g, want %g\n",
                                    asym ? "w4a16" : "w4a8", R, C, G, r, k, row[k], want);
                        fail();
                    }
                }
            }
            free(codes);
            free(zeros);
            free(scales);
            free(row);
            free(buf);
        }
}

/* (f) the result does not depend on the pool it runs on (rows split differently, more members
 * than rows), nor do the from_float entries, which take the pool too */
static void test_threads(void **state)
{
    (void)state;
    enum { R = 300, C = 512, G = 128 }; /* above the 64K weights a matrix needs for threads */
    float *w = xmalloc(sizeof(float) * R * C), imp[C];
    rng_seed(16);
    make_matrix(w, R, C);
    for (int k = 0; k < C; k++)
        imp[k] = expf(rng_normal());
    for (int asym = 0; asym < 2; asym++) {
        enum kn_dtype dt = asym ? KN_DT_W4A16 : KN_DT_W4A8;
        size_t bytes = kn_mat_bytes(dt, R, C, G);
        uint8_t *one = xmalloc(bytes), *other = xmalloc(bytes), *plain = xmalloc(bytes);
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        const int counts[] = {1, 2, 3, cpus > 0 ? (int)cpus : 1, R + 5};
        kn_quant_w4(w, R, C, G, asym, asym ? imp : NULL, one, NULL);
        kn_type_traits[dt].from_float(w, R, C, G, plain, NULL);
        for (size_t i = 0; i < ARRAY_SIZE(counts); i++) {
            struct wrk_pool *pool;
            assert_int_equal(wrk_pool_init(&pool, counts[i], NULL), 0);
            struct kn_par par = wrk_pool_par(pool);
            memset(other, 0xee, bytes);
            kn_quant_w4(w, R, C, G, asym, asym ? imp : NULL, other, &par);
            assert_memory_equal(one, other, bytes);
            memset(other, 0xee, bytes);
            kn_type_traits[dt].from_float(w, R, C, G, other, &par);
            assert_memory_equal(plain, other, bytes);
            wrk_pool_free(pool);
        }
        free(one);
        free(other);
        free(plain);
    }
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_exhaustive),
        cmocka_unit_test(test_group_exhaustive_many),
        cmocka_unit_test(test_group_importance),
        cmocka_unit_test(test_matrix_is_groups),
        cmocka_unit_test(test_pack_roundtrip),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests_name("quant", tests, NULL, NULL);
}
