/* SPDX-License-Identifier: MIT */
/* coordinator/server/openai.c: the OpenAI endpoints - completions and chat completions (the
 * request parsed by request.c, the response written here: one JSON body, or server-sent
 * events as the tokens come), the models, and llama.cpp's /tokenize, /detokenize and
 * /apply-template. */
#include "srv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the response's JSON ---- */

json_t *srv_text_json(const char *t, size_t n)
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

/* The object around @choices (an array; NULL after a failed allocation) of the kind @object,
 * with the usage when @usage. */
static json_t *envelope(const struct sreq *p, const char *object, json_t *choices, bool usage)
{
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", p->id, "object", object, "created",
                          (json_int_t)p->created, "model", p->s->model, "choices", choices);
    if (o && usage)
        json_object_set_new(o, "usage", usage_json(p));
    return o;
}

/* The finish_reason of @p ending with @f: tool_calls when its answer made calls. */
static json_t *finish_json(const struct sreq *p, enum coord_finish f)
{
    if (!f)
        return json_null();
    return json_string(f == COORD_FINISH_STOP && p->split.called ? "tool_calls"
                                                                 : coord_finish_name(f));
}

/* One text_completion object: a chunk of @text (stream), or the whole result with usage. */
static json_t *completion_json(const struct sreq *p, const char *text, size_t n,
                               enum coord_finish f, bool usage, json_t *lp)
{
    json_t *choice =
        json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "text", srv_text_json(text, n), "logprobs",
                  lp ? lp : json_null(), "finish_reason", finish_json(p, f));
    return envelope(p, "text_completion", json_pack("[o]", choice), usage);
}

/* One chat.completion(.chunk) object around @msg (consumed; NULL: a delta of @text, with the
 * role when @role, or the whole message): a stream's chunk, or the whole answer with usage. */
static json_t *chat_json(const struct sreq *p, const char *text, size_t n, enum coord_finish f,
                         bool usage, json_t *lp, bool role, json_t *msg)
{
    bool stream = p->q.stream;
    if (!msg && (msg = json_object())) {
        if (role || !stream)
            json_object_set_new(msg, "role", json_string("assistant"));
        if (n || role || !stream)
            json_object_set_new(msg, "content", srv_text_json(text, n));
    }
    json_t *choice =
        json_pack("{s:i,s:o,s:o,s:o}", "index", 0, stream ? "delta" : "message", msg, "logprobs",
                  lp ? lp : json_null(), "finish_reason", finish_json(p, f));
    return envelope(p, stream ? "chat.completion.chunk" : "chat.completion",
                    json_pack("[o]", choice), usage);
}

/* A chunk or the whole response, as the request's kind writes it. */
static json_t *response_json(const struct sreq *p, const char *text, size_t n, enum coord_finish f,
                             bool usage, json_t *lp)
{
    return p->q.chat ? chat_json(p, text, n, f, usage, lp, false, NULL)
                     : completion_json(p, text, n, f, usage, lp);
}

/* Appends "data: <json>\n\n" (srv.mu held; @j is consumed). */
static bool sse_put(struct sreq *p, json_t *j)
{
    char *t = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    bool ok = t && sreq_out_put(p, "data: ", 6) && sreq_out_put(p, t, strlen(t)) &&
              sreq_out_put(p, "\n\n", 2);
    free(t);
    return ok;
}

/* ---- logprobs ---- */

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

/* A token's chat logprobs entry: {"token", "logprob", "bytes"} (OpenAI's chat format; the
 * caller adds top_logprobs to the entries of the sampled tokens). */
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

/* ---- the response as the events come ---- */

/* A stream's last events after its finish: the finish chunk, the usage when asked, [DONE]. */
static bool stream_end(struct sreq *p, const struct coord_event *ev)
{
    bool ok = sse_put(p, response_json(p, "", 0, ev->finish, false, NULL));
    if (ok && p->q.include_usage) {
        ok = sse_put(p, envelope(p, p->q.chat ? "chat.completion.chunk" : "text_completion",
                                 json_array(), true));
    }
    return ok && sreq_out_put(p, "data: [DONE]\n\n", 14);
}

