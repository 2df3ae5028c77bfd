/* SPDX-License-Identifier: MIT */
/* coordinator/server/server.c: the HTTP server - requests parsed on their connection's thread
 * (libmicrohttpd, one thread per connection), handed to the thread that drives the scheduler,
 * and their tokens handed back through a buffer per request.
 *
 * A request lives in struct sreq, shared by its connection and the scheduler's thread, freed by
 * whichever lets it go last (refs, under srv.mu). The connection queues it (pending), waits until
 * the scheduler has accepted or refused it - so every error is decided before the status line
 * goes out - then streams what on_event appends, or waits for the end and sends one body. A
 * client that goes away (its socket hung up, checked every WAIT_MS while waiting, or a failed
 * write) has its request cancelled before the next step.
 */
#include "server.h"

#include "chat.h"
#include "gate.h"
#include "notify.h"
#include "request.h"
#include "tokenizer.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#define BODY_MAX (1u << 20) /* bytes of a request body */
#define WAIT_MS 100         /* a waiting connection checks its client this often */
/* a half-closed client is probed again this often: one that reads on may close for good later;
 * with at most this many 100 Continues (some clients take only a few 1xx: Go's took 5) */
#define PROBE_NS 2000000000ull
#define MAX_CONTINUES 4
#define CONN_TIMEOUT_S 30   /* a connection idle this long is closed */
/* A request's header and body must arrive within this many seconds of the connection's accept
 * (or of its previous response): a client that trickles them a byte at a time (slowloris) is
 * cut off then, where the idle timeout above would wait forever. */
#define REQUEST_DEADLINE_S 15
#define MAX_CONNECTIONS 512
/* s.ready once the engine failed for good (a worker dead past --restarts): every open request
 * has its error, /health and new requests get 503 until the clients have their endings */
#define ENGINE_LOST 3
#define FLUSH_NS 5000000000ull /* how long the endings of a drain or a loss may take to send */

enum sreq_state { SREQ_PENDING, SREQ_RUNNING, SREQ_REFUSED, SREQ_DONE };

/* A Prometheus histogram: counts per upper bound (seconds), the sum and the count. */
#define HIST_BOUNDS 14
struct hist {
    const double *le; /* HIST_BOUNDS bounds, then +Inf */
    uint64_t bucket[HIST_BOUNDS];
    double sum;
    uint64_t count;
};

static const double ttft_le[HIST_BOUNDS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                            1,     2.5,  5,     10,   30,  60,   120};
static const double step_le[HIST_BOUNDS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                            0.25,  0.5,    1,     2.5,  5,     10,   30};

static void hist_observe(struct hist *h, double v)
{
    for (int i = 0; i < HIST_BOUNDS; i++)
        if (v <= h->le[i])
            h->bucket[i]++;
    h->sum += v;
    h->count++;
}

/* What GET /metrics reports (under srv.mu): the scheduler's figures as of its last step, and
 * what the server counted. */
struct metrics {
    struct coord_sched_stats st;
    uint64_t prompt_tokens, generated_tokens;
    uint64_t finished[COORD_FINISH_ERROR + 1]; /* requests by finish reason */
    uint64_t refused;                          /* 4xx/5xx after parsing: too long, queue full */
    struct hist ttft, itl, step;
};

struct srv;

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
    pthread_cond_t cv;
};

/* An open connection, as the deadline watchdog sees it (srv.sock_mu). */
struct sock {
    int fd;
    uint64_t since; /* accepted, or its last response sent (ns) */
    bool busy;      /* a request of it is being answered: no deadline */
    bool cut;
    struct sock *prev, *next;
};

struct srv {
    const struct coord_serve_opts *o;
    pthread_mutex_t sock_mu;
    struct sock *socks;
    bool watching; /* sock_mu: the watchdog runs */
    struct coord_tok tok;
    bool tok_loaded;
    struct coord_chat_tmpl chat; /* chat.jinja NULL: no template (chat_why says why) */
    char chat_why[300];
    struct coord_sched *sched;
    char model[128];
    int context;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* the scheduler's thread: something was queued */
    int ready;           /* 0 loading, 1 serving, 2 draining, 3 lost (ENGINE_LOST), -1 stopping */
    char lost[300];      /* ready 3: why the engine is gone */
    struct sreq *pending, **pending_tail, *cancels, *all;
    uint32_t open;  /* queued or in the scheduler, not finished */
    uint32_t limit; /* open requests before a 429 */
    uint64_t next_id;
    struct metrics m;
    /* the engine's cancel flag: set from opts.stop by the relay while the model loads; once it
     * serves, a signal drains and a second one stops between steps, never inside one */
    volatile sig_atomic_t engine_cancel;
    int loaded; /* __atomic: the load is over (the relay ends) */
    struct MHD_Daemon *d;
};

/* ---- requests ---- */

static void sreq_free(struct sreq *p)
{
    coord_completion_req_free(&p->q);
    json_decref(p->lp);
    free(p->out);
    pthread_cond_destroy(&p->cv);
    free(p);
}

/* Drops one reference (srv.mu held); returns whether the caller must free @p (after unlocking). */
static bool sreq_unref_locked(struct sreq *p)
{
    if (--p->refs)
        return false;
    struct srv *s = p->s;
    if (p->prev)
        p->prev->next = p->next;
    else
        s->all = p->next;
    if (p->next)
        p->next->prev = p->prev;
    return true;
}

static void sreq_unref(struct sreq *p)
{
    struct srv *s = p->s;
    pthread_mutex_lock(&s->mu);
    bool last = sreq_unref_locked(p);
    pthread_mutex_unlock(&s->mu);
    if (last)
        sreq_free(p);
}

/* Asks the scheduler's thread to cancel @p (srv.mu held). */
static void sreq_cancel_locked(struct sreq *p)
{
    struct srv *s = p->s;
    p->cancel = true;
    if (p->state == SREQ_RUNNING && !p->cancel_queued) {
        p->cancel_queued = true;
        p->refs++;
        p->next_cancel = s->cancels;
        s->cancels = p;
    }
    pthread_cond_signal(&s->wake);
}

/* Appends @n bytes to @p's output (srv.mu held). false: out of memory. */
static bool out_put(struct sreq *p, const char *b, size_t n)
{
    if (p->off && p->off == p->len) /* all sent: start over */
        p->off = p->len = 0;
    if (p->len + n + 1 > p->cap) {
        size_t cap = 2 * (p->len + n) + 256;
        char *o = realloc(p->out, cap);
        if (!o)
            return false;
        p->out = o;
        p->cap = cap;
    }
    memcpy(p->out + p->len, b, n);
    p->len += n;
    p->out[p->len] = '\0';
    return true;
}

/* A JSON string of @n bytes of text; text that is not UTF-8 becomes U+FFFD. */
static json_t *text_json(const char *t, size_t n)
{
    json_t *j = json_stringn(t, n);
    return j ? j : json_string("\xef\xbf\xbd");
}

static json_t *usage_json(const struct sreq *p)
{
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", p->prompt_tokens,
                     "completion_tokens", p->completion_tokens, "total_tokens",
                     p->prompt_tokens + p->completion_tokens, "prompt_tokens_details",
                     "cached_tokens", p->cached_tokens);
}

/* One text_completion object: a chunk of @text (stream), or the whole result with usage. */
static json_t *completion_json(const struct sreq *p, const char *text, size_t n,
                               enum coord_finish f, bool usage, json_t *lp)
{
    json_t *choice = json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "text", text_json(text, n),
                               "logprobs", lp ? lp : json_null(), "finish_reason",
                               f ? json_string(coord_finish_name(f)) : json_null());
    json_t *o =
        json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", p->id, "object", "text_completion", "created",
                  (json_int_t)p->created, "model", p->s->model, "choices", choice);
    if (o && usage)
        json_object_set_new(o, "usage", usage_json(p));
    return o;
}

/* One chat.completion(.chunk) object: a delta of @text (stream; with the role when @role), or
 * the whole message with usage. */
static json_t *chat_json(const struct sreq *p, const char *text, size_t n, enum coord_finish f,
                         bool usage, json_t *lp, bool role)
{
    bool stream = p->q.stream;
    json_t *msg = json_object();
    if (msg && (role || !stream))
        json_object_set_new(msg, "role", json_string("assistant"));
    if (msg && (n || role || !stream))
        json_object_set_new(msg, "content", text_json(text, n));
    json_t *choice = json_pack("{s:i,s:o,s:o,s:o}", "index", 0, stream ? "delta" : "message", msg,
                               "logprobs", lp ? lp : json_null(), "finish_reason",
                               f ? json_string(coord_finish_name(f)) : json_null());
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", p->id, "object",
                          stream ? "chat.completion.chunk" : "chat.completion", "created",
                          (json_int_t)p->created, "model", p->s->model, "choices", choice);
    if (o && usage)
        json_object_set_new(o, "usage", usage_json(p));
    return o;
}

