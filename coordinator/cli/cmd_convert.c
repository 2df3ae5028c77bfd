/* SPDX-License-Identifier: MIT */
/* coordinator/cli/cmd_convert.c: `shardlm convert` - options, the weight-path probe when no
 * --scheme is given, then coord_convert with its progress on stderr. */
#include "calib.h"
#include "cli.h"
#include "convert.h"
#include "kn.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage_convert[] =
    "usage: shardlm convert INPUT [--tokenizer TOKENIZER.bin] [--scheme f32|bf16|w4a16|w4a8]\n"
    "                       [--priority speed|fidelity] [--group N] [--head-bits 8|6|4]\n"
    "                       [--ctx N] [--method rtn|imatrix|gptq|awq|auto] [--calib FILE|self]\n"
    "                       [--calib-tokens N] [--damp F] [--no-act-order] [--threads N]\n"
    "                       [-q] -o OUT.shlm\n"
    "\n"
    "Reads a model and writes a .shlm file. INPUT is a GGUF file (llama, qwen2, gemma; tensors\n"
    "F32/F16/BF16/Q8_0/Q4_0, dequantized then quantized to the scheme), a Hugging Face\n"
    "directory (config.json, *.safetensors, tokenizer.json) or a llama2.c checkpoint (shared or\n"
    "separate classifier; it needs --tokenizer, the others carry their own).\n"
    "  --scheme S      f32 and bf16: every tensor in that type. w4a16: asymmetric int4 with a\n"
    "                  scale and zero point per group, f32 activations. w4a8: symmetric int4\n"
    "                  (zero point 8) with a searched per-group scale, int8 per-token "
    "activations.\n"
    "                  Without --scheme a CPU probe picks the weight path and says so: w4a8 where\n"
    "                  the CPU has AMX (int8 tiles), else w4a16.\n"
    "  --priority P    with no --scheme: speed (default) follows the probe; fidelity always\n"
    "                  picks w4a16 (lower KL divergence, f32 activations)\n"
    "  --group N       int4 group size, a multiple of 32 from 32 to 256 (default: 64 for w4a16,\n"
    "                  128 for w4a8)\n"
    "  --head-bits B   embedding and LM head of the int4 schemes: 8 = int8 per row (default),\n"
    "                  6 = 6-bit per group of 32 (6.5 bits a weight: the head's bytes 19%\n"
    "                  fewer than int8's), 4 = the scheme's int4\n"
    "  --ctx N         cap the context length (it sizes the KV cache; default: the model's)\n"
    "  --method M      how int4 matrices are rounded (the file's layout is the same for all):\n"
    "                  rtn: each group's scale searched, round to nearest (default without\n"
    "                  --calib); imatrix: the search weighs each input channel by its mean\n"
    "                  square on calibration text; gptq: group scales first, then GPTQ's error\n"
    "                  feedback over the columns (default with --calib); awq: input channels\n"
    "                  scaled by activation, folded into the norm before, then imatrix;\n"
    "                  auto: the last eighth of the calibration tokens (at least 16) is held\n"
    "                  out of the statistics, every method above is fitted on the rest and run\n"
    "                  on it, and the one with the lowest mean KL divergence from the f32\n"
    "                  model there is written (rtn unless another is strictly lower); one line\n"
    "                  says which: 'shardlm convert: method auto chose M (held-out kld: rtn K\n"
    "                  imatrix K gptq K awq K; H held-out tokens)', K '-' for a method that\n"
    "                  could not be fitted; where the f32 logits of H tokens pass 512 MiB\n"
    "                  (H x vocabulary x 4 bytes) the first that fit are scored, and the line\n"
    "                  says so ('; H held-out tokens, the first S scored (512 MiB of f32\n"
    "                  logits)')\n"
    "                  A mixture of experts' experts are rounded to nearest whatever the\n"
    "                  method (calibration does not see them): the last line says\n"
    "                  '(experts: rtn)'\n"
    "  --calib SRC     calibration text for imatrix/gptq/awq/auto: a UTF-8 text file (at most\n"
    "                  64 MiB), or self: the model writes its own from BOS at temperature 1\n"
    "                  (the default for those methods); refused with rtn, f32 and bf16\n"
    "  --calib-tokens N  calibration tokens (default 4096), in sequences of up to 512\n"
    "  --damp F        GPTQ: add F times the mean diagonal to the Hessian (default: its columns\n"
    "                  / the calibration tokens, from 0.01 to 1; grows ten-fold, three times at\n"
    "                  most, while the Hessian is singular)\n"
    "  --no-act-order  GPTQ: round the columns in order, not by decreasing activation\n"
    "  --threads N     quantizer and calibration threads (default: the online CPUs)\n"
    "  -o OUT          output file (written whole or not at all)\n"
    "  -q, --quiet     no progress on stderr\n";

