/* SPDX-License-Identifier: MIT */
/* `shardlm serve` end to end on the bundled stories260K model (f32): the server over loopback,
 * driven by a small HTTP/1.1 client of this file. Greedy completions equal the golden texts
 * (streamed and not, the four prompts at once), the API key is required, bad requests get their
 * OpenAI error object and status, a client that leaves mid-stream is cancelled while the others
 * go on, and SIGTERM stops the server with exit 0 and nothing left running. One server runs for
 * all of them (the group's setup starts it); each check is a case of its own, so that one that
 * fails does not hide the others. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>

#include "testutil.h"

static char dir[4096], rundir[4096], env_rundir[4200], model[4200], keyfile[4200], tmplfile[4200];
static const char *key = "test-key-3f9a";

static int make_files(void)
{
    tu_mkdtemp(dir, sizeof(dir), "serve");
    tu_path(rundir, sizeof(rundir), "%s/run", dir);
    tu_path(env_rundir, sizeof(env_rundir), "SHARDLM_RUNTIME_DIR=%s", rundir);
    tu_path(model, sizeof(model), "%s/f32.shlm", dir);
    tu_path(keyfile, sizeof(keyfile), "%s/key", dir);
    tu_path(tmplfile, sizeof(tmplfile), "%s/chat.jinja", dir);
    char line[64];
    snprintf(line, sizeof(line), "%s\n", key);
    /* stories260K has no chat template: one that gives the text of the last message after BOS,
     * so that a chat's greedy reply is the golden continuation; it raises when asked to, and
     * names the tools and documents of a request before the message */
    static const char tmpl[] =
        "{% if fail is defined %}{{ raise_exception('asked to fail: ' ~ fail) }}{% endif %}"
        "{{ bos_token }}{% if tools is defined %}{% for t in tools %}tool "
        "{{ t.function.name }}\n{% endfor %}{% endif %}{% if documents is defined %}"
        "{% for d in documents %}document {{ d.title }}\n{% endfor %}{% endif %}"
        "{{ messages[-1]['content'] }}\n";
    return tu_convert(model, "f32", NULL) || tu_write(keyfile, line, strlen(line)) ||
                   tu_write(tmplfile, tmpl, strlen(tmpl))
               ? -1
               : 0;
}

static pid_t server; /* the running server (start_server) */

static int port;

static int connect_server(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {.tv_sec = 60};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
        close(fd);
        return -1;
    }
    return fd;
}

static void send_all(int fd, const char *b, size_t n)
{
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        b += w;
        n -= (size_t)w;
    }
}

/* Sends a request (with the key unless @nokey); returns the connected socket. */
static int send_request(const char *method, const char *path, const char *body, size_t blen,
                        bool nokey)
{
    int fd = connect_server();
    if (fd < 0)
        return -1;
    char head[512];
    int n = snprintf(head, sizeof(head),
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n%s%s%s\r\n",
                     method, path, blen, nokey ? "" : "Authorization: Bearer ", nokey ? "" : key,
                     nokey ? "" : "\r\n");
    send_all(fd, head, (size_t)n);
    send_all(fd, body, blen);
    return fd;
}

struct resp {
    int status;
    char *body; /* de-chunked, NUL-terminated */
    size_t len;
};

