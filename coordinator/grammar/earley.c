/* SPDX-License-Identifier: MIT */
/* coordinator/grammar/earley.c: the context-free grammar over lexemes and its Earley parser.
 *
 * A row holds the items after the lexemes so far; rows form a stack, so the mask's walk pushes
 * the row after a lexeme, looks, and pops it. Nullable nonterminals are advanced over as they
 * are predicted (Aycock and Horspool's fix), so completion never has to revisit its own row. */
#include "gr_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int gr_cfg_nt(struct gr_cfg *g)
{
    if (g->n_nt >= (1 << 24) - 1)
        return -E2BIG;
    return g->n_nt++;
}

int gr_cfg_rule(struct gr_cfg *g, int lhs, const int32_t *sym, int n)
{
    if ((g->max_rules && g->n_rules >= g->max_rules) || g->n_rules >= (1 << 23) - 1 ||
        n >= (1 << 15))
        return -E2BIG;
    if (gr_grow((void **)&g->rules, &g->cap_rules, g->n_rules, 1, sizeof(*g->rules)) ||
        gr_grow((void **)&g->rhs, &g->cap_rhs, g->n_rhs, n, sizeof(*g->rhs)))
        return -ENOMEM;
    g->rules[g->n_rules++] = (struct gr_rule){lhs, g->n_rhs, n};
    if (n)
        memcpy(g->rhs + g->n_rhs, sym, sizeof(int32_t) * (size_t)n);
    g->n_rhs += n;
    return 0;
}

int gr_cfg_finish(struct gr_cfg *g, int start, const uint8_t *lex_empty)
{
    int s = gr_cfg_nt(g);
    if (s < 0)
        return s;
    int32_t sym = ~start;
    int rc = gr_cfg_rule(g, s, &sym, 1);
    if (rc)
        return rc;
    g->start_rule = g->n_rules - 1;
    g->nullable = calloc((size_t)g->n_nt, 1);
    g->nt_off = calloc((size_t)g->n_nt + 1, sizeof(int32_t));
    g->nt_rules = malloc(sizeof(int32_t) * (size_t)g->n_rules);
    uint8_t *prod = calloc((size_t)g->n_nt, 1), *rule_ok = calloc((size_t)g->n_rules, 1);
    if (!g->nullable || !g->nt_off || !g->nt_rules || !prod || !rule_ok) {
        free(prod);
        free(rule_ok);
        return -ENOMEM;
    }
    /* productive: a rule whose symbols are lexemes that match something and productive
     * nonterminals; the others are dropped, so no prediction leads where nothing completes */
    for (bool changed = true; changed;) {
        changed = false;
        for (int r = 0; r < g->n_rules; r++) {
            const struct gr_rule *ru = &g->rules[r];
            if (rule_ok[r])
                continue;
            bool all = true;
            for (int k = 0; k < ru->len && all; k++) {
                int32_t y = g->rhs[ru->off + k];
                all = y < 0 ? prod[~y] : !lex_empty[y];
            }
            if (all) {
                rule_ok[r] = 1;
                if (!prod[ru->lhs])
                    changed = true;
                prod[ru->lhs] = 1;
            }
        }
    }
    rc = prod[s] ? 0 : -ENOENT;
    for (int r = 0; r < g->n_rules; r++)
        if (rule_ok[r])
            g->nt_off[g->rules[r].lhs + 1]++;
    for (int i = 0; i < g->n_nt; i++)
        g->nt_off[i + 1] += g->nt_off[i];
    int32_t *fill = malloc(sizeof(int32_t) * (size_t)g->n_nt + 1);
    if (!fill) {
        free(prod);
        free(rule_ok);
        return -ENOMEM;
    }
    memcpy(fill, g->nt_off, sizeof(int32_t) * (size_t)g->n_nt);
    for (int r = 0; r < g->n_rules; r++)
        if (rule_ok[r])
            g->nt_rules[fill[g->rules[r].lhs]++] = r;
    free(fill);
    for (bool changed = true; changed;) {
        changed = false;
        for (int r = 0; r < g->n_rules; r++) {
            const struct gr_rule *ru = &g->rules[r];
            if (g->nullable[ru->lhs] || !rule_ok[r])
                continue;
            bool all = true;
            for (int k = 0; k < ru->len && all; k++) {
                int32_t y = g->rhs[ru->off + k];
                all = y < 0 && g->nullable[~y];
            }
            if (all) {
                g->nullable[ru->lhs] = 1;
                changed = true;
            }
        }
    }
    free(prod);
    free(rule_ok);
    return rc;
}

