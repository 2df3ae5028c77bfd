/* SPDX-License-Identifier: MIT */
/* coordinator/cli/cmd_tokenize.c: `shardlm tokenize` - encode a text or decode ids with the
 * tokenizer of a tokenizer.bin, a GGUF, a tokenizer.json, a tokenizer blob or a .shlm file, told
 * apart by their content (coord_tok_from_image). */
#include "cli.h"

#include "tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
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
    "\n"
    "Prints the token ids of TEXT on one line, separated by spaces, or with --decode the text\n"
    "of the ids, then a newline. FILE is told apart by its content: a .shlm model, a GGUF file,\n"
    "a Hugging Face tokenizer.json, a tokenizer blob, or a llama2.c tokenizer.bin.\n"
    "  --bos, --eos      start with BOS / end with EOS (default: neither)\n"
    "  --add-special     BOS/EOS as the tokenizer's source declares (add_bos_token, ...)\n"
    "  --special         text that spells a control token (\"<|endoftext|>\") is that token\n"
    "  --vocab-size N    entries of a tokenizer.bin (default: as many as it holds exactly)\n"
    "  --decode          the arguments are ids to turn back into text\n";

#define bad_usage(...) coord_usage_error("tokenize", usage, __VA_ARGS__)

static int run(const char *path, long vocab_size, bool decode, unsigned flags, int n_args,
               char **args, struct shardlm_err *e)
{
    void *map;
    size_t size;
    int rc = coord_map_nonempty(path, &map, &size, e);
    if (rc)
        return rc;
    struct coord_tok t;
    rc = coord_tok_from_image(&t, map, size, vocab_size, path, e);
    if (rc)
        goto out_unmap;
    if (decode) {
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
out_unmap:
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
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *path = NULL;
    long vocab_size = 0;
    bool decode = false;
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
        }
    }
    if (!path)
        return bad_usage("--tokenizer FILE is required");
    int n_args = argc - optind;
    if (decode && n_args < 1)
        return bad_usage("--decode needs at least one id");
    if (decode && flags)
        return bad_usage("--bos, --eos, --add-special and --special are for encoding");
    if (!decode && n_args != 1)
        return bad_usage("expected one TEXT argument (quote it), got %s", n_args ? "more" : "none");
    for (int i = 0; decode && i < n_args; i++) { /* the range needs the vocabulary: later */
        long id;
        if (!coord_parse_long(argv[optind + i], 0, LONG_MAX, &id))
            return bad_usage("--decode: '%s' is not a token id", argv[optind + i]);
    }
    struct shardlm_err e;
    rc = run(path, vocab_size, decode, flags, n_args, argv + optind, &e);
    if (rc) {
        fprintf(stderr, "shardlm tokenize: %s\n", e.msg);
        return 1;
    }
    return 0;
}
