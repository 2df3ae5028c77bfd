/* SPDX-License-Identifier: MIT */
/* coordinator/convert/gptq.c: GPTQ with static groups and act-order (see quant.h).
 *
 * In the rounding order p = 0..n-1 (columns perm[p]), write the dampened Hessian reversed,
 * A = J Hp J = R^T R with R upper (one Cholesky factorisation, no inverse). A row's loss
 * d Hp d^T (d = w - q) is then |R e|^2 for e = d J, and component k of R e involves e_k.. only:
 * rounding in order p (k = n-1-p) with the earlier errors fixed, the value that zeroes component
 * k is w_p + sum_{p' < p} G[p][p'] d_{p'}, G[p][p'] = R[k][n-1-p'] / R[k][k] - the later
 * components can still be zeroed by the columns not yet rounded, so rounding that value to the
 * nearest code is the greedy optimum: GPTQ's update (the same codes as its inverse-Hessian form,
 * as the test against the textbook algorithm shows; Babai's nearest plane, seen so).
 *
 * The factorisation is blocked (panels of FACTOR_BLOCK rows, the trailing update split over the
 * pool's threads), in double. Rounding keeps the weights transposed (a column is a row) and adds
 * the earlier columns' errors to a block of GPTQ_BLOCK columns at once; rows of W are
 * independent, so the pool's threads take ranges of them. */
#include "quant.h"

#include "kn.h"
#include "pool.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GPTQ_BLOCK 128  /* columns per lazy batch */
#define FACTOR_BLOCK 64 /* rows per panel of the factorisation */

static const char *const method_names[COORD_QUANT_METHODS] = {"rtn", "imatrix", "gptq", "awq",
                                                              "auto"};

int coord_quant_method_parse(const char *name, enum coord_quant_method *m)
{
    for (int i = 0; i < COORD_QUANT_METHODS; i++)
        if (!strcmp(name, method_names[i])) {
            *m = (enum coord_quant_method)i;
            return 0;
        }
    return -1;
}

const char *coord_quant_method_name(enum coord_quant_method m)
{
    return (unsigned)m < COORD_QUANT_METHODS ? method_names[m] : "?";
}

float coord_gptq_damp(int cols, long tokens)
{
    double d = tokens > 0 ? (double)cols / (double)tokens : 1.0;
    return d < COORD_GPTQ_DAMP ? COORD_GPTQ_DAMP : d > 1.0 ? 1.0f : (float)d;
}

/* a[i][j] for an n x n row-major matrix */
#define AT(a, n, i, j) ((a)[(size_t)(i) * (size_t)(n) + (size_t)(j)])

static void par_run(struct wrk_pool *pool, void (*fn)(void *, int, int), void *arg)
{
    if (pool)
        wrk_pool_run(pool, fn, arg);
    else
        fn(arg, 0, 1);
}

/* The trailing update of a panel: rows [ke, n) of the upper triangle lose the panel's outer
 * products, A[i][i..] -= sum_k R[k][i] R[k][i..] over the panel rows k in [kb, ke). */
struct trail_job {
    double *a;
    int n, kb, ke;
};

static void trail_part(void *arg, int t, int nt)
{
    const struct trail_job *j = arg;
    int n = j->n, m = n - j->ke;
    /* row i costs n - i: split the triangle's area evenly */
    double area = (double)m * m;
    int i0 = j->ke + m - (int)sqrt(area * (nt - t) / nt);
    int i1 = t + 1 == nt ? n : j->ke + m - (int)sqrt(area * (nt - t - 1) / nt);
    for (int i = i0; i < i1; i++) {
        double *restrict ai = &AT(j->a, n, i, 0);
        int k = j->kb;
        for (; k + 4 <= j->ke; k += 4) { /* four panel rows per pass over row i */
            const double *r0 = &AT(j->a, n, k, 0), *r1 = r0 + n, *r2 = r1 + n, *r3 = r2 + n;
            double f0 = r0[i], f1 = r1[i], f2 = r2[i], f3 = r3[i];
            for (int c = i; c < n; c++)
                ai[c] -= f0 * r0[c] + f1 * r1[c] + f2 * r2[c] + f3 * r3[c];
        }
        for (; k < j->ke; k++) {
            const double *rk = &AT(j->a, n, k, 0);
            double f = rk[i];
            for (int c = i; c < n; c++)
                ai[c] -= f * rk[c];
        }
    }
}