/* A chunk or the whole response, as the request's kind writes it. */
static json_t *response_json(const struct sreq *p, const char *text, size_t n, enum coord_finish f,
                             bool usage, json_t *lp)
{
    return p->q.chat ? chat_json(p, text, n, f, usage, lp, false)
                     : completion_json(p, text, n, f, usage, lp);
}

/* Appends "data: <json>\n\n" (srv.mu held; @j is consumed). */
static bool sse_put(struct sreq *p, json_t *j)
{
    char *t = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    bool ok = t && out_put(p, "data: ", 6) && out_put(p, t, strlen(t)) && out_put(p, "\n\n", 2);
    free(t);
    return ok;
}

/* A token's piece as JSON: its text, or "bytes:\\xNN.." when it is not UTF-8 on its own (a
 * part of a character), as OpenAI writes those. */
static json_t *piece_json(const struct srv *s, int prev, int id, size_t *len)
{
    const char *t = coord_tok_decode(&s->tok, prev, id, len);
    json_t *j = json_stringn(t, *len);
    if (j)
        return j;
    char b[6 + 4 * 64 + 1] = "bytes:";
    size_t n = 6;
    for (size_t i = 0; i < *len && i < 64; i++)
        n += (size_t)snprintf(b + n, sizeof(b) - n, "\\x%02x", (unsigned char)t[i]);
    return json_string(b);
}

/* Appends token @ev's log-probabilities to @lp ({"tokens", "token_logprobs", "top_logprobs",
 * "text_offset"}: OpenAI's completions format). srv.mu held. */
static bool logprobs_add(struct sreq *p, json_t *lp, const struct coord_event *ev)
{
    struct srv *s = p->s;
    size_t len;
    json_t *top = json_object();
    for (int i = 0; top && i < ev->logprobs->n_top; i++) {
        size_t tl;
        json_t *k = piece_json(s, p->last_token, ev->logprobs->top[i].id, &tl);
        /* two ids that spell the same text: the likelier one (listed first) stays */
        if (k && !json_object_get(top, json_string_value(k)))
            json_object_set_new(top, json_string_value(k), json_real(ev->logprobs->top[i].logprob));
        json_decref(k);
    }
    json_t *tok = piece_json(s, p->last_token, ev->token, &len);
    bool ok = top && tok && !json_array_append_new(json_object_get(lp, "tokens"), tok) &&
              !json_array_append_new(json_object_get(lp, "token_logprobs"),
                                     json_real(ev->logprobs->logprob)) &&
              !json_array_append_new(json_object_get(lp, "top_logprobs"), top) &&
              !json_array_append_new(json_object_get(lp, "text_offset"),
                                     json_integer((json_int_t)p->text_off));
    p->text_off += len;
    return ok;
}

/* A token's chat logprobs entry: {"token", "logprob", "bytes", "top_logprobs"} (OpenAI's chat
 * format); @top false leaves top_logprobs out (the entries inside it). */
static json_t *chat_token_json(const struct srv *s, int prev, int id, float logprob)
{
    size_t len;
    const char *t = coord_tok_decode(&s->tok, prev, id, &len);
    json_t *bytes = json_array();
    for (size_t i = 0; bytes && i < len; i++)
        json_array_append_new(bytes, json_integer((unsigned char)t[i]));
    return json_pack("{s:o,s:f,s:o}", "token", piece_json(s, prev, id, &len), "logprob",
                     (double)logprob, "bytes", bytes ? bytes : json_null());
}

/* Appends token @ev to a chat logprobs object {"content": [...]}. srv.mu held. */
static bool chat_logprobs_add(struct sreq *p, json_t *lp, const struct coord_event *ev)
{
    struct srv *s = p->s;
    json_t *e = chat_token_json(s, p->last_token, ev->token, ev->logprobs->logprob);
    json_t *top = json_array();
    for (int i = 0; e && top && i < ev->logprobs->n_top; i++)
        json_array_append_new(top, chat_token_json(s, p->last_token, ev->logprobs->top[i].id,
                                                   ev->logprobs->top[i].logprob));
    if (!e || !top || json_object_set_new(e, "top_logprobs", top)) {
        json_decref(e);
        return false;
    }
    return !json_array_append_new(json_object_get(lp, "content"), e);
}

static json_t *logprobs_new(const struct sreq *p)
{
    if (p->q.chat)
        return json_pack("{s:[]}", "content");
    return json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs",
                     "text_offset");
}

/* The scheduler's callback, on its thread during a step. */
static void on_event(void *ctx, const struct coord_event *ev)
{
    struct sreq *p = ctx;
    struct srv *s = p->s;
    uint64_t now = shardlm_now_ns();
    pthread_mutex_lock(&s->mu);
    if (ev->token >= 0) { /* a new token: time to the first one, or since the last one */
        if (p->t_last)
            hist_observe(&s->m.itl, (double)(now - p->t_last) / 1e9);
        else
            hist_observe(&s->m.ttft, (double)(now - p->t_arrive) / 1e9);
        p->t_last = now;
        s->m.generated_tokens++;
    }
    p->prompt_tokens = ev->prompt_tokens;
    p->completion_tokens = ev->completion_tokens;
    p->cached_tokens = ev->cached_tokens;
    if (ev->engine_failed && s->ready > 0 && s->ready != ENGINE_LOST) {
        /* before the first client hears of it: whoever asks /health after its error gets 503 */
        s->ready = ENGINE_LOST;
        snprintf(s->lost, sizeof(s->lost), "%s", ev->error ? ev->error : "the engine failed");
    }
    bool ok = true;
    json_t *lp = NULL; /* this token's, for a stream's chunk */
    bool (*add)(struct sreq *, json_t *, const struct coord_event *) =
        p->q.chat ? chat_logprobs_add : logprobs_add;
    if (ev->logprobs && ev->token >= 0) {
        if (p->q.stream)
            ok = (lp = logprobs_new(p)) && add(p, lp, ev);
        else
            ok = (p->lp || (p->lp = logprobs_new(p))) && add(p, p->lp, ev);
    }
    if (ev->token >= 0)
        p->last_token = ev->token;
    if (ok && p->q.chat && p->q.stream && !p->role_sent) { /* the first chunk: the role */
        ok = sse_put(p, chat_json(p, "", 0, 0, false, NULL, true));
        p->role_sent = true;
    }
    if (ok && (ev->text_len || lp))
        ok = p->q.stream ? sse_put(p, response_json(p, ev->text, ev->text_len, 0, false, lp))
                         : out_put(p, ev->text, ev->text_len);
    else
        json_decref(lp);
    if (ok && ev->finish == COORD_FINISH_ERROR && p->q.stream) /* after a 200: as an event */
        ok = sse_put(p, json_pack("{s:{s:s,s:s,s:n}}", "error", "message",
                                  ev->error ? ev->error : "the engine failed", "type",
                                  "server_error", "code"));
    if (ok && ev->finish && p->q.stream) {
        ok = sse_put(p, response_json(p, "", 0, ev->finish, false, NULL));
        if (ok && p->q.include_usage) {
            json_t *u = json_pack("{s:s,s:s,s:I,s:s,s:[]}", "id", p->id, "object",
                                  p->q.chat ? "chat.completion.chunk" : "text_completion",
                                  "created", (json_int_t)p->created, "model", s->model, "choices");
            if (u)
                json_object_set_new(u, "usage", usage_json(p));
            ok = sse_put(p, u);
        }
        ok = ok && out_put(p, "data: [DONE]\n\n", 14);
    }
    if (!ok && !p->cancel)
        sreq_cancel_locked(p); /* out of memory: this request ends */
    bool last = false;
    if (ev->finish) {
        p->finish = ev->finish;
        if (ev->error)
            snprintf(p->err, sizeof(p->err), "%s", ev->error);
        p->state = SREQ_DONE;
        s->m.finished[ev->finish]++;
        s->m.prompt_tokens += (uint64_t)ev->prompt_tokens;
        s->open--;
        last = sreq_unref_locked(p); /* the scheduler's reference */
    }
    if (!last)
        pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&s->mu);
    if (last)
        sreq_free(p);
}

/* ---- the scheduler's thread ---- */

/* Refuses @p with @status and a message (srv.mu not held); drops the scheduler's reference. */
static void refuse(struct sreq *p, unsigned status, const char *msg)
{
    struct srv *s = p->s;
    pthread_mutex_lock(&s->mu);
    p->state = SREQ_REFUSED;
    p->status = status;
    s->m.refused++;
    snprintf(p->err, sizeof(p->err), "%s", msg);
    s->open--;
    bool last = sreq_unref_locked(p);
    if (!last)
        pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&s->mu);
    if (last)
        sreq_free(p);
}