/* Everything the server sends until it closes the connection (NUL-terminated; *@len bytes). */
static char *read_raw(int fd, size_t *n_raw)
{
    size_t cap = 1 << 16, len = 0;
    char *raw = malloc(cap);
    for (;;) {
        if (len + 4096 > cap)
            raw = realloc(raw, cap *= 2);
        ssize_t n = recv(fd, raw + len, 4096, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    raw[len] = '\0';
    *n_raw = len;
    return raw;
}

/* Reads a whole response (the server closes the connection after it); interim (1xx) responses
 * before it are skipped, as HTTP/1.1 clients skip them. */
static void read_response(int fd, struct resp *r)
{
    size_t len;
    char *raw = read_raw(fd, &len), *start = raw;
    r->status = -1;
    while (sscanf(start, "HTTP/1.%*d %d", &r->status) == 1 && r->status >= 100 && r->status < 200 &&
           strstr(start, "\r\n\r\n"))
        start = strstr(start, "\r\n\r\n") + 4;
    memmove(raw, start, len - (size_t)(start - raw) + 1);
    len -= (size_t)(start - raw);
    char *b = strstr(raw, "\r\n\r\n");
    b = b ? b + 4 : raw + len;
    bool chunked = strcasestr(raw, "Transfer-Encoding: chunked") != NULL &&
                   strcasestr(raw, "Transfer-Encoding: chunked") < b;
    r->body = malloc(len + 1);
    r->len = 0;
    if (!chunked) {
        r->len = (size_t)(raw + len - b);
        memcpy(r->body, b, r->len);
    } else
        for (const char *end = raw + len;;) {
            /* every step stays inside the received bytes: a reply cut anywhere (in a size
             * line, the data or its CRLF) is a failed assertion, never a read past them */
            unsigned long n = strtoul(b, &b, 16);
            b = strstr(b, "\r\n");
            if (!n || !b)
                break;
            b += 2;
            if (n > (size_t)(end - b) || (size_t)(end - b) - n < 2 || memcmp(b + n, "\r\n", 2)) {
                fprintf(stderr,
                        "a chunk of %lu bytes cut short or unterminated; the reply's "
                        "last bytes:\n%s\n",
                        n, len > 300 ? raw + len - 300 : raw);
                fail_msg("a broken chunked reply");
            }
            memcpy(r->body + r->len, b, n);
            r->len += n;
            b += n + 2;
        }
    r->body[r->len] = '\0';
    free(raw);
}

static void request(const char *method, const char *path, const char *body, struct resp *r)
{
    int fd = send_request(method, path, body, body ? strlen(body) : 0, false);
    assert_true(fd >= 0);
    read_response(fd, r);
}

/* Sends @req as it is, shuts down the writing side when @half (the request is all sent: HTTP
 * lets a client do that and still read the answer), and returns everything the server sends. */
static char *raw_exchange(const char *req, bool half, size_t *len)
{
    int fd = connect_server();
    assert_true(fd >= 0);
    send_all(fd, req, strlen(req));
    if (half)
        assert_int_equal(shutdown(fd, SHUT_WR), 0);
    return read_raw(fd, len);
}

/* The status of raw response @raw. */
static int raw_status(const char *raw)
{
    int status = -1;
    sscanf(raw, "HTTP/1.%*d %d", &status);
    return status;
}

/* @req (a request whose body cannot be delimited for sure) is answered with one 400, our JSON
 * error object, and the end of the connection: one status line, not libmicrohttpd's page. */
static void assert_one_400(const char *req)
{
    size_t len;
    char *raw = raw_exchange(req, false, &len);
    const char *body = strstr(raw, "\r\n\r\n");
    if (raw_status(raw) != 400 || !body || strstr(raw + 1, "HTTP/1."))
        fprintf(stderr, "--- sent\n%s\n--- got\n%s\n", req, raw);
    assert_int_equal(raw_status(raw), 400);
    assert_null(strstr(raw + 1, "HTTP/1.")); /* one status line */
    assert_non_null(strcasestr(raw, "\r\nConnection: close\r\n"));
    assert_non_null(strcasestr(raw, "\r\nContent-Type: application/json\r\n"));
    json_t *j = json_loads(body + 4, 0, NULL);
    assert_true(json_is_string(json_object_get(json_object_get(j, "error"), "message")));
    json_decref(j);
    free(raw);
}

/* The Content-Length of raw response @raw, or -1. */
static long raw_length(const char *raw)
{
    const char *h = strcasestr(raw, "\r\nContent-Length: ");
    return h ? strtol(h + 18, NULL, 10) : -1;
}

/* @path's answer to HEAD equals GET's (status, Content-Type and Content-Length) without the
 * body, with the key or without. */
static void assert_head_like_get(const char *path, bool nokey)
{
    char req[512];
    size_t glen, hlen;
    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s%s%s\r\n",
             path, nokey ? "" : "Authorization: Bearer ", nokey ? "" : key, nokey ? "" : "\r\n");
    char *get = raw_exchange(req, false, &glen);
    req[0] = 'H', req[1] = 'E', req[2] = 'A';
    memmove(req + 4, req + 3, strlen(req + 3) + 1);
    req[3] = 'D';
    char *head = raw_exchange(req, false, &hlen);
    if (raw_status(head) != raw_status(get))
        fprintf(stderr, "HEAD %s: %d, GET %d\n", path, raw_status(head), raw_status(get));
    assert_int_equal(raw_status(head), raw_status(get));
    const char *gb = strstr(get, "\r\n\r\n"), *hb = strstr(head, "\r\n\r\n");
    assert_true(gb && hb);
    assert_int_equal(raw_length(head), raw_length(get));
    assert_int_equal(raw_length(get), (long)(get + glen - gb - 4));
    assert_int_equal(hb + 4, head + hlen); /* no body */
    const char *ht = strcasestr(head, "\r\nContent-Type: "),
               *gt = strcasestr(get, "\r\nContent-Type: ");
    assert_true(ht && gt);
    assert_int_equal(strncmp(ht, gt, strcspn(gt + 2, "\r") + 2), 0);
    free(get);
    free(head);
}

/* The message of an OpenAI error object in @r (asserting the shape). */
static void assert_error(struct resp *r, int status)
{
    if (r->status != status)
        fprintf(stderr, "want %d, got %d: %s\n", status, r->status, r->body);
    assert_int_equal(r->status, status);
    json_t *j = json_loads(r->body, 0, NULL);
    assert_non_null(j);
    json_t *e = json_object_get(j, "error");
    assert_true(json_is_string(json_object_get(e, "message")));
    assert_true(json_is_string(json_object_get(e, "type")));
    json_decref(j);
    free(r->body);
}

/* The golden continuation of prompt @no, the prompt and its new tokens. */
static char *golden_tail(int no, char *prompt, size_t plen, int *n_new)
{
    int n_ids;
    assert_int_equal(tu_golden_prompt(tu_data(), no, prompt, plen, &n_ids), 0);
    *n_new = 257 - n_ids; /* the reference fed 256 positions */
    char *g = tu_golden_tail(tu_data(), no, prompt);
    assert_non_null(g);
    return g;
}

/* The text of a streamed completion (@chat: a chat completion): its chunks' texts in order.
 * Checks the framing (only "data: " events, [DONE] last), that the finish reason comes once, in a
 * chunk of its own with empty text after the last text, and the usage chunk after it, and for a
 * chat that the role comes in the first chunk alone; returns the finish reason and the usage's
 * completion tokens. */
static char *stream_text(const struct resp *r, bool chat, char *finish, size_t flen,
                         int *completion_tokens)
{
    char *text = calloc(1, r->len + 1), *save, *copy = strdup(r->body);
    size_t tl = 0;
    int events = 0;
    bool done = false, usage = false;
    *finish = '\0';
    for (char *ev = strtok_r(copy, "\n", &save); ev; ev = strtok_r(NULL, "\n", &save)) {
        if (*ev == ':') /* an SSE comment */
            continue;
        assert_int_equal(strncmp(ev, "data: ", 6), 0);
        assert_false(done);
        if (!strcmp(ev + 6, "[DONE]")) {
            done = true;
            continue;
        }
        json_t *j = json_loads(ev + 6, 0, NULL);
        assert_non_null(j);
        const char *object = json_string_value(json_object_get(j, "object"));
        if (!object) /* an error event, say: shown, not handed to strcmp */
            fprintf(stderr, "an event that is not a chunk: %s\n", ev + 6);
        assert_non_null(object);
        assert_string_equal(object, chat ? "chat.completion.chunk" : "text_completion");
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        json_t *delta = json_object_get(ch, "delta");
        if (chat) {
            const char *role = json_string_value(json_object_get(delta, "role"));
            assert_true(events == 0 ? role && !strcmp(role, "assistant") : !role);
        }
        events++;
        if (!ch) { /* the usage chunk, after the finish */
            assert_true(*finish && !usage);
            usage = true;
            json_t *u = json_object_get(j, "usage");
            *completion_tokens = (int)json_integer_value(json_object_get(u, "completion_tokens"));
        } else {
            assert_false(*finish);
            const char *t = json_string_value(chat ? json_object_get(delta, "content")
                                                   : json_object_get(ch, "text"));
            assert_true(t || chat); /* a chat's last delta is empty */
            if (t) {
                memcpy(text + tl, t, strlen(t));
                tl += strlen(t);
            }
            json_t *f = json_object_get(ch, "finish_reason");
            if (json_is_string(f)) {
                assert_true(!t || !*t); /* as OpenAI sends it: a chunk of its own, no text */
                snprintf(finish, flen, "%s", json_string_value(f));
            }
        }
        json_decref(j);
    }
    free(copy);
    assert_true(done && usage && *finish &&
                events > (chat ? 3 : 2)); /* data events, [DONE] aside */
    return text;
}

/* The body of a greedy chat completion: @prompt as the user's message. */
static char *chat_body(const char *prompt, int max_tokens, bool stream)
{
    json_t *b = json_pack("{s:[{s:s,s:s}],s:i,s:i,s:b,s:{s:b}}", "messages", "role", "user",
                          "content", prompt, "max_completion_tokens", max_tokens, "temperature", 0,
                          "stream", stream, "stream_options", "include_usage", 1);
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

/* The body of a greedy completion of @prompt. */
static char *completion_body(const char *prompt, int max_tokens, bool stream)
{
    json_t *b = json_pack("{s:s,s:i,s:i,s:b,s:{s:b}}", "prompt", prompt, "max_tokens", max_tokens,
                          "temperature", 0, "stream", stream, "stream_options", "include_usage", 1);
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

/* The four golden prompts, greedy, all sent before any answer is read (so they run together),
 * each streamed or not, as completions or as chats: every text is the golden one. */
static void golden_round(bool stream, bool chat)
{
    int fds[4], n_new[4];
    char prompt[4][512], *want[4];
    for (int i = 0; i < 4; i++) {
        want[i] = golden_tail(i + 1, prompt[i], sizeof(prompt[i]), &n_new[i]);
        char *body = (chat ? chat_body : completion_body)(prompt[i], n_new[i], stream);
        const char *path = chat ? (i % 2 ? "/v1/chat/completions" : "/chat/completions")
                                : (i % 2 ? "/v1/completions" : "/completions");
        fds[i] = send_request("POST", path, body, strlen(body), false);
        assert_true(fds[i] >= 0);
        free(body);
    }
    for (int i = 0; i < 4; i++) {
        struct resp r;
        read_response(fds[i], &r);
        assert_int_equal(r.status, 200);
        char *got, finish[32];
        int completion = -1;
        if (stream)
            got = stream_text(&r, chat, finish, sizeof(finish), &completion);
        else {
            json_t *j = json_loads(r.body, 0, NULL);
            assert_non_null(j);
            assert_string_equal(json_string_value(json_object_get(j, "object")),
                                chat ? "chat.completion" : "text_completion");
            json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
            json_t *t = chat ? json_object_get(json_object_get(ch, "message"), "content")
                             : json_object_get(ch, "text");
            got = strdup(json_string_value(t));
            snprintf(finish, sizeof(finish), "%s",
                     json_string_value(json_object_get(ch, "finish_reason")));
            json_t *u = json_object_get(j, "usage");
            completion = (int)json_integer_value(json_object_get(u, "completion_tokens"));
            assert_true(json_integer_value(json_object_get(u, "prompt_tokens")) > 0);
            json_decref(j);
        }
        if (strcmp(got, want[i]))
            fprintf(stderr, "prompt %d (%s):\n--- got\n%s\n--- want\n%s\n", i + 1,
                    stream ? "stream" : "plain", got, want[i]);
        assert_string_equal(got, want[i]);
        /* the golden text ran its n_new tokens, or stopped at the end of the story */
        assert_true(completion == n_new[i] ? !strcmp(finish, "length")
                                           : completion < n_new[i] && !strcmp(finish, "stop"));
        free(got);
        free(want[i]);
        free(r.body);
    }
}

/* GET /health until it answers 200 (the server loads the model after it listens; no assertion:
 * start_server, a group setup, calls it). */
static bool wait_ready(pid_t pid)
{
    for (int i = 0; i < 600; i++) {
        int fd = send_request("GET", "/health", "", 0, true);
        if (fd >= 0) {
            struct resp r;
            read_response(fd, &r);
            free(r.body);
            if (r.status == 200)
                return true;
            if (r.status != 503) { /* loading */
                fprintf(stderr, "GET /health while the server loads: %d\n", r.status);
                return false;
            }
        }
        if (kill(pid, 0))
            return false;
        usleep(100 * 1000);
    }
    return false;
}

/* The server the cases below share: started once by start_server (the group's setup), in a
 * thread that runs it under tu_run_shardlm and keeps its exit status and output in srv_run;
 * test_sigterm_drains, the last case, stops it. Each case checks one thing and leaves the server
 * as it found it, so that a failure in one does not hide the others'. */
static struct tu_run *srv_run;
static pthread_t srv_thread;
static pthread_mutex_t srv_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t srv_cv = PTHREAD_COND_INITIALIZER;
static bool srv_exited; /* tu_run_shardlm returned: the server was reaped */

static void server_started(pid_t pid, void *arg)
{
    pthread_mutex_lock(&srv_mu);
    server = pid;
    pthread_cond_signal(&srv_cv);
    pthread_mutex_unlock(&srv_mu);
}

static void *run_server(void *arg)
{
    char p[16];
    snprintf(p, sizeof(p), "%d", port);
    char *args[] = {"serve",           "-m",     model, "--port", p, "--api-key-file", keyfile,
                    "--chat-template", tmplfile, NULL};
    tu_run_shardlm(srv_run, env_rundir, args, NULL, 300, server_started, NULL);
    pthread_mutex_lock(&srv_mu);
    srv_exited = true;
    pthread_cond_signal(&srv_cv);
    pthread_mutex_unlock(&srv_mu);
    return NULL;
}

/* The group's setup: the server, serving (its output on stderr when it does not get there). */
static int start_server(void **state)
{
    srv_run = malloc(sizeof(*srv_run));
    port = tu_free_port();
    assert_true(port > 0);
    if (!srv_run || pthread_create(&srv_thread, NULL, run_server, NULL))
        return -1;
    pthread_mutex_lock(&srv_mu);
    while (!server && !srv_exited)
        pthread_cond_wait(&srv_cv, &srv_mu);
    pid_t pid = server;
    pthread_mutex_unlock(&srv_mu);
    if (pid > 0 && wait_ready(pid))
        return 0;
    if (pid > 0)
        kill(pid, SIGKILL);
    pthread_join(srv_thread, NULL);
    fprintf(stderr, "serve: status %d, not serving\n%s\n", srv_run->status, srv_run->err);
    return -1;
}

/* The group's teardown: a server that test_sigterm_drains did not stop is killed. */
static int stop_server(void **state)
{
    pthread_mutex_lock(&srv_mu);
    bool running = !srv_exited;
    pthread_mutex_unlock(&srv_mu);
    if (running) {
        kill(server, SIGKILL);
        pthread_join(srv_thread, NULL);
    }
    server = 0; /* reaped: teardown must not signal it */
    free(srv_run);
    return 0;
}

/* The key: none or a wrong one is a 401, /health needs none */
static void test_key(void **state)
{
    struct resp r;
    int fd = send_request("GET", "/v1/models", "", 0, true);
    read_response(fd, &r);
    assert_error(&r, 401);
    fd = connect_server();
    static const char wrong[] = "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                "Authorization: Bearer test-key-3f9b\r\n\r\n";
    send_all(fd, wrong, sizeof(wrong) - 1);
    read_response(fd, &r);
    assert_error(&r, 401);
    /* what docs/deploy.md calls public: /health, /metrics and the chat page, under /v1/ too;
     * any other path, unknown ones included, needs the key */
    static const char *const public[] = {"/health", "/v1/health", "/metrics",   "/v1/metrics",
                                         "/",       "/v1/",       "/index.html"};
    for (size_t i = 0; i < sizeof(public) / sizeof(public[0]); i++) {
        read_response(send_request("GET", public[i], "", 0, true), &r);
        if (r.status != 200)
            fprintf(stderr, "GET %s without a key: %d\n", public[i], r.status);
        assert_int_equal(r.status, 200);
        free(r.body);
    }
    read_response(send_request("GET", "/v1/no-such-path", "", 0, true), &r);
    assert_error(&r, 401);
    request("GET", "/v1/models", NULL, &r);
    assert_int_equal(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")),
        "f32.shlm");
    json_decref(j);
    free(r.body);
}

static void test_golden_completions(void **state) { golden_round(false, false); }
static void test_golden_completion_streams(void **state) { golden_round(true, false); }
static void test_golden_chats(void **state) { golden_round(false, true); }
static void test_golden_chat_streams(void **state) { golden_round(true, true); }

/* The chat template: /apply-template renders it (the template's last newline is Jinja's to
 * drop); a raise is the request's 400 with its message; chat logprobs */
static void test_chat_template(void **state)
{
    struct resp r;
    request("POST", "/apply-template",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi \u00e9\"}]}", &r);
    assert_int_equal(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "prompt")), "<s>Hi \xc3\xa9");
    json_decref(j);
    free(r.body);
    request("POST", "/v1/chat/completions",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
            "\"chat_template_kwargs\": {\"fail\": 7}}",
            &r);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "asked to fail: 7"));
    free(r.body);
    request("POST", "/v1/chat/completions", "{\"messages\": [{\"content\": \"no role\"}]}", &r);
    assert_error(&r, 400);
    request("POST", "/v1/chat/completions",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time\"}], "
            "\"max_tokens\": 4, \"temperature\": 0, \"logprobs\": true, \"top_logprobs\": 2}",
            &r);
    assert_int_equal(r.status, 200);
    j = json_loads(r.body, 0, NULL);
    json_t *cc = json_array_get(json_object_get(j, "choices"), 0);
    json_t *lc = json_object_get(json_object_get(cc, "logprobs"), "content");
    assert_int_equal(json_array_size(lc), 4);
    char chat_spelled[256] = "";
    for (size_t i = 0; i < 4; i++) {
        json_t *e = json_array_get(lc, i), *top = json_object_get(e, "top_logprobs");
        assert_int_equal(json_array_size(top), 2);
        assert_string_equal(json_string_value(json_object_get(e, "token")),
                            json_string_value(json_object_get(json_array_get(top, 0), "token")));
        assert_true(json_real_value(json_object_get(e, "logprob")) <= 0);
        strncat(chat_spelled, json_string_value(json_object_get(e, "token")),
                sizeof(chat_spelled) - strlen(chat_spelled) - 1);
    }
    assert_string_equal(chat_spelled, json_string_value(json_object_get(
                                          json_object_get(cc, "message"), "content")));
    json_decref(j);
    free(r.body);
}

