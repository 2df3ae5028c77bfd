/* SPDX-License-Identifier: MIT */
/* coordinator/server/gate.c: the listening socket, and each request's head looked at before
 * libmicrohttpd reads it (why: gate.h). One thread accepts; each new connection gets a thread
 * of its own until its head has come (libmicrohttpd then gives it another, its own). */
#include "gate.h"

#include "util.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define POLL_MS 100 /* a waiting thread sees the stop flag this often */

struct coord_gate {
    struct coord_gate_opts o;
    int fd, port;
    int stop; /* __atomic */
    pthread_t accepter;
    pthread_mutex_t mu;
    pthread_cond_t idle;
    uint32_t pending; /* screening threads (mu) */
};

struct pending {
    struct coord_gate *g;
    int fd;
    struct sockaddr_storage addr;
    socklen_t len;
    uint64_t since;
};

bool coord_gate_chunked(const char *v, size_t n)
{
    while (n && (*v == ' ' || *v == '\t'))
        v++, n--;
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    return n == 7 && !strncasecmp(v, "chunked", 7);
}

/* Whether header line [@p, @e) names field @name (lower case, with its colon). */
static bool field_is(const char *p, const char *e, const char *name)
{
    size_t n = strlen(name);
    return (size_t)(e - p) >= n && !strncasecmp(p, name, n);
}

const char *coord_gate_head_error(const char *head, size_t len)
{
    const char *p = head, *end = head + len;
    while (p < end && (*p == '\r' || *p == '\n')) /* empty lines before the request line */
        p++;
    const char *line_end = memchr(p, '\n', (size_t)(end - p)); /* the request line */
    if (!line_end)
        return NULL;
    const char *rl_end = line_end > p && line_end[-1] == '\r' ? line_end - 1 : line_end;
    bool http10 = rl_end - p >= 8 && !memcmp(rl_end - 8, "HTTP/1.0", 8);
    unsigned lengths = 0, encodings = 0;
    const char *first = NULL; /* the first Content-Length's digits, without leading zeros */
    size_t first_n = 0;
    for (p = line_end + 1; p < end; p = line_end + 1) {
        line_end = memchr(p, '\n', (size_t)(end - p));
        if (!line_end)
            line_end = end;
        const char *e = line_end;
        if (e > p && e[-1] == '\r')
            e--;
        if (e == p) /* the blank line that ends the head */
            break;
        /* libmicrohttpd glues a folded line onto the one before without a separator (so
         * "Content-Length: 1" + " 0" is 10 to it, 1 to a proxy): refused, as section 5.2 allows */
        if (*p == ' ' || *p == '\t')
            return "a header line that starts with whitespace (obsolete line folding, RFC 9112 "
                   "section 5.2)";
        const char *colon = memchr(p, ':', (size_t)(e - p));
        if (!colon || colon == p)
            return "a header line without a field name and a colon";
        if (colon[-1] == ' ' || colon[-1] == '\t')
            return "whitespace between a header field's name and its colon (RFC 9112 section "
                   "5.1)";
        if (field_is(p, e, "transfer-encoding:")) {
            if (http10)
                return "Transfer-Encoding in an HTTP/1.0 request (RFC 9112 section 6.1)";
            if (++encodings > 1)
                return "Transfer-Encoding: given more than once";
            if (!coord_gate_chunked(colon + 1, (size_t)(e - colon - 1)))
                return "Transfer-Encoding: only chunked is taken";
        }
        if (!field_is(p, e, "content-length:"))
            continue;
        lengths++;
        const char *v = colon + 1, *ve = e;
        while (v < ve && (*v == ' ' || *v == '\t'))
            v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        size_t digits = 0;
        while (v + digits < ve && v[digits] >= '0' && v[digits] <= '9')
            digits++;
        if (!digits || v + digits != ve)
            return "Content-Length: expected one decimal number of bytes";
        while (digits > 1 && *v == '0') { /* leading zeros are still one number */
            v++;
            digits--;
        }
        if (digits > 19) /* 10^19 bytes and more: past any body, and past what a u64 holds */
            return "Content-Length: past any body this server takes";
        if (!first) {
            first = v;
            first_n = digits;
        } else if (digits != first_n || memcmp(v, first, digits)) {
            return "Content-Length: two different values";
        }
    }
    if (lengths && encodings)
        return "Transfer-Encoding and Content-Length together: send one of them";
    return NULL;
}

size_t coord_gate_head_len(const char *buf, size_t n)
{
    size_t i = 0;
    while (i < n && (buf[i] == '\r' || buf[i] == '\n')) /* empty lines before the request line */
        i++;
    for (; i < n; i++) {
        if (buf[i] != '\n')
            continue;
        if (i + 1 < n && buf[i + 1] == '\n')
            return i + 2;
        if (i + 2 < n && buf[i + 1] == '\r' && buf[i + 2] == '\n')
            return i + 3;
    }
    return 0;
}

