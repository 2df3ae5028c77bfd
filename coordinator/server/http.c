/* SPDX-License-Identifier: MIT */
/* coordinator/server/http.c: libmicrohttpd's glue - the route table (its 404 and 405 too), the
 * API key, the request's framing and body, the deadline watchdog, error objects, and the
 * routes that are HTTP's own (/health, the chat page). */
#include "srv.h"

#include "gate.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define CONN_TIMEOUT_S 30 /* a connection idle this long is closed */
/* A request's header and body must arrive within this many seconds of the connection's accept
 * (or of its previous response): a client that trickles them a byte at a time (slowloris) is
 * cut off then, where the idle timeout above would wait forever. */
#define REQUEST_DEADLINE_S 15
#define MAX_CONNECTIONS 512

/* ---- answers ---- */

/* Queues @j (consumed) as the answer, with "Connection: close" when @close and an Allow header
 * when @allow is not NULL. */
static enum MHD_Result queue_json(struct MHD_Connection *c, unsigned status, json_t *j, bool close,
                                  const char *allow)
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
    if (allow)
        MHD_add_response_header(r, "Allow", allow);
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

enum MHD_Result srv_send_json(struct MHD_Connection *c, unsigned status, json_t *j)
{
    return queue_json(c, status, j, false, NULL);
}

/* OpenAI's error object for @msg; param is the field a 400 names ("temperature: out of
 * range..."), else null. */
static json_t *error_json(unsigned status, const char *type, const char *code, const char *msg)
{
    char param[64] = "";
    size_t k = strspn(msg, "abcdefghijklmnopqrstuvwxyz_.");
    if (status == 400 && k && k < sizeof(param) && (msg[k] == ':' || msg[k] == '['))
        memcpy(param, msg, k);
    return json_pack("{s:{s:o,s:s,s:s?,s:s?}}", "error", "message", srv_text_json(msg, strlen(msg)),
                     "type", type, "param", *param ? param : NULL, "code", code);
}

/* An error that ends the connection: its request's framing cannot be trusted. */
static enum MHD_Result send_error_close(struct MHD_Connection *c, unsigned status,
                                        const char *msg)
{
    return queue_json(c, status, error_json(status, "invalid_request_error", NULL, msg), true,
                      NULL);
}