/* Submits @p (its prompt tokenized by its connection). */
static void submit(struct srv *s, struct sreq *p)
{
    struct coord_completion_req *q = &p->q;
    if (q->n_ids < 1) /* an empty text with a tokenizer that adds no BOS */
        return refuse(p, 400, "prompt: empty");
    p->r = (struct coord_request){.prompt = q->ids,
                                  .n_prompt = q->n_ids,
                                  .max_tokens = q->max_tokens,
                                  .sampling = q->sampling,
                                  .stop = (const char *const *)q->stops,
                                  .n_stop = q->n_stops,
                                  .ignore_eos = q->ignore_eos,
                                  .logprobs = q->logprobs,
                                  .on_event = on_event,
                                  .ctx = p};
    if (!q->seeded) { /* a seed of its own */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        p->r.sampling.seed =
            (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)(uintptr_t)p;
    }
    struct shardlm_err e = {{0}};
    uint64_t id;
    /* callbacks come in steps, never during the submission: the state changes after it */
    int rc = coord_sched_submit(s->sched, &p->r, &id, &e);
    if (rc)
        return refuse(p, rc == -ENOMEM ? 500 : 400, e.msg);
    pthread_mutex_lock(&s->mu);
    p->state = SREQ_RUNNING;
    p->prompt_tokens = q->n_ids;
    p->last_token = q->ids[q->n_ids - 1]; /* the first new token's piece follows it */
    p->sched_id = id;
    if (p->cancel && !p->cancel_queued) { /* the client left while it was submitted */
        p->cancel_queued = true;
        p->refs++;
        p->next_cancel = s->cancels;
        s->cancels = p;
    }
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Takes what the connections queued: new requests (submitted), cancellations. */
static void take_queued(struct srv *s)
{
    pthread_mutex_lock(&s->mu);
    struct sreq *pend = s->pending, *canc = s->cancels;
    s->pending = NULL;
    s->pending_tail = &s->pending;
    s->cancels = NULL;
    pthread_mutex_unlock(&s->mu);
    while (pend) {
        struct sreq *p = pend;
        pend = p->next_pending;
        pthread_mutex_lock(&s->mu);
        bool left = p->cancel; /* its client left while it waited */
        pthread_mutex_unlock(&s->mu);
        if (left)
            refuse(p, 499, "the client closed the connection");
        else
            submit(s, p);
    }
    while (canc) {
        struct sreq *p = canc;
        canc = p->next_cancel;
        coord_sched_cancel(s->sched, p->sched_id);
        sreq_unref(p);
    }
}

/* ---- the connections ---- */

struct conn {
    char *body;
    size_t len;
    bool too_big;
    bool http11;  /* HTTP/1.1 (a 1xx may go before the answer), not 1.0 */
    bool closing; /* its answer ends the connection */
};

enum client_state {
    CLIENT_HERE,
    CLIENT_HALF_CLOSED, /* it sent its FIN: done sending, or gone (only a write can tell) */
    CLIENT_GONE,        /* reset or hung up */
};

static enum client_state client_state(int fd)
{
    struct pollfd pf = {.fd = fd, .events = POLLRDHUP};
    if (fd < 0 || poll(&pf, 1, 0) <= 0)
        return CLIENT_HERE;
    if (pf.revents & (POLLHUP | POLLERR))
        return CLIENT_GONE;
    return pf.revents & POLLRDHUP ? CLIENT_HALF_CLOSED : CLIENT_HERE;
}

/* What probes a client that sent its FIN before any byte of the answer: an interim response,
 * which HTTP/1.1 clients skip (RFC 9110 section 15.2). */
static const char probe_continue[] = "HTTP/1.1 100 Continue\r\n\r\n";

/* Waits on @p's condition for WAIT_MS (srv.mu held); @streaming: its response has begun.
 * Returns false when the client left (the request is then cancelled) or the server stops.
 * A client may shut down its writing side once its request is sent and still read the answer
 * (RFC 9112 section 9.6), and a FIN looks the same whether it did that or closed: so the first
 * FIN is answered with a probe - a 100 Continue before the answer, an SSE comment within a
 * stream (then set @p->ping for stream_read) - that a closed socket answers with a reset; and
 * again every PROBE_NS, since it may close for good while it waits. An HTTP/1.0 client cannot
 * take a 1xx: its FIN is its leaving. */
static bool wait_step(struct sreq *p, bool streaming)
{
    struct srv *s = p->s;
    if (s->ready < 0)
        return false;
    enum client_state cs = client_state(p->fd);
    uint64_t now = shardlm_now_ns();
    if (cs == CLIENT_HALF_CLOSED && (!p->probed_ns || now - p->probed_ns >= PROBE_NS) &&
        (streaming || p->continues < MAX_CONTINUES)) {
        p->probed_ns = now;
        if (streaming) {
            p->ping = true;
            return true;
        }
        p->continues++;
        ssize_t n = p->http11 ? send(p->fd, probe_continue, sizeof(probe_continue) - 1,
                                     MSG_NOSIGNAL | MSG_DONTWAIT)
                              : -1;
        if (n != (ssize_t)sizeof(probe_continue) - 1)
            cs = CLIENT_GONE;
    }
    if (cs == CLIENT_GONE) {
        sreq_cancel_locked(p);
        return false;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += WAIT_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&p->cv, &s->mu, &ts);
    return true;
}

/* Queues @j (consumed) as the answer, with "Connection: close" when @close. */
static enum MHD_Result queue_json(struct MHD_Connection *c, unsigned status, json_t *j, bool close)
{
    char *t = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    if (!t)
        return MHD_NO;
    size_t n = strlen(t);
    t[n] = '\n'; /* json_dumps' terminator becomes the body's last newline */
    struct MHD_Response *r = MHD_create_response_from_buffer(n + 1, t, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(t);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (close)
        MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *j)
{
    return queue_json(c, status, j, false);
}

/* OpenAI's error object for @msg; param is the field a 400 names ("temperature: out of
 * range..."), else null. */
static json_t *error_json(unsigned status, const char *type, const char *code, const char *msg)
{
    char param[64] = "";
    size_t k = strspn(msg, "abcdefghijklmnopqrstuvwxyz_.");
    if (status == 400 && k && k < sizeof(param) && (msg[k] == ':' || msg[k] == '['))
        memcpy(param, msg, k);
    return json_pack("{s:{s:o,s:s,s:s?,s:s?}}", "error", "message", text_json(msg, strlen(msg)),
                     "type", type, "param", *param ? param : NULL, "code", code);
}

/* An error that ends the connection: its request's framing cannot be trusted. */
static enum MHD_Result send_error_close(struct MHD_Connection *c, struct conn *cn, unsigned status,
                                        const char *msg)
{
    cn->closing = true;
    return queue_json(c, status, error_json(status, "invalid_request_error", NULL, msg), true);
}

/* The gate's refusal of a request head: a whole 400 response with our error object. */
static bool gate_refusal(void *arg, const char *why, char **out, size_t *len)
{
    (void)arg;
    json_t *j = error_json(400, "invalid_request_error", NULL, why);
    char *t = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!t)
        return false;
    size_t n = strlen(t) + 1; /* and its newline */
    *out = malloc(n + 160);
    if (*out)
        *len = (size_t)snprintf(*out, n + 160,
                                "HTTP/1.1 400 Bad Request\r\nConnection: close\r\n"
                                "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s\n",
                                n, t);
    free(t);
    return *out != NULL;
}

/* A connection whose first request head passed the gate. */
static void gate_admit(void *arg, int fd, const struct sockaddr *addr, socklen_t len)
{
    struct srv *s = arg;
    MHD_add_connection(s->d, fd, addr, len); /* it closes @fd when it cannot take it */
}

/* An OpenAI error object. */
static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *type,
                                  const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *type,
                                  const char *code, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return send_json(c, status, error_json(status, type, code, msg));
}

/* The framing headers of a request, counted. */
struct framing {
    int n_length, n_encoding;
    const char *length; /* the first Content-Length */
    bool lengths_differ;
    bool spaced_name; /* a field name that ends in whitespace: libmicrohttpd keeps it apart */
    bool other_coding; /* a Transfer-Encoding other than chunked */
};

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key,
                                     const char *value)
{
    struct framing *f = cls;
    (void)kind;
    size_t n = strlen(key);
    if (n && (key[n - 1] == ' ' || key[n - 1] == '\t'))
        f->spaced_name = true;
    if (!strcasecmp(key, "Content-Length")) {
        if (f->n_length++ && strcmp(value, f->length))
            f->lengths_differ = true;
        else
            f->length = value;
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        f->n_encoding++;
        f->other_coding |= !coord_gate_chunked(value, strlen(value));
    }
    return MHD_YES;
}

