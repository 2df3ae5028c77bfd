/* SPDX-License-Identifier: MIT */
/* shm/plan + kernels/kn_repack: the shard plan covers every head, unit and vocabulary row, and
 * shards computed separately add up to the whole (row slices exactly, column slices with their
 * zero pads to float rounding). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include "arch/ref/kn_ref.h"
#include "plan.h"
#include "testutil.h"

static struct shlm_config stories(void)
{
    struct shlm_config c = {.arch = SHLM_ARCH_LLAMA, .dim = 64, .hidden_dim = 172, .n_layers = 5,
                            .n_heads = 8, .n_kv_heads = 4, .head_dim = 8, .vocab_size = 512,
                            .seq_len = 512, .norm_eps = 1e-5f, .rope_theta = 10000.0f};
    return c;
}

static void test_plan_covers_everything(void **state)
{
    struct shlm_config c = stories();
    static const int groups[] = {0, 64, 128};
    for (int gi = 0; gi < 3; gi++)
        for (int R = 1; R <= 8; R++) {
            int q_next = 0, f_next = 0, v_next = 0;
            for (int r = 0; r < R; r++) {
                struct seg_plan p;
                assert_int_equal(
                    seg_plan_make(&p, &c, &(struct shlm_config_ext){0}, groups[gi], R, r), 0);
                /* contiguous, disjoint, non-empty, in rank order */
                assert_int_equal(p.q0, q_next);
                assert_int_equal(p.f0, f_next);
                assert_int_equal(p.v0, v_next);
                assert_int_equal(p.v0 % KN_TILE_ROWS, 0); /* tiled head rows are whole blocks */
                assert_true(p.q1 > p.q0 && p.f1 > p.f0 && p.v1 > p.v0);
                q_next = p.q1;
                f_next = p.f1;
                v_next = p.v1;
                /* every query head's KV head is held, and only those */
                for (int h = p.q0; h < p.q1; h++)
                    assert_true(h / 2 >= p.kv0 && h / 2 < p.kv1);
                assert_int_equal(p.kv0, p.q0 / 2);
                assert_int_equal(p.kv1, (p.q1 - 1) / 2 + 1);
                /* pads line the shard's groups up with the source's */
                int g = groups[gi];
                assert_int_equal(p.o_pad, g ? p.q0 * 8 % g : 0);
                assert_int_equal(p.down_pad, g ? p.f0 % g : 0);
                /* nearly equal: sizes differ by at most one */
                assert_true(abs((p.q1 - p.q0) - 8 / R) <= 1);
            }
            assert_int_equal(q_next, 8);
            assert_int_equal(f_next, 172);
            assert_int_equal(v_next, 512);
        }
    /* R = 3: heads 0-2, 3-5, 6-7 read KV 0-1, 1-2, 3 (KV head 1 replicated) */
    struct seg_plan p;
    assert_int_equal(seg_plan_make(&p, &c, &(struct shlm_config_ext){0}, 0, 3, 1), 0);
    assert_int_equal(p.q0, 2);
    assert_int_equal(p.q1, 5);
    assert_int_equal(p.kv0, 1);
    assert_int_equal(p.kv1, 3);
    /* more ranks than heads, bad rank */
    assert_int_equal(seg_plan_make(&p, &c, &(struct shlm_config_ext){0}, 0, 9, 0), -EINVAL);
    assert_int_equal(seg_plan_make(&p, &c, &(struct shlm_config_ext){0}, 0, 2, 2), -EINVAL);
    assert_int_equal(seg_plan_make(&p, &c, &(struct shlm_config_ext){0}, 0, 0, 0), -EINVAL);
}

/* A mixture of experts' plans: tensor-parallel, every rank every expert and its slice of each
 * one's units (behind the group's pad); expert-parallel, each rank a contiguous range of whole
 * experts, the ranges disjoint and covering all, refused past one expert per rank; a header's
 * plan is its placement's, and a file's placement must be 0. */
