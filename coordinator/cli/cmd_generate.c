/* coordinator/cli/cmd_generate.c: `shardlm generate` - options, then coord_generate. */
#include "cli.h"
#include "generate.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

int coord_cmd_generate(int argc, char **argv)
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
        int eo = coord_cli_engine_option(c, &o.engine, why, sizeof(why));
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
                return coord_usage_error("generate", usage_generate,
                                         "-n '%s': expected a count 0..16777216", optarg);
            o.n = (int)v;
            break;
        case 'T':
            if (!coord_cli_parse_float(optarg, 0.0f, 100.0f, &o.temp))
                return coord_usage_error("generate", usage_generate, "--temp '%s': expected 0..100",
                                         optarg);
            break;
        case 'P':
            if (!coord_cli_parse_float(optarg, 1e-6f, 1.0f, &o.top_p))
                return coord_usage_error("generate", usage_generate,
                                         "--top-p '%s': expected (0, 1]", optarg);
            break;
        case 'S': {
            char *end;
            errno = 0;
            o.seed = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end)
                return coord_usage_error("generate", usage_generate,
                                         "--seed '%s': expected an integer", optarg);
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
        return coord_cli_extra_argument("generate", usage_generate, argv);
    if (!o.engine.model_path || !o.prompt)
        return coord_usage_error("generate", usage_generate, "-m and -p are required");
    if (!seeded)
        o.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    coord_signals_install();
    struct shardlm_err e = {{0}};
    int rc = coord_cli_engine_env(&o.engine, &e);
    return coord_cli_exit("generate", rc ? rc : coord_generate(&o, &e), &e);
}
