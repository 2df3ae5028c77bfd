/* SPDX-License-Identifier: MIT */
/* coordinator/sched: the scheduler and its KV block pool, over a model of the engine.
 *
 * The model engine keeps in each cache position the token and position written there, reads a
 * sequence's whole history back through its block table at every step, and answers with logits
 * whose argmax is a hash of that history. So a table that names a wrong block, a prefix-cache hit
 * on the wrong prefix, a preempted sequence resumed wrong or two sequences writing one block
 * changes the greedy text, or trips the model's own checks: every request's tokens must equal
 * what the same hash gives over the request alone. Thousands of random operations (arrivals
 * sharing prefixes, growth, cancels, a pool small enough to preempt) run with the pool audited
 * after every step (coord_sched_audit: references, free and LRU lists, sharing only of cached
 * full blocks), and at the end the pool is all free.
 *
 * With a window W (a model windowed on every layer) the model engine reads back only the positions
 * the window of the chunk's first token covers, and hashes only the last W tokens: a block the
 * scheduler gave back and another sequence took shows up as a wrong read, one read after it was
 * given back as an entry outside the pool. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler.h"
#include "testutil.h"

enum { VOCAB = 64, CTX = 256, BOS = 0, EOS = 1, MAXS = 64 };

struct cell {
    int32_t token, pos; /* -1: never written */
};

struct fake {
    uint32_t n_blocks;
    struct cell (*kv)[COORD_KV_BLOCK];
    float logits[MAXS][VOCAB];
    int steps, fail_at; /* fail_at: the step that returns an error (0: none) */
    uint64_t max_batch;
    uint32_t window; /* every layer's window (0: none) */
};

/* The next token after @n tokens of @t: a hash of the history (its last @window tokens when
 * there is a window); EOS now and then. */
static int next_of(const int32_t *t, int n, uint32_t window)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = window && (uint32_t)n > window ? n - (int)window : 0; i < n; i++)
        h = (h ^ (uint64_t)(t[i] * 131 + i)) * 1099511628211ull;
    return (int)((h >> 20) % (VOCAB - 1)) + 1; /* 1..VOCAB-1: EOS (1) about one time in 63 */
}

static int fake_step(void *ctx, struct coord_seq_step *seqs, int n, struct shardlm_err *e)
{
    struct fake *f = ctx;
    if (++f->steps == f->fail_at)
        return shardlm_fail(e, -ECHILD, "model engine: worker died");
    f->max_batch = (uint64_t)n > f->max_batch ? (uint64_t)n : f->max_batch;
    int32_t hist[CTX];
    for (int i = 0; i < n; i++) {
        struct coord_seq_step *s = &seqs[i];
        assert_true(s->n_tokens >= 1 && s->pos + s->n_tokens <= CTX);
        for (int j = 0; j < i; j++)
            assert_true(seqs[j].seq_id != s->seq_id);
        /* every earlier position in the window of the first token reads back what was written
         * there (with a window, the positions before are never read) */
        uint32_t p0 = f->window && s->pos + 1 > f->window ? s->pos + 1 - f->window : 0;
        for (uint32_t p = p0; p < s->pos; p++) {
            uint32_t b = s->blocks[p / COORD_KV_BLOCK];
            assert_true(b < f->n_blocks);
            struct cell c = f->kv[b][p % COORD_KV_BLOCK];
            if (c.pos != (int32_t)p)
                fail_msg("position %u of sequence %u reads block %u holding position %d", p,
                         s->seq_id, b, c.pos);
            hist[p] = c.token;
        }
        for (uint32_t p = s->pos; p < s->pos + s->n_tokens; p++)
            hist[p] = s->tokens[p - s->pos];
        int next = next_of(hist, (int)(s->pos + s->n_tokens), f->window);
        for (int v = 0; v < VOCAB; v++)
            f->logits[i][v] = v == next ? 5.0f : 0.0f;
        s->logits = f->logits[i];
    }
    /* writes after all reads: a block written by one sequence and read by another in the same
     * step would show up as a wrong read in a later step (and the engine forbids it) */
    for (int i = 0; i < n; i++) {
        struct coord_seq_step *s = &seqs[i];
        for (int j = 0; j < i; j++)
            for (uint32_t p = s->pos; p < s->pos + s->n_tokens; p++)
                for (uint32_t r = seqs[j].pos; r < seqs[j].pos + seqs[j].n_tokens; r++)
                    assert_false(s->blocks[p / COORD_KV_BLOCK] ==
                                 seqs[j].blocks[r / COORD_KV_BLOCK]);
        for (uint32_t p = s->pos; p < s->pos + s->n_tokens; p++)
            f->kv[s->blocks[p / COORD_KV_BLOCK]][p % COORD_KV_BLOCK] =
                (struct cell){s->tokens[p - s->pos], (int32_t)p};
    }
    return 0;
}

