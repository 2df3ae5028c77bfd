/* SPDX-License-Identifier: MIT */
/* coordinator/sched/scheduler.h: the scheduler - many sequences over one engine, continuous
 * batching over a paged KV cache with prefix caching, per-sequence sampling. */

/* Front ends (`shardlm generate`, the HTTP server) submit requests and read each one's tokens
 * back through its callback; one thread calls coord_sched_step() in a loop. Each step:
 *  1. every running sequence that has all its tokens in the KV cache decodes one (oldest
 *     first);
 *  2. sequences still prefilling, then waiting ones (first come, first served), get chunks of
 *     their remaining tokens within the step's token budget (opts.step_tokens) and the cap on
 *     running sequences (opts.max_seqs); a sequence starting looks its prompt up in the prefix
 *     cache block by block and prefills only the rest;
 *  3. a sequence that needs a block when none is left preempts the most recently started one
 *     (its blocks released - full ones stay cached - and its tokens computed again when it is
 *     admitted anew, ahead of later arrivals);
 *  4. the engine runs the step; each sequence whose chunk reached its last token samples the
 *     next one, and its text (complete UTF-8 characters, held back while it may begin a stop
 *     string) goes to the callback, with the finish reason on the last call.
 * When every layer of the model attends within a window W (Mistral with a window, Phi-3), a
 * sequence's blocks wholly before its next position's window are read by no layer again: they go
 * back to the pool as it advances (a block shared or cached for a prefix stays so for the others),
 * so it holds at most ceil((W + step_tokens - 1) / block) + 1 blocks however long it grows. With
 * a global layer (Gemma 2/3) every block holds that layer's K/V too and nothing goes back.
 * A request that alone needs more KV blocks than the cache has (a windowed one: those of its
 * window and a chunk), or more positions than the context, is refused at submission. Not
 * thread-safe: one thread drives it (a server hands requests over to that thread).
 */
#ifndef SHARDLM_COORD_SCHEDULER_H
#define SHARDLM_COORD_SCHEDULER_H

#include "engine.h"
#include "grammar.h"
#include "kvpool.h"
#include "sampler.h"
#include "tokenizer.h"

#include <stdbool.h>
#include <stdint.h>

enum coord_finish {
    COORD_FINISH_NONE = 0, /* still running */
    COORD_FINISH_STOP,     /* end of sequence, a stop token or a stop string */
    COORD_FINISH_LENGTH,   /* max_tokens, or the context is full */
    COORD_FINISH_CANCELLED,
    COORD_FINISH_ERROR,
};

/* "stop", "length", "cancelled", "error" (OpenAI's finish_reason where it has one). */
const char *coord_finish_name(enum coord_finish f);

/* One call of a request's callback: a token (with its text, maybe empty), and on the last call
 * the finish reason (then token may be -1: no new token). */
struct coord_event {
    uint64_t id;
    int token;
    const char *text; /* valid during the call */
    size_t text_len;
    const struct coord_logprobs *logprobs; /* when the request asked for them, else NULL */
    enum coord_finish finish;
    const char *error; /* COORD_FINISH_ERROR: why */
    /* COORD_FINISH_ERROR: the step failed in the engine (a worker dead past its restarts, a
     * cancel), not for this request alone: every open request ends with this error, and
     * coord_sched_step() returns it once they have */
    bool engine_failed;
    int prompt_tokens, completion_tokens, cached_tokens;
};

typedef void (*coord_event_fn)(void *ctx, const struct coord_event *ev);

/* What a front end asks for; everything is copied at submission. */
struct coord_request {
    const int32_t *prompt;
    int n_prompt;
    int max_tokens; /* new tokens at most; 0: as many as the context (and the KV cache) leave */
    struct coord_sampling sampling;
    const int32_t *stop_ids; /* tokens that end the sequence (besides EOS) */
    int n_stop_ids;
    const char *const *stop; /* strings that end it; the text stops before them */
    int n_stop;
    bool ignore_eos;
    int logprobs; /* -1: none; n >= 0: the sampled token's and the top n alternatives' */
    /* structured output (NULL: none): each token is drawn from those @grammar allows next (the
     * mask applied to the logits before every other step of sampling and before the
     * log-probabilities), and the sequence may end (EOS, a stop token) only where the grammar
     * is complete. Borrowed: it must outlive the request's last event; requests may share it */
    struct gr_grammar *grammar;
    /* with @grammar: it applies only from where these bytes (a grammar's spelling: control
     * tokens as GR_SPECIAL and their text) first appear in the output - a lazy grammar, fed
     * the output from there on; one the output then breaks is dropped (NULL: from the start) */
    const char *grammar_trigger;
    size_t grammar_trigger_len;
    bool grammar_trigger_at_start; /* ... only where the output begins with it */
    bool special_text; /* control tokens are text too (a chat format's markers), not only EOS
                        * and the tokens that end the sequence */
    coord_event_fn on_event;
    void *ctx;
};