/* In place: the upper triangle of @a (n x n, symmetric) becomes R with a = R^T R. Returns 0, or
 * -EDOM at a pivot that is not positive. */
static int cholesky_upper(double *a, int n, struct wrk_pool *pool)
{
    for (int kb = 0; kb < n; kb += FACTOR_BLOCK) {
        int ke = kb + FACTOR_BLOCK < n ? kb + FACTOR_BLOCK : n;
        /* the panel rows, one after another: each is final once the rows above it in the
         * panel are taken off it (the panels before have been, by the trailing updates) */
        for (int k = kb; k < ke; k++) {
            double *restrict rk = &AT(a, n, k, 0);
            for (int p = kb; p < k; p++) {
                const double *rp = &AT(a, n, p, 0);
                double f = rp[k];
                for (int c = k; c < n; c++)
                    rk[c] -= f * rp[c];
            }
            double d = rk[k];
            if (!(d > 0.0) || !isfinite(d))
                return -EDOM;
            d = sqrt(d);
            double inv = 1.0 / d;
            rk[k] = d;
            for (int c = k + 1; c < n; c++)
                rk[c] *= inv;
        }
        if (ke < n) {
            struct trail_job j = {a, n, kb, ke};
            par_run(pool, trail_part, &j);
        }
    }
    return 0;
}

/* The code of @x (0..15, with the zero point) for scale @s and zero point @z. */
static int code_of(float x, float s, int z)
{
    if (s == 0.0f)
        return z;
    int q = (int)lrintf(x / s) + z;
    return q < 0 ? 0 : q > 15 ? 15 : q;
}

struct diag_key {
    float d;
    int i;
};

static int by_diag_desc(const void *a, const void *b)
{
    const struct diag_key *x = a, *y = b;
    if (x->d != y->d)
        return x->d > y->d ? -1 : 1;
    return x->i - y->i;
}

/* Columns in decreasing diag(@h) order (ties: the lower index first), or as they are. */
static int *column_order(const float *h, int cols, bool act_order)
{
    int *perm = malloc((size_t)cols * sizeof(int));
    struct diag_key *k = malloc((size_t)cols * sizeof(*k));
    if (!perm || !k) {
        free(perm);
        free(k);
        return NULL;
    }
    for (int i = 0; i < cols; i++)
        k[i] = (struct diag_key){act_order ? AT(h, cols, i, i) : 0.0f, i};
    qsort(k, (size_t)cols, sizeof(*k), by_diag_desc);
    for (int i = 0; i < cols; i++)
        perm[i] = k[i].i;
    free(k);
    return perm;
}

/* A = J Hp J in double: H in @perm's order, reversed, dead columns (zero diagonal) given a 1,
 * plus @damp times the mean diagonal; *@dead marks the dead columns (by original index). */
static double *reversed_hessian(const float *h, int n, const int *perm, float damp, bool *dead)
{
    double *a = malloc((size_t)n * (size_t)n * sizeof(double)), mean = 0.0;
    if (!a)
        return NULL;
    for (int i = 0; i < n; i++) {
        dead[i] = !(AT(h, n, i, i) > 0.0f);
        mean += dead[i] ? 0.0 : AT(h, n, i, i);
    }
    mean = mean > 0.0 ? mean / n : 1.0;
    for (int i = 0; i < n; i++) {
        int ci = perm[n - 1 - i];
        for (int j = 0; j < n; j++) {
            int cj = perm[n - 1 - j];
            AT(a, n, i, j) = dead[ci] || dead[cj] ? 0.0 : AT(h, n, ci, cj);
        }
        AT(a, n, i, i) += (dead[ci] ? 1.0 : 0.0) + damp * mean;
    }
    return a;
}

/* G (n x n, float; row p holds p' < p) from the factor of the dampened, permuted H; the
 * dampening grows ten-fold (three times at most) while the factorisation finds H singular.
 * Returns 0, -EDOM or -ENOMEM. */
