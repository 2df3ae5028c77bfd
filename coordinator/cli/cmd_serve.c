/* SPDX-License-Identifier: MIT */
/* coordinator/cli/cmd_serve.c: `shardlm serve` - options, then coord_serve. */
#include "chat.h"
#include "cli.h"
#include "notify.h"
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_serve[] =
    "usage: shardlm serve -m MODEL.shlm [--host ADDR] [--port N] [--api-key-file F]\n"
    "                     [--chat-template FILE] [--max-waiting N] [--max-connections N]\n"
    "                     [--drain-seconds N] [--max-seqs N] [--step-tokens N]\n"
    "                     [--kv-tokens N] [--kv-mem SIZE] [--no-prefix-cache] [--workers N]\n"
    "                     [--threads T] [--cpus LIST] [--no-persist] [--io MODE] [--verify]\n"
    "                     [--stats] [--restarts N] [--listen EP] [--keys DIR] [--verbose]\n"
    "\n"
    "An OpenAI-compatible HTTP server over the batched engine. It listens at once (GET /health\n"
    "answers 503 while the model loads, 200 when it serves). SIGINT or SIGTERM drains it: new\n"
    "requests get 503, running ones finish (for up to --drain-seconds), then it exits 0; a\n"
    "second signal stops it at once. A worker that dies is restarted (--restarts); past that\n"
    "the engine is lost: every open request gets its error (a 500, or an error event before\n"
    "[DONE]), /health and new requests 503, then it exits 1 saying why. Under systemd\n"
    "(Type=notify; deploy/systemd/) it sends READY=1 to $NOTIFY_SOCKET once /health answers\n"
    "200, and STOPPING=1 when a drain starts or the engine is lost.\n"
    "Endpoints (each also without /v1; HEAD as GET): GET /health, GET /metrics (Prometheus),\n"
    "GET / (a chat page; these three need no key), GET /v1/models, POST /v1/completions\n"
    "(prompt as a string or token ids; max_tokens (default 16), temperature, top_p, top_k,\n"
    "min_p, seed, stop, frequency_penalty, presence_penalty, repetition_penalty, logprobs\n"
    "(0..20), ignore_eos, stream and\n"
    "stream_options.include_usage; streamed as server-sent events or one JSON body;\n"
    "structured outputs: response_format json_object or json_schema, llama.cpp's json_schema\n"
    "and grammar, vLLM's guided_json / guided_regex / guided_choice / guided_grammar), POST\n"
    "/v1/chat/completions (messages through the model's chat template; the same parameters,\n"
    "logprobs true with top_logprobs, chat_template_kwargs; tools with tool_choice auto, none,\n"
    "required or a named function and parallel_tool_calls, answered as tool_calls in the\n"
    "model's own call syntax; reasoning apart as reasoning_content unless reasoning_format is\n"
    "\"none\"), POST /apply-template {\"messages\"}\n"
    "(the rendered prompt), POST /tokenize {\"content\", \"add_special\"} and POST\n"
    "/detokenize {\"tokens\"}. Errors are OpenAI error objects: 400, 401, 404, 405, 413 (bodies\n"
    "past 1 MiB), 429, 503. A client that disconnects has its request cancelled within a step.\n"
    "  --host ADDR     IPv4 address to bind (default 127.0.0.1, loopback only)\n"
    "  --port N        TCP port (default 8080; 0: any free one, printed on stderr)\n"
    "  --api-key-file F\n"
    "                  require \"Authorization: Bearer KEY\", KEY the file's first line\n"
    "  --chat-template FILE\n"
    "                  the Jinja chat template for chat requests, instead of the model's own\n"
    "                  (`shardlm template` shows what it renders)\n"
    "  --max-waiting N requests queued beyond the running ones before a 429 (default 4 x\n"
    "                  --max-seqs)\n"
    "  --max-connections N\n"
    "                  open connections at once (default 512); a request's header and body must\n"
    "                  arrive within 15 s of its connection's accept or previous answer\n"
    "  --drain-seconds N\n"
    "                  after SIGTERM, how long running requests may go on (default 30)\n" SCHED_HELP
        LAYOUT_HELP LOAD_HELP ACCESS_HELP
    "  --verbose       worker layout, the KV cache's blocks and per-step timings on stderr\n";

#define API_KEY_MAX 4096

/* The line scripts wait for: the address, with the port bound (--port 0 picks one). */
static void print_listen(void *arg, int port)
{
    const struct coord_serve_opts *o = arg;
    fprintf(stderr, "shardlm: listening on http://%s:%d\n", o->host, port);
}

/* --stats: the load report once the model is served. */
static void print_ready(void *arg, struct coord_engine *g)
{
    const struct coord_serve_opts *o = arg;
    if (o->engine.load.stats)
        coord_cli_print_stats(g, 0, stderr);
}

/* The key: the file's first line, without its newline; refuses an empty one. */
static int read_key(const char *path, char **out, struct shardlm_err *e)
{
    uint8_t *buf;
    size_t len;
    int rc = coord_read_file(path, API_KEY_MAX, &buf, &len, e);
    if (rc)
        return rc;
    size_t n = 0;
    while (n < len && buf[n] != '\n' && buf[n] != '\r')
        n++;
    if (!n || memchr(buf, '\0', n)) {
        free(buf);
        return shardlm_fail(e, -EINVAL, "%s: the first line must hold the API key", path);
    }
    char *k = realloc(buf, len + 1);
    if (!k) {
        free(buf);
        return shardlm_fail(e, -ENOMEM, "out of memory");
    }
    k[n] = '\0';
    *out = k;
    return 0;
}

