/* SPDX-License-Identifier: MIT */
/* coordinator/server/srv.h: what the server's rooms share (not installed, not for the CLI).
 *
 *   serve.c    the serve loop: open (listen, load), run (the scheduler's steps), drain, close
 *   http.c     libmicrohttpd's glue: the route table, the key, framing, deadlines, errors
 *   openai.c   the OpenAI endpoints: completions' JSON in and out, /tokenize, /detokenize...
 *   life.c     a request's life: its state, its references, its queueing and waiting
 *   metrics.c  GET /metrics: Prometheus' text
 *   request.c  a completion request's JSON body, parsed and checked (request.h)
 *   gate.c     the listening socket, and a look at each connection's first head (gate.h)
 *   notify.c   readiness for systemd (notify.h)
 *
 * Requests are parsed on their connection's thread (libmicrohttpd, one thread per
 * connection), handed to the thread that drives the scheduler, and their tokens handed back
 * through a buffer per request.
 *
 * A request lives in struct sreq, shared by its connection and the scheduler's thread, freed by
 * whichever lets it go last (refs, under srv.mu). The connection queues it (pending), waits until
 * the scheduler has accepted or refused it - so every error is decided before the status line
 * goes out - then streams what the scheduler's events append, or waits for the end and sends one
 * body. A client that goes away (its socket hung up, checked every SRV_WAIT_MS while waiting, or
 * a failed write) has its request cancelled before the next step. */
#ifndef SHARDLM_COORD_SRV_H
#define SHARDLM_COORD_SRV_H

#include "chat.h"
#include "grammar.h"
#include "request.h"
#include "server.h"
#include "tokenizer.h"
#include "toolcall.h"

#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define SRV_BODY_MAX (1u << 20) /* bytes of a request body */
#define SRV_WAIT_MS 100         /* a waiting connection checks its client this often */

/* The server's state (srv.state, under srv.mu). */
enum srv_state {
    SRV_LOADING,  /* bound, the model loading: the tokenizer and the context are not known */
    SRV_SERVING,  /* requests are taken */
    SRV_DRAINING, /* a signal came: new requests get 503, running ones finish */
    SRV_LOST,     /* the engine failed for good: every open request has its error, /health and
                   * new requests get 503 until the clients have their endings */
    SRV_STOPPING, /* every waiting connection gives up, then the connections end */
};

enum sreq_state { SREQ_PENDING, SREQ_RUNNING, SREQ_REFUSED, SREQ_DONE };

/* A Prometheus histogram: counts per upper bound (seconds), the sum and the count. */
#define SRV_HIST_BOUNDS 14
struct srv_hist {
    const double *le; /* SRV_HIST_BOUNDS bounds, then +Inf */
    uint64_t bucket[SRV_HIST_BOUNDS];
    double sum;
    uint64_t count;
};

/* What GET /metrics reports (under srv.mu): the scheduler's figures as of its last step, and
 * what the server counted. */
struct srv_metrics {
    struct coord_sched_stats st;
    uint64_t prompt_tokens, generated_tokens;
    uint64_t finished[COORD_FINISH_ERROR + 1]; /* requests by finish reason */
    uint64_t refused;                          /* 4xx/5xx after parsing: too long, queue full */
    uint64_t grammars_compiled, grammars_reused; /* requests' grammars: compiled, from the cache */
    struct srv_hist ttft, itl, step;
};

struct srv;

/* A compiled grammar, shared by the requests that ask for the same one (srv_structure): kept
 * for the next request (srv.grams) while it is among the last SRV_GRAMS asked for. Only the
 * scheduler's thread uses the grammar itself; these fields are under srv.mu. */
struct srv_gram {
    struct gr_grammar *g;
    char *key; /* what it was compiled from (kind, options, source), binary */
    size_t key_len;
    uint64_t hash;
    int refs;      /* requests holding it */
    bool cached;   /* in srv.grams */
    uint64_t used; /* srv.gram_clock when last asked for */
};
#define SRV_GRAMS 16

