/* SPDX-License-Identifier: MIT */
/* tests/test_gptq.c: GPTQ (coordinator/convert/gptq.c) against a slow textbook implementation on
 * small matrices, its error against round-to-nearest, singular Hessians; the calibration text's
 * checks; --method auto's held-out slice and choice (coordinator/convert/auto.c) on stories260K. */
#include "calib.h"
#include "convert.h"
#include "kn.h"
#include "pool.h"
#include "quant.h"
#include "testutil.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <cmocka.h>

static uint64_t rng = 12345;
static double unif(void)
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng >> 11) * 0x1.0p-53;
}
static float gauss(void)
{
    double u = unif() + 1e-12, v = unif();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* H = mean of x x^T over @n samples with correlated, unevenly scaled channels (as activations
 * are: a few channels much larger, neighbours correlated). */
static float *make_hessian(int cols, int n)
{
    float *h = calloc((size_t)cols * cols, sizeof(float)),
          *x = malloc((size_t)cols * sizeof(float));
    for (int s = 0; s < n; s++) {
        float common = gauss();
        for (int i = 0; i < cols; i++)
            x[i] = (gauss() + 0.7f * common) * (i % 17 == 0 ? 6.0f : 1.0f + 0.02f * i);
        for (int i = 0; i < cols; i++)
            for (int j = 0; j < cols; j++)
                h[(size_t)i * cols + j] += x[i] * x[j] / (float)n;
    }
    free(x);
    return h;
}

/* The textbook algorithm: the full inverse Hessian (Gauss-Jordan, double), columns in decreasing
 * diag order, after each column the error update of every later column and the rank-one
 * downdate of the inverse (OBQ's formulas, as GPTQ's paper states them before its Cholesky
 * reformulation). The scales are the same static groups (the plain search). Writes the
 * dequantized weights. */
static void gptq_textbook(const float *w, int rows, int cols, int group, bool asym, const float *h,
                          float damp, float *deq)
{
    int ng = kn_ngroups(cols, group);
    double *a = calloc((size_t)cols * cols * 2, sizeof(double)), mean = 0;
    double *W = malloc((size_t)rows * cols * sizeof(double));
    float *s = malloc((size_t)rows * ng * sizeof(float)),
          *diag = malloc((size_t)cols * sizeof(float));
    int *z = malloc((size_t)rows * ng * sizeof(int)), *perm = malloc((size_t)cols * sizeof(int));
    bool *done = calloc((size_t)cols, 1);
    for (int i = 0; i < cols; i++)
        mean += (diag[i] = h[(size_t)i * cols + i]) / cols;
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < ng; g++) {
            int k0 = g * group, n = cols - k0 < group ? cols - k0 : group;
            kn_quant_group(w + (size_t)r * cols + k0, n, asym, NULL, &s[r * ng + g],
                           &z[r * ng + g]);
        }
    for (int i = 0; i < cols; i++) { /* order: decreasing diag, ties by index (selection) */
        int best = -1;
        for (int j = 0; j < cols; j++)
            if (!done[j] && (best < 0 || diag[j] > diag[best]))
                best = j;
        done[best] = true;
        perm[i] = best;
    }
    /* [H + damp I | I] -> [I | H^-1] */
    int n2 = 2 * cols;
    for (int i = 0; i < cols; i++) {
        for (int j = 0; j < cols; j++)
            a[(size_t)i * n2 + j] = h[(size_t)i * cols + j] + (i == j ? damp * mean : 0.0);
        a[(size_t)i * n2 + cols + i] = 1.0;
    }
    for (int p = 0; p < cols; p++) {
        double piv = a[(size_t)p * n2 + p];
        for (int j = 0; j < n2; j++)
            a[(size_t)p * n2 + j] /= piv;
        for (int i = 0; i < cols; i++)
            if (i != p) {
                double f = a[(size_t)i * n2 + p];
                for (int j = 0; j < n2; j++)
                    a[(size_t)i * n2 + j] -= f * a[(size_t)p * n2 + j];
            }
    }
#define HINV(i, j) a[(size_t)(i)*n2 + cols + (j)]
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        W[i] = w[i];
    for (int t = 0; t < cols; t++) {
        int c = perm[t], g = c / group;
        double d = HINV(c, c);
        for (int r = 0; r < rows; r++) {
            float sc = s[r * ng + g];
            int zz = z[r * ng + g];
            int q = sc == 0.0f ? zz : (int)lrintf((float)W[(size_t)r * cols + c] / sc) + zz;
            q = q < 0 ? 0 : q > 15 ? 15 : q;
            float dq = sc * (float)(q - zz);
            deq[(size_t)r * cols + c] = dq;
            double err = (W[(size_t)r * cols + c] - dq) / d;
            for (int u = t + 1; u < cols; u++)
                W[(size_t)r * cols + perm[u]] -= err * HINV(c, perm[u]);
        }
        for (int i = 0; i < cols; i++) /* H^-1 -= H^-1[:, c] H^-1[c, :] / H^-1[c, c] */
            for (int j = 0; j < cols; j++)
                if (i != c && j != c)
                    HINV(i, j) -= HINV(i, c) * HINV(c, j) / d;
        for (int i = 0; i < cols; i++)
            HINV(i, c) = HINV(c, i) = 0.0;
        HINV(c, c) = 1.0; /* never read again */
    }
#undef HINV
    free(a);
    free(W);
    free(s);
    free(diag);
    free(z);
    free(perm);
    free(done);
}