static void test_plan_experts(void **state)
{
    struct shlm_config c = stories();
    struct shlm_config_ext x = {.n_experts = 6,
                                .n_experts_used = 2,
                                .expert_ffn = 96,
                                .moe_route = SHLM_ROUTE_SOFTMAX_NORM};
    for (int R = 1; R <= 8; R++) {
        int e_next = 0, x_next = 0;
        for (int r = 0; r < R; r++) {
            struct seg_plan p;
            assert_int_equal(seg_plan_place(&p, &c, &x, 64, R, r, SEG_EXPERTS_TP), 0);
            assert_int_equal(p.experts, SEG_EXPERTS_TP);
            assert_int_equal(p.x0, 0);
            assert_int_equal(p.x1, 6);
            assert_int_equal(p.e0, e_next);
            assert_true(p.e1 > p.e0);
            assert_int_equal(p.down_pad_exp, p.e0 % 64);
            e_next = p.e1;
            int rc = seg_plan_place(&p, &c, &x, 64, R, r, SEG_EXPERTS_EP);
            if (R > 6) { /* an expert per rank at least */
                assert_int_equal(rc, -EINVAL);
                continue;
            }
            assert_int_equal(rc, 0);
            assert_int_equal(p.experts, SEG_EXPERTS_EP);
            assert_int_equal(p.e0, 0);
            assert_int_equal(p.e1, 96);
            assert_int_equal(p.down_pad_exp, 0);
            assert_int_equal(p.x0, x_next);
            assert_true(p.x1 > p.x0);
            x_next = p.x1;
        }
        assert_int_equal(e_next, 96);
        if (R <= 6)
            assert_int_equal(x_next, 6);
    }
    /* a dense model has one placement */
    struct seg_plan p;
    assert_int_equal(seg_plan_place(&p, &c, &(struct shlm_config_ext){0}, 0, 2, 1, SEG_EXPERTS_EP),
                     0);
    assert_int_equal(p.experts, SEG_EXPERTS_TP);
    /* a header's plan */
    struct shlm_header h = {.cfg = c,
                            .cfgx = x,
                            .scheme = SHLM_SCHEME_W4A8,
                            .group = 64,
                            .shard_rank = 1,
                            .shard_count = 3,
                            .experts_placement = SEG_EXPERTS_EP};
    assert_int_equal(seg_plan_of(&p, &h), 0);
    assert_int_equal(p.x0, 2);
    assert_int_equal(p.x1, 4);
    h.experts_placement = 2;
    assert_int_equal(seg_plan_of(&p, &h), -EINVAL);
    h.experts_placement = SEG_EXPERTS_EP;
    h.shard_count = 0; /* a file */
    h.shard_rank = 0;
    assert_int_equal(seg_plan_of(&p, &h), -EINVAL);
}

