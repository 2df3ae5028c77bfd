/* SPDX-License-Identifier: MIT */
/* kernels/kn_quant.c: quantizers from f32 rows into the canonical layouts described in kn.h.
 *
 * Both int4 schemes give each group the parameters of least (importance-weighted) squared
 * reconstruction error among all the layout can store, the scale rounded to fp16 as it is
 * stored: an exact search over every fp16 scale (and, asymmetric, every zero point), made
 * short by lower bounds on the error (see "the search of one group's scale" below).
 *  - W4A8 (symmetric, codes -8..7 around 8): the scale's sign is free, so the side of the group
 *    with the larger values can get the 8th level.
 *  - W4A16 (asymmetric, integer zero point 0..15).
 * Rows are independent: a matrix is split by rows over the members of the parallel for its
 * caller hands in (the worker's pool), and the result does not depend on how.
 */
#include "kn.h"

#include <math.h>
#include <string.h>

static void put_nibble(uint8_t *row, int i, int code)
{
    if (i % 2)
        row[i / 2] = (uint8_t)((row[i / 2] & 0x0f) | (code << 4));
    else
        row[i / 2] = (uint8_t)((row[i / 2] & 0xf0) | code);
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ---- the search of one group's scale ----
 *
 * Fold each element's sign into the range of its codes: with zero point z the codes reach z
 * levels below zero and 15 - z above, so element i of magnitude r_i = |w_i| gets the level
 * q_i(u) = min(cap_i, rint(r_i / u)) at scale u > 0, cap_i = z for a negative element and
 * 15 - z for a positive one (a negative symmetric scale is z = 7 on the same magnitudes:
 * sym_search). With the importance m_i,
 *     E(u) = a - 2 u b(u) + u^2 c(u),  a = sum m_i r_i^2, b = sum m_i r_i q_i, c = sum m_i q_i^2,
 * and b, c change only at the "events" u = r_i / (k + 1/2), where element i's level goes from
 * k to k + 1 as u falls. The stored scale is fp16, and the fp16 bit patterns are monotone in
 * the value: one pass down the fp16 values of a range adds each event to the cell between two
 * of them it falls in and evaluates E exactly at every fp16 scale there (sweep). Over the whole
 * window below, that is the exhaustive search over the stored scales.
 *
 * What keeps it short is bounding E from below, so that most of the window is never swept:
 *  - the window, from the best error e found so far: below u_lo a single element is clipped
 *    so far that its error alone reaches e, above u_hi the elements rounded to zero add up to
 *    e. A start at the smallest scale that clips nothing, and one least-squares step from it,
 *    give the first e.
 *  - ranges of MACRO fp16 values from both ends of the window: the sum of each element's
 *    least error anywhere in the range (grp_range_bound, in SIMD); where E is far above e it
 *    stops early, and the window shrinks to the first ranges that can beat e.
 *  - coarse cells of CELL fp16 values in what is left: only the events are added up into the
 *    cells, which bounds E in each: the elements without an event in the cell keep their
 *    codes (one quadratic in u), the others get their least error anywhere in it.
 *  - caps next to a searched neighbour's (the other sign, or the next zero point) differ only
 *    in the largest elements (shift_bound).
 * Only the cells whose bound is below e are swept value by value, the lowest bound first. On
 * normal weights (n = 128, both signs) that is about 130 events and 350 fp16 values: 11 us a
 * group on the 2-core Zen 4 VM, where the grid search before (201 scales, each refitted) took
 * 70 us. On stories260K the least error moved w4a16 g64's mean KLD from 0.0728 to 0.0706; for
 * w4a8 g128 it left 0.0844 as it was, and the free sign took it to 0.0716.
 */

static inline float minf(float a, float b) { return a < b ? a : b; }
static inline float maxf(float a, float b) { return a > b ? a : b; }

/* Positive fp16 values by bit pattern h (1 .. 0x7bff): the value, and the pattern of the
 * largest value <= u (u >= 0 finite; 0x7bff above the largest half). */
static inline float f16_val(uint32_t h)
{
    union {
        uint32_t u;
        float f;
    } v = {.u = (h + (112u << 10)) << 13};
    return h < 0x400u ? (float)h * 0x1p-24f : v.f;
}

static inline uint32_t f16_floor(float u)
{
    union {
        float f;
        uint32_t u;
    } v = {.f = u};
    if (u < 0x1p-14f)
        return (uint32_t)(u * 0x1p24f); /* subnormal halves: steps of 2^-24 */
    uint32_t h = (v.u >> 13) - (112u << 10);
    return h > 0x7bffu ? 0x7bffu : h;
}

static float f16_round(float s) { return kn_f16_to_f32(kn_f32_to_f16(minf(s, 65504.0f))); }

/* Four lanes of GCC's generic vectors (SSE2 on x86-64, which every such CPU has): GCC does not
 * vectorise the search's loops by itself (float reductions, selects). */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

static inline v4f v4_set(float x) { return (v4f){x, x, x, x}; }
static inline v4f v4_load(const float *p)
{
    v4f v;
    memcpy(&v, p, sizeof(v));
    return v;
}
static inline v4f v4_sel(v4i m, v4f a, v4f b) { return (v4f)((m & (v4i)a) | (~m & (v4i)b)); }
static inline v4f v4_min(v4f a, v4f b) { return v4_sel(a < b, a, b); }
static inline v4f v4_max(v4f a, v4f b) { return v4_sel(a > b, a, b); }
/* rintf in the default rounding mode (to nearest even) for |x| <= 2^22, as lrintf rounds the
 * codes, without SSE4.1's roundps (and only without -ffast-math, which would fold it away) */
static inline v4f v4_rint(v4f x) { return (x + v4_set(0x1.8p23f)) - v4_set(0x1.8p23f); }
static inline v4f v4_trunc(v4f x)
{
    return __builtin_convertvector(__builtin_convertvector(x, v4i), v4f);
}
static inline float v4_sum(v4f x) { return (x[0] + x[1]) + (x[2] + x[3]); }

/* The elements of a group on one side of zero that count (r > 0, m > 0), padded with zeros
 * (no error at any scale) to a multiple of 16 for the vector loops. */
struct side {
    float r[KN_MAX_GROUP + 16], m[KN_MAX_GROUP + 16];
    int n;
    float rmax;
    double a; /* sum m r^2: its error when its codes are 0 (cap 0, or a large scale) */
};

struct grp {
    struct side neg, pos;
    double a;   /* neg.a + pos.a */
    float rmax; /* of both sides */
    /* sum m r^2 by magnitude, 1/8 octave per bucket below rmax (the bits of a float above its
     * 20th: exponent and 3 mantissa bits); the last bucket takes everything smaller */
    double zeros[64];
    uint32_t kmax; /* that key of rmax */
};

static inline uint32_t mag_key(float f)
{
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    return v.u >> 20;
}

static void side_add(struct side *sd, float r, float m)
{
    sd->r[sd->n] = r;
    sd->m[sd->n++] = m;
    sd->rmax = maxf(sd->rmax, r);
    sd->a += (double)m * r * r;
}

static void side_pad(struct side *sd)
{
    for (int i = sd->n; i % 16; i++)
        sd->r[i] = sd->m[i] = 0.0f;
}

/* The elements of @w that count under @imp (NULL: all, weight 1). Returns false when none
 * does (all zero, or no weight where w is not). */
static bool grp_init(struct grp *g, const float *w, const float *imp, int n)
{
    g->neg.n = g->pos.n = 0;
    g->neg.rmax = g->pos.rmax = 0.0f;
    g->neg.a = g->pos.a = 0.0;
    for (int i = 0; i < n; i++) {
        float m = imp ? imp[i] : 1.0f;
        if (w[i] != 0.0f && m > 0.0f)
            side_add(w[i] < 0.0f ? &g->neg : &g->pos, fabsf(w[i]), m);
    }
    side_pad(&g->neg);
    side_pad(&g->pos);
    g->a = g->neg.a + g->pos.a;
    g->rmax = maxf(g->neg.rmax, g->pos.rmax);
    if (!(g->a > 0.0))
        return false;
    memset(g->zeros, 0, sizeof(g->zeros));
    g->kmax = mag_key(g->rmax);
    for (int s = 0; s < 2; s++) {
        const struct side *sd = s ? &g->pos : &g->neg;
        for (int i = 0; i < sd->n; i++) {
            uint32_t j = g->kmax - mag_key(sd->r[i]);
            g->zeros[j < 63 ? j : 63] += (double)sd->m[i] * sd->r[i] * sd->r[i];
        }
    }
    return true;
}

/* The levels of one side's elements at inverse scale @inv, at most @cap, into @q (floats). */
static void side_levels(const struct side *sd, float cap, float inv, float *q)
{
    for (int i = 0; i < sd->n; i += 4) {
        v4f x = v4_rint(v4_min(v4_load(sd->r + i) * v4_set(inv), v4_set(cap)));
        memcpy(q + i, &x, sizeof(x));
    }
}

/* Adds b and c of one side's levels @q to (*b, *c); each term is exact in double. */
static void side_bc(const struct side *sd, const float *q, double *b, double *c)
{
    double b0 = 0.0, b1 = 0.0, c0 = 0.0, c1 = 0.0;
    for (int i = 0; i < sd->n; i += 2) {
        double m0 = (double)sd->m[i] * q[i], m1 = (double)sd->m[i + 1] * q[i + 1];
        b0 += m0 * sd->r[i];
        b1 += m1 * sd->r[i + 1];
        c0 += m0 * q[i];
        c1 += m1 * q[i + 1];
    }
    *b += b0 + b1;
    *c += c0 + c1;
}

/* A scale magnitude with its caps (cn below zero, cp above) and error. */
struct cand {
    double e;
    float u;
    int cn, cp;
};

/* E(u) for caps (cn, cp), and the least-squares scale of the codes it gives in *refit. */
static double grp_err(const struct grp *g, float u, int cn, int cp, float *refit)
{
    float q[KN_MAX_GROUP + 16];
    double b = 0.0, c = 0.0;
    side_levels(&g->neg, (float)cn, 1.0f / u, q);
    side_bc(&g->neg, q, &b, &c);
    side_levels(&g->pos, (float)cp, 1.0f / u, q);
    side_bc(&g->pos, q, &b, &c);
    if (refit)
        *refit = c > 0.0 ? (float)(b / c) : u;
    return g->a - (double)u * (2.0 * b - (double)u * c);
}

/* Scale @u (rounded to fp16) and one least-squares step from it (the scale that fits u's own
 * codes best), into @best if they beat it. */
static void cand_try(const struct grp *g, float u, int cn, int cp, struct cand *best)
{
    float refit, u1 = f16_round(u);
    if (!(u1 > 0.0f))
        return;
    double e = grp_err(g, u1, cn, cp, &refit);
    if (e < best->e)
        *best = (struct cand){e, u1, cn, cp};
    float u2 = f16_round(refit);
    if (u2 > 0.0f && u2 != u1 && (e = grp_err(g, u2, cn, cp, NULL)) < best->e)
        *best = (struct cand){e, u2, cn, cp};
}

/* ---- bounds ---- */

/* The largest scale that can beat error @e: above it, the elements that round to zero add up
 * to e (from the magnitude buckets of grp_init; a bucket boundary, so up to 1/8 octave above
 * the exact bound). */
static float grp_zero_bound(const struct grp *g, double e)
{
    double sum = 0.0;
    for (uint32_t j = 63; j >= 1; j--) {
        sum += g->zeros[j];
        /* every element so far is below the smallest float of the next bucket up */
        if (sum >= e && g->kmax + 1 >= j) {
            union {
                uint32_t u;
                float f;
            } v = {.u = (g->kmax - j + 1) << 20};
            return 2.0f * v.f;
        }
    }
    return 2.0f * g->rmax; /* above it every code is 0: error a */
}

/* The smallest scale that can beat error @e at levels up to @cap on side @sd: below it one
 * element's clipping error m (r - cap u)^2 reaches e. */
static float side_clip_bound(const struct side *sd, int cap, double e)
{
    if (cap == 0)
        return 0.0f;
    float ef = (float)e, lo = 0.0f;
    for (int i = 0; i < sd->n; i++)
        lo = maxf(lo, sd->r[i] - sqrtf(ef / sd->m[i]));
    return lo / (float)cap * (1.0f - 0x1p-20f); /* a margin for the float rounding */
}

/* A lower bound of E over the scales [ua, ub] with caps (cn, cp): the sum of each element's
 * least error anywhere in the range (the distance from r to the nearest of q * [ua, ub]);
 * stops once it reaches @limit. */
static double grp_range_bound(const struct grp *g, int cn, int cp, float ua, float ub, double limit)
{
    double lb = 0.0;
    v4f inv = v4_set(1.0f / ub), va = v4_set(ua), vb = v4_set(ub), one = v4_set(1.0f);
    for (int s = 0; s < 2; s++) {
        const struct side *sd = s ? &g->pos : &g->neg;
        v4f cap = v4_set((float)(s ? cp : cn));
        for (int i0 = 0; i0 < sd->n; i0 += 16) {
            v4f acc = v4_set(0.0f);
            for (int i = i0; i < i0 + 16; i += 4) {
                v4f r = v4_load(sd->r + i);
                /* q ub <= r: level q is closest at ub, level q + 1 (if any) at ua */
                v4f q = v4_trunc(v4_min(r * inv, cap));
                v4f d = r - q * vb, up = v4_max((q + one) * va - r, v4_set(0.0f));
                d = v4_sel(q < cap, v4_min(d, up), d);
                acc += v4_load(sd->m + i) * d * d;
            }
            lb += v4_sum(acc);
            if (lb >= limit)
                return lb;
        }
    }
    return lb;
}

/* Caps next to a searched neighbour's: one level moved from one side of zero to the other (the
 * two signs of a symmetric scale, or zero points z and z +- 1). Only the elements beyond the
 * moved level change their error, so
 *     E(u) = E_nb(u) + sum_lose m u (2r - (2c + 1) u)_+ - sum_gain m u (2r - (2c - 1) u)_+
 * (c the side's new cap), and E_nb(u) >= e, the best error once the neighbour was searched:
 * where the gains do not outweigh the losses, these caps cannot beat e. The terms are of the
 * few largest elements; a loser left out only weakens the bound, a gainer must be in. */
#define SHIFT_MAX 32
struct shift {
    int n; /* -1: too many gainers, no bound */
    double e;
    float r[SHIFT_MAX], m[SHIFT_MAX], kappa[SHIFT_MAX];
    bool gain[SHIFT_MAX];
};

static void shift_add(struct shift *sh, const struct side *sd, int cap, bool gain, float u_bot)
{
    float kappa = (float)(gain ? 2 * cap - 1 : 2 * cap + 1);
    for (int i = 0; i < sd->n && sh->n >= 0; i++) {
        if (2.0f * sd->r[i] <= kappa * u_bot)
            continue; /* no change anywhere above u_bot */
        if (sh->n == SHIFT_MAX) {
            sh->n = gain ? -1 : sh->n;
            return;
        }
        sh->r[sh->n] = sd->r[i];
        sh->m[sh->n] = sd->m[i];
        sh->kappa[sh->n] = kappa;
        sh->gain[sh->n++] = gain;
    }
}

/* The bound of caps (cn, cp) over the scales from @u_bot up, from the neighbour whose negative
 * cap is @cn0, searched with best error @e then. Returns false when it cannot be used. */
static bool shift_init(struct shift *sh, const struct grp *g, int cn, int cp, int cn0, double e,
                       float u_bot)
{
    bool neg_gains = cn > cn0;
    sh->n = 0;
    sh->e = e;
    shift_add(sh, neg_gains ? &g->neg : &g->pos, neg_gains ? cn : cp, true, u_bot);
    shift_add(sh, neg_gains ? &g->pos : &g->neg, neg_gains ? cp : cn, false, u_bot);
    return sh->n >= 0;
}

static inline float shift_term(const struct shift *sh, int i, float u)
{
    return sh->m[i] * u * maxf(0.0f, 2.0f * sh->r[i] - sh->kappa[i] * u);
}

/* A lower bound of E over the scales [ua, ub]: a loss is least at an end of the range (it is
 * concave in u), a gain largest at its vertex r / kappa. */
static double shift_bound(const struct shift *sh, float ua, float ub)
{
    double lb = sh->e;
    for (int i = 0; i < sh->n; i++) {
        if (sh->gain[i]) {
            float v = sh->r[i] / sh->kappa[i];
            lb -= shift_term(sh, i, v < ua ? ua : v > ub ? ub : v);
        } else {
            lb += minf(shift_term(sh, i, ua), shift_term(sh, i, ub));
        }
    }
    return lb;
}

/* fp16 values of a range of the window's ends */
#define MACRO 64

/* Whether E can be below @e on [b, t] by both bounds. */
static bool range_open(const struct grp *g, int cn, int cp, const struct shift *sh, double e,
                       uint32_t b, uint32_t t)
{
    float ua = f16_val(b), ub = f16_val(t);
    return (!sh || shift_bound(sh, ua, ub) < e) && grp_range_bound(g, cn, cp, ua, ub, e) < e;
}

/* Narrows [*bot, *top] from both ends to the first range of MACRO values where E can be below
 * @e: cheap where E is far above e (the bound stops early, and ranges 4x as wide go first);
 * what lies between is left to the coarse cells, which cost less than a full bound per range.
 * Returns false if no range can. */
static bool narrow(const struct grp *g, int cn, int cp, const struct shift *sh, double e,
                   uint32_t *bot, uint32_t *top)
{
    uint32_t t = *top, b, step = 4 * MACRO;
    for (;;) {
        b = t - *bot >= step ? t - step + 1 : *bot;
        if (range_open(g, cn, cp, sh, e, b, t)) {
            if (step == MACRO)
                break;
            step = MACRO; /* somewhere in it: the first narrow range that can */
        } else if (b == *bot) {
            return false;
        } else {
            t = b - 1;
        }
    }
    *top = t;
    b = *bot;
    for (step = 4 * MACRO;;) {
        bool fits = b + step <= t + 1;
        if (fits && !range_open(g, cn, cp, sh, e, b, b + step - 1))
            b += step;
        else if (step > MACRO)
            step = MACRO;
        else
            break;
    }
    *bot = b;
    return true;
}

/* ---- sweeps ---- */

/* 1 / (k + 1/2): element r's level goes from k to k + 1 at scale r / (k + 1/2) */
static const float inv_half[16] = {2.0f / 1,  2.0f / 3,  2.0f / 5,  2.0f / 7,  2.0f / 9,  2.0f / 11,
                                   2.0f / 13, 2.0f / 15, 2.0f / 17, 2.0f / 19, 2.0f / 21, 2.0f / 23,
                                   2.0f / 25, 2.0f / 27, 2.0f / 29, 2.0f / 31};

/* The elements of one side with events in the fp16 values [bot, top]: adds (b, c) of all at
 * the top to (*b, *c); their indices into @mv, their levels at top and bottom into q0, q1.
 * Returns how many. */
static int side_movers(const struct side *sd, int cap, uint32_t bot, uint32_t top, double *b,
                       double *c, float *q0, float *q1, uint8_t *mv)
{
    side_levels(sd, (float)cap, 1.0f / f16_val(top), q0);
    side_levels(sd, (float)cap, 1.0f / f16_val(bot), q1);
    side_bc(sd, q0, b, c);
    int n = 0;
    for (int i = 0; i < sd->n; i++) {
        mv[n] = (uint8_t)i;
        n += q1[i] > q0[i];
    }
    return n;
}

/* fp16 values a sweep takes at once (a longer range is swept in parts) */
#define SWEEP_VALUES 1024

/* Adds one side's state at the top of [bot, top] to (*b, *c), and its events in it to the
 * steps (step i: between fp16 values top - i and top - i + 1). */
static void side_steps(const struct side *sd, int cap, uint32_t bot, uint32_t top, double *b,
                       double *c, double *db, double *dc)
{
    float q0[KN_MAX_GROUP + 16], q1[KN_MAX_GROUP + 16];
    uint8_t mv[KN_MAX_GROUP];
    int nm = side_movers(sd, cap, bot, top, b, c, q0, q1, mv);
    for (int j = 0; j < nm; j++) {
        int i = mv[j];
        float r = sd->r[i], m = sd->m[i];
        for (int k = (int)q0[i]; k < (int)q1[i]; k++) {
            uint32_t h = f16_floor(r * inv_half[k]);
            if (h < bot)
                break; /* a tie at the bottom: both codes give the same error */
            uint32_t at = h >= top ? 0 : top - h;
            db[at] += (double)m * r;
            dc[at] += (double)m * (2 * k + 1);
        }
    }
}

/* The best fp16 scale in [bot, top] for caps (cn, cp), into @best if it beats it. */
static void sweep(const struct grp *g, int cn, int cp, uint32_t bot, uint32_t top,
                  struct cand *best)
{
    double db[SWEEP_VALUES], dc[SWEEP_VALUES];
    for (;; top -= SWEEP_VALUES) {
        uint32_t lo = top - bot >= SWEEP_VALUES ? top - SWEEP_VALUES + 1 : bot;
        int len = (int)(top - lo) + 1, at = -1;
        double b = 0.0, c = 0.0, e_best = best->e;
        memset(db, 0, (size_t)len * sizeof(double));
        memset(dc, 0, (size_t)len * sizeof(double));
        side_steps(&g->neg, cn, lo, top, &b, &c, db, dc);
        side_steps(&g->pos, cp, lo, top, &b, &c, db, dc);
        for (int i = 0; i < len; i++) {
            b += db[i];
            c += dc[i];
            double u = f16_val(top - (uint32_t)i), e = g->a - u * (2.0 * b - u * c);
            if (e < e_best) {
                e_best = e;
                at = i;
            }
        }
        if (at >= 0)
            *best = (struct cand){e_best, f16_val(top - (uint32_t)at), cn, cp};
        if (lo == bot)
            break;
    }
}

/* fp16 values per coarse cell: 1.6 to 3.1 % of the scale, less than the distance between two
 * events of one element (6.4 % at level 15) unless the scale is a subnormal half */
#define CELL 32
/* coarse cells a pass takes at once (4 octaves; a wider window goes in parts) */
#define CELLS 128

/* What the events of one coarse cell add up to. */
struct cell {
    double db, dc;     /* the change of (b, c) across the cell */
    double ra, rb, rc; /* the terms of a, b, c of the elements with an event here, above it */
    double emin;       /* the least error of those elements anywhere in the cell */
    float u_top, u_bot;
};

/* Adds one side's state at the top of the cells to (*b, *c), and its events to the cells. */
static void side_cells(const struct side *sd, int cap, uint32_t bot, uint32_t top, double *b,
                       double *c, struct cell *cl)
{
    float q0[KN_MAX_GROUP + 16], q1[KN_MAX_GROUP + 16];
    uint8_t mv[KN_MAX_GROUP];
    int nm = side_movers(sd, cap, bot, top, b, c, q0, q1, mv);
    for (int j = 0; j < nm; j++) {
        int i = mv[j];
        float r = sd->r[i], m = sd->m[i];
        uint32_t prev = UINT32_MAX;
        double prev_min = 0.0;
        for (int k = (int)q0[i]; k < (int)q1[i]; k++) {
            uint32_t h = f16_floor(r * inv_half[k]);
            if (h < bot)
                break; /* a tie at the bottom: both codes give the same error */
            uint32_t at = (h >= top ? 0 : top - h) / CELL;
            struct cell *x = &cl[at];
            x->db += (double)m * r;
            x->dc += (double)m * (2 * k + 1);
            if (at == prev) { /* a second event of this element here (subnormal scales) */
                x->emin -= prev_min;
                prev_min = 0.0;
                continue;
            }
            x->ra += (double)m * r * r;
            x->rb += (double)m * r * k;
            x->rc += (double)m * k * k;
            /* level k is closest to r at the cell's top, level k + 1 at its bottom */
            float d0 = maxf(0.0f, r - x->u_top * (float)k);
            float d1 = maxf(0.0f, x->u_bot * (float)(k + 1) - r);
            prev_min = (double)m * minf(d0 * d0, d1 * d1);
            x->emin += prev_min;
            prev = at;
        }
    }
}

/* The least E the cell can have with (b, c) its state above it. */
static double cell_bound(const struct grp *g, const struct cell *x, double b, double c)
{
    double a = g->a - x->ra, bf = b - x->rb, cf = c - x->rc, u = x->u_top;
    if (cf > 0.0) { /* the vertex of the fixed elements' quadratic, within the cell */
        u = bf / cf;
        u = u > x->u_top ? x->u_top : u < x->u_bot ? x->u_bot : u;
    }
    return a - u * (2.0 * bf - u * cf) + x->emin;
}

/* The coarse cells of [bot, top] (at most CELLS), then sweeps of those that can beat @best:
 * the lowest bound first, with its neighbours that can too. */
static void search_cells(const struct grp *g, int cn, int cp, const struct shift *sh, uint32_t bot,
                         uint32_t top, struct cand *best)
{
    struct cell cl[CELLS];
    double lb[CELLS], b = 0.0, c = 0.0;
    int nc = (int)((top - bot) / CELL) + 1;
    for (int j = 0; j < nc; j++) {
        uint32_t ct = top - (uint32_t)j * CELL, cb = ct - bot >= CELL ? ct - CELL + 1 : bot;
        cl[j] = (struct cell){.u_top = f16_val(ct), .u_bot = f16_val(cb)};
    }
    side_cells(&g->neg, cn, bot, top, &b, &c, cl);
    side_cells(&g->pos, cp, bot, top, &b, &c, cl);
    for (int j = 0; j < nc; j++) {
        lb[j] = cell_bound(g, &cl[j], b, c);
        if (sh && lb[j] < best->e)
            lb[j] = fmax(lb[j], shift_bound(sh, cl[j].u_bot, cl[j].u_top));
        b += cl[j].db;
        c += cl[j].dc;
    }
    for (;;) {
        int j0 = -1;
        for (int j = 0; j < nc; j++)
            if (lb[j] < best->e && (j0 < 0 || lb[j] < lb[j0]))
                j0 = j;
        if (j0 < 0)
            break;
        int j1 = j0;
        while (j0 > 0 && lb[j0 - 1] < best->e)
            j0--;
        while (j1 + 1 < nc && lb[j1 + 1] < best->e)
            j1++;
        uint32_t ct = top - (uint32_t)j0 * CELL, cb = top - (uint32_t)j1 * CELL;
        sweep(g, cn, cp, cb - bot >= CELL ? cb - CELL + 1 : bot, ct, best);
        for (int j = j0; j <= j1; j++)
            lb[j] = INFINITY;
    }
}

/* Searches caps (cn, cp) where they can still beat @best; @cn0 >= 0: the negative cap of a
 * searched neighbour (shift_bound). */
static void search_caps(const struct grp *g, int cn, int cp, int cn0, struct cand *best)
{
    double e = best->e;
    if (e <= 0.0)
        return; /* exact already */
    if ((cn == 0 && g->neg.a >= e) || (cp == 0 && g->pos.a >= e))
        return; /* the side that only has code 0 already costs e */
    float lo = maxf(side_clip_bound(&g->neg, cn, e), side_clip_bound(&g->pos, cp, e));
    float hi = minf(grp_zero_bound(g, e), 65504.0f);
    uint32_t bot = f16_floor(lo), top = f16_floor(hi);
    bot = bot < 1 ? 1 : bot;
    if (bot > top)
        return;
    struct shift shift, *sh = NULL;
    if (cn0 >= 0 && shift_init(&shift, g, cn, cp, cn0, e, f16_val(bot)))
        sh = &shift;
    if (!narrow(g, cn, cp, sh, e, &bot, &top))
        return;
    for (;; top -= CELLS * CELL) {
        uint32_t b = top - bot >= CELLS * CELL ? top - CELLS * CELL + 1 : bot;
        search_cells(g, cn, cp, sh, b, top, best);
        if (b == bot)
            break;
    }
}

/* The smallest scale that clips nothing with caps (cn, cp). */
static float grp_unclipped(const struct grp *g, int cn, int cp)
{
    float un = cn ? g->neg.rmax / (float)cn : g->neg.rmax > 0.0f ? INFINITY : 0.0f;
    float up = cp ? g->pos.rmax / (float)cp : g->pos.rmax > 0.0f ? INFINITY : 0.0f;
    return maxf(un, up);
}

/* Symmetric: a positive scale is caps (8, 7), a negative one (7, 8): the sign decides which
 * side of the group gets the 8th level. Returns the scale. */
static float sym_search(const struct grp *g)
{
    struct cand best = {g->a, 0.0f, 8, 7};          /* scale 0 */
    int first = g->neg.rmax >= g->pos.rmax ? 8 : 7; /* the 8th level to the larger side */
    cand_try(g, grp_unclipped(g, first, 15 - first), first, 15 - first, &best);
    search_caps(g, first, 15 - first, -1, &best);
    search_caps(g, 15 - first, first, first, &best);
    return best.cn == 8 ? best.u : -best.u;
}

/* Asymmetric: zero point z is caps (z, 15 - z); the one that clips least first, then outwards,
 * each next to a searched one. */
static void asym_search(const struct grp *g, float *s, int *z)
{
    struct cand best = {g->a, 0.0f, 0, 15};
    int z0 = 0;
    for (int k = 1; k < 16; k++)
        if (grp_unclipped(g, k, 15 - k) < grp_unclipped(g, z0, 15 - z0))
            z0 = k;
    cand_try(g, grp_unclipped(g, z0, 15 - z0), z0, 15 - z0, &best);
    for (int d = 0; d < 32; d++) { /* z0, z0 + 1, z0 - 1, z0 + 2, ... */
        int k = d % 2 ? z0 + (d + 1) / 2 : z0 - d / 2;
        if (k >= 0 && k < 16)
            search_caps(g, k, 15 - k, d == 0 ? -1 : k > z0 ? k - 1 : k + 1, &best);
    }
    *s = best.u;
    *z = best.cn;
}

void kn_quant_group(const float *w, int n, bool asym, const float *imp, float *s, int *z)
{
    KN_ASSERT(n > 0 && n <= KN_MAX_GROUP);
    struct grp g;
    /* no weight on any non-zero element: every scale is as good, take the unweighted one */
    if (!grp_init(&g, w, imp, n) && (!imp || !grp_init(&g, w, NULL, n))) {
        *s = 0.0f;
        *z = asym ? 0 : 8;
        return;
    }
    if (asym) {
        asym_search(&g, s, z);
    } else {
        *s = sym_search(&g);
        *z = 8;
    }
}

/* The code of @x for scale @s and zero point @z, as every W4 quantizer here rounds it. */
static int w4_code(float x, float s, int z)
{
    float inv = s != 0.0f ? 1.0f / s : 0.0f;
    return clampi((int)lrintf(x * inv) + z, 0, 15);
}

/* The parts of a canonical W4 matrix at @out. */
struct w4_parts {
    uint8_t *codes;   /* (rows, row bytes) */
    uint16_t *scales; /* (rows, ngroups) fp16 */
    uint8_t *zeros;   /* (rows, ngroups), asymmetric only */
    size_t row_bytes;
    int ngroups;
};

static struct w4_parts w4_parts(void *out, int rows, int cols, int group)
{
    struct w4_parts p = {
        .codes = out, .row_bytes = kn_w4_row_bytes(cols), .ngroups = kn_ngroups(cols, group)};
    p.scales = (uint16_t *)(p.codes + kn_codes_bytes(KN_DT_W4A8, rows, cols));
    p.zeros = (uint8_t *)(p.scales + (size_t)rows * (size_t)p.ngroups);
    return p;
}

/* The rows of a W4 matrix; rows are independent, so members take disjoint ranges. */
struct quant_job {
    const float *w, *imp;
    int rows, cols, group;
    bool asym;
    struct w4_parts out;
};

/* Member @t of @nt: rows [rows * t / nt, rows * (t + 1) / nt). */
static void quant_rows(void *arg, int t, int nt)
{
    const struct quant_job *j = arg;
    const struct w4_parts *o = &j->out;
    int r0 = (int)((long)j->rows * t / nt), r1 = (int)((long)j->rows * (t + 1) / nt);
    for (int r = r0; r < r1; r++) {
        const float *row = j->w + (size_t)r * (size_t)j->cols;
        uint8_t *codes = o->codes + (size_t)r * o->row_bytes;
        for (int g = 0; g < o->ngroups; g++) {
            int k0 = g * j->group, n = j->cols - k0 < j->group ? j->cols - k0 : j->group, z;
            float s;
            kn_quant_group(row + k0, n, j->asym, j->imp ? j->imp + k0 : NULL, &s, &z);
            for (int i = 0; i < n; i++)
                put_nibble(codes, k0 + i, w4_code(row[k0 + i], s, z));
            o->scales[(size_t)r * (size_t)o->ngroups + (size_t)g] = kn_f32_to_f16(s);
            if (j->asym)
                o->zeros[(size_t)r * (size_t)o->ngroups + (size_t)g] = (uint8_t)z;
        }
    }
}

void kn_quant_w4(const float *w, int rows, int cols, int group, bool asym, const float *imp,
                 void *out, const struct kn_par *par)
{
    struct quant_job j = {w, imp, rows, cols, group, asym, w4_parts(out, rows, cols, group)};
    memset(j.out.codes, 0, kn_codes_bytes(KN_DT_W4A8, rows, cols));
    if (par && (long)rows * cols >= KN_QUANT_PAR_MIN)
        par->run(par->pool, quant_rows, &j);
    else
        quant_rows(&j, 0, 1);
}

void kn_quant_w4a16(const float *w, int rows, int cols, int group, void *out)
{
    kn_quant_w4(w, rows, cols, group, true, NULL, out, NULL);
}

void kn_quant_w4a8(const float *w, int rows, int cols, int group, void *out)
{
    kn_quant_w4(w, rows, cols, group, false, NULL, out, NULL);
}

void kn_w4_pack(const uint8_t *codes, const float *scales, const uint8_t *zeros, int rows, int cols,
                int group, bool asym, void *out)
{
    struct w4_parts o = w4_parts(out, rows, cols, group);
    memset(o.codes, 0, kn_codes_bytes(KN_DT_W4A8, rows, cols));
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < cols; k++) {
            uint8_t q = codes[(size_t)r * (size_t)cols + (size_t)k];
            KN_ASSERT(q <= 15);
            put_nibble(o.codes + (size_t)r * o.row_bytes, k, q);
        }
    size_t ns = (size_t)rows * (size_t)o.ngroups;
    for (size_t i = 0; i < ns; i++) {
        o.scales[i] = kn_f32_to_f16(scales[i]);
        if (asym) {
            KN_ASSERT(zeros[i] <= 15);
            o.zeros[i] = zeros[i];
        }
    }
}

void kn_quant_q8(const float *w, int rows, int cols, void *out)
{
    int8_t *codes = out;
    float *scales = (float *)((uint8_t *)out + kn_codes_bytes(KN_DT_Q8, rows, cols));
    memset(codes, 0, kn_codes_bytes(KN_DT_Q8, rows, cols));
    for (int r = 0; r < rows; r++) {
        const float *row = w + (size_t)r * (size_t)cols;
        float amax = 0.0f;
        for (int i = 0; i < cols; i++)
            amax = fmaxf(amax, fabsf(row[i]));
        float s = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int i = 0; i < cols; i++)
            codes[(size_t)r * (size_t)cols + (size_t)i] = (int8_t)lrintf(row[i] * inv);
        scales[r] = s;
    }
}

void kn_quant_bf16(const float *w, size_t n, uint16_t *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = kn_f32_to_bf16(w[i]);
}