static void dequant(const void *buf, int rows, int cols, int group, bool asym, float *out)
{
    struct kn_mat m;
    kn_mat_view(&m, asym ? KN_DT_W4A16 : KN_DT_W4A8, rows, cols, group, buf);
    for (int r = 0; r < rows; r++)
        kn_mat_row(&m, r, out + (size_t)r * cols);
}

static void check_against_textbook(int rows, int cols, int group, bool asym)
{
    float *w = malloc((size_t)rows * cols * sizeof(float)), *h = make_hessian(cols, 4 * cols);
    for (int i = 0; i < rows * cols; i++)
        w[i] = 0.02f * gauss();
    enum kn_dtype dt = asym ? KN_DT_W4A16 : KN_DT_W4A8;
    void *buf = malloc(kn_mat_bytes(dt, rows, cols, group)),
         *rtn = malloc(kn_mat_bytes(dt, rows, cols, group));
    float *got = malloc((size_t)rows * cols * sizeof(float)),
          *want = malloc((size_t)rows * cols * sizeof(float)),
          *plain = malloc((size_t)rows * cols * sizeof(float)), *imp = malloc(cols * sizeof(float));
    struct coord_gptq_opts o = {0.01f, true};
    assert_int_equal(coord_gptq(w, rows, cols, group, asym, h, &o, NULL, buf), 0);
    dequant(buf, rows, cols, group, asym, got);
    /* threads split the factorisation's rows and W's rows: the same bytes */
    struct wrk_pool *pool;
    assert_int_equal(wrk_pool_init(&pool, 3, NULL), 0);
    assert_int_equal(coord_gptq(w, rows, cols, group, asym, h, &o, pool, rtn), 0);
    assert_memory_equal(buf, rtn, kn_mat_bytes(dt, rows, cols, group));
    wrk_pool_free(pool);
    gptq_textbook(w, rows, cols, group, asym, h, 0.01f, want);
    /* same codes but where float rounding put a value on the other side of a rounding edge */
    int same = 0;
    for (int i = 0; i < rows * cols; i++)
        same += got[i] == want[i];
    double lg = coord_gptq_loss(w, got, rows, cols, h),
           lw = coord_gptq_loss(w, want, rows, cols, h);
    fprintf(stderr, "gptq %dx%d g%d %s: %d/%d codes as the textbook's, loss %.6g vs %.6g\n", rows,
            cols, group, asym ? "asym" : "sym", same, rows * cols, lg, lw);
    assert_true(same >= rows * cols * 99 / 100);
    assert_true(fabs(lg - lw) <= 0.01 * lw);
    /* and the error it minimises is well below round-to-nearest's, with the same importance or
     * none */
    for (int i = 0; i < cols; i++)
        imp[i] = h[(size_t)i * cols + i];
    kn_quant_w4(w, rows, cols, group, asym, imp, rtn, NULL);
    dequant(rtn, rows, cols, group, asym, plain);
    double lr = coord_gptq_loss(w, plain, rows, cols, h);
    kn_quant_w4(w, rows, cols, group, asym, NULL, rtn, NULL);
    dequant(rtn, rows, cols, group, asym, plain);
    double lp = coord_gptq_loss(w, plain, rows, cols, h);
    fprintf(stderr, "  imatrix rtn loss %.6g, plain rtn %.6g\n", lr, lp);
    assert_true(lg < 0.8 * lr && lg < 0.8 * lp);
    free(w), free(h), free(buf), free(rtn), free(got), free(want), free(plain), free(imp);
}

