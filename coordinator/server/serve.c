/* SPDX-License-Identifier: MIT */
/* coordinator/server/serve.c: `shardlm serve`'s life - open (listen, then load the model while
 * GET /health answers 503), run (the scheduler's steps on this thread), drain (a first signal:
 * the running requests finish), close. The rooms it drives are listed in srv.h. */
#include "srv.h"

#include "gate.h"
#include "notify.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FLUSH_NS 5000000000ull /* how long the endings of a drain or a loss may take to send */

/* ---- open ---- */

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
    if (srv_formats_init(s))
        return shardlm_fail(e, -ENOMEM, "out of memory");
    return 0;
}

/* Binds and starts the HTTP side: GET /health answers 503 from now until the model serves.
 * Returns 0, or -errno with @e set (nothing left to close). */
static int serve_open(struct srv *s, const struct coord_serve_opts *o, struct shardlm_err *e)
{
    s->o = o;
    s->pending_tail = &s->pending;
    srv_metrics_init(&s->m);
    json_object_seed(0); /* jansson seeds its hash function once, before any thread uses it */
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->wake, NULL);
    const char *base = strrchr(o->engine.model_path, '/');
    snprintf(s->model, sizeof(s->model), "%s", base ? base + 1 : o->engine.model_path);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    if (inet_pton(AF_INET, o->host ? o->host : "127.0.0.1", &addr.sin_addr) != 1)
        return shardlm_fail(e, -EINVAL, "--host '%s': expected an IPv4 address", o->host);
    int rc = srv_http_start(s, &addr, e);
    if (rc)
        return rc;
    if (o->on_listen)
        o->on_listen(o->arg, s->port);
    coord_notify("STATUS=loading %s (GET /health answers 503 until it serves)", s->model);
    return 0;
}

/* Loads the model (a signal meanwhile stops the load) and starts the scheduler: then it
 * serves. Returns 0, -ECANCELED (a signal), or -errno with @e set. */
static int serve_load(struct srv *s, struct shardlm_err *e)
{
    const struct coord_serve_opts *o = s->o;
    struct coord_engine_opts eo = o->engine;
    eo.while_starting = load_tok;
    eo.arg = s;
    eo.kv_fit = true;
    if (!eo.max_seqs)
        eo.max_seqs = 16;
    pthread_t relay_thread;
    bool relaying = false;
    if (o->stop) {
        eo.cancel = &s->engine_cancel;
        relaying = pthread_create(&relay_thread, NULL, relay, s) == 0;
        if (!relaying)
            eo.cancel = o->stop; /* no drain then: a signal stops it */
    }
    int rc = coord_engine_start(&s->eng, &eo, e);
    if (relaying) {
        __atomic_store_n(&s->loaded, 1, __ATOMIC_RELEASE);
        pthread_join(relay_thread, NULL);
        if (!rc && *o->stop) /* a signal as the load ended: no request came, stop */
            rc = -ECANCELED;
    }
    struct coord_sched_opts so = o->sched;
    so.max_seqs = eo.max_seqs;
    if (!rc)
        rc = coord_sched_init(&s->sched, s->eng, &s->tok, &so, e);
    if (rc)
        return rc;
    coord_sched_stats(s->sched, &s->m.st);
    s->context = (int)coord_engine_model(s->eng)->hdr->cfg.seq_len;
    s->limit = eo.max_seqs + (o->max_waiting ? o->max_waiting : 4 * eo.max_seqs);
    pthread_mutex_lock(&s->mu);
    s->state = SRV_SERVING;
    pthread_mutex_unlock(&s->mu);
    if (o->on_ready)
        o->on_ready(o->arg, s->eng);
    /* after SRV_SERVING: a manager that calls the unit started finds /health at 200 */
    coord_notify("READY=1\nSTATUS=serving %s on %s:%d", s->model, o->host ? o->host : "127.0.0.1",
                 s->port);
    if (o->engine.log)
        o->engine.log(o->engine.log_ctx, COORD_LOG_INFO, "serving");
    return 0;
}

/* ---- run ---- */

/* The first signal: new requests get 503, the running ones go on for up to drain_seconds.
 * Returns when the drain ends (shardlm_now_ns()). */
static uint64_t serve_drain(struct srv *s)
{
    const struct coord_serve_opts *o = s->o;
    int sig = (int)*o->stop;
    *o->stop = 0; /* the engine goes on; a second signal stops it */
    uint64_t end = shardlm_now_ns() + (uint64_t)o->drain_seconds * 1000000000ull + 1;
    pthread_mutex_lock(&s->mu);
    s->state = SRV_DRAINING;
    uint32_t open = s->open;
    pthread_mutex_unlock(&s->mu);
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
    return end;
}

/* The drain is out of time: what still runs ends as cancelled, its streams with their last
 * chunk (one more step). */
