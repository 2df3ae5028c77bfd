/* SPDX-License-Identifier: MIT */
/* coordinator/engine/engine.c: the engine's API - start, step, stop. */
#include "engine_internal.h"

#include "kn.h"
#include "peer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

/* What can be checked is, before anything is created: the kernel table, the runtime directory's
 * path and whether the workers' socket fits in it. */
static int check_options(struct coord_engine *g, const struct coord_engine_opts *o,
                         struct shardlm_err *e)
{
    char err[256];
    if (o->isa && !kn_ops_find(o->isa, err, sizeof(err)))
        return shardlm_fail(e, -ENOTSUP, "%s", err);
    if (o->prefetch && kn_pf_parse(o->prefetch) < -1)
        return shardlm_fail(e, -EINVAL, "prefetch mode '%s': expected auto, hw, l1 or l2",
                            o->prefetch);
    int rc = coord_rundir_path(g, o, e);
    if (rc || o->access.listen)
        return rc;
    char sock[PATH_MAX]; /* the workers' socket: an AF_UNIX path has 107 bytes at most */
    size_t max = sizeof(((struct sockaddr_un *)0)->sun_path);
    seg_path(sock, sizeof(sock), g->rundir, getpid(), SEG_RUN_SOCK);
    if (strlen(sock) >= max)
        return shardlm_fail(e, -ENAMETOOLONG,
                            "runtime directory %s: too long a path for the "
                            "workers' socket (%zu bytes, at most %zu); choose a shorter "
                            "SHARDLM_RUNTIME_DIR or --listen tcp",
                            g->rundir, strlen(sock), max - 1);
    return 0;
}

/* The layout, the model file's header, the runtime directory (stale files of dead
 * coordinators removed), the ranks. */
static int open_model(struct coord_engine *g, const struct coord_engine_opts *o,
                      struct shardlm_err *e)
{
    int rc = coord_layout_make(&g->layout, &o->layout, e);
    if (rc || (rc = coord_model_open(&g->file, o->model_path, e)) || (rc = coord_rundir_open(g, e)))
        return rc;
    seg_clean_stale(g->rundir);
    g->img = g->file.img;
    const struct shlm_config *c = &g->img.hdr->cfg;
    g->n_ranks = g->layout.n_ranks;
    if ((uint32_t)g->n_ranks > c->n_heads)
        return shardlm_fail(e, -EINVAL, "%d workers: more than the model's %u attention heads",
                            g->n_ranks, c->n_heads);
    if (!(g->ranks = calloc((size_t)g->n_ranks, sizeof(*g->ranks))))
        return shardlm_fail(e, -ENOMEM, "out of memory");
    return 0;
}

static int start(struct coord_engine *g, const struct coord_engine_opts *o, struct shardlm_err *e)
{
    int rc;
    g->shm_budget.limit = o->shm_limit;
    if ((rc = check_options(g, o, e)) || (rc = open_model(g, o, e)) ||
        (rc = coord_segments_make(g, o, e)) || (rc = coord_link_open(g, &o->access, e)) ||
        (rc = coord_workers_prepare(g, o, e)))
        return rc;
    for (int r = 0; r < g->n_ranks; r++)
        if ((rc = coord_worker_spawn(g, r, e)))
            return rc;
    if (o->while_starting && (rc = o->while_starting(g, o->arg, e)))
        return rc;
    if ((rc = coord_workers_handshake(g, e)))
        return rc;
    g->stats.ready_ns = shardlm_now_ns();
    coord_engine_sample(g);
    coord_log_weight_path(g);
    return 0;
}

/* Everything start made, whatever state it reached; @g itself stays. */
static void teardown(struct coord_engine *g)
{
    coord_workers_stop(g);
    coord_link_close(g);
    coord_segments_free(g);
    free(g->ranks);
    g->ranks = NULL;
    coord_model_close(&g->file);
    coord_layout_free(&g->layout);
    if (g->rundir[0])
        seg_clean_pid(g->rundir, getpid());
}

int coord_engine_start(struct coord_engine **out, const struct coord_engine_opts *o,
                       struct shardlm_err *e)
{
    struct coord_engine *g = calloc(1, sizeof(*g));
    *out = NULL;
    if (!g)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    g->file.fd = -1;
    g->max_restarts = o->restarts < 0 ? 0 : o->restarts ? o->restarts : COORD_RESTARTS;
    g->stats.start_ns = shardlm_now_ns();
    g->log = (struct coord_log){o->log, o->log_ctx, o->verbose};
    g->cancel = o->cancel;
    int rc = start(g, o, e);
    if (rc) {
        teardown(g);
        if (g->made_rundir)
            rmdir(g->rundir); /* only if empty: a segment another start published stays */
        free(g);
        return rc;
    }
    *out = g;
    return 0;
}