static void test_textbook_sym(void **state) { check_against_textbook(24, 160, 32, false); }
static void test_textbook_asym(void **state) { check_against_textbook(16, 128, 64, true); }
/* a width that is no multiple of the group (a short last group), natural order */
static void test_short_group(void **state)
{
    int rows = 8, cols = 100;
    float *w = malloc((size_t)rows * cols * sizeof(float)), *h = make_hessian(cols, 300);
    for (int i = 0; i < rows * cols; i++)
        w[i] = gauss();
    void *buf = malloc(kn_mat_bytes(KN_DT_W4A8, rows, cols, 32));
    struct coord_gptq_opts o = {0.01f, false};
    assert_int_equal(coord_gptq(w, rows, cols, 32, false, h, &o, NULL, buf), 0);
    float *got = malloc((size_t)rows * cols * sizeof(float));
    dequant(buf, rows, cols, 32, false, got);
    for (int i = 0; i < rows * cols; i++)
        assert_true(isfinite(got[i]) && fabsf(got[i] - w[i]) < 2.0f);
    free(w), free(h), free(buf), free(got);
}

/* Dead inputs (a zero row/column in H) get zero weights; a Hessian of rank 1 is made positive by
 * the dampening; one that dampening cannot save is -EDOM, never NaN weights. */
static void test_singular(void **state)
{
    int rows = 4, cols = 32;
    float *w = malloc((size_t)rows * cols * sizeof(float)), *h = calloc(cols * cols, sizeof(float));
    float *got = malloc((size_t)rows * cols * sizeof(float));
    void *buf = malloc(kn_mat_bytes(KN_DT_W4A8, rows, cols, 32));
    for (int i = 0; i < rows * cols; i++)
        w[i] = gauss();
    struct coord_gptq_opts o = {0.01f, true};
    /* all dead: every weight zero */
    assert_int_equal(coord_gptq(w, rows, cols, 32, false, h, &o, NULL, buf), 0);
    dequant(buf, rows, cols, 32, false, got);
    for (int i = 0; i < rows * cols; i++)
        assert_true(got[i] == 0.0f);
    /* rank one (every input the same), and no dampening asked: it grows until H factors */
    for (int i = 0; i < cols * cols; i++)
        h[i] = 1.0f;
    o.damp = 0.0f;
    assert_int_equal(coord_gptq(w, rows, cols, 32, false, h, &o, NULL, buf), 0);
    dequant(buf, rows, cols, 32, false, got);
    for (int i = 0; i < rows * cols; i++)
        assert_true(isfinite(got[i]));
    /* not positive semi-definite at all (off-diagonals 100 times the diagonal) */
    for (int i = 0; i < cols; i++)
        for (int j = 0; j < cols; j++)
            h[i * cols + j] = i == j ? 1.0f : 100.0f;
    o.damp = 0.01f;
    assert_int_equal(coord_gptq(w, rows, cols, 32, false, h, &o, NULL, buf), -EDOM);
    free(w), free(h), free(got), free(buf);
}

/* The Hessian's accumulation (each kernel table this CPU runs, the tiles' edges, threads)
 * against a plain double sum; the tables with FMA give the same bits. */
