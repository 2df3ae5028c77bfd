/* SPDX-License-Identifier: MIT */
/* coordinator/engine/stats.c: what the engine tells its caller - accessors, memory samples. */
#include "engine_internal.h"

#include "kn.h"

#include <stdio.h>

const struct shlm_model *coord_engine_model(const struct coord_engine *g) { return &g->img; }

const char *coord_engine_model_path(const struct coord_engine *g) { return g->file.path; }

const char *coord_engine_rundir(const struct coord_engine *g) { return g->rundir; }

int coord_engine_n_ranks(const struct coord_engine *g) { return g->n_ranks; }

const struct coord_layout *coord_engine_layout(const struct coord_engine *g) { return &g->layout; }

void coord_engine_rank(const struct coord_engine *g, int r, struct coord_rank_info *out)
{
    const struct coord_rank *cr = &g->ranks[r];
    *out = (struct coord_rank_info){
        .pid = cr->reaped ? 0 : cr->pid,
        .isa = cr->isa,
        .weights_bytes = cr->weights.size,
        .kv_bytes = cr->kv.size,
        .compute_ns = cr->compute_ns,
        .allreduce_ns = cr->allreduce_ns,
        .peak_anon = cr->peak_anon,
    };
}

uint32_t coord_engine_logit_rows(const struct coord_engine *g) { return g->exch_layout.logit_rows; }

uint32_t coord_engine_max_seqs(const struct coord_engine *g) { return g->max_seqs; }

uint32_t coord_engine_kv_blocks(const struct coord_engine *g) { return g->kv_blocks; }

size_t coord_engine_kv_block_bytes(const struct coord_engine *g)
{
    size_t sum = 0;
    for (int r = 0; r < g->n_ranks; r++)
        sum += seg_kv_block_bytes(g->ranks[r].kv_layout.n_layers, g->ranks[r].kv_layout.kv_dim,
                                  g->ranks[r].kv_layout.keys_only);
    return sum;
}

size_t coord_engine_exchange_bytes(const struct coord_engine *g) { return g->exch.size; }

const struct coord_engine_stats *coord_engine_stats(const struct coord_engine *g)
{
    return &g->stats;
}

void coord_engine_sample(struct coord_engine *g)
{
    uint64_t a = coord_rss_anon(0);
    g->stats.peak_anon = a > g->stats.peak_anon ? a : g->stats.peak_anon;
    for (int r = 0; g->ranks && r < g->n_ranks; r++) {
        struct coord_rank *cr = &g->ranks[r];
        a = cr->pid && !cr->reaped ? coord_rss_anon(cr->pid) : 0;
        cr->peak_anon = a > cr->peak_anon ? a : cr->peak_anon;
    }
}

void coord_log_weight_path(const struct coord_engine *g)
{
    const struct shlm_header *h = g->img.hdr;
    struct kn_cpu cpu;
    char feat[128], scheme[64];
    if (!coord_log_on(&g->log, COORD_LOG_INFO))
        return;
    kn_cpu_probe(&cpu);
    kn_cpu_describe(&cpu, feat, sizeof(feat));
    if (h->scheme >= SHLM_SCHEME_W4A16)
        snprintf(scheme, sizeof(scheme), "%s g%u in tiles, head int%u", shlm_scheme_name(h->scheme),
                 h->group, h->head_bits);
    else
        snprintf(scheme, sizeof(scheme), "%s", shlm_scheme_name(h->scheme));
    coord_logf(&g->log, COORD_LOG_INFO, "weights %s; kernels %s (cpu: %s)", scheme, g->ranks[0].isa,
               feat);
}
