/* shardlm: the command line. Each command parses its options, runs, and prints one line
 * "shardlm <command>: <what went wrong>" on failure. Exit codes: 0 ok, 1 failure, 2 bad usage,
 * 128 + signal when interrupted (130 for SIGINT, 143 for SIGTERM). */
#include "bench.h"
#include "convert.h"
#include "engine.h"
#include "generate.h"
#include "shmcli.h"
#include "inspect.h"
#include "synth.h"
#include "tokcli.h"

#include <errno.h>
#include <limits.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char usage_main[] =
    "usage: shardlm <command> [options]\n"
    "\n"
    "shardlm serves decoder-only language models on CPU servers from 4-bit weights: a\n"
    "coordinator process and worker processes that share the weights in shared memory.\n"
    "\n"
    "commands:\n"
    "  convert   INPUT [--scheme S] -o OUT.shlm a GGUF file, Hugging Face directory or llama2.c\n"
    "            checkpoint (+ --tokenizer) into a .shlm model file\n"
    "  synth     --shape NAME -o FILE.gguf      a synthetic model for benchmarks\n"
    "  inspect   FILE                           config, tokenizer and tensors of a model file\n"
    "  tokenize  --tokenizer FILE TEXT          token ids of TEXT (--decode ID... for text)\n"
    "  generate  -m MODEL.shlm -p PROMPT -n N    generate text (streamed to stdout)\n"
    "  load      -m MODEL.shlm [--stats]         build (or find) the weights segments and stop:\n"
    "            the next generate starts warm\n"
    "  shm       list | purge | verify          the segments in the runtime directory\n"
    "  keygen    -o DIR                         CURVE keys for --listen off loopback\n"
    "  eval      -m MODEL.shlm --ref DIR         KL divergence, top-1 and perplexity against\n"
    "            reference logits\n"
    "  bench     -m MODEL.shlm [-p 512] [-n 128] [-t 1,2]  prefill and decode speed, roofline\n"
    "  bench allreduce [--ranks 2,4] [--floats N]  latency of the shared-memory all-reduce\n"
    "  bench kernels [--isa NAME]  GEMV GB/s and GEMM GOP/s of each kernel, read bandwidth\n"
    "  bench tokenizer --tokenizer FILE [--mb N]  tokenizing speed (MB/s) on N MB of English\n"
    "\n"
    "`shardlm <command> --help` describes each command's options.\n"
    "\n"
    "environment: SHARDLM_ISA=ref|avx2|avx512|amx forces the workers' kernel table (one this CPU\n"
    "cannot run is an error); SHARDLM_RUNTIME_DIR holds segments and sockets (default\n"
    "/dev/shm/shardlm-<uid>); SHARDLM_WORKER is the worker binary (default: next to shardlm);\n"
    "SHARDLM_SHM_LIMIT=BYTES refuses segments past that size with ENOSPC (for tests).\n";

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

#define LAYOUT_HELP                                                                                \
    "  --workers N     tensor-parallel workers (default: one per NUMA node, all its CPUs;\n"      \
    "                  more workers than nodes split the nodes' CPUs)\n"                           \
    "  --threads T     threads per worker (default: one per CPU of the worker)\n"                  \
    "  --cpus LIST     each worker's CPUs, workers separated by ':' (e.g. 0-3:4-7); CPUs may be\n" \
    "                  shared between workers this way\n"

#define ACCESS_HELP                                                                                \
    "  --listen EP     where workers reach the coordinator: tcp (127.0.0.1, a free port) or\n"     \
    "                  tcp://HOST:PORT (default: a socket in the private runtime directory)\n"     \
    "  --keys DIR      CURVE keys of `shardlm keygen`: encrypt the connection and admit only\n"    \
    "                  workers holding DIR/worker.key (required for an address off loopback)\n"

