/* coordinator/cli/cmd_convert.c: `shardlm convert` - options, the weight-path probe when no
 * --scheme is given, then coord_convert with its progress on stderr. */
#include "cli.h"
#include "convert.h"
#include "kn.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char usage_convert[] =
    "usage: shardlm convert INPUT [--tokenizer TOKENIZER.bin] [--scheme f32|bf16|w4a16|w4a8]\n"
    "                       [--priority speed|fidelity] [--group N] [--head-bits 8|4]\n"
    "                       [--ctx N] -o OUT.shlm\n"
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
    "                  4 = the scheme's int4\n"
    "  --ctx N         cap the context length (it sizes the KV cache; default: the model's)\n"
    "  -o OUT          output file (written whole or not at all)\n"
    "  -q, --quiet     no progress on stderr\n";

/* Progress on stderr: a counter on a terminal; in a log a line every 5 s of a long conversion. */
struct convert_progress {
    bool tty;
    uint64_t t0, last_ns; /* when the tensors started; the last line */
};

static void convert_progress(void *ctx, int done, int total)
{
    struct convert_progress *p = ctx;
    if (done == 0) {
        p->t0 = p->last_ns = shardlm_now_ns();
    } else if (p->tty) {
        fprintf(stderr, "\rshardlm convert: %d/%d tensors", done, total);
    } else if (shardlm_now_ns() - p->last_ns > 5000000000ull) {
        p->last_ns = shardlm_now_ns();
        fprintf(stderr, "shardlm convert: %d/%d tensors, %.0f s\n", done, total,
                (double)(p->last_ns - p->t0) / 1e9);
    }
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
    char g[32] = "";
    if (info->group)
        snprintf(g, sizeof(g), " group %d head int%d", info->group, o->head_bits);
    fprintf(stderr, "%sshardlm convert: wrote %s: %s%s, %d tensors, %llu bytes, %.1f s\n",
            p->tty ? "\r" : "", o->out, shlm_scheme_name(o->scheme), g, info->n_tensors,
            (unsigned long long)info->file_bytes, (double)(shardlm_now_ns() - p->t0) / 1e9);
}

/* What `shardlm convert`'s command line asks for: coord_convert's options and the CLI's own. */
struct convert_args {
    struct coord_convert_opts o;
    bool fidelity, quiet;
};

/* Option @c of getopt_long (its value in optarg) into @a. Returns -1 to go on, else the exit
 * code: 0 after --help, 2 after a bad value or an unknown option (with the usage). */
static int convert_option(int c, struct convert_args *a)
{
    long v;
    switch (c) {
    case 't':
        a->o.tokenizer = optarg;
        return -1;
    case 'P':
        if (strcmp(optarg, "speed") && strcmp(optarg, "fidelity"))
            return coord_usage_error("convert", usage_convert,
                                     "--priority '%s': expected speed or fidelity", optarg);
        a->fidelity = strcmp(optarg, "fidelity") == 0;
        return -1;
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
        if (!coord_parse_long(optarg, 4, 8, &v) || (v != 4 && v != 8))
            return coord_usage_error("convert", usage_convert, "--head-bits '%s': expected 8 or 4",
                                     optarg);
        a->o.head_bits = (int)v;
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
    case 'q':
        a->quiet = true;
        return -1;
    case 'h':
        fputs(usage_convert, stdout);
        return 0;
    default:
        fputs(usage_convert, stderr);
        return 2;
    }
}

/* @argv into @a, the scheme probed when none is given. Returns -1 when the conversion is to
 * run, else the exit code (as convert_option, or 2 for a missing or misplaced argument). */
static int convert_parse(int argc, char **argv, struct convert_args *a)
{
    static const struct option opts[] = {{"tokenizer", required_argument, 0, 't'},
                                         {"scheme", required_argument, 0, 's'},
                                         {"group", required_argument, 0, 'g'},
                                         {"head-bits", required_argument, 0, 'b'},
                                         {"ctx", required_argument, 0, 'x'},
                                         {"priority", required_argument, 0, 'P'},
                                         {"quiet", no_argument, 0, 'q'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c, rc;
    while ((c = getopt_long(argc, argv, "o:qh", opts, NULL)) != -1)
        if ((rc = convert_option(c, a)) >= 0)
            return rc;
    if (optind != argc - 1)
        return coord_usage_error("convert", usage_convert, "expected one INPUT");
    a->o.checkpoint = argv[optind];
    if (!a->o.out)
        return coord_usage_error("convert", usage_convert, "-o is required");
    if ((int)a->o.scheme < 0)
        a->o.scheme = probe_scheme(a->fidelity);
    if (a->o.group && a->o.scheme != SHLM_SCHEME_W4A16 && a->o.scheme != SHLM_SCHEME_W4A8)
        return coord_usage_error("convert", usage_convert,
                                 "--group applies to w4a16 and w4a8 only");
    return -1;
}

int coord_cmd_convert(int argc, char **argv)
{
    struct convert_args a = {.o = {.head_bits = 8, .scheme = (enum shlm_scheme) - 1}};
    int rc = convert_parse(argc, argv, &a);
    if (rc >= 0)
        return rc;
    struct convert_progress prog = {.tty = isatty(2)};
    if (!a.quiet) {
        a.o.progress = convert_progress;
        a.o.progress_ctx = &prog;
    }
    struct coord_convert_info info;
    struct shardlm_err e = {{0}};
    rc = coord_convert(&a.o, &info, &e);
    if (!rc && !a.quiet)
        print_written(&a.o, &info, &prog);
    return coord_cli_exit("convert", rc, &e);
}