/* What the test knows of one request. */
struct req {
    uint64_t id;
    int32_t tokens[CTX + 1];
    int n_prompt, max_new, got;
    int32_t out[CTX + 1];
    enum coord_finish finish;
    int events, cached;
    bool cancelled;
    bool engine_failed; /* its last event said so */
    bool ignore_eos;
    uint32_t window; /* the model's (next_of) */
};

static void on_event(void *ctx, const struct coord_event *ev)
{
    struct req *r = ctx;
    assert_int_equal(r->finish, COORD_FINISH_NONE); /* nothing after the last event */
    r->events++;
    if (ev->token >= 0)
        r->out[r->got++] = ev->token;
    r->finish = ev->finish;
    r->cached = ev->cached_tokens;
    r->engine_failed = ev->engine_failed;
    assert_true(!ev->engine_failed || ev->finish == COORD_FINISH_ERROR);
    assert_int_equal(ev->completion_tokens, r->got);
}

/* The greedy continuation of @r alone: the tokens it must have produced (a prefix of them when
 * cancelled). Returns how many, and whether it ends with a stop token in *@stop. */
static int expected(const struct req *r, int32_t *want, bool *stop)
{
    int32_t t[CTX + 1];
    memcpy(t, r->tokens, (size_t)r->n_prompt * sizeof(int32_t));
    int len = r->n_prompt, n = 0;
    *stop = false;
    while (n < r->max_new) {
        int tok = next_of(t, len, r->window);
        want[n++] = tok;
        if ((tok == EOS || tok == BOS) && !r->ignore_eos) {
            *stop = true;
            break;
        }
        t[len++] = tok;
        if (len > CTX)
            break;
    }
    return n;
}

static void check_done(const struct req *r)
{
    int32_t want[CTX + 1];
    bool stop;
    int n = expected(r, want, &stop);
    if (r->cancelled && r->finish == COORD_FINISH_CANCELLED) {
        assert_true(r->got <= n);
    } else {
        if (r->got != n)
            fail_msg("request %llu: %d tokens, %d expected", (unsigned long long)r->id, r->got, n);
        assert_int_equal(r->finish, stop ? COORD_FINISH_STOP : COORD_FINISH_LENGTH);
    }
    for (int i = 0; i < r->got; i++)
        if (r->out[i] != want[i])
            fail_msg("request %llu: token %d is %d, %d alone", (unsigned long long)r->id, i,
                     r->out[i], want[i]);
}

static void audit(struct coord_sched *s)
{
    struct shardlm_err e = {{0}};
    if (coord_sched_audit(s, &e))
        fail_msg("audit: %s", e.msg);
}

static struct fake *fake_new(uint32_t n_blocks)
{
    struct fake *f = calloc(1, sizeof(*f));
    f->n_blocks = n_blocks;
    f->kv = malloc(n_blocks * sizeof(*f->kv));
    for (uint32_t b = 0; b < n_blocks; b++)
        for (int i = 0; i < COORD_KV_BLOCK; i++)
            f->kv[b][i] = (struct cell){-1, -1};
    return f;
}

