/* SPDX-License-Identifier: MIT */
/* The routes of `shardlm serve` (coordinator/server/http.c) against the list the docs give
 * (README.md's serve paragraph, docs/deploy.md's security section), kept here by hand so that
 * the server's own table can be wrong: every path, with and without /v1, answers the methods it
 * takes; every other method gets a 405 whose Allow header names exactly those it takes (RFC
 * 9110 section 15.5.6) - with or without the key on a public route, behind the 401 on one that
 * needs the key (an unknown path without the key is a 401 too: docs/deploy.md); an unknown path
 * is a 404 without an Allow. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <strings.h>
#include <sys/socket.h>

#include "testutil.h"

static char dir[4096], rundir[4096], env_rundir[4200], model[4200], keyfile[4200];
static const char key[] = "routes-key-71c2";

/* What the docs list: a path, the methods it takes, whether it needs the key. GET routes take
 * HEAD too (README: "HEAD works on every GET route"). */
static const struct {
    const char *path;
    const char *allow; /* the Allow header's methods, in any order */
    bool key;
} routes[] = {
    {"/health", "GET, HEAD", false},
    {"/metrics", "GET, HEAD", false},
    {"/", "GET, HEAD", false},
    {"/index.html", "GET, HEAD", false},
    {"/models", "GET, HEAD", true},
    {"/models/f32.shlm", "GET, HEAD", true},
    {"/models/another-name", "GET, HEAD", true},
    {"/completions", "POST", true},
    {"/chat/completions", "POST", true},
    {"/tokenize", "POST", true},
    {"/detokenize", "POST", true},
    {"/apply-template", "POST", true},
};

/* The methods tried on each path. */
static const char *const methods[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"};

static int setup(void **state)
{
    tu_mkdtemp(dir, sizeof(dir), "routes");
    tu_path(rundir, sizeof(rundir), "%s/run", dir);
    tu_path(env_rundir, sizeof(env_rundir), "SHARDLM_RUNTIME_DIR=%s", rundir);
    tu_path(model, sizeof(model), "%s/f32.shlm", dir);
    tu_path(keyfile, sizeof(keyfile), "%s/key", dir);
    char line[64];
    snprintf(line, sizeof(line), "%s\n", key);
    return tu_convert(model, "f32", NULL) || tu_write(keyfile, line, strlen(line)) ? -1 : 0;
}

static int teardown(void **state)
{
    tu_rmdir(dir);
    return 0;
}

static int port;

/* An answer: its status, its Allow header's value ("" when none) and its body. */
struct answer {
    int status;
    char allow[128];
    char body[2048];
};

/* Sends "@method @path" (with the key when @with_key, a body "{}" when @method is not HEAD or
 * GET) on a connection of its own and reads the answer until the server closes it. Returns
 * false when no answer came. */
static bool ask(const char *method, const char *path, bool with_key, struct answer *a)
{
    memset(a, 0, sizeof(*a));
    a->status = -1;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {.tv_sec = 30};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
        close(fd);
        return false;
    }
    bool body = strcmp(method, "GET") && strcmp(method, "HEAD");
    char req[512];
    int n = snprintf(
        req, sizeof(req),
        "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s%s%s\r\n%s", method, path,
        with_key ? "Authorization: Bearer " : "", with_key ? key : "", with_key ? "\r\n" : "",
        body ? "Content-Type: application/json\r\nContent-Length: 2\r\n" : "", body ? "{}" : "");
    bool sent = send(fd, req, (size_t)n, MSG_NOSIGNAL) == n;
    char raw[8192];
    size_t len = 0;
    ssize_t got;
    while (sent && len < sizeof(raw) - 1 &&
           (got = recv(fd, raw + len, sizeof(raw) - 1 - len, 0)) > 0)
        len += (size_t)got;
    close(fd);
    raw[len] = '\0';
    char *end = strstr(raw, "\r\n\r\n");
    if (!sent || !end || sscanf(raw, "HTTP/1.1 %d", &a->status) != 1)
        return false;
    *end = '\0';
    for (char *h = strstr(raw, "\r\n"); h; h = strstr(h + 2, "\r\n"))
        if (!strncasecmp(h + 2, "Allow:", 6)) {
            const char *v = h + 8 + strspn(h + 8, " ");
            snprintf(a->allow, sizeof(a->allow), "%.*s", (int)strcspn(v, "\r"), v);
        }
    snprintf(a->body, sizeof(a->body), "%s", end + 4);
    return true;
}

/* Whether the comma-separated method list @allow names @method. */
static bool allows(const char *allow, const char *method)
{
    size_t ml = strlen(method);
    for (const char *o = allow + strspn(allow, ", "); *o; o += strspn(o, ", ")) {
        size_t ol = strcspn(o, ", ");
        if (ol == ml && !strncmp(o, method, ml))
            return true;
        o += ol;
    }
    return false;
}