#define LOAD_HELP                                                                                  \
    "  --no-persist    weights in memfds that go with the processes; by default each worker's\n"   \
    "                  weights stay in the runtime directory, so the next start on the same "      \
    "model\n"                                                                                      \
    "                  and layout maps them instead of reading the file (`shardlm shm purge`)\n"   \
    "  --verify        check such a segment's data against its checksums before using it (a\n"    \
    "                  warm start trusts its header alone; `shardlm shm verify` checks them all)\n" \
    "  --io MODE       how the file is read: auto (default: buffered when it is in the page "      \
    "cache,\n"                                                                                     \
    "                  else O_DIRECT), direct (buffered where the filesystem refuses O_DIRECT)\n"  \
    "                  or buffered\n"                                                              \
    "  --restarts N    a worker that dies is started again on its CPUs over the same segments "    \
    "and\n"                                                                                        \
    "                  the step re-run, up to N times per step (default 3; 0: fail at once)\n"     \
    "  --stats         load report on stderr: bytes read and GB/s, segments, peak anonymous\n"     \
    "                  memory per process, time to ready (and to the first token); last line\n"    \
    "                  load segments_bytes=<n> peak_anon_bytes=<n> seconds=<s>\n"

static const char usage_load[] =
    "usage: shardlm load -m MODEL.shlm [--workers N] [--threads T] [--cpus LIST] [--no-persist]\n"
    "                    [--verify] [--io MODE] [--stats] [--restarts N] [--listen EP]\n"
    "                    [--keys DIR] [--verbose]\n"
    "\n"
    "Loads the model as generate would - the weights segments of its workers, built from the file\n"
    "or found complete from an earlier run - starts the workers, and stops. Without --no-persist\n"
    "the segments stay, so a later generate with the same layout starts warm.\n" LAYOUT_HELP
        LOAD_HELP ACCESS_HELP "  --verbose       worker layout on stderr\n";

static const char usage_generate[] =
    "usage: shardlm generate -m MODEL.shlm -p PROMPT [-n N] [--temp T] [--top-p P] [--seed S]\n"
    "                        [--workers N] [--threads T] [--cpus LIST] [--no-persist] [--io MODE]\n"
    "                        [--verify] [--stats] [--restarts N] [--listen EP] [--keys DIR]\n"
    "                        [--verbose]\n"
    "\n"
    "Starts the coordinator and its worker, and prints the prompt and its continuation as it\n"
    "is generated, then a newline. Stops after N new tokens (default 256) or at BOS/EOS.\n"
    "  --temp T        sampling temperature, 0 = greedy (default 1.0)\n"
    "  --top-p P       nucleus sampling mass in (0, 1] (default 0.9)\n"
    "  --seed S        random seed (default: from the clock)\n" LAYOUT_HELP LOAD_HELP ACCESS_HELP
    "  --verbose       worker layout (`rank <r> node <n> cpus <list> pid <pid>`) and per-step\n"
    "                  timings (wall, all-reduce, per-rank compute) on stderr\n";

static const char usage_eval[] =
    "usage: shardlm eval -m MODEL.shlm --ref DIR [--save DIR [--overwrite]] [--workers N]\n"
    "                    [--threads T] [--cpus LIST] [--no-persist] [--io MODE] [--stats]\n"
    "                    [--verify] [--restarts N] [--listen EP] [--keys DIR] [--verbose]\n"
    "\n"
    "Feeds the token sequences of DIR/greedy.tsv (prompt, prompt ids, generated ids, text file,\n"
    "logits file) and compares the model's logits with the reference float32 logits: per prompt\n"
    "and overall, the mean KL divergence KL(ref || model), the top-1 agreement and the\n"
    "perplexity of the sequence. The last line reads\n"
    "  overall kld=<mean> top1=<fraction> ppl=<value>\n"
    "  --save DIR      also write this model's logits to DIR in the same format, to compare\n"
    "                  another model or layout against it (not the --ref folder; files there\n"
    "                  are never replaced unless --overwrite)\n" LAYOUT_HELP LOAD_HELP ACCESS_HELP;