/* Sequence @s's block table of @nb entries into @t: its own, or slot seq_id's contexts of @slot
 * blocks each. */
static void table_of(const struct coord_seq_step *s, uint32_t slot, uint32_t nb, uint32_t *t)
{
    for (uint32_t b = 0; b < nb; b++)
        t[b] = s->blocks ? s->blocks[b] : s->seq_id * slot + b;
}

/* Checks @seqs against the engine's own copies of the capacities (never the segments' headers,
 * which the workers can write), reserves their KV and logits memory, writes their tokens and
 * block tables into the exchange, and describes each in @sq; *@tokens, how many in all. */
static int stage_step(struct coord_engine *g, struct coord_seq_step *seqs, int n,
                      Shardlm__StepSeq *sq, uint32_t *tokens, struct shardlm_err *e)
{
    const struct seg_exchange *x = &g->exch_layout;
    uint32_t ctx = g->img.hdr->cfg.seq_len;
    int32_t *tok = coord_exch_tokens(g);
    uint32_t *own = g->tables; /* the step's tables as checked: never read back from the exchange */
    uint32_t rows = 0, nblk = 0, slot = coord_kv_blocks_for(ctx); /* blocks of a context */
    uint32_t window = shlm_kv_window(&g->img.hdr->cfg, &g->img.hdr->cfgx);
    *tokens = 0;
    for (int i = 0; i < n; i++) {
        struct coord_seq_step *s = &seqs[i];
        uint32_t r = s->all_logits ? s->n_tokens : 1;
        if (s->n_tokens == 0 || (uint64_t)s->pos + s->n_tokens > ctx)
            return shardlm_fail(e, -E2BIG,
                                "sequence %u: positions %u..%llu outside the context "
                                "of %u",
                                s->seq_id, s->pos, (unsigned long long)s->pos + s->n_tokens - 1,
                                ctx);
        uint32_t nb = coord_kv_blocks_for((uint64_t)s->pos + s->n_tokens);
        if (s->n_tokens > x->max_tokens - *tokens || r > x->logit_rows - rows ||
            nb > x->max_blocks - nblk)
            return shardlm_fail(e, -E2BIG, "step too large for the exchange segment");
        if (!s->blocks && s->seq_id >= g->kv_blocks / slot)
            return shardlm_fail(e, -EINVAL, "sequence %u: the KV cache has %u slots", s->seq_id,
                                g->kv_blocks / slot);
        uint32_t *t = own + nblk;
        table_of(s, slot, nb, t);
        /* blocks before every layer's window may have gone back to the pool (SEG_KV_NONE) */
        uint32_t dead = s->blocks ? seg_kv_dead_blocks(window, s->pos) : 0;
        for (uint32_t b = 0; b < nb; b++)
            if (t[b] >= g->kv_blocks && !(b < dead && t[b] == SEG_KV_NONE))
                return shardlm_fail(e, -EINVAL, "sequence %u: KV block %u, the cache has %u",
                                    s->seq_id, t[b], g->kv_blocks);
        for (int j = 0; j < i; j++) {
            if (seqs[j].seq_id == s->seq_id)
                return shardlm_fail(e, -EINVAL, "sequence %u twice in one step", s->seq_id);
            if (seg_kv_writes_overlap(own + sq[j].block_offset, seqs[j].pos, seqs[j].n_tokens, t,
                                      s->pos, s->n_tokens))
                return shardlm_fail(e, -EINVAL, "sequences %u and %u write one KV block",
                                    seqs[j].seq_id, s->seq_id);
        }
        for (uint32_t b = s->pos / COORD_KV_BLOCK; b < nb; b++) {
            int rc = coord_reserve_kv(g, t[b], e);
            if (rc)
                return rc;
        }
        shardlm__step_seq__init(&sq[i]);
        sq[i].seq_id = s->seq_id;
        sq[i].pos = s->pos;
        sq[i].n_tokens = s->n_tokens;
        sq[i].token_offset = *tokens;
        sq[i].all_logits = s->all_logits;
        sq[i].logits_row = rows;
        sq[i].block_offset = nblk;
        memcpy(tok + *tokens, s->tokens, (size_t)s->n_tokens * sizeof(int32_t));
        s->logits = coord_exch_logits(g) + (size_t)rows * x->vocab;
        *tokens += s->n_tokens;
        rows += r;
        nblk += nb;
    }
    memcpy(coord_exch_blocks(g), own, (size_t)nblk * sizeof(uint32_t));
    return coord_reserve_logits(g, rows, e);
}