static uint64_t rng = 0x1234567;
static float randn(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    float u = ((rng >> 40) + 0.5f) / 16777216.0f;
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    float v = ((rng >> 40) + 0.5f) / 16777216.0f;
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static void *quantize(enum kn_dtype dt, const float *w, int rows, int cols, int group)
{
    void *buf = calloc(1, kn_mat_bytes(dt, rows, cols, group));
    switch (dt) {
    case KN_DT_F32:
        memcpy(buf, w, (size_t)rows * cols * 4);
        break;
    case KN_DT_Q8:
        kn_quant_q8(w, rows, cols, buf);
        break;
    case KN_DT_W4A16:
        kn_quant_w4a16(w, rows, cols, group, buf);
        break;
    case KN_DT_W4A8:
        kn_quant_w4a8(w, rows, cols, group, buf);
        break;
    default:
        fail();
    }
    return buf;
}

/* Column shards [c0, c1) with their pads, each against its slice of x: the sum over shards is the
 * whole product. W4A8 quantizes each slice's activations with its own scale, so it only agrees to
 * the int8 activation error (per-rank scales, as the issue allows). */
static void test_column_shards_add_up(void **state)
{
    static const enum kn_dtype dts[] = {KN_DT_F32, KN_DT_Q8, KN_DT_W4A16, KN_DT_W4A8};
    const int rows = 24, cols = 172;
    float *w = malloc((size_t)rows * cols * 4), x[172], full[24], sum[24], part[24];
    for (int i = 0; i < rows * cols; i++)
        w[i] = 0.02f * randn();
    for (int i = 0; i < cols; i++)
        x[i] = randn();
    for (int d = 0; d < 4; d++)
        for (int group = 64; group <= 128; group += 64) {
            void *q = quantize(dts[d], w, rows, cols, group);
            struct kn_mat m;
            kn_mat_view(&m, dts[d], rows, cols, group, q);
            struct kn_act a;
            assert_int_equal(kn_act_alloc(&a, cols, group), 0);
            kn_act_prepare_scalar(&a, x); /* the ref table's */
            kn_gemv_ref(&m, &a, full, 0, rows);
            kn_act_free(&a);
            for (int R = 1; R <= 4; R++) {
                memset(sum, 0, sizeof(sum));
                for (int r = 0; r < R; r++) {
                    int c0 = cols * r / R, c1 = cols * (r + 1) / R;
                    int pad = dts[d] >= KN_DT_W4A16 ? c0 % group : 0, n = pad + c1 - c0;
                    void *sh = malloc(kn_mat_bytes(dts[d], rows, n, group));
                    kn_repack_cols(&m, c0, c1, pad, sh);
                    struct kn_mat sm;
                    kn_mat_view(&sm, dts[d], rows, n, group, sh);
                    float xs[300] = {0};
                    memcpy(xs + pad, x + c0, (size_t)(c1 - c0) * 4);
                    assert_int_equal(kn_act_alloc(&a, n, group), 0);
                    kn_act_prepare_scalar(&a, xs);
                    kn_gemv_ref(&sm, &a, part, 0, rows);
                    kn_act_free(&a);
                    for (int i = 0; i < rows; i++)
                        sum[i] += part[i];
                    free(sh);
                }
                float tol = dts[d] == KN_DT_W4A8 ? 0.02f : 1e-4f;
                for (int i = 0; i < rows; i++)
                    assert_true(fabsf(sum[i] - full[i]) <= tol * (1.0f + fabsf(full[i])));
            }
            free(q);
        }
    free(w);
}

/* Row shards are the same rows, bit for bit, and views of rows agree with copies of them. */
static void test_row_shards_exact(void **state)
{
    static const enum kn_dtype dts[] = {KN_DT_F32, KN_DT_Q8, KN_DT_W4A16, KN_DT_W4A8};
    const int rows = 37, cols = 172, group = 64;
    float *w = malloc((size_t)rows * cols * 4), x[172], full[37], part[37];
    for (int i = 0; i < rows * cols; i++)
        w[i] = 0.02f * randn();
    for (int i = 0; i < cols; i++)
        x[i] = randn();
    struct kn_act a;
    assert_int_equal(kn_act_alloc(&a, cols, group), 0);
    kn_act_prepare_scalar(&a, x); /* the ref table's */
    for (int d = 0; d < 4; d++) {
        void *q = quantize(dts[d], w, rows, cols, group);
        struct kn_mat m, v;
        kn_mat_view(&m, dts[d], rows, cols, group, q);
        kn_gemv_ref(&m, &a, full, 0, rows);
        int r0 = 11, r1 = 30;
        void *sh = malloc(kn_mat_bytes(dts[d], r1 - r0, cols, group));
        kn_repack_rows(&m, r0, r1, sh);
        struct kn_mat sm;
        kn_mat_view(&sm, dts[d], r1 - r0, cols, group, sh);
        kn_gemv_ref(&sm, &a, part, 0, r1 - r0);
        assert_memory_equal(part, full + r0, (size_t)(r1 - r0) * 4);
        kn_mat_rows(&m, r0, r1, &v);
        kn_gemv_ref(&v, &a, part, 0, r1 - r0);
        assert_memory_equal(part, full + r0, (size_t)(r1 - r0) * 4);
        free(sh);
        free(q);
    }
    kn_act_free(&a);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_covers_everything),
        cmocka_unit_test(test_plan_experts),
        cmocka_unit_test(test_column_shards_add_up),
        cmocka_unit_test(test_row_shards_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