/* Progress on stderr: a counter on a terminal; in a log a line every 5 s of a long conversion.
 * The tensor lines say the output's MB/s so far and the time left at that rate. */
struct convert_progress {
    bool tty;
    uint64_t start;       /* when the conversion started */
    uint64_t t0, last_ns; /* when the tensors started; the last line */
    const struct coord_convert_info *info;
};

static bool progress_due(struct convert_progress *p, bool last)
{
    uint64_t now = shardlm_now_ns();
    if (!last && !p->tty && now - p->last_ns < 5000000000ull)
        return false;
    if (!last && p->tty && now - p->last_ns < 200000000ull)
        return false;
    p->last_ns = now;
    return true;
}

static void convert_progress(void *ctx, int done, int total)
{
    struct convert_progress *p = ctx;
    if (done == 0) {
        p->t0 = p->last_ns = shardlm_now_ns();
        return;
    }
    if (!progress_due(p, false))
        return;
    double s = (double)(p->last_ns - p->t0) / 1e9, mb = (double)p->info->bytes_written / 1e6;
    double rate = s > 0 ? mb / s : 0, left = (double)p->info->file_bytes / 1e6 - mb;
    fprintf(stderr, "%sshardlm convert: tensor %d of %d, %.1f MB/s, %.0f s, %.0f s left%s",
            p->tty ? "\r" : "", done, total, rate, s, rate > 0 ? left / rate : 0.0,
            p->tty ? "\033[K" : "\n");
}

/* The calibration's stages: generated tokens, then the statistics passes. */
static void convert_stage(void *ctx, const char *stage, long done, long total)
{
    struct convert_progress *p = ctx;
    if (!progress_due(p, done == total))
        return;
    fprintf(stderr, "%sshardlm convert: calibration %s %ld/%ld%s", p->tty ? "\r" : "", stage, done,
            total, p->tty ? "\033[K" : "\n");
}

/* The weight path when no --scheme is given, said on stderr: w4a8 where the CPU has AMX (unless
 * @fidelity), else w4a16. */
static enum shlm_scheme probe_scheme(bool fidelity)
{
    struct kn_cpu cpu;
    char feat[128];
    kn_cpu_probe(&cpu);
    kn_cpu_describe(&cpu, feat, sizeof(feat));
    enum shlm_scheme s = cpu.amx && !fidelity ? SHLM_SCHEME_W4A8 : SHLM_SCHEME_W4A16;
    fprintf(stderr, "shardlm convert: scheme %s (%s; cpu: %s; --scheme overrides)\n",
            shlm_scheme_name(s),
            fidelity  ? "--priority fidelity"
            : cpu.amx ? "AMX: int8 tiles"
                      : "no AMX",
            feat);
    return s;
}

