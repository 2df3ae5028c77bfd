/* SPDX-License-Identifier: MIT */
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
    "usage: shardlm generate -m MODEL.shlm (-p PROMPT ... | -f FILE) [-n N] [--json]\n"
    "                        [--temp T] [--top-p P] [--top-k K] [--min-p P] [--seed S]\n"
    "                        [--repeat-penalty R] [--frequency-penalty F] [--presence-penalty F]\n"
    "                        [--stop STR ...] [--json-schema FILE | --regex RE | --grammar FILE]\n"
    "                        [--max-seqs N] [--step-tokens N] [--kv-tokens N]\n"
    "                        [--kv-mem SIZE] [--no-prefix-cache] [--workers N] [--threads T]\n"
    "                        [--cpus LIST] [--no-persist] [--io MODE] [--verify] [--stats]\n"
    "                        [--restarts N] [--listen EP] [--keys DIR] [--verbose]\n"
    "\n"
    "Starts the coordinator and its workers and continues every prompt, all of them at once\n"
    "(batched steps over a shared KV cache). One prompt: prints it and its continuation as it\n"
    "is generated, then a newline. Several (-p more than once, or -f): each result in prompt\n"
    "order as soon as it is done, \"[i] \" before it (i from 1), or with --json one object per\n"
    "prompt and line: {\"prompt\", \"text\", \"finish_reason\", \"prompt_tokens\",\n"
    "\"completion_tokens\", \"cached_tokens\"}. Each stops after N new tokens (default 256), at\n"
    "BOS/EOS or at a stop string.\n"
    "  -p PROMPT       a prompt (repeat for more)\n"
    "  -f FILE         prompts, one per line (empty lines skipped)\n"
    "  -n N            new tokens per prompt (0: the prompt alone)\n"
    "  --json          one JSON object per prompt and line\n"
    "  --temp T        sampling temperature, 0 = greedy (default 1.0)\n"
    "  --top-p P       nucleus sampling mass in (0, 1] (default 0.9)\n"
    "  --top-k K       sample among the K most likely tokens only (default 0: all)\n"
    "  --min-p P       drop tokens less likely than P times the most likely (default 0)\n"
    "  --repeat-penalty R\n"
    "                  divide the logits of tokens already in the text by R (default 1: off)\n"
    "  --frequency-penalty F, --presence-penalty F\n"
    "                  subtract F per earlier occurrence of a generated token, or F once\n"
    "                  (OpenAI's; -2..2, default 0)\n"
    "  --stop STR      end a sequence before STR (repeat for up to 16)\n"
    "  --json-schema FILE\n"
    "                  every continuation is compact JSON valid against the JSON Schema in FILE\n"
    "                  (each token drawn from those the schema allows; the sequence ends where\n"
    "                  the JSON does); a schema that cannot be compiled is refused before the\n"
    "                  model starts, naming the keyword\n"
    "  --regex RE      every continuation matches the regular expression RE (ECMAScript syntax)\n"
    "  --grammar FILE  every continuation is a sentence of the GBNF grammar in FILE (llama.cpp's\n"
    "                  syntax, from the rule root)\n"
    "  --seed S        random seed (default: from the clock); prompt i draws from S + "
    "i\n" SCHED_HELP LAYOUT_HELP LOAD_HELP ACCESS_HELP
    "  --verbose       worker layout (`rank <r> node <n> cpus <list> pid <pid>`), the KV cache's\n"
    "                  blocks and per-step timings (wall, all-reduce, per-rank compute) on "
    "stderr\n";

#define GENERATE_MAX_PROMPTS 256 /* -p at most this often: more come with -f */

static const struct option generate_options[] = {{"prompt", required_argument, 0, 'p'},
                                                 {"file", required_argument, 0, 'f'},
                                                 {"json", no_argument, 0, 'J'},
                                                 {"temp", required_argument, 0, 'T'},
                                                 {"top-p", required_argument, 0, 'P'},
                                                 {"top-k", required_argument, 0, 1100},
                                                 {"min-p", required_argument, 0, 1101},
                                                 {"repeat-penalty", required_argument, 0, 1102},
                                                 {"frequency-penalty", required_argument, 0, 1103},
                                                 {"presence-penalty", required_argument, 0, 1104},
                                                 {"stop", required_argument, 0, 1105},
                                                 {"json-schema", required_argument, 0, 1106},
                                                 {"regex", required_argument, 0, 1107},
                                                 {"grammar", required_argument, 0, 1108},
                                                 {"seed", required_argument, 0, 'S'},
                                                 {"help", no_argument, 0, 'h'},
                                                 SCHED_OPTIONS,
                                                 ENGINE_OPTIONS,
                                                 {0, 0, 0, 0}};

static const struct coord_cli_path generate_paths[] = {
    {'f', "-f"}, {1106, "--json-schema"}, {1108, "--grammar"}, {0, 0}};

static const struct coord_cli_cmd generate_cmd = {"generate", usage_generate, "m:p:f:n:vh",
                                                  generate_options, generate_paths};

#define bad_usage(...) coord_usage_error("generate", usage_generate, __VA_ARGS__)

