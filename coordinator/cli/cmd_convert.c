/* coordinator/cli/cmd_convert.c: `shardlm convert` - options, the weight-path probe when no
 * --scheme is given, then coord_convert. */
#include "cli.h"
#include "convert.h"
#include "kn.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

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
    "  --group N       int4 group size, 32/64/128/256 (default: 64 for w4a16, 128 for w4a8)\n"
    "  --head-bits B   embedding and LM head of the int4 schemes: 8 = int8 per row (default),\n"
    "                  4 = the scheme's int4\n"
    "  --ctx N         cap the context length (it sizes the KV cache; default: the model's)\n"
    "  -o OUT          output file (written whole or not at all)\n"
    "  -q, --quiet     no progress on stderr\n";

int coord_cmd_convert(int argc, char **argv)
{
    struct coord_convert_opts o = {.head_bits = 8, .scheme = (enum shlm_scheme) - 1};
    static const struct option opts[] = {{"tokenizer", required_argument, 0, 't'},
                                         {"scheme", required_argument, 0, 's'},
                                         {"group", required_argument, 0, 'g'},
                                         {"head-bits", required_argument, 0, 'b'},
                                         {"ctx", required_argument, 0, 'x'},
                                         {"priority", required_argument, 0, 'P'},
                                         {"quiet", no_argument, 0, 'q'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    long v;
    bool fidelity = false;
    while ((c = getopt_long(argc, argv, "o:qh", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            o.tokenizer = optarg;
            break;
        case 'P':
            if (strcmp(optarg, "speed") && strcmp(optarg, "fidelity"))
                return coord_usage_error("convert", usage_convert,
                                         "--priority '%s': expected speed or fidelity", optarg);
            fidelity = strcmp(optarg, "fidelity") == 0;
            break;
        case 's':
            if (shlm_scheme_parse(optarg, &o.scheme))
                return coord_usage_error("convert", usage_convert,
                                         "unknown scheme '%s' (expected f32, bf16, w4a16 or w4a8)",
                                         optarg);
            break;
        case 'g':
            if (!coord_parse_long(optarg, 32, KN_MAX_GROUP, &v) || v % 32)
                return coord_usage_error("convert", usage_convert,
                                         "--group '%s': expected 32, 64, 128 or 256", optarg);
            o.group = (int)v;
            break;
        case 'b':
            if (!coord_parse_long(optarg, 4, 8, &v) || (v != 4 && v != 8))
                return coord_usage_error("convert", usage_convert,
                                         "--head-bits '%s': expected 8 or 4", optarg);
            o.head_bits = (int)v;
            break;
        case 'x':
            if (!coord_parse_long(optarg, 1, 1 << 20, &v))
                return coord_usage_error("convert", usage_convert,
                                         "--ctx '%s': expected 1..1048576", optarg);
            o.max_ctx = (uint32_t)v;
            break;
        case 'o':
            o.out = optarg;
            break;
        case 'q':
            o.quiet = true;
            break;
        case 'h':
            fputs(usage_convert, stdout);
            return 0;
        default:
            fputs(usage_convert, stderr);
            return 2;
        }
    }
    if (optind != argc - 1)
        return coord_usage_error("convert", usage_convert, "expected one INPUT");
    o.checkpoint = argv[optind];
    if (!o.out)
        return coord_usage_error("convert", usage_convert, "-o is required");
    if ((int)o.scheme < 0) { /* the weight path probe */
        struct kn_cpu cpu;
        char feat[128];
        kn_cpu_probe(&cpu);
        kn_cpu_describe(&cpu, feat, sizeof(feat));
        o.scheme = cpu.amx && !fidelity ? SHLM_SCHEME_W4A8 : SHLM_SCHEME_W4A16;
        fprintf(stderr, "shardlm convert: scheme %s (%s; cpu: %s; --scheme overrides)\n",
                shlm_scheme_name(o.scheme),
                fidelity  ? "--priority fidelity"
                : cpu.amx ? "AMX: int8 tiles"
                          : "no AMX",
                feat);
    }
    if (o.group && o.scheme != SHLM_SCHEME_W4A16 && o.scheme != SHLM_SCHEME_W4A8)
        return coord_usage_error("convert", usage_convert,
                                 "--group applies to w4a16 and w4a8 only");
    struct shardlm_err e = {{0}};
    return coord_cli_exit("convert", coord_convert(&o, &e), &e);
}
