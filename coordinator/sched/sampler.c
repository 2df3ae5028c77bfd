/* SPDX-License-Identifier: MIT */
/* coordinator/sched/sampler.c: sampling. */
#include "sampler.h"

#include "kn.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int coord_sampler_init_ex(struct coord_sampler *s, int vocab, const struct coord_sampling *p)
{
    memset(s, 0, sizeof(*s));
    s->vocab = vocab;
    s->p = *p;
    s->rng = p->seed ? p->seed : 0x9e3779b97f4a7c15ull;
    s->softmax = kn_ops_select(NULL, NULL, 0)->softmax;
    s->scratch = malloc((size_t)vocab * sizeof(*s->scratch));
    bool want_counts = p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
    bool want_seen = p->repetition_penalty != 1.0f && p->repetition_penalty > 0.0f;
    if (want_counts)
        s->counts = calloc((size_t)vocab, sizeof(*s->counts));
    if (want_seen)
        s->seen = calloc((size_t)vocab, 1);
    if (want_counts || want_seen)
        s->seen_ids = malloc((size_t)vocab * sizeof(*s->seen_ids));
    if (!s->scratch || (want_counts && !s->counts) || (want_seen && !s->seen) ||
        ((want_counts || want_seen) && !s->seen_ids)) {
        coord_sampler_free(s);
        return -ENOMEM;
    }
    return 0;
}

int coord_sampler_init(struct coord_sampler *s, int vocab, float temp, float top_p, uint64_t seed)
{
    struct coord_sampling p = {
        .temp = temp, .top_p = top_p, .repetition_penalty = 1.0f, .seed = seed};
    return coord_sampler_init_ex(s, vocab, &p);
}

void coord_sampler_free(struct coord_sampler *s)
{
    free(s->scratch);
    free(s->counts);
    free(s->seen);
    free(s->seen_ids);
    memset(s, 0, sizeof(*s));
}

void coord_sampler_observe(struct coord_sampler *s, int id, bool generated)
{
    if (id < 0 || id >= s->vocab || !s->seen_ids)
        return;
    bool fresh = (!s->seen || !s->seen[id]) && (!s->counts || !s->counts[id]);
    if (s->seen)
        s->seen[id] = 1;
    if (s->counts && generated)
        s->counts[id]++;
    if (fresh && ((s->seen && s->seen[id]) || (s->counts && s->counts[id])))
        s->seen_ids[s->n_seen_ids++] = id;
}

/* The first index of the largest value: the maximum over 8 independent running maxima (no
 * chain of dependent compares through the whole vocabulary), then the first place it occurs. */