/* ignore_eos: the greedy story that ends at EOS goes on to max_tokens, the same text first; a
 * value that is not a boolean is a 400 */
static void test_ignore_eos(void **state)
{
    struct resp r;
    request("POST", "/v1/completions",
            "{\"prompt\": \"Once upon a time\", \"max_tokens\": 400, \"temperature\": 0}", &r);
    assert_int_equal(r.status, 200);
    json_t *ends = json_loads(r.body, 0, NULL);
    free(r.body);
    json_t *ec = json_array_get(json_object_get(ends, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ec, "finish_reason")), "stop");
    request("POST", "/v1/completions",
            "{\"prompt\": \"Once upon a time\", \"max_tokens\": 400, \"temperature\": 0, "
            "\"ignore_eos\": true}",
            &r);
    assert_int_equal(r.status, 200);
    json_t *goes = json_loads(r.body, 0, NULL);
    free(r.body);
    json_t *gc = json_array_get(json_object_get(goes, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(gc, "finish_reason")), "length");
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(goes, "usage"), "completion_tokens")),
        400);
    const char *et = json_string_value(json_object_get(ec, "text"));
    assert_int_equal(strncmp(json_string_value(json_object_get(gc, "text")), et, strlen(et)), 0);
    json_decref(ends);
    json_decref(goes);
    request("POST", "/v1/completions", "{\"prompt\": \"x\", \"ignore_eos\": 1}", &r);
    assert_error(&r, 400);
}

