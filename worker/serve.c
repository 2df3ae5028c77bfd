/* SPDX-License-Identifier: MIT */
/* worker/serve.c: the worker's side of the protocol - what it does with each message from its
 * coordinator. Every field is checked before use; a bad message gets an Error reply. */
#include "serve.h"

#include "common.h"

#include "pin.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void wrk_log(const struct wrk *w, const char *fmt, ...)
{
    if (w->quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "shardlm-worker[%u]: ", w->rank);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static int send_env(struct wrk *w, proto_env *env) { return w->send(w, env); }

int wrk_reply_error(struct wrk *w, int code, uint64_t step_id, const struct shardlm_err *e)
{
    char msg[sizeof(e->msg)];
    snprintf(msg, sizeof(msg), "%s", e->msg); /* the message field is not const */
    wrk_log(w, "error: %s", msg);
    Shardlm__Error err = SHARDLM__ERROR__INIT;
    err.code = code;
    err.message = msg;
    err.step_id = step_id;
    proto_env env = SHARDLM__ENVELOPE__INIT;
    env.msg_case = SHARDLM__ENVELOPE__MSG_ERROR;
    env.error = &err;
    return send_env(w, &env);
}

void wrk_detach(struct wrk *w)
{
    if (w->attached)
        wrk_model_free(&w->model);
    seg_free(&w->weights);
    seg_free(&w->kv);
    seg_free(&w->exch);
    w->attached = false;
}

/* Answers Attach or Rejoin: the layout read back from the kernel. */
static int send_ready(struct wrk *w)
{
    char cpus[1024];
    Shardlm__Ready r = SHARDLM__READY__INIT;
    r.rank = w->rank;
    r.weights_bytes = w->weights.size;
    r.node = wrk_read_back(cpus, sizeof(cpus));
    r.cpus = cpus;
    r.threads = (uint32_t)(w->pool ? wrk_pool_size(w->pool) : 1);
    proto_env env = SHARDLM__ENVELOPE__INIT;
    env.msg_case = SHARDLM__ENVELOPE__MSG_READY;
    env.ready = &r;
    return send_env(w, &env);
}

/* Maps the segments an Attach names, checks them against the model and builds the model view.
 * Returns 0 (attached) or -errno with @e set, attached to nothing. */
static int on_attach(struct wrk *w, const Shardlm__Attach *a, struct shardlm_err *e)
{
    struct shardlm_err why;
    int rc;
    if (w->attached)
        return shardlm_fail(e, -EALREADY, "Attach: already attached");
    if (a->rank != w->rank || a->n_ranks < 1 || a->n_ranks > SEG_AR_MAX_RANKS)
        return shardlm_fail(e, -EINVAL, "Attach: rank %u of %u, this worker is rank %u", a->rank,
                            a->n_ranks, w->rank);
    if ((rc = seg_map(&w->weights, a->weights_path, a->weights_bytes, false)) ||
        (rc = seg_map(&w->kv, a->kv_path, a->kv_bytes, true)) ||
        (rc = seg_map(&w->exch, a->exchange_path, a->exchange_bytes, true))) {
        shardlm_fail(e, rc, "Attach: cannot map segments: %s", strerror(-rc));
        goto out_detach;
    }
    rc = shlm_parse(&w->img, w->weights.base, w->weights.size, a->weights_path, &why);
    if (rc) {
        shardlm_fail(e, rc, "Attach: %s", why.msg);
        goto out_detach;
    }
    const struct shlm_header *h = w->img.hdr;
    const struct shlm_config *c = &h->cfg;
    struct seg_plan p;
    if (h->shard_rank != a->rank || h->shard_count != a->n_ranks || seg_plan_of(&p, h)) {
        rc = shardlm_fail(e, -EINVAL,
                          "Attach: the weights segment holds shard %u of %u (experts placement "
                          "%u), not a valid shard %u of %u",
                          h->shard_rank, h->shard_count, h->experts_placement, a->rank, a->n_ranks);
        goto out_detach;
    }
    if (seg_kv_check(w->kv.base, w->kv.size, c->n_layers, (uint32_t)p.kv_dim, p.kv_keys_only) ||
        seg_exchange_check(w->exch.base, w->exch.size, c->vocab_size, a->n_ranks, c->dim)) {
        rc = shardlm_fail(e, -EINVAL, "Attach: KV or exchange segment does not fit the model");
        goto out_detach;
    }
    seg_ar_attach(&w->ar, seg_exchange_ar(w->exch.base), (int)a->rank, getpid());
    rc = wrk_model_init(&w->model, &w->img, w->ops, SEG_MAX_CHUNK, w->pool, &w->ar);
    if (rc) {
        shardlm_fail(e, rc, "Attach: %s", strerror(-rc));
        goto out_detach;
    }
    w->attached = true;
    return 0;
out_detach:
    wrk_detach(w);
    return rc;
}

/* The KV blocks a sequence's table names for positions 0 .. pos + n - 1. */
static uint64_t table_len(const Shardlm__StepSeq *q)
{
    return ((uint64_t)q->pos + q->n_tokens + SEG_KV_BLOCK - 1) / SEG_KV_BLOCK;
}

/* Checks one sequence of a Step against the segments. 0 or -EINVAL with @e set. */
static int check_seq(struct wrk *w, const Shardlm__StepSeq *q, struct shardlm_err *e)
{
    const struct seg_exchange *x = w->exch.base;
    const struct seg_kv *kv = w->kv.base;
    const int32_t *tok = seg_exchange_tokens(w->exch.base);
    const uint32_t *blocks = seg_exchange_blocks(w->exch.base);
    uint32_t ctx = w->model.cfg.seq_len;
    uint64_t rows = q->all_logits ? q->n_tokens : 1, nb = table_len(q);
    if (q->n_tokens == 0 || (uint64_t)q->pos + q->n_tokens > ctx)
        return shardlm_fail(e, -EINVAL, "positions %u..+%u outside the context of %u", q->pos,
                            q->n_tokens, ctx);
    if ((uint64_t)q->token_offset + q->n_tokens > x->max_tokens)
        return shardlm_fail(e, -EINVAL, "tokens %u..+%u outside the exchange's %u", q->token_offset,
                            q->n_tokens, x->max_tokens);
    if ((uint64_t)q->logits_row + rows > x->logit_rows)
        return shardlm_fail(e, -EINVAL, "logits rows %u..+%llu outside the exchange's %u",
                            q->logits_row, (unsigned long long)rows, x->logit_rows);
    if ((uint64_t)q->block_offset + nb > x->max_blocks)
        return shardlm_fail(e, -EINVAL, "block table %u..+%llu outside the exchange's %u",
                            q->block_offset, (unsigned long long)nb, x->max_blocks);
    /* the blocks before every layer's window are never read (the kernels start at the window):
     * the coordinator may have given them back (SEG_KV_NONE); every block read must be there */
    uint32_t dead = seg_kv_dead_blocks(shlm_kv_window(&w->model.cfg, &w->model.cfgx), q->pos);
    for (uint64_t b = 0; b < nb; b++) {
        uint32_t t = blocks[q->block_offset + b];
        if (t >= kv->n_blocks && !(b < dead && t == SEG_KV_NONE))
            return shardlm_fail(e, -EINVAL, "KV block %u outside the cache's %u", t, kv->n_blocks);
    }
    for (uint32_t t = 0; t < q->n_tokens; t++) {
        int32_t id = tok[q->token_offset + t];
        if (id < 0 || (uint32_t)id >= x->vocab)
            return shardlm_fail(e, -EINVAL, "token id %d outside the vocabulary of %u", id,
                                x->vocab);
    }
    return 0;
}

/* Checks every field of a Step against the segments before anything is touched. Returns 0 or
 * -EINVAL with @e naming the field. */
static int check_step(struct wrk *w, const Shardlm__Step *s, struct shardlm_err *e)
{
    const struct seg_exchange *x = w->exch.base;
    const uint32_t *blocks = seg_exchange_blocks(w->exch.base);
    if (s->step_id <= w->last_step)
        return shardlm_fail(e, -EINVAL, "step_id %llu is not after %llu",
                            (unsigned long long)s->step_id, (unsigned long long)w->last_step);
    if (s->n_seqs == 0 || s->n_seqs > x->max_tokens)
        return shardlm_fail(e, -EINVAL, "%zu sequences, expected 1..%u", s->n_seqs, x->max_tokens);
    for (size_t i = 0; i < s->n_seqs; i++) {
        const Shardlm__StepSeq *q = s->seqs[i];
        int rc = check_seq(w, q, e);
        if (rc)
            return rc;
        for (size_t j = 0; j < i; j++) {
            if (s->seqs[j]->seq_id == q->seq_id)
                return shardlm_fail(e, -EINVAL, "seq_id %u twice in one step", q->seq_id);
            const Shardlm__StepSeq *p = s->seqs[j];
            if (seg_kv_writes_overlap(blocks + p->block_offset, p->pos, p->n_tokens,
                                      blocks + q->block_offset, q->pos, q->n_tokens))
                return shardlm_fail(e, -EINVAL, "sequences %u and %u write one KV block",
                                    s->seqs[j]->seq_id, q->seq_id);
        }
    }
    return 0;
}

/* Runs a checked Step: every sequence through the model, its logits into the exchange. Fills @d
 * (times, rank). Returns 0 or -errno with @e set. */
static int on_step(struct wrk *w, const Shardlm__Step *s, Shardlm__StepDone *d,
                   struct shardlm_err *e)
{
    struct shardlm_err why;
    unsigned long long id = (unsigned long long)s->step_id;
    if (!w->attached)
        return shardlm_fail(e, -ENOTCONN, "Step before Attach");
    int rc = check_step(w, s, &why);
    if (rc)
        return shardlm_fail(e, rc, "Step %llu: %s", id, why.msg);
    w->last_step = s->step_id;
    if (w->fault_step_delay_ms)
        usleep(w->fault_step_delay_ms * 1000u);
    uint64_t t0 = shardlm_now_ns();
    const int32_t *tok = seg_exchange_tokens(w->exch.base);
    const uint32_t *blocks = seg_exchange_blocks(w->exch.base);
    float *logits = seg_exchange_logits(w->exch.base);
    size_t vocab = w->model.cfg.vocab_size;
    seg_ar_take_wait_ns(&w->ar);
    struct wrk_run *runs = calloc(s->n_seqs, sizeof(*runs));
    if (!runs)
        return shardlm_fail(e, -ENOMEM, "Step %llu: out of memory", id);
    for (size_t i = 0; i < s->n_seqs; i++) {
        const Shardlm__StepSeq *q = s->seqs[i];
        runs[i] = (struct wrk_run){
            q->seq_id,    tok + q->token_offset,    (int)q->n_tokens,
            (int)q->pos,  blocks + q->block_offset, logits + (size_t)q->logits_row * vocab,
            q->all_logits};
    }
    rc = wrk_forward_batch(&w->model, w->kv.base, runs, (int)s->n_seqs);
    free(runs);
    if (rc)
        return shardlm_fail(e, rc, "Step %llu: all-reduce failed: %s", id,
                            rc == -ETIMEDOUT ? "peers made no progress" : "group aborted");
    d->step_id = s->step_id;
    d->compute_ns = shardlm_now_ns() - t0;
    d->allreduce_ns = seg_ar_take_wait_ns(&w->ar);
    d->expert_bytes = w->model.expert_bytes;
    d->rank = w->rank;
    return 0;
}

/* A peer was restarted and the coordinator reset the all-reduce area: attach to it afresh (the
 * call count starts over with everyone's). The segments and the model view stay. Returns 0 or
 * -errno with @e set. */
static int on_rejoin(struct wrk *w, const Shardlm__Rejoin *j, struct shardlm_err *e)
{
    if (!w->attached)
        return shardlm_fail(e, -ENOTCONN, "Rejoin before Attach");
    if (j->rank != w->rank)
        return shardlm_fail(e, -EINVAL, "Rejoin: rank %u, this worker is rank %u", j->rank,
                            w->rank);
    if (seg_ar_check(seg_exchange_ar(w->exch.base),
                     w->exch.size - ((struct seg_exchange *)w->exch.base)->ar_off,
                     (int)w->ar.n_ranks, (size_t)SEG_MAX_CHUNK * w->model.cfg.dim))
        return shardlm_fail(e, -EINVAL, "Rejoin: the all-reduce area does not fit the group");
    seg_ar_attach(&w->ar, seg_exchange_ar(w->exch.base), (int)w->rank, getpid());
    return 0;
}

/* Answers a Heartbeat request with its sequence number. */
static int send_heartbeat(struct wrk *w, uint64_t seq)
{
    Shardlm__Heartbeat h = SHARDLM__HEARTBEAT__INIT;
    h.seq = seq;
    h.reply = true;
    proto_env env = SHARDLM__ENVELOPE__INIT;
    env.msg_case = SHARDLM__ENVELOPE__MSG_HEARTBEAT;
    env.heartbeat = &h;
    return send_env(w, &env);
}

int wrk_handle(struct wrk *w, const proto_env *in, bool *shutdown)
{
    struct shardlm_err e = {{0}};
    uint64_t step_id = 0;
    int rc;
    *shutdown = false;
    switch (in->msg_case) {
    case SHARDLM__ENVELOPE__MSG_ATTACH:
        if (!(rc = on_attach(w, in->attach, &e)))
            return send_ready(w);
        break;
    case SHARDLM__ENVELOPE__MSG_STEP: {
        Shardlm__StepDone d = SHARDLM__STEP_DONE__INIT;
        step_id = in->step->step_id;
        if (!(rc = on_step(w, in->step, &d, &e))) {
            proto_env env = SHARDLM__ENVELOPE__INIT;
            env.msg_case = SHARDLM__ENVELOPE__MSG_STEP_DONE;
            env.step_done = &d;
            return send_env(w, &env);
        }
        break;
    }
    case SHARDLM__ENVELOPE__MSG_HEARTBEAT:
        return in->heartbeat->reply ? 0 : send_heartbeat(w, in->heartbeat->seq);
    case SHARDLM__ENVELOPE__MSG_REJOIN:
        if (!(rc = on_rejoin(w, in->rejoin, &e)))
            return send_ready(w);
        break;
    case SHARDLM__ENVELOPE__MSG_SHUTDOWN:
        *shutdown = true;
        return 0;
    default:
        rc = shardlm_fail(&e, -EPROTO, "unexpected %s from the coordinator", proto_case_name(in));
        break;
    }
    return wrk_reply_error(w, rc, step_id, &e);
}
