/* SPDX-License-Identifier: MIT */
/* coordinator/server/life.c: a request's life - made on its connection's thread, its prompt
 * encoded there, queued for the scheduler's thread, submitted or refused, its events recorded,
 * and freed by whichever of the two lets it go last (srv.h); the server's state beside it. */
#include "srv.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* a half-closed client is probed again this often: one that reads on may close for good later;
 * with at most this many 100 Continues (some clients take only a few 1xx: Go's took 5) */
#define PROBE_NS 2000000000ull
#define MAX_CONTINUES 4

/* ---- the server's state ---- */

enum srv_state srv_state_get(struct srv *s, char *lost)
{
    pthread_mutex_lock(&s->mu);
    enum srv_state st = s->state;
    if (lost) /* serve.c's engine_lost() writes it under the lock */
        memcpy(lost, s->lost, sizeof(s->lost));
    pthread_mutex_unlock(&s->mu);
    return st;
}

const char *srv_state_why(enum srv_state st)
{
    return st == SRV_LOST      ? "the engine is lost: the server is stopping"
           : st == SRV_LOADING ? "the model is loading"
                               : "the server is stopping";
}

/* ---- references ---- */

struct sreq *sreq_new(struct srv *s, int fd, bool http11, bool chat)
{
    struct sreq *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->s = s;
    p->refs = 1;
    p->last_token = -1;
    p->created = (long long)time(NULL);
    pthread_cond_init(&p->cv, NULL);
    p->fd = fd;
    p->http11 = http11;
    pthread_mutex_lock(&s->mu);
    p->next = s->all;
    if (s->all)
        s->all->prev = p;
    s->all = p;
    snprintf(p->id, sizeof(p->id), "%s-%llu", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)++s->next_id);
    pthread_mutex_unlock(&s->mu);
    return p;
}

void sreq_free(struct sreq *p)
{
    coord_completion_req_free(&p->q);
    srv_grammar_release(p->s, p);
    free(p->trigger);
    srv_split_free(&p->split);
    json_decref(p->lp);
    free(p->out);
    pthread_cond_destroy(&p->cv);
    free(p);
}

bool sreq_unref_locked(struct sreq *p)
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

void sreq_unref(struct sreq *p)
{
    struct srv *s = p->s;
    pthread_mutex_lock(&s->mu);
    bool last = sreq_unref_locked(p);
    pthread_mutex_unlock(&s->mu);
    if (last)
        sreq_free(p);
}

/* Queues @p's cancellation for the scheduler's thread, which holds a reference until it has
 * passed it on (srv.mu held). */
static void queue_cancel_locked(struct sreq *p)
{
    struct srv *s = p->s;
    p->cancel_queued = true;
    p->refs++;
    p->next_cancel = s->cancels;
    s->cancels = p;
}

void sreq_cancel_locked(struct sreq *p)
{
    p->cancel = true;
    if (p->state == SREQ_RUNNING && !p->cancel_queued)
        queue_cancel_locked(p);
    pthread_cond_signal(&p->s->wake);
}

bool sreq_out_put(struct sreq *p, const char *b, size_t n)
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

/* ---- the prompt ---- */

int srv_encode(const struct srv *s, const char *text, size_t n, unsigned flags, const char *what,
               int32_t **ids, char *why, size_t wlen)
{
    /* a prompt is at most SRV_BODY_MAX bytes (~50 ms for the encoder); a rendered chat may be
     * longer, up to this */
    int np = n > SRV_BODY_MAX * 8 ? -E2BIG
             : (*ids = malloc((n + 3) * sizeof(int32_t)))
                 ? coord_tok_encode_ex(&s->tok, text, n, flags, *ids, (int)n + 3)
                 : -ENOMEM;
    if (np < 0 && np != -ENOMEM)
        snprintf(why, wlen, "cannot tokenize %s: %s", what,
                 np == -EILSEQ ? "a character this vocabulary cannot spell" : strerror(-np));
    return np;
}

/* ---- the scheduler's side ---- */