static void fake_free(struct fake *f)
{
    free(f->kv);
    free(f);
}

/* A scheduler over @f that gives blocks back before @window (0: keeps them, as before it did). */
static struct coord_sched *start_w(struct fake *f, uint32_t max_seqs, uint32_t step_tokens,
                                   bool prefix_cache, uint32_t window)
{
    struct coord_sched_backend b = {fake_step, f, VOCAB, CTX, f->n_blocks, MAXS, BOS, EOS, window};
    struct coord_sched_opts o = {max_seqs, step_tokens, !prefix_cache};
    struct coord_sched *s;
    struct shardlm_err e = {{0}};
    if (coord_sched_init_backend(&s, &b, NULL, &o, &e))
        fail_msg("init: %s", e.msg);
    return s;
}

static struct coord_sched *start(struct fake *f, uint32_t max_seqs, uint32_t step_tokens,
                                 bool prefix_cache)
{
    return start_w(f, max_seqs, step_tokens, prefix_cache, f->window);
}

/* A prompt: a prefix of one of three shared texts (so prefixes repeat) and a tail of its own. */
static int make_prompt(int32_t *t, uint64_t *rng)
{
    static int32_t shared[3][96];
    static bool made;
    if (!made) {
        uint64_t x = 99;
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < 96; i++)
                shared[k][i] =
                    (int32_t)(((x = x * 6364136223846793005ull + 1) >> 33) % (VOCAB - 2)) + 2;
        made = true;
    }
    int k = (int)(tu_rand(rng) % 3), pre = (int)(tu_rand(rng) % 97),
        tail = 1 + (int)(tu_rand(rng) % 24);
    memcpy(t, shared[k], (size_t)pre * sizeof(int32_t));
    for (int i = 0; i < tail; i++)
        t[pre + i] = (int32_t)(tu_rand(rng) % (VOCAB - 2)) + 2;
    return pre + tail;
}

/* Random arrivals, cancels and steps over a pool that forces preemption. */
static void random_run(uint64_t seed, uint32_t n_blocks, uint32_t max_seqs, uint32_t step_tokens,
                       bool prefix_cache, int ops, bool verbose, uint32_t window)
{
    struct fake *f = fake_new(n_blocks);
    f->window = window;
    struct coord_sched *s = start(f, max_seqs, step_tokens, prefix_cache);
    enum { MAXR = 4096 };
    struct req *reqs = calloc(MAXR, sizeof(*reqs));
    int n_reqs = 0;
    uint64_t rng = seed;
    struct shardlm_err e = {{0}};
    for (int op = 0; op < ops; op++) {
        uint64_t roll = tu_rand(&rng) % 100;
        if (roll < 30 && n_reqs < MAXR) {
            struct req *r = &reqs[n_reqs];
            r->n_prompt = make_prompt(r->tokens, &rng);
            r->max_new = 1 + (int)(tu_rand(&rng) % 48);
            r->window = window;
            struct coord_request q = {.prompt = r->tokens,
                                      .n_prompt = r->n_prompt,
                                      .max_tokens = r->max_new,
                                      .sampling = {.top_p = 1.0f, .repetition_penalty = 1.0f},
                                      .logprobs = -1,
                                      .on_event = on_event,
                                      .ctx = r};
            if (coord_sched_submit(s, &q, &r->id, &e))
                fail_msg("submit: %s", e.msg);
            n_reqs++;
        } else if (roll < 33 && n_reqs) {
            struct req *r = &reqs[tu_rand(&rng) % (uint64_t)n_reqs];
            if (r->finish == COORD_FINISH_NONE) {
                r->cancelled = true;
                coord_sched_cancel(s, r->id);
            }
        } else {
            if (coord_sched_step(s, &e))
                fail_msg("step: %s", e.msg);
            audit(s);
        }
    }
    if (coord_sched_run(s, &e))
        fail_msg("run: %s", e.msg);
    audit(s);
    struct coord_sched_stats st;
    coord_sched_stats(s, &st);
    const struct coord_kvpool *p = coord_sched_pool(s);
    assert_int_equal(p->n_held, 0); /* all free or cached: nothing lost */
    assert_int_equal(p->n_free + p->n_lru, n_blocks);
    int cached = 0;
    for (int i = 0; i < n_reqs; i++) {
        assert_int_not_equal(reqs[i].finish, COORD_FINISH_NONE);
        check_done(&reqs[i]);
        cached += reqs[i].cached > 0;
    }
    if (verbose)
        fprintf(stderr,
                "seed %llu, window %u: %d requests, %llu steps (largest %llu sequences), %llu "
                "preemptions, "
                "%llu evictions, %d requests started from the prefix cache (%llu of %llu prompt "
                "tokens)\n",
                (unsigned long long)seed, window, n_reqs, (unsigned long long)st.steps,
                (unsigned long long)f->max_batch, (unsigned long long)st.preemptions,
                (unsigned long long)st.evictions, cached, (unsigned long long)st.cached_tokens,
                (unsigned long long)st.prompt_tokens);
    if (prefix_cache && n_blocks >= 64)
        assert_true(cached > 0);
    if (!prefix_cache)
        assert_int_equal(st.cached_tokens, 0);
    if (n_blocks <= 24 && max_seqs >= 6 && !window) /* six sequences of up to 11 blocks in 24 */
        assert_true(st.preemptions > 0);
    coord_sched_free(s);
    fake_free(f);
    free(reqs);
}

