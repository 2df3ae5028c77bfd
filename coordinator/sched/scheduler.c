/* SPDX-License-Identifier: MIT */
/* coordinator/sched/scheduler.c: continuous batching over the paged KV cache. */
#include "scheduler.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STOP_LEN 256 /* bytes of one stop string */
#define MAX_STOPS 16

enum seq_state { SEQ_WAITING, SEQ_RUNNING };

struct seq {
    uint64_t id, arrival, started; /* started: admission order (preemption takes the latest) */
    enum seq_state state;
    uint32_t slot;   /* its label in steps while running (< max_seqs) */
    int32_t *tokens; /* prompt then generated, context + 1 at most */
    int len, n_prompt, n_gen, max_new;
    int computed;     /* positions whose KV is in its blocks */
    uint32_t *table;  /* blocks held, in position order; [0, n_dead) given back (SEG_KV_NONE) */
    uint64_t *hashes; /* chained hashes of its full blocks, [0, n_hashed) */
    int n_blocks, n_hashed;
    int n_dead;        /* leading blocks no layer reads again, given back (drop_dead) */
    int cached_tokens; /* prompt tokens the prefix cache had at its first start */
    bool looked_up, cancelled;
    struct coord_sampler smp;
    int32_t *stop_ids;
    int n_stop_ids;
    char **stop;
    int n_stop;
    bool ignore_eos;
    int logprobs;
    coord_event_fn on_event;
    void *ctx;
    struct coord_utf8 u;
    struct gr_matcher *gm; /* the request's grammar over its generated tokens, or NULL */
    struct gr_grammar *lazy; /* a lazy grammar not started yet (its trigger not seen) */
    char *trig;              /* its trigger */
    size_t trig_len;
    bool trig_at_start;
    char *tail; /* the output's last bytes, as the grammar spells them (trig_len - 1 + a token) */
    size_t n_tail;
    bool special_text;
    char *pending; /* decoded text held back (a stop string may begin in it) */
    size_t n_pending;
    int step_n; /* tokens in the step being built (0: not in it) */
};

struct coord_sched {
    struct coord_sched_backend be;
    const struct coord_tok *tok;
    struct coord_sched_opts o;
    struct coord_kvpool pool;
    struct seq **seqs; /* open requests, in arrival order */
    int n_seqs, cap_seqs;
    uint32_t running;
    uint8_t *slot_used; /* (max_seqs) */
    uint64_t next_id, next_arrival, next_start;
    struct coord_seq_step *step; /* (max_seqs) */
    struct seq **in_step;        /* (max_seqs) */
    float *raw;                  /* (vocab) logits kept for log-probabilities */
    char *text;                  /* scratch of one event's text */
    size_t text_cap;
    struct coord_sched_stats st;
    struct gr_vocab *gv; /* the tokenizer's tokens for grammars, made at the first that needs it */
    char *gspecial;      /* control tokens' spellings for grammars: GR_SPECIAL and their text */
    uint64_t *gspecial_off; /* (vocab + 1) into gspecial; NULL: none */
    uint32_t *mask;      /* (gr_mask_words) scratch */
    int32_t eog[COORD_TOK_MAX_EOG]; /* the tokens that end a generation (coord_tok_eog_ids) */
    int n_eog;
    bool failed; /* the engine failed: fail_all() is ending every request */
};

const char *coord_finish_name(enum coord_finish f)
{
    static const char *const names[] = {"", "stop", "length", "cancelled", "error"};
    return f >= 0 && f <= COORD_FINISH_ERROR ? names[f] : "?";
}

static int engine_step(void *ctx, struct coord_seq_step *seqs, int n, struct shardlm_err *e)
{
    return coord_engine_step(ctx, seqs, n, e);
}

void coord_sched_engine_backend(struct coord_engine *g, struct coord_sched_backend *b)
{
    const struct shlm_header *h = coord_engine_model(g)->hdr;
    *b = (struct coord_sched_backend){engine_step,
                                      g,
                                      h->cfg.vocab_size,
                                      h->cfg.seq_len,
                                      coord_engine_kv_blocks(g),
                                      coord_engine_max_seqs(g),
                                      (int)h->bos_id,
                                      (int)h->eos_id,
                                      shlm_kv_window(&h->cfg, &h->cfgx)};
}

int coord_sched_init(struct coord_sched **out, struct coord_engine *g, const struct coord_tok *tok,
                     const struct coord_sched_opts *o, struct shardlm_err *e)
{
    uint32_t rows = coord_engine_logit_rows(g), want = o->max_seqs ? o->max_seqs : 1;
    if (want > rows) /* each running sequence's next token needs a row of logits a step */
        return shardlm_fail(e, -E2BIG,
                            "--max-seqs %u: a step returns at most %u rows of logits over this "
                            "vocabulary of %u",
                            want, rows, coord_engine_model(g)->hdr->cfg.vocab_size);
    struct coord_sched_backend b;
    coord_sched_engine_backend(g, &b);
    return coord_sched_init_backend(out, &b, tok, o, e);
}