/* The last line: what was written, and how long the tensors took (after a counter, over it). */
static void print_written(const struct coord_convert_opts *o, const struct coord_convert_info *info,
                          const struct convert_progress *p)
{
    char g[64] = "";
    if (info->group)
        snprintf(g, sizeof(g), " group %d head int%d", info->group, o->head_bits);
    if (info->method != COORD_QUANT_RTN)
        snprintf(g + strlen(g), sizeof(g) - strlen(g), " %s%s",
                 coord_quant_method_name(info->method), info->experts_rtn ? " (experts: rtn)" : "");
    fprintf(stderr, "%sshardlm convert: wrote %s: %s%s, %d tensors, %llu bytes, %.1f s\n",
            p->tty ? "\r\033[K" : "", o->out, shlm_scheme_name(o->scheme), g, info->n_tensors,
            (unsigned long long)info->file_bytes, (double)(shardlm_now_ns() - p->start) / 1e9);
}

/* --method auto's choice, one line (a contract: README): the chosen method, then every
 * candidate's mean KLD on the held-out slice in the method table's order ('-' where it could not
 * be fitted), then the slice's size. A second line says the time it took against each method's
 * own fit (not with -q). */
static void print_auto(const struct coord_auto_report *r, const struct convert_progress *p,
                       bool quiet)
{
    char klds[256] = "", times[256] = "";
    for (int m = 0; m < COORD_QUANT_AUTO; m++) {
        const char *name = coord_quant_method_name((enum coord_quant_method)m);
        size_t n = strlen(klds), t = strlen(times);
        if (isnan(r->kld[m]))
            snprintf(klds + n, sizeof(klds) - n, "%s%s -", m ? " " : "", name);
        else
            snprintf(klds + n, sizeof(klds) - n, "%s%s %.6g", m ? " " : "", name, r->kld[m]);
        snprintf(times + t, sizeof(times) - t, ", %s %.2f s", name, r->seconds[m]);
    }
    char scored[128] = "";
    if (r->heldout_scored < r->heldout_tokens) /* past the bound on their f32 logits (auto.c) */
        snprintf(scored, sizeof(scored), ", the first %ld scored (%zu MiB of f32 logits)",
                 r->heldout_scored, r->heldout_bound >> 20);
    fprintf(stderr,
            "%sshardlm convert: method auto chose %s (held-out kld: %s; %ld held-out tokens%s)\n",
            p->tty ? "\r\033[K" : "", coord_quant_method_name(r->chosen), klds, r->heldout_tokens,
            scored);
    if (!quiet)
        fprintf(stderr, "shardlm convert: method auto: f32 reference %.2f s%s\n", r->ref_seconds,
                times);
}

/* What `shardlm convert`'s command line asks for: coord_convert's options and the CLI's own. */
struct convert_args {
    struct coord_convert_opts o;
    bool fidelity, quiet, method_set;
    bool head_bits_set, priority_set; /* given on the command line: checked against the scheme */
};

/* Option @c of coord_cli_getopt (its value in optarg) into @a. Returns -1 to go on, else the
 * exit code: 2 after a bad value (with the usage). */