const char *coord_gate_screen(int fd, uint64_t deadline_ns, const int *stop)
{
    char *buf = malloc(COORD_GATE_HEAD_MAX);
    if (!buf)
        return NULL;
    const char *why = NULL;
    ssize_t seen = -1;
    while (!__atomic_load_n(stop, __ATOMIC_RELAXED) && shardlm_now_ns() < deadline_ns) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, POLL_MS) <= 0)
            continue;
        ssize_t n = recv(fd, buf, COORD_GATE_HEAD_MAX, MSG_PEEK | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (n <= 0) /* its end, or an error: libmicrohttpd sees it too */
            break;
        size_t head = coord_gate_head_len(buf, (size_t)n);
        if (head) {
            why = coord_gate_head_error(buf, head);
            break;
        }
        if (n == COORD_GATE_HEAD_MAX) { /* unchecked, libmicrohttpd would take up to its pool */
            why = "the request head is longer than 16 KiB";
            break;
        }
        if (n == seen)         /* the same part again: poll() says readable while it sits */
            usleep(10 * 1000); /* there; wait for more */
        seen = n;
    }
    free(buf);
    return why;
}

void coord_gate_refuse(int fd, const char *resp, size_t len)
{
    while (len) {
        ssize_t w = send(fd, resp, len, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        resp += w;
        len -= (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    char sink[4096];
    uint64_t until = shardlm_now_ns() + 1000000000ull;
    while (shardlm_now_ns() < until) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, POLL_MS) > 0 && recv(fd, sink, sizeof(sink), MSG_DONTWAIT) == 0)
            break;
        if (pf.revents & (POLLHUP | POLLERR))
            break;
    }
}

/* One new connection: its first head, then libmicrohttpd or a refusal. */
static void *screen(void *arg)
{
    struct pending *p = arg;
    struct coord_gate *g = p->g;
    uint64_t deadline = p->since + (uint64_t)g->o.deadline_s * 1000000000ull;
    const char *why = coord_gate_screen(p->fd, deadline, &g->stop);
    /* past the deadline without a whole head (a client trickling it): cut off here, as the
     * server's watchdog cuts off a connection's later requests */
    if (!why && !__atomic_load_n(&g->stop, __ATOMIC_RELAXED) && shardlm_now_ns() < deadline) {
        g->o.admit(g->o.arg, p->fd, (const struct sockaddr *)&p->addr, p->len);
    } else {
        char *resp = NULL;
        size_t len = 0;
        if (why && g->o.refusal(g->o.arg, why, &resp, &len))
            coord_gate_refuse(p->fd, resp, len);
        free(resp);
        close(p->fd);
    }
    free(p);
    pthread_mutex_lock(&g->mu);
    if (!--g->pending)
        pthread_cond_broadcast(&g->idle);
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

static void *accepter(void *arg)
{
    struct coord_gate *g = arg;
    while (!__atomic_load_n(&g->stop, __ATOMIC_RELAXED)) {
        struct pollfd pf = {.fd = g->fd, .events = POLLIN};
        if (poll(&pf, 1, POLL_MS) <= 0)
            continue;
        struct pending *p = calloc(1, sizeof(*p));
        if (!p) {
            usleep(10 * 1000);
            continue;
        }
        p->g = g;
        p->len = sizeof(p->addr);
        p->fd = accept4(g->fd, (struct sockaddr *)&p->addr, &p->len, SOCK_CLOEXEC);
        if (p->fd < 0) {
            free(p);
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                usleep(10 * 1000); /* out of descriptors: the kernel's queue holds them */
            continue;
        }
        p->since = shardlm_now_ns();
        pthread_mutex_lock(&g->mu);
        bool room = g->pending < g->o.max_pending;
        if (room)
            g->pending++;
        pthread_mutex_unlock(&g->mu);
        pthread_t t;
        pthread_attr_t at;
        bool started = false;
        if (room && !pthread_attr_init(&at)) {
            pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
            started = pthread_create(&t, &at, screen, p) == 0;
            pthread_attr_destroy(&at);
        }
        if (!started) {
            if (room) {
                pthread_mutex_lock(&g->mu);
                g->pending--;
                pthread_mutex_unlock(&g->mu);
            }
            close(p->fd); /* as libmicrohttpd closes one past its connection limit */
            free(p);
        }
    }
    return NULL;
}

int coord_gate_start(struct coord_gate **out, const struct coord_gate_opts *o)
{
    struct coord_gate *g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    g->o = *o;
    /* non-blocking: a connection gone between poll() and accept4() must not block the stop */
    g->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1, rc;
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);
    if (g->fd < 0 || setsockopt(g->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
        bind(g->fd, (const struct sockaddr *)&o->addr, sizeof(o->addr)) ||
        listen(g->fd, SOMAXCONN) || getsockname(g->fd, (struct sockaddr *)&a, &alen)) {
        rc = -errno;
        goto out_close;
    }
    g->port = ntohs(a.sin_port);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->idle, NULL);
    if ((rc = -pthread_create(&g->accepter, NULL, accepter, g)))
        goto out_destroy;
    *out = g;
    return 0;
out_destroy:
    pthread_cond_destroy(&g->idle);
    pthread_mutex_destroy(&g->mu);
out_close:
    if (g->fd >= 0)
        close(g->fd);
    free(g);
    return rc;
}

int coord_gate_port(const struct coord_gate *g) { return g->port; }

void coord_gate_stop(struct coord_gate *g)
{
    if (!g)
        return;
    __atomic_store_n(&g->stop, 1, __ATOMIC_RELAXED);
    pthread_join(g->accepter, NULL);
    close(g->fd);
    pthread_mutex_lock(&g->mu);
    while (g->pending) /* each sees the flag within POLL_MS (a refusal's linger: 1 s) */
        pthread_cond_wait(&g->idle, &g->mu);
    pthread_mutex_unlock(&g->mu);
    pthread_cond_destroy(&g->idle);
    pthread_mutex_destroy(&g->mu);
    free(g);
}