int coord_sched_init_backend(struct coord_sched **out, const struct coord_sched_backend *b,
                             const struct coord_tok *tok, const struct coord_sched_opts *o,
                             struct shardlm_err *e)
{
    *out = NULL;
    struct coord_sched *s = calloc(1, sizeof(*s));
    if (!s)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    s->be = *b;
    s->tok = tok;
    s->o = *o;
    if (!s->o.max_seqs || s->o.max_seqs > b->max_seqs)
        s->o.max_seqs = b->max_seqs;
    if (!s->o.step_tokens)
        s->o.step_tokens = COORD_SCHED_STEP_TOKENS;
    if (s->o.step_tokens > b->context)
        s->o.step_tokens = b->context;
    if (s->o.step_tokens < s->o.max_seqs) {
        uint32_t st = s->o.step_tokens, ms = s->o.max_seqs;
        free(s);
        return shardlm_fail(e, -EINVAL,
                            "--step-tokens %u is below --max-seqs %u: every running sequence "
                            "decodes one token a step",
                            st, ms);
    }
    uint32_t m = s->o.max_seqs;
    if (b->kv_blocks < m) {
        free(s);
        return shardlm_fail(e, -EINVAL,
                            "a KV cache of %u blocks (%u positions) cannot give each of %u "
                            "sequences one: raise --kv-tokens or --kv-mem, or lower --max-seqs",
                            b->kv_blocks, b->kv_blocks * COORD_KV_BLOCK, m);
    }
    int rc = coord_kvpool_init(&s->pool, b->kv_blocks, !o->no_prefix_cache);
    s->slot_used = calloc(m, 1);
    s->step = calloc(m, sizeof(*s->step));
    s->in_step = calloc(m, sizeof(*s->in_step));
    s->raw = malloc((size_t)b->vocab * sizeof(float));
    if (rc || !s->slot_used || !s->step || !s->in_step || !s->raw) {
        coord_sched_free(s);
        return shardlm_fail(e, -ENOMEM, "out of memory");
    }
    s->st.blocks = b->kv_blocks;
    if (tok)
        s->n_eog = coord_tok_eog_ids(tok, s->eog);
    if (b->eos >= 0 && !s->n_eog)
        s->eog[s->n_eog++] = b->eos;
    *out = s;
    return 0;
}

static void seq_free(struct seq *q)
{
    coord_sampler_free(&q->smp);
    free(q->tokens);
    free(q->table);
    free(q->hashes);
    free(q->stop_ids);
    for (int i = 0; i < q->n_stop; i++)
        free(q->stop[i]);
    free(q->stop);
    free(q->pending);
    gr_matcher_free(q->gm);
    free(q->trig);
    free(q->tail);
    free(q);
}

void coord_sched_free(struct coord_sched *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_seqs; i++)
        seq_free(s->seqs[i]);
    free(s->seqs);
    coord_kvpool_free(&s->pool);
    free(s->slot_used);
    free(s->step);
    free(s->in_step);
    free(s->raw);
    free(s->text);
    gr_vocab_free(s->gv);
    free(s->gspecial);
    free(s->gspecial_off);
    free(s->mask);
    free(s);
}

/* Whether token @id is a control token (its text is not the output's, but a format's). */
static bool is_control(const struct coord_tok *t, int id)
{
    return id >= 0 && id < t->vocab_size && (t->attrs[id] & COORD_TOKA_TYPE) == COORD_TOKT_CONTROL;
}

/* Token @id as a grammar spells it (a control token: GR_SPECIAL and its text), *@len bytes. */
static const char *grammar_bytes(const struct coord_sched *s, int id, size_t *len)
{
    if (s->gspecial_off && id >= 0 && (uint32_t)id < s->be.vocab &&
        s->gspecial_off[id + 1] > s->gspecial_off[id]) {
        *len = s->gspecial_off[id + 1] - s->gspecial_off[id];
        return s->gspecial + s->gspecial_off[id];
    }
    if (!s->tok || id < 0 || id >= s->tok->vocab_size) {
        *len = 0;
        return "";
    }
    return coord_tok_text(s->tok, id, len);
}

/* The tokenizer's vocabulary for grammars: every token's text, a control token's spelled with
 * GR_SPECIAL before it, none with the byte 0xFF of its own; EOS the end. Returns 0 or -errno with
 * @e set. */
static int grammar_vocab(struct coord_sched *s, struct shardlm_err *e)
{
    if (s->gv)
        return 0;
    if (!s->tok)
        return shardlm_fail(e, -EINVAL, "a grammar needs a tokenizer");
    const struct coord_tok *t = s->tok;
    int n = (int)s->be.vocab;
    size_t special = 0;
    for (int i = 0; i < n && i < t->vocab_size; i++)
        if (is_control(t, i))
            special += strlen(GR_SPECIAL) + t->vocab_len[i];
    const char **bytes = calloc((size_t)n, sizeof(char *));
    uint32_t *lens = calloc((size_t)n, sizeof(uint32_t));
    s->gspecial = malloc(special + 1);
    s->gspecial_off = calloc((size_t)n + 1, sizeof(uint64_t));
    int rc = -ENOMEM;
    if (bytes && lens && s->gspecial && s->gspecial_off) {
        uint64_t off = 0;
        for (int i = 0; i < n; i++) {
            s->gspecial_off[i] = off;
            if (i < t->vocab_size && is_control(t, i)) {
                memcpy(s->gspecial + off, GR_SPECIAL, strlen(GR_SPECIAL));
                memcpy(s->gspecial + off + strlen(GR_SPECIAL), t->vocab[i], t->vocab_len[i]);
                off += strlen(GR_SPECIAL) + t->vocab_len[i];
            }
        }
        s->gspecial_off[n] = off;
        for (int i = 0; i < n && i < t->vocab_size; i++) {
            size_t len;
            bytes[i] = grammar_bytes(s, i, &len);
            lens[i] = (uint32_t)len;
            /* a byte-level vocabulary's token of the byte 0xFF (never in UTF-8 text) would
             * spell GR_SPECIAL: a grammar's control token is only the token itself */
            if (!is_control(t, i) && memchr(bytes[i], 0xff, len))
                bytes[i] = NULL;
        }
        int eos = s->be.eos >= 0 && s->be.eos < n ? s->be.eos : -1;
        rc = gr_vocab_new(n, bytes, lens, eos, &s->gv, e);
        if (!rc && !(s->mask = malloc(sizeof(uint32_t) * (size_t)gr_mask_words(s->gv)))) {
            gr_vocab_free(s->gv);
            s->gv = NULL;
            rc = -ENOMEM;
        }
    }
    free(bytes);
    free(lens);
    if (!s->gv) {
        free(s->gspecial);
        free(s->gspecial_off);
        s->gspecial = NULL;
        s->gspecial_off = NULL;
    }
    return rc == -ENOMEM ? shardlm_fail(e, rc, "out of memory") : rc;
}