bool srv_event_out(struct sreq *p, const struct coord_event *ev)
{
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
        ok = sse_put(p, chat_json(p, "", 0, 0, false, NULL, true, NULL));
        p->role_sent = true;
    }
    if (ok && p->parse && p->q.stream) { /* the answer split: a delta of what is new */
        json_t *d;
        ok = srv_split_delta(p, ev->text, ev->text_len, ev->finish != 0, &d);
        if (ok && (d || lp))
            ok = sse_put(p, chat_json(p, "", 0, 0, false, lp, false, d ? d : json_object()));
        else
            json_decref(lp);
    } else if (ok && (ev->text_len || lp))
        ok = p->q.stream ? sse_put(p, response_json(p, ev->text, ev->text_len, 0, false, lp))
                         : sreq_out_put(p, ev->text, ev->text_len);
    else
        json_decref(lp);
    if (ok && ev->finish == COORD_FINISH_ERROR && p->q.stream) /* after a 200: as an event */
        ok = sse_put(p, json_pack("{s:{s:s,s:s,s:n}}", "error", "message",
                                  ev->error ? ev->error : "the engine failed", "type",
                                  "server_error", "code"));
    if (ok && ev->finish && p->q.stream)
        ok = stream_end(p, ev);
    return ok;
}

/* ---- completions ---- */

/* The streamed body: what the events appended, as it comes. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct sreq *p = cls;
    struct srv *s = p->s;
    (void)pos;
    static const char comment[] = ":\n\n"; /* an SSE comment: clients skip it */
    pthread_mutex_lock(&s->mu);
    while (p->off == p->len && p->state == SREQ_RUNNING && !p->cancel && !p->ping)
        if (!sreq_wait_step(p, true))
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

/* The prompt of chat request @p: its messages through the chat template, tokenized with the
 * special tokens the template wrote (and no BOS of its own: the template writes it, as Hugging
 * Face's apply_chat_template has it); its grammar and answer split (srv_structure). Returns 0,
 * or -EINVAL / -ENOMEM with @why set. */
