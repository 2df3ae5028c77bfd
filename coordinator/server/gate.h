/* SPDX-License-Identifier: MIT */
/* coordinator/server/gate.h: the server's listening socket, and a look at each request's head
 * before libmicrohttpd reads it.
 *
 * libmicrohttpd 0.9.75 (Debian 12's) answers a Content-Length it cannot parse (-5, 10^20,
 * "2, 2") with its own HTML page, its status line and headers written twice
 * (transmit_error_response_len() builds the header, then the state machine builds it again),
 * and never calls the handler. So the server accepts the connections itself: the gate peeks
 * (MSG_PEEK: nothing consumed) at a connection's first request head, then hands the socket over
 * (MHD_add_connection) or answers the 400 itself. The next requests of a kept-alive connection
 * are not peeked at: libmicrohttpd may hold them already (read with a body, or pipelined), so a
 * later one with an unparseable Content-Length still gets libmicrohttpd's reply (a 400 whose
 * header comes twice); the server's handler refuses its other framing faults. */
#ifndef SHARDLM_COORD_GATE_H
#define SHARDLM_COORD_GATE_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define COORD_GATE_HEAD_MAX 16384 /* bytes of a head looked at; a longer one is refused */

struct coord_gate;

struct coord_gate_opts {
    struct sockaddr_in addr;
    uint32_t max_pending; /* connections being looked at; more are closed at accept */
    uint32_t deadline_s;  /* a head must arrive within this long of the accept */
    /* A connection whose head passed (or could not be read: it ends, or is too long), for
     * libmicrohttpd; it owns @fd from then on. */
    void (*admit)(void *arg, int fd, const struct sockaddr *addr, socklen_t len);
    /* The whole HTTP response refusing a head for @why (malloc'd into *@out, *@len bytes);
     * false: none (the connection is closed without one). */
    bool (*refusal)(void *arg, const char *why, char **out, size_t *len);
    void *arg;
};

/* Binds and listens (backlog SOMAXCONN, SO_REUSEADDR) and starts accepting. Returns 0, or
 * -errno (bind or listen failed: -EADDRINUSE, -EADDRNOTAVAIL...). Stop with coord_gate_stop(). */
int coord_gate_start(struct coord_gate **g, const struct coord_gate_opts *o);
/* The port it listens on. */
int coord_gate_port(const struct coord_gate *g);
/* Stops accepting, closes what it still looks at, waits for its threads, frees @g. */
void coord_gate_stop(struct coord_gate *g);

/* Why the request head @head (@len bytes, up to its blank line) must be refused, or NULL: its
 * body cannot be delimited for sure (RFC 9112 section 6.3: a Content-Length that is not one
 * decimal number, two different ones, one with Transfer-Encoding, a Transfer-Encoding other
 * than chunked or given twice or in HTTP/1.0), a field name ends in whitespace (section 5.1), a
 * line is folded (5.2) or has no colon. A proxy in front might read such a head otherwise than
 * libmicrohttpd does. */
const char *coord_gate_head_error(const char *head, size_t len);

/* Whether a Transfer-Encoding value (@n bytes at @v) is "chunked" alone: the one coding the
 * server takes (libmicrohttpd waits for a body it cannot delimit under any other, RFC 9112
 * section 6.1). */
bool coord_gate_chunked(const char *v, size_t n);

/* The length of the request head at the start of @buf (@n bytes) up to and including its blank
 * line (CRLF or a bare LF, as libmicrohttpd takes both), or 0 while it is not all there. */
size_t coord_gate_head_len(const char *buf, size_t n);

/* Waits for the head of the first request on @fd (peeked, left for libmicrohttpd) until
 * @deadline_ns (shardlm_now_ns()) or *@stop (read with __atomic_load_n()). Returns its error as
 * coord_gate_head_error() says, or that it is longer than COORD_GATE_HEAD_MAX; or NULL: it
 * passed, or no whole head came (the connection ended, the time ran out). */
const char *coord_gate_screen(int fd, uint64_t deadline_ns, const int *stop);

/* Sends @resp on @fd, shuts down the writing side and reads what the client still sends for up
 * to a second, so that the answer is not lost to a reset (a lingering close); does not close. */
void coord_gate_refuse(int fd, const char *resp, size_t len);

#endif
