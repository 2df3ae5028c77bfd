/* SPDX-License-Identifier: MIT */
/* coordinator/cli/cmd_tokenize.c: `shardlm tokenize` - encode a text or decode ids with the
 * tokenizer of a tokenizer.bin, a GGUF, a tokenizer.json, a tokenizer blob or a .shlm file, told
 * apart by their content (coord_tok_from_image). */
#include "cli.h"

#include "tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char usage[] =
    "usage: shardlm tokenize --tokenizer FILE [--bos] [--eos] [--add-special] [--special]\n"
    "                        [--vocab-size N] TEXT\n"
    "       shardlm tokenize --tokenizer FILE [--vocab-size N] --decode ID...\n"
    "       shardlm tokenize --tokenizer FILE [--bos] [--eos] [--add-special] [--special] --jsonl\n"
    "\n"
    "Prints the token ids of TEXT on one line, separated by spaces, or with --decode the text\n"
    "of the ids, then a newline. FILE is told apart by its content: a .shlm model, a GGUF file,\n"
    "a Hugging Face tokenizer.json, a tokenizer blob, or a llama2.c tokenizer.bin.\n"
    "  --bos, --eos      start with BOS / end with EOS (default: neither)\n"
    "  --add-special     BOS/EOS as the tokenizer's source declares (add_bos_token, ...)\n"
    "  --special         text that spells a control token (\"<|endoftext|>\") is that token\n"
    "  --vocab-size N    entries of a tokenizer.bin (default: as many as it holds exactly)\n"
    "  --decode          the arguments are ids to turn back into text\n"
    "  --jsonl           each line of stdin is a JSON string to encode; prints for each a\n"
    "                    line {\"ids\": [...], \"text\": DECODED}: the ids decoded back\n"
    "                    (bytes that are not UTF-8 become U+FFFD)\n";

#define bad_usage(...) coord_usage_error("tokenize", usage, __VA_ARGS__)

/* The decoded text of @ids[0..@n) as streaming prints it (coord_utf8_feed: ill-formed bytes
 * U+FFFD), in a malloc'd buffer of *@len bytes, or NULL. */
static char *decode_all(const struct coord_tok *t, const int32_t *ids, int n, size_t *len)
{
    size_t cap = 64, o = 0;
    char *out = malloc(cap);
    struct coord_utf8 u = {0};
    for (int i = 0; out && i <= n; i++) {
        size_t pl = 0;
        const char *p = i < n ? coord_tok_decode(t, i ? ids[i - 1] : -1, ids[i], &pl) : NULL;
        size_t need = o + 3 * pl + 16;
        if (need > cap) {
            char *grown = realloc(out, cap = need * 2);
            if (!grown) {
                free(out);
                return NULL;
            }
            out = grown;
        }
        o += i < n ? coord_utf8_feed(&u, p, pl, out + o) : coord_utf8_flush(&u, out + o);
    }
    *len = o;
    return out;
}

/* --jsonl: encodes each line of stdin (a JSON string) and prints {"ids": [...], "text": the ids
 * decoded}, one line each. Returns 0 or -errno with @e naming the line. */
static int run_jsonl(const struct coord_tok *t, unsigned flags, struct shardlm_err *e)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int rc = 0;
    for (long no = 1; !rc && (got = getline(&line, &cap, stdin)) > 0; no++) {
        json_error_t je;
        json_t *s = json_loadb(line, (size_t)got, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!json_is_string(s)) {
            json_decref(s);
            rc = shardlm_fail(e, -EINVAL, "stdin line %ld: expected a JSON string", no);
            break;
        }
        size_t len = json_string_length(s), dlen = 0;
        int max = (int)(len * 2 + 8);
        int32_t *ids = malloc((size_t)max * sizeof(int32_t));
        json_t *arr = json_array(), *o = NULL;
        struct shardlm_err why;
        int n = ids ? coord_tok_encode_err(t, json_string_value(s), len, flags, ids, max, &why)
                    : -ENOMEM;
        char *text = n >= 0 ? decode_all(t, ids, n, &dlen) : NULL;
        for (int i = 0; arr && i < n; i++)
            json_array_append_new(arr, json_integer(ids[i]));
        if (n < 0)
            rc = shardlm_fail(e, n, "stdin line %ld: cannot tokenize the text: %s", no,
                              n == -ENOMEM ? "out of memory" : why.msg);
        else if (!text || !arr || !(o = json_pack("{s:O,s:s%}", "ids", arr, "text", text, dlen)))
            rc = shardlm_fail(e, -ENOMEM, "out of memory");
        char *out = o ? json_dumps(o, JSON_COMPACT) : NULL;
        if (out)
            puts(out);
        else if (!rc)
            rc = shardlm_fail(e, -ENOMEM, "out of memory");
        free(out);
        json_decref(o);
        json_decref(arr);
        free(text);
        free(ids);
        json_decref(s);
    }
    free(line);
    return rc;
}