enum MHD_Result srv_send_error(struct MHD_Connection *c, unsigned status, const char *type,
                               const char *code, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return srv_send_json(c, status, error_json(status, type, code, msg));
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

/* ---- a request's head and body ---- */

/* The framing headers of a request, counted. */
struct framing {
    int n_length, n_encoding;
    const char *length; /* the first Content-Length */
    bool lengths_differ;
    bool spaced_name;  /* a field name that ends in whitespace: libmicrohttpd keeps it apart */
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

/* A request's headers are in: a context for its body, and no Nagle delay on its socket. */
static enum MHD_Result conn_begin(struct MHD_Connection *c, const char *version, void **con_cls)
{
    struct srv_conn *cn = calloc(1, sizeof(*cn));
    if (!cn)
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
        return send_error_close(c, 400, why);
    return MHD_YES;
}

/* A piece of the body: kept up to SRV_BODY_MAX bytes, past that only counted as too big. */
static enum MHD_Result conn_body(struct srv_conn *cn, const char *upload, size_t *upload_size)
{
    if (!cn->too_big && cn->len + *upload_size > SRV_BODY_MAX) {
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

/* ---- the connections' deadline ---- */

/* The deadline's state of connection @c: a request of it is being answered (@busy), or it is
 * waiting for the next one from now. */
static void sock_busy(struct srv *s, struct MHD_Connection *c, bool busy)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct srv_sock *k = ci ? ci->socket_context : NULL;
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
    struct srv_sock *k = *socket_context;
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
        for (struct srv_sock *k = s->socks; k; k = k->next)
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

bool srv_conns_busy(struct srv *s)
{
    bool busy = false;
    pthread_mutex_lock(&s->sock_mu);
    for (struct srv_sock *k = s->socks; k && !busy; k = k->next)
        busy = k->busy;
    pthread_mutex_unlock(&s->sock_mu);
    return busy;
}

/* ---- HTTP's own routes ---- */

/* GET /health: 200 {"status": "ok"} while it serves; 503 loading, stopping, or failed (with
 * the engine's error). */
static enum MHD_Result health(struct srv *s, struct MHD_Connection *c, struct srv_conn *cn,
                              const char *url)
{
    char lost[sizeof(s->lost)];
    enum srv_state st = srv_state_get(s, lost);
    return srv_send_json(c, st == SRV_SERVING ? 200 : 503,
                         json_pack("{s:s,s:s*}", "status",
                                   st == SRV_SERVING   ? "ok"
                                   : st == SRV_LOADING ? "loading"
                                   : st == SRV_LOST    ? "failed"
                                                       : "stopping",
                                   "error", st == SRV_LOST ? lost : NULL));
}

/* the chat page (coordinator/server/page/index.html, embedded by cmake/embed.cmake) */
extern const unsigned char coord_page_index[];
extern const size_t coord_page_index_len;

/* GET /: the page, from the binary; it loads nothing from elsewhere (the CSP says so). */
static enum MHD_Result page(struct srv *s, struct MHD_Connection *c, struct srv_conn *cn,
                            const char *url)
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

/* ---- the routes ---- */

enum route_method {
    ROUTE_GET = 1u << 0, /* and HEAD: GET without the body (libmicrohttpd leaves the body out,
                          * the headers and the status are GET's) */
    ROUTE_POST = 1u << 1,
};

/* Every path the server answers (after a leading /v1, which every path may carry): README.md
 * and docs/deploy.md list them, tests/test_routes.c checks them against its own list. */
static const struct route {
    const char *path;
    bool prefix;      /* the path is a prefix: /models/NAME */
    unsigned methods; /* enum route_method */
    /* needs the API key: all but /health, /metrics (the load balancer's checks, Prometheus)
     * and the chat page (static, no model data: it asks its user for the key) */
    bool key;
    srv_route_fn *fn;
} routes[] = {
    {"/health", false, ROUTE_GET, false, health},
    {"/metrics", false, ROUTE_GET, false, srv_metrics},
    {"/", false, ROUTE_GET, false, page},
    {"/index.html", false, ROUTE_GET, false, page},
    {"/models", false, ROUTE_GET, true, srv_models},
    {"/models/", true, ROUTE_GET, true, srv_model},
    {"/completions", false, ROUTE_POST, true, srv_completions},
    {"/chat/completions", false, ROUTE_POST, true, srv_chat_completions},
    {"/tokenize", false, ROUTE_POST, true, srv_tokenize},
    {"/detokenize", false, ROUTE_POST, true, srv_detokenize},
    {"/apply-template", false, ROUTE_POST, true, srv_apply_template},
};

/* The route of @url, or NULL. */
static const struct route *route_find(const char *url)
{
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        if (routes[i].prefix ? !strncmp(url, routes[i].path, strlen(routes[i].path))
                             : !strcmp(url, routes[i].path))
            return &routes[i];
    return NULL;
}

static bool route_takes(const struct route *rt, const char *method)
{
    if (!strcmp(method, "GET") || !strcmp(method, "HEAD"))
        return rt->methods & ROUTE_GET;
    return !strcmp(method, "POST") && rt->methods & ROUTE_POST;
}

/* 405, with the Allow header RFC 9110 section 15.5.6 asks for: the methods @rt takes. */
static enum MHD_Result not_allowed(struct MHD_Connection *c, const struct route *rt,
                                   const char *method, const char *url)
{
    char allow[32], msg[400];
    snprintf(allow, sizeof(allow), "%s%s%s", rt->methods & ROUTE_GET ? "GET, HEAD" : "",
             rt->methods == (ROUTE_GET | ROUTE_POST) ? ", " : "",
             rt->methods & ROUTE_POST ? "POST" : "");
    snprintf(msg, sizeof(msg), "%s is not allowed on %s", method, url);
    return queue_json(c, 405, error_json(405, "invalid_request_error", NULL, msg), false, allow);
}

/* A whole request: to its route. The order of the answers: a public route answers without the
 * key, its wrong methods a 405 (it reveals nothing its GET does not); any other path, an
 * unknown one included, asks for the key first (a 401), so that a client without it learns
 * nothing of the paths behind it (docs/deploy.md) - not even which exist, as a 405 before the
 * 401 would tell; then a body too big (413), an unknown path (404), a wrong method (405). */
static enum MHD_Result route(struct srv *s, struct MHD_Connection *c, struct srv_conn *cn,
                             const char *url, const char *method)
{
    if (!strncmp(url, "/v1/", 4))
        url += 3;
    const struct route *rt = route_find(url);
    if (!rt || rt->key) {
        if (!authorized(s, c))
            return srv_send_error(c, 401, "invalid_request_error", "invalid_api_key",
                                  "a missing or wrong API key (Authorization: Bearer KEY)");
        if (cn->too_big)
            return srv_send_error(c, 413, "invalid_request_error", NULL,
                                  "the request body is larger than %u bytes", SRV_BODY_MAX);
        if (!rt)
            return srv_send_error(c, 404, "invalid_request_error", NULL,
                                  "no such endpoint: %s %s", method, url);
    }
    return route_takes(rt, method) ? rt->fn(s, c, cn, url) : not_allowed(c, rt, method, url);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
    struct srv *s = cls;
    struct srv_conn *cn = *con_cls;
    if (!cn)
        return conn_begin(c, version, con_cls);
    if (*upload_size)
        return conn_body(cn, upload, upload_size);
    sock_busy(s, c, true); /* the whole request is in */
    return route(s, c, cn, url, method);
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
    struct srv_conn *cn = *con_cls;
    if (cn) {
        free(cn->body);
        free(cn);
        *con_cls = NULL;
    }
}

/* ---- start and stop ---- */

int srv_http_start(struct srv *s, const struct sockaddr_in *addr, struct shardlm_err *e)
{
    const struct coord_serve_opts *o = s->o;
    pthread_mutex_init(&s->sock_mu, NULL);
    /* poll(), not select(): no FD_SETSIZE ceiling under the connection limit; the gate
     * listens and hands connections over (gate.h says why), through the ITC */
    unsigned limit = o->max_connections ? o->max_connections : MAX_CONNECTIONS;
    s->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD |
                                MHD_USE_ITC | MHD_USE_NO_LISTEN_SOCKET,
                            0, NULL, NULL, handle, s, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)CONN_TIMEOUT_S, MHD_OPTION_CONNECTION_LIMIT, limit,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_NOTIFY_CONNECTION,
                            notify_connection, s, MHD_OPTION_END);
    struct coord_gate_opts go = {.addr = *addr,
                                 .max_pending = limit,
                                 .deadline_s = REQUEST_DEADLINE_S,
                                 .admit = gate_admit,
                                 .refusal = gate_refusal,
                                 .arg = s};
    int rc = s->d ? coord_gate_start(&s->gate, &go) : -ENOMEM;
    if (rc) {
        if (s->d)
            MHD_stop_daemon(s->d);
        pthread_mutex_destroy(&s->sock_mu);
        return shardlm_fail(e, rc, "cannot listen on %s:%d: %s%s", o->host ? o->host : "127.0.0.1",
                            o->port, strerror(-rc),
                            rc == -EADDRNOTAVAIL ? " (not an address of this host)" : "");
    }
    s->watching = true; /* before the thread reads it */
    if (pthread_create(&s->watch_thread, NULL, watchdog, s))
        s->watching = false;
    s->port = coord_gate_port(s->gate);
    return 0;
}

void srv_http_stop(struct srv *s)
{
    coord_gate_stop(s->gate); /* no new connections */
    MHD_stop_daemon(s->d);
    if (s->watching) {
        pthread_mutex_lock(&s->sock_mu);
        s->watching = false;
        pthread_mutex_unlock(&s->sock_mu);
        pthread_join(s->watch_thread, NULL);
    }
    pthread_mutex_destroy(&s->sock_mu);
}