/* A lazy grammar's watch after token @tok: its bytes join the output's tail; where the trigger
 * shows, the grammar starts, fed the tail from the trigger on (dropped if it refuses it). */
static void watch_trigger(struct coord_sched *s, struct seq *q, int tok)
{
    size_t len;
    const char *b = grammar_bytes(s, tok, &len);
    char *t = realloc(q->tail, q->n_tail + len + 1);
    if (!t) { /* no room to watch: the grammar is not started */
        q->lazy = NULL;
        return;
    }
    q->tail = t;
    memcpy(t + q->n_tail, b, len);
    q->n_tail += len;
    const char *at = memmem(t, q->n_tail, q->trig, q->trig_len);
    if (q->trig_at_start && at != t) { /* the output did not begin with it: never */
        size_t k = q->n_tail < q->trig_len ? q->n_tail : q->trig_len;
        if (memcmp(t, q->trig, k))
            q->lazy = NULL;
        return;
    }
    if (at) {
        struct shardlm_err e;
        if (!gr_matcher_new(q->lazy, s->gv, &q->gm, &e) &&
            !gr_matcher_commit_bytes(q->gm, at, q->n_tail - (size_t)(at - t))) {
            gr_matcher_free(q->gm);
            q->gm = NULL;
        }
        q->lazy = NULL;
        return;
    }
    if (q->n_tail >= q->trig_len && !q->trig_at_start) { /* keep what may begin the trigger */
        size_t keep = q->trig_len - 1;
        memmove(t, t + q->n_tail - keep, keep);
        q->n_tail = keep;
    }
}

/* ---- submission ---- */

static int copy_stops(struct seq *q, const struct coord_request *r, struct shardlm_err *e)
{
    if (r->n_stop > MAX_STOPS)
        return shardlm_fail(e, -EINVAL, "%d stop strings, at most %d", r->n_stop, MAX_STOPS);
    if (r->n_stop && !(q->stop = calloc((size_t)r->n_stop, sizeof(*q->stop))))
        return shardlm_fail(e, -ENOMEM, "out of memory");
    for (int i = 0; i < r->n_stop; i++) {
        size_t n = strlen(r->stop[i]);
        if (n == 0 || n > MAX_STOP_LEN)
            return shardlm_fail(e, -EINVAL, "a stop string of %zu bytes: 1..%d", n, MAX_STOP_LEN);
        if (!(q->stop[i] = strdup(r->stop[i])))
            return shardlm_fail(e, -ENOMEM, "out of memory");
        q->n_stop++;
    }
    if (r->n_stop_ids < 0 || r->n_stop_ids > 1024)
        return shardlm_fail(e, -EINVAL, "%d stop tokens, at most 1024", r->n_stop_ids);
    if (r->n_stop_ids) {
        if (!(q->stop_ids = malloc((size_t)r->n_stop_ids * sizeof(int32_t))))
            return shardlm_fail(e, -ENOMEM, "out of memory");
        memcpy(q->stop_ids, r->stop_ids, (size_t)r->n_stop_ids * sizeof(int32_t));
        q->n_stop_ids = r->n_stop_ids;
    }
    return 0;
}