static void test_hessian_add(void **state)
{
    static const int widths[] = {7, 16, 24, 100, 172, 301};
    struct wrk_pool *pool;
    const struct kn_ops *all[8];
    int n_ops = kn_ops_available(all, 8);
    float *fma_h[sizeof(widths) / sizeof(widths[0])] = {0};
    assert_int_equal(wrk_pool_init(&pool, 3, NULL), 0);
    for (int t = 0; t < n_ops; t++) {
        const struct kn_ops *ops = all[t];
        for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++) {
            int cols = widths[w], n = 37, ld = cols + 5;
            float *x = malloc((size_t)n * ld * sizeof(float));
            float *h1 = calloc((size_t)cols * cols, sizeof(float)),
                  *h2 = calloc((size_t)cols * cols, sizeof(float));
            rng = 40 + w; /* the same x for every table */
            for (int i = 0; i < n * ld; i++)
                x[i] = gauss();
            coord_calib_hessian_add(h1, x, n, ld, cols, ops, NULL);
            coord_calib_hessian_add(h1, x, n, ld, cols, ops, NULL); /* it adds */
            coord_calib_hessian_add(h2, x, 17, ld, cols, ops, pool);
            coord_calib_hessian_add(h2, x + (size_t)17 * ld, n - 17, ld, cols, ops, pool);
            coord_calib_hessian_add(h2, x, n, ld, cols, ops, pool);
            for (int i = 0; i < cols; i++)
                for (int k = 0; k <= i; k++) {
                    double want = 0.0;
                    for (int r = 0; r < n; r++)
                        want += 2.0 * x[(size_t)r * ld + i] * x[(size_t)r * ld + k];
                    double tol = 1e-4 * (1.0 + fabs(want));
                    assert_true(fabs(h1[(size_t)i * cols + k] - want) < tol);
                    assert_true(fabs(h2[(size_t)i * cols + k] - want) < tol);
                }
            if (ops->isa == KN_ISA_REF) {
                free(h1);
            } else if (fma_h[w]) {
                for (int i = 0; i < cols; i++) /* the lower triangle: the upper one is scratch */
                    assert_memory_equal(h1 + (size_t)i * cols, fma_h[w] + (size_t)i * cols,
                                        (size_t)(i + 1) * sizeof(float));
                free(h1);
            } else {
                fma_h[w] = h1;
            }
            free(x), free(h2);
        }
    }
    for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++)
        free(fma_h[w]);
    wrk_pool_free(pool);
}

static void test_method_names(void **state)
{
    enum coord_quant_method m;
    const char *names[] = {"rtn", "imatrix", "gptq", "awq", "auto"};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(coord_quant_method_parse(names[i], &m), 0);
        assert_string_equal(coord_quant_method_name(m), names[i]);
    }
    assert_int_equal(coord_quant_method_parse("GPTQ", &m), -1);
    assert_int_equal(coord_quant_method_parse("", &m), -1);
}

/* The calibration text: a regular file of UTF-8, not empty, not past the limit. */
static void test_calib_text(void **state)
{
    char dir[4096], path[4200];
    tu_mkdtemp(dir, sizeof(dir), "calib");
    struct shardlm_err e;
    char *text;
    size_t len;
    snprintf(path, sizeof(path), "%s/ok.txt", dir);
    tu_write(path, "Once upon a time. \xc3\xa9t\xc3\xa9\n", 24);
    assert_int_equal(coord_calib_read_text(path, &text, &len, &e), 0);
    assert_int_equal(len, strlen(text));
    free(text);
    snprintf(path, sizeof(path), "%s/empty.txt", dir);
    tu_write(path, "", 0);
    assert_int_equal(coord_calib_read_text(path, &text, &len, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "empty"));
    snprintf(path, sizeof(path), "%s/latin1.txt", dir);
    tu_write(path, "caf\xe9 au lait", 12);
    assert_int_equal(coord_calib_read_text(path, &text, &len, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "not UTF-8 text (byte 3)"));
    snprintf(path, sizeof(path), "%s/nul.txt", dir);
    tu_write(path, "a\0b", 3);
    assert_int_equal(coord_calib_read_text(path, &text, &len, &e), -EINVAL);
    snprintf(path, sizeof(path), "%s/big.txt", dir);
    int fd = open(path, O_CREAT | O_WRONLY, 0600);
    assert_true(fd >= 0 && ftruncate(fd, (off_t)COORD_CALIB_MAX_BYTES + 1) == 0);
    close(fd);
    assert_int_equal(coord_calib_read_text(path, &text, &len, &e), -EFBIG);
    assert_non_null(strstr(e.msg, "64 MiB"));
    assert_int_equal(coord_calib_read_text(dir, &text, &len, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "not a regular file"));
    snprintf(path, sizeof(path), "%s/missing.txt", dir);
    assert_int_equal(coord_calib_read_text(path, &text, &len, &e), -ENOENT);
    tu_rmdir(dir);
}

/* Writes the calibration text @path: stories.txt, then @tail four times (past the held-out cut
 * at the token counts test_heldout asks for). */