static bool parse_float(const char *s, float lo, float hi, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* The options of every command that starts the engine: layout (--workers/--threads/--cpus),
 * load (--no-persist/--io/--stats), access (--listen/--keys), --restarts, -m and --verbose.
 * Returns 1 if @c was one of them, 0 if not, -1 on a bad value with @why naming the option and
 * what it takes. */
static int engine_option(int c, struct coord_engine_opts *o, char *why, size_t len)
{
    long v;
    const char *opt, *want; /* for a bad value */
    switch (c) {
    case 'W':
        if (!coord_parse_long(optarg, 1, 256, &v)) {
            opt = "--workers", want = "a count 1..256";
            goto bad;
        }
        o->layout.workers = (int)v;
        return 1;
    case 'H':
        if (!coord_parse_long(optarg, 1, 4096, &v)) {
            opt = "--threads", want = "a count 1..4096";
            goto bad;
        }
        o->layout.threads = (int)v;
        return 1;
    case 'C':
        o->layout.cpus = optarg;
        return 1;
    case 'N':
        o->load.no_persist = true;
        return 1;
    case 'I':
        if (coord_io_parse(optarg, &o->load.io)) {
            opt = "--io", want = "auto, direct or buffered";
            goto bad;
        }
        return 1;
    case 'Z':
        o->load.stats = true;
        return 1;
    case 'V':
        o->load.verify = true;
        return 1;
    case 'L':
        o->access.listen = optarg;
        return 1;
    case 'K':
        o->access.keys = optarg;
        return 1;
    case 'X': /* 0 asks for none: the engine's -1 (its 0 is the default) */
        if (!coord_parse_long(optarg, 0, 100, &v)) {
            opt = "--restarts", want = "a count 0..100";
            goto bad;
        }
        o->restarts = v ? (int)v : -1;
        return 1;
    case 'm':
        o->model_path = optarg;
        return 1;
    case 'v':
        o->verbose = true;
        return 1;
    }
    return 0;
bad:
    snprintf(why, len, "%s '%s': expected %s", opt, optarg, want);
    return -1;
}

/* The end of an engine command's options: none may be left but the ones it takes. */
static int extra_argument(const char *cmd, const char *usage, char **argv)
{
    return coord_usage_error(cmd, usage, "unexpected argument '%s' (a prompt with spaces needs "
                             "quotes)", argv[optind]);
}

#define ENGINE_OPTIONS                                                                             \
    {"model", required_argument, 0, 'm'}, {"verbose", no_argument, 0, 'v'},                        \
        {"workers", required_argument, 0, 'W'}, {"threads", required_argument, 0, 'H'},            \
        {"cpus", required_argument, 0, 'C'}, {"no-persist", no_argument, 0, 'N'},                  \
        {"io", required_argument, 0, 'I'}, {"stats", no_argument, 0, 'Z'},                         \
        {"verify", no_argument, 0, 'V'},                                                           \
        {"listen", required_argument, 0, 'L'}, {"keys", required_argument, 0, 'K'},                \
    {                                                                                              \
        "restarts", required_argument, 0, 'X'                                                      \
    }

static int exit_code(const char *cmd, int rc, const struct shardlm_err *e)
{
    if (rc == 0)
        return 0;
    if (rc == -EINTR && coord_stop_signal) {
        fprintf(stderr, "shardlm %s: stopped by signal %d\n", cmd, (int)coord_stop_signal);
        return 128 + (int)coord_stop_signal;
    }
    /* every failure says something, even one whose message nobody set */
    fprintf(stderr, "shardlm %s: %s\n", cmd, e->msg[0] ? e->msg : strerror(-rc));
    return 1;
}

static int cmd_convert(int argc, char **argv)
{
    struct coord_convert_opts o = {.head_bits = 8, .scheme = (enum shlm_scheme)-1};
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
                                 "unknown scheme '%s' (expected f32, bf16, w4a16 or w4a8)", optarg);
            break;
        case 'g':
            if (!coord_parse_long(optarg, 32, KN_MAX_GROUP, &v) || v % 32)
                return coord_usage_error("convert", usage_convert,
                                 "--group '%s': expected 32, 64, 128 or 256", optarg);
            o.group = (int)v;
            break;
        case 'b':
            if (!coord_parse_long(optarg, 4, 8, &v) || (v != 4 && v != 8))
                return coord_usage_error("convert", usage_convert, "--head-bits '%s': expected 8 or 4",
                                 optarg);
            o.head_bits = (int)v;
            break;
        case 'x':
            if (!coord_parse_long(optarg, 1, 1 << 20, &v))
                return coord_usage_error("convert", usage_convert, "--ctx '%s': expected 1..1048576",
                                 optarg);
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
        return coord_usage_error("convert", usage_convert, "expected one INPUT%s", "");
    o.checkpoint = argv[optind];
    if (!o.out)
        return coord_usage_error("convert", usage_convert, "-o is required%s", "");
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
        return coord_usage_error("convert", usage_convert, "--group applies to w4a16 and w4a8 only%s", "");
    struct shardlm_err e = {{0}};
    return exit_code("convert", coord_convert(&o, &e), &e);
}