static int convert_option(int c, struct convert_args *a)
{
    long v;
    switch (c) {
    case 't':
        a->o.tokenizer = optarg;
        return -1;
    case 'P': {
        static const struct coord_cli_word priorities[] = {
            {"speed", 0}, {"fidelity", 1}, {NULL, 0}};
        int fidelity = coord_cli_word(priorities, optarg);
        if (fidelity < 0)
            return coord_usage_error("convert", usage_convert,
                                     "--priority '%s': expected speed or fidelity", optarg);
        a->fidelity = fidelity;
        a->priority_set = true;
        return -1;
    }
    case 's':
        if (shlm_scheme_parse(optarg, &a->o.scheme))
            return coord_usage_error("convert", usage_convert,
                                     "unknown scheme '%s' (expected f32, bf16, w4a16 or w4a8)",
                                     optarg);
        return -1;
    case 'g': /* as the .shlm format (shlm_expected_tensors); the kernels take any even group */
        if (!coord_parse_long(optarg, 32, KN_MAX_GROUP, &v) || v % 32)
            return coord_usage_error("convert", usage_convert,
                                     "--group '%s': expected a multiple of 32 from 32 to %d",
                                     optarg, KN_MAX_GROUP);
        a->o.group = (int)v;
        return -1;
    case 'b':
        if (!coord_parse_long(optarg, 4, 8, &v) || (v != 4 && v != 6 && v != 8))
            return coord_usage_error("convert", usage_convert,
                                     "--head-bits '%s': expected 8, 6 or 4", optarg);
        a->o.head_bits = (int)v;
        a->head_bits_set = true;
        return -1;
    case 'x':
        if (!coord_parse_long(optarg, 1, 1 << 20, &v))
            return coord_usage_error("convert", usage_convert, "--ctx '%s': expected 1..1048576",
                                     optarg);
        a->o.max_ctx = (uint32_t)v;
        return -1;
    case 'o':
        a->o.out = optarg;
        return -1;
    case 'M':
        if (coord_quant_method_parse(optarg, &a->o.method))
            return coord_usage_error("convert", usage_convert,
                                     "--method '%s': expected rtn, imatrix, gptq, awq or auto",
                                     optarg);
        a->method_set = true;
        return -1;
    case 'C':
        a->o.calib = optarg;
        return -1;
    case 'T':
        if (!coord_parse_long(optarg, 16, COORD_CALIB_MAX_TOKENS, &v))
            return coord_usage_error("convert", usage_convert,
                                     "--calib-tokens '%s': expected 16..%d", optarg,
                                     COORD_CALIB_MAX_TOKENS);
        a->o.calib_tokens = (int)v;
        return -1;
    case 'D': {
        double d;
        if (!coord_cli_parse_double(optarg, 0.0, 1.0, &d) || d <= 0.0)
            return coord_usage_error("convert", usage_convert,
                                     "--damp '%s': expected a number above 0, at most 1", optarg);
        a->o.damp = (float)d;
        return -1;
    }
    case 'A':
        a->o.no_act_order = true;
        return -1;
    case 'j':
        if (!coord_parse_long(optarg, 1, 1024, &v))
            return coord_usage_error("convert", usage_convert, "--threads '%s': expected 1..1024",
                                     optarg);
        a->o.threads = (int)v;
        return -1;
    case 'q':
        a->quiet = true;
        return -1;
    }
    return -1;
}

/* @argv into @a, the scheme probed when none is given. Returns -1 when the conversion is to
 * run, else the exit code (0 after --help, 2 after a bad value or a missing or misplaced
 * argument). */