static int check_sampling(const struct coord_sampling *p, struct shardlm_err *e)
{
    if (!(p->temp >= 0.0f && p->temp <= 100.0f))
        return shardlm_fail(e, -EINVAL, "temperature %g outside [0, 100]", (double)p->temp);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return shardlm_fail(e, -EINVAL, "top_p %g outside (0, 1]", (double)p->top_p);
    if (p->top_k < 0)
        return shardlm_fail(e, -EINVAL, "top_k %d is negative", p->top_k);
    if (!(p->min_p >= 0.0f && p->min_p < 1.0f))
        return shardlm_fail(e, -EINVAL, "min_p %g outside [0, 1)", (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f && p->repetition_penalty <= 10.0f))
        return shardlm_fail(e, -EINVAL, "repetition penalty %g outside (0, 10]",
                            (double)p->repetition_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f) ||
        !(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return shardlm_fail(e, -EINVAL, "frequency and presence penalties lie in [-2, 2]");
    return 0;
}

/* The most blocks one sequence ever holds at once when every layer is windowed (window W, chunks
 * of at most step_tokens T): during a chunk at pos it holds those of positions pos - W + 1 ..
 * pos + T - 1 (drop_dead gave back the ones before), W + T - 1 positions over at most
 * ceil((W + T - 1) / block) + 1 blocks. UINT32_MAX without a window (its whole length). */
static uint32_t live_blocks(const struct coord_sched *s)
{
    if (!s->be.window)
        return UINT32_MAX;
    return coord_kv_blocks_for((uint64_t)s->be.window - 1 + s->o.step_tokens) + 1;
}

int coord_sched_submit(struct coord_sched *s, const struct coord_request *r, uint64_t *id,
                       struct shardlm_err *e)
{
    uint32_t ctx = s->be.context;
    if (r->n_prompt < 1)
        return shardlm_fail(e, -EINVAL, "an empty prompt");
    if ((uint32_t)r->n_prompt > ctx)
        return shardlm_fail(e, -E2BIG, "the prompt is %d tokens, longer than the context of %u",
                            r->n_prompt, ctx);
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || (uint32_t)r->prompt[i] >= s->be.vocab)
            return shardlm_fail(e, -EINVAL, "token id %d outside the vocabulary of %u",
                                r->prompt[i], s->be.vocab);
    /* the last new token is sampled, never fed: n_prompt + max_new - 1 positions */
    int room = (int)ctx - r->n_prompt + 1;
    if (r->max_tokens < 0 || r->max_tokens > room)
        return shardlm_fail(e, -E2BIG,
                            "the prompt (%d tokens) plus %d new tokens exceeds the context of "
                            "%u; ask for %d or fewer",
                            r->n_prompt, r->max_tokens, ctx, room);
    /* 0 (a request without max_tokens): up to the end of the context, or of the KV cache when
     * that holds fewer positions (so that it is never refused for a limit it did not set); a
     * windowed model's sequence needs only its live blocks, so the cache never limits it when
     * those fit */
    int max_new = r->max_tokens;
    uint32_t live = live_blocks(s);
    if (!max_new) {
        uint64_t fit = (uint64_t)s->pool.n_blocks * COORD_KV_BLOCK + 1;
        max_new = live <= s->pool.n_blocks /* windowed: the cache never limits it */
                          || !(fit > (uint64_t)r->n_prompt &&
                               fit - (uint64_t)r->n_prompt < (uint64_t)room)
                      ? room
                      : (int)(fit - (uint64_t)r->n_prompt);
    }
    uint32_t need = coord_kv_blocks_for((uint64_t)r->n_prompt + (uint64_t)max_new - 1);
    if (need > live && live > s->pool.n_blocks)
        return shardlm_fail(e, -E2BIG,
                            "the request needs %u KV blocks (a window of %u positions and a chunk "
                            "of %u), the cache has %u (raise --kv-tokens or --kv-mem, or lower "
                            "--step-tokens or the new tokens)",
                            live, s->be.window, s->o.step_tokens, s->pool.n_blocks);
    if (need > live)
        need = live;
    if (need > s->pool.n_blocks)
        return shardlm_fail(e, -E2BIG,
                            "the request needs %u KV blocks (%d positions), the cache has %u "
                            "(raise --kv-tokens or --kv-mem, or lower the new tokens)",
                            need, r->n_prompt + max_new - 1, s->pool.n_blocks);
    if (r->n_stop && !s->tok)
        return shardlm_fail(e, -EINVAL, "stop strings need a tokenizer");
    if (r->logprobs > COORD_MAX_LOGPROBS)
        return shardlm_fail(e, -EINVAL, "%d log-probabilities, at most %d", r->logprobs,
                            COORD_MAX_LOGPROBS);
    int rc = check_sampling(&r->sampling, e);
    if (rc)
        return rc;
    if (s->n_seqs == s->cap_seqs) {
        int cap = s->cap_seqs ? 2 * s->cap_seqs : 16;
        struct seq **grown = realloc(s->seqs, (size_t)cap * sizeof(*grown));
        if (!grown)
            return shardlm_fail(e, -ENOMEM, "out of memory");
        s->seqs = grown;
        s->cap_seqs = cap;
    }
    struct seq *q = calloc(1, sizeof(*q));
    uint32_t bpc = coord_kv_blocks_for(ctx);
    if (!q || !(q->tokens = malloc(((size_t)ctx + 1) * sizeof(int32_t))) ||
        !(q->table = malloc((size_t)bpc * sizeof(uint32_t))) ||
        !(q->hashes = malloc((size_t)bpc * sizeof(uint64_t))) ||
        coord_sampler_init_ex(&q->smp, (int)s->be.vocab, &r->sampling)) {
        if (q)
            seq_free(q);
        return shardlm_fail(e, -ENOMEM, "out of memory");
    }
    bool lazy = r->grammar && r->grammar_trigger && r->grammar_trigger_len;
    if ((rc = copy_stops(q, r, e)) || (r->grammar && (rc = grammar_vocab(s, e))) ||
        (r->grammar && !lazy && (rc = gr_matcher_new(r->grammar, s->gv, &q->gm, e)))) {
        seq_free(q);
        return rc;
    }
    if (lazy) {
        if (!(q->trig = malloc(r->grammar_trigger_len))) {
            seq_free(q);
            return shardlm_fail(e, -ENOMEM, "out of memory");
        }
        memcpy(q->trig, r->grammar_trigger, r->grammar_trigger_len);
        q->trig_len = r->grammar_trigger_len;
        q->trig_at_start = r->grammar_trigger_at_start;
        q->lazy = r->grammar;
    }
    q->special_text = r->special_text;
    memcpy(q->tokens, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
    for (int i = 0; i < r->n_prompt; i++)
        coord_sampler_observe(&q->smp, r->prompt[i], false);
    q->len = q->n_prompt = r->n_prompt;
    q->max_new = max_new;
    q->ignore_eos = r->ignore_eos;
    q->logprobs = r->logprobs;
    q->on_event = r->on_event;
    q->ctx = r->ctx;
    q->id = ++s->next_id;
    q->arrival = ++s->next_arrival;
    q->state = SEQ_WAITING;
    s->seqs[s->n_seqs++] = q;
    *id = q->id;
    return 0;
}

void coord_sched_cancel(struct coord_sched *s, uint64_t id)
{
    for (int i = 0; i < s->n_seqs; i++)
        if (s->seqs[i]->id == id)
            s->seqs[i]->cancelled = true;
}

bool coord_sched_idle(const struct coord_sched *s) { return s->n_seqs == 0; }

/* ---- blocks of a sequence ---- */

/* Gives back every block of @q (full ones stay in the prefix cache) and its slot: it waits
 * again, to be computed anew. */
static void release_all(struct coord_sched *s, struct seq *q)
{
    for (int i = q->n_dead; i < q->n_blocks; i++)
        coord_kvpool_release(&s->pool, q->table[i]);
    q->n_blocks = q->n_hashed = q->n_dead = 0;
    q->computed = 0;
    if (q->state == SEQ_RUNNING) {
        s->slot_used[q->slot] = 0;
        s->running--;
    }
    q->state = SEQ_WAITING;
}

/* Gives back @q's leading blocks that no layer reads again: when every layer is windowed, those
 * wholly before the window of its next position (seg_kv_dead_blocks); its table keeps their
 * places as SEG_KV_NONE. A block is one holder less, as at the sequence's end: one that another
 * sequence shares stays theirs, a full one stays in the prefix cache (published first). So a
 * windowed sequence holds its live blocks only, however long it grows. */
static void drop_dead(struct coord_sched *s, struct seq *q)
{
    int dead = (int)seg_kv_dead_blocks(s->be.window, (uint64_t)q->computed);
    for (; q->n_dead < dead && q->n_dead < q->n_blocks; q->n_dead++) {
        coord_kvpool_release(&s->pool, q->table[q->n_dead]);
        q->table[q->n_dead] = SEG_KV_NONE;
        s->st.blocks_dropped++;
    }
}

/* The running sequence started last. */
static struct seq *youngest(struct coord_sched *s)
{
    struct seq *y = NULL;
    for (int i = 0; i < s->n_seqs; i++) {
        struct seq *q = s->seqs[i];
        if (q->state == SEQ_RUNNING && (!y || q->started > y->started))
            y = q;
    }
    return y;
}

/* Preempts @v: out of the step being built (if it was in), its blocks released. */
static void preempt(struct coord_sched *s, struct seq *v)
{
    v->step_n = 0;
    release_all(s, v);
    s->st.preemptions++;
}

/* Blocks for @q's positions below @upto; when the pool is out of them, preempts the youngest
 * running sequence (never one older than @q: then @q itself goes). Returns false when @q was
 * preempted. */
static bool grow(struct coord_sched *s, struct seq *q, int upto)
{
    uint32_t need = coord_kv_blocks_for((uint64_t)upto);
    while ((uint32_t)q->n_blocks < need) {
        uint32_t b = coord_kvpool_alloc(&s->pool);
        if (b != KVPOOL_NONE) {
            q->table[q->n_blocks++] = b;
            continue;
        }
        struct seq *v = youngest(s);
        preempt(s, v);
        if (v == q)
            return false;
    }
    return true;
}

/* A waiting sequence maps the longest cached prefix of its tokens (whole blocks, leaving at
 * least its last token to compute: its logits are needed). */
static void map_prefix(struct coord_sched *s, struct seq *q)
{
    uint64_t parent = 0;
    int full = (q->len - 1) / COORD_KV_BLOCK;
    for (int j = 0; j < full; j++) {
        const int32_t *t = q->tokens + (size_t)j * COORD_KV_BLOCK;
        uint64_t h = coord_kvpool_hash(parent, t);
        uint32_t b = coord_kvpool_lookup(&s->pool, h, parent, t);
        if (b == KVPOOL_NONE)
            break;
        q->table[q->n_blocks++] = b;
        q->hashes[q->n_hashed++] = h;
        parent = h;
    }
    q->computed = q->n_blocks * COORD_KV_BLOCK;
}

/* Starts the waiting @q with a chunk of at most @budget tokens, if the pool has the blocks for
 * that chunk once its cached prefix is mapped (a start never preempts: it waits). Returns the
 * chunk, or 0 when it must wait. */
static int admit(struct coord_sched *s, struct seq *q, uint32_t budget)
{
    map_prefix(s, q);
    drop_dead(s, q); /* the prefix's blocks before the window: back to the cache */
    int left = q->len - q->computed;
    int take = (uint32_t)left < budget ? left : (int)budget;
    uint32_t need =
        coord_kv_blocks_for((uint64_t)q->computed + (uint64_t)take) - (uint32_t)q->n_blocks;
    if (coord_kvpool_available(&s->pool) < need) {
        s->st.blocks_dropped -= (uint64_t)q->n_dead; /* counted for running sequences only */
        release_all(s, q);
        return 0;
    }
    uint32_t slot = 0;
    while (s->slot_used[slot])
        slot++;
    s->slot_used[slot] = 1;
    q->slot = slot;
    q->state = SEQ_RUNNING;
    q->started = ++s->next_start;
    s->running++;
    if (!q->looked_up) { /* the first start counts for the request's cached tokens */
        q->looked_up = true;
        q->cached_tokens = q->computed < q->n_prompt ? q->computed : q->n_prompt;
        s->st.prompt_tokens += (uint64_t)q->n_prompt;
        s->st.cached_tokens += (uint64_t)q->cached_tokens;
    }
    return take;
}

/* Publishes @q's blocks that became full. */
static void publish_full(struct coord_sched *s, struct seq *q)
{
    while ((q->n_hashed + 1) * COORD_KV_BLOCK <= q->computed) {
        int j = q->n_hashed;
        uint64_t parent = j ? q->hashes[j - 1] : 0;
        const int32_t *t = q->tokens + (size_t)j * COORD_KV_BLOCK;
        uint64_t h = coord_kvpool_hash(parent, t);
        coord_kvpool_publish(&s->pool, q->table[j], h, parent, t);
        q->hashes[q->n_hashed++] = h;
    }
}

/* ---- events ---- */

static int text_room(struct coord_sched *s, size_t n)
{
    if (n <= s->text_cap)
        return 0;
    char *t = realloc(s->text, n);
    if (!t)
        return -ENOMEM;
    s->text = t;
    s->text_cap = n;
    return 0;
}

static void emit(struct coord_sched *s, struct seq *q, int token, const char *text, size_t len,
                 const struct coord_logprobs *lp, enum coord_finish f, const char *error)
{
    struct coord_event ev = {.id = q->id,
                             .token = token,
                             .text = text ? text : "",
                             .text_len = len,
                             .logprobs = lp,
                             .finish = f,
                             .error = error,
                             .engine_failed = s->failed,
                             .prompt_tokens = q->n_prompt,
                             .completion_tokens = q->n_gen,
                             .cached_tokens = q->cached_tokens};
    if (q->on_event)
        q->on_event(q->ctx, &ev);
}

/* Where the first stop string begins in @t (n bytes), or -1. */
static long find_stop(const struct seq *q, const char *t, size_t n)
{
    long at = -1;
    for (int i = 0; i < q->n_stop; i++) {
        size_t k = strlen(q->stop[i]);
        for (size_t p = 0; p + k <= n && (at < 0 || (long)p < at); p++)
            if (!memcmp(t + p, q->stop[i], k)) {
                at = (long)p;
                break;
            }
    }
    return at;
}

/* Bytes at the end of @t (n bytes) that begin some stop string: held back. */
static size_t stop_prefix(const struct seq *q, const char *t, size_t n)
{
    size_t hold = 0;
    for (int i = 0; i < q->n_stop; i++) {
        size_t k = strlen(q->stop[i]);
        for (size_t l = k - 1 < n ? k - 1 : n; l > hold; l--)
            if (!memcmp(t + n - l, q->stop[i], l)) {
                hold = l;
                break;
            }
    }
    return hold;
}

/* Appends token @tok's text to @q's pending text (complete characters only). Returns 0 or
 * -ENOMEM. */
static int decode_into(struct coord_sched *s, struct seq *q, int prev, int tok)
{
    if (!s->tok)
        return 0;
    size_t len;
    const char *piece = coord_tok_decode(s->tok, prev, tok, &len);
    if (q->special_text && is_control(s->tok, tok) && tok != s->tok->bos_id) {
        piece = s->tok->vocab[tok];
        len = s->tok->vocab_len[tok];
    }
    if (!coord_tok_printable(piece, len))
        return 0;
    if (text_room(s, 3 * len + 12))
        return -ENOMEM;
    size_t n = coord_utf8_feed(&q->u, piece, len, s->text);
    char *p = realloc(q->pending, q->n_pending + n + 1);
    if (!p)
        return -ENOMEM;
    memcpy(p + q->n_pending, s->text, n);
    q->pending = p;
    q->n_pending += n;
    return 0;
}

/* Sends @q's pending text with token @tok: up to a stop string (then true: it stops), or all
 * but what may begin one. */
static bool send_text(struct coord_sched *s, struct seq *q, int tok,
                      const struct coord_logprobs *lp)
{
    long at = find_stop(q, q->pending, q->n_pending);
    size_t out = at >= 0 ? (size_t)at : q->n_pending - stop_prefix(q, q->pending, q->n_pending);
    if (at >= 0) {
        emit(s, q, tok, q->pending, out, lp, COORD_FINISH_STOP, NULL);
        return true;
    }
    emit(s, q, tok, q->pending, out, lp, COORD_FINISH_NONE, NULL);
    if (out && out < q->n_pending) /* (no text at all: pending is still NULL) */
        memmove(q->pending, q->pending + out, q->n_pending - out);
    q->n_pending -= out;
    return false;
}

/* Ends @q: what it held back (no stop string came of it; and a character cut off, as U+FFFD)
 * goes with the last event. */
static void finish(struct coord_sched *s, struct seq *q, int tok, const struct coord_logprobs *lp,
                   enum coord_finish f, const char *error)
{
    char tail[3];
    size_t n = s->tok ? coord_utf8_flush(&q->u, tail) : 0;
    if (!text_room(s, q->n_pending + n + 1)) {
        if (q->n_pending)
            memcpy(s->text, q->pending, q->n_pending);
        memcpy(s->text + q->n_pending, tail, n);
        emit(s, q, tok, s->text, q->n_pending + n, lp, f, error);
    } else
        emit(s, q, tok, NULL, 0, lp, f, error);
}

/* Drops @q from the open requests (after its last event). */
static void remove_seq(struct coord_sched *s, struct seq *q)
{
    release_all(s, q);
    int i = 0;
    while (s->seqs[i] != q)
        i++;
    memmove(&s->seqs[i], &s->seqs[i + 1], (size_t)(s->n_seqs - i - 1) * sizeof(*s->seqs));
    s->n_seqs--;
    seq_free(q);
}

/* Whether @tok is one of @q's stop tokens, or (@eog) one that ends a generation. */
static bool is_stop_token(const struct coord_sched *s, const struct seq *q, int tok, bool eog)
{
    for (int i = 0; i < s->n_eog && eog; i++)
        if (s->eog[i] == tok)
            return true;
    for (int i = 0; i < q->n_stop_ids; i++)
        if (q->stop_ids[i] == tok)
            return true;
    return false;
}

/* The tokens @q's grammar forbids next get -inf in @logits (the exchange's row); the tokens
 * that end a sequence are allowed exactly where the grammar may end. Returns false when no
 * token is left (a grammar that leads nowhere), or on an error. */
static bool apply_grammar(struct coord_sched *s, struct seq *q, float *logits)
{
    long n = gr_matcher_mask(q->gm, s->mask);
    if (n <= 0)
        return false;
    uint32_t *m = s->mask;
    bool can_end = s->be.eos >= 0 && (m[s->be.eos >> 5] >> (s->be.eos & 31) & 1);
    /* the tokens that end a sequence (control tokens: not in the grammar's vocabulary) follow
     * EOS: allowed where the grammar may end, else not */
    for (int i = 0; i < s->n_eog + q->n_stop_ids; i++) {
        int t = i < s->n_eog ? s->eog[i] : q->stop_ids[i - s->n_eog];
        if (t < 0 || (uint32_t)t >= s->be.vocab)
            continue;
        if (can_end)
            m[t >> 5] |= 1u << (t & 31);
        else
            m[t >> 5] &= ~(1u << (t & 31));
    }
    /* (a word at a time: most are all allowed or all refused) */
    uint32_t full = s->be.vocab / 32;
    for (uint32_t w = 0; w < full; w++) {
        uint32_t out = ~m[w];
        if (out == 0xffffffffu) {
            for (uint32_t b = 0; b < 32; b++)
                logits[w * 32 + b] = -INFINITY;
            continue;
        }
        for (; out; out &= out - 1)
            logits[w * 32 + (uint32_t)__builtin_ctz(out)] = -INFINITY;
    }
    for (uint32_t t = full * 32; t < s->be.vocab; t++)
        if (!(m[t >> 5] >> (t & 31) & 1))
            logits[t] = -INFINITY;
    return true;
}

/* @q's chunk reached its last token: samples the next one from @logits, reports it, and
 * returns true when the sequence is done. */
static bool advance(struct coord_sched *s, struct seq *q, const float *logits)
{
    struct coord_logprobs lp, *lpp = NULL;
    float *row = (float *)logits; /* the exchange's row: the sampler works in place */
    uint64_t g0 = q->gm ? shardlm_now_ns() : 0;
    if (q->gm && !apply_grammar(s, q, row)) {
        finish(s, q, -1, NULL, COORD_FINISH_ERROR, "the grammar allows no token here");
        return true;
    }
    if (q->gm)
        s->st.grammar_ns += shardlm_now_ns() - g0;
    if (q->logprobs >= 0) {
        memcpy(s->raw, logits, s->be.vocab * sizeof(float));
        row = s->raw;
    }
    int tok = coord_sample(&q->smp, row);
    if (q->logprobs >= 0) {
        coord_logprobs(&q->smp, logits, tok, q->logprobs, &lp);
        lpp = &lp;
    }
    /* under a grammar, EOS and the end tokens are allowed only where it may end: they end
     * the sequence, ignore_eos or not */
    bool grammar_end = q->gm && (tok == s->be.eos || is_stop_token(s, q, tok, true));
    if (is_stop_token(s, q, tok, !q->ignore_eos) || (tok == s->be.bos && !q->ignore_eos) ||
        grammar_end) {
        q->n_gen++;
        finish(s, q, tok, lpp, COORD_FINISH_STOP, NULL);
        return true;
    }
    g0 = q->gm || q->lazy ? shardlm_now_ns() : 0;
    if (q->gm && !gr_matcher_commit(q->gm, tok)) { /* it was in the mask: an invariant */
        finish(s, q, -1, lpp, COORD_FINISH_ERROR, "the grammar refused the token it allowed");
        return true;
    }
    if (q->lazy)
        watch_trigger(s, q, tok);
    if (g0)
        s->st.grammar_ns += shardlm_now_ns() - g0;
    int prev = q->tokens[q->len - 1];
    q->tokens[q->len++] = tok;
    q->n_gen++;
    coord_sampler_observe(&q->smp, tok, true);
    if (decode_into(s, q, prev, tok)) {
        finish(s, q, tok, lpp, COORD_FINISH_ERROR, "out of memory");
        return true;
    }
    bool last = q->n_gen >= q->max_new || (uint32_t)q->len > s->be.context;
    if (!last)
        return send_text(s, q, tok, lpp);
    if (find_stop(q, q->pending, q->n_pending) >= 0)
        return send_text(s, q, tok, lpp);
    finish(s, q, tok, lpp, COORD_FINISH_LENGTH, NULL);
    return true;
}

/* ---- steps ---- */

/* Cancelled requests leave before the step is built. */
static void drop_cancelled(struct coord_sched *s)
{
    for (int i = 0; i < s->n_seqs;) {
        struct seq *q = s->seqs[i];
        if (!q->cancelled) {
            i++;
            continue;
        }
        finish(s, q, -1, NULL, COORD_FINISH_CANCELLED, NULL);
        remove_seq(s, q);
    }
}

/* Chooses the step's sequences and chunks; returns how many. */
static int build_step(struct coord_sched *s)
{
    uint32_t budget = s->o.step_tokens;
    /* 1. decodes, oldest first (seqs[] is in arrival order) */
    for (int i = 0; i < s->n_seqs; i++) {
        struct seq *q = s->seqs[i];
        if (q->state != SEQ_RUNNING || q->computed != q->len - 1)
            continue;
        if (grow(s, q, q->len))
            q->step_n = 1;
    }
    for (int i = 0; i < s->n_seqs; i++) /* one preempted later in the loop gave its token back */
        budget -= (uint32_t)s->seqs[i]->step_n;
    /* 2. prefill chunks in arrival order: of running sequences, and of waiting ones while they
     * can start (first come, first served: once one must wait, later ones do too) */
    bool closed = false;
    for (int i = 0; i < s->n_seqs && budget > 0; i++) {
        struct seq *q = s->seqs[i];
        if (q->step_n || q->cancelled)
            continue;
        if (q->state == SEQ_WAITING &&
            (closed || s->running >= s->o.max_seqs || !admit(s, q, budget))) {
            closed = true;
            continue;
        }
        int left = q->len - q->computed;
        int take = (uint32_t)left < budget ? left : (int)budget;
        if (q->computed + take < q->len) /* a partial chunk: whole blocks where it can */
            take = take > COORD_KV_BLOCK ? take / COORD_KV_BLOCK * COORD_KV_BLOCK : take;
        if (!grow(s, q, q->computed + take))
            continue; /* preempted itself: it was the youngest */
        q->step_n = take;
        budget -= (uint32_t)take;
    }
    int n = 0;
    for (int i = 0; i < s->n_seqs; i++) {
        struct seq *q = s->seqs[i];
        if (!q->step_n)
            continue;
        s->in_step[n] = q;
        s->step[n++] = (struct coord_seq_step){.seq_id = q->slot,
                                               .pos = (uint32_t)q->computed,
                                               .n_tokens = (uint32_t)q->step_n,
                                               .tokens = q->tokens + q->computed,
                                               .blocks = q->table};
    }
    return n;
}

/* Every open request ends with the error @why (the engine failed), marked engine_failed. */
static void fail_all(struct coord_sched *s, const char *why)
{
    s->failed = true;
    while (s->n_seqs) {
        struct seq *q = s->seqs[0];
        finish(s, q, -1, NULL, COORD_FINISH_ERROR, why);
        remove_seq(s, q);
    }
    s->failed = false;
}

int coord_sched_step(struct coord_sched *s, struct shardlm_err *e)
{
    drop_cancelled(s);
    if (!s->n_seqs)
        return 0;
    uint64_t t0 = shardlm_now_ns();
    int n = build_step(s);
    if (n == 0) /* cannot happen: a lone sequence always fits (coord_sched_submit) */
        return shardlm_fail(e, -EDEADLK, "scheduler: no sequence could be scheduled");
    if (s->pool.n_held > s->st.blocks_peak)
        s->st.blocks_peak = s->pool.n_held;
    int rc = s->be.step(s->be.ctx, s->step, n, e);
    if (rc) {
        fail_all(s, e->msg);
        return rc;
    }
    uint64_t t1 = shardlm_now_ns();
    for (int i = 0; i < n; i++) {
        struct seq *q = s->in_step[i];
        q->computed += q->step_n;
        if (q->step_n == 1 && q->computed == q->len)
            s->st.decode_tokens++;
        else
            s->st.prefill_tokens += (uint64_t)q->step_n;
        q->step_n = 0;
        publish_full(s, q);
        drop_dead(s, q);
        if (q->computed == q->len && advance(s, q, s->step[i].logits))
            remove_seq(s, q);
    }
    uint64_t t2 = shardlm_now_ns();
    s->st.steps++;
    s->st.step_ns += t2 - t0;
    s->st.sample_ns += t2 - t1;
    return 0;
}

int coord_sched_run(struct coord_sched *s, struct shardlm_err *e)
{
    while (!coord_sched_idle(s)) {
        int rc = coord_sched_step(s, e);
        if (rc)
            return rc;
    }
    return 0;
}

void coord_sched_stats(const struct coord_sched *s, struct coord_sched_stats *out)
{
    *out = s->st;
    out->running = s->running;
    out->waiting = (uint32_t)s->n_seqs - s->running;
    out->blocks = s->pool.n_blocks;
    out->blocks_used = s->pool.n_held;
    out->blocks_cached = s->pool.n_lru;
    out->evictions = s->pool.evictions;
}

const struct coord_kvpool *coord_sched_pool(const struct coord_sched *s) { return &s->pool; }

int coord_sched_audit(const struct coord_sched *s, struct shardlm_err *e)
{
    const struct coord_kvpool *p = &s->pool;
    uint32_t nb = p->n_blocks, running = 0;
    uint32_t *count = calloc(nb, sizeof(*count));
    uint8_t *where = calloc(nb, 1); /* 1 free, 2 LRU */
    int rc = 0;
    if (!count || !where) {
        rc = shardlm_fail(e, -ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < s->n_seqs; i++) {
        const struct seq *q = s->seqs[i];
        if (q->state == SEQ_RUNNING) {
            running++;
            if (q->n_blocks != (int)coord_kv_blocks_for((uint64_t)q->computed)) {
                rc = shardlm_fail(e, -EPROTO, "request %llu holds %d blocks for %d positions",
                                  (unsigned long long)q->id, q->n_blocks, q->computed);
                goto out;
            }
            /* the blocks before every layer's window given back, and only those */
            if (q->n_dead != (int)seg_kv_dead_blocks(s->be.window, (uint64_t)q->computed)) {
                rc = shardlm_fail(e, -EPROTO, "request %llu gave back %d blocks at position %d",
                                  (unsigned long long)q->id, q->n_dead, q->computed);
                goto out;
            }
            for (int j = 0; j < i; j++)
                if (s->seqs[j]->state == SEQ_RUNNING && s->seqs[j]->slot == q->slot) {
                    rc = shardlm_fail(e, -EPROTO, "two running requests in slot %u", q->slot);
                    goto out;
                }
        } else if (q->n_blocks || q->n_dead) {
            rc = shardlm_fail(e, -EPROTO, "waiting request %llu holds %d blocks",
                              (unsigned long long)q->id, q->n_blocks);
            goto out;
        }
        for (int j = 0; j < q->n_blocks; j++) {
            if ((j < q->n_dead) != (q->table[j] == SEG_KV_NONE)) {
                rc = shardlm_fail(e, -EPROTO, "request %llu: table entry %d is %u (%d given back)",
                                  (unsigned long long)q->id, j, q->table[j], q->n_dead);
                goto out;
            }
            if (j >= q->n_dead)
                count[q->table[j]]++;
        }
    }
    if (running != s->running) {
        rc = shardlm_fail(e, -EPROTO, "%u requests running, counted %u", s->running, running);
        goto out;
    }
    for (uint32_t i = 0; i < p->n_free; i++) {
        uint32_t b = p->free_stack[i];
        if (b >= nb || where[b] || p->ref[b] || p->cached[b]) {
            rc = shardlm_fail(e, -EPROTO, "free list entry %u: block %u twice, held or cached", i,
                              b);
            goto out;
        }
        where[b] = 1;
    }
    uint32_t n_lru = 0;
    for (uint32_t b = p->lru_head, prev = KVPOOL_NONE; b != KVPOOL_NONE; b = p->lru_next[b]) {
        if (b >= nb || where[b] || p->ref[b] || !p->cached[b] || p->lru_prev[b] != prev ||
            ++n_lru > p->n_lru) {
            rc = shardlm_fail(e, -EPROTO, "LRU list: block %u misplaced", b);
            goto out;
        }
        where[b] = 2;
        prev = b;
    }
    uint32_t held = 0;
    for (uint32_t b = 0; b < nb; b++) {
        if (p->ref[b] != count[b]) {
            rc = shardlm_fail(e, -EPROTO, "block %u: %u references, %u tables name it", b,
                              p->ref[b], count[b]);
            goto out;
        }
        held += p->ref[b] > 0;
        if ((p->ref[b] > 0) + (where[b] != 0) != 1) {
            rc = shardlm_fail(e, -EPROTO, "block %u is %s", b,
                              p->ref[b] ? "held and listed" : "lost (neither held nor listed)");
            goto out;
        }
        if (p->ref[b] > 1 && !p->cached[b]) {
            rc = shardlm_fail(e, -EPROTO, "block %u shared by %u but not a cached full block", b,
                              p->ref[b]);
            goto out;
        }
        if (p->cached[b] && coord_kvpool_find(p, p->hash[b], p->parent[b],
                                              p->tokens + (size_t)b * COORD_KV_BLOCK) != b) {
            rc = shardlm_fail(e, -EPROTO, "cached block %u cannot be found", b);
            goto out;
        }
    }
    if (held != p->n_held || n_lru != p->n_lru || held + p->n_free + n_lru != nb)
        rc = shardlm_fail(e, -EPROTO, "counts: %u held (%u said), %u free, %u LRU (%u said) of %u",
                          held, p->n_held, p->n_free, n_lru, p->n_lru, nb);
out:
    free(count);
    free(where);
    return rc;
}