static int cmd_generate(int argc, char **argv)
{
    struct coord_generate_opts o = {.n = 256, .temp = 1.0f, .top_p = 0.9f};
    bool seeded = false;
    static const struct option opts[] = {{"prompt", required_argument, 0, 'p'},
                                         {"temp", required_argument, 0, 'T'},
                                         {"top-p", required_argument, 0, 'P'},
                                         {"seed", required_argument, 0, 'S'},
                                         {"help", no_argument, 0, 'h'},
                                         ENGINE_OPTIONS,
                                         {0, 0, 0, 0}};
    int c;
    long v;
    while ((c = getopt_long(argc, argv, "m:p:n:vh", opts, NULL)) != -1) {
        char why[160];
        int eo = engine_option(c, &o.engine, why, sizeof(why));
        if (eo < 0)
            return coord_usage_error("generate", usage_generate, "%s", why);
        if (eo)
            continue;
        switch (c) {
        case 'p':
            o.prompt = optarg;
            break;
        case 'n':
            if (!coord_parse_long(optarg, 0, 1 << 24, &v))
                return coord_usage_error("generate", usage_generate, "-n '%s': expected a count 0..16777216",
                                 optarg);
            o.n = (int)v;
            break;
        case 'T':
            if (!parse_float(optarg, 0.0f, 100.0f, &o.temp))
                return coord_usage_error("generate", usage_generate, "--temp '%s': expected 0..100",
                                 optarg);
            break;
        case 'P':
            if (!parse_float(optarg, 1e-6f, 1.0f, &o.top_p))
                return coord_usage_error("generate", usage_generate, "--top-p '%s': expected (0, 1]",
                                 optarg);
            break;
        case 'S': {
            char *end;
            errno = 0;
            o.seed = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end)
                return coord_usage_error("generate", usage_generate, "--seed '%s': expected an integer",
                                 optarg);
            seeded = true;
            break;
        }
        case 'h':
            fputs(usage_generate, stdout);
            return 0;
        default:
            fputs(usage_generate, stderr);
            return 2;
        }
    }
    if (optind != argc)
        return extra_argument("generate", usage_generate, argv);
    if (!o.engine.model_path || !o.prompt)
        return coord_usage_error("generate", usage_generate, "-m and -p are required%s", "");
    if (!seeded)
        o.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    coord_signals_install();
    struct shardlm_err e = {{0}};
    return exit_code("generate", coord_generate(&o, &e), &e);
}

static int cmd_eval(int argc, char **argv)
{
    struct coord_eval_opts o = {0};
    static const struct option opts[] = {{"ref", required_argument, 0, 'r'},
                                         {"save", required_argument, 0, 's'},
                                         {"overwrite", no_argument, 0, 'O'},
                                         {"help", no_argument, 0, 'h'},
                                         ENGINE_OPTIONS,
                                         {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "m:vh", opts, NULL)) != -1) {
        char why[160];
        int eo = engine_option(c, &o.engine, why, sizeof(why));
        if (eo < 0)
            return coord_usage_error("eval", usage_eval, "%s", why);
        if (eo)
            continue;
        switch (c) {
        case 's':
            o.save_dir = optarg;
            break;
        case 'O':
            o.overwrite = true;
            break;
        case 'r':
            o.ref_dir = optarg;
            break;
        case 'h':
            fputs(usage_eval, stdout);
            return 0;
        default:
            fputs(usage_eval, stderr);
            return 2;
        }
    }
    if (optind != argc)
        return extra_argument("eval", usage_eval, argv);
    if (!o.engine.model_path || !o.ref_dir)
        return coord_usage_error("eval", usage_eval, "-m and --ref are required%s", "");
    coord_signals_install();
    struct shardlm_err e = {{0}};
    return exit_code("eval", coord_eval(&o, &e), &e);
}