static const struct option serve_options[] = {{"host", required_argument, 0, 1200},
                                              {"port", required_argument, 0, 1201},
                                              {"api-key-file", required_argument, 0, 1202},
                                              {"max-waiting", required_argument, 0, 1203},
                                              {"drain-seconds", required_argument, 0, 1204},
                                              {"chat-template", required_argument, 0, 1205},
                                              {"max-connections", required_argument, 0, 1206},
                                              {"help", no_argument, 0, 'h'},
                                              SCHED_OPTIONS,
                                              ENGINE_OPTIONS,
                                              {0, 0, 0, 0}};

static const struct coord_cli_path serve_paths[] = {
    {1202, "--api-key-file"}, {1205, "--chat-template"}, {0, 0}};

static const struct coord_cli_cmd serve_cmd = {"serve", usage_serve, "m:vh", serve_options,
                                               serve_paths};

#define bad_usage(...) coord_usage_error("serve", usage_serve, __VA_ARGS__)

/* What the command line asks for: coord_serve's options and the files they come from. */
struct serve_args {
    struct coord_serve_opts o;
    const char *key_file, *template_file;
};

/* One of serve's own options (@c, its value in optarg) into @arg, a struct serve_args. Returns
 * -1 to go on, else the exit code (2 after a bad value). */
static int serve_option(int c, void *arg)
{
    struct serve_args *a = arg;
    long v;
    switch (c) {
    case 1200: {
        struct in_addr addr;
        if (inet_pton(AF_INET, optarg, &addr) != 1)
            return bad_usage("--host '%s': expected an IPv4 address", optarg);
        a->o.host = optarg;
        break;
    }
    case 1201:
        if (!coord_parse_long(optarg, 0, 65535, &v))
            return bad_usage("--port '%s': expected 0..65535", optarg);
        a->o.port = (int)v;
        break;
    case 1202:
        a->key_file = optarg;
        break;
    case 1203:
        if (!coord_parse_long(optarg, 1, 1 << 20, &v))
            return bad_usage("--max-waiting '%s': expected 1..1048576", optarg);
        a->o.max_waiting = (uint32_t)v;
        break;
    case 1204:
        if (!coord_parse_long(optarg, 0, 86400, &v))
            return bad_usage("--drain-seconds '%s': expected 0..86400", optarg);
        a->o.drain_seconds = (uint32_t)v;
        break;
    case 1205:
        a->template_file = optarg;
        break;
    case 1206:
        if (!coord_parse_long(optarg, 1, 65536, &v))
            return bad_usage("--max-connections '%s': expected 1..65536", optarg);
        a->o.max_connections = (uint32_t)v;
        break;
    }
    return -1;
}

/* The files the options name, read before the engine starts: the API key into *@key, the chat
 * template (parsed here too, so that a syntax error fails at the start) into *@tmpl. Returns 0
 * or -errno with @e set and nothing to free. */
static int serve_read_files(const struct serve_args *a, char **key, char **tmpl,
                            struct shardlm_err *e)
{
    *key = *tmpl = NULL;
    int rc = a->key_file ? read_key(a->key_file, key, e) : 0;
    if (!rc && a->template_file) {
        struct coord_chat_tmpl t;
        if (!(rc = coord_cli_load_template(a->template_file, NULL, NULL, &t, tmpl, e)))
            coord_chat_tmpl_free(&t);
    }
    if (rc) {
        free(*key);
        *key = NULL;
    }
    return rc;
}

/* Serves with @o until a signal drains it or the engine is lost, telling systemd (its
 * NOTIFY_SOCKET) when it is ready. Returns 0 or -errno with @e set. */
static int serve_run(struct coord_serve_opts *o, struct shardlm_err *e)
{
    if (!o->api_key && strncmp(o->host, "127.", 4))
        fprintf(stderr,
                "shardlm: warning: serving on %s without --api-key-file: anyone who "
                "reaches this address can use the model\n",
                o->host);
    coord_signals_install();
    /* systemd's readiness socket, for this process only: the workers are not told of it */
    const char *notify = getenv("NOTIFY_SOCKET");
    int nrc = coord_notify_open(notify);
    if (nrc < 0)
        fprintf(stderr, "shardlm: warning: NOTIFY_SOCKET='%s': %s; no readiness will be sent\n",
                notify, nrc == -EINVAL ? "not a socket path or @name" : strerror(-nrc));
    unsetenv("NOTIFY_SOCKET");
    int rc = coord_cli_engine_env(&o->engine, e);
    if (!rc)
        rc = coord_serve(o, e);
    coord_notify_close();
    return rc;
}

int coord_cmd_serve(int argc, char **argv)
{
    struct serve_args a = {
        .o = {.host = "127.0.0.1", .port = 8080, .stop = &coord_stop_signal, .drain_seconds = 30}};
    struct coord_serve_opts *o = &a.o;
    int rc =
        coord_cli_parse_engine(&serve_cmd, argc, argv, &o->engine, &o->sched, serve_option, &a);
    if (rc >= 0)
        return rc;
    if (!o->engine.model_path)
        return bad_usage("-m MODEL.shlm is required");
    if ((rc = coord_cli_check_kv(&serve_cmd, &o->engine)) >= 0)
        return rc;
    struct shardlm_err e = {{0}};
    char *key, *tmpl;
    if ((rc = serve_read_files(&a, &key, &tmpl, &e)))
        return coord_cli_exit("serve", rc, &e);
    o->chat_template = tmpl;
    o->version = coord_cli_version;
    o->api_key = key;
    o->on_listen = print_listen;
    o->on_ready = print_ready;
    o->arg = o;
    rc = serve_run(o, &e);
    free(key);
    free(tmpl);
    return coord_cli_exit("serve", rc, &e);
}