static int convert_parse(int argc, char **argv, struct convert_args *a)
{
    static const struct option opts[] = {{"tokenizer", required_argument, 0, 't'},
                                         {"scheme", required_argument, 0, 's'},
                                         {"group", required_argument, 0, 'g'},
                                         {"head-bits", required_argument, 0, 'b'},
                                         {"ctx", required_argument, 0, 'x'},
                                         {"priority", required_argument, 0, 'P'},
                                         {"method", required_argument, 0, 'M'},
                                         {"calib", required_argument, 0, 'C'},
                                         {"calib-tokens", required_argument, 0, 'T'},
                                         {"damp", required_argument, 0, 'D'},
                                         {"no-act-order", no_argument, 0, 'A'},
                                         {"threads", required_argument, 0, 'j'},
                                         {"quiet", no_argument, 0, 'q'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    static const struct coord_cli_path paths[] = {
        {'t', "--tokenizer"}, {'C', "--calib"}, {'o', "-o"}, {0, 0}};
    static const struct coord_cli_cmd cmd = {"convert", usage_convert, "o:qh", opts, paths};
    int c, rc;
    while ((c = coord_cli_getopt(&cmd, argc, argv, &rc)) != -1)
        if (c == COORD_CLI_EXIT || (rc = convert_option(c, a)) >= 0)
            return rc;
    if (optind != argc - 1)
        return coord_usage_error("convert", usage_convert, "expected one INPUT");
    a->o.checkpoint = argv[optind];
    if (!*a->o.checkpoint)
        return coord_cli_empty_path("convert", usage_convert, "INPUT");
    if (!a->o.out)
        return coord_usage_error("convert", usage_convert, "-o is required");
    if ((int)a->o.scheme >= 0 && a->priority_set)
        return coord_usage_error(
            "convert", usage_convert,
            "--priority chooses a scheme when --scheme is not given: not both");
    if ((int)a->o.scheme < 0)
        a->o.scheme = probe_scheme(a->fidelity);
    /* the options of the int4 schemes are refused with another, never ignored (--method and
     * --calib by coord_convert's check) */
    bool w4 = a->o.scheme == SHLM_SCHEME_W4A16 || a->o.scheme == SHLM_SCHEME_W4A8;
    if (a->o.group && !w4)
        return coord_usage_error("convert", usage_convert,
                                 "--group applies to w4a16 and w4a8 only");
    if (a->head_bits_set && !w4)
        return coord_usage_error("convert", usage_convert,
                                 "--head-bits applies to w4a16 and w4a8 only (%s stores the "
                                 "embedding and the LM head in %s)",
                                 shlm_scheme_name(a->o.scheme), shlm_scheme_name(a->o.scheme));
    /* a calibration text without a method: the best measured (docs/fidelity.md) */
    if (a->o.calib && !a->method_set && w4)
        a->o.method = COORD_QUANT_GPTQ;
    if ((a->o.damp > 0.0f || a->o.no_act_order) && a->o.method != COORD_QUANT_GPTQ)
        return coord_usage_error("convert", usage_convert,
                                 "--damp and --no-act-order apply to --method gptq only");
    if (a->o.calib_tokens && a->o.method == COORD_QUANT_RTN)
        return coord_usage_error("convert", usage_convert,
                                 "--calib-tokens applies to a calibrated --method only");
    return -1;
}

int coord_cmd_convert(int argc, char **argv)
{
    struct convert_args a = {.o = {.head_bits = 8, .scheme = (enum shlm_scheme) - 1}};
    int rc = convert_parse(argc, argv, &a);
    if (rc >= 0)
        return rc;
    struct coord_convert_info info;
    struct convert_progress prog = {.tty = isatty(2), .info = &info};
    /* SIGINT/SIGTERM stop it through the cancel flag: the temporary file goes, exit 130/143 */
    coord_signals_install();
    a.o.cancel = &coord_stop_signal;
    char stale[4200];
    int n_stale = coord_out_clean_stale(a.o.out, stale, sizeof(stale));
    if (n_stale)
        fprintf(stderr,
                "shardlm convert: removed %d temporary file%s of %s left by a stopped convert "
                "(%s%s)\n",
                n_stale, n_stale > 1 ? "s" : "", a.o.out, stale, n_stale > 1 ? ", ..." : "");
    if (!a.quiet) {
        a.o.progress = convert_progress;
        a.o.stage = convert_stage;
        a.o.progress_ctx = &prog;
        prog.start = prog.t0 = prog.last_ns = shardlm_now_ns();
        bool w4 = a.o.scheme == SHLM_SCHEME_W4A16 || a.o.scheme == SHLM_SCHEME_W4A8;
        if (a.o.method != COORD_QUANT_RTN && w4) /* else refused by coord_convert */
            fprintf(stderr, "shardlm convert: %s, calibrating on %s\n",
                    coord_quant_method_name(a.o.method),
                    a.o.calib && strcmp(a.o.calib, "self") ? a.o.calib
                                                           : "the model's own text (--calib self)");
    }
    struct shardlm_err e = {{0}};
    rc = coord_convert(&a.o, &info, &e);
    if (!rc && a.o.method == COORD_QUANT_AUTO) /* the choice, even with -q */
        print_auto(&info.auto_report, &prog, a.quiet);
    if (!rc && !a.quiet)
        print_written(&a.o, &info, &prog);
    return coord_cli_exit("convert", rc, &e);
}