/* Why the body of request @c cannot be delimited without guessing (RFC 9112 section 6.3: a
 * proxy in front may read the other header), or NULL. libmicrohttpd reads the first
 * Content-Length, or Transfer-Encoding over it. */
static const char *framing_error(struct MHD_Connection *c)
{
    struct framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_framing, &f);
    if (f.spaced_name)
        return "whitespace between a header field's name and its colon (RFC 9112 section 5.1)";
    if (f.n_encoding > 1)
        return "Transfer-Encoding: given more than once";
    if (f.other_coding)
        return "Transfer-Encoding: only chunked is taken";
    if (f.n_encoding && f.n_length)
        return "Transfer-Encoding and Content-Length together: send one of them";
    if (f.lengths_differ)
        return "Content-Length: two different values";
    return NULL;
}

static bool authorized(const struct srv *s, struct MHD_Connection *c)
{
    const char *key = s->o->api_key;
    if (!key)
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7))
        return false;
    h += 7;
    size_t n = strlen(key), m = strlen(h);
    unsigned diff = (unsigned)(n ^ m);
    for (size_t i = 0; i < n; i++) /* the same time whatever the key's first wrong byte */
        diff |= (unsigned)(key[i] ^ (i < m ? h[i] : 0));
    return diff == 0;
}

/* The streamed body: what on_event appended, as it comes. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct sreq *p = cls;
    struct srv *s = p->s;
    (void)pos;
    static const char comment[] = ":\n\n"; /* an SSE comment: clients skip it */
    pthread_mutex_lock(&s->mu);
    while (p->off == p->len && p->state == SREQ_RUNNING && !p->cancel && !p->ping)
        if (!wait_step(p, true))
            break;
    ssize_t n;
    if (p->off < p->len) {
        n = (ssize_t)(p->len - p->off < max ? p->len - p->off : max);
        memcpy(buf, p->out + p->off, (size_t)n);
        p->off += (size_t)n;
        p->ping = false; /* these bytes probe the client as well */
    } else if (p->ping && !p->cancel && max >= sizeof(comment) - 1) {
        n = (ssize_t)sizeof(comment) - 1;
        memcpy(buf, comment, (size_t)n);
        p->ping = false;
    } else
        n = p->state == SREQ_DONE ? MHD_CONTENT_READER_END_OF_STREAM
                                  : MHD_CONTENT_READER_END_WITH_ERROR;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void stream_free(void *cls)
{
    struct sreq *p = cls;
    pthread_mutex_lock(&p->s->mu);
    if (p->state == SREQ_RUNNING || p->state == SREQ_PENDING)
        sreq_cancel_locked(p);
    bool last = sreq_unref_locked(p);
    pthread_mutex_unlock(&p->s->mu);
    if (last)
        sreq_free(p);
}

/* The prompt of chat request @q: its messages through the chat template, tokenized with the
 * special tokens the template wrote (and no BOS of its own: the template writes it, as Hugging
 * Face's apply_chat_template has it). Returns 0, or -EINVAL / -ENOMEM with @why set. */
static int chat_prompt(struct srv *s, struct coord_completion_req *q, char *why, size_t wlen)
{
    if (!s->chat.jinja) {
        snprintf(why, wlen, "%s", s->chat_why);
        return -EINVAL;
    }
    char *text;
    size_t n;
    bool bad;
    int rc = coord_chat_render(&s->chat, q->messages, q->add_generation_prompt, q->tmpl_kwargs,
                               &text, &n, &bad, why, wlen);
    if (rc == -ENOMEM)
        return rc;
    if (rc) { /* malformed messages, a template that raised or passed a limit: the request's */
        char m[240];
        snprintf(m, sizeof(m), "%.239s", why);
        snprintf(why, wlen, "%s%s", bad ? "" : "the chat template: ", m);
        return -EINVAL;
    }
    /* a llama2.c vocabulary parses no special tokens: a leading BOS text is the BOS id */
    unsigned flags = COORD_TOK_ENC_PARSE_SPECIAL;
    size_t skip = strlen(s->chat.bos);
    if (s->tok.type == COORD_TOK_SPM_LLAMA2C && skip && n >= skip &&
        !memcmp(text, s->chat.bos, skip))
        flags |= COORD_TOK_ENC_BOS;
    else
        skip = 0;
    int np = n > BODY_MAX * 8 ? -E2BIG
             : (q->ids = malloc((n + 3) * sizeof(int32_t)))
                 ? coord_tok_encode_ex(&s->tok, text + skip, n - skip, flags, q->ids, (int)n + 3)
                 : -ENOMEM;
    free(text);
    if (np < 0 && np != -ENOMEM)
        snprintf(why, wlen, "cannot tokenize the rendered prompt: %s",
                 np == -EILSEQ ? "a character this vocabulary cannot spell" : strerror(-np));
    q->n_ids = np < 0 ? 0 : np;
    if (np >= 0 && np > s->context) {
        snprintf(why, wlen, "the prompt has %d tokens, more than the context (%d)", np, s->context);
        return -EINVAL;
    }
    if (np == 0) {
        snprintf(why, wlen, "the chat template rendered an empty prompt");
        return -EINVAL;
    }
    return np < 0 ? (np == -ENOMEM ? -ENOMEM : -EINVAL) : 0;
}

/* POST /v1/completions and /v1/chat/completions (@chat). */
static enum MHD_Result generate(struct srv *s, struct MHD_Connection *c, struct conn *cn, bool chat)
{
    pthread_mutex_lock(&s->mu);
    int ready = s->ready; /* the tokenizer and the context are known once it is 1 */
    pthread_mutex_unlock(&s->mu);
    if (ready != 1)
        return send_error(c, 503, "unavailable_error", NULL,
                          ready == ENGINE_LOST ? "the engine is lost: the server is stopping"
                          : ready              ? "the server is stopping"
                                               : "the model is loading");
    struct sreq *p = calloc(1, sizeof(*p));
    if (!p)
        return send_error(c, 500, "server_error", NULL, "out of memory");
    p->s = s;
    p->refs = 1;
    p->last_token = -1;
    p->created = (long long)time(NULL);
    pthread_cond_init(&p->cv, NULL);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    p->fd = ci ? ci->connect_fd : -1;
    p->http11 = cn->http11;
    pthread_mutex_lock(&s->mu);
    p->next = s->all;
    if (s->all)
        s->all->prev = p;
    s->all = p;
    snprintf(p->id, sizeof(p->id), "%s-%llu", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)++s->next_id);
    pthread_mutex_unlock(&s->mu);
    char why[300];
    int prc = coord_completion_parse(cn->body ? cn->body : "", cn->len, s->tok.vocab_size,
                                     s->context, chat, &p->q, why, sizeof(why));
    struct coord_completion_req *q = &p->q;
    if (!prc && chat)
        prc = chat_prompt(s, q, why, sizeof(why));
    if (!prc && q->prompt) { /* here, not on the scheduler's thread: the tokenizer is read-only */
        size_t n = strlen(q->prompt); /* at most BODY_MAX bytes: ~50 ms for the encoder */
        int np = (q->ids = malloc((n + 3) * sizeof(int32_t)))
                     ? coord_tok_encode(&s->tok, q->prompt, true, false, q->ids, (int)n + 3)
                     : -ENOMEM;
        if (np < 0)
            snprintf(why, sizeof(why), "cannot tokenize the prompt: %s",
                     np == -EILSEQ ? "a character this vocabulary cannot spell" : strerror(-np));
        prc = np < 0 ? np : 0;
        q->n_ids = np < 0 ? 0 : np;
    }
    if (prc) {
        enum MHD_Result rc = prc == -ENOMEM
                                 ? send_error(c, 500, "server_error", NULL, "out of memory")
                                 : send_error(c, 400, "invalid_request_error", NULL, "%s", why);
        sreq_unref(p);
        return rc;
    }
    pthread_mutex_lock(&s->mu);
    unsigned status = 0;
    if (s->ready != 1)
        status = 503;
    else if (s->open >= s->limit) {
        status = 429;
        s->m.refused++;
    } else {
        p->refs++; /* the scheduler's */
        p->t_arrive = shardlm_now_ns();
        s->open++;
        *s->pending_tail = p;
        s->pending_tail = &p->next_pending;
        pthread_cond_signal(&s->wake);
        while (p->state == SREQ_PENDING && wait_step(p, false))
            ;
    }
    enum sreq_state st = p->state;
    bool stopping = s->ready < 0;
    pthread_mutex_unlock(&s->mu);
    if (status) {
        sreq_unref(p);
        return status == 503
                   ? send_error(c, 503, "unavailable_error", NULL, "the server is stopping")
                   : send_error(c, 429, "rate_limit_error", NULL,
                                "too many requests queued (%u): try again later", s->limit);
    }
    if (st == SREQ_REFUSED || st == SREQ_PENDING) {
        enum MHD_Result rc =
            st == SREQ_PENDING
                ? (stopping ? send_error(c, 503, "unavailable_error", NULL, "the server stopped")
                            : MHD_NO) /* the client left */
                : send_error(c, p->status,
                             p->status >= 500 ? "server_error" : "invalid_request_error", NULL,
                             "%s", p->err);
        sreq_unref(p);
        return rc;
    }
    /* accepted: the first token may be a long queue away, and a stream may pause; the client's
     * leaving is seen by its socket's hang-up, not by an idle timeout */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    if (p->q.stream) {
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, p, stream_free);
        if (!r) {
            stream_free(p);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        enum MHD_Result rc = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return rc;
    }
    pthread_mutex_lock(&s->mu);
    while (p->state == SREQ_RUNNING && wait_step(p, false))
        ;
    bool done = p->state == SREQ_DONE;
    stopping = s->ready < 0 || (done && p->finish == COORD_FINISH_CANCELLED && !p->cancel);
    if (done && (p->finish == COORD_FINISH_ERROR || stopping)) {
        /* no 200 for what did not complete: the engine failed, or a drain ran out of time */
        char msg[sizeof(p->err)];
        snprintf(msg, sizeof(msg), "%s", *p->err ? p->err : "the engine failed");
        bool failed = p->finish == COORD_FINISH_ERROR;
        pthread_mutex_unlock(&s->mu);
        sreq_unref(p);
        return failed ? send_error(c, 500, "server_error", NULL, "%s", msg)
                      : send_error(c, 503, "unavailable_error", NULL,
                                   "the server stopped before the request finished");
    }
    if (!done && stopping) {
        pthread_mutex_unlock(&s->mu);
        sreq_unref(p);
        return send_error(c, 503, "unavailable_error", NULL, "the server stopped");
    }
    json_t *o = NULL;
    if (done) { /* the response takes the logprobs object */
        o = response_json(p, p->out ? p->out : "", p->len, p->finish, true,
                          p->q.logprobs >= 0 ? (p->lp ? p->lp : logprobs_new(p)) : NULL);
        p->lp = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    sreq_unref(p);
    return done ? send_json(c, 200, o) : MHD_NO;
}

