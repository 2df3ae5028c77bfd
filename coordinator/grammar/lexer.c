/* SPDX-License-Identifier: MIT */
/* coordinator/grammar/lexer.c: lexemes and the lexer.
 *
 * Each lexeme's regex becomes a Thompson NFA over bytes (code points as UTF-8, or as any of their
 * encodings inside a JSON string), trimmed to the states from which its end is reachable, so a
 * non-empty set of states always has a way forward. The lexer is the DFA over sets of NFA states
 * of all lexemes, built one transition at a time as matchers ask for it: a state is a set (after
 * epsilon closure, only states with byte edges or an end), interned by its contents, and the
 * lexemes whose end it holds are the lexemes that may end there. */
#include "gr_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

static int new_state(struct gr_lexer *l)
{
    if (l->max_states && l->n_ns >= l->max_states)
        return -E2BIG;
    if (gr_grow((void **)&l->ns, &l->cap_ns, l->n_ns, 1, sizeof(*l->ns)))
        return -ENOMEM;
    l->ns[l->n_ns] = (struct gr_nstate){.lexeme = -1};
    return l->n_ns++;
}

static int add_edge(struct gr_lexer *l, int from, unsigned lo, unsigned hi, int to)
{
    struct gr_nstate *s = &l->ns[from];
    if (lo > 255)
        return 0;
    if (hi > 255)
        hi = 255;
    return GR_PUSH(s->e, s->n_e, s->cap_e, ((struct gr_nedge){(uint8_t)lo, (uint8_t)hi, to}));
}

static int add_eps(struct gr_lexer *l, int from, int to)
{
    struct gr_nstate *s = &l->ns[from];
    return GR_PUSH(s->eps, s->n_eps, s->cap_eps, to);
}

/* A position of a byte chain: up to 3 byte ranges (a hex digit: 0-9, a-f, A-F). */
struct bpos {
    int n;
    uint8_t lo[3], hi[3];
};

static int chain(struct gr_lexer *l, int from, int to, const struct bpos *pos, int k)
{
    int cur = from;
    for (int i = 0; i < k; i++) {
        int nx = i == k - 1 ? to : new_state(l);
        if (nx < 0)
            return nx;
        for (int j = 0; j < pos[i].n; j++)
            if (add_edge(l, cur, pos[i].lo[j], pos[i].hi[j], nx))
                return -ENOMEM;
        cur = nx;
    }
    return 0;
}

static struct bpos byte_range(unsigned lo, unsigned hi)
{
    return (struct bpos){1, {(uint8_t)lo}, {(uint8_t)hi}};
}

/* Code points lo..hi (no surrogates among them after the split) as UTF-8 byte chains from
 * @from to @to: split until each chain's bytes range independently (the split of Rust's
 * regex-syntax Utf8Sequences, written anew). */
static int utf8_ranges(struct gr_lexer *l, int from, int to, uint32_t lo, uint32_t hi)
{
    if (lo > hi)
        return 0;
    if (lo <= 0xDFFF && hi >= 0xD800) {
        int rc = lo < 0xD800 ? utf8_ranges(l, from, to, lo, 0xD7FF) : 0;
        return rc ? rc : hi > 0xDFFF ? utf8_ranges(l, from, to, 0xE000, hi) : 0;
    }
    static const uint32_t bound[3] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= bound[i] && hi > bound[i]) {
            int rc = utf8_ranges(l, from, to, lo, bound[i]);
            return rc ? rc : utf8_ranges(l, from, to, bound[i] + 1, hi);
        }
    if (hi <= 0x7F)
        return add_edge(l, from, lo, hi, to) ? -ENOMEM : 0;
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) {
                int rc = utf8_ranges(l, from, to, lo, lo | m);
                return rc ? rc : utf8_ranges(l, from, to, (lo | m) + 1, hi);
            }
            if ((hi & m) != m) {
                int rc = utf8_ranges(l, from, to, lo, (hi & ~m) - 1);
                return rc ? rc : utf8_ranges(l, from, to, hi & ~m, hi);
            }
        }
    }
    char a[4], b[4];
    int k = (int)coord_utf8_put(a, lo);
    coord_utf8_put(b, hi);
    struct bpos pos[4];
    for (int i = 0; i < k; i++)
        pos[i] = byte_range((uint8_t)a[i], (uint8_t)b[i]);
    return chain(l, from, to, pos, k);
}

static struct bpos hex_digits(unsigned a, unsigned b)
{
    struct bpos p = {0};
    if (a <= 9) {
        p.lo[p.n] = (uint8_t)('0' + a);
        p.hi[p.n++] = (uint8_t)('0' + (b < 9 ? b : 9));
    }
    if (b >= 10) {
        unsigned x = a > 10 ? a : 10;
        p.lo[p.n] = (uint8_t)('a' + x - 10);
        p.hi[p.n++] = (uint8_t)('a' + b - 10);
        p.lo[p.n] = (uint8_t)('A' + x - 10);
        p.hi[p.n++] = (uint8_t)('A' + b - 10);
    }
    return p;
}

/* The numbers lo..hi written as @w hex digits (either case), after the positions @pre (n_pre),
 * as chains from @from to @to. */