static int run(const char *path, long vocab_size, bool decode, bool jsonl, unsigned flags,
               int n_args, char **args, struct shardlm_err *e)
{
    void *map;
    size_t size;
    struct coord_tok t;
    int rc = coord_cli_open_tok(path, vocab_size, &t, &map, &size, e);
    if (rc)
        return rc;
    if (jsonl) {
        rc = run_jsonl(&t, flags, e);
    } else if (decode) {
        int prev = -1;
        for (int i = 0; i < n_args; i++) {
            long id;
            if (!coord_parse_long(args[i], 0, t.vocab_size - 1, &id)) {
                rc = shardlm_fail(e, -EINVAL, "id '%s': expected 0..%d", args[i], t.vocab_size - 1);
                goto out_tok;
            }
            size_t len;
            const char *p = coord_tok_decode(&t, prev, (int)id, &len);
            fwrite(p, 1, len, stdout);
            prev = (int)id;
        }
        putchar('\n');
    } else {
        size_t len = strlen(args[0]);
        int max = (int)(len * 2 + 8) > 0 ? (int)(len * 2 + 8) : 8;
        int32_t *ids = malloc((size_t)max * sizeof(int32_t));
        if (!ids) {
            rc = shardlm_fail(e, -ENOMEM, "out of memory");
            goto out_tok;
        }
        struct shardlm_err why;
        int n = coord_tok_encode_err(&t, args[0], len, flags, ids, max, &why);
        if (n < 0) {
            rc = shardlm_fail(e, n, "cannot tokenize the text: %s", why.msg);
            free(ids);
            goto out_tok;
        }
        for (int i = 0; i < n; i++)
            printf(i ? " %d" : "%d", ids[i]);
        putchar('\n');
        free(ids);
    }
    if (fflush(stdout) != 0)
        rc = shardlm_fail(e, -EIO, "cannot write to stdout");
out_tok:
    coord_tok_free(&t);
    munmap(map, size);
    return rc;
}

int coord_cmd_tokenize(int argc, char **argv)
{
    static const struct option opts[] = {{"tokenizer", required_argument, 0, 't'},
                                         {"vocab-size", required_argument, 0, 'v'},
                                         {"bos", no_argument, 0, 'b'},
                                         {"eos", no_argument, 0, 'e'},
                                         {"add-special", no_argument, 0, 'a'},
                                         {"special", no_argument, 0, 's'},
                                         {"decode", no_argument, 0, 'd'},
                                         {"jsonl", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *path = NULL;
    long vocab_size = 0;
    bool decode = false, jsonl = false;
    unsigned flags = 0;
    static const struct coord_cli_path paths[] = {{'t', "--tokenizer"}, {0, 0}};
    static const struct coord_cli_cmd cmd = {"tokenize", usage, "h", opts, paths};
    int c, rc;
    optind = 0; /* GNU: start afresh (the tests call this more than once) */
    while ((c = coord_cli_getopt(&cmd, argc, argv, &rc)) != -1) {
        switch (c) {
        case COORD_CLI_EXIT:
            return rc;
        case 't':
            path = optarg;
            break;
        case 'v':
            if (!coord_parse_long(optarg, 1, COORD_TOK_MAX_VOCAB, &vocab_size))
                return bad_usage("--vocab-size '%s': expected 1..4194304", optarg);
            break;
        case 'b':
            flags |= COORD_TOK_ENC_BOS;
            break;
        case 'e':
            flags |= COORD_TOK_ENC_EOS;
            break;
        case 'a':
            flags |= COORD_TOK_ENC_ADD_SPECIAL;
            break;
        case 's':
            flags |= COORD_TOK_ENC_PARSE_SPECIAL;
            break;
        case 'd':
            decode = true;
            break;
        case 'j':
            jsonl = true;
            break;
        }
    }
    if (!path)
        return bad_usage("--tokenizer FILE is required");
    int n_args = argc - optind;
    if (decode && n_args < 1)
        return bad_usage("--decode needs at least one id");
    if (decode && flags)
        return bad_usage("--bos, --eos, --add-special and --special are for encoding");
    if (jsonl && (decode || n_args))
        return bad_usage("--jsonl reads its texts from stdin: no --decode, no TEXT");
    if (!decode && !jsonl && n_args != 1)
        return bad_usage("expected one TEXT argument (quote it), got %s", n_args ? "more" : "none");
    for (int i = 0; decode && i < n_args; i++) { /* the range needs the vocabulary: later */
        long id;
        if (!coord_parse_long(argv[optind + i], 0, LONG_MAX, &id))
            return bad_usage("--decode: '%s' is not a token id", argv[optind + i]);
    }
    struct shardlm_err e;
    rc = run(path, vocab_size, decode, jsonl, flags, n_args, argv + optind, &e);
    if (rc) {
        fprintf(stderr, "shardlm tokenize: %s\n", e.msg);
        return 1;
    }
    return 0;
}