/* ---- /metrics, /tokenize, /detokenize ---- */

struct text {
    char *b;
    size_t len, cap;
    bool failed;
};

static void text_printf(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_printf(struct text *t, const char *fmt, ...)
{
    for (int tries = 0; tries < 2 && !t->failed; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->b ? t->b + t->len : NULL, t->b ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if (t->b && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = 2 * (t->len + (size_t)n) + 1024;
        char *b = realloc(t->b, cap);
        if (!b)
            t->failed = true;
        else {
            t->b = b;
            t->cap = cap;
        }
    }
}

static void put_metric(struct text *t, const char *name, const char *type, const char *help,
                       double v)
{
    text_printf(t, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static void put_hist(struct text *t, const char *name, const char *help, const struct hist *h)
{
    text_printf(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < HIST_BOUNDS; i++)
        text_printf(t, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i],
                    (unsigned long long)h->bucket[i]);
    text_printf(t, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n", name,
                (unsigned long long)h->count, name, h->sum, name, (unsigned long long)h->count);
}

/* GET /metrics: Prometheus' text format (version 0.0.4). */
static enum MHD_Result metrics(struct srv *s, struct MHD_Connection *c)
{
    pthread_mutex_lock(&s->mu);
    struct metrics m = s->m;
    uint32_t open = s->open;
    int ready = s->ready;
    pthread_mutex_unlock(&s->mu);
    struct text t = {0};
    if (s->o->version) { /* "0.1.0 (commit X)": version and commit as labels */
        const char *v = s->o->version, *sp = strchr(v, ' '), *commit = strstr(v, "(commit ");
        int vn = sp ? (int)(sp - v) : (int)strlen(v), cn = 0;
        if (commit) {
            commit += 8;
            cn = (int)strcspn(commit, ")\"\\\n");
        }
        text_printf(&t,
                    "# HELP shardlm_build_info The version and git commit of this server\n"
                    "# TYPE shardlm_build_info gauge\n"
                    "shardlm_build_info{version=\"%.*s\",commit=\"%.*s\"} 1\n",
                    vn, v, cn, commit ? commit : "");
    }
    put_metric(&t, "shardlm_ready", "gauge", "1 when the model is loaded and served", ready == 1);
    put_metric(&t, "shardlm_requests_running", "gauge", "Sequences in the running batch",
               m.st.running);
    /* queued on the connections' side or waiting in the scheduler */
    uint32_t waiting = open > m.st.running ? open - m.st.running : 0;
    put_metric(&t, "shardlm_requests_waiting", "gauge", "Requests accepted and not yet running",
               waiting);
    put_metric(&t, "shardlm_kv_blocks_capacity", "gauge", "KV cache blocks (16 positions each)",
               m.st.blocks);
    put_metric(&t, "shardlm_kv_blocks_used", "gauge", "KV cache blocks held by sequences",
               m.st.blocks_used);
    put_metric(&t, "shardlm_kv_blocks_cached", "gauge",
               "KV cache blocks kept for the prefix cache and held by no sequence",
               m.st.blocks_cached);
    put_metric(&t, "shardlm_prefix_cache_queried_tokens_total", "counter",
               "Prompt tokens looked up in the prefix cache", (double)m.st.prompt_tokens);
    put_metric(&t, "shardlm_prefix_cache_hit_tokens_total", "counter",
               "Prompt tokens found in the prefix cache", (double)m.st.cached_tokens);
    put_metric(&t, "shardlm_prefix_cache_hit_rate", "gauge",
               "Prompt tokens found in the prefix cache over those looked up, since the start",
               m.st.prompt_tokens ? (double)m.st.cached_tokens / (double)m.st.prompt_tokens : 0);
    put_metric(&t, "shardlm_prompt_tokens_total", "counter", "Prompt tokens of finished requests",
               (double)m.prompt_tokens);
    put_metric(&t, "shardlm_generation_tokens_total", "counter", "Tokens generated",
               (double)m.generated_tokens);
    put_metric(&t, "shardlm_preemptions_total", "counter",
               "Sequences preempted when the KV cache ran out", (double)m.st.preemptions);
    text_printf(&t, "# HELP shardlm_requests_total Requests finished, by finish reason\n"
                    "# TYPE shardlm_requests_total counter\n");
    for (int f = COORD_FINISH_STOP; f <= COORD_FINISH_ERROR; f++)
        text_printf(&t, "shardlm_requests_total{finish=\"%s\"} %llu\n",
                    coord_finish_name((enum coord_finish)f), (unsigned long long)m.finished[f]);
    put_metric(&t, "shardlm_requests_refused_total", "counter",
               "Requests refused after parsing (past the context or the KV cache, queue full)",
               (double)m.refused);
    put_hist(&t, "shardlm_time_to_first_token_seconds",
             "From a request's arrival to its first token", &m.ttft);
    put_hist(&t, "shardlm_inter_token_latency_seconds", "Between a request's consecutive tokens",
             &m.itl);
    put_hist(&t, "shardlm_step_seconds", "One scheduler step (a batched forward and sampling)",
             &m.step);
    if (t.failed || !t.b) {
        free(t.b);
        return send_error(c, 500, "server_error", NULL, "out of memory");
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(t.len, t.b, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(t.b);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result rc = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return rc;
}

/* The body of /tokenize or /detokenize as an object, or NULL after answering a 400 / 503. */
static json_t *tok_body(struct srv *s, struct MHD_Connection *c, struct conn *cn,
                        enum MHD_Result *rc)
{
    pthread_mutex_lock(&s->mu);
    int ready = s->ready;
    pthread_mutex_unlock(&s->mu);
    if (ready <= 0) {
        *rc = send_error(c, 503, "unavailable_error", NULL,
                         ready ? "the server is stopping" : "the model is loading");
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loadb(cn->body ? cn->body : "", cn->len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        *rc = send_error(c, 400, "invalid_request_error", NULL, "expected a JSON object%s%s",
                         j ? "" : ": ", j ? "" : je.text);
        return NULL;
    }
    return j;
}

/* POST /tokenize {"content": TEXT, "add_special": false}: {"tokens": [ids]} (llama.cpp's). */
static enum MHD_Result tokenize(struct srv *s, struct MHD_Connection *c, struct conn *cn)
{
    enum MHD_Result rc;
    json_t *j = tok_body(s, c, cn, &rc);
    if (!j)
        return rc;
    json_t *ct = json_object_get(j, "content"), *sp = json_object_get(j, "add_special");
    if (!json_is_string(ct) || memchr(json_string_value(ct), '\0', json_string_length(ct)) ||
        (sp && !json_is_boolean(sp))) {
        json_decref(j);
        return send_error(c, 400, "invalid_request_error", NULL,
                          "expected {\"content\": a string, \"add_special\": true or false}");
    }
    size_t n = json_string_length(ct);
    int32_t *ids = malloc((n + 3) * sizeof(int32_t));
    int nt = ids ? coord_tok_encode(&s->tok, json_string_value(ct), json_is_true(sp), false, ids,
                                    (int)n + 3)
                 : -ENOMEM;
    json_decref(j);
    if (nt < 0) {
        free(ids);
        return nt == -ENOMEM ? send_error(c, 500, "server_error", NULL, "out of memory")
                             : send_error(c, 400, "invalid_request_error", NULL,
                                          "cannot tokenize the content: %s",
                                          nt == -EILSEQ ? "a character this vocabulary cannot spell"
                                                        : strerror(-nt));
    }
    json_t *arr = json_array();
    for (int i = 0; arr && i < nt; i++)
        if (json_array_append_new(arr, json_integer(ids[i]))) {
            json_decref(arr);
            arr = NULL;
        }
    free(ids);
    return arr ? send_json(c, 200, json_pack("{s:o}", "tokens", arr))
               : send_error(c, 500, "server_error", NULL, "out of memory");
}

/* POST /detokenize {"tokens": [ids]}: {"content": TEXT} (byte tokens joined into characters,
 * ill-formed bytes as U+FFFD, BOS, EOS and control tokens left out). */
static enum MHD_Result detokenize(struct srv *s, struct MHD_Connection *c, struct conn *cn)
{
    enum MHD_Result rc;
    json_t *j = tok_body(s, c, cn, &rc);
    if (!j)
        return rc;
    json_t *ids = json_object_get(j, "tokens");
    struct text t = {0};
    struct coord_utf8 u = {0};
    char buf[3 * 256 + 12];
    int prev = -1;
    size_t i;
    json_t *v;
    bool bad = !json_is_array(ids);
    json_array_foreach(bad ? NULL : ids, i, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= s->tok.vocab_size) {
            bad = true;
            break;
        }
        int id = (int)json_integer_value(v);
        size_t len;
        const char *piece = coord_tok_decode(&s->tok, prev, id, &len);
        prev = id;
        if (id == s->tok.bos_id || id == s->tok.eos_id || !coord_tok_printable(piece, len))
            continue;
        for (size_t off = 0; off < len; off += 256) {
            size_t n = coord_utf8_feed(&u, piece + off, len - off < 256 ? len - off : 256, buf);
            text_printf(&t, "%.*s", (int)n, buf);
        }
    }
    json_decref(j);
    if (bad) {
        free(t.b);
        return send_error(c, 400, "invalid_request_error", NULL,
                          "expected {\"tokens\": [token ids in [0, %d)]}", s->tok.vocab_size);
    }
    size_t n = coord_utf8_flush(&u, buf);
    text_printf(&t, "%.*s", (int)n, buf);
    if (t.failed) {
        free(t.b);
        return send_error(c, 500, "server_error", NULL, "out of memory");
    }
    json_t *o = json_pack("{s:o}", "content", text_json(t.b ? t.b : "", t.len));
    free(t.b);
    return send_json(c, 200, o);
}

/* ---- connections: the request deadline ---- */

/* The deadline's state of connection @c: a request of it is being answered (@busy), or it is
 * waiting for the next one from now. */
static void sock_busy(struct srv *s, struct MHD_Connection *c, bool busy)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct sock *k = ci ? ci->socket_context : NULL;
    if (!k)
        return;
    pthread_mutex_lock(&s->sock_mu);
    k->busy = busy;
    k->since = shardlm_now_ns();
    pthread_mutex_unlock(&s->sock_mu);
}

/* Connections as they open and close: the watchdog's list. */
static void notify_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                              enum MHD_ConnectionNotificationCode code)
{
    struct srv *s = cls;
    struct sock *k = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci || !(k = calloc(1, sizeof(*k))))
            return; /* no deadline for this one: only the idle timeout */
        k->fd = ci->connect_fd;
        k->since = shardlm_now_ns();
        pthread_mutex_lock(&s->sock_mu);
        k->next = s->socks;
        if (s->socks)
            s->socks->prev = k;
        s->socks = k;
        pthread_mutex_unlock(&s->sock_mu);
        *socket_context = k;
    } else if (k) { /* closed: before libmicrohttpd closes the descriptor */
        pthread_mutex_lock(&s->sock_mu);
        if (k->prev)
            k->prev->next = k->next;
        else
            s->socks = k->next;
        if (k->next)
            k->next->prev = k->prev;
        pthread_mutex_unlock(&s->sock_mu);
        free(k);
        *socket_context = NULL;
    }
}

/* Every half second: a connection past REQUEST_DEADLINE_S without a whole request is shut down
 * (its thread then sees the end of the stream and closes it). */
static void *watchdog(void *arg)
{
    struct srv *s = arg;
    pthread_mutex_lock(&s->sock_mu);
    while (s->watching) {
        uint64_t now = shardlm_now_ns();
        for (struct sock *k = s->socks; k; k = k->next)
            if (!k->busy && !k->cut && now - k->since > REQUEST_DEADLINE_S * 1000000000ull) {
                shutdown(k->fd, SHUT_RDWR);
                k->cut = true;
            }
        pthread_mutex_unlock(&s->sock_mu);
        usleep(500 * 1000);
        pthread_mutex_lock(&s->sock_mu);
    }
    pthread_mutex_unlock(&s->sock_mu);
    return NULL;
}

/* the chat page (coordinator/server/page/index.html, embedded by cmake/embed.cmake) */
extern const unsigned char coord_page_index[];
extern const size_t coord_page_index_len;

/* GET /: the page, from the binary; it loads nothing from elsewhere (the CSP says so). */
static enum MHD_Result send_page(struct MHD_Connection *c)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        coord_page_index_len, (void *)coord_page_index, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; style-src "
                            "'unsafe-inline'; connect-src 'self'; img-src data:");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    enum MHD_Result rc = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return rc;
}