/* Thousands of operations per run, pools from tight (preemptions) to roomy (cache hits). */
static void test_random_operations(void **state)
{
    (void)state;
    uint64_t seed = tu_seed("sched");
    random_run(seed, 24, 6, 48, true, 4000, true, 0);
    random_run(seed + 1, 40, 8, 64, true, 4000, true, 0);
    random_run(seed + 2, 200, 16, 96, true, 4000, true, 0);
    random_run(seed + 3, 200, 16, 96, false, 2000, true, 0);
    random_run(seed + 4, 17, 2, 16, true, 3000, true, 0); /* one request alone nearly fills it */
    /* windowed on every layer: blocks go back as sequences advance, amid preemptions, prefix
     * hits on blocks others hold or gave back, and cancels (a window of whole blocks, and not) */
    random_run(seed + 5, 24, 6, 48, true, 4000, true, 32);
    random_run(seed + 6, 12, 4, 16, true, 4000, true, 20);
    random_run(seed + 7, 40, 8, 64, false, 2000, true, 45);
}

/* The pool alone: LRU order of eviction, lookup of a cached block, release to the LRU list. */
static void test_pool_lru(void **state)
{
    (void)state;
    struct coord_kvpool p;
    assert_int_equal(coord_kvpool_init(&p, 3, true), 0);
    int32_t t[3][COORD_KV_BLOCK];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < COORD_KV_BLOCK; i++)
            t[k][i] = k * 100 + i;
    uint32_t b[3];
    uint64_t h[3];
    for (int k = 0; k < 3; k++) {
        b[k] = coord_kvpool_alloc(&p);
        assert_int_equal(b[k], (uint32_t)k); /* a fresh pool hands out blocks in order */
        h[k] = coord_kvpool_hash(k ? h[k - 1] : 0, t[k]);
        coord_kvpool_publish(&p, b[k], h[k], k ? h[k - 1] : 0, t[k]);
    }
    assert_int_equal(coord_kvpool_alloc(&p), KVPOOL_NONE); /* all held */
    coord_kvpool_release(&p, b[1]);
    coord_kvpool_release(&p, b[0]);
    coord_kvpool_release(&p, b[2]);
    assert_int_equal(coord_kvpool_available(&p), 3);
    /* a lookup takes block 0 back off the LRU list; a wrong parent finds nothing */
    assert_int_equal(coord_kvpool_lookup(&p, h[0], 0, t[0]), b[0]);
    assert_int_equal(coord_kvpool_lookup(&p, h[1], 12345, t[1]), KVPOOL_NONE);
    /* eviction takes the least recently released: block 1, then 2 */
    assert_int_equal(coord_kvpool_alloc(&p), b[1]);
    assert_int_equal(coord_kvpool_find(&p, h[1], h[0], t[1]), KVPOOL_NONE);
    assert_int_equal(coord_kvpool_alloc(&p), b[2]);
    assert_int_equal(p.evictions, 2);
    coord_kvpool_free(&p);
}

