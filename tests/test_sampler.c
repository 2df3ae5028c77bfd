/* SPDX-License-Identifier: MIT */
/* coordinator/sched/sampler: greedy is argmax, a seed fixes the draws, temperature sampling follows
 * the softmax, and the nucleus (top-p) cut never lets a token outside it through. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"

#define N_DRAWS 20000

/* p[i] = softmax(logits / temp)[i], in double. */
static void softmax_ref(const float *logits, int n, double temp, double *p)
{
    double mx = logits[0], sum = 0.0;
    for (int i = 1; i < n; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < n; i++)
        sum += p[i] = exp((logits[i] - mx) / temp);
    for (int i = 0; i < n; i++)
        p[i] /= sum;
}

/* One draw from @logits; coord_sample() overwrites its input when temp > 0, so it gets a copy. */
static int draw(struct coord_sampler *s, const float *logits, int n)
{
    float tmp[256];
    assert_true(n <= 256);
    memcpy(tmp, logits, (size_t)n * sizeof(float));
    int id = coord_sample(s, tmp);
    assert_in_range(id, 0, n - 1);
    return id;
}

static void test_argmax(void **state)
{
    const float a[] = {0.5f, -1.0f, 3.0f, 2.0f, 3.0f};
    assert_int_equal(coord_argmax(a, 5), 2); /* tie between 2 and 4: the first */
    assert_int_equal(coord_argmax(a, 2), 0);
    assert_int_equal(coord_argmax(a, 1), 0);
    const float neg[] = {-5.0f, -2.0f, -2.0f, -7.0f};
    assert_int_equal(coord_argmax(neg, 4), 1);
    const float flat[] = {1.0f, 1.0f, 1.0f};
    assert_int_equal(coord_argmax(flat, 3), 0);
    const float inf[] = {1.0f, INFINITY, 2.0f};
    assert_int_equal(coord_argmax(inf, 3), 1);
}

/* temp 0 is argmax whatever top_p and the seed, and leaves the logits alone. */
static void test_greedy(void **state)
{
    const float logits[] = {0.1f, 2.5f, -3.0f, 2.5f, 1.0f, 2.4999f};
    float work[6];
    const float top_ps[] = {1.0f, 0.5f, 0.01f};
    for (int k = 0; k < 3; k++) {
        struct coord_sampler s;
        assert_int_equal(coord_sampler_init(&s, 6, 0.0f, top_ps[k], 1234 + (uint64_t)k), 0);
        for (int rep = 0; rep < 50; rep++) {
            memcpy(work, logits, sizeof(work));
            assert_int_equal(coord_sample(&s, work), 1); /* tie 1 and 3: the first */
            assert_memory_equal(work, logits, sizeof(work));
        }
        coord_sampler_free(&s);
        assert_null(s.scratch);
    }
}

/* Two samplers with the same seed draw the same sequence; another seed draws another one. */
static void test_seed_is_deterministic(void **state)
{
    const float logits[] = {1.0f, 0.8f, 0.6f, 0.4f, 0.2f, 0.0f, -0.2f, -0.4f};
    const float top_ps[] = {1.0f, 0.8f};
    for (int k = 0; k < 2; k++) {
        struct coord_sampler a, b, c;
        assert_int_equal(coord_sampler_init(&a, 8, 0.9f, top_ps[k], 42), 0);
        assert_int_equal(coord_sampler_init(&b, 8, 0.9f, top_ps[k], 42), 0);
        assert_int_equal(coord_sampler_init(&c, 8, 0.9f, top_ps[k], 43), 0);
        int differ = 0;
        for (int i = 0; i < 1000; i++) {
            int x = draw(&a, logits, 8);
            assert_int_equal(x, draw(&b, logits, 8));
            differ += x != draw(&c, logits, 8);
        }
        /* two independent sequences over 8 tokens agree on a draw with probability < 0.2 */
        assert_true(differ > 500);
        coord_sampler_free(&a);
        coord_sampler_free(&b);
        coord_sampler_free(&c);
    }
    /* seed 0 is allowed (replaced by a fixed constant), and is deterministic too */
    struct coord_sampler z1, z2;
    assert_int_equal(coord_sampler_init(&z1, 8, 1.0f, 1.0f, 0), 0);
    assert_int_equal(coord_sampler_init(&z2, 8, 1.0f, 1.0f, 0), 0);
    for (int i = 0; i < 100; i++)
        assert_int_equal(draw(&z1, logits, 8), draw(&z2, logits, 8));
    coord_sampler_free(&z1);
    coord_sampler_free(&z2);
}