struct coord_sched_opts {
    uint32_t max_seqs;    /* running sequences at most (the engine's max_seqs or fewer) */
    uint32_t step_tokens; /* tokens one step may carry (decodes first, then prefill chunks) */
    bool no_prefix_cache;
};

/* Default of coord_sched_opts.step_tokens: prefill's throughput is flat from chunks of 64 tokens
 * (llama32-1b, 2 threads: pp64..pp512 all 330-341 tok/s), so a larger budget only makes the
 * running sequences wait longer for their next token (docs/benchmarks.md "Many sequences"). */
#define COORD_SCHED_STEP_TOKENS 256u

struct coord_sched_stats {
    uint64_t steps, step_ns, sample_ns; /* sampling and detokenizing, in the steps' time */
    uint64_t grammar_ns;                /* grammars' masks and commits, in sample_ns */
    uint64_t prefill_tokens, decode_tokens;
    uint64_t prompt_tokens, cached_tokens; /* looked up in the prefix cache, and found */
    uint64_t preemptions, evictions;
    uint32_t running, waiting;
    uint32_t blocks, blocks_used, blocks_cached; /* held by sequences; cached and unheld */
    uint32_t blocks_peak;                        /* the most held at once, in any step */
    uint64_t blocks_dropped; /* given back before every layer's window, sequences still running */
};

struct coord_sched;

/* What the scheduler runs its steps on: an engine (coord_sched_init) or, in tests, a model of
 * one. */
struct coord_sched_backend {
    int (*step)(void *ctx, struct coord_seq_step *seqs, int n, struct shardlm_err *e);
    void *ctx;
    uint32_t vocab, context, kv_blocks, max_seqs;
    int bos, eos;
    /* the window every layer attends within (shlm_kv_window), 0: some layer reads the whole
     * context. With one, a sequence's blocks before its window go back to the pool as it
     * advances, and a request needs only the blocks of a window and a chunk */
    uint32_t window;
};

/* A scheduler over the started engine @g and the tokenizer @tok (both outlive it). Returns 0 or
 * -errno with @e set. */
int coord_sched_init(struct coord_sched **out, struct coord_engine *g, const struct coord_tok *tok,
                     const struct coord_sched_opts *o, struct shardlm_err *e);
/* The backend coord_sched_init() runs on: the engine @g's step and capacities, the model's
 * tokens and window (shlm_kv_window). */
void coord_sched_engine_backend(struct coord_engine *g, struct coord_sched_backend *b);
/* The same over @b (copied); @tok may be NULL (no text; stop strings refused). */
int coord_sched_init_backend(struct coord_sched **out, const struct coord_sched_backend *b,
                             const struct coord_tok *tok, const struct coord_sched_opts *o,
                             struct shardlm_err *e);
void coord_sched_free(struct coord_sched *s);

/* Queues a request; *@id names it. Returns 0, or -E2BIG (past the context or the whole KV
 * cache), -EINVAL (bad parameters) or -ENOMEM with @e set; the callback is never called for a
 * refused request. */
int coord_sched_submit(struct coord_sched *s, const struct coord_request *r, uint64_t *id,
                       struct shardlm_err *e);
/* Cancels request @id before the next step: its blocks are freed and its callback gets
 * COORD_FINISH_CANCELLED. Unknown or finished ids are ignored. */
void coord_sched_cancel(struct coord_sched *s, uint64_t id);
/* Whether no request is waiting or running. */
bool coord_sched_idle(const struct coord_sched *s);
/* Runs one step. Returns 0 (also when idle), or the engine's error (-ECANCELED, a worker
 * that cannot be restarted...) with @e set: the engine is unusable then, and every request
 * still open gets COORD_FINISH_ERROR. */
int coord_sched_step(struct coord_sched *s, struct shardlm_err *e);
/* Runs steps until every request has finished. */
int coord_sched_run(struct coord_sched *s, struct shardlm_err *e);
void coord_sched_stats(const struct coord_sched *s, struct coord_sched_stats *out);
/* The KV block pool (tests check its accounting). */
const struct coord_kvpool *coord_sched_pool(const struct coord_sched *s);
/* Checks the accounting between steps: every block held exactly as often as tables name it,
 * free, cached-unheld or held and never two of these, a block shared only when it is a full
 * cached one, every cached block findable, the free list and LRU list whole, each running
 * sequence holding the blocks of its computed positions and no more, waiting ones none.
 * Returns 0 or -EPROTO with @e naming the first broken rule. */
int coord_sched_audit(const struct coord_sched *s, struct shardlm_err *e);

#endif