/* Submissions that cannot be served are refused, one line each, the callback never called. */
static void test_refused_requests(void **state)
{
    (void)state;
    struct fake *f = fake_new(8); /* 128 positions */
    struct coord_sched *s = start(f, 4, 64, true);
    int32_t t[CTX + 2] = {0};
    struct req r = {0};
    struct shardlm_err e = {{0}};
    uint64_t id;
    struct coord_request q = {.prompt = t,
                              .n_prompt = 10,
                              .max_tokens = 4,
                              .sampling = {.top_p = 1.0f, .repetition_penalty = 1.0f},
                              .logprobs = -1,
                              .on_event = on_event,
                              .ctx = &r};
    q.n_prompt = CTX + 1;
    assert_int_equal(coord_sched_submit(s, &q, &id, &e), -E2BIG);
    assert_non_null(strstr(e.msg, "longer than the context"));
    q.n_prompt = 100;
    q.max_tokens = 100; /* 199 positions: 13 blocks, the pool has 8 */
    assert_int_equal(coord_sched_submit(s, &q, &id, &e), -E2BIG);
    assert_non_null(strstr(e.msg, "KV blocks"));
    q.max_tokens = CTX; /* past the context */
    assert_int_equal(coord_sched_submit(s, &q, &id, &e), -E2BIG);
    q.max_tokens = 4;
    q.n_prompt = 0;
    assert_int_equal(coord_sched_submit(s, &q, &id, &e), -EINVAL);
    q.n_prompt = 10;
    /* a grammar needs the tokenizer's texts: a scheduler without one refuses it */
    struct gr_grammar *g;
    assert_int_equal(gr_compile_regex("a+", 2, NULL, &g, &e), 0);
    q.grammar = g;
    assert_int_equal(coord_sched_submit(s, &q, &id, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "grammar needs a tokenizer"));
    q.grammar = NULL;
    gr_grammar_free(g);
    t[3] = VOCAB;
    assert_int_equal(coord_sched_submit(s, &q, &id, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "vocabulary"));
    t[3] = 0;
    q.sampling.top_p = 0.0f;
    assert_int_equal(coord_sched_submit(s, &q, &id, &e), -EINVAL);
    q.sampling.top_p = 1.0f;
    q.sampling.temp = -1.0f;
    assert_int_equal(coord_sched_submit(s, &q, &id, &e), -EINVAL);
    q.sampling.temp = 0.0f;
    const char *stop[] = {"x"};
    q.stop = stop;
    q.n_stop = 1; /* no tokenizer here */
    assert_int_equal(coord_sched_submit(s, &q, &id, &e), -EINVAL);
    q.n_stop = 0;
    q.logprobs = COORD_MAX_LOGPROBS + 1;
    assert_int_equal(coord_sched_submit(s, &q, &id, &e), -EINVAL);
    assert_int_equal(r.events, 0);
    assert_true(coord_sched_idle(s));
    /* --step-tokens below --max-seqs */
    struct coord_sched_backend b = {fake_step, f, VOCAB, CTX, f->n_blocks, MAXS, BOS, EOS, 0};
    struct coord_sched_opts o = {8, 4, false};
    struct coord_sched *bad;
    assert_int_equal(coord_sched_init_backend(&bad, &b, NULL, &o, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "--step-tokens 4 is below --max-seqs 8"));
    /* a pool smaller than one block per running sequence */
    o = (struct coord_sched_opts){16, 64, false};
    b.max_seqs = 16;
    assert_int_equal(coord_sched_init_backend(&bad, &b, NULL, &o, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "cannot give each of 16 sequences one"));
    /* max_tokens 0 (a request without one) where the pool holds less than the context: accepted,
     * it runs to the end of the pool (100 + 29 - 1 positions: 8 blocks), not refused */
    for (int i = 0; i < 100; i++)
        t[i] = 2 + i % (VOCAB - 2);
    q.n_prompt = 100;
    q.max_tokens = 0;
    q.logprobs = -1;
    assert_int_equal(coord_sched_submit(s, &q, &id, &e), 0);
    r.id = id;
    memcpy(r.tokens, t, 100 * sizeof(int32_t));
    r.n_prompt = 100;
    r.max_new = 29;
    for (int i = 0; i < 200 && !coord_sched_idle(s); i++)
        assert_int_equal(coord_sched_step(s, &e), 0);
    assert_true(coord_sched_idle(s));
    check_done(&r); /* the tokens alone would give, to EOS or 29 of them */
    coord_sched_free(s);
    fake_free(f);
}