void gr_cfg_free(struct gr_cfg *g)
{
    free(g->rules);
    free(g->rhs);
    free(g->nullable);
    free(g->nt_off);
    free(g->nt_rules);
    memset(g, 0, sizeof(*g));
}

/* ---- parser ---- */

static uint64_t item_key(struct gr_item it)
{
    return (uint64_t)(uint32_t)it.rule << 40 | (uint64_t)(uint16_t)it.dot << 24 |
           (uint64_t)(uint32_t)it.origin;
}

/* Adds @k to the set of what the row being built has seen (its items, and the completions it
 * has made): 1 when new, 0 when there, -ENOMEM. Growing keeps only the items' keys: a
 * completion forgotten is made again, to the same items. */
static int seen_add(struct gr_parser *p, uint64_t k)
{
    if ((p->n_seen + 1) * 2 > p->seen_mask) {
        int nm = p->seen_mask ? p->seen_mask * 2 + 1 : 255;
        while ((p->n_items - p->rows[p->n_rows].beg + 1) * 2 > nm)
            nm = nm * 2 + 1;
        uint64_t *seen = malloc(sizeof(uint64_t) * (size_t)(nm + 1));
        uint32_t *sg = calloc((size_t)nm + 1, sizeof(uint32_t));
        if (!seen || !sg) {
            free(seen);
            free(sg);
            return -ENOMEM;
        }
        free(p->seen);
        free(p->seen_gen);
        p->seen = seen;
        p->seen_gen = sg;
        p->seen_mask = nm;
        p->gen = 1;
        p->n_seen = 0;
        for (int i = p->rows[p->n_rows].beg; i < p->n_items; i++) {
            uint64_t ik = item_key(p->items[i]);
            uint64_t h = (ik * 0x9E3779B97F4A7C15ull) >> 20;
            while (p->seen_gen[h & (uint64_t)nm] == p->gen)
                h++;
            p->seen[h & (uint64_t)nm] = ik;
            p->seen_gen[h & (uint64_t)nm] = p->gen;
            p->n_seen++;
        }
    }
    for (uint64_t h = (k * 0x9E3779B97F4A7C15ull) >> 20;; h++) {
        uint64_t i = h & (uint64_t)p->seen_mask;
        if (p->seen_gen[i] != p->gen) {
            p->seen[i] = k;
            p->seen_gen[i] = p->gen;
            p->n_seen++;
            return 1;
        }
        if (p->seen[i] == k)
            return 0;
    }
}

/* Adds @it to the row being built unless it is there. Returns 0 or -ENOMEM / -E2BIG. */
static int add_item(struct gr_parser *p, struct gr_item it)
{
    int in_row = p->n_items - p->rows[p->n_rows].beg;
    if (p->max_items && in_row >= p->max_items)
        return -E2BIG;
    int rc = seen_add(p, item_key(it));
    if (rc <= 0)
        return rc;
    if (gr_grow((void **)&p->items, &p->cap_items, p->n_items, 1, sizeof(*p->items)))
        return -ENOMEM;
    p->items[p->n_items++] = it;
    return 0;
}

static void new_gen(struct gr_parser *p)
{
    p->n_seen = 0;
    if (++p->gen == 0) {
        if (p->seen_gen)
            memset(p->seen_gen, 0, sizeof(uint32_t) * ((size_t)p->seen_mask + 1));
        p->gen = 1;
    }
}

/* A row's index of more entries than this is sorted (completions search it); smaller ones are
 * read through. */
