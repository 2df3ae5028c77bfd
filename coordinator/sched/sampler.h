/* SPDX-License-Identifier: MIT */
/* coordinator/sched/sampler.h: next-token sampling of one sequence: penalties, greedy,
 * temperature, top-k, nucleus (top-p), min-p, and log-probabilities. */
#ifndef SHARDLM_COORD_SAMPLER_H
#define SHARDLM_COORD_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

/* The most alternatives a token's log-probabilities report. */
#define COORD_MAX_LOGPROBS 20

/* What a request asks of the sampler. The neutral value of each field turns it off. */
struct coord_sampling {
    float temp;  /* 0: greedy */
    float top_p; /* in (0, 1]; 1: no nucleus cut */
    int top_k;   /* 0: no cut */
    float min_p; /* in [0, 1): drop tokens below min_p times the most likely's probability */
    /* Hugging Face's repetition penalty over the prompt and the generated tokens (a token seen
     * has its logit divided by it when positive, multiplied when negative): 1 is off; OpenAI's
     * frequency and presence penalties over the generated tokens (logit -= count * frequency +
     * (count > 0) * presence): 0 is off */
    float repetition_penalty, frequency_penalty, presence_penalty;
    uint64_t seed; /* 0: a fixed default */
};

struct coord_prob {
    float p;
    int id;
};

struct coord_sampler {
    int vocab;
    struct coord_sampling p;
    uint64_t rng;
    struct coord_prob *scratch; /* (vocab) candidates */
    int32_t *counts;            /* (vocab) generated tokens seen, when a penalty is on */
    uint8_t *seen;              /* (vocab) prompt or generated, when the repetition penalty is */
    int32_t *seen_ids;          /* the distinct tokens counted or seen, in order (vocab) */
    int n_seen_ids;
    void (*softmax)(float *x, int n); /* the fastest kernel table's */
};

/* One sampled token's log-probability (log-softmax of the model's logits) and the top
 * alternatives, most likely first. */
struct coord_logprobs {
    float logprob;
    int n_top;
    struct {
        int id;
        float logprob;
    } top[COORD_MAX_LOGPROBS];
};

/* Returns 0 or -ENOMEM. Release with coord_sampler_free(). */
int coord_sampler_init_ex(struct coord_sampler *s, int vocab, const struct coord_sampling *p);
/* coord_sampler_init_ex() with only temperature, top-p and seed. */
int coord_sampler_init(struct coord_sampler *s, int vocab, float temp, float top_p, uint64_t seed);
void coord_sampler_free(struct coord_sampler *s);
/* Token @id entered the sequence: from the prompt (@generated false) or sampled. */
void coord_sampler_observe(struct coord_sampler *s, int id, bool generated);
/* Picks the next token from @logits (vocab floats; modified in place unless greedy without
 * penalties). */
int coord_sample(struct coord_sampler *s, float *logits);
/* The log-probability of token @id under @logits (vocab floats, read only; no penalty or
 * temperature) and the @n most likely tokens' (n <= COORD_MAX_LOGPROBS), without a full sort.
 * Uses @s's scratch: call it before coord_sample() or after, not with its candidates in use. */
void coord_logprobs(struct coord_sampler *s, const float *logits, int id, int n,
                    struct coord_logprobs *out);
int coord_argmax(const float *x, int n);

#endif