static int serve_drain_cut(struct srv *s, struct shardlm_err *e)
{
    pthread_mutex_lock(&s->mu);
    for (struct sreq *p = s->all; p; p = p->next)
        if (p->state == SREQ_RUNNING)
            coord_sched_cancel(s->sched, p->sched_id);
    pthread_mutex_unlock(&s->mu);
    return coord_sched_step(s->sched, e);
}

/* Nothing runs: waits for a request (and sees a signal within SRV_WAIT_MS), then checks the
 * workers - one that died while idle is restarted now, or the engine is lost now (not at the
 * next request, with /health saying ok until then). */
static int serve_idle(struct srv *s, struct shardlm_err *e)
{
    pthread_mutex_lock(&s->mu);
    if (!s->pending && !s->cancels) {
        struct timespec ts;
        srv_deadline(&ts, SRV_WAIT_MS);
        pthread_cond_timedwait(&s->wake, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    return coord_engine_check(s->eng, e);
}

/* One step of the scheduler, timed for /metrics. */
static int serve_step(struct srv *s, struct shardlm_err *e)
{
    uint64_t t0 = shardlm_now_ns();
    int rc = coord_sched_step(s->sched, e);
    struct coord_sched_stats st;
    coord_sched_stats(s->sched, &st);
    pthread_mutex_lock(&s->mu);
    srv_hist_observe(&s->m.step, (double)(shardlm_now_ns() - t0) / 1e9);
    s->m.st = st;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Steps until a second signal (or, without opts.stop, the engine's cancel flag), the end of a
 * drain (*@drain_end: when it began, it ends), or an error. Returns 0 or -errno with @e set. */
static int serve_run(struct srv *s, uint64_t *drain_end, struct shardlm_err *e)
{
    const struct coord_serve_opts *o = s->o;
    int rc = 0;
    while (!rc) {
        if (o->stop && *o->stop && !*drain_end)
            *drain_end = serve_drain(s);
        else if (o->stop ? *o->stop != 0 : (o->engine.cancel && *o->engine.cancel))
            break; /* a second signal */
        srv_take_queued(s);
        bool idle = coord_sched_idle(s->sched);
        if (*drain_end && shardlm_now_ns() >= *drain_end && !idle)
            return serve_drain_cut(s, e);
        if (*drain_end && idle)
            break;
        rc = idle ? serve_idle(s, e) : serve_step(s, e);
    }
    return rc;
}

/* ---- close ---- */

/* The engine failed for good (@why): the scheduler has already ended every request it held
 * with an error (a 500, or an error event and [DONE]); what is still queued here gets a 503,
 * and so does everything that comes (/health included) until the server exits. */
static void engine_lost(struct srv *s, const char *why)
{
    pthread_mutex_lock(&s->mu);
    s->state = SRV_LOST;
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
        sreq_refuse(p, 503, msg);
    }
    while (canc) { /* the scheduler is done with them */
        struct sreq *p = canc;
        canc = p->next_cancel;
        sreq_unref(p);
    }
}

/* A drain that ended, or a lost engine, lets the connections send what their requests wrote
 * (each lets its request go once sent, and is busy until its answer is written), for up to
 * FLUSH_NS; then every waiting connection gives up. */
static void serve_flush(struct srv *s, bool flush)
{
    uint64_t flush_end = shardlm_now_ns() + FLUSH_NS;
    pthread_mutex_lock(&s->mu);
    while (flush && (s->all || srv_conns_busy(s)) && shardlm_now_ns() < flush_end) {
        pthread_mutex_unlock(&s->mu);
        usleep(10 * 1000);
        pthread_mutex_lock(&s->mu);
    }
    s->state = SRV_STOPPING;
    for (struct sreq *p = s->all; p; p = p->next)
        pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Ends the connections, then frees what the requests, the scheduler and the engine held. */
static void serve_close(struct srv *s)
{
    srv_http_stop(s);
    coord_sched_free(s->sched); /* no more callbacks */
    while (s->all) {            /* what the scheduler and the queues still held */
        struct sreq *p = s->all;
        s->all = p->next;
        sreq_free(p);
    }
    coord_chat_tmpl_free(&s->chat);
    srv_formats_free(s);
    srv_grams_free(s);
    free(s->controls);
    if (s->tok_loaded)
        coord_tok_free(&s->tok);
    if (s->eng)
        coord_engine_stop(s->eng);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->mu);
}

int coord_serve(const struct coord_serve_opts *o, struct shardlm_err *e)
{
    struct srv s = {0};
    int rc = serve_open(&s, o, e);
    if (rc)
        return rc;
    rc = serve_load(&s, e);
    uint64_t drain_end = 0; /* draining since the first signal, until then */
    if (!rc)
        rc = serve_run(&s, &drain_end, e);
    bool lost = rc && rc != -ECANCELED && s.sched; /* the engine failed while serving */
    if (lost)
        engine_lost(&s, e->msg);
    if (rc == -ECANCELED) /* a second signal, or one during the load */
        rc = 0;
    /* not after a second signal */
    serve_flush(&s, lost || (drain_end && s.sched && coord_sched_idle(s.sched)));
    serve_close(&s);
    return rc;
}