/* An engine error ends every open request, running or waiting, with COORD_FINISH_ERROR, the
 * reason and engine_failed (what tells the server its engine is lost). */
static void test_engine_error(void **state)
{
    (void)state;
    struct fake *f = fake_new(64);
    f->fail_at = 3;
    struct coord_sched *s = start(f, 2, 64, true); /* two run, one waits */
    struct req r[3] = {{0}};
    struct shardlm_err e = {{0}};
    for (int i = 0; i < 3; i++) {
        r[i].n_prompt = 5 + i;
        for (int k = 0; k < r[i].n_prompt; k++)
            r[i].tokens[k] = 2 + k;
        struct coord_request q = {.prompt = r[i].tokens,
                                  .n_prompt = r[i].n_prompt,
                                  .max_tokens = 30,
                                  .sampling = {.top_p = 1.0f, .repetition_penalty = 1.0f},
                                  .logprobs = -1,
                                  .on_event = on_event,
                                  .ctx = &r[i]};
        assert_int_equal(coord_sched_submit(s, &q, &r[i].id, &e), 0);
    }
    assert_int_equal(coord_sched_run(s, &e), -ECHILD);
    assert_non_null(strstr(e.msg, "worker died"));
    for (int i = 0; i < 3; i++) {
        assert_int_equal(r[i].finish, COORD_FINISH_ERROR);
        assert_true(r[i].engine_failed);
    }
    assert_true(coord_sched_idle(s));
    assert_int_equal(coord_sched_pool(s)->n_held, 0);
    coord_sched_free(s);
    fake_free(f);
}

/* Submits @r (its tokens, n_prompt, max_new, window set) without stopping at EOS. */
static void submit_long(struct coord_sched *s, struct req *r)
{
    struct shardlm_err e = {{0}};
    r->ignore_eos = true;
    struct coord_request q = {.prompt = r->tokens,
                              .n_prompt = r->n_prompt,
                              .max_tokens = r->max_new,
                              .sampling = {.top_p = 1.0f, .repetition_penalty = 1.0f},
                              .ignore_eos = true,
                              .logprobs = -1,
                              .on_event = on_event,
                              .ctx = r};
    if (coord_sched_submit(s, &q, &r->id, &e))
        fail_msg("submit: %s", e.msg);
}