static int cmd_load(int argc, char **argv)
{
    struct coord_engine_opts o = {0};
    static const struct option opts[] = {
        {"help", no_argument, 0, 'h'}, ENGINE_OPTIONS, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "m:vh", opts, NULL)) != -1) {
        char why[160];
        int eo = engine_option(c, &o, why, sizeof(why));
        if (eo < 0)
            return coord_usage_error("load", usage_load, "%s", why);
        if (eo)
            continue;
        if (c == 'h') {
            fputs(usage_load, stdout);
            return 0;
        }
        fputs(usage_load, stderr);
        return 2;
    }
    if (optind != argc)
        return extra_argument("load", usage_load, argv);
    if (!o.model_path)
        return coord_usage_error("load", usage_load, "-m is required%s", "");
    coord_signals_install();
    struct shardlm_err e = {{0}};
    struct coord_engine g;
    int rc = coord_engine_start(&g, &o, &e);
    if (rc)
        return exit_code("load", rc, &e);
    if (o.load.stats)
        coord_engine_print_stats(&g, 0, stderr);
    else
        fprintf(stderr, "shardlm: %d weights segment%s ready (%d built, %d found complete)%s%s\n",
                g.n_ranks, g.n_ranks > 1 ? "s" : "", g.stats.built, g.stats.reused,
                o.load.no_persist ? "" : " in ", o.load.no_persist ? "" : g.rundir);
    coord_engine_stop(&g);
    return 0;
}

/* The environment variables --help documents, checked before any command runs: one set wrong
 * (empty, or not a number) is an error, never silently the default. Returns 0 or exit code 2. */
static int check_environment(void)
{
    const char *rd = getenv("SHARDLM_RUNTIME_DIR"), *lim = getenv("SHARDLM_SHM_LIMIT");
    long v;
    if (rd && !*rd) {
        fprintf(stderr, "shardlm: SHARDLM_RUNTIME_DIR is set but empty: unset it for the default "
                "(/dev/shm/shardlm-<uid>) or name a folder\n");
        return 2;
    }
    if (lim && !coord_parse_long(lim, 1, LONG_MAX, &v)) {
        fprintf(stderr, "shardlm: SHARDLM_SHM_LIMIT='%s': expected a byte count >= 1\n", lim);
        return 2;
    }
    if (seg_set_rundir(rd)) {
        fprintf(stderr, "shardlm: SHARDLM_RUNTIME_DIR is longer than %d bytes\n", PATH_MAX - 1);
        return 2;
    }
    seg_set_limit(lim ? (uint64_t)v : 0);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_main, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage_main, stdout);
        return 0;
    }
    int env_rc = check_environment();
    if (env_rc)
        return env_rc;
    /* each command sees argv starting at its own name */
    if (strcmp(cmd, "convert") == 0)
        return cmd_convert(argc - 1, argv + 1);
    if (strcmp(cmd, "generate") == 0)
        return cmd_generate(argc - 1, argv + 1);
    if (strcmp(cmd, "eval") == 0)
        return cmd_eval(argc - 1, argv + 1);
    if (strcmp(cmd, "load") == 0)
        return cmd_load(argc - 1, argv + 1);
    if (strcmp(cmd, "keygen") == 0)
        return coord_cmd_keygen(argc - 1, argv + 1);
    if (strcmp(cmd, "shm") == 0)
        return coord_cmd_shm(argc - 1, argv + 1);
    if (strcmp(cmd, "synth") == 0)
        return coord_cmd_synth(argc - 1, argv + 1);
    if (strcmp(cmd, "inspect") == 0)
        return coord_cmd_inspect(argc - 1, argv + 1);
    if (strcmp(cmd, "tokenize") == 0)
        return coord_cmd_tokenize(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0)
        return coord_cmd_bench(argc - 1, argv + 1);
    fprintf(stderr, "shardlm: unknown command '%s'\n%s", cmd, usage_main);
    return 2;
}