/* POST /apply-template {"messages", "add_generation_prompt", "chat_template_kwargs"}:
 * {"prompt": TEXT}, the chat template's rendering (llama.cpp's). */
static enum MHD_Result apply_template(struct srv *s, struct MHD_Connection *c, struct conn *cn)
{
    enum MHD_Result rc;
    json_t *j = tok_body(s, c, cn, &rc);
    if (!j)
        return rc;
    if (!s->chat.jinja) {
        json_decref(j);
        return send_error(c, 400, "invalid_request_error", NULL, "%s", s->chat_why);
    }
    char *text, why[300];
    size_t n;
    bool bad;
    int r = coord_chat_render_request(&s->chat, j, &text, &n, &bad, why, sizeof(why));
    json_decref(j);
    if (r == -ENOMEM)
        return send_error(c, 500, "server_error", NULL, "out of memory");
    if (r)
        return send_error(c, 400, "invalid_request_error", NULL, "%s%s",
                          bad ? "" : "the chat template: ", why);
    json_t *o = json_pack("{s:o}", "prompt", text_json(text, n));
    free(text);
    return send_json(c, 200, o);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
    struct srv *s = cls;
    struct conn *cn = *con_cls;
    if (!cn) { /* the headers: a context for the body, and no Nagle delay on this socket */
        if (!(cn = calloc(1, sizeof(*cn))))
            return MHD_NO;
        *con_cls = cn;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        int one = 1;
        if (ci)
            setsockopt(ci->connect_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        cn->http11 = strcmp(version, MHD_HTTP_VERSION_1_0) != 0;
        const char *why = framing_error(c);
        if (why) /* answered before the body is read; the connection closes after it */
            return send_error_close(c, cn, 400, why);
        return MHD_YES;
    }
    if (*upload_size) { /* a piece of the body */
        if (!cn->too_big && cn->len + *upload_size > BODY_MAX) {
            cn->too_big = true;
            free(cn->body);
            cn->body = NULL;
        }
        if (!cn->too_big) {
            char *b = realloc(cn->body, cn->len + *upload_size);
            if (!b)
                return MHD_NO;
            memcpy(b + cn->len, upload, *upload_size);
            cn->body = b;
            cn->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    sock_busy(s, c, true); /* the whole request is in */
    if (!strncmp(url, "/v1/", 4))
        url += 3;
    /* HEAD is GET without the body (libmicrohttpd leaves the body out, the headers and the
     * status are GET's) */
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/health") && get) {
        char lost[sizeof(s->lost)];
        pthread_mutex_lock(&s->mu);
        int ready = s->ready;
        memcpy(lost, s->lost, sizeof(lost)); /* engine_lost() writes it under the lock */
        pthread_mutex_unlock(&s->mu);
        return send_json(c, ready == 1 ? 200 : 503,
                         json_pack("{s:s,s:s*}", "status",
                                   ready == 1             ? "ok"
                                   : ready == 0           ? "loading"
                                   : ready == ENGINE_LOST ? "failed"
                                                          : "stopping",
                                   "error", ready == ENGINE_LOST ? lost : NULL));
    }
    if (!strcmp(url, "/metrics") && get) /* for the scraper, like /health: no key */
        return metrics(s, c);
    if ((!strcmp(url, "/") || !strcmp(url, "/index.html")) && get) /* the page asks for the key */
        return send_page(c);
    if (!authorized(s, c))
        return send_error(c, 401, "invalid_request_error", "invalid_api_key",
                          "a missing or wrong API key (Authorization: Bearer KEY)");
    if (cn->too_big)
        return send_error(c, 413, "invalid_request_error", NULL,
                          "the request body is larger than %u bytes", BODY_MAX);
    if (!strcmp(url, "/models") && get)
        return send_json(c, 200,
                         json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id",
                                   s->model, "object", "model", "created", (json_int_t)0,
                                   "owned_by", "shardlm"));
    if (!strncmp(url, "/models/", 8) && get) /* the loaded model by its name */
        return strcmp(url + 8, s->model)
                   ? send_error(c, 404, "invalid_request_error", "model_not_found",
                                "no model named '%.200s' (this server has '%s')", url + 8, s->model)
                   : send_json(c, 200,
                               json_pack("{s:s,s:s,s:I,s:s}", "id", s->model, "object", "model",
                                         "created", (json_int_t)0, "owned_by", "shardlm"));
    if (!strcmp(url, "/completions") && post)
        return generate(s, c, cn, false);
    if (!strcmp(url, "/chat/completions") && post)
        return generate(s, c, cn, true);
    if (!strcmp(url, "/tokenize") && post)
        return tokenize(s, c, cn);
    if (!strcmp(url, "/detokenize") && post)
        return detokenize(s, c, cn);
    if (!strcmp(url, "/apply-template") && post)
        return apply_template(s, c, cn);
    if (!strcmp(url, "/completions") || !strcmp(url, "/models") || !strcmp(url, "/metrics") ||
        !strcmp(url, "/tokenize") || !strcmp(url, "/detokenize") ||
        !strcmp(url, "/chat/completions") || !strcmp(url, "/apply-template"))
        return send_error(c, 405, "invalid_request_error", NULL, "%s is not allowed on %s", method,
                          url);
    return send_error(c, 404, "invalid_request_error", NULL, "no such endpoint: %s %s", method,
                      url);
}

/* After a request. The next request of a kept-alive connection is not peeked at as its first
 * was (gate.h): libmicrohttpd may have read it already, with the body before it or in one
 * packet with it (pipelining), and waiting for it in the socket stalled such a client for the
 * whole deadline; handle() still refuses its ambiguous framing. */
static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    sock_busy(cls, c, false);
    struct conn *cn = *con_cls;
    if (cn) {
        free(cn->body);
        free(cn);
        *con_cls = NULL;
    }
}