static void calib_text(const char *path, const char *tail)
{
    char src[4200];
    size_t n = 0;
    snprintf(src, sizeof(src), "%s/calib/stories.txt", tu_data());
    char *text = tu_slurp(src, &n);
    assert_non_null(text);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(text, 1, n, f);
    for (int i = 0; i < 4; i++)
        fprintf(f, "%s\n", tail);
    fclose(f);
    free(text);
}

/* The images of stories260K at w4a16 g64 by each method but auto, fitted on @c, as hashes. */
static void fit_all(struct coord_source *src, struct coord_calib *c, uint64_t *hash)
{
    struct coord_convert_opts o = {.scheme = SHLM_SCHEME_W4A16, .head_bits = 8};
    struct shardlm_err e;
    for (int m = 0; m < COORD_QUANT_AUTO; m++) {
        void *img;
        size_t size;
        assert_int_equal(coord_convert_image_by(src, &o, 64, (enum coord_quant_method)m, c, NULL,
                                                &img, &size, &e),
                         0);
        hash[m] = shlm_hash(img, size);
        munmap(img, size);
    }
}

/* Writes the model image @img (@size bytes) to @path. */
static void image_save(const char *path, void *img, size_t size)
{
    assert_int_equal(tu_write(path, img, size), 0);
    munmap(img, size);
}

/* `shardlm eval -m @model --ref @ref [--save @save]` in @dir's runtime folder: the overall mean
 * KLD. */
static double eval_kld(const char *dir, const char *model, const char *ref, const char *save)
{
    char env[4200];
    tu_path(env, sizeof(env), "SHARDLM_RUNTIME_DIR=%s/run", dir);
    char *args[] = {"eval",
                    "-m",
                    (char *)model,
                    "--ref",
                    (char *)ref,
                    "--no-persist",
                    "--threads",
                    "1",
                    "--workers",
                    "1",
                    save ? "--save" : NULL,
                    (char *)save,
                    NULL};
    struct tu_run *r = malloc(sizeof(*r));
    tu_run_shardlm(r, env, args, NULL, 120, NULL, NULL);
    if (r->status)
        fprintf(stderr, "eval %s: %d: %s\n", model, r->status, r->err);
    assert_int_equal(r->status, 0);
    const char *o = strstr(r->out, "overall kld=");
    assert_non_null(o);
    double k = strtod(o + strlen("overall kld="), NULL);
    free(r);
    return k;
}

/* The held-out KLDs of @r against `shardlm eval` of each method's image fitted on @c (the
 * engine's workers, their kernels' layouts), over the held-out sequences of @c as a reference
 * folder whose logits are the source's in f32 (eval --save of the f32 file). */