/* Log-probabilities: greedy, so each token is its own likeliest alternative; the pieces spell
 * the text */
static void test_logprobs(void **state)
{
    struct resp r;
    request("POST", "/v1/completions",
            "{\"prompt\": \"Once upon a time\", \"max_tokens\": 8, \"temperature\": 0, "
            "\"logprobs\": 2}",
            &r);
    assert_int_equal(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0),
           *lp = json_object_get(ch, "logprobs");
    json_t *toks = json_object_get(lp, "tokens"), *tlp = json_object_get(lp, "token_logprobs");
    json_t *top = json_object_get(lp, "top_logprobs"), *off = json_object_get(lp, "text_offset");
    assert_int_equal(json_array_size(toks), 8);
    assert_int_equal(json_array_size(tlp), 8);
    assert_int_equal(json_array_size(top), 8);
    assert_int_equal(json_array_size(off), 8);
    char spelled[512] = "";
    for (size_t i = 0; i < 8; i++) {
        const char *t = json_string_value(json_array_get(toks, i));
        assert_int_equal(json_integer_value(json_array_get(off, i)), strlen(spelled));
        strcat(spelled, t);
        double l = json_real_value(json_array_get(tlp, i));
        json_t *alts = json_array_get(top, i);
        assert_true(l <= 0 && json_object_size(alts) >= 1 && json_object_size(alts) <= 2);
        const char *k;
        json_t *v;
        json_object_foreach(alts, k, v) assert_true(json_real_value(v) <= l);
        assert_true(json_real_value(json_object_get(alts, t)) == l);
    }
    assert_string_equal(spelled, json_string_value(json_object_get(ch, "text")));
    json_decref(j);
    free(r.body);
    request("POST", "/v1/completions", "{\"prompt\": \"Hi\", \"logprobs\": 21}", &r);
    assert_error(&r, 400);
}

/* Tokens and back */
static void test_tokenize(void **state)
{
    struct resp r;
    request("POST", "/tokenize", "{\"content\": \"Once upon a time\", \"add_special\": true}", &r);
    assert_int_equal(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    json_t *ids = json_object_get(j, "tokens");
    assert_true(json_array_size(ids) > 1);
    assert_int_equal(json_integer_value(json_array_get(ids, 0)), 1); /* BOS */
    json_t *dj = json_pack("{s:O}", "tokens", ids);
    char *detok = json_dumps(dj, JSON_COMPACT);
    json_decref(dj);
    json_decref(j);
    free(r.body);
    request("POST", "/detokenize", detok, &r);
    free(detok);
    assert_int_equal(r.status, 200);
    j = json_loads(r.body, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "content")), "Once upon a time");
    json_decref(j);
    free(r.body);
    request("POST", "/detokenize", "{\"tokens\": [1, -1]}", &r);
    assert_error(&r, 400);
    request("POST", "/tokenize", "{\"content\": 7}", &r);
    assert_error(&r, 400);
}

/* /metrics: its form, and its requests finished (stop and length) and times to the first token
 * (*@ttft) */