static int gptq_feedback(const float *h, int n, const int *perm, float damp, bool *dead, float *g,
                         struct wrk_pool *pool)
{
    int rc = -EDOM;
    for (int t = 0; t < 4 && rc == -EDOM; t++, damp = damp > 0.0f ? damp * 10.0f : 1e-4f) {
        double *a = reversed_hessian(h, n, perm, damp, dead);
        if (!a)
            return -ENOMEM;
        if (!(rc = cholesky_upper(a, n, pool)))
            for (int p = 0; p < n; p++) {
                const double *rk = &AT(a, n, n - 1 - p, 0);
                double inv = 1.0 / rk[n - 1 - p];
                for (int q = 0; q < n; q++)
                    AT(g, n, p, q) = q < p ? (float)(rk[n - 1 - q] * inv) : 0.0f;
            }
        free(a);
    }
    return rc;
}

/* What GPTQ needs of a Hessian, whatever the matrix: shared by the matrices that read the same
 * input (q, k, v; gate, up). */
struct coord_gptq_factor {
    int cols;
    int *perm;  /* the rounding order */
    bool *dead; /* columns whose input is always zero */
    float *g;   /* (cols x cols) the error feedback, see the top of the file */
};

void coord_gptq_factor_free(struct coord_gptq_factor *f)
{
    if (!f)
        return;
    free(f->perm);
    free(f->dead);
    free(f->g);
    free(f);
}