int coord_argmax(const float *x, int n)
{
    float m[8];
    int i = 0;
    for (int j = 0; j < 8; j++)
        m[j] = x[0];
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    float mx = m[0];
    for (int j = 1; j < 8; j++)
        mx = m[j] > mx ? m[j] : mx;
    for (; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (i = 0; i < n && !(x[i] == mx); i++)
        ;
    return i < n ? i : 0; /* NaN everywhere: the first */
}

/* xorshift64*, uniform in [0, 1) */
static float uniform(uint64_t *st)
{
    *st ^= *st >> 12;
    *st ^= *st << 25;
    *st ^= *st >> 27;
    return (float)((*st * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

static int by_prob_desc(const void *a, const void *b)
{
    const struct coord_prob *x = a, *y = b;
    return x->p > y->p ? -1 : x->p < y->p ? 1 : x->id - y->id;
}

/* The penalties, over the tokens the sequence holds only. */
static void penalize(const struct coord_sampler *s, float *logits)
{
    const struct coord_sampling *p = &s->p;
    for (int k = 0; k < s->n_seen_ids; k++) {
        int i = s->seen_ids[k];
        if (s->seen && s->seen[i])
            logits[i] = logits[i] > 0.0f ? logits[i] / p->repetition_penalty
                                         : logits[i] * p->repetition_penalty;
        if (s->counts && s->counts[i])
            logits[i] -= (float)s->counts[i] * p->frequency_penalty + p->presence_penalty;
    }
}

/* Sifts the new root of the min-heap @h of @n down (the least probable on top). */
static void sift_down(struct coord_prob *h, int n, int i)
{
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && by_prob_desc(&h[c + 1], &h[c]) > 0)
            c++;
        if (by_prob_desc(&h[c], &h[i]) <= 0)
            return;
        struct coord_prob t = h[c];
        h[c] = h[i];
        h[i] = t;
        i = c;
    }
}

/* The @k most probable of @p (n values) into @out, most probable first: a min-heap of k over
 * one pass, O(n log k). Returns how many (min(k, n)). */
static int top_k(const float *p, int n, int k, struct coord_prob *out)
{
    if (k > n)
        k = n;
    for (int i = 0; i < k; i++)
        out[i] = (struct coord_prob){p[i], i};
    for (int i = k / 2 - 1; i >= 0; i--)
        sift_down(out, k, i);
    for (int i = k; i < n; i++) {
        struct coord_prob c = {p[i], i};
        if (by_prob_desc(&c, &out[0]) < 0) {
            out[0] = c;
            sift_down(out, k, 0);
        }
    }
    qsort(out, (size_t)k, sizeof(*out), by_prob_desc);
    return k;
}

/* Draws from the first @m candidates (weights need not sum to 1). */
static int draw(struct coord_prob *c, int m, float r)
{
    float mass = 0.0f, cdf = 0.0f;
    for (int i = 0; i < m; i++)
        mass += c[i].p;
    float target = r * mass;
    for (int i = 0; i < m; i++) {
        cdf += c[i].p;
        if (target < cdf)
            return c[i].id;
    }
    return c[m - 1].id;
}

/* The nucleus of the @m candidates @c: reorders them so that c[0 .. k) is the smallest set of
 * the most probable whose mass passes @top_p (ties at the edge all in), and returns k - by
 * quickselect over the probabilities, O(m) expected, no sort. */
static int nucleus(struct coord_prob *c, int m, float top_p)
{
    int lo = 0, hi = m; /* c[0, lo) taken (each above everything in [lo, hi)), of mass acc */
    float acc = 0.0f;
    while (hi - lo > 1) {
        float pivot = c[lo + (hi - lo) / 2].p;
        /* three ways: [lo, a) above the pivot, [a, b) equal, [b, hi) below */
        int a = lo, b = lo, i = lo, top = hi;
        while (i < top) {
            struct coord_prob t = c[i];
            if (t.p > pivot) {
                c[i] = c[b];
                c[b] = c[a];
                c[a++] = t;
                b++;
                i++;
            } else if (t.p == pivot) {
                c[i] = c[b];
                c[b++] = t;
                i++;
            } else {
                c[i] = c[--top];
                c[top] = t;
            }
        }
        float above = 0.0f, equal = 0.0f;
        for (int j = lo; j < a; j++)
            above += c[j].p;
        for (int j = a; j < b; j++)
            equal += c[j].p;
        if (acc + above > top_p)
            hi = a; /* the nucleus ends inside the part above */
        else if (acc + above + equal > top_p)
            return b;
        else {
            acc += above + equal;
            lo = b;
        }
    }
    return hi;
}

int coord_sample(struct coord_sampler *s, float *logits)
{
    const struct coord_sampling *p = &s->p;
    int n = s->vocab;
    penalize(s, logits);
    int best = coord_argmax(logits, n);
    if (p->temp <= 0.0f)
        return best;
    float inv_t = 1.0f / p->temp;
    for (int i = 0; i < n; i++)
        logits[i] *= inv_t;
    s->softmax(logits, n); /* the largest stays at best */
    float r = uniform(&s->rng), pmax = logits[best];
    bool cut_p = p->top_p<1.0f, cut_k = p->top_k> 0 && p->top_k<n, cut_min = p->min_p> 0.0f;
    if (!cut_p && !cut_k && !cut_min) {
        float cdf = 0.0f;
        for (int i = 0; i < n; i++) {
            cdf += logits[i];
            if (r < cdf)
                return i;
        }
        return n - 1;
    }
    /* the chain of Hugging Face's warpers after the temperature: top-k, top-p, min-p */
    int m = 0;
    if (cut_k) {
        m = top_k(logits, n, p->top_k, s->scratch); /* most probable first */
        float mass = 0.0f;
        for (int i = 0; cut_p && i < m; i++)
            if ((mass += s->scratch[i].p) > p->top_p) {
                m = i + 1;
                break;
            }
    } else {
        /* candidates: with a nucleus, the tokens of the binary orders of magnitude that reach
         * top_p (one pass sums the mass per float exponent); with min-p, those not below
         * min_p * pmax */
        int e_min = 0;
        if (cut_p) {
            float mass[256] = {0}, acc = 0.0f;
            for (int i = 0; i < n; i++) {
                uint32_t bits;
                memcpy(&bits, &logits[i], 4);
                mass[bits >> 23 & 0xff] += logits[i];
            }
            for (e_min = 255; e_min > 0 && (acc += mass[e_min]) <= p->top_p; e_min--)
                ;
        }
        float floor = cut_min ? p->min_p * pmax : 0.0f;
        for (int i = 0; i < n; i++) {
            uint32_t bits;
            memcpy(&bits, &logits[i], 4);
            if ((int)(bits >> 23 & 0xff) >= e_min && logits[i] >= floor)
                s->scratch[m++] = (struct coord_prob){logits[i], i};
        }
        if (m == 0)
            return best;
        if (cut_p)
            m = nucleus(s->scratch, m, p->top_p);
    }
    if (cut_min) {
        int keep = 0;
        for (int i = 0; i < m; i++)
            if (s->scratch[i].p >= p->min_p * pmax)
                s->scratch[keep++] = s->scratch[i];
        m = keep; /* the most probable token always stays */
    }
    return draw(s->scratch, m, r);
}

void coord_logprobs(struct coord_sampler *s, const float *logits, int id, int n,
                    struct coord_logprobs *out)
{
    /* log p(i) = x_i - lse, lse = log sum e^x: after a softmax of a copy, p of the largest is
     * e^(x_best - lse), never below 1 / vocab, so lse = x_best - log p_best loses nothing */
    int vocab = s->vocab, best = coord_argmax(logits, vocab);
    float *p = (float *)s->scratch; /* vocab floats fit in vocab candidates */
    memcpy(p, logits, (size_t)vocab * sizeof(float));
    s->softmax(p, vocab);
    float lse = logits[best] - logf(p[best]);
    out->logprob = logits[id] - lse;
    n = n < 0 ? 0 : n > COORD_MAX_LOGPROBS ? COORD_MAX_LOGPROBS : n;
    struct coord_prob top[COORD_MAX_LOGPROBS];
    out->n_top = n ? top_k(logits, vocab, n, top) : 0;
    for (int i = 0; i < out->n_top; i++) {
        out->top[i].id = top[i].id;
        out->top[i].logprob = top[i].p - lse;
    }
}