/* Sends step @st to every rank and waits for all of them to finish it. -ECHILD when a worker
 * died (whatever else the survivors said about it first), else 0 or -errno with @e set. */
static int run_step(struct coord_engine *g, Shardlm__Step *st, struct shardlm_err *e)
{
    proto_env env = SHARDLM__ENVELOPE__INIT;
    env.msg_case = SHARDLM__ENVELOPE__MSG_STEP;
    env.step = st;
    for (int r = 0; r < g->n_ranks; r++)
        g->ranks[r].done = false;
    int rc = coord_link_send_all(g, &env, e);
    const struct coord_wait w = {.want = SHARDLM__ENVELOPE__MSG_STEP_DONE, .timeout_ms = -1};
    for (int got = 0; !rc && got < g->n_ranks; got++) {
        proto_env *in;
        int r;
        if ((rc = coord_link_wait(g, &w, &in, &r, e)))
            break;
        const Shardlm__StepDone *d = in->step_done;
        struct coord_rank *cr = &g->ranks[r];
        if (!(rc = coord_peer_step_done(d, r, st->step_id, cr->done, e))) {
            cr->done = true;
            cr->compute_ns = d->compute_ns;
            cr->allreduce_ns = d->allreduce_ns;
            cr->expert_bytes = d->expert_bytes;
        }
        proto_free(in);
        if (rc)
            coord_group_fail(g, rc);
    }
    if (rc && rc != -ECHILD && rc != -ECANCELED && coord_workers_any_dead(g, e))
        rc = coord_group_fail(g, -ECHILD); /* the survivors' complaints follow from the death */
    return rc;
}

/* Restarts the dead workers (their death said in @why) at most max_restarts times in all,
 * counting in *@restarts: a restart that fails - the new worker dies too, or does not say
 * Hello, attach or Rejoin - is one of those times, its workers that are not Ready are killed and
 * the restart tried again while the budget allows. @when names the moment for the log, @then
 * what follows a restart that held. Returns
 * 0 once one holds; when the budget is spent, -ECHILD with the death that spent it and "; no
 * restarts left"; -ECANCELED or -ENOMEM as they come. */
static int restart_dead(struct coord_engine *g, int *restarts, const char *when, const char *then,
                        const char *why0, struct shardlm_err *e)
{
    char why[sizeof(e->msg)];
    snprintf(why, sizeof(why), "%s", why0);
    uint64_t r0 = shardlm_now_ns();
    for (;;) {
        if (coord_cancelled(g->cancel))
            return shardlm_fail(e, -ECANCELED, "cancelled");
        if (*restarts >= g->max_restarts)
            return shardlm_fail(e, -ECHILD, "%.*s; no restarts left (%d %s)",
                                (int)sizeof(e->msg) - 48, why, g->max_restarts,
                                restarts == &g->idle_restarts ? "between steps" : "per step");
        (*restarts)++;
        int rc = coord_workers_recover(g, e);
        if (!rc)
            break;
        if (rc == -ECANCELED || rc == -ENOMEM)
            return rc;
        coord_logf(&g->log, COORD_LOG_WARN, "%s %s; restart %d of %d failed: %s", why, when,
                   *restarts, g->max_restarts, e->msg);
        snprintf(why, sizeof(why), "%s", e->msg);
        coord_workers_kill_unready(g);
    }
    coord_logf(&g->log, COORD_LOG_WARN, "%s %s; restarted in %.1f ms%s", why, when,
               (double)(shardlm_now_ns() - r0) / 1e6, then);
    return 0;
}

/* Runs @st; when a worker dies, restarts it on its CPUs over the same segments and runs the
 * step again (its KV rows for these positions are rewritten with the same values), within
 * max_restarts restarts (restart_dead()). */
static int run_restarting(struct coord_engine *g, Shardlm__Step *st, struct shardlm_err *e)
{
    int restarts = 0;
    for (;;) {
        st->step_id = ++g->step_id;
        int rc = run_step(g, st, e);
        if (rc != -ECHILD)
            return rc;
        char why[sizeof(e->msg)], when[64];
        snprintf(why, sizeof(why), "%s", e->msg);
        snprintf(when, sizeof(when), "during step %llu", (unsigned long long)st->step_id);
        if ((rc = restart_dead(g, &restarts, when, ", running the step again", why, e)))
            return rc;
    }
}