static unsigned long long metrics_finished(unsigned long long *ttft)
{
    struct resp r;
    int fd = send_request("GET", "/metrics", "", 0, true);
    read_response(fd, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\nshardlm_ready 1\n"));
    assert_non_null(strstr(r.body, "# TYPE shardlm_time_to_first_token_seconds histogram\n"));
    assert_non_null(strstr(r.body, "shardlm_step_seconds_bucket{le=\"+Inf\"} "));
    unsigned long long stop = 0, length = 0;
    const char *m = strstr(r.body, "shardlm_requests_total{finish=\"stop\"} ");
    assert_non_null(m);
    sscanf(m, "shardlm_requests_total{finish=\"stop\"} %llu", &stop);
    m = strstr(r.body, "shardlm_requests_total{finish=\"length\"} ");
    assert_non_null(m);
    sscanf(m, "shardlm_requests_total{finish=\"length\"} %llu", &length);
    m = strstr(r.body, "shardlm_time_to_first_token_seconds_count ");
    assert_non_null(m);
    sscanf(m, "shardlm_time_to_first_token_seconds_count %llu", ttft);
    free(r.body);
    return stop + length;
}

/* The metrics count what ran, whatever the cases before ran: 11 requests here (two golden
 * rounds, completions and streamed chats, a completion with logprobs, one with ignore_eos, a chat
 * with logprobs), each with a first token; refused ones (400) and /tokenize are not counted. A
 * request is counted before its answer's last byte, and the figures are read after every answer. */
static void test_metrics(void **state)
{
    unsigned long long ttft0, ttft1, done0 = metrics_finished(&ttft0);
    golden_round(false, false);
    golden_round(true, true);
    struct resp r;
    static const char *const counted[][2] = {
        {"/v1/completions", "{\"prompt\": \"Once upon a time\", \"max_tokens\": 8, "
                            "\"temperature\": 0, \"logprobs\": 2}"},
        {"/v1/completions", "{\"prompt\": \"Once\", \"max_tokens\": 20, \"ignore_eos\": true}"},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time\"}], "
         "\"max_tokens\": 4, \"logprobs\": true, \"top_logprobs\": 2}"},
    };
    for (size_t i = 0; i < sizeof(counted) / sizeof(counted[0]); i++) {
        request("POST", counted[i][0], counted[i][1], &r);
        assert_int_equal(r.status, 200);
        free(r.body);
    }
    request("POST", "/v1/completions", "{\"prompt\": \"Hi\", \"logprobs\": 21}", &r);
    assert_error(&r, 400);
    request("POST", "/v1/chat/completions", "{\"messages\": [{\"content\": \"no role\"}]}", &r);
    assert_error(&r, 400);
    request("POST", "/tokenize", "{\"content\": \"Once upon a time\"}", &r);
    assert_int_equal(r.status, 200);
    free(r.body);
    unsigned long long done1 = metrics_finished(&ttft1);
    assert_int_equal(done1 - done0, 8 + 3);
    assert_int_equal(ttft1 - ttft0, 8 + 3);
}