int coord_gptq_factor(const float *h, int cols, const struct coord_gptq_opts *o,
                      struct wrk_pool *pool, struct coord_gptq_factor **out)
{
    struct coord_gptq_factor *f = calloc(1, sizeof(*f));
    *out = NULL;
    if (!f)
        return -ENOMEM;
    f->cols = cols;
    f->perm = column_order(h, cols, o->act_order);
    f->dead = malloc((size_t)cols * sizeof(bool));
    f->g = malloc((size_t)cols * (size_t)cols * sizeof(float));
    int rc = -ENOMEM;
    if (f->perm && f->dead && f->g)
        rc = gptq_feedback(h, cols, f->perm, o->damp, f->dead, f->g, pool);
    if (rc) {
        coord_gptq_factor_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

/* One matrix's rounding: rows [r0, r1) per thread. */
struct apply_job {
    const struct coord_gptq_factor *f;
    const float *w;
    int rows, group;
    bool asym;
    float *wt, *d; /* (cols x rows) transposed, permuted: adjusted weights; errors w - q */
    float *scales;
    uint8_t *zeros, *codes;
};

/* Columns [p0, p1) of the adjusted weights (rows [r0, r1)) take the errors of columns [q0, q1):
 * wt[p] += G[p][q] d[q]. Four error rows per pass over a column keep the traffic down. */
static void add_errors(const struct apply_job *j, int p0, int p1, int q0, int q1, int r0, int r1)
{
    int cols = j->f->cols, rows = j->rows;
    const float *g = j->f->g;
    for (int q = q0; q < q1; q += 4) {
        int nq = q1 - q < 4 ? q1 - q : 4;
        const float *d0 = j->d + (size_t)q * rows, *d1 = d0 + rows, *d2 = d1 + rows,
                    *d3 = d2 + rows;
        for (int p = p0; p < p1; p++) {
            float *restrict wp = j->wt + (size_t)p * rows;
            const float *gp = &AT(g, cols, p, q);
            if (nq == 4) {
                for (int r = r0; r < r1; r++)
                    wp[r] += gp[0] * d0[r] + gp[1] * d1[r] + gp[2] * d2[r] + gp[3] * d3[r];
            } else {
                for (int k = 0; k < nq; k++) {
                    const float *dk = d0 + (size_t)k * rows;
                    for (int r = r0; r < r1; r++)
                        wp[r] += gp[k] * dk[r];
                }
            }
        }
    }
}

static void apply_part(void *arg, int t, int nt)
{
    const struct apply_job *j = arg;
    const struct coord_gptq_factor *f = j->f;
    int rows = j->rows, cols = f->cols, group = j->group, ng = kn_ngroups(cols, group);
    int r0 = (int)((long)rows * t / nt), r1 = (int)((long)rows * (t + 1) / nt);
    /* static groups: each group's scale and zero point from the original weights by the plain
     * search; the feedback moves weights within a group afterwards, so a scale fitted to the
     * group's range does better than one weighed by diag(H) (stories260K: 0.0480 against
     * 0.0485 at w4a8 g128, 0.0464 against 0.0475 at w4a16 g64, 0.0504 against 0.0526 and
     * 0.0431 against 0.0493 calibrated on tests/data/calib/stories.txt) */
    for (int r = r0; r < r1; r++)
        for (int g = 0; g < ng; g++) {
            int k0 = g * group, n = cols - k0 < group ? cols - k0 : group, z;
            kn_quant_group(j->w + (size_t)r * cols + k0, n, j->asym, NULL,
                           &j->scales[(size_t)r * ng + g], &z);
            j->zeros[(size_t)r * ng + g] = (uint8_t)z;
        }
    for (int p = 0; p < cols; p++) /* transposed, permuted; a dead column is zero */
        for (int r = r0; r < r1; r++)
            j->wt[(size_t)p * rows + r] =
                f->dead[f->perm[p]] ? 0.0f : AT(j->w, cols, r, f->perm[p]);
    for (int b0 = 0; b0 < cols; b0 += GPTQ_BLOCK) {
        int b1 = b0 + GPTQ_BLOCK < cols ? b0 + GPTQ_BLOCK : cols;
        add_errors(j, b0, b1, 0, b0, r0, r1); /* the columns before the block, at once */
        for (int p = b0; p < b1; p++) {
            add_errors(j, p, p + 1, b0, p, r0, r1); /* the block's, one by one */
            int c = f->perm[p], g = c / group;
            const float *restrict wp = j->wt + (size_t)p * rows;
            float *restrict dp = j->d + (size_t)p * rows;
            for (int r = r0; r < r1; r++) {
                float s = j->scales[(size_t)r * ng + g];
                int z = j->zeros[(size_t)r * ng + g], q = code_of(wp[r], s, z);
                j->codes[(size_t)r * cols + c] = (uint8_t)q;
                dp[r] = (f->dead[c] ? 0.0f : AT(j->w, cols, r, c)) - s * (float)(q - z);
            }
        }
    }
}

int coord_gptq_apply(const struct coord_gptq_factor *f, const float *w, int rows, int group,
                     bool asym, struct wrk_pool *pool, void *out)
{
    int cols = f->cols, ng = kn_ngroups(cols, group);
    size_t wn = (size_t)rows * (size_t)cols;
    struct apply_job j = {f,
                          w,
                          rows,
                          group,
                          asym,
                          malloc(wn * sizeof(float)),
                          malloc(wn * sizeof(float)),
                          malloc((size_t)rows * ng * sizeof(float)),
                          malloc((size_t)rows * ng),
                          malloc(wn)};
    int rc = -ENOMEM;
    if (j.wt && j.d && j.scales && j.zeros && j.codes) {
        par_run(pool, apply_part, &j);
        kn_w4_pack(j.codes, j.scales, j.zeros, rows, cols, group, asym, out);
        rc = 0;
    }
    free(j.wt);
    free(j.d);
    free(j.scales);
    free(j.zeros);
    free(j.codes);
    return rc;
}

int coord_gptq(const float *w, int rows, int cols, int group, bool asym, const float *h,
               const struct coord_gptq_opts *o, struct wrk_pool *pool, void *out)
{
    struct coord_gptq_factor *f;
    int rc = coord_gptq_factor(h, cols, o, pool, &f);
    if (!rc)
        rc = coord_gptq_apply(f, w, rows, group, asym, pool, out);
    coord_gptq_factor_free(f);
    return rc;
}

double coord_gptq_loss(const float *w, const float *q, int rows, int cols, const float *h)
{
    double total = 0.0;
    double *d = malloc((size_t)cols * sizeof(double));
    if (!d)
        return NAN;
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < cols; i++)
            d[i] = (double)AT(w, cols, r, i) - AT(q, cols, r, i);
        for (int i = 0; i < cols; i++) {
            double hi = 0.0;
            for (int j = 0; j < cols; j++)
                hi += AT(h, cols, i, j) * d[j];
            total += d[i] * hi;
        }
    }
    free(d);
    return total;
}