/* A completion request, from its connection's thread to the scheduler's and back. */
struct sreq {
    struct srv *s;
    int refs;
    struct sreq *prev, *next; /* every live request (srv.all) */
    struct sreq *next_pending, *next_cancel;
    struct coord_completion_req q; /* the request, parsed on the connection's thread */
    struct coord_request r;        /* what the scheduler gets */
    char id[32];
    long long created;
    int fd; /* the client's socket */
    /* state, under srv.mu */
    enum sreq_state state;
    unsigned status; /* SREQ_REFUSED: the HTTP status and message */
    char err[300];
    uint64_t sched_id;
    bool cancel, cancel_queued;
    char *out; /* stream: server-sent events not yet sent; else: the text */
    size_t len, cap, off;
    enum coord_finish finish;
    int prompt_tokens, completion_tokens, cached_tokens;
    uint64_t t_arrive, t_last; /* when it was queued; its last token (ns) */
    int last_token;            /* the token before the next one (for its piece), -1 */
    bool role_sent;            /* a chat stream: the first chunk (the role) is out */
    bool http11;               /* the client speaks HTTP/1.1: it takes a 1xx before the answer */
    uint64_t probed_ns;        /* when its FIN was last answered with a probe (0: never) */
    unsigned continues;        /* 100 Continue probes sent */
    bool ping;                 /* a stream's probe is to go out */
    size_t text_off;           /* bytes of the tokens' pieces so far (logprobs' text_offset) */
    json_t *lp;                /* a plain response's logprobs object, filled token by token */
    /* structured output and tool calls, set up on the connection's thread */
    struct gr_grammar *grammar; /* the request's grammar (the scheduler borrows it), or NULL */
    struct srv_gram *gram;      /* ... held from the cache of compiled grammars (NULL: its own) */
    char *trigger;              /* a lazy grammar's trigger (tool_choice auto), or NULL */
    size_t trigger_len;
    bool trigger_at_start; /* ... only where the answer begins */
    bool parse;        /* a chat answer split into reasoning, content and tool calls (toolcall.h) */
    bool in_think;     /* the prompt opened the reasoning (the answer starts inside it) */
    struct srv_split { /* a stream's split answer: the text so far and what was sent */
        char *raw;
        size_t len, cap;
        size_t reasoning, content; /* bytes sent */
        int calls;                 /* calls whose name was sent */
        size_t *args;              /* (calls) their arguments' bytes sent */
        bool called;               /* a call was sent: finish_reason tool_calls */
    } split;
    pthread_cond_t cv;
};

/* An open connection, as the deadline watchdog sees it (srv.sock_mu). */
struct srv_sock {
    int fd;
    uint64_t since; /* accepted, or its last response sent (ns) */
    bool busy;      /* a request of it is being answered: no deadline */
    bool cut;
    struct srv_sock *prev, *next;
};

struct srv {
    const struct coord_serve_opts *o;
    pthread_mutex_t sock_mu;
    struct srv_sock *socks;
    bool watching; /* sock_mu: the watchdog runs */
    pthread_t watch_thread;
    struct coord_tok tok;
    bool tok_loaded;
    struct coord_chat_tmpl chat; /* chat.jinja NULL: no template (chat_why says why) */
    char chat_why[300];
    const struct coord_tool_format *fmt; /* the template's tool-call and reasoning format */
    int32_t *controls;                   /* the control tokens, longest text first (srv_spell) */
    int n_controls;
    struct coord_tool_format spelled;  /* fmt's markers spelled for grammars (srv_spell), once */
    struct srv_gram *grams[SRV_GRAMS]; /* compiled grammars kept for the next requests (mu) */
    uint64_t gram_clock;
    size_t trigger_len; /* (spelled.trigger's) */
    bool fmt_special; /* the format's markers are control tokens: answers show them */
    struct coord_engine *eng;
    struct coord_sched *sched;
    char model[128];
    int context;
    pthread_mutex_t mu;
    pthread_cond_t wake;  /* the scheduler's thread: something was queued */
    enum srv_state state; /* under mu; srv_state_get() takes mu to read it */
    char lost[300];       /* SRV_LOST: why the engine is gone */
    struct sreq *pending, **pending_tail, *cancels, *all;
    uint32_t open;  /* queued or in the scheduler, not finished */
    uint32_t limit; /* open requests before a 429 */
    uint64_t next_id;
    struct srv_metrics m;
    /* the engine's cancel flag: set from opts.stop by the relay while the model loads; once it
     * serves, a signal drains and a second one stops between steps, never inside one */
    volatile sig_atomic_t engine_cancel;
    int loaded; /* __atomic: the load is over (the relay ends) */
    struct MHD_Daemon *d;
    struct coord_gate *gate;
    int port;
};