static void check_klds_by_eval(const char *dir, struct coord_source *src, struct coord_calib *c,
                               const struct coord_auto_report *r)
{
    char path[4400], ref0[4096], ref1[4096], run[4096], line[65536];
    const int32_t *tok;
    const int *len;
    int n, vocab = (int)src->cfg.vocab_size;
    struct shardlm_err e;
    coord_calib_heldout(c, &tok, &len, &n);
    tu_path(ref0, sizeof(ref0), "%s/ref0", dir);
    tu_path(ref1, sizeof(ref1), "%s/ref1", dir);
    tu_path(run, sizeof(run), "%s/run", dir);
    assert_int_equal(mkdir(ref0, 0700), 0);
    assert_int_equal(mkdir(run, 0700), 0);
    tu_path(path, sizeof(path), "%s/greedy.tsv", ref0);
    FILE *tsv = fopen(path, "w");
    assert_non_null(tsv);
    for (int q = 0, at = 0; q < n; at += len[q++]) {
        /* a line per held-out sequence: its BOS as the prompt, the rest as the continuation;
         * logits that are not the model's (eval --save writes the model's) */
        size_t k = (size_t)snprintf(line, sizeof(line), "h%d\t%d\t", q, tok[at]);
        for (int i = 1; i < len[q]; i++)
            k +=
                (size_t)snprintf(line + k, sizeof(line) - k, "%s%d", i > 1 ? " " : "", tok[at + i]);
        fprintf(tsv, "%s\th%d.txt\th%d.logits.f32\n", line, q, q);
        float *lg = malloc((size_t)len[q] * vocab * sizeof(float));
        for (size_t i = 0; i < (size_t)len[q] * vocab; i++)
            lg[i] = (float)(i % 7);
        tu_path(path, sizeof(path), "%s/h%d.logits.f32", ref0, q);
        assert_int_equal(tu_write(path, lg, (size_t)len[q] * vocab * sizeof(float)), 0);
        tu_path(path, sizeof(path), "%s/h%d.txt", ref0, q);
        assert_int_equal(tu_write(path, "-\n", 2), 0);
        free(lg);
    }
    fclose(tsv);
    void *img;
    size_t size;
    tu_path(path, sizeof(path), "%s/f32.shlm", dir);
    assert_int_equal(coord_convert_image(src, SHLM_SCHEME_F32, NULL, &img, &size, &e), 0);
    image_save(path, img, size);
    eval_kld(dir, path, ref0, ref1);
    assert_true(eval_kld(dir, path, ref1, NULL) < 1e-9); /* the reference is the f32 model's */
    struct coord_convert_opts o = {.scheme = SHLM_SCHEME_W4A16, .head_bits = 8};
    for (int m = 0; m < COORD_QUANT_AUTO; m++) {
        tu_path(path, sizeof(path), "%s/m%d.shlm", dir, m);
        assert_int_equal(coord_convert_image_by(src, &o, 64, (enum coord_quant_method)m, c, NULL,
                                                &img, &size, &e),
                         0);
        image_save(path, img, size);
        double k = eval_kld(dir, path, ref1, NULL);
        printf("held-out kld %s: auto %.6g, eval %.6g\n",
               coord_quant_method_name((enum coord_quant_method)m), r->kld[m], k);
        assert_true(fabs(k - r->kld[m]) <= 1e-3 * k);
    }
    tu_rmdir(run);
    tu_rmdir(ref0);
    tu_rmdir(ref1);
}

/* --method auto's held-out slice: the last eighth of the tokens, never in the statistics - a
 * calibration whose held-out text differs fits every method to the same bytes, and those are the
 * bytes of a calibration on the fit tokens alone; coord_auto keeps the candidate of the lowest
 * held-out KLD (so never above rtn's), and its image is that method's. */
