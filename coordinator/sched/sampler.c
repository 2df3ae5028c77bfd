/* coordinator/sched/sampler.c: sampling. */
#include "sampler.h"

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
    s->scratch = malloc((size_t)vocab * sizeof(*s->scratch));
    if (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f)
        s->counts = calloc((size_t)vocab, sizeof(*s->counts));
    if (p->repetition_penalty != 1.0f && p->repetition_penalty > 0.0f)
        s->seen = calloc((size_t)vocab, 1);
    bool want_counts = p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
    bool want_seen = p->repetition_penalty != 1.0f && p->repetition_penalty > 0.0f;
    if (!s->scratch || (want_counts && !s->counts) || (want_seen && !s->seen)) {
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
    memset(s, 0, sizeof(*s));
}

void coord_sampler_observe(struct coord_sampler *s, int id, bool generated)
{
    if (id < 0 || id >= s->vocab)
        return;
    if (s->seen)
        s->seen[id] = 1;
    if (s->counts && generated)
        s->counts[id]++;
}

int coord_argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
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

static void penalize(const struct coord_sampler *s, float *logits)
{
    const struct coord_sampling *p = &s->p;
    for (int i = 0; s->seen && i < s->vocab; i++)
        if (s->seen[i])
            logits[i] = logits[i] > 0.0f ? logits[i] / p->repetition_penalty
                                         : logits[i] * p->repetition_penalty;
    for (int i = 0; s->counts && i < s->vocab; i++)
        if (s->counts[i])
            logits[i] -= (float)s->counts[i] * p->frequency_penalty + p->presence_penalty;
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
    float mx = logits[best], sum = 0.0f;
    for (int i = 0; i < n; i++) {
        logits[i] = expf((logits[i] - mx) / p->temp);
        sum += logits[i];
    }
    for (int i = 0; i < n; i++)
        logits[i] /= sum;
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
        /* below (1 - top_p) / (n - 1) a token cannot be in the nucleus; below min_p * pmax it
         * is cut anyway: neither becomes a candidate */
        float floor = cut_p ? (1.0f - p->top_p) / (float)(n > 1 ? n - 1 : 1) : 0.0f;
        floor = cut_min && p->min_p * pmax > floor ? p->min_p * pmax : floor;
        for (int i = 0; i < n; i++)
            if (logits[i] >= floor)
                s->scratch[m++] = (struct coord_prob){logits[i], i};
        if (m == 0) /* top_p below 1/n on a flat distribution: nothing passes, take the top */
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

void coord_logprobs(const float *logits, int vocab, int id, int n, struct coord_logprobs *out)
{
    float mx = logits[coord_argmax(logits, vocab)];
    double sum = 0.0;
    for (int i = 0; i < vocab; i++)
        sum += exp((double)logits[i] - mx);
    float lse = mx + (float)log(sum);
    out->logprob = logits[id] - lse;
    n = n < 0 ? 0 : n > COORD_MAX_LOGPROBS ? COORD_MAX_LOGPROBS : n;
    struct coord_prob top[COORD_MAX_LOGPROBS];
    out->n_top = n ? top_k(logits, vocab, n, top) : 0;
    for (int i = 0; i < out->n_top; i++) {
        out->top[i].id = top[i].id;
        out->top[i].logprob = top[i].p - lse;
    }
}