/* ---- life.c: a request's life ---- */

/* The server's state, read under srv.mu; with @lost (SRV_LOST: why) copied when not NULL
 * (sizeof(s->lost) bytes). */
enum srv_state srv_state_get(struct srv *s, char *lost);
/* Why a request that needs the model gets a 503 in state @st (not SRV_SERVING). */
const char *srv_state_why(enum srv_state st);

/* A new request of @s from the socket @fd (one reference: its connection's), on srv.all; NULL
 * when out of memory. */
struct sreq *sreq_new(struct srv *s, int fd, bool http11, bool chat);
void sreq_free(struct sreq *p);
/* Drops one reference (srv.mu held); returns whether the caller must free @p (after unlocking). */
bool sreq_unref_locked(struct sreq *p);
void sreq_unref(struct sreq *p);
/* Asks the scheduler's thread to cancel @p (srv.mu held). */
void sreq_cancel_locked(struct sreq *p);
/* Appends @n bytes to @p's output (srv.mu held). false: out of memory. */
bool sreq_out_put(struct sreq *p, const char *b, size_t n);
/* Refuses @p with @status and a message (srv.mu not held); drops the scheduler's reference. */
void sreq_refuse(struct sreq *p, unsigned status, const char *msg);
/* Queues @p for the scheduler and waits until it is accepted or refused (or its client leaves,
 * or the server stops). Returns 0 with @p's state in *@st and whether the server stops in
 * *@stopping, or the status of a refusal decided here: 503 (the server no longer serves) or
 * 429 (too many requests open, counted as refused). */
unsigned sreq_queue(struct sreq *p, enum sreq_state *st, bool *stopping);
/* Waits on @p's condition for SRV_WAIT_MS (srv.mu held); @streaming: its response has begun.
 * Returns false when the client left (the request is then cancelled) or the server stops. */
bool sreq_wait_step(struct sreq *p, bool streaming);
/* *@ts: @ms milliseconds from now on CLOCK_REALTIME (pthread_cond_timedwait()'s). */
void srv_deadline(struct timespec *ts, long ms);

/* Tokenizes @n bytes of @text with coord_tok_encode_ex() @flags into *@ids (malloc'd, the
 * caller frees it, on an error too; left alone past 8 MiB of text). Returns the number of
 * tokens, -ENOMEM, or another -errno with @why set to "cannot tokenize @what: REASON". */
int srv_encode(const struct srv *s, const char *text, size_t n, unsigned flags, const char *what,
               int32_t **ids, char *why, size_t wlen);

/* @n bytes of @text as a grammar spells them: each control token's text with GR_SPECIAL before
 * it (malloc'd, NUL-terminated; *@len its bytes when @len is not NULL), or NULL. */
char *srv_spell(const struct srv *s, const char *text, size_t *len);
/* Finds the control tokens and the chat format's markers (after the tokenizer and template
 * loaded). Returns 0 or -ENOMEM. */
int srv_formats_init(struct srv *s);
void srv_formats_free(struct srv *s);
/* Lets go of @p's grammar (the cache's or its own). */
void srv_grammar_release(struct srv *s, struct sreq *p);
/* Frees the cache of compiled grammars (at the end: no request holds one). */
void srv_grams_free(struct srv *s);

