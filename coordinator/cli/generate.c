/* coordinator/cli/generate.c: text generation through the engine. */
#include "generate.h"

#include "cli.h"
#include "sampler.h"
#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Writes one decoded piece to stdout through @u (a character split over byte tokens waits
 * for its last byte) and flushes it. -errno when stdout fails (-EPIPE when it is gone, -ENOSPC
 * when it is full). */
static int emit(const struct coord_tok *t, struct coord_utf8 *u, int prev, int token)
{
    size_t len;
    const char *piece = coord_tok_decode(t, prev, token, &len);
    if (!coord_tok_printable(piece, len))
        return 0;
    char buf[3 * 256 + 12];
    for (size_t off = 0; off < len; off += 256) {
        size_t n = coord_utf8_feed(u, piece + off, len - off < 256 ? len - off : 256, buf);
        if (fwrite(buf, 1, n, stdout) != n)
            return errno ? -errno : -EIO;
    }
    return fflush(stdout) != 0 ? (errno ? -errno : -EIO) : 0;
}

/* The one message of a failed write to stdout. */
static int stdout_failed(int rc, struct shardlm_err *e)
{
    return shardlm_fail(e, rc, "writing to stdout: %s", strerror(-rc));
}

struct tok_load {
    const struct coord_generate_opts *o;
    struct coord_tok tok;
    bool loaded;
    int32_t *ids; /* the prompt's, BOS first (malloc'd) */
    int np;
};

/* While the workers start: builds the tokenizer, tokenizes the prompt and checks that it and
 * -n fit the context, so a prompt too long fails before any step (and SIGTERM is seen within
 * a few ms of any of this: the encoder is linear, ~20 MB/s). */
static int load_tok(struct coord_engine *g, void *arg, struct shardlm_err *e)
{
    struct tok_load *t = arg;
    const struct coord_generate_opts *o = t->o;
    const struct shlm_model *m = coord_engine_model(g);
    int rc = coord_tok_from_shlm(&t->tok, m, o->engine.model_path, e);
    if (rc)
        return rc;
    t->loaded = true;
    int ctx = (int)m->hdr->cfg.seq_len, max = (int)strlen(o->prompt) + 3;
    if (!(t->ids = malloc((size_t)max * sizeof(int32_t))))
        return shardlm_fail(e, -ENOMEM, "out of memory");
    int np = t->np = coord_tok_encode(&t->tok, o->prompt, true, false, t->ids, max);
    if (np < 0)
        return shardlm_fail(e, np, "cannot tokenize the prompt: %s",
                            np == -EILSEQ ? "a character this vocabulary cannot spell"
                                          : strerror(-np));
    if (np > ctx)
        return shardlm_fail(e, -E2BIG, "the prompt is %d tokens, longer than the context of %d", np,
                            ctx);
    /* the last new token is sampled, never fed: np + n - 1 positions */
    if (o->n > 0 && np + o->n - 1 > ctx)
        return shardlm_fail(e, -E2BIG,
                            "the prompt (%d tokens) plus -n %d exceeds the context of "
                            "%d; use -n %d or less",
                            np, o->n, ctx, ctx - np + 1);
    return 0;
}

int coord_generate(const struct coord_generate_opts *o, struct shardlm_err *e)
{
    struct coord_engine *g;
    struct tok_load tl = {.o = o};
    struct coord_engine_opts eo = o->engine;
    eo.while_starting = load_tok;
    eo.arg = &tl;
    struct coord_tok tok;
    struct coord_sampler smp;
    int rc = coord_engine_start(&g, &eo, e);
    if (rc) {
        if (tl.loaded)
            coord_tok_free(&tl.tok);
        free(tl.ids);
        return rc;
    }
    tok = tl.tok;
    int32_t *ids = tl.ids;
    int np = tl.np;
    const struct shlm_header *h = coord_engine_model(g)->hdr;
    if ((rc = coord_sampler_init(&smp, (int)h->cfg.vocab_size, o->temp, o->top_p, o->seed))) {
        shardlm_fail(e, rc, "out of memory");
        goto out_tok;
    }
    struct coord_utf8 u = {0};
    for (int i = 1; i < np; i++)
        if ((rc = emit(&tok, &u, ids[i - 1], ids[i]))) {
            stdout_failed(rc, e);
            goto out_smp;
        }

    struct coord_seq_step s = {.seq_id = 0, .pos = 0, .n_tokens = (uint32_t)np, .tokens = ids};
    int prev = ids[np - 1];
    uint64_t t0 = shardlm_now_ns(), t_first = 0;
    int produced = 0;
    for (int i = 0; i < o->n; i++) {
        if ((rc = coord_engine_step(g, &s, 1, e)))
            break;
        if (!t_first)
            t_first = shardlm_now_ns();
        int next = coord_sample(&smp, (float *)s.logits);
        if (next == (int)h->bos_id || next == (int)h->eos_id)
            break;
        if ((rc = emit(&tok, &u, prev, next))) {
            stdout_failed(rc, e);
            break;
        }
        produced++;
        s.pos += s.n_tokens;
        s.n_tokens = 1;
        s.tokens = &ids[0];
        ids[0] = next;
        prev = next;
    }
    if (!ferror(stdout)) {
        char tail[3];
        size_t n = coord_utf8_flush(&u, tail); /* a character cut off: U+FFFD */
        bool ok = fwrite(tail, 1, n, stdout) == n && putchar('\n') != EOF && fflush(stdout) == 0;
        if (!ok && !rc)
            rc = stdout_failed(errno ? -errno : -EIO, e);
    }
    if (o->engine.verbose && t_first) {
        uint64_t t1 = shardlm_now_ns();
        fprintf(stderr, "prompt %d tokens, generated %d; first token %.1f ms, decode %.1f tok/s\n",
                np, produced, (double)(t_first - t0) / 1e6,
                produced > 1 ? (produced - 1) / ((double)(t1 - t_first) / 1e9) : 0.0);
    }
    if (o->engine.load.stats)
        coord_cli_print_stats(g, t_first, stderr);
out_smp:
    coord_sampler_free(&smp);
out_tok:
    free(ids);
    coord_tok_free(&tok);
    coord_engine_stop(g);
    return rc;
}