/* ---- the server ---- */

/* During the load: passes a signal on to the engine's cancel flag, so that the load stops. */
static void *relay(void *arg)
{
    struct srv *s = arg;
    while (!__atomic_load_n(&s->loaded, __ATOMIC_ACQUIRE)) {
        sig_atomic_t sig = *s->o->stop;
        if (sig) {
            s->engine_cancel = sig;
            break;
        }
        usleep(10 * 1000);
    }
    return NULL;
}

/* The text of special token @id for a template's bos_token / eos_token; llama2.c stores them
 * between newlines ("\n<s>\n"), which are not part of the token's name. */
static void special_text(const struct coord_tok *t, int id, char *out, size_t len)
{
    if (id < 0)
        return;
    const char *p = t->vocab[id];
    size_t n = t->vocab_len[id];
    if (t->type == COORD_TOK_SPM_LLAMA2C)
        while (n && (*p == '\n' || p[n - 1] == '\n')) {
            p += *p == '\n';
            n -= 1;
        }
    snprintf(out, len, "%.*s", (int)n, p);
}

/* While the workers start: the tokenizer. */
static int load_tok(struct coord_engine *g, void *arg, struct shardlm_err *e)
{
    struct srv *s = arg;
    int rc = coord_tok_from_shlm(&s->tok, coord_engine_model(g), s->o->engine.model_path, e);
    s->tok_loaded = rc == 0;
    if (rc)
        return rc;
    /* the chat template: --chat-template's, else the model's; the text of BOS and EOS */
    const char *src = s->o->chat_template ? s->o->chat_template : s->tok.chat_template;
    const struct coord_tok *t = &s->tok;
    char bos[64] = "", eos[64] = "", why[300];
    special_text(t, t->bos_id, bos, sizeof(bos));
    special_text(t, t->eos_id, eos, sizeof(eos));
    if (!src) {
        snprintf(s->chat_why, sizeof(s->chat_why),
                 "this model has no chat template: use /v1/completions, or start the server "
                 "with --chat-template FILE");
    } else if (coord_chat_tmpl_init(&s->chat, src, strlen(src), bos, eos, why, sizeof(why))) {
        snprintf(s->chat_why, sizeof(s->chat_why),
                 "the model's chat template does not parse (%.200s): start the server with "
                 "--chat-template FILE",
                 why);
        if (s->o->engine.log)
            s->o->engine.log(s->o->engine.log_ctx, COORD_LOG_WARN, s->chat_why);
    }
    return 0;
}

/* Whether a connection is in the middle of a request: its answer is not all written yet. */
static bool conns_busy(struct srv *s)
{
    bool busy = false;
    pthread_mutex_lock(&s->sock_mu);
    for (struct sock *k = s->socks; k && !busy; k = k->next)
        busy = k->busy;
    pthread_mutex_unlock(&s->sock_mu);
    return busy;
}

/* The engine failed for good (@why): the scheduler has already ended every request it held
 * with an error (a 500, or an error event and [DONE]); what is still queued here gets a 503,
 * and so does everything that comes (/health included) until the server exits. */
static void engine_lost(struct srv *s, const char *why)
{
    pthread_mutex_lock(&s->mu);
    s->ready = ENGINE_LOST;
    snprintf(s->lost, sizeof(s->lost), "%.*s", (int)sizeof(s->lost) - 1, why);
    struct sreq *pend = s->pending, *canc = s->cancels;
    s->pending = s->cancels = NULL;
    s->pending_tail = &s->pending;
    uint32_t open = 0; /* whose connections are still to answer: failed ones and queued ones */
    for (struct sreq *p = s->all; p; p = p->next)
        open++;
    pthread_mutex_unlock(&s->mu);
    coord_notify("STOPPING=1\nSTATUS=the engine is lost: %s", why);
    if (s->o->engine.log) {
        char msg[480];
        snprintf(msg, sizeof(msg),
                 "the engine is lost (%.300s): %u open request(s) end with an error, /health "
                 "answers 503 until they are sent and the server exits",
                 why, open);
        s->o->engine.log(s->o->engine.log_ctx, COORD_LOG_WARN, msg);
    }
    char msg[sizeof(s->lost)];
    snprintf(msg, sizeof(msg), "the engine is lost: %.*s", (int)sizeof(msg) - 24, why);
    while (pend) {
        struct sreq *p = pend;
        pend = p->next_pending;
        refuse(p, 503, msg);
    }
    while (canc) { /* the scheduler is done with them */
        struct sreq *p = canc;
        canc = p->next_cancel;
        sreq_unref(p);
    }
}