#define GR_IX_SORTED 24

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The lexer start state for the sorted lexemes @ids (n), cached by the set. */
static int32_t start_state(struct gr_grammar *g, const int32_t *ids, int n)
{
    if (!n)
        return GR_DEAD;
    uint64_t h = gr_hash(ids, sizeof(int32_t) * (size_t)n, 0x84222325cbf29ce4ull);
    if (g->startc_mask)
        for (uint64_t i = h & (uint64_t)g->startc_mask;; i = (i + 1) & (uint64_t)g->startc_mask) {
            struct gr_startc *c = &g->startc[i];
            if (!c->ids)
                break;
            if (c->hash == h && c->n == n && !memcmp(c->ids, ids, sizeof(int32_t) * (size_t)n))
                return c->state;
        }
    int32_t st = gr_lexer_start(&g->lex, ids, n);
    if (st < 0)
        return st == GR_DEAD ? GR_DEAD : -ENOMEM;
    if ((g->n_startc + 1) * 2 > g->startc_mask) {
        int nm = g->startc_mask ? g->startc_mask * 2 + 1 : 63;
        struct gr_startc *t = calloc((size_t)nm + 1, sizeof(*t));
        if (!t)
            return st; /* uncached */
        for (int j = 0; j <= g->startc_mask && g->startc; j++) {
            if (!g->startc[j].ids)
                continue;
            uint64_t i = g->startc[j].hash & (uint64_t)nm;
            while (t[i].ids)
                i = (i + 1) & (uint64_t)nm;
            t[i] = g->startc[j];
        }
        free(g->startc);
        g->startc = t;
        g->startc_mask = nm;
    }
    int32_t *copy = malloc(sizeof(int32_t) * (size_t)n);
    if (!copy)
        return st;
    memcpy(copy, ids, sizeof(int32_t) * (size_t)n);
    uint64_t i = h & (uint64_t)g->startc_mask;
    while (g->startc[i].ids)
        i = (i + 1) & (uint64_t)g->startc_mask;
    g->startc[i] = (struct gr_startc){h, copy, n, st};
    g->n_startc++;
    return st;
}

/* Completes the row being built (its first items are in place): predictions, completions, then
 * its allowed lexemes and whether it accepts. Returns 0 or -errno. */