static int chat_prompt(struct srv *s, struct sreq *p, char *why, size_t wlen)
{
    struct coord_completion_req *q = &p->q;
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
    int np = srv_encode(s, text + skip, n - skip, flags, "the rendered prompt", &q->ids, why, wlen);
    int src = np < 0 ? 0 : srv_structure(s, p, text, n, why, wlen);
    free(text);
    if (src)
        return src;
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

/* @p's request from its connection's body, its prompt tokenized (here, not on the scheduler's
 * thread: the tokenizer is read-only). Returns 0, or -EINVAL / -ENOMEM with @why set. */
static int prepare(struct srv *s, struct srv_conn *cn, struct sreq *p, bool chat, char *why,
                   size_t wlen)
{
    struct coord_completion_req *q = &p->q;
    int rc = coord_completion_parse(cn->body ? cn->body : "", cn->len, s->tok.vocab_size,
                                    s->context, chat, q, why, wlen);
    if (!rc && chat)
        rc = chat_prompt(s, p, why, wlen);
    if (!rc && q->prompt) {
        int np = srv_encode(s, q->prompt, strlen(q->prompt), COORD_TOK_ENC_BOS, "the prompt",
                            &q->ids, why, wlen);
        rc = np < 0 ? np : 0;
        q->n_ids = np < 0 ? 0 : np;
    }
    if (!rc && !chat)
        rc = srv_structure(s, p, NULL, 0, why, wlen);
    return rc;
}

/* The answer to a request the scheduler did not take (@st REFUSED), or that was never taken
 * (@st PENDING: its client left, or the server stopped). */
static enum MHD_Result answer_untaken(struct MHD_Connection *c, struct sreq *p, enum sreq_state st,
                                      bool stopping)
{
    enum MHD_Result rc =
        st == SREQ_PENDING
            ? (stopping ? srv_send_error(c, 503, "unavailable_error", NULL, "the server stopped")
                        : MHD_NO) /* the client left */
            : srv_send_error(c, p->status,
                             p->status >= 500 ? "server_error" : "invalid_request_error", NULL,
                             "%s", p->err);
    sreq_unref(p);
    return rc;
}

/* A stream's answer: 200 and the events as they come (the response owns the reference). */
static enum MHD_Result answer_stream(struct MHD_Connection *c, struct sreq *p)
{
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

/* A plain answer: waits for the end, then one body. */
static enum MHD_Result answer_plain(struct srv *s, struct MHD_Connection *c, struct sreq *p)
{
    pthread_mutex_lock(&s->mu);
    while (p->state == SREQ_RUNNING && sreq_wait_step(p, false))
        ;
    bool done = p->state == SREQ_DONE;
    bool stopping =
        s->state == SRV_STOPPING || (done && p->finish == COORD_FINISH_CANCELLED && !p->cancel);
    if (done && (p->finish == COORD_FINISH_ERROR || stopping)) {
        /* no 200 for what did not complete: the engine failed, or a drain ran out of time */
        char msg[sizeof(p->err)];
        snprintf(msg, sizeof(msg), "%s", *p->err ? p->err : "the engine failed");
        bool failed = p->finish == COORD_FINISH_ERROR;
        pthread_mutex_unlock(&s->mu);
        sreq_unref(p);
        return failed ? srv_send_error(c, 500, "server_error", NULL, "%s", msg)
                      : srv_send_error(c, 503, "unavailable_error", NULL,
                                       "the server stopped before the request finished");
    }
    if (!done && stopping) {
        pthread_mutex_unlock(&s->mu);
        sreq_unref(p);
        return srv_send_error(c, 503, "unavailable_error", NULL, "the server stopped");
    }
    json_t *o = NULL;
    if (done) { /* the response takes the logprobs object */
        json_t *lp = p->q.logprobs >= 0 ? (p->lp ? p->lp : logprobs_new(p)) : NULL;
        json_t *msg =
            p->parse ? srv_split_message(p, p->out ? p->out : "", p->len, &p->split.called) : NULL;
        o = msg || !p->parse
                ? (p->q.chat
                       ? chat_json(p, p->out ? p->out : "", p->len, p->finish, true, lp, false, msg)
                       : completion_json(p, p->out ? p->out : "", p->len, p->finish, true, lp))
                : (json_decref(lp), NULL);
        p->lp = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    sreq_unref(p);
    return done ? srv_send_json(c, 200, o) : MHD_NO;
}

/* POST /v1/completions and /v1/chat/completions (@chat). */
static enum MHD_Result generate(struct srv *s, struct MHD_Connection *c, struct srv_conn *cn,
                                bool chat)
{
    enum srv_state state = srv_state_get(s, NULL); /* the tokenizer and context: once serving */
    if (state != SRV_SERVING)
        return srv_send_error(c, 503, "unavailable_error", NULL, "%s", srv_state_why(state));
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct sreq *p = sreq_new(s, ci ? ci->connect_fd : -1, cn->http11, chat);
    if (!p)
        return srv_send_error(c, 500, "server_error", NULL, "out of memory");
    char why[300];
    int prc = prepare(s, cn, p, chat, why, sizeof(why));
    if (prc) {
        enum MHD_Result rc = prc == -ENOMEM
                                 ? srv_send_error(c, 500, "server_error", NULL, "out of memory")
                                 : srv_send_error(c, 400, "invalid_request_error", NULL, "%s", why);
        sreq_unref(p);
        return rc;
    }
    enum sreq_state st;
    bool stopping;
    unsigned status = sreq_queue(p, &st, &stopping);
    if (status) {
        sreq_unref(p);
        return status == 503
                   ? srv_send_error(c, 503, "unavailable_error", NULL, "the server is stopping")
                   : srv_send_error(c, 429, "rate_limit_error", NULL,
                                    "too many requests queued (%u): try again later", s->limit);
    }
    if (st == SREQ_REFUSED || st == SREQ_PENDING)
        return answer_untaken(c, p, st, stopping);
    /* accepted: the first token may be a long queue away, and a stream may pause; the client's
     * leaving is seen by its socket's hang-up, not by an idle timeout */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    return p->q.stream ? answer_stream(c, p) : answer_plain(s, c, p);
}

enum MHD_Result srv_completions(struct srv *s, struct MHD_Connection *c, struct srv_conn *cn,
                                const char *url)
{
    return generate(s, c, cn, false);
}

enum MHD_Result srv_chat_completions(struct srv *s, struct MHD_Connection *c, struct srv_conn *cn,
                                     const char *url)
{
    return generate(s, c, cn, true);
}

/* ---- the model ---- */

/* The loaded model as /models lists it. */
static json_t *model_json(const struct srv *s)
{
    return json_pack("{s:s,s:s,s:I,s:s}", "id", s->model, "object", "model", "created",
                     (json_int_t)0, "owned_by", "shardlm");
}

/* GET /v1/models: the loaded model. */
enum MHD_Result srv_models(struct srv *s, struct MHD_Connection *c, struct srv_conn *cn,
                           const char *url)
{
    return srv_send_json(c, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", model_json(s)));
}

/* GET /v1/models/NAME: the loaded model by its name. */
enum MHD_Result srv_model(struct srv *s, struct MHD_Connection *c, struct srv_conn *cn,
                          const char *url)
{
    const char *name = url + strlen("/models/");
    return strcmp(name, s->model)
               ? srv_send_error(c, 404, "invalid_request_error", "model_not_found",
                                "no model named '%.200s' (this server has '%s')", name, s->model)
               : srv_send_json(c, 200, model_json(s));
}

/* ---- /tokenize, /detokenize, /apply-template ---- */

/* The body of /tokenize, /detokenize or /apply-template as an object, or NULL after answering
 * a 400 / 503. */
static json_t *tok_body(struct srv *s, struct MHD_Connection *c, struct srv_conn *cn,
                        enum MHD_Result *rc)
{
    enum srv_state st = srv_state_get(s, NULL);
    if (st == SRV_LOADING || st == SRV_STOPPING) { /* the tokenizer is there while it drains */
        *rc = srv_send_error(c, 503, "unavailable_error", NULL, "%s", srv_state_why(st));
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loadb(cn->body ? cn->body : "", cn->len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        *rc = srv_send_error(c, 400, "invalid_request_error", NULL, "expected a JSON object%s%s",
                             j ? "" : ": ", j ? "" : je.text);
        return NULL;
    }
    return j;
}

/* POST /tokenize {"content": TEXT, "add_special": false, "parse_special": false}:
 * {"tokens": [ids]} (llama.cpp's); parse_special: special tokens' text in TEXT is those tokens,
 * as the server reads a rendered chat prompt. */
enum MHD_Result srv_tokenize(struct srv *s, struct MHD_Connection *c, struct srv_conn *cn,
                             const char *url)
{
    enum MHD_Result rc;
    json_t *j = tok_body(s, c, cn, &rc);
    if (!j)
        return rc;
    json_t *ct = json_object_get(j, "content"), *sp = json_object_get(j, "add_special");
    json_t *ps = json_object_get(j, "parse_special");
    if (!json_is_string(ct) || memchr(json_string_value(ct), '\0', json_string_length(ct)) ||
        (sp && !json_is_boolean(sp)) || (ps && !json_is_boolean(ps))) {
        json_decref(j);
        return srv_send_error(c, 400, "invalid_request_error", NULL,
                              "expected {\"content\": a string, \"add_special\": true or false, "
                              "\"parse_special\": true or false}");
    }
    int32_t *ids = NULL;
    char why[300];
    unsigned flags = (json_is_true(sp) ? COORD_TOK_ENC_BOS : 0) |
                     (json_is_true(ps) ? COORD_TOK_ENC_PARSE_SPECIAL : 0);
    int nt = srv_encode(s, json_string_value(ct), json_string_length(ct), flags, "the content",
                        &ids, why, sizeof(why));
    json_decref(j);
    if (nt < 0) {
        free(ids);
        return nt == -ENOMEM ? srv_send_error(c, 500, "server_error", NULL, "out of memory")
                             : srv_send_error(c, 400, "invalid_request_error", NULL, "%s", why);
    }
    json_t *arr = json_array();
    for (int i = 0; arr && i < nt; i++)
        if (json_array_append_new(arr, json_integer(ids[i]))) {
            json_decref(arr);
            arr = NULL;
        }
    free(ids);
    return arr ? srv_send_json(c, 200, json_pack("{s:o}", "tokens", arr))
               : srv_send_error(c, 500, "server_error", NULL, "out of memory");
}

/* POST /detokenize {"tokens": [ids]}: {"content": TEXT} (byte tokens joined into characters,
 * ill-formed bytes as U+FFFD, BOS, EOS and control tokens left out). */
enum MHD_Result srv_detokenize(struct srv *s, struct MHD_Connection *c, struct srv_conn *cn,
                               const char *url)
{
    enum MHD_Result rc;
    json_t *j = tok_body(s, c, cn, &rc);
    if (!j)
        return rc;
    json_t *ids = json_object_get(j, "tokens");
    struct srv_text t = {0};
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
            srv_text_printf(&t, "%.*s", (int)n, buf);
        }
    }
    json_decref(j);
    if (bad) {
        free(t.b);
        return srv_send_error(c, 400, "invalid_request_error", NULL,
                              "expected {\"tokens\": [token ids in [0, %d)]}", s->tok.vocab_size);
    }
    size_t n = coord_utf8_flush(&u, buf);
    srv_text_printf(&t, "%.*s", (int)n, buf);
    if (t.failed) {
        free(t.b);
        return srv_send_error(c, 500, "server_error", NULL, "out of memory");
    }
    json_t *o = json_pack("{s:o}", "content", srv_text_json(t.b ? t.b : "", t.len));
    free(t.b);
    return srv_send_json(c, 200, o);
}

/* POST /apply-template {"messages", "add_generation_prompt", "chat_template_kwargs"}:
 * {"prompt": TEXT}, the chat template's rendering (llama.cpp's). */
enum MHD_Result srv_apply_template(struct srv *s, struct MHD_Connection *c, struct srv_conn *cn,
                                   const char *url)
{
    enum MHD_Result rc;
    json_t *j = tok_body(s, c, cn, &rc);
    if (!j)
        return rc;
    if (!s->chat.jinja) {
        json_decref(j);
        return srv_send_error(c, 400, "invalid_request_error", NULL, "%s", s->chat_why);
    }
    char *text, why[300];
    size_t n;
    bool bad;
    int r = coord_chat_render_request(&s->chat, j, &text, &n, &bad, why, sizeof(why));
    json_decref(j);
    if (r == -ENOMEM)
        return srv_send_error(c, 500, "server_error", NULL, "out of memory");
    if (r)
        return srv_send_error(c, 400, "invalid_request_error", NULL, "%s%s",
                              bad ? "" : "the chat template: ", why);
    json_t *o = json_pack("{s:o}", "prompt", srv_text_json(text, n));
    free(text);
    return srv_send_json(c, 200, o);
}