/* Whether the completion @r answered one of the texts @a, @b (JSON's whitespace around). */
static bool answered(const struct resp *r, const char *a, const char *b)
{
    json_t *j = json_loads(r->body, 0, NULL);
    const char *t = json_string_value(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
    size_t n = t ? strlen(t) : 0;
    while (t && n && strchr(" \t\n\r", t[n - 1]))
        n--;
    size_t s0 = t ? strspn(t, " \t\n\r") : 0;
    bool ok = r->status == 200 && t && s0 <= n &&
              ((strlen(a) == n - s0 && !memcmp(t + s0, a, n - s0)) ||
               (strlen(b) == n - s0 && !memcmp(t + s0, b, n - s0)));
    json_decref(j);
    return ok;
}

/* The grammar counters of /metrics: compiled (*@compiled) and found compiled already. */
static unsigned long long grammars_reused(unsigned long long *compiled)
{
    struct resp r;
    request("GET", "/metrics", "", &r);
    assert_int_equal(r.status, 200);
    unsigned long long reused = 0;
    const char *m = strstr(r.body, "\nshardlm_grammars_compiled_total ");
    assert_non_null(m);
    sscanf(m, "\nshardlm_grammars_compiled_total %llu", compiled);
    m = strstr(r.body, "\nshardlm_grammars_reused_total ");
    assert_non_null(m);
    sscanf(m, "\nshardlm_grammars_reused_total %llu", &reused);
    free(r.body);
    return reused;
}

/* A grammar asked for again is compiled once (the last 16 kept): the same schema three times is
 * one compile and two reuses, each answer within it; 20 other choices (past the 16 places) all
 * compile and answer; and the first schema, evicted by then, compiles again. */
static void test_grammar_cache(void **state)
{
    static const char schema[] = "\"response_format\": {\"type\": \"json_schema\", "
                                 "\"json_schema\": {\"schema\": {\"enum\": [\"Lily\", \"Tom\"]}}}";
    struct resp r;
    char body[512];
    unsigned long long c0, c1, c2, c3;
    unsigned long long r0 = grammars_reused(&c0);
    for (int i = 0; i < 3; i++) {
        snprintf(body, sizeof(body),
                 "{\"prompt\": \"Once\", \"max_tokens\": 8, \"temperature\": 1, %s}", schema);
        request("POST", "/v1/completions", body, &r);
        if (!answered(&r, "\"Lily\"", "\"Tom\""))
            fail_msg("%s", r.body);
        free(r.body);
    }
    unsigned long long r1 = grammars_reused(&c1);
    assert_int_equal(c1 - c0, 1);
    assert_int_equal(r1 - r0, 2);
    for (int i = 0; i < 20; i++) {
        snprintf(body, sizeof(body),
                 "{\"prompt\": \"Once\", \"max_tokens\": 8, \"guided_choice\": [\"a%d\", \"b%d\"]}",
                 i, i);
        request("POST", "/v1/completions", body, &r);
        char a[16], b[16];
        snprintf(a, sizeof(a), "a%d", i);
        snprintf(b, sizeof(b), "b%d", i);
        if (!answered(&r, a, b))
            fail_msg("%s", r.body);
        free(r.body);
    }
    unsigned long long r2 = grammars_reused(&c2);
    assert_int_equal(c2 - c1, 20);
    assert_int_equal(r2, r1);
    snprintf(body, sizeof(body), "{\"prompt\": \"Once\", \"max_tokens\": 8, %s}", schema);
    request("POST", "/v1/completions", body, &r);
    assert_int_equal(r.status, 200);
    free(r.body);
    grammars_reused(&c3);
    assert_int_equal(c3 - c2, 1);
}

/* OpenAI fields the server does not implement: a value that asks for nothing is taken, any other
 * is a 400 naming the field (not ignored) */
static void test_inert_fields(void **state)
{
    struct resp r;
    static const struct {
        const char *field;
        bool taken;
    } inert[] = {
        {"\"logit_bias\": {\"5\": 100}", false},
        {"\"logit_bias\": {}", true},
        {"\"best_of\": 3", false},
        {"\"best_of\": 1", true},
        {"\"suffix\": \"The end\"", false},
        {"\"suffix\": null", true},
    };
    for (size_t i = 0; i < sizeof(inert) / sizeof(inert[0]); i++) {
        char body[256];
        snprintf(body, sizeof(body), "{\"prompt\": \"Once\", \"max_tokens\": 1, %s}",
                 inert[i].field);
        request("POST", "/v1/completions", body, &r);
        if (inert[i].taken) {
            if (r.status != 200)
                fprintf(stderr, "%s: %s\n", inert[i].field, r.body);
            assert_int_equal(r.status, 200);
            free(r.body);
        } else {
            char name[32];
            sscanf(inert[i].field, "\"%31[a-z_]", name);
            assert_non_null(strstr(r.body, name));
            assert_non_null(strstr(r.body, "not supported"));
            assert_error(&r, 400);
        }
    }
}

/* Structured output on /v1/completions: response_format and the guided fields constrain the
 * text; what does not compile, two constraints, or tools' fields are 400s naming the field */
/* Whether the number in @got ("|text|") equals one of the |-separated numbers of @want as JSON
 * Schema compares numbers (an enum's 1 allows 1.0: the grammar lets a sampled model write it). */
static bool same_number(const char *want, const char *got)
{
    char *end;
    double g = strtod(got + 1, &end);
    if (end == got + 1 || strcmp(end, "|"))
        return false;
    for (const char *w = want + 1; *w; w = strchr(w, '|') + 1) {
        double x = strtod(w, &end);
        if (end != w && *end == '|' && x == g)
            return true;
        if (!strchr(w, '|')[1])
            break;
    }
    return false;
}

static void test_structured_fields(void **state)
{
    struct resp r;
    static const struct {
        const char *field, *text; /* text NULL: a 400 whose message holds the words of @why */
        const char *why;
    } cases[] = {
        {"\"response_format\": {\"type\": \"text\"}", "", NULL},
        {"\"guided_choice\": [\"Lily\", \"Tom\"]", "Lily|Tom", NULL},
        {"\"guided_regex\": \"[a-c]{3}\"", NULL, NULL},
        {"\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": "
         "{\"enum\": [1, 2]}}}",
         "1|2", NULL},
        {"\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": "
         "{\"type\": \"string\", \"format\": \"hostname\"}}}",
         NULL, "format"},
        {"\"grammar\": \"root ::= x\"", NULL, "grammar"},
        {"\"guided_regex\": \"a\", \"grammar\": \"root ::= \\\"a\\\"\"", NULL, "one at most"},
        {"\"tool_choice\": \"required\"", NULL, "tool_choice"},
        {"\"response_format\": {\"type\": \"xml\"}", NULL, "response_format"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char body[512];
        snprintf(body, sizeof(body),
                 "{\"prompt\": \"Once\", \"max_tokens\": 8, \"temperature\": 1, %s}",
                 cases[i].field);
        request("POST", "/v1/completions", body, &r);
        if (cases[i].why || !cases[i].text) {
            if (!cases[i].why) { /* a regex: any three of a-c */
                assert_int_equal(r.status, 200);
                json_t *j = json_loads(r.body, 0, NULL);
                const char *t = json_string_value(
                    json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
                assert_non_null(t);
                assert_int_equal(strspn(t, "abc"), 3);
                assert_int_equal(strlen(t), 3);
                json_decref(j);
                free(r.body);
                continue;
            }
            if (!strstr(r.body, cases[i].why))
                fail_msg("%s: %s", cases[i].field, r.body);
            assert_error(&r, 400);
            continue;
        }
        if (r.status != 200)
            fail_msg("%s: %s", cases[i].field, r.body);
        json_t *j = json_loads(r.body, 0, NULL);
        const char *t = json_string_value(
            json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
        assert_non_null(t);
        const char *t0 = t;
        if (*cases[i].text) { /* one of the |-separated texts (JSON: whitespace around) */
            char want[64];
            snprintf(want, sizeof(want), "|%s|", cases[i].text);
            char got[64];
            size_t n = strlen(t);
            while (n && strchr(" \t\n\r", t[n - 1]))
                n--;
            t += strspn(t, " \t\n\r");
            snprintf(got, sizeof(got), "|%.*s|", (int)(n - (size_t)(t - t0)), t);
            if (!strstr(want, got) && !same_number(want, got))
                fail_msg("%s: %s", cases[i].field, t);
        }
        json_decref(j);
        free(r.body);
    }
}

/* A chat without max_tokens, or with null, streamed or not, runs to its end or the context; a
 * completion's default is 16; a max_tokens past the context is a 400 saying so */
static void test_max_tokens_default(void **state)
{
    struct resp r;
    request("POST", "/v1/chat/completions",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time\"}], "
            "\"max_tokens\": null}",
            &r);
    assert_int_equal(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    const char *fin = json_string_value(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "finish_reason"));
    assert_true(fin && (!strcmp(fin, "stop") || !strcmp(fin, "length")));
    json_decref(j);
    free(r.body);
    request("POST", "/v1/chat/completions",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time\"}], "
            "\"stream\": true, \"stream_options\": {\"include_usage\": true}}",
            &r);
    assert_int_equal(r.status, 200);
    char sfin[32];
    int sn = 0;
    free(stream_text(&r, true, sfin, sizeof(sfin), &sn));
    assert_true(!strcmp(sfin, "stop") ? sn > 0 : !strcmp(sfin, "length") && sn > 16);
    free(r.body);
    request("POST", "/v1/completions",
            "{\"prompt\": \"Once upon a time\", \"max_tokens\": null, \"ignore_eos\": true}", &r);
    assert_int_equal(r.status, 200);
    j = json_loads(r.body, 0, NULL);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 16);
    json_decref(j);
    free(r.body);
    request("POST", "/v1/chat/completions",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
            "\"max_tokens\": 100000}",
            &r);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "exceeds the context of "));
    assert_non_null(strstr(r.body, " or fewer"));
    free(r.body);
}

/* Tools and documents: /apply-template renders them as a chat request does - the same prompt,
 * so the chat's prompt tokens are the rendering's (BOS and its text) */
static void test_tools_documents(void **state)
{
    struct resp r;
    static const char tools_req[] =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time\"}], "
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"weather\"}}], "
        "\"documents\": [{\"title\": \"story\", \"text\": \"a cat\"}], "
        "\"max_tokens\": 1, \"temperature\": 0}";
    request("POST", "/apply-template", tools_req, &r);
    assert_int_equal(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    const char *rendered = json_string_value(json_object_get(j, "prompt"));
    assert_non_null(rendered);
    assert_string_equal(rendered, "<s>tool weather\ndocument story\nOnce upon a time");
    json_t *tk = json_pack("{s:s,s:b}", "content", rendered + 3, "add_special", 1);
    char *tks = json_dumps(tk, JSON_COMPACT);
    json_decref(tk);
    json_decref(j);
    free(r.body);
    request("POST", "/tokenize", tks, &r);
    free(tks);
    assert_int_equal(r.status, 200);
    j = json_loads(r.body, 0, NULL);
    size_t rendered_tokens = json_array_size(json_object_get(j, "tokens"));
    json_decref(j);
    free(r.body);
    request("POST", "/v1/chat/completions", tools_req, &r);
    assert_int_equal(r.status, 200);
    j = json_loads(r.body, 0, NULL);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")),
        rendered_tokens);
    json_decref(j);
    free(r.body);
}

/* A client that shuts down its writing side once its request is sent gets its answer:
 * completions streamed and not, /tokenize */
static void test_half_closed(void **state)
{
    struct resp r;
    static const char *const half_paths[] = {"/v1/completions", "/v1/completions", "/tokenize"};
    static const char *const half_bodies[] = {
        "{\"prompt\": \"Once upon a time\", \"max_tokens\": 8, \"temperature\": 0}",
        "{\"prompt\": \"Once upon a time\", \"max_tokens\": 8, \"temperature\": 0, "
        "\"stream\": true, \"stream_options\": {\"include_usage\": true}}",
        "{\"content\": \"Once upon a time\"}"};
    for (int i = 0; i < 3; i++) {
        char req[1024], sfin[32];
        snprintf(req, sizeof(req),
                 "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                 "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                 half_paths[i], key, strlen(half_bodies[i]), half_bodies[i]);
        int hf = connect_server();
        assert_true(hf >= 0);
        send_all(hf, req, strlen(req));
        assert_int_equal(shutdown(hf, SHUT_WR), 0);
        read_response(hf, &r);
        if (r.status != 200)
            fprintf(stderr, "half-closed %s: %d %s\n", half_paths[i], r.status, r.body);
        assert_int_equal(r.status, 200);
        if (i == 1) {
            int hn = 0;
            free(stream_text(&r, false, sfin, sizeof(sfin), &hn));
            assert_int_equal(hn, 8);
        } else
            assert_non_null(strstr(r.body, i ? "\"tokens\":[" : "\"completion_tokens\":8"));
        free(r.body);
    }
}

/* A body that cannot be delimited for sure (RFC 9112 section 6.3): one 400 each */
static void test_undelimited_bodies(void **state)
{
    assert_one_400("POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}");
    assert_one_400("POST /tokenize HTTP/1.1\r\nHost: x\r\n"
                   "Content-Length: 100000000000000000000\r\n\r\n{}");
    assert_one_400("POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 2, 2\r\n\r\n{}");
    assert_one_400("POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 19\r\n"
                   "Content-Length: 2\r\n\r\n{\"content\": \"Once\"}");
    assert_one_400("POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                   "Content-Length: 19\r\n\r\n13\r\n{\"content\": \"Once\"}\r\n0\r\n\r\n");
    assert_one_400("POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 19\r\n"
                   "Transfer-Encoding: chunked\r\n\r\n13\r\n{\"content\": \"Once\"}\r\n0\r\n\r\n");

    assert_one_400("POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length : 19\r\n\r\n"
                   "{\"content\": \"Once\"}"); /* RFC 9112 section 5.1 */
    assert_one_400("POST /tokenize HTTP/1.1\nHost: x\nContent-Length: -5\n\n{}"); /* bare LFs */
    static const char *const codings[] = {"identity", "gzip, chunked", "chunked, chunked",
                                          "xchunked"};
    for (size_t i = 0; i < sizeof(codings) / sizeof(codings[0]); i++) {
        char req[256];
        snprintf(req, sizeof(req),
                 "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: %s\r\n\r\n"
                 "13\r\n{\"content\": \"Once\"}\r\n0\r\n\r\n",
                 codings[i]);
        assert_one_400(req);
    }
}

/* A kept-alive connection's later request: its two lengths are refused by the handler (an
 * unparseable one gets libmicrohttpd's own 400, which the gate cannot see: gate.h) */
static void test_kept_alive_lengths(void **state)
{
    int fd = connect_server();
    assert_true(fd >= 0);
    static const char first[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    send_all(fd, first, sizeof(first) - 1);
    char kept[1024];
    size_t kl = 0;
    while (kl < sizeof(kept) - 1 && !memmem(kept, kl, "{\"status\":\"ok\"}\n", 16)) {
        ssize_t n = recv(fd, kept + kl, sizeof(kept) - 1 - kl, 0);
        assert_true(n > 0);
        kl += (size_t)n;
    }
    static const char second[] = "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 19\r\n"
                                 "Content-Length: 2\r\n\r\n{\"content\": \"Once\"}";
    send_all(fd, second, sizeof(second) - 1);
    size_t rl;
    char *raw = read_raw(fd, &rl);
    if (raw_status(raw) != 400 || strstr(raw + 1, "HTTP/1."))
        fprintf(stderr, "kept alive, then two Content-Lengths:\n%s\n", raw);
    assert_int_equal(raw_status(raw), 400);
    assert_null(strstr(raw + 1, "HTTP/1."));
    assert_non_null(strstr(raw, "\"error\":{"));
    free(raw);
}

/* Pipelined requests (sent in one write) and a head with bare LFs are all answered at once, not
 * after the 15 s a request has to arrive */
static void test_pipelined(void **state)
{
    static const struct {
        const char *req;
        int answers;
    } prompt_ones[] = {
        {"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n"
         "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
         3},
        {"GET /health HTTP/1.1\nHost: x\nConnection: close\n\n", 1},
    };
    for (size_t i = 0; i < sizeof(prompt_ones) / sizeof(prompt_ones[0]); i++) {
        struct timespec t0, t1;
        size_t rl;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        char *raw = raw_exchange(prompt_ones[i].req, false, &rl);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        int answers = 0;
        for (const char *h = raw; (h = strstr(h, "HTTP/1.1 200 OK\r\n")); h++)
            answers++;
        if (answers != prompt_ones[i].answers || took > 5)
            fprintf(stderr, "--- sent\n%s\n--- got in %.1f s\n%s\n", prompt_ones[i].req, took, raw);
        assert_int_equal(answers, prompt_ones[i].answers);
        /* 15 s when the server waited for a head it already had; an answer takes milliseconds:
         * 5 s tells them apart on a host however loaded */
        assert_true(took < 5);
        free(raw);
    }
}

/* HEAD is GET without the body, on every GET route; /health and the page need no key */
static void test_head(void **state)
{
    assert_head_like_get("/health", true);
    assert_head_like_get("/metrics", true);
    assert_head_like_get("/", true);
    assert_head_like_get("/v1/models", false);
    assert_head_like_get("/v1/models/f32.shlm", false);
    assert_head_like_get("/v1/models", true); /* 401 both */
}

/* Without the key: the page (static, no data), /health and /metrics (for a scraper) answer;
 * everything that reads the model or runs it is a 401 */
static void test_routes_without_key(void **state)
{
    struct resp r;
    static const struct {
        const char *method, *path;
        int status;
    } open_routes[] = {
        {"GET", "/", 200},
        {"GET", "/index.html", 200},
        {"GET", "/v1/", 200},
        {"GET", "/v1/index.html", 200},
        {"GET", "/health", 200},
        {"GET", "/v1/health", 200},
        {"GET", "/metrics", 200},
        {"GET", "/v1/models", 401},
        {"GET", "/models", 401},
        {"GET", "/v1/models/f32.shlm", 401},
        {"POST", "/v1/completions", 401},
        {"POST", "/completions", 401},
        {"POST", "/v1/chat/completions", 401},
        {"POST", "/tokenize", 401},
        {"POST", "/detokenize", 401},
        {"POST", "/apply-template", 401},
        {"POST", "/v1/apply-template", 401},
        {"GET", "/v1/nothing", 401},
        {"GET", "/v1/completions", 401},
        {"OPTIONS", "/v1/models", 401},
    };
    for (size_t i = 0; i < sizeof(open_routes) / sizeof(open_routes[0]); i++) {
        int fd = send_request(open_routes[i].method, open_routes[i].path, "{}", 2, true);
        read_response(fd, &r);
        if (r.status != open_routes[i].status)
            fprintf(stderr, "no key: %s %s: %d\n", open_routes[i].method, open_routes[i].path,
                    r.status);
        assert_int_equal(r.status, open_routes[i].status);
        assert_null(strstr(r.body, "f32.shlm")); /* nothing names the model */
        free(r.body);
    }
}

/* Bad requests: each its status and an OpenAI error object */
static void test_bad_requests(void **state)
{
    struct resp r;
    request("POST", "/v1/completions", "{\"prompt\": ", &r);
    assert_error(&r, 400);
    request("POST", "/v1/completions", "[1, 2]", &r);
    assert_error(&r, 400);
    request("POST", "/v1/completions", "{\"prompt\": \"Hi\", \"n\": 2}", &r);
    assert_error(&r, 400);
    request("POST", "/v1/completions", "{\"prompt\": \"Hi\", \"max_tokens\": 0}", &r);
    assert_error(&r, 400);
    request("POST", "/v1/completions", "{\"prompt\": \"Hi\", \"temperature\": \"hot\"}", &r);
    assert_error(&r, 400);
    request("POST", "/v1/completions", "{\"prompt\": [1, 99999]}", &r);
    assert_error(&r, 400);
    char *longp = malloc(20000 + 1); /* more tokens than the context, however they merge */
    memset(longp, 'a', 20000);
    longp[20000] = '\0';
    char *body = completion_body(longp, 4, false); /* past the context of 256 */
    request("POST", "/v1/completions", body, &r);
    assert_error(&r, 400);
    free(body);
    free(longp);
    request("POST", "/v1/completions", "{\"prompt\": \"Hi\", \"temperature\": 5}", &r);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "\"param\":\"temperature\"")); /* OpenAI's param */
    free(r.body);
    request("GET", "/v1/models/f32.shlm", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"id\":\"f32.shlm\""));
    free(r.body);
    request("GET", "/v1/models/gpt-4", NULL, &r);
    assert_error(&r, 404);
    request("GET", "/v1/nothing", NULL, &r);
    assert_error(&r, 404);
    request("GET", "/v1/completions", NULL, &r);
    assert_error(&r, 405);
    size_t big = (1u << 20) + 10;
    char *huge = malloc(big);
    memset(huge, ' ', big);
    int fd = send_request("POST", "/v1/completions", huge, big, false);
    read_response(fd, &r);
    assert_error(&r, 413);
    free(huge);
}