static int hex_ranges(struct gr_lexer *l, int from, int to, struct bpos *pre, int n_pre,
                      uint32_t lo, uint32_t hi, int w)
{
    if (!w)
        return chain(l, from, to, pre, n_pre);
    uint32_t p = 1u << (4 * (w - 1));
    uint32_t dl = lo / p, dh = hi / p, rl = lo % p, rh = hi % p;
    int rc;
    if (dl == dh) {
        pre[n_pre] = hex_digits(dl, dl);
        return hex_ranges(l, from, to, pre, n_pre + 1, rl, rh, w - 1);
    }
    if (rl) {
        pre[n_pre] = hex_digits(dl, dl);
        if ((rc = hex_ranges(l, from, to, pre, n_pre + 1, rl, p - 1, w - 1)))
            return rc;
        dl++;
    }
    bool upper = rh != p - 1;
    uint32_t top = dh;
    if (upper)
        dh--;
    if (dl <= dh) {
        pre[n_pre] = hex_digits(dl, dh);
        if ((rc = hex_ranges(l, from, to, pre, n_pre + 1, 0, p - 1, w - 1)))
            return rc;
    }
    if (upper) {
        pre[n_pre] = hex_digits(top, top);
        return hex_ranges(l, from, to, pre, n_pre + 1, 0, rh, w - 1);
    }
    return 0;
}

/* High surrogates 0xD800 + hlo..hhi followed by "\u" and low surrogates 0xDC00 + llo..lhi,
 * from @u (after the first "\u") to @to. */
static int pair(struct gr_lexer *l, int u, int to, uint32_t hlo, uint32_t hhi, uint32_t llo,
                uint32_t lhi)
{
    struct bpos pre[8];
    int mid = new_state(l), m1 = mid < 0 ? mid : new_state(l), m2 = m1 < 0 ? m1 : new_state(l);
    if (m2 < 0)
        return m2;
    int rc = hex_ranges(l, u, mid, pre, 0, 0xD800 + hlo, 0xD800 + hhi, 4);
    if (rc)
        return rc;
    if (add_edge(l, mid, '\\', '\\', m1) || add_edge(l, m1, 'u', 'u', m2))
        return -ENOMEM;
    return hex_ranges(l, m2, to, pre, 0, 0xDC00 + llo, 0xDC00 + lhi, 4);
}

/* Astral code points lo..hi as surrogate pairs, from @u (after the first "\u") to @to. */
static int surrogates(struct gr_lexer *l, int u, int to, uint32_t lo, uint32_t hi)
{
    uint32_t hl = (lo - 0x10000) >> 10, hh = (hi - 0x10000) >> 10;
    uint32_t ll = (lo - 0x10000) & 0x3FF, lh = (hi - 0x10000) & 0x3FF;
    int rc;
    if (hl == hh)
        return pair(l, u, to, hl, hl, ll, lh);
    if (ll) {
        if ((rc = pair(l, u, to, hl, hl, ll, 0x3FF)))
            return rc;
        hl++;
    }
    uint32_t top = hh;
    if (lh != 0x3FF)
        hh--;
    if (hl <= hh && (rc = pair(l, u, to, hl, hh, 0, 0x3FF)))
        return rc;
    return lh != 0x3FF ? pair(l, u, to, top, top, 0, lh) : 0;
}