/* Empirical frequencies over N_DRAWS = 20000 draws at top_p 1 match softmax(logits / temp).
 *
 * Bound: each count c_i is Binomial(N, p_i), so c_i/N has standard deviation
 * sigma_i = sqrt(p_i (1 - p_i) / N) (at most 0.0035 for N = 20000). We allow 5 sigma_i per token:
 * a correct sampler with an ideal generator exceeds it with probability about 6e-7 per token, and
 * the seed is fixed so the outcome never changes between runs. The generator's 24-bit uniforms
 * bias p_i by at most 2^-24, far below sigma. A wrong cumulative sum (an off-by-one index, a
 * missing normalisation, the temperature applied twice) moves some p_i by 0.03 or more, i.e.
 * past 8 sigma. On top of that, the chi-square statistic over the 5 categories (4 degrees of
 * freedom) must stay under 23.5, its 1e-4 upper quantile. */
static void check_frequencies(float temp, uint64_t seed)
{
    const float logits[5] = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
    double p[5];
    softmax_ref(logits, 5, temp, p);
    struct coord_sampler s;
    assert_int_equal(coord_sampler_init(&s, 5, temp, 1.0f, seed), 0);
    int count[5] = {0};
    for (int i = 0; i < N_DRAWS; i++)
        count[draw(&s, logits, 5)]++;
    coord_sampler_free(&s);
    double chi2 = 0.0;
    for (int i = 0; i < 5; i++) {
        double f = (double)count[i] / N_DRAWS, sigma = sqrt(p[i] * (1.0 - p[i]) / N_DRAWS);
        if (fabs(f - p[i]) > 5.0 * sigma)
            fail_msg("temp %.2f token %d: frequency %.4f, softmax %.4f (5 sigma = %.4f)", temp, i,
                     f, p[i], 5.0 * sigma);
        double e = p[i] * N_DRAWS;
        chi2 += (count[i] - e) * (count[i] - e) / e;
    }
    if (chi2 > 23.5)
        fail_msg("temp %.2f: chi-square %.1f over 4 degrees of freedom", temp, chi2);
}

static void test_temperature_frequencies(void **state)
{
    check_frequencies(1.0f, 7);
    check_frequencies(1.0f, 0xdeadbeef);
    check_frequencies(0.5f, 99); /* sharper: also checks that the temperature is applied once */
    check_frequencies(2.0f, 100);
}

/* Logits whose softmax at temp 1 is @p. */
static void logits_of(const double *p, int n, float *logits)
{
    for (int i = 0; i < n; i++)
        logits[i] = (float)log(p[i]);
}

/* top_p 0.5 on a distribution where one token holds 0.6: that token alone is the nucleus. */
static void test_top_p_single_token(void **state)
{
    const double p[5] = {0.1, 0.1, 0.1, 0.6, 0.1};
    float logits[5];
    logits_of(p, 5, logits);
    struct coord_sampler s;
    assert_int_equal(coord_sampler_init(&s, 5, 1.0f, 0.5f, 3), 0);
    for (int i = 0; i < 5000; i++)
        assert_int_equal(draw(&s, logits, 5), 3);
    coord_sampler_free(&s);
}

/* The nucleus as the sampler defines it (llama2.c): tokens by decreasing probability up to and
 * including the first at which the cumulative mass exceeds @top_p. Marks them in @in. Returns
 * false when a cumulative mass is within 1e-4 of @top_p: float rounding in the sampler may then
 * legitimately put the cut one token either way, so the case is not a fair check. */