/* What the command line asks for: coord_generate's options, and whether --seed was given. */
struct generate_args {
    struct coord_generate_opts o;
    bool seeded;
};

/* The sampling options (@c of getopt_long, its value in optarg) into @sp. Returns -1 to go on,
 * 2 after a bad value, 0 if @c is none of them. */
static int sampling_option(int c, struct coord_sampling *sp)
{
    long v;
    switch (c) {
    case 'T':
        if (!coord_cli_parse_float(optarg, 0.0f, 100.0f, &sp->temp))
            return bad_usage("--temp '%s': expected 0..100", optarg);
        return -1;
    case 'P':
        if (!coord_cli_parse_float(optarg, 1e-6f, 1.0f, &sp->top_p))
            return bad_usage("--top-p '%s': expected (0, 1]", optarg);
        return -1;
    case 1100:
        if (!coord_parse_long(optarg, 0, 1 << 24, &v))
            return bad_usage("--top-k '%s': expected a count (0: off)", optarg);
        sp->top_k = (int)v;
        return -1;
    case 1101:
        if (!coord_cli_parse_float(optarg, 0.0f, 0.999f, &sp->min_p))
            return bad_usage("--min-p '%s': expected [0, 1)", optarg);
        return -1;
    case 1102:
        if (!coord_cli_parse_float(optarg, 0.01f, 10.0f, &sp->repetition_penalty))
            return bad_usage("--repeat-penalty '%s': expected 0.01..10", optarg);
        return -1;
    case 1103:
    case 1104:
        if (!coord_cli_parse_float(optarg, -2.0f, 2.0f,
                                   c == 1103 ? &sp->frequency_penalty : &sp->presence_penalty))
            return bad_usage("--%s-penalty '%s': expected -2..2",
                             c == 1103 ? "frequency" : "presence", optarg);
        return -1;
    case 'S': {
        char *end;
        errno = 0;
        sp->seed = strtoull(optarg, &end, 10);
        if (errno || end == optarg || *end)
            return bad_usage("--seed '%s': expected an integer", optarg);
        return -1;
    }
    }
    return 0;
}

/* One of generate's own options (@c, its value in optarg) into @arg, a struct generate_args.
 * Returns -1 to go on, else the exit code (2 after a bad value). */
static int generate_option(int c, void *arg)
{
    struct generate_args *a = arg;
    struct coord_generate_opts *o = &a->o;
    long v;
    int rc = sampling_option(c, &o->sampling);
    if (c == 'S' && rc < 0)
        a->seeded = true;
    if (rc)
        return rc;
    switch (c) {
    case 'p':
        if (o->n_prompts == GENERATE_MAX_PROMPTS)
            return bad_usage("more than 256 -p prompts: use -f FILE");
        o->prompts[o->n_prompts++] = optarg;
        break;
    case 'f':
        o->prompt_file = optarg;
        break;
    case 'J':
        o->json = true;
        break;
    case 'n':
        if (!coord_parse_long(optarg, 0, 1 << 24, &v))
            return bad_usage("-n '%s': expected a count 0..16777216", optarg);
        o->n = (int)v;
        break;
    case 1105:
        if (o->n_stop == GEN_MAX_STOPS)
            return bad_usage("more than %d --stop strings", GEN_MAX_STOPS);
        if (!*optarg || strlen(optarg) > 256)
            return bad_usage("--stop: expected a string of 1..256 bytes");
        o->stop[o->n_stop++] = optarg;
        break;
    case 1106:
    case 1107:
    case 1108:
        if (o->json_schema_path || o->regex || o->gbnf_path)
            return bad_usage("--json-schema, --regex and --grammar: one of them, once");
        if (c == 1107 && !*optarg)
            return bad_usage("--regex: expected a regular expression");
        if (c == 1106)
            o->json_schema_path = optarg;
        else if (c == 1107)
            o->regex = optarg;
        else
            o->gbnf_path = optarg;
        break;
    }
    return -1;
}

int coord_cmd_generate(int argc, char **argv)
{
    static const char *prompts[GENERATE_MAX_PROMPTS];
    struct generate_args a = {
        .o = {.n = 256,
              .prompts = prompts,
              .sampling = {.temp = 1.0f, .top_p = 0.9f, .repetition_penalty = 1.0f}}};
    struct coord_generate_opts *o = &a.o;
    int rc = coord_cli_parse_engine(&generate_cmd, argc, argv, &o->engine, &o->sched,
                                    generate_option, &a);
    if (rc >= 0)
        return rc;
    if (!o->engine.model_path || (!o->n_prompts && !o->prompt_file))
        return bad_usage("-m and -p (or -f) are required");
    if ((rc = coord_cli_check_kv(&generate_cmd, &o->engine)) >= 0)
        return rc;
    if (!a.seeded)
        o->sampling.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    coord_signals_install();
    struct shardlm_err e = {{0}};
    rc = coord_cli_engine_env(&o->engine, &e);
    return coord_cli_exit("generate", rc ? rc : coord_generate(o, &e), &e);
}