/* A client that leaves mid-stream: the server goes on serving the next one */
static void test_client_leaves(void **state)
{
    char *body = completion_body("Once upon a time", 200, true);
    int fd = send_request("POST", "/v1/completions", body, strlen(body), false);
    char some[256];
    assert_true(recv(fd, some, sizeof(some), 0) > 0);
    close(fd);
    free(body);
    golden_round(false, false);
}

/* SIGTERM drains: a stream that runs goes on to its end, new requests get a 503; then the
 * server exits 0 and leaves no run file and no worker (the last case: it stops the server) */
static void test_sigterm_drains(void **state)
{
    struct resp r;
    char *body = completion_body("Once upon a time", 240, true);
    int fd = send_request("POST", "/v1/completions", body, strlen(body), false);
    free(body);
    char head[64];
    assert_true(recv(fd, head, sizeof(head), MSG_PEEK | MSG_WAITALL) == (ssize_t)sizeof(head));
    kill(server, SIGTERM);
    for (int i = 0; i < 100; i++) { /* until it drains (or, done already, no longer listens) */
        int hf = send_request("GET", "/health", "", 0, true);
        if (hf < 0)
            break;
        read_response(hf, &r);
        free(r.body);
        if (r.status != 200) {
            assert_true(r.status == 503 || r.status == -1);
            int f2 = send_request("POST", "/v1/completions", "{\"prompt\": \"Hi\"}", 16, false);
            if (f2 >= 0) {
                read_response(f2, &r);
                if (r.status != -1) /* -1: closed meanwhile */
                    assert_error(&r, 503);
                else
                    free(r.body);
            }
            break;
        }
        usleep(5 * 1000);
    }
    read_response(fd, &r);
    assert_int_equal(r.status, 200);
    char finish[32];
    int completion = 0;
    free(stream_text(&r, false, finish, sizeof(finish), &completion));
    assert_true(!strcmp(finish, "length") || !strcmp(finish, "stop"));
    assert_true(completion > 0);
    free(r.body);
    pthread_join(srv_thread, NULL); /* tu_run_shardlm reaps it */
    if (srv_run->status != 0)
        fprintf(stderr, "serve: status %d\n%s\n", srv_run->status, srv_run->err);
    assert_int_equal(srv_run->status, 0);
    assert_non_null(strstr(srv_run->err, "listening on http://127.0.0.1:"));
    assert_true(tu_count_run_files(rundir) <= 0);
    assert_false(tu_workers_alive(rundir));
}

