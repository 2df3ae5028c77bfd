/* SPDX-License-Identifier: MIT */
/* coordinator/cli/stats.c: the --stats report of the engine commands, from its accessors. */
#include "cli.h"

#include <stdio.h>

void coord_cli_print_stats(struct coord_engine *g, uint64_t first_token_ns, FILE *f)
{
    coord_engine_sample(g);
    const struct coord_engine_stats *st = coord_engine_stats(g);
    double secs = (double)(st->ready_ns - st->start_ns) / 1e9;
    int n_ranks = coord_engine_n_ranks(g);
    if (st->built)
        fprintf(f,
                "shardlm: load: %d weights segment%s built from %s: %llu bytes read in %.3f s "
                "(%.2f GB/s), %s\n",
                st->built, st->built > 1 ? "s" : "", coord_engine_model_path(g),
                (unsigned long long)st->load.bytes, (double)st->load.ns / 1e9,
                (double)st->load.bytes / (double)(st->load.ns ? st->load.ns : 1), st->load.io);
    if (st->reused)
        fprintf(f, "shardlm: load: %d weights segment%s found complete in %s (warm start)\n",
                st->reused, st->reused > 1 ? "s" : "", coord_engine_rundir(g));
    uint64_t w = 0, kv = 0, x = coord_engine_exchange_bytes(g);
    for (int r = 0; r < n_ranks; r++) {
        struct coord_rank_info ri;
        coord_engine_rank(g, r, &ri);
        w += ri.weights_bytes;
        kv += ri.kv_bytes;
    }
    uint64_t total = w + kv + x, anon = st->peak_anon;
    fprintf(f, "shardlm: segments: weights %llu, kv %llu, exchange %llu: %llu bytes\n",
            (unsigned long long)w, (unsigned long long)kv, (unsigned long long)x,
            (unsigned long long)total);
    fprintf(f, "shardlm: peak anonymous memory: coordinator %.1f MiB", (double)anon / 1048576.0);
    for (int r = 0; r < n_ranks; r++) {
        struct coord_rank_info ri;
        coord_engine_rank(g, r, &ri);
        fprintf(f, ", rank %d %.1f MiB", r, (double)ri.peak_anon / 1048576.0);
        anon += ri.peak_anon;
    }
    fprintf(f, "; %.1f MiB in all\n", (double)anon / 1048576.0);
    fprintf(f, "shardlm: start to workers ready %.3f s", secs);
    if (first_token_ns)
        fprintf(f, ", to the first token %.3f s", (double)(first_token_ns - st->start_ns) / 1e9);
    fprintf(f, "\n");
    fprintf(f, "load segments_bytes=%llu peak_anon_bytes=%llu seconds=%.3f\n",
            (unsigned long long)total, (unsigned long long)anon, secs);
}
