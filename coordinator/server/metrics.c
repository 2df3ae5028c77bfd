/* SPDX-License-Identifier: MIT */
/* coordinator/server/metrics.c: GET /metrics - what the scheduler and the server counted, in
 * Prometheus' text format (version 0.0.4). */
#include "srv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double ttft_le[SRV_HIST_BOUNDS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                1,     2.5,  5,     10,   30,  60,   120};
static const double step_le[SRV_HIST_BOUNDS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                0.25,  0.5,    1,     2.5,  5,     10,   30};

void srv_metrics_init(struct srv_metrics *m)
{
    m->ttft.le = ttft_le;
    m->itl.le = step_le;
    m->step.le = step_le;
}

void srv_hist_observe(struct srv_hist *h, double v)
{
    for (int i = 0; i < SRV_HIST_BOUNDS; i++)
        if (v <= h->le[i])
            h->bucket[i]++;
    h->sum += v;
    h->count++;
}

void srv_text_printf(struct srv_text *t, const char *fmt, ...)
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

static void put_metric(struct srv_text *t, const char *name, const char *type, const char *help,
                       double v)
{
    srv_text_printf(t, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static void put_hist(struct srv_text *t, const char *name, const char *help,
                     const struct srv_hist *h)
{
    srv_text_printf(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < SRV_HIST_BOUNDS; i++)
        srv_text_printf(t, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i],
                        (unsigned long long)h->bucket[i]);
    srv_text_printf(t, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n", name,
                    (unsigned long long)h->count, name, h->sum, name, (unsigned long long)h->count);
}

/* shardlm_build_info from the version text "0.1.0 (commit X)": version and commit as labels. */
static void put_build_info(struct srv_text *t, const char *v)
{
    const char *sp = strchr(v, ' '), *commit = strstr(v, "(commit ");
    int vn = sp ? (int)(sp - v) : (int)strlen(v), cn = 0;
    if (commit) {
        commit += 8;
        cn = (int)strcspn(commit, ")\"\\\n");
    }
    srv_text_printf(t,
                    "# HELP shardlm_build_info The version and git commit of this server\n"
                    "# TYPE shardlm_build_info gauge\n"
                    "shardlm_build_info{version=\"%.*s\",commit=\"%.*s\"} 1\n",
                    vn, v, cn, commit ? commit : "");
}

/* The scheduler's gauges and counters of @m (@open requests open). */
static void put_sched(struct srv_text *t, const struct srv_metrics *m, uint32_t open)
{
    put_metric(t, "shardlm_requests_running", "gauge", "Sequences in the running batch",
               m->st.running);
    /* queued on the connections' side or waiting in the scheduler */
    uint32_t waiting = open > m->st.running ? open - m->st.running : 0;
    put_metric(t, "shardlm_requests_waiting", "gauge", "Requests accepted and not yet running",
               waiting);
    put_metric(t, "shardlm_kv_blocks_capacity", "gauge", "KV cache blocks (16 positions each)",
               m->st.blocks);
    put_metric(t, "shardlm_kv_blocks_used", "gauge", "KV cache blocks held by sequences",
               m->st.blocks_used);
    put_metric(t, "shardlm_kv_blocks_cached", "gauge",
               "KV cache blocks kept for the prefix cache and held by no sequence",
               m->st.blocks_cached);
    put_metric(t, "shardlm_prefix_cache_queried_tokens_total", "counter",
               "Prompt tokens looked up in the prefix cache", (double)m->st.prompt_tokens);
    put_metric(t, "shardlm_prefix_cache_hit_tokens_total", "counter",
               "Prompt tokens found in the prefix cache", (double)m->st.cached_tokens);
    put_metric(t, "shardlm_prefix_cache_hit_rate", "gauge",
               "Prompt tokens found in the prefix cache over those looked up, since the start",
               m->st.prompt_tokens ? (double)m->st.cached_tokens / (double)m->st.prompt_tokens : 0);
}

/* What the server counted of @m: tokens, requests, histograms. */
static void put_requests(struct srv_text *t, const struct srv_metrics *m)
{
    put_metric(t, "shardlm_prompt_tokens_total", "counter", "Prompt tokens of finished requests",
               (double)m->prompt_tokens);
    put_metric(t, "shardlm_generation_tokens_total", "counter", "Tokens generated",
               (double)m->generated_tokens);
    put_metric(t, "shardlm_preemptions_total", "counter",
               "Sequences preempted when the KV cache ran out", (double)m->st.preemptions);
    srv_text_printf(t, "# HELP shardlm_requests_total Requests finished, by finish reason\n"
                       "# TYPE shardlm_requests_total counter\n");
    for (int f = COORD_FINISH_STOP; f <= COORD_FINISH_ERROR; f++)
        srv_text_printf(t, "shardlm_requests_total{finish=\"%s\"} %llu\n",
                        coord_finish_name((enum coord_finish)f),
                        (unsigned long long)m->finished[f]);
    put_metric(t, "shardlm_requests_refused_total", "counter",
               "Requests refused after parsing (past the context or the KV cache, queue full)",
               (double)m->refused);
    put_metric(t, "shardlm_grammars_compiled_total", "counter",
               "Requests' grammars (response_format, guided fields, tools) compiled",
               (double)m->grammars_compiled);
    put_metric(t, "shardlm_grammars_reused_total", "counter",
               "Requests' grammars found compiled already (the last 16 kept)",
               (double)m->grammars_reused);
    put_hist(t, "shardlm_time_to_first_token_seconds",
             "From a request's arrival to its first token", &m->ttft);
    put_hist(t, "shardlm_inter_token_latency_seconds", "Between a request's consecutive tokens",
             &m->itl);
    put_hist(t, "shardlm_step_seconds", "One scheduler step (a batched forward and sampling)",
             &m->step);
}

enum MHD_Result srv_metrics(struct srv *s, struct MHD_Connection *c, struct srv_conn *cn,
                            const char *url)
{
    pthread_mutex_lock(&s->mu);
    struct srv_metrics m = s->m;
    uint32_t open = s->open;
    enum srv_state st = s->state;
    pthread_mutex_unlock(&s->mu);
    struct srv_text t = {0};
    if (s->o->version)
        put_build_info(&t, s->o->version);
    put_metric(&t, "shardlm_ready", "gauge", "1 when the model is loaded and served",
               st == SRV_SERVING);
    put_sched(&t, &m, open);
    put_requests(&t, &m);
    if (t.failed || !t.b) {
        free(t.b);
        return srv_send_error(c, 500, "server_error", NULL, "out of memory");
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
