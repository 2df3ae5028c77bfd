/* SPDX-License-Identifier: MIT */
/* coordinator/cli/cmd_template.c: `shardlm template` - a chat template rendered over a request
 * read from stdin, for scripts and for checking a template against Jinja2 itself. */
#include "cli.h"

#include "chat.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUEST_MAX (16u << 20) /* bytes of the request on stdin */

static const char usage[] =
    "usage: shardlm template --chat-template FILE [--bos-token S] [--eos-token S] < REQUEST.json\n"
    "\n"
    "Prints the prompt a chat template renders for a request (exactly its bytes, nothing\n"
    "added), as POST /apply-template returns it. The request on stdin is a JSON object:\n"
    "{\"messages\": [{\"role\": ..., \"content\": ...}, ...], \"add_generation_prompt\": true,\n"
    " \"chat_template_kwargs\": {...}} (add_generation_prompt defaults to true; the kwargs are\n"
    "extra template variables, e.g. {\"enable_thinking\": false}). Contents may be strings or\n"
    "lists of text parts (joined with newlines).\n"
    "  --chat-template FILE  the Jinja template (as a tokenizer_config.json's chat_template)\n"
    "  --bos-token S         the template's bos_token (default empty)\n"
    "  --eos-token S         the template's eos_token (default empty)\n"
    "A template that raises (raise_exception) prints its message and exits 1.\n";

#define bad_usage(...) coord_usage_error("template", usage, __VA_ARGS__)

/* stdin, whole, up to REQUEST_MAX bytes */
static int read_stdin(char **out, size_t *len, struct shardlm_err *e)
{
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    if (!b)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    for (;;) {
        if (n == cap) {
            if (cap >= REQUEST_MAX) {
                free(b);
                return shardlm_fail(e, -EFBIG, "the request on stdin is larger than %u MiB",
                                    REQUEST_MAX >> 20);
            }
            char *nb = realloc(b, cap * 2);
            if (!nb) {
                free(b);
                return shardlm_fail(e, -ENOMEM, "out of memory");
            }
            b = nb;
            cap *= 2;
        }
        size_t k = fread(b + n, 1, cap - n, stdin);
        n += k;
        if (k == 0) {
            if (ferror(stdin)) {
                free(b);
                return shardlm_fail(e, -EIO, "cannot read stdin");
            }
            break;
        }
    }
    *out = b;
    *len = n;
    return 0;
}

static int run(const char *path, const char *bos, const char *eos, struct shardlm_err *e)
{
    struct coord_chat_tmpl t;
    int rc = coord_cli_load_template(path, bos, eos, &t, NULL, e);
    if (rc)
        return rc;
    char why[320];
    char *body = NULL;
    size_t blen = 0;
    if ((rc = read_stdin(&body, &blen, e)))
        goto out_tmpl;
    json_error_t je;
    json_t *req = json_loadb(body, blen, 0, &je);
    free(body);
    if (!req) {
        rc = shardlm_fail(e, -EINVAL, "stdin: not JSON (line %d: %s)", je.line, je.text);
        goto out_tmpl;
    }
    char *out;
    size_t olen;
    bool bad;
    rc = coord_chat_render_request(&t, req, &out, &olen, &bad, why, sizeof(why));
    json_decref(req);
    if (rc) {
        rc = shardlm_fail(e, rc, "%s%s", bad ? "stdin: " : "", why);
        goto out_tmpl;
    }
    if (fwrite(out, 1, olen, stdout) != olen || fflush(stdout) != 0)
        rc = shardlm_fail(e, -EIO, "cannot write to stdout");
    free(out);
out_tmpl:
    coord_chat_tmpl_free(&t);
    return rc;
}

int coord_cmd_template(int argc, char **argv)
{
    static const struct option opts[] = {{"chat-template", required_argument, 0, 't'},
                                         {"bos-token", required_argument, 0, 'b'},
                                         {"eos-token", required_argument, 0, 'e'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    static const struct coord_cli_path paths[] = {{'t', "--chat-template"}, {0, 0}};
    static const struct coord_cli_cmd cmd = {"template", usage, "h", opts, paths};
    const char *path = NULL, *bos = "", *eos = "";
    int c, rc;
    optind = 0;
    while ((c = coord_cli_getopt(&cmd, argc, argv, &rc)) != -1) {
        switch (c) {
        case COORD_CLI_EXIT:
            return rc;
        case 't':
            path = optarg;
            break;
        case 'b':
            bos = optarg;
            break;
        case 'e':
            eos = optarg;
            break;
        }
    }
    if (!path)
        return bad_usage("--chat-template FILE is required");
    if (optind < argc)
        return coord_cli_extra_argument("template", usage, argv);
    struct shardlm_err e = {0};
    return coord_cli_exit("template", run(path, bos, eos, &e), &e);
}