/* The scheduler's thread: takes what the connections queued (new requests submitted, or
 * refused when their client left; cancellations passed on). */
void srv_take_queued(struct srv *s);

/* ---- openai.c: the OpenAI endpoints ---- */

/* A JSON string of @n bytes of text; text that is not UTF-8 becomes U+FFFD. */
json_t *srv_text_json(const char *t, size_t n);
/* Appends to @p's output what event @ev adds to its response: the text (a stream: as
 * server-sent events, with the logprobs, the role first, the finish and usage chunks and
 * [DONE] at the end), a plain response's logprobs. srv.mu held. false: out of memory. */
bool srv_event_out(struct sreq *p, const struct coord_event *ev);

/* A route's handler (http.c's table): answers the request @c, whose body is in @cn, at @url
 * (without /v1). */
struct srv_conn;
typedef enum MHD_Result srv_route_fn(struct srv *s, struct MHD_Connection *c, struct srv_conn *cn,
                                     const char *url);
/* POST /completions, /chat/completions, /tokenize, /detokenize, /apply-template; GET /models,
 * /models/NAME */
srv_route_fn srv_completions, srv_chat_completions, srv_tokenize, srv_detokenize,
    srv_apply_template, srv_models, srv_model;

/* ---- structured.c: grammars, tool calls, reasoning ---- */

/* Compiles @p's grammar - its response_format or guided field, or with tools its calls in the
 * model's syntax (all of it for tool_choice required or named; for auto a lazy grammar from the
 * format's trigger) - and decides whether its answer is split (a chat with tools, or a format
 * that reasons). @prompt: the rendered chat prompt (NULL for completions). Returns 0, -EINVAL
 * with @why set to a 400's message (the field and what does not compile), or -ENOMEM. */
int srv_structure(struct srv *s, struct sreq *p, const char *prompt, size_t prompt_len, char *why,
                  size_t wlen);
/* A plain chat answer's message: role, content (null when only calls), reasoning_content,
 * tool_calls; *@called when it has calls. NULL when out of memory. */
json_t *srv_split_message(struct sreq *p, const char *text, size_t n, bool *called);
/* A stream's next @n bytes of answer (@final: the last): *@delta the chunk's delta of what is
 * new (NULL: nothing yet). false when out of memory. */
bool srv_split_delta(struct sreq *p, const char *text, size_t n, bool final, json_t **delta);
void srv_split_free(struct srv_split *sp);

/* ---- metrics.c ---- */

void srv_metrics_init(struct srv_metrics *m);
void srv_hist_observe(struct srv_hist *h, double v);
srv_route_fn srv_metrics; /* GET /metrics */

/* A growing text (metrics, /detokenize): failed once an allocation failed. */
struct srv_text {
    char *b;
    size_t len, cap;
    bool failed;
};
void srv_text_printf(struct srv_text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- http.c: libmicrohttpd's glue ---- */

/* A request's connection-side context: its body as it comes. */
struct srv_conn {
    char *body;
    size_t len;
    bool too_big;
    bool http11;  /* HTTP/1.1 (a 1xx may go before the answer), not 1.0 */
};

/* Starts libmicrohttpd (a thread per connection, no listening socket of its own), the gate
 * that listens and hands it the connections, and the deadline watchdog. Returns 0 with
 * s->port set, or -errno with @e set. Stop with srv_http_stop(). */
int srv_http_start(struct srv *s, const struct sockaddr_in *addr, struct shardlm_err *e);
void srv_http_stop(struct srv *s);
/* Whether a connection is in the middle of a request: its answer is not all written yet. */
bool srv_conns_busy(struct srv *s);

/* Queues @j (consumed) as the answer. */
enum MHD_Result srv_send_json(struct MHD_Connection *c, unsigned status, json_t *j);
/* An OpenAI error object. */
enum MHD_Result srv_send_error(struct MHD_Connection *c, unsigned status, const char *type,
                               const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
