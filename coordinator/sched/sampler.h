/* coordinator/sched/sampler.h: next-token sampling: greedy, temperature, nucleus (top-p). */
#ifndef SHARDLM_COORD_SAMPLER_H
#define SHARDLM_COORD_SAMPLER_H

#include <stdint.h>

struct coord_sampler {
    int vocab;
    float temp;  /* 0: greedy */
    float top_p; /* in (0, 1]; 1 disables the nucleus cut */
    uint64_t rng;
    struct coord_prob { float p; int id; } *scratch; /* (vocab) */
};

/* Returns 0 or -ENOMEM. Release with coord_sampler_free(). */
int coord_sampler_init(struct coord_sampler *s, int vocab, float temp, float top_p, uint64_t seed);
void coord_sampler_free(struct coord_sampler *s);
/* Picks the next token from @logits (vocab floats; modified in place when temp > 0). */
int coord_sample(struct coord_sampler *s, float *logits);
int coord_argmax(const float *x, int n);

#endif
