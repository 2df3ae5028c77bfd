/* SPDX-License-Identifier: MIT */
/* coordinator/server/server.h: `shardlm serve` - an OpenAI-compatible HTTP front end on the
 * scheduler (libmicrohttpd, one thread per connection; the calling thread runs the steps). */
#ifndef SHARDLM_COORD_SERVER_H
#define SHARDLM_COORD_SERVER_H

#include "engine.h"
#include "scheduler.h"
#include "util.h"

#include <signal.h>
#include <stdint.h>

struct coord_serve_opts {
    struct coord_engine_opts engine; /* the model, layout, load, access; cancel stops the server */
    struct coord_sched_opts sched;
    const char *host;     /* numeric IPv4 address to bind (default 127.0.0.1) */
    int port;             /* 0: any free port */
    const char *api_key;  /* requests must carry "Authorization: Bearer <key>"; NULL: none */
    uint32_t max_waiting; /* requests queued beyond the running ones before a 429 */
    uint32_t max_connections; /* open connections at once (0: 512); more are closed at accept */
    /* The flag the signal handler sets (engine.cancel points at it too). Set once, the server
     * drains: it clears the flag, answers 503 to new requests and lets the running ones finish
     * for up to drain_seconds; set again, it stops at once. NULL: engine.cancel stops it. */
    volatile sig_atomic_t *stop;
    uint32_t drain_seconds;
    /* The chat template's text (--chat-template), or NULL: the model's own. */
    const char *chat_template;
    /* "0.1.0 (commit cb668aa1b2c3)", `shardlm --version`'s text, for /metrics' shardlm_build_info;
     * NULL: not reported. */
    const char *version;
    /* Called once the socket listens, with the bound port (a test reads it), before loading;
     * and once the engine has started. */
    void (*on_listen)(void *arg, int port);
    void (*on_ready)(void *arg, struct coord_engine *g);
    void *arg;
};

/* Serves until stopped (see opts.stop): binds first (GET /health answers 503 while the model
 * loads), then runs the scheduler's steps on this thread. Endpoints: GET /health, GET /metrics,
 * GET /v1/models, POST /v1/completions and /v1/chat/completions (streamed as server-sent events
 * or one JSON body), POST /tokenize, /detokenize and /apply-template, each also without /v1.
 * Returns 0 when the cancel flag stopped it, or -errno with @e set. */
int coord_serve(const struct coord_serve_opts *o, struct shardlm_err *e);

#endif