static bool nucleus_ref(const double *p, int n, double top_p, bool *in)
{
    int order[256];
    for (int i = 0; i < n; i++)
        order[i] = i;
    for (int i = 1; i < n; i++) /* insertion sort by p descending, stable */
        for (int j = i; j > 0 && p[order[j]] > p[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    memset(in, 0, (size_t)n * sizeof(bool));
    double mass = 0.0;
    for (int i = 0; i < n; i++) {
        if (i + 1 < n && fabs(p[order[i]] - p[order[i + 1]]) < 1e-6 && mass + p[order[i]] > top_p)
            return false; /* a tie at the cut: which of the two is in depends on qsort */
        mass += p[order[i]];
        if (fabs(mass - top_p) < 1e-4)
            return false;
        in[order[i]] = true;
        if (mass > top_p)
            break;
    }
    return true;
}

/* Over random distributions and cut points, every draw is inside the nucleus, and draws reach
 * more than one token of it when it has several (the cut is not plain argmax). */
static void test_top_p_stays_in_nucleus(void **state)
{
    uint64_t rng = 0x1234567;
    int checked = 0;
    for (int round = 0; round < 300; round++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int n = 2 + (int)((rng >> 33) % 60);
        float logits[64];
        for (int i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            logits[i] = (float)((double)(rng >> 11) / 9007199254740992.0 * 8.0 - 4.0);
        }
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        /* top_p in [0.05, 0.95]; below 1/n see test_top_p_below_uniform_mass */
        float top_p = 0.05f + 0.9f * (float)((double)(rng >> 11) / 9007199254740992.0);
        double p[64];
        softmax_ref(logits, n, 1.0, p);
        bool in[64];
        if (!nucleus_ref(p, n, top_p, in))
            continue;
        int size = 0;
        for (int i = 0; i < n; i++)
            size += in[i];
        struct coord_sampler s;
        assert_int_equal(coord_sampler_init(&s, n, 1.0f, top_p, rng | 1), 0);
        bool seen[64] = {false};
        int distinct = 0;
        for (int d = 0; d < 200; d++) {
            int id = draw(&s, logits, n);
            if (!in[id])
                fail_msg("round %d: n %d top_p %.4f drew token %d (p %.5f) outside the %d-token "
                         "nucleus", round, n, top_p, id, p[id], size);
            distinct += !seen[id];
            seen[id] = true;
        }
        coord_sampler_free(&s);
        if (size >= 2)
            assert_true(distinct >= 2);
        checked++;
    }
    assert_true(checked > 200);
}

/* A cut below 1/n on a near-flat distribution: the nucleus is the single most likely token.
 * The pre-filter keeps p >= (1 - top_p) / (n - 1), here 0.317, above every probability, so it
 * keeps none: the sampler then takes the most likely token (it once read scratch[-1] here). The
 * CLI allows --top-p down to 1e-6 and --temp up to 100, which flattens any distribution. */
static void test_top_p_below_uniform_mass(void **state)
{
    const double p[4] = {0.2, 0.3, 0.25, 0.25};
    float logits[4];
    logits_of(p, 4, logits);
    struct coord_sampler s;
    assert_int_equal(coord_sampler_init(&s, 4, 1.0f, 0.05f, 11), 0);
    for (int i = 0; i < 100; i++)
        assert_int_equal(draw(&s, logits, 4), 1);
    coord_sampler_free(&s);
}

/* top_p 1 samples the whole distribution, rare tokens included. */
static void test_top_p_one_keeps_all(void **state)
{
    const double p[4] = {0.97, 0.01, 0.01, 0.01};
    float logits[4];
    logits_of(p, 4, logits);
    struct coord_sampler s;
    assert_int_equal(coord_sampler_init(&s, 4, 1.0f, 1.0f, 5), 0);
    int count[4] = {0};
    for (int i = 0; i < 5000; i++)
        count[draw(&s, logits, 4)]++;
    coord_sampler_free(&s);
    /* expected 50 each; P(Binomial(5000, 0.01) < 20) ~ 1e-6 */
    for (int i = 1; i < 4; i++)
        assert_true(count[i] >= 20);
}

/* Random logits over @n tokens in [-4, 4). */
static void random_logits(uint64_t *rng, float *logits, int n)
{
    for (int i = 0; i < n; i++) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        logits[i] = (float)((double)(*rng >> 11) / 9007199254740992.0 * 8.0 - 4.0);
    }
}

/* Rank of token @id among @p (n): how many are strictly more likely. */
static int rank_of(const double *p, int n, int id)
{
    int r = 0;
    for (int i = 0; i < n; i++)
        r += p[i] > p[id];
    return r;
}

/* top-k draws only among the k most likely, reaches more than one of them, and k = 1 is argmax;
 * with top-p as well, the nucleus is taken within the k (Hugging Face's order). */
static void test_top_k(void **state)
{
    uint64_t rng = 77;
    for (int round = 0; round < 200; round++) {
        int n = 4 + (int)(round % 60), k = 1 + round % (n - 1);
        float logits[64];
        double p[64];
        random_logits(&rng, logits, n);
        softmax_ref(logits, n, 1.0, p);
        struct coord_sampling sp = {
            .temp = 1.0f, .top_p = 1.0f, .top_k = k, .repetition_penalty = 1.0f, .seed = rng | 1};
        struct coord_sampler s;
        assert_int_equal(coord_sampler_init_ex(&s, n, &sp), 0);
        bool seen[64] = {false};
        int distinct = 0;
        for (int d = 0; d < 300; d++) {
            int id = draw(&s, logits, n);
            if (rank_of(p, n, id) >= k)
                fail_msg("n %d top_k %d drew token %d of rank %d", n, k, id, rank_of(p, n, id));
            distinct += !seen[id];
            seen[id] = true;
        }
        if (k == 1)
            assert_int_equal(distinct, 1);
        else
            assert_true(distinct >= 2);
        coord_sampler_free(&s);
    }
    /* top_k 2 then top_p 0.5 on {0.6, 0.3, ...}: the nucleus of the two is token 0 alone */
    const double q[4] = {0.05, 0.6, 0.05, 0.3};
    float logits[4];
    logits_of(q, 4, logits);
    struct coord_sampling sp = {
        .temp = 1.0f, .top_p = 0.5f, .top_k = 2, .repetition_penalty = 1.0f, .seed = 9};
    struct coord_sampler s;
    assert_int_equal(coord_sampler_init_ex(&s, 4, &sp), 0);
    for (int d = 0; d < 500; d++)
        assert_int_equal(draw(&s, logits, 4), 1);
    coord_sampler_free(&s);
}

/* min-p keeps the tokens at least min_p times as likely as the most likely, alone or after the
 * nucleus; the frequencies among them follow their probabilities. */
static void test_min_p(void **state)
{
    const double q[5] = {0.4, 0.3, 0.15, 0.1, 0.05};
    float logits[5];
    logits_of(q, 5, logits);
    for (int with_top_p = 0; with_top_p < 2; with_top_p++) {
        struct coord_sampling sp = {.temp = 1.0f,
                                    .top_p = with_top_p ? 0.95f : 1.0f,
                                    .min_p = 0.3f,
                                    .repetition_penalty = 1.0f,
                                    .seed = 5};
        struct coord_sampler s;
        assert_int_equal(coord_sampler_init_ex(&s, 5, &sp), 0);
        int count[5] = {0};
        for (int d = 0; d < N_DRAWS; d++)
            count[draw(&s, logits, 5)]++;
        coord_sampler_free(&s);
        /* 0.3 * 0.4 = 0.12: tokens 0, 1, 2 stay, in proportion 0.4 : 0.3 : 0.15 */
        assert_int_equal(count[3] + count[4], 0);
        double f0 = (double)count[0] / N_DRAWS, f2 = (double)count[2] / N_DRAWS;
        assert_true(fabs(f0 - 0.4 / 0.85) < 0.02 && fabs(f2 - 0.15 / 0.85) < 0.02);
    }
}

/* Penalties: the repetition penalty divides a seen token's positive logit and multiplies a
 * negative one; frequency and presence penalties count only generated tokens. */
static void test_penalties(void **state)
{
    float logits[4] = {2.0f, 1.9f, -1.0f, -1.2f}, tmp[4];
    struct coord_sampling sp = {.top_p = 1.0f, .repetition_penalty = 1.5f};
    struct coord_sampler s;
    assert_int_equal(coord_sampler_init_ex(&s, 4, &sp), 0);
    memcpy(tmp, logits, sizeof(tmp));
    assert_int_equal(coord_sample(&s, tmp), 0);
    coord_sampler_observe(&s, 0, false); /* in the prompt */
    coord_sampler_observe(&s, 2, false);
    memcpy(tmp, logits, sizeof(tmp));
    assert_int_equal(coord_sample(&s, tmp), 1); /* 2.0 / 1.5 < 1.9 */
    assert_float_equal(tmp[0], 2.0f / 1.5f, 1e-6);
    assert_float_equal(tmp[2], -1.5f, 1e-6);
    coord_sampler_free(&s);

    sp = (struct coord_sampling){.top_p = 1.0f,
                                 .repetition_penalty = 1.0f,
                                 .frequency_penalty = 0.5f,
                                 .presence_penalty = 0.25f};
    assert_int_equal(coord_sampler_init_ex(&s, 4, &sp), 0);
    coord_sampler_observe(&s, 1, false); /* the prompt does not count */
    coord_sampler_observe(&s, 0, true);
    coord_sampler_observe(&s, 0, true);
    memcpy(tmp, logits, sizeof(tmp));
    assert_int_equal(coord_sample(&s, tmp), 1);
    assert_float_equal(tmp[0], 2.0f - 2 * 0.5f - 0.25f, 1e-6);
    assert_float_equal(tmp[1], 1.9f, 1e-6);
    coord_sampler_free(&s);
}

/* Log-probabilities equal a double log-softmax, the top alternatives come most likely first,
 * and asking for none reports the sampled token's alone. */
static void test_logprobs(void **state)
{
    uint64_t rng = 3;
    for (int round = 0; round < 50; round++) {
        int n = 30 + round;
        float logits[256];
        double p[256];
        random_logits(&rng, logits, n);
        softmax_ref(logits, n, 1.0, p);
        struct coord_logprobs lp;
        int id = round % n, want_n = round % (COORD_MAX_LOGPROBS + 1);
        struct coord_sampler s;
        assert_int_equal(coord_sampler_init(&s, n, 1.0f, 1.0f, 1), 0);
        coord_logprobs(&s, logits, id, want_n, &lp);
        coord_sampler_free(&s);
        assert_float_equal(lp.logprob, log(p[id]), 1e-5);
        assert_int_equal(lp.n_top, want_n);
        for (int i = 0; i < lp.n_top; i++) {
            assert_int_equal(rank_of(p, n, lp.top[i].id), i);
            assert_float_equal(lp.top[i].logprob, log(p[lp.top[i].id]), 1e-5);
        }
    }
}

/* The nucleus by quickselect on a large flat-ish vocabulary: every draw is inside the sorted
 * reference's nucleus (ties at the edge excluded from the check, as in nucleus_ref). */
static void test_top_p_large_vocab(void **state)
{
    enum { N = 4096 };
    static float logits[N], tmp[N];
    static double p[N];
    static bool in[N];
    uint64_t rng = 11;
    for (int round = 0; round < 20; round++) {
        random_logits(&rng, logits, N);
        softmax_ref(logits, N, 1.0, p);
        float top_p = 0.1f + 0.04f * (float)round;
        /* the reference: the most likely tokens until the mass passes top_p */
        double mass = 0.0, cut = 0.0;
        int order_done = 0;
        memset(in, 0, sizeof(in));
        while (mass <= top_p && order_done < N) {
            int best = -1;
            for (int i = 0; i < N; i++)
                if (!in[i] && (best < 0 || p[i] > p[best]))
                    best = i;
            in[best] = true;
            mass += p[best];
            cut = p[best];
            order_done++;
        }
        struct coord_sampling sp = {
            .temp = 1.0f, .top_p = top_p, .repetition_penalty = 1.0f, .seed = rng | 1};
        struct coord_sampler s;
        assert_int_equal(coord_sampler_init_ex(&s, N, &sp), 0);
        for (int d = 0; d < 200; d++) {
            memcpy(tmp, logits, sizeof(tmp));
            int id = coord_sample(&s, tmp);
            if (!in[id] && fabs(p[id] - cut) > 1e-9)
                fail_msg("top_p %.2f: token %d (p %.3g) outside the %d-token nucleus", top_p, id,
                         p[id], order_done);
        }
        coord_sampler_free(&s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_seed_is_deterministic),
        cmocka_unit_test(test_temperature_frequencies),
        cmocka_unit_test(test_top_p_single_token),
        cmocka_unit_test(test_top_p_stays_in_nucleus),
        cmocka_unit_test(test_top_p_one_keeps_all),
        cmocka_unit_test(test_top_p_below_uniform_mass),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_top_p_large_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