/* One code point of @s in a JSON string, from @from to @to. */
static int json_chars(struct gr_lexer *l, int from, int to, const struct gr_cset *s)
{
    int rc;
    for (int i = 0; i < s->n; i++) { /* raw: not '"', '\\' nor a control character */
        uint32_t lo = s->r[i].lo < 0x20 ? 0x20 : s->r[i].lo, hi = s->r[i].hi;
        for (uint32_t c = lo; c <= hi && c < 0x80; c++)
            if (c != '"' && c != '\\' && (rc = add_edge(l, from, c, c, to)))
                return -ENOMEM;
        if (hi >= 0x80 && (rc = utf8_ranges(l, from, to, lo < 0x80 ? 0x80 : lo, hi)))
            return rc;
    }
    int bs = -1, u = -1;
    static const struct {
        uint32_t c;
        char e;
    } esc[] = {{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {8, 'b'},
               {12, 'f'},  {10, 'n'},    {13, 'r'},  {9, 't'}};
    for (size_t i = 0; i < sizeof(esc) / sizeof(esc[0]); i++) {
        if (!gr_cset_has(s, esc[i].c))
            continue;
        if (bs < 0 && ((bs = new_state(l)) < 0 || add_edge(l, from, '\\', '\\', bs)))
            return bs < 0 ? bs : -ENOMEM;
        if (add_edge(l, bs, (uint8_t)esc[i].e, (uint8_t)esc[i].e, to))
            return -ENOMEM;
    }
    for (int i = 0; i < s->n; i++) {
        uint32_t lo = s->r[i].lo, hi = s->r[i].hi;
        if (u < 0) {
            if (bs < 0 && ((bs = new_state(l)) < 0 || add_edge(l, from, '\\', '\\', bs)))
                return bs < 0 ? bs : -ENOMEM;
            if ((u = new_state(l)) < 0 || add_edge(l, bs, 'u', 'u', u))
                return u < 0 ? u : -ENOMEM;
        }
        struct bpos pre[8];
        for (int part = 0; part < 2; part++) { /* BMP less the surrogates */
            uint32_t a = part ? 0xE000 : 0, b = part ? 0xFFFF : 0xD7FF;
            uint32_t x = lo > a ? lo : a, y = hi < b ? hi : b;
            if (x <= y && (rc = hex_ranges(l, u, to, pre, 0, x, y, 4)))
                return rc;
        }
        if (hi >= 0x10000 && (rc = surrogates(l, u, to, lo > 0x10000 ? lo : 0x10000, hi)))
            return rc;
    }
    return 0;
}

static int build_bool(struct gr_lexer *l, const struct gr_re *r, int from, int to);

/* The fragment of @r from @from to @to. */
static int build(struct gr_lexer *l, const struct gr_re *r, int from, int to)
{
    int rc;
    switch (r->kind) {
    case GR_RE_NONE:
        return 0;
    case GR_RE_EMPTY:
        return add_eps(l, from, to);
    case GR_RE_SET:
        if (r->enc == GR_ENC_JSON)
            return json_chars(l, from, to, &r->set);
        for (int i = 0; i < r->set.n; i++) {
            if (r->enc == GR_ENC_BYTE)
                rc = add_edge(l, from, r->set.r[i].lo, r->set.r[i].hi, to) ? -ENOMEM : 0;
            else
                rc = utf8_ranges(l, from, to, r->set.r[i].lo, r->set.r[i].hi);
            if (rc)
                return rc;
        }
        return 0;
    case GR_RE_CAT: {
        int cur = from;
        for (int i = 0; i < r->n_sub; i++) {
            int nx = i == r->n_sub - 1 ? to : new_state(l);
            if (nx < 0)
                return nx;
            if ((rc = build(l, r->sub[i], cur, nx)))
                return rc;
            cur = nx;
        }
        return r->n_sub ? 0 : add_eps(l, from, to);
    }
    case GR_RE_ALT:
        for (int i = 0; i < r->n_sub; i++) {
            /* a fresh pair of states per branch keeps branches' epsilon edges apart */
            int a = new_state(l), b = a < 0 ? a : new_state(l);
            if (b < 0)
                return b;
            if (add_eps(l, from, a) || add_eps(l, b, to) || (rc = build(l, r->sub[i], a, b)))
                return rc ? rc : -ENOMEM;
        }
        return 0;
    case GR_RE_REP: {
        int cur = from;
        for (int i = 0; i < r->min; i++) {
            int nx = new_state(l);
            if (nx < 0)
                return nx;
            if ((rc = build(l, r->sub[0], cur, nx)))
                return rc;
            cur = nx;
        }
        if (r->max < 0) { /* cur -> loop -> cur */
            int a = new_state(l), b = a < 0 ? a : new_state(l);
            if (b < 0)
                return b;
            if (add_eps(l, cur, a) || add_eps(l, b, a) || add_eps(l, a, to) ||
                (rc = build(l, r->sub[0], a, b)))
                return rc ? rc : -ENOMEM;
            return 0;
        }
        for (int i = r->min; i < r->max; i++) { /* each optional copy may end the run */
            int nx = new_state(l);
            if (nx < 0)
                return nx;
            if (add_eps(l, cur, to) || (rc = build(l, r->sub[0], cur, nx)))
                return rc ? rc : -ENOMEM;
            cur = nx;
        }
        return add_eps(l, cur, to);
    }
    case GR_RE_BOOL:
        return build_bool(l, r, from, to);
    }
    return 0;
}

/* Drops the edges of states first..n_ns into states from which @accept cannot be reached. */
static int trim(struct gr_lexer *l, int first, int accept)
{
    int n = l->n_ns - first;
    int32_t *deg = calloc((size_t)n + 1, sizeof(int32_t));
    uint8_t *live = calloc((size_t)n, 1);
    int32_t *work = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *radj = NULL;
    int rc = -ENOMEM;
    if (!deg || !live || !work)
        goto out;
    long m = 0;
    for (int s = first; s < l->n_ns; s++) {
        for (int j = 0; j < l->ns[s].n_e; j++)
            deg[l->ns[s].e[j].to - first + 1]++, m++;
        for (int j = 0; j < l->ns[s].n_eps; j++)
            deg[l->ns[s].eps[j] - first + 1]++, m++;
    }
    for (int i = 0; i < n; i++)
        deg[i + 1] += deg[i];
    radj = malloc(sizeof(int32_t) * (size_t)(m ? m : 1));
    if (!radj)
        goto out;
    int32_t *fill = work; /* reuse as cursors */
    memcpy(fill, deg, sizeof(int32_t) * (size_t)n);
    for (int s = first; s < l->n_ns; s++) {
        for (int j = 0; j < l->ns[s].n_e; j++)
            radj[fill[l->ns[s].e[j].to - first]++] = s - first;
        for (int j = 0; j < l->ns[s].n_eps; j++)
            radj[fill[l->ns[s].eps[j] - first]++] = s - first;
    }
    int top = 0;
    work[top++] = accept - first;
    live[accept - first] = 1;
    while (top) {
        int v = work[--top];
        for (int k = deg[v]; k < deg[v + 1]; k++)
            if (!live[radj[k]]) {
                live[radj[k]] = 1;
                work[top++] = radj[k];
            }
    }
    for (int s = first; s < l->n_ns; s++) {
        struct gr_nstate *st = &l->ns[s];
        int k = 0;
        for (int j = 0; j < st->n_e; j++)
            if (live[st->e[j].to - first])
                st->e[k++] = st->e[j];
        st->n_e = k;
        k = 0;
        for (int j = 0; j < st->n_eps; j++)
            if (live[st->eps[j] - first])
                st->eps[k++] = st->eps[j];
        st->n_eps = k;
    }
    rc = 0;
out:
    free(deg);
    free(live);
    free(work);
    free(radj);
    return rc;
}

static int lx_find(struct gr_lexer *l, const char *key, size_t len, uint64_t h)
{
    if (!l->lx_mask)
        return -1;
    for (uint64_t i = h & (uint64_t)l->lx_mask;; i = (i + 1) & (uint64_t)l->lx_mask) {
        int id = l->lx_map[i];
        if (id < 0)
            return -1;
        if (l->lx[id].key_len == len && !memcmp(l->lx[id].key, key, len))
            return id;
    }
}

static int lx_index(struct gr_lexer *l, int id)
{
    if ((l->n_lx + 1) * 2 > l->lx_mask) {
        int nm = l->lx_mask ? l->lx_mask * 2 + 1 : 63;
        int32_t *map = malloc(sizeof(int32_t) * (size_t)(nm + 1));
        if (!map)
            return -ENOMEM;
        memset(map, 0xff, sizeof(int32_t) * (size_t)(nm + 1));
        for (int j = 0; j < l->n_lx; j++) {
            if (j == id)
                continue;
            uint64_t i =
                gr_hash(l->lx[j].key, l->lx[j].key_len, 0xcbf29ce484222325ull) & (uint64_t)nm;
            while (map[i] >= 0)
                i = (i + 1) & (uint64_t)nm;
            map[i] = j;
        }
        free(l->lx_map);
        l->lx_map = map;
        l->lx_mask = nm;
    }
    uint64_t i =
        gr_hash(l->lx[id].key, l->lx[id].key_len, 0xcbf29ce484222325ull) & (uint64_t)l->lx_mask;
    while (l->lx_map[i] >= 0)
        i = (i + 1) & (uint64_t)l->lx_mask;
    l->lx_map[i] = id;
    return 0;
}

int gr_lexer_add(struct gr_lexer *l, const struct gr_re *r)
{
    size_t len;
    char *key = gr_re_key(r, &len);
    if (!key)
        return -ENOMEM;
    uint64_t h = gr_hash(key, len, 0xcbf29ce484222325ull);
    int id = lx_find(l, key, len, h);
    if (id >= 0) {
        free(key);
        return id;
    }
    int first = l->n_ns;
    int s = new_state(l), a = s < 0 ? s : new_state(l);
    int rc = a < 0 ? a : build(l, r, s, a);
    if (!rc)
        rc = trim(l, first, a);
    if (!rc && gr_grow((void **)&l->lx, &l->cap_lx, l->n_lx, 1, sizeof(*l->lx)))
        rc = -ENOMEM;
    if (rc) {
        for (int i = first; i < l->n_ns; i++) {
            free(l->ns[i].e);
            free(l->ns[i].eps);
        }
        l->n_ns = first;
        free(key);
        return rc;
    }
    id = l->n_lx++;
    l->lx[id] = (struct gr_lexeme){key, len, s, a, gr_re_nullable(r)};
    l->ns[a].lexeme = id;
    if ((rc = lx_index(l, id)))
        return rc; /* the lexeme stays, unfound: a later add makes a second one */
    return id;
}

/* ---- intersection and exclusion ---- */

static int32_t bool_step_all(struct gr_lexer *l, int32_t q, int32_t *next);

/* A GR_RE_BOOL: each sub-regex a lexeme of a scratch lexer, whose DFA over sets of all their
 * states is a DFA over tuples; explored whole from the start (at most GR_BOOL_MAX_STATES), a
 * state accepting when every positive sub and no negative one accepts, dead when a positive one
 * has no state left; trimmed to the states that can still accept; then written into @l as
 * deterministic NFA states from @from to @to. */
static int build_bool(struct gr_lexer *l, const struct gr_re *r, int from, int to)
{
    struct gr_lexer x = {.max_states = l->max_states ? l->max_states : 2000000,
                         .max_dstates = GR_BOOL_MAX_STATES};
    int32_t ids[64], lo[64], hi[64];
    int rc = 0, n = r->n_sub;
    int32_t *order = NULL, *map = NULL, *next = NULL;
    uint8_t *acc = NULL, *live = NULL;
    if (n > 64)
        return -E2BIG;
    for (int i = 0; i < n; i++) {
        lo[i] = x.n_ns;
        ids[i] = gr_lexer_add(&x, r->sub[i]);
        hi[i] = x.n_ns;
        if (ids[i] < 0) {
            rc = ids[i];
            goto out;
        }
    }
    int32_t start = gr_lexer_start(&x, ids, n);
    if (start < 0) { /* nothing matches: no edge from @from */
        rc = start == GR_DEAD ? 0 : -ENOMEM;
        goto out;
    }
    order = malloc(sizeof(int32_t) * GR_BOOL_MAX_STATES);
    next = malloc(sizeof(int32_t) * 256 * (size_t)GR_BOOL_MAX_STATES);
    acc = calloc(GR_BOOL_MAX_STATES, 1);
    live = calloc(GR_BOOL_MAX_STATES, 1);
    map = malloc(sizeof(int32_t) * GR_BOOL_MAX_STATES);
    if (!order || !next || !acc || !live || !map) {
        rc = -ENOMEM;
        goto out;
    }
    /* explore: every state's successors (states are numbered as found: x's ids) */
    int n_seen = 0;
    order[n_seen++] = start;
    for (int k = 0; k < n_seen; k++) {
        int32_t q = order[k];
        if (q >= GR_BOOL_MAX_STATES || bool_step_all(&x, q, next + 256 * (size_t)q)) {
            rc = x.overflow || q >= GR_BOOL_MAX_STATES ? -E2BIG : -ENOMEM;
            goto out;
        }
        for (int b = 0; b < 256; b++) {
            int32_t t = next[256 * (size_t)q + (size_t)b];
            if (t >= 0 && !live[t]) { /* live[] marks "seen" for now */
                live[t] = 1;
                if (n_seen >= GR_BOOL_MAX_STATES) {
                    rc = -E2BIG;
                    goto out;
                }
                order[n_seen++] = t;
            }
        }
        live[q] = 1;
    }
    /* a state: dead when a positive sub has no state in it; accepting as above */
    for (int k = 0; k < n_seen; k++) {
        int32_t q = order[k];
        const struct gr_dstate *d = &x.ds[q];
        bool ok = true, has[64] = {0};
        for (int i = 0; i < d->n_set; i++)
            for (int j = 0; j < n; j++)
                if (d->set[i] >= lo[j] && d->set[i] < hi[j])
                    has[j] = true;
        for (int j = 0; j < r->n_pos; j++)
            ok &= has[j];
        live[q] = ok;
        bool a = ok;
        for (int j = 0; j < n && a; j++) {
            bool in = false;
            for (int i = 0; i < d->n_acc; i++)
                in |= d->acc[i] == ids[j];
            a = j < r->n_pos ? in : !in;
        }
        acc[q] = a;
    }
    /* trim: keep the live states from which an accepting one is reachable */
    for (bool changed = true; changed;) {
        changed = false;
        for (int k = n_seen - 1; k >= 0; k--) {
            int32_t q = order[k];
            if (!live[q] || acc[q] >= 2)
                continue;
            bool reach = acc[q] == 1;
            for (int b = 0; b < 256 && !reach; b++) {
                int32_t t = next[256 * (size_t)q + (size_t)b];
                reach = t >= 0 && live[t] && acc[t] >= 1;
            }
            if (reach) {
                acc[q] = acc[q] == 1 ? 3 : 2; /* 2: can reach, 3: accepting */
                changed = true;
            }
        }
    }
    for (int k = 0; k < n_seen; k++) {
        int32_t q = order[k];
        map[q] = -1;
        if (live[q] && acc[q] >= 2 && (map[q] = new_state(l)) < 0) {
            rc = map[q];
            goto out;
        }
    }
    if (map[start] < 0)
        goto out; /* nothing matches */
    if (add_eps(l, from, map[start])) {
        rc = -ENOMEM;
        goto out;
    }
    for (int k = 0; k < n_seen; k++) {
        int32_t q = order[k];
        if (map[q] < 0)
            continue;
        if (acc[q] == 3 && add_eps(l, map[q], to)) {
            rc = -ENOMEM;
            goto out;
        }
        for (int b = 0; b < 256;) { /* runs of bytes to one state: one edge */
            int32_t t = next[256 * (size_t)q + (size_t)b];
            int e = b;
            while (e + 1 < 256 && next[256 * (size_t)q + (size_t)e + 1] == t)
                e++;
            if (t >= 0 && map[t] >= 0 && add_edge(l, map[q], (unsigned)b, (unsigned)e, map[t])) {
                rc = -ENOMEM;
                goto out;
            }
            b = e + 1;
        }
    }
out:
    free(order);
    free(next);
    free(acc);
    free(live);
    free(map);
    gr_lexer_free(&x);
    return rc;
}

/* ---- the DFA ---- */

static int scratch(struct gr_lexer *l)
{
    if (l->cap_scratch >= l->n_ns)
        return 0;
    int n = l->n_ns * 2;
    uint32_t *mark = calloc((size_t)n, sizeof(uint32_t));
    int8_t *nk = calloc((size_t)n, 1);
    int32_t *p[2 + GR_PSETS];
    bool ok = mark && nk;
    for (int i = 0; i < 2 + GR_PSETS; i++)
        ok &= (p[i] = malloc(sizeof(int32_t) * (size_t)n)) != NULL;
    if (!ok) {
        free(mark);
        free(nk);
        for (int i = 0; i < 2 + GR_PSETS; i++)
            free(p[i]);
        return -ENOMEM;
    }
    if (l->nkeeps)
        memcpy(nk, l->nkeeps, (size_t)l->cap_scratch);
    free(l->mark);
    free(l->nkeeps);
    free(l->stack);
    free(l->buf);
    for (int i = 0; i < GR_PSETS; i++)
        free(l->pset[i]);
    l->mark = mark;
    l->nkeeps = nk;
    l->stack = p[0];
    l->buf = p[1];
    for (int i = 0; i < GR_PSETS; i++)
        l->pset[i] = p[2 + i];
    l->gen = 0;
    l->cap_scratch = n;
    return 0;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Closes the seeds l->stack[0..n) (marked with l->gen) under epsilon into l->buf: the states
 * with byte edges or an end, sorted. Returns their count. */
static int closure(struct gr_lexer *l, int n)
{
    int k = 0;
    while (n) {
        int s = l->stack[--n];
        struct gr_nstate *st = &l->ns[s];
        if (st->n_e || st->lexeme >= 0)
            l->buf[k++] = s;
        for (int j = 0; j < st->n_eps; j++) {
            int t = st->eps[j];
            if (l->mark[t] != l->gen) {
                l->mark[t] = l->gen;
                l->stack[n++] = t;
            }
        }
    }
    if (k > 16) {
        qsort(l->buf, (size_t)k, sizeof(int32_t), cmp_i32);
        return k;
    }
    for (int i = 1; i < k; i++) { /* small sets (most): an insertion sort */
        int32_t x = l->buf[i];
        int j = i;
        for (; j > 0 && l->buf[j - 1] > x; j--)
            l->buf[j] = l->buf[j - 1];
        l->buf[j] = x;
    }
    return k;
}

static void mark_gen(struct gr_lexer *l)
{
    if (++l->gen == 0) {
        memset(l->mark, 0, sizeof(uint32_t) * (size_t)l->cap_scratch);
        l->gen = 1;
    }
}

static int ds_rehash(struct gr_lexer *l)
{
    int nm = l->ds_mask ? l->ds_mask * 2 + 1 : 255;
    struct gr_dslot *map = malloc(sizeof(*map) * (size_t)(nm + 1));
    if (!map)
        return -ENOMEM;
    for (int i = 0; i <= nm; i++)
        map[i].id = -1;
    for (int j = 0; j < l->n_ds; j++) {
        uint64_t i = l->ds[j].hash & (uint64_t)nm;
        while (map[i].id >= 0)
            i = (i + 1) & (uint64_t)nm;
        map[i] = (struct gr_dslot){(uint32_t)(l->ds[j].hash >> 32), j};
    }
    free(l->ds_map);
    l->ds_map = map;
    l->ds_mask = nm;
    return 0;
}

/* The state of the set l->buf[0..k): found or made. GR_DEAD for an empty set; -ENOMEM, or
 * GR_DEAD with l->overflow past the limit. */
static int32_t intern(struct gr_lexer *l, int k)
{
    if (!k)
        return GR_DEAD;
    uint64_t h = gr_hash(l->buf, sizeof(int32_t) * (size_t)k, 0xcbf29ce484222325ull);
    uint32_t tag = (uint32_t)(h >> 32);
    if (l->ds_mask)
        for (uint64_t i = h & (uint64_t)l->ds_mask;; i = (i + 1) & (uint64_t)l->ds_mask) {
            int id = l->ds_map[i].id;
            if (id < 0)
                break;
            if (l->ds_map[i].tag == tag && l->ds[id].hash == h && l->ds[id].n_set == k &&
                !memcmp(l->ds[id].set, l->buf, sizeof(int32_t) * (size_t)k))
                return id;
        }
    if (l->max_dstates && l->n_ds >= l->max_dstates) {
        l->overflow = true;
        return GR_DEAD;
    }
    if ((l->n_ds + 1) * 2 > l->ds_mask && ds_rehash(l))
        return -ENOMEM;
    if (gr_grow((void **)&l->ds, &l->cap_ds, l->n_ds, 1, sizeof(*l->ds)))
        return -ENOMEM;
    int chunk = l->n_ds >> GR_ROW_SHIFT;
    if (chunk >= l->cap_rows) {
        int nc = l->cap_rows ? l->cap_rows * 2 : 16;
        int32_t **t = realloc(l->rows, sizeof(*t) * (size_t)nc);
        if (!t)
            return -ENOMEM;
        memset(t + l->cap_rows, 0, sizeof(*t) * (size_t)(nc - l->cap_rows));
        l->rows = t;
        l->cap_rows = nc;
    }
    if (!l->rows[chunk] &&
        !(l->rows[chunk] = malloc(sizeof(int32_t) * ((size_t)256 << GR_ROW_SHIFT))))
        return -ENOMEM;
    struct gr_dstate *d = &l->ds[l->n_ds];
    memset(d, 0, sizeof(*d));
    d->set = malloc(sizeof(int32_t) * (size_t)k);
    if (!d->set)
        return -ENOMEM;
    memcpy(d->set, l->buf, sizeof(int32_t) * (size_t)k);
    d->n_set = k;
    d->hash = h;
    int32_t *row = gr_lexer_row(l, l->n_ds);
    for (int i = 0; i < 256; i++)
        row[i] = GR_UNSET;
    d->plain = GR_UNSET;
    d->keeps = -1;
    int na = 0;
    for (int i = 0; i < k; i++)
        na += l->ns[l->buf[i]].lexeme >= 0;
    if (na) {
        d->acc = malloc(sizeof(int32_t) * (size_t)na);
        if (!d->acc) {
            free(d->set);
            return -ENOMEM;
        }
        for (int i = 0; i < k; i++)
            if (l->ns[l->buf[i]].lexeme >= 0)
                d->acc[d->n_acc++] = l->ns[l->buf[i]].lexeme;
        qsort(d->acc, (size_t)na, sizeof(int32_t), cmp_i32);
    }
    uint64_t i = h & (uint64_t)l->ds_mask;
    while (l->ds_map[i].id >= 0)
        i = (i + 1) & (uint64_t)l->ds_mask;
    l->ds_map[i] = (struct gr_dslot){tag, l->n_ds};
    return l->n_ds++;
}

int gr_lexer_start(struct gr_lexer *l, const int32_t *ids, int n)
{
    if (scratch(l))
        return -ENOMEM;
    mark_gen(l);
    int k = 0;
    for (int i = 0; i < n; i++) {
        int s = l->lx[ids[i]].start;
        if (l->mark[s] != l->gen) {
            l->mark[s] = l->gen;
            l->stack[k++] = s;
        }
    }
    return intern(l, closure(l, k));
}

int32_t gr_lexer_step_slow(struct gr_lexer *l, int32_t q, uint8_t b)
{
    if (scratch(l))
        return GR_DEAD;
    mark_gen(l);
    int k = 0;
    /* the run of bytes around @b that every edge of @q takes alike: they all go where @b goes
     * (a mask's walk meets many bytes of one state: one closure for them all) */
    int lo = 0, hi = 255;
    const struct gr_dstate *d = &l->ds[q];
    for (int i = 0; i < d->n_set; i++) {
        const struct gr_nstate *st = &l->ns[d->set[i]];
        for (int j = 0; j < st->n_e; j++) {
            const struct gr_nedge *ed = &st->e[j];
            if (b >= ed->lo && b <= ed->hi) {
                lo = ed->lo > lo ? ed->lo : lo;
                hi = ed->hi < hi ? ed->hi : hi;
                if (l->mark[ed->to] != l->gen) {
                    l->mark[ed->to] = l->gen;
                    l->stack[k++] = ed->to;
                }
            } else if (ed->hi < b)
                lo = ed->hi + 1 > lo ? ed->hi + 1 : lo;
            else
                hi = ed->lo - 1 < hi ? ed->lo - 1 : hi;
        }
    }
    int32_t t = intern(l, closure(l, k));
    if (t < GR_DEAD) { /* out of memory: dead for now, not remembered */
        l->overflow = true;
        return GR_DEAD;
    }
    if (t == GR_DEAD && l->overflow)
        return GR_DEAD;
    int32_t *row = gr_lexer_row(l, q);
    for (int c = lo; c <= hi; c++)
        row[c] = t;
    return t;
}

/* ---- plain characters (see gr_lexer_plain_next) ---- */

/* Whether every byte string of the ranges @r[0..n) read from the closed set @a (@k states,
 * sorted) comes to the closed set l->pset[0] (@kt states; 0: every one dies at its first byte).
 * Sets, not DFA states: the states a character passes through midway are not made. The closures
 * of level @d go to l->pset[d + 1]. */
static bool ranges_to(struct gr_lexer *l, const int32_t *a, int k, const uint8_t (*r)[2], int n,
                      int kt, int d)
{
    int lo = r[0][0], hi = r[0][1];
    /* the edges that take bytes of the range, and where runs of bytes they treat alike start */
    enum { MAX_EDGES = 64 };
    struct gr_nedge in[MAX_EDGES];
    int n_in = 0;
    bool cut[257] = {false};
    for (int i = 0; i < k; i++) {
        const struct gr_nstate *st = &l->ns[a[i]];
        for (int j = 0; j < st->n_e; j++) {
            const struct gr_nedge *e = &st->e[j];
            if (e->hi < lo || e->lo > hi)
                continue;
            if (n_in == MAX_EDGES)
                return false; /* not worth knowing: "not uniform" only costs speed */
            in[n_in++] = *e;
            if (e->lo > lo)
                cut[e->lo] = true;
            if (e->hi < hi)
                cut[e->hi + 1] = true;
        }
    }
    for (int b = lo; b <= hi;) {
        mark_gen(l);
        int seeds = 0;
        for (int i = 0; i < n_in; i++)
            if (b >= in[i].lo && b <= in[i].hi && l->mark[in[i].to] != l->gen) {
                l->mark[in[i].to] = l->gen;
                l->stack[seeds++] = in[i].to;
            }
        int m = closure(l, seeds);
        if (!m) {
            if (kt)
                return false; /* dies where the others live */
        } else if (!kt) {
            return false; /* lives where the others die */
        } else if (n == 1) {
            if (m != kt || memcmp(l->buf, l->pset[0], sizeof(int32_t) * (size_t)m))
                return false;
        } else {
            memcpy(l->pset[d + 1], l->buf, sizeof(int32_t) * (size_t)m);
            if (!ranges_to(l, l->pset[d + 1], m, r + 1, n - 1, kt, d + 1))
                return false;
        }
        do
            b++;
        while (b <= hi && !cut[b]);
    }
    return true;
}

/* The plain characters as UTF-8: byte ranges, one per byte of the character. */
static const struct {
    uint8_t r[4][2];
    int n;
} plain_utf8[] = {
    {{{0x20, 0x21}}, 1},
    {{{0x23, 0x5B}}, 1},
    {{{0x5D, 0x7F}}, 1},
    {{{0xC2, 0xDF}, {0x80, 0xBF}}, 2},
    {{{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}}, 3},
    {{{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}}, 3},
    {{{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}}, 3},
    {{{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}}, 3},
    {{{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}}, 4},
    {{{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}}, 4},
    {{{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}}, 4},
};

static int32_t plain_next(struct gr_lexer *l, int32_t q)
{
    if (scratch(l))
        return GR_MIXED;
    const struct gr_dstate *d = &l->ds[q];
    /* the set 'a' comes to: every other plain character must come there too */
    mark_gen(l);
    int seeds = 0;
    for (int i = 0; i < d->n_set; i++) {
        const struct gr_nstate *st = &l->ns[d->set[i]];
        for (int j = 0; j < st->n_e; j++)
            if ('a' >= st->e[j].lo && 'a' <= st->e[j].hi && l->mark[st->e[j].to] != l->gen) {
                l->mark[st->e[j].to] = l->gen;
                l->stack[seeds++] = st->e[j].to;
            }
    }
    int kt = closure(l, seeds);
    memcpy(l->pset[0], l->buf, sizeof(int32_t) * (size_t)kt);
    for (size_t i = 0; i < sizeof(plain_utf8) / sizeof(plain_utf8[0]); i++)
        if (!ranges_to(l, d->set, d->n_set, plain_utf8[i].r, plain_utf8[i].n, kt, 0))
            return GR_MIXED;
    if (!kt)
        return GR_DEAD;
    memcpy(l->buf, l->pset[0], sizeof(int32_t) * (size_t)kt);
    int32_t t = intern(l, kt);    /* (it may grow, move, l->ds) */
    return t >= 0 ? t : GR_MIXED; /* out of memory or past the limit: not known */
}

int32_t gr_lexer_plain_next(struct gr_lexer *l, int32_t q)
{
    if (l->ds[q].plain == GR_UNSET) {
        int32_t p = plain_next(l, q); /* it may grow (move) l->ds */
        l->ds[q].plain = p;
    }
    return l->ds[q].plain;
}

/* Whether NFA state @s's closure alone goes back to itself on every plain character. */
static bool nfa_keeps_plain(struct gr_lexer *l, int32_t s)
{
    mark_gen(l);
    l->mark[s] = l->gen;
    l->stack[0] = s;
    int k = closure(l, 1);
    if (!k)
        return false;
    memcpy(l->pset[0], l->buf, sizeof(int32_t) * (size_t)k);
    for (size_t i = 0; i < sizeof(plain_utf8) / sizeof(plain_utf8[0]); i++)
        if (!ranges_to(l, l->pset[0], k, plain_utf8[i].r, plain_utf8[i].n, k, 0))
            return false;
    return true;
}

bool gr_lexer_keeps_plain(struct gr_lexer *l, int32_t q)
{
    struct gr_dstate *d = &l->ds[q];
    if (d->keeps >= 0)
        return d->keeps;
    if (scratch(l))
        return false;
    bool keeps = false;
    for (int i = 0; i < d->n_set && !keeps; i++) {
        int32_t s = d->set[i];
        if (!l->nkeeps[s]) {
            /* a quick no first: 'a' taken by an edge */
            bool a = false;
            for (int j = 0; j < l->ns[s].n_e && !a; j++)
                a = 'a' >= l->ns[s].e[j].lo && 'a' <= l->ns[s].e[j].hi;
            l->nkeeps[s] = a && nfa_keeps_plain(l, s) ? 1 : 2;
        }
        keeps = l->nkeeps[s] == 1;
    }
    d->keeps = keeps;
    return keeps;
}

/* The successors of @q on every byte into @next (GR_DEAD where none), one closure per run of
 * bytes that the NFA's edges treat alike. Returns 0 or -1 (out of memory, or past the limit). */
static int32_t bool_step_all(struct gr_lexer *l, int32_t q, int32_t *next)
{
    uint8_t cut[257] = {0}; /* cut[b]: a run starts at byte b */
    cut[0] = 1;
    const struct gr_dstate *d = &l->ds[q];
    for (int i = 0; i < d->n_set; i++) {
        const struct gr_nstate *st = &l->ns[d->set[i]];
        for (int j = 0; j < st->n_e; j++) {
            cut[st->e[j].lo] = 1;
            cut[st->e[j].hi + 1] = 1;
        }
    }
    for (int b = 0; b < 256;) {
        int e = b + 1;
        while (e < 256 && !cut[e])
            e++;
        int32_t t = gr_lexer_step(l, q, (uint8_t)b);
        if (t == GR_DEAD && l->overflow)
            return -1;
        for (int k = b; k < e; k++)
            next[k] = t;
        b = e;
    }
    return 0;
}

uint8_t *gr_lexer_empty(struct gr_lexer *l)
{
    uint8_t *e = calloc((size_t)l->n_lx + 1, 1);
    for (int i = 0; e && i < l->n_lx; i++) {
        int32_t id = i, q = gr_lexer_start(l, &id, 1);
        e[i] = q == GR_DEAD;
    }
    return e;
}

void gr_lexer_free(struct gr_lexer *l)
{
    for (int i = 0; i < l->n_ns; i++) {
        free(l->ns[i].e);
        free(l->ns[i].eps);
    }
    free(l->ns);
    for (int i = 0; i < l->n_lx; i++)
        free(l->lx[i].key);
    free(l->lx);
    free(l->lx_map);
    for (int i = 0; i < l->n_ds; i++) {
        free(l->ds[i].set);
        free(l->ds[i].acc);
    }
    free(l->ds);
    for (int i = 0; i < l->cap_rows; i++)
        free(l->rows[i]);
    free(l->rows);
    free(l->ds_map);
    free(l->mark);
    free(l->stack);
    free(l->buf);
    for (int i = 0; i < GR_PSETS; i++)
        free(l->pset[i]);
    free(l->nkeeps);
    memset(l, 0, sizeof(*l));
}
