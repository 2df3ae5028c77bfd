/* SPDX-License-Identifier: MIT */
/* coordinator/cli/cmd_synth.c: `shardlm synth` - options, the shapes' usage text, then coord_synth
 * with its layer counter on stderr. */
#include "cli.h"
#include "synth.h"
#include "synth_tok.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The usage text, with a line per shape of coord_synth_shapes(). */
static const char *usage(void)
{
    static char text[8192];
    if (text[0])
        return text;
    size_t n,
        len = (size_t)snprintf(
            text, sizeof(text),
            "usage: shardlm synth --shape NAME -o FILE.gguf [--seed S] [--tokenizer DIR]\n"
            "\n"
            "Writes a synthetic model (normal weights, std 0.02; norms 1.0) in GGUF F16 with a\n"
            "byte-level BPE vocabulary, or with --tokenizer the tokenizer of DIR/tokenizer.json\n"
            "and DIR/tokenizer_config.json (vocabulary, merges, special tokens, chat template),\n"
            "whose size replaces the shape's vocab. Shapes:\n");
    const struct coord_synth_shape *shapes = coord_synth_shapes(&n);
    for (size_t i = 0; i < n && len < sizeof(text); i++) {
        const struct coord_synth_shape *s = &shapes[i];
        len += (size_t)snprintf(text + len, sizeof(text) - len,
                                "  %-17s %s: hidden %u, %u layers, %u heads x %u, %u KV heads, "
                                "FFN %u %s, vocab %u%s\n",
                                s->name, s->arch, s->dim, s->layers, s->heads, s->head_dim,
                                s->kv_heads, s->ffn, s->gelu ? "GELU-tanh" : "SiLU", s->vocab,
                                s->head_gate ? ", per-head output gate" : "");
    }
    return text;
}

static bool known_shape(const char *name)
{
    size_t n;
    const struct coord_synth_shape *shapes = coord_synth_shapes(&n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(shapes[i].name, name) == 0)
            return true;
    return false;
}

/* The layer counter on stderr: "\rshardlm synth: layer l/n" after each layer on a terminal; in a
 * log (not a terminal) one line per layer every 5 s and the last one, as convert's. */
struct synth_progress {
    bool tty, started; /* started: a terminal's counter line needs its newline */
    uint64_t last_ns;  /* the last line in a log */
};

static void synth_progress(void *ctx, int done, int total)
{
    struct synth_progress *p = ctx;
    if (!done)
        return;
    if (p->tty) {
        p->started = true;
        fprintf(stderr, "\rshardlm synth: layer %d/%d", done, total);
        return;
    }
    uint64_t now = shardlm_now_ns();
    if (done < total && now - p->last_ns < 5000000000ull)
        return;
    p->last_ns = now;
    fprintf(stderr, "shardlm synth: layer %d/%d\n", done, total);
}

int coord_cmd_synth(int argc, char **argv)
{
    const char *shape = NULL, *out = NULL, *tokdir = NULL;
    uint64_t seed = 1;
    static const struct option opts[] = {{"shape", required_argument, 0, 's'},
                                         {"seed", required_argument, 0, 'S'},
                                         {"tokenizer", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    static const struct coord_cli_path paths[] = {{'o', "-o"}, {'t', "--tokenizer"}, {0, 0}};
    struct coord_cli_cmd cmd = {"synth", usage(), "o:h", opts, paths};
    int c, rc;
    while ((c = coord_cli_getopt(&cmd, argc, argv, &rc)) != -1) {
        switch (c) {
        case COORD_CLI_EXIT:
            return rc;
        case 's':
            shape = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 't':
            tokdir = optarg;
            break;
        case 'S': {
            char *end;
            seed = strtoull(optarg, &end, 10);
            if (end == optarg || *end) {
                fprintf(stderr, "shardlm synth: --seed '%s': expected an integer\n", optarg);
                return 2;
            }
            break;
        }
        }
    }
    if (!shape || !out || optind != argc)
        return coord_usage_error("synth", cmd.usage, "--shape and -o are required");
    if (!known_shape(shape))
        return coord_usage_error("synth", cmd.usage, "unknown shape '%s'", shape);
    char stale[4200]; /* an interrupted synth's temporary file (it dies of the signal) */
    int n_stale = coord_out_clean_stale(out, stale, sizeof(stale));
    if (n_stale)
        fprintf(stderr,
                "shardlm synth: removed %d temporary file%s of %s left by a stopped synth (%s%s)\n",
                n_stale, n_stale > 1 ? "s" : "", out, stale, n_stale > 1 ? ", ..." : "");
    struct shardlm_err e;
    struct coord_synth_tok tok;
    if (tokdir && coord_synth_tok_load(&tok, tokdir, &e)) {
        fprintf(stderr, "shardlm synth: %s\n", e.msg);
        return 1;
    }
    struct synth_progress prog = {.tty = isatty(2), .last_ns = shardlm_now_ns()};
    rc = coord_synth_with_tok(shape, out, seed, tokdir ? &tok : NULL, synth_progress, &prog, &e);
    if (tokdir)
        coord_synth_tok_free(&tok);
    if (prog.started)
        fprintf(stderr, "\n");
    if (rc) {
        fprintf(stderr, "shardlm synth: %s\n", e.msg);
        return 1;
    }
    return 0;
}