/* How many methods the list @l names. */
static int count_methods(const char *l)
{
    int n = 0;
    for (const char *o = l + strspn(l, ", "); *o; o += strspn(o, ", "), n++)
        o += strcspn(o, ", ");
    return n;
}

/* Whether the method lists @a and @b name the same methods. */
static bool same_methods(const char *a, const char *b)
{
    for (size_t m = 0; m < sizeof(methods) / sizeof(methods[0]); m++)
        if (allows(a, methods[m]) != allows(b, methods[m]))
            return false;
    return count_methods(a) == count_methods(b);
}

/* GET /health until it answers 200 (the server loads the model after it listens). */
static bool wait_ready(pid_t pid)
{
    struct answer a;
    for (int i = 0; i < 600 && !kill(pid, 0); i++) {
        if (ask("GET", "/health", false, &a) && a.status == 200)
            return true;
        usleep(100 * 1000);
    }
    return false;
}

/* Counts a failed check with its line on stderr, so that every route is tried. */
static int failures;
static void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char *fmt, ...)
{
    if (ok)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    failures++;
}

/* One route's methods at @path, with the key or without. */
static void try_route(size_t i, const char *path, bool with_key)
{
    for (size_t m = 0; m < sizeof(methods) / sizeof(methods[0]); m++) {
        const char *method = methods[m];
        struct answer a;
        if (!ask(method, path, with_key, &a)) {
            check(false, "%s %s: no answer", method, path);
            continue;
        }
        bool taken = allows(routes[i].allow, method);
        const char *keyed = with_key ? "with the key" : "without the key";
        if (routes[i].key && !with_key) { /* nothing about a keyed path without the key */
            check(a.status == 401, "%s %s %s: %d (expected 401)", method, path, keyed, a.status);
            continue;
        }
        if (taken) {
            /* a 404 only of the model's name (/models/another-name), not of the path */
            check(a.status != 405 && !strstr(a.body, "no such endpoint"),
                  "%s %s %s: %d (a method it takes)", method, path, keyed, a.status);
            continue;
        }
        check(a.status == 405, "%s %s %s: %d (expected 405)", method, path, keyed, a.status);
        check(same_methods(a.allow, routes[i].allow), "%s %s %s: Allow '%s' (expected '%s')",
              method, path, keyed, a.allow, routes[i].allow);
        if (strcmp(method, "HEAD")) { /* an OpenAI error object naming the method */
            json_t *j = json_loads(a.body, 0, NULL);
            const char *msg =
                json_string_value(json_object_get(json_object_get(j, "error"), "message"));
            check(msg && strstr(msg, method), "%s %s %s: body '%s'", method, path, keyed, a.body);
            json_decref(j);
        }
    }
}

/* Every route, then an unknown path; SIGTERM at the end. */
static void drive(pid_t pid, void *arg)
{
    bool *ok = arg;
    if (!wait_ready(pid)) {
        kill(pid, SIGKILL);
        return;
    }
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        char v1[128];
        snprintf(v1, sizeof(v1), "/v1%s", routes[i].path);
        for (int with_key = 0; with_key < 2; with_key++) {
            try_route(i, routes[i].path, with_key);
            try_route(i, v1, with_key);
        }
    }
    /* an unknown path: a 404 without Allow (with the key; without it, a 401) */
    static const char *const unknown[] = {"/v1/nothing", "/nothing", "/v1", "/healthz",
                                          "/v1/completions/x"};
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        struct answer a;
        for (size_t m = 0; m < 3; m++) { /* GET, HEAD, POST */
            bool got = ask(methods[m], unknown[i], true, &a);
            check(got && a.status == 404 && !*a.allow, "%s %s: %d, Allow '%s' (expected 404)",
                  methods[m], unknown[i], a.status, a.allow);
            got = ask(methods[m], unknown[i], false, &a);
            check(got && a.status == 401, "%s %s without the key: %d (expected 401)", methods[m],
                  unknown[i], a.status);
        }
    }
    kill(pid, SIGTERM);
    *ok = failures == 0;
}

static void test_routes(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char p[16];
    port = tu_free_port();
    assert_true(port > 0);
    snprintf(p, sizeof(p), "%d", port);
    char *args[] = {"serve", "-m", model, "--port", p, "--api-key-file", keyfile, NULL};
    bool ok = false;
    tu_run_shardlm(r, env_rundir, args, NULL, 90, drive, &ok);
    if (r->status != 0)
        fprintf(stderr, "serve: status %d\n%s\n", r->status, r->err);
    assert_int_equal(failures, 0);
    assert_true(ok);
    assert_int_equal(r->status, 0);
    free(r);
}

int main(void)
{
    if (!tu_have_data())
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
