/* SPDX-License-Identifier: MIT */
/* coordinator/grammar/grammar.c: a grammar's life (limits, free) and the two simplest sources:
 * a regular expression and a choice among strings. */
#include "gr_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gr_grammar_new(const struct gr_opts *o, const char *what, struct gr_grammar **out,
                   struct shardlm_err *e)
{
    struct gr_grammar *g = calloc(1, sizeof(*g));
    if (!g)
        return shardlm_fail(e, -ENOMEM, "grammar: out of memory");
    g->lex.max_states = o && o->max_nfa_states ? o->max_nfa_states : 2000000;
    g->lex.max_dstates = o && o->max_dfa_states ? o->max_dfa_states : 200000;
    g->cfg.max_rules = o && o->max_rules ? o->max_rules : 1000000;
    snprintf(g->what, sizeof(g->what), "%s", what);
    if ((o && o->think_open && !(g->think_open = strdup(o->think_open))) ||
        (o && o->think_close && !(g->think_close = strdup(o->think_close))) ||
        (o && o->lead && !(g->lead = strdup(o->lead)))) {
        gr_grammar_free(g);
        return shardlm_fail(e, -ENOMEM, "grammar: out of memory");
    }
    *out = g;
    return 0;
}

void gr_grammar_free(struct gr_grammar *g)
{
    if (!g)
        return;
    gr_lexer_free(&g->lex);
    gr_cfg_free(&g->cfg);
    free(g->think_open);
    free(g->think_close);
    free(g->lead);
    for (int i = 0; g->startc && i <= g->startc_mask; i++)
        free(g->startc[i].ids);
    free(g->startc);
    for (int i = 0; i < g->cap_mc; i++) {
        free(g->mc[i].bits);
        free(g->mc[i].b);
    }
    free(g->mc);
    free(g);
}

bool gr_grammar_overflow(const struct gr_grammar *g) { return g->lex.overflow; }

/* The frame around @start: top -> [think] [lead] start | [lead] start (the reasoning
 * required when think_open is ""). Returns top or -errno. */
static int frame(struct gr_grammar *g, int start)
{
    struct shardlm_err e;
    struct gr_rebuild b = {.max_nodes = 1000000, .e = &e};
    int32_t sym[3];
    int n = 0, think = -1, rc = 0;
    if (g->think_open && g->think_close && *g->think_close) {
        struct gr_cset ws = {0};
        if (gr_cset_add(&ws, '\t', '\n') || gr_cset_add(&ws, '\r', '\r') ||
            gr_cset_add(&ws, ' ', ' ')) {
            gr_cset_free(&ws);
            return -ENOMEM;
        }
        struct gr_re *r = gr_re_cat(
            &b,
            gr_re_cat(&b, gr_re_lit(&b, GR_ENC_BYTE, g->think_open, strlen(g->think_open)),
                      gr_re_until(&b, g->think_close)),
            gr_re_rep(&b, gr_re_set(&b, GR_ENC_BYTE, &ws), 0, 4));
        gr_cset_free(&ws);
        think = r ? gr_lexer_add(&g->lex, r) : -ENOMEM;
        rc = think < 0 ? think : 0;
    }
    if (!rc && g->lead && *g->lead) {
        struct gr_re *r = gr_re_lit(&b, GR_ENC_BYTE, g->lead, strlen(g->lead));
        int lx = r ? gr_lexer_add(&g->lex, r) : -ENOMEM;
        if (lx < 0)
            rc = lx;
        else
            sym[n++] = lx;
    }
    gr_rebuild_free(&b);
    int top = rc ? rc : gr_cfg_nt(&g->cfg);
    if (top < 0)
        return top;
    sym[n++] = ~start;
    if (think < 0 || *g->think_open) /* the reasoning may be left out */
        rc = gr_cfg_rule(&g->cfg, top, sym, n);
    if (!rc && think >= 0) {
        memmove(sym + 1, sym, (size_t)n * sizeof(*sym));
        sym[0] = think;
        rc = gr_cfg_rule(&g->cfg, top, sym, n + 1);
    }
    return rc ? rc : top;
}

int gr_finish(struct gr_grammar *g, int start)
{
    if ((g->think_open && g->think_close) || g->lead) {
        start = frame(g, start);
        if (start < 0)
            return start;
    }
    uint8_t *empty = gr_lexer_empty(&g->lex);
    if (!empty)
        return -ENOMEM;
    int rc = gr_cfg_finish(&g->cfg, start, empty);
    free(empty);
    return rc;
}

int gr_fail_code(struct shardlm_err *e, int rc, const char *what)
{
    if (rc == -E2BIG)
        return shardlm_fail(e, rc, "%s: past the grammar's limits (states, rules or items)", what);
    if (rc == -ENOMEM)
        return shardlm_fail(e, rc, "%s: out of memory", what);
    if (rc == -ENOENT)
        return shardlm_fail(e, -EINVAL, "%s: no text matches it", what);
    return rc;
}

/* S -> L (| empty, when L matches it): one lexeme as the whole grammar. */
static int one_lexeme(struct gr_grammar *g, const struct gr_re *r, struct shardlm_err *e)
{
    int lx = gr_lexer_add(&g->lex, r);
    if (lx < 0)
        return gr_fail_code(e, lx, g->what);
    int s = gr_cfg_nt(&g->cfg);
    int rc = s < 0 ? s : gr_cfg_rule(&g->cfg, s, &lx, 1);
    if (!rc && g->lex.lx[lx].nullable)
        rc = gr_cfg_rule(&g->cfg, s, NULL, 0);
    if (!rc)
        rc = gr_finish(g, s);
    return rc ? gr_fail_code(e, rc, g->what) : 0;
}

int gr_compile_regex(const char *re, size_t len, const struct gr_opts *o, struct gr_grammar **out,
                     struct shardlm_err *e)
{
    struct gr_grammar *g;
    int rc = gr_grammar_new(o, "regex", &g, e);
    if (rc)
        return rc;
    struct gr_rebuild b = {.max_nodes = 1000000, .e = e};
    struct gr_re *r = gr_re_parse(&b, re, len, GR_ENC_UTF8, true);
    rc = r ? one_lexeme(g, r, e) : -EINVAL;
    gr_rebuild_free(&b);
    if (rc) {
        gr_grammar_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

int gr_compile_choice(const char *const *s, const size_t *lens, int n, const struct gr_opts *o,
                      struct gr_grammar **out, struct shardlm_err *e)
{
    if (n <= 0)
        return shardlm_fail(e, -EINVAL, "choice: no strings to choose from");
    struct gr_grammar *g;
    int rc = gr_grammar_new(o, "choice", &g, e);
    if (rc)
        return rc;
    struct gr_rebuild b = {.max_nodes = 10000000, .e = e};
    struct gr_re *alt = gr_re_new(&b, GR_RE_ALT);
    rc = alt ? 0 : -ENOMEM;
    for (int i = 0; i < n && !rc; i++)
        rc = gr_re_add(&b, alt, gr_re_lit(&b, GR_ENC_UTF8, s[i], lens[i]));
    if (!rc)
        rc = one_lexeme(g, alt, e);
    gr_rebuild_free(&b);
    if (rc) {
        gr_grammar_free(g);
        return rc;
    }
    *out = g;
    return 0;
}