static int close_row(struct gr_parser *p, struct gr_grammar *g)
{
    const struct gr_cfg *c = &g->cfg;
    int r = p->n_rows;
    int rc;
    for (int i = p->rows[r].beg; i < p->n_items; i++) {
        struct gr_item it = p->items[i];
        const struct gr_rule *ru = &c->rules[it.rule];
        if (it.dot == ru->len) {
            int32_t want = ~ru->lhs;
            if (it.origin == r)
                continue; /* nullable: advanced over when predicted */
            /* the same (lhs, origin) completed by another rule adds the same items */
            rc = seen_add(p, 1ull << 63 | (uint64_t)(uint32_t)ru->lhs << 24 | (uint32_t)it.origin);
            if (rc <= 0) {
                if (rc < 0)
                    return rc;
                continue;
            }
            /* the origin row's items waiting for the lhs: a binary search in its index */
            const struct gr_row *o = &p->rows[it.origin];
            uint64_t key = (uint64_t)(uint32_t)~want << 32;
            int lo = o->ix_beg, hi = o->ix_end;
            if (hi - lo <= GR_IX_SORTED) { /* small: unsorted, read through */
                for (int j = lo; j < hi; j++) {
                    if (p->ix[j] >> 32 != (uint32_t)~want)
                        continue;
                    struct gr_item jt = p->items[(uint32_t)p->ix[j]];
                    if ((rc = add_item(
                             p, (struct gr_item){jt.rule, (int16_t)(jt.dot + 1), jt.origin})))
                        return rc;
                }
                continue;
            }
            while (lo < hi) {
                int mid = (lo + hi) / 2;
                if (p->ix[mid] < key)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            for (int j = lo; j < o->ix_end && p->ix[j] >> 32 == (uint32_t)~want; j++) {
                struct gr_item jt = p->items[(uint32_t)p->ix[j]];
                if ((rc = add_item(p, (struct gr_item){jt.rule, (int16_t)(jt.dot + 1), jt.origin})))
                    return rc;
            }
            continue;
        }
        int32_t y = c->rhs[ru->off + it.dot];
        if (y >= 0)
            continue;
        int nt = ~y;
        for (int k = c->nt_off[nt]; k < c->nt_off[nt + 1]; k++)
            if ((rc = add_item(p, (struct gr_item){c->nt_rules[k], 0, r})))
                return rc;
        if (c->nullable[nt] &&
            (rc = add_item(p, (struct gr_item){it.rule, (int16_t)(it.dot + 1), it.origin})))
            return rc;
    }
    struct gr_row *row = &p->rows[r];
    row->end = p->n_items;
    /* its index for later completions: the items waiting for a nonterminal, by nonterminal */
    row->ix_beg = p->n_ix;
    for (int i = row->beg; i < row->end; i++) {
        struct gr_item it = p->items[i];
        const struct gr_rule *ru = &c->rules[it.rule];
        if (it.dot >= ru->len || c->rhs[ru->off + it.dot] >= 0)
            continue;
        if (gr_grow((void **)&p->ix, &p->cap_ix, p->n_ix, 1, sizeof(*p->ix)))
            return -ENOMEM;
        p->ix[p->n_ix++] = (uint64_t)(uint32_t)~c->rhs[ru->off + it.dot] << 32 | (uint32_t)i;
    }
    row->ix_end = p->n_ix;
    if (row->ix_end - row->ix_beg > GR_IX_SORTED)
        qsort(p->ix + row->ix_beg, (size_t)(row->ix_end - row->ix_beg), sizeof(uint64_t), cmp_u64);
    row->accepting = false;
    int n_lex = 0;
    for (int i = row->beg; i < row->end; i++) {
        struct gr_item it = p->items[i];
        const struct gr_rule *ru = &c->rules[it.rule];
        if (it.rule == c->start_rule && it.dot == 1 && it.origin == 0)
            row->accepting = true;
        if (it.dot < ru->len && c->rhs[ru->off + it.dot] >= 0) {
            if (gr_grow((void **)&p->lex_buf, &p->cap_lex, n_lex, 1, sizeof(int32_t)))
                return -ENOMEM;
            p->lex_buf[n_lex++] = c->rhs[ru->off + it.dot];
        }
    }
    if (n_lex)
        qsort(p->lex_buf, (size_t)n_lex, sizeof(int32_t), cmp_i32);
    int u = 0;
    for (int i = 0; i < n_lex; i++)
        if (!u || p->lex_buf[u - 1] != p->lex_buf[i])
            p->lex_buf[u++] = p->lex_buf[i];
    int32_t st = start_state(g, p->lex_buf, u);
    if (st < GR_DEAD)
        return st;
    row->lex_start = st;
    p->n_rows++;
    return 0;
}

static int open_row(struct gr_parser *p)
{
    if (p->n_rows >= (1 << 24) - 1)
        return -E2BIG;
    if (gr_grow((void **)&p->rows, &p->cap_rows, p->n_rows, 1, sizeof(*p->rows)))
        return -ENOMEM;
    p->rows[p->n_rows] = (struct gr_row){.beg = p->n_items, .ix_beg = p->n_ix, .ix_end = p->n_ix};
    new_gen(p);
    return 0;
}

int gr_parser_init(struct gr_parser *p, struct gr_grammar *g, struct shardlm_err *e)
{
    memset(p, 0, sizeof(*p));
    p->max_items = 1 << 20;
    int rc = open_row(p);
    if (!rc)
        rc = add_item(p, (struct gr_item){g->cfg.start_rule, 0, 0});
    if (!rc)
        rc = close_row(p, g);
    if (rc) {
        gr_parser_free(p);
        return shardlm_fail(e, rc, "grammar: the first row cannot be built (%s)",
                            rc == -E2BIG ? "too many items" : "out of memory");
    }
    return 0;
}

int gr_parser_push(struct gr_parser *p, struct gr_grammar *g, const int32_t *acc, int n)
{
    const struct gr_cfg *c = &g->cfg;
    const struct gr_row *top = &p->rows[p->n_rows - 1];
    int beg = top->beg, end = top->end;
    int rc = open_row(p);
    if (rc)
        return rc;
    for (int i = beg; i < end; i++) {
        struct gr_item it = p->items[i];
        const struct gr_rule *ru = &c->rules[it.rule];
        if (it.dot >= ru->len)
            continue;
        int32_t y = c->rhs[ru->off + it.dot];
        if (y < 0)
            continue;
        bool hit = false;
        for (int k = 0; k < n && !hit; k++)
            hit = acc[k] == y;
        if (hit && (rc = add_item(p, (struct gr_item){it.rule, (int16_t)(it.dot + 1), it.origin})))
            goto fail;
    }
    if (p->n_items == p->rows[p->n_rows].beg)
        return 0;
    if ((rc = close_row(p, g)))
        goto fail;
    return 1;
fail:
    p->n_items = p->rows[p->n_rows].beg;
    p->n_ix = p->rows[p->n_rows].ix_beg;
    return rc;
}

void gr_parser_free(struct gr_parser *p)
{
    free(p->items);
    free(p->ix);
    free(p->rows);
    free(p->seen);
    free(p->seen_gen);
    free(p->lex_buf);
    memset(p, 0, sizeof(*p));
}