static void test_heldout(void **state)
{
    char dir[4096], a_txt[4200], b_txt[4200], ck[4200], tok[4200];
    tu_mkdtemp(dir, sizeof(dir), "heldout");
    snprintf(a_txt, sizeof(a_txt), "%s/a.txt", dir);
    snprintf(b_txt, sizeof(b_txt), "%s/b.txt", dir);
    calib_text(a_txt, "The cat sat on the mat and looked at the big red sun in the sky all day.");
    calib_text(b_txt, "A dog ran to the park, where a girl threw a ball for him again and again.");
    tu_path(ck, sizeof(ck), "%s/models/stories260K/stories260K.bin", tu_src());
    tu_path(tok, sizeof(tok), "%s/models/stories260K/tok512.bin", tu_src());
    struct coord_source src;
    struct shardlm_err e;
    assert_int_equal(coord_source_open(&src, ck, tok, 0, &e), 0);
    /* 1600 tokens in sequences of 512 (a BOS and 511 of the text): 200 held out, the 1400
     * before them in the fit, all of them from stories.txt (1496 tokens) */
    struct coord_calib_opts co = {.text = a_txt,
                                  .tokens = 1600,
                                  .hessians = true,
                                  .samples = true,
                                  .holdout = true,
                                  .threads = 1};
    struct coord_calib *ca, *cb, *cf;
    assert_int_equal(coord_calib_open(&ca, &src, &co, &e), 0);
    co.text = b_txt;
    assert_int_equal(coord_calib_open(&cb, &src, &co, &e), 0);
    co = (struct coord_calib_opts){
        .text = a_txt, .tokens = 1400, .hessians = true, .samples = true, .threads = 1};
    assert_int_equal(coord_calib_open(&cf, &src, &co, &e), 0);
    assert_int_equal(coord_calib_tokens(ca), 1400);
    assert_int_equal(coord_calib_tokens(cf), 1400);
    const int32_t *ta, *tb;
    const int *la, *lb;
    int na, nb;
    coord_calib_heldout(ca, &ta, &la, &na);
    coord_calib_heldout(cb, &tb, &lb, &nb);
    /* sequences of 512, 512, 512 and 64 tokens: the last whole, and of the third its last 136
     * after a BOS */
    assert_int_equal(na, 2);
    assert_int_equal(nb, 2);
    assert_int_equal(la[0], 137);
    assert_int_equal(la[1], 64);
    assert_int_equal(ta[0], 1);
    assert_int_equal(ta[137], 1);
    assert_true(memcmp(ta, tb, 201 * sizeof(*ta)) != 0); /* the held-out texts differ */
    uint64_t ha[COORD_QUANT_AUTO], hb[COORD_QUANT_AUTO], hf[COORD_QUANT_AUTO];
    fit_all(&src, ca, ha);
    fit_all(&src, cb, hb);
    fit_all(&src, cf, hf);
    for (int m = 0; m < COORD_QUANT_AUTO; m++) {
        assert_true(ha[m] == hb[m]);
        assert_true(ha[m] == hf[m]);
        for (int k = 0; k < m; k++) /* the methods are told apart */
            assert_true(ha[m] != ha[k]);
    }
    /* the choice: the lowest held-out KLD, rtn unless strictly lower; the image is its own */
    struct coord_convert_opts o = {.scheme = SHLM_SCHEME_W4A16, .head_bits = 8};
    struct coord_auto_report r;
    void *img;
    size_t size;
    assert_int_equal(coord_auto(&src, &o, 64, ca, NULL, &img, &size, &r, &e), 0);
    assert_int_equal(r.heldout_tokens, 201);
    for (int m = 0; m < COORD_QUANT_AUTO; m++) {
        assert_true(r.kld[m] > 0.0 && r.kld[m] < 1.0);
        assert_true(r.kld[r.chosen] <= r.kld[m]);
    }
    assert_true(r.kld[r.chosen] <= r.kld[COORD_QUANT_RTN]);
    assert_true(shlm_hash(img, size) == ha[r.chosen]);
    munmap(img, size);
    check_klds_by_eval(dir, &src, ca, &r);
    /* the bound on the f32 log-probabilities kept (201 x 512 floats here): where they fit, the
     * same figures; past it, the first positions that fit are scored (100 of 201) */
    assert_int_equal(r.heldout_scored, 201);
    struct coord_auto_report rc;
    o.heldout_bytes = 201 * 512 * sizeof(float);
    assert_int_equal(coord_auto(&src, &o, 64, ca, NULL, &img, &size, &rc, &e), 0);
    munmap(img, size);
    assert_int_equal(rc.heldout_scored, 201);
    for (int m = 0; m < COORD_QUANT_AUTO; m++)
        assert_true(rc.kld[m] == r.kld[m]);
    o.heldout_bytes = 101 * 512 * sizeof(float) - 1;
    assert_int_equal(coord_auto(&src, &o, 64, ca, NULL, &img, &size, &rc, &e), 0);
    munmap(img, size);
    assert_int_equal(rc.heldout_tokens, 201);
    assert_int_equal(rc.heldout_scored, 100);
    assert_int_equal(rc.heldout_bound, o.heldout_bytes); /* the bound the auto line names */
    assert_true(rc.kld[COORD_QUANT_RTN] != r.kld[COORD_QUANT_RTN]);
    o.heldout_bytes = 0;
    /* the held-out KLDs are the slice's: another slice, other figures */
    struct coord_auto_report rb;
    assert_int_equal(coord_auto(&src, &o, 64, cb, NULL, &img, &size, &rb, &e), 0);
    munmap(img, size);
    assert_true(rb.kld[COORD_QUANT_RTN] != r.kld[COORD_QUANT_RTN]);
    coord_calib_free(ca);
    coord_calib_free(cb);
    coord_calib_free(cf);
    /* a calibration too short to hold 16 tokens out is refused, in one line */
    co = (struct coord_calib_opts){.text = a_txt, .tokens = 100, .holdout = true, .threads = 1};
    assert_int_equal(coord_calib_open(&ca, &src, &co, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "too few to hold 16 of them out"));
    assert_null(strchr(e.msg, '\n'));
    coord_source_close(&src);
    tu_rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_textbook_sym), cmocka_unit_test(test_textbook_asym),
        cmocka_unit_test(test_short_group),  cmocka_unit_test(test_singular),
        cmocka_unit_test(test_hessian_add),  cmocka_unit_test(test_method_names),
        cmocka_unit_test(test_calib_text),   cmocka_unit_test(test_heldout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
