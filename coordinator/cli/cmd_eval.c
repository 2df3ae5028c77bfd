/* SPDX-License-Identifier: MIT */
/* coordinator/cli/cmd_eval.c: `shardlm eval` - options, then coord_eval. */
#include "cli.h"
#include "generate.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_eval[] =
    "usage: shardlm eval -m MODEL.shlm --ref DIR [--save DIR [--overwrite]] [--workers N]\n"
    "                    [--threads T] [--cpus LIST] [--no-persist] [--io MODE] [--stats]\n"
    "                    [--verify] [--restarts N] [--listen EP] [--keys DIR] [--verbose]\n"
    "\n"
    "Feeds the token sequences of DIR/greedy.tsv (prompt, prompt ids, generated ids, text file,\n"
    "logits file) and compares the model's logits with the reference logits (float32, or\n"
    "float16 in a file whose name ends in .f16): per prompt and overall, the mean KL\n"
    "divergence KL(ref || model), the top-1 agreement, the perplexity of the sequence, the\n"
    "99th percentile of the positions' KL divergences (interpolated linearly between the\n"
    "closest ranks, as numpy.percentile), the largest and the 99th percentile of the\n"
    "positions' relative L2 distances of the logits (||model - ref|| / ||ref||) and the mean\n"
    "top-1 probability of the reference (how peaked its outputs are). The last line reads\n"
    "  overall kld=<mean> top1=<fraction> ppl=<value> kld_p99=<value> rel_l2_max=<value>\n"
    "          rel_l2_p99=<value> ref_top1_prob=<mean>\n"
    "  --save DIR      also write this model's logits to DIR in the same format, to compare\n"
    "                  another model or layout against it (not the --ref folder; files there\n"
    "                  are never replaced unless --overwrite)\n" LAYOUT_HELP LOAD_HELP ACCESS_HELP;

static const struct option eval_options[] = {{"ref", required_argument, 0, 'r'},
                                             {"save", required_argument, 0, 's'},
                                             {"overwrite", no_argument, 0, 'O'},
                                             {"help", no_argument, 0, 'h'},
                                             ENGINE_OPTIONS,
                                             {0, 0, 0, 0}};

static const struct coord_cli_path eval_paths[] = {{'r', "--ref"}, {'s', "--save"}, {0, 0}};

static const struct coord_cli_cmd eval_cmd = {"eval", usage_eval, "m:vh", eval_options, eval_paths};

/* One of eval's own options (@c, its value in optarg) into @arg, a struct coord_eval_opts.
 * Returns -1: none can be bad. */
static int eval_option(int c, void *arg)
{
    struct coord_eval_opts *o = arg;
    if (c == 's')
        o->save_dir = optarg;
    else if (c == 'O')
        o->overwrite = true;
    else if (c == 'r')
        o->ref_dir = optarg;
    return -1;
}

int coord_cmd_eval(int argc, char **argv)
{
    struct coord_eval_opts o = {0};
    int rc = coord_cli_parse_engine(&eval_cmd, argc, argv, &o.engine, NULL, eval_option, &o);
    if (rc >= 0)
        return rc;
    if (!o.engine.model_path || !o.ref_dir)
        return coord_usage_error("eval", usage_eval, "-m and --ref are required");
    coord_signals_install();
    struct shardlm_err e = {{0}};
    rc = coord_cli_engine_env(&o.engine, &e);
    return coord_cli_exit("eval", rc ? rc : coord_eval(&o, &e), &e);
}
