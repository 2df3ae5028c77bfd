/* SPDX-License-Identifier: MIT */
/* tests/test_gate.c: the server's look at a connection's first request head
 * (coordinator/server/gate.c) - where a head ends, and which heads it refuses. Each case says
 * which way it must go, so a check that stops refusing fails here (test_serve sends some of them
 * over a socket, where the handler's own checks would hide it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gate.h"

static const struct {
    const char *head;
    const char *refusal; /* a word of the reason, or NULL: it passes */
} heads[] = {
    /* what clients send */
    {"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", NULL},
    {"POST /v1/completions HTTP/1.1\r\nHost: localhost:8080\r\nUser-Agent: curl/7.88.1\r\n"
     "Accept: */*\r\nContent-Type: application/json\r\nContent-Length: 42\r\n\r\n",
     NULL},
    {"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: keep-alive\r\n"
     "content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
     NULL},
    {"POST /x HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n", NULL},
    {"POST /x HTTP/1.1\r\nContent-Length: 007\r\nContent-Length: 7\r\n\r\n", NULL},
    {"GET / HTTP/1.1\nHost: x\n\n", NULL},
    {"GET / HTTP/1.1\r\nX-Empty:\r\n\r\n", NULL},
    {"\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n", NULL},
    /* what a proxy in front might read otherwise */
    {"POST /x HTTP/1.1\r\nContent-Length: -5\r\n\r\n", "decimal"},
    {"POST /x HTTP/1.1\r\nContent-Length: 2, 2\r\n\r\n", "decimal"},
    {"POST /x HTTP/1.1\r\nContent-Length: \r\n\r\n", "decimal"},
    {"POST /x HTTP/1.1\r\nContent-Length: 100000000000000000000\r\n\r\n", "past any body"},
    {"POST /x HTTP/1.1\r\nContent-Length: 10000000000000000000\r\n\r\n", "past any body"},
    {"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "two different"},
    {"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", "together"},
    {"POST /x HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", "together"},
    {"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "only chunked"},
    {"POST /x HTTP/1.1\r\nTransfer-Encoding: identity\r\n\r\n", "only chunked"},
    {"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
     "more than once"},
    {"POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", "HTTP/1.0"},
    {"POST /x HTTP/1.1\r\nContent-Length : 3\r\n\r\n", "colon"},
    {"POST /x HTTP/1.1\r\nContent-Length\t: 3\r\n\r\n", "colon"},
    {"POST /x HTTP/1.1\r\nContent-Length: 1\r\n 0\r\n\r\n", "folding"},
    {"POST /x HTTP/1.1\r\n\tX: y\r\n\r\n", "folding"},
    {"POST /x HTTP/1.1\r\nContent-Length 3\r\n\r\n", "colon"},
    {"POST /x HTTP/1.1\r\n: 3\r\n\r\n", "colon"},
    /* the same behind empty lines (libmicrohttpd skips them) and with bare LFs */
    {"\r\n\r\nPOST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "two different"},
    {"\n\nPOST /x HTTP/1.1\nTransfer-Encoding: gzip\n\n", "only chunked"},
    {"POST /x HTTP/1.1\nContent-Length: -1\n\n", "decimal"},
};

static void test_heads(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(heads) / sizeof(heads[0]); i++) {
        const char *h = heads[i].head;
        size_t n = strlen(h), len = coord_gate_head_len(h, n);
        if (len != n)
            fail_msg("case %zu: head length %zu of %zu", i, len, n);
        const char *why = coord_gate_head_error(h, len);
        if (!heads[i].refusal != !why || (why && !strstr(why, heads[i].refusal)))
            fail_msg("case %zu (%.40s...): '%s', expected %s%s", i, h, why ? why : "passes",
                     heads[i].refusal ? "a refusal saying " : "it passes",
                     heads[i].refusal ? heads[i].refusal : "");
    }
}

/* A head's end: its first empty line, CRLF or LF; 0 while it has not come; what follows it
 * (a body, a pipelined request) is not part of it. */
static void test_head_len(void **state)
{
    (void)state;
    static const struct {
        const char *buf;
        size_t len;
    } cases[] = {
        {"GET / HTTP/1.1\r\nHost: x\r\n", 0},
        {"GET / HTTP/1.1\r\nHost: x\r\n\r", 0},
        {"GET / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n", 18},
        {"GET / HTTP/1.1\n\nbody", 16},
        {"GET / HTTP/1.1\n\r\nbody", 17},
        {"\r\n\r\n", 0},
        {"", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (coord_gate_head_len(cases[i].buf, strlen(cases[i].buf)) != cases[i].len)
            fail_msg("case %zu: %zu, expected %zu", i,
                     coord_gate_head_len(cases[i].buf, strlen(cases[i].buf)), cases[i].len);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_heads),
                                       cmocka_unit_test(test_head_len)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