/* Bad options: one line and exit 2, before anything starts. */
static void test_serve_usage(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char *bad[][6] = {{"serve", NULL},
                      {"serve", "-m", model, "--host", "localhost", NULL},
                      {"serve", "-m", model, "--port", "70000", NULL},
                      {"serve", "-m", model, "--max-waiting", "0", NULL}};
    /* a chat template that is missing or does not parse: one line, exit 1, before loading */
    char badt[4200];
    tu_path(badt, sizeof(badt), "%s/bad.jinja", dir);
    assert_int_equal(tu_write(badt, "x\n{% if %}", 10), 0);
    char *bad_tmpl[][6] = {{"serve", "-m", model, "--chat-template", "/nonexistent/t.jinja", NULL},
                           {"serve", "-m", model, "--chat-template", badt, NULL}};
    for (size_t i = 0; i < 2; i++) {
        tu_run_shardlm(r, env_rundir, bad_tmpl[i], NULL, 30, NULL, NULL);
        assert_int_equal(r->status, 1);
        assert_non_null(strstr(r->err, i ? "bad.jinja: line 2: " : "t.jinja"));
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tu_run_shardlm(r, env_rundir, bad[i], NULL, 30, NULL, NULL);
        assert_int_equal(r->status, 2);
        assert_non_null(strstr(r->err, "shardlm serve: "));
    }
    char empty[4200];
    tu_path(empty, sizeof(empty), "%s/empty-key", dir);
    assert_int_equal(tu_write(empty, "\n", 1), 0);
    char *args[] = {"serve", "-m", model, "--api-key-file", empty, NULL};
    tu_run_shardlm(r, env_rundir, args, NULL, 30, NULL, NULL);
    assert_int_equal(r->status, 1);
    assert_non_null(strstr(r->err, "the first line must hold the API key"));
    free(r);
}

int main(void)
{
    if (!tu_have_data())
        return 1;
    if (make_files()) {
        fprintf(stderr, "test_serve: cannot make the model and files in %s\n", dir);
        tu_rmdir(dir);
        return 1;
    }
    const struct CMUnitTest options[] = {
        cmocka_unit_test(test_serve_usage),
    };
    /* in this order: each case stands alone, but the last one stops the server */
    const struct CMUnitTest served[] = {
        cmocka_unit_test(test_key),
        cmocka_unit_test(test_golden_completions),
        cmocka_unit_test(test_golden_completion_streams),
        cmocka_unit_test(test_golden_chats),
        cmocka_unit_test(test_golden_chat_streams),
        cmocka_unit_test(test_chat_template),
        cmocka_unit_test(test_ignore_eos),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_tokenize),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_inert_fields),
        cmocka_unit_test(test_structured_fields),
        cmocka_unit_test(test_grammar_cache),
        cmocka_unit_test(test_max_tokens_default),
        cmocka_unit_test(test_tools_documents),
        cmocka_unit_test(test_half_closed),
        cmocka_unit_test(test_undelimited_bodies),
        cmocka_unit_test(test_kept_alive_lengths),
        cmocka_unit_test(test_pipelined),
        cmocka_unit_test(test_head),
        cmocka_unit_test(test_routes_without_key),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_client_leaves),
        cmocka_unit_test(test_sigterm_drains),
    };
    int failed = cmocka_run_group_tests_name("serve options", options, NULL, NULL);
    failed += cmocka_run_group_tests_name("serve", served, start_server, stop_server);
    tu_rmdir(dir);
    return failed ? 1 : 0;
}