/* The scheduler's callback, on its thread during a step: the figures, the response's text
 * (openai.c), and at the end the request's state. */
static void on_event(void *ctx, const struct coord_event *ev)
{
    struct sreq *p = ctx;
    struct srv *s = p->s;
    uint64_t now = shardlm_now_ns();
    pthread_mutex_lock(&s->mu);
    if (ev->token >= 0) { /* a new token: time to the first one, or since the last one */
        if (p->t_last)
            srv_hist_observe(&s->m.itl, (double)(now - p->t_last) / 1e9);
        else
            srv_hist_observe(&s->m.ttft, (double)(now - p->t_arrive) / 1e9);
        p->t_last = now;
        s->m.generated_tokens++;
    }
    p->prompt_tokens = ev->prompt_tokens;
    p->completion_tokens = ev->completion_tokens;
    p->cached_tokens = ev->cached_tokens;
    if (ev->engine_failed && (s->state == SRV_SERVING || s->state == SRV_DRAINING)) {
        /* before the first client hears of it: whoever asks /health after its error gets 503 */
        s->state = SRV_LOST;
        snprintf(s->lost, sizeof(s->lost), "%s", ev->error ? ev->error : "the engine failed");
    }
    if (!srv_event_out(p, ev) && !p->cancel)
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

void sreq_refuse(struct sreq *p, unsigned status, const char *msg)
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
        return sreq_refuse(p, 400, "prompt: empty");
    p->r = (struct coord_request){.prompt = q->ids,
                                  .n_prompt = q->n_ids,
                                  .max_tokens = q->max_tokens,
                                  .sampling = q->sampling,
                                  .stop = (const char *const *)q->stops,
                                  .n_stop = q->n_stops,
                                  .ignore_eos = q->ignore_eos,
                                  .logprobs = q->logprobs,
                                  .grammar = p->grammar,
                                  .grammar_trigger = p->trigger,
                                  .grammar_trigger_len = p->trigger_len,
                                  .grammar_trigger_at_start = p->trigger_at_start,
                                  .special_text = p->parse && s->fmt_special,
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
        return sreq_refuse(p, rc == -ENOMEM ? 500 : 400, e.msg);
    pthread_mutex_lock(&s->mu);
    p->state = SREQ_RUNNING;
    p->prompt_tokens = q->n_ids;
    p->last_token = q->ids[q->n_ids - 1]; /* the first new token's piece follows it */
    p->sched_id = id;
    if (p->cancel && !p->cancel_queued) /* the client left while it was submitted */
        queue_cancel_locked(p);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&s->mu);
}

void srv_take_queued(struct srv *s)
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
            sreq_refuse(p, 499, "the client closed the connection");
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

/* ---- the connection's side ---- */

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

/* A client may shut down its writing side once its request is sent and still read the answer
 * (RFC 9112 section 9.6), and a FIN looks the same whether it did that or closed: so the first
 * FIN is answered with a probe - a 100 Continue before the answer, an SSE comment within a
 * stream (then set @p->ping for the stream's reader) - that a closed socket answers with a
 * reset; and again every PROBE_NS, since it may close for good while it waits. An HTTP/1.0
 * client cannot take a 1xx: its FIN is its leaving. */
bool sreq_wait_step(struct sreq *p, bool streaming)
{
    struct srv *s = p->s;
    if (s->state == SRV_STOPPING)
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
    srv_deadline(&ts, SRV_WAIT_MS);
    pthread_cond_timedwait(&p->cv, &s->mu, &ts);
    return true;
}

void srv_deadline(struct timespec *ts, long ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_nsec += ms * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

unsigned sreq_queue(struct sreq *p, enum sreq_state *st, bool *stopping)
{
    struct srv *s = p->s;
    pthread_mutex_lock(&s->mu);
    unsigned status = 0;
    if (s->state != SRV_SERVING)
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
        while (p->state == SREQ_PENDING && sreq_wait_step(p, false))
            ;
    }
    *st = p->state;
    *stopping = s->state == SRV_STOPPING;
    pthread_mutex_unlock(&s->mu);
    return status;
}