/* Steps @s to the end, audited, the blocks held never above @most; the stats after. */
static void run_bounded(struct coord_sched *s, uint32_t most, struct coord_sched_stats *st)
{
    struct shardlm_err e = {{0}};
    for (int i = 0; i < 10000 && !coord_sched_idle(s); i++) {
        if (coord_sched_step(s, &e))
            fail_msg("step: %s", e.msg);
        audit(s);
        if (coord_sched_pool(s)->n_held > most)
            fail_msg("step %d: %u blocks held, at most %u", i, coord_sched_pool(s)->n_held, most);
    }
    assert_true(coord_sched_idle(s));
    coord_sched_stats(s, st);
    assert_true(st->blocks_peak <= most);
}

/* A model windowed on every layer (W = 32, chunks of 32: a sequence holds at most
 * ceil((32 + 32 - 1) / 16) + 1 = 5 blocks): a sequence of 239 positions (15 blocks) runs in a
 * pool of 8, its tokens those of a pool that keeps every block (64, nothing given back); four of
 * them run side by side in 20 blocks without a preemption, where keeping their blocks took 60. */
static void test_window_long_sequences(void **state)
{
    (void)state;
    enum { W = 32, STEP = 32, LIVE = 5 };
    static struct req proto, keep, tight, four[4];
    struct coord_sched_stats st;
    for (int i = 0; i < 40; i++)
        proto.tokens[i] = 2 + (i * 7) % (VOCAB - 2);
    proto.n_prompt = 40;
    proto.max_new = 200;
    proto.window = W;
    keep = tight = proto;

    struct fake *f = fake_new(64);
    f->window = W;
    struct coord_sched *s = start_w(f, 4, STEP, true, 0); /* today's: every block kept */
    submit_long(s, &keep);
    run_bounded(s, 64, &st);
    assert_int_equal(st.blocks_peak, 15);
    assert_int_equal(st.blocks_dropped, 0);
    check_done(&keep);
    assert_int_equal(keep.got, 200);
    coord_sched_free(s);
    fake_free(f);

    f = fake_new(4); /* fewer than a window and a chunk need */
    f->window = W;
    s = start(f, 4, STEP, true);
    struct coord_request big = {.prompt = tight.tokens,
                                .n_prompt = 40,
                                .max_tokens = 200,
                                .sampling = {.top_p = 1.0f, .repetition_penalty = 1.0f},
                                .logprobs = -1};
    uint64_t id;
    struct shardlm_err e = {{0}};
    assert_int_equal(coord_sched_submit(s, &big, &id, &e), -E2BIG);
    assert_non_null(strstr(e.msg, "needs 5 KV blocks (a window of 32 positions and a chunk of 32)"));
    big.max_tokens = 25; /* 64 positions: 4 blocks */
    assert_int_equal(coord_sched_submit(s, &big, &id, &e), 0);
    coord_sched_free(s);
    fake_free(f);

    f = fake_new(8); /* 128 positions for a sequence of 239 */
    f->window = W;
    s = start(f, 4, STEP, true);
    submit_long(s, &tight);
    run_bounded(s, LIVE, &st);
    check_done(&tight);
    assert_int_equal(tight.got, keep.got);
    assert_memory_equal(tight.out, keep.out, sizeof(keep.out[0]) * (size_t)keep.got);
    assert_int_equal(st.blocks_dropped, 15 - 2); /* the two last stay to its end */
    /* without max_tokens: to the end of the context (217 new tokens), the pool no limit */
    static struct req open_ended;
    open_ended = proto;
    open_ended.max_new = 0;
    submit_long(s, &open_ended);
    run_bounded(s, LIVE, &st);
    assert_int_equal(open_ended.got, CTX - 40 + 1);
    assert_int_equal(open_ended.finish, COORD_FINISH_LENGTH);
    open_ended.max_new = CTX - 40 + 1;
    check_done(&open_ended);
    coord_sched_free(s);
    fake_free(f);

    f = fake_new(4 * LIVE);
    f->window = W;
    s = start(f, 4, STEP, true);
    for (int k = 0; k < 4; k++) {
        four[k] = proto;
        four[k].tokens[0] = 2 + k; /* their own prompts: no prefix in common */
        submit_long(s, &four[k]);
    }
    run_bounded(s, 4 * LIVE, &st);
    for (int k = 0; k < 4; k++)
        check_done(&four[k]);
    assert_int_equal(st.preemptions, 0);
    assert_int_equal(f->max_batch, 4);
    coord_sched_free(s);
    fake_free(f);
}

