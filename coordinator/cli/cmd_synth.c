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

/* The features line of an architecture shape (its HF class or "GGUF only", experts, window, caps,
 * multipliers, RoPE, gpt-oss's sinks and biases). */
static size_t features(const struct coord_synth_shape *s, char *out, size_t size)
{
    size_t len = (size_t)snprintf(out, size, "%20s%s", "", s->hf_class ? s->hf_class : "GGUF only");
#define ADD(...)                                                                                   \
    if (len < size)                                                                                \
    len += (size_t)snprintf(out + len, size - len, __VA_ARGS__)
    if (s->experts)
        ADD(", %u experts of %u units, %u per token%s", s->experts, s->expert_ffn, s->experts_used,
            s->mxfp4 ? " (MXFP4 values)" : "");
    if (s->shared)
        ADD(" and %u shared, %s routing x%g, %u dense first", s->shared,
            s->sigmoid ? "sigmoid" : "softmax", (double)s->route_scale, s->dense_first);
    if (s->kv_lora)
        ADD(", latent attention (q rank %u, latent %u, RoPE %u of %u, values %u)", s->q_lora,
            s->kv_lora, s->rope_dim, s->head_dim, s->v_dim);
    if (s->sink_mean != 0.0f)
        ADD(", attention sinks");
    if (s->bias_std > 0.0f)
        ADD(", q/k/v/O and expert biases");
    if (s->qk_norm)
        ADD(", q/k norms");
    if (s->fused)
        ADD(", fused qkv/gate_up");
    if (s->window)
        ADD(", window %u%s", s->window,
            s->window_pattern == 2   ? " (even layers)"
            : s->window_pattern == 6 ? " (5 local : 1 global)"
                                     : "");
    if (s->theta_local)
        ADD(", RoPE base %g/%g", s->theta_local, s->theta);
    if (s->attn_softcap)
        ADD(", soft-caps %g/%g", s->attn_softcap, s->final_softcap);
    if (s->logit_scale)
        ADD(", multipliers emb %g res %g attn %g logits /%g", s->emb_mult, s->res_mult,
            s->attn_mult, s->logit_scale);
    if (s->no_rope_every)
        ADD(", no RoPE every %uth layer", s->no_rope_every);
    if (s->rope == COORD_SYNTH_ROPE_LLAMA3)
        ADD(", llama3 RoPE x%g (low %g, high %g, orig %u)", s->rope_factor, s->rope_low,
            s->rope_high, s->rope_orig_ctx);
    if (s->rope == COORD_SYNTH_ROPE_LONGROPE)
        ADD(", LongRoPE (orig %u of %u)", s->rope_orig_ctx, s->ctx);
    if (s->rope == COORD_SYNTH_ROPE_YARN)
        ADD(", YaRN x%g (orig %u)", (double)s->ctx / s->rope_orig_ctx, s->rope_orig_ctx);
    ADD("%s\n", s->untied ? ", untied" : "");
#undef ADD
    return len;
}

/* The usage text, with a line per shape of coord_synth_shapes(). */
static const char *usage(void)
{
    static char text[8192];
    if (text[0])
        return text;
    size_t n,
        len = (size_t)snprintf(
            text, sizeof(text),
            "usage: shardlm synth --shape NAME (-o FILE.gguf | --hf DIR) [--type f16|f32]\n"
            "                     [--seed S] [--tokenizer DIR]\n"
            "\n"
            "Writes a synthetic model (seeded normal weights) in GGUF (F16 matrices, or F32 with\n"
            "--type f32) with a byte-level BPE vocabulary, or with --hf the same model as a\n"
            "Hugging Face folder (config.json, model.safetensors, tokenizer.json,\n"
            "tokenizer_config.json). --tokenizer gives it a real tokenizer instead: DIR's\n"
            "tokenizer.json and tokenizer_config.json (vocabulary, merges, special tokens, chat\n"
            "template), whose size replaces the shape's vocab. Shapes:\n");
    const struct coord_synth_shape *shapes = coord_synth_shapes(&n);
    for (size_t i = 0; i < n && len < sizeof(text); i++) {
        const struct coord_synth_shape *s = &shapes[i];
        len += (size_t)snprintf(text + len, sizeof(text) - len,
                                "  %-17s %s: hidden %u, %u layers, %u heads x %u, %u KV heads, "
                                "FFN %u %s, vocab %u%s\n",
                                s->name, s->arch, s->dim, s->layers, s->heads, s->head_dim,
                                s->kv_heads, s->ffn,
                                s->gelu                       ? "GELU-tanh"
                                : !strcmp(s->arch, "gpt-oss") ? "clamped SwiGLU"
                                                              : "SiLU",
                                s->vocab, s->head_gate ? ", per-head output gate" : "");
        if ((s->hf_type || s->rank) && len < sizeof(text))
            len += features(s, text + len, sizeof(text) - len);
    }
    return text;
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
    const char *shape = NULL, *out = NULL, *hf = NULL, *tokdir = NULL;
    bool f32 = false;
    uint64_t seed = 1;
    static const struct option opts[] = {{"shape", required_argument, 0, 's'},
                                         {"hf", required_argument, 0, 'H'},
                                         {"type", required_argument, 0, 't'},
                                         {"seed", required_argument, 0, 'S'},
                                         {"tokenizer", required_argument, 0, 'T'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    static const struct coord_cli_path paths[] = {
        {'o', "-o"}, {'H', "--hf"}, {'T', "--tokenizer"}, {0, 0}};
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
        case 'H':
            hf = optarg;
            break;
        case 'T':
            tokdir = optarg;
            break;
        case 't':
            if (strcmp(optarg, "f16") && strcmp(optarg, "f32"))
                return coord_usage_error("synth", cmd.usage, "--type '%s': expected f16 or f32",
                                         optarg);
            f32 = strcmp(optarg, "f32") == 0;
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
    if (!shape || !(out || hf) || optind != argc)
        return coord_usage_error("synth", cmd.usage, "--shape and -o are required");
    if (out && hf)
        return coord_usage_error("synth", cmd.usage, "-o and --hf exclude each other");
    const struct coord_synth_shape *s = coord_synth_shape(shape);
    if (!s)
        return coord_usage_error("synth", cmd.usage, "unknown shape '%s'", shape);
    if (hf && !s->hf_type)
        return coord_usage_error("synth", cmd.usage, "shape '%s' has no Hugging Face form (--hf)",
                                 shape);
    if (hf)
        out = hf;
    char stale[4200]; /* an interrupted synth's temporary file (it dies of the signal) */
    int n_stale = hf ? 0 : coord_out_clean_stale(out, stale, sizeof(stale));
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
    struct coord_synth_opts o = {.shape = shape,
                                 .out = out,
                                 .hf = hf != NULL,
                                 .f32 = f32,
                                 .seed = seed,
                                 .progress = synth_progress,
                                 .progress_ctx = &prog,
                                 .tok = tokdir ? &tok : NULL};
    rc = coord_synth_write(&o, &e);
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