int coord_serve(const struct coord_serve_opts *o, struct shardlm_err *e)
{
    struct srv s = {.o = o};
    s.pending_tail = &s.pending;
    s.m.ttft.le = ttft_le;
    s.m.itl.le = step_le;
    s.m.step.le = step_le;
    json_object_seed(0); /* jansson seeds its hash function once, before any thread uses it */
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.wake, NULL);
    const char *base = strrchr(o->engine.model_path, '/');
    snprintf(s.model, sizeof(s.model), "%s", base ? base + 1 : o->engine.model_path);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    if (inet_pton(AF_INET, o->host ? o->host : "127.0.0.1", &addr.sin_addr) != 1)
        return shardlm_fail(e, -EINVAL, "--host '%s': expected an IPv4 address", o->host);
    pthread_mutex_init(&s.sock_mu, NULL);
    /* poll(), not select(): no FD_SETSIZE ceiling under the connection limit; the gate
     * listens and hands connections over (gate.h says why), through the ITC */
    unsigned limit = o->max_connections ? o->max_connections : MAX_CONNECTIONS;
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC |
            MHD_USE_NO_LISTEN_SOCKET,
        0, NULL, NULL, handle, &s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CONN_TIMEOUT_S,
        MHD_OPTION_CONNECTION_LIMIT, limit, MHD_OPTION_NOTIFY_COMPLETED, completed, &s,
        MHD_OPTION_NOTIFY_CONNECTION, notify_connection, &s, MHD_OPTION_END);
    s.d = d;
    struct coord_gate *gate = NULL;
    struct coord_gate_opts go = {.addr = addr,
                                 .max_pending = limit,
                                 .deadline_s = REQUEST_DEADLINE_S,
                                 .admit = gate_admit,
                                 .refusal = gate_refusal,
                                 .arg = &s};
    int grc = d ? coord_gate_start(&gate, &go) : -ENOMEM;
    if (grc) {
        if (d)
            MHD_stop_daemon(d);
        pthread_mutex_destroy(&s.sock_mu);
        return shardlm_fail(e, grc, "cannot listen on %s:%d: %s%s",
                            o->host ? o->host : "127.0.0.1", o->port, strerror(-grc),
                            grc == -EADDRNOTAVAIL ? " (not an address of this host)" : "");
    }
    pthread_t watch_thread;
    s.watching = true; /* before the thread reads it */
    if (pthread_create(&watch_thread, NULL, watchdog, &s))
        s.watching = false;
    int port = coord_gate_port(gate);
    if (o->on_listen)
        o->on_listen(o->arg, port);
    coord_notify("STATUS=loading %s (GET /health answers 503 until it serves)", s.model);
    struct coord_engine *eng = NULL;
    struct coord_engine_opts eo = o->engine;
    eo.while_starting = load_tok;
    eo.arg = &s;
    eo.kv_fit = true;
    if (!eo.max_seqs)
        eo.max_seqs = 16;
    pthread_t relay_thread;
    bool relaying = false;
    if (o->stop) {
        eo.cancel = &s.engine_cancel;
        relaying = pthread_create(&relay_thread, NULL, relay, &s) == 0;
        if (!relaying)
            eo.cancel = o->stop; /* no drain then: a signal stops it */
    }
    int rc = coord_engine_start(&eng, &eo, e);
    if (relaying) {
        __atomic_store_n(&s.loaded, 1, __ATOMIC_RELEASE);
        pthread_join(relay_thread, NULL);
        if (!rc && *o->stop) /* a signal as the load ended: no request came, stop */
            rc = -ECANCELED;
    }
    struct coord_sched_opts so = o->sched;
    so.max_seqs = eo.max_seqs;
    if (!rc)
        rc = coord_sched_init(&s.sched, eng, &s.tok, &so, e);
    if (!rc) {
        coord_sched_stats(s.sched, &s.m.st);
        s.context = (int)coord_engine_model(eng)->hdr->cfg.seq_len;
        s.limit = eo.max_seqs + (o->max_waiting ? o->max_waiting : 4 * eo.max_seqs);
        pthread_mutex_lock(&s.mu);
        s.ready = 1;
        pthread_mutex_unlock(&s.mu);
        if (o->on_ready)
            o->on_ready(o->arg, eng);
        /* after ready = 1: a manager that calls the unit started finds /health at 200 */
        coord_notify("READY=1\nSTATUS=serving %s on %s:%d", s.model,
                     o->host ? o->host : "127.0.0.1", port);
        if (o->engine.log)
            o->engine.log(o->engine.log_ctx, COORD_LOG_INFO, "serving");
    }
    uint64_t drain_end = 0; /* draining since the first signal, until then */
    while (!rc) {
        if (o->stop && *o->stop && !drain_end) {
            int sig = (int)*o->stop;
            *o->stop = 0; /* the engine goes on; a second signal stops it */
            drain_end = shardlm_now_ns() + (uint64_t)o->drain_seconds * 1000000000ull + 1;
            pthread_mutex_lock(&s.mu);
            s.ready = 2;
            uint32_t open = s.open;
            pthread_mutex_unlock(&s.mu);
            coord_notify("STOPPING=1\nSTATUS=draining %u request(s) for up to %u s", open,
                         o->drain_seconds);
            if (o->engine.log) {
                char msg[160];
                snprintf(msg, sizeof(msg),
                         "signal %d: draining %u request(s) for up to %u s (a second signal "
                         "stops at once)",
                         sig, open, o->drain_seconds);
                o->engine.log(o->engine.log_ctx, COORD_LOG_INFO, msg);
            }
        } else if (o->stop ? *o->stop != 0 : (o->engine.cancel && *o->engine.cancel)) {
            break; /* a second signal */
        }
        take_queued(&s);
        if (drain_end && shardlm_now_ns() >= drain_end && !coord_sched_idle(s.sched)) {
            /* out of time: what still runs ends as cancelled, its streams with their last chunk */
            pthread_mutex_lock(&s.mu);
            for (struct sreq *p = s.all; p; p = p->next)
                if (p->state == SREQ_RUNNING)
                    coord_sched_cancel(s.sched, p->sched_id);
            pthread_mutex_unlock(&s.mu);
            rc = coord_sched_step(s.sched, e);
            break;
        }
        if (drain_end && coord_sched_idle(s.sched))
            break;
        if (coord_sched_idle(s.sched)) {
            pthread_mutex_lock(&s.mu);
            if (!s.pending && !s.cancels) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += WAIT_MS * 1000000L; /* and sees a signal this soon */
                if (ts.tv_nsec >= 1000000000L) {
                    ts.tv_sec++;
                    ts.tv_nsec -= 1000000000L;
                }
                pthread_cond_timedwait(&s.wake, &s.mu, &ts);
            }
            pthread_mutex_unlock(&s.mu);
            /* a worker that died while idle: restarted now, or the engine is lost now (not at
             * the next request, with /health saying ok until then) */
            if ((rc = coord_engine_check(eng, e)))
                break;
            continue;
        }
        uint64_t t0 = shardlm_now_ns();
        rc = coord_sched_step(s.sched, e);
        struct coord_sched_stats st;
        coord_sched_stats(s.sched, &st);
        pthread_mutex_lock(&s.mu);
        hist_observe(&s.m.step, (double)(shardlm_now_ns() - t0) / 1e9);
        s.m.st = st;
        pthread_mutex_unlock(&s.mu);
    }
    bool lost = rc && rc != -ECANCELED && s.sched; /* the engine failed while serving */
    if (lost)
        engine_lost(&s, e->msg);
    if (rc == -ECANCELED) /* a second signal, or one during the load */
        rc = 0;
    /* a drain that ended, or a lost engine, lets the connections send what their requests wrote
     * (each lets its request go once sent, and is busy until its answer is written), for up to
     * a few more seconds */
    uint64_t flush_end = shardlm_now_ns() + FLUSH_NS;
    /* not after a second signal */
    bool flush = lost || (drain_end && s.sched && coord_sched_idle(s.sched));
    pthread_mutex_lock(&s.mu);
    while (flush && (s.all || conns_busy(&s)) && shardlm_now_ns() < flush_end) {
        pthread_mutex_unlock(&s.mu);
        usleep(10 * 1000);
        pthread_mutex_lock(&s.mu);
    }
    /* stop: every waiting connection gives up, then the connections end */
    s.ready = -1;
    for (struct sreq *p = s.all; p; p = p->next)
        pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&s.mu);
    coord_gate_stop(gate); /* no new connections */
    MHD_stop_daemon(d);
    if (s.watching) {
        pthread_mutex_lock(&s.sock_mu);
        s.watching = false;
        pthread_mutex_unlock(&s.sock_mu);
        pthread_join(watch_thread, NULL);
    }
    pthread_mutex_destroy(&s.sock_mu);
    coord_sched_free(s.sched); /* no more callbacks */
    while (s.all) {            /* what the scheduler and the queues still held */
        struct sreq *p = s.all;
        s.all = p->next;
        sreq_free(p);
    }
    coord_chat_tmpl_free(&s.chat);
    if (s.tok_loaded)
        coord_tok_free(&s.tok);
    if (eng)
        coord_engine_stop(eng);
    pthread_cond_destroy(&s.wake);
    pthread_mutex_destroy(&s.mu);
    return rc;
}