/* A block one sequence gives back before its window stays with another that shares it (mapped
 * from the prefix cache): B starts on A's 64-token prompt while A still holds the prompt's last
 * blocks; each gives them back in its own time, and both read their windows right to the end. */
static void test_window_shared_prefix(void **state)
{
    (void)state;
    enum { W = 32, STEP = 32 };
    static struct req a, b;
    struct shardlm_err e = {{0}};
    struct fake *f = fake_new(16);
    f->window = W;
    struct coord_sched *s = start(f, 2, STEP, true);
    for (int i = 0; i < 64; i++)
        a.tokens[i] = 2 + (i * 5) % (VOCAB - 2);
    a.n_prompt = 64;
    a.max_new = 100;
    a.window = W;
    b = a;
    for (int i = 64; i < 72; i++)
        b.tokens[i] = 2 + i % 9;
    b.n_prompt = 72;
    b.max_new = 60;
    submit_long(s, &a);
    for (int i = 0; i < 6; i++) { /* two chunks of the prompt, then four decodes: A at 68 */
        assert_int_equal(coord_sched_step(s, &e), 0);
        audit(s);
    }
    submit_long(s, &b);
    uint32_t shared = 0;
    for (int i = 0; i < 1000 && !coord_sched_idle(s); i++) {
        assert_int_equal(coord_sched_step(s, &e), 0);
        audit(s);
        const struct coord_kvpool *p = coord_sched_pool(s);
        for (uint32_t k = 0; k < p->n_blocks; k++)
            shared += p->ref[k] > 1;
    }
    assert_true(coord_sched_idle(s));
    assert_int_equal(b.cached, 64); /* B found the whole prompt of A */
    assert_true(shared > 0);        /* and held some of it with A */
    check_done(&a);
    check_done(&b);
    coord_sched_free(s);
    fake_free(f);
}

/* Which models give blocks back: every layer windowed, by pattern too when the model has fewer
 * layers than the pattern's period; never with a global layer (Gemma 2/3) or a window as long as
 * the context. */
static void test_kv_window(void **state)
{
    (void)state;
    struct shlm_config c = {.n_layers = 26, .seq_len = 8192};
    struct shlm_config_ext x = {.window = 512, .window_pattern = 6}; /* gemma3-1b */
    assert_int_equal(shlm_kv_window(&c, &x), 0);
    x.window_pattern = 2; /* Gemma 2 */
    assert_int_equal(shlm_kv_window(&c, &x), 0);
    c.n_layers = 5;
    x.window_pattern = 6;
    assert_int_equal(shlm_kv_window(&c, &x), 512);
    c.n_layers = 26;
    x.window_pattern = 0; /* Mistral, Phi-3 */
    assert_int_equal(shlm_kv_window(&c, &x), 512);
    x.window = 8192;
    assert_int_equal(shlm_kv_window(&c, &x), 0);
    x.window = 0;
    assert_int_equal(shlm_kv_window(&c, &x), 0);
    assert_int_equal(seg_kv_dead_blocks(32, 31), 0);
    assert_int_equal(seg_kv_dead_blocks(32, 47), 1); /* reads 16.. on */
    assert_int_equal(seg_kv_dead_blocks(32, 46), 0);
    assert_int_equal(seg_kv_dead_blocks(0, 1000), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_lru),
        cmocka_unit_test(test_refused_requests),
        cmocka_unit_test(test_engine_error),
        cmocka_unit_test(test_random_operations),
        cmocka_unit_test(test_window_long_sequences),
        cmocka_unit_test(test_window_shared_prefix),
        cmocka_unit_test(test_kv_window),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