int coord_engine_check(struct coord_engine *g, struct shardlm_err *e)
{
    if (!coord_workers_any_dead(g, e))
        return 0;
    char why[sizeof(e->msg)];
    snprintf(why, sizeof(why), "%s", e->msg);
    /* counted until a step runs: a worker that dies after each restart is not restarted forever */
    return restart_dead(g, &g->idle_restarts, "between steps", "", why, e);
}

/* The COORD_LOG_DEBUG line of a step: wall time, the slowest all-reduce, each rank's compute. */
static void log_step(const struct coord_engine *g, const Shardlm__Step *st, uint32_t tokens)
{
    if (!coord_log_on(&g->log, COORD_LOG_DEBUG))
        return;
    uint64_t ar = 0;
    for (int r = 0; r < g->n_ranks; r++)
        ar = g->ranks[r].allreduce_ns > ar ? g->ranks[r].allreduce_ns : ar;
    char line[4096];
    int len = snprintf(line, sizeof(line),
                       "step %llu %s tokens %u wall %.3f ms allreduce %.3f ms "
                       "compute",
                       (unsigned long long)st->step_id,
                       st->kind == SHARDLM__STEP_KIND__STEP_PREFILL ? "prefill" : "decode", tokens,
                       (double)g->last_wall_ns / 1e6, (double)ar / 1e6);
    for (int r = 0; r < g->n_ranks && len < (int)sizeof(line); r++)
        len += snprintf(line + len, sizeof(line) - (size_t)len, " r%d %.3f", r,
                        (double)g->ranks[r].compute_ns / 1e6);
    if (len < (int)sizeof(line))
        len += snprintf(line + len, sizeof(line) - (size_t)len, " ms");
    /* a mixture of experts: each rank's expert reads, and the busiest one's over their mean */
    uint64_t most = 0, sum = 0;
    for (int r = 0; r < g->n_ranks; r++) {
        sum += g->ranks[r].expert_bytes;
        most = g->ranks[r].expert_bytes > most ? g->ranks[r].expert_bytes : most;
    }
    if (sum && len < (int)sizeof(line)) {
        len += snprintf(line + len, sizeof(line) - (size_t)len, " experts");
        for (int r = 0; r < g->n_ranks && len < (int)sizeof(line); r++)
            len += snprintf(line + len, sizeof(line) - (size_t)len, " r%d %.2f", r,
                            (double)g->ranks[r].expert_bytes / 1e6);
        if (len < (int)sizeof(line))
            snprintf(line + len, sizeof(line) - (size_t)len, " MB imbalance %.2f",
                     (double)most * g->n_ranks / (double)sum);
    }
    coord_logf(&g->log, COORD_LOG_DEBUG, "%s", line);
}

int coord_engine_step(struct coord_engine *g, struct coord_seq_step *seqs, int n,
                      struct shardlm_err *e)
{
    if (n < 1 || (uint32_t)n > g->max_seqs)
        return shardlm_fail(e, -EINVAL, "a step carries 1..%u sequences, not %d", g->max_seqs, n);
    Shardlm__StepSeq *sq = calloc((size_t)n, sizeof(*sq));
    Shardlm__StepSeq **sp = calloc((size_t)n, sizeof(*sp));
    uint32_t tokens = 0;
    int rc = !sq || !sp ? shardlm_fail(e, -ENOMEM, "out of memory")
                        : stage_step(g, seqs, n, sq, &tokens, e);
    if (rc)
        goto out;
    for (int i = 0; i < n; i++)
        sp[i] = &sq[i];
    Shardlm__Step st = SHARDLM__STEP__INIT;
    st.kind =
        tokens > (uint32_t)n ? SHARDLM__STEP_KIND__STEP_PREFILL : SHARDLM__STEP_KIND__STEP_DECODE;
    st.n_seqs = (size_t)n;
    st.seqs = sp;
    uint64_t t0 = shardlm_now_ns();
    if ((rc = run_restarting(g, &st, e)))
        goto out;
    g->last_wall_ns = shardlm_now_ns() - t0;
    g->idle_restarts = 0; /* the workers held for a step */
    log_step(g, &st, tokens);
out:
    free(sq);
    free(sp);
    return rc;
}

void coord_engine_stop(struct coord_engine *g)
{
    if (!g)
        return;
    teardown(g);
    free(g);
}
