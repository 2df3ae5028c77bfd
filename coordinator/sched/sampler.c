/* coordinator/sched/sampler.c: sampling. */
#include "sampler.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int coord_sampler_init(struct coord_sampler *s, int vocab, float temp, float top_p, uint64_t seed)
{
    memset(s, 0, sizeof(*s));
    s->vocab = vocab;
    s->temp = temp;
    s->top_p = top_p;
    s->rng = seed ? seed : 0x9e3779b97f4a7c15ull;
    s->scratch = malloc((size_t)vocab * sizeof(*s->scratch));
    return s->scratch ? 0 : -ENOMEM;
}

void coord_sampler_free(struct coord_sampler *s)
{
    free(s->scratch);
    memset(s, 0, sizeof(*s));
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
    float pa = ((const struct coord_prob *)a)->p, pb = ((const struct coord_prob *)b)->p;
    return pa > pb ? -1 : pa < pb;
}

int coord_sample(struct coord_sampler *s, float *logits)
{
    int n = s->vocab;
    if (s->temp <= 0.0f)
        return coord_argmax(logits, n);
    float mx = logits[coord_argmax(logits, n)], sum = 0.0f;
    for (int i = 0; i < n; i++) {
        logits[i] = expf((logits[i] - mx) / s->temp);
        sum += logits[i];
    }
    for (int i = 0; i < n; i++)
        logits[i] /= sum;
    float r = uniform(&s->rng);
    if (s->top_p >= 1.0f) {
        float cdf = 0.0f;
        for (int i = 0; i < n; i++) {
            cdf += logits[i];
            if (r < cdf)
                return i;
        }
        return n - 1;
    }
    /* nucleus: the smallest set of most likely tokens whose mass reaches top_p; tokens below
     * (1 - top_p) / (n - 1) cannot be in it and are dropped before sorting */
    float cutoff = (1.0f - s->top_p) / (float)(n > 1 ? n - 1 : 1);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] >= cutoff)
            s->scratch[m++] = (struct coord_prob){logits[i], i};
    if (m == 0) /* top_p below 1/n on a flat distribution: nothing passes, take the top */
        return coord_argmax(logits, n);
    qsort(s->scratch, (size_t)m, sizeof(*s->scratch), by_prob_desc);
    float mass = 0.0f;
    int last = m - 1;
    for (int i = 0; i < m; i++) {
        mass += s->scratch[i].p;
        if (mass > s->top_p) {
            last = i;
            break;
        }
    }
    float target = r * mass, cdf = 0.0f;
    for (int i = 0; i <= last; i++) {
        cdf += s->scratch[i].p;
        if (target < cdf)
            return s->scratch[i].id;
    }
    return s->scratch[last].id;
}
