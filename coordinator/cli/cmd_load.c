/* SPDX-License-Identifier: MIT */
/* coordinator/cli/cmd_load.c: `shardlm load` - start the engine (building or finding the weights
 * segments), report, stop. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_load[] =
    "usage: shardlm load -m MODEL.shlm [--workers N] [--threads T] [--cpus LIST] [--no-persist]\n"
    "                    [--verify] [--io MODE] [--stats] [--restarts N] [--listen EP]\n"
    "                    [--keys DIR] [--verbose]\n"
    "\n"
    "Loads the model as generate would - the weights segments of its workers, built from the file\n"
    "or found complete from an earlier run - starts the workers, and stops. Without --no-persist\n"
    "the segments stay, so a later generate with the same layout starts warm.\n" LAYOUT_HELP
        LOAD_HELP ACCESS_HELP "  --verbose       worker layout on stderr\n";

static const struct option load_options[] = {
    {"help", no_argument, 0, 'h'}, ENGINE_OPTIONS, {0, 0, 0, 0}};

static const struct coord_cli_cmd load_cmd = {"load", usage_load, "m:vh", load_options, NULL};

int coord_cmd_load(int argc, char **argv)
{
    struct coord_engine_opts o = {0};
    int rc = coord_cli_parse_engine(&load_cmd, argc, argv, &o, NULL, NULL, NULL);
    if (rc >= 0)
        return rc;
    if (!o.model_path)
        return coord_usage_error("load", usage_load, "-m is required");
    coord_signals_install();
    struct shardlm_err e = {{0}};
    struct coord_engine *g;
    rc = coord_cli_engine_env(&o, &e);
    if (rc || (rc = coord_engine_start(&g, &o, &e)))
        return coord_cli_exit("load", rc, &e);
    const struct coord_engine_stats *st = coord_engine_stats(g);
    int n = coord_engine_n_ranks(g);
    if (o.load.stats)
        coord_cli_print_stats(g, 0, stderr);
    else
        fprintf(stderr, "shardlm: %d weights segment%s ready (%d built, %d found complete)%s%s\n",
                n, n > 1 ? "s" : "", st->built, st->reused, o.load.no_persist ? "" : " in ",
                o.load.no_persist ? "" : coord_engine_rundir(g));
    coord_engine_stop(g);
    return 0;
}
